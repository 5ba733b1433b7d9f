// FusedLceGradCube: the deterministic backward driven by the cube (MIX, 1 cube : 2 vector cores), C1 / V1 / C2 per
// tile. Status: compiled and run on CPU against the AscendC API twin (tests/support/ascendc_twin, tests/ascend); not
// run on NPU hardware.
//
// Contract (the driver's Coefs, docs/providers.md): per token a, t and optionally b, u and
// the global lse; with z = softcap(h W^T + bias) / T,
//   dz_j = p_j (a + b max(z_j, lse - 104)) - t [j == label] - u,   p_j = exp(z_j - lse),
//   dz_j *= 1 - (z_j T / c)^2 with a softcap c;  dX += dz W, dW += dz^T h, db += column sums of dz (fp32).
// Two phases (fused_lce_cube_tiling.h plan_grad): X, token block m on AI core m % cores over every vocabulary block;
// W, vocabulary block nb on core nb % cores over every token block. Per tile:
//   C1 (AIC)  z tile -> GM ring slot k % 2 (MatmulImpl, fp32), flag kFull;
//   V1 (AIVs) copy their rows out (flag kFree + slot back to the cube), form dz in fp32 with whole-tile level-0
//             instructions (the one-hot term by the scalar unit, one element per row), round it to the operand dtype
//             (the fp32 tile itself for fp32) into the dz ring (flag kDzReady);
//   C2 (AIC)  dX[m] += dz @ W[nb] or dW[nb] += dz^T @ h[m] through the fixpipe's fp32 accumulation into the output;
//             every output element is accumulated by this one core, in tile order (kDzFree + slot back);
// the cube issues C1 of tile k + 1 before waiting for V1 of tile k, so cube and vector overlap (hicann/ops-nn
// matmul/fused_linear_cross_entropy_loss_grad/op_kernel/fused_linear_cross_entropy_loss_grad_mem_friendly.h has the
// C1/V1/C2/V2 shape; there the partials of several cores are summed by the vector cores in core order (V2); here the
// split of the work makes one core own each output block, so no V2 sum is needed for dX / dW).
// db: each vector core sums its rows' dz per column in UB (fp32, tile order) into a workspace partial; after SyncAll
// the two partials are added in vector-core order. No atomics between cores: bitwise the same for every core timing.
// fp32 dW memory: the fp32 output itself (V x D x 4 bytes, the adapter's contract); no other dW workspace.
//
// Two optional modes cut the GEMMs (both keep the ownership split above, so both stay deterministic):
//   * z cache (GM input zCache right after lse, fp32 [N, V_local] row-major; tiling hasZCache): the forward's
//     FusedLceStatsCube wrote the cube's raw tiles h W^T there (before bias / softcap / temperature, so the vector
//     work below is unchanged and the result is bitwise that of recomputing); V1 reads its rows of the tile from it
//     (DataCopyPad at row stride V_local) and no C1 runs in either phase.
//   * dz kept (tiling keepDz = 1, workspace plan.ws_total_keep): phase X's V1 writes every dz tile (operand dtype)
//     into Dz (N x V_local) instead of the dz ring, and db's fp32 column sums per (token block, vector core) to
//     partials; phase X's cube runs only C1 (or nothing, with the z cache). Dz is kept in column chunks of
//     plan.keep_cols columns (a multiple of base_n below 65535), chunk c an N x width row-major matrix at
//     c N keep_cols: the GM -> L1 copy of the Matmul library puts an operand's row stride into
//     Nd2NzParams::srcDValue, 16 bits on dav-2201 (asc-devkit stage/copy_cube_in/copy_tile_to_cube/
//     data_copy_wrapper_nd.h CopyND2NZ), so one N x V_local matrix (row stride V_local, >= 65535 at every real
//     vocabulary) would be read from wrong rows by the default config. SyncAll<false> (all cube and vector cores;
//     asc-devkit impl/basic_api/dav_c220/kernel_operator_sync_impl.h SyncAllImpl, the non-AIV-only path) makes the
//     whole Dz visible, then the cube runs whole-K GEMMs from it: dX[m] = sum over chunks c of Dz_c[m rows, :] @
//     W[c] (K = the chunk's width; the first chunk writes dX, the others add; token blocks as in phase X) and
//     dW[nb] += Dz_c[:, nb's columns]^T @ h (K = N; vocabulary blocks as in phase W). A is a sub-matrix of a chunk:
//     SetOrgShape gives its leading dimension (orgKa = width untransposed, orgM = width transposed; asc-devkit docs
//     Matmul-Kernel侧接口/SetOrgShape.md, impl/adv_api/detail/matmul/stage/copy_cube_in/base/
//     copy_cube_in_params_base.h GetOrgWidth), and K accumulates in L0C, so every output tile leaves the fixpipe
//     once per chunk (per tile GEMMs read-modify-write each output block n_blocks / m_blocks times through L2). dX
//     is written (keepDz: the caller's zero fill is not read), dW added (atomic add: the caller may pass the
//     earlier driver blocks' sum). db = the partials summed in (token block, vector core) order, from fp32 dz (not
//     the rounded operand-dtype copy).
//   With both: fwd + bwd = 3 GEMMs of 2 N D V (z, dX, dW) instead of 5.
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
constexpr uint16_t kFlagFull = 5, kFlagFree = 6;      // z ring (AIC -> AIVs, AIVs -> AIC, ids 6 / 7)
constexpr uint16_t kFlagDzReady = 8, kFlagDzFree = 9;  // dz ring (AIVs -> AIC, AIC -> AIVs, ids 9 / 10)
enum GradSlot : uint32_t { kA = 0, kT, kB, kU, kLse, kLseFloor, kLab, kSlotsUsed };
static_assert(kSlotsUsed <= fc::kCubeSlots, "row slots");
}  // namespace

