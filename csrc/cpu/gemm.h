// Tile GEMMs of the CPU kernel with bfloat16 / float16 operands and float32 results (lce_cpu.cpp uses them).
//
// The logits must come out float32-exact (the loss is compared with float64 at ~1e-5), so every path multiplies
// the 16-bit operands exactly and accumulates in float32. Paths, picked at run time per dtype (low_gemm_path):
//   kMkl     MKL's cblas_gemm_bf16bf16f32 / cblas_gemm_f16f16f32, looked up in the process (x86 torch wheels link
//            MKL into libtorch_cpu and export them): row-major operands with transposes and alpha. MKL runs them
//            on the CPU's bf16 / fp16 instructions (AVX512_BF16, AMX) and elsewhere converts while packing
//            (measured on AVX2 Zen 3: bf16 at float32 GEMM speed, fp16 ~25% slower than float32);
//   kBrgemm  ATen's at::native::cpublas::brgemm (bf16 x bf16 -> fp32, no transposes, no alpha; oneDNN or the BLAS
//            torch was built with); bfloat16 only (float16 dZ needs the alpha, see to_half_scaled);
//   kConvert no 16-bit GEMM: the caller converts its tiles to float32 for float32 GEMMs.
// A path is used only after a one-time check on this machine that it returns float32-exact sums for every
// transpose combination the kernel uses (some builds round the output to 16 bits, or lack the symbols).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace fused_lce::cpu {

// x86 features that decide the default paths (cpuid + the OS's saved register state); all false elsewhere.
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, avx512 = false;     // avx512: F + BW + DQ + VL
  bool avx512_bf16 = false, avx512_fp16 = false, amx_bf16 = false, amx_fp16 = false;
};
const CpuFeatures& cpu_features();
std::string cpu_features_string();  // e.g. "avx2,fma,f16c" (for describe)

enum class LowGemm : int { kConvert = 0, kMkl = 1, kBrgemm = 2 };
const char* low_gemm_name(LowGemm p);

// The path for bfloat16 / float16 inputs. Env FUSED_LCE_CPP_LOW_GEMM (read per call) = "auto" (default) | "mkl" |
// "brgemm" | "convert" forces one (a forced path that is missing or inexact here falls back to "convert");
// FUSED_LCE_CPP_BF16_GEMM=0 (older knob) means "convert" for bfloat16. Auto: bfloat16 -> mkl, else brgemm when
// the CPU has bf16 instructions, else convert; float16 -> mkl when the CPU has fp16 instructions (AVX512_FP16 /
// AMX_FP16), else convert (there MKL's emulation is slower than converting the tiles).
LowGemm low_gemm_path(at::ScalarType dt);

// Whether `path` runs on this machine and passed the exactness check for dt (run once per path and dtype).
bool low_gemm_usable(LowGemm path, at::ScalarType dt);

// C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major, C float32, A and B of dtype dt (kBFloat16 / kHalf) given
// as raw 16-bit values; op(X) = X^T when tx. beta is 0 (C is not read) or 1. kBrgemm takes no transposes and
// alpha == 1. M, N, K and the leading dimensions must fit in int32 (tiles do).
void low_gemm(LowGemm path, at::ScalarType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
              const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float alpha, float beta, float* C,
              int64_t ldc);

// float16 copy of a row-major float32 block (rows x cols, leading dimensions ld_src / ld_dst) scaled by a power of
// two so that its largest magnitude lands in [2^14, 2^15): float16's range is too narrow for dZ (entries of
// g/N-scaled softmax gradients underflow), its 11-bit precision is not. Returns 1/scale, the GEMM's alpha
// (1 when the block is all zero, or holds an inf or NaN, which the copy keeps).
float to_half_scaled(const float* src, int64_t rows, int64_t cols, int64_t ld_src, uint16_t* dst, int64_t ld_dst);

}  // namespace fused_lce::cpu
