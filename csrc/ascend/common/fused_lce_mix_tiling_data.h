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
// last output, fp32 [N, V_local] of the raw h W^T tiles; nullptr = not kept), workspace, tiling.
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
};

// FusedLceGradMix: dz_j = p_j (a + b max(z_j, lse - 104)) - t [j == label] - u, p_j = exp(z_j - lse), times
// 1 - (z_j T / c)^2 with a softcap c (the driver's Coefs contract, /work/notes/logprobs_contract.md section 4).
// GM arguments: a, t, b, u, hidden, weight, bias, labels, lse, zCache (optional input: the forward's fp32 [N, V_local]
// h W^T; nullptr = recompute), dx, dw, db, workspace, tiling. keepDz (appended, 0 = off) needs the workspace
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
    uint32_t keepPad_;
    // keepDz = 1: the whole-K GEMMs from the kept row-major Dz (N x V_local) after SyncAll
    AscendC::tiling::TCubeTiling mmDxAll;  // dX[m] = Dz[m rows, :] @ W     (base_m x D, K = V_local)
    AscendC::tiling::TCubeTiling mmDwAll;  // dW[nb] += Dz[:, nb cols].T @ h (base_n x D, K = N)
};

#endif  // FUSED_LCE_MIX_TILING_DATA_H_
