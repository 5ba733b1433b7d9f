// Per-row elementwise kernels of the CPU backend: everything that touches a logits tile between its GEMMs.
//
// They work on one row segment (one token, one vocabulary tile) of float32 logits that the GEMM has just written,
// so the row is still in cache. Built for several ISAs (AVX-512, AVX2, baseline) in one translation unit and picked
// at run time (rows.cpp); the math is identical in every variant (same polynomial exp), so results do not depend
// on which one runs, only on the compiler's rounding of the same operations.
#pragma once

#include <cstdint>

namespace fused_lce::cpu {

// Statistics of one row segment after pass 1.
struct RowStat {
  float max;       // max of the (bias-added, softcapped, tempered) logits; -inf when all are -inf
  float sumexp;    // sum exp(z - max)
  float zsum;      // sum z (only when asked: label smoothing)
  float target;    // z[label] when the label falls in this segment (else untouched)
  int64_t argmax;  // first index of the max within the segment
  float ez;        // sum exp(z - max) * (z - max) (only when asked: the entropy of linear_logprobs)
};

// How pass 2 finds the probabilities in the tile.
enum class GradFrom : int {
  kProb = 0,    // the tile holds p = exp(z - tile_max) from pass 1 (no softcap): softmax = p * scale
  kLogits = 1,  // the tile holds the final (bias-added, softcapped, tempered) logits from pass 1
  kRaw = 2,     // the tile holds raw GEMM output: add bias and softcap first (recompute path)
};

struct RowKernels {
  // Pass 1 on one row segment `z[0:n)`: add `bias` (nullable), softcap when cap > 0 (z -> cap*tanh(z/cap)), times
  // inv_temp (1: off), find max / first argmax / sum z, read z[label] when 0 <= label < n, then sum exp(z - max)
  // and, with want_ez, sum exp(z - max) * (z - max). The transformed logits are written back; with store_prob
  // (not with want_ez / inv_temp != 1) they are replaced by exp(z - max).
  void (*stats)(float* z, const float* bias, int64_t n, float cap, float inv_temp, int64_t label, bool want_zsum,
                bool want_ez, bool store_prob, RowStat* out);
  // Pass 2 on one row segment: z becomes dz_raw = (p * (a + b * zt) - u - t*[j == label]) * softcap'(zc), where
  // zc = softcap(z + bias) and zt = zc / temp are the capped and the tempered logits and p = exp(zt - lse)
  // (the caller folds 1 / temp into a, b, t, u):
  //   kProb:   p = z * scale                     (scale = a * exp(tile_max - lse); b = 0, temp = 1, a unused)
  //   kLogits: the tile holds zt
  //   kRaw:    the tile holds the raw GEMM output
  // When db is non-null the result is added into db[0:n) (float32 bias-gradient accumulator of this tile).
  // When z16 is non-null the result is also written there rounded to bfloat16 (for bf16 GEMMs).
  void (*grad)(float* z, const float* bias, int64_t n, float cap, float temp, int64_t label, GradFrom from,
               float lse, float a, float b, float u, float t, float scale, float* db, uint16_t* z16);
  const char* isa;
};

// The best variant for this CPU (env FUSED_LCE_CPP_ISA = "avx512" | "avx2" | "default" forces one it supports).
const RowKernels& row_kernels();

// dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols (cache-blocked).
void transpose(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst);
void transpose(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, uint16_t* dst, int64_t ld_dst);

}  // namespace fused_lce::cpu
