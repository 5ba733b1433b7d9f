"""JIT build of the twin extension (tests/ascend/twin_ops.cpp + the kernels of csrc/ascend compiled against the AscendC
CPU twin in csrc/ascend/twin/kernel). Built once per source change into build/twin-ext (ninja, cached by torch)."""
from __future__ import annotations

import functools
import glob
import os

import torch

from fused_lce.backends import npu as npu_backend

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


def configure(hw: dict = HW_910B, seed: int = 1, switch_prob: float = 0.3, hazards: bool = True,
              mm_variant: int = 0) -> None:
    """Select the part, the scheduler seed and the Matmul tiling variant (0: the default tiling; 1..5: other legal
    values of GetTiling's free fields, twin_ops.cpp vary_tiling) of the next _twin_* calls."""
    ops = load_twin()
    ops._twin_config([hw["cube_cores"], hw["vec_per_cube"], hw["ub"], hw["l1"], hw["l0a"], hw["l0b"], hw["l0c"]],
                     int(seed), float(switch_prob), bool(hazards), int(mm_variant))


MM_VARIANTS = range(6)
COUNTERS = ("aic", "v_instr", "v_bytes", "s_ops", "gm_rd", "gm_wr", "cube_flops", "l1_in")


def counters() -> list[dict]:
    """Work counters of the last launch, one dict per core (AIVs first, then AICs), named by COUNTERS: vector
    instructions and UB bytes they write, scalar ops, GM bytes read / written, cube FLOPs, cube operand bytes copied
    GM -> L1."""
    c = load_twin()._twin_counters()
    k = len(COUNTERS)
    return [dict(zip(COUNTERS, c[i:i + k])) for i in range(0, len(c), k)]


class TwinKernels(npu_backend._AdapterKernels):
    """The kernels on the twin behind the interface the "npu" backend calls: ``fused_lce.backends.npu``'s
    ``_AdapterKernels`` over the twin's ``_twin_*`` ops (the adapter ops' contracts), for plugging them into the npu
    provider.

    ``kernels="mix"`` runs the cube-driven FusedLceStatsMix / FusedLceGradMix with their one-pass modes
    (``supports_cache``), ``"old"`` FusedLceStats / FusedLceGrad; None follows FUSED_LCE_NPU_KERNELS at every call,
    as the adapter does (default "mix")."""

    def __init__(self, hw: dict = HW_910B, seed: int = 1, kernels: str | None = None):
        super().__init__(kernels, ops=load_twin(), prefix="_twin")
        configure(hw, seed)
