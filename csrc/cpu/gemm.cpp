// 16-bit tile GEMMs with float32 results: CPU feature detection, the MKL / ATen entry points, the exactness check,
// and the scaled float16 copy of dZ (see gemm.h).
#include "gemm.h"

#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define FLCE_X86 1
#endif

namespace fused_lce::cpu {

// ---------------------------------------------------------------------------------------------- CPU features
namespace {

#ifdef FLCE_X86
uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#ifdef FLCE_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6, os_avx512 = (xcr0 & 0xe6) == 0xe6, os_amx = (xcr0 & 0x60000) == 0x60000;
  if (!avx || !os_avx) return f;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0, a71 = 0, b71 = 0, c71 = 0, d71 = 0;
  if (__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) {
    f.avx2 = (b7 >> 5) & 1;
    f.avx512 = os_avx512 && ((b7 >> 16) & 1) && ((b7 >> 17) & 1) && ((b7 >> 30) & 1) && ((b7 >> 31) & 1);
    f.avx512_fp16 = f.avx512 && ((d7 >> 23) & 1);
    f.amx_bf16 = os_amx && ((d7 >> 24) & 1) && ((d7 >> 22) & 1);
    if (a7 >= 1 && __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71)) {
      f.avx512_bf16 = f.avx512 && ((a71 >> 5) & 1);
      f.amx_fp16 = os_amx && ((d7 >> 24) & 1) && ((a71 >> 21) & 1);
    }
  }
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

std::string cpu_features_string() {
  const CpuFeatures& f = cpu_features();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ",";
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512, "avx512");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx512_fp16, "avx512_fp16");
  add(f.amx_bf16, "amx_bf16");
  add(f.amx_fp16, "amx_fp16");
  return s.empty() ? "none" : s;
}

// ---------------------------------------------------------------------------------------------- entry points
namespace {

// MKL's CBLAS signature for both 16-bit types (MKL_BF16 / MKL_F16 are uint16_t; LP64: MKL_INT is int).
using CblasGemm16 = void (*)(int layout, int transa, int transb, int m, int n, int k, float alpha, const uint16_t* a,
                             int lda, const uint16_t* b, int ldb, float beta, float* c, int ldc);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

void* find_symbol(const char* name) {
  if (void* p = dlsym(RTLD_DEFAULT, name)) return p;
  // torch's own library, if the symbol is not in the default scope
  if (void* h = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD)) {
    void* p = dlsym(h, name);
    dlclose(h);
    return p;
  }
  return nullptr;
}

CblasGemm16 mkl_entry(at::ScalarType dt) {
  static const CblasGemm16 bf16 = (CblasGemm16)find_symbol("cblas_gemm_bf16bf16f32");
  static const CblasGemm16 f16 = (CblasGemm16)find_symbol("cblas_gemm_f16f16f32");
  return dt == at::kBFloat16 ? bf16 : dt == at::kHalf ? f16 : nullptr;
}

uint16_t bits_of(float x, at::ScalarType dt) {
  return dt == at::kBFloat16 ? c10::BFloat16(x).x : c10::Half(x).x;
}

