"""A CPU twin of the CANN toolchain the AscendC kernels of csrc/ascend are built with, so CI can compile and
run the kernel sources unchanged with g++ (a test double: nothing here ships in the package).

* ``kernel/`` -- the AscendC API subset the kernels use (``kernel_operator.h``, ``lib/matmul_intf.h``,
  ``kernel_tiling/kernel_tiling.h``), put in front of the include path; ``twin/`` holds its runtime (cores,
  pipes, memories, the checks it reports).
* ``host/`` -- stub CANN host headers (``include/`` plays ``${CANN}/include``) and a host runtime, against
  which the op_host sources compile with opbuild's flags and their tiling functions run. It shares
  ``TCubeTiling`` with ``kernel/`` (one definition of the struct both sides fill and read), hence one folder
  for both halves.
* ``ext/`` -- the torch extension that launches the kernels on CPU tensors behind ops with the NPU adapter's
  contracts (``fused_lce::_twin_*``), and the probe kernels of the twin's own rules.
* ``build.py`` -- builds that extension (and the per-dtype kernel variants, generated from one list);
  ``TwinKernels``, the kernels behind the "npu" provider's interface.
* ``ref.py`` -- the twin tests' shared inputs, tolerances and the loss's grad kernel call (the float64
  references of the kernels' contracts are ``fused_lce.core.formulas``').
* ``host_build.py`` / ``tiling_driver.cpp`` -- compile the op_host sources against ``host/`` and run their
  tiling.
"""
