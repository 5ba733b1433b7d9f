"""FusedLceGrad (csrc/ascend/fused_lce_grad) compiled and run on the AscendC CPU twin, against float64 gradients of
sum_i g_i * loss_i over one vocabulary shard given the saved lse: every dtype and option (bias, label smoothing,
z-loss, softcap, gradient masks), ignored tokens (g = 0), bad labels (g = NaN), odd V and tails, several cores and
segments (dX of a token block accumulated by several cores with float32 atomics), vocabulary shards."""
import itertools

import pytest
import torch

from twin_ref import GRAD_RTOL, HW_910B, HW_TINY, grads64, logits64, rel_l2

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(37, 45, 301), (5, 16, 77), (70, 24, 150)]
OPTIONS = [dict(), dict(bias=True), dict(eps=0.1), dict(z_loss=1e-2), dict(softcap=4.0),
           dict(bias=True, eps=0.2, z_loss=1e-3, softcap=3.0)]


def make(n, d, v, dtype, bias):
    h = torch.randn(n, d).to(dtype)
    w = (torch.randn(v, d) / d**0.5 * 2).to(dtype)
    b = (torch.randn(v) * 0.5).to(dtype) if bias else None
    return h, w, b


def lse_of(h, w, b, softcap):
    z, _ = logits64(h, w, b, softcap)
    return torch.logsumexp(z, dim=1)


def check(got, ref, dtype, msg):
    names = ("dx", "dw", "db")
    for name, a, r in zip(names, got, ref):
        if r is None:
            assert a.numel() == 0, f"{name} {msg}"
            continue
        tol = GRAD_RTOL[dtype] if name != "db" else 2e-5  # db sums the float32 dz, never rounded
        err = rel_l2(a, r)
        assert a.dtype == torch.float32 and a.shape == r.shape, f"{name} {msg}"
        assert err <= tol, f"{name} rel L2 {err:.3g} > {tol} {msg}"


@pytest.mark.parametrize("hw", [HW_910B, HW_TINY], ids=["910b", "tiny"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: "-".join(sorted(o)) or "plain")
def test_grads_match_float64(ops, part, seed, hw, dtype, opt):
    part(hw, sched_seed=seed)
    eps, zl, cap = opt.get("eps", 0.0), opt.get("z_loss", 0.0), opt.get("softcap", 0.0)
    for n, d, v in SHAPES:
        h, w, b = make(n, d, v, dtype, opt.get("bias", False))
        y = torch.randint(0, v, (n,))
        g = torch.rand(n) + 0.5
        lse = lse_of(h, w, b, cap)
        got = ops._twin_grads(g, h, w, b, y, lse.float(), 0, v, eps, zl, cap, [True, True, True])
        ref = grads64(g, h, w, b, y, lse.float(), 0, v, eps, zl, cap)
        check(got, ref if b is not None else ref[:2] + (None,), dtype, f"seed={seed} shape={(n, d, v)}")


@pytest.mark.parametrize("mask", list(itertools.product([False, True], repeat=3)), ids=str)
def test_grad_masks(ops, part, seed, mask):
    part(HW_TINY, sched_seed=seed)
    n, d, v = 21, 16, 90
    h, w, b = make(n, d, v, torch.float32, True)
    y = torch.randint(0, v, (n,))
    g = torch.rand(n)
    lse = lse_of(h, w, b, 0.0)
    got = ops._twin_grads(g, h, w, b, y, lse.float(), 0, v, 0.0, 0.0, 0.0, list(mask))
    ref = grads64(g, h, w, b, y, lse.float(), 0, v, 0.0, 0.0, 0.0)
    check(got, tuple(r if m else None for r, m in zip(ref, mask)), torch.float32, f"mask={mask}")


def test_ignored_tokens_and_bad_labels(ops, part, seed):
    """g = 0 for ignored tokens contributes nothing; g = NaN (out-of-range label) poisons its own dX row and the dW
    / db it touches, never reads out of bounds."""
    part(HW_TINY, sched_seed=seed)
    n, d, v = 30, 16, 100
    h, w, b = make(n, d, v, torch.bfloat16, True)
    y = torch.randint(0, v, (n,))
    y[5] = 10**6  # out of range, also outside any shard
    g = torch.rand(n) + 0.1
    g[[1, 2, 3]] = 0.0
    g[5] = float("nan")
    lse = lse_of(h, w, b, 0.0).float()
    dx, dw, db = ops._twin_grads(g, h, w, b, y, lse, 0, v, 0.1, 0.0, 0.0, [True, True, True])
    assert torch.isnan(dx[5]).all() and not torch.isnan(dx[torch.arange(n) != 5]).any()
    assert torch.isnan(dw).any() and torch.isnan(db).any()
    assert torch.equal(dx[[1, 2, 3]], torch.zeros(3, d))
    g2 = g.clone()
    g2[5] = 0.0
    got = ops._twin_grads(g2, h, w, b, y, lse, 0, v, 0.1, 0.0, 0.0, [True, True, True])
    check(got, grads64(g2, h, w, b, y, lse, 0, v, 0.1, 0.0, 0.0), torch.bfloat16, f"seed={seed}")


def test_vocab_shard(ops, part, seed):
    """One shard of a vocabulary of 500: label smoothing's uniform term uses vocab_total, labels outside the shard
    give no one-hot term."""
    part(HW_TINY, sched_seed=seed)
    n, d, v, vs, vt = 33, 24, 130, 200, 500
    h, w, b = make(n, d, v, torch.float16, True)
    y = torch.randint(0, vt, (n,))
    y[::3] = torch.randint(vs, vs + v, (len(y[::3]),))
    lse = (lse_of(h, w, b, 0.0) + 1.3).float()  # the global lse is larger than the shard's
    got = ops._twin_grads(torch.ones(n), h, w, b, y, lse, vs, vt, 0.1, 1e-3, 0.0, [True, True, True])
    check(got, grads64(torch.ones(n), h, w, b, y, lse, vs, vt, 0.1, 1e-3, 0.0), torch.float16, f"seed={seed}")


def test_atomic_order_only_changes_rounding(ops, part, seed):
    """Interleavings change the order of the float32 atomic adds of dW (and of dX across segments): results agree
    to float32 rounding, not bit for bit."""
    n, d, v = 9, 16, 200
    h, w, b = make(n, d, v, torch.float32, True)
    y = torch.randint(0, v, (n,))
    lse = lse_of(h, w, b, 0.0).float()
    outs = []
    for s in (seed, seed + 7):
        part(HW_TINY, sched_seed=s, switch_prob=0.9)
        outs.append(ops._twin_grads(torch.ones(n), h, w, b, y, lse, 0, v, 0.0, 0.0, 0.0, [True, True, True]))
    for a, c in zip(*outs):
        assert rel_l2(a, c) < 1e-6
