"""The Ascend NPU backends: this project's own AscendC kernels ("npu") and CANN's fused trio in torch_npu
("npu_cann", registered through ``fused_lce/backends/npu_cann.py``).

STATUS: the AscendC kernel sources are compiled (g++) and run on CPU against a twin of the AscendC API in CI
(the conformance suite runs them as provider "npu_twin"); they have not been compiled by the CANN toolchain
nor run on NPU hardware. docs/npu-status.md says what ran where and holds the first-hardware-run checklist;
docs/npu-design.md says what the kernels do.

* ``provider.py`` -- ``AscendCProvider``, the "npu" provider: the kernels behind the driver's ``stats`` /
  ``grads`` (the driver does the rest: combine, loss, reduction, as for every provider). D == 0 is declined
  (``supports``); an empty vocabulary shard (vocab parallel) launches no kernel. With the kernels' one-pass
  modes the forward keeps its z cache (float32 [rows, V_local]) for the backward, which then computes no
  logits and keeps dz, so fwd + bwd cost 3 GEMMs of 2 N D V instead of 5; ``token_block`` bounds the rows per
  driver block so that the z cache and the kept dz fit ``opts.tile_bytes`` (default ``DEFAULT_TILE_BYTES``),
  and dW / db are summed over the blocks in float32 in block order (deterministic; dW in place).
* ``kernels.py`` -- the host adapter's private ops (``fused_lce::_npu_*``, csrc/npu/) over the two kernels.
* ``cann.py`` -- ``CannTrioProvider``, the "npu_cann" provider over torch_npu's fused trio.
* ``env.py`` -- what the host has: torch_npu with a device, the custom OPP kernels where op-plugin will find
  them (ASCEND_CUSTOM_OPP_PATH, then the vendors of ``$ASCEND_OPP_PATH/vendors/config.ini``, as fixed when
  torch_npu loaded; each aclnn symbol resolved with dlsym in the library op-plugin will take it from), and the
  build status setup.py recorded (``build_status()``).

Availability of "npu" is checked in order and the first failing step is reported: torch_npu importable, an NPU
device, the OPP kernel package not failed at install, the aclnn symbols where op-plugin will look for them,
the host adapter ``fused_lce._npu_C`` built and loadable.

The providers are imported on first use (``PROVIDER`` below): ``import fused_lce`` imports ``env`` from here
before it imports torch, and nothing else.
"""


def __getattr__(name):
    if name in ("PROVIDER", "AscendCProvider"):  # the registry loads PROVIDER
        from . import provider

        return getattr(provider, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
