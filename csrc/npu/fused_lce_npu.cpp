// Host adapter of the AscendC kernels (csrc/ascend) for torch_npu. Status: written and compiled against the
// torch-npu wheel's headers (see docs/npu.md), not run on hardware.
//
// Registers, in the `fused_lce` namespace the Python package defines (fused_lce/ops.py):
//   * fused_lce::_npu_stats / fused_lce::_npu_grads: thin ops over aclnnFusedLceStats / aclnnFusedLceGrad (the
//     two-phase aclnn API the custom OPP build generates), called through torch_npu's op-api helper
//     EXEC_NPU_CMD_EXT, which resolves the aclnn symbols in the custom OPP's libcust_opapi.so at run time;
//   * a PrivateUse1 kernel for fused_lce::forward / fused_lce::backward that runs the single-device case without
//     Python (statistics -> loss -> reduction -> optional gradients in the same call) and hands everything else
//     (another backend requested, a vocab-parallel group, an unsupported dtype) back to the Python router through
//     fused_lce::_route_forward / _route_backward. The Python "npu" backend uses the same two ops, so both paths
//     share the kernels and the arithmetic below mirrors fused_lce.backends.npu_emulator.finish.
// Autograd and the fake (meta) kernels stay registered in Python.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>

#include "npu_cpp_extension.h"  // torch_npu: EXEC_NPU_CMD_EXT (op_plugin/include)

namespace fused_lce_npu {

using at::Tensor;
using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;
using Tensor5 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;
using Tensor6 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

constexpr int64_t kMaskHidden = 1, kMaskWeight = 2, kMaskBias = 4;

static void check_problem(const Tensor& hidden, const Tensor& weight, const c10::optional<Tensor>& bias,
                          const Tensor& labels) {
    TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
                "fused_lce npu: expected hidden (N, D) and weight (V, D), got ", hidden.sizes(), " and ",
                weight.sizes());
    TORCH_CHECK(labels.dim() == 1 && labels.size(0) == hidden.size(0), "fused_lce npu: labels must be (N,)");
    TORCH_CHECK(hidden.scalar_type() == weight.scalar_type(), "fused_lce npu: hidden and weight dtypes differ");
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), "fused_lce npu: bias must be (V,)");
    }
}

// Per-token local statistics over this rank's vocabulary rows: max, sum exp(z - max), target logit (0 when the
// label is not in this shard), sum of logits (only when with_zsum), first argmax as a global id.
Tensor5 npu_stats(const Tensor& hidden, const Tensor& weight, const c10::optional<Tensor>& bias,
                  const Tensor& labels, int64_t vocab_start, double softcap, bool with_zsum) {
    check_problem(hidden, weight, bias, labels);
    const c10::OptionalDeviceGuard guard(device_of(hidden));
    const int64_t n = hidden.size(0);
    auto f32 = hidden.options().dtype(at::kFloat);
    Tensor m = at::empty({n}, f32);
    Tensor s = at::empty({n}, f32);
    Tensor zt = at::empty({n}, f32);
    Tensor zs = at::empty({n}, f32);
    Tensor amax_local = at::empty({n}, hidden.options().dtype(at::kInt));
    if (n > 0) {
        Tensor h = hidden.contiguous();
        Tensor w = weight.contiguous();
        Tensor y = labels.contiguous();
        c10::optional<Tensor> b = bias.has_value() && bias->defined() ? c10::optional<Tensor>(bias->contiguous())
                                                                      : c10::nullopt;
        EXEC_NPU_CMD_EXT(aclnnFusedLceStats, h, w, b, y, vocab_start, softcap, with_zsum, m, s, zt, zs, amax_local);
    }
    // the kernel keeps 32-bit shard-local ids (cheap on the vector unit); global ids are int64
    Tensor amax = amax_local.to(at::kLong).add_(vocab_start);
    return {m, s, zt, zs, amax};
}

