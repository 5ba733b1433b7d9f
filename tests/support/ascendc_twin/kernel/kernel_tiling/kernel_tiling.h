// CPU twin of the AscendC API: the kernel-side tiling structs. TCubeTiling is the POD the Matmul API reads; its
// fields and their order follow the TILING_DATA_FIELD_DEF list of asc-devkit include/adv_api/matmul/
// matmul_tilingdata.h (generated there into AscendC::tiling::TCubeTiling; written here by hand).
#ifndef FUSED_LCE_TWIN_KERNEL_TILING_H_
#define FUSED_LCE_TWIN_KERNEL_TILING_H_

#include <cstdint>

namespace AscendC {
namespace tiling {

struct TCubeTiling {
    int32_t usedCoreNum;
    int32_t M, N, Ka, Kb;
    int32_t singleCoreM, singleCoreN, singleCoreK;
    int32_t baseM, baseN, baseK;
    int32_t depthA1, depthB1;
    int32_t stepM, stepN;
    int32_t isBias;
    int32_t transLength;
    int32_t iterateOrder;
    int32_t shareMode;
    int32_t shareL1Size, shareL0CSize, shareUbSize;
    int32_t batchM, batchN, singleBatchM, singleBatchN;
    int32_t stepKa, stepKb;
    int32_t depthAL1CacheUB, depthBL1CacheUB;
    int32_t dbL0A, dbL0B, dbL0C;
    int32_t ALayoutInfoB, ALayoutInfoS, ALayoutInfoN, ALayoutInfoG, ALayoutInfoD;
    int32_t BLayoutInfoB, BLayoutInfoS, BLayoutInfoN, BLayoutInfoG, BLayoutInfoD;
    int32_t CLayoutInfoB, CLayoutInfoS1, CLayoutInfoN, CLayoutInfoG, CLayoutInfoS2;
    int32_t BatchNum;
    int32_t mxTypePara;
};

}  // namespace tiling
}  // namespace AscendC

#endif  // FUSED_LCE_TWIN_KERNEL_TILING_H_
