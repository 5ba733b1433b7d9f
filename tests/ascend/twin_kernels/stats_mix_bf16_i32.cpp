// The cube-driven MIX stats kernel for bfloat16_t operands and int32_t labels, compiled unchanged against the AscendC CPU twin
// (one entry symbol per variant, as the CANN build's per-dtype variants).
#define DTYPE_HIDDEN bfloat16_t
#define DTYPE_LABELS int32_t
#define fused_lce_stats_mix fused_lce_stats_mix_bf16_i32
#include "../../../csrc/ascend/fused_lce_stats/op_kernel/fused_lce_stats_mix.cpp"
