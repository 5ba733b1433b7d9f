// CPU twin of the AscendC Matmul high-level API on Atlas A2 (NPU arch 2201), in its two forms:
//   * the client `Matmul` a MIX kernel's vector core drives (USE_WORKSPACE mode of impl/adv_api/detail/matmul/utils/
//     matmul_utils.h; REGIST_MATMUL_OBJ runs the server on the cube core, which the twin does in the client's call);
//   * `MatmulImpl` on the cube core itself (include/adv_api/matmul/matmul.h; what ops-nn's fused kernels use): its
//     GM reads are the cube's MTE2, its results leave through the fixpipe (FIX), both attributed to the AIC for the
//     race checker; CrossCoreSetFlag<2, PIPE_FIX> after IterateAll covers the whole GEMM (FIX runs after MTE2 / M).
// Semantics modelled from asc-devkit:
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
//   * scheduler_norm_base.h: iterateOrder 0 (ORDER_M) walks M tile by M tile inside each group of stepN N tiles, N
//     innermost; ORDER_N the other way round.
// The cube computes in float32: products of bf16 / fp16 operands are exact, sums run in K order (the hardware's
// order inside a fractal is not modelled). Also modelled, each rule with its probe (docs/npu-twin-rules.md): the
// MatmulConfig field set (Norm / MDL, intrinsicsCheck); every operand copy's Nd2NzParams and every output copy's
// fixpipe params as the library builds them, checked against their field widths; the tiling checks of CheckTiling;
// the real iterate order; the overlay of a cube core's objects in L1 / L0C (End() between two objects' use); the L1
// buffers of the Norm template as laid out at Init (whole K, the first depth - 2 K blocks, or none cached) with the
// cube computing from the blocks as they were copied in, not from GM; the cube's GM -> L1 bytes (a counter of the
// performance model).
#ifndef FUSED_LCE_TWIN_MATMUL_INTF_H_
#define FUSED_LCE_TWIN_MATMUL_INTF_H_

#include "fused_lce_cube_tiling.h"  // csrc/ascend/common: l1_block_bytes, the L1 block sizes shared with the planner
#include "kernel_operator.h"
#include "kernel_tiling/kernel_tiling.h"

enum class IterateOrder { ORDER_M = 0, ORDER_N, UNDEF };
enum class ScheduleType { INNER_PRODUCT = 0, OUTER_PRODUCT };
enum class BatchMode { NONE = 0, BATCH_LESS_THAN_L1, BATCH_LARGE_THAN_L1, SINGLE_LARGE_THAN_L1 };
enum BatchOutMode { SINGLE_BATCH = 0, MULTI_BATCH, DYNAMIC };
enum IterateMode : uint8_t {
    ITERATE_MODE_NORMAL = 0b00000001, ITERATE_MODE_ALL = 0b00000010, ITERATE_MODE_BATCH = 0b00000100,
    ITERATE_MODE_N_BATCH = 0b00001000, ITERATE_MODE_DEFAULT = 0b11111111,
};
enum class DecompressionMode {
    DECOMP_NONE = 0, DECOMP_2bitTo8bit, DECOMP_3bitTo8bit, DECOMP_4bitTo8bit, DECOMP_16bitTo64bit, DECOMP_1bitTo8bit,
    DECOMP_1bitTo4bit, DECOMP_2bitTo4bit, DECOMP_3bitTo4bit,
};
constexpr uint32_t SHARED_CO1_BUFFER_SIZE = 64 * 1024;

// The Matmul template configuration: CANN's field set, names, types and order (asc-devkit
// include/adv_api/matmul/matmul_config.h), so that a positional initialiser (as ops-nn writes them) means the same
// here. The twin reads doNorm / doMultiDataLoad (the template), intrinsicsCheck (GM -> L1 copies of an operand whose
// row stride is >= 65535 elements are looped row by row, stage/copy_cube_in/copy_tile_to_cube/
// data_copy_wrapper_nd.h; without it the stride goes into Nd2NzParams::srcDValue, 16 bits) and iterateOrder.
struct MatmulConfig {
    bool doNorm = false;
    bool doBasicBlock = false;
    bool doMultiDataLoad = false;
    uint32_t basicM = 0;
    uint32_t basicN = 0;
    uint32_t basicK = 0;
    bool intrinsicsCheck = false;
    bool isNBatch = false;
    bool enVecND2NZ = false;
    bool doSpecialBasicBlock = false;
    uint32_t doMTE2Preload = 0;
    uint32_t singleCoreM = 0;
    uint32_t singleCoreN = 0;
    uint32_t singleCoreK = 0;
    uint32_t stepM = 0;
    uint32_t stepN = 0;
    uint32_t baseMN = 0;
    uint32_t singleCoreMN = 0;
    bool enUnitFlag = true;
    bool isPerTensor = false;
    bool hasAntiQuantOffset = false;
    bool doIBShareNorm = false;
    bool doSpecialMDL = false;
    bool enableInit = true;
    BatchMode batchMode = BatchMode::NONE;
    bool enableEnd = true;
    bool enableGetTensorC = true;
    bool enableSetOrgShape = true;
    bool enableSetBias = true;
    bool enableSetTail = true;
    bool enableQuantVector = true;
    bool enableSetDefineData = true;
    uint8_t iterateMode = IterateMode::ITERATE_MODE_DEFAULT;
    bool enableReuse = true;
    bool enableUBReuse = false;
    bool enableL1CacheUB = false;
    bool intraBlockPartSum = false;
    IterateOrder iterateOrder{IterateOrder::UNDEF};
    ScheduleType scheduleType = ScheduleType::INNER_PRODUCT;
    bool enableDoubleCache = false;
    bool isBiasBatch = true;
    bool enableStaticPadZeros = false;
    bool isPartialOutput = false;
    bool enableMixDualMaster = false;
    bool isA2B2Shared = false;
    bool isEnableChannelSplit = false;
    bool enableKdimReorderLoad = false;
    bool isCO1Shared = false;
    uint32_t sharedCO1BufferSize = SHARED_CO1_BUFFER_SIZE;
    BatchOutMode bmmOutMode = BatchOutMode::SINGLE_BATCH;
    bool enableL1BankConflictOptimise = false;
    bool enableRelu = false;
    DecompressionMode decompMode = DecompressionMode::DECOMP_NONE;
};

