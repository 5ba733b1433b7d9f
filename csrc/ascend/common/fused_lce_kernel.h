// The prelude of every kernel source of the package (op_kernel/*.cpp): the AscendC API and the Matmul library, the
// tiling data (with FUSED_LCE_HD = __aicore__, so the planners' index helpers compile for the cores), the shared
// vector-core building blocks, and the namespaces the kernels use. One include, so the two kernels cannot differ in
// what they compile against.
#ifndef FUSED_LCE_KERNEL_H_
#define FUSED_LCE_KERNEL_H_

#define FUSED_LCE_HD __aicore__
#include "kernel_operator.h"
#include "lib/matmul_intf.h"
#include "fused_lce_cube_tiling_data.h"
#include "fused_lce_cube_aiv.h"

using namespace AscendC;
using namespace fused_lce_cube;
namespace ft = fused_lce::tiling;
namespace fc = fused_lce::cube;

// A vector core's UB, laid out by the plan (CubePlan / CubeGradPlan): its logit tile z, the work tile w and, where the
// plan has one, the second work tile w2 (softcap, entropy).
template <typename Plan>
__aicore__ inline void TileBuffers(TPipe* pipe, TBuf<TPosition::VECCALC>& ub, const Plan& mp, uint32_t tile,
                                   LocalTensor<float>* z, LocalTensor<float>* w, LocalTensor<float>* w2) {
    pipe->InitBuffer(ub, mp.ub_end);
    *z = ub.GetWithOffset<float>(tile, mp.ub_z);
    *w = ub.GetWithOffset<float>(tile, mp.ub_w);
    if (mp.ub_w2 != ft::kUbNone) *w2 = ub.GetWithOffset<float>(tile, mp.ub_w2);
}

#endif  // FUSED_LCE_KERNEL_H_
