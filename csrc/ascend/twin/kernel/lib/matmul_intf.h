// CPU twin of the AscendC Matmul high-level API as a MIX (AIC:AIV) kernel's vector core sees it on Atlas A2
// (NPU arch 2201, USE_WORKSPACE mode of impl/adv_api/detail/matmul/utils/matmul_utils.h). Semantics modelled from
// asc-devkit:
//   * include/adv_api/matmul/matmul_client.h: SetTensorA/B (a transpose must be declared in MatmulType), SetTail
//     (new singleCore M/N/K), Iterate<true> (one baseM x baseN tile per call, false after the last), synchronous
//     GetTensorC(LocalTensor c): the cube writes the tile through the fixpipe into a GM staging buffer of
//     align32(c.GetSize() * sizeof(C)) bytes, then the client copies c.GetSize() elements GM -> UB with DataCopy on
//     MTE2 (blockLen = size / 8, so a size that is not a multiple of 8 floats loses its tail) and waits MTE2_V;
//     GetTensorC.md: the C LocalTensor must hold at least baseM * baseN elements; IterateAll(gm, enAtomic) writes
//     every tile with the fixpipe (enAtomic 1: float atomic add);
//   * impl/adv_api/detail/matmul/stage/copy_cube_out/copy_cube_out_fixpipe.h (CopyOutNZ2ND) with
//     scheduler/iterator/n_loop/n_loop_norm_base.h: with enSequentialWrite the rows of a tile are written at the
//     stride of the tile's own width (the tail width on the last N tile), otherwise at the original N (orgN) stride
//     at offset (mIdx * baseM) * orgN + nIdx * baseN;
//   * stage/copy_cube_in/base/copy_cube_in_params_base.h: A is (M, Ka) with row stride orgKa, or (Ka, M) with stride
//     orgM when transposed; B is (Kb, N) with stride orgN, or (N, Kb) with stride orgKb when transposed;
//   * scheduler_norm_base.h: iterateOrder 0 (ORDER_M) walks N inside M.
// The cube computes in float32: products of bf16 / fp16 operands are exact, sums run in K order (the hardware's
// order inside a fractal is not modelled). Capacities of L0A / L0B / L0C / L1 are checked against the tiling.
#ifndef FUSED_LCE_TWIN_MATMUL_INTF_H_
#define FUSED_LCE_TWIN_MATMUL_INTF_H_

#include "kernel_operator.h"
#include "kernel_tiling/kernel_tiling.h"

enum class IterateOrder { ORDER_M = 0, ORDER_N, UNDEF };
enum class ScheduleType { INNER_PRODUCT = 0, OUTER_PRODUCT };
struct MatmulConfig {
    bool doNorm = true;
    bool doBasicBlock = false;
    bool doMultiDataLoad = false;
    bool enableInit = true;
    bool enableSetTail = true;
};
inline constexpr MatmulConfig CFG_NORM{};
inline constexpr MatmulConfig CFG_MDL{true, false, true, true, true};

