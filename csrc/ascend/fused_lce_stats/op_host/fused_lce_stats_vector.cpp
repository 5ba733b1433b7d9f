// FusedLceStatsVector: operator definition, shape / dtype inference and tiling. The CANN build generates the two-phase
// aclnn API from this definition:
//   aclnnFusedLceStatsVectorGetWorkspaceSize(hidden, weight, biasOptional, labels, vocabStart, softcap, withZsum,
//                                      temperature, withEntropy, maxOut, sumExpOut, targetLogitOut, logitSumOut,
//                                      argmaxOut, entropyStatOut, ws, executor)
// entropyStatOut (ez = sum exp(z - max) (z - max)) is written only with withEntropy; otherwise it may be empty.
//   aclnnFusedLceStatsVector(workspace, workspaceSize, executor, stream)
// Status: compiled with opbuild's flags against the host twin's stub CANN headers and run under its runtime in CI
// (tests/ascend/host); never compiled against a real CANN toolkit, not run on hardware.
#include "../../common/fused_lce_host.h"

namespace optiling {

// IR input indices (the Input(...) order below); bias is optional, so GetInputDesc(3) would not be labels without it
constexpr size_t kHidden = 0, kWeight = 1, kBias = 2, kLabels = 3;

static ge::graphStatus FusedLceStatsVectorTiling(gert::TilingContext* ctx) {
    namespace fh = fused_lce_host;
    namespace ft = fused_lce::tiling;
    FusedLceVectorTilingData* td = ctx->GetTilingData<FusedLceVectorTilingData>();
    if (td == nullptr) return fh::fail(ctx, "tiling buffer smaller than FusedLceVectorTilingData (%zu bytes)",
                                       sizeof(FusedLceVectorTilingData));
    if (ctx->GetPlatformInfo() == nullptr) return fh::fail(ctx, "no platform info");
    platform_ascendc::PlatformAscendC plat(ctx->GetPlatformInfo());
    const fh::Input hidden = fh::input(ctx, kHidden), weight = fh::input(ctx, kWeight), bias = fh::input(ctx, kBias),
                    labels = fh::input(ctx, kLabels);
    uint64_t n = 0, d = 0, v = 0;
    if (fh::check_problem(ctx, hidden, weight, bias, labels, &n, &d, &v) != ge::GRAPH_SUCCESS) return ge::GRAPH_FAILED;
    fh::StatsAttrs at;
    if (fh::read_stats_attrs(ctx, &at) != ge::GRAPH_SUCCESS) return ge::GRAPH_FAILED;
    const int64_t vocabStart = at.vocabStart;
    const float softcap = at.softcap, temperature = at.temperature;
    const bool withZsum = at.withZsum, withEntropy = at.withEntropy;

    const uint32_t flags = (bias.present ? ft::kBias : 0u) | (withZsum ? ft::kSmoothing : 0u) |
                           (softcap > 0.0f ? ft::kSoftcap : 0u) | (withEntropy ? ft::kEntropy : 0u);
    const ft::Plan plan = ft::plan(n, d, v, fh::elt_bytes(hidden.dtype), flags, fh::hw_spec(plat));
    if (plan.status != ft::kOk) return fh::fail(ctx, "FusedLceStatsVector: %s", ft::status_text(plan.status));
    std::memset(static_cast<void*>(td), 0, sizeof(*td));  // padding too: the tiling data is copied as bytes
    td->plan = plan;
    td->vocabStart = vocabStart;
    td->softcap = softcap;
    td->temperature = temperature;
    td->withZsum = withZsum ? 1u : 0u;
    td->withEntropy = withEntropy ? 1u : 0u;
    td->gradMask = 0;
    td->labelBytes = labels.dtype == ge::DT_INT64 ? 8u : 4u;
    td->hasBias = bias.present ? 1u : 0u;
    // z = h[rows] @ W[cols].T: vec_rows x base_n, K = D, C delivered to the vector core's UB
    if (plan.n > 0 &&
        !fh::gemm_tiling(plat, hidden.dtype, false, true, matmul_tiling::TPosition::VECIN, plan.vec_rows, plan.base_n,
                         plan.d, static_cast<uint32_t>(ft::align_up(plan.vec_rows, 16)), plan.base_n, td->mmLogits))
        return fh::fail(ctx, "FusedLceStatsVector: the Matmul API found no tiling");
    return fh::finish_launch(ctx, plat, plan);
}

}  // namespace optiling

namespace ge {

static graphStatus FusedLceStatsVectorInferShape(gert::InferShapeContext* ctx) {
    const gert::Shape* h = ctx->GetInputShape(0);
    if (h == nullptr || h->GetDimNum() != 2) return GRAPH_FAILED;
    for (size_t i = 0; i < 6; ++i) {
        gert::Shape* out = ctx->GetOutputShape(i);
        if (out == nullptr) return GRAPH_FAILED;
        out->SetDimNum(1);
        out->SetDim(0, h->GetDim(0));
    }
    return GRAPH_SUCCESS;
}

static graphStatus FusedLceStatsVectorInferDataType(gert::InferDataTypeContext* ctx) {
    for (size_t i = 0; i < 4; ++i) ctx->SetOutputDataType(i, DT_FLOAT);
    ctx->SetOutputDataType(4, DT_INT32);
    ctx->SetOutputDataType(5, DT_FLOAT);
    return GRAPH_SUCCESS;
}

}  // namespace ge

namespace ops {

class FusedLceStatsVector : public OpDef {
public:
    explicit FusedLceStatsVector(const char* name) : OpDef(name) {
        const fused_lce_host::OpTypes t;
        fused_lce_host::problem_inputs(*this, t);
        fused_lce_host::stats_outputs_and_attrs(*this, t);
        SetInferShape(ge::FusedLceStatsVectorInferShape).SetInferDataType(ge::FusedLceStatsVectorInferDataType);
        AICore().SetTiling(optiling::FusedLceStatsVectorTiling).AddConfig("ascend910b").AddConfig("ascend910_93");
    }
};

OP_ADD(FusedLceStatsVector);

}  // namespace ops
