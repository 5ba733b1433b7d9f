// fused_lce._C: the CPU kernels, registered as private ops of the `fused_lce` library (schemas here, CPU
// implementations below). The public ops fused_lce::forward / backward, their checks, routing, loss formula,
// reduction and autograd live in Python (fused_lce/ops.py, fused_lce/driver.py); the "cpp" provider
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

fused_lce::cpu::Options options(int64_t vocab_start, int64_t vocab_total, double label_smoothing, double z_loss,
                                double softcap, int64_t tile_bytes, double temperature = 1.0,
                                bool entropy = false) {
  fused_lce::cpu::Options o;
  o.vocab_start = vocab_start;
  o.vocab_total = vocab_total;
  o.label_smoothing = label_smoothing;
  o.z_loss = z_loss;
  o.softcap = softcap;
  o.tile_bytes = tile_bytes;
  o.temperature = temperature;
  o.entropy = entropy;
  return o;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> cpu_stats(
    const Tensor& hidden, const Tensor& weight, const Tensor& labels, const OptTensor& bias, int64_t vocab_start,
    double softcap, bool with_zsum, int64_t tile_bytes, double temperature, bool with_entropy) {
  auto st = fused_lce::cpu::stats(
      hidden, weight, labels, bias,
      options(vocab_start, 0, with_zsum ? 1.0 : 0.0, 0.0, softcap, tile_bytes, temperature, with_entropy));
  return {st.m, st.s, st.target, st.zsum, st.argmax, or_empty(st.ez, st.m)};
}

std::tuple<Tensor, Tensor, Tensor> cpu_grads(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                                             const OptTensor& bias, const Tensor& lse, const Tensor& a,
                                             const OptTensor& b, const Tensor& t, const OptTensor& u, double scale,
                                             int64_t vocab_start, double softcap, double temperature,
                                             int64_t tile_bytes, Mask mask, bool fp32_grad_hidden) {
  fused_lce::cpu::GradCoefs coef{a, b.value_or(Tensor()), t, u.value_or(Tensor())};
  auto r = fused_lce::cpu::grads(hidden, weight, labels, bias, lse, coef, scale,
                                 options(vocab_start, 0, 0.0, 0.0, softcap, tile_bytes, temperature), mask,
                                 fp32_grad_hidden);
  return {or_empty(r.grad_hidden, hidden), or_empty(r.grad_weight, weight), or_empty(r.grad_bias, weight)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> cpu_fused(
    const Tensor& hidden, const Tensor& weight, const Tensor& labels, const OptTensor& bias, const Tensor& g,
    double scale, int64_t vocab_total, double label_smoothing, double z_loss, double softcap, int64_t tile_bytes,
    Mask mask) {
  auto [st, r] = fused_lce::cpu::fused(hidden, weight, labels, bias, g, scale,
                                       options(0, vocab_total, label_smoothing, z_loss, softcap, tile_bytes), mask);
  return {st.m, st.s, st.target, st.zsum, st.argmax, or_empty(r.grad_hidden, hidden),
          or_empty(r.grad_weight, weight), or_empty(r.grad_bias, weight)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fused_lce, m) {
  // ez: sum exp(z - m) (z - m) with with_entropy, else empty
  m.def("_cpu_stats(Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, int vocab_start, float softcap, "
        "bool with_zsum, int tile_bytes, float temperature=1.0, bool with_entropy=False) -> (Tensor m, Tensor s, "
        "Tensor target, Tensor zsum, Tensor argmax, Tensor ez)");
  // dz = p * (a + b z) - t onehot - u (b, u None: 0), z = softcap(logits) / temperature, then times softcap'
  m.def("_cpu_grads(Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor lse, Tensor a, Tensor? b, "
        "Tensor t, Tensor? u, float scale, int vocab_start, float softcap, float temperature, int tile_bytes, "
        "bool[3] grad_mask, bool fp32_grad_hidden) -> (Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)");
  m.def("_cpu_fused(Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor g, float scale, "
        "int vocab_total, float label_smoothing, float z_loss, float softcap, int tile_bytes, bool[3] grad_mask) "
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
