// The CPU kernel of fused_lce ("cpp" backend): per-token loss, lse, correctness and gradients of a 2-D problem,
// never materialising more than a row block of logits. The loss formula, token weights, reduction and routing
// live in Python (fused_lce/core); csrc/ops.cpp registers these kernels as private ops.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <string>

namespace fused_lce::cpu {

struct Options {
  bool with_zsum = false;    // the statistics include the sum of logits (label smoothing's term)
  double softcap = 0.0;      // 0: off
  double temperature = 1.0;  // logits z = softcap(x) / temperature (linear_logprobs; the loss uses 1)
  bool entropy = false;      // the statistics include ez (linear_logprobs with the entropy)
  int64_t vocab_start = 0;   // first global id of this weight shard
  int64_t tile_bytes = 0;    // 0: 256 MiB
};

// The loss's gradient coefficients per unit of token weight g, affine in the token's lse (the driver's
// fused_lce.core.formulas.loss_terms): a = g (a0 + a1 lse), t = g t0, u = g u0.
struct LossTerms {
  double a0 = 1.0, a1 = 0.0, t0 = 1.0, u0 = 0.0;
};

// Per-token statistics over this weight shard: max, sum exp(z - max), the label's logit (0 when the label is not
// in the shard), sum of logits (0 unless Options::with_zsum), first argmax as a global id (int64), and with
// Options::entropy ez = sum exp(z - max) (z - max) (else undefined).
struct StatsOut {
  at::Tensor m, s, target, zsum, argmax, ez;
};

// Per-token coefficients of the logits gradient, float32 (N,) each; b and u may be undefined (0):
// dz = p * (a + b z) - t * onehot(label) - u with p = exp(z - lse), z the tempered logits (fused_lce.driver forms
// them, 1 / temperature folded in), then times softcap'.
struct GradCoefs {
  at::Tensor a, b, t, u;
};

// Gradients (undefined where not asked for). grad_hidden is float32 when fp32_grad_hidden (a vocab-parallel
// caller sums it over the group first), else hidden's dtype; the others have their input's dtype.
struct GradsOut {
  at::Tensor grad_hidden, grad_weight, grad_bias;
};

// The statistics only (the vocab-parallel path combines them across ranks before the gradients).
StatsOut stats(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
               const std::optional<at::Tensor>& bias, const Options& opt);

// Gradients of scale * (the logits gradient of GradCoefs) from the global per-token lse (recomputes the logits).
// A token whose coefficients are all 0 is skipped, a NaN coefficient poisons its gradients.
GradsOut grads(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
               const std::optional<at::Tensor>& bias, const at::Tensor& lse, const GradCoefs& coef, double scale,
               const Options& opt, std::array<bool, 3> mask, bool fp32_grad_hidden);

// One device, one pass: the statistics and the gradients of scale * sum_i g_i * loss_i (logits kept between the
// two passes of a token block when they fit the tile budget: 3 GEMM-equivalents). g is the per-token weight: 0
// skips a token, NaN poisons its gradients; LossTerms turns it into the coefficients at the token's own lse. The
// loss only (temperature 1, no entropy).
std::pair<StatsOut, GradsOut> fused(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                    const std::optional<at::Tensor>& bias, const at::Tensor& g,
                                    const LossTerms& terms, double scale, const Options& opt,
                                    std::array<bool, 3> mask);

// Which row-kernel ISA and GEMM path run here, and the tiling a problem gets (for tests and the benchmark).
std::string describe(int64_t n, int64_t v, int64_t d, bool low_precision, int64_t tile_bytes, bool fused);

}  // namespace fused_lce::cpu
