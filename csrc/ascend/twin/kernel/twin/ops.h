// CPU twin of the AscendC API: data movement (DataCopy / DataCopyPad) and the vector ("tensor前n个数据计算",
// count-based) APIs the kernels use. Contracts from asc-devkit docs/zh/api/SIMD-API/基础API: 通用说明和约束 (UB
// operands 32-byte aligned, overlap rules), 数据搬运/DataCopy*.md (count * sizeof(T) a multiple of 32 bytes, strides in
// 32-byte blocks on the UB side and bytes on the GM side for DataCopyPad, dummy fill), 归约计算/ReduceMax.md /
// ReduceSum.md (index stored as the bits of the value type, first index on ties, sharedTmpBuffer sizes, Atlas A2
// level-2 ReduceSum: binary tree inside a 256-byte repeat, repeats added in order), 类型转换/Cast.md (round modes
// per type pair on Atlas A2), 高阶API Tanh (no src/dst overlap, y = (e^2x - 1) / (e^2x + 1) on x clipped to +-8.8,
// impl/adv_api/detail/math/tanh/tanh_common_impl.h).
#ifndef FUSED_LCE_TWIN_OPS_H_
#define FUSED_LCE_TWIN_OPS_H_

#include "tensor.h"

namespace AscendC {

// ---- parameter structs (basic_api/kernel_struct_data_copy.h, kernel_struct_fixpipe.h) ---------------------------
// Fields have CANN's own types, as twin::Field: the full value assigned is kept and checked at the call against the
// type and the documented range (docs/npu-twin-rules.md lists every rule and its probe). Constructors take any
// integer so that a too-large value reaches the check instead of being cut by the conversion.
using twin::Field;
struct DataCopyParams {
    DataCopyParams() {}
    DataCopyParams(Field<uint16_t> count, Field<uint16_t> len, Field<uint16_t> srcStrideIn, Field<uint16_t> dstStrideIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn) {}
    Field<uint16_t> blockCount = 1;
    Field<uint16_t> blockLen = 0;
    union {
        Field<uint16_t> srcGap;
        Field<uint16_t> srcStride{0};
    };
    union {
        Field<uint16_t> dstGap;
        Field<uint16_t> dstStride{0};
    };
};
struct DataCopyExtParams {
    DataCopyExtParams() {}
    DataCopyExtParams(Field<uint16_t> count, Field<uint32_t> len, Field<uint32_t> srcStrideIn,
                      Field<uint32_t> dstStrideIn, Field<uint32_t> rsvIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn), rsv(rsvIn) {}
    Field<uint16_t> blockCount = 1;
    Field<uint32_t> blockLen = 0;
    Field<uint32_t> srcStride = 0;
    Field<uint32_t> dstStride = 0;
    Field<uint32_t> rsv = 0;
};
struct DataCopyPadParams {
    DataCopyPadParams() {}
    DataCopyPadParams(const bool isPadValue, Field<uint8_t> leftPadValue, Field<uint8_t> rightPadValue,
                      const uint64_t padValue)
        : isPad(isPadValue), leftPadding(leftPadValue), rightPadding(rightPadValue), paddingValue(padValue) {}
    bool isPad = false;
    Field<uint8_t> leftPadding = 0;
    Field<uint8_t> rightPadding = 0;
    uint64_t paddingValue = 0;
};
template <typename T>
struct DataCopyPadExtParams {
    DataCopyPadExtParams() {}
    DataCopyPadExtParams(const bool isPadValue, Field<uint8_t> leftPadValue, Field<uint8_t> rightPadValue, T padValue)
        : isPad(isPadValue), leftPadding(leftPadValue), rightPadding(rightPadValue), paddingValue(padValue) {}
    bool isPad = false;
    Field<uint8_t> leftPadding = 0;
    Field<uint8_t> rightPadding = 0;
    T paddingValue = T(0);
};
// GM -> L1 copy with ND -> NZ conversion (the Matmul model's operand loads on dav-2201; the twin has no public L1
// tensors, so only lib/matmul_intf.h issues it).
struct Nd2NzParams {
    Nd2NzParams() {}
    Nd2NzParams(Field<uint16_t> ndNumIn, Field<uint16_t> nValueIn, Field<uint16_t> dValueIn,
                Field<uint16_t> srcNdMatrixStrideIn, Field<uint16_t> srcDValueIn, Field<uint16_t> dstNzC0StrideIn,
                Field<uint16_t> dstNzNStrideIn, Field<uint16_t> dstNzMatrixStrideIn)
        : ndNum(ndNumIn), nValue(nValueIn), dValue(dValueIn), srcNdMatrixStride(srcNdMatrixStrideIn),
          srcDValue(srcDValueIn), dstNzC0Stride(dstNzC0StrideIn), dstNzNStride(dstNzNStrideIn),
          dstNzMatrixStride(dstNzMatrixStrideIn) {}
    Field<uint16_t> ndNum = 1;
    Field<uint16_t> nValue = 0;
    Field<uint16_t> dValue = 0;
    Field<uint16_t> srcNdMatrixStride = 0;
    Field<uint16_t> srcDValue = 0;
    Field<uint16_t> dstNzC0Stride = 0;
    Field<uint16_t> dstNzNStride = 0;
    Field<uint16_t> dstNzMatrixStride = 0;
};
// L0C -> GM through the fixpipe (FixpipeParamsV220; the Matmul model's output copies, NZ2ND).
struct FixpipeParamsV220 {
    FixpipeParamsV220() {}
    Field<uint16_t> nSize = 0;
    Field<uint16_t> mSize = 0;
    Field<uint16_t> srcStride = 0;
    Field<uint32_t> dstStride = 0;
    Field<uint16_t> ndNum = 1;
    Field<uint16_t> srcNdStride = 0;
    Field<uint16_t> dstNdStride = 0;
    bool reluEn = false;
    Field<uint8_t> unitFlag = 0;
};

namespace twin_ops {
// Documents the field rules cite (asc-devkit docs/zh/api/SIMD-API/基础API/...).
constexpr const char* kDocCopyPadIn = "DataCopyPad(GMToUB).md, DataCopyExtParams";
constexpr const char* kDocCopyPadOut = "DataCopyPad(UBToGM).md, DataCopyExtParams";
constexpr const char* kDocCopy = "DataCopy(GM and UB).md, DataCopyParams";
constexpr const char* kDocNd2Nz = "DataCopy(GMToL1 ND2NZ).md, Nd2NzParams";
constexpr const char* kDocFixpipe = "Fixpipe(L0C to GM).md, FixpipeParamsV220 with NZ2ND";
constexpr const char* kDocRepeat = "SIMD计算说明/高维切分.md: repeatTime in [0, 255], strides of the repeat params";

// Checks an Nd2NzParams at a GM -> L1 ND2NZ copy (kernel_struct_data_copy.h types; ranges of the GMToL1 ND2NZ doc).
inline void check_nd2nz(const Nd2NzParams& p, const char* api, const twin::Loc& loc) {
    twin::field_value(loc, api, "Nd2NzParams::ndNum", p.ndNum, 0, 4095, kDocNd2Nz);
    twin::field_value(loc, api, "Nd2NzParams::nValue", p.nValue, 0, 16384, kDocNd2Nz);
    twin::field_value(loc, api, "Nd2NzParams::dValue", p.dValue, 0, 65535, kDocNd2Nz);
    twin::field_value(loc, api, "Nd2NzParams::srcNdMatrixStride", p.srcNdMatrixStride, 0, 65535, kDocNd2Nz);
    twin::field_value(loc, api, "Nd2NzParams::srcDValue", p.srcDValue, 1, 65535, kDocNd2Nz);
    twin::field_value(loc, api, "Nd2NzParams::dstNzC0Stride", p.dstNzC0Stride, 1, 16384, kDocNd2Nz);
    twin::field_value(loc, api, "Nd2NzParams::dstNzNStride", p.dstNzNStride, 1, 16384, kDocNd2Nz);
    twin::field_value(loc, api, "Nd2NzParams::dstNzMatrixStride", p.dstNzMatrixStride, 0, 16384, kDocNd2Nz);
}
// Checks a FixpipeParamsV220 of an NZ2ND copy to GM: nSize in [0, 4095] (the Matmul library passes an ND tile's own
// width, copy_cube_out_utils.h FixpipeParamsUtil), mSize in [0, 8192], srcStride in C0 units, dstStride (ND:
// elements per destination row) not 0.
inline void check_fixpipe(const FixpipeParamsV220& p, const char* api, const twin::Loc& loc) {
    twin::field_value(loc, api, "FixpipeParamsV220::nSize", p.nSize, 0, 4095, kDocFixpipe);
    twin::field_value(loc, api, "FixpipeParamsV220::mSize", p.mSize, 0, 8192, kDocFixpipe);
    twin::field_value(loc, api, "FixpipeParamsV220::srcStride", p.srcStride, kDocFixpipe);
    twin::field_value(loc, api, "FixpipeParamsV220::dstStride", p.dstStride, 1, UINT32_MAX, kDocFixpipe);
    twin::field_value(loc, api, "FixpipeParamsV220::ndNum", p.ndNum, 1, 65535, kDocFixpipe);
}
}  // namespace twin_ops

namespace twin_ops {
using twin::Loc;

template <typename T>
inline void check_ub(const LocalTensor<T>& t, uint64_t elems, const char* api, const Loc& loc, const char* role,
                     uint32_t align = ONE_BLK_SIZE) {
    t.check_owner(api, loc);
    if (!twin_detail::is_ub_pos(t.pos_)) twin::fail_at(loc, api, "%s operand is not in the unified buffer", role);
    if (t.offset() % align != 0)
        twin::fail_at(loc, api, "%s operand at UB offset %llu is not %u-byte aligned", role,
                      static_cast<unsigned long long>(t.offset()), align);
    if (elems > t.GetSize())
        twin::fail_at(loc, api, "%s operand: %llu elements exceed its LocalTensor length %u (UB offset %llu)", role,
                      static_cast<unsigned long long>(elems), t.GetSize(),
                      static_cast<unsigned long long>(t.offset()));
}
template <typename T, typename U>
inline void check_overlap(const LocalTensor<T>& dst, uint64_t dn, const LocalTensor<U>& src, uint64_t sn,
                          const char* api, const Loc& loc, bool allow_same_start = true) {
    const uint64_t d0 = dst.offset(), d1 = d0 + dn * sizeof(T), s0 = src.offset(), s1 = s0 + sn * sizeof(U);
    if (d0 < s1 && s0 < d1 && !(allow_same_start && d0 == s0))
        twin::fail_at(loc, api, "destination [%llu, %llu) and source [%llu, %llu) UB bytes overlap partially",
                      static_cast<unsigned long long>(d0), static_cast<unsigned long long>(d1),
                      static_cast<unsigned long long>(s0), static_cast<unsigned long long>(s1));
}
template <typename T>
inline void rd(twin::Core& c, const LocalTensor<T>& t, uint64_t bytes, int pipe, uint32_t e, uint16_t site,
               const char* api, const Loc& loc) {
    twin::ub_access(c, t.offset(), bytes, pipe, false, e, site, api, loc);
}
template <typename T>
inline void wr(twin::Core& c, const LocalTensor<T>& t, uint64_t bytes, int pipe, uint32_t e, uint16_t site,
               const char* api, const Loc& loc) {
    twin::ub_access(c, t.offset(), bytes, pipe, true, e, site, api, loc);
}
template <typename T>
inline T* ptr(const LocalTensor<T>& t) {
    return reinterpret_cast<T*>(t.addr_);
}
template <typename T>
inline bool is_float_like() {
    return IsSameType<T, float>::value || IsSameType<T, half>::value;
}

// GM side of a DMA: bounds, read-only inputs, ordering with this core's earlier GM writes, cross-core races.
template <typename T>
inline twin::Region& gm_side(twin::Core& c, const GlobalTensor<T>& g, uint64_t lo_bytes, uint64_t span, bool write,
                             bool atomic, int pipe, const char* api, const Loc& loc) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(g.GetPhyAddr()) + lo_bytes;
    if (g.GetSize() != 0 && lo_bytes + span > g.GetSize() * sizeof(T))
        twin::fail_at(loc, api, "GM range of %llu bytes exceeds the GlobalTensor size of %llu elements",
                      static_cast<unsigned long long>(lo_bytes + span),
                      static_cast<unsigned long long>(g.GetSize()));
    twin::Region& r = twin::gm_bounds(a, span, write, api, loc);
    (write ? c.cnt.gm_wr : c.cnt.gm_rd) += span;
    twin::dcache_dma_check(c, a, span, api, loc);
    twin::gm_race(r, a, span, write, atomic, c, pipe, c.clk.epoch[pipe], twin::site_id(api, loc), api, loc);
    return r;
}

// One DMA write of `n` bytes to GM, honouring the core's atomic mode.
template <typename T>
inline void gm_store(twin::Core& c, uint8_t* dst, const uint8_t* src, uint64_t n, const char* api, const Loc& loc) {
    if (c.atomic == 0) {
        std::memcpy(dst, src, n);
        return;
    }
    if (c.atomic_elt != static_cast<int>(sizeof(T)))
        twin::fail_at(loc, api, "SetAtomicAdd element type (%d bytes) does not match the copied type (%zu bytes)",
                      c.atomic_elt, sizeof(T));
    for (uint64_t i = 0; i + sizeof(T) <= n; i += sizeof(T)) {
        T a, b;
        std::memcpy(&a, dst + i, sizeof(T));
        std::memcpy(&b, src + i, sizeof(T));
        T s;
        if constexpr (std::is_integral<T>::value) {
            s = static_cast<T>(a + b);
        } else {
            s = T(twin::to_f32(a) + twin::to_f32(b));
        }
        std::memcpy(dst + i, &s, sizeof(T));
    }
}
inline void note_mte3(twin::Core& c, uintptr_t a, uint64_t n, uint32_t e, uint16_t site) {
    if (twin::rt().cfg.hazards && n) c.pending_mte3.push_back({a, a + n, e, site});
}
}  // namespace twin_ops

