// Tiling of the cube-driven kernels (csrc/ascend/fused_lce_stats/op_kernel/fused_lce_stats_cube.cpp), plain C++17
// with no CANN include, on top of fused_lce::tiling::plan (fused_lce_tiling.h: tile choice, grid, segments, cores).
//
// The cube core (AIC) of every used AI core computes whole base_m x base_n logit tiles (MatmulImpl, fp32 in L0C) into
// a two-slot ring in GM (its own slice of the workspace); its two vector cores (AIV) take vec_rows rows each of a
// slot, and the slot is handed back to the cube as soon as both have copied it to UB, so the cube computes tile k + 1
// (and k + 2) while the vector cores work on tile k. The hand-off uses CrossCoreSetFlag / CrossCoreWaitFlag in mode 2
// (one AI core's cube and its vector cores), the shape of hicann/ops-nn
// matmul/fused_linear_online_max_sum/op_kernel/fused_linear_online_max_sum.h (CVProcess).
//
// The vector side works on whole tiles with level-0 (repeat) instructions, one repeat per row, so every per-row
// statistic is a vector of row slots (kCubeSlots of slot_stride = align64(vec_rows) floats: Compare / Select work on
// whole 256-byte repeats).
#ifndef FUSED_LCE_CUBE_TILING_H_
#define FUSED_LCE_CUBE_TILING_H_

#include <cstdint>

#include "fused_lce_tiling.h"

