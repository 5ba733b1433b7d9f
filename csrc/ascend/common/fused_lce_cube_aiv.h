// Whole-tile vector building blocks of the cube-driven kernels (fused_lce_stats_cube.cpp). Status: compiled and
// run on CPU against the AscendC API twin (tests/support/ascendc_twin); not run on NPU hardware.
//
// A tile is `rows` rows of baseN floats at a row stride of baseN (baseN a multiple of 16, so every row starts on a
// 32-byte block); the first `cols` columns are data, the others are never read as data. Per-row work is one level-0
// instruction per 64-column chunk (a 256-byte repeat) with one repeat per row: mask = the chunk's data columns,
// repeat stride = baseN / 8 blocks (asc-devkit docs SIMD计算说明/高维切分, BinaryRepeatParams; 归约计算/ReduceRepeat;
// 数据填充/Brcb). Per-row results live in row slots of `stride` = align64(rows) floats, so the statistics are updated
// with count-form instructions over whole 256-byte repeats (Compare / Select need whole repeats, Compare.md).
// Callers order the pipes; inside a function every dependent vector instruction follows a PipeBarrier<PIPE_V>.
#ifndef FUSED_LCE_CUBE_AIV_H_
#define FUSED_LCE_CUBE_AIV_H_

#include "kernel_operator.h"

