"""FusedLceGradVector (csrc/ascend/fused_lce_grad) compiled and run on the AscendC CPU twin, against float64 gradients
of sum_i g_i * loss_i over one vocabulary shard given the saved lse: every dtype and option (bias, label smoothing,
z-loss, softcap, gradient masks), ignored tokens (g = 0), bad labels (g = NaN), odd V and tails, several cores and
segments (dX of a token block accumulated by several cores with float32 atomics), vocabulary shards."""
import itertools

import pytest
import torch

from ..support.ascendc_twin.ref import (GRAD_RTOL, HW_910B, HW_TINY, coef_grads64, grads64, logits64, rel_l2,
                                        twin_loss_grads)

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
        got = twin_loss_grads(ops, g, h, w, b, y, lse.float(), 0, v, eps, zl, cap, [True, True, True])
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
    got = twin_loss_grads(ops, g, h, w, b, y, lse.float(), 0, v, 0.0, 0.0, 0.0, list(mask))
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
    dx, dw, db = twin_loss_grads(ops, g, h, w, b, y, lse, 0, v, 0.1, 0.0, 0.0, [True, True, True])
    assert torch.isnan(dx[5]).all() and not torch.isnan(dx[torch.arange(n) != 5]).any()
    assert torch.isnan(dw).any() and torch.isnan(db).any()
    assert torch.equal(dx[[1, 2, 3]], torch.zeros(3, d))
    g2 = g.clone()
    g2[5] = 0.0
    got = twin_loss_grads(ops, g2, h, w, b, y, lse, 0, v, 0.1, 0.0, 0.0, [True, True, True])
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
    got = twin_loss_grads(ops, torch.ones(n), h, w, b, y, lse, vs, vt, 0.1, 1e-3, 0.0, [True, True, True])
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
        outs.append(twin_loss_grads(ops, torch.ones(n), h, w, b, y, lse, 0, v, 0.0, 0.0, 0.0, [True, True, True]))
    for a, c in zip(*outs):
        assert rel_l2(a, c) < 1e-6


# --------------------------------------------------------- linear_logprobs: Coefs (a, t, b, u) and temperature
def lse_t(h, w, b, softcap, temperature):
    z, _ = logits64(h, w, b, softcap, temperature)
    return torch.logsumexp(z, dim=1)


def random_coefs(n, with_b=True, with_u=True):
    """Per-token (4, N) float32 a, t, b, u of both signs, as the driver's logprob_coefs / loss_coefs form them."""
    c = torch.randn(4, n)
    if not with_b:
        c[2] = 0.0
    if not with_u:
        c[3] = 0.0
    return c


COEF_OPTIONS = [dict(temperature=0.7), dict(temperature=1.3, bias=True), dict(temperature=0.7, softcap=4.0),
                dict(temperature=1.0, u=True), dict(temperature=1.3, softcap=3.0, bias=True, u=True)]


@pytest.mark.parametrize("hw", [HW_910B, HW_TINY], ids=["910b", "tiny"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opt", COEF_OPTIONS, ids=lambda o: "-".join(f"{k}{v}" for k, v in sorted(o.items())))
def test_coefs_match_float64(ops, part, seed, hw, dtype, opt):
    """dz = p (a + b z) - t onehot - u with random per-token coefficients (b != 0: the entropy's term), tempered
    logits (the kernel only recomputes z with T; the coefficients carry 1 / T) and the softcap derivative."""
    part(hw, sched_seed=seed)
    temp, cap = opt["temperature"], opt.get("softcap", 0.0)
    for n, d, v in SHAPES:
        h, w, b = make(n, d, v, dtype, opt.get("bias", False))
        y = torch.randint(0, v, (n,))
        c = random_coefs(n, with_u=opt.get("u", False))
        lse = lse_t(h, w, b, cap, temp).float()
        got = ops._twin_grads_vector(h, w, b, y, lse, c, 0, cap, temp, [True, True, True])
        ref = coef_grads64(c, h, w, b, y, lse, 0, cap, temp)
        check(got, ref if b is not None else ref[:2] + (None,), dtype, f"seed={seed} shape={(n, d, v)}")


def test_coefs_zero_rows_nan_rows_and_masked_vocabulary(ops, part, seed):
    """All-zero coefficient rows contribute exactly 0 whatever their lse (an all -inf row has lse = -inf); a NaN
    b poisons its own dX row only; -inf logits (masked vocabulary) give 0, not 0 * -inf, in the b z term; a label
    out of range is only compared."""
    part(HW_TINY, sched_seed=seed)
    n, d, v = 30, 16, 100
    h, w, b = make(n, d, v, torch.float32, True)
    b[torch.randperm(v)[:30]] = -float("inf")
    y = torch.randint(0, v, (n,))
    y[7] = 10**6
    c = random_coefs(n)
    lse = lse_t(h, w, b, 0.0, 0.7).float()
    zero = [1, 2, 20]
    c[:, zero] = 0.0
    lse[zero] = -float("inf")  # would make p = exp(z + inf) = inf if the row were not skipped
    got = ops._twin_grads_vector(h, w, b, y, lse, c, 0, 0.0, 0.7, [True, True, True])
    assert all(torch.isfinite(g).all() for g in got)
    assert torch.equal(got[0][zero], torch.zeros(len(zero), d))
    lse_ref = lse.clone()
    lse_ref[zero] = 0.0  # the reference multiplies finite p by 0
    ref = coef_grads64(c, h, w, b, y, lse_ref, 0, 0.0, 0.7)
    check(got, ref, torch.float32, f"seed={seed}")
    c2 = c.clone()
    c2[2, 5] = float("nan")
    dx, dw, db = ops._twin_grads_vector(h, w, b, y, lse, c2, 0, 0.0, 0.7, [True, True, True])
    assert torch.isnan(dx[5]).all() and torch.isfinite(dx[torch.arange(n) != 5]).all()
    assert torch.isnan(dw).any() and torch.isnan(db).any()


def test_loss_coefs_equal_the_legacy_weight_form(ops, part, seed):
    """The loss through Coefs (b = 0, u from label smoothing) is the gradient of sum g_i loss_i with smoothing and
    z-loss: the driver's loss_coefs and the float64 reference of the loss agree."""
    part(HW_TINY, sched_seed=seed)
    n, d, v = 37, 45, 301
    h, w, b = make(n, d, v, torch.float32, True)
    y = torch.randint(0, v, (n,))
    g = torch.rand(n) + 0.5
    lse = lse_of(h, w, b, 2.0).float()
    from fused_lce.core import Options
    from fused_lce.core.formulas import loss_coefs
    opts = Options(label_smoothing=0.1, z_loss=1e-2, softcap=2.0)
    co = loss_coefs(lse, g, opts, v)
    planes = torch.stack([x if x is not None else torch.zeros(n) for x in co])
    got = ops._twin_grads_vector(h, w, b, y, lse, planes, 0, 2.0, 1.0, [True, True, True])
    check(got, grads64(g, h, w, b, y, lse, 0, v, 0.1, 1e-2, 2.0), torch.float32, f"seed={seed}")