namespace AscendC {

template <TPosition POSITION, CubeFormat FORMAT, typename TYPE, bool ISTRANS = false,
          LayoutMode LAYOUT = LayoutMode::NONE, bool IBSHARE = false, TPosition SRCPOS = TPosition::GM>
struct MatmulType {
    constexpr static TPosition pos = POSITION;
    constexpr static CubeFormat format = FORMAT;
    using T = TYPE;
    constexpr static bool isTrans = ISTRANS;
    constexpr static LayoutMode layout = LAYOUT;
    constexpr static bool ibShare = IBSHARE;
    constexpr static TPosition srcPos = SRCPOS;
};

template <const void* a = nullptr, const void* b = nullptr, const void* c = nullptr>
struct MatmulCallBackFunc {};

template <class A_TYPE, class B_TYPE, class C_TYPE, class BIAS_TYPE = C_TYPE, const auto& MM_CFG = CFG_NORM,
          class MM_CB = MatmulCallBackFunc<>, class POLICY = void>
class Matmul {
    using SrcAT = typename A_TYPE::T;
    using SrcBT = typename B_TYPE::T;
    using DstT = typename C_TYPE::T;
    using BiasT = typename BIAS_TYPE::T;
    static_assert(A_TYPE::format == CubeFormat::ND && B_TYPE::format == CubeFormat::ND,
                  "twin Matmul: only ND operands are modelled");
    static_assert(C_TYPE::format == CubeFormat::ND, "twin Matmul: only ND output is modelled");

public:
    __aicore__ inline void Init(const tiling::TCubeTiling* cubeTiling, TPipe* tpipe = nullptr, twin::Loc loc = {}) {
        static const char* api = "Matmul::Init";
        twin::Core& c = twin::cur();
        if (cubeTiling == nullptr) twin::fail_at(loc, api, "null tiling");
        t_ = *cubeTiling;
        core_ = &c;
        const twin::Config& cfg = twin::rt().cfg;
        if (t_.baseM <= 0 || t_.baseN <= 0 || t_.baseK <= 0)
            twin::fail_at(loc, api, "base tile %d x %d x %d is not positive", t_.baseM, t_.baseN, t_.baseK);
        const int c0 = static_cast<int>(32 / sizeof(SrcAT));
        if (t_.baseM % 16 || t_.baseN % 16 || t_.baseK % c0)
            twin::fail_at(loc, api, "base tile %d x %d x %d is not a multiple of the 16 x 16 x %d fractal", t_.baseM,
                          t_.baseN, t_.baseK, c0);
        const uint64_t l0a = static_cast<uint64_t>(t_.baseM) * t_.baseK * sizeof(SrcAT) * (t_.dbL0A > 1 ? 2 : 1);
        const uint64_t l0b = static_cast<uint64_t>(t_.baseN) * t_.baseK * sizeof(SrcBT) * (t_.dbL0B > 1 ? 2 : 1);
        const uint64_t l0c = static_cast<uint64_t>(t_.baseM) * t_.baseN * 4 * (t_.dbL0C > 1 ? 2 : 1);
        using ull = unsigned long long;
        if (l0a > cfg.l0a_bytes) twin::fail_at(loc, api, "L0A needs %llu bytes > %llu", (ull)l0a, (ull)cfg.l0a_bytes);
        if (l0b > cfg.l0b_bytes) twin::fail_at(loc, api, "L0B needs %llu bytes > %llu", (ull)l0b, (ull)cfg.l0b_bytes);
        if (l0c > cfg.l0c_bytes) twin::fail_at(loc, api, "L0C needs %llu bytes > %llu", (ull)l0c, (ull)cfg.l0c_bytes);
        const uint64_t l1 = static_cast<uint64_t>(std::max(t_.depthA1, 1)) * t_.baseM * t_.baseK * sizeof(SrcAT) +
                            static_cast<uint64_t>(std::max(t_.depthB1, 1)) * t_.baseN * t_.baseK * sizeof(SrcBT);
        if (l1 > cfg.l1_bytes)
            twin::fail_at(loc, api, "L1 needs %llu bytes (depthA1 %d, depthB1 %d) > %llu", (unsigned long long)l1,
                          t_.depthA1, t_.depthB1, (unsigned long long)cfg.l1_bytes);
        if (c.aic >= 0) twin::rt().mm_res[c.aic]->l1_objects_bytes += l1;
        single_m_ = t_.singleCoreM;
        single_n_ = t_.singleCoreN;
        single_k_ = t_.singleCoreK;
        org_m_ = t_.M;
        org_n_ = t_.N;
        org_ka_ = t_.Ka;
        org_kb_ = t_.Kb;
        org_kc_ = 0;
        inited_ = true;
        (void)tpipe;
    }
    __aicore__ inline void SetOrgShape(int orgM, int orgN, int orgK) { SetOrgShape(orgM, orgN, orgK, orgK, orgN); }
    __aicore__ inline void SetOrgShape(int orgM, int orgN, int orgKa, int orgKb, int orgKc = 0) {
        org_m_ = orgM;
        org_n_ = orgN;
        org_ka_ = orgKa;
        org_kb_ = orgKb;
        org_kc_ = orgKc;
    }
    __aicore__ inline void SetSingleShape(int m, int n, int k) { SetTail(m, n, k); }
    __aicore__ inline void SetTail(int tailM = -1, int tailN = -1, int tailK = -1, twin::Loc loc = {}) {
        check("Matmul::SetTail", loc);
        if (tailM == 0 || tailN == 0 || tailK == 0 || tailM < -1 || tailN < -1 || tailK < -1)
            twin::fail_at(loc, "Matmul::SetTail", "shape %d x %d x %d must be positive", tailM, tailN, tailK);
        if (tailM != -1) single_m_ = tailM;
        if (tailN != -1) single_n_ = tailN;
        if (tailK != -1) single_k_ = tailK;
    }
    __aicore__ inline void SetTensorA(const GlobalTensor<SrcAT>& gm, bool isTransposeA = false, twin::Loc loc = {}) {
        check("Matmul::SetTensorA", loc);
        if (isTransposeA && !A_TYPE::isTrans)
            twin::fail_at(loc, "Matmul::SetTensorA",
                          "transposed A requested but MatmulType of A does not declare isTrans");
        a_ = gm;
        trans_a_ = isTransposeA;
        has_a_ = true;
        first_ = true;
    }
    __aicore__ inline void SetTensorB(const GlobalTensor<SrcBT>& gm, bool isTransposeB = false, twin::Loc loc = {}) {
        check("Matmul::SetTensorB", loc);
        if (isTransposeB && !B_TYPE::isTrans)
            twin::fail_at(loc, "Matmul::SetTensorB",
                          "transposed B requested but MatmulType of B does not declare isTrans");
        b_ = gm;
        trans_b_ = isTransposeB;
        has_b_ = true;
        first_ = true;
    }
    __aicore__ inline void SetBias(const GlobalTensor<BiasT>& gm, twin::Loc loc = {}) {
        check("Matmul::SetBias", loc);
        bias_ = gm;
        has_bias_ = true;
    }
    __aicore__ inline void DisableBias() { has_bias_ = false; }
    __aicore__ inline void ClearBias() { has_bias_ = false; }

