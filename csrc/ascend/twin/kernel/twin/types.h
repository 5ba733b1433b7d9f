// CPU twin of the AscendC API: scalar types, enums and the keyword macros of the kernel dialect.
// Written from the semantics in mirror-cann/asc-devkit's headers and docs (no code copied). The twin is a test
// tool: it runs AscendC kernel sources with g++ on a CPU and checks the rules that hardware would not report.
#ifndef FUSED_LCE_TWIN_TYPES_H_
#define FUSED_LCE_TWIN_TYPES_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

// ---- keyword macros of the kernel dialect (bisheng attributes): empty on the CPU --------------------------------
#define __aicore__
#define __global__
#define __gm__
#define __ubuf__
#define __cbuf__
#define __inout_pipe__(x)
#define __sync_alias__
#define __sync_noalias__
#define __kfc_workspace__
#define __vector__
#define __cube__
#define __mix__(a, b)
typedef uint8_t* GM_ADDR;

namespace twin {

// Bit-exact IEEE binary16 / bfloat16 with round-to-nearest-even conversions from float (NaN stays NaN).
inline uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float bits_f32(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t f32_to_bf16_rne(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_f16_rne(float f) {
    const uint32_t u = f32_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));  // NaN
    if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
    if (absu < 0x38800000u) {  // below the smallest normal half: subnormal or zero
        if (absu < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
        const uint32_t exp = absu >> 23;
        const uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - exp;  // value = mant * 2^(exp - 126) half-subnormal units (2^-24)
        const uint32_t rem = mant & ((1u << shift) - 1u);
        const uint32_t halfway = 1u << (shift - 1);
        uint32_t q = mant >> shift;
        if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
        return static_cast<uint16_t>(sign | q);
    }
    uint32_t v = absu - 0x38000000u;  // rebias exponent 127 -> 15
    v += 0xfffu + ((v >> 13) & 1u);
    return static_cast<uint16_t>(sign | (v >> 13));
}
inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        return (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(mant), -24);
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace twin

// AscendC's 16-bit float types (operands of the cube; the vector unit converts them with Cast).
struct half {
    uint16_t bits = 0;
    half() = default;
    half(float f) : bits(twin::f32_to_f16_rne(f)) {}  // NOLINT: implicit like the device type
    half(double d) : half(static_cast<float>(d)) {}   // NOLINT
    half(int i) : half(static_cast<float>(i)) {}      // NOLINT
    operator float() const { return twin::f16_to_f32(bits); }  // NOLINT
    float ToFloat() const { return twin::f16_to_f32(bits); }
    static half from_bits(uint16_t b) {
        half h;
        h.bits = b;
        return h;
    }
};
struct bfloat16_t {
    uint16_t bits = 0;
    bfloat16_t() = default;
    bfloat16_t(float f) : bits(twin::f32_to_bf16_rne(f)) {}  // NOLINT
    bfloat16_t(double d) : bfloat16_t(static_cast<float>(d)) {}  // NOLINT
    bfloat16_t(int i) : bfloat16_t(static_cast<float>(i)) {}  // NOLINT
    operator float() const { return twin::bf16_to_f32(bits); }  // NOLINT
    float ToFloat() const { return twin::bf16_to_f32(bits); }
    static bfloat16_t from_bits(uint16_t b) {
        bfloat16_t h;
        h.bits = b;
        return h;
    }
};
static_assert(sizeof(half) == 2 && sizeof(bfloat16_t) == 2, "16-bit float types");

namespace twin {
// A field of one of CANN's parameter structs (or a narrow scalar parameter of an API), declared with CANN's own type
// T. It keeps the full value the kernel assigned: CANN's struct keeps only T's low bits and the hardware reads those
// silently; the twin checks the full value at the call against T and the field's documented range
// (twin::field_value in runtime.h) and reports a value that does not fit. Converting it to T gives what CANN's field
// would hold.
template <typename T>
struct Field {
    static_assert(std::is_integral<T>::value, "integral fields only");
    Field() = default;
    template <typename U, typename std::enable_if<std::is_arithmetic<U>::value, int>::type = 0>
    constexpr Field(U u) : v(wide(u)) {}  // NOLINT: implicit, like an assignment to CANN's field
    constexpr operator T() const { return static_cast<T>(v); }  // NOLINT: the bits CANN's field would hold
    constexpr int64_t value() const { return v; }
    int64_t v;  // as assigned; unsigned values above INT64_MAX saturate (they fit no field either)

private:
    template <typename U>
    static constexpr int64_t wide(U u) {
        if constexpr (std::is_floating_point<U>::value) {
            return static_cast<int64_t>(u);
        } else if constexpr (std::is_unsigned<U>::value && sizeof(U) >= sizeof(int64_t)) {
            return u > static_cast<U>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
        } else {
            return static_cast<int64_t>(u);
        }
    }
};

template <typename T>
inline float to_f32(T v) {
    return static_cast<float>(v);
}
template <typename T>
inline T from_f32(float f) {
    return static_cast<T>(f);
}
}  // namespace twin

// Pipes of an AI core (a compiler builtin type in the global namespace on the NPU). AIV: S (scalar), V (vector),
// MTE2 (GM -> UB), MTE3 (UB -> GM). AIC: M (cube), MTE1, FIX.
enum pipe_t : uint8_t { PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_FIX = 9 };

// Matmul formats live in the global namespace (asc-devkit include/adv_api/matmul/matmul_config.h).
enum class CubeFormat { ND = 0, NZ, ZN, ZZ, NN, ND_ALIGN, SCALAR, VECTOR, ROW_MAJOR = ND, COLUMN_MAJOR };
enum class LayoutMode { NONE = 0, BSNGD, SBNGD, BNGS1S2, NORMAL };

namespace AscendC {

// Logical positions (asc-devkit docs: 通用说明和约束, TPosition -> physical memory).
enum class TPosition : uint8_t {
    GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC, LCM = VECCALC, SPM, SHM = SPM, TSCM, C2PIPE2GM,
    C2PIPE2LOCAL, MAX,
};
using QuePosition = TPosition;
enum class Hardware : uint8_t { GM, UB, L1, L0A, L0B, L0C, BIAS, FIXBUF, MAX };
using ::CubeFormat;
using ::LayoutMode;

using ::pipe_t;
using ::PIPE_S;
using ::PIPE_V;
using ::PIPE_M;
using ::PIPE_MTE1;
using ::PIPE_MTE2;
using ::PIPE_MTE3;
using ::PIPE_ALL;
using ::PIPE_FIX;

// <source pipe>_<destination pipe>: the destination waits for the source (SetFlag-WaitFlag(ISASI).md).
enum class HardEvent : uint8_t {
    MTE2_MTE1, MTE1_MTE2, MTE1_M, M_MTE1, MTE2_V, V_MTE2, MTE3_V, V_MTE3, M_V, V_M, V_V, MTE3_MTE1, MTE1_MTE3,
    MTE1_V, MTE2_M, M_MTE2, V_MTE1, M_FIX, FIX_M, MTE3_MTE2, MTE2_MTE3, S_V, V_S, S_MTE2, MTE2_S, S_MTE3, MTE3_S,
    MTE2_FIX, FIX_MTE2, FIX_S, M_S, FIX_MTE3, MTE1_FIX, FIX_MTE1, FIX_FIX, MAX,
};
enum TEventID : int32_t {};
using event_t = int32_t;
constexpr int32_t EVENT_ID0 = 0, EVENT_ID1 = 1, EVENT_ID2 = 2, EVENT_ID3 = 3, EVENT_ID4 = 4, EVENT_ID5 = 5,
                  EVENT_ID6 = 6, EVENT_ID7 = 7;

enum class RoundMode { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD, CAST_HYBRID };
enum class CacheLine : uint8_t { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE };
enum class DcciDst : uint8_t { CACHELINE_ALL = 0, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };

// KERNEL_TASK_TYPE_DEFAULT values (kernel_operator.h).
enum KernelMetaType : int {
    KERNEL_TYPE_AIV_ONLY = 0, KERNEL_TYPE_AIC_ONLY, KERNEL_TYPE_MIX_AIV_1_0, KERNEL_TYPE_MIX_AIC_1_0,
    KERNEL_TYPE_MIX_AIC_1_1, KERNEL_TYPE_MIX_AIC_1_2,
};

template <typename T, typename U>
struct IsSameType {
    static constexpr bool value = std::is_same<T, U>::value;
};
template <typename T>
using PrimT = T;

constexpr uint32_t ONE_BLK_SIZE = 32;          // bytes of one UB data block
constexpr uint32_t DEFAULT_BLK_NUM = 8;        // data blocks of one vector repeat
constexpr uint8_t DEFAULT_BLK_STRIDE = 1;
constexpr uint8_t DEFAULT_REPEAT_STRIDE = 8;
enum class ReduceType : uint8_t { SUM = 0, MAX, MIN };
enum class ReduceOrder : uint8_t { ORDER_VALUE_INDEX = 0, ORDER_INDEX_VALUE, ORDER_ONLY_VALUE, ORDER_ONLY_INDEX };
enum class CMPMODE : uint8_t { LT = 0, GT, EQ, LE, GE, NE };
enum class SELMODE : uint8_t { VSEL_CMPMASK_SPR = 0, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };
constexpr uint32_t ONE_REPEAT_BYTE_SIZE = 256;  // bytes one vector repeat reads
constexpr uint32_t DEFAULT_C0_SIZE = 32;

}  // namespace AscendC

#endif  // FUSED_LCE_TWIN_TYPES_H_
