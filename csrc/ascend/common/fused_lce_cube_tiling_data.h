// Tiling data of the cube-driven kernels (FusedLceStatsCube, FusedLceGradCube), written by the host, read by op_kernel:
// the plan of fused_lce_cube_tiling.h, the scalar options of the loss and of the log-prob contract (softcap,
// temperature, entropy), the cube core's Matmul tilings and the conservative variant bits.
// Status: compiled (kernel side) against the AscendC CPU twin; not compiled with CANN, not run on hardware.
#ifndef FUSED_LCE_CUBE_TILING_DATA_H_
#define FUSED_LCE_CUBE_TILING_DATA_H_

#include <cstdint>

#include "kernel_tiling/kernel_tiling.h"
#include "fused_lce_cube_tiling.h"

// FusedLceStatsCube GM arguments: hidden, weight, bias, labels, max, sum_exp, target, zsum, argmax, ez, zCache
// (optional last output, fp32 [N, V_local] of the raw h W^T tiles, written when hasZCache), workspace, tiling. Presence
// of an optional argument comes from the tiling (hasBias, hasZCache), never from its address: CANN does not promise a
// null GM address for an absent optional (ops-nn switches its optional logits output with an attribute).
struct FusedLceStatsCubeTilingData {
    fused_lce::cube::CubePlan plan;
    int64_t vocabStart;       // first global id of this rank's vocabulary rows
    float softcap;            // 0: off
    float invTemperature;     // 1 / T (z = softcap(h W^T + b) / T)
    uint32_t withZsum;        // sum of logits wanted (label smoothing)
    uint32_t withEz;          // ez = sum_j exp(z_j - m) (z_j - m) wanted (entropy)
    uint32_t hasBias;
    uint32_t labelBytes;      // 4 or 8
    AscendC::tiling::TCubeTiling mmLogits;  // on the AIC: z = h[block] @ W[cols].T (base_m x base_n, K = D)
    uint32_t hasZCache;       // the zCache output is given (the OpDef attribute keep_z)
    uint32_t variant;         // fused_lce::cube::Variant bits (the OpDef attribute variant; 0: default)
};

// FusedLceGradCube: dz_j = p_j (a + b max(z_j, lse - 104)) - t [j == label] - u, p_j = exp(z_j - lse), times
// 1 - (z_j T / c)^2 with a softcap c (the driver's Coefs contract, docs/providers.md).
// GM arguments: a, t, b, u, hidden, weight, bias, labels, lse, zCache (optional input: the forward's fp32 [N, V_local]
// h W^T, read when hasZCache; else the logits are recomputed), dx, dw, db, workspace, tiling. keepDz (appended, 0 =
// off) needs the workspace plan.ws_total_keep instead of plan.ws_total (fused_lce_cube_tiling.h plan_keep_dz) and the
// tilings mmDxAll / mmDwAll.
struct FusedLceGradCubeTilingData {
    fused_lce::cube::CubeGradPlan plan;
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
    uint32_t variant;    // fused_lce::cube::Variant bits (the OpDef attribute variant; 0: default)
    uint32_t pad_;
};

namespace fused_lce {
namespace cube {
// Keeps as much of a GEMM's A in L1 across its N tiles as L1 holds besides B's double buffer. With the Norm template,
// ORDER_M and stepM 1, A's buffer is reset only when a group of stepN N tiles ends (asc-devkit scheduler/base/
// scheduler_norm_base.h MoveOnIterateOrderM) and its position is the K index (stage/copy_cube_in/base/
// copy_cube_in_norm.h GetIterIndex); its Init (resource/cube_in_buffer/cube_in_buffer_normal.h), from the tiling's
// singleCoreK, caches the whole K when depthA1 >= kIter, else, with depthA1 > 2, the first depthA1 - 2 K blocks (two
// more rotate). So this sets stepN = n_tiles, depthB1 = 2 and depthA1 = the most A blocks that fit, up to kIter:
// A's whole K is copied once per group, or its first depthA1 - 2 K blocks are and the rest once per tile. Where not
// even three A blocks (or A's whole K) fit, the tiling is left as GetTiling returned it. (ops-nn sets tiling fields
// after GetTiling the same way, e.g. weight_quant_batch_matmul_v2's stepN / depthB1.) `a_trans` / `b_trans`: the
// MatmulType transposes of the kernel's object (the L1 block sizes depend on them for float32). The kernels are
// correct for any legal values: the tests run them under a grid of them. Used for
//   * FusedLceStatsCube's mmLogits: one Iterate sequence per task, A = the token block's hidden rows, the N tiles the
//     segment's vocabulary blocks (bf16, a 128 x 128 x 128 base tile: the whole K up to D = 1664, 11 K blocks
//     beyond);
//   * FusedLceGradCube's per-tile mmDx / mmDw: A = the dz tile (K = base_n or base_m), the N tiles D's columns.
inline void keep_a_resident(AscendC::tiling::TCubeTiling* t, uint64_t k, uint64_t n_tiles, uint32_t elt,
                            uint64_t l1_bytes, bool a_trans, bool b_trans) {
    if (t->baseK <= 0 || t->baseM <= 0 || t->baseN <= 0 || n_tiles == 0 || n_tiles > 0x7fffffffull) return;
    const uint64_t bk = static_cast<uint64_t>(t->baseK), kiter = ft::ceil_div(k, bk);
    const uint64_t a_blk = l1_block_bytes(true, a_trans, static_cast<uint64_t>(t->baseM), bk, elt);
    const uint64_t b_db = 2 * l1_block_bytes(false, b_trans, static_cast<uint64_t>(t->baseN), bk, elt);
    if (kiter == 0 || kiter > 0x7fffffffull || b_db + a_blk > l1_bytes) return;
    uint64_t depth = (l1_bytes - b_db) / a_blk;
    if (depth > kiter) depth = kiter;
    if (depth < kiter && depth < 3) return;  // two blocks or fewer below the whole K cache nothing
    t->stepM = 1;
    t->depthA1 = static_cast<int32_t>(depth);
    t->stepN = static_cast<int32_t>(n_tiles);
    t->depthB1 = 2;
    t->iterateOrder = 0;
    t->shareL1Size = static_cast<int32_t>(depth * a_blk + b_db);
}
}  // namespace cube
}  // namespace fused_lce

#endif  // FUSED_LCE_CUBE_TILING_DATA_H_
