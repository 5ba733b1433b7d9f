"""The kernels' conservative variants (csrc/ascend/common/fused_lce_cube_tiling.h ``Variant``) on the AscendC
CPU twin. Each replaces a behaviour only hardware can judge with a plainer one computing the same numbers --
kPlainTiling: the Matmul tilings as GetTiling returns them and one forward GEMM per tile; kSerialMatmul: a
full pipe barrier between the backward's Matmul objects -- so every variant must give the default's results
bit for bit, in every mode (z cache, dz kept, recompute), on the 910B and on a part with many cores, tiles and
segments; and kPlainTiling must really change what the cube copies (the L1-residency override is off)."""
import pytest
import torch

from ..support.ascendc_twin import build as twin_build
from .test_twin_grads_cube import coefs, lse_of, make
from ..support.ascendc_twin.ref import HW_910B, HW_TINY

VARIANTS = (1, 2, 3)  # kPlainTiling, kSerialMatmul, both


def run_all(ops, h, w, b, y, lse, c, variant):
    """Every kernel and mode on one problem under one variant: the forward with and without the z cache
    (segments on the tiny part), the backward recomputing, from the z cache with dz kept, and with dz kept
    alone."""
    fwd = ops._twin_stats_cube(h, w, b, y, 0, 3.0, 0.8, True, True, True, variant)
    out = list(fwd)
    out += ops._twin_stats_cube(h, w, b, y, 0, 3.0, 0.8, False, False, False, variant)[:6]
    for cache, keep in ((None, False), (fwd[6], True), (None, True)):
        out += ops._twin_grads_cube(h, w, b, y, lse, *c, 0, 3.0, 0.8, [True, True, True], cache, keep,
                                    None, variant)
    return out


@pytest.mark.parametrize("hw", [HW_910B, HW_TINY], ids=["910b", "tiny"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_variants_give_the_default_bit_for_bit(ops, part, seed, hw, dtype):
    opt = dict(bias=True, u=True, b=True)
    h, w, b, y = make(45, 40, 301, dtype, opt)
    y[::5] = -100
    lse = lse_of(h, w, b, 3.0, 0.8)
    c = coefs(45, opt)
    part(hw, sched_seed=seed)
    base = run_all(ops, h, w, b, y, lse, c, 0)
    assert all(torch.isfinite(x).all() for x in base if x.is_floating_point())
    for variant in VARIANTS:
        part(hw, sched_seed=seed + variant, switch_prob=0.6)  # another interleaving too
        got = run_all(ops, h, w, b, y, lse, c, variant)
        for i, (x, x0) in enumerate(zip(got, base)):
            assert torch.equal(x, x0), f"variant {variant}: output {i} differs (seed {seed})"


def test_plain_tiling_turns_the_l1_residency_off(ops, part):
    """With the override the token block's hidden rows stay in L1 over a segment's tiles; without it they are
    copied in again for every tile: more operand bytes GM -> L1, the same results (one AI core: one segment of
    16 tiles)."""
    part(dict(HW_910B, cube_cores=1), sched_seed=1)
    h, w, b, y = make(64, 256, 2048, torch.bfloat16, {})
    copied, outs = {}, {}
    for variant in (0, 1):
        outs[variant] = ops._twin_stats_cube(h, w, b, y, 0, 0.0, 1.0, False, False, False, variant)
        copied[variant] = sum(r["l1_in"] for r in twin_build.counters())
    assert copied[1] > copied[0], copied
    for x, x0 in zip(outs[1], outs[0]):
        assert torch.equal(x, x0)


def test_a_bad_variant_is_refused(ops):
    h, w, b, y = make(5, 16, 77, torch.float32, {})
    with pytest.raises(RuntimeError, match="variant must be in 0..3"):
        ops._twin_stats_cube(h, w, b, y, 0, 0.0, 1.0, False, False, False, 4)
