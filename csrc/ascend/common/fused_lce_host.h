// Host-side helpers of the two ops' tiling functions: reading and validating the node (inputs by IR index, shapes,
// attributes), the part's memories from PlatformAscendC, the Matmul API tilings of the kernels' GEMMs, logging.
// C++11 and only CANN's public host headers: opbuild compiles the op_host sources with
// `-fPIC -D_GLIBCXX_USE_CXX11_ABI=0 -std=c++11 -I${CANN}/include` and the project's OPBUILD_COMPILE_OPTIONS,
// none here (asc-devkit
// cmake/asc/fwk_modules/util/compile_ascendc_all_ops_so.py, gen_compile_make_file); the relative include of the
// tiling data below resolves without any -I.
// Status: compiled with those flags against the host twin's stub headers (tests/support/ascendc_twin/host/include) and
// run under its runtime in CI (tests/ascend/host); never compiled against a real CANN toolkit, not run on hardware.
#ifndef FUSED_LCE_HOST_H_
#define FUSED_LCE_HOST_H_

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "register/op_def_registry.h"
#include "tiling/platform/platform_ascendc.h"
#include "tiling/tiling_api.h"

#include "fused_lce_cube_tiling.h"  // beside this header: opbuild compiles op_host with only the CANN includes

namespace fused_lce_host {

// Batch scheduling (TilingContext::SetScheduleMode(1)): the launch starts only when all of its cores are free.
// Both kernels synchronise all cores (SyncAll): the forward when a token block's vocabulary is split in segments, the
// backward before its db merge; without batch mode two such launches on different streams can each hold part of the
// cores and wait for the other's forever
// (asc-devkit docs/zh/api/SIMD-API/基础API/同步控制/核间同步/SyncAll.md, 约束说明). Every op sets it on every launch, as ops-nn's
// FusedLinearOnlineMaxSum does (matmul/fused_linear_online_max_sum/op_host/..._tiling.cpp, BATCH_MODE): they use every
// core anyway, and a kernel that gains a cross-core sync later stays safe.
constexpr uint32_t kBatchScheduleMode = 1;

// Error log of a failed tiling. CANN's OP_LOGE comes from ops-nn's own log/log.h (opbase), which is not part of
// ${CANN}/include for custom ops, so it is not used; the runtime reports the failed tiling itself, this adds why.
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
inline ge::graphStatus fail(const gert::ExtendedKernelContext* ctx, const char* fmt, ...) {
    const char* node = ctx != nullptr && ctx->GetNodeName() != nullptr ? ctx->GetNodeName() : "?";
    std::fprintf(stderr, "[ERROR] fused_lce tiling (%s): ", node);
    va_list args;
    va_start(args, fmt);
    std::vfprintf(stderr, fmt, args);
    va_end(args);
    std::fputc('\n', stderr);
    return ge::GRAPH_FAILED;
}

inline bool operand_dtype(ge::DataType dt) { return dt == ge::DT_BF16 || dt == ge::DT_FLOAT16 || dt == ge::DT_FLOAT; }
inline uint32_t elt_bytes(ge::DataType dt) { return dt == ge::DT_FLOAT ? 4u : 2u; }

inline matmul_tiling::DataType mm_dtype(ge::DataType dt) {
    switch (dt) {
        case ge::DT_BF16: return matmul_tiling::DataType::DT_BF16;
        case ge::DT_FLOAT16: return matmul_tiling::DataType::DT_FLOAT16;
        default: return matmul_tiling::DataType::DT_FLOAT;
    }
}

// One input of the node by its IR index (the index in the OpDef's Input(...) order). IR indices stay valid when an
// optional input before it is absent; the instance indices of GetInputDesc / GetInputShape shift down by one then.
struct Input {
    bool present;
    ge::DataType dtype;
    const gert::Shape* shape;  // storage shape (ND: the tensor's shape)
};

inline Input input(const gert::TilingContext* ctx, size_t ir_index) {
    Input in;
    const gert::CompileTimeTensorDesc* desc = ctx->GetOptionalInputDesc(ir_index);
    const gert::StorageShape* shape = ctx->GetOptionalInputShape(ir_index);
    in.present = desc != nullptr && shape != nullptr;
    in.dtype = desc != nullptr ? desc->GetDataType() : ge::DT_UNDEFINED;
    in.shape = shape != nullptr ? &shape->GetStorageShape() : nullptr;
    return in;
}

inline bool is_vector(const Input& in, int64_t len) {
    return in.present && in.shape->GetDimNum() == 1 && in.shape->GetDim(0) == len;
}

// What the tiling checks, and why here: the operator is the one place every caller passes through (aclnn calls
// from the torch adapter, graph mode), so it checks every shape and dtype the kernels rely on to stay inside their
// buffers, the attribute values that would otherwise give a silently wrong number (a negative vocab_start moves the
// target column; softcap and temperature the kernels divide by), and its planner refuses what the kernels cannot
// run (sizes past the Matmul API's int32 or the 16-bit copy stride, ids past exact floats). The torch adapter checks
// only the buffers it passes (csrc/npu), Python the user's input (fused_lce/core/validate.py).
// hidden (N, D) and weight (V, D) of one operand dtype, labels (N,) int32/int64, bias (V,) of the operand dtype or
// absent. Returns GRAPH_SUCCESS and fills n / d / v, or logs what is wrong.
inline ge::graphStatus check_problem(const gert::TilingContext* ctx, const Input& hidden, const Input& weight,
                                     const Input& bias, const Input& labels, uint64_t* n, uint64_t* d, uint64_t* v) {
    if (!hidden.present || !weight.present || !labels.present)
        return fail(ctx, "hidden, weight and labels are required");
    if (hidden.shape->GetDimNum() != 2 || weight.shape->GetDimNum() != 2)
        return fail(ctx, "hidden and weight must be 2-D, got %zu-D and %zu-D", hidden.shape->GetDimNum(),
                    weight.shape->GetDimNum());
    const int64_t sn = hidden.shape->GetDim(0), sd = hidden.shape->GetDim(1), sv = weight.shape->GetDim(0);
    if (sn < 0 || sd < 0 || sv < 0 || weight.shape->GetDim(1) != sd)
        return fail(ctx, "hidden (%lld, %lld) and weight (%lld, %lld) do not match", static_cast<long long>(sn),
                    static_cast<long long>(sd), static_cast<long long>(sv),
                    static_cast<long long>(weight.shape->GetDim(1)));
    if (!operand_dtype(hidden.dtype) || weight.dtype != hidden.dtype)
        return fail(ctx, "hidden and weight must share one of bf16 / fp16 / fp32 (dtypes %d, %d)",
                    static_cast<int>(hidden.dtype), static_cast<int>(weight.dtype));
    if (!is_vector(labels, sn) || (labels.dtype != ge::DT_INT32 && labels.dtype != ge::DT_INT64))
        return fail(ctx, "labels must be int32 / int64 of shape (N,) = (%lld,)", static_cast<long long>(sn));
    if (bias.present && (!is_vector(bias, sv) || bias.dtype != hidden.dtype))
        return fail(ctx, "bias must have shape (V,) = (%lld,) and the dtype of hidden", static_cast<long long>(sv));
    *n = static_cast<uint64_t>(sn);
    *d = static_cast<uint64_t>(sd);
    *v = static_cast<uint64_t>(sv);
    return ge::GRAPH_SUCCESS;
}

// The problem's inputs at their IR indices, checked, and their sizes.
struct Problem {
    Input hidden, weight, bias, labels;
    uint64_t n = 0, d = 0, v = 0;
};

// An op's own tiling, run after the prologue every tiling function shares (tiling_entry below).
template <typename TD>
using TilingBody = ge::graphStatus (*)(gert::TilingContext* ctx, TD* td, const Problem& pr,
                                       platform_ascendc::PlatformAscendC& plat);

// The tiling function an op registers: the tiling data buffer (large enough for TD), the platform info and the
// problem's inputs, checked, then `Body`. hidden is at IR index kIrHidden, weight, bias and labels right after it
// (problem_inputs declares them so). A template because OpAICoreDef::SetTiling takes a plain function pointer
// (gert::OpImplRegisterV2::TilingKernelFunc = UINT32 (*)(TilingContext*)): the op's specifics cannot be captured.
template <typename TD, size_t kIrHidden, TilingBody<TD> Body>
inline ge::graphStatus tiling_entry(gert::TilingContext* ctx) {
    TD* td = ctx->GetTilingData<TD>();
    if (td == nullptr) return fail(ctx, "tiling buffer smaller than the op's tiling data (%zu bytes)", sizeof(TD));
    if (ctx->GetPlatformInfo() == nullptr) return fail(ctx, "no platform info");
    Problem pr;
    pr.hidden = input(ctx, kIrHidden);
    pr.weight = input(ctx, kIrHidden + 1);
    pr.bias = input(ctx, kIrHidden + 2);
    pr.labels = input(ctx, kIrHidden + 3);
    if (check_problem(ctx, pr.hidden, pr.weight, pr.bias, pr.labels, &pr.n, &pr.d, &pr.v) != ge::GRAPH_SUCCESS)
        return ge::GRAPH_FAILED;
    platform_ascendc::PlatformAscendC plat(ctx->GetPlatformInfo());
    return Body(ctx, td, pr, plat);
}

// temperature attribute: finite and > 0 (the kernels multiply the logits by its reciprocal)
inline bool temperature_ok(float t) { return t > 0.0f && t <= 3.4028234663852886e38f; }

template <typename T>
inline bool attr(const gert::RuntimeAttrs* attrs, size_t index, T* out) {
    const T* p = attrs != nullptr ? attrs->GetAttrPointer<T>(index) : nullptr;
    if (p == nullptr) return false;
    *out = *p;
    return true;
}

inline fused_lce::tiling::HwSpec hw_spec(const platform_ascendc::PlatformAscendC& plat) {
    fused_lce::tiling::HwSpec hw;
    hw.cube_cores = plat.GetCoreNumAic();
    const uint32_t aiv = plat.GetCoreNumAiv();
    hw.vec_per_cube = hw.cube_cores > 0 && aiv >= hw.cube_cores ? aiv / hw.cube_cores : 1;
    uint64_t size = 0;
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::UB, size);
    hw.ub_bytes = size;
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::L1, size);
    hw.l1_bytes = size;
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::L0_A, size);
    hw.l0a_bytes = size;
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::L0_B, size);
    hw.l0b_bytes = size;
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::L0_C, size);
    hw.l0c_bytes = size;
    return hw;
}