// Small integer operands whose every partial sum is exact in float32 but not in 16 bits; C starts with values that
// need float32's mantissa, so a path that rounds C or its sums to 16 bits, ignores beta, alpha or a transpose, or
// misreads a leading dimension, fails. Exact equality with the float64 result is required.
bool check_exact(LowGemm path, at::ScalarType dt) {
  const int64_t M = 37, N = 29, K = 67, pad = 3;
  uint32_t state = 12345u;
  auto rnd = [&](int lo, int hi) {
    state = state * 1664525u + 1013904223u;
    return lo + (int)((state >> 8) % (uint32_t)(hi - lo + 1));
  };
  std::vector<std::array<bool, 2>> trans = {{false, false}};
  if (path == LowGemm::kMkl) trans = {{false, false}, {false, true}, {true, false}, {true, true}};
  for (auto [ta, tb] : trans) {
    for (int variant = 0; variant < 2; ++variant) {
      const float beta = variant == 0 ? 0.0f : 1.0f;
      const float alpha = (path == LowGemm::kMkl && variant == 1) ? 0.125f : 1.0f;
      const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
      const int64_t lda = ac + pad, ldb = bc + pad, ldc = N + pad;
      std::vector<float> a(ar * lda, 0.0f), b(br * ldb, 0.0f);
      std::vector<uint16_t> a16(ar * lda), b16(br * ldb);
      for (int64_t i = 0; i < ar * lda; ++i) a[i] = (float)rnd(-8, 8);
      for (int64_t i = 0; i < br * ldb; ++i) b[i] = (float)rnd(-8, 8) / 16.0f;
      for (int64_t i = 0; i < ar * lda; ++i) a16[i] = bits_of(a[i], dt);
      for (int64_t i = 0; i < br * ldb; ++i) b16[i] = bits_of(b[i], dt);
      std::vector<float> c(M * ldc);
      for (auto& x : c) x = 3.0f + (float)rnd(0, 4095) / 4096.0f;
      std::vector<float> c0 = c;
      low_gemm(path, dt, ta, tb, M, N, K, a16.data(), lda, b16.data(), ldb, alpha, beta, c.data(), ldc);
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          double s = 0.0;
          for (int64_t k = 0; k < K; ++k)
            s += (double)(ta ? a[k * lda + i] : a[i * lda + k]) * (double)(tb ? b[j * ldb + k] : b[k * ldb + j]);
          const double want = alpha * s + beta * (double)c0[i * ldc + j];
          if ((double)c[i * ldc + j] != want) return false;
        }
        for (int64_t j = N; j < ldc; ++j)  // padding untouched
          if (c[i * ldc + j] != c0[i * ldc + j]) return false;
      }
    }
  }
  return true;
}

}  // namespace

const char* low_gemm_name(LowGemm p) {
  switch (p) {
    case LowGemm::kMkl: return "mkl";
    case LowGemm::kBrgemm: return "brgemm";
    default: return "convert";
  }
}

bool low_gemm_usable(LowGemm path, at::ScalarType dt) {
  if (dt != at::kBFloat16 && dt != at::kHalf) return false;
  if (path == LowGemm::kConvert) return true;
  if (path == LowGemm::kMkl && mkl_entry(dt) == nullptr) return false;
  if (path == LowGemm::kBrgemm && dt != at::kBFloat16) return false;  // fp16 dZ needs the GEMM's alpha (scaling)
  static std::mutex mu;
  static int cache[3][2] = {{0, 0}, {0, 0}, {0, 0}};  // 0 unknown, 1 exact, -1 not
  std::lock_guard<std::mutex> lock(mu);
  int& r = cache[(int)path][dt == at::kHalf ? 1 : 0];
  if (r == 0) {
    bool ok = false;
    try {
      ok = check_exact(path, dt);
    } catch (...) {
      ok = false;
    }
    r = ok ? 1 : -1;
  }
  return r == 1;
}

LowGemm low_gemm_path(at::ScalarType dt) {
  if (dt != at::kBFloat16 && dt != at::kHalf) return LowGemm::kConvert;
  const bool bf16 = dt == at::kBFloat16;
  const char* env = std::getenv("FUSED_LCE_CPP_LOW_GEMM");
  const char* old = std::getenv("FUSED_LCE_CPP_BF16_GEMM");
  if (bf16 && old != nullptr && std::strcmp(old, "0") == 0) return LowGemm::kConvert;
  if (env != nullptr && *env != '\0' && std::strcmp(env, "auto") != 0) {
    LowGemm want = std::strcmp(env, "mkl") == 0 ? LowGemm::kMkl
                   : std::strcmp(env, "brgemm") == 0 ? LowGemm::kBrgemm : LowGemm::kConvert;
    return low_gemm_usable(want, dt) ? want : LowGemm::kConvert;
  }
  const CpuFeatures& f = cpu_features();
  const bool native = bf16 ? (f.avx512_bf16 || f.amx_bf16) : (f.avx512_fp16 || f.amx_fp16);
  if ((bf16 || native) && low_gemm_usable(LowGemm::kMkl, dt)) return LowGemm::kMkl;
  if (bf16 && native && low_gemm_usable(LowGemm::kBrgemm, dt)) return LowGemm::kBrgemm;
  return LowGemm::kConvert;
}