template <typename T, typename LabelT>
class FusedLceGradCubeKernel {
public:
    using AType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T>;
    using ATransType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T, true>;
    using BTransType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, T, true>;
    using CType = matmul::MatmulType<TPosition::GM, CubeFormat::ND, float>;

    struct TileAt {
        bool phaseW;
        uint64_t m, nb;
    };

    __aicore__ inline void Init(GM_ADDR* in, GM_ADDR* out, GM_ADDR workspace, const FusedLceGradCubeTilingData* td) {
        td_ = td;
        mp_ = &td->plan;
        p_ = &td->plan.base;
        // presence by tiling (hasB / hasU / hasZCache / gradMask): an absent optional's address need not be null
        const bool coefGiven[4] = {true, true, td->hasB != 0, td->hasU != 0};
        for (int k = 0; k < 4; ++k)
            if (coefGiven[k]) coef_[k].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(in[k]));  // a, t, b, u
        hGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(in[4]));
        wGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(in[5]));
        if (td->hasBias) bGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(in[6]));
        yGm_.SetGlobalBuffer(reinterpret_cast<__gm__ LabelT*>(in[7]));
        lseGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(in[8]));
        zc_ = td->hasZCache != 0;
        serialMatmul_ = (td->variant & fc::kSerialMatmul) != 0;
        if (zc_) zcGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(in[9]));
        for (int k = 0; k < 3; ++k)  // dx, dw, db: the outputs gradMask selects
            if (td->gradMask & (1u << k)) out_[k].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(out[k]));
        ring_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace));
        dzRing_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(workspace + mp_->ws_ring));
        dbPart_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace + mp_->ws_ring + mp_->ws_dz));
        // dz kept: for every mask (dX alone too, so that dX is the same whole-K GEMM whatever else is wanted)
        keep_ = td->keepDz != 0 && td->gradMask != 0;
        if (keep_) {
            dzKeep_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(workspace + mp_->ws_total));
            dbKeep_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace + mp_->ws_total + mp_->ws_keep_dz));
        }
        cores_ = p_->used_cores;
        core_ = ASCEND_IS_AIC ? static_cast<uint64_t>(GetBlockIdx()) : GetBlockIdx() / GetTaskRation();
        tileElems_ = static_cast<uint64_t>(p_->base_m) * p_->base_n;
        // dz kept: phase X forms every dz (also for dW / db alone); the whole-K dW GEMMs use phase W's ownership
        const bool wantX = (td->gradMask & 1u) != 0 || keep_;
        const bool wantW = keep_ ? (td->gradMask & 2u) != 0 : (td->gradMask & 6u) != 0;
        tasksX_ = wantX && core_ < p_->m_blocks ? ft::ceil_div(p_->m_blocks - core_, cores_) : 0;
        tasksW_ = wantW && core_ < p_->n_blocks ? ft::ceil_div(p_->n_blocks - core_, cores_) : 0;
        total_ = tasksX_ * p_->n_blocks + tasksW_ * p_->m_blocks;
        vecTiles_ = keep_ ? tasksX_ * p_->n_blocks : total_;  // tiles with V1 (and C1 without the z cache)
    }

    // The kept Dz's column chunk holding shard-local column c0: its origin, its width (its row stride) and c0's
    // column in it.
    __aicore__ inline void DzChunk(uint64_t c0, GlobalTensor<T>* chunk, uint64_t* width, uint64_t* col) const {
        const uint64_t kc = mp_->keep_cols, c = c0 / kc, start = c * kc;
        *chunk = dzKeep_[start * p_->n];
        *width = p_->v - start < kc ? p_->v - start : kc;
        *col = c0 - start;
    }

    __aicore__ inline TileAt At(uint64_t k) const {
        const uint64_t kx = tasksX_ * p_->n_blocks;
        if (k < kx) return {false, core_ + (k / p_->n_blocks) * cores_, k % p_->n_blocks};
        k -= kx;
        return {true, k % p_->m_blocks, core_ + (k / p_->m_blocks) * cores_};
    }

    // ---- cube core --------------------------------------------------------------------------------------------
    __aicore__ inline void ProcessCube(TPipe* pipe) {
        matmul::MatmulImpl<AType, BTransType, CType> mmZ;
        matmul::MatmulImpl<AType, AType, CType> mmDx;       // dz (rows x cols) @ W[nb] (cols x D); keepDz: per chunk
        matmul::MatmulImpl<ATransType, AType, CType> mmDw;  // dz^T (cols x rows) @ h[m] (rows x D); keepDz: K = N
        const bool recompute = !zc_ && vecTiles_ > 0;
        if (recompute) mmZ.Init(&td_->mmZ, pipe);
        if (tasksX_ > 0 && (td_->gradMask & 1u)) mmDx.Init(keep_ ? &td_->mmDxAll : &td_->mmDx, pipe);
        if (tasksW_ > 0 && (td_->gradMask & 2u)) mmDw.Init(keep_ ? &td_->mmDwAll : &td_->mmDw, pipe);
        if (recompute) Logits(mmZ, 0);
        for (uint64_t k = 0; k < vecTiles_; ++k) {
            if (recompute && k + 1 < vecTiles_) Logits(mmZ, k + 1);  // C1 of the next tile overlaps V1 of this one
            Switch();
            CrossCoreWaitFlag(kFlagDzReady);
            const TileAt a = At(k);
            const uint32_t slot = static_cast<uint32_t>(k % fc::kRingSlots);
            const int rows = static_cast<int>(ft::block_rows(*p_, a.m));
            const int cols = static_cast<int>(ft::block_cols(*p_, a.nb));
            const GlobalTensor<T> dz = dzRing_[(core_ * fc::kRingSlots + slot) * tileElems_];
            if (keep_) {
                // dz stays in Dz for the whole-K GEMMs after SyncAll
            } else if (!a.phaseW && (td_->gradMask & 1u)) {
                mmDx.SetTensorA(dz);
                mmDx.SetTensorB(wGm_[a.nb * p_->base_n * p_->d]);
                mmDx.SetTail(rows, static_cast<int>(p_->d), cols);
                mmDx.IterateAll(out_[0][a.m * p_->base_m * p_->d], 1);
                mmDx.End();
                Switch();
            } else if (a.phaseW && (td_->gradMask & 2u)) {
                mmDw.SetTensorA(dz, true);
                mmDw.SetTensorB(hGm_[a.m * p_->base_m * p_->d]);
                mmDw.SetTail(cols, static_cast<int>(p_->d), rows);
                mmDw.IterateAll(out_[1][a.nb * p_->base_n * p_->d], 1);
                mmDw.End();
                Switch();
            }
            if (k + fc::kRingSlots < vecTiles_) CrossCoreSetFlag<2, PIPE_FIX>(kFlagDzFree + slot);
        }
        if (!keep_) return;
        // the whole Dz (every core's tiles) and the db partials are in the workspace
        SyncAll<false>();
        Switch();
        const uint64_t d = p_->d, n = p_->n;
        GlobalTensor<T> chunk;
        uint64_t width, col;
        if (td_->gradMask & 1u) {
            for (uint64_t i = 0; i < tasksX_; ++i) {  // dX[m] = sum over chunks of Dz_c[m rows, :] @ W[c], K = width
                const uint64_t m = core_ + i * cores_;
                for (uint64_t c0 = 0; c0 < p_->v; c0 += mp_->keep_cols) {
                    DzChunk(c0, &chunk, &width, &col);
                    mmDx.SetOrgShape(n, d, width, width, d);  // A rows at stride width; B = W[c] (width x D)
                    mmDx.SetTensorA(chunk[m * p_->base_m * width]);
                    mmDx.SetTensorB(wGm_[c0 * d]);
                    mmDx.SetTail(ft::block_rows(*p_, m), d, width);
                    mmDx.IterateAll(out_[0][m * p_->base_m * d], c0 == 0 ? 0 : 1);  // the first chunk writes
                    mmDx.End();
                }
            }
        }
        Switch();
        if (td_->gradMask & 2u) {
            for (uint64_t i = 0; i < tasksW_; ++i) {  // dW[nb] += Dz_c[:, nb's columns]^T @ h, K = N
                const uint64_t nb = core_ + i * cores_;
                DzChunk(nb * p_->base_n, &chunk, &width, &col);
                mmDw.SetOrgShape(width, d, n, n, d);  // A^T stored N x width; B = h (N x D)
                mmDw.SetTensorA(chunk[col], true);
                mmDw.SetTensorB(hGm_);
                mmDw.SetTail(ft::block_cols(*p_, nb), d, n);
                mmDw.IterateAll(out_[1][nb * p_->base_n * d], 1);
                mmDw.End();
            }
        }
    }

    // ---- vector cores -----------------------------------------------------------------------------------------
    __aicore__ inline void InitVector(TPipe* pipe) {
        pipe->InitBuffer(ub_, mp_->ub_end);
        const uint32_t tile = p_->vec_rows * p_->base_n;
        st_ = mp_->slot_stride;
        z_ = ub_.GetWithOffset<float>(tile, mp_->ub_z);
        w_ = ub_.GetWithOffset<float>(tile, mp_->ub_w);
        w2_ = ub_.GetWithOffset<float>(tile, mp_->ub_w2);
        if constexpr (!IsSameType<T, float>::value) cast_ = ub_.GetWithOffset<T>(tile, mp_->ub_cast);
        if (td_->hasBias) {
            biasIn_ = ub_.GetWithOffset<T>(static_cast<uint32_t>(ft::align_up(p_->base_n, 16)), mp_->ub_bias);
            if constexpr (IsSameType<T, float>::value) {
                biasF32_ = biasIn_;
            } else {
                biasF32_ = ub_.GetWithOffset<float>(p_->base_n, mp_->ub_bias_f32);
            }
            colsum_ = ub_.GetWithOffset<float>(p_->base_n, mp_->ub_colsum);
        }
        const uint32_t bcLen = static_cast<uint32_t>(ft::align_up(p_->vec_rows, 8) * 8);
        bc_ = ub_.GetWithOffset<float>(bcLen, mp_->ub_bc);
        bc2_ = ub_.GetWithOffset<float>(bcLen, mp_->ub_bc2);
        slots_ = ub_.GetWithOffset<float>(st_ * fc::kCubeSlots, mp_->ub_slots);
        Duplicate(slots_, 0.0f, st_ * fc::kCubeSlots);
        PipeBarrier<PIPE_V>();
    }

    __aicore__ inline void ProcessVector() {
        const uint32_t sub = GetSubBlockIdx();
        const bool wantDb = td_->hasBias && (td_->gradMask & 4u);
        for (uint64_t k = 0; k < vecTiles_; ++k) {
            const TileAt a = At(k);
            const uint32_t slot = static_cast<uint32_t>(k % fc::kRingSlots);
            uint64_t r0, nr;
            ft::vec_rows_of(*p_, ft::block_rows(*p_, a.m), sub, &r0, &nr);
            const uint32_t rows = static_cast<uint32_t>(nr);
            const uint64_t row0 = a.m * p_->base_m + r0, c0 = a.nb * p_->base_n;
            const uint32_t cols = static_cast<uint32_t>(ft::block_cols(*p_, a.nb));
            // db: per vocabulary block over the token blocks (phase W), or per tile (dz kept: phase X)
            const bool dbHere = wantDb && (keep_ || a.phaseW);
            const bool dbStart = dbHere && (keep_ || a.m == 0), dbEnd = dbHere && (keep_ || a.m + 1 == p_->m_blocks);
            if (dbStart) {
                Order<HardEvent::MTE3_V>();  // the previous partial has left colsum
                Duplicate(colsum_, 0.0f, cols);
                PipeBarrier<PIPE_V>();
            }
            if (!zc_) CrossCoreWaitFlag(kFlagFull);
            Order<HardEvent::V_MTE2>();
            Order<HardEvent::S_MTE2>();
            Order<HardEvent::MTE3_MTE2>();  // the previous dz (fp32: z itself) has left for GM
            if (rows > 0) {
                if (zc_) {  // rows of the cached tile at row stride V_local -> UB rows at base_n
                    CopyRows(z_, zcGm_[row0 * p_->v + c0], rows, cols, p_->v, p_->base_n);
                } else {
                    DataCopy(z_, ring_[(core_ * fc::kRingSlots + slot) * tileElems_ + r0 * p_->base_n],
                             rows * p_->base_n);
                }
                LoadRowData(row0, rows, cols, c0);
            }
            if (!zc_ && k + fc::kRingSlots < vecTiles_) CrossCoreSetFlag<2, PIPE_MTE2>(kFlagFree + slot);
            if (rows > 0) {
                Order<HardEvent::MTE2_V>();
                Order<HardEvent::MTE2_S>();
                Order<HardEvent::MTE3_V>();  // bf16 / fp16: the previous dz has left cast_
                Dz(rows, cols, static_cast<int32_t>(c0));
                if (dbHere) {
                    for (uint32_t r = 0; r < rows; ++r) {  // fp32 column sums in row order
                        Add(colsum_, colsum_, z_[r * p_->base_n], cols);
                        PipeBarrier<PIPE_V>();
                    }
                }
            }
            // dz to the ring slot once the cube's C2 of tile k - 2 has read it. With the cube's present order (C2 of
            // k - 2 before C1 of k) kFull already implies this (the twin finds no race without it); the explicit
            // hand-back keeps the ring safe if the cube ever prefetches deeper, and bounds the cube's kDzReady
            // count (4 bits) when no C1 paces the vector cores (z cache) or dz has its own place (dz kept).
            if (k >= fc::kRingSlots) CrossCoreWaitFlag(kFlagDzFree + slot);
            if (rows > 0) {
                Order<HardEvent::V_MTE3>();
                const LocalTensor<T>& src = DzOut();
                if (keep_) {  // rows of base_n in UB -> the Dz chunk's rows at stride its width
                    GlobalTensor<T> chunk;
                    uint64_t width, col;
                    DzChunk(c0, &chunk, &width, &col);
                    StoreRows(chunk[row0 * width + col], src, rows, cols, p_->base_n, width);
                } else {
                    DataCopy(dzRing_[(core_ * fc::kRingSlots + slot) * tileElems_ + r0 * p_->base_n], src,
                             rows * p_->base_n);
                }
            }
            CrossCoreSetFlag<2, PIPE_MTE3>(kFlagDzReady);
            if (dbEnd) {
                Order<HardEvent::V_MTE3>();
                const DataCopyExtParams cp(1, cols * sizeof(float), 0, 0, 0);
                if (keep_) {
                    DataCopyPad(dbKeep_[(a.m * GetTaskRation() + sub) * p_->v + c0], colsum_, cp);
                } else {
                    DataCopyPad(dbPart_[sub * p_->v + c0], colsum_, cp);
                }
            }
        }
        if (keep_) {
            SyncAll<false>();  // with the cube cores: every dz tile and db partial is in the workspace
            if (wantDb) FinishDb(core_ * GetTaskRation() + sub, static_cast<uint64_t>(cores_) * GetTaskRation());
        } else if (wantDb) {
            SyncAll();  // every block's two partials are in the workspace
            FinishDb(core_ * GetTaskRation() + sub, static_cast<uint64_t>(cores_) * GetTaskRation());
        }
    }