// The Norm and MDL templates with CANN's parameter lists (include/adv_api/matmul/tiling.h); the fields the twin does
// not model keep their defaults.
constexpr MatmulConfig GetNormalConfig(const bool intrinsicsLimit = false, const bool batchLoop = false,
                                       const bool isVecND2NZ = false,
                                       const BatchMode bmmMode = BatchMode::BATCH_LESS_THAN_L1,
                                       const bool isMsgReuse = true,
                                       const IterateOrder iterateOrder = IterateOrder::UNDEF,
                                       const ScheduleType scheduleType = ScheduleType::INNER_PRODUCT,
                                       const bool enUnitFlag = true, const bool enableMixDualMaster = false,
                                       const BatchOutMode bmmOutMode = BatchOutMode::SINGLE_BATCH) {
    MatmulConfig c{};
    c.doNorm = true;
    c.intrinsicsCheck = intrinsicsLimit;
    c.isNBatch = batchLoop;
    c.enVecND2NZ = isVecND2NZ;
    c.batchMode = bmmMode;
    c.enableReuse = isMsgReuse;
    c.enableUBReuse = true;
    c.iterateOrder = iterateOrder;
    c.scheduleType = scheduleType;
    c.enUnitFlag = enUnitFlag;
    c.enableMixDualMaster = enableMixDualMaster;
    c.bmmOutMode = bmmOutMode;
    return c;
}
constexpr MatmulConfig GetMDLConfig(const bool intrinsicsLimit = false, const bool batchLoop = false,
                                    const uint32_t doMTE2Preload = 0, const bool isVecND2NZ = false,
                                    bool isPerTensor = false, bool hasAntiQuantOffset = false,
                                    const bool enUnitFlag = false, const bool isMsgReuse = true,
                                    const bool enableUBReuse = true, const bool enableL1CacheUB = false,
                                    const bool enableMixDualMaster = false, const bool enableKdimReorderLoad = false,
                                    const bool enableL1BankConflictOptimise = false) {
    MatmulConfig c{};
    c.doMultiDataLoad = true;
    c.intrinsicsCheck = intrinsicsLimit;
    c.isNBatch = batchLoop;
    c.doMTE2Preload = doMTE2Preload;
    c.enVecND2NZ = isVecND2NZ;
    c.isPerTensor = isPerTensor;
    c.hasAntiQuantOffset = hasAntiQuantOffset;
    c.enUnitFlag = enUnitFlag;
    c.enableReuse = isMsgReuse;
    c.enableUBReuse = enableUBReuse;
    c.enableL1CacheUB = enableL1CacheUB;
    c.enableMixDualMaster = enableMixDualMaster;
    c.enableKdimReorderLoad = enableKdimReorderLoad;
    c.enableL1BankConflictOptimise = enableL1BankConflictOptimise;
    return c;
}
constexpr MatmulConfig CFG_NORM = GetNormalConfig();
constexpr MatmulConfig CFG_MDL = GetMDLConfig();

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
    static constexpr const MatmulConfig& kCfg = MM_CFG;
    static_assert(kCfg.doNorm != kCfg.doMultiDataLoad && !kCfg.doBasicBlock && !kCfg.doSpecialBasicBlock &&
                      !kCfg.doSpecialMDL && !kCfg.doIBShareNorm,
                  "twin Matmul: the Norm and MDL templates only");