namespace twin_ops {
// The checked fields of a DataCopyParams (blockCount in [1, 4095], blockLen in 32-byte blocks, gaps in 32-byte
// blocks, all uint16_t), and of the params the count form builds (blockLen = count * sizeof(T) / 32).
struct CopyBlocks {
    uint64_t count, len, src_gap, dst_gap;
};
inline CopyBlocks copy_blocks(const DataCopyParams& p, const char* api, const Loc& loc) {
    CopyBlocks k;
    k.count = twin::field_value(loc, api, "DataCopyParams::blockCount", p.blockCount, 1, 4095, kDocCopy);
    k.len = twin::field_value(loc, api, "DataCopyParams::blockLen", p.blockLen, 1, 65535, kDocCopy);
    k.src_gap = twin::field_value(loc, api, "DataCopyParams::srcStride", p.srcStride, kDocCopy);
    k.dst_gap = twin::field_value(loc, api, "DataCopyParams::dstStride", p.dstStride, kDocCopy);
    return k;
}
template <typename T>
inline void count_fits(uint64_t count, const char* api, const Loc& loc) {
    twin::field_value(loc, api, "DataCopyParams::blockLen (count * sizeof(T) / 32)",
                      Field<uint16_t>(count * sizeof(T) / ONE_BLK_SIZE), 0, 65535, kDocCopy);
}
}  // namespace twin_ops

// ---- DataCopy: contiguous, 32-byte multiples -------------------------------------------------------------------
template <typename T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count,
                                twin::Loc loc = {}) {
    static const char* api = "DataCopy(GM->UB)";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin::yield_point();
    const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(T);
    if (bytes % ONE_BLK_SIZE != 0)
        twin::fail_at(loc, api,
                      "count * sizeof(T) = %llu bytes is not a multiple of 32 (the hardware would round it down); "
                      "use DataCopyPad",
                      static_cast<unsigned long long>(bytes));
    twin_ops::count_fits<T>(count, api, loc);
    twin_ops::check_ub(dst, count, api, loc, "destination");
    const uint32_t e = twin::issue(c, twin::kMTE2);
    const uint16_t site = twin::site_id(api, loc);
    twin_ops::gm_side(c, src, 0, bytes, false, false, twin::kMTE2, api, loc);
    twin_ops::wr(c, dst, bytes, twin::kMTE2, e, site, api, loc);
    std::memcpy(dst.addr_, src.GetPhyAddr(), bytes);
}
template <typename T>
__aicore__ inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count,
                                twin::Loc loc = {}) {
    static const char* api = "DataCopy(UB->GM)";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin::yield_point();
    const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(T);
    if (bytes % ONE_BLK_SIZE != 0)
        twin::fail_at(loc, api,
                      "count * sizeof(T) = %llu bytes is not a multiple of 32 (the hardware would round it down); "
                      "use DataCopyPad",
                      static_cast<unsigned long long>(bytes));
    twin_ops::count_fits<T>(count, api, loc);
    twin_ops::check_ub(src, count, api, loc, "source");
    const uint32_t e = twin::issue(c, twin::kMTE3);
    const uint16_t site = twin::site_id(api, loc);
    twin_ops::rd(c, src, bytes, twin::kMTE3, e, site, api, loc);
    twin_ops::gm_side(c, dst, 0, bytes, true, c.atomic != 0, twin::kMTE3, api, loc);
    twin_ops::gm_store<T>(c, reinterpret_cast<uint8_t*>(dst.GetPhyAddr()), src.addr_, bytes, api, loc);
    twin_ops::note_mte3(c, reinterpret_cast<uintptr_t>(dst.GetPhyAddr()), bytes, e, site);
}
// Strided form: blockCount blocks of blockLen 32-byte units, gaps in 32-byte units on both sides.
template <typename T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p,
                                twin::Loc loc = {}) {
    static const char* api = "DataCopy(GM->UB, params)";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin::yield_point();
    const twin_ops::CopyBlocks k = twin_ops::copy_blocks(p, api, loc);
    const uint64_t blk = k.len * ONE_BLK_SIZE;
    const uint64_t ub_span = k.count ? (k.count - 1) * (blk + k.dst_gap * 32ull) + blk : 0;
    const uint64_t gm_step = blk + k.src_gap * 32ull;
    twin_ops::check_ub(dst, ub_span / sizeof(T), api, loc, "destination");
    const uint32_t e = twin::issue(c, twin::kMTE2);
    const uint16_t site = twin::site_id(api, loc);
    for (uint64_t b = 0; b < k.count; ++b) {
        twin_ops::gm_side(c, src, b * gm_step, blk, false, false, twin::kMTE2, api, loc);
        const uint64_t uoff = b * (blk + k.dst_gap * 32ull);
        twin::ub_access(c, dst.offset() + uoff, blk, twin::kMTE2, true, e, site, api, loc);
        std::memcpy(dst.addr_ + uoff, reinterpret_cast<const uint8_t*>(src.GetPhyAddr()) + b * gm_step, blk);
    }
}
template <typename T>
__aicore__ inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p,
                                twin::Loc loc = {}) {
    static const char* api = "DataCopy(UB->GM, params)";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin::yield_point();
    const twin_ops::CopyBlocks k = twin_ops::copy_blocks(p, api, loc);
    const uint64_t blk = k.len * ONE_BLK_SIZE;
    const uint64_t ub_span = k.count ? (k.count - 1) * (blk + k.src_gap * 32ull) + blk : 0;
    const uint64_t gm_step = blk + k.dst_gap * 32ull;
    twin_ops::check_ub(src, ub_span / sizeof(T), api, loc, "source");
    const uint32_t e = twin::issue(c, twin::kMTE3);
    const uint16_t site = twin::site_id(api, loc);
    for (uint64_t b = 0; b < k.count; ++b) {
        const uint64_t uoff = b * (blk + k.src_gap * 32ull);
        twin::ub_access(c, src.offset() + uoff, blk, twin::kMTE3, false, e, site, api, loc);
        twin_ops::gm_side(c, dst, b * gm_step, blk, true, c.atomic != 0, twin::kMTE3, api, loc);
        uint8_t* g = reinterpret_cast<uint8_t*>(dst.GetPhyAddr()) + b * gm_step;
        twin_ops::gm_store<T>(c, g, src.addr_ + uoff, blk, api, loc);
        twin_ops::note_mte3(c, reinterpret_cast<uintptr_t>(g), blk, e, site);
    }
}
// UB -> UB copy, executed by the vector unit in this model (the twin's kernels do not use it; fidelity samples may).
template <typename T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count,
                                twin::Loc loc = {}) {
    static const char* api = "DataCopy(UB->UB)";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(T);
    if (bytes % ONE_BLK_SIZE != 0)
        twin::fail_at(loc, api, "count * sizeof(T) = %llu bytes is not a multiple of 32",
                      static_cast<unsigned long long>(bytes));
    twin_ops::check_ub(dst, count, api, loc, "destination");
    twin_ops::check_ub(src, count, api, loc, "source");
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    twin_ops::rd(c, src, bytes, twin::kV, e, site, api, loc);
    twin_ops::wr(c, dst, bytes, twin::kV, e, site, api, loc);
    std::memmove(dst.addr_, src.addr_, bytes);
}