    template <bool sync = true>
    __aicore__ inline bool Iterate(bool enPartialSum = false, twin::Loc loc = {}) {
        static const char* api = "Matmul::Iterate";
        static_assert(sync, "twin Matmul: only the synchronous Iterate is modelled");
        check(api, loc);
        twin::api_enter(*core_);
        twin::yield_point();
        if (!has_a_ || !has_b_) twin::fail_at(loc, api, "Iterate before SetTensorA / SetTensorB");
        (void)enPartialSum;
        const int m_iter = ceil_div(single_m_, t_.baseM), n_iter = ceil_div(single_n_, t_.baseN);
        if (first_) {
            idx_ = 0;
            first_ = false;
        } else {
            if (idx_ + 1 >= m_iter * n_iter) {
                done_ = true;
                return false;
            }
            ++idx_;
        }
        if (t_.iterateOrder == static_cast<int>(IterateOrder::ORDER_N)) {
            mi_ = idx_ % m_iter;
            ni_ = idx_ / m_iter;
        } else {
            mi_ = idx_ / n_iter;
            ni_ = idx_ % n_iter;
        }
        compute(api, loc);
        has_tile_ = true;
        return true;
    }

    // Synchronous GetTensorC into UB (VECIN) on Atlas A2: fixpipe -> GM staging buffer -> DataCopy (MTE2) -> UB.
    template <bool sync = true, bool doPad = false>
    __aicore__ inline void GetTensorC(const LocalTensor<DstT>& c, uint8_t enAtomic = 0, bool enSequentialWrite = false,
                                      uint32_t height = 0, uint32_t width = 0, uint32_t srcGap = 0,
                                      uint32_t dstGap = 0, twin::Loc loc = {}) {
        static const char* api = "Matmul::GetTensorC(LocalTensor)";
        static_assert(sync && !doPad, "twin Matmul: synchronous, unpadded GetTensorC only");
        static_assert(C_TYPE::pos == TPosition::VECIN || C_TYPE::pos == TPosition::VECCALC ||
                          C_TYPE::pos == TPosition::VECOUT,
                      "GetTensorC(LocalTensor) needs a C MatmulType in UB");
        (void)height, (void)width, (void)srcGap, (void)dstGap;
        check(api, loc);
        twin::Core& core = *core_;
        twin::api_enter(core);
        twin::yield_point();
        if (!has_tile_) twin::fail_at(loc, api, "GetTensorC before Iterate");
        if (enAtomic != 0) twin::fail_at(loc, api, "enAtomic must be 0 for a LocalTensor destination");
        c.check_owner(api, loc);
        const uint64_t size = c.GetSize();
        if (size < static_cast<uint64_t>(t_.baseM) * t_.baseN)
            twin::fail_at(loc, api,
                          "C LocalTensor holds %llu elements, fewer than baseM * baseN = %d * %d (GetTensorC.md)",
                          (unsigned long long)size, t_.baseM, t_.baseN);
        if (size % (32 / sizeof(DstT)) != 0)
            twin::fail_at(loc, api,
                          "C LocalTensor size %llu is not a multiple of %zu: the copy to UB moves size / %zu "
                          "blocks and drops the rest",
                          (unsigned long long)size, 32 / sizeof(DstT), 32 / sizeof(DstT));
        const uint64_t slot = (size * sizeof(DstT) + 31) / 32 * 32;
        std::vector<uint8_t>& ring = twin::rt().kfc_ring[core.index];
        if (slot > ring.size())
            twin::fail_at(loc, api, "C LocalTensor of %llu bytes exceeds the client's GM staging ring of %zu bytes",
                          (unsigned long long)slot, ring.size());
        std::memset(ring.data(), 0xff, slot);  // bytes the fixpipe does not write read back as NaN
        fixpipe_out(reinterpret_cast<DstT*>(ring.data()), slot / sizeof(DstT), enSequentialWrite, false,
                    "the GetTensorC LocalTensor", api, loc);
        // CopyToUB: DataCopy(c, staging, c.GetSize()) on MTE2, then SetFlag/WaitFlag<MTE2_V> inside the client
        twin_ops::check_ub(c, size, api, loc, "C");
        const uint32_t e = twin::issue(core, twin::kMTE2);
        twin::ub_access(core, c.offset(), size * sizeof(DstT), twin::kMTE2, true, e, twin::site_id(api, loc), api,
                        loc);
        std::memcpy(c.addr_, ring.data(), size * sizeof(DstT));
        twin::issue(core, twin::kV);
        for (int p = 0; p < twin::kNumPipes; ++p)
            core.clk.known[twin::kV][p] = std::max(core.clk.known[twin::kV][p], core.clk.known[twin::kMTE2][p]);
        core.clk.known[twin::kV][twin::kMTE2] = core.clk.epoch[twin::kMTE2];
    }
    // GetTensorC into GM (fixpipe), optionally with float atomic add.
    template <bool sync = true>
    __aicore__ inline void GetTensorC(const GlobalTensor<DstT>& gm, uint8_t enAtomic = 0,
                                      bool enSequentialWrite = false, twin::Loc loc = {}) {
        static const char* api = "Matmul::GetTensorC(GlobalTensor)";
        check(api, loc);
        twin::api_enter(*core_);
        twin::yield_point();
        if (!has_tile_) twin::fail_at(loc, api, "GetTensorC before Iterate");
        if (enAtomic > 1) twin::fail_at(loc, api, "only enAtomic 0 / 1 (add) are modelled");
        fixpipe_gm(gm, enAtomic == 1, enSequentialWrite, api, loc);
    }
    template <bool sync = true>
    __aicore__ inline void IterateAll(const GlobalTensor<DstT>& gm, uint8_t enAtomic = 0,
                                      bool enSequentialWrite = false, bool waitIterateAll = false, bool fakeMsg = false,
                                      twin::Loc loc = {}) {
        static const char* api = "Matmul::IterateAll";
        static_assert(sync, "twin Matmul: synchronous IterateAll only");
        (void)waitIterateAll, (void)fakeMsg;
        check(api, loc);
        if (enAtomic > 1) twin::fail_at(loc, api, "only enAtomic 0 / 1 (add) are modelled");
        first_ = true;
        while (Iterate<true>(false, loc)) fixpipe_gm(gm, enAtomic == 1, enSequentialWrite, api, loc);
    }
    __aicore__ inline void End() {
        has_tile_ = false;
        first_ = true;
    }

