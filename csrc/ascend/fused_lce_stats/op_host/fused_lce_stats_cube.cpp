// FusedLceStatsCube (the cube-driven forward, op_kernel/fused_lce_stats_cube.cpp): operator definition and tiling
// (the parts both ops share, inference included, are fused_lce_host.h's). The CANN build generates the two-phase
// aclnn API from this definition:
//   aclnnFusedLceStatsCubeGetWorkspaceSize(hidden, weight, biasOptional, labels, vocabStart, softcap, withZsum,
//                                         temperature, withEntropy, keepZ, variant, maxOut, sumExpOut, targetLogitOut,
//                                         logitSumOut, argmaxOut, entropyStatOut, zCacheOptional, ws, executor)
//   aclnnFusedLceStatsCube(workspace, workspaceSize, executor, stream)
// The kernel writes all six (N,) outputs on every launch (logit_sum / entropy_stat are 0 unless asked for), so none
// may be empty. z_cache (float32 (N, V), optional, the last output): when given, the cube also writes every tile's
// h W^T there (before bias / softcap / temperature) for FusedLceGradCube's z_cache input. The attribute keep_z says
// it is given and becomes the tiling's hasZCache: the kernel never takes presence from the GM address (CANN does not promise null for an absent
// optional; ops-nn's FusedLinearOnlineMaxSum switches its optional logits output with an attribute the same way).
// The attribute variant (last) selects conservative variants for a first hardware run (fused_lce_cube_tiling.h).
// Kernel type: the kernel declares KERNEL_TYPE_MIX_AIC_1_2 (KERNEL_TASK_TYPE_DEFAULT); the block dim set here is
// the number of AI cores used, each one cube (AIC) with its two vector cores (AIV), as ops-nn's
// FusedLinearOnlineMaxSum does (hicann/ops-nn matmul/fused_linear_online_max_sum/op_host/
// fused_linear_online_max_sum_tiling.cpp: SetBlockDim(aiCubeNum), SetScheduleMode(BATCH_MODE), workspace = the
// system workspace + its GM ring).
// Status: compiled with opbuild's flags against the host twin's stub CANN headers and run under its runtime in CI
// (tests/ascend/host); never compiled against a real CANN toolkit, not run on hardware.
#include "../../common/fused_lce_host.h"
#include "../../common/fused_lce_cube_tiling_data.h"

