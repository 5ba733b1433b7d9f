// FusedLceGradVector: operator definition, shape / dtype inference and tiling. Generated aclnn API:
//   aclnnFusedLceGradVectorGetWorkspaceSize(coefs, hidden, weight, biasOptional, labels, lse, vocabStart, softcap,
//                                     temperature, gradMask, gradHiddenOut, gradWeightOut, gradBiasOut, ws,
//                                     executor)
// coefs (4, N) float32: the per-token coefficients a, t, b, u of dz = p (a + b z) - t onehot - u that the driver
// forms (the loss's and the log-probs' alike, docs/providers.md).
//   aclnnFusedLceGradVector(workspace, workspaceSize, executor, stream)
// The three outputs are float32 accumulators that the caller zero-fills (the kernel adds into them); an output not
// selected by gradMask (bit0 dX, bit1 dW, bit2 db) may be an empty tensor.
// Status: compiled with opbuild's flags against the host twin's stub CANN headers and run under its runtime in CI
// (tests/ascend/host); never compiled against a real CANN toolkit, not run on hardware.
#include "../../common/fused_lce_host.h"

namespace optiling {

// IR input indices (the Input(...) order below); bias is optional, so the instance index of labels / lse is one lower
// without it
constexpr size_t kCoefs = 0, kHidden = 1, kWeight = 2, kBias = 3, kLabels = 4, kLse = 5;

static ge::graphStatus FusedLceGradVectorTiling(gert::TilingContext* ctx) {
    namespace fh = fused_lce_host;
    namespace ft = fused_lce::tiling;
    FusedLceVectorTilingData* td = ctx->GetTilingData<FusedLceVectorTilingData>();
    if (td == nullptr) return fh::fail(ctx, "tiling buffer smaller than FusedLceVectorTilingData (%zu bytes)",
                                       sizeof(FusedLceVectorTilingData));
    if (ctx->GetPlatformInfo() == nullptr) return fh::fail(ctx, "no platform info");
    platform_ascendc::PlatformAscendC plat(ctx->GetPlatformInfo());
    const fh::Input coefs = fh::input(ctx, kCoefs), hidden = fh::input(ctx, kHidden),
                    weight = fh::input(ctx, kWeight), bias = fh::input(ctx, kBias), labels = fh::input(ctx, kLabels),
                    lse = fh::input(ctx, kLse);
    uint64_t n = 0, d = 0, v = 0;
    if (fh::check_problem(ctx, hidden, weight, bias, labels, &n, &d, &v) != ge::GRAPH_SUCCESS) return ge::GRAPH_FAILED;
    const int64_t sn = static_cast<int64_t>(n);
    const bool coefsOk = coefs.present && coefs.shape->GetDimNum() == 2 && coefs.shape->GetDim(0) == 4 &&
                         coefs.shape->GetDim(1) == sn && coefs.dtype == ge::DT_FLOAT;
    if (!coefsOk || !fh::is_vector(lse, sn) || lse.dtype != ge::DT_FLOAT)
        return fh::fail(ctx, "coefs must be float32 (4, N) and lse float32 (N,), N = %lld", static_cast<long long>(sn));
    fh::GradAttrs at;
    if (fh::read_grad_attrs(ctx, &at) != ge::GRAPH_SUCCESS) return ge::GRAPH_FAILED;
    const int64_t vocabStart = at.vocabStart, mask = at.gradMask;
    const float softcap = at.softcap, temperature = at.temperature;

    const uint32_t flags = ft::kBackward | (bias.present ? ft::kBias : 0u) | (softcap > 0.0f ? ft::kSoftcap : 0u);
    const ft::Plan plan = ft::plan(n, d, v, fh::elt_bytes(hidden.dtype), flags, fh::hw_spec(plat));
    if (plan.status != ft::kOk) return fh::fail(ctx, "FusedLceGradVector: %s", ft::status_text(plan.status));
    std::memset(static_cast<void*>(td), 0, sizeof(*td));  // padding too: the tiling data is copied as bytes
    td->plan = plan;
    td->vocabStart = vocabStart;
    td->softcap = softcap;
    td->temperature = temperature;
    td->gradMask = static_cast<uint32_t>(mask) & (bias.present ? 7u : 3u);
    td->labelBytes = labels.dtype == ge::DT_INT64 ? 8u : 4u;
    td->hasBias = bias.present ? 1u : 0u;
    if (plan.n > 0) {
        const uint32_t bm = static_cast<uint32_t>(ft::align_up(plan.vec_rows, 16));
        // z = h[rows] @ W[cols].T (vec_rows x base_n, K = D), as the forward
        bool ok = fh::gemm_tiling(plat, hidden.dtype, false, true, matmul_tiling::TPosition::VECIN, plan.vec_rows,
                                  plan.base_n, plan.d, bm, plan.base_n, td->mmLogits);
        // dX[rows] (vec_rows x D) += dz (vec_rows x base_n) @ W[cols] (base_n x D): output chunks of base_d
        ok = ok && fh::gemm_tiling(plat, hidden.dtype, false, false, matmul_tiling::TPosition::GM, plan.vec_rows,
                                   plan.d, plan.base_n, bm, plan.base_d, td->mmDx);
        // dW[cols] (base_n x D) += dz.T (base_n x vec_rows) @ h[rows] (vec_rows x D)
        ok = ok && fh::gemm_tiling(plat, hidden.dtype, true, false, matmul_tiling::TPosition::GM, plan.base_n, plan.d,
                                   plan.vec_rows, plan.base_n, plan.base_d, td->mmDw);
        if (!ok) return fh::fail(ctx, "FusedLceGradVector: the Matmul API found no tiling");
    }
    return fh::finish_launch(ctx, plat, plan);
}

}  // namespace optiling

namespace ge {

static graphStatus FusedLceGradVectorInferShape(gert::InferShapeContext* ctx) {
    // hidden and weight come before the optional bias: their instance index is their IR index
    const gert::Shape* h = ctx->GetInputShape(1);
    const gert::Shape* w = ctx->GetInputShape(2);
    return fused_lce_host::infer_grad_shapes(ctx, h, w);
}

static graphStatus FusedLceGradVectorInferDataType(gert::InferDataTypeContext* ctx) {
    return fused_lce_host::infer_grad_dtypes(ctx);  // float32 accumulators
}

}  // namespace ge

namespace ops {

class FusedLceGradVector : public OpDef {
public:
    explicit FusedLceGradVector(const char* name) : OpDef(name) {
        const fused_lce_host::OpTypes t;
        Input("coefs").ParamType(REQUIRED).DataType(t.f32).Format(t.nd);
        fused_lce_host::problem_inputs(*this, t);
        Input("lse").ParamType(REQUIRED).DataType(t.f32).Format(t.nd);
        fused_lce_host::grad_outputs_and_attrs(*this, t);
        SetInferShape(ge::FusedLceGradVectorInferShape).SetInferDataType(ge::FusedLceGradVectorInferDataType);
        AICore().SetTiling(optiling::FusedLceGradVectorTiling).AddConfig("ascend910b").AddConfig("ascend910_93");
    }
};

OP_ADD(FusedLceGradVector);

}  // namespace ops
