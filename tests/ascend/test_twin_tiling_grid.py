"""The kernels do not depend on the Matmul tiling values that the host's GetTiling chooses. op_host fixes only
the base M / N (SetFixSplit) and the shapes; baseK, the L1 depths, the steps, the L0 double-buffer flags and
the iterate order are the real algorithm's choice (asc-devkit
impl/adv_api/tiling/matmul/matmul_tiling_algorithm.cpp), which the twin does not reproduce. Each variant of
the twin extension's vary_tiling (tests/support/ascendc_twin/ext/ops.cpp) replaces them with another legal set
(the twin's Matmul model checks legality: L0A / L0B / L0C with their double-buffer flags, L1, the MDL depth
rules); both kernels, every mode, must give the same results bit for bit, and match float64."""
import pytest
import torch

from .test_twin_grads_cube import coefs, grads64, lse_of, make
from ..support.ascendc_twin.build import MM_VARIANTS, counters
from ..support.ascendc_twin.ref import GRAD_RTOL, HW_910B, HW_TINY, rel_l2

SHAPE = (37, 45, 301)


def run_all(ops, h, w, b, y, lse, c):
    """Every kernel and mode on one problem: the cube-driven forward (with the z cache) and backward
    (recomputing / with the z cache and dz kept)."""
    zc = ops._twin_stats_cube(h, w, b, y, 0, 0.0, 1.0, True, True, True)
    out = list(zc)
    for cache, keep in ((None, False), (zc[6], True), (None, True)):
        out += ops._twin_grads_cube(h, w, b, y, lse, *c, 0, 0.0, 1.0, [True, True, True], cache, keep, None)
    return out


@pytest.mark.parametrize("hw", [HW_910B, HW_TINY], ids=["910b", "tiny"])
def test_results_do_not_depend_on_the_free_tiling_values(ops, part, seed, hw):
    opt = dict(bias=True, u=True)
    h, w, b, y = make(*SHAPE, torch.float32, opt)
    lse = lse_of(h, w, b, 0.0, 1.0)
    c = coefs(SHAPE[0], opt)
    base = None
    # cube operand bytes of the last launch: the variants change what stays in L1, not the results
    copied = set()
    for variant in MM_VARIANTS:
        part(hw, sched_seed=seed, mm_variant=variant)
        got = run_all(ops, h, w, b, y, lse, c)
        copied.add(sum(r["l1_in"] for r in counters()))
        if base is None:
            base = got
            ref = grads64(h, w, b, y, lse, *c, 0, 0.0, 1.0)
            for x, r in zip(got[7:10], ref):  # the cube-driven backward against float64
                assert rel_l2(x, r) < GRAD_RTOL[torch.float32]
            continue
        for i, (x, x0) in enumerate(zip(got, base)):
            assert torch.equal(x, x0), f"variant {variant}: output {i} differs"
    assert len(copied) > 1, "no variant changed the tiling"