// ---- DataCopyPad: byte-granular blocks --------------------------------------------------------------------------
namespace twin_ops {
template <typename T>
inline void pad_in(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint64_t count, uint64_t len,
                   uint64_t src_gap, uint64_t dst_gap_blocks, bool is_pad, uint8_t left, uint8_t right, T value,
                   const char* api, const Loc& loc) {
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin::yield_point();
    if (len % sizeof(T) != 0)
        twin::fail_at(loc, api, "blockLen %llu is not a multiple of sizeof(T)", static_cast<unsigned long long>(len));
    if (left * sizeof(T) > 32 || right * sizeof(T) > 32)
        twin::fail_at(loc, api, "left/right padding may not exceed 32 bytes");
    if (count == 0 || len == 0) return;  // NOP (Atlas A2)
    const uint64_t row = left * sizeof(T) + len + right * sizeof(T);
    const uint64_t row_ub = (row + 31) / 32 * 32;
    const uint64_t step = row_ub + dst_gap_blocks * 32;
    const uint64_t span = (count - 1) * step + row_ub;
    check_ub(dst, 0, api, loc, "destination");
    if (span > dst.len_)
        twin::fail_at(loc, api, "writes %llu UB bytes but the destination LocalTensor has %u",
                      static_cast<unsigned long long>(span), dst.len_);
    const uint32_t e = twin::issue(c, twin::kMTE2);
    const uint16_t site = twin::site_id(api, loc);
    for (uint64_t b = 0; b < count; ++b) {
        const uint64_t goff = b * (static_cast<uint64_t>(len) + src_gap);
        gm_side(c, src, goff, len, false, false, twin::kMTE2, api, loc);
        uint8_t* u = dst.addr_ + b * step;
        twin::ub_access(c, dst.offset() + b * step, row_ub, twin::kMTE2, true, e, site, api, loc);
        const uint8_t* g = reinterpret_cast<const uint8_t*>(src.GetPhyAddr()) + goff;
        T fill = value;
        if (!is_pad) {
            if (left == 0 && right == 0) {
                std::memcpy(&fill, g, sizeof(T));  // dummy = the block's first element (DataCopyPad GMToUB docs)
            } else {
                std::memset(static_cast<void*>(&fill), 0xff, sizeof(T));  // unspecified values: NaN / -1 in the twin
            }
        }
        for (uint64_t i = 0; i < row_ub; i += sizeof(T)) std::memcpy(u + i, &fill, sizeof(T));
        std::memcpy(u + left * sizeof(T), g, len);
        if (!is_pad && (left || right)) {
            T junk;
            std::memset(static_cast<void*>(&junk), 0xff, sizeof(T));
            for (uint64_t i = 0; i < row_ub; i += sizeof(T))
                if (i < left * sizeof(T) || i >= left * sizeof(T) + len) std::memcpy(u + i, &junk, sizeof(T));
        }
    }
}
template <typename T>
inline void pad_out(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint64_t count, uint64_t len,
                    uint64_t src_gap_blocks, uint64_t dst_gap, const char* api, const Loc& loc) {
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin::yield_point();
    if (len % sizeof(T) != 0)
        twin::fail_at(loc, api, "blockLen %llu is not a multiple of sizeof(T)", static_cast<unsigned long long>(len));
    if (count == 0 || len == 0) return;
    const uint64_t row_ub = (static_cast<uint64_t>(len) + 31) / 32 * 32;
    const uint64_t step = row_ub + src_gap_blocks * 32;
    const uint64_t span = (count - 1) * step + len;
    check_ub(src, 0, api, loc, "source");
    if (span > src.len_)
        twin::fail_at(loc, api, "reads %llu UB bytes but the source LocalTensor has %u",
                      static_cast<unsigned long long>(span), src.len_);
    const uint32_t e = twin::issue(c, twin::kMTE3);
    const uint16_t site = twin::site_id(api, loc);
    for (uint64_t b = 0; b < count; ++b) {
        const uint64_t goff = b * (static_cast<uint64_t>(len) + dst_gap);
        twin::ub_access(c, src.offset() + b * step, len, twin::kMTE3, false, e, site, api, loc);
        gm_side(c, dst, goff, len, true, c.atomic != 0, twin::kMTE3, api, loc);
        uint8_t* g = reinterpret_cast<uint8_t*>(dst.GetPhyAddr()) + goff;
        gm_store<T>(c, g, src.addr_ + b * step, len, api, loc);
        note_mte3(c, reinterpret_cast<uintptr_t>(g), len, e, site);
    }
}
}  // namespace twin_ops

namespace twin_ops {
// DataCopyPad's block fields: DataCopyExtParams (blockCount in [0, 4095], blockLen in [0, 2097151] bytes, uint32
// strides) or DataCopyParams (uint16 fields, blockLen in bytes); padding counts in elements (uint8).
struct PadBlocks {
    uint64_t count, len, src_gap, dst_gap;
};
inline PadBlocks pad_blocks(const DataCopyExtParams& p, bool in, const char* api, const Loc& loc) {
    const char* doc = in ? kDocCopyPadIn : kDocCopyPadOut;
    PadBlocks k;
    k.count = twin::field_value(loc, api, "DataCopyExtParams::blockCount", p.blockCount, 0, 4095, doc);
    k.len = twin::field_value(loc, api, "DataCopyExtParams::blockLen", p.blockLen, 0, 2097151, doc);
    k.src_gap = twin::field_value(loc, api, "DataCopyExtParams::srcStride", p.srcStride, doc);
    k.dst_gap = twin::field_value(loc, api, "DataCopyExtParams::dstStride", p.dstStride, doc);
    return k;
}
inline PadBlocks pad_blocks(const DataCopyParams& p, bool in, const char* api, const Loc& loc) {
    const char* doc = in ? kDocCopyPadIn : kDocCopyPadOut;
    PadBlocks k;
    k.count = twin::field_value(loc, api, "DataCopyParams::blockCount", p.blockCount, 0, 4095, doc);
    k.len = twin::field_value(loc, api, "DataCopyParams::blockLen", p.blockLen, doc);
    k.src_gap = twin::field_value(loc, api, "DataCopyParams::srcStride", p.srcStride, doc);
    k.dst_gap = twin::field_value(loc, api, "DataCopyParams::dstStride", p.dstStride, doc);
    return k;
}
inline uint8_t padding(const Field<uint8_t>& f, const char* name, const char* api, const Loc& loc) {
    return static_cast<uint8_t>(twin::field_value(loc, api, name, f, kDocCopyPadIn));
}
}  // namespace twin_ops

template <typename T>
__aicore__ inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src,
                                   const DataCopyExtParams& p, const DataCopyPadExtParams<T>& pad,
                                   twin::Loc loc = {}) {
    static const char* api = "DataCopyPad(GM->UB)";
    const twin_ops::PadBlocks k = twin_ops::pad_blocks(p, true, api, loc);
    twin_ops::pad_in(dst, src, k.count, k.len, k.src_gap, k.dst_gap, pad.isPad,
                     twin_ops::padding(pad.leftPadding, "DataCopyPadExtParams::leftPadding", api, loc),
                     twin_ops::padding(pad.rightPadding, "DataCopyPadExtParams::rightPadding", api, loc),
                     pad.paddingValue, api, loc);
}
template <typename T>
__aicore__ inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p,
                                   const DataCopyPadParams& pad, twin::Loc loc = {}) {
    static const char* api = "DataCopyPad(GM->UB)";
    T v;
    std::memset(static_cast<void*>(&v), 0, sizeof(T));
    std::memcpy(&v, &pad.paddingValue, sizeof(T) < 8 ? sizeof(T) : 8);
    const twin_ops::PadBlocks k = twin_ops::pad_blocks(p, true, api, loc);
    twin_ops::pad_in(dst, src, k.count, k.len, k.src_gap, k.dst_gap, pad.isPad,
                     twin_ops::padding(pad.leftPadding, "DataCopyPadParams::leftPadding", api, loc),
                     twin_ops::padding(pad.rightPadding, "DataCopyPadParams::rightPadding", api, loc), v, api, loc);
}
template <typename T>
__aicore__ inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src,
                                   const DataCopyExtParams& p, twin::Loc loc = {}) {
    static const char* api = "DataCopyPad(UB->GM)";
    const twin_ops::PadBlocks k = twin_ops::pad_blocks(p, false, api, loc);
    twin_ops::pad_out(dst, src, k.count, k.len, k.src_gap, k.dst_gap, api, loc);
}
template <typename T>
__aicore__ inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p,
                                   twin::Loc loc = {}) {
    static const char* api = "DataCopyPad(UB->GM)";
    const twin_ops::PadBlocks k = twin_ops::pad_blocks(p, false, api, loc);
    twin_ops::pad_out(dst, src, k.count, k.len, k.src_gap, k.dst_gap, api, loc);
}

// ---- vector unit: element-wise ---------------------------------------------------------------------------------
namespace twin_ops {
template <typename T>
inline void require_vec_type(const char* api, const Loc& loc) {
    if (IsSameType<T, bfloat16_t>::value)
        twin::fail_at(loc, api, "bfloat16_t is not a vector arithmetic type on Atlas A2 (Cast to float first)");
}
// dst[i] = f(src[i]) for i < count, computed in float for half / float, natively for integers.
template <typename T, typename F>
inline void unary(const char* api, const LocalTensor<T>& dst, const LocalTensor<T>& src, int32_t count, F f,
                  const Loc& loc, bool allow_overlap = true) {
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    require_vec_type<T>(api, loc);
    if (count < 0) twin::fail_at(loc, api, "negative count");
    check_ub(dst, count, api, loc, "destination");
    check_ub(src, count, api, loc, "source");
    check_overlap(dst, count, src, count, api, loc, allow_overlap);
    if (count == 0) return;  // NOP on Atlas A2
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    rd(c, src, count * sizeof(T), twin::kV, e, site, api, loc);
    wr(c, dst, count * sizeof(T), twin::kV, e, site, api, loc);
    T* d = ptr(dst);
    const T* s = ptr(src);
    for (int32_t i = 0; i < count; ++i) d[i] = f(s[i]);
}
template <typename T, typename F>
inline void binary(const char* api, const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b,
                   int32_t count, F f, const Loc& loc) {
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    require_vec_type<T>(api, loc);
    if (count < 0) twin::fail_at(loc, api, "negative count");
    check_ub(dst, count, api, loc, "destination");
    check_ub(a, count, api, loc, "source 0");
    check_ub(b, count, api, loc, "source 1");
    check_overlap(dst, count, a, count, api, loc);
    check_overlap(dst, count, b, count, api, loc);
    if (count == 0) return;
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    rd(c, a, count * sizeof(T), twin::kV, e, site, api, loc);
    rd(c, b, count * sizeof(T), twin::kV, e, site, api, loc);
    wr(c, dst, count * sizeof(T), twin::kV, e, site, api, loc);
    T* d = ptr(dst);
    const T* x = ptr(a);
    const T* y = ptr(b);
    for (int32_t i = 0; i < count; ++i) d[i] = f(x[i], y[i]);
}
template <typename T>
inline T from(float v) {
    return static_cast<T>(v);
}
template <typename T>
inline float f(T v) {
    return static_cast<float>(v);
}
}  // namespace twin_ops

