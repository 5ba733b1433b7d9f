// FusedLceStatsCube: the forward statistics kernel driven by the cube (MIX, 1 cube : 2 vector cores). Status: compiled
// and run on CPU against the AscendC API twin (tests/support/ascendc_twin, tests/ascend); not run on NPU hardware.
//
// The loss and log-prob statistics of z = softcap(h W^T + b) / T and the entropy sum ez = sum_j exp(z_j - m)
// max(z_j - m, -104). Outputs per token of this rank's vocabulary: max, sum exp(z - max), target logit (0 when the
// label is not in this shard), sum of logits (0 unless withZsum), first argmax (shard-local int32), ez (0 unless
// withEz).
//
// Tasks (token block, vocabulary segment) are those of fused_lce::tiling::plan, task t on AI core t % used_cores.
//   * cube core (AIC): for each vocabulary block of its tasks, in order, MatmulImpl computes the whole
//     (block rows x base_n) logit tile with fp32 accumulation into slot k % 2 of its GM ring and sets flag kFull
//     (mode 2, after the fixpipe); before reusing a slot it waits until both vector cores have copied it out
//     (kFree + slot). So the GEMM of tiles k + 1 and k + 2 runs while the vector cores work on tile k. This is the
//     hand-off of hicann/ops-nn matmul/fused_linear_online_max_sum/op_kernel/fused_linear_online_max_sum.h
//     (CVProcess: CrossCoreSetFlag<SYNC_MODE2, PIPE_FIX> / CrossCoreWaitFlag, two ping-pong slots).
//   * vector cores (AIV): each waits for kFull, copies its vec_rows rows of the slot to UB, hands the slot back
//     (kFree, set on MTE2 right after the copy), and updates its rows' running statistics with whole-tile level-0
//     instructions (fused_lce_cube_aiv.h): bias, softcap, temperature, row max / first argmax, exp(z - m), the row
//     sums, the target logit by Gather; no per-row scalar loop per tile (labels are read by the scalar unit once per
//     task).
// With several segments the partial statistics go to the workspace and, after SyncAll of the vector cores, a
// vectorised finishing phase merges them in segment order (no atomics: the result does not depend on core timing).
// z cache (optional last output zCache, fp32 [N, V_local] row-major; nullptr: off): the cube writes each tile there
// instead of the ring slot (SetOrgShape's orgKc = V_local sets C's row stride, asc-devkit docs Matmul-Kernel侧接口/
// SetOrgShape.md) and the vector cores read their rows from it (DataCopyPad at row stride V_local); the flags and the
// slot hand-back stay as with the ring (they pace the cube). It holds the cube's raw h W^T, before bias, softcap and
// temperature: FusedLceGradCube takes it (its zCache input) in place of its logit GEMMs and applies those itself, so
// its gradients are bitwise those of recomputing.
#define FUSED_LCE_HD __aicore__
#include "kernel_operator.h"
#include "lib/matmul_intf.h"
#include "../../common/fused_lce_cube_tiling_data.h"
#include "../../common/fused_lce_cube_aiv.h"

using namespace AscendC;
using namespace fused_lce_cube;
namespace ft = fused_lce::tiling;
namespace fc = fused_lce::cube;

namespace {
// Cross-core flag ids: not 11..14 (SyncAll's on Atlas A2) and no Matmul client objects here (they take 0 .. 2n-1).
constexpr uint16_t kFlagFull = 5;  // AIC -> its AIVs: a tile is in the ring (FIFO count, one per tile)
constexpr uint16_t kFlagFree = 6;  // AIVs -> AIC: slot s (id kFlagFree + s) may be overwritten

enum CubeSlot : uint32_t {
    kM = 0, kS, kZt, kZs, kAm, kEz,      // running statistics (argmax as a float id: exact below 2^24)
    kMNew, kShift, kDm, kEdm, kTmp,      // online update
    kTmax, kTidx, kCv, kCi, kRed, kTile, // tile reductions
    kLab, kRowBase, kYrel, kOff, kGat,   // target logit (label as float, -1 when not in the shard)
    kSlotsUsed
};
static_assert(kSlotsUsed <= fc::kCubeSlots, "row slots");
constexpr uint32_t kPart = kMNew;        // finishing phase: the six partial planes, then temporaries
}  // namespace

