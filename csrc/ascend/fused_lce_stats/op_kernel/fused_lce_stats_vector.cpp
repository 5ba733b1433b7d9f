// FusedLceStatsVector: the forward kernel (MIX, 1 cube : 2 vector cores). Status: compiled and run on CPU against an
// AscendC API twin (tests/support/ascendc_twin, tests/ascend); not run on NPU hardware.
//
// For every task (token block m, vocabulary segment s) of the plan, in task order on core t % used_cores, each of
// the two vector cores takes vec_rows rows of the token block and, for every vocabulary block of the segment in
// increasing order:
//   1. drives the Matmul API: z = h[rows] @ W[cols].T, K = D in base_k chunks, float32 accumulation in L0C. On an
//      Atlas A2 the tile then goes L0C -> GM (the client's staging workspace, fixpipe) -> UB (DataCopy on MTE2):
//      logits exist in global memory one (vec_rows x base_n) tile per vector core at a time, never as N x V;
//   2. adds the bias, applies the softcap and divides by the temperature (float32; softcap first);
//   3. updates the running max / sum-exp / target logit / sum of logits / first argmax of its rows, and with
//      withEntropy the entropy statistic ez = sum exp(z - max) (z - max) relative to the same running max.
// With one segment the task writes the outputs; otherwise it writes its partial statistics to the workspace and,
// after a barrier of all vector cores (SyncAll), the finishing phase merges the segments of each token in segment
// order, vectorised over tokens and written out with DataCopyPad (no scalar GM stores: cores never share a cache
// line).
// Outputs (per token, this rank's vocabulary only): max, sum exp(z - max), target logit (0 when the label is not in
// this shard), sum of logits (0 unless with_zsum), first argmax as a shard-local int32 id, and with withEntropy ez
// (the output is not touched otherwise and may be empty).
#define FUSED_LCE_HD __aicore__
#include "kernel_operator.h"
#include "lib/matmul_intf.h"
#include "../../common/fused_lce_vector_tiling_data.h"
#include "../../common/fused_lce_vector_aiv.h"

using namespace AscendC;
using namespace fused_lce_kernel;
namespace ft = fused_lce::tiling;

template <typename T, typename LabelT>
class FusedLceStatsVectorKernel {
public:
    using AType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T>;
    using BType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T, true>;  // W is (V, D): transposed B
    using CType = matmul::MatmulType<TPosition::VECIN, CubeFormat::ND, float>;
    matmul::Matmul<AType, BType, CType> mm;