#define TWIN_BINARY(NAME, EXPR_FLOAT, EXPR_INT)                                                                     \
    template <typename T, bool isSetMask = true>                                                                    \
    __aicore__ inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
                                const int32_t& count, twin::Loc loc = {}) {                                         \
        twin_ops::binary(#NAME, dst, src0, src1, count,                                                             \
                         [](T x, T y) -> T {                                                                        \
                             if constexpr (std::is_integral<T>::value) {                                            \
                                 return static_cast<T>(EXPR_INT);                                                   \
                             } else {                                                                               \
                                 const float a = twin_ops::f(x), b = twin_ops::f(y);                                \
                                 return twin_ops::from<T>(EXPR_FLOAT);                                              \
                             }                                                                                      \
                         },                                                                                         \
                         loc);                                                                                      \
    }
TWIN_BINARY(Add, a + b, x + y)
TWIN_BINARY(Sub, a - b, x - y)
TWIN_BINARY(Mul, a * b, x * y)
TWIN_BINARY(Div, a / b, y == 0 ? 0 : x / y)
TWIN_BINARY(Max, (a > b || std::isnan(a)) ? a : b, x > y ? x : y)
TWIN_BINARY(Min, (a < b || std::isnan(a)) ? a : b, x < y ? x : y)
#undef TWIN_BINARY

#define TWIN_SCALAR(NAME, EXPR_FLOAT, EXPR_INT)                                                                     \
    template <typename T, bool isSetMask = true>                                                                    \
    __aicore__ inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,        \
                                const int32_t& count, twin::Loc loc = {}) {                                         \
        const T sv = scalarValue;                                                                                   \
        twin_ops::unary(#NAME, dst, src, count,                                                                     \
                        [sv](T x) -> T {                                                                            \
                            if constexpr (std::is_integral<T>::value) {                                             \
                                const T y = sv;                                                                     \
                                return static_cast<T>(EXPR_INT);                                                    \
                            } else {                                                                                \
                                const float a = twin_ops::f(x), b = twin_ops::f(sv);                                \
                                return twin_ops::from<T>(EXPR_FLOAT);                                               \
                            }                                                                                       \
                        },                                                                                          \
                        loc);                                                                                       \
    }
TWIN_SCALAR(Adds, a + b, x + y)
TWIN_SCALAR(Muls, a * b, x * y)
TWIN_SCALAR(Maxs, a > b ? a : b, x > y ? x : y)
TWIN_SCALAR(Mins, a < b ? a : b, x < y ? x : y)
#undef TWIN_SCALAR

#define TWIN_UNARY(NAME, EXPR)                                                                                      \
    template <typename T, bool isSetMask = true>                                                                    \
    __aicore__ inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count,        \
                                twin::Loc loc = {}) {                                                               \
        static_assert(std::is_same<T, float>::value || std::is_same<T, half>::value, #NAME ": half / float only");  \
        twin_ops::unary(#NAME, dst, src, count,                                                                     \
                        [](T x) -> T {                                                                              \
                            const float a = twin_ops::f(x);                                                         \
                            return twin_ops::from<T>(EXPR);                                                         \
                        },                                                                                          \
                        loc);                                                                                       \
    }
TWIN_UNARY(Exp, std::exp(a))
TWIN_UNARY(Ln, std::log(a))
TWIN_UNARY(Abs, std::fabs(a))
TWIN_UNARY(Sqrt, std::sqrt(a))
TWIN_UNARY(Rsqrt, 1.0f / std::sqrt(a))
TWIN_UNARY(Reciprocal, 1.0f / a)
TWIN_UNARY(Relu, a > 0.0f ? a : 0.0f)
#undef TWIN_UNARY

template <typename T, bool isSetMask = true>
__aicore__ inline void LeakyRelu(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,
                                 const int32_t& count, twin::Loc loc = {}) {
    const float alpha = twin_ops::f(scalarValue);
    twin_ops::unary("LeakyRelu", dst, src, count,
                    [alpha](T x) -> T {
                        const float a = twin_ops::f(x);
                        return twin_ops::from<T>(a >= 0.0f ? a : a * alpha);
                    },
                    loc);
}

// Duplicate: dst[i] = scalar for i < count.
template <typename T, bool isSetMask = true>
__aicore__ inline void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, const int32_t& count,
                                 twin::Loc loc = {}) {
    static const char* api = "Duplicate";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    if (count < 0) twin::fail_at(loc, api, "negative count");
    twin_ops::check_ub(dst, count, api, loc, "destination");
    if (count == 0) return;
    const uint32_t e = twin::issue(c, twin::kV);
    twin_ops::wr(c, dst, count * sizeof(T), twin::kV, e, twin::site_id(api, loc), api, loc);
    T* d = twin_ops::ptr(dst);
    for (int32_t i = 0; i < count; ++i) d[i] = scalarValue;
}

// ---- Cast ------------------------------------------------------------------------------------------------------
namespace twin_ops {
// Round a float to a 16-bit float format (bf16 or fp16) with the given mode.
template <typename H>
inline H round16(float x, RoundMode m) {
    const H rne(x);
    const float v = static_cast<float>(rne);
    if (std::isnan(x) || std::isinf(x) || v == x || m == RoundMode::CAST_RINT || m == RoundMode::CAST_NONE) return rne;
    auto step = [](uint16_t b, bool up) -> uint16_t {  // next representable value towards +inf (up) or -inf
        const bool neg = b & 0x8000u;
        if ((b & 0x7fffu) == 0) return up ? 1 : 0x8001u;
        return (neg != up) ? static_cast<uint16_t>(b + 1) : static_cast<uint16_t>(b - 1);
    };
    H lo, hi;
    if (v < x) {
        lo = rne;
        hi = H::from_bits(step(rne.bits, true));
    } else {
        hi = rne;
        lo = H::from_bits(step(rne.bits, false));
    }
    switch (m) {
        case RoundMode::CAST_FLOOR: return lo;
        case RoundMode::CAST_CEIL: return hi;
        case RoundMode::CAST_TRUNC: return x > 0 ? lo : hi;
        case RoundMode::CAST_ROUND: {
            const double dl = static_cast<double>(x) - static_cast<float>(lo);
            const double dh = static_cast<float>(hi) - static_cast<double>(x);
            if (dl < dh) return lo;
            if (dh < dl) return hi;
            return x > 0 ? hi : lo;  // ties away from zero
        }
        case RoundMode::CAST_ODD: return (lo.bits & 1u) ? lo : hi;
        default: return rne;
    }
}
inline float round_int_mode(float x, RoundMode m) {
    switch (m) {
        case RoundMode::CAST_FLOOR: return std::floor(x);
        case RoundMode::CAST_CEIL: return std::ceil(x);
        case RoundMode::CAST_TRUNC: return std::trunc(x);
        case RoundMode::CAST_ROUND: return std::round(x);
        default: return std::nearbyint(x);
    }
}
inline const char* mode_name(RoundMode m) {
    static const char* n[] = {"CAST_NONE", "CAST_RINT", "CAST_FLOOR", "CAST_CEIL", "CAST_ROUND", "CAST_TRUNC",
                              "CAST_ODD", "CAST_HYBRID"};
    return n[static_cast<int>(m)];
}
template <typename T>
inline const char* type_name() {
    if (IsSameType<T, float>::value) return "float";
    if (IsSameType<T, half>::value) return "half";
    if (IsSameType<T, bfloat16_t>::value) return "bfloat16_t";
    if (IsSameType<T, int32_t>::value) return "int32_t";
    if (IsSameType<T, int16_t>::value) return "int16_t";
    if (IsSameType<T, int64_t>::value) return "int64_t";
    return "other";
}
}  // namespace twin_ops

// Supported (src, dst, mode) combinations follow the Atlas A2 table of Cast.md.
template <typename T, typename U>
__aicore__ inline void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src, const RoundMode& roundMode,
                            const uint32_t count, twin::Loc loc = {}) {
    static const char* api = "Cast";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    using RM = RoundMode;
    const RM m = roundMode;
    const bool rounding = m == RM::CAST_RINT || m == RM::CAST_FLOOR || m == RM::CAST_CEIL || m == RM::CAST_ROUND ||
                          m == RM::CAST_TRUNC;
    bool ok = false;
    if constexpr ((IsSameType<U, half>::value || IsSameType<U, bfloat16_t>::value) && IsSameType<T, float>::value) {
        ok = m == RM::CAST_NONE;
    } else if constexpr (IsSameType<U, float>::value && IsSameType<T, half>::value) {
        ok = rounding || m == RM::CAST_ODD || m == RM::CAST_NONE;
    } else if constexpr (IsSameType<U, float>::value && IsSameType<T, bfloat16_t>::value) {
        ok = rounding;
    } else if constexpr (IsSameType<U, float>::value &&
                         (IsSameType<T, int32_t>::value || IsSameType<T, float>::value)) {
        ok = rounding;
    } else if constexpr (IsSameType<U, int32_t>::value && IsSameType<T, float>::value) {
        ok = rounding || m == RM::CAST_NONE;
    } else if constexpr (IsSameType<U, half>::value && IsSameType<T, int32_t>::value) {
        ok = rounding;
    }
    if (!ok)
        twin::fail_at(loc, api, "Cast from %s to %s with %s is not supported on Atlas A2 (Cast.md)",
                      twin_ops::type_name<U>(), twin_ops::type_name<T>(), twin_ops::mode_name(m));
    twin_ops::check_ub(dst, count, api, loc, "destination");
    twin_ops::check_ub(src, count, api, loc, "source");
    twin_ops::check_overlap(dst, count, src, count, api, loc, sizeof(T) == sizeof(U));
    if (count == 0) return;
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    twin_ops::rd(c, src, static_cast<uint64_t>(count) * sizeof(U), twin::kV, e, site, api, loc);
    twin_ops::wr(c, dst, static_cast<uint64_t>(count) * sizeof(T), twin::kV, e, site, api, loc);
    T* d = twin_ops::ptr(dst);
    const U* s = twin_ops::ptr(src);
    for (uint32_t i = 0; i < count; ++i) {
        if constexpr (IsSameType<T, float>::value && !std::is_integral<U>::value) {
            d[i] = static_cast<float>(s[i]);
        } else if constexpr (IsSameType<T, half>::value || IsSameType<T, bfloat16_t>::value) {
            d[i] = twin_ops::round16<T>(static_cast<float>(s[i]), m == RM::CAST_NONE ? RM::CAST_RINT : m);
        } else if constexpr (IsSameType<T, int32_t>::value) {
            const float r = twin_ops::round_int_mode(static_cast<float>(s[i]), m);
            d[i] = std::isnan(r) ? 0 : r >= 2147483647.0f ? INT32_MAX : r <= -2147483648.0f ? INT32_MIN
                                                                                             : static_cast<int32_t>(r);
        } else if constexpr (IsSameType<T, float>::value && IsSameType<U, int32_t>::value) {
            d[i] = static_cast<float>(s[i]);
        } else if constexpr (IsSameType<T, float>::value && IsSameType<U, float>::value) {
            d[i] = twin_ops::round_int_mode(s[i], m);
        }
    }
}

