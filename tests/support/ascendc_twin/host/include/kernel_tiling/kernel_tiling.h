// Stub of CANN's kernel_tiling/kernel_tiling.h for host code: AscendC::tiling::TCubeTiling, the standard-C++ Matmul
// tiling struct (field list and order of asc-devkit include/adv_api/matmul/matmul_tilingdata.h, all int32_t; the real
// header is generated from it by impl/adv_api/cmake/scripts/gen_kernel_tiling_data_def.py).
// Host code includes it for standard-C++ tiling structs (asc-devkit docs 如何使用Tiling依赖的头文件.md).
// One definition for host and kernel: the device twin's (kernel/kernel_tiling/kernel_tiling.h of this twin).
#ifndef FUSED_LCE_TWIN_HOST_KERNEL_TILING_H_
#define FUSED_LCE_TWIN_HOST_KERNEL_TILING_H_

#include "../../../kernel/kernel_tiling/kernel_tiling.h"

#endif  // FUSED_LCE_TWIN_HOST_KERNEL_TILING_H_
