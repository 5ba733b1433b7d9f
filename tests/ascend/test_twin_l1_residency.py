"""The cube-driven kernels with the hidden size large enough that the GEMM operands they keep in L1 (op_host's
keep_a_resident) do not fit whole on the tiny part: the results against float64 and the cube's GM -> L1
operand bytes against what the Matmul library's L1 buffers predict (asc-devkit
resource/cube_in_buffer/cube_in_buffer_normal.h: with depthA1 > 2 below A's whole K the first depthA1 - 2 K
blocks stay in L1 over a group of N tiles, the others are copied for every tile; docs/npu-twin-rules.md rules
12 and 14). The other kernel tests use D <= 45, whose K fits."""
import math

import pytest
import torch

from .test_twin_grads_cube import coefs, grads64, lse_of
from .test_twin_grads_cube import make as make_grads
from .test_twin_stats_cube import check as check_stats
from .test_twin_stats_cube import run as run_stats
from ..support.ascendc_twin.build import counters
from ..support.ascendc_twin.ref import GRAD_RTOL, HW_TINY, make_stats_inputs, rel_l2

D = 1000
DTYPES = [torch.bfloat16, torch.float32]


def l1_copied():
    return sum(r["l1_in"] for r in counters())


def block_bytes(is_a, trans, mn, k, elt):
    """One L1 base block as copy_cube_in_params_base.h GetBaseSize sizes it (A: baseM x baseK, B: baseK x
    baseN)."""
    up = lambda x, a: -(-x // a) * a  # noqa: E731
    if elt != 4:
        return mn * k * elt
    if is_a:
        return up(mn, 16) * up(k, 16 if trans else 8) * 4
    return up(mn, 8) * (k if trans else up(k, 16)) * 4


def stats_cube_l1_bytes(plan, n, d, v, elt, l1):
    """GM -> L1 bytes of FusedLceStatsCube: per task (a token block against a vocabulary segment) one Iterate
    sequence over the segment's tiles; W's blocks are copied for every tile (depthB1 2); h's (A, depthA1 as
    keep_a_resident sets it) all on the first tile, then those beyond the cached ones on every other tile."""
    bm, bn, bk, m_blocks, n_blocks, segments, seg_blocks = (plan[i] for i in (1, 2, 3, 5, 6, 7, 13))
    kiter = math.ceil(d / bk)
    depth = min((l1 - 2 * block_bytes(False, True, bn, bk, elt)) // block_bytes(True, False, bm, bk, elt),
                kiter)
    assert 3 <= depth < kiter, f"depthA1 {depth}, kIter {kiter}: not a partial residency"
    cached_k = min((depth - 2) * bk, d)
    total = 0
    for m in range(m_blocks):
        rows = min(bm, n - m * bm)
        for s in range(segments):
            blocks = range(s * seg_blocks, min((s + 1) * seg_blocks, n_blocks))
            for i, nb in enumerate(blocks):
                cols = min(bn, v - nb * bn)
                total += cols * d + rows * (d if i == 0 else d - cached_k)
    return total * elt


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_stats_cube_partial_residency(ops, part, seed, dtype):
    part(HW_TINY, sched_seed=seed)
    n, v, elt = 37, 301, dtype.itemsize
    h, w, b = make_stats_inputs(n, D, v, dtype, False)
    y = torch.randint(0, v, (n,))
    args = (0, 0.0, 1.0, False, False)
    check_stats(run_stats(ops, h, w, b, y, *args), h, w, b, y, *args, f"seed={seed} D={D}")
    plan = ops._twin_plan_stats_cube(n, D, v, elt, 0, False)
    want = stats_cube_l1_bytes(plan, n, D, v, elt, HW_TINY["l1"])
    assert l1_copied() == want
    if dtype == torch.bfloat16:  # the figure an independent run on the twin measured for this shape
        assert want == 1_344_960


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grad_cube_large_d(ops, part, seed, dtype):
    """The backward recomputing z: per tile (m, nb) in each phase z = h[m] W[nb]^T (both copied whole, one
    tile per sequence), then in phase X dX[m] += dz W[nb] and in phase W dW[nb] += dz^T h[m] over D's column
    tiles, dz (K = the tile's width / height, one K block) kept in L1 across them and copied once: 3 (rows +
    cols) D + 2 rows cols elements per tile."""
    part(HW_TINY, sched_seed=seed)
    n, v, elt = 37, 301, dtype.itemsize
    h, w, bias, y = make_grads(n, D, v, dtype, {})
    lse = lse_of(h, w, bias, 0.0, 1.0)
    c = coefs(n, {})
    got = ops._twin_grads_cube(h, w, bias, y, lse, *c, 0, 0.0, 1.0, [True, True, False])
    for name, g, r in zip(("dx", "dw"), got, grads64(h, w, bias, y, lse, *c, 0, 0.0, 1.0)):
        assert rel_l2(g, r) < GRAD_RTOL[dtype], name
    plan = ops._twin_plan_grad_cube(n, D, v, elt, 0)
    m_blocks, n_blocks = plan[8], plan[9]
    assert math.ceil(D / plan[3]) > 1  # several column tiles share the kept dz
    assert l1_copied() == (3 * D * (n * n_blocks + v * m_blocks) + 2 * n * v) * elt
