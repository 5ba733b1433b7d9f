// Stub of CANN's tiling/tiling_api.h (asc-devkit include/adv_api/tiling_api.h, installed as include/tiling/): the
// host tiling APIs of the advanced AscendC library. Only the Matmul tiling and PlatformAscendC are modelled.
#ifndef FUSED_LCE_TWIN_HOST_TILING_TILING_API_H_
#define FUSED_LCE_TWIN_HOST_TILING_TILING_API_H_

#include "matmul/matmul_tiling.h"
#include "tiling/platform/platform_ascendc.h"

#endif  // FUSED_LCE_TWIN_HOST_TILING_TILING_API_H_
