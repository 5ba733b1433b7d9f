// fused_lce._C: the C++ kernels of torch.ops.fused_lce.forward / backward for the CPU dispatch key, plus the
// Python entry points the "cpp" backend object (fused_lce/backends/cpp_cpu.py) calls.
//
// The schemas are defined in Python (fused_lce/ops.py). Once this library is loaded every CPU call of the two ops
// lands here: the "cpp" backend (and "auto", whose first CPU choice is cpp) runs natively, including the
// reduction that the Python router (ops._forward_kernel) would do; anything else -- another backend, a
// vocab-parallel group, an unsupported dtype -- is handed back to the Python router through
// fused_lce::_route_forward / _route_backward, which have the same schemas.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>

#include "cpu/lce_cpu.h"

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using Mask = std::array<bool, 3>;
using FwdOut = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
using BwdOut = std::tuple<Tensor, Tensor, Tensor>;
using FwdSig = FwdOut(const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const OptTensor&,
                      c10::string_view, int64_t, double, double, double, c10::string_view, c10::string_view, int64_t,
                      int64_t, int64_t, Mask);
using BwdSig = BwdOut(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const Tensor&,
                      int64_t, double, double, double, c10::string_view, c10::string_view, int64_t, int64_t, int64_t,
                      Mask);

// Native when the cpp backend is what the caller asked for (explicitly, or "auto" without an env override to
// another backend) and the kernel supports the problem; the router raises the proper error otherwise.
bool run_native(c10::string_view backend, c10::string_view group_name, const Tensor& hidden, const Tensor& weight,
                const OptTensor& bias) {
  if (!group_name.empty()) return false;  // vocab-parallel: the Python router does the combine
  if (!fused_lce::cpu::unsupported(hidden, weight, bias).empty()) return false;
  if (backend == "cpp") return true;
  if (backend != "auto") return false;
  const char* env = std::getenv("FUSED_LCE_BACKEND");
  return env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0 || std::strcmp(env, "cpp") == 0;
}

fused_lce::cpu::Options make_options(int64_t ignore_index, double label_smoothing, double z_loss, double softcap,
                                     int64_t vocab_start, int64_t vocab_total, int64_t tile_bytes) {
  fused_lce::cpu::Options o;
  o.ignore_index = ignore_index;
  o.label_smoothing = label_smoothing;
  o.z_loss = z_loss;
  o.softcap = softcap;
  o.vocab_start = vocab_start;
  o.vocab_total = vocab_total;
  o.tile_bytes = tile_bytes;
  return o;
}

Tensor or_empty(const Tensor& t, const Tensor& like) { return t.defined() ? t : at::empty({0}, like.options()); }

// 1 / divisor of the summed loss as ops._divisor / ops._safe_inverse compute it: 1 for "sum", num_items or the
// number of valid tokens for "mean"; 0 when the divisor is 0 (all ignored: loss and gradients 0, never NaN).
Tensor inverse_divisor(c10::string_view reduction, const OptTensor& num_items, const Tensor& labels,
                       int64_t ignore_index) {
  auto f32 = labels.options().dtype(at::kFloat);
  Tensor div;
  if (reduction != "mean")
    div = at::ones({}, f32);
  else if (num_items.has_value() && num_items->defined())
    div = num_items->to(labels.device(), at::kFloat).reshape({});
  else
    div = labels.ne(ignore_index).sum().to(at::kFloat);
  Tensor pos = div.gt(0);
  return at::where(pos, at::where(pos, div, at::ones_like(div)).reciprocal(), at::zeros_like(div));
}

FwdOut forward_cpu(const Tensor& hidden, const Tensor& weight, const Tensor& labels, const OptTensor& bias,
                   const OptTensor& num_items, c10::string_view reduction, int64_t ignore_index,
                   double label_smoothing, double z_loss, double softcap, c10::string_view backend,
                   c10::string_view group_name, int64_t vocab_start, int64_t vocab_total, int64_t tile_bytes,
                   Mask grad_mask) {
  if (!run_native(backend, group_name, hidden, weight, bias)) {
    static auto route =
        c10::Dispatcher::singleton().findSchemaOrThrow("fused_lce::_route_forward", "").typed<FwdSig>();
    return route.call(hidden, weight, labels, bias, num_items, reduction, ignore_index, label_smoothing, z_loss,
                      softcap, backend, group_name, vocab_start, vocab_total, tile_bytes, grad_mask);
  }
  const bool has_bias = bias.has_value() && bias->defined();
  const Mask mask{grad_mask[0], grad_mask[1], grad_mask[2] && has_bias};
  const bool fused = reduction != "none" && (mask[0] || mask[1] || mask[2]);
  Tensor inv = inverse_divisor(reduction, num_items, labels, ignore_index);
  std::optional<double> scale;
  if (fused) scale = (double)inv.item<float>();
  auto r = fused_lce::cpu::forward(hidden, weight, labels, bias,
                                   make_options(ignore_index, label_smoothing, z_loss, softcap, vocab_start,
                                                vocab_total, tile_bytes),
                                   scale, mask, /*fp32_grad_hidden=*/false);
  Tensor loss = reduction == "none" ? r.loss : r.loss.sum() * inv;
  return {loss, r.lse, r.correct, or_empty(r.grad_hidden, hidden), or_empty(r.grad_weight, weight),
          or_empty(r.grad_bias, weight)};
}

