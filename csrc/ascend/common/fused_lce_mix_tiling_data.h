// Tiling data of the cube-driven MIX kernels (FusedLceStatsMix), written by the host, read by op_kernel. Its own
// struct (not FusedLceTilingData): the plan of csrc/include/fused_lce_mix_tiling.h, the scalar options of the loss
// and of the log-prob contract (softcap, temperature, entropy), and the cube core's Matmul tiling.
// Status: compiled (kernel side) against the AscendC CPU twin; not compiled with CANN, not run on hardware.
#ifndef FUSED_LCE_MIX_TILING_DATA_H_
#define FUSED_LCE_MIX_TILING_DATA_H_

#include <cstdint>

#include "kernel_tiling/kernel_tiling.h"
#include "../../include/fused_lce_mix_tiling.h"

// FusedLceStatsMix GM arguments: hidden, weight, bias, labels, max, sum_exp, target, zsum, argmax, ez, zCache (optional
// last output, fp32 [N, V_local] of the raw h W^T tiles, written when hasZCache), workspace, tiling. Presence of an
// optional argument comes from the tiling (hasBias, hasZCache), never from its address: CANN does not promise a null
// GM address for an absent optional (ops-nn switches its optional logits output with an attribute).
struct FusedLceMixTilingData {
    fused_lce::mix::MixPlan plan;
    int64_t vocabStart;       // first global id of this rank's vocabulary rows
    float softcap;            // 0: off
    float invTemperature;     // 1 / T (z = softcap(h W^T + b) / T)
    uint32_t withZsum;        // sum of logits wanted (label smoothing)
    uint32_t withEz;          // ez = sum_j exp(z_j - m) (z_j - m) wanted (entropy)
    uint32_t hasBias;
    uint32_t labelBytes;      // 4 or 8
    AscendC::tiling::TCubeTiling mmLogits;  // on the AIC: z = h[block] @ W[cols].T (base_m x base_n, K = D)
    uint32_t hasZCache;       // the zCache output is given (the OpDef attribute keep_z)
    uint32_t pad_;
};

// FusedLceGradMix: dz_j = p_j (a + b max(z_j, lse - 104)) - t [j == label] - u, p_j = exp(z_j - lse), times
// 1 - (z_j T / c)^2 with a softcap c (the driver's Coefs contract, /work/notes/logprobs_contract.md section 4).
// GM arguments: a, t, b, u, hidden, weight, bias, labels, lse, zCache (optional input: the forward's fp32 [N, V_local]
// h W^T, read when hasZCache; else the logits are recomputed), dx, dw, db, workspace, tiling. keepDz (appended, 0 = off) needs the workspace
// plan.ws_total_keep instead of plan.ws_total (fused_lce_mix_tiling.h plan_keep_dz) and the tilings mmDxAll /
// mmDwAll (appended last).
struct FusedLceGradMixTilingData {
    fused_lce::mix::MixGradPlan plan;
    int64_t vocabStart;
    float softcap;
    float invTemperature;
    uint32_t gradMask;   // bit0 dX, bit1 dW, bit2 db
    uint32_t hasBias;
    uint32_t hasB;       // the coefficient b is given (log-prob entropy term)
    uint32_t hasU;       // the coefficient u is given (label smoothing)
    AscendC::tiling::TCubeTiling mmZ;   // z = h[m] @ W[nb].T            (base_m x base_n, K = D)
    AscendC::tiling::TCubeTiling mmDx;  // dX[m] += dz @ W[nb]           (base_m x D, K = base_n)
    AscendC::tiling::TCubeTiling mmDw;  // dW[nb] += dz.T @ h[m]         (base_n x D, K = base_m)
    // Appended (0 = the behaviour before these fields existed):
    uint32_t keepDz;     // 1: dz kept between the phases in the workspace (plan.ws_total_keep bytes; 3 GEMMs)
    uint32_t hasZCache;  // the zCache input is given: no logit GEMM
    // keepDz = 1: the whole-K GEMMs from the kept row-major Dz (N x V_local) after SyncAll
    AscendC::tiling::TCubeTiling mmDxAll;  // dX[m] = Dz[m rows, :] @ W     (base_m x D, K = V_local)
    AscendC::tiling::TCubeTiling mmDwAll;  // dW[nb] += Dz[:, nb cols].T @ h (base_n x D, K = N)
};

namespace fused_lce {
namespace mix {
// Keeps a GEMM's A in L1 across its N tiles. With the Norm template, ORDER_M and one M tile, A stays in L1 for a
// group of stepN N tiles when its buffer holds the whole K (depthA1 >= kIter * stepM: the "k full load" of asc-devkit
// resource/cube_in_buffer/cube_in_buffer_normal.h; A is reset after each N group, scheduler/base/
// scheduler_norm_base.h MoveOnIterateOrderM). Where A (baseM x K) and B's double buffer fit L1, this sets
// depthA1 = kIter and stepN = n_tiles, so A is copied in once instead of once per N tile; otherwise the tiling is left
// as GetTiling returned it. (ops-nn sets tiling fields after GetTiling the same way, e.g. weight_quant_batch_matmul_v2's
// stepN / depthB1.) The kernels are correct for any legal values: the tests run them under a grid of them. Used for
//   * FusedLceStatsMix's mmLogits: one Iterate sequence per task, A = the token block's hidden rows, the N tiles the
//     segment's vocabulary blocks (A fits L1 for D up to about 1.5 K at base_m 128, bf16);
//   * FusedLceGradMix's per-tile mmDx / mmDw: A = the dz tile (K = base_n or base_m), the N tiles D's columns.
inline void keep_a_resident(AscendC::tiling::TCubeTiling* t, uint64_t k, uint64_t n_tiles, uint32_t elt,
                            uint64_t l1_bytes) {
    if (t->baseK <= 0 || t->baseM <= 0 || t->baseN <= 0 || n_tiles == 0 || n_tiles > 0x7fffffffull) return;
    const uint64_t bk = static_cast<uint64_t>(t->baseK), kiter = ft::ceil_div(k, bk);
    const uint64_t need = (static_cast<uint64_t>(t->baseM) * kiter + 2ull * t->baseN) * bk * elt;
    if (need > l1_bytes || kiter > 0x7fffffffull) return;
    t->stepM = 1;
    t->depthA1 = static_cast<int32_t>(kiter);
    t->stepN = static_cast<int32_t>(n_tiles);
    t->depthB1 = 2;
    t->iterateOrder = 0;
    t->shareL1Size = static_cast<int32_t>(need);
}
}  // namespace mix
}  // namespace fused_lce

#endif  // FUSED_LCE_MIX_TILING_DATA_H_
