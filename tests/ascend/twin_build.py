"""JIT build of the twin extension (tests/ascend/twin_ops.cpp + the kernels of csrc/ascend compiled against the AscendC
CPU twin in csrc/ascend/twin/kernel). Built once per source change into build/twin-ext (ninja, cached by torch)."""
from __future__ import annotations

import functools
import glob
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TWIN_INCLUDE = os.path.join(ROOT, "csrc", "ascend", "twin", "kernel")

# The part of the twin tests ask for: Atlas A2 (910B) memories with 24 AI cores, and a tiny part whose small UB
# forces small tiles, many vocabulary blocks, segments and cores.
HW_910B = dict(cube_cores=24, vec_per_cube=2, ub=192 * 1024, l1=512 * 1024, l0a=64 * 1024, l0b=64 * 1024,
               l0c=128 * 1024)
HW_TINY = dict(cube_cores=5, vec_per_cube=2, ub=32 * 1024, l1=64 * 1024, l0a=4 * 1024, l0b=4 * 1024, l0c=8 * 1024)


@functools.lru_cache(maxsize=1)
def load_twin():
    """Build (or reuse) and load the extension; registers fused_lce::_twin_* ops."""
    from torch.utils.cpp_extension import load

    import fused_lce  # noqa: F401  (defines the fused_lce op namespace first)

    build = os.environ.get("FUSED_LCE_TWIN_BUILD", os.path.join(ROOT, "build", "twin-ext"))
    os.makedirs(build, exist_ok=True)
    sources = [os.path.join(HERE, "twin_ops.cpp"), os.path.join(HERE, "twin_probes.cpp")]
    sources += sorted(glob.glob(os.path.join(HERE, "twin_kernels", "*.cpp")))
    load(name="fused_lce_twin", sources=sources, build_directory=build,
         extra_cflags=["-O2", "-std=c++17", "-fno-strict-aliasing", f"-I{TWIN_INCLUDE}"], is_python_module=False,
         verbose=False)
    return torch.ops.fused_lce


def configure(hw: dict = HW_910B, seed: int = 1, switch_prob: float = 0.3, hazards: bool = True) -> None:
    """Select the part and the scheduler seed of the next _twin_* calls."""
    ops = load_twin()
    ops._twin_config([hw["cube_cores"], hw["vec_per_cube"], hw["ub"], hw["l1"], hw["l0a"], hw["l0b"], hw["l0c"]],
                     int(seed), float(switch_prob), bool(hazards))


class TwinKernels:
    """The kernels on the twin behind the interface the "npu" backend calls (``stats`` / ``grads``, the same
    arguments as ``fused_lce.backends.npu._AdapterKernels``), for plugging them into the npu provider.

    ``kernels="old"`` (the default; FUSED_LCE_TWIN_KERNELS overrides it) runs FusedLceStats / FusedLceGrad, which the
    adapter calls on hardware; ``"mix"`` runs the cube-driven FusedLceStatsMix / FusedLceGradMix behind the same
    interface (the driver's Coefs (a, t, b, u) passed through), to check them against every suite before the adapter
    switches."""

    def __init__(self, hw: dict = HW_910B, seed: int = 1, kernels: str | None = None):
        self.ops = load_twin()
        configure(hw, seed)
        self.kind = kernels or os.environ.get("FUSED_LCE_TWIN_KERNELS", "old")
        if self.kind not in ("old", "mix"):
            raise ValueError(f"kernels must be 'old' or 'mix', got {self.kind!r}")

    @property
    def supports_cache(self) -> bool:
        """True for the MIX kernels: ``stats(..., keep_z=True)`` also returns the z cache and ``grads`` takes
        ``zcache`` / ``keep_dz`` (the one-pass modes, docs/npu.md); fused_lce.backends.npu uses them when set."""
        return self.kind == "mix"

    def stats(self, hidden, weight, bias, labels, vocab_start, softcap, with_zsum, temperature, with_entropy,
              keep_z: bool = False):
        """(max, sum_exp, target, zsum, argmax, ez), and the z cache (float32 [N, V_local]) as a 7th item when
        ``keep_z`` (MIX only)."""
        if self.kind == "mix":
            r = self.ops._twin_stats_mix(hidden, weight, bias, labels, int(vocab_start), float(softcap),
                                         float(temperature), bool(with_zsum), bool(with_entropy), bool(keep_z))
            return r if keep_z else r[:6]
        if keep_z:
            raise ValueError("keep_z needs the MIX kernels (kernels='mix')")
        return self.ops._twin_stats(hidden, weight, bias, labels, int(vocab_start), float(softcap), bool(with_zsum),
                                    float(temperature), bool(with_entropy))

    def grads(self, coefs, hidden, weight, bias, labels, lse, vocab_start, softcap, temperature, grad_mask,
              zcache=None, keep_dz: bool = False, dw_out=None):
        """(dx, dw, db) float32. ``zcache``: what ``stats(..., keep_z=True)`` returned for these rows (the logits
        are not recomputed); ``keep_dz``: dz kept between the backward's phases; ``dw_out``: a float32 (V, D)
        tensor dW is added to in place (and returned as dw), for sums over driver blocks (MIX only)."""
        if self.kind == "mix":
            c = coefs.float()
            dx, dw, db = self.ops._twin_grads_mix(hidden, weight, bias, labels, lse.float(), c[0], c[1], c[2], c[3],
                                                  int(vocab_start), float(softcap), float(temperature),
                                                  [bool(x) for x in grad_mask], zcache, bool(keep_dz), dw_out)
            return dx, (dw_out if dw_out is not None and grad_mask[1] else dw), db
        if zcache is not None or keep_dz or dw_out is not None:
            raise ValueError("zcache / keep_dz / dw_out need the MIX kernels (kernels='mix')")
        return self.ops._twin_grads(coefs, hidden, weight, bias, labels, lse, int(vocab_start), float(softcap),
                                    float(temperature), [bool(x) for x in grad_mask])
