"""The kernels of the "npu" provider: the host adapter's private ops (csrc/npu/fused_lce_npu.cpp) over the AscendC
kernels FusedLceStatsCube / FusedLceGradCube. The cube core drives, its two vector cores follow through rings in GM;
every gradient element is accumulated by one core in a fixed order (deterministic), and the one-pass modes (the
forward keeps z, the backward keeps dz) cost 3 GEMMs for fwd + bwd. They have not run on hardware; every suite runs
them on the twin in CI. Where they cannot serve, the NPU falls back to CANN's own fused ops ("npu_cann") and the
``torch`` route (docs/npu-status.md).
"""
from __future__ import annotations

import torch

# the two-phase aclnn API the CANN build generates for the two kernels (checked in the OPP's libcust_opapi.so)
ACLNN_SYMBOLS = ("aclnnFusedLceStatsCubeGetWorkspaceSize", "aclnnFusedLceStatsCube",
                 "aclnnFusedLceGradCubeGetWorkspaceSize", "aclnnFusedLceGradCube")


class AdapterKernels:
    """The compiled kernels through the host adapter's ops ``_npu_stats_cube`` / ``_npu_grads_cube``. ``ops`` is the
    op namespace and ``prefix`` the ops' prefix: the twin's ``_twin_*`` ops have the same schemas
    (csrc/npu/kernel_ops.h), so the twin's ``TwinKernels`` (tests/support/ascendc_twin/build.py) is this class over
    them."""

    #: the one-pass modes: ``stats(..., keep_z=True)`` also returns the z cache, ``grads`` takes ``zcache`` /
    #: ``keep_dz`` / ``dw_out`` (docs/npu-design.md)
    supports_cache = True

    def __init__(self, ops=None, prefix: str = "_npu"):
        self.ops = torch.ops.fused_lce if ops is None else ops
        self.prefix = prefix

    def _op(self, name: str):
        return getattr(self.ops, f"{self.prefix}_{name}")

    def stats(self, hidden, weight, bias, labels, vocab_start, softcap, temperature, with_zsum, with_entropy,
              keep_z: bool = False):
        """(max, sum_exp, target, zsum, argmax, ez), and the z cache (float32 [N, V_local], the forward's h W^T) as a
        7th item when ``keep_z``."""
        r = self._op("stats_cube")(hidden, weight, bias, labels, int(vocab_start), float(softcap), float(temperature),
                                   bool(with_zsum), bool(with_entropy), bool(keep_z))
        return r if keep_z else r[:6]

    def grads(self, hidden, weight, bias, labels, lse, coefs, vocab_start, softcap, temperature, grad_mask,
              zcache=None, keep_dz: bool = False, dw_out=None, present=(True, True)):
        """(dx, dw, db) float32 from ``coefs`` (4, N), the planes a, t, b, u. ``zcache``: what
        ``stats(..., keep_z=True)`` returned for these rows (no logits recomputed); ``keep_dz``: dz kept between the
        backward's phases; ``dw_out``: a float32 (V, D) tensor dW is added to in place (and returned as dw), for sums
        over driver blocks; ``present``: whether the planes b and u are given (an absent one is 0, passed as None so
        the kernel skips its vector work)."""
        mask = [bool(x) for x in grad_mask]
        c = coefs.float()
        b_, u_ = (c[2] if present[0] else None), (c[3] if present[1] else None)
        dx, dw, db = self._op("grads_cube")(hidden, weight, bias, labels, lse.float(), c[0], c[1], b_, u_,
                                            int(vocab_start), float(softcap), float(temperature), mask, zcache,
                                            bool(keep_dz), dw_out)
        return dx, (dw_out if dw_out is not None and mask[1] else dw), db
