// Host adapter of the AscendC kernels (csrc/ascend) for torch_npu: two private kernel ops and nothing else.
// Status: compiled and linked against the torch-npu wheel's headers and libtorch_npu.so in CI
// (tests/backends/npu/test_adapter_build.py), never loaded, not run on hardware.
//
//   fused_lce::_npu_stats_cube -> aclnnFusedLceStatsCube, fused_lce::_npu_grads_cube -> aclnnFusedLceGradCube: the
//       cube-driven kernels (deterministic backward, one-pass modes)
// Their schemas and contracts are in kernel_ops.h (shared with the twin's _twin_* ops); fused_lce/backends/npu/
// kernels.py calls them.
//
// All are called through torch_npu's op-api helper EXEC_NPU_CMD_EXT (op-plugin op_plugin/utils/
// op_api_common_base.h), which resolves the two-phase aclnn symbols in the custom OPP's libcust_opapi.so at run
// time, takes the workspace from the caching allocator and launches on the current stream. Routing, loss,
// reductions, autograd and the fake kernels live in Python (fused_lce/); this file only validates its inputs
// (every problem is a ValueError, or TypeError for a dtype, naming the argument, never a device fault) and launches.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <tuple>

#include "../ascend/common/fused_lce_cube_tiling.h"  // the kernels' variant bits (plain C++, no CANN include)
#include "kernel_ops.h"
#include "npu_cpp_extension.h"  // torch_npu: EXEC_NPU_CMD_EXT (op_plugin/include)

namespace fused_lce_npu {

using at::Tensor;
using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;
using Tensor7 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

constexpr int64_t kMaskHidden = 1, kMaskWeight = 2, kMaskBias = 4;
// The Matmul API takes int32 shapes (fused_lce_tiling.h kTooLarge); checked here so the error names the argument.
constexpr int64_t kInt32Max = 2147483647;

static bool has(const c10::optional<Tensor>& t) { return t.has_value() && t->defined(); }

static bool operand_dtype(at::ScalarType t) {
    return t == at::kBFloat16 || t == at::kHalf || t == at::kFloat;  // the OpDef's operand dtypes
}

static void same_device(const char* op, const char* name, const Tensor& t, const Tensor& hidden) {
    TORCH_CHECK_VALUE(t.device() == hidden.device(), op, ": ", name, " is on ", t.device(), " but hidden is on ",
                hidden.device());
}

// Shapes, dtypes and devices shared by both ops: hidden (N, D), weight (V, D), bias (V,) or None, labels (N,).
static void check_problem(const char* op, const Tensor& hidden, const Tensor& weight,
                          const c10::optional<Tensor>& bias, const Tensor& labels, int64_t vocab_start) {
    TORCH_CHECK_VALUE(hidden.defined() && weight.defined() && labels.defined(), op,
                ": hidden, weight and labels must be tensors");
    TORCH_CHECK_VALUE(hidden.dim() == 2, op, ": hidden must be 2-D (N, D), got shape ", hidden.sizes());
    TORCH_CHECK_VALUE(weight.dim() == 2, op, ": weight must be 2-D (V, D), got shape ", weight.sizes());
    TORCH_CHECK_VALUE(weight.size(1) == hidden.size(1), op, ": weight.size(1) (", weight.size(1),
                ") must equal hidden.size(1) (", hidden.size(1), ")");
    TORCH_CHECK_VALUE(hidden.size(1) > 0 && weight.size(0) > 0, op, ": hidden size D (", hidden.size(1),
                ") and vocabulary rows V (", weight.size(0), ") must be > 0");
    TORCH_CHECK_VALUE(hidden.size(1) <= kInt32Max && weight.size(0) <= kInt32Max, op,
                ": D and V must each be < 2^31 (int32 Matmul shapes), got D=", hidden.size(1), " V=", weight.size(0));
    TORCH_CHECK_VALUE(hidden.size(1) < 65535, op, ": the hidden size D must be < 65535 (the cube reads h and W at "
                      "row stride D, which the GM -> L1 copy's 16-bit Nd2NzParams::srcDValue holds), got D=",
                      hidden.size(1));
    TORCH_CHECK_TYPE(operand_dtype(hidden.scalar_type()), op,
                     ": hidden dtype must be bfloat16, float16 or float32, got ", hidden.scalar_type());
    TORCH_CHECK_TYPE(weight.scalar_type() == hidden.scalar_type(), op, ": weight dtype ", weight.scalar_type(),
                " differs from hidden dtype ", hidden.scalar_type());
    TORCH_CHECK_VALUE(hidden.device().type() == c10::DeviceType::PrivateUse1, op,
                      ": hidden must be an NPU tensor, got ", hidden.device());
    same_device(op, "weight", weight, hidden);
    TORCH_CHECK_VALUE(labels.dim() == 1 && labels.size(0) == hidden.size(0), op, ": labels must have shape (N,) = (",
                hidden.size(0), ",), got ", labels.sizes());
    TORCH_CHECK_TYPE(labels.scalar_type() == at::kLong || labels.scalar_type() == at::kInt, op,
                ": labels dtype must be int64 or int32, got ", labels.scalar_type());
    same_device(op, "labels", labels, hidden);
    if (has(bias)) {
        TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0), op, ": bias must have shape (V,) = (",
                    weight.size(0), ",), got ", bias->sizes());
        TORCH_CHECK_TYPE(bias->scalar_type() == hidden.scalar_type(), op, ": bias dtype ", bias->scalar_type(),
                    " differs from hidden dtype ", hidden.scalar_type());
        same_device(op, "bias", *bias, hidden);
    }
    TORCH_CHECK_VALUE(vocab_start >= 0, op, ": vocab_start must be >= 0, got ", vocab_start);
}

