// FusedLceGradCube (the deterministic cube-driven backward, op_kernel/fused_lce_grad_cube.cpp): operator
// definition and tiling (the parts both ops share, inference included, are fused_lce_host.h's). Generated aclnn API:
//   aclnnFusedLceGradCubeGetWorkspaceSize(coefA, coefT, coefBOptional, coefUOptional, hidden, weight, biasOptional,
//                                        labels, lse, zCacheOptional, vocabStart, softcap, temperature, gradMask,
//                                        keepDz, variant, gradHiddenOut, gradWeightOut, gradBiasOut, ws, executor)
//   aclnnFusedLceGradCube(workspace, workspaceSize, executor, stream)
// coef_a, coef_t, coef_b, coef_u: float32 (N,) planes of the driver's Coefs (dz = p (a + b max(z, lse - 104)) -
// t onehot - u); an absent b / u is 0 and skips its vector work. z_cache (float32 (N, V), optional, right after
// lse): FusedLceStatsCube's kept h W^T of these rows; given, the kernel computes no logits (the tiling's hasZCache,
// from the optional input's presence here: never from its GM address). keep_dz: dz kept in the workspace between the
// two phases (tiling keepDz, workspace ws_total_keep), so phase W runs no z GEMM either: with z_cache, 3 GEMMs for
// forward + backward.
// The three outputs are float32 accumulators that the caller zero-fills or, for dW, passes with the earlier driver
// blocks' sum (the cube adds into them through the fixpipe, each element by one core in a fixed order; with keep_dz
// dX is written by one whole-K GEMM per token block instead); an output not selected by gradMask (bit0 dX, bit1 dW,
// bit2 db) may be an empty tensor.
// Kernel type KERNEL_TYPE_MIX_AIC_1_2 (the kernel's KERNEL_TASK_TYPE_DEFAULT); block dim = AI cores used, batch
// mode (the kernel's SyncAll before the db merge), workspace = system workspace + rings + db partials, as ops-nn's
// FusedLinearCrossEntropyLossGrad sets them (hicann/ops-nn matmul/fused_linear_cross_entropy_loss_grad/op_host/
// fused_linear_cross_entropy_loss_grad_tiling.cpp: SetBlockDim(aicNum), workspace = user + GetLibApiWorkSpaceSize).
// The attribute variant (last) selects conservative variants for a first hardware run (fused_lce_cube_tiling.h).
// Status: compiled with opbuild's flags against the host twin's stub CANN headers and run under its runtime in CI
// (tests/ascend/host); never compiled against a real CANN toolkit, not run on hardware.
#include "../../common/fused_lce_host.h"
#include "../../common/fused_lce_cube_tiling_data.h"

