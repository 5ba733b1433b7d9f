// Stub of CANN's kernel_tiling/kernel_tiling.h for host code: AscendC::tiling::TCubeTiling, the standard-C++ Matmul
// tiling struct (field list and order of asc-devkit include/adv_api/matmul/matmul_tilingdata.h, all int32_t; the real
// header is generated from it by impl/adv_api/cmake/scripts/gen_kernel_tiling_data_def.py).
// Host code includes it for standard-C++ tiling structs (asc-devkit docs 如何使用Tiling依赖的头文件.md).
// One definition for host and kernel: the device twin's (csrc/ascend/twin/kernel/kernel_tiling/kernel_tiling.h) when
// present; the copy below only serves a checkout without the device twin and must stay field-for-field equal to it.
#ifndef FUSED_LCE_TWIN_HOST_KERNEL_TILING_H_
#define FUSED_LCE_TWIN_HOST_KERNEL_TILING_H_

#if defined(__has_include)
#if __has_include("../../../kernel/kernel_tiling/kernel_tiling.h")
#include "../../../kernel/kernel_tiling/kernel_tiling.h"
#define FUSED_LCE_TWIN_HOST_TCUBE_FROM_KERNEL 1
#endif
#endif

#ifndef FUSED_LCE_TWIN_HOST_TCUBE_FROM_KERNEL
#include <cstdint>

namespace AscendC {
namespace tiling {

struct TCubeTiling {
    int32_t usedCoreNum;
    int32_t M;
    int32_t N;
    int32_t Ka;
    int32_t Kb;
    int32_t singleCoreM;
    int32_t singleCoreN;
    int32_t singleCoreK;
    int32_t baseM;
    int32_t baseN;
    int32_t baseK;
    int32_t depthA1;
    int32_t depthB1;
    int32_t stepM;
    int32_t stepN;
    int32_t isBias;
    int32_t transLength;
    int32_t iterateOrder;
    int32_t shareMode;
    int32_t shareL1Size;
    int32_t shareL0CSize;
    int32_t shareUbSize;
    int32_t batchM;
    int32_t batchN;
    int32_t singleBatchM;
    int32_t singleBatchN;
    int32_t stepKa;
    int32_t stepKb;
    int32_t depthAL1CacheUB;
    int32_t depthBL1CacheUB;
    int32_t dbL0A;
    int32_t dbL0B;
    int32_t dbL0C;
    int32_t ALayoutInfoB;
    int32_t ALayoutInfoS;
    int32_t ALayoutInfoN;
    int32_t ALayoutInfoG;
    int32_t ALayoutInfoD;
    int32_t BLayoutInfoB;
    int32_t BLayoutInfoS;
    int32_t BLayoutInfoN;
    int32_t BLayoutInfoG;
    int32_t BLayoutInfoD;
    int32_t CLayoutInfoB;
    int32_t CLayoutInfoS1;
    int32_t CLayoutInfoN;
    int32_t CLayoutInfoG;
    int32_t CLayoutInfoS2;
    int32_t BatchNum;
    int32_t mxTypePara;
};

}  // namespace tiling
}  // namespace AscendC

#endif  // !FUSED_LCE_TWIN_HOST_TCUBE_FROM_KERNEL

#endif  // FUSED_LCE_TWIN_HOST_KERNEL_TILING_H_