static void check_vector(const char* op, const char* name, const Tensor& t, const Tensor& hidden) {
    TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " must be a tensor");
    TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == hidden.size(0), op, ": ", name, " must have shape (N,) = (",
                hidden.size(0), ",), got ", t.sizes());
    TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), op, ": ", name, " must be a floating tensor, got ",
                t.scalar_type());
    same_device(op, name, t, hidden);
}

// the scalar options every kernel op takes
static void check_softcap_temperature(const char* op, double softcap, double temperature) {
    TORCH_CHECK_VALUE(std::isfinite(softcap) && softcap >= 0.0, op, ": softcap must be finite and >= 0 (0 = off), got ",
                softcap);
    TORCH_CHECK_VALUE(std::isfinite(temperature) && temperature > 0.0, op, ": temperature must be finite and > 0, got ",
                temperature);
}

// the conservative variant bits (fused_lce::cube::Variant)
static void check_variant(const char* op, int64_t variant) {
    TORCH_CHECK_VALUE(variant >= 0 && variant <= fused_lce::cube::kVariantMask, op,
                      ": variant must be a set of the bits of fused_lce::cube::Variant (0..",
                      fused_lce::cube::kVariantMask, "), got ", variant);
}

static c10::optional<Tensor> contiguous_or_none(const c10::optional<Tensor>& t) {
    return has(t) ? c10::optional<Tensor>(t->contiguous()) : c10::nullopt;
}

// ---- FusedLceStatsCube / FusedLceGradCube ---------------------------------------------------------------------
// Their planner carries vocabulary ids (and, in the backward, row offsets) as exact floats: V (and N for the
// backward) must be < 2^24 (fused_lce_cube_tiling.h kMaxLocalVocab).
constexpr int64_t kCubeMaxIds = int64_t(1) << 24;