template <typename T, typename LabelT>
class FusedLceStatsCubeKernel {
public:
    using AType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T>;
    using BType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T, true>;  // W is (V, D): transposed B
    using CType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, float>;

    __aicore__ inline void Init(GM_ADDR hidden, GM_ADDR weight, GM_ADDR bias, GM_ADDR labels, GM_ADDR* outs,
                                GM_ADDR workspace, const FusedLceStatsCubeTilingData* td) {
        td_ = td;
        mp_ = &td->plan;
        p_ = &td->plan.base;
        hGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(hidden));
        wGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(weight));
        if (td->hasBias) bGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(bias));
        yGm_.SetGlobalBuffer(reinterpret_cast<__gm__ LabelT*>(labels));
        for (int k = 0; k < 6; ++k) out_[k].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outs[k]));
        zc_ = td->hasZCache != 0;  // presence by tiling (an absent optional's address need not be null)
        plainTiling_ = (td->variant & fc::kPlainTiling) != 0;
        if (zc_) zcGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outs[6]));
        // workspace: [partial statistics: plane k of segment s at k * segments * N + s * N][ring: per AI core two
        // slots of base_m x base_n floats]
        wsStats_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace));
        ring_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace + mp_->ws_stats));
        core_ = ASCEND_IS_AIC ? static_cast<uint64_t>(GetBlockIdx()) : GetBlockIdx() / GetTaskRation();
        tileElems_ = static_cast<uint64_t>(p_->base_m) * p_->base_n;
        // tiles this AI core runs (the cube and both vector cores walk the same sequence)
        total_ = 0;
        for (uint64_t t = core_; t < p_->tasks; t += p_->used_cores) {
            uint64_t mIdx, sIdx, nb0, nb1;
            ft::task_coords(*p_, t, &mIdx, &sIdx);
            ft::segment_blocks(*p_, sIdx, &nb0, &nb1);
            total_ += nb1 - nb0;
        }
    }

    // ---- cube core --------------------------------------------------------------------------------------------
    __aicore__ inline void ProcessCube(TPipe* pipe) {
        matmul::MatmulImpl<AType, BType, CType> mm;
        mm.Init(&td_->mmLogits, pipe);
        if (zc_) {  // C rows at the cache's row stride V_local (A, B strides as the tiling's)
            const AscendC::tiling::TCubeTiling& t = td_->mmLogits;
            mm.SetOrgShape(t.M, t.N, t.Ka, t.Kb, p_->v);
        }
        uint64_t k = 0;
        for (uint64_t t = core_; t < p_->tasks; t += p_->used_cores) {
            uint64_t mIdx, sIdx, nb0, nb1;
            ft::task_coords(*p_, t, &mIdx, &sIdx);
            ft::segment_blocks(*p_, sIdx, &nb0, &nb1);
            const uint64_t row0 = mIdx * p_->base_m;
            if (plainTiling_) {  // the conservative variant: one GEMM per tile, GetTiling's tiling as it is
                for (uint64_t nb = nb0; nb < nb1; ++nb, ++k) {
                    mm.SetTensorA(hGm_[row0 * p_->d]);
                    mm.SetTensorB(wGm_[nb * p_->base_n * p_->d], true);
                    mm.SetTail(ft::block_rows(*p_, mIdx), ft::block_cols(*p_, nb), p_->d);
                    Tile(mm, row0, nb, k);
                    mm.End();
                }
                continue;
            }
            // one GEMM per task: the token block's rows against the segment's vocabulary rows, one base_m x base_n
            // tile per Iterate (the segment has one M tile, so the tiles come in vocabulary order); with the
            // tiling's depthA1 / stepN of fused_lce_cube_tiling_data.h keep_a_resident the hidden rows stay in L1
            // for the whole segment instead of being copied in again for every tile
            mm.SetTensorA(hGm_[row0 * p_->d]);
            mm.SetTensorB(wGm_[nb0 * p_->base_n * p_->d], true);
            mm.SetTail(ft::block_rows(*p_, mIdx), ft::block_cols(*p_, nb1 - 1) + (nb1 - 1 - nb0) * p_->base_n,
                       p_->d);
            for (uint64_t nb = nb0; nb < nb1; ++nb, ++k) Tile(mm, row0, nb0, k);
            mm.End();
        }
    }

    // The next tile of the current GEMM into ring slot k % 2 (or, with the z cache, into the cache at (row0, the
    // GEMM's first column origin nb0 * base_n): the library offsets each tile by its place in the GEMM), then kFull.
    template <class MM>
    __aicore__ inline void Tile(MM& mm, uint64_t row0, uint64_t nb0, uint64_t k) {
        const uint32_t slot = static_cast<uint32_t>(k % fc::kRingSlots);
        if (k >= fc::kRingSlots) CrossCoreWaitFlag(kFlagFree + slot);  // both AIVs copied tile k - 2 out
        mm.template Iterate<true>();
        if (zc_) {
            mm.GetTensorC(zcGm_[row0 * p_->v + nb0 * p_->base_n]);
        } else {  // rows at the tile's own width (the last vocabulary block's: its tail width)
            mm.GetTensorC(ring_[(core_ * fc::kRingSlots + slot) * tileElems_], 0, true);
        }
        CrossCoreSetFlag<2, PIPE_FIX>(kFlagFull);
    }

    // ---- vector cores -----------------------------------------------------------------------------------------
    __aicore__ inline void InitVector(TPipe* pipe) {
        pipe->InitBuffer(ub_, mp_->ub_end);
        const uint32_t tile = p_->vec_rows * p_->base_n;
        stride_ = mp_->slot_stride;
        z_ = ub_.GetWithOffset<float>(tile, mp_->ub_z);
        w_ = ub_.GetWithOffset<float>(tile, mp_->ub_w);
        if (mp_->ub_w2 != ft::kUbNone) w2_ = ub_.GetWithOffset<float>(tile, mp_->ub_w2);
        if (td_->hasBias) {
            biasIn_ = ub_.GetWithOffset<T>(static_cast<uint32_t>(ft::align_up(p_->base_n, 16)), mp_->ub_bias);
            if constexpr (IsSameType<T, float>::value) {
                biasF32_ = biasIn_;
            } else {
                biasF32_ = ub_.GetWithOffset<float>(p_->base_n, mp_->ub_bias_f32);
            }
        }
        bc_ = ub_.GetWithOffset<float>(static_cast<uint32_t>(ft::align_up(p_->vec_rows, 8) * 8), mp_->ub_bc);
        for (uint32_t i = 0; i < 4; ++i)
            mask_[i] = ub_.GetWithOffset<uint8_t>(fc::kMaskBytes, mp_->ub_mask + i * fc::kMaskBytes);
        slots_ = ub_.GetWithOffset<float>(stride_ * fc::kCubeSlots, mp_->ub_slots);
        // every slot defined (rows past a tile's last row are computed on but never written out); row byte offsets
        // of the tile for the target Gather
        Duplicate(slots_, 0.0f, stride_ * fc::kCubeSlots);
        PipeBarrier<PIPE_V>();
        CreateVecIndex(S(kRowBase), 0.0f, stride_);
        PipeBarrier<PIPE_V>();
        Muls(S(kRowBase), S(kRowBase), static_cast<float>(p_->base_n * sizeof(float)), stride_);
        PipeBarrier<PIPE_V>();
    }

    __aicore__ inline void ProcessVector() {
        const uint32_t sub = GetSubBlockIdx();
        uint64_t k = 0;
        for (uint64_t t = core_; t < p_->tasks; t += p_->used_cores) {
            uint64_t mIdx, sIdx, r0, nr, nb0, nb1;
            ft::task_coords(*p_, t, &mIdx, &sIdx);
            ft::vec_rows_of(*p_, ft::block_rows(*p_, mIdx), sub, &r0, &nr);
            ft::segment_blocks(*p_, sIdx, &nb0, &nb1);
            const uint64_t row0 = mIdx * p_->base_m + r0;
            const uint32_t rows = static_cast<uint32_t>(nr);
            if (rows > 0) StartTask(row0, rows);
            for (uint64_t nb = nb0; nb < nb1; ++nb, ++k) {
                const uint32_t slot = static_cast<uint32_t>(k % fc::kRingSlots);
                const uint64_t c0 = nb * p_->base_n;
                const uint32_t cols = static_cast<uint32_t>(ft::block_cols(*p_, nb));
                CrossCoreWaitFlag(kFlagFull);
                Order<HardEvent::V_MTE2>();  // the previous tile's vector reads of z and the bias are done
                if (rows > 0 && zc_) {  // rows at stride V_local
                    CopyRows(z_, zcGm_[row0 * p_->v + c0], rows, cols, p_->v, p_->base_n);
                } else if (rows > 0) {  // the tile's rows at its own width
                    CopyRows(z_, ring_[(core_ * fc::kRingSlots + slot) * tileElems_ + r0 * cols], rows, cols, cols,
                             p_->base_n);
                }
                // the slot is free once this core's copy is done (MTE2); the cube waits for both vector cores
                if (k + fc::kRingSlots < total_) CrossCoreSetFlag<2, PIPE_MTE2>(kFlagFree + slot);
                if (rows == 0) continue;
                if (td_->hasBias)
                    DataCopyPad(biasIn_, bGm_[c0], DataCopyExtParams(1, cols * sizeof(T), 0, 0, 0), NoPad<T>());
                Order<HardEvent::MTE2_V>();
                Tile(rows, cols, static_cast<float>(c0));
            }
            if (rows == 0) continue;
            if (p_->segments == 1) {
                WriteStats(row0, rows, nullptr, 0);
            } else {
                WriteStats(row0, rows, &wsStats_, sIdx * p_->n);
            }
        }
        if (p_->segments > 1) {
            SyncAll();  // every segment's partial statistics are in the workspace
            Finish(core_ * GetTaskRation() + sub, static_cast<uint64_t>(p_->used_cores) * GetTaskRation());
        }
    }

