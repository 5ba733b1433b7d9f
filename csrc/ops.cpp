// fused_lce._C: the CPU kernels, registered as private ops of the `fused_lce` library (schemas here, CPU
// implementations below). The public ops fused_lce::forward / backward, their checks, routing, loss formula,
// reduction and autograd live in Python (fused_lce/ops, fused_lce/core); the "cpp" provider
// (fused_lce/backends/cpp.py) calls these three kernels:
//   _cpu_stats  per-token statistics of this weight shard (vocab-parallel path: combined across ranks in Python;
//               with temperature and the entropy statistic for linear_logprobs)
//   _cpu_grads  gradients from the global lse and the driver's per-token coefficients (recompute)
//   _cpu_fused  one device: statistics and gradients in one pass over each token block
#include <torch/extension.h>
#include <torch/library.h>

#include "cpu/lce_cpu.h"

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using Mask = std::array<bool, 3>;

Tensor or_empty(const Tensor& t, const Tensor& like) { return t.defined() ? t : at::empty({0}, like.options()); }

fused_lce::cpu::Options options(int64_t vocab_start, double softcap, double temperature, bool with_zsum,
                                bool entropy, int64_t tile_bytes) {
  fused_lce::cpu::Options o;
  o.vocab_start = vocab_start;
  o.softcap = softcap;
  o.temperature = temperature;
  o.with_zsum = with_zsum;
  o.entropy = entropy;
  o.tile_bytes = tile_bytes;
  return o;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> cpu_stats(
    const Tensor& hidden, const Tensor& weight, const OptTensor& bias, const Tensor& labels, int64_t vocab_start,
    double softcap, double temperature, bool with_zsum, bool with_entropy, int64_t tile_bytes) {
  auto st = fused_lce::cpu::stats(hidden, weight, labels, bias,
                                  options(vocab_start, softcap, temperature, with_zsum, with_entropy, tile_bytes));
  return {st.m, st.s, st.target, st.zsum, st.argmax, or_empty(st.ez, st.m)};
}

std::tuple<Tensor, Tensor, Tensor> cpu_grads(const Tensor& hidden, const Tensor& weight, const OptTensor& bias,
                                             const Tensor& labels, const Tensor& lse, const Tensor& a,
                                             const Tensor& t, const OptTensor& b, const OptTensor& u,
                                             int64_t vocab_start, double softcap, double temperature, Mask mask,
                                             double scale, int64_t tile_bytes, bool fp32_grad_hidden) {
  fused_lce::cpu::GradCoefs coef{a, b.value_or(Tensor()), t, u.value_or(Tensor())};
  auto r = fused_lce::cpu::grads(hidden, weight, labels, bias, lse, coef, scale,
                                 options(vocab_start, softcap, temperature, false, false, tile_bytes), mask,
                                 fp32_grad_hidden);
  return {or_empty(r.grad_hidden, hidden), or_empty(r.grad_weight, weight), or_empty(r.grad_bias, weight)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> cpu_fused(
    const Tensor& hidden, const Tensor& weight, const OptTensor& bias, const Tensor& labels, const Tensor& g,
    double a0, double a1, double t0, double u0, double softcap, bool with_zsum, Mask mask, double scale,
    int64_t tile_bytes) {
  auto [st, r] = fused_lce::cpu::fused(hidden, weight, labels, bias, g, {a0, a1, t0, u0}, scale,
                                       options(0, softcap, 1.0, with_zsum, false, tile_bytes), mask);
  return {st.m, st.s, st.target, st.zsum, st.argmax, or_empty(r.grad_hidden, hidden),
          or_empty(r.grad_weight, weight), or_empty(r.grad_bias, weight)};
}

}  // namespace

// One argument order for the private kernel ops of every device: problem tensors (hidden, weight, bias?,
// labels), then per-op tensors, then vocab_start, softcap, temperature, then per-op flags and sizes.
TORCH_LIBRARY_FRAGMENT(fused_lce, m) {
  // ez: sum exp(z - m) (z - m) with with_entropy, else empty
  m.def("_cpu_stats(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, int vocab_start, float softcap, "
        "float temperature, bool with_zsum, bool with_entropy, int tile_bytes) -> (Tensor m, Tensor s, "
        "Tensor target, Tensor zsum, Tensor argmax, Tensor ez)");
  // dz = p * (a + b z) - t onehot - u (b, u None: 0), z = softcap(logits) / temperature, then times softcap'
  m.def("_cpu_grads(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, Tensor lse, Tensor a, Tensor t, "
        "Tensor? b, Tensor? u, int vocab_start, float softcap, float temperature, bool[3] grad_mask, float scale, "
        "int tile_bytes, bool fp32_grad_hidden) -> (Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)");
  // the loss in one pass: a = g (a0 + a1 lse), t = g t0, u = g u0 at each token's own lse (LossTerms)
  m.def("_cpu_fused(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, Tensor g, float a0, float a1, "
        "float t0, float u0, float softcap, bool with_zsum, bool[3] grad_mask, float scale, int tile_bytes) "
        "-> (Tensor m, Tensor s, Tensor target, Tensor zsum, Tensor argmax, Tensor grad_hidden, "
        "Tensor grad_weight, Tensor grad_bias)");
}

TORCH_LIBRARY_IMPL(fused_lce, CPU, m) {
  m.impl("_cpu_stats", TORCH_FN(cpu_stats));
  m.impl("_cpu_grads", TORCH_FN(cpu_grads));
  m.impl("_cpu_fused", TORCH_FN(cpu_fused));
}

// Not a kernel: what the kernel picks for a problem, for tests and benchmarks.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fused_lce CPU kernels (registered as torch.ops.fused_lce._cpu_*)";
  m.def("describe", &fused_lce::cpu::describe,
        "The row-kernel ISA, GEMM path and tiling a problem (n, v, d, low_precision, tile_bytes, fused) gets.");
}
