"""The two kernels on the twin composed like the npu backend composes them (statistics per vocabulary shard
-> combine -> loss -> token weights -> gradients per shard, each step the driver's own from fused_lce.core),
against fused_lce.core.formulas.reference_loss in float64 with autograd: the loss, lse, token accuracy and
every gradient, on one device and on vocabulary shards."""
import pytest
import torch

from fused_lce.core import formulas
from fused_lce.core.distributed import merge_stats
from fused_lce.core.types import Options, Stats

from ..support.ascendc_twin.ref import GRAD_RTOL, HW_910B, HW_TINY, rel_l2, twin_loss_grads

IGNORE = -100


def run_twin(ops, h, w, b, y, shards, eps, zl, cap):
    v = w.shape[0]
    opts = Options(ignore_index=IGNORE, label_smoothing=eps, z_loss=zl, softcap=cap)
    bounds = [round(i * v / shards) for i in range(shards + 1)]
    parts = [ops._twin_stats_cube(h, w[a:c], None if b is None else b[a:c], y, a, cap, 1.0, eps > 0,
                                  False)[:5] for a, c in zip(bounds, bounds[1:])]
    st = Stats(*merge_stats(*(torch.stack(f) for f in zip(*parts))))  # the vocab-parallel combine
    per, lse, correct = formulas.loss_from_stats(st, y, opts, v)
    valid, bad = formulas.label_classes(y, opts, v)
    inv = formulas.safe_inverse(formulas.mean_divisor("mean", None, y, IGNORE, valid))
    g = formulas.token_weights(valid, bad) * inv
    dx = torch.zeros(h.shape, dtype=torch.float32)
    dws, dbs = [], []
    for a, c in zip(bounds, bounds[1:]):
        gx, gw, gb = twin_loss_grads(ops, g, h, w[a:c], None if b is None else b[a:c], y, lse, a, v, eps, zl,
                                     cap, [True, True, b is not None])
        dx += gx
        dws.append(gw)
        dbs.append(gb)
    acc = correct.sum() / max(int(valid.sum()), 1)
    return per.sum() * inv, lse.double(), acc, dx, torch.cat(dws), torch.cat(dbs) if b is not None else None


def reference(h, w, b, y, eps, zl, cap):
    hd = h.double().requires_grad_()
    wd = w.double().requires_grad_()
    bd = b.double().requires_grad_() if b is not None else None
    loss, lse, acc, _ = formulas.reference_loss(hd, wd, y, bd, ignore_index=IGNORE, label_smoothing=eps,
                                                z_loss=zl, softcap=cap or None)
    loss.backward()
    return loss.detach(), lse.detach(), acc, hd.grad, wd.grad, bd.grad if bd is not None else None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("opt", [dict(), dict(bias=True, eps=0.1, zl=1e-3, cap=6.0)], ids=["plain", "all"])
def test_matches_reference_loss(ops, part, seed, dtype, shards, opt):
    part(HW_TINY if shards > 1 else HW_910B, sched_seed=seed)
    n, d, v = 53, 40, 301
    h = torch.randn(n, d).to(dtype)
    w = (torch.randn(v, d) / d**0.5 * 2).to(dtype)
    b = torch.randn(v).to(dtype) if opt.get("bias") else None
    y = torch.randint(0, v, (n,))
    y[::7] = IGNORE
    eps, zl, cap = opt.get("eps", 0.0), opt.get("zl", 0.0), opt.get("cap", 0.0)
    got = run_twin(ops, h, w, b, y, shards, eps, zl, cap)
    ref = reference(h, w, b, y, eps, zl, cap)
    msg = f"seed={seed}"
    assert abs(float(got[0]) - float(ref[0])) <= 2e-5 * max(1.0, abs(float(ref[0]))), msg
    valid = y != IGNORE
    assert torch.allclose(got[1][valid], ref[1][valid], rtol=2e-6, atol=2e-5), msg
    assert abs(float(got[2]) - float(ref[2])) <= 1.0 / n + 1e-12, msg  # one near-tie may flip
    for a, r in zip(got[3:], ref[3:]):
        if r is None:
            continue
        assert rel_l2(a, r) <= GRAD_RTOL[dtype], f"{rel_l2(a, r)} {msg}"


def test_all_tokens_ignored_give_zero(ops, part, seed):
    part(HW_TINY, sched_seed=seed)
    n, d, v = 9, 16, 50
    h, w = torch.randn(n, d), torch.randn(v, d)
    y = torch.full((n,), IGNORE)
    loss, _, _, dx, dw, _ = run_twin(ops, h, w, None, y, 1, 0.0, 0.0, 0.0)
    assert float(loss) == 0.0 and not dx.any() and not dw.any()


def test_bad_label_gives_nan_loss_only_for_that_token(ops, part, seed):
    part(HW_TINY, sched_seed=seed)
    n, d, v = 12, 16, 60
    h, w = torch.randn(n, d), torch.randn(v, d)
    y = torch.randint(0, v, (n,))
    y[4] = v + 5  # out of range: the kernels see no target column, the loss layer marks it NaN
    m, s, zt = ops._twin_stats_cube(h, w, None, y, 0, 0.0, 1.0, False, False)[:3]
    assert float(zt[4]) == 0.0 and torch.isfinite(m).all() and torch.isfinite(s).all()
    g = torch.ones(n)
    g[4] = float("nan")
    dx, dw, _ = twin_loss_grads(ops, g, h, w, None, y, (m + s.log()), 0, v, 0.0, 0.0, 0.0,
                                [True, True, False])
    assert torch.isnan(dx[4]).all() and torch.isfinite(dx[torch.arange(n) != 4]).all() and \
        torch.isnan(dw).any()


def test_more_than_2_pow_31_logits(ops, part):
    """N * V > 2^31 at small D: no index of the kernels (or of the twin) wraps at 32 bits. Statistics only,
    hazard checkers off (they are exercised by every other test); each token's statistics are checked in
    float64."""
    part(HW_910B, sched_seed=3, switch_prob=0.05, hazards=False)
    n, d, v = 65537, 4, 32769
    assert n * v > 2**31
    gen = torch.Generator().manual_seed(5)
    h = torch.randn(n, d, generator=gen).bfloat16()
    w = torch.randn(v, d, generator=gen).bfloat16()
    y = torch.randint(0, v, (n,), generator=gen)
    m, s, zt, _, am = ops._twin_stats_cube(h, w, None, y, 0, 0.0, 1.0, False, False)[:5]
    # float64 reference on tokens spread over the whole range (the full logits would be 17 GB)
    idx = torch.cat([torch.arange(0, 64), torch.randint(0, n, (1024,), generator=gen),
                     torch.arange(n - 64, n)])
    z = h[idx].double() @ w.double().t()
    rm = z.max(dim=1).values
    assert torch.allclose(m[idx].double(), rm, rtol=1e-5, atol=1e-4)
    assert torch.allclose(s[idx].double(), torch.exp(z - rm[:, None]).sum(dim=1), rtol=1e-4)
    assert torch.allclose(zt[idx].double(), z.gather(1, y[idx, None])[:, 0], atol=1e-4)
    assert torch.all(z.gather(1, am[idx, None])[:, 0] >= rm - 1e-4)
