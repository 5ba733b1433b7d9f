// The stats kernel for float operands and int32_t labels, compiled unchanged against the AscendC CPU twin.
// The macros play the role of the CANN build's per-dtype variants (DTYPE_* from the OpDef, one entry
// symbol per variant).
#define DTYPE_HIDDEN float
#define DTYPE_LABELS int32_t
#define fused_lce_stats fused_lce_stats_f32_i32
#include "../../../csrc/ascend/fused_lce_stats/op_kernel/fused_lce_stats.cpp"
