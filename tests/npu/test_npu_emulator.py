"""(b) The tile emulator of the AscendC kernels against the float64 reference, every option, with gradients.

The emulator is the spec of csrc/ascend/: float32 logits from exact bf16/fp16 products, float32 online softmax,
dz rounded to the input dtype before the gradient GEMMs, float32 accumulation. So the loss and lse must agree with
the float64 reference to float32 rounding whatever the input dtype, and the gradients to the rounding of dz.
"""
import math

import pytest
import torch

from fused_lce import driver
from fused_lce.backends.base import Options
from fused_lce.backends.npu import AscendCProvider
from fused_lce.reference import reference_loss

from ..conftest import run_provider, run_provider_backward
from . import npu_emulator as E

# a tiny part: small tiles, several K chunks, token tails and vocabulary segments on 130 x 517 problems
SMALL_HW = E.HwSpec(cube_cores=5, ub_bytes=40 * 1024, l1_bytes=64 * 1024, l0a_bytes=16 * 1024,
                    l0b_bytes=16 * 1024, l0c_bytes=32 * 1024)
GRAD_TOL = {torch.float32: 5e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2}
OPTIONS = [dict(), dict(bias=True), dict(ls=0.1), dict(z=1e-2), dict(cap=4.0),
           dict(bias=True, ls=0.3, z=1e-3, cap=2.5)]


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def make(n, d, v, dtype, seed, bias=False, ignore_every=5):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).to(dtype)
    w = (torch.randn(v, d, generator=g) * (3.0 / math.sqrt(d))).to(dtype)
    b = torch.randn(v, generator=g).to(dtype) if bias else None
    y = torch.randint(0, v, (n,), generator=g)
    if n:
        y[:: ignore_every] = -100
    return h, w, b, y, g


def reference(h, w, b, y, ls, z, cap, upstream):
    h64 = h.double().requires_grad_()
    w64 = w.double().requires_grad_()
    b64 = b.double().requires_grad_() if b is not None else None
    per, lse, _, _ = reference_loss(h64, w64, y, b64, reduction="none", label_smoothing=ls, z_loss=z,
                                    softcap=cap or None)
    (per * upstream.double()).sum().backward()
    logits = h.double() @ w.double().t() + (b.double() if b is not None else 0)
    if cap:
        logits = cap * torch.tanh(logits / cap)
    return per.detach(), lse.detach(), logits.argmax(-1), h64.grad, w64.grad, (b64.grad if b is not None else None)


