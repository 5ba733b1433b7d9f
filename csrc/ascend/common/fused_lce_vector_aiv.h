// Vector-core (AIV) building blocks of the vector-driven pair (FusedLceStatsVector / FusedLceGradVector). All
// arithmetic is float32 in the unified buffer (UB). Status: compiled and run on CPU against an AscendC API twin
// (tests/support/ascendc_twin); not run on NPU hardware.
//
// Conventions every function here follows (the twin checks each of them, see docs/npu-status.md):
//   * a C tile z holds `rows` rows at a stride of baseN floats, of which the first `cols` are logits; the columns
//     [cols, baseN) hold whatever the cube's staging buffer held and are never read as data (every per-row vector
//     op uses `cols` elements; whole-tile element-wise ops may run over them, their results are never used);
//   * vector operands start on 32-byte UB blocks (asc-devkit docs 通用说明和约束: "Unified Buffer 32Byte对齐"), so
//     per-row slices z[r * baseN] are aligned because baseN is a multiple of 16;
//   * in-place element-wise ops (dst the same tensor as a source) overlap 100%, which 通用说明和约束 (通用地址重叠约束)
//     allows; partial overlaps never occur (every view starts at a row or plane boundary);
//   * pipes are ordered explicitly: PipeBarrier<PIPE_V> between dependent vector instructions, SetFlag/WaitFlag
//     V_S before the scalar unit reads what the vector unit wrote and S_V before the vector unit touches what the
//     scalar unit read or wrote (asc-devkit docs 同步控制/核内同步; the kernels do not rely on the compiler's
//     --cce-auto-sync to insert these).
#ifndef FUSED_LCE_VECTOR_AIV_H_
#define FUSED_LCE_VECTOR_AIV_H_

#include "kernel_operator.h"