// float32 gradients of sum_i grad_tok[i] * loss_i (grad_tok is 0 for ignored tokens, NaN for bad labels).
// Outputs that grad_mask does not ask for are empty.
Tensor3 npu_grads(const Tensor& grad_tok, const Tensor& hidden, const Tensor& weight,
                  const c10::optional<Tensor>& bias, const Tensor& labels, const Tensor& lse, int64_t vocab_start,
                  int64_t vocab_total, double label_smoothing, double z_loss, double softcap,
                  std::array<bool, 3> grad_mask) {
    check_problem(hidden, weight, bias, labels);
    const c10::OptionalDeviceGuard guard(device_of(hidden));
    const bool has_bias = bias.has_value() && bias->defined();
    const int64_t mask = (grad_mask[0] ? kMaskHidden : 0) | (grad_mask[1] ? kMaskWeight : 0) |
                         (grad_mask[2] && has_bias ? kMaskBias : 0);
    auto f32 = hidden.options().dtype(at::kFloat);
    // the kernel accumulates with float32 atomic adds: the accumulators start at zero
    Tensor dx = (mask & kMaskHidden) ? at::zeros({hidden.size(0), hidden.size(1)}, f32) : at::empty({0}, f32);
    Tensor dw = (mask & kMaskWeight) ? at::zeros({weight.size(0), weight.size(1)}, f32) : at::empty({0}, f32);
    Tensor db = (mask & kMaskBias) ? at::zeros({weight.size(0)}, f32) : at::empty({0}, f32);
    if (mask != 0 && hidden.size(0) > 0) {
        Tensor g = grad_tok.to(at::kFloat).contiguous();
        Tensor l = lse.to(at::kFloat).contiguous();
        Tensor h = hidden.contiguous();
        Tensor w = weight.contiguous();
        Tensor y = labels.contiguous();
        c10::optional<Tensor> b = has_bias ? c10::optional<Tensor>(bias->contiguous()) : c10::nullopt;
        EXEC_NPU_CMD_EXT(aclnnFusedLceGrad, g, h, w, b, y, l, vocab_start, vocab_total, label_smoothing, z_loss,
                         softcap, mask, dx, dw, db);
    }
    return {dx, dw, db};
}

// ------------------------------------------------------------------------------------------- fused_lce::forward
struct Tokens {
    Tensor y, valid, bad;
};

static Tokens classify(const Tensor& labels, int64_t ignore_index, int64_t vocab_total) {
    Tokens t;
    t.y = labels.to(at::kLong);
    t.valid = t.y.ne(ignore_index);
    t.bad = t.valid.logical_and(t.y.lt(0).logical_or(t.y.ge(vocab_total)));
    return t;
}

// scale where valid, 0 where ignored, NaN where the label is out of range
static Tensor token_weights(const Tokens& t, const Tensor& scale) {
    Tensor g = at::where(t.valid, scale.to(at::kFloat).expand(t.valid.sizes()),
                         at::zeros({}, scale.options().dtype(at::kFloat)));
    return at::where(t.bad, at::full_like(g, std::numeric_limits<float>::quiet_NaN()), g);
}

// True when this adapter should run the call itself; the Python router decides everything else.
static bool own_path(c10::string_view backend, c10::string_view group_name, const Tensor& hidden) {
    if (!group_name.empty()) return false;  // the vocab-parallel combine lives in fused_lce.distributed
    const auto dt = hidden.scalar_type();
    if (dt != at::kBFloat16 && dt != at::kHalf && dt != at::kFloat) return false;
    if (backend == "npu") return true;
    if (backend != "auto") return false;
    const char* env = std::getenv("FUSED_LCE_BACKEND");
    const std::string want = env ? env : "";
    return want.empty() || want == "auto" || want == "npu";
}

static Tensor3 grads_in_dtype(const Tensor& g, const Tensor& hidden, const Tensor& weight,
                              const c10::optional<Tensor>& bias, const Tensor& labels, const Tensor& lse,
                              int64_t vocab_start, int64_t vocab_total, double label_smoothing, double z_loss,
                              double softcap, std::array<bool, 3> mask) {
    auto r = npu_grads(g, hidden, weight, bias, labels, lse, vocab_start, vocab_total, label_smoothing, z_loss,
                       softcap, mask);
    Tensor dx = std::get<0>(r), dw = std::get<1>(r), db = std::get<2>(r);
    return {mask[0] ? dx.to(hidden.scalar_type()) : hidden.new_empty({0}),
            mask[1] ? dw.to(weight.scalar_type()) : weight.new_empty({0}),
            mask[2] ? db.to(bias->scalar_type()) : weight.new_empty({0})};
}