    // ---- twin internals ----
private:
    static int ceil_div(int a, int b) { return (a + b - 1) / b; }
    void check(const char* api, const twin::Loc& loc) const {
        if (!inited_) twin::fail_at(loc, api, "Matmul object used before REGIST_MATMUL_OBJ / Init");
        if (core_ != &twin::cur()) twin::fail_at(loc, api, "Matmul object of another core");
    }
    int tile_m() const { return std::min(t_.baseM, single_m_ - mi_ * t_.baseM); }
    int tile_n() const { return std::min(t_.baseN, single_n_ - ni_ * t_.baseN); }

    // Reads rows of an operand from GM with bounds / race checks (the cube reads on behalf of this AIV; the AIV
    // posted the request on its scalar pipe, so this core's MTE3 writes must be known to PIPE_S).
    template <typename T>
    void read_rows(const GlobalTensor<T>& g, uint64_t row0, uint64_t rows, uint64_t stride, uint64_t col0,
                   uint64_t cols, std::vector<float>& out, const char* what, const char* api, const twin::Loc& loc) {
        twin::Core& c = *core_;
        out.resize(rows * cols);
        // one check per contiguous run of GM (the whole block when rows are back to back)
        const bool contiguous = stride == cols || rows == 1;
        for (uint64_t r = 0; r < rows; ++r) {
            if (contiguous ? r == 0 : true) {
                const uint64_t n = contiguous ? rows * cols : cols;
                try {
                    twin_ops::gm_side(c, g, ((row0 + r) * stride + col0) * sizeof(T), n * sizeof(T), false, false,
                                      twin::kS, api, loc);
                } catch (const twin::Error& e) {
                    throw twin::Error(std::string(e.what()) +
                                      twin::format(" (cube reading %s rows %llu..%llu, %llu elements each)", what,
                                                   (unsigned long long)(row0 + r),
                                                   (unsigned long long)(row0 + (contiguous ? rows : r + 1) - 1),
                                                   (unsigned long long)cols));
                }
            }
            const T* p = g.GetPhyAddr() + (row0 + r) * stride + col0;
            float* o = &out[r * cols];
            for (uint64_t k = 0; k < cols; ++k) o[k] = static_cast<float>(p[k]);
        }
    }
    void compute(const char* api, const twin::Loc& loc) {
        const int mh = tile_m(), nw = tile_n(), K = single_k_;
        const uint64_t m0 = static_cast<uint64_t>(mi_) * t_.baseM, n0 = static_cast<uint64_t>(ni_) * t_.baseN;
        std::vector<float>& A = a_buf_;  // A as (mh, K), B as (K, nw)
        std::vector<float>& B = b_buf_;
        if (!trans_a_) {
            read_rows(a_, m0, mh, org_ka_, 0, K, A, "A", api, loc);
        } else {  // stored (K, M): row k holds A[:, k]
            std::vector<float> at;
            read_rows(a_, 0, K, org_m_, m0, mh, at, "A (transposed)", api, loc);
            A.assign(static_cast<size_t>(mh) * K, 0.0f);
            for (int k = 0; k < K; ++k)
                for (int i = 0; i < mh; ++i) A[static_cast<size_t>(i) * K + k] = at[static_cast<size_t>(k) * mh + i];
        }
        if (!trans_b_) {
            read_rows(b_, 0, K, org_n_, n0, nw, B, "B", api, loc);
        } else {  // stored (N, K)
            std::vector<float> bt;
            read_rows(b_, n0, nw, org_kb_, 0, K, bt, "B (transposed)", api, loc);
            B.assign(static_cast<size_t>(K) * nw, 0.0f);
            for (int j = 0; j < nw; ++j)
                for (int k = 0; k < K; ++k) B[static_cast<size_t>(k) * nw + j] = bt[static_cast<size_t>(j) * K + k];
        }
        tile_.assign(static_cast<size_t>(mh) * nw, 0.0f);
        if (has_bias_) {
            std::vector<float> bias;
            read_rows(bias_, 0, 1, 0, n0, nw, bias, "bias", api, loc);
            for (int i = 0; i < mh; ++i)
                for (int j = 0; j < nw; ++j) tile_[static_cast<size_t>(i) * nw + j] = bias[j];
        }
        for (int i = 0; i < mh; ++i) {
            float* acc = &tile_[static_cast<size_t>(i) * nw];
            for (int k = 0; k < K; ++k) {
                const float a = A[static_cast<size_t>(i) * K + k];
                const float* b = &B[static_cast<size_t>(k) * nw];
                for (int j = 0; j < nw; ++j) acc[j] += a * b[j];
            }
        }
    }
    // Fixpipe write of the current tile to dst (capacity in elements).
    template <typename T>
    void fixpipe_out(T* dst, uint64_t capacity, bool seq, bool atomic, const char* what, const char* api,
                     const twin::Loc& loc) {
        const int mh = tile_m(), nw = tile_n();
        const uint64_t stride = seq ? static_cast<uint64_t>(nw) : static_cast<uint64_t>(org_kc_ ? org_kc_ : org_n_);
        const uint64_t off =
            seq ? 0 : static_cast<uint64_t>(mi_) * t_.baseM * stride + static_cast<uint64_t>(ni_) * t_.baseN;
        const uint64_t end = off + (mh - 1) * stride + nw;
        if (end > capacity)
            twin::fail_at(loc, api,
                          "the %d x %d C tile written at row stride %llu (offset %llu) needs %llu elements but %s "
                          "holds %llu",
                          mh, nw, (unsigned long long)stride, (unsigned long long)off, (unsigned long long)end, what,
                          (unsigned long long)capacity);
        for (int i = 0; i < mh; ++i)
            for (int j = 0; j < nw; ++j) {
                T& d = dst[off + i * stride + j];
                const float v = tile_[static_cast<size_t>(i) * nw + j];
                d = atomic ? T(static_cast<float>(d) + v) : T(v);
            }
    }
    void fixpipe_gm(const GlobalTensor<DstT>& gm, bool atomic, bool seq, const char* api, const twin::Loc& loc) {
        twin::Core& c = *core_;
        const int mh = tile_m(), nw = tile_n();
        const uint64_t stride = seq ? static_cast<uint64_t>(nw) : static_cast<uint64_t>(org_kc_ ? org_kc_ : org_n_);
        const uint64_t off =
            seq ? 0 : static_cast<uint64_t>(mi_) * t_.baseM * stride + static_cast<uint64_t>(ni_) * t_.baseN;
        for (int i = 0; i < mh; ++i) {
            const uint64_t o = off + i * stride;
            try {
                twin_ops::gm_side(c, gm, o * sizeof(DstT), nw * sizeof(DstT), true, atomic, twin::kS, api, loc);
            } catch (const twin::Error& e) {
                throw twin::Error(std::string(e.what()) + twin::format(" (fixpipe writing C row %d of the tile)", i));
            }
            DstT* d = gm.GetPhyAddr() + o;
            for (int j = 0; j < nw; ++j) {
                const float v = tile_[static_cast<size_t>(i) * nw + j];
                d[j] = atomic ? DstT(static_cast<float>(d[j]) + v) : DstT(v);
            }
        }
    }