BwdOut backward_cpu(const Tensor& grad_loss, const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                    const OptTensor& bias, const Tensor& lse, int64_t ignore_index, double label_smoothing,
                    double z_loss, double softcap, c10::string_view backend, c10::string_view group_name,
                    int64_t vocab_start, int64_t vocab_total, int64_t tile_bytes, Mask grad_mask) {
  if (!run_native(backend, group_name, hidden, weight, bias)) {
    static auto route =
        c10::Dispatcher::singleton().findSchemaOrThrow("fused_lce::_route_backward", "").typed<BwdSig>();
    return route.call(grad_loss, hidden, weight, labels, bias, lse, ignore_index, label_smoothing, z_loss, softcap,
                      backend, group_name, vocab_start, vocab_total, tile_bytes, grad_mask);
  }
  const bool has_bias = bias.has_value() && bias->defined();
  const Mask mask{grad_mask[0], grad_mask[1], grad_mask[2] && has_bias};
  auto [dh, dw, db] = fused_lce::cpu::backward(
      grad_loss, hidden, weight, labels, bias, lse,
      make_options(ignore_index, label_smoothing, z_loss, softcap, vocab_start, vocab_total, tile_bytes), mask,
      /*fp32_grad_hidden=*/false);
  return {or_empty(dh, hidden), or_empty(dw, weight), or_empty(db, weight)};
}

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

}  // namespace

TORCH_LIBRARY_IMPL(fused_lce, CPU, m) {
  m.impl("forward", TORCH_FN(forward_cpu));
  m.impl("backward", TORCH_FN(backward_cpu));
}

// Entry points of the Python backend object (per-token results, no reduction; see backends/base.py).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fused_lce C++ kernels (CPU)";
  m.def(
      "forward",
      [](const Tensor& hidden, const Tensor& weight, const Tensor& labels, const OptTensor& bias,
         int64_t ignore_index, double label_smoothing, double z_loss, double softcap, int64_t vocab_start,
         int64_t vocab_total, int64_t tile_bytes, std::optional<double> grad_scale, Mask mask, bool fp32_grad_hidden) {
        pybind11::gil_scoped_release no_gil;
        auto r = fused_lce::cpu::forward(
            hidden, weight, labels, bias,
            make_options(ignore_index, label_smoothing, z_loss, softcap, vocab_start, vocab_total, tile_bytes),
            grad_scale, mask, fp32_grad_hidden);
        return std::make_tuple(r.loss, r.lse, r.correct, opt(r.grad_hidden), opt(r.grad_weight), opt(r.grad_bias));
      },
      "Per-token (loss, lse, correct, grad_hidden|None, grad_weight|None, grad_bias|None); gradients of "
      "grad_scale * sum(loss) for the inputs selected by mask when grad_scale is given.");
  m.def(
      "backward",
      [](const Tensor& grad_loss, const Tensor& hidden, const Tensor& weight, const Tensor& labels,
         const OptTensor& bias, const Tensor& lse, int64_t ignore_index, double label_smoothing, double z_loss,
         double softcap, int64_t vocab_start, int64_t vocab_total, int64_t tile_bytes, Mask mask,
         bool fp32_grad_hidden) {
        pybind11::gil_scoped_release no_gil;
        auto [dh, dw, db] = fused_lce::cpu::backward(
            grad_loss, hidden, weight, labels, bias, lse,
            make_options(ignore_index, label_smoothing, z_loss, softcap, vocab_start, vocab_total, tile_bytes), mask,
            fp32_grad_hidden);
        return std::make_tuple(opt(dh), opt(dw), opt(db));
      },
      "(grad_hidden|None, grad_weight|None, grad_bias|None) of sum(grad_loss * loss) from the saved lse.");
  m.def(
      "stats",
      [](const Tensor& hidden, const Tensor& weight, const Tensor& labels, const OptTensor& bias,
         int64_t ignore_index, double label_smoothing, double softcap, int64_t vocab_start, int64_t vocab_total,
         int64_t tile_bytes) {
        pybind11::gil_scoped_release no_gil;
        return fused_lce::cpu::stats(
            hidden, weight, labels, bias,
            make_options(ignore_index, label_smoothing, 0.0, softcap, vocab_start, vocab_total, tile_bytes));
      },
      "Per-token (max, sumexp, target logit, sum of logits, first argmax) of this weight shard.");
  m.def("unsupported", &fused_lce::cpu::unsupported, "Empty string when the kernel can run these inputs.");
  m.def("describe", &fused_lce::cpu::describe,
        "The row-kernel ISA, GEMM path and tiling a problem (n, v, d, dtype, tile_bytes, fused) gets.");
}