Tensor6 forward_npu(const Tensor& hidden, const Tensor& weight, const Tensor& labels, const c10::optional<Tensor>& bias,
                    const c10::optional<Tensor>& num_items, c10::string_view reduction, int64_t ignore_index,
                    double label_smoothing, double z_loss, double softcap, c10::string_view backend,
                    c10::string_view group_name, int64_t vocab_start, int64_t vocab_total, int64_t tile_bytes,
                    std::array<bool, 3> grad_mask) {
    if (!own_path(backend, group_name, hidden)) {
        static auto route = c10::Dispatcher::singleton()
                                .findSchemaOrThrow("fused_lce::_route_forward", "")
                                .typed<decltype(forward_npu)>();
        return route.call(hidden, weight, labels, bias, num_items, reduction, ignore_index, label_smoothing, z_loss,
                          softcap, backend, group_name, vocab_start, vocab_total, tile_bytes, grad_mask);
    }
    const int64_t vt = vocab_total > 0 ? vocab_total : weight.size(0);
    auto st = npu_stats(hidden, weight, bias, labels, vocab_start, softcap, label_smoothing > 0);
    Tensor m = std::get<0>(st), s = std::get<1>(st), zt = std::get<2>(st), zs = std::get<3>(st);
    Tensor amax = std::get<4>(st);
    Tokens t = classify(labels, ignore_index, vt);
    Tensor lse = m + at::log(s);
    Tensor per = (lse - zt) * (1.0 - label_smoothing);
    if (label_smoothing != 0.0) per = per + (lse - zs / static_cast<double>(vt)) * label_smoothing;
    if (z_loss != 0.0) per = per + lse * lse * z_loss;
    per = at::where(t.valid, per, at::zeros_like(per));
    per = at::where(t.bad, at::full_like(per, std::numeric_limits<float>::quiet_NaN()), per);
    Tensor correct = t.valid.logical_and(amax.eq(t.y));

    const bool has_bias = bias.has_value() && bias->defined();
    const std::array<bool, 3> mask = {grad_mask[0], grad_mask[1], grad_mask[2] && has_bias};
    const bool fused = reduction != "none" && (mask[0] || mask[1] || mask[2]);
    // divisor: 1 for "sum", num_items or the count of valid tokens for "mean"; 0 -> loss and gradients 0
    Tensor div = at::ones({}, per.options());
    if (reduction == "mean") {
        div = num_items.has_value() && num_items->defined() ? num_items->to(per.options()).reshape({})
                                                            : t.valid.sum().to(at::kFloat);
    }
    Tensor pos = div.gt(0);
    Tensor inv = at::where(pos, at::reciprocal(at::where(pos, div, at::ones_like(div))), at::zeros_like(div));
    Tensor loss = reduction == "none" ? per : per.sum() * inv;
    Tensor dx = hidden.new_empty({0}), dw = weight.new_empty({0}), db = weight.new_empty({0});
    if (fused) {
        std::tie(dx, dw, db) = grads_in_dtype(token_weights(t, inv), hidden, weight, bias, labels, lse, vocab_start,
                                              vt, label_smoothing, z_loss, softcap, mask);
    }
    return {loss, lse, correct, dx, dw, db};
}

Tensor3 backward_npu(const Tensor& grad_loss, const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                     const c10::optional<Tensor>& bias, const Tensor& lse, int64_t ignore_index,
                     double label_smoothing, double z_loss, double softcap, c10::string_view backend,
                     c10::string_view group_name, int64_t vocab_start, int64_t vocab_total, int64_t tile_bytes,
                     std::array<bool, 3> grad_mask) {
    if (!own_path(backend, group_name, hidden)) {
        static auto route = c10::Dispatcher::singleton()
                                .findSchemaOrThrow("fused_lce::_route_backward", "")
                                .typed<decltype(backward_npu)>();
        return route.call(grad_loss, hidden, weight, labels, bias, lse, ignore_index, label_smoothing, z_loss,
                          softcap, backend, group_name, vocab_start, vocab_total, tile_bytes, grad_mask);
    }
    const int64_t vt = vocab_total > 0 ? vocab_total : weight.size(0);
    const bool has_bias = bias.has_value() && bias->defined();
    const std::array<bool, 3> mask = {grad_mask[0], grad_mask[1], grad_mask[2] && has_bias};
    if (!(mask[0] || mask[1] || mask[2])) return {hidden.new_empty({0}), weight.new_empty({0}), weight.new_empty({0})};
    Tokens t = classify(labels, ignore_index, vt);
    return grads_in_dtype(token_weights(t, grad_loss), hidden, weight, bias, labels, lse, vocab_start, vt,
                          label_smoothing, z_loss, softcap, mask);
}

}  // namespace fused_lce_npu

// The namespace is defined by the Python package (torch.library.Library("fused_lce", "DEF")): add a fragment.
TORCH_LIBRARY_FRAGMENT(fused_lce, m) {
    m.def("_npu_stats(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, int vocab_start, float softcap, "
          "bool with_zsum) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
    m.def("_npu_grads(Tensor grad_tok, Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, Tensor lse, "
          "int vocab_start, int vocab_total, float label_smoothing, float z_loss, float softcap, bool[3] grad_mask) "
          "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(fused_lce, PrivateUse1, m) {
    m.impl("_npu_stats", &fused_lce_npu::npu_stats);
    m.impl("_npu_grads", &fused_lce_npu::npu_grads);
    m.impl("forward", &fused_lce_npu::forward_npu);
    m.impl("backward", &fused_lce_npu::backward_npu);
}