    tiling::TCubeTiling t_{};
    twin::Core* core_ = nullptr;
    bool inited_ = false;
    GlobalTensor<SrcAT> a_;
    GlobalTensor<SrcBT> b_;
    GlobalTensor<BiasT> bias_;
    bool trans_a_ = false, trans_b_ = false, has_a_ = false, has_b_ = false, has_bias_ = false;
    int single_m_ = 0, single_n_ = 0, single_k_ = 0;
    int org_m_ = 0, org_n_ = 0, org_ka_ = 0, org_kb_ = 0, org_kc_ = 0;
    bool first_ = true, done_ = false, has_tile_ = false;
    int idx_ = 0, mi_ = 0, ni_ = 0;
    std::vector<float> tile_, a_buf_, b_buf_;
};

namespace twin_detail {
inline void regist_matmul() {}
template <class MM, class... Rest>
inline void regist_matmul(MM& mm, const tiling::TCubeTiling* t, Rest&&... rest) {
    mm.Init(t);
    regist_matmul(rest...);
}
template <class MM, class... Rest>
inline void regist_matmul(MM& mm, tiling::TCubeTiling* t, Rest&&... rest) {
    mm.Init(t);
    regist_matmul(rest...);
}
}  // namespace twin_detail

}  // namespace AscendC

namespace matmul = AscendC;

// REGIST_MATMUL_OBJ(pipe, sysWorkspace, mm0, &tiling0, mm1, &tiling1, ...): on the AIV, initialises each client
// (on the AIC the real macro runs the Matmul server; the twin runs the cube work in the calling AIV's context).
#define REGIST_MATMUL_OBJ(tpipe, workspace, ...)                     \
    do {                                                             \
        (void)(tpipe);                                               \
        (void)(workspace);                                           \
        ::AscendC::twin_detail::regist_matmul(__VA_ARGS__);          \
    } while (0)
#define REGIST_CUBE_OBJ REGIST_MATMUL_OBJ

#endif  // FUSED_LCE_TWIN_MATMUL_INTF_H_