public:
    __aicore__ inline void Init(const tiling::TCubeTiling* cubeTiling, TPipe* tpipe = nullptr, twin::Loc loc = {}) {
        static const char* api = "Matmul::Init";
        twin::Core& c = twin::cur();
        if (cubeTiling == nullptr) twin::fail_at(loc, api, "null tiling");
        t_ = *cubeTiling;
        core_ = &c;
        if (impl_ && c.kind != twin::Core::AIC)
            twin::fail_at(loc, api, "MatmulImpl runs on the cube core (guard its use with ASCEND_IS_AIC)");
        if (!impl_ && c.kind == twin::Core::AIC)
            twin::fail_at(loc, api, "the Matmul client runs on vector cores (REGIST_MATMUL_OBJ serves it on the cube)");
        rd_pipe_ = impl_ ? twin::kMTE2 : twin::kS;
        wr_pipe_ = impl_ ? twin::kFIX : twin::kS;
        check_tiling(api, loc);
        // the L1 buffers are laid out once, from the tiling's single-core shape (scheduler_base.h Init runs KLoop
        // Init before CopyCubeInA / B Init): a later SetTail does not change what they cache
        const bool shaped = t_.singleCoreM > 0 && t_.singleCoreN > 0 && t_.singleCoreK > 0;
        const int kiter0 = shaped ? ceil_div(t_.singleCoreK, t_.baseK) : 0;
        a_l1_.init(t_.depthA1, kiter0, t_.stepM);
        b_l1_.init(t_.depthB1, kiter0, t_.stepN);
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
    // SetOrgShape / SetTail / SetSingleShape take int in CANN; the twin keeps the full value to check it fits.
    __aicore__ inline void SetOrgShape(twin::Field<int> orgM, twin::Field<int> orgN, twin::Field<int> orgK,
                                       twin::Loc loc = {}) {
        SetOrgShape(orgM, orgN, orgK, orgK, orgN, loc);
    }
    __aicore__ inline void SetOrgShape(twin::Field<int> orgM, twin::Field<int> orgN, twin::Field<int> orgKa,
                                       twin::Field<int> orgKb, twin::Field<int> orgKc = 0, twin::Loc loc = {}) {
        static const char* api = "Matmul::SetOrgShape";
        check(api, loc);
        org_m_ = shape_arg(orgM, "orgM", 1, api, loc);
        org_n_ = shape_arg(orgN, "orgN", 1, api, loc);
        org_ka_ = shape_arg(orgKa, "orgKa", 1, api, loc);
        org_kb_ = shape_arg(orgKb, "orgKb", 1, api, loc);
        org_kc_ = shape_arg(orgKc, "orgKc", 0, api, loc);
    }
    __aicore__ inline void SetSingleShape(twin::Field<int> m, twin::Field<int> n, twin::Field<int> k,
                                          twin::Loc loc = {}) {
        SetTail(m, n, k, loc);
    }
    __aicore__ inline void SetTail(twin::Field<int> tailM = -1, twin::Field<int> tailN = -1,
                                   twin::Field<int> tailK = -1, twin::Loc loc = {}) {
        static const char* api = "Matmul::SetTail";
        check(api, loc);
        const int m = shape_arg(tailM, "tailM", -1, api, loc), n = shape_arg(tailN, "tailN", -1, api, loc),
                  k = shape_arg(tailK, "tailK", -1, api, loc);
        if (m == 0 || n == 0 || k == 0) twin::fail_at(loc, api, "shape %d x %d x %d must be positive", m, n, k);
        if (m != -1) single_m_ = m;
        if (n != -1) single_n_ = n;
        if (k != -1) single_k_ = k;
    }
    __aicore__ inline void SetTensorA(const GlobalTensor<SrcAT>& gm, bool isTransposeA = false, twin::Loc loc = {}) {
        static const char* api = "Matmul::SetTensorA";
        check(api, loc);
        if (isTransposeA && !A_TYPE::isTrans)
            twin::fail_at(loc, api, "transposed A requested but MatmulType of A does not declare isTrans");
        make_live(api, loc);
        a_ = gm;
        trans_a_ = isTransposeA;
        has_a_ = true;
        restart();
        a_l1_.reset();  // SetTensorA resets A's L1 buffer only (copy_cube_in_norm.h SetInput)
    }
    __aicore__ inline void SetTensorB(const GlobalTensor<SrcBT>& gm, bool isTransposeB = false, twin::Loc loc = {}) {
        static const char* api = "Matmul::SetTensorB";
        check(api, loc);
        if (isTransposeB && !B_TYPE::isTrans)
            twin::fail_at(loc, api, "transposed B requested but MatmulType of B does not declare isTrans");
        make_live(api, loc);
        b_ = gm;
        trans_b_ = isTransposeB;
        has_b_ = true;
        restart();
        b_l1_.reset();  // and SetTensorB B's only: a sequence started by it computes with A's cached blocks
    }
    __aicore__ inline void SetBias(const GlobalTensor<BiasT>& gm, twin::Loc loc = {}) {
        check("Matmul::SetBias", loc);
        bias_ = gm;
        has_bias_ = true;
        restart();  // no L1 operand buffer is reset
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
        make_live(api, loc);
        (void)enPartialSum;
        if (done_ && impl_)
            twin::fail_at(loc, api,
                          "Iterate after the sequence's last tile without SetTensorA / SetTensorB / SetBias: only "
                          "those restart the scheduler (not End), whose loops would run on past their end "
                          "(scheduler_norm_base.h)");
        if (!next_tile()) {
            done_ = true;
            has_tile_ = false;
            return false;
        }
        if (impl_) cube_pipeline();
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
        // the client posts IterateAll as the first message of a sequence (matmul_client.h asserts isFirstIter); on
        // the cube it just loops Iterate, from wherever the scheduler stands (matmul_impl.h IterateAll)
        if (!impl_ && !first_)
            twin::fail_at(loc, api,
                          "the client's IterateAll starts a sequence: SetTensorA / SetTensorB / SetBias first");
        // one message for a client: the server runs the whole GEMM before it serves another object (kernel_kfc.h
        // switches queues between messages only), so its hits inside it are safe from the other objects' copies
        in_message_ = true;
        while (Iterate<true>(false, loc)) fixpipe_gm(gm, enAtomic == 1, enSequentialWrite, api, loc);
        in_message_ = false;
        if (!impl_) {  // the server ends a client's IterateAll with End (matmul_server.h IterateAll)
            a_l1_.reset();
            b_l1_.reset();
        }
    }
    // End: the object gives L1 / L0C back (CopyCubeInA / B Destroy, scheduler_base.h End), so another object of the
    // core may use them. It does not restart the scheduler (isFirstIter_ is set by SetTensorA / B and SetBias only).
    __aicore__ inline void End() {
        has_tile_ = false;
        a_l1_.reset();
        b_l1_.reset();
        if (impl_ && core_ != nullptr && core_->aic >= 0) {
            twin::MatmulResources& r = *twin::rt().mm_res[core_->aic];
            if (r.live == this) r.live = nullptr;
        }
    }

    // ---- twin internals ----
protected:
    bool impl_ = false;  // MatmulImpl (the cube core drives it) rather than the client
private:
    // One operand's L1 buffer as the Norm template keeps it (resource/cube_in_buffer/cube_in_buffer_normal.h). Init
    // decides once, from the tiling: with depth > 2 base blocks and fewer than the whole K of the major axis's step
    // (depth < kIter * stepM for A, * stepN for B), the first depth - 2 buffer positions are cached and two more
    // rotate; with the whole K, every position is cached; with depth <= 2 and not the whole K (or kIter 1 and depth
    // 2), nothing is. A block at position pos is copied in unless pos < cacheSize_ and pos < cacheProc_ (Hit); a
    // hit hands the cube the block as it was copied (a snapshot: a later write to GM does not reach it). Reset
    // (SetTensorA / B, the scheduler's loop ends, End) forgets the cached blocks.
    struct L1Buffer {
        struct Block {
            bool filled = false;
            int rows = 0, cols = 0;
            std::vector<float> data;  // rows x cols, as the cube reads it (A: M x K, B: K x N)
        };
        int cache_size = 0;        // cacheSize_
        int queue = 0;             // buffers of the rotating queue qid_ (0: none initialised)
        int proc = 0;              // cacheProc_: cached positions copied in since the last reset
        std::vector<Block> slots;  // cacheHead_[pos]
        void init(int cache_num, int kiter, int major) {
            proc = 0;
            const bool whole_k = static_cast<int64_t>(cache_num) >= static_cast<int64_t>(kiter) * major;
            if (cache_num > 2) {
                cache_size = whole_k ? cache_num : cache_num - 2;
                queue = whole_k ? 0 : 2;
            } else if (!whole_k || (kiter == 1 && cache_num == 2)) {
                cache_size = 0;
                queue = cache_num;
            } else {
                cache_size = cache_num;
                queue = 0;
            }
            slots.assign(static_cast<size_t>(cache_size), Block());
        }
        void reset() { proc = 0; }
        bool hit(int pos) const { return pos < cache_size && pos < proc; }
    };

    // One GEMM tile on the cube core: operands in on MTE2, the cube (M), results out through the fixpipe, which knows
    // the loads and the cube done (the Matmul API orders them internally).
    void cube_pipeline() {
        twin::Core& c = *core_;
        twin::issue(c, twin::kMTE2);
        twin::issue(c, twin::kM);
        twin::issue(c, twin::kFIX);
        c.clk.known[twin::kFIX][twin::kMTE2] = c.clk.epoch[twin::kMTE2];
        c.clk.known[twin::kFIX][twin::kM] = c.clk.epoch[twin::kM];
    }
    int rd_pipe_ = twin::kS, wr_pipe_ = twin::kS;
    // The scheduler's Reset (matmul_impl_base.h SetTensorA / SetTensorB / SetBias): the next Iterate starts at the
    // first tile. It resets no L1 buffer (scheduler_norm_base.h MoveOnFirstIterate).
    void restart() {
        first_ = true;
        done_ = false;
    }
    static int ceil_div(int a, int b) { return (a + b - 1) / b; }
    void check(const char* api, const twin::Loc& loc) const {
        if (!inited_) twin::fail_at(loc, api, "Matmul object used before REGIST_MATMUL_OBJ / Init");
        if (core_ != &twin::cur()) twin::fail_at(loc, api, "Matmul object of another core");
    }
    static int shape_arg(const twin::Field<int>& v, const char* name, int lo, const char* api, const twin::Loc& loc) {
        return static_cast<int>(
            twin::field_value(loc, api, name, v, lo, INT32_MAX, "the Matmul API's int shape arguments"));
    }
    // A client object may reuse a block it cached only while no other client object of the same AIC has copied
    // into the shared L1 region since its own last copy (the other object's blocks may lie over it).
    uint64_t l1_gen_ = 0;
    bool in_message_ = false;  // inside a client IterateAll (one server message)
    void note_shared_l1(const twin::Loc& loc) {
        if (impl_ || core_->aic < 0) return;
        twin::MatmulResources& r = *twin::rt().mm_res[core_->aic];
        l1_gen_ = ++r.client_l1_gen;
        r.client_l1_loc = loc;
    }
    void check_shared_l1(const char* what, const char* api, const twin::Loc& loc) const {
        if (impl_ || in_message_ || core_->aic < 0) return;
        const twin::MatmulResources& r = *twin::rt().mm_res[core_->aic];
        if (r.client_l1_gen != l1_gen_)
            twin::fail_at(loc, api,
                          "%s hits a block this object cached in L1, but another Matmul object served by the same "
                          "cube has copied into L1 since (at %s:%d): the server objects share one L1 region "
                          "(shareMode 0, kernel_tpipe_base.h AuxShareBufStart), so the block may be overwritten; "
                          "SetTensor the operand again (or End the object) before reusing it",
                          what, twin::base_name(r.client_l1_loc.file), r.client_l1_loc.line);
    }
    // The MatmulImpl objects of a core overlay L1 / L0C (MatmulResources): one holds data at a time.
    void make_live(const char* api, const twin::Loc& loc) {
        if (!impl_ || core_->aic < 0) return;
        twin::MatmulResources& r = *twin::rt().mm_res[core_->aic];
        if (r.live != nullptr && r.live != this)
            twin::fail_at(loc, api,
                          "the MatmulImpl objects of a cube core overlay L1 / L0C (their Init starts at the same "
                          "share address): another object became live at %s:%d and has not called End()",
                          twin::base_name(r.live_loc.file), r.live_loc.line);
        if (r.live != this) {
            r.live = this;
            r.live_loc = loc;
        }
    }

    // Tiling checks of the Matmul API (impl/adv_api/detail/matmul/param/matmul_shape_tiling.h CheckTiling, CPU-debug
    // build): positive depths and steps; base tiles within L0A / L0B (doubled when both dbL0A and dbL0B are 2) and
    // L0C (doubled with dbL0C 2); MDL: depthA1 a multiple of stepM * stepKa and at most twice it (B likewise); and
    // the object's L1 buffers (depthA1 base blocks of A, depthB1 of B: the CubeInBuffer sizes) within L1.
    void check_tiling(const char* api, const twin::Loc& loc) {
        const twin::Config& cfg = twin::rt().cfg;
        if (t_.baseM <= 0 || t_.baseN <= 0 || t_.baseK <= 0)
            twin::fail_at(loc, api, "base tile %d x %d x %d is not positive", t_.baseM, t_.baseN, t_.baseK);
        if (t_.depthA1 <= 0 || t_.depthB1 <= 0 || t_.stepM <= 0 || t_.stepN <= 0 || t_.stepKa <= 0 ||
            t_.stepKb <= 0 || t_.isBias < 0 || t_.iterateOrder < 0 || t_.iterateOrder > 1)
            twin::fail_at(loc, api,
                          "tiling depthA1 %d depthB1 %d stepM %d stepN %d stepKa %d stepKb %d isBias %d iterateOrder "
                          "%d: depths and steps must be > 0, iterateOrder 0 or 1",
                          t_.depthA1, t_.depthB1, t_.stepM, t_.stepN, t_.stepKa, t_.stepKb, t_.isBias,
                          t_.iterateOrder);
        const int c0 = static_cast<int>(32 / sizeof(SrcAT));
        if (t_.baseM % 16 || t_.baseN % 16 || t_.baseK % c0)
            twin::fail_at(loc, api, "base tile %d x %d x %d is not a multiple of the 16 x 16 x %d fractal", t_.baseM,
                          t_.baseN, t_.baseK, c0);
        const uint64_t ab = ((t_.dbL0A - 1) & (t_.dbL0B - 1)) ? 2 : 1;
        const uint64_t l0a = static_cast<uint64_t>(t_.baseM) * t_.baseK * sizeof(SrcAT) * ab;
        const uint64_t l0b = static_cast<uint64_t>(t_.baseN) * t_.baseK * sizeof(SrcBT) * ab;
        const uint64_t l0c = static_cast<uint64_t>(t_.baseM) * t_.baseN * 4 * (t_.dbL0C == 2 ? 2 : 1);
        using ull = unsigned long long;
        if (l0a > cfg.l0a_bytes) twin::fail_at(loc, api, "L0A needs %llu bytes > %llu", (ull)l0a, (ull)cfg.l0a_bytes);
        if (l0b > cfg.l0b_bytes) twin::fail_at(loc, api, "L0B needs %llu bytes > %llu", (ull)l0b, (ull)cfg.l0b_bytes);
        if (l0c > cfg.l0c_bytes) twin::fail_at(loc, api, "L0C needs %llu bytes > %llu", (ull)l0c, (ull)cfg.l0c_bytes);
        if (kCfg.doMultiDataLoad) {
            const int sa = t_.stepM * t_.stepKa, sb = t_.stepN * t_.stepKb;
            if (t_.depthA1 % sa || t_.depthA1 / sa > 2 || t_.depthB1 % sb || t_.depthB1 / sb > 2)
                twin::fail_at(loc, api,
                              "MDL: depthA1 %d must be stepM * stepKa (%d) or twice it, depthB1 %d stepN * stepKb "
                              "(%d) or twice it",
                              t_.depthA1, sa, t_.depthB1, sb);
        }
        // each block as CopyCubeInParams::GetBaseSize sizes it (fused_lce::cube::l1_block_bytes)
        namespace fc = fused_lce::cube;
        l1_bytes_ = static_cast<uint64_t>(t_.depthA1) *
                        fc::l1_block_bytes(true, A_TYPE::isTrans, t_.baseM, t_.baseK, sizeof(SrcAT)) +
                    static_cast<uint64_t>(t_.depthB1) *
                        fc::l1_block_bytes(false, B_TYPE::isTrans, t_.baseN, t_.baseK, sizeof(SrcBT));
        if (l1_bytes_ > cfg.l1_bytes)
            twin::fail_at(loc, api, "L1 needs %llu bytes (depthA1 %d, depthB1 %d) > %llu", (ull)l1_bytes_,
                          t_.depthA1, t_.depthB1, (ull)cfg.l1_bytes);
        if (core_->aic >= 0) {  // the objects overlay: the core needs the largest
            twin::MatmulResources& r = *twin::rt().mm_res[core_->aic];
            r.l1_max_bytes = std::max(r.l1_max_bytes, l1_bytes_);
        }
    }

    // ORDER_M unless the config or, with the config's UNDEF, the tiling says ORDER_N (scheduler_norm_base.h MoveNext).
    bool order_m() const {
        return kCfg.iterateOrder == IterateOrder::UNDEF ? t_.iterateOrder == static_cast<int>(IterateOrder::ORDER_M)
                                                        : kCfg.iterateOrder == IterateOrder::ORDER_M;
    }
    // The next tile of the iteration (false after the last). Order as the scheduler's MoveOnIterateOrderM / N
    // (scheduler_norm_base.h): ORDER_M walks groups of stepN N tiles, inside each every M tile, inside that the
    // group's N tiles (N innermost within a group); ORDER_N symmetrically with stepM. The operand buffers are reset
    // where the scheduler resets them: ORDER_M resets A after each N group of one M tile and B after each N group;
    // ORDER_N the other way round.
    bool next_tile() {
        const int m_iter = ceil_div(single_m_, t_.baseM), n_iter = ceil_div(single_n_, t_.baseN);
        const int64_t a_was = a_epoch_, b_was = b_epoch_;
        if (first_) {  // no buffer reset here: only where SetTensorA / B, End and the scheduler's loops reset
            idx_ = 0;
            first_ = false;
        } else if (done_) {  // the client counts its tiles itself and says false again (matmul_client.h Iterate)
            return false;
        } else if (idx_ + 1 >= m_iter * n_iter) {
            // the cube's last MoveNext resets both; the client says false without asking the cube (matmul_client.h
            // Iterate counts mnIter_), so there the buffers keep their blocks until End
            if (impl_) {
                a_l1_.reset();
                b_l1_.reset();
            }
            return false;
        } else {
            ++idx_;
        }
        if (!order_m()) {
            const int g = t_.stepM, per = g * n_iter;  // tiles per group of stepM M tiles
            const int mo = idx_ / per, r = idx_ % per, gm = std::min(g, m_iter - mo * g);
            ni_ = r / gm;
            mi_ = mo * g + r % gm;
            a_epoch_ = mo;
            b_epoch_ = static_cast<int64_t>(mo) * n_iter + ni_;
        } else {
            const int g = t_.stepN, per = g * m_iter;
            const int no = idx_ / per, r = idx_ % per, gn = std::min(g, n_iter - no * g);
            mi_ = r / gn;
            ni_ = no * g + r % gn;
            a_epoch_ = static_cast<int64_t>(no) * m_iter + mi_;
            b_epoch_ = no;
        }
        if (idx_ > 0 && a_epoch_ != a_was) a_l1_.reset();
        if (idx_ > 0 && b_epoch_ != b_was) b_l1_.reset();
        return true;
    }
    int tile_m() const { return std::min(t_.baseM, single_m_ - mi_ * t_.baseM); }
    int tile_n() const { return std::min(t_.baseN, single_n_ - ni_ * t_.baseN); }

    // The GM -> L1 copy of one base block (rows x cols of a row-major GM matrix of row stride gcol): one ND2NZ
    // DataCopy whose Nd2NzParams are checked as CopyND2NZ builds them (data_copy_wrapper_nd.h, dav-2201): without
    // intrinsicsCheck the row stride gcol goes into srcDValue (16 bits); with it a stride >= 65535 is copied row by
    // row (nValue 1, srcDValue = the row's width) from an int32 offset gCol * row.
    template <typename T>
    void copy_in(const char* what, uint64_t gcol, uint64_t h, uint64_t w, const char* api, const twin::Loc& loc) {
        const bool looped = kCfg.intrinsicsCheck && gcol >= 65535;
        Nd2NzParams p;
        p.ndNum = 1;
        p.nValue = looped ? 1 : h;
        p.dValue = w;
        p.srcNdMatrixStride = 0;
        p.srcDValue = looped ? w : gcol;
        p.dstNzC0Stride = (h + 15) / 16 * 16;
        p.dstNzNStride = 1;
        p.dstNzMatrixStride = 0;
        if (looped && gcol * (h - 1) > static_cast<uint64_t>(INT32_MAX))
            twin::fail_at(loc, api,
                          "%s: the looped copy's source offset gCol * row = %llu * %llu overflows its int32 "
                          "(data_copy_wrapper_nd.h CopyND2NZ)",
                          what, (unsigned long long)gcol, (unsigned long long)(h - 1));
        try {
            twin_ops::check_nd2nz(p, api, loc);
        } catch (const twin::Error& e) {
            throw twin::Error(std::string(e.what()) +
                              twin::format(" (the Matmul library's GM -> L1 copy of %s, row stride %llu: "
                                           "MatmulConfig::intrinsicsCheck copies strides >= 65535 row by row)",
                                           what, (unsigned long long)gcol));
        }
        // the library's own threshold (MatmulConfig.md; the loop starts at UINT16_MAX): 65535 fits the field, but
        // only intrinsicsCheck is documented to copy it
        if (gcol >= 65535 && !kCfg.intrinsicsCheck)
            twin::fail_at(loc, api,
                          "%s has a row stride of %llu elements (>= 65535): copy it with MatmulConfig::"
                          "intrinsicsCheck (GetNormalConfig(true), MatmulConfig.md) or keep the stride below 65535",
                          what, (unsigned long long)gcol);
        core_->cnt.l1_in += h * w * sizeof(T);
    }

    // The current tile's operand as L1 holds it, into `out` (A: mh x K, B: K x nw, row-major): base block kb comes
    // from its cached slot on a hit (what was copied then, whatever GM holds now), else it is copied from GM now
    // (checked, counted, kept in the slot when its position is cached). Buffer positions as CopyCubeIn::
    // GetIterIndex (copy_cube_in_norm.h): A's is its K index under ORDER_M, (M index * kIter + K index) modulo
    // stepM * kIter under ORDER_N; B's is its K index under ORDER_N, (K index + N index * kIter) modulo
    // stepN * kIter under ORDER_M. Runs of blocks copied together are read from GM in one pass.
    template <typename T>
    void load_operand(bool is_a, const GlobalTensor<T>& g, std::vector<float>& out, const char* api,
                      const twin::Loc& loc) {
        const int mh = tile_m(), nw = tile_n(), K = single_k_, bk = t_.baseK, kiter = ceil_div(K, bk);
        const int other = is_a ? mh : nw;  // the tile's extent besides K
        const bool trans = is_a ? trans_a_ : trans_b_;
        const char* what = is_a ? (trans ? "A (transposed)" : "A") : (trans ? "B (transposed)" : "B");
        L1Buffer& buf = is_a ? a_l1_ : b_l1_;
        // element (x, k) of the tile's operand (x along M for A, along N for B) in `out`
        auto at = [&](int x, int k) -> float& {
            return is_a ? out[static_cast<size_t>(x) * K + k] : out[static_cast<size_t>(k) * nw + x];
        };
        out.assign(static_cast<size_t>(other) * K, 0.0f);
        std::vector<int> pos(kiter);
        std::vector<char> copy(kiter);
        for (int kb = 0; kb < kiter; ++kb) {
            if (is_a) {
                pos[kb] = order_m() ? kb : (mi_ * kiter + kb) % (t_.stepM * kiter);
            } else {
                pos[kb] = order_m() ? (kb + ni_ * kiter) % (t_.stepN * kiter) : kb;
            }
            const int kw = std::min(bk, K - kb * bk);
            copy[kb] = !buf.hit(pos[kb]);
            if (copy[kb]) continue;
            check_shared_l1(what, api, loc);
            const typename L1Buffer::Block& b = buf.slots[pos[kb]];
            const int rows = is_a ? other : kw, cols = is_a ? kw : other;
            if (!b.filled || b.rows != rows || b.cols != cols)
                twin::fail_at(loc, api,
                              "%s's L1 buffer position %d hits a block %s (%d x %d) where the tile needs %d x %d "
                              "(cube_in_buffer_normal.h Hit returns the slot as it is)",
                              what, pos[kb], b.filled ? "of another shape" : "never copied in", b.rows, b.cols, rows,
                              cols);
            for (int x = 0; x < other; ++x)
                for (int k = 0; k < kw; ++k) at(x, kb * bk + k) = is_a ? b.data[x * kw + k] : b.data[k * other + x];
        }
        const uint64_t m0 = static_cast<uint64_t>(mi_) * t_.baseM, n0 = static_cast<uint64_t>(ni_) * t_.baseN;
        const uint64_t x0 = is_a ? m0 : n0;
        for (int kb = 0; kb < kiter;) {
            if (!copy[kb]) {
                ++kb;
                continue;
            }
            int ke = kb;
            while (ke < kiter && copy[ke]) ++ke;
            const int k0 = kb * bk, klen = std::min(K, ke * bk) - k0;
            // GM layout: A (M, K) at stride orgKa or (K, M) at orgM; B (K, N) at orgN or (N, K) at orgKb
            const bool k_rows = is_a == trans;  // GM rows run along K
            const uint64_t gcol = is_a ? (trans ? org_m_ : org_ka_) : (trans ? org_kb_ : org_n_);
            for (int b = kb; b < ke; ++b) {  // the copies' parameters first, then the data
                const int kw = std::min(bk, K - b * bk);
                if (pos[b] >= buf.cache_size && buf.queue == 0)
                    twin::fail_at(loc, api,
                                  "%s's L1 buffer was laid out at Init for the whole K of the tiling (singleCoreK %d: "
                                  "%d positions) but this tile needs position %d: a K beyond singleCoreK (SetTail) "
                                  "has no buffer to copy into (cube_in_buffer_normal.h Init / AllocTensor)",
                                  what, t_.singleCoreK, buf.cache_size, pos[b]);
                copy_in<T>(what, gcol, k_rows ? kw : other, k_rows ? other : kw, api, loc);
            }
            note_shared_l1(loc);
            std::vector<float> run;
            if (k_rows) {
                read_rows(g, k0, klen, gcol, x0, other, run, what, api, loc);
            } else {
                read_rows(g, x0, other, gcol, k0, klen, run, what, api, loc);
            }
            for (int x = 0; x < other; ++x)
                for (int k = 0; k < klen; ++k)
                    at(x, k0 + k) = k_rows ? run[static_cast<size_t>(k) * other + x]
                                           : run[static_cast<size_t>(x) * klen + k];
            for (int b = kb; b < ke; ++b) {
                if (pos[b] >= buf.cache_size) continue;  // a rotating buffer
                const int kw = std::min(bk, K - b * bk);
                typename L1Buffer::Block& s = buf.slots[pos[b]];  // AllocTensor: into the cache
                s.filled = true;
                s.rows = is_a ? other : kw;
                s.cols = is_a ? kw : other;
                s.data.resize(static_cast<size_t>(other) * kw);
                for (int x = 0; x < other; ++x)
                    for (int k = 0; k < kw; ++k)
                        (is_a ? s.data[x * kw + k] : s.data[k * other + x]) = at(x, b * bk + k);
                ++buf.proc;
            }
            kb = ke;
        }
    }

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
                                      rd_pipe_, api, loc);
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
        if (kCfg.doMultiDataLoad)
            twin::fail_at(loc, api, "the twin models the Norm template's L1 buffers only (MDL's are not modelled)");
        const int mh = tile_m(), nw = tile_n(), K = single_k_;
        core_->cnt.cube_flops += 2ull * static_cast<uint64_t>(mh) * nw * K;
        const uint64_t n0 = static_cast<uint64_t>(ni_) * t_.baseN;
        std::vector<float>& A = a_buf_;  // A as (mh, K), B as (K, nw), as L1 holds them
        std::vector<float>& B = b_buf_;
        load_operand<SrcAT>(true, a_, A, api, loc);
        load_operand<SrcBT>(false, b_, B, api, loc);
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
    // Where the fixpipe writes the current tile: rows at the tile's own width with enSequentialWrite, else at the
    // original N (orgKc when set) from (mIdx * baseM) * stride + nIdx * baseN (copy_cube_out_fixpipe.h CopyOutNZ2ND),
    // with its FixpipeParamsV220 checked as FixpipeParamsUtil fills them (nSize the tile width, mSize its height,
    // srcStride the height aligned to 16, dstStride the row stride).
    void out_layout(bool seq, uint64_t* stride, uint64_t* off, const char* api, const twin::Loc& loc) const {
        const int mh = tile_m(), nw = tile_n();
        *stride = seq ? static_cast<uint64_t>(nw) : static_cast<uint64_t>(org_kc_ ? org_kc_ : org_n_);
        *off = seq ? 0 : static_cast<uint64_t>(mi_) * t_.baseM * *stride + static_cast<uint64_t>(ni_) * t_.baseN;
        FixpipeParamsV220 fp;
        fp.nSize = nw;
        fp.mSize = mh;
        fp.srcStride = (mh + 15) / 16 * 16;
        fp.dstStride = *stride;
        twin_ops::check_fixpipe(fp, api, loc);
    }
    // Fixpipe write of the current tile to dst (capacity in elements).
    template <typename T>
    void fixpipe_out(T* dst, uint64_t capacity, bool seq, bool atomic, const char* what, const char* api,
                     const twin::Loc& loc) {
        const int mh = tile_m(), nw = tile_n();
        uint64_t stride, off;
        out_layout(seq, &stride, &off, api, loc);
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
        uint64_t stride, off;
        out_layout(seq, &stride, &off, api, loc);
        for (int i = 0; i < mh; ++i) {
            const uint64_t o = off + i * stride;
            try {
                twin_ops::gm_side(c, gm, o * sizeof(DstT), nw * sizeof(DstT), true, atomic, wr_pipe_, api, loc);
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
    int64_t a_epoch_ = 0, b_epoch_ = 0;
    L1Buffer a_l1_, b_l1_;
    uint64_t l1_bytes_ = 0;
    std::vector<float> tile_, a_buf_, b_buf_;
};

// MatmulImpl: the Matmul object a cube core drives itself (no client / server messages).
template <class A_TYPE, class B_TYPE, class C_TYPE, class BIAS_TYPE = C_TYPE, const auto& MM_CFG = CFG_NORM,
          class MM_CB = MatmulCallBackFunc<>, class POLICY = void>
class MatmulImpl : public Matmul<A_TYPE, B_TYPE, C_TYPE, BIAS_TYPE, MM_CFG, MM_CB, POLICY> {
public:
    MatmulImpl() { this->impl_ = true; }
};

namespace twin_detail {
inline void regist_matmul() {}
template <class MM, class... Rest>
inline void regist_matmul(MM& mm, const tiling::TCubeTiling* t, Rest&&... rest) {
    mm.Init(t);
    ++twin::cur().matmul_client_objects;  // each client object takes two cross-core flag ids
    regist_matmul(rest...);
}
template <class MM, class... Rest>
inline void regist_matmul(MM& mm, tiling::TCubeTiling* t, Rest&&... rest) {
    mm.Init(t);
    ++twin::cur().matmul_client_objects;
    regist_matmul(rest...);
}
}  // namespace twin_detail

}  // namespace AscendC

namespace matmul = AscendC;

// REGIST_MATMUL_OBJ(pipe, sysWorkspace, mm0, &tiling0, mm1, &tiling1, ...): on the AIV, initialises each client;
// on the AIC the real macro runs the Matmul server until the clients are done and returns from the kernel (the twin
// runs the cube work in the calling AIV's context, so the AIC just returns).
#define REGIST_MATMUL_OBJ(tpipe, workspace, ...)                     \
    do {                                                             \
        (void)(tpipe);                                               \
        (void)(workspace);                                           \
        if (ASCEND_IS_AIC) return;                                   \
        ::AscendC::twin_detail::regist_matmul(__VA_ARGS__);          \
    } while (0)
#define REGIST_CUBE_OBJ REGIST_MATMUL_OBJ

#endif  // FUSED_LCE_TWIN_MATMUL_INTF_H_