// Per-token local statistics over this rank's vocabulary rows [vocab_start, vocab_start + V) of z = softcap(logits) /
// temperature: max, sum exp(z - max), target logit (0 when the label is not in this shard), sum of logits, first
// argmax as a global id (int64) and ez = sum exp(z - max) (z - max). The kernel writes all six outputs on every
// launch (sum of logits 0 without with_zsum, ez 0 without with_entropy), so ez is always (N,). keep_z: the
// OpDef's optional z_cache output is given, float32 (N, V), and returned 7th (the kept h W^T for _npu_grads_cube's
// zcache); otherwise it is absent and an empty tensor is returned in its place.
Tensor7 npu_stats_cube(const Tensor& hidden, const Tensor& weight, const c10::optional<Tensor>& bias,
                       const Tensor& labels, int64_t vocab_start, double softcap, double temperature, bool with_zsum,
                       bool with_entropy, bool keep_z, int64_t variant) {
    const char* op = "fused_lce::_npu_stats_cube";
    check_problem(op, hidden, weight, bias, labels, vocab_start);
    TORCH_CHECK_VALUE(weight.size(0) < kCubeMaxIds, op,
                      ": the cube-driven kernels need fewer than 2^24 vocabulary rows per rank (ids travel as exact "
                      "floats), got V=", weight.size(0));
    check_softcap_temperature(op, softcap, temperature);
    check_variant(op, variant);
    const c10::OptionalDeviceGuard guard(device_of(hidden));
    const int64_t n = hidden.size(0);
    auto f32 = hidden.options().dtype(at::kFloat);
    Tensor m = at::empty({n}, f32);
    Tensor s = at::empty({n}, f32);
    Tensor zt = at::empty({n}, f32);
    Tensor zs = at::empty({n}, f32);
    Tensor amax_local = at::empty({n}, hidden.options().dtype(at::kInt));
    Tensor ez = at::empty({n}, f32);
    Tensor zc = keep_z ? at::empty({n, weight.size(0)}, f32) : at::empty({0}, f32);
    if (n > 0) {
        Tensor h = hidden.contiguous();
        Tensor w = weight.contiguous();
        Tensor y = labels.contiguous();
        c10::optional<Tensor> b = contiguous_or_none(bias);
        // optional output: given, the cube writes every tile's h W^T into it; absent, no logit cache
        const c10::optional<Tensor> z_cache = keep_z ? c10::optional<Tensor>(zc) : c10::nullopt;
        // keep_z is also the attribute that tells the kernel (tiling hasZCache): presence never by address
        EXEC_NPU_CMD_EXT(aclnnFusedLceStatsCube, h, w, b, y, vocab_start, softcap, with_zsum, temperature, with_entropy,
                         keep_z, variant, m, s, zt, zs, amax_local, ez, z_cache);
    }
    Tensor amax = amax_local.to(at::kLong).add_(vocab_start);
    return {m, s, zt, zs, amax, ez, zc};
}

