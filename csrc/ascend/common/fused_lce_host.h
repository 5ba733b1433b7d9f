// Host-side helpers of the two ops' tiling functions: the part's memories from PlatformAscendC, and the Matmul
// API tilings of the kernels' GEMMs with the plan's fixed base tile. Status: written, not compiled here (no CANN
// toolkit), not run on hardware.
#ifndef FUSED_LCE_HOST_H_
#define FUSED_LCE_HOST_H_

#include "register/op_def_registry.h"
#include "tiling/platform/platform_ascendc.h"
#include "tiling/tiling_api.h"

#include "fused_lce_tiling_data.h"

namespace fused_lce_host {

inline fused_lce::tiling::HwSpec hw_spec(const platform_ascendc::PlatformAscendC& plat) {
    fused_lce::tiling::HwSpec hw;
    hw.cube_cores = plat.GetCoreNumAic();
    const uint32_t aiv = plat.GetCoreNumAiv();
    hw.vec_per_cube = hw.cube_cores > 0 && aiv >= hw.cube_cores ? aiv / hw.cube_cores : 1;
    uint64_t size = 0;
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::UB, size);
    hw.ub_bytes = size;
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::L1, size);
    hw.l1_bytes = size;
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::L0_A, size);
    hw.l0a_bytes = size;
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::L0_B, size);
    hw.l0b_bytes = size;
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::L0_C, size);
    hw.l0c_bytes = size;
    return hw;
}

inline matmul_tiling::DataType mm_dtype(ge::DataType dt) {
    switch (dt) {
        case ge::DT_BF16: return matmul_tiling::DataType::DT_BF16;
        case ge::DT_FLOAT16: return matmul_tiling::DataType::DT_FLOAT16;
        default: return matmul_tiling::DataType::DT_FLOAT;
    }
}

inline uint32_t elt_bytes(ge::DataType dt) { return dt == ge::DT_FLOAT ? 4u : 2u; }

// One single-core Matmul tiling (each vector core drives its own GEMM of m x n x k), base tile fixed to the plan's
// so that the kernels' UB buffers match what the Matmul API delivers. Returns false when the API finds no tiling.
inline bool gemm_tiling(const platform_ascendc::PlatformAscendC& plat, ge::DataType dt, bool transA, bool transB,
                        matmul_tiling::TPosition cPos, uint64_t m, uint64_t n, uint64_t k, uint32_t baseM,
                        uint32_t baseN, uint32_t baseK, uint64_t ubLeft, AscendC::tiling::TCubeTiling& out) {
    matmul_tiling::MatmulApiTiling api(plat);
    const auto t = mm_dtype(dt);
    api.SetAType(matmul_tiling::TPosition::GM, matmul_tiling::CubeFormat::ND, t, transA);
    api.SetBType(matmul_tiling::TPosition::GM, matmul_tiling::CubeFormat::ND, t, transB);
    api.SetCType(cPos, matmul_tiling::CubeFormat::ND, matmul_tiling::DataType::DT_FLOAT);
    api.SetBias(false);
    api.SetOrgShape(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k));
    api.SetShape(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k));
    api.SetFixSplit(static_cast<int>(baseM), static_cast<int>(baseN), static_cast<int>(baseK));
    api.SetBufferSpace(-1, -1, static_cast<int>(ubLeft));
    return api.GetTiling(out) != -1;
}

}  // namespace fused_lce_host

#endif  // FUSED_LCE_HOST_H_
