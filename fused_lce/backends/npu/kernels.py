"""The kernels of the "npu" provider: the host adapter's private ops (csrc/npu/fused_lce_npu.cpp), and which kernel
pair they launch.

FUSED_LCE_NPU_KERNELS picks the pair, read at every kernel call:
* "cube" (the default): FusedLceStatsCube / FusedLceGradCube. The cube core drives, its two vector cores follow
  through rings in GM; every gradient element is accumulated by one core in a fixed order (deterministic), and the
  one-pass modes (the forward keeps z, the backward keeps dz) cost 3 GEMMs for fwd + bwd.
* "vector": FusedLceStatsVector / FusedLceGradVector. Each vector core drives the Matmul API for its rows; the
  backward recomputes the logits and accumulates dX / dW with float32 atomic adds.
Neither pair has run on hardware; both run every suite on the twin in CI. "vector" is the fallback if the default
pair fails the first hardware run (docs/npu-status.md).
"""
from __future__ import annotations

import os
from typing import Optional

import torch

KERNELS_ENV = "FUSED_LCE_NPU_KERNELS"
KERNEL_CHOICES = ("vector", "cube")
DEFAULT_KERNELS = "cube"
# the two-phase aclnn API the CANN build generates for each pair (checked in the OPP's libcust_opapi.so)
VECTOR_ACLNN_SYMBOLS = ("aclnnFusedLceStatsVectorGetWorkspaceSize", "aclnnFusedLceStatsVector",
                        "aclnnFusedLceGradVectorGetWorkspaceSize", "aclnnFusedLceGradVector")
CUBE_ACLNN_SYMBOLS = ("aclnnFusedLceStatsCubeGetWorkspaceSize", "aclnnFusedLceStatsCube",
                      "aclnnFusedLceGradCubeGetWorkspaceSize", "aclnnFusedLceGradCube")


def kernel_choice(env: Optional[dict] = None) -> str:
    """The kernel pair FUSED_LCE_NPU_KERNELS asks for (DEFAULT_KERNELS when unset); ValueError naming the variable
    otherwise."""
    env = os.environ if env is None else env
    kind = env.get(KERNELS_ENV, "").strip() or DEFAULT_KERNELS
    if kind not in KERNEL_CHOICES:
        raise ValueError(f"{KERNELS_ENV}: expected one of {KERNEL_CHOICES}, got {kind!r}")
    return kind


class AdapterKernels:
    """The compiled kernels through the host adapter's ops: the vector pair (``_npu_stats_vector`` /
    ``_npu_grads_vector``) or the cube pair (``_npu_stats_cube`` / ``_npu_grads_cube``). ``kind`` None follows
    FUSED_LCE_NPU_KERNELS at every call; ``ops`` is the op namespace and ``prefix`` the ops' prefix: the twin's
    ``_twin_*`` ops have the same schemas (csrc/npu/kernel_ops.h), so the twin's ``TwinKernels``
    (tests/support/ascendc_twin/build.py) is this class over them."""

    def __init__(self, kind: Optional[str] = None, ops=None, prefix: str = "_npu"):
        if kind is not None and kind not in KERNEL_CHOICES:
            raise ValueError(f"kind: expected one of {KERNEL_CHOICES}, got {kind!r}")
        self._kind = kind
        self.ops = torch.ops.fused_lce if ops is None else ops
        self.prefix = prefix

    @property
    def kind(self) -> str:
        return self._kind if self._kind is not None else kernel_choice()

    @property
    def supports_cache(self) -> bool:
        """The cube pair's one-pass modes: ``stats(..., keep_z=True)`` also returns the z cache, ``grads`` takes
        ``zcache`` / ``keep_dz`` / ``dw_out`` (docs/npu-design.md); AscendCProvider uses them when set."""
        return self.kind == "cube"

    def _op(self, name: str):
        return getattr(self.ops, f"{self.prefix}_{name}")

    def stats(self, hidden, weight, bias, labels, vocab_start, softcap, temperature, with_zsum, with_entropy,
              keep_z: bool = False):
        """(max, sum_exp, target, zsum, argmax, ez), and the z cache (float32 [N, V_local], the forward's h W^T) as a
        7th item when ``keep_z`` (cube pair only)."""
        if self.kind == "cube":
            r = self._op("stats_cube")(hidden, weight, bias, labels, int(vocab_start), float(softcap),
                                       float(temperature), bool(with_zsum), bool(with_entropy), bool(keep_z))
            return r if keep_z else r[:6]
        if keep_z:
            raise ValueError("keep_z needs the cube pair (FUSED_LCE_NPU_KERNELS=cube)")
        return self._op("stats_vector")(hidden, weight, bias, labels, int(vocab_start), float(softcap),
                                        float(temperature), bool(with_zsum), bool(with_entropy))

    def grads(self, hidden, weight, bias, labels, lse, coefs, vocab_start, softcap, temperature, grad_mask,
              zcache=None, keep_dz: bool = False, dw_out=None, present=(True, True)):
        """(dx, dw, db) float32 from ``coefs`` (4, N), the planes a, t, b, u. Cube pair only: ``zcache``, what
        ``stats(..., keep_z=True)`` returned for these rows (no logits recomputed); ``keep_dz``, dz kept between the
        backward's phases; ``dw_out``, a float32 (V, D) tensor dW is added to in place (and returned as dw), for sums
        over driver blocks; ``present``, whether the planes b and u are given (an absent one is 0, passed as None so
        the kernel skips its vector work)."""
        mask = [bool(x) for x in grad_mask]
        if self.kind == "cube":  # the (4, N) planes a, t, b, u one by one
            c = coefs.float()
            b_, u_ = (c[2] if present[0] else None), (c[3] if present[1] else None)
            dx, dw, db = self._op("grads_cube")(hidden, weight, bias, labels, lse.float(), c[0], c[1], b_, u_,
                                                int(vocab_start), float(softcap), float(temperature), mask, zcache,
                                                bool(keep_dz), dw_out)
            return dx, (dw_out if dw_out is not None and mask[1] else dw), db
        if zcache is not None or keep_dz or dw_out is not None:
            raise ValueError("zcache / keep_dz / dw_out need the cube pair (FUSED_LCE_NPU_KERNELS=cube)")
        return self._op("grads_vector")(hidden, weight, bias, labels, lse, coefs, int(vocab_start), float(softcap),
                                        float(temperature), mask)
