// Tiling data of FusedLceStatsVector / FusedLceGradVector, shared by op_host (writes it) and op_kernel (reads it).
// Standard-C++ tiling struct (REGISTER_TILING_DEFAULT): the plan from fused_lce_tiling.h verbatim, the scalar
// attributes, and the Matmul API tilings of the GEMMs the kernels issue.
// Status: compiled (kernel side) against the AscendC CPU twin; not compiled with CANN, not run on hardware.
#ifndef FUSED_LCE_VECTOR_TILING_DATA_H_
#define FUSED_LCE_VECTOR_TILING_DATA_H_

#include <cstdint>

#include "kernel_tiling/kernel_tiling.h"
// kernel sources define FUSED_LCE_HD as __aicore__ before including this header; host code leaves it empty.
#include "fused_lce_tiling.h"  // beside this header: opbuild compiles op_host with only the CANN includes

struct FusedLceVectorTilingData {
    fused_lce::tiling::Plan plan;
    int64_t vocabStart;      // first global id of this rank's vocabulary rows
    float softcap;           // 0: off
    float temperature;       // z = softcap(h W^T + b) / temperature (1: off; > 0 and finite)
    uint32_t withZsum;       // FusedLceStatsVector: sum of logits wanted (label smoothing)
    uint32_t withEntropy;    // FusedLceStatsVector: the entropy statistic ez wanted (a sixth output)
    uint32_t gradMask;       // bit0 dX, bit1 dW, bit2 db (FusedLceGradVector)
    uint32_t labelBytes;     // 4 or 8
    uint32_t hasBias;
    uint32_t pad_;
    AscendC::tiling::TCubeTiling mmLogits;  // z = h[rows] @ W[cols].T      (vec_rows x base_n, K = D)
    AscendC::tiling::TCubeTiling mmDx;      // dX[rows] += dz @ W[cols]     (vec_rows x D,      K = base_n)
    AscendC::tiling::TCubeTiling mmDw;      // dW[cols] += dz.T @ h[rows]   (base_n x D,        K = vec_rows)
};

#endif  // FUSED_LCE_VECTOR_TILING_DATA_H_