namespace optiling {

namespace fh = fused_lce_host;
namespace ft = fused_lce::tiling;
namespace fc = fused_lce::cube;

namespace grad_cube {
// IR input indices (the Input(...) order below); coef_b, coef_u, bias and z_cache are optional, so instance indices
// of the later inputs shift when one is absent: every input is read by IR index. weight, bias and labels follow
// hidden.
constexpr size_t kCoefA = 0, kCoefT = 1, kCoefB = 2, kCoefU = 3, kHidden = 4, kLse = 8, kZCache = 9;
}  // namespace grad_cube

// a coefficient plane: float32 (N,)
static bool plane_ok(const fused_lce_host::Input& in, int64_t n) {
    return fused_lce_host::is_vector(in, n) && in.dtype == ge::DT_FLOAT;
}

ge::graphStatus GradTiling(gert::TilingContext* ctx, FusedLceGradCubeTilingData* td, const fh::Problem& pr,
                                  platform_ascendc::PlatformAscendC& plat) {
    using namespace grad_cube;
    const fh::Input a = fh::input(ctx, kCoefA), t = fh::input(ctx, kCoefT), b = fh::input(ctx, kCoefB),
                    u = fh::input(ctx, kCoefU), lse = fh::input(ctx, kLse);
    const fh::Input &hidden = pr.hidden, &bias = pr.bias;
    const uint64_t n = pr.n, d = pr.d, v = pr.v;
    const int64_t sn = static_cast<int64_t>(n);
    const bool planesOk = plane_ok(a, sn) && plane_ok(t, sn) && (!b.present || plane_ok(b, sn)) &&
                          (!u.present || plane_ok(u, sn));
    if (!planesOk || !fh::is_vector(lse, sn) || lse.dtype != ge::DT_FLOAT)
        return fh::fail(ctx, "coef_a / coef_t (and coef_b / coef_u when given) and lse must be float32 (N,), N = %lld",
                        static_cast<long long>(sn));
    const fh::Input zc = fh::input(ctx, kZCache);
    if (zc.present && (zc.dtype != ge::DT_FLOAT || zc.shape == nullptr || zc.shape->GetDimNum() != 2 ||
                       zc.shape->GetDim(0) != sn || zc.shape->GetDim(1) != static_cast<int64_t>(v)))
        return fh::fail(ctx, "z_cache must be float32 (N, V) = (%lld, %lld)", static_cast<long long>(sn),
                        static_cast<long long>(v));
    fh::GradAttrs at;
    if (fh::read_grad_attrs(ctx, &at) != ge::GRAPH_SUCCESS) return ge::GRAPH_FAILED;
    const bool keepDz = at.keep;

    const uint32_t flags = (bias.present ? ft::kBias : 0u) | (at.softcap > 0.0f ? ft::kSoftcap : 0u);
    const fc::CubeGradPlan plan = fc::plan_grad(n, d, v, fh::elt_bytes(hidden.dtype), flags, fh::hw_spec(plat));
    if (plan.status != ft::kOk) return fh::fail(ctx, "FusedLceGradCube: %s", ft::status_text(plan.status));
    fh::init_tiling_data(td, plan, at, bias.present, zc.present);
    td->gradMask = static_cast<uint32_t>(at.gradMask) & (bias.present ? 7u : 3u);
    td->hasB = b.present ? 1u : 0u;
    td->hasU = u.present ? 1u : 0u;
    td->keepDz = keepDz ? 1u : 0u;
    const ft::Plan& p = plan.base;
    if (p.n > 0) {
        const uint32_t bm = p.base_m, bn = p.base_n;
        // C1: z = h[m] @ W[nb].T (base_m x base_n, K = D) into the GM ring
        bool ok = fh::gemm_tiling(plat, hidden.dtype, false, true, matmul_tiling::TPosition::GM, bm, bn, p.d, bm, bn,
                                  td->mmZ);
        // C2, phase X: dX[m] (base_m x D) += dz (base_m x base_n) @ W[nb] (base_n x D), output chunks of base_d
        ok = ok && fh::gemm_tiling(plat, hidden.dtype, false, false, matmul_tiling::TPosition::GM, bm, p.d, bn, bm,
                                   p.base_d, td->mmDx);
        // C2, phase W: dW[nb] (base_n x D) += dz.T (base_n x base_m) @ h[m] (base_m x D)
        ok = ok && fh::gemm_tiling(plat, hidden.dtype, true, false, matmul_tiling::TPosition::GM, bn, p.d, bm, bn,
                                   p.base_d, td->mmDw);
        if (keepDz) {  // after SyncAll, from the kept Dz (N x V in column chunks): dX[m] = sum over chunks of
                       // Dz_c[m rows, :] @ W[c] (K = the chunk's width) ...
            ok = ok && fh::gemm_tiling(plat, hidden.dtype, false, false, matmul_tiling::TPosition::GM, bm, p.d,
                                       plan.keep_cols, bm, p.base_d, td->mmDxAll);
            // ... and dW[nb] += Dz[:, nb cols].T @ h (K = N)
            ok = ok && fh::gemm_tiling(plat, hidden.dtype, true, false, matmul_tiling::TPosition::GM, bn, p.d, n, bn,
                                       p.base_d, td->mmDwAll);
        }
        if (!ok) return fh::fail(ctx, "FusedLceGradCube: the Matmul API found no tiling");
        const char* op = "FusedLceGradCube";
        ok = fh::kept_base_tile(ctx, op, "mmZ", td->mmZ, bm, bn, p.d) &&
             fh::kept_base_tile(ctx, op, "mmDx", td->mmDx, bm, p.base_d, bn) &&
             fh::kept_base_tile(ctx, op, "mmDw", td->mmDw, bn, p.base_d, bm) &&
             (!keepDz || (fh::kept_base_tile(ctx, op, "mmDxAll", td->mmDxAll, bm, p.base_d, plan.keep_cols) &&
                          fh::kept_base_tile(ctx, op, "mmDwAll", td->mmDwAll, bn, p.base_d, n)));
        if (!ok) return ge::GRAPH_FAILED;
        // the per-tile C2 GEMMs keep their dz tile in L1 across D's column tiles (kPlainTiling: as GetTiling gave)
        const uint64_t l1 = fh::hw_spec(plat).l1_bytes, dcols = ft::ceil_div(p.d, p.base_d);
        if (!(at.variant & fc::kPlainTiling)) {
            fc::keep_a_resident(&td->mmDx, bn, dcols, p.elt_bytes, l1, false, false);  // dz @ W
            fc::keep_a_resident(&td->mmDw, bm, dcols, p.elt_bytes, l1, true, false);   // dz^T @ h
        }
    }
    return fh::finish_launch(ctx, plat, p.used_cores, keepDz ? plan.ws_total_keep : plan.ws_total);
}

}  // namespace optiling

namespace ops {

class FusedLceGradCube : public OpDef {
public:
    explicit FusedLceGradCube(const char* name) : OpDef(name) {
        const fused_lce_host::OpTypes t;
        Input("coef_a").ParamType(REQUIRED).DataType(t.f32).Format(t.nd);
        Input("coef_t").ParamType(REQUIRED).DataType(t.f32).Format(t.nd);
        Input("coef_b").ParamType(OPTIONAL).DataType(t.f32).Format(t.nd);
        Input("coef_u").ParamType(OPTIONAL).DataType(t.f32).Format(t.nd);
        fused_lce_host::problem_inputs(*this, t);
        Input("lse").ParamType(REQUIRED).DataType(t.f32).Format(t.nd);
        Input("z_cache").ParamType(OPTIONAL).DataType(t.f32).Format(t.nd);  // right after lse: the forward's h W^T
        fused_lce_host::grad_outputs_and_attrs(*this, t);
        // then keep_dz (dz kept between the phases: the tiling's keepDz), variant, inference and tiling
        fused_lce_host::finish_opdef<FusedLceGradCubeTilingData, optiling::grad_cube::kHidden, optiling::GradTiling,
                                     fused_lce_host::infer_grad_shapes>(*this, "keep_dz",
                                                                        fused_lce_host::infer_grad_dtypes);
    }
};

OP_ADD(FusedLceGradCube);

}  // namespace ops