namespace fused_lce {
namespace cube {

namespace ft = fused_lce::tiling;

constexpr uint32_t kCubeSlots = 28;      // per-row float slots (fused_lce_cube_aiv.h CubeSlot)
constexpr uint32_t kRingSlots = 2;      // GM ring slots per AI core (double buffer)
constexpr uint64_t kCubeStatPlanes = 6;  // m, s, target, zsum, argmax (float), ez per token and segment
constexpr uint64_t kMaxLocalVocab = 1ull << 24;  // labels and argmax ids travel as exact floats (< 2^24)
constexpr uint32_t kMaskBytes = 32;     // one Compare mask region (slot_stride / 8 bytes, padded to a block)
constexpr uint64_t kMaxSegments = 8;    // vocabulary segments tried to balance the last wave of token blocks

// Conservative variants (the ops' attribute `variant`, a bit set; 0 = the default kernels). Each replaces one
// behaviour that only hardware can judge with a plainer one that computes the same numbers, so a first run on a card
// can compare them bit for bit (fused-lce doctor):
//   kPlainTiling:  the Matmul tilings stay as GetTiling returned them (no keep_a_resident override of depthA1 /
//                  stepN / shareL1Size), and the forward issues one GEMM per tile instead of one Iterate sequence
//                  over a segment's tiles behind a widened SetTail;
//   kSerialMatmul: the backward's cube puts PipeBarrier<PIPE_ALL> between its Matmul objects (mmZ, mmDx, mmDw
//                  overlay L1), so no copy of one can overtake the last reads of the other.
enum Variant : uint32_t { kPlainTiling = 1u, kSerialMatmul = 2u, kVariantMask = 3u };


struct CubePlan {
    ft::Plan base;  // tile, grid, segments, cores (its GM workspace is not used: ws_* below)
    uint32_t slot_stride;  // floats per row slot
    uint32_t ub_z, ub_w, ub_w2, ub_bias, ub_bias_f32, ub_bc, ub_mask, ub_slots, ub_end;
    uint64_t ws_stats;  // kCubeStatPlanes * segments * N floats (segments > 1 only)
    uint64_t ws_ring;   // used_cores * kRingSlots * base_m * base_n floats
    uint64_t ws_total;
    int32_t status;
    uint32_t pad_;
};

namespace detail {
// Places the regions of one vector core's UB one after another, each on a 32-byte block. A region the plan does not
// need gets no bytes and the offset ft::kUbNone (never a valid view): a zero-sized region sharing the next one's
// offset would let a copy sized for another dtype write over it.
struct UbLayout {
    uint64_t end = 0;
    uint32_t take(bool need, uint64_t bytes) {
        if (!need) return ft::kUbNone;
        const uint64_t at = end;
        end += ft::align_up(bytes, ft::kUbAlign);
        return static_cast<uint32_t>(at);
    }
};
}  // namespace detail

// The forward's UB for a vec_rows x base_n tile (byte offsets into m, ft::kUbNone for an absent region); returns the
// bytes:
//   z     the logit tile (vec_rows x base_n floats), as copied from the ring, then biased / capped / tempered
//   w     z - max and its exponentials; w2: softcap tanh scratch, then exp when the entropy sum is wanted
//   bias  the bias block as loaded; bias_f32 its float copy (bf16 / fp16)
//   bc    per-row values broadcast to one 32-byte block per row (Brcb), align8(vec_rows) blocks
//   mask  Compare results (4 masks of slot_stride bits)
//   slots kCubeSlots row slots
inline uint64_t layout_stats(CubePlan* m, uint64_t vr, uint64_t bn, uint32_t elt, uint32_t flags, bool ez) {
    const bool bias = (flags & ft::kBias) != 0;
    detail::UbLayout ub;
    m->slot_stride = static_cast<uint32_t>(ft::align_up(vr, 64));
    m->ub_z = ub.take(true, vr * bn * 4);
    m->ub_w = ub.take(true, vr * bn * 4);
    m->ub_w2 = ub.take((flags & ft::kSoftcap) != 0 || ez, vr * bn * 4);
    m->ub_bias = ub.take(bias, ft::align_up(bn, ft::kMinBase) * elt);
    m->ub_bias_f32 = ub.take(bias && elt != 4, bn * 4);
    m->ub_bc = ub.take(true, ft::align_up(vr, 8) * 8 * 4);
    m->ub_mask = ub.take(true, 4 * kMaskBytes);
    m->ub_slots = ub.take(true, m->slot_stride * static_cast<uint64_t>(kCubeSlots) * 4);
    m->ub_end = static_cast<uint32_t>(ub.end);
    return ub.end;
}

// Plan of the cube-driven forward for N tokens, hidden D, V vocabulary rows on this rank; `ez`: the entropy sum is
// wanted. Never throws; check `status` (ft::Status). The tile is ft::plan's first that fits this layout.
inline CubePlan plan_stats(uint64_t n, uint64_t d, uint64_t v, uint32_t elt, uint32_t flags, bool ez,
                           const ft::HwSpec& hw = ft::HwSpec()) {
    CubePlan m{};
    if (v >= kMaxLocalVocab) {
        m.status = ft::kTooLarge;
        return m;
    }
    m.base = ft::plan(n, d, v, elt, flags & ~static_cast<uint32_t>(ft::kBackward), hw,
                      [&](uint64_t vr, uint64_t bn) -> uint64_t {
                          CubePlan s;
                          return layout_stats(&s, vr, bn, elt, flags, ez);
                      });
    if (m.base.status != ft::kOk) {
        m.status = m.base.status;
        return m;
    }
    layout_stats(&m, m.base.vec_rows, m.base.base_n, elt, flags, ez);
    ft::Plan& p = m.base;
    // Balance the last wave: with a number of token blocks that is not a multiple of the cores, split the vocabulary
    // in the segments that give the busiest core the fewest tiles: ft::plan's split (the cores shared out when the
    // blocks are fewer, e.g. 24 segments for one block) or up to kMaxSegments (e.g. 32 blocks on 24 cores: two
    // waves of 1187 tiles -> 4 x 396 with 3 segments; 18 blocks: 18 of 24 cores busy -> 72 tasks of 297 tiles with
    // 4 segments); the finishing phase merges them (O(N x segments)).
    if (p.m_blocks % hw.cube_cores != 0) {
        const auto busiest = [&](uint64_t s) -> uint64_t {
            const uint64_t sb = ft::ceil_div(p.n_blocks, s), segs = ft::ceil_div(p.n_blocks, sb);
            return ft::ceil_div(p.m_blocks * segs, hw.cube_cores) * sb;
        };
        uint64_t best_seg = p.segments, best = busiest(p.segments);
        for (uint64_t s = 1; s <= kMaxSegments && s <= p.n_blocks; ++s) {
            if (busiest(s) < best) {
                best = busiest(s);
                best_seg = s;
            }
        }
        p.seg_blocks = ft::ceil_div(p.n_blocks, best_seg);
        p.segments = ft::ceil_div(p.n_blocks, p.seg_blocks);
        p.tasks = p.m_blocks * p.segments;
        p.used_cores = static_cast<uint32_t>(p.tasks < hw.cube_cores ? p.tasks : hw.cube_cores);
    }
    uint64_t stats = 0;
    if (p.segments > 1) stats = kCubeStatPlanes * p.segments * n * 4;  // n < 2^40 per the Matmul limits of one rank
    m.ws_stats = ft::align_up(stats, ft::kGmAlign);
    m.ws_ring = ft::align_up(static_cast<uint64_t>(p.used_cores) * kRingSlots * p.base_m * p.base_n * 4, ft::kGmAlign);
    m.ws_total = m.ws_stats + m.ws_ring;
    m.status = ft::kOk;
    return m;
}

// ---- backward (fused_lce_grad_cube.cpp) ---------------------------------------------------------------------------
// Phase X: token block m on AI core m % cores walks every vocabulary block (dX[m] += dz @ W[nb]); phase W: vocabulary
// block nb on core nb % cores walks every token block (dW[nb] += dz^T @ h[m], db partials per vector core). Each
// output element is accumulated by one core in a fixed order, so the result does not depend on core timing.
struct CubeGradPlan {
    ft::Plan base;           // tile (with base_d for the dX / dW GEMMs), grid; base.used_cores = cores below
    uint32_t slot_stride;
    uint32_t ub_z, ub_w, ub_w2, ub_cast, ub_bias, ub_bias_f32, ub_bc, ub_bc2, ub_colsum, ub_slots, ub_end;
    uint64_t ws_ring, ws_dz, ws_db, ws_total;  // z ring (fp32), dz ring (operand dtype), db partials (2 x V fp32)
    uint64_t dw_workspace_bytes;  // fp32 dW bytes outside the output: none (the output itself is accumulated)
    int32_t status;
    uint32_t pad_;
    // The dz-kept mode (FusedLceGradCubeTilingData::keepDz = 1; 0 uses none of this and needs only ws_total):
    // phase X writes every dz tile (operand dtype) into Dz (N x V in column chunks, keep_cols below) and the cube
    // then runs whole-K GEMMs per dX / dW output block from it, with no logit GEMM and no vector work (3 GEMMs in
    // fwd + bwd with a z cache, 4 without). Placed after ws_total:
    uint64_t ws_keep_dz;     // Dz: N x V operand-dtype dz in column chunks
    uint64_t ws_keep_db;     // db partials, one per (token block, vector core): 2 x m_blocks x V fp32 (bias only)
    uint64_t ws_total_keep;  // ws_total + ws_keep_dz + ws_keep_db: the workspace to allocate when keepDz = 1
    // Dz is kept in column chunks of keep_cols columns (a multiple of base_n below 65535; the last chunk narrower),
    // chunk c an N x width row-major matrix at c x N x keep_cols: every row stride the cube reads stays within the
    // 16 bits of the GM -> L1 copy's Nd2NzParams::srcDValue (fused_lce_tiling.h kMaxOperandStride), so the dX / dW
    // objects take the default Matmul config. dX[m] is one whole-K GEMM per chunk (the first writes, the others
    // add); dW[nb] one GEMM over the chunk holding block nb.
    uint64_t keep_cols;
};

// Workspace bytes of the dz-kept mode beyond plan_grad's ws_total (the formula plan_grad fills in):
//   align512(n x v x elt) + (bias ? align512(2 ceil(n / base_m) v 4) : 0)
// (+ 8 n v / base_m for db): the caller bounds n per launch (fused_lce/backends/npu/provider.py). Dz's column chunks
// (keep_cols) tile the same n x v elements.
inline void plan_keep_dz(CubeGradPlan* m, uint64_t n, uint64_t v, uint32_t elt, bool bias) {
    const ft::Plan& p = m->base;
    const uint64_t chunk = ft::kMaxOperandStride / p.base_n * p.base_n;
    m->keep_cols = v < chunk ? v : chunk;
    m->ws_keep_dz = ft::align_up(n * v * elt, ft::kGmAlign);
    m->ws_keep_db = bias ? ft::align_up(2 * p.m_blocks * v * 4, ft::kGmAlign) : 0;
    m->ws_total_keep = m->ws_total + m->ws_keep_dz + m->ws_keep_db;
}

// The backward's UB for a vec_rows x base_n tile, as layout_stats (z becomes dz in place):
//   w, w2  p = exp(z - lse); softcap: tanh scratch, then w2 keeps the derivative 1 - tanh^2 for the end
//   cast   bf16 / fp16: dz rounded to the operand dtype for the cube (fp32 hands z itself over)
//   bias, bias_f32, bc as the forward's; bc2 a second broadcast block set (and the live-row mask)
//   colsum with a bias: column sums of dz (db)
//   slots  kCubeSlots row slots
inline uint64_t layout_grad(CubeGradPlan* m, uint64_t vr, uint64_t bn, uint32_t elt, uint32_t flags) {
    const bool bias = (flags & ft::kBias) != 0;
    detail::UbLayout ub;
    m->slot_stride = static_cast<uint32_t>(ft::align_up(vr, 64));
    m->ub_z = ub.take(true, vr * bn * 4);
    m->ub_w = ub.take(true, vr * bn * 4);
    m->ub_w2 = ub.take(true, vr * bn * 4);
    m->ub_cast = ub.take(elt != 4, vr * bn * elt);
    m->ub_bias = ub.take(bias, ft::align_up(bn, ft::kMinBase) * elt);
    m->ub_bias_f32 = ub.take(bias && elt != 4, bn * 4);
    m->ub_bc = ub.take(true, ft::align_up(vr, 8) * 8 * 4);
    m->ub_bc2 = ub.take(true, ft::align_up(vr, 8) * 8 * 4);
    m->ub_colsum = ub.take(bias, bn * 4);
    m->ub_slots = ub.take(true, m->slot_stride * static_cast<uint64_t>(kCubeSlots) * 4);
    m->ub_end = static_cast<uint32_t>(ub.end);
    return ub.end;
}

inline CubeGradPlan plan_grad(uint64_t n, uint64_t d, uint64_t v, uint32_t elt, uint32_t flags,
                              const ft::HwSpec& hw = ft::HwSpec()) {
    CubeGradPlan m{};
    if (v >= kMaxLocalVocab || n >= kMaxLocalVocab) {  // ids and row offsets travel as exact floats
        m.status = ft::kTooLarge;
        return m;
    }
    const bool bias = (flags & ft::kBias) != 0;
    m.base = ft::plan(n, d, v, elt, flags | ft::kBackward, hw,
                      [&](uint64_t vr, uint64_t bn) -> uint64_t {
                          CubeGradPlan s;
                          return layout_grad(&s, vr, bn, elt, flags);
                      });
    if (m.base.status != ft::kOk) {
        m.status = m.base.status;
        return m;
    }
    layout_grad(&m, m.base.vec_rows, m.base.base_n, elt, flags);
    ft::Plan& p = m.base;
    uint64_t cores = p.m_blocks > p.n_blocks ? p.m_blocks : p.n_blocks;
    if (cores > hw.cube_cores) cores = hw.cube_cores;
    if (cores == 0) cores = 1;
    p.used_cores = static_cast<uint32_t>(cores);
    const uint64_t tile = static_cast<uint64_t>(p.base_m) * p.base_n;
    m.ws_ring = ft::align_up(cores * kRingSlots * tile * 4, ft::kGmAlign);
    m.ws_dz = ft::align_up(cores * kRingSlots * tile * elt, ft::kGmAlign);
    m.ws_db = bias ? ft::align_up(2 * v * 4, ft::kGmAlign) : 0;
    m.ws_total = m.ws_ring + m.ws_dz + m.ws_db;
    m.dw_workspace_bytes = 0;
    plan_keep_dz(&m, n, v, elt, bias);
    m.status = ft::kOk;
    return m;
}

// L1 bytes of one base block of a Norm-template Matmul operand, A (`is_a`: baseM x baseK) or B (baseK x baseN), as
// the library sizes its L1 buffers (asc-devkit stage/copy_cube_in/base/copy_cube_in_params_base.h GetBaseSize =
// GetBaseHeightAlign x GetBaseWidthAlign, both taken on the untransposed base shape whatever `trans`, the MatmulType's
// isTrans). float32: A's baseM aligned to 16 and its baseK to 16 if A is transposed, else to c0 = 8; B's baseN aligned
// to c0 = 8 and its baseK to 16 if B is not transposed, else not at all. 16-bit operands take the block as it is.
// The twin's Matmul (tests/support/ascendc_twin/kernel/lib/matmul_intf.h) sizes its L1 check with this function.
inline uint64_t l1_block_bytes(bool is_a, bool trans, uint64_t base_mn, uint64_t base_k, uint32_t elt) {
    if (elt != 4) return base_mn * base_k * elt;
    if (is_a) return ft::align_up(base_mn, 16) * ft::align_up(base_k, trans ? 16 : 8) * 4;
    return ft::align_up(base_mn, 8) * (trans ? base_k : ft::align_up(base_k, 16)) * 4;
}

}  // namespace cube
}  // namespace fused_lce

#endif  // FUSED_LCE_CUBE_TILING_H_
