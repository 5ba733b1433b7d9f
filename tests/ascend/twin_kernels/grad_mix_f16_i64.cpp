// The cube-driven deterministic MIX backward for half operands and int64_t labels, compiled unchanged against the
// AscendC CPU twin (one entry symbol per variant).
#define DTYPE_HIDDEN half
#define DTYPE_LABELS int64_t
#define fused_lce_grad_mix fused_lce_grad_mix_f16_i64
#include "../../../csrc/ascend/fused_lce_grad/op_kernel/fused_lce_grad_mix.cpp"