void low_gemm(LowGemm path, at::ScalarType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
              const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float alpha, float beta, float* C,
              int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // the libraries reject ld < 1 (D = 0): C = beta * C by hand
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  if (path == LowGemm::kMkl) {
    CblasGemm16 f = mkl_entry(dt);
    TORCH_CHECK(f != nullptr, "fused_lce: MKL's 16-bit GEMM is not in this process");
    f(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, (int)M, (int)N, (int)K, alpha, A, (int)lda, B,
      (int)ldb, beta, C, (int)ldc);
    return;
  }
  TORCH_CHECK(path == LowGemm::kBrgemm && !ta && !tb && alpha == 1.0f && (beta == 0.0f || beta == 1.0f),
              "fused_lce: unsupported 16-bit GEMM call");
#if defined(CPUBLAS_BRGEMM_BF16BF16F32) && defined(CPUBLAS_BRGEMM_F16F16F32)
  if (dt == at::kBFloat16)
    at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, beta != 0.0f, reinterpret_cast<const at::BFloat16*>(A),
                                reinterpret_cast<const at::BFloat16*>(B), C, /*is_vnni=*/false);
  else
    at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, beta != 0.0f, reinterpret_cast<const at::Half*>(A),
                                reinterpret_cast<const at::Half*>(B), C, /*is_vnni=*/false);
#else
  TORCH_CHECK(false, "fused_lce: built against a torch without 16-bit brgemm");
#endif
}

// ---------------------------------------------------------------------------------------------- float16 dZ
namespace {

// (max |x|, whether some x is inf or NaN) of a row-major block
struct Amax {
  float max = 0.0f;
  bool nonfinite = false;
};

Amax amax_scalar(const float* src, int64_t rows, int64_t cols, int64_t ld) {
  Amax r;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const float a = std::fabs(src[i * ld + j]);
      if (!(a <= std::numeric_limits<float>::max())) r.nonfinite = true;
      else if (a > r.max) r.max = a;
    }
  return r;
}

void half_scalar(const float* src, int64_t rows, int64_t cols, int64_t ld_src, uint16_t* dst, int64_t ld_dst,
                 float s) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * ld_dst + j] = c10::Half(src[i * ld_src + j] * s).x;
}

#ifdef FLCE_X86
__attribute__((target("avx2,f16c"))) Amax amax_avx2(const float* src, int64_t rows, int64_t cols, int64_t ld) {
  const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(std::numeric_limits<float>::max());
  __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  Amax r;
  for (int64_t i = 0; i < rows; ++i) {
    const float* p = src + i * ld;
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8) {
      const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(p + j));
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));  // inf or NaN
      m = _mm256_max_ps(m, a);
    }
    const Amax t = amax_scalar(p + j, 1, cols - j, ld);
    r.max = std::max(r.max, t.max);
    r.nonfinite |= t.nonfinite;
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  for (float x : lanes) r.max = std::max(r.max, x);
  r.nonfinite |= _mm256_movemask_ps(bad) != 0;
  return r;
}

__attribute__((target("avx2,f16c"))) void half_avx2(const float* src, int64_t rows, int64_t cols, int64_t ld_src,
                                                     uint16_t* dst, int64_t ld_dst, float s) {
  const __m256 vs = _mm256_set1_ps(s);
  for (int64_t i = 0; i < rows; ++i) {
    const float* p = src + i * ld_src;
    uint16_t* q = dst + i * ld_dst;
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j),
                       _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(p + j), vs), _MM_FROUND_TO_NEAREST_INT));
    half_scalar(p + j, 1, cols - j, ld_src, q + j, ld_dst, s);
  }
}
#endif

}  // namespace

float to_half_scaled(const float* src, int64_t rows, int64_t cols, int64_t ld_src, uint16_t* dst, int64_t ld_dst) {
#ifdef FLCE_X86
  const bool vec = cpu_features().avx2 && cpu_features().f16c;
#else
  const bool vec = false;
#endif
  Amax a;
#ifdef FLCE_X86
  if (vec) a = amax_avx2(src, rows, cols, ld_src);
#endif
  if (!vec) a = amax_scalar(src, rows, cols, ld_src);
  float s = 1.0f;
  // max * s in [2^14, 2^15); s <= 2^126 keeps s and 1/s normal (a block of denormals is scaled less)
  if (!a.nonfinite && a.max > 0.0f) s = std::ldexp(1.0f, std::min(14 - std::ilogb(a.max), 126));
#ifdef FLCE_X86
  if (vec) {
    half_avx2(src, rows, cols, ld_src, dst, ld_dst, s);
    return 1.0f / s;
  }
#endif
  half_scalar(src, rows, cols, ld_src, dst, ld_dst, s);
  return 1.0f / s;
}

}  // namespace fused_lce::cpu
