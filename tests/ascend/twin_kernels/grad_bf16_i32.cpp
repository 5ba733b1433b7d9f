// The grad kernel for bfloat16_t operands and int32_t labels, compiled unchanged against the AscendC CPU twin.
// The macros play the role of the CANN build's per-dtype variants (DTYPE_* from the OpDef, one entry
// symbol per variant).
#define DTYPE_HIDDEN bfloat16_t
#define DTYPE_LABELS int32_t
#define fused_lce_grad fused_lce_grad_bf16_i32
#include "../../../csrc/ascend/fused_lce_grad/op_kernel/fused_lce_grad.cpp"