private:
    __aicore__ inline LocalTensor<float> S(uint32_t slot) const { return slots_[slot * stride_]; }

    // Labels of the task's rows as float shard-local ids (-1 outside the shard) and the statistics reset.
    __aicore__ inline void StartTask(uint64_t row0, uint32_t rows) {
        Order<HardEvent::V_S>();     // the previous task's vector reads of the label slot are done
        Order<HardEvent::MTE3_V>();  // and its statistics have left the slots
        LocalTensor<float> lab = S(kLab);
        const int64_t v = static_cast<int64_t>(p_->v);
        for (uint32_t r = 0; r < rows; ++r) {
            const int64_t y = static_cast<int64_t>(yGm_.GetValue(row0 + r)) - td_->vocabStart;
            lab.SetValue(r, (y >= 0 && y < v) ? static_cast<float>(y) : -1.0f);
        }
        Order<HardEvent::S_V>();
        Duplicate(S(kM), NegInf(), stride_);
        Duplicate(slots_[kS * stride_], 0.0f, stride_ * (kEz - kS + 1));  // s, zt, zs, argmax, ez
        PipeBarrier<PIPE_V>();
    }

    // One tile of `rows` rows, shard-local columns [c0, c0 + cols), in z_.
    __aicore__ inline void Tile(uint32_t rows, uint32_t cols, float c0) {
        const uint32_t bn = p_->base_n, count = rows * bn;
        const uint32_t st = stride_;
        if (td_->hasBias) {
            if constexpr (!IsSameType<T, float>::value) {
                Cast(biasF32_, biasIn_, RoundMode::CAST_NONE, cols);  // bf16 / fp16 -> float is exact
                PipeBarrier<PIPE_V>();
            }
            RowBroadcast(RowOp::kAdd, z_, z_, biasF32_, false, rows, cols, bn);
            PipeBarrier<PIPE_V>();
        }
        if (td_->softcap > 0.0f) {  // z = (c / T) tanh(z / c)
            Muls(z_, z_, 1.0f / td_->softcap, count);
            PipeBarrier<PIPE_V>();
            Tanh(w2_, z_, count);
            PipeBarrier<PIPE_V>();
            Muls(z_, w2_, td_->softcap * td_->invTemperature, count);
            PipeBarrier<PIPE_V>();
        } else if (td_->invTemperature != 1.0f) {
            Muls(z_, z_, td_->invTemperature, count);
            PipeBarrier<PIPE_V>();
        }
        // tile max and first argmax per row; the running argmax moves only on a strictly larger max
        RowMaxArgmax(S(kTmax), S(kTidx), z_, rows, cols, bn, st, S(kCv), S(kCi), mask_[0]);
        PipeBarrier<PIPE_V>();
        Compare(mask_[1], S(kTmax), S(kM), CMPMODE::GT, st);
        Adds(S(kTidx), S(kTidx), c0, st);
        Max(S(kMNew), S(kTmax), S(kM), st);  // a NaN tile max propagates
        PipeBarrier<PIPE_V>();
        Select(S(kAm), mask_[1], S(kTidx), S(kAm), SELMODE::VSEL_TENSOR_TENSOR_MODE, st);
        Maxs(S(kShift), S(kMNew), kMinFinite, st);  // finite: rows still at -inf give exp(-inf) = 0, not NaN
        PipeBarrier<PIPE_V>();
        Sub(S(kDm), S(kM), S(kShift), st);
        Brcb(bc_, S(kShift), ft::ceil_div(rows, 8), BrcbRepeatParams(1, 8));
        PipeBarrier<PIPE_V>();
        Maxs(S(kDm), S(kDm), kExpFloor, st);
        RowBroadcast(RowOp::kSub, w_, z_, bc_, true, rows, cols, bn);  // w = z - m_new
        if (td_->withZsum) {
            RowSum(S(kTile), z_, rows, cols, bn, st, S(kRed));
            PipeBarrier<PIPE_V>();
            Add(S(kZs), S(kZs), S(kTile), st);
        }
        PipeBarrier<PIPE_V>();
        Exp(S(kEdm), S(kDm), st);
        const bool ez = td_->withEz != 0;
        if (ez) {
            Exp(w2_, w_, count);  // e = exp(z - m); w becomes max(z - m, -104) * e
            PipeBarrier<PIPE_V>();
            Maxs(w_, w_, kExpFloor, count);
            Mul(S(kTmp), S(kDm), S(kS), st);  // ez -> e^{dm} (ez + dm s) + tile
            PipeBarrier<PIPE_V>();
            Mul(w_, w_, w2_, count);
            Add(S(kEz), S(kEz), S(kTmp), st);
            PipeBarrier<PIPE_V>();
            Mul(S(kEz), S(kEz), S(kEdm), st);
            RowSum(S(kTile), w_, rows, cols, bn, st, S(kRed));
            PipeBarrier<PIPE_V>();
            Add(S(kEz), S(kEz), S(kTile), st);
            PipeBarrier<PIPE_V>();
        } else {
            Exp(w_, w_, count);
            PipeBarrier<PIPE_V>();
        }
        // s = s e^{m_old - m_new} + sum_j exp(z_j - m_new)
        Mul(S(kS), S(kS), S(kEdm), st);
        RowSum(S(kTile), ez ? w2_ : w_, rows, cols, bn, st, S(kRed));
        PipeBarrier<PIPE_V>();
        Add(S(kS), S(kS), S(kTile), st);
        Adds(S(kM), S(kMNew), 0.0f, st);
        // target logit: z[r, label_r - c0] by Gather where the label falls in [c0, c0 + cols)
        Adds(S(kYrel), S(kLab), -c0, st);
        PipeBarrier<PIPE_V>();
        Compares(mask_[2], S(kYrel), 0.0f, CMPMODE::GE, st);
        Compares(mask_[3], S(kYrel), static_cast<float>(cols), CMPMODE::LT, st);
        Maxs(S(kOff), S(kYrel), 0.0f, st);
        PipeBarrier<PIPE_V>();
        Mins(S(kOff), S(kOff), static_cast<float>(cols - 1), st);
        PipeBarrier<PIPE_V>();
        Muls(S(kOff), S(kOff), static_cast<float>(sizeof(float)), st);
        PipeBarrier<PIPE_V>();
        Add(S(kOff), S(kOff), S(kRowBase), st);
        PipeBarrier<PIPE_V>();
        LocalTensor<int32_t> off = S(kOff).template ReinterpretCast<int32_t>();
        Cast(off, S(kOff), RoundMode::CAST_RINT, st);  // exact integers (< 2^24)
        PipeBarrier<PIPE_V>();
        Gather(S(kGat), z_, off.template ReinterpretCast<uint32_t>(), 0, rows);
        PipeBarrier<PIPE_V>();
        Select(S(kGat), mask_[2], S(kGat), 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, st);
        PipeBarrier<PIPE_V>();
        Select(S(kGat), mask_[3], S(kGat), 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, st);
        PipeBarrier<PIPE_V>();
        Add(S(kZt), S(kZt), S(kGat), st);
        PipeBarrier<PIPE_V>();
    }

    // The six statistics -> GM (MTE3): the outputs (argmax as int32), or the workspace planes at `wsOff` (float).
    __aicore__ inline void WriteStats(uint64_t row0, uint32_t rows, GlobalTensor<float>* ws, uint64_t wsOff) {
        if (ws == nullptr) {
            LocalTensor<int32_t> am = S(kAm).template ReinterpretCast<int32_t>();
            Cast(am, S(kAm), RoundMode::CAST_RINT, stride_);
            PipeBarrier<PIPE_V>();
        }
        Order<HardEvent::V_MTE3>();
        const DataCopyExtParams cp(1, rows * sizeof(float), 0, 0, 0);
        const uint64_t plane = p_->segments * p_->n;
        for (uint32_t k = 0; k < 6; ++k) {
            GlobalTensor<float> g = ws == nullptr ? out_[k][row0] : (*ws)[k * plane + wsOff + row0];
            DataCopyPad(g, S(kM + k), cp);
        }
    }

    // Finishing phase: worker `me` of `workers` merges its tokens over the segments in segment order, stride_ tokens
    // at a time: from maxima m_a, m_b to M = max: s = s_a e^{da} + s_b e^{db}, ez = e^{da}(ez_a + da s_a) +
    // e^{db}(ez_b + db s_b) with da = max(m_a - M, -104) (a partial at -inf contributes 0); the lower segment keeps
    // the argmax on ties.
    __aicore__ inline void Finish(uint64_t me, uint64_t workers) {
        const uint64_t per = ft::ceil_div(p_->n, workers);
        const uint64_t i0 = me * per < p_->n ? me * per : p_->n;
        const uint64_t i1 = i0 + per < p_->n ? i0 + per : p_->n;
        const uint64_t plane = p_->segments * p_->n;
        const uint32_t st = stride_;
        const uint32_t kBig = kPart + 6;  // M, shift, da, db, ea, eb, tmp
        LocalTensor<float> M = S(kBig), sh = S(kBig + 1), da = S(kBig + 2), db = S(kBig + 3);
        LocalTensor<float> ea = S(kBig + 4), eb = S(kBig + 5), tmp = S(kBig + 6);
        for (uint64_t t0 = i0; t0 < i1; t0 += st) {
            const uint32_t cnt = static_cast<uint32_t>(i1 - t0 < st ? i1 - t0 : st);
            const DataCopyExtParams cp(1, cnt * sizeof(float), 0, 0, 0);
            Order<HardEvent::MTE3_MTE2>();  // the previous chunk's results have left the slots
            for (uint64_t sg = 0; sg < p_->segments; ++sg) {
                const uint32_t into = sg == 0 ? kM : kPart;
                Order<HardEvent::V_MTE2>();
                for (uint32_t k = 0; k < 6; ++k)
                    DataCopyPad(S(into + k), wsStats_[k * plane + sg * p_->n + t0], cp, NoPad<float>());
                Order<HardEvent::MTE2_V>();
                if (sg == 0) continue;
                const LocalTensor<float> pm = S(kPart), ps = S(kPart + 1), pzt = S(kPart + 2), pzs = S(kPart + 3);
                const LocalTensor<float> pam = S(kPart + 4), pez = S(kPart + 5);
                Compare(mask_[0], pm, S(kM), CMPMODE::GT, st);
                Max(M, S(kM), pm, st);
                Add(S(kZt), S(kZt), pzt, st);
                Add(S(kZs), S(kZs), pzs, st);
                PipeBarrier<PIPE_V>();
                Select(S(kAm), mask_[0], pam, S(kAm), SELMODE::VSEL_TENSOR_TENSOR_MODE, st);
                Maxs(sh, M, kMinFinite, st);
                PipeBarrier<PIPE_V>();
                Sub(da, S(kM), sh, st);
                Sub(db, pm, sh, st);
                PipeBarrier<PIPE_V>();
                Maxs(da, da, kExpFloor, st);
                Maxs(db, db, kExpFloor, st);
                PipeBarrier<PIPE_V>();
                Exp(ea, da, st);
                Exp(eb, db, st);
                if (td_->withEz) {
                    Mul(da, da, S(kS), st);  // da s_a, db s_b
                    Mul(db, db, ps, st);
                    PipeBarrier<PIPE_V>();
                    Add(S(kEz), S(kEz), da, st);
                    Add(pez, pez, db, st);
                }
                PipeBarrier<PIPE_V>();
                Mul(S(kS), S(kS), ea, st);
                Mul(tmp, ps, eb, st);
                if (td_->withEz) {
                    Mul(S(kEz), S(kEz), ea, st);
                    Mul(pez, pez, eb, st);
                }
                PipeBarrier<PIPE_V>();
                Add(S(kS), S(kS), tmp, st);
                Adds(S(kM), M, 0.0f, st);
                if (td_->withEz) Add(S(kEz), S(kEz), pez, st);
                PipeBarrier<PIPE_V>();
            }
            LocalTensor<int32_t> am = S(kAm).template ReinterpretCast<int32_t>();
            Cast(am, S(kAm), RoundMode::CAST_RINT, st);
            PipeBarrier<PIPE_V>();
            Order<HardEvent::V_MTE3>();
            for (uint32_t k = 0; k < 6; ++k) DataCopyPad(out_[k][t0], S(kM + k), cp);
        }
    }

    const FusedLceStatsCubeTilingData* td_;
    const fc::CubePlan* mp_;
    const ft::Plan* p_;
    uint64_t core_ = 0, total_ = 0, tileElems_ = 0;
    uint32_t stride_ = 0;
    bool zc_ = false, plainTiling_ = false;
    GlobalTensor<T> hGm_, wGm_, bGm_;
    GlobalTensor<LabelT> yGm_;
    GlobalTensor<float> out_[6], wsStats_, ring_, zcGm_;
    TBuf<TPosition::VECCALC> ub_;
    LocalTensor<float> z_, w_, w2_, biasF32_, bc_, slots_;
    LocalTensor<T> biasIn_;
    LocalTensor<uint8_t> mask_[4];
};

extern "C" __global__ __aicore__ void fused_lce_stats_cube(GM_ADDR hidden, GM_ADDR weight, GM_ADDR bias, GM_ADDR labels,
                                                           GM_ADDR outMax, GM_ADDR outSum, GM_ADDR outTarget,
                                                           GM_ADDR outZsum, GM_ADDR outArgmax, GM_ADDR outEz,
                                                           GM_ADDR zCache, GM_ADDR workspace, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    REGISTER_TILING_DEFAULT(FusedLceStatsCubeTilingData);
    GET_TILING_DATA(td, tiling);
    GM_ADDR user = GetUserWorkspace(workspace);
    GM_ADDR outs[7] = {outMax, outSum, outTarget, outZsum, outArgmax, outEz, zCache};
    TPipe pipe;
    FusedLceStatsCubeKernel<DTYPE_HIDDEN, DTYPE_LABELS> op;
    op.Init(hidden, weight, bias, labels, outs, user, &td);
    if ASCEND_IS_AIC {
        op.ProcessCube(&pipe);
        return;
    }
    op.InitVector(&pipe);
    op.ProcessVector();
}