// One single-core Matmul tiling of an m x n x k GEMM (each vector core drives its own), base M / N fixed to the
// plan's so that the kernels' UB tiles match what the Matmul API delivers. Base K is left to the API: SetFixSplit
// documents baseK as "only -1 supported" (asc-devkit docs/zh/api/SIMD-API/高阶API/矩阵计算/Matmul-Tiling类/
// SetFixSplit.md). UB space 0: on 910B the C matrix goes L0C -> GM workspace -> UB, the API needs no UB of its own.
// Every setter's status is checked; false when the API rejects a setting or finds no tiling.
inline bool gemm_tiling(const platform_ascendc::PlatformAscendC& plat, ge::DataType dt, bool transA, bool transB,
                        matmul_tiling::TPosition cPos, uint64_t m, uint64_t n, uint64_t k, uint32_t baseM,
                        uint32_t baseN, AscendC::tiling::TCubeTiling& out) {
    if (m == 0 || n == 0 || k == 0 || m > 0x7fffffffull || n > 0x7fffffffull || k > 0x7fffffffull) return false;
    matmul_tiling::MatmulApiTiling api(plat);
    const matmul_tiling::DataType t = mm_dtype(dt);
    const int32_t im = static_cast<int32_t>(m), in = static_cast<int32_t>(n), ik = static_cast<int32_t>(k);
    bool ok = api.SetAType(matmul_tiling::TPosition::GM, matmul_tiling::CubeFormat::ND, t, transA) == 0;
    ok = ok && api.SetBType(matmul_tiling::TPosition::GM, matmul_tiling::CubeFormat::ND, t, transB) == 0;
    ok = ok && api.SetCType(cPos, matmul_tiling::CubeFormat::ND, matmul_tiling::DataType::DT_FLOAT) == 0;
    ok = ok && api.SetBias(false) == 0;
    ok = ok && api.SetOrgShape(im, in, ik) == 0;
    ok = ok && api.SetShape(im, in, ik) == 0;
    ok = ok && api.SetFixSplit(static_cast<int32_t>(baseM), static_cast<int32_t>(baseN), -1) == 0;
    ok = ok && api.SetBufferSpace(-1, -1, 0) == 0;
    return ok && api.GetTiling(out) != -1;
}

