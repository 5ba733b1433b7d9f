// The grad kernel for float operands and int64_t labels, compiled unchanged against the AscendC CPU twin.
// The macros play the role of the CANN build's per-dtype variants (DTYPE_* from the OpDef, one entry
// symbol per variant).
#define DTYPE_HIDDEN float
#define DTYPE_LABELS int64_t
#define fused_lce_grad fused_lce_grad_f32_i64
#include "../../../csrc/ascend/fused_lce_grad/op_kernel/fused_lce_grad.cpp"
