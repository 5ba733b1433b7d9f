"""The kernels of the "npu" provider: the host adapter's private ops (csrc/npu/fused_lce_npu.cpp) over the
AscendC kernels FusedLceStatsCube / FusedLceGradCube. The cube core drives, its two vector cores follow
through rings in GM; every gradient element is accumulated by one core in a fixed order (deterministic), and
the one-pass modes (the forward keeps z, the backward keeps dz) cost 3 GEMMs for fwd + bwd. They have not run
on hardware; every suite runs them on the twin in CI. Where they cannot serve, the NPU falls back to CANN's
own fused ops ("npu_cann") and the ``torch`` route (docs/npu-status.md).
"""
from __future__ import annotations

import os
from typing import Optional

import torch

# the two-phase aclnn API the CANN build generates for the two kernels (checked in the OPP's libcust_opapi.so)
ACLNN_SYMBOLS = ("aclnnFusedLceStatsCubeGetWorkspaceSize", "aclnnFusedLceStatsCube",
                 "aclnnFusedLceGradCubeGetWorkspaceSize", "aclnnFusedLceGradCube")

# Conservative variants of the kernels (csrc/ascend/common/fused_lce_cube_tiling.h ``Variant``): each replaces
# a behaviour only hardware can judge with a plainer one computing the same numbers, so that a first run on a
# card can compare them bit for bit (``fused-lce doctor`` does). Set the variable to 1 to run the variant.
PLAIN_TILING, SERIAL_MATMUL = 1, 2
VARIANT_ENV = {
    # the Matmul tilings as GetTiling returns them (no L1-residency override), one forward GEMM per tile
    "FUSED_LCE_NPU_PLAIN_TILING": PLAIN_TILING,
    # a full pipe barrier between the backward's Matmul objects, which share L1
    "FUSED_LCE_NPU_SERIAL_MATMUL": SERIAL_MATMUL,
}


def variant_from_env(env: Optional[dict] = None) -> int:
    """The variant bits the environment asks for; ValueError naming the variable for a value other than 0
    / 1."""
    env = os.environ if env is None else env
    bits = 0
    for name, bit in VARIANT_ENV.items():
        value = env.get(name, "").strip()
        if value not in ("", "0", "1"):
            raise ValueError(f"{name}: expected 0 or 1, got {value!r}")
        bits |= bit if value == "1" else 0
    return bits


class AdapterKernels:
    """The compiled kernels through the host adapter's ops ``_npu_stats_cube`` / ``_npu_grads_cube``. ``ops``
    is the op namespace and ``prefix`` the ops' prefix: the twin's ``_twin_*`` ops have the same schemas
    (csrc/npu/kernel_ops.h), so the twin's ``TwinKernels`` (tests/support/ascendc_twin/build.py) is this class
    over them. ``variant``: the conservative variant bits, or None to follow the environment at every call."""

    #: the one-pass modes: ``stats(..., keep_z=True)`` also returns the z cache, ``grads`` takes ``zcache`` /
    #: ``keep_dz`` / ``dw_out`` (docs/npu-design.md)
    supports_cache = True

    def __init__(self, ops=None, prefix: str = "_npu", variant: Optional[int] = None):
        self.ops = torch.ops.fused_lce if ops is None else ops
        self.prefix = prefix
        self._variant = variant

    @property
    def variant(self) -> int:
        return variant_from_env() if self._variant is None else self._variant

    def _op(self, name: str):
        return getattr(self.ops, f"{self.prefix}_{name}")

    def stats(self, hidden, weight, bias, labels, vocab_start, softcap, temperature, with_zsum, with_entropy,
              keep_z: bool = False):
        """(max, sum_exp, target, zsum, argmax, ez), and the z cache (float32 [N, V_local], the forward's h
        W^T) as a 7th item when ``keep_z``."""
        r = self._op("stats_cube")(hidden, weight, bias, labels, int(vocab_start), float(softcap),
                                   float(temperature), bool(with_zsum), bool(with_entropy), bool(keep_z),
                                   self.variant)
        return r if keep_z else r[:6]

    def grads(self, hidden, weight, bias, labels, lse, coefs, vocab_start, softcap, temperature, grad_mask,
              zcache=None, keep_dz: bool = False, dw_out=None, present=(True, True)):
        """(dx, dw, db) float32 from ``coefs`` (4, N), the planes a, t, b, u. ``zcache``: what
        ``stats(..., keep_z=True)`` returned for these rows (no logits recomputed); ``keep_dz``: dz kept
        between the backward's phases; ``dw_out``: a float32 (V, D) tensor dW is added to in place (and
        returned as dw), for sums over driver blocks; ``present``: whether the planes b and u are given (an
        absent one is 0, passed as None so the kernel skips its vector work)."""
        mask = [bool(x) for x in grad_mask]
        c = coefs.float()
        b_, u_ = (c[2] if present[0] else None), (c[3] if present[1] else None)
        dx, dw, db = self._op("grads_cube")(hidden, weight, bias, labels, lse.float(), c[0], c[1], b_, u_,
                                            int(vocab_start), float(softcap), float(temperature),
                                            mask, zcache, bool(keep_dz), dw_out, self.variant)
        return dx, (dw_out if dw_out is not None and mask[1] else dw), db
