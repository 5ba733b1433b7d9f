// The CPU kernel of fused_lce ("cpp" backend): per-token loss, lse, correctness and gradients of a 2-D problem,
// never materialising more than a row block of logits. The op-level glue (reduction, routing) lives in ops.cpp.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <string>

namespace fused_lce::cpu {

struct Options {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  double z_loss = 0.0;
  double softcap = 0.0;      // 0: off
  int64_t vocab_start = 0;   // first global id of this weight shard
  int64_t vocab_total = 0;   // 0: weight.size(0)
  int64_t tile_bytes = 0;    // 0: env FUSED_LCE_TILE_MB, else 256 MiB
};

struct TokenResult {
  at::Tensor loss;     // (N,) float32: 0 where ignored, NaN where the label is out of range
  at::Tensor lse;      // (N,) float32
  at::Tensor correct;  // (N,) bool
  at::Tensor grad_hidden, grad_weight, grad_bias;  // undefined unless computed
};

// Per-token forward. With grad_scale, also the gradients of grad_scale * sum_i loss_i for the inputs selected by
// mask (hidden, weight, bias), computed in the same pass. grad_hidden is float32 when fp32_grad_hidden (a
// vocab-parallel caller all-reduces it before casting), else hidden's dtype; the others have their input's dtype.
TokenResult forward(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                    const std::optional<at::Tensor>& bias, const Options& opt, std::optional<double> grad_scale,
                    std::array<bool, 3> mask, bool fp32_grad_hidden);

// Gradients of sum_i grad_loss_i * loss_i from the saved per-token lse (recomputes the logits).
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor& grad_loss, const at::Tensor& hidden,
                                                        const at::Tensor& weight, const at::Tensor& labels,
                                                        const std::optional<at::Tensor>& bias, const at::Tensor& lse,
                                                        const Options& opt, std::array<bool, 3> mask,
                                                        bool fp32_grad_hidden);

// Pass 1 only, per token, over this weight shard: (max, sum exp(z - max), target logit or 0 when the label is
// not in the shard, sum of logits, first argmax as a global id). For the vocab-parallel combine in Python.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> stats(const at::Tensor& hidden,
                                                                             const at::Tensor& weight,
                                                                             const at::Tensor& labels,
                                                                             const std::optional<at::Tensor>& bias,
                                                                             const Options& opt);

// Empty string when the kernel can run these inputs, else why not.
std::string unsupported(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

// Which row-kernel ISA and GEMM path run here, and the tiling a problem gets (for tests and the benchmark).
std::string describe(int64_t n, int64_t v, int64_t d, bool low_precision, int64_t tile_bytes, bool fused);

}  // namespace fused_lce::cpu