// float32 gradients of dz = p (a + b z) - t onehot(label) - u (times the softcap derivative), z = softcap(logits) /
// temperature, p = exp(z - lse), from the deterministic cube-driven backward, with the driver's per-token
// coefficient planes a, t (N,) and optionally b, u (N,) (absent = 0; the kernel skips their vector work; 0 for
// ignored tokens, NaN for bad labels, 1 / temperature already folded in); lse is the per-token log-sum-exp over the
// whole (possibly sharded) vocabulary. Outputs grad_mask does not ask for (or db without bias) are empty. zcache:
// what _npu_stats_cube(keep_z=True) returned for these rows (the kernel computes no logits); keep_dz: dz kept between
// the two phases (the larger workspace); dw_acc: a float32 contiguous (V, D) tensor dW is added into in place (the sum
// of the earlier driver blocks; the kernel only adds into dW), then returned empty as dW, as the twin's op does.
Tensor3 npu_grads_cube(const Tensor& hidden, const Tensor& weight, const c10::optional<Tensor>& bias,
                       const Tensor& labels, const Tensor& lse, const Tensor& a, const Tensor& t,
                       const c10::optional<Tensor>& b, const c10::optional<Tensor>& u, int64_t vocab_start,
                       double softcap, double temperature, std::array<bool, 3> grad_mask,
                       const c10::optional<Tensor>& zcache, bool keep_dz, const c10::optional<Tensor>& dw_acc,
                       int64_t variant) {
    const char* op = "fused_lce::_npu_grads_cube";
    check_problem(op, hidden, weight, bias, labels, vocab_start);
    TORCH_CHECK_VALUE(weight.size(0) < kCubeMaxIds && hidden.size(0) < kCubeMaxIds, op,
                      ": the cube-driven backward needs N and V each below 2^24 per launch (row offsets and ids travel "
                      "as exact floats), got N=", hidden.size(0), " V=", weight.size(0));
    check_vector(op, "lse", lse, hidden);
    check_vector(op, "a", a, hidden);
    check_vector(op, "t", t, hidden);
    if (has(b)) check_vector(op, "b", *b, hidden);
    if (has(u)) check_vector(op, "u", *u, hidden);
    check_softcap_temperature(op, softcap, temperature);
    check_variant(op, variant);
    if (has(zcache))
        TORCH_CHECK_VALUE(zcache->scalar_type() == at::kFloat && zcache->dim() == 2 &&
                              zcache->size(0) == hidden.size(0) && zcache->size(1) == weight.size(0) &&
                              zcache->device() == hidden.device(),
                    op, ": zcache must be a float32 (N, V) = (", hidden.size(0), ", ", weight.size(0),
                    ") tensor on the hidden states' device (what _npu_stats_cube(keep_z=True) returned), got ",
                    zcache->scalar_type(), " ", zcache->sizes());
    const bool has_bias = has(bias);
    const int64_t mask = (grad_mask[0] ? kMaskHidden : 0) | (grad_mask[1] ? kMaskWeight : 0) |
                         (grad_mask[2] && has_bias ? kMaskBias : 0);
    const bool acc = has(dw_acc) && (mask & kMaskWeight);
    if (acc)
        TORCH_CHECK_VALUE(dw_acc->scalar_type() == at::kFloat && dw_acc->is_contiguous() && dw_acc->dim() == 2 &&
                        dw_acc->size(0) == weight.size(0) && dw_acc->size(1) == weight.size(1) &&
                        dw_acc->device() == weight.device(),
                    op, ": dw_acc must be a contiguous float32 (V, D) = (", weight.size(0), ", ", weight.size(1),
                    ") tensor on the weight's device, got ", dw_acc->scalar_type(), " ", dw_acc->sizes());
    const c10::OptionalDeviceGuard guard(device_of(hidden));
    auto f32 = hidden.options().dtype(at::kFloat);
    // the cube only adds into the outputs through the fixpipe (each element by one core): they start at zero, or dW
    // at the earlier blocks' sum
    Tensor dx = (mask & kMaskHidden) ? at::zeros({hidden.size(0), hidden.size(1)}, f32) : at::empty({0}, f32);
    Tensor dw = acc ? *dw_acc
                    : (mask & kMaskWeight) ? at::zeros({weight.size(0), weight.size(1)}, f32) : at::empty({0}, f32);
    Tensor db = (mask & kMaskBias) ? at::zeros({weight.size(0)}, f32) : at::empty({0}, f32);
    if (mask != 0 && hidden.size(0) > 0) {
        auto plane = [](const Tensor& x) { return x.to(at::kFloat).contiguous(); };
        Tensor ca = plane(a);
        Tensor ct = plane(t);
        c10::optional<Tensor> cb = has(b) ? c10::optional<Tensor>(plane(*b)) : c10::nullopt;
        c10::optional<Tensor> cu = has(u) ? c10::optional<Tensor>(plane(*u)) : c10::nullopt;
        Tensor l = plane(lse);
        Tensor h = hidden.contiguous();
        Tensor w = weight.contiguous();
        Tensor y = labels.contiguous();
        c10::optional<Tensor> bb = contiguous_or_none(bias);
        c10::optional<Tensor> z_cache = contiguous_or_none(zcache);  // absent: recompute the logits
        EXEC_NPU_CMD_EXT(aclnnFusedLceGradCube, ca, ct, cb, cu, h, w, bb, y, l, z_cache, vocab_start, softcap,
                         temperature, mask, keep_dz, variant, dx, dw, db);
    }
    return {dx, acc ? at::empty({0}, f32) : dw, db};
}

}  // namespace fused_lce_npu

// The namespace is defined by the Python package (torch.library.Library("fused_lce", "DEF")): add a fragment with the
// private kernel ops only (kernel_ops.h); their meta kernels and every public op are registered in Python.
TORCH_LIBRARY_FRAGMENT(fused_lce, m) { fused_lce_npu::def_kernel_ops(m, "_npu"); }

TORCH_LIBRARY_IMPL(fused_lce, PrivateUse1, m) {
    m.impl("_npu_stats_cube", &fused_lce_npu::npu_stats_cube);
    m.impl("_npu_grads_cube", &fused_lce_npu::npu_grads_cube);
}
