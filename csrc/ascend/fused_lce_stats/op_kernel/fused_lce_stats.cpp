// FusedLceStats: the forward kernel (MIX, 1 cube : 2 vector cores). Status: written, not compiled here (no CANN
// toolkit), not run on hardware; npu_emulator.stats is its executable spec.
//
// For every task (token block m, vocabulary segment s) of the plan, in task order on core t % used_cores, each of
// the two vector cores takes vec_rows rows of the token block and, for every vocabulary block of the segment in
// increasing order:
//   1. drives the Matmul API: z = h[rows] @ W[cols].T, K = D in base_k chunks, float32 accumulation in L0C, result
//      delivered into its UB (C position VECIN) -- logits never go to global memory;
//   2. adds the bias and applies the softcap (float32);
//   3. updates the running max / sum-exp / target logit / sum of logits / first argmax of its rows.
// With one segment the task writes the outputs; otherwise it writes its partial statistics to the workspace and,
// after a full-core barrier, the finishing phase merges the segments of each token in segment order.
// Outputs (per token, this rank's vocabulary only): max, sum exp(z - max), target logit (0 when the label is not in
// this shard), sum of logits (0 unless with_zsum), first argmax as a shard-local int32 id.
#define FUSED_LCE_HD __aicore__
#include "kernel_operator.h"
#include "lib/matmul_intf.h"
#include "../../common/fused_lce_tiling_data.h"
#include "../../common/fused_lce_vec.h"

using namespace AscendC;
using namespace fused_lce_kernel;
namespace ft = fused_lce::tiling;

template <typename T, typename LabelT>
class FusedLceStatsKernel {
public:
    using AType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T>;
    using BType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T, true>;  // W is (V, D): transposed B
    using CType = matmul::MatmulType<TPosition::VECIN, CubeFormat::ND, float>;
    matmul::Matmul<AType, BType, CType> mm;

    __aicore__ inline void Init(GM_ADDR hidden, GM_ADDR weight, GM_ADDR bias, GM_ADDR labels, GM_ADDR outMax,
                                GM_ADDR outSum, GM_ADDR outTarget, GM_ADDR outZsum, GM_ADDR outArgmax,
                                GM_ADDR workspace, const FusedLceTilingData* td, TPipe* pipe) {
        td_ = td;
        p_ = &td->plan;
        hGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(hidden));
        wGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(weight));
        if (td->hasBias) bGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(bias));
        yGm_.SetGlobalBuffer(reinterpret_cast<__gm__ LabelT*>(labels));
        outMax_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outMax));
        outSum_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outSum));
        outTarget_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outTarget));
        outZsum_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outZsum));
        outArgmax_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(outArgmax));
        // partial statistics of segment s for token i at [s * N + i] in five planes (m, s, zt, zs, argmax)
        wsStats_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace));
        pipe->InitBuffer(ub_, static_cast<uint32_t>(p_->ub_used));
        LocalTensor<uint8_t> base = ub_.Get<uint8_t>();
        c_[0] = base[p_->ub_c0].ReinterpretCast<float>();
        c_[1] = base[p_->ub_c1].ReinterpretCast<float>();
        work_ = base[p_->ub_work].ReinterpretCast<float>();
        work2_ = base[p_->ub_work2].ReinterpretCast<float>();
        biasIn_ = base[p_->ub_bias].ReinterpretCast<T>();
        biasF32_ = base[p_->ub_bias + p_->base_n * sizeof(T)].ReinterpretCast<float>();
        rows_.base = base[p_->ub_rows].ReinterpretCast<float>();
        rows_.stride = static_cast<uint32_t>(ft::align_up(p_->vec_rows, 8));
        // ReduceMax/ReduceSum write (value, index) pairs into a small scratch: the backward-only coefficient slot
        reduceTmp_ = rows_.slot(kRowCoefP);
    }

    __aicore__ inline void Process() {
        const uint32_t sub = GetSubBlockIdx();
        const uint64_t core = GetBlockIdx() / GetTaskRation();
        for (uint64_t t = core; t < p_->tasks; t += p_->used_cores) {
            uint64_t mIdx, sIdx, r0, nr;
            ft::task_coords(*p_, t, &mIdx, &sIdx);
            ft::vec_rows_of(*p_, ft::block_rows(*p_, mIdx), sub, &r0, &nr);
            if (nr > 0) RunTask(mIdx * p_->base_m + r0, static_cast<uint32_t>(nr), sIdx);
        }
        if (p_->segments > 1) {
            SyncAll();  // every segment's partial statistics are in the workspace
            Finish(core, sub);
        }
        mm.End();
    }

