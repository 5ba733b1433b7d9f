"""FusedLceGradCube (csrc/ascend/fused_lce_grad/op_kernel/fused_lce_grad_cube.cpp: cube-driven C1/V1/C2, one
core per output block, no atomics between cores) on the AscendC CPU twin, against float64 with the driver's
Coefs(a, t, b, u) contract: every dtype, bias, softcap, temperature, label smoothing (u), the entropy term
(b), tails, shards, grad masks, both parts, and bitwise determinism across scheduler seeds."""
import pytest
import torch

from fused_lce.core import formulas
from fused_lce.core.types import Coefs, Options

from ..support.ascendc_twin.ref import GRAD_RTOL, HW_910B, HW_TINY, rel_l2

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(37, 45, 301), (5, 16, 77), (130, 33, 257)]
OPTIONS = [dict(), dict(bias=True, u=True), dict(softcap=5.0, temperature=0.7, b=True),
           dict(bias=True, u=True, b=True, softcap=3.0, temperature=1.3)]


def make(n, d, v, dtype, opt, vs=0, vt=None):
    h = torch.randn(n, d).to(dtype)
    w = (torch.randn(v, d) / d**0.5 * 3).to(dtype)
    bias = torch.randn(v).to(dtype) if opt.get("bias") else None
    y = torch.randint(vs, vs + v, (n,)) if vt is None else torch.randint(0, vt, (n,))
    return h, w, bias, y


def lse_of(h, w, bias, softcap, temperature):
    z = formulas.reference_logits(h, w, bias, softcap=softcap, temperature=temperature)
    return torch.logsumexp(z, dim=1).float()


def coefs(n, opt):
    a, t = torch.randn(n), torch.randn(n)
    b = torch.randn(n) * 0.5 if opt.get("b") else None
    u = torch.randn(n) * 0.1 if opt.get("u") else None
    return a, t, b, u


def grads64(h, w, bias, y, lse, a, t, b, u, vs, softcap, temperature):
    return formulas.reference_coef_grads(h, w, y, lse, Coefs(a, t, b, u), bias, vocab_start=vs,
                                         softcap=softcap, temperature=temperature)


def run(ops, h, w, bias, y, lse, a, t, b, u, vs=0, softcap=0.0, temperature=1.0, mask=(True, True, True)):
    return ops._twin_grads_cube(h, w, bias, y, lse, a, t, b, u, vs, softcap, temperature, list(mask))


def check(got, ref, dtype, has_bias, msg):
    tol = GRAD_RTOL[dtype]
    for name, g, r in zip(("dx", "dw", "db"), got, ref):
        if name == "db" and not has_bias:
            assert g.numel() == 0
            continue
        assert torch.isfinite(g).all(), f"{name} {msg}"
        e = rel_l2(g, r)
        assert e < tol, f"{name} {msg}: rel L2 {e:.2e} > {tol:.1e}"


@pytest.mark.parametrize("hw", [HW_910B, HW_TINY], ids=["910b", "tiny"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: "-".join(sorted(o)) or "plain")
def test_cube_grads_match_float64(ops, part, seed, hw, dtype, opt):
    part(hw, sched_seed=seed)
    sc, temp = opt.get("softcap", 0.0), opt.get("temperature", 1.0)
    for n, d, v in SHAPES:
        h, w, bias, y = make(n, d, v, dtype, opt)
        lse = lse_of(h, w, bias, sc, temp)
        a, t, b, u = coefs(n, opt)
        got = run(ops, h, w, bias, y, lse, a, t, b, u, 0, sc, temp)
        ref = grads64(h, w, bias, y, lse, a, t, b, u, 0, sc, temp)
        check(got, ref, dtype, bias is not None, f"seed={seed} shape={(n, d, v)}")


def test_cube_grads_bitwise_deterministic_across_seeds(ops, part, seed):
    """No cross-core atomics: every scheduler interleaving gives the same bits (tiny part: many cores and
    tiles)."""
    opt = dict(bias=True, u=True, b=True, softcap=3.0, temperature=1.3)
    h, w, bias, y = make(45, 33, 301, torch.bfloat16, opt)
    lse = lse_of(h, w, bias, 3.0, 1.3)
    a, t, b, u = coefs(45, opt)
    outs = []
    for s in (seed, seed + 1, seed + 2):
        part(HW_TINY, sched_seed=s, switch_prob=0.9)
        outs.append(run(ops, h, w, bias, y, lse, a, t, b, u, 0, 3.0, 1.3))
    for o in outs[1:]:
        for x, x_ in zip(outs[0], o):
            assert torch.equal(x, x_)


def test_cube_grads_loss_coefs_match_float64(ops, part, seed):
    """The loss's coefficients (a = g (1 + 2 z_loss lse), t = g (1 - eps), u = g eps / V; no b plane) against
    float64."""
    part(HW_TINY, sched_seed=seed)
    h, w, bias, y = make(37, 45, 301, torch.float32, dict(bias=True))
    lse = lse_of(h, w, bias, 2.0, 1.0)
    g = torch.rand(37)
    a, t, _, u = formulas.loss_coefs(lse, g, Options(label_smoothing=0.1, z_loss=1e-3), 301)
    got = run(ops, h, w, bias, y, lse, a, t, None, u, 0, 2.0, 1.0)
    check(got, grads64(h, w, bias, y, lse, a, t, None, u, 0, 2.0, 1.0), torch.float32, True, f"seed={seed}")


def test_cube_grads_shard_masks_and_masked_vocab(ops, part, seed):
    """A vocabulary shard (labels outside give no one-hot term), each grad_mask alone, and -inf logits with b
    != 0 (p = 0 must give 0, not NaN)."""
    part(HW_TINY, sched_seed=seed)
    n, d, v, vs = 29, 20, 150, 300
    opt = dict(bias=True, b=True)
    h, w, bias, y = make(n, d, v, torch.float32, opt, vs=vs, vt=1000)
    bias[:40] = -float("inf")
    lse = lse_of(h, w, bias, 0.0, 1.0) + 0.3  # the global lse of a larger vocabulary
    a, t, b, u = coefs(n, opt)
    ref = grads64(h, w, bias, y, lse, a, t, b, u, vs, 0.0, 1.0)
    full = run(ops, h, w, bias, y, lse, a, t, b, u, vs)
    check(full, ref, torch.float32, True, f"seed={seed}")
    for i in range(3):
        mask = [j == i for j in range(3)]
        got = run(ops, h, w, bias, y, lse, a, t, b, u, vs, mask=mask)
        assert torch.equal(got[i], full[i])
        assert all(got[j].numel() == 0 for j in range(3) if j != i)


def test_cube_grads_workspace_bound(ops, part):
    """The workspace is the two rings per AI core (fp32 z, operand-dtype dz) plus 2 V fp32 db partials: it
    does not grow with D or N, and no fp32 dW buffer exists besides the output."""
    part(HW_910B)
    for n, d, v in [(8192, 4096, 151936), (32768, 4096, 151936), (4096, 3584, 152064)]:
        st, bm, bn, bd, cores, ws, dw_ws = ops._twin_plan_grad_cube(n, d, v, 2, 1)[:7]
        assert st == 0 and dw_ws == 0
        ring = cores * 2 * bm * bn
        assert ws == -(-ring * 4 // 512) * 512 + -(-ring * 2 // 512) * 512 + -(-2 * v * 4 // 512) * 512
        assert ws < 8 << 20, ws
