// FusedLceGradVector: the backward kernel (MIX, 1 cube : 2 vector cores). Status: compiled and run on CPU against an
// AscendC API twin (tests/support/ascendc_twin, tests/ascend); not run on NPU hardware.
//
// Gradients of the logits gradient dz_j = p_j (a + b z_j) - t [j == label] - u (times the softcap derivative) given
// the saved lse and the per-token coefficients Coefs(a, t, b, u) that the driver forms (docs/providers.md, "Log-probs
// and entropy": for the loss a = g (1 + 2 z_loss lse), t = g (1 - eps), u = g eps / V_total, b = 0; for log-probs
// and entropy b != 0; all 0 for ignored tokens, NaN for out-of-range labels, so a bad label poisons what it touches
// instead of reading out of bounds; 1 / temperature is already folded in). Same tasks and tile order as
// FusedLceStatsVector. For every tile, each vector core (vec_rows rows):
//   1. recomputes z = h[rows] @ W[cols].T (Matmul; on an Atlas A2 the C tile goes L0C -> GM staging -> UB), adds
//      bias / softcap, divides by the temperature;
//   2. forms dz in float32 (TileGradient), adds its column sums into db with a float32 atomic add;
//   3. stages dz in its slot of the GM workspace (rounded to the operand dtype for bf16 / fp16; the float32 tile
//      as it is for fp32);
//   4. issues dX[rows] += dz @ W[cols] and dW[cols] += dz.T @ h[rows] over exactly `cols` vocabulary rows; the
//      cube writes both through the fixpipe with float32 atomic adds into the float32 accumulators (outputs of
//      the op; the host casts them).
// dX of a token block is accumulated in vocabulary-block order by one vector core when the plan has one segment;
// dW rows receive the token blocks' contributions in an order that depends on core timing (float32 atomics).
#define FUSED_LCE_HD __aicore__
#include "kernel_operator.h"
#include "lib/matmul_intf.h"
#include "../../common/fused_lce_vector_tiling_data.h"
#include "../../common/fused_lce_vector_aiv.h"

using namespace AscendC;
using namespace fused_lce_kernel;
namespace ft = fused_lce::tiling;

static_assert(kRowSlotCount <= ft::kRowSlots, "row slots of fused_lce_vector_aiv.h must fit the plan's UB region");

template <typename T, typename LabelT>
class FusedLceGradVectorKernel {
public:
    using HType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T>;
    using WtType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T, true>;   // W[cols] as (D, cols)
    using WType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T>;          // W[cols] as (cols, D)
    using DzType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T>;         // staged dz (rows, base_n)
    using DzTType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T, true>;  // the same, transposed
    using CVec = matmul::MatmulType<TPosition::VECIN, CubeFormat::ND, float>;
    using CGm = matmul::MatmulType<TPosition::GM, CubeFormat::ND, float>;
    matmul::Matmul<HType, WtType, CVec> mmLogits;
    matmul::Matmul<DzType, WType, CGm> mmDx;
    matmul::Matmul<DzTType, HType, CGm> mmDw;

    __aicore__ inline void Init(GM_ADDR coefs, GM_ADDR hidden, GM_ADDR weight, GM_ADDR bias, GM_ADDR labels,
                                GM_ADDR lse, GM_ADDR dx, GM_ADDR dw, GM_ADDR db, GM_ADDR workspace,
                                const FusedLceVectorTilingData* td, TPipe* pipe) {
        td_ = td;
        p_ = &td->plan;
        invTemp_ = 1.0f / td->temperature;
        cGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(coefs));  // (4, N): planes a, t, b, u
        hGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(hidden));
        wGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(weight));
        if (td->hasBias) bGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(bias));
        yGm_.SetGlobalBuffer(reinterpret_cast<__gm__ LabelT*>(labels));
        lseGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(lse));
        dxGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(dx));
        dwGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(dw));
        dbGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(db));
        // dz staging: per vector core, two (vec_rows x base_n) slots of the staged type
        const uint64_t slot = static_cast<uint64_t>(p_->vec_rows) * p_->base_n;
        dzGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(workspace + p_->ws_stats) + GetBlockIdx() * 2 * slot);
        pipe->InitBuffer(ub_, static_cast<uint32_t>(p_->ub_used));
        const uint32_t cElems = static_cast<uint32_t>(td->mmLogits.baseM) * static_cast<uint32_t>(td->mmLogits.baseN);
        z_ = ub_.GetWithOffset<float>(cElems, p_->ub_c);  // exactly baseM x baseN: see FusedLceStatsVector
        const uint32_t tileElems = p_->vec_rows * p_->base_n;
        work_ = ub_.GetWithOffset<float>(tileElems, p_->ub_work);  // a + b z of TileGradient's b term
        if (td->softcap > 0.0f) work2_ = ub_.GetWithOffset<float>(tileElems, p_->ub_work2);
        if constexpr (!IsSameType<T, float>::value) cast_ = ub_.GetWithOffset<T>(tileElems, p_->ub_cast);
        if (td->hasBias) {
            biasIn_ = ub_.GetWithOffset<T>(static_cast<uint32_t>(ft::align_up(p_->base_n, 16)), p_->ub_bias);
            if constexpr (IsSameType<T, float>::value) {
                biasF32_ = biasIn_;
            } else {
                biasF32_ = ub_.GetWithOffset<float>(p_->base_n, p_->ub_bias_f32);
            }
            colsum_ = ub_.GetWithOffset<float>(p_->base_n, p_->ub_colsum);
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
        mmLogits.End();
        mmDx.End();
        mmDw.End();
    }