// Fails the tiling unless GetTiling kept the base M / N that gemm_tiling fixed with SetFixSplit: the kernels size
// their GM ring slots and place the tiles they read back (ring, z cache) by the plan's base tile, while the Matmul
// library's fixpipe places a tile by the tiling's (asc-devkit stage/copy_cube_out/copy_cube_out_fixpipe.h). CANN's
// SetFixSplit pins them (matmul_tiling_base.cpp, min = max), so this holds today; a host library that did otherwise
// must not give wrong results silently. Likewise singleCoreK must be the `k` given (a single-core SetShape makes it
// so): the library lays an operand's L1 buffer out at Init from singleCoreK (scheduler_base.h Init -> KLoop ->
// cube_in_buffer_normal.h Init), so with a smaller one keep_a_resident's "whole K" depth would leave no rotating
// buffer for the K blocks the kernels' SetTail asks beyond it.
inline bool kept_base_tile(gert::TilingContext* ctx, const char* op, const char* gemm,
                           const AscendC::tiling::TCubeTiling& t, uint32_t baseM, uint32_t baseN, uint64_t k) {
    if (t.baseM != static_cast<int32_t>(baseM) || t.baseN != static_cast<int32_t>(baseN)) {
        fail(ctx, "%s: GetTiling returned a %d x %d base tile for %s, not the %u x %u the plan fixed (SetFixSplit)",
             op, t.baseM, t.baseN, gemm, baseM, baseN);
        return false;
    }
    if (t.singleCoreK < 0 || static_cast<uint64_t>(t.singleCoreK) != k) {
        fail(ctx, "%s: GetTiling returned singleCoreK %d for %s, not its K = %llu (the L1 buffers are laid out from "
             "singleCoreK)", op, t.singleCoreK, gemm, static_cast<unsigned long long>(k));
        return false;
    }
    return true;
}