// ---- reductions (level 2) --------------------------------------------------------------------------------------
namespace twin_ops {
inline uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
// sharedTmpBuffer elements ReduceMax / ReduceMin need (ReduceMax.md 关键特性说明; RoundUp there is a ceiling
// division, as the implementation's second-step output count shows).
template <typename T>
inline uint64_t reduce_maxmin_tmp(uint64_t count, bool index) {
    const uint64_t per_blk = 32 / sizeof(T), per_rep = 256 / sizeof(T);
    const uint64_t first = count < per_rep ? 1 : count / per_rep;
    const uint64_t it1 = first * 2;
    if (!index) return ceil_div(it1, per_blk) * per_blk;
    const uint64_t it2_start = ceil_div(it1, per_blk) * per_blk;
    const uint64_t it2 = ceil_div(it1, per_rep) * 2;
    const uint64_t it2_end = ceil_div(it2, per_blk) * per_blk;
    if (it2 <= 2) return it2_start + it2_end;
    const uint64_t it3_start = it2_end;
    const uint64_t it3 = ceil_div(it2, per_rep) * 2;
    const uint64_t it3_end = ceil_div(it3, per_blk) * per_blk;
    return it2_start + it3_start + it3_end;
}
template <typename T>
inline void reduce_common(const char* api, const LocalTensor<T>& dst, const LocalTensor<T>& src,
                          const LocalTensor<T>& tmp, int32_t count, uint64_t dst_elems, uint32_t dst_align,
                          uint64_t tmp_elems, const Loc& loc) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, half>::value, "reductions: half / float only");
    if (count < 1 || static_cast<uint64_t>(count) * sizeof(T) > twin::cur().ub_size)
        twin::fail_at(loc, api, "count %d outside [1, UB size / sizeof(T)]", count);
    check_ub(src, count, api, loc, "source");
    check_ub(dst, dst_elems, api, loc, "destination", dst_align);
    check_ub(tmp, tmp_elems, api, loc, "sharedTmpBuffer");
}
}  // namespace twin_ops

// dst[0] = max, dst[1] = bits of the first index of the max (calIndex), as the value type (ReduceRepeat.md).
template <typename T>
__aicore__ inline void ReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src,
                                 const LocalTensor<T>& sharedTmpBuffer, const int32_t count, bool calIndex = 0,
                                 twin::Loc loc = {}) {
    static const char* api = "ReduceMax";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    const uint64_t need = twin_ops::reduce_maxmin_tmp<T>(count > 0 ? count : 1, calIndex);
    twin_ops::reduce_common(api, dst, src, sharedTmpBuffer, count, calIndex ? 2 : 1,
                            static_cast<uint32_t>(sizeof(T) * (calIndex ? 2 : 1)), need, loc);
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    twin_ops::rd(c, src, count * sizeof(T), twin::kV, e, site, api, loc);
    twin_ops::wr(c, sharedTmpBuffer, need * sizeof(T), twin::kV, e, site, api, loc);
    twin_ops::wr(c, dst, (calIndex ? 2 : 1) * sizeof(T), twin::kV, e, site, api, loc);
    const T* s = twin_ops::ptr(src);
    float best = twin_ops::f(s[0]);
    uint32_t idx = 0;
    for (int32_t i = 1; i < count; ++i) {
        const float v = twin_ops::f(s[i]);
        if (v > best) {
            best = v;
            idx = static_cast<uint32_t>(i);
        }
    }
    T* d = twin_ops::ptr(dst);
    T* t = twin_ops::ptr(sharedTmpBuffer);
    std::memset(t, 0xff, need * sizeof(T));  // intermediate results: unspecified for the caller
    d[0] = s[idx];
    if (calIndex) {
        if (sizeof(T) == 2) {
            const uint16_t b = static_cast<uint16_t>(idx);
            std::memcpy(&d[1], &b, 2);
        } else {
            std::memcpy(&d[1], &idx, 4);
        }
    }
}
template <typename T>
__aicore__ inline void ReduceMin(const LocalTensor<T>& dst, const LocalTensor<T>& src,
                                 const LocalTensor<T>& sharedTmpBuffer, const int32_t count, bool calIndex = 0,
                                 twin::Loc loc = {}) {
    static const char* api = "ReduceMin";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    const uint64_t need = twin_ops::reduce_maxmin_tmp<T>(count > 0 ? count : 1, calIndex);
    twin_ops::reduce_common(api, dst, src, sharedTmpBuffer, count, calIndex ? 2 : 1,
                            static_cast<uint32_t>(sizeof(T) * (calIndex ? 2 : 1)), need, loc);
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    twin_ops::rd(c, src, count * sizeof(T), twin::kV, e, site, api, loc);
    twin_ops::wr(c, sharedTmpBuffer, need * sizeof(T), twin::kV, e, site, api, loc);
    twin_ops::wr(c, dst, (calIndex ? 2 : 1) * sizeof(T), twin::kV, e, site, api, loc);
    const T* s = twin_ops::ptr(src);
    float best = twin_ops::f(s[0]);
    uint32_t idx = 0;
    for (int32_t i = 1; i < count; ++i) {
        const float v = twin_ops::f(s[i]);
        if (v < best) {
            best = v;
            idx = static_cast<uint32_t>(i);
        }
    }
    T* d = twin_ops::ptr(dst);
    std::memset(twin_ops::ptr(sharedTmpBuffer), 0xff, need * sizeof(T));
    d[0] = s[idx];
    if (calIndex) {
        if (sizeof(T) == 2) {
            const uint16_t b = static_cast<uint16_t>(idx);
            std::memcpy(&d[1], &b, 2);
        } else {
            std::memcpy(&d[1], &idx, 4);
        }
    }
}
// Level 0 ("高维切分", mask continuous mode): repeatTime repeats of `mask` elements, srcRepStride 32-byte blocks
// apart; the result covers every selected element (the index is the element's offset from src).
namespace twin_ops {
template <typename T, bool kMax>
inline void reduce_extreme_l0(const char* api, const LocalTensor<T>& dst, const LocalTensor<T>& src,
                              const LocalTensor<T>& tmp, int32_t mask, int32_t repeatTime, int32_t srcRepStride,
                              bool calIndex, const Loc& loc) {
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    const int32_t per_rep = 256 / sizeof(T), per_blk = 32 / sizeof(T);
    if (mask < 1 || mask > per_rep || repeatTime < 1 || srcRepStride < 0)
        twin::fail_at(loc, api, "mask %d / repeatTime %d / srcRepStride %d out of range", mask, repeatTime,
                      srcRepStride);
    const uint64_t span = static_cast<uint64_t>(repeatTime - 1) * srcRepStride * per_blk + mask;
    const uint64_t need = reduce_maxmin_tmp<T>(static_cast<uint64_t>(repeatTime) * per_rep, calIndex);
    check_ub(src, span, api, loc, "source");
    check_ub(dst, calIndex ? 2 : 1, api, loc, "destination", static_cast<uint32_t>(sizeof(T) * (calIndex ? 2 : 1)));
    check_ub(tmp, need, api, loc, "sharedTmpBuffer");
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    rd(c, src, span * sizeof(T), twin::kV, e, site, api, loc);
    wr(c, tmp, need * sizeof(T), twin::kV, e, site, api, loc);
    wr(c, dst, (calIndex ? 2 : 1) * sizeof(T), twin::kV, e, site, api, loc);
    const T* sp = ptr(src);
    float best = f(sp[0]);
    uint32_t idx = 0;
    for (int32_t r = 0; r < repeatTime; ++r)
        for (int32_t l = 0; l < mask; ++l) {
            const uint32_t k = static_cast<uint32_t>(r * srcRepStride * per_blk + l);
            const float v = f(sp[k]);
            if (kMax ? v > best : v < best) {
                best = v;
                idx = k;
            }
        }
    T* d = ptr(dst);
    std::memset(static_cast<void*>(ptr(tmp)), 0xff, need * sizeof(T));
    d[0] = sp[idx];
    if (calIndex) {
        if (sizeof(T) == 2) {
            const uint16_t b = static_cast<uint16_t>(idx);
            std::memcpy(&d[1], &b, 2);
        } else {
            std::memcpy(&d[1], &idx, 4);
        }
    }
}
}  // namespace twin_ops
template <typename T>
__aicore__ inline void ReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src,
                                 const LocalTensor<T>& sharedTmpBuffer, const int32_t mask, const int32_t repeatTime,
                                 const int32_t srcRepStride, bool calIndex = 0, twin::Loc loc = {}) {
    twin_ops::reduce_extreme_l0<T, true>("ReduceMax(level 0)", dst, src, sharedTmpBuffer, mask, repeatTime,
                                          srcRepStride, calIndex, loc);
}
template <typename T>
__aicore__ inline void ReduceMin(const LocalTensor<T>& dst, const LocalTensor<T>& src,
                                 const LocalTensor<T>& sharedTmpBuffer, const int32_t mask, const int32_t repeatTime,
                                 const int32_t srcRepStride, bool calIndex = 0, twin::Loc loc = {}) {
    twin_ops::reduce_extreme_l0<T, false>("ReduceMin(level 0)", dst, src, sharedTmpBuffer, mask, repeatTime,
                                           srcRepStride, calIndex, loc);
}
template <typename T, bool isSetMask = true>
__aicore__ inline void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src,
                                 const LocalTensor<T>& sharedTmpBuffer, const int32_t mask, const int32_t repeatTime,
                                 const int32_t srcRepStride, twin::Loc loc = {}) {
    (void)dst, (void)src, (void)sharedTmpBuffer, (void)mask, (void)repeatTime, (void)srcRepStride;
    twin::fail_at(loc, "ReduceSum(level 0)", "not modelled by the twin");
}
template <typename T>
__aicore__ inline T GetReduceRepeatSumSpr(twin::Loc loc = {}) {
    twin::fail_at(loc, "GetReduceRepeatSumSpr", "not modelled by the twin");
}
__aicore__ inline void InitSocState() {}

