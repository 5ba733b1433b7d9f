// FusedLceGrad: operator definition, shape / dtype inference and tiling. Generated aclnn API:
//   aclnnFusedLceGradGetWorkspaceSize(gradTok, hidden, weight, biasOptional, labels, lse, vocabStart, vocabTotal,
//                                     labelSmoothing, zLoss, softcap, gradMask, gradHiddenOut, gradWeightOut,
//                                     gradBiasOut, ws, executor)
//   aclnnFusedLceGrad(workspace, workspaceSize, executor, stream)
// The three outputs are float32 accumulators that the caller zero-fills (the kernel adds into them); an output not
// selected by gradMask (bit0 dX, bit1 dW, bit2 db) may be an empty tensor.
// Status: compiled with opbuild's flags against the host twin's stub CANN headers and run under its runtime in CI
// (tests/ascend/host); never compiled against a real CANN toolkit, not run on hardware.
#include "../../common/fused_lce_host.h"

namespace optiling {

// IR input indices (the Input(...) order below); bias is optional, so the instance index of labels / lse is one lower
// without it
constexpr size_t kGradTok = 0, kHidden = 1, kWeight = 2, kBias = 3, kLabels = 4, kLse = 5;
// attribute indices (the Attr(...) order below)
constexpr size_t kAttrVocabStart = 0, kAttrVocabTotal = 1, kAttrLabelSmoothing = 2, kAttrZLoss = 3, kAttrSoftcap = 4,
                 kAttrGradMask = 5;

static ge::graphStatus FusedLceGradTiling(gert::TilingContext* ctx) {
    namespace fh = fused_lce_host;
    namespace ft = fused_lce::tiling;
    FusedLceTilingData* td = ctx->GetTilingData<FusedLceTilingData>();
    if (td == nullptr) return fh::fail(ctx, "tiling buffer smaller than FusedLceTilingData (%zu bytes)",
                                       sizeof(FusedLceTilingData));
    if (ctx->GetPlatformInfo() == nullptr) return fh::fail(ctx, "no platform info");
    platform_ascendc::PlatformAscendC plat(ctx->GetPlatformInfo());
    const fh::Input gradTok = fh::input(ctx, kGradTok), hidden = fh::input(ctx, kHidden),
                    weight = fh::input(ctx, kWeight), bias = fh::input(ctx, kBias), labels = fh::input(ctx, kLabels),
                    lse = fh::input(ctx, kLse);
    uint64_t n = 0, d = 0, v = 0;
    if (fh::check_problem(ctx, hidden, weight, bias, labels, &n, &d, &v) != ge::GRAPH_SUCCESS) return ge::GRAPH_FAILED;
    const int64_t sn = static_cast<int64_t>(n);
    if (!fh::is_vector(gradTok, sn) || gradTok.dtype != ge::DT_FLOAT || !fh::is_vector(lse, sn) ||
        lse.dtype != ge::DT_FLOAT)
        return fh::fail(ctx, "grad_tok and lse must be float32 of shape (N,) = (%lld,)", static_cast<long long>(sn));
    int64_t vocabStart = 0, vocabTotal = 0, mask = 0;
    float labelSmoothing = 0.0f, zLoss = 0.0f, softcap = 0.0f;
    const gert::RuntimeAttrs* attrs = ctx->GetAttrs();
    if (!fh::attr(attrs, kAttrVocabStart, &vocabStart) || !fh::attr(attrs, kAttrVocabTotal, &vocabTotal) ||
        !fh::attr(attrs, kAttrLabelSmoothing, &labelSmoothing) || !fh::attr(attrs, kAttrZLoss, &zLoss) ||
        !fh::attr(attrs, kAttrSoftcap, &softcap) || !fh::attr(attrs, kAttrGradMask, &mask))
        return fh::fail(ctx, "missing attribute");
    if (vocabStart < 0 || (vocabTotal > 0 && static_cast<uint64_t>(vocabTotal) < static_cast<uint64_t>(vocabStart) + v))
        return fh::fail(ctx, "need vocab_start >= 0 and vocab_total >= vocab_start + V (or 0 = V)");
    if (!(labelSmoothing >= 0.0f && labelSmoothing <= 1.0f) || !(zLoss >= 0.0f) || !(softcap >= 0.0f) || mask < 0 ||
        mask > 7)
        return fh::fail(ctx, "label_smoothing in [0, 1], z_loss >= 0, softcap >= 0, grad_mask in [0, 7]");

    const uint32_t flags = ft::kBackward | (bias.present ? ft::kBias : 0u) |
                           (labelSmoothing > 0.0f ? ft::kSmoothing : 0u) | (softcap > 0.0f ? ft::kSoftcap : 0u);
    const ft::Plan plan = ft::plan(n, d, v, fh::elt_bytes(hidden.dtype), flags, fh::hw_spec(plat));
    if (plan.status != ft::kOk) return fh::fail(ctx, "FusedLceGrad: %s", ft::status_text(plan.status));
    std::memset(static_cast<void*>(td), 0, sizeof(*td));  // padding too: the tiling data is copied as bytes
    td->plan = plan;
    td->vocabStart = vocabStart;
    td->vocabTotal = vocabTotal > 0 ? vocabTotal : static_cast<int64_t>(plan.v);
    td->softcap = softcap;
    td->labelSmoothing = labelSmoothing;
    td->zLoss = zLoss;
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
        if (!ok) return fh::fail(ctx, "FusedLceGrad: the Matmul API found no tiling");
    }
    return fh::finish_launch(ctx, plat, plan);
}

}  // namespace optiling