// Sets the launch outputs shared by every op: block dim (MIX kernel, KERNEL_TYPE_MIX_AIC_1_2: the number of AI cores,
// each one cube with its two vector cores; asc-devkit CV融合/算子实现.md, 分离模式: the block count is the number of
// AIC + AIV combinations used), batch scheduling, and the workspace (the Matmul library's system workspace + the
// plan's user workspace).
inline ge::graphStatus finish_launch(gert::TilingContext* ctx, const platform_ascendc::PlatformAscendC& plat,
                                     uint32_t used_cores, uint64_t user_ws) {
    const uint32_t block_dim = used_cores > 0 ? used_cores : 1u;
    if (ctx->SetBlockDim(block_dim) != ge::GRAPH_SUCCESS) return fail(ctx, "SetBlockDim failed");
    if (ctx->SetScheduleMode(kBatchScheduleMode) != ge::GRAPH_SUCCESS) return fail(ctx, "SetScheduleMode failed");
    size_t* ws = ctx->GetWorkspaceSizes(1);
    if (ws == nullptr) return fail(ctx, "no workspace slot");
    const uint64_t lib = plat.GetLibApiWorkSpaceSize();
    if (user_ws > static_cast<uint64_t>(SIZE_MAX) - lib) return fail(ctx, "workspace size overflows size_t");
    ws[0] = static_cast<size_t>(lib + user_ws);
    return ge::GRAPH_SUCCESS;
}