// dst[0] = sum; Atlas A2 level-2 order: pairwise tree inside each 256-byte repeat, repeats added in order.
template <typename T, bool isSetMask = true>
__aicore__ inline void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src,
                                 const LocalTensor<T>& sharedTmpBuffer, const int32_t count, twin::Loc loc = {}) {
    static const char* api = "ReduceSum";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin_ops::reduce_common(api, dst, src, sharedTmpBuffer, count, 1, sizeof(T), 0, loc);
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    twin_ops::rd(c, src, count * sizeof(T), twin::kV, e, site, api, loc);
    twin_ops::wr(c, dst, sizeof(T), twin::kV, e, site, api, loc);
    const T* s = twin_ops::ptr(src);
    const int32_t per_rep = 256 / sizeof(T);
    T acc = T(0.0f);
    for (int32_t r0 = 0; r0 < count; r0 += per_rep) {
        T lane[128];
        for (int32_t i = 0; i < per_rep; ++i) lane[i] = r0 + i < count ? s[r0 + i] : T(0.0f);
        for (int32_t w = per_rep / 2; w >= 1; w /= 2)
            for (int32_t i = 0; i < w; ++i) lane[i] = T(twin_ops::f(lane[2 * i]) + twin_ops::f(lane[2 * i + 1]));
        acc = r0 == 0 ? lane[0] : T(twin_ops::f(acc) + twin_ops::f(lane[0]));
    }
    twin_ops::ptr(dst)[0] = acc;
}

// ---- vector unit: tensor high-dimension (level 0) forms ("高维切分", mask continuous mode) -------------------------
// One instruction runs repeatTime repeats; repeat j covers the first `mask` elements of 8 data blocks (32 bytes each,
// 32 / sizeof(T) elements): element i of repeat j lives at j * repStride + (i / perBlock) * blkStride blocks, at
// (i % perBlock) inside its block (SIMD计算说明/高维切分.md; BinaryRepeatParams / UnaryRepeatParams). Strides are in
// 32-byte blocks; operands start on 32-byte blocks; every element touched must lie inside its LocalTensor.
struct BinaryRepeatParams {
    BinaryRepeatParams() {}
    BinaryRepeatParams(Field<uint8_t> dstBlk, Field<uint8_t> src0Blk, Field<uint8_t> src1Blk, Field<uint8_t> dstRep,
                       Field<uint8_t> src0Rep, Field<uint8_t> src1Rep)
        : dstBlkStride(dstBlk), src0BlkStride(src0Blk), src1BlkStride(src1Blk), dstRepStride(dstRep),
          src0RepStride(src0Rep), src1RepStride(src1Rep) {}
    uint32_t blockNumber = DEFAULT_BLK_NUM;
    Field<uint8_t> dstBlkStride = DEFAULT_BLK_STRIDE;
    Field<uint8_t> src0BlkStride = DEFAULT_BLK_STRIDE;
    Field<uint8_t> src1BlkStride = DEFAULT_BLK_STRIDE;
    Field<uint8_t> dstRepStride = DEFAULT_REPEAT_STRIDE;
    Field<uint8_t> src0RepStride = DEFAULT_REPEAT_STRIDE;
    Field<uint8_t> src1RepStride = DEFAULT_REPEAT_STRIDE;
    bool repeatStrideMode = false;
    bool strideSizeMode = false;
};
struct UnaryRepeatParams {
    UnaryRepeatParams() {}
    UnaryRepeatParams(Field<uint16_t> dstBlk, Field<uint16_t> srcBlk, Field<uint8_t> dstRep, Field<uint8_t> srcRep)
        : dstBlkStride(dstBlk), srcBlkStride(srcBlk), dstRepStride(dstRep), srcRepStride(srcRep) {}
    uint32_t blockNumber = DEFAULT_BLK_NUM;
    Field<uint16_t> dstBlkStride = DEFAULT_BLK_STRIDE;
    Field<uint16_t> srcBlkStride = DEFAULT_BLK_STRIDE;
    Field<uint8_t> dstRepStride = DEFAULT_REPEAT_STRIDE;
    Field<uint8_t> srcRepStride = DEFAULT_REPEAT_STRIDE;
    bool repeatStrideMode = false;
    bool strideSizeMode = false;
};
struct BrcbRepeatParams {
    BrcbRepeatParams() {}
    BrcbRepeatParams(Field<uint16_t> dstBlk, Field<uint16_t> dstRep) : dstRepStride(dstRep), dstBlkStride(dstBlk) {}
    uint32_t blockNumber = DEFAULT_BLK_NUM;
    Field<uint16_t> dstRepStride = DEFAULT_REPEAT_STRIDE;
    Field<uint16_t> dstBlkStride = DEFAULT_BLK_STRIDE;
};

namespace twin_ops {
// Element offset (in T) of element i of repeat j of an operand with the given strides.
template <typename T>
inline uint64_t l0_off(uint32_t j, uint32_t i, uint32_t blk, uint32_t rep) {
    const uint32_t per = 32 / sizeof(T);
    return (static_cast<uint64_t>(j) * rep + (i / per) * static_cast<uint64_t>(blk)) * per + i % per;
}
// Bounds and hazard record of every block an operand's level-0 access touches.
template <typename T>
inline void l0_touch(twin::Core& c, const LocalTensor<T>& t, uint32_t mask, uint32_t repeat, uint32_t blk,
                     uint32_t rep, bool write, uint32_t e, uint16_t site, const char* api, const Loc& loc,
                     const char* role) {
    check_ub(t, 0, api, loc, role);
    const uint32_t per = 32 / sizeof(T);
    uint64_t maxel = 0;
    for (uint32_t j = 0; j < repeat; ++j)
        for (uint32_t b = 0; b * per < mask; ++b) {
            const uint64_t el = l0_off<T>(j, b * per, blk, rep);
            const uint32_t n = std::min(per, mask - b * per);
            maxel = std::max<uint64_t>(maxel, el + n);
            if (maxel <= t.GetSize())
                twin::ub_access(c, t.offset() + el * sizeof(T), n * sizeof(T), twin::kV, write, e, site, api, loc);
        }
    if (maxel > t.GetSize())
        twin::fail_at(loc, api, "%s operand: the repeats reach element %llu, beyond its LocalTensor length %u", role,
                      static_cast<unsigned long long>(maxel), t.GetSize());
}
// The checked strides of a BinaryRepeatParams (uint8_t each) and a repeat count (uint8_t, [0, 255]).
struct BinStrides {
    uint32_t dst_blk, s0_blk, s1_blk, dst_rep, s0_rep, s1_rep;
};
inline BinStrides bin_strides(const BinaryRepeatParams& p, const char* api, const Loc& loc) {
    auto f = [&](const char* n, const Field<uint8_t>& x) {
        return static_cast<uint32_t>(twin::field_value(loc, api, n, x, kDocRepeat));
    };
    return {f("BinaryRepeatParams::dstBlkStride", p.dstBlkStride), f("BinaryRepeatParams::src0BlkStride", p.src0BlkStride),
            f("BinaryRepeatParams::src1BlkStride", p.src1BlkStride), f("BinaryRepeatParams::dstRepStride", p.dstRepStride),
            f("BinaryRepeatParams::src0RepStride", p.src0RepStride),
            f("BinaryRepeatParams::src1RepStride", p.src1RepStride)};
}
inline uint32_t repeat_time(const Field<uint8_t>& r, const char* api, const Loc& loc) {
    return static_cast<uint32_t>(twin::field_value(loc, api, "repeatTime", r, 0, 255, kDocRepeat));
}
template <typename T, typename F>
inline void l0_binary(const char* api, const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b,
                      uint64_t mask, Field<uint8_t> repeatTime, const BinaryRepeatParams& params, F f,
                      const Loc& loc) {
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    require_vec_type<T>(api, loc);
    if (mask == 0 || mask > 256 / sizeof(T))
        twin::fail_at(loc, api, "mask %llu outside 1..%zu (continuous mode)", static_cast<unsigned long long>(mask),
                      256 / sizeof(T));
    const uint32_t repeat = repeat_time(repeatTime, api, loc);
    const BinStrides p = bin_strides(params, api, loc);
    if (repeat == 0) return;  // NOP on Atlas A2
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    const uint32_t m = static_cast<uint32_t>(mask);
    l0_touch(c, a, m, repeat, p.s0_blk, p.s0_rep, false, e, site, api, loc, "source 0");
    l0_touch(c, b, m, repeat, p.s1_blk, p.s1_rep, false, e, site, api, loc, "source 1");
    l0_touch(c, dst, m, repeat, p.dst_blk, p.dst_rep, true, e, site, api, loc, "destination");
    T* d = ptr(dst);
    const T* x = ptr(a);
    const T* y = ptr(b);
    std::vector<T> out(m);
    for (uint32_t j = 0; j < repeat; ++j) {  // a repeat reads its operands, then writes
        for (uint32_t i = 0; i < m; ++i)
            out[i] = f(x[l0_off<T>(j, i, p.s0_blk, p.s0_rep)], y[l0_off<T>(j, i, p.s1_blk, p.s1_rep)]);
        for (uint32_t i = 0; i < m; ++i) d[l0_off<T>(j, i, p.dst_blk, p.dst_rep)] = out[i];
    }
}
}  // namespace twin_ops

#define TWIN_BINARY_L0(NAME, EXPR)                                                                                  \
    template <typename T, bool isSetMask = true>                                                                    \
    __aicore__ inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
                                uint64_t mask, twin::Field<uint8_t> repeatTime,                                     \
                                const BinaryRepeatParams& repeatParams,                                             \
                                twin::Loc loc = {}) {                                                               \
        twin_ops::l0_binary(#NAME "(level 0)", dst, src0, src1, mask, repeatTime, repeatParams,                    \
                            [](T x, T y) -> T {                                                                     \
                                const float a = twin_ops::f(x), b = twin_ops::f(y);                                 \
                                return twin_ops::from<T>(EXPR);                                                     \
                            },                                                                                      \
                            loc);                                                                                   \
    }
