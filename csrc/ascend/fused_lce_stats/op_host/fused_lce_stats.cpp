// FusedLceStats: operator definition, shape / dtype inference and tiling. The CANN build generates the two-phase
// aclnn API from this definition:
//   aclnnFusedLceStatsGetWorkspaceSize(hidden, weight, biasOptional, labels, vocabStart, softcap, withZsum,
//                                      maxOut, sumExpOut, targetLogitOut, logitSumOut, argmaxOut, ws, executor)
//   aclnnFusedLceStats(workspace, workspaceSize, executor, stream)
// Status: written, not compiled here (no CANN toolkit), not run on hardware.
#include "../../common/fused_lce_host.h"

namespace optiling {

static ge::graphStatus FusedLceStatsTiling(gert::TilingContext* ctx) {
    auto* td = ctx->GetTilingData<FusedLceTilingData>();
    platform_ascendc::PlatformAscendC plat(ctx->GetPlatformInfo());
    const gert::Shape& h = ctx->GetInputShape(0)->GetStorageShape();
    const gert::Shape& w = ctx->GetInputShape(1)->GetStorageShape();
    const bool hasBias = ctx->GetOptionalInputShape(2) != nullptr;
    const ge::DataType dt = ctx->GetInputDesc(0)->GetDataType();
    const ge::DataType labelDt = ctx->GetInputDesc(3)->GetDataType();
    const gert::RuntimeAttrs* attrs = ctx->GetAttrs();
    const int64_t vocabStart = *attrs->GetAttrPointer<int64_t>(0);
    const float softcap = *attrs->GetAttrPointer<float>(1);
    const bool withZsum = *attrs->GetAttrPointer<bool>(2);

    namespace ft = fused_lce::tiling;
    const uint32_t flags = (hasBias ? ft::kBias : 0u) | (withZsum ? ft::kSmoothing : 0u) |
                           (softcap > 0.0f ? ft::kSoftcap : 0u);
    const ft::Plan plan = ft::plan(static_cast<uint64_t>(h.GetDim(0)), static_cast<uint64_t>(h.GetDim(1)),
                                   static_cast<uint64_t>(w.GetDim(0)), fused_lce_host::elt_bytes(dt), flags,
                                   fused_lce_host::hw_spec(plat));
    if (plan.status != ft::kOk) {
        OP_LOGE(ctx->GetNodeName(), "FusedLceStats: %s", ft::status_text(plan.status));
        return ge::GRAPH_FAILED;
    }
    td->plan = plan;
    td->vocabStart = vocabStart;
    td->vocabTotal = 0;
    td->softcap = softcap;
    td->labelSmoothing = withZsum ? 1.0f : 0.0f;  // the kernel only needs "sum of logits wanted"
    td->zLoss = 0.0f;
    td->gradMask = 0;
    td->labelBytes = labelDt == ge::DT_INT64 ? 8u : 4u;
    td->hasBias = hasBias ? 1u : 0u;
    if (plan.n > 0 &&
        !fused_lce_host::gemm_tiling(plat, dt, false, true, matmul_tiling::TPosition::VECIN, plan.vec_rows,
                                     plan.base_n, plan.d, static_cast<uint32_t>(ft::align_up(plan.vec_rows, 16)),
                                     plan.base_n, plan.base_k, 0, td->mmLogits)) {
        OP_LOGE(ctx->GetNodeName(), "FusedLceStats: the Matmul API found no tiling");
        return ge::GRAPH_FAILED;
    }
    ctx->SetBlockDim(plan.used_cores > 0 ? plan.used_cores : 1u);  // MIX: number of AI cores
    size_t* ws = ctx->GetWorkspaceSizes(1);
    ws[0] = static_cast<size_t>(plat.GetLibApiWorkSpaceSize()) + static_cast<size_t>(plan.ws_total);
    return ge::GRAPH_SUCCESS;
}

}  // namespace optiling

namespace ge {

static graphStatus FusedLceStatsInferShape(gert::InferShapeContext* ctx) {
    const gert::Shape* h = ctx->GetInputShape(0);
    for (size_t i = 0; i < 5; ++i) {
        gert::Shape* out = ctx->GetOutputShape(i);
        out->SetDimNum(1);
        out->SetDim(0, h->GetDim(0));
    }
    return GRAPH_SUCCESS;
}

static graphStatus FusedLceStatsInferDataType(gert::InferDataTypeContext* ctx) {
    for (size_t i = 0; i < 4; ++i) ctx->SetOutputDataType(i, DT_FLOAT);
    ctx->SetOutputDataType(4, DT_INT32);
    return GRAPH_SUCCESS;
}

}  // namespace ge

namespace ops {

class FusedLceStats : public OpDef {
public:
    explicit FusedLceStats(const char* name) : OpDef(name) {
        // (operand dtype, label dtype) combinations; one kernel binary each
        const std::vector<ge::DataType> operand = {ge::DT_BF16, ge::DT_FLOAT16, ge::DT_FLOAT,
                                                   ge::DT_BF16, ge::DT_FLOAT16, ge::DT_FLOAT};
        const std::vector<ge::DataType> label = {ge::DT_INT64, ge::DT_INT64, ge::DT_INT64,
                                                 ge::DT_INT32, ge::DT_INT32, ge::DT_INT32};
        const std::vector<ge::DataType> f32(6, ge::DT_FLOAT), i32(6, ge::DT_INT32);
        const std::vector<ge::Format> nd(6, ge::FORMAT_ND);
        Input("hidden").ParamType(REQUIRED).DataType(operand).Format(nd);
        Input("weight").ParamType(REQUIRED).DataType(operand).Format(nd);
        Input("bias").ParamType(OPTIONAL).DataType(operand).Format(nd);
        Input("labels").ParamType(REQUIRED).DataType(label).Format(nd);
        Output("max").ParamType(REQUIRED).DataType(f32).Format(nd);
        Output("sum_exp").ParamType(REQUIRED).DataType(f32).Format(nd);
        Output("target_logit").ParamType(REQUIRED).DataType(f32).Format(nd);
        Output("logit_sum").ParamType(REQUIRED).DataType(f32).Format(nd);
        Output("argmax").ParamType(REQUIRED).DataType(i32).Format(nd);
        Attr("vocab_start").AttrType(REQUIRED).Int();
        Attr("softcap").AttrType(OPTIONAL).Float(0.0f);
        Attr("with_zsum").AttrType(OPTIONAL).Bool(false);
        SetInferShape(ge::FusedLceStatsInferShape).SetInferDataType(ge::FusedLceStatsInferDataType);
        AICore().SetTiling(optiling::FusedLceStatsTiling).AddConfig("ascend910b").AddConfig("ascend910_93");
    }
};

OP_ADD(FusedLceStats);

}  // namespace ops