private:
    __aicore__ inline LocalTensor<float> S(uint32_t s) const { return slots_[s * st_]; }

    // the dz tile in the operand dtype: z_ itself for fp32, its rounded copy otherwise
    __aicore__ inline const LocalTensor<T>& DzOut() const {
        if constexpr (IsSameType<T, float>::value) {
            return z_;
        } else {
            return cast_;
        }
    }

    // Coefficients, lse and labels of the tile's rows; the bias block.
    __aicore__ inline void LoadRowData(uint64_t row0, uint32_t rows, uint32_t cols, uint64_t c0) {
        const DataCopyExtParams cp(1, rows * sizeof(float), 0, 0, 0);
        DataCopyPad(S(kA), coef_[0][row0], cp, NoPad<float>());
        DataCopyPad(S(kT), coef_[1][row0], cp, NoPad<float>());
        if (td_->hasB) DataCopyPad(S(kB), coef_[2][row0], cp, NoPad<float>());
        if (td_->hasU) DataCopyPad(S(kU), coef_[3][row0], cp, NoPad<float>());
        DataCopyPad(S(kLse), lseGm_[row0], cp, NoPad<float>());
        if (td_->hasBias) DataCopyPad(biasIn_, bGm_[c0], DataCopyExtParams(1, cols * sizeof(T), 0, 0, 0), NoPad<T>());
        Order<HardEvent::V_S>();  // the slots' vector initialisation is done before the scalar unit writes
        LocalTensor<int32_t> lab = S(kLab).template ReinterpretCast<int32_t>();
        const int64_t v = static_cast<int64_t>(p_->v);
        for (uint32_t r = 0; r < rows; ++r) {  // shard-local label, -1 outside the shard (compared, never indexed)
            const int64_t y = static_cast<int64_t>(yGm_.GetValue(row0 + r)) - td_->vocabStart;
            lab.SetValue(r, (y >= 0 && y < v) ? static_cast<int32_t>(y) : -1);
        }
    }

    // dz of the tile in place in z_ (fp32), and its operand-dtype copy in cast_ (bf16 / fp16).
    __aicore__ inline void Dz(uint32_t rows, uint32_t cols, int32_t c0) {
        const uint32_t bn = p_->base_n, count = rows * bn, st = st_;
        const uint64_t brcbRep = ft::ceil_div(rows, 8);
        if (td_->hasBias) {
            if constexpr (!IsSameType<T, float>::value) {
                Cast(biasF32_, biasIn_, RoundMode::CAST_NONE, cols);
                PipeBarrier<PIPE_V>();
            }
            RowBroadcast(RowOp::kAdd, z_, z_, biasF32_, false, rows, cols, bn);
            PipeBarrier<PIPE_V>();
        }
        if (td_->softcap > 0.0f) {  // w2 keeps tanh(z / c) for the derivative
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
        // p = exp(z - lse)
        Brcb(bc_, S(kLse), brcbRep, BrcbRepeatParams(1, 8));
        Adds(S(kLseFloor), S(kLse), kExpFloor, st);
        PipeBarrier<PIPE_V>();
        RowBroadcast(RowOp::kSub, w_, z_, bc_, true, rows, cols, bn);
        if (td_->hasB) Brcb(bc2_, S(kLseFloor), brcbRep, BrcbRepeatParams(1, 8));
        PipeBarrier<PIPE_V>();
        Exp(w_, w_, count);
        if (td_->hasB) {  // coefficient a + b max(z, lse - 104): a p_j = 0 never meets a -inf logit
            RowBroadcast(RowOp::kMax, z_, z_, bc2_, true, rows, cols, bn);
            Brcb(bc_, S(kB), brcbRep, BrcbRepeatParams(1, 8));
            PipeBarrier<PIPE_V>();
            RowBroadcast(RowOp::kMul, z_, z_, bc_, true, rows, cols, bn);
            Brcb(bc2_, S(kA), brcbRep, BrcbRepeatParams(1, 8));
            PipeBarrier<PIPE_V>();
            RowBroadcast(RowOp::kAdd, z_, z_, bc2_, true, rows, cols, bn);
            PipeBarrier<PIPE_V>();
            Mul(z_, z_, w_, count);
        } else {
            Brcb(bc_, S(kA), brcbRep, BrcbRepeatParams(1, 8));
            PipeBarrier<PIPE_V>();
            RowBroadcast(RowOp::kMul, z_, w_, bc_, true, rows, cols, bn);
        }
        PipeBarrier<PIPE_V>();
        if (td_->hasU) {
            Brcb(bc_, S(kU), brcbRep, BrcbRepeatParams(1, 8));
            PipeBarrier<PIPE_V>();
            RowBroadcast(RowOp::kSub, z_, z_, bc_, true, rows, cols, bn);
            PipeBarrier<PIPE_V>();
        }
        // - t at the label column (the scalar unit, one element per row)
        Order<HardEvent::V_S>();
        LocalTensor<int32_t> lab = S(kLab).template ReinterpretCast<int32_t>();
        LocalTensor<float> t = S(kT);
        for (uint32_t r = 0; r < rows; ++r) {
            const int32_t y = lab.GetValue(r) - c0;
            if (y >= 0 && y < static_cast<int32_t>(cols)) {
                const uint32_t i = r * bn + static_cast<uint32_t>(y);
                z_.SetValue(i, z_.GetValue(i) - t.GetValue(r));
            }
        }
        Order<HardEvent::S_V>();
        if (td_->softcap > 0.0f) {  // times 1 - tanh^2
            Mul(w2_, w2_, w2_, count);
            PipeBarrier<PIPE_V>();
            Muls(w2_, w2_, -1.0f, count);
            PipeBarrier<PIPE_V>();
            Adds(w2_, w2_, 1.0f, count);
            PipeBarrier<PIPE_V>();
            Mul(z_, z_, w2_, count);
            PipeBarrier<PIPE_V>();
        }
        if constexpr (!IsSameType<T, float>::value) {
            Cast(cast_, z_, RoundMode::CAST_RINT, count);
            PipeBarrier<PIPE_V>();
        }
    }

    // db = the partials summed in order (vector core 0 + vector core 1; dz kept: (token block, vector core) in
    // order), for this worker's share of the vocabulary.
    __aicore__ inline void FinishDb(uint64_t me, uint64_t workers) {
        const uint64_t v = p_->v, per = ft::align_up(ft::ceil_div(v, workers), 8);
        const uint64_t j0 = me * per < v ? me * per : v, j1 = j0 + per < v ? j0 + per : v;
        const uint32_t chunk = p_->vec_rows * p_->base_n;
        const GlobalTensor<float>& part = keep_ ? dbKeep_ : dbPart_;
        const uint64_t parts = keep_ ? p_->m_blocks * GetTaskRation() : 2;
        for (uint64_t c = j0; c < j1; c += chunk) {
            const uint32_t cnt = static_cast<uint32_t>(j1 - c < chunk ? j1 - c : chunk);
            const DataCopyExtParams cp(1, cnt * sizeof(float), 0, 0, 0);
            Order<HardEvent::MTE3_MTE2>();
            Order<HardEvent::V_MTE2>();
            DataCopyPad(z_, part[c], cp, NoPad<float>());
            for (uint64_t q = 1; q < parts; ++q) {
                if (q > 1) Order<HardEvent::V_MTE2>();  // the previous Add has read w_
                DataCopyPad(w_, part[q * v + c], cp, NoPad<float>());
                Order<HardEvent::MTE2_V>();
                Add(z_, z_, w_, cnt);
                PipeBarrier<PIPE_V>();
            }
            Order<HardEvent::V_MTE3>();
            DataCopyPad(out_[2][c], z_, cp);
        }
    }

    // kSerialMatmul (a conservative variant): every pipe drained where the cube passes from one Matmul object to
    // another (they overlay L1: the next object's copies must not overtake the last one's reads)
    __aicore__ inline void Switch() {
        if (serialMatmul_) PipeBarrier<PIPE_ALL>();
    }

    template <class MM>
    __aicore__ inline void Logits(MM& mm, uint64_t k) {
        const TileAt a = At(k);
        const uint32_t slot = static_cast<uint32_t>(k % fc::kRingSlots);
        if (k >= fc::kRingSlots) CrossCoreWaitFlag(kFlagFree + slot);
        mm.SetTensorA(hGm_[a.m * p_->base_m * p_->d]);
        mm.SetTensorB(wGm_[a.nb * p_->base_n * p_->d], true);
        mm.SetTail(static_cast<int>(ft::block_rows(*p_, a.m)), static_cast<int>(ft::block_cols(*p_, a.nb)),
                   static_cast<int>(p_->d));
        mm.IterateAll(ring_[(core_ * fc::kRingSlots + slot) * tileElems_]);
        mm.End();
        CrossCoreSetFlag<2, PIPE_FIX>(kFlagFull);
    }

    const FusedLceGradCubeTilingData* td_;
    const fc::CubeGradPlan* mp_;
    const ft::Plan* p_;
    uint64_t core_ = 0, cores_ = 1, total_ = 0, vecTiles_ = 0, tileElems_ = 0, tasksX_ = 0, tasksW_ = 0;
    uint32_t st_ = 0;
    bool zc_ = false, keep_ = false, serialMatmul_ = false;
    GlobalTensor<float> coef_[4], lseGm_, zcGm_, out_[3], ring_, dbPart_, dbKeep_;
    GlobalTensor<T> hGm_, wGm_, bGm_, dzRing_, dzKeep_;
    GlobalTensor<LabelT> yGm_;
    TBuf<TPosition::VECCALC> ub_;
    LocalTensor<float> z_, w_, w2_, biasF32_, colsum_, bc_, bc2_, slots_;
    LocalTensor<T> biasIn_, cast_;
};

extern "C" __global__ __aicore__ void fused_lce_grad_cube(GM_ADDR coefA, GM_ADDR coefT, GM_ADDR coefB, GM_ADDR coefU,
                                                          GM_ADDR hidden, GM_ADDR weight, GM_ADDR bias, GM_ADDR labels,
                                                          GM_ADDR lse, GM_ADDR zCache, GM_ADDR dx, GM_ADDR dw,
                                                          GM_ADDR db, GM_ADDR workspace, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    REGISTER_TILING_DEFAULT(FusedLceGradCubeTilingData);
    GET_TILING_DATA(td, tiling);
    GM_ADDR user = GetUserWorkspace(workspace);
    GM_ADDR in[10] = {coefA, coefT, coefB, coefU, hidden, weight, bias, labels, lse, zCache};
    GM_ADDR out[3] = {dx, dw, db};
    TPipe pipe;
    FusedLceGradCubeKernel<DTYPE_HIDDEN, DTYPE_LABELS> op;
    op.Init(in, out, user, &td);
    if ASCEND_IS_AIC {
        op.ProcessCube(&pipe);
        return;
    }
    op.InitVector(&pipe);
    op.ProcessVector();
}