namespace optiling {

namespace fh = fused_lce_host;
namespace ft = fused_lce::tiling;
namespace fc = fused_lce::cube;

namespace stats_cube {
// IR index of hidden (the Input(...) order below); weight, bias (optional) and labels follow it
constexpr size_t kHidden = 0;
constexpr size_t kZCacheOut = 6;  // output index of the optional z_cache (the last output)
}  // namespace stats_cube

ge::graphStatus StatsTiling(gert::TilingContext* ctx, FusedLceStatsCubeTilingData* td, const fh::Problem& pr,
                                   platform_ascendc::PlatformAscendC& plat) {
    using namespace stats_cube;
    const uint64_t n = pr.n, d = pr.d, v = pr.v;
    fh::StatsAttrs at;
    if (fh::read_stats_attrs(ctx, &at) != ge::GRAPH_SUCCESS) return ge::GRAPH_FAILED;
    const bool keepZ = at.keep;
    // keep_z says the kernel writes N x V floats into z_cache, so then the output must be given with that shape.
    // Without keep_z the kernel never touches z_cache, whatever is given: the generated aclnn passes an absent optional
    // output as a null tensor (asc-devkit tools/build/opbuild/op_aclnn_generator.cpp, NnopbaseAddOutput), a graph
    // allocates it from InferShape's (N, V) below, and a hand-written op_api may pass an empty one (ops-nn's for its
    // built-in fused_linear_online_max_sum allocates shape (0)); none of them is refused.
    const gert::StorageShape* zcs = ctx->GetOutputShape(kZCacheOut);
    const gert::Shape* zc = zcs != nullptr ? &zcs->GetStorageShape() : nullptr;
    if (keepZ && (zc == nullptr || zc->GetDimNum() != 2 || zc->GetDim(0) != static_cast<int64_t>(n) ||
                  zc->GetDim(1) != static_cast<int64_t>(v)))
        return fh::fail(ctx, "FusedLceStatsCube: keep_z is set but no z_cache output of shape (N, V) = (%lld, %lld) "
                        "is given", static_cast<long long>(n), static_cast<long long>(v));

    // the entropy sum is the planner's own argument (not a Plan flag): the cube-driven forward's workspace always has
    // six planes
    const uint32_t flags = (pr.bias.present ? ft::kBias : 0u) | (at.withZsum ? ft::kSmoothing : 0u) |
                           (at.softcap > 0.0f ? ft::kSoftcap : 0u);
    const fc::CubePlan plan = fc::plan_stats(n, d, v, fh::elt_bytes(pr.hidden.dtype), flags, at.withEntropy,
                                             fh::hw_spec(plat));
    if (plan.status != ft::kOk) return fh::fail(ctx, "FusedLceStatsCube: %s", ft::status_text(plan.status));
    fh::init_tiling_data(td, plan, at, pr.bias.present, keepZ);
    td->withZsum = at.withZsum ? 1u : 0u;
    td->withEz = at.withEntropy ? 1u : 0u;
    td->labelBytes = pr.labels.dtype == ge::DT_INT64 ? 8u : 4u;
    // on the AIC: z = h[block] @ W[cols].T, the whole base_m x base_n tile (K = D) into the GM ring; one Iterate per
    // tile of a task's segment, the hidden rows kept in L1 across them when the plan says they fit (kPlainTiling: one
    // GEMM per tile, GetTiling's tiling as it is)
    const ft::Plan& p = plan.base;
    if (p.n > 0 && !fh::gemm_tiling(plat, pr.hidden.dtype, false, true, matmul_tiling::TPosition::GM, p.base_m,
                                    p.base_n, p.d, p.base_m, p.base_n, td->mmLogits))
        return fh::fail(ctx, "FusedLceStatsCube: the Matmul API found no tiling");
    if (p.n > 0 && !fh::kept_base_tile(ctx, "FusedLceStatsCube", "mmLogits", td->mmLogits, p.base_m, p.base_n,
                                          p.d))
        return ge::GRAPH_FAILED;
    if (p.n > 0 && !(at.variant & fc::kPlainTiling))  // A = h (not transposed), B = W (transposed)
        fc::keep_a_resident(&td->mmLogits, p.d, p.seg_blocks, p.elt_bytes, fh::hw_spec(plat).l1_bytes, false, true);
    return fh::finish_launch(ctx, plat, p.used_cores, plan.ws_total);
}

}  // namespace optiling

namespace ops {

class FusedLceStatsCube : public OpDef {
public:
    explicit FusedLceStatsCube(const char* name) : OpDef(name) {
        const fused_lce_host::OpTypes t;  // the shared inputs, outputs and attributes, then:
        fused_lce_host::problem_inputs(*this, t);
        fused_lce_host::stats_outputs_and_attrs(*this, t);
        // last output: the z cache (an optional output, as ops-nn's FusedLinearOnlineMaxSum declares its
        // vocab_parallel_logits_out)
        Output("z_cache").ParamType(OPTIONAL).DataType(t.f32).Format(t.nd);
        // then keep_z (z_cache is given: the tiling's hasZCache), variant, inference and tiling
        fused_lce_host::finish_opdef<FusedLceStatsCubeTilingData, optiling::stats_cube::kHidden, optiling::StatsTiling,
                                     fused_lce_host::infer_stats_shapes>(*this, "keep_z",
                                                                         fused_lce_host::infer_stats_dtypes);
    }
};

OP_ADD(FusedLceStatsCube);

}  // namespace ops
