// Tiling data of the cube-driven MIX kernels (FusedLceStatsMix), written by the host, read by op_kernel. Its own
// struct (not FusedLceTilingData): the plan of csrc/include/fused_lce_mix_tiling.h, the scalar options of the loss
// and of the log-prob contract (softcap, temperature, entropy), and the cube core's Matmul tiling.
// Status: compiled (kernel side) against the AscendC CPU twin; not compiled with CANN, not run on hardware.
#ifndef FUSED_LCE_MIX_TILING_DATA_H_
#define FUSED_LCE_MIX_TILING_DATA_H_

#include <cstdint>

#include "kernel_tiling/kernel_tiling.h"
#include "../../include/fused_lce_mix_tiling.h"

struct FusedLceMixTilingData {
    fused_lce::mix::MixPlan plan;
    int64_t vocabStart;       // first global id of this rank's vocabulary rows
    float softcap;            // 0: off
    float invTemperature;     // 1 / T (z = softcap(h W^T + b) / T)
    uint32_t withZsum;        // sum of logits wanted (label smoothing)
    uint32_t withEz;          // ez = sum_j exp(z_j - m) (z_j - m) wanted (entropy)
    uint32_t hasBias;
    uint32_t labelBytes;      // 4 or 8
    AscendC::tiling::TCubeTiling mmLogits;  // on the AIC: z = h[block] @ W[cols].T (base_m x base_n, K = D)
};

#endif  // FUSED_LCE_MIX_TILING_DATA_H_
