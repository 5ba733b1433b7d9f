// Stub of asc-devkit include/adv_api/matmul/matmul_tilingdata.h: the host-side optiling::TCubeTiling (a
// BEGIN_TILING_DATA_DEF class in the real header). fused_lce uses the standard-C++ AscendC::tiling::TCubeTiling
// (kernel_tiling/kernel_tiling.h) instead; this declaration only keeps MatmulApiTiling's overload set as the real one.
#ifndef FUSED_LCE_TWIN_HOST_TILING_MATMUL_TILINGDATA_H_
#define FUSED_LCE_TWIN_HOST_TILING_MATMUL_TILINGDATA_H_

namespace optiling {
class TCubeTiling {
public:
    TCubeTiling() = default;
};
}  // namespace optiling

#endif  // FUSED_LCE_TWIN_HOST_TILING_MATMUL_TILINGDATA_H_
