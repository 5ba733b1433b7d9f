// The cube-driven deterministic MIX backward for bfloat16_t operands and int32_t labels, compiled unchanged against the
// AscendC CPU twin (one entry symbol per variant).
#define DTYPE_HIDDEN bfloat16_t
#define DTYPE_LABELS int32_t
#define fused_lce_grad_mix fused_lce_grad_mix_bf16_i32
#include "../../../csrc/ascend/fused_lce_grad/op_kernel/fused_lce_grad_mix.cpp"