TWIN_BINARY_L0(Add, a + b)
TWIN_BINARY_L0(Sub, a - b)
TWIN_BINARY_L0(Mul, a * b)
TWIN_BINARY_L0(Max, (a > b || std::isnan(a)) ? a : b)
TWIN_BINARY_L0(Min, (a < b || std::isnan(a)) ? a : b)
#undef TWIN_BINARY_L0

// ReduceRepeat<type>: one result per repeat (归约计算/ReduceRepeat.md): SUM adds the repeat's elements as a binary
// tree of adjacent pairs (ReduceDataBlock.md 关键特性说明); MAX / MIN give the value and / or the first index of the
// extreme inside the repeat (the index as the bits of the value type; ORDER_ONLY_INDEX: a uint32). dstRepStride is in
// results (value + index: 2 elements; value or SUM: 1 element; index only: 4 bytes).
template <ReduceType reduceType, typename T, typename U, bool isSetMask = true>
__aicore__ inline void ReduceRepeat(const LocalTensor<T>& dst, const LocalTensor<U>& src, const int32_t mask,
                                    const int32_t repeatTime, const int32_t dstRepStride, const int32_t srcBlkStride,
                                    const int32_t srcRepStride, ReduceOrder order = ReduceOrder::ORDER_VALUE_INDEX,
                                    twin::Loc loc = {}) {
    static const char* api = "ReduceRepeat";
    static_assert(std::is_same<T, U>::value, "ReduceRepeat: one data type on Atlas A2");
    static_assert(std::is_same<T, float>::value || std::is_same<T, half>::value, "ReduceRepeat: half / float");
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    const int32_t per_rep = 256 / sizeof(T);
    if (mask < 1 || mask > per_rep) twin::fail_at(loc, api, "mask %d outside 1..%d (continuous mode)", mask, per_rep);
    // ReduceRepeat.md: repeatTime in [0, 255], the three strides in [0, 65535]
    twin::field_value(loc, api, "repeatTime", Field<int32_t>(repeatTime), 0, 255, "ReduceRepeat.md");
    twin::field_value(loc, api, "dstRepStride", Field<int32_t>(dstRepStride), 0, 65535, "ReduceRepeat.md");
    twin::field_value(loc, api, "srcBlkStride", Field<int32_t>(srcBlkStride), 0, 65535, "ReduceRepeat.md");
    twin::field_value(loc, api, "srcRepStride", Field<int32_t>(srcRepStride), 0, 65535, "ReduceRepeat.md");
    if (repeatTime == 0) return;
    const bool both = reduceType != ReduceType::SUM &&
                      (order == ReduceOrder::ORDER_VALUE_INDEX || order == ReduceOrder::ORDER_INDEX_VALUE);
    const bool only_index = reduceType != ReduceType::SUM && order == ReduceOrder::ORDER_ONLY_INDEX;
    const uint32_t unit = both ? 2 * sizeof(T) : only_index ? 4 : sizeof(T);  // bytes of one result
    twin_ops::check_ub(dst, 0, api, loc, "destination", unit);
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    twin_ops::l0_touch(c, src, mask, repeatTime, srcBlkStride, srcRepStride, false, e, site, api, loc, "source");
    const uint64_t need = (static_cast<uint64_t>(repeatTime - 1) * dstRepStride) * unit + unit;
    if (need > dst.len_)
        twin::fail_at(loc, api, "the results need %llu bytes of the destination, which has %u",
                      static_cast<unsigned long long>(need), dst.len_);
    const U* s = twin_ops::ptr(src);
    uint8_t* d = dst.addr_;
    for (int32_t j = 0; j < repeatTime; ++j) {
        uint8_t* out = d + static_cast<uint64_t>(j) * dstRepStride * unit;
        twin::ub_access(c, dst.offset() + static_cast<uint64_t>(j) * dstRepStride * unit, unit, twin::kV, true, e,
                        site, api, loc);
        if (reduceType == ReduceType::SUM) {
            T lane[128];
            for (int32_t i = 0; i < per_rep; ++i)
                lane[i] = i < mask ? s[twin_ops::l0_off<U>(j, i, srcBlkStride, srcRepStride)] : T(0.0f);
            for (int32_t w = per_rep / 2; w >= 1; w /= 2)
                for (int32_t i = 0; i < w; ++i) lane[i] = T(twin_ops::f(lane[2 * i]) + twin_ops::f(lane[2 * i + 1]));
            std::memcpy(out, &lane[0], sizeof(T));
            continue;
        }
        float best = twin_ops::f(s[twin_ops::l0_off<U>(j, 0, srcBlkStride, srcRepStride)]);
        uint32_t idx = 0;
        for (int32_t i = 1; i < mask; ++i) {
            const float v = twin_ops::f(s[twin_ops::l0_off<U>(j, i, srcBlkStride, srcRepStride)]);
            if (reduceType == ReduceType::MAX ? v > best : v < best) {
                best = v;
                idx = static_cast<uint32_t>(i);
            }
        }
        const T val = s[twin_ops::l0_off<U>(j, idx, srcBlkStride, srcRepStride)];
        T ib;
        std::memset(static_cast<void*>(&ib), 0, sizeof(T));
        std::memcpy(&ib, &idx, sizeof(T) < 4 ? sizeof(T) : 4);
        switch (order) {
            case ReduceOrder::ORDER_VALUE_INDEX:
                std::memcpy(out, &val, sizeof(T));
                std::memcpy(out + sizeof(T), &ib, sizeof(T));
                break;
            case ReduceOrder::ORDER_INDEX_VALUE:
                std::memcpy(out, &ib, sizeof(T));
                std::memcpy(out + sizeof(T), &val, sizeof(T));
                break;
            case ReduceOrder::ORDER_ONLY_VALUE: std::memcpy(out, &val, sizeof(T)); break;
            case ReduceOrder::ORDER_ONLY_INDEX: std::memcpy(out, &idx, 4); break;
        }
    }
}

// Brcb: element i * 8 + k of src fills data block k of repeat i (数据填充/Brcb.md); dstBlkStride 0 counts as 1.
template <typename T>
__aicore__ inline void Brcb(const LocalTensor<T>& dst, const LocalTensor<T>& src, twin::Field<uint8_t> repeatParam,
                            const BrcbRepeatParams& params, twin::Loc loc = {}) {
    static const char* api = "Brcb";
    static_assert(sizeof(T) == 2 || sizeof(T) == 4, "Brcb: b16 / b32");
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    const uint32_t repeatTime = twin_ops::repeat_time(repeatParam, api, loc);
    struct {
        uint64_t dstRepStride, dstBlkStride;
    } p{static_cast<uint64_t>(
            twin::field_value(loc, api, "BrcbRepeatParams::dstRepStride", params.dstRepStride, twin_ops::kDocRepeat)),
        static_cast<uint64_t>(
            twin::field_value(loc, api, "BrcbRepeatParams::dstBlkStride", params.dstBlkStride, twin_ops::kDocRepeat))};
    if (repeatTime == 0) return;
    const uint32_t per = 32 / sizeof(T), blk = p.dstBlkStride == 0 ? 1 : static_cast<uint32_t>(p.dstBlkStride);
    twin_ops::check_ub(src, static_cast<uint64_t>(repeatTime) * 8, api, loc, "source");
    twin_ops::check_ub(dst, 0, api, loc, "destination");
    const uint64_t last = ((static_cast<uint64_t>(repeatTime) - 1) * p.dstRepStride + 7ull * blk) * per + per;
    if (last > dst.GetSize())
        twin::fail_at(loc, api, "destination: the repeats reach element %llu, beyond its LocalTensor length %u",
                      static_cast<unsigned long long>(last), dst.GetSize());
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    twin_ops::rd(c, src, static_cast<uint64_t>(repeatTime) * 8 * sizeof(T), twin::kV, e, site, api, loc);
    const T* s = twin_ops::ptr(src);
    T* d = twin_ops::ptr(dst);
    for (uint32_t i = 0; i < repeatTime; ++i)
        for (uint32_t k = 0; k < 8; ++k) {
            const uint64_t b0 = (static_cast<uint64_t>(i) * p.dstRepStride + k * blk) * per;
            twin::ub_access(c, dst.offset() + b0 * sizeof(T), 32, twin::kV, true, e, site, api, loc);
            for (uint32_t x = 0; x < per; ++x) d[b0 + x] = s[i * 8 + k];
        }
}

// ---- compare, select, gather, index (比较与选择, 离散与聚合, 数据填充) --------------------------------------------------
namespace twin_ops {
inline bool cmp(float a, float b, CMPMODE m) {
    switch (m) {
        case CMPMODE::LT: return a < b;
        case CMPMODE::GT: return a > b;
        case CMPMODE::EQ: return a == b;
        case CMPMODE::LE: return a <= b;
        case CMPMODE::GE: return a >= b;
        default: return a != b;
    }
}
template <typename T, typename F>
inline void compare_impl(const char* api, const LocalTensor<uint8_t>& dst, const LocalTensor<T>& a,
                         const LocalTensor<T>* b, uint32_t count, F value_b, CMPMODE mode, const Loc& loc) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, half>::value, "Compare: half / float");
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    // count elements must fill whole 256-byte repeats: the rest would be left out silently (Compare.md / Compares.md)
    if ((static_cast<uint64_t>(count) * sizeof(T)) % 256 != 0)
        twin::fail_at(loc, api, "count %u * %zu bytes is not a multiple of 256 (the hardware drops the partial repeat)",
                      count, sizeof(T));
    check_ub(a, count, api, loc, "source 0");
    if (b) check_ub(*b, count, api, loc, "source 1");
    check_ub(dst, count / 8, api, loc, "destination");
    if (count == 0) return;
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    rd(c, a, count * sizeof(T), twin::kV, e, site, api, loc);
    if (b) rd(c, *b, count * sizeof(T), twin::kV, e, site, api, loc);
    wr(c, dst, count / 8, twin::kV, e, site, api, loc);
    const T* x = ptr(a);
    uint8_t* d = ptr(dst);
    std::memset(d, 0, count / 8);
    for (uint32_t i = 0; i < count; ++i)
        if (cmp(f(x[i]), value_b(i), mode)) d[i / 8] |= static_cast<uint8_t>(1u << (i % 8));  // element i: bit i
}
}  // namespace twin_ops

