// Tiling math of the fused linear-cross-entropy AscendC kernels (csrc/ascend/), in plain C++17 with no CANN
// include, so that the same code runs in the op_host tiling function, in the kernels (index helpers only) and in
// the g++ unit tests (tests/ascend/tiling_test.cpp) and the CPU twin's harness (tests/support/ascendc_twin).
//
// Work decomposition (both kernels):
//   * cube tile: base_m tokens x base_n vocabulary rows, K = hidden dim in chunks of base_k, fp32 result in L0C;
//   * each AI core (cube) serves vec_per_cube vector cores; each vector core gets vec_rows = base_m / vec_per_cube
//     rows of every C tile in its unified buffer (UB) and does all softmax math in float32;
//   * task = (token block m, vocabulary segment s). A task walks the vocabulary blocks of its segment in increasing
//     order with an online softmax. Segments exist only to keep cores busy when there are fewer token blocks than
//     cores; their partial statistics are merged in segment order (s = 0, 1, ...) by a finishing phase.
//   * task t runs on core t % used_cores; consecutive tasks run at the same time, so with one segment the cores
//     sweep the same weight block together (it is read from HBM once and shared through L2).
#ifndef FUSED_LCE_TILING_H_
#define FUSED_LCE_TILING_H_

#include <cstdint>

#ifndef FUSED_LCE_HD
#define FUSED_LCE_HD  // the kernels define this as __aicore__ before including the header
#endif

