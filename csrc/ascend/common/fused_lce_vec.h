// Vector-core (AIV) building blocks shared by the two kernels. All arithmetic is float32 in the unified buffer
// (UB). Each function is the AscendC form of one function of fused_lce/backends/npu_emulator.py, named after it:
//   vector_logits   -> VectorLogits   (bias, softcap on a C tile)
//   online_update   -> OnlineUpdate   (max / sum-exp / target / sum / first argmax over one vocabulary block)
//   merge_segments  -> MergeStats     (finishing phase of the forward kernel)
//   grads (dz part) -> TileGradient   (dz of one tile, its column sums, its cast to the operand dtype)
// Status: written, not compiled here (no CANN toolkit), not run on hardware.
#ifndef FUSED_LCE_VEC_H_
#define FUSED_LCE_VEC_H_

#include "kernel_operator.h"

namespace fused_lce_kernel {

using namespace AscendC;

constexpr float kNegInf = -3.4028234663852886e38f * 2.0f;  // -inf (the compiler folds the overflow)
constexpr uint32_t kFloatsPerBlock = 8;                    // 32-byte UB block

// Per-row float32 slots of the `rows` UB region (fused_lce::tiling::kRowSlots = 12 slots of align8(vec_rows)).
enum RowSlot : uint32_t {
    kRowMax = 0, kRowSum, kRowTarget, kRowZsum, kRowArgmax,   // running statistics (argmax: int32 bits)
    kRowTileMax, kRowTileSum, kRowScale,                      // per-block temporaries
    kRowCoefP, kRowCoefT, kRowCoefU,                          // backward coefficients a, t, u
    kRowLabel,                                                // shard-local label (int32 bits)
};

struct RowView {
    LocalTensor<float> base;
    uint32_t stride;  // align8(vec_rows)
    __aicore__ inline LocalTensor<float> slot(RowSlot s) const { return base[s * stride]; }
};

// z[r, :cols] += bias[:cols]; then z = c * tanh(z / c) when softcap c > 0. z rows are base_n apart.
__aicore__ inline void VectorLogits(const LocalTensor<float>& z, const LocalTensor<float>& biasF32, bool hasBias,
                                    float softcap, uint32_t rows, uint32_t cols, uint32_t baseN,
                                    const LocalTensor<float>& scratch) {
    if (hasBias) {
        for (uint32_t r = 0; r < rows; ++r) {
            Add(z[r * baseN], z[r * baseN], biasF32, cols);
        }
        PipeBarrier<PIPE_V>();
    }
    if (softcap > 0.0f) {
        const uint32_t count = rows * baseN;  // padding columns hold -inf: tanh keeps them at -c, masked later
        Muls(z, z, 1.0f / softcap, count);
        PipeBarrier<PIPE_V>();
        Tanh(scratch, z, count);
        PipeBarrier<PIPE_V>();
        Muls(z, scratch, softcap, count);
        PipeBarrier<PIPE_V>();
    }
}

// One vocabulary block of the online softmax for `rows` rows. `c0` is the block's first shard-local column,
// labels in kRowLabel are shard-local (out-of-shard labels are negative or >= V_local and never hit).
// Mirrors npu_emulator.online_update, including its guards: the first maximum keeps the argmax (strict >), and
// rows whose running max is still -inf keep sum = 0.
__aicore__ inline void OnlineUpdate(const LocalTensor<float>& z, const RowView& rv, uint32_t rows, uint32_t cols,
                                    uint32_t baseN, int32_t c0, bool withZsum, const LocalTensor<float>& work,
                                    const LocalTensor<float>& reduceTmp) {
    LocalTensor<float> m = rv.slot(kRowMax);
    LocalTensor<float> s = rv.slot(kRowSum);
    LocalTensor<float> zt = rv.slot(kRowTarget);
    LocalTensor<float> zs = rv.slot(kRowZsum);
    LocalTensor<int32_t> am = rv.slot(kRowArgmax).ReinterpretCast<int32_t>();
    LocalTensor<int32_t> lab = rv.slot(kRowLabel).ReinterpretCast<int32_t>();
    for (uint32_t r = 0; r < rows; ++r) {
        LocalTensor<float> zr = z[r * baseN];
        // (value, index) of the first maximum of the row; the index comes back as the bits of a float
        ReduceMax<float>(reduceTmp, zr, work, cols, true);
        PipeBarrier<PIPE_V>();
        const float tmax = reduceTmp.GetValue(0);
        const float tidxBits = reduceTmp.GetValue(1);
        const uint32_t tidx = *reinterpret_cast<const uint32_t*>(&tidxBits);
        const float mOld = m.GetValue(r);
        const float mNew = tmax > mOld ? tmax : mOld;
        if (tmax > mOld) {
            am.SetValue(r, c0 + static_cast<int32_t>(tidx));
        }
        const int32_t y = lab.GetValue(r) - c0;
        if (y >= 0 && y < static_cast<int32_t>(cols)) {
            zt.SetValue(r, zt.GetValue(r) + zr.GetValue(y));
        }
        if (withZsum) {
            ReduceSum<float>(reduceTmp, zr, work, cols);
            PipeBarrier<PIPE_V>();
            zs.SetValue(r, zs.GetValue(r) + reduceTmp.GetValue(0));
        }
        if (mNew == kNegInf) {
            continue;  // nothing finite yet: sum stays 0 (exp(-inf - -inf) would be NaN)
        }
        // sum = sum * exp(mOld - mNew) + sum(exp(z - mNew)); the rescale of one scalar goes through the vector
        // unit (the scalar unit has no exp)
        Adds(work, zr, -mNew, cols);
        PipeBarrier<PIPE_V>();
        Exp(work, work, cols);
        PipeBarrier<PIPE_V>();
        ReduceSum<float>(reduceTmp, work, work, cols);
        PipeBarrier<PIPE_V>();
        const float tileSum = reduceTmp.GetValue(0);
        float scale = 1.0f;
        if (mOld != mNew) {
            Duplicate(work, mOld - mNew, kFloatsPerBlock);
            PipeBarrier<PIPE_V>();
            Exp(work, work, kFloatsPerBlock);
            PipeBarrier<PIPE_V>();
            scale = work.GetValue(0);
        }
        s.SetValue(r, s.GetValue(r) * scale + tileSum);
        m.SetValue(r, mNew);
    }
}

// dz of one tile for `rows` rows, in place in z (float32), as npu_emulator.grads:
//   p = exp(z - lse); dz = a * p - u - t * onehot(label); dz *= 1 - (z / c)^2 with softcap c (z is capped)
// zCapped keeps the capped logits when softcap is on (work2 region). Columns >= cols are zeroed so that they add
// nothing to the GEMMs that consume the tile. colsum (db) accumulates the float32 dz over the rows.
__aicore__ inline void TileGradient(const LocalTensor<float>& z, const LocalTensor<float>& zCapped,
                                    const LocalTensor<float>& lse, const RowView& rv, uint32_t rows, uint32_t cols,
                                    uint32_t baseN, int32_t c0, float softcap, bool wantColsum,
                                    const LocalTensor<float>& colsum) {
    LocalTensor<float> a = rv.slot(kRowCoefP);
    LocalTensor<float> t = rv.slot(kRowCoefT);
    LocalTensor<float> u = rv.slot(kRowCoefU);
    LocalTensor<int32_t> lab = rv.slot(kRowLabel).ReinterpretCast<int32_t>();
    if (softcap > 0.0f) {
        DataCopy(zCapped, z, rows * baseN);
        PipeBarrier<PIPE_V>();
    }
    for (uint32_t r = 0; r < rows; ++r) {
        LocalTensor<float> zr = z[r * baseN];
        Adds(zr, zr, -lse.GetValue(r), cols);
        PipeBarrier<PIPE_V>();
        Exp(zr, zr, cols);
        PipeBarrier<PIPE_V>();
        Muls(zr, zr, a.GetValue(r), cols);
        PipeBarrier<PIPE_V>();
        Adds(zr, zr, -u.GetValue(r), cols);
        PipeBarrier<PIPE_V>();
        const int32_t y = lab.GetValue(r) - c0;
        if (y >= 0 && y < static_cast<int32_t>(cols)) {
            zr.SetValue(y, zr.GetValue(y) - t.GetValue(r));
        }
        if (cols < baseN) {
            Duplicate(zr[cols], 0.0f, baseN - cols);
        }
    }
    PipeBarrier<PIPE_V>();
    if (softcap > 0.0f) {
        // 1 - (zc / c)^2, multiplied into dz
        const uint32_t count = rows * baseN;
        Muls(zCapped, zCapped, 1.0f / softcap, count);
        PipeBarrier<PIPE_V>();
        Mul(zCapped, zCapped, zCapped, count);
        PipeBarrier<PIPE_V>();
        Muls(zCapped, zCapped, -1.0f, count);
        PipeBarrier<PIPE_V>();
        Adds(zCapped, zCapped, 1.0f, count);
        PipeBarrier<PIPE_V>();
        Mul(z, z, zCapped, count);
        PipeBarrier<PIPE_V>();
    }
    if (wantColsum) {
        Duplicate(colsum, 0.0f, baseN);
        PipeBarrier<PIPE_V>();
        for (uint32_t r = 0; r < rows; ++r) {
            Add(colsum, colsum, z[r * baseN], baseN);
            PipeBarrier<PIPE_V>();
        }
    }
}

}  // namespace fused_lce_kernel

#endif  // FUSED_LCE_VEC_H_