template <typename T, typename U>
__aicore__ inline void Compare(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                               CMPMODE cmpMode, uint32_t count, twin::Loc loc = {}) {
    static_assert(std::is_same<U, uint8_t>::value, "Compare: uint8_t mask");
    const T* y = twin_ops::ptr(src1);
    twin_ops::compare_impl("Compare", dst, src0, &src1, count, [y](uint32_t i) { return twin_ops::f(y[i]); },
                           cmpMode, loc);
}
template <typename T, typename U>
__aicore__ inline void Compares(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const T src1Scalar,
                                CMPMODE cmpMode, uint32_t count, twin::Loc loc = {}) {
    static_assert(std::is_same<U, uint8_t>::value, "Compares: uint8_t mask");
    const float v = twin_ops::f(src1Scalar);
    twin_ops::compare_impl("Compares", dst, src0, static_cast<const LocalTensor<T>*>(nullptr), count,
                           [v](uint32_t) { return v; }, cmpMode, loc);
}
template <typename T, typename U>
__aicore__ inline void CompareScalar(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const T src1Scalar,
                                     CMPMODE cmpMode, uint32_t count, twin::Loc loc = {}) {
    Compares(dst, src0, src1Scalar, cmpMode, count, loc);
}

namespace twin_ops {
template <typename T, typename U, typename F>
inline void select_impl(const char* api, const LocalTensor<T>& dst, const LocalTensor<U>& mask,
                        const LocalTensor<T>& a, const LocalTensor<T>* b, F value_b, SELMODE mode, uint32_t count,
                        const Loc& loc) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, half>::value, "Select: half / float");
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    check_ub(dst, count, api, loc, "destination");
    check_ub(a, count, api, loc, "source 0");
    if (b) check_ub(*b, count, api, loc, "source 1");
    const uint32_t per_rep = 256 / sizeof(T);
    const uint64_t mask_bytes = mode == SELMODE::VSEL_CMPMASK_SPR ? per_rep / 8 : (count + 7) / 8;
    check_ub(mask.template ReinterpretCast<uint8_t>(), mask_bytes, api, loc, "selMask");
    if (count == 0) return;
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    rd(c, mask, mask_bytes, twin::kV, e, site, api, loc);
    rd(c, a, count * sizeof(T), twin::kV, e, site, api, loc);
    if (b) rd(c, *b, count * sizeof(T), twin::kV, e, site, api, loc);
    wr(c, dst, count * sizeof(T), twin::kV, e, site, api, loc);
    const uint8_t* m = reinterpret_cast<const uint8_t*>(mask.addr_);
    const T* x = ptr(a);
    T* d = ptr(dst);
    for (uint32_t i = 0; i < count; ++i) {
        const uint32_t bit = mode == SELMODE::VSEL_CMPMASK_SPR ? i % per_rep : i;  // mode 0: the same bits per repeat
        d[i] = (m[bit / 8] >> (bit % 8) & 1u) ? x[i] : value_b(i);
    }
}
}  // namespace twin_ops

// Select (count form): element i from src0 where bit i of selMask is 1, else from src1 (a tensor in modes 0 and 2, a
// scalar in mode 1); mode 0 reuses the first 256 / sizeof(T) bits for every repeat (Select.md).
template <typename T, typename U>
__aicore__ inline void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
                              T src1, SELMODE selMode, uint32_t count, twin::Loc loc = {}) {
    if (selMode != SELMODE::VSEL_TENSOR_SCALAR_MODE)
        twin::fail_at(loc, "Select", "a scalar src1 needs VSEL_TENSOR_SCALAR_MODE");
    twin_ops::select_impl("Select", dst, selMask, src0, static_cast<const LocalTensor<T>*>(nullptr),
                          [src1](uint32_t) { return src1; }, selMode, count, loc);
}
template <typename T, typename U>
__aicore__ inline void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
                              const LocalTensor<T>& src1, SELMODE selMode, uint32_t count, twin::Loc loc = {}) {
    if (selMode == SELMODE::VSEL_TENSOR_SCALAR_MODE)
        twin::fail_at(loc, "Select", "VSEL_TENSOR_SCALAR_MODE takes a scalar src1");
    const T* y = twin_ops::ptr(src1);
    twin_ops::select_impl("Select", dst, selMask, src0, &src1, [y](uint32_t i) { return y[i]; }, selMode, count,
                          loc);
}

// Gather: dst[i] = the element of src at byte offset srcBaseAddr + srcOffset[i] (离散与聚合/Gather.md).
template <typename T>
__aicore__ inline void Gather(const LocalTensor<T>& dst, const LocalTensor<T>& src,
                              const LocalTensor<uint32_t>& srcOffset, const uint32_t srcBaseAddr,
                              const uint32_t count, twin::Loc loc = {}) {
    static const char* api = "Gather";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin_ops::check_ub(dst, count, api, loc, "destination");
    twin_ops::check_ub(src, 0, api, loc, "source");
    twin_ops::check_ub(srcOffset, count, api, loc, "srcOffset");
    if (count == 0) return;
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    twin_ops::rd(c, srcOffset, count * 4, twin::kV, e, site, api, loc);
    const uint32_t* off = twin_ops::ptr(srcOffset);
    T* d = twin_ops::ptr(dst);
    std::vector<T> out(count);
    for (uint32_t i = 0; i < count; ++i) {
        const uint64_t b = static_cast<uint64_t>(srcBaseAddr) + off[i];
        if (b % sizeof(T) != 0 || b + sizeof(T) > src.len_)
            twin::fail_at(loc, api, "offset %llu bytes of element %u is outside the source (%u bytes) or misaligned",
                          static_cast<unsigned long long>(b), i, src.len_);
        twin::ub_access(c, src.offset() + b, sizeof(T), twin::kV, false, e, site, api, loc);
        std::memcpy(&out[i], src.addr_ + b, sizeof(T));
    }
    twin_ops::wr(c, dst, count * sizeof(T), twin::kV, e, site, api, loc);
    std::memcpy(d, out.data(), count * sizeof(T));
}

// CreateVecIndex: dst[i] = firstValue + i.
template <typename T>
__aicore__ inline void CreateVecIndex(const LocalTensor<T>& dst, const T firstValue, uint32_t calCount,
                                      twin::Loc loc = {}) {
    static const char* api = "CreateVecIndex";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin_ops::check_ub(dst, calCount, api, loc, "destination");
    if (calCount == 0) return;
    const uint32_t e = twin::issue(c, twin::kV);
    twin_ops::wr(c, dst, calCount * sizeof(T), twin::kV, e, twin::site_id(api, loc), api, loc);
    T* d = twin_ops::ptr(dst);
    for (uint32_t i = 0; i < calCount; ++i) d[i] = static_cast<T>(twin_ops::f(firstValue) + static_cast<float>(i));
}

// Bitwise And / Or of 16-bit integers (逻辑计算).
#define TWIN_LOGIC(NAME, OP)                                                                                        \
    template <typename T>                                                                                           \
    __aicore__ inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
                                const int32_t& count, twin::Loc loc = {}) {                                         \
        static_assert(std::is_same<T, uint16_t>::value || std::is_same<T, int16_t>::value, #NAME ": 16-bit ints"); \
        twin_ops::binary(#NAME, dst, src0, src1, count, [](T x, T y) -> T { return static_cast<T>(x OP y); }, loc); \
    }
TWIN_LOGIC(And, &)
TWIN_LOGIC(Or, |)
#undef TWIN_LOGIC

// ---- Tanh (advanced API, math) ---------------------------------------------------------------------------------
namespace twin_ops {
template <typename T>
inline void tanh_impl(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<uint8_t>* tmp,
                      uint32_t count, const Loc& loc) {
    static const char* api = "Tanh";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    static_assert(std::is_same<T, float>::value || std::is_same<T, half>::value, "Tanh: half / float only");
    check_ub(dst, count, api, loc, "destination");
    check_ub(src, count, api, loc, "source");
    check_overlap(dst, count, src, count, api, loc, false);  // "不支持源操作数与目的操作数地址重叠"
    uint64_t tmp_off, tmp_len;
    if (tmp != nullptr) {
        check_ub(*tmp, 0, api, loc, "sharedTmpBuffer");
        tmp_off = tmp->offset();
        tmp_len = tmp->len_;
        check_overlap(*tmp, tmp_len, dst, count * sizeof(T), api, loc, false);
        check_overlap(*tmp, tmp_len, src, count * sizeof(T), api, loc, false);
    } else {
        // the framework pops the UB left after the TPipe's buffers (PopStackBuffer)
        tmp_off = (c.pipe_end + 31) / 32 * 32;
        tmp_len = c.ub_size > tmp_off ? c.ub_size - tmp_off : 0;
    }
    const uint64_t stack = (tmp_len / (sizeof(T) == 2 ? 2 : 1)) / 32 * 32;
    if (stack < 32)
        twin::fail_at(loc, api, "temporary buffer of %llu bytes is too small (no UB left after the TPipe buffers?)",
                      static_cast<unsigned long long>(tmp_len));
    if (count == 0) return;
    const uint32_t e = twin::issue(c, twin::kV);
    const uint16_t site = twin::site_id(api, loc);
    rd(c, src, count * sizeof(T), twin::kV, e, site, api, loc);
    const uint64_t used = std::min<uint64_t>(tmp_len, static_cast<uint64_t>(count) * 4 * (sizeof(T) == 2 ? 2 : 1));
    twin::ub_access(c, tmp_off, used, twin::kV, true, e, site, api, loc);
    wr(c, dst, count * sizeof(T), twin::kV, e, site, api, loc);
    T* d = ptr(dst);
    const T* s = ptr(src);
    for (uint32_t i = 0; i < count; ++i) {
        float x = f(s[i]);
        x = std::min(x, 8.8f);
        x = std::max(x, -8.8f);
        const float e2 = std::exp(x * 2.0f);
        d[i] = from<T>((e2 - 1.0f) / (e2 + 1.0f));
    }
    std::memset(c.ub + tmp_off, 0xff, used);
}
}  // namespace twin_ops

template <typename T, bool isReuseSource = false>
__aicore__ inline void Tanh(const LocalTensor<T>& dstTensor, const LocalTensor<T>& srcTensor,
                            const LocalTensor<uint8_t>& sharedTmpBuffer, const uint32_t calCount, twin::Loc loc = {}) {
    twin_ops::tanh_impl(dstTensor, srcTensor, &sharedTmpBuffer, calCount, loc);
}
template <typename T, bool isReuseSource = false>
__aicore__ inline void Tanh(const LocalTensor<T>& dstTensor, const LocalTensor<T>& srcTensor, const uint32_t calCount,
                            twin::Loc loc = {}) {
    twin_ops::tanh_impl<T>(dstTensor, srcTensor, nullptr, calCount, loc);
}

}  // namespace AscendC

#endif  // FUSED_LCE_TWIN_OPS_H_
