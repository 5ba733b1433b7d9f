// Instantiates the row kernels of rows_impl.inc once per ISA and picks one at run time.
#include "rows.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"  // the vector helpers are always inlined: no ABI crosses them
#endif

#include <cstdlib>
#include <cstring>

namespace fused_lce::cpu {

#define FLCE_NS isa_default
#define FLCE_TARGET
#include "rows_impl.inc"
#undef FLCE_NS
#undef FLCE_TARGET

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FLCE_X86 1
#define FLCE_NS isa_avx2
#define FLCE_TARGET __attribute__((target("avx2,fma")))
#include "rows_impl.inc"
#undef FLCE_NS
#undef FLCE_TARGET
#define FLCE_NS isa_avx512
#define FLCE_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")))
#include "rows_impl.inc"
#undef FLCE_NS
#undef FLCE_TARGET
#endif

namespace {

const RowKernels kDefault{&isa_default::stats, &isa_default::grad, "default"};
#ifdef FLCE_X86
const RowKernels kAvx2{&isa_avx2::stats, &isa_avx2::grad, "avx2"};
const RowKernels kAvx512{&isa_avx512::stats, &isa_avx512::grad, "avx512"};
#endif

const RowKernels* pick() {
  const char* env = std::getenv("FUSED_LCE_CPP_ISA");
  const bool any = env == nullptr || *env == '\0';
#ifdef FLCE_X86
  if ((any || std::strcmp(env, "avx512") == 0) && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return &kAvx512;
  if ((any || std::strcmp(env, "avx2") == 0 || std::strcmp(env, "avx512") == 0) && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma"))
    return &kAvx2;
#endif
  (void)any;
  return &kDefault;
}

}  // namespace

const RowKernels& row_kernels() { return *pick(); }  // getenv per call: cheap next to a tile

namespace {
template <class T>
void transpose_impl(const T* src, int64_t rows, int64_t cols, int64_t ld_src, T* dst, int64_t ld_dst) {
  constexpr int64_t B = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += B) {
    const int64_t r1 = r0 + B < rows ? r0 + B : rows;
    for (int64_t c0 = 0; c0 < cols; c0 += B) {
      const int64_t c1 = c0 + B < cols ? c0 + B : cols;
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
    }
  }
}
}  // namespace

void transpose(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst) {
  transpose_impl(src, rows, cols, ld_src, dst, ld_dst);
}
void transpose(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, uint16_t* dst, int64_t ld_dst) {
  transpose_impl(src, rows, cols, ld_src, dst, ld_dst);
}

}  // namespace fused_lce::cpu
