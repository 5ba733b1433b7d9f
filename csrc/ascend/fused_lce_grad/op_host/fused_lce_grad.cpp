// FusedLceGrad: operator definition, shape / dtype inference and tiling. Generated aclnn API:
//   aclnnFusedLceGradGetWorkspaceSize(gradTok, hidden, weight, biasOptional, labels, lse, vocabStart, vocabTotal,
//                                     labelSmoothing, zLoss, softcap, gradMask, gradHiddenOut, gradWeightOut,
//                                     gradBiasOut, ws, executor)
//   aclnnFusedLceGrad(workspace, workspaceSize, executor, stream)
// The three outputs are float32 accumulators that the caller zero-fills (the kernel adds into them); an output not
// selected by gradMask (bit0 dX, bit1 dW, bit2 db) may be an empty tensor.
// Status: written, not compiled here (no CANN toolkit), not run on hardware.
#include "../../common/fused_lce_host.h"

namespace optiling {

static ge::graphStatus FusedLceGradTiling(gert::TilingContext* ctx) {
    auto* td = ctx->GetTilingData<FusedLceTilingData>();
    platform_ascendc::PlatformAscendC plat(ctx->GetPlatformInfo());
    const gert::Shape& h = ctx->GetInputShape(1)->GetStorageShape();
    const gert::Shape& w = ctx->GetInputShape(2)->GetStorageShape();
    const bool hasBias = ctx->GetOptionalInputShape(3) != nullptr;
    const ge::DataType dt = ctx->GetInputDesc(1)->GetDataType();
    const ge::DataType labelDt = ctx->GetInputDesc(4)->GetDataType();
    const gert::RuntimeAttrs* attrs = ctx->GetAttrs();
    const int64_t vocabStart = *attrs->GetAttrPointer<int64_t>(0);
    const int64_t vocabTotal = *attrs->GetAttrPointer<int64_t>(1);
    const float labelSmoothing = *attrs->GetAttrPointer<float>(2);
    const float zLoss = *attrs->GetAttrPointer<float>(3);
    const float softcap = *attrs->GetAttrPointer<float>(4);
    const int64_t mask = *attrs->GetAttrPointer<int64_t>(5);

    namespace ft = fused_lce::tiling;
    const uint32_t flags = ft::kBackward | (hasBias ? ft::kBias : 0u) | (labelSmoothing > 0.0f ? ft::kSmoothing : 0u) |
                           (softcap > 0.0f ? ft::kSoftcap : 0u);
    const ft::Plan plan = ft::plan(static_cast<uint64_t>(h.GetDim(0)), static_cast<uint64_t>(h.GetDim(1)),
                                   static_cast<uint64_t>(w.GetDim(0)), fused_lce_host::elt_bytes(dt), flags,
                                   fused_lce_host::hw_spec(plat));
    if (plan.status != ft::kOk) {
        OP_LOGE(ctx->GetNodeName(), "FusedLceGrad: %s", ft::status_text(plan.status));
        return ge::GRAPH_FAILED;
    }
    td->plan = plan;
    td->vocabStart = vocabStart;
    td->vocabTotal = vocabTotal > 0 ? vocabTotal : static_cast<int64_t>(plan.v);
    td->softcap = softcap;
    td->labelSmoothing = labelSmoothing;
    td->zLoss = zLoss;
    td->gradMask = static_cast<uint32_t>(mask) & (hasBias ? 7u : 3u);
    td->labelBytes = labelDt == ge::DT_INT64 ? 8u : 4u;
    td->hasBias = hasBias ? 1u : 0u;
    if (plan.n > 0) {
        const uint32_t bm = static_cast<uint32_t>(ft::align_up(plan.vec_rows, 16));
        bool ok = fused_lce_host::gemm_tiling(plat, dt, false, true, matmul_tiling::TPosition::VECIN, plan.vec_rows,
                                              plan.base_n, plan.d, bm, plan.base_n, plan.base_k, 0, td->mmLogits);
        // dX[rows] (vec_rows x D) += dz (vec_rows x base_n) @ W[cols] (base_n x D): output chunks of base_d
        ok = ok && fused_lce_host::gemm_tiling(plat, dt, false, false, matmul_tiling::TPosition::GM, plan.vec_rows,
                                               plan.d, plan.base_n, bm, plan.base_d, plan.base_n, 0, td->mmDx);
        // dW[cols] (base_n x D) += dz.T (base_n x vec_rows) @ h[rows] (vec_rows x D)
        ok = ok && fused_lce_host::gemm_tiling(plat, dt, true, false, matmul_tiling::TPosition::GM, plan.base_n,
                                               plan.d, plan.vec_rows, plan.base_n, plan.base_d, bm, 0, td->mmDw);
        if (!ok) {
            OP_LOGE(ctx->GetNodeName(), "FusedLceGrad: the Matmul API found no tiling");
            return ge::GRAPH_FAILED;
        }
    }
    ctx->SetBlockDim(plan.used_cores > 0 ? plan.used_cores : 1u);
    size_t* ws = ctx->GetWorkspaceSizes(1);
    ws[0] = static_cast<size_t>(plat.GetLibApiWorkSpaceSize()) + static_cast<size_t>(plan.ws_total);
    return ge::GRAPH_SUCCESS;
}

}  // namespace optiling

namespace ge {

static graphStatus FusedLceGradInferShape(gert::InferShapeContext* ctx) {
    *ctx->GetOutputShape(0) = *ctx->GetInputShape(1);
    *ctx->GetOutputShape(1) = *ctx->GetInputShape(2);
    gert::Shape* db = ctx->GetOutputShape(2);
    db->SetDimNum(1);
    db->SetDim(0, ctx->GetInputShape(2)->GetDim(0));
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