namespace fused_lce_kernel {

using namespace AscendC;

// -inf as a bit pattern: `-FLT_MAX * 2` overflows and is not a constant expression for g++.
constexpr uint32_t kNegInfBits = 0xff800000u;
__aicore__ inline float NegInf() {
    union {
        uint32_t u;
        float f;
    } v{kNegInfBits};
    return v.f;
}
constexpr float kMinFinite = -3.4028234663852886e38f;  // -FLT_MAX: a finite shift for rows whose max is -inf
constexpr uint32_t kFloatsPerBlock = 8;                 // 32-byte UB block
constexpr uint32_t kReduceTmpFloats = 16;               // ReduceMax(calIndex) scratch per row for count <= 256
                                                        // (ReduceMax.md sharedTmpBuffer formula)

// Per-row float32 slots of the `rows` UB region (fused_lce::tiling::kRowSlots slots of align8(vec_rows) floats).
// The statistics come first, in output order, so that the kernels copy slots kRowMax + k for k < statistics.
enum RowSlot : uint32_t {
    kRowMax = 0, kRowSum, kRowTarget, kRowZsum, kRowArgmax, kRowEz,  // running statistics (argmax: int32 bits)
    kRowTileSum, kRowTileZsum, kRowTileEz, kRowScaleArg, kRowScale,   // per-block temporaries of the online update
    kRowRedPair,                                                      // ReduceMax (value, index) pairs: 2 slots
    kRowCoefA = kRowRedPair + 2, kRowCoefT, kRowCoefB, kRowCoefU,     // backward coefficients (Coefs) a, t, b, u
    kRowLse, kRowLabel,                                               // lse, shard-local label (int32 bits)
    kRowLive,                                                         // backward: 1 unless all coefficients are 0
    kRowSlotCount
};
// The floor of z - m in the entropy sum and of z - lse in the b * z term: exp(-104) is below float32's smallest
// subnormal (exp(-103.97) = 2^-149), so a logit that far below the max has p = 0 and contributes exactly 0 instead
// of 0 * (-inf) = NaN at a -inf logit (docs/providers.md, "Log-probs and entropy").
constexpr float kLogFloor = -104.0f;

struct RowView {
    LocalTensor<float> base;
    uint32_t stride;  // align8(vec_rows)
    __aicore__ inline LocalTensor<float> slot(uint32_t s) const { return base[s * stride]; }
};

// One-directional pipe order point: everything issued on the source pipe before it is complete before the
// destination pipe continues. SetFlag / WaitFlag are paired with the same event and an id the TPipe reports free
// (FetchEventID, as asc-devkit's own APIs do, e.g. matmul_client.h CopyToUB), so ids never collide with the
// framework's.
template <HardEvent ev>
__aicore__ inline void Order() {
    const event_t id = static_cast<event_t>(GetTPipePtr()->FetchEventID(ev));
    SetFlag<ev>(id);
    WaitFlag<ev>(id);
}

// z[r, :cols] += bias[:cols]; then z = c * tanh(z / c) when softcap c > 0, keeping tanh(z / c) = z_capped / c in
// `capScratch` (the backward's softcap derivative needs it); then z *= invTemp (softcap first, then temperature,
// as the contract and TRL's chunked log-prob transform). Entered with z and bias readable by the vector pipe.
__aicore__ inline void VectorLogits(const LocalTensor<float>& z, const LocalTensor<float>& biasF32, bool hasBias,
                                    float softcap, float invTemp, uint32_t rows, uint32_t cols, uint32_t baseN,
                                    const LocalTensor<float>& capScratch) {
    if (hasBias) {
        for (uint32_t r = 0; r < rows; ++r) {
            Add(z[r * baseN], z[r * baseN], biasF32, cols);
        }
        PipeBarrier<PIPE_V>();
    }
    if (softcap > 0.0f) {
        const uint32_t count = rows * baseN;
        Muls(z, z, 1.0f / softcap, count);
        PipeBarrier<PIPE_V>();
        Tanh(capScratch, z, count);  // source and destination must not overlap (Tanh.md)
        PipeBarrier<PIPE_V>();
        Muls(z, capScratch, softcap, count);
        PipeBarrier<PIPE_V>();
    }
    if (invTemp != 1.0f) {
        Muls(z, z, invTemp, rows * baseN);  // whole tile: the padding columns are never read as data
        PipeBarrier<PIPE_V>();
    }
}

// One vocabulary block of the online softmax for `rows` rows, the shard-local columns [c0, c0 + cols).
// Mirrors the float64-tested semantics: the first maximum keeps the argmax (strict >; ReduceMax returns the
// smallest index among equal maxima, ReduceMax.md), rows whose running max is still -inf keep sum = 0, and
//   sum = sum * exp(m_old - m_new) + sum_j exp(z_j - m_new);
// with `withEz` also the entropy statistic relative to the same running max,
//   ez = exp(m_old - m_new) * (ez + max(m_old - m_new, -104) * sum) + sum_j exp(z_j - m_new) * max(z_j - m_new, -104)
// (the floors make -inf logits and a -inf previous max add 0; at -104 the exp factor is 0 anyway). z is consumed
// (it holds max(z - m, -104) * exp(z - m) afterwards). `work` is a (rows x baseN) scratch tile. Entered with z
// readable by V and the row slots last touched by S or by S-ordered pipes; leaves with the S -> V order (S_V).
__aicore__ inline void OnlineUpdate(const LocalTensor<float>& z, const RowView& rv, uint32_t rows, uint32_t cols,
                                    uint32_t baseN, int32_t c0, bool withZsum, bool withEz,
                                    const LocalTensor<float>& work) {
    LocalTensor<float> m = rv.slot(kRowMax);
    LocalTensor<float> s = rv.slot(kRowSum);
    LocalTensor<float> zt = rv.slot(kRowTarget);
    LocalTensor<float> zs = rv.slot(kRowZsum);
    LocalTensor<int32_t> am = rv.slot(kRowArgmax).ReinterpretCast<int32_t>();
    LocalTensor<int32_t> lab = rv.slot(kRowLabel).ReinterpretCast<int32_t>();
    LocalTensor<float> pair = rv.slot(kRowRedPair);
    LocalTensor<float> tileSum = rv.slot(kRowTileSum);
    LocalTensor<float> tileZsum = rv.slot(kRowTileZsum);
    LocalTensor<float> scaleArg = rv.slot(kRowScaleArg);
    LocalTensor<float> scale = rv.slot(kRowScale);
    LocalTensor<float> ez = rv.slot(kRowEz);
    LocalTensor<float> tileEz = rv.slot(kRowTileEz);
    const float negInf = NegInf();

    // 1. per row: (max, first index) and the sum of logits, into distinct row slots
    for (uint32_t r = 0; r < rows; ++r) {
        ReduceMax<float>(pair[2 * r], z[r * baseN], work[r * kReduceTmpFloats], cols, true);
        if (withZsum) {
            ReduceSum<float>(tileZsum[r], z[r * baseN], work[r * kReduceTmpFloats], cols);
        }
    }
    Order<HardEvent::V_S>();
    // 2. scalar: new max, argmax, target logit, sum of logits, the rescale argument m_old - m_new
    for (uint32_t r = 0; r < rows; ++r) {
        const float tmax = pair.GetValue(2 * r);
        const float tidxBits = pair.GetValue(2 * r + 1);
        const uint32_t tidx = *reinterpret_cast<const uint32_t*>(&tidxBits);  // index stored as float bits
        const float mOld = m.GetValue(r);
        const float mNew = (tmax > mOld || tmax != tmax) ? tmax : mOld;  // a NaN maximum propagates
        if (tmax > mOld) {
            am.SetValue(r, c0 + static_cast<int32_t>(tidx));
        }
        const int32_t y = lab.GetValue(r) - c0;
        if (y >= 0 && y < static_cast<int32_t>(cols)) {
            zt.SetValue(r, zt.GetValue(r) + z.GetValue(r * baseN + static_cast<uint32_t>(y)));
        }
        if (withZsum) {
            zs.SetValue(r, zs.GetValue(r) + tileZsum.GetValue(r));
        }
        scaleArg.SetValue(r, mNew == negInf ? 0.0f : mOld - mNew);
        m.SetValue(r, mNew);
    }
    Order<HardEvent::S_V>();
    // 3. vector: exp(z - m_new) per row, the row sums, exp(m_old - m_new)
    PipeBarrier<PIPE_V>();  // the ReduceMax scratch in `work` is overwritten below
    uint32_t finiteRows = 0;
    for (uint32_t r = 0; r < rows; ++r) {
        const float mNew = m.GetValue(r);
        if (mNew != negInf) {
            Adds(work[r * baseN], z[r * baseN], -mNew, cols);
            ++finiteRows;
        }
    }
    if (finiteRows > 0) {
        PipeBarrier<PIPE_V>();
        if (withEz) {  // z (no longer needed: the target logit was read in step 2) <- max(z - m, -104)
            for (uint32_t r = 0; r < rows; ++r) {
                if (m.GetValue(r) != negInf) Maxs(z[r * baseN], work[r * baseN], kLogFloor, cols);
            }
            PipeBarrier<PIPE_V>();
        }
        Exp(work, work, rows * baseN);
        PipeBarrier<PIPE_V>();
        // ez terms before the row sums: the ReduceSums get their source as sharedTmpBuffer, which Atlas A2 / A3
        // (累加方式一) never touch (ReduceSum.md 关键特性说明); doing the Mul first does not depend on that
        if (withEz) {
            for (uint32_t r = 0; r < rows; ++r) {
                if (m.GetValue(r) != negInf) Mul(z[r * baseN], z[r * baseN], work[r * baseN], cols);
            }
            PipeBarrier<PIPE_V>();
        }
        for (uint32_t r = 0; r < rows; ++r) {
            if (m.GetValue(r) != negInf) {
                ReduceSum<float>(tileSum[r], work[r * baseN], work[r * baseN], cols);
                if (withEz) ReduceSum<float>(tileEz[r], z[r * baseN], z[r * baseN], cols);
            }
        }
    }
    Exp(scale, scaleArg, rows);
    Order<HardEvent::V_S>();
    // 4. scalar: sum = sum * exp(m_old - m_new) + tile sum (rows still at -inf keep sum = 0)
    for (uint32_t r = 0; r < rows; ++r) {
        if (m.GetValue(r) == negInf) {
            continue;
        }
        const float arg = scaleArg.GetValue(r);
        const float a = arg == 0.0f ? 1.0f : scale.GetValue(r);
        const float sOld = s.GetValue(r);
        if (withEz) {
            const float d = arg > kLogFloor ? arg : kLogFloor;  // -inf (first finite block): 0 * (0 - 104 * 0)
            ez.SetValue(r, a * (ez.GetValue(r) + d * sOld) + tileEz.GetValue(r));
        }
        s.SetValue(r, sOld * a + tileSum.GetValue(r));
    }
    Order<HardEvent::S_V>();
}

// dz of one tile for `rows` rows, in place in z (float32), from the per-token coefficients (Coefs) a, t, b, u:
//   p = exp(z - lse); dz = p * (a + b * max(z, lse - 104)) - t * onehot(label) - u; dz *= 1 - (z_capped / c)^2,
// z the tempered logits, `capTanh` = tanh(z_raw / c) = z_capped / c from VectorLogits (softcap c > 0 only). The
// b term runs only when `withB` (a b of the task is not 0) and uses `work` (rows x baseN) for the per-element
// coefficient; the floor at lse - 104 keeps p = 0 at z = -inf from giving 0 * (-inf) = NaN. Rows whose coefficients
// are all 0 (kRowLive = 0) are set to 0 whatever their logits (an all -inf row's lse is -inf); a NaN coefficient
// is not 0 and poisons its row. colsum (db) gets the column sums of dz over the rows. Entered with z readable by V,
// the coefficient slots written by S before an S_V order point, and colsum free for V; leaves with the vector
// results complete up to PipeBarrier<PIPE_V>.
__aicore__ inline void TileGradient(const LocalTensor<float>& z, const LocalTensor<float>& capTanh, const RowView& rv,
                                    uint32_t rows, uint32_t cols, uint32_t baseN, int32_t c0, float softcap,
                                    bool withB, const LocalTensor<float>& work, bool wantColsum,
                                    const LocalTensor<float>& colsum) {
    LocalTensor<float> a = rv.slot(kRowCoefA);
    LocalTensor<float> t = rv.slot(kRowCoefT);
    LocalTensor<float> b = rv.slot(kRowCoefB);
    LocalTensor<float> u = rv.slot(kRowCoefU);
    LocalTensor<float> lse = rv.slot(kRowLse);
    LocalTensor<float> live = rv.slot(kRowLive);
    LocalTensor<int32_t> lab = rv.slot(kRowLabel).ReinterpretCast<int32_t>();
    if (withB) {  // work = a + b * max(z, lse - 104), per row
        for (uint32_t r = 0; r < rows; ++r) {
            Maxs(work[r * baseN], z[r * baseN], lse.GetValue(r) + kLogFloor, cols);
        }
        PipeBarrier<PIPE_V>();
        for (uint32_t r = 0; r < rows; ++r) {
            Muls(work[r * baseN], work[r * baseN], b.GetValue(r), cols);
        }
        PipeBarrier<PIPE_V>();
        for (uint32_t r = 0; r < rows; ++r) {
            Adds(work[r * baseN], work[r * baseN], a.GetValue(r), cols);
        }
        PipeBarrier<PIPE_V>();  // z is overwritten below
    }
    for (uint32_t r = 0; r < rows; ++r) {
        Adds(z[r * baseN], z[r * baseN], -lse.GetValue(r), cols);
    }
    PipeBarrier<PIPE_V>();
    Exp(z, z, rows * baseN);
    PipeBarrier<PIPE_V>();
    for (uint32_t r = 0; r < rows; ++r) {
        if (withB) {
            Mul(z[r * baseN], z[r * baseN], work[r * baseN], cols);
        } else {
            Muls(z[r * baseN], z[r * baseN], a.GetValue(r), cols);
        }
    }
    PipeBarrier<PIPE_V>();
    for (uint32_t r = 0; r < rows; ++r) {
        Adds(z[r * baseN], z[r * baseN], -u.GetValue(r), cols);
    }
    Order<HardEvent::V_S>();
    for (uint32_t r = 0; r < rows; ++r) {
        const int32_t y = lab.GetValue(r) - c0;
        if (y >= 0 && y < static_cast<int32_t>(cols)) {
            const uint32_t k = r * baseN + static_cast<uint32_t>(y);
            z.SetValue(k, z.GetValue(k) - t.GetValue(r));
        }
    }
    Order<HardEvent::S_V>();
    if (softcap > 0.0f) {
        const uint32_t count = rows * baseN;  // 1 - (z_capped / c)^2, multiplied into dz
        Mul(capTanh, capTanh, capTanh, count);
        PipeBarrier<PIPE_V>();
        Muls(capTanh, capTanh, -1.0f, count);
        PipeBarrier<PIPE_V>();
        Adds(capTanh, capTanh, 1.0f, count);
        PipeBarrier<PIPE_V>();
        Mul(z, z, capTanh, count);
        PipeBarrier<PIPE_V>();
    }
    for (uint32_t r = 0; r < rows; ++r) {
        if (live.GetValue(r) == 0.0f) Duplicate(z[r * baseN], 0.0f, cols);
    }
    PipeBarrier<PIPE_V>();
    if (wantColsum) {
        Duplicate(colsum, 0.0f, cols);
        PipeBarrier<PIPE_V>();
        for (uint32_t r = 0; r < rows; ++r) {
            Add(colsum, colsum, z[r * baseN], cols);
            PipeBarrier<PIPE_V>();
        }
    }
}

}  // namespace fused_lce_kernel

#endif  // FUSED_LCE_VECTOR_AIV_H_