@pytest.mark.parametrize("hw", [E.HwSpec(), SMALL_HW], ids=["910b", "small"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(o) or "plain")
def test_emulator_matches_fp64_reference(hw, dtype, opts, seed):
    n, d, v = (37, 45, 301) if hw is SMALL_HW else (70, 40, 517)
    h, w, b, y, g = make(n, d, v, dtype, seed, bias=opts.get("bias", False))
    ls, z, cap = opts.get("ls", 0.0), opts.get("z", 0.0), opts.get("cap", 0.0)
    p = E.plan_for(h, w, b is not None, ls > 0, bool(cap), False, hw)
    assert p.n_blocks > 1 and (p.segments > 1 or p.m_blocks > 1)  # the online update and merges really run
    m, s, zt, zs, amax = E.stats(h, w, b, y, 0, cap, ls > 0, hw)
    loss, lse, correct = E.finish(m, s, zt, zs, amax, y, -100, ls, z, v)
    upstream = torch.rand(n, generator=g) + 0.5
    r_loss, r_lse, r_argmax, r_dh, r_dw, r_db = reference(h, w, b, y, ls, z, cap, upstream)
    ctx = f"seed={seed}"
    assert rel(loss, r_loss) < 1e-6, ctx
    assert rel(lse, r_lse) < 1e-6, ctx
    valid = y != -100
    assert torch.equal(correct, valid & (r_argmax == y)), ctx
    assert torch.all(loss[~valid] == 0), ctx
    g_tok = driver.token_weights(valid, torch.zeros_like(valid), upstream)
    dx, dw, db = E.grads(g_tok, h, w, b, y, lse, 0, v, ls, z, cap, [True, True, True], hw)
    assert dx.dtype == dw.dtype == torch.float32  # float32 accumulators
    tol = GRAD_TOL[dtype]
    assert rel(dx, r_dh) < tol, (ctx, rel(dx, r_dh))
    assert rel(dw, r_dw) < tol, (ctx, rel(dw, r_dw))
    if b is not None:
        assert rel(db, r_db) < 1e-5, ctx  # db sums the float32 dz
    assert torch.all(dx[~valid] == 0), ctx


def test_vocab_shards_combine_like_one_device(seed):
    """Two ranks' local stats (vocab_start != 0), merged as fused_lce.distributed.combine_stats does, give the
    unsharded result: the kernel's shard-local target/argmax conventions are right."""
    h, w, b, y, _ = make(50, 32, 300, torch.bfloat16, seed, bias=True)
    full = E.stats(h, w, b, y, 0, 0.0, True)
    parts = [E.stats(h, w[:130], b[:130], y, 0, 0.0, True), E.stats(h, w[130:], b[130:], y, 130, 0.0, True)]
    merged = E.merge_segments(parts)
    for a, c in zip(merged, full):
        if a.dtype == torch.int64:
            assert torch.equal(a, c), seed
        else:
            assert rel(a, c) < 1e-6, seed


def test_bad_labels_poison_and_all_ignored_is_zero():
    h, w, _, y, g = make(20, 16, 200, torch.float32, 3)
    y[4] = 200    # out of range
    y[5] = -7     # negative, not ignore_index
    m, s, zt, zs, amax = E.stats(h, w, None, y, 0, 0.0, False)
    loss, lse, correct = E.finish(m, s, zt, zs, amax, y, -100, 0.0, 0.0, 200)
    assert math.isnan(loss[4]) and math.isnan(loss[5]) and not correct[4] and not correct[5]
    assert torch.isfinite(loss[6:]).all()
    valid = y != -100
    bad = valid & ((y < 0) | (y >= 200))
    dx, dw, _ = E.grads(driver.token_weights(valid, bad, torch.ones(20)), h, w, None, y, lse, 0, 200, 0.0, 0.0, 0.0,
                        [True, True, False])
    assert torch.isnan(dx[4]).all() and torch.isfinite(dx[6:]).all() and torch.isnan(dw).any()
    yi = torch.full((20,), -100)
    m, s, zt, zs, amax = E.stats(h, w, None, yi, 0, 0.0, False)
    loss, lse, _ = E.finish(m, s, zt, zs, amax, yi, -100, 0.0, 0.0, 200)
    assert torch.all(loss == 0)
    dx, dw, _ = E.grads(torch.zeros(20), h, w, None, yi, lse, 0, 200, 0.0, 0.0, 0.0, [True, True, False])
    assert torch.all(dx == 0) and torch.all(dw == 0)


def test_no_tokens():
    h, w, _, y, _ = make(0, 8, 40, torch.bfloat16, 0)
    m, s, zt, zs, amax = E.stats(h, w, None, y, 0, 0.0, False)
    assert m.shape == (0,)
    dx, dw, _ = E.grads(torch.zeros(0), h, w, None, y, m, 0, 40, 0.0, 0.0, 0.0, [True, True, False])
    assert dx.shape == (0, 8) and torch.all(dw == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_npu_backend_glue_with_emulated_kernels(dtype, seed):
    """The "npu" provider's Python side (statistics, gradients, casts) through the driver on CPU tensors, with the
    emulator standing in for the compiled kernels."""
    be = AscendCProvider("npu_emulated", kernels=E.Kernels(), device_types=("cpu",))
    assert be.unavailable_reason() is None
    h, w, b, y, g = make(45, 24, 260, dtype, seed, bias=True)
    cfg = Options(ignore_index=-100, label_smoothing=0.1, z_loss=1e-3, softcap=6.0)
    valid = y != -100
    scale = torch.tensor(1.0 / float(valid.sum()))
    loss, lse, _, (dh, dw, db) = run_provider(be, h, w, y, b, cfg, scale)
    r_loss, r_lse, _, r_dh, r_dw, r_db = reference(h, w, b, y, 0.1, 1e-3, 6.0, torch.full((45,), float(scale)))
    assert rel(loss, r_loss) < 1e-6 and rel(lse, r_lse) < 1e-6, seed
    assert dh.dtype == dtype and dw.dtype == dtype and db.dtype == dtype
    tol = GRAD_TOL[dtype] * 2
    assert rel(dh, r_dh) < tol and rel(dw, r_dw) < tol and rel(db, r_db) < tol, seed
    up = torch.rand(45, generator=g)
    dh, dw, db = run_provider_backward(be, up, h, w, y, b, lse, cfg, (True, False, True))
    _, _, _, r_dh2, _, r_db2 = reference(h, w, b, y, 0.1, 1e-3, 6.0, up)
    assert dw is None and rel(dh, r_dh2) < tol and rel(db, r_db2) < tol, seed