    __aicore__ inline void Init(GM_ADDR hidden, GM_ADDR weight, GM_ADDR bias, GM_ADDR labels, GM_ADDR outMax,
                                GM_ADDR outSum, GM_ADDR outTarget, GM_ADDR outZsum, GM_ADDR outArgmax,
                                GM_ADDR outEz, GM_ADDR workspace, const FusedLceVectorTilingData* td, TPipe* pipe) {
        td_ = td;
        p_ = &td->plan;
        withEz_ = td->withEntropy != 0;
        nStats_ = withEz_ ? 6u : 5u;
        invTemp_ = 1.0f / td->temperature;
        hGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(hidden));
        wGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(weight));
        if (td->hasBias) bGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(bias));
        yGm_.SetGlobalBuffer(reinterpret_cast<__gm__ LabelT*>(labels));
        out_[0].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outMax));
        out_[1].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outSum));
        out_[2].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outTarget));
        out_[3].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outZsum));
        out_[4].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outArgmax));  // int32 bits, copied as 4-byte words
        if (withEz_) out_[5].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outEz));
        // partial statistics of segment s for token i at [plane * segments * N + s * N + i], nStats_ planes (m, s,
        // zt, zs, argmax as int32 bits, ez with withEntropy: the plan sizes the workspace for them, kEntropy)
        wsStats_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace));
        pipe->InitBuffer(ub_, static_cast<uint32_t>(p_->ub_used));
        // The C tile view has exactly baseM x baseN elements of the Matmul tiling: GetTensorC(LocalTensor) copies
        // c.GetSize() elements into it (matmul_client.h CopyToUB) and needs at least baseM * baseN (GetTensorC.md);
        // a view made with operator[] would keep the whole rest of the buffer as its length.
        const uint32_t cElems = static_cast<uint32_t>(td->mmLogits.baseM) * static_cast<uint32_t>(td->mmLogits.baseN);
        z_ = ub_.GetWithOffset<float>(cElems, p_->ub_c);
        const uint32_t tileElems = p_->vec_rows * p_->base_n;
        work_ = ub_.GetWithOffset<float>(tileElems, p_->ub_work);
        if (td->softcap > 0.0f) work2_ = ub_.GetWithOffset<float>(tileElems, p_->ub_work2);
        if (td->hasBias) {
            biasIn_ = ub_.GetWithOffset<T>(static_cast<uint32_t>(ft::align_up(p_->base_n, 16)), p_->ub_bias);
            if constexpr (IsSameType<T, float>::value) {
                biasF32_ = biasIn_;  // float bias is used where it lands
            } else {
                biasF32_ = ub_.GetWithOffset<float>(p_->base_n, p_->ub_bias_f32);
            }
        }
        rows_.stride = static_cast<uint32_t>(ft::align_up(p_->vec_rows, 8));
        rows_.base = ub_.GetWithOffset<float>(rows_.stride * ft::kRowSlots, p_->ub_rows);
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

    __aicore__ inline void ResetStats() {
        Duplicate(rows_.slot(kRowMax), NegInf(), rows_.stride);
        Duplicate(rows_.slot(kRowSum), 0.0f, rows_.stride);
        Duplicate(rows_.slot(kRowTarget), 0.0f, rows_.stride);
        Duplicate(rows_.slot(kRowZsum), 0.0f, rows_.stride);
        Duplicate(rows_.slot(kRowArgmax).ReinterpretCast<int32_t>(), 0, rows_.stride);
        if (withEz_) Duplicate(rows_.slot(kRowEz), 0.0f, rows_.stride);
        Order<HardEvent::V_S>();  // the scalar unit reads and updates these slots next
    }

    __aicore__ inline void LoadBias(uint64_t c0, uint32_t cols) {
        DataCopyPad(biasIn_, bGm_[c0], DataCopyExtParams(1, cols * sizeof(T), 0, 0, 0),
                    DataCopyPadExtParams<T>(false, 0, 0, 0));
        Order<HardEvent::MTE2_V>();
        if constexpr (!IsSameType<T, float>::value) {
            Cast(biasF32_, biasIn_, RoundMode::CAST_NONE, cols);  // bf16 / fp16 -> float is exact
            PipeBarrier<PIPE_V>();
        }
    }

    __aicore__ inline void RunTask(uint64_t row0, uint32_t rows, uint64_t sIdx) {
        LoadLabels(row0, rows);
        Order<HardEvent::MTE3_V>();  // the previous task's DataCopyPad of the statistics has read the slots
        Order<HardEvent::S_V>();
        ResetStats();
        uint64_t nb0, nb1;
        ft::segment_blocks(*p_, sIdx, &nb0, &nb1);
        for (uint64_t nb = nb0; nb < nb1; ++nb) {
            const uint64_t c0 = nb * p_->base_n;
            const uint32_t cols = static_cast<uint32_t>(ft::block_cols(*p_, nb));
            // the previous block's vector and scalar reads of z (and of the staged bias) are done before MTE2
            // overwrites them
            Order<HardEvent::V_MTE2>();
            Order<HardEvent::S_MTE2>();
            // A again for every block: the cube serves several Matmul objects (and both vector cores) from one
            // L1 region (shareMode 0: AuxShareBufStart puts each object at the share start, kernel_tpipe_base.h,
            // from scheduler_base.h Init), so hidden rows cached by an earlier sequence may be overwritten since
            mm.SetTensorA(hGm_[row0 * p_->d]);
            mm.SetTensorB(wGm_[c0 * p_->d], true);
            mm.SetTail(rows, cols, static_cast<int>(p_->d));
            mm.template Iterate<true>();
            // enSequentialWrite = false: rows land at the tiling's N stride (orgN = base_n) also for a partial last
            // block; with true they would land at the stride of the tile's own width (copy_cube_out_fixpipe.h)
            mm.template GetTensorC<true>(z_, 0, false);
            if (td_->hasBias) LoadBias(c0, cols);
            VectorLogits(z_, biasF32_, td_->hasBias, td_->softcap, invTemp_, rows, cols, p_->base_n, work2_);
            OnlineUpdate(z_, rows_, rows, cols, p_->base_n, static_cast<int32_t>(c0), td_->withZsum != 0, withEz_,
                         work_);
        }
        if (p_->segments == 1) {
            WriteStats(row0, rows, out_, 0);
        } else {
            // partial statistics of this segment: plane k at k * segments * N + s * N
            WriteStats(row0, rows, nullptr, sIdx * p_->n);
        }
    }

    // The nStats_ statistics slots -> GM (MTE3): to `dst` planes, or to the workspace planes at `wsOff`.
    __aicore__ inline void WriteStats(uint64_t row0, uint32_t rows, GlobalTensor<float>* dst, uint64_t wsOff) {
        Order<HardEvent::V_MTE3>();
        Order<HardEvent::S_MTE3>();  // the slots were last written by SetValue
        const DataCopyExtParams cp(1, rows * sizeof(float), 0, 0, 0);
        const uint64_t plane = p_->segments * p_->n;
        for (uint32_t k = 0; k < nStats_; ++k) {
            GlobalTensor<float> g = dst != nullptr ? dst[k][row0] : wsStats_[k * plane + wsOff + row0];
            DataCopyPad(g, rows_.slot(kRowMax + k), cp);
        }
    }

    // Finishing phase: vector core (core, sub) merges tokens [i0, i1) over the segments in segment order,
    // `stride` tokens at a time, as the float64-tested semantics (merge of (m, s) pairs, first argmax of the lower
    // segment on ties; ez moved like s, see OnlineUpdate). Inputs come in by DataCopyPad, outputs leave by
    // DataCopyPad. The work tile holds 12 planes of align8(vec_rows) floats: vec_rows is a multiple of 8 and
    // base_n >= 16 (fused_lce_tiling.h), so vec_rows * base_n >= 12 * align8(vec_rows).
    __aicore__ inline void Finish(uint64_t core, uint32_t sub) {
        const uint64_t workers = static_cast<uint64_t>(p_->used_cores) * GetTaskRation();
        const uint64_t me = core * GetTaskRation() + sub;
        const uint64_t per = ft::ceil_div(p_->n, workers);
        const uint64_t i0 = me * per < p_->n ? me * per : p_->n;
        const uint64_t i1 = i0 + per < p_->n ? i0 + per : p_->n;
        const uint64_t plane = p_->segments * p_->n;
        const uint32_t w = rows_.stride;
        const uint32_t ns = nStats_;
        // accumulators in the statistics slots, segment partials and temporaries in the work tile
        LocalTensor<float> acc[6] = {rows_.slot(kRowMax), rows_.slot(kRowSum), rows_.slot(kRowTarget),
                                     rows_.slot(kRowZsum), rows_.slot(kRowArgmax), rows_.slot(kRowEz)};
        LocalTensor<float> part[6] = {work_[0 * w], work_[1 * w], work_[2 * w], work_[3 * w], work_[4 * w],
                                      work_[5 * w]};
        LocalTensor<float> mNew = work_[6 * w], shift = work_[7 * w], ea = work_[8 * w], eb = work_[9 * w];
        LocalTensor<float> da = work_[10 * w], db = work_[11 * w];
        for (uint64_t t0 = i0; t0 < i1; t0 += w) {
            const uint32_t cnt = static_cast<uint32_t>(i1 - t0 < w ? i1 - t0 : w);
            const DataCopyExtParams cp(1, cnt * sizeof(float), 0, 0, 0);
            Order<HardEvent::MTE3_MTE2>();  // the previous chunk's results have left the accumulators
            for (uint64_t sg = 0; sg < p_->segments; ++sg) {
                LocalTensor<float>* into = sg == 0 ? acc : part;
                Order<HardEvent::V_MTE2>();
                Order<HardEvent::S_MTE2>();
                for (uint32_t k = 0; k < ns; ++k) {
                    DataCopyPad(into[k], wsStats_[k * plane + sg * p_->n + t0], cp,
                                DataCopyPadExtParams<float>(false, 0, 0, 0));
                }
                Order<HardEvent::MTE2_V>();
                Order<HardEvent::MTE2_S>();
                if (sg == 0) continue;
                // argmax: the partial's index wins only on a strictly larger max (scalar, before m is updated)
                for (uint32_t i = 0; i < cnt; ++i) {
                    if (part[0].GetValue(i) > acc[0].GetValue(i)) {
                        acc[4].ReinterpretCast<int32_t>().SetValue(i, part[4].ReinterpretCast<int32_t>().GetValue(i));
                    }
                }
                Order<HardEvent::S_V>();
                // s = s * exp(m - shift) + ps * exp(pm - shift), shift = max(m, pm) clamped to a finite value so
                // that rows whose maxima are both -inf give exp(-inf) = 0 instead of NaN
                Max(mNew, acc[0], part[0], cnt);
                PipeBarrier<PIPE_V>();
                Maxs(shift, mNew, kMinFinite, cnt);
                PipeBarrier<PIPE_V>();
                Sub(ea, acc[0], shift, cnt);
                Sub(eb, part[0], shift, cnt);
                PipeBarrier<PIPE_V>();
                if (withEz_) {  // the shifts floored at -104: a -inf partial adds exp(-inf) * (0 - 104 * 0) = 0
                    Maxs(da, ea, kLogFloor, cnt);
                    Maxs(db, eb, kLogFloor, cnt);
                    PipeBarrier<PIPE_V>();  // Exp overwrites ea / eb in place
                }
                Exp(ea, ea, cnt);
                Exp(eb, eb, cnt);
                PipeBarrier<PIPE_V>();
                if (withEz_) {  // ez = ea (ez + da s) + eb (pez + db ps), with s and ps before their update
                    Mul(da, da, acc[1], cnt);
                    Mul(db, db, part[1], cnt);
                    PipeBarrier<PIPE_V>();
                    Add(da, da, acc[5], cnt);
                    Add(db, db, part[5], cnt);
                    PipeBarrier<PIPE_V>();
                    Mul(da, da, ea, cnt);
                    Mul(db, db, eb, cnt);
                    PipeBarrier<PIPE_V>();
                    Add(acc[5], da, db, cnt);
                }
                Mul(acc[1], acc[1], ea, cnt);
                Mul(eb, part[1], eb, cnt);
                Add(acc[2], acc[2], part[2], cnt);
                Add(acc[3], acc[3], part[3], cnt);
                Max(acc[0], acc[0], part[0], cnt);
                PipeBarrier<PIPE_V>();
                Add(acc[1], acc[1], eb, cnt);
                PipeBarrier<PIPE_V>();
                Order<HardEvent::V_S>();  // the next segment's argmax step reads the updated max
            }
            Order<HardEvent::V_MTE3>();
            Order<HardEvent::S_MTE3>();
            for (uint32_t k = 0; k < ns; ++k) {
                DataCopyPad(out_[k][t0], acc[k], cp);
            }
        }
    }

    const FusedLceVectorTilingData* td_;
    const ft::Plan* p_;
    GlobalTensor<T> hGm_, wGm_, bGm_;
    GlobalTensor<LabelT> yGm_;
    GlobalTensor<float> out_[6], wsStats_;
    bool withEz_;
    uint32_t nStats_;
    float invTemp_;
    TBuf<TPosition::VECCALC> ub_;
    LocalTensor<float> z_, work_, work2_, biasF32_;
    LocalTensor<T> biasIn_;
    RowView rows_;
};

extern "C" __global__ __aicore__ void fused_lce_stats_vector(GM_ADDR hidden, GM_ADDR weight, GM_ADDR bias,
                                                             GM_ADDR labels, GM_ADDR outMax, GM_ADDR outSum,
                                                             GM_ADDR outTarget, GM_ADDR outZsum, GM_ADDR outArgmax,
                                                             GM_ADDR outEz, GM_ADDR workspace, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    REGISTER_TILING_DEFAULT(FusedLceVectorTilingData);
    GET_TILING_DATA(td, tiling);
    GM_ADDR user = GetUserWorkspace(workspace);
    TPipe pipe;
    FusedLceStatsVectorKernel<DTYPE_HIDDEN, DTYPE_LABELS> op;
    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), op.mm, &td.mmLogits);
    op.Init(hidden, weight, bias, labels, outMax, outSum, outTarget, outZsum, outArgmax, outEz, user, &td, &pipe);
    op.Process();
}