// ---- shape / dtype inference of the two ops (h, w: the shapes of hidden and weight) ---------------------------------
// FusedLceStatsCube: six (N,) statistics (argmax int32, the rest float32) and the optional z_cache, float32
// (N, V_local) when present
inline ge::graphStatus infer_stats_shapes(gert::InferShapeContext* ctx, const gert::Shape* h, const gert::Shape* w) {
    if (h == nullptr || w == nullptr || h->GetDimNum() != 2 || w->GetDimNum() != 2) return ge::GRAPH_FAILED;
    for (size_t i = 0; i < 6; ++i) {
        gert::Shape* out = ctx->GetOutputShape(i);
        if (out == nullptr) return ge::GRAPH_FAILED;
        out->SetDimNum(1);
        out->SetDim(0, h->GetDim(0));
    }
    gert::Shape* cache = ctx->GetOutputShape(6);
    if (cache != nullptr) {
        cache->SetDimNum(2);
        cache->SetDim(0, h->GetDim(0));
        cache->SetDim(1, w->GetDim(0));
    }
    return ge::GRAPH_SUCCESS;
}

inline ge::graphStatus infer_stats_dtypes(gert::InferDataTypeContext* ctx) {
    for (size_t i = 0; i < 7; ++i) ctx->SetOutputDataType(i, i == 4 ? ge::DT_INT32 : ge::DT_FLOAT);  // 4: argmax
    return ge::GRAPH_SUCCESS;
}

// FusedLceGradCube: dX like hidden, dW like weight, db (V,), all float32 accumulators
inline ge::graphStatus infer_grad_shapes(gert::InferShapeContext* ctx, const gert::Shape* h, const gert::Shape* w) {
    gert::Shape* dx = ctx->GetOutputShape(0);
    gert::Shape* dw = ctx->GetOutputShape(1);
    gert::Shape* db = ctx->GetOutputShape(2);
    if (h == nullptr || w == nullptr || dx == nullptr || dw == nullptr || db == nullptr || w->GetDimNum() != 2)
        return ge::GRAPH_FAILED;
    *dx = *h;
    *dw = *w;
    db->SetDimNum(1);
    db->SetDim(0, w->GetDim(0));
    return ge::GRAPH_SUCCESS;
}

inline ge::graphStatus infer_grad_dtypes(gert::InferDataTypeContext* ctx) {
    for (size_t i = 0; i < 3; ++i) ctx->SetOutputDataType(i, ge::DT_FLOAT);
    return ge::GRAPH_SUCCESS;
}

// ---- OpDef pieces shared by the two ops (one list each, so the forward and the backward cannot drift) -----------------------------
// (operand dtype, label dtype) combinations, one kernel binary each; every tensor ND.
struct OpTypes {
    std::vector<ge::DataType> operand{ge::DT_BF16, ge::DT_FLOAT16, ge::DT_FLOAT,
                                      ge::DT_BF16, ge::DT_FLOAT16, ge::DT_FLOAT};
    std::vector<ge::DataType> label{ge::DT_INT64, ge::DT_INT64, ge::DT_INT64, ge::DT_INT32, ge::DT_INT32, ge::DT_INT32};
    std::vector<ge::DataType> f32 = std::vector<ge::DataType>(6, ge::DT_FLOAT);
    std::vector<ge::DataType> i32 = std::vector<ge::DataType>(6, ge::DT_INT32);
    std::vector<ge::Format> nd = std::vector<ge::Format>(6, ge::FORMAT_ND);
};

// hidden, weight, bias (optional), labels: the problem inputs of every op, in this order
inline void problem_inputs(ops::OpDef& def, const OpTypes& t) {
    def.Input("hidden").ParamType(ops::REQUIRED).DataType(t.operand).Format(t.nd);
    def.Input("weight").ParamType(ops::REQUIRED).DataType(t.operand).Format(t.nd);
    def.Input("bias").ParamType(ops::OPTIONAL).DataType(t.operand).Format(t.nd);
    def.Input("labels").ParamType(ops::REQUIRED).DataType(t.label).Format(t.nd);
}

