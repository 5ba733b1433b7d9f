// The private kernel ops of the "npu" backend, one schema list for every registration: the host adapter
// (fused_lce_npu.cpp: prefix "_npu", PrivateUse1 kernels) and the test suite's twin extension (the same AscendC
// kernel sources on CPU: prefix "_twin"). fused_lce/backends/npu/kernels.py calls either through the same code.
//
// One argument order for every private kernel op on every device (csrc/ops.cpp's _cpu_* ops too): the problem
// tensors (hidden, weight, bias?, labels), the op's own tensors, then vocab_start, softcap, temperature, then the op's
// flags and sizes (and, last, optional extras with defaults).
//   stats_cube: per-token local statistics of this rank's vocabulary rows of z = softcap(logits) / temperature ->
//            (max, sum exp(z - max), target logit, sum of logits, first argmax as a global int64 id, ez (the entropy
//            statistic, 0 without with_entropy), the z cache (float32 (N, V)) with keep_z, else empty).
//   grads_cube: float32 dX, dW, db of dz = p (a + b z) - t onehot - u from the driver's per-token coefficient planes
//            a, t and optional b, u; outputs grad_mask leaves out (or db without bias) are empty. zcache: what
//            stats_cube(keep_z) returned; keep_dz; dw_acc: a float32 (V, D) tensor dW is added into in place.
//   variant (both, last): the conservative variant bits of csrc/ascend/common/fused_lce_cube_tiling.h (0: default).
#ifndef FUSED_LCE_NPU_KERNEL_OPS_H_
#define FUSED_LCE_NPU_KERNEL_OPS_H_

#include <string>

namespace fused_lce_npu {

struct KernelOpSchema {
    const char* name;       // after the prefix: _npu_<name>, _twin_<name>
    const char* signature;  // the schema after the name
};

constexpr KernelOpSchema kKernelOps[] = {
    {"stats_cube",
     "(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, int vocab_start, float softcap, float temperature, "
     "bool with_zsum, bool with_entropy, bool keep_z=False, int variant=0) "
     "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"},
    {"grads_cube",
     "(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, Tensor lse, Tensor a, Tensor t, Tensor? b, "
     "Tensor? u, int vocab_start, float softcap, float temperature, bool[3] grad_mask, Tensor? zcache=None, "
     "bool keep_dz=False, Tensor(a!)? dw_acc=None, int variant=0) -> (Tensor, Tensor, Tensor)"},
};

// Defines every kernel op as <prefix>_<name> in a TORCH_LIBRARY_FRAGMENT.
template <class Library>
void def_kernel_ops(Library& m, const char* prefix) {
    for (const KernelOpSchema& op : kKernelOps) m.def((std::string(prefix) + "_" + op.name + op.signature).c_str());
}

}  // namespace fused_lce_npu

#endif  // FUSED_LCE_NPU_KERNEL_OPS_H_