namespace ge {

static graphStatus FusedLceGradInferShape(gert::InferShapeContext* ctx) {
    // hidden and weight come before the optional bias: their instance index is their IR index
    const gert::Shape* h = ctx->GetInputShape(1);
    const gert::Shape* w = ctx->GetInputShape(2);
    gert::Shape* dx = ctx->GetOutputShape(0);
    gert::Shape* dw = ctx->GetOutputShape(1);
    gert::Shape* db = ctx->GetOutputShape(2);
    if (h == nullptr || w == nullptr || dx == nullptr || dw == nullptr || db == nullptr || w->GetDimNum() != 2)
        return GRAPH_FAILED;
    *dx = *h;
    *dw = *w;
    db->SetDimNum(1);
    db->SetDim(0, w->GetDim(0));
    return GRAPH_SUCCESS;
}

static graphStatus FusedLceGradInferDataType(gert::InferDataTypeContext* ctx) {
    for (size_t i = 0; i < 3; ++i) ctx->SetOutputDataType(i, DT_FLOAT);  // float32 accumulators
    return GRAPH_SUCCESS;
}

}  // namespace ge

namespace ops {

class FusedLceGrad : public OpDef {
public:
    explicit FusedLceGrad(const char* name) : OpDef(name) {
        const std::vector<ge::DataType> operand = {ge::DT_BF16, ge::DT_FLOAT16, ge::DT_FLOAT,
                                                   ge::DT_BF16, ge::DT_FLOAT16, ge::DT_FLOAT};
        const std::vector<ge::DataType> label = {ge::DT_INT64, ge::DT_INT64, ge::DT_INT64,
                                                 ge::DT_INT32, ge::DT_INT32, ge::DT_INT32};
        const std::vector<ge::DataType> f32(6, ge::DT_FLOAT);
        const std::vector<ge::Format> nd(6, ge::FORMAT_ND);
        Input("grad_tok").ParamType(REQUIRED).DataType(f32).Format(nd);
        Input("hidden").ParamType(REQUIRED).DataType(operand).Format(nd);
        Input("weight").ParamType(REQUIRED).DataType(operand).Format(nd);
        Input("bias").ParamType(OPTIONAL).DataType(operand).Format(nd);
        Input("labels").ParamType(REQUIRED).DataType(label).Format(nd);
        Input("lse").ParamType(REQUIRED).DataType(f32).Format(nd);
        Output("grad_hidden").ParamType(REQUIRED).DataType(f32).Format(nd);
        Output("grad_weight").ParamType(REQUIRED).DataType(f32).Format(nd);
        Output("grad_bias").ParamType(REQUIRED).DataType(f32).Format(nd);
        Attr("vocab_start").AttrType(REQUIRED).Int();
        Attr("vocab_total").AttrType(REQUIRED).Int();
        Attr("label_smoothing").AttrType(OPTIONAL).Float(0.0f);
        Attr("z_loss").AttrType(OPTIONAL).Float(0.0f);
        Attr("softcap").AttrType(OPTIONAL).Float(0.0f);
        Attr("grad_mask").AttrType(OPTIONAL).Int(7);
        SetInferShape(ge::FusedLceGradInferShape).SetInferDataType(ge::FusedLceGradInferDataType);
        AICore().SetTiling(optiling::FusedLceGradTiling).AddConfig("ascend910b").AddConfig("ascend910_93");
    }
};

OP_ADD(FusedLceGrad);

}  // namespace ops