namespace fused_lce_cube {

using namespace AscendC;

constexpr uint32_t kChunk = 64;          // floats of one 256-byte repeat
constexpr float kMinFinite = -3.4028234663852886e38f;  // -FLT_MAX: a finite shift for rows whose max is -inf
constexpr float kExpFloor = -104.0f;     // float32 exp underflows to 0 below (the ez contract floors z - m here)

__aicore__ inline float NegInf() {
    union {
        uint32_t u;
        float f;
    } v{0xff800000u};
    return v.f;
}

// One-directional pipe order point with an id the TPipe reports free (as asc-devkit's own APIs do).
template <HardEvent ev>
__aicore__ inline void Order() {
    const event_t id = static_cast<event_t>(GetTPipePtr()->FetchEventID(ev));
    SetFlag<ev>(id);
    WaitFlag<ev>(id);
}

__aicore__ inline uint32_t ChunkMask(uint32_t cols, uint32_t c) { return cols - c < kChunk ? cols - c : kChunk; }

// Parameter structs are built with parentheses from full-width values, never narrowed here: a value too large for
// CANN's field then reaches the twin's field checks (tests/support/ascendc_twin, docs/npu-twin-rules.md) instead of
// being cut silently (a braced list would not compile against the real headers, whose fields are 8 / 16 / 32 bits).
template <typename T>
__aicore__ inline DataCopyPadExtParams<T> NoPad() {
    return DataCopyPadExtParams<T>(false, 0, 0, 0);
}

// rows x cols elements at row stride srcLd in GM -> UB rows at stride dstLd (a multiple of 32 bytes): one DataCopy
// when both strides are the row, else DataCopyPad (GM gap in bytes, UB gap in 32-byte blocks, DataCopyPad(GMToUB).md).
template <typename T>
__aicore__ inline void CopyRows(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint64_t rows, uint64_t cols,
                                uint64_t srcLd, uint64_t dstLd) {
    if (srcLd == cols && dstLd == cols) {
        DataCopy(dst, src, rows * cols);
        return;
    }
    const uint64_t rowBytes = cols * sizeof(T), rowBlocks = (rowBytes + 31) / 32;
    const DataCopyExtParams cp(rows, rowBytes, (srcLd - cols) * sizeof(T), dstLd * sizeof(T) / 32 - rowBlocks, 0);
    DataCopyPad(dst, src, cp, NoPad<T>());
}
// UB rows of `cols` elements at stride srcLd (a multiple of 32 bytes) -> GM rows at stride dstLd.
template <typename T>
__aicore__ inline void StoreRows(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint64_t rows, uint64_t cols,
                                 uint64_t srcLd, uint64_t dstLd) {
    const uint64_t rowBytes = cols * sizeof(T), rowBlocks = (rowBytes + 31) / 32;
    DataCopyPad(dst, src, DataCopyExtParams(rows, rowBytes, srcLd * sizeof(T) / 32 - rowBlocks, (dstLd - cols) * sizeof(T),
                                            0));
}

// Row-wise tile (rows x baseN) op with a row vector broadcast: dst[r, :cols] = op(x[r, :cols], v) where v is one row
// of baseN floats (src1 repeat stride 0: every repeat reads the same row, e.g. the bias) or, with `perRowBlock`, a
// Brcb result holding row r's value in block r (src1 block stride 0, repeat stride 1).
enum class RowOp { kAdd, kSub, kMul, kMax };
__aicore__ inline void RowBroadcast(RowOp op, const LocalTensor<float>& dst, const LocalTensor<float>& x,
                                    const LocalTensor<float>& v, bool perRowBlock, uint32_t rows, uint32_t cols,
                                    uint32_t baseN) {
    const uint32_t rs = baseN / 8;
    const BinaryRepeatParams p =
        perRowBlock ? BinaryRepeatParams(1, 1, 0, rs, rs, 1) : BinaryRepeatParams(1, 1, 1, rs, rs, 0);
    for (uint32_t c = 0; c < cols; c += kChunk) {
        const LocalTensor<float> vv = perRowBlock ? v : v[c];
        const uint64_t mask = ChunkMask(cols, c);
        const uint32_t rep = rows;
        switch (op) {
            case RowOp::kAdd: Add(dst[c], x[c], vv, mask, rep, p); break;
            case RowOp::kSub: Sub(dst[c], x[c], vv, mask, rep, p); break;
            case RowOp::kMul: Mul(dst[c], x[c], vv, mask, rep, p); break;
            case RowOp::kMax: Max(dst[c], x[c], vv, mask, rep, p); break;
        }
    }
}

// sum[r] = sum over the data columns of x[r, :]: ReduceRepeat SUM per chunk (the first straight into `sum`), the
// other chunks' sums added in chunk order. `red` is a row slot of scratch.
__aicore__ inline void RowSum(const LocalTensor<float>& sum, const LocalTensor<float>& x, uint32_t rows, uint32_t cols,
                              uint32_t baseN, uint32_t stride, const LocalTensor<float>& red) {
    const int32_t rs = static_cast<int32_t>(baseN / 8);
    ReduceRepeat<ReduceType::SUM, float, float>(sum, x, static_cast<int32_t>(ChunkMask(cols, 0)),
                                                static_cast<int32_t>(rows), 1, 1, rs);
    for (uint32_t c = kChunk; c < cols; c += kChunk) {
        PipeBarrier<PIPE_V>();
        ReduceRepeat<ReduceType::SUM, float, float>(red, x[c], static_cast<int32_t>(ChunkMask(cols, c)),
                                                    static_cast<int32_t>(rows), 1, 1, rs);
        PipeBarrier<PIPE_V>();
        Add(sum, sum, red, stride);
    }
}

// Row max and the first column index holding it: ReduceRepeat MAX gives each chunk's max and its first index
// (ReduceRepeat.md: the smallest index among equal maxima); chunks are combined in column order keeping the earlier
// chunk on ties (strict >). `idx` holds float column indices (exact: baseN <= 256). `cv`, `ci` are scratch slots,
// `mask` a Compare mask of stride bits.
__aicore__ inline void RowMaxArgmax(const LocalTensor<float>& mx, const LocalTensor<float>& idx,
                                    const LocalTensor<float>& x, uint32_t rows, uint32_t cols, uint32_t baseN,
                                    uint32_t stride, const LocalTensor<float>& cv, const LocalTensor<float>& ci,
                                    const LocalTensor<uint8_t>& mask) {
    const int32_t rs = static_cast<int32_t>(baseN / 8);
    const int32_t r = static_cast<int32_t>(rows);
    ReduceRepeat<ReduceType::MAX, float, float>(mx, x, static_cast<int32_t>(ChunkMask(cols, 0)), r, 1, 1, rs,
                                                ReduceOrder::ORDER_ONLY_VALUE);
    ReduceRepeat<ReduceType::MAX, float, float>(idx, x, static_cast<int32_t>(ChunkMask(cols, 0)), r, 1, 1, rs,
                                                ReduceOrder::ORDER_ONLY_INDEX);
    PipeBarrier<PIPE_V>();
    Cast(idx, idx.ReinterpretCast<int32_t>(), RoundMode::CAST_NONE, stride);  // uint32 index bits -> float
    for (uint32_t c = kChunk; c < cols; c += kChunk) {
        PipeBarrier<PIPE_V>();
        ReduceRepeat<ReduceType::MAX, float, float>(cv, x[c], static_cast<int32_t>(ChunkMask(cols, c)), r, 1, 1, rs,
                                                    ReduceOrder::ORDER_ONLY_VALUE);
        ReduceRepeat<ReduceType::MAX, float, float>(ci, x[c], static_cast<int32_t>(ChunkMask(cols, c)), r, 1, 1, rs,
                                                    ReduceOrder::ORDER_ONLY_INDEX);
        PipeBarrier<PIPE_V>();
        Cast(ci, ci.ReinterpretCast<int32_t>(), RoundMode::CAST_NONE, stride);
        Compare(mask, cv, mx, CMPMODE::GT, stride);
        PipeBarrier<PIPE_V>();
        Adds(ci, ci, static_cast<float>(c), stride);
        Select(mx, mask, cv, mx, SELMODE::VSEL_TENSOR_TENSOR_MODE, stride);
        PipeBarrier<PIPE_V>();
        Select(idx, mask, ci, idx, SELMODE::VSEL_TENSOR_TENSOR_MODE, stride);
    }
}

// s = (s + k) x
__aicore__ inline void HornerStep(const LocalTensor<float>& s, const LocalTensor<float>& x, float k, uint32_t count) {
    PipeBarrier<PIPE_V>();
    Adds(s, s, k, count);
    PipeBarrier<PIPE_V>();
    Mul(s, s, x, count);
}

// z = c tanh(z / c) on the first `count` floats of a tile (count a multiple of 64: Compare / Select take whole
// 256-byte repeats), to about one float32 unit for every c. With y = z / c: CANN's Tanh where |y| >= 0.625 (its
// (e^2y - 1) / (e^2y + 1) is accurate there), z (1 + y^2 P(y^2)) below (P: the odd polynomial of Cephes' tanhf; z
// itself where y^2 underflows or 1 / c is flushed to 0, so a huge c leaves the logits as they are). That quotient
// alone cancels for small |y|: an error ~6e-8 c, and every logit 0 once e^2y rounds to 1. `y`, `s`: tile scratch;
// `mask`: count bits.
__aicore__ inline void Softcap(const LocalTensor<float>& z, const LocalTensor<float>& y, const LocalTensor<float>& s,
                               const LocalTensor<uint8_t>& mask, float c, uint32_t count) {
    Muls(y, z, 1.0f / c, count);
    PipeBarrier<PIPE_V>();
    Tanh(s, y, count);
    PipeBarrier<PIPE_V>();
    Mul(y, y, y, count);  // y^2
    Muls(s, s, c, count);
    PipeBarrier<PIPE_V>();
    Compares(mask, y, 0.625f * 0.625f, CMPMODE::LT, count);  // the polynomial's range (NaN: the Tanh side)
    PipeBarrier<PIPE_V>();
    Select(z, mask, z, s, SELMODE::VSEL_TENSOR_TENSOR_MODE, count);  // z there, c tanh(y) elsewhere
    PipeBarrier<PIPE_V>();
    Muls(s, y, -5.70498872745e-3f, count);  // Horner in y^2
    HornerStep(s, y, 2.06390887954e-2f, count);
    HornerStep(s, y, -5.37397155531e-2f, count);
    HornerStep(s, y, 1.33314422036e-1f, count);
    HornerStep(s, y, -3.33332819422e-1f, count);
    PipeBarrier<PIPE_V>();
    Adds(s, s, 1.0f, count);  // 1 + y^2 P(y^2)
    PipeBarrier<PIPE_V>();
    Select(s, mask, s, 1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
    PipeBarrier<PIPE_V>();
    Mul(z, z, s, count);
    PipeBarrier<PIPE_V>();
}

// The bias block's UB buffers of a vector core from the plan's layout: as loaded (operand dtype, base_n rounded up
// to 16 elements) and as float32 (the same buffer when the operand dtype is float32).
template <typename T>
__aicore__ inline void BiasBuffers(TBuf<TPosition::VECCALC>& ub, uint32_t baseN, uint32_t offIn, uint32_t offF32,
                                   LocalTensor<T>* in, LocalTensor<float>* f32) {
    *in = ub.GetWithOffset<T>((baseN + 15u) / 16u * 16u, offIn);
    if constexpr (IsSameType<T, float>::value) {
        *f32 = *in;
    } else {
        *f32 = ub.GetWithOffset<float>(baseN, offF32);
    }
}

}  // namespace fused_lce_cube

#endif  // FUSED_LCE_CUBE_AIV_H_
