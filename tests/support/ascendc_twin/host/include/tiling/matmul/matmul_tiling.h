// Stub of asc-devkit include/adv_api/matmul/matmul_tiling.h: matmul_tiling::MatmulApiTiling, the single-core Matmul
// tiling. GetTiling returns -1 on failure (GetTiling.md: "如果返回值为-1，则代表Tiling计算失败").
// The twin's Compute() is NOT the real tiling algorithm (impl/adv_api/tiling/matmul/matmul_tiling_algorithm.cpp):
// it honours fixed base tiles and the L0 / L1 limits and fills every TCubeTiling field deterministically, so tests
// may rely on the echoed problem (M/N/Ka/Kb, singleCore*, fixed base*, isBias) and on failures, never on the values
// the real algorithm would choose (depthA1, stepKa, ...).
#ifndef FUSED_LCE_TWIN_HOST_TILING_MATMUL_TILING_H_
#define FUSED_LCE_TWIN_HOST_TILING_MATMUL_TILING_H_

#include <cstdint>

#include "kernel_tiling/kernel_tiling.h"
#include "matmul_tiling_base.h"
#include "matmul_tilingdata.h"
#include "tiling/platform/platform_ascendc.h"

namespace matmul_tiling {

class MatmulApiTiling : public MatmulApiTilingBase {
public:
    MatmulApiTiling() {}
    explicit MatmulApiTiling(const platform_ascendc::PlatformAscendC& ascendcPlatform)
        : MatmulApiTilingBase(ascendcPlatform) {}
    explicit MatmulApiTiling(const PlatformInfo& platform) : MatmulApiTilingBase(platform) {}
    ~MatmulApiTiling() override = default;
    int64_t GetTiling(optiling::TCubeTiling& tiling) override;
    int64_t GetTiling(AscendC::tiling::TCubeTiling& tiling) override;

protected:
    int64_t Compute() override;
};

}  // namespace matmul_tiling

#endif  // FUSED_LCE_TWIN_HOST_TILING_MATMUL_TILING_H_