// Every attribute of an op, read by its OpDef index and checked: first the list stats_outputs_and_attrs /
// grad_outputs_and_attrs declares, then the two finish_opdef declares last (`keep`, `variant`).
struct LossAttrs {  // what both ops have
    int64_t vocabStart = 0;
    float softcap = 0.0f, temperature = 1.0f;
    bool keep = false;     // keep_z (FusedLceStatsCube) / keep_dz (FusedLceGradCube)
    uint32_t variant = 0;  // fused_lce::cube::Variant bits
};

// The loss's values that would otherwise give a silently wrong number, and the last two attributes, at `index`.
inline ge::graphStatus read_loss_attrs(gert::TilingContext* ctx, size_t index, LossAttrs* a) {
    if (a->vocabStart < 0 || !(a->softcap >= 0.0f) || !temperature_ok(a->temperature))
        return fail(ctx, "vocab_start must be >= 0, softcap >= 0, temperature finite and > 0");
    int64_t v = 0;
    if (!attr(ctx->GetAttrs(), index, &a->keep) || !attr(ctx->GetAttrs(), index + 1, &v))
        return fail(ctx, "missing attribute");
    if (v < 0 || v > static_cast<int64_t>(fused_lce::cube::kVariantMask))
        return fail(ctx, "variant must be a set of the bits %u, got %lld", fused_lce::cube::kVariantMask,
                    static_cast<long long>(v));
    a->variant = static_cast<uint32_t>(v);
    return ge::GRAPH_SUCCESS;
}

struct StatsAttrs : LossAttrs {
    bool withZsum = false, withEntropy = false;
};

inline ge::graphStatus read_stats_attrs(gert::TilingContext* ctx, StatsAttrs* a) {
    const gert::RuntimeAttrs* attrs = ctx->GetAttrs();
    if (!attr(attrs, 0, &a->vocabStart) || !attr(attrs, 1, &a->softcap) || !attr(attrs, 2, &a->withZsum) ||
        !attr(attrs, 3, &a->temperature) || !attr(attrs, 4, &a->withEntropy))
        return fail(ctx, "missing attribute");
    return read_loss_attrs(ctx, 5, a);  // keep_z, variant
}

struct GradAttrs : LossAttrs {
    int64_t gradMask = 0;
};

inline ge::graphStatus read_grad_attrs(gert::TilingContext* ctx, GradAttrs* a) {
    const gert::RuntimeAttrs* attrs = ctx->GetAttrs();
    if (!attr(attrs, 0, &a->vocabStart) || !attr(attrs, 1, &a->softcap) || !attr(attrs, 2, &a->temperature) ||
        !attr(attrs, 3, &a->gradMask))
        return fail(ctx, "missing attribute");
    if (a->gradMask < 0 || a->gradMask > 7) return fail(ctx, "grad_mask must be in [0, 7]");
    return read_loss_attrs(ctx, 4, a);  // keep_dz, variant
}

// Starts an op's tiling data: all of it zeroed (padding and later-appended fields too: 0 = off), then the plan and
// the fields both ops' structs have (fused_lce_cube_tiling_data.h).
template <typename TD, typename CubePlan>
inline void init_tiling_data(TD* td, const CubePlan& plan, const LossAttrs& at, bool bias, bool z_cache) {
    std::memset(static_cast<void*>(td), 0, sizeof(*td));
    td->plan = plan;
    td->vocabStart = at.vocabStart;
    td->softcap = at.softcap;
    td->invTemperature = static_cast<float>(1.0 / static_cast<double>(at.temperature));
    td->hasBias = bias ? 1u : 0u;
    td->hasZCache = z_cache ? 1u : 0u;
    td->variant = at.variant;
}