private:
    // The rows' coefficients a, t, b, u (scalar reads of the (4, N) coefs input), lse, shard-local labels, and
    // whether each row is live (a coefficient not 0; NaN counts as live). Returns whether any b of the rows is not
    // 0 (the b term of TileGradient runs only then: the loss never pays for it).
    __aicore__ inline bool LoadRows(uint64_t row0, uint32_t rows) {
        LocalTensor<int32_t> lab = rows_.slot(kRowLabel).ReinterpretCast<int32_t>();
        LocalTensor<float> a = rows_.slot(kRowCoefA), t = rows_.slot(kRowCoefT), b = rows_.slot(kRowCoefB),
                           u = rows_.slot(kRowCoefU);
        LocalTensor<float> lse = rows_.slot(kRowLse), live = rows_.slot(kRowLive);
        const int64_t v = static_cast<int64_t>(p_->v);
        const uint64_t n = p_->n;
        bool anyB = false;
        for (uint32_t r = 0; r < rows; ++r) {
            const uint64_t i = row0 + r;
            const int64_t y = static_cast<int64_t>(yGm_.GetValue(i)) - td_->vocabStart;
            lab.SetValue(r, (y >= 0 && y < v) ? static_cast<int32_t>(y) : -1);
            const float ca = cGm_.GetValue(i), ct = cGm_.GetValue(n + i), cb = cGm_.GetValue(2 * n + i),
                        cu = cGm_.GetValue(3 * n + i);
            lse.SetValue(r, lseGm_.GetValue(i));
            a.SetValue(r, ca);
            t.SetValue(r, ct);
            b.SetValue(r, cb);
            u.SetValue(r, cu);
            const bool isLive = !(ca == 0.0f && ct == 0.0f && cb == 0.0f && cu == 0.0f);  // NaN != 0: live
            live.SetValue(r, isLive ? 1.0f : 0.0f);
            anyB = anyB || cb != 0.0f;
        }
        Order<HardEvent::S_V>();
        return anyB;
    }

    __aicore__ inline void LoadBias(uint64_t c0, uint32_t cols) {
        DataCopyPad(biasIn_, bGm_[c0], DataCopyExtParams(1, cols * sizeof(T), 0, 0, 0),
                    DataCopyPadExtParams<T>(false, 0, 0, 0));
        Order<HardEvent::MTE2_V>();
        if constexpr (!IsSameType<T, float>::value) {
            Cast(biasF32_, biasIn_, RoundMode::CAST_NONE, cols);
            PipeBarrier<PIPE_V>();
        }
    }

    __aicore__ inline void RunTask(uint64_t row0, uint32_t rows, uint64_t sIdx) {
        const bool withB = LoadRows(row0, rows);
        uint64_t nb0, nb1;
        ft::segment_blocks(*p_, sIdx, &nb0, &nb1);
        const uint64_t slot = static_cast<uint64_t>(p_->vec_rows) * p_->base_n;
        const uint32_t tileElems = rows * p_->base_n;
        const bool wantDx = td_->gradMask & 1u, wantDw = td_->gradMask & 2u, wantDb = td_->gradMask & 4u;
        uint32_t buf = 0;
        for (uint64_t nb = nb0; nb < nb1; ++nb) {
            const uint64_t c0 = nb * p_->base_n;
            const uint32_t cols = static_cast<uint32_t>(ft::block_cols(*p_, nb));
            // the previous block's readers of z / bias / the staged tile are done before they are overwritten
            Order<HardEvent::V_MTE2>();
            Order<HardEvent::S_MTE2>();
            Order<HardEvent::MTE3_MTE2>();  // fp32: the previous dz was staged to GM straight from z
            // A again for every block: the cube serves several Matmul objects (and both vector cores) from one
            // L1 region (shareMode 0: AuxShareBufStart puts each object at the share start, kernel_tpipe_base.h,
            // from scheduler_base.h Init), so hidden rows cached by an earlier sequence may be overwritten since
            mmLogits.SetTensorA(hGm_[row0 * p_->d]);
            mmLogits.SetTensorB(wGm_[c0 * p_->d], true);
            mmLogits.SetTail(rows, cols, static_cast<int>(p_->d));
            mmLogits.template Iterate<true>();
            mmLogits.template GetTensorC<true>(z_, 0, false);  // rows at the orgN = base_n stride
            if (td_->hasBias) LoadBias(c0, cols);
            VectorLogits(z_, biasF32_, td_->hasBias, td_->softcap, invTemp_, rows, cols, p_->base_n, work2_);
            if (wantDb) Order<HardEvent::MTE3_V>();  // the previous block's db copy has read colsum
            TileGradient(z_, work2_, rows_, rows, cols, p_->base_n, static_cast<int32_t>(c0), td_->softcap, withB,
                         work_, wantDb, colsum_);
            if (wantDb) {
                Order<HardEvent::V_MTE3>();
                SetAtomicAdd<float>();
                DataCopyPad(dbGm_[c0], colsum_, DataCopyExtParams(1, cols * sizeof(float), 0, 0, 0));
                SetAtomicNone();
            }
            // dz -> this core's staging slot (the cube reads it from there); only its first `cols` columns are
            // read by the two GEMMs below
            GlobalTensor<T> dz = dzGm_[buf * slot];
            if constexpr (IsSameType<T, float>::value) {
                Order<HardEvent::V_MTE3>();
                DataCopy(dz, z_, tileElems);
            } else {
                Order<HardEvent::MTE3_V>();  // the previous staging copy has read cast_
                Cast(cast_, z_, RoundMode::CAST_RINT, tileElems);
                Order<HardEvent::V_MTE3>();
                DataCopy(dz, cast_, tileElems);
            }
            Order<HardEvent::MTE3_S>();  // the staged tile is in GM before the scalar unit asks the cube to read it
            if (wantDx) {
                // dX[rows] (rows x D) += dz (rows x cols) @ W[c0 : c0 + cols] (cols x D): K = cols, so the cube
                // never reads past the last vocabulary row of W
                mmDx.SetTensorA(dz);
                mmDx.SetTensorB(wGm_[c0 * p_->d]);
                mmDx.SetTail(rows, static_cast<int>(p_->d), cols);
                mmDx.IterateAll(dxGm_[row0 * p_->d], 1);  // enAtomic 1: float32 accumulate into dX
            }
            if (wantDw) {
                // dW[c0 : c0 + cols] (cols x D) += dz.T (cols x rows) @ h[rows] (rows x D)
                mmDw.SetTensorA(dz, true);
                mmDw.SetTensorB(hGm_[row0 * p_->d]);
                mmDw.SetTail(cols, static_cast<int>(p_->d), rows);
                mmDw.IterateAll(dwGm_[c0 * p_->d], 1);
            }
            buf ^= 1u;
        }
    }

    const FusedLceVectorTilingData* td_;
    const ft::Plan* p_;
    GlobalTensor<float> cGm_, lseGm_, dxGm_, dwGm_, dbGm_;
    float invTemp_;
    GlobalTensor<T> hGm_, wGm_, bGm_, dzGm_;
    GlobalTensor<LabelT> yGm_;
    TBuf<TPosition::VECCALC> ub_;
    LocalTensor<float> z_, work_, work2_, biasF32_, colsum_;
    LocalTensor<T> cast_, biasIn_;
    RowView rows_;
};

extern "C" __global__ __aicore__ void fused_lce_grad_vector(GM_ADDR coefs, GM_ADDR hidden, GM_ADDR weight, GM_ADDR bias,
                                                            GM_ADDR labels, GM_ADDR lse, GM_ADDR dx, GM_ADDR dw,
                                                            GM_ADDR db, GM_ADDR workspace, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    REGISTER_TILING_DEFAULT(FusedLceVectorTilingData);
    GET_TILING_DATA(td, tiling);
    GM_ADDR user = GetUserWorkspace(workspace);
    TPipe pipe;
    FusedLceGradVectorKernel<DTYPE_HIDDEN, DTYPE_LABELS> op;
    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), op.mmLogits, &td.mmLogits, op.mmDx, &td.mmDx, op.mmDw,
                      &td.mmDw);
    op.Init(coefs, hidden, weight, bias, labels, lse, dx, dw, db, user, &td, &pipe);
    op.Process();
}
