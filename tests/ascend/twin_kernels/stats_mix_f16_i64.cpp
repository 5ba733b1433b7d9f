// The cube-driven MIX stats kernel for half operands and int64_t labels, compiled unchanged against the AscendC CPU twin
// (one entry symbol per variant, as the CANN build's per-dtype variants).
#define DTYPE_HIDDEN half
#define DTYPE_LABELS int64_t
#define fused_lce_stats_mix fused_lce_stats_mix_f16_i64
#include "../../../csrc/ascend/fused_lce_stats/op_kernel/fused_lce_stats_mix.cpp"