// FusedLceStatsCube: the six per-token outputs and the five attributes (read_stats_attrs' order)
inline void stats_outputs_and_attrs(ops::OpDef& def, const OpTypes& t) {
    def.Output("max").ParamType(ops::REQUIRED).DataType(t.f32).Format(t.nd);
    def.Output("sum_exp").ParamType(ops::REQUIRED).DataType(t.f32).Format(t.nd);
    def.Output("target_logit").ParamType(ops::REQUIRED).DataType(t.f32).Format(t.nd);
    def.Output("logit_sum").ParamType(ops::REQUIRED).DataType(t.f32).Format(t.nd);
    def.Output("argmax").ParamType(ops::REQUIRED).DataType(t.i32).Format(t.nd);
    def.Output("entropy_stat").ParamType(ops::REQUIRED).DataType(t.f32).Format(t.nd);
    def.Attr("vocab_start").AttrType(ops::REQUIRED).Int();
    def.Attr("softcap").AttrType(ops::OPTIONAL).Float(0.0f);
    def.Attr("with_zsum").AttrType(ops::OPTIONAL).Bool(false);
    def.Attr("temperature").AttrType(ops::OPTIONAL).Float(1.0f);
    def.Attr("with_entropy").AttrType(ops::OPTIONAL).Bool(false);
}

// FusedLceGradCube: the three float32 gradient outputs and the four attributes (read_grad_attrs' order)
inline void grad_outputs_and_attrs(ops::OpDef& def, const OpTypes& t) {
    def.Output("grad_hidden").ParamType(ops::REQUIRED).DataType(t.f32).Format(t.nd);
    def.Output("grad_weight").ParamType(ops::REQUIRED).DataType(t.f32).Format(t.nd);
    def.Output("grad_bias").ParamType(ops::REQUIRED).DataType(t.f32).Format(t.nd);
    def.Attr("vocab_start").AttrType(ops::REQUIRED).Int();
    def.Attr("softcap").AttrType(ops::OPTIONAL).Float(0.0f);
    def.Attr("temperature").AttrType(ops::OPTIONAL).Float(1.0f);
    def.Attr("grad_mask").AttrType(ops::OPTIONAL).Int(7);
}

// ---- what both OpDefs end with ------------------------------------------------------------------------------------
// An op's output shapes from hidden's and weight's (infer_stats_shapes, infer_grad_shapes).
typedef ge::graphStatus (*InferShapes)(gert::InferShapeContext* ctx, const gert::Shape* h, const gert::Shape* w);

// The InferShape function an op registers: hidden and weight read by IR index (an optional input before them, as
// FusedLceGradCube's coef_b / coef_u, shifts instance indices), then `Shapes`. A template for tiling_entry's reason:
// OpDef::SetInferShape takes a plain function pointer (InferShapeKernelFunc = UINT32 (*)(InferShapeContext*)).
template <size_t kIrHidden, InferShapes Shapes>
inline ge::graphStatus infer_shape_entry(gert::InferShapeContext* ctx) {
    return Shapes(ctx, ctx->GetRequiredInputShape(kIrHidden), ctx->GetRequiredInputShape(kIrHidden + 1));
}

// The tail of both OpDefs, in one place so that the ops cannot drift: the last two attributes (read_loss_attrs),
// the op's `keep` flag (named by the op: what it keeps for the other op) and `variant`, then the inference
// functions, the tiling and the SoCs the kernels are built for.
template <typename TD, size_t kIrHidden, TilingBody<TD> Body, InferShapes Shapes>
inline void finish_opdef(ops::OpDef& def, const char* keep,
                         gert::OpImplRegisterV2::InferDataTypeKernelFunc infer_dtypes) {
    def.Attr(keep).AttrType(ops::OPTIONAL).Bool(false);
    def.Attr("variant").AttrType(ops::OPTIONAL).Int(0);  // fused_lce::cube::Variant bits (0: the default kernel)
    def.SetInferShape(infer_shape_entry<kIrHidden, Shapes>).SetInferDataType(infer_dtypes);
    def.AICore().SetTiling(tiling_entry<TD, kIrHidden, Body>).AddConfig("ascend910b").AddConfig("ascend910_93");
}

}  // namespace fused_lce_host

#endif  // FUSED_LCE_HOST_H_