private:
    __aicore__ inline void LoadLabels(uint64_t row0, uint32_t rows) {
        // shard-local int32 labels; anything outside [0, V_local) becomes -1 (never hits a column)
        LocalTensor<int32_t> lab = rows_.slot(kRowLabel).ReinterpretCast<int32_t>();
        const int64_t v = static_cast<int64_t>(p_->v);
        for (uint32_t r = 0; r < rows; ++r) {
            const int64_t y = static_cast<int64_t>(yGm_.GetValue(row0 + r)) - td_->vocabStart;
            lab.SetValue(r, (y >= 0 && y < v) ? static_cast<int32_t>(y) : -1);
        }
    }

    __aicore__ inline void ResetStats(uint32_t rows) {
        Duplicate(rows_.slot(kRowMax), kNegInf, rows_.stride);
        Duplicate(rows_.slot(kRowSum), 0.0f, rows_.stride);
        Duplicate(rows_.slot(kRowTarget), 0.0f, rows_.stride);
        Duplicate(rows_.slot(kRowZsum), 0.0f, rows_.stride);
        Duplicate(rows_.slot(kRowArgmax).ReinterpretCast<int32_t>(), 0, rows_.stride);
        PipeBarrier<PIPE_V>();
    }

    __aicore__ inline void LoadBias(uint64_t c0, uint32_t cols) {
        DataCopyPad(biasIn_, bGm_[c0], {1, static_cast<uint32_t>(cols * sizeof(T)), 0, 0, 0}, {false, 0, 0, 0});
        SetFlag<HardEvent::MTE2_V>(EVENT_ID0);
        WaitFlag<HardEvent::MTE2_V>(EVENT_ID0);
        if constexpr (IsSameType<T, float>::value) {
            DataCopy(biasF32_, biasIn_, static_cast<uint32_t>(ft::align_up(cols, 8)));
        } else {
            Cast(biasF32_, biasIn_, RoundMode::CAST_NONE, cols);
        }
        PipeBarrier<PIPE_V>();
    }

    __aicore__ inline void RunTask(uint64_t row0, uint32_t rows, uint64_t sIdx) {
        LoadLabels(row0, rows);
        ResetStats(rows);
        uint64_t nb0, nb1;
        ft::segment_blocks(*p_, sIdx, &nb0, &nb1);
        mm.SetTensorA(hGm_[row0 * p_->d]);
        uint32_t buf = 0;
        for (uint64_t nb = nb0; nb < nb1; ++nb) {
            const uint64_t c0 = nb * p_->base_n;
            const uint32_t cols = static_cast<uint32_t>(ft::block_cols(*p_, nb));
            mm.SetTensorB(wGm_[c0 * p_->d], true);
            mm.SetTail(rows, cols, static_cast<int>(p_->d));
            LocalTensor<float> z = c_[buf];
            // padding columns of a short last block must not win the max: fill with -inf first
            if (cols < p_->base_n) {
                Duplicate(z, kNegInf, rows * p_->base_n);
                PipeBarrier<PIPE_V>();
            }
            mm.template Iterate<true>();
            mm.template GetTensorC<true>(z, false, true);
            if (td_->hasBias) LoadBias(c0, cols);
            VectorLogits(z, biasF32_, td_->hasBias, td_->softcap, rows, cols, p_->base_n, work2_);
            OnlineUpdate(z, rows_, rows, cols, p_->base_n, static_cast<int32_t>(c0), td_->labelSmoothing > 0.0f,
                         work_, reduceTmp_);
            buf ^= 1u;  // the next block's C tile lands in the other buffer while this one is consumed
        }
        if (p_->segments == 1) {
            WriteStats(row0, rows, outMax_, outSum_, outTarget_, outZsum_, outArgmax_);
        } else {
            const uint64_t off = sIdx * p_->n;
            GlobalTensor<float> wsM = wsStats_[off];
            GlobalTensor<float> wsS = wsStats_[p_->segments * p_->n + off];
            GlobalTensor<float> wsT = wsStats_[2 * p_->segments * p_->n + off];
            GlobalTensor<float> wsZ = wsStats_[3 * p_->segments * p_->n + off];
            GlobalTensor<int32_t> wsA;
            const uint64_t amOff = 4 * p_->segments * p_->n + off;
            wsA.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(wsStats_[amOff].GetPhyAddr()));
            WriteStats(row0, rows, wsM, wsS, wsT, wsZ, wsA);
        }
    }

    __aicore__ inline void WriteStats(uint64_t row0, uint32_t rows, GlobalTensor<float>& m, GlobalTensor<float>& s,
                                      GlobalTensor<float>& zt, GlobalTensor<float>& zs, GlobalTensor<int32_t>& am) {
        SetFlag<HardEvent::V_MTE3>(EVENT_ID0);
        WaitFlag<HardEvent::V_MTE3>(EVENT_ID0);
        const DataCopyExtParams cp{1, static_cast<uint32_t>(rows * sizeof(float)), 0, 0, 0};
        DataCopyPad(m[row0], rows_.slot(kRowMax), cp);
        DataCopyPad(s[row0], rows_.slot(kRowSum), cp);
        DataCopyPad(zt[row0], rows_.slot(kRowTarget), cp);
        DataCopyPad(zs[row0], rows_.slot(kRowZsum), cp);
        DataCopyPad(am[row0], rows_.slot(kRowArgmax).ReinterpretCast<int32_t>(), cp);
        SetFlag<HardEvent::MTE3_V>(EVENT_ID0);
        WaitFlag<HardEvent::MTE3_V>(EVENT_ID0);
    }

    // Finishing phase: vector core (core, sub) merges tokens [i0, i1) over the segments in order, as
    // npu_emulator.merge_segments (scalar loop: O(N * segments) work, small next to the GEMMs).
    __aicore__ inline void Finish(uint64_t core, uint32_t sub) {
        const uint64_t workers = static_cast<uint64_t>(p_->used_cores) * GetTaskRation();
        const uint64_t me = core * GetTaskRation() + sub;
        const uint64_t per = ft::ceil_div(p_->n, workers);
        const uint64_t i0 = me * per < p_->n ? me * per : p_->n;
        const uint64_t i1 = i0 + per < p_->n ? i0 + per : p_->n;
        const uint64_t plane = p_->segments * p_->n;
        __gm__ int32_t* amBase = reinterpret_cast<__gm__ int32_t*>(wsStats_[4 * plane].GetPhyAddr());
        for (uint64_t i = i0; i < i1; ++i) {
            float m = kNegInf, s = 0.0f, zt = 0.0f, zs = 0.0f;
            int32_t am = 0;
            for (uint64_t sg = 0; sg < p_->segments; ++sg) {
                const uint64_t k = sg * p_->n + i;
                const float pm = wsStats_.GetValue(k);
                const float ps = wsStats_.GetValue(plane + k);
                const float mNew = pm > m ? pm : m;
                if (mNew != kNegInf) {
                    // exp of a scalar through the vector unit (work_ is free in this phase)
                    Duplicate(work_, m - mNew, 1);
                    Duplicate(work_[kFloatsPerBlock], pm - mNew, 1);
                    PipeBarrier<PIPE_V>();
                    Exp(work_, work_, 2 * kFloatsPerBlock);
                    PipeBarrier<PIPE_V>();
                    const float a = m == mNew ? 1.0f : work_.GetValue(0);
                    const float b = pm == mNew ? 1.0f : work_.GetValue(kFloatsPerBlock);
                    s = s * a + ps * b;
                } else {
                    s = s + ps;
                }
                if (pm > m) am = amBase[k];
                m = mNew;
                zt += wsStats_.GetValue(2 * plane + k);
                zs += wsStats_.GetValue(3 * plane + k);
            }
            outMax_.SetValue(i, m);
            outSum_.SetValue(i, s);
            outTarget_.SetValue(i, zt);
            outZsum_.SetValue(i, zs);
            outArgmax_.SetValue(i, am);
        }
        // scalar stores go through the data cache: write them back before the kernel ends
        DataCacheCleanAndInvalid<float, CacheLine::ENTIRE_DATA_CACHE>(outMax_);
        DataCacheCleanAndInvalid<float, CacheLine::ENTIRE_DATA_CACHE>(outSum_);
        DataCacheCleanAndInvalid<float, CacheLine::ENTIRE_DATA_CACHE>(outTarget_);
        DataCacheCleanAndInvalid<float, CacheLine::ENTIRE_DATA_CACHE>(outZsum_);
        DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE>(outArgmax_);
    }

    const FusedLceTilingData* td_;
    const ft::Plan* p_;
    GlobalTensor<T> hGm_, wGm_, bGm_;
    GlobalTensor<LabelT> yGm_;
    GlobalTensor<float> outMax_, outSum_, outTarget_, outZsum_, wsStats_;
    GlobalTensor<int32_t> outArgmax_;
    TBuf<TPosition::VECCALC> ub_;
    LocalTensor<float> c_[2], work_, work2_, biasF32_, reduceTmp_;
    LocalTensor<T> biasIn_;
    RowView rows_;
};

extern "C" __global__ __aicore__ void fused_lce_stats(GM_ADDR hidden, GM_ADDR weight, GM_ADDR bias, GM_ADDR labels,
                                                      GM_ADDR outMax, GM_ADDR outSum, GM_ADDR outTarget,
                                                      GM_ADDR outZsum, GM_ADDR outArgmax, GM_ADDR workspace,
                                                      GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    REGISTER_TILING_DEFAULT(FusedLceTilingData);
    GET_TILING_DATA(td, tiling);
    GM_ADDR user = GetUserWorkspace(workspace);
    TPipe pipe;
    FusedLceStatsKernel<DTYPE_HIDDEN, DTYPE_LABELS> op;
    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), op.mm, &td.mmLogits);
    op.Init(hidden, weight, bias, labels, outMax, outSum, outTarget, outZsum, outArgmax, user, &td, &pipe);
    op.Process();
}