namespace fused_lce {
namespace tiling {

// Per-core memories of one AI core (cube) and its vector cores. Defaults: Atlas A2 (910B) / A3. op_host fills
// this from platform_ascendc::PlatformAscendC so other parts get their own numbers.
struct HwSpec {
    uint32_t cube_cores = 24;
    uint32_t vec_per_cube = 2;
    uint64_t ub_bytes = 192 * 1024;   // unified buffer of one vector core
    uint64_t l1_bytes = 512 * 1024;
    uint64_t l0a_bytes = 64 * 1024;
    uint64_t l0b_bytes = 64 * 1024;
    uint64_t l0c_bytes = 128 * 1024;
};

enum Flags : uint32_t {
    kBias = 1u,           // a bias vector is added to the logits (in fp32)
    kSmoothing = 2u,      // sum of logits per token is needed (label smoothing)
    kSoftcap = 4u,        // logits -> c * tanh(z / c)
    kBackward = 8u,       // plan for the gradient kernel
};

enum Status : int32_t {
    kOk = 0,
    kBadDtype = 1,        // element size must be 2 (bf16/fp16) or 4 (fp32)
    kEmptyDim = 2,        // D == 0 or V == 0 (N == 0 is fine: zero tasks)
    kTooLarge = 3,        // a size exceeds the 32-bit limits of the Matmul API (or the cube planners' 2^24)
    kNoFit = 4,           // no tile fits the on-chip memories
    kStrideLimit = 5,     // D >= 65535: the cube operands' row stride does not fit the GM -> L1 copy's 16-bit field
};

// The largest row stride (elements) of a cube operand that the GM -> L1 ND -> NZ copy takes in one instruction on
// dav-2201: Nd2NzParams::srcDValue is 16 bits and the Matmul library copies row by row from 65535 on, but only
// under MatmulConfig::intrinsicsCheck (asc-devkit stage/copy_cube_in/copy_tile_to_cube/data_copy_wrapper_nd.h). h and
// W (row stride D) are read with the default config, so D must stay below it.
constexpr uint64_t kMaxOperandStride = 65534;

// UB headroom left to the Matmul client (message queues) and the vector APIs' own scratch.
constexpr uint64_t kUbReserved = 16 * 1024;
constexpr uint64_t kUbAlign = 32;          // UB allocations are 32-byte blocks
constexpr uint64_t kGmAlign = 512;         // workspace slices start on 512-byte boundaries
constexpr uint32_t kUbNone = 0xffffffffu;  // offset of a UB region the plan does not allocate (never a valid view)
constexpr uint32_t kMinBase = 16;          // cube fractal edge

// The plan. Plain old data: op_host copies it verbatim into the tiling buffer, the kernels read it from there.
struct Plan {
    // problem
    uint64_t n, d, v;             // tokens, hidden size, vocabulary rows held by this rank
    uint32_t elt_bytes;           // 2 (bf16 / fp16) or 4 (fp32)
    uint32_t flags;
    // cube tile
    uint32_t base_m, base_n, base_k;
    uint32_t base_d;              // backward: column chunk of the dX / dW GEMM outputs
    uint32_t depth_k;             // base_k chunks staged in L1 per operand and buffer
    uint32_t l0c_buffers;         // 2: the next tile accumulates while the previous one drains
    uint32_t a_resident;          // 1: the token block's hidden rows stay in L1 for the whole vocabulary sweep
    uint32_t vec_rows;            // C-tile rows per vector core
    // grid
    uint64_t m_blocks, n_blocks;  // token blocks, vocabulary blocks
    uint64_t tail_m, tail_n;      // rows of the last token block, columns of the last vocabulary block
    uint64_t segments, seg_blocks, tasks;
    uint32_t used_cores, cube_cores;
    // on-chip bytes used (UB: one vector core's, under the caller's layout)
    uint64_t l1_used, l0a_used, l0b_used, l0c_used, ub_used;
    int32_t status;
    uint32_t pad_;
};

FUSED_LCE_HD inline uint64_t ceil_div(uint64_t a, uint64_t b) { return b == 0 ? 0 : (a + b - 1) / b; }
FUSED_LCE_HD inline uint64_t align_up(uint64_t a, uint64_t b) { return ceil_div(a, b) * b; }

// ---- index helpers used by the kernels -----------------------------------------------------------------------
FUSED_LCE_HD inline void task_coords(const Plan& p, uint64_t t, uint64_t* m_idx, uint64_t* s_idx) {
    *m_idx = t / p.segments;
    *s_idx = t % p.segments;
}
// vocabulary blocks [*nb0, *nb1) of segment s
FUSED_LCE_HD inline void segment_blocks(const Plan& p, uint64_t s, uint64_t* nb0, uint64_t* nb1) {
    uint64_t b0 = s * p.seg_blocks;
    uint64_t b1 = b0 + p.seg_blocks;
    *nb0 = b0 < p.n_blocks ? b0 : p.n_blocks;
    *nb1 = b1 < p.n_blocks ? b1 : p.n_blocks;
}
FUSED_LCE_HD inline uint64_t block_rows(const Plan& p, uint64_t m_idx) {
    return m_idx + 1 == p.m_blocks ? p.tail_m : p.base_m;
}
FUSED_LCE_HD inline uint64_t block_cols(const Plan& p, uint64_t nb) {
    return nb + 1 == p.n_blocks ? p.tail_n : p.base_n;
}
// first row (within the token block) and row count handled by vector core `sub` (0 .. vec_per_cube-1)
FUSED_LCE_HD inline void vec_rows_of(const Plan& p, uint64_t rows, uint32_t sub, uint64_t* r0, uint64_t* nr) {
    uint64_t a = static_cast<uint64_t>(sub) * p.vec_rows;
    uint64_t b = a + p.vec_rows;
    if (a > rows) a = rows;
    if (b > rows) b = rows;
    *r0 = a;
    *nr = b - a;
}

// ---- planner (host only) ----------------------------------------------------------------------------------------
// Plan for N tokens, hidden size D, V vocabulary rows on this rank. Never throws; check `status`.
// `ub_bytes(vec_rows, base_n)` gives the UB bytes one vector core needs for that tile under the kernel's own layout
// (fused_lce_cube_tiling.h lays out each kernel's UB): the kernels' layouts are the only ones, so a tile is taken
// exactly when the layout it will run with fits, with kUbReserved left over.
template <typename UbBytes>
inline Plan plan(uint64_t n, uint64_t d, uint64_t v, uint32_t elt_bytes, uint32_t flags, const HwSpec& hw,
                 const UbBytes& ub_bytes) {
    Plan p{};
    p.n = n;
    p.d = d;
    p.v = v;
    p.elt_bytes = elt_bytes;
    p.flags = flags;
    p.cube_cores = hw.cube_cores;
    if (elt_bytes != 2 && elt_bytes != 4) {
        p.status = kBadDtype;
        return p;
    }
    if (d == 0 || v == 0) {
        p.status = kEmptyDim;
        return p;
    }
    // the Matmul API takes int32 shapes: K = D and the vocabulary offsets of one rank must fit
    if (d > 0x7fffffffull || v > 0x7fffffffull || hw.cube_cores == 0 || hw.vec_per_cube == 0) {
        p.status = kTooLarge;
        return p;
    }
    if (d > kMaxOperandStride) {
        p.status = kStrideLimit;
        return p;
    }
    const bool bwd = (flags & kBackward) != 0;
    const uint64_t ub_budget = hw.ub_bytes > kUbReserved ? hw.ub_bytes - kUbReserved : 0;
    const uint64_t m_cap = n == 0 ? kMinBase : align_up(n, kMinBase);  // no 128-row tiles for 5 tokens
    const uint64_t d16 = align_up(d, kMinBase);
    static const uint32_t kBm[] = {128, 64, 32, 16};
    static const uint32_t kBn[] = {256, 128, 64, 32, 16};
    static const uint32_t kBk[] = {256, 128, 64, 32, 16};
    static const uint32_t kDepth[] = {8, 4, 2, 1};

    // Two passes: first only tiles whose float C fits L0C twice (the next tile accumulates while the previous one
    // drains), then any tile that fits once.
    bool found = false;
    for (int pass = 0; pass < 2 && !found; ++pass)
    for (uint32_t bm0 : kBm) {
        uint64_t bm = bm0 < m_cap ? bm0 : m_cap;
        if (bm % (8ull * hw.vec_per_cube) != 0) continue;  // each vector core's rows fill whole 32-byte blocks
        for (uint32_t bn : kBn) {
            if (bm * bn * 4 * (pass == 0 ? 2 : 1) > hw.l0c_bytes) continue;
            uint64_t vr = ceil_div(bm, hw.vec_per_cube);
            const uint64_t ub = ub_bytes(vr, static_cast<uint64_t>(bn));
            if (ub > ub_budget) continue;
            uint64_t bk = 0;
            for (uint32_t k : kBk) {
                if (k > d16 && k != kMinBase) continue;
                if (bm * k * elt_bytes * 2 <= hw.l0a_bytes && bn * k * elt_bytes * 2 <= hw.l0b_bytes) {
                    bk = k;
                    break;
                }
            }
            if (bk == 0) continue;
            uint64_t bd = 0;
            if (bwd) {
                uint64_t rows = bm > bn ? bm : bn;
                for (uint32_t c : kBk) {
                    if (c > d16 && c != kMinBase) continue;
                    if (rows * c * 4 * 2 <= hw.l0c_bytes) {
                        bd = c;
                        break;
                    }
                }
                if (bd == 0) continue;
            }
            // L1: the token block's rows stay resident when they fit in half of L1; the weight streams through
            // the rest in double-buffered depth_k * base_k slices (and so does the hidden block otherwise)
            const uint64_t kd = align_up(d, bk);
            const uint64_t a_res_bytes = bm * kd * elt_bytes;
            const bool a_res = a_res_bytes <= hw.l1_bytes / 2;
            uint64_t depth = 0, l1 = 0;
            for (uint32_t dk : kDepth) {
                if (dk > 1 && static_cast<uint64_t>(dk) * bk > kd) continue;
                uint64_t slice = static_cast<uint64_t>(dk) * bk * elt_bytes * 2;
                uint64_t need = (a_res ? a_res_bytes : bm * slice) + bn * slice;
                if (need <= hw.l1_bytes) {
                    depth = dk;
                    l1 = need;
                    break;
                }
            }
            if (depth == 0) continue;
            p.base_m = static_cast<uint32_t>(bm);
            p.base_n = bn;
            p.base_k = static_cast<uint32_t>(bk);
            p.base_d = static_cast<uint32_t>(bd);
            p.depth_k = static_cast<uint32_t>(depth);
            p.a_resident = a_res ? 1u : 0u;
            p.l0c_buffers = bm * bn * 4 * 2 <= hw.l0c_bytes ? 2u : 1u;
            p.vec_rows = static_cast<uint32_t>(vr);
            p.l1_used = l1;
            p.l0a_used = bm * bk * elt_bytes * 2;
            p.l0b_used = bn * bk * elt_bytes * 2;
            p.l0c_used = bm * bn * 4 * p.l0c_buffers;
            if (bwd) {
                uint64_t rows = bm > bn ? bm : bn;
                uint64_t out = rows * bd * 4 * 2;
                if (out > p.l0c_used) p.l0c_used = out;
            }
            p.ub_used = ub;
            found = true;
            break;
        }
        if (found) break;
    }
    if (!found) {
        p.status = kNoFit;
        return p;
    }

    // grid
    p.m_blocks = ceil_div(n, p.base_m);
    p.n_blocks = ceil_div(v, p.base_n);
    p.tail_m = n == 0 ? 0 : n - (p.m_blocks - 1) * p.base_m;
    p.tail_n = v - (p.n_blocks - 1) * p.base_n;
    uint64_t segs = 1;
    if (p.m_blocks > 0 && p.m_blocks < hw.cube_cores) {
        segs = hw.cube_cores / p.m_blocks;
        if (segs > p.n_blocks) segs = p.n_blocks;
        if (segs < 1) segs = 1;
    }
    p.seg_blocks = ceil_div(p.n_blocks, segs);
    p.segments = ceil_div(p.n_blocks, p.seg_blocks);  // no empty segment
    p.tasks = p.m_blocks * p.segments;
    p.used_cores = static_cast<uint32_t>(p.tasks < hw.cube_cores ? p.tasks : hw.cube_cores);

    p.status = kOk;
    return p;
}

inline const char* status_text(int32_t status) {
    switch (status) {
        case kOk: return "ok";
        case kBadDtype: return "element size must be 2 (bf16/fp16) or 4 (fp32)";
        case kEmptyDim: return "hidden size and vocabulary size must be > 0";
        case kTooLarge:
            return "a dimension exceeds the int32 Matmul limits, or V_local (backward: also N) reaches 2^24, where ids "
                   "stop being exact floats";
        case kNoFit: return "no tile fits the on-chip memories of this part";
        case kStrideLimit:
            return "hidden size D >= 65535: the row stride of h and W does not fit Nd2NzParams::srcDValue (16 bits) "
                   "of the cube's GM -> L1 copy on Atlas A2";
        default: return "unknown status";
    }
}

}  // namespace tiling
}  // namespace fused_lce

#endif  // FUSED_LCE_TILING_H_
