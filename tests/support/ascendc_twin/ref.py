"""Float64 references of the kernels' contracts (per-token statistics and gradients over one vocabulary shard),
tolerances and the parts the twin tests run on."""
from __future__ import annotations

import os
import random

import torch

from .build import HW_910B, HW_TINY  # noqa: F401  (the parts the tests pick from here)


def fresh_seed() -> int:
    """A new seed each run, fixed under CI (printed in failure messages)."""
    return 20261201 if os.environ.get("CI") else random.randrange(2**31)


# ---------------------------------------------------------------------------------------------- float64 references
def logits64(hidden, weight, bias, softcap, temperature=1.0):
    """(z, raw): z = softcap(h W^T + b) / temperature (softcap first), raw = h W^T + b."""
    z = hidden.double() @ weight.double().t()
    if bias is not None:
        z = z + bias.double()
    raw = z
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    return z / temperature, raw


def ez64(z, m):
    """sum_j exp(z_j - m) (z_j - m), -inf logits (and rows whose max is -inf) adding 0."""
    d = z - m[:, None]
    e = torch.exp(d)
    return torch.where(e > 0, e * d, torch.zeros_like(d)).sum(dim=1)


def stats64(hidden, weight, bias, labels, vocab_start, softcap, with_zsum, temperature=1.0):
    """(max, sum exp(z - max), target logit or 0, sum of logits or 0, first argmax + vocab_start) over the shard."""
    z, _ = logits64(hidden, weight, bias, softcap, temperature)
    n, v = z.shape
    m = z.max(dim=1).values if v else torch.full((n,), -float("inf"), dtype=torch.float64)
    s = torch.exp(z - m[:, None]).sum(dim=1)
    local = labels.long() - vocab_start
    hit = (local >= 0) & (local < v)
    zt = torch.where(hit, z.gather(1, local.clamp(0, v - 1)[:, None])[:, 0], torch.zeros_like(m))
    zs = z.sum(dim=1) if with_zsum else torch.zeros_like(m)
    am = z.argmax(dim=1) + vocab_start
    return m, s, zt, zs, am, z


def grads64(grad_tok, hidden, weight, bias, labels, lse, vocab_start, vocab_total, eps, z_loss, softcap):
    """Float64 dX, dW, db of sum_i g_i loss_i over the shard, given the global lse (the kernel's contract)."""
    z, raw = logits64(hidden, weight, bias, softcap)
    n, v = z.shape
    g = grad_tok.double()
    l64 = lse.double()
    p = torch.exp(z - l64[:, None])
    dz = (g * (1 + 2 * z_loss * l64))[:, None] * p - (g * eps / vocab_total)[:, None]
    local = labels.long() - vocab_start
    hit = (local >= 0) & (local < v)
    rows = torch.arange(n)[hit]
    dz[rows, local[hit]] -= (g * (1 - eps))[hit]
    if softcap:
        dz = dz * (1 - torch.tanh(raw / softcap) ** 2)
    dx = dz @ weight.double()
    dw = dz.t() @ hidden.double()
    db = dz.sum(dim=0)
    return dx, dw, db


def loss_coefs(grad_tok, lse, eps, z_loss, vocab_total):
    """The loss's (4, N) float32 coefficient planes a, t, b, u of the grad kernel (fused_lce.formulas.loss_coefs)."""
    g = grad_tok.float()
    l32 = lse.float()
    return torch.stack([g * (1 + 2 * z_loss * l32), g * (1 - eps), torch.zeros_like(g), g * (eps / vocab_total)])


def coef_grads64(coefs, hidden, weight, bias, labels, lse, vocab_start, softcap, temperature=1.0):
    """Float64 dX, dW, db of dz = p (a + b z) - t onehot - u (times the softcap derivative) over the shard."""
    z, raw = logits64(hidden, weight, bias, softcap, temperature)
    n, v = z.shape
    a, t, b, u = (c.double() for c in coefs)
    l64 = lse.double()
    p = torch.exp(z - l64[:, None])
    bz = torch.where(p > 0, b[:, None] * z, torch.zeros_like(z))  # p = 0 (z = -inf) adds 0
    dz = p * a[:, None] + p * bz - u[:, None]
    local = labels.long() - vocab_start
    hit = (local >= 0) & (local < v)
    rows = torch.arange(n)[hit]
    dz[rows, local[hit]] -= t[hit]
    if softcap:
        dz = dz * (1 - torch.tanh(raw / softcap) ** 2)
    return dz @ weight.double(), dz.t() @ hidden.double(), dz.sum(dim=0)


def twin_loss_grads(ops, grad_tok, hidden, weight, bias, labels, lse, vocab_start, vocab_total, eps, z_loss, softcap,
                    mask):
    """The grad kernel on the twin with the loss's coefficients (what the npu provider sends for the loss)."""
    a, t, _, u = loss_coefs(grad_tok, lse, eps, z_loss, vocab_total)
    dx, dw, db = ops._twin_grads_cube(hidden, weight, bias, labels, lse.float(), a, t, None, u, vocab_start, softcap,
                                      1.0, list(mask))
    return dx, dw, db


def make_stats_inputs(n, d, v, dtype, bias, scale=1.0):
    """Hidden (scaled), a weight whose logits spread over a few units, an optional bias: the statistics tests'."""
    h = (torch.randn(n, d) * scale).to(dtype)
    w = (torch.randn(v, d) / d**0.5 * 3).to(dtype)
    b = torch.randn(v).to(dtype) if bias else None
    return h, w, b


# ---------------------------------------------------------------------------------------------- tolerances
# relative L2 error of the gradients against float64: bf16 / fp16 round dz to the operand dtype before the GEMMs
GRAD_RTOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}


def rel_l2(a, b) -> float:
    a, b = a.double(), b.double()
    nb = float(b.norm())
    return float((a - b).norm()) / nb if nb > 0 else float((a - b).norm())


def assert_stats(got, ref, scale, vocab_start, msg):
    """Statistics within float32 rounding of the float64 reference, scaled by the logits' magnitude."""
    m, s, zt, zs, am = got[:5]
    rm, rs, rzt, rzs, ram, z = ref
    atol = 2e-5 * scale
    assert torch.allclose(m.double(), rm, rtol=1e-5, atol=atol), f"max {msg}: {(m.double() - rm).abs().max()}"
    rel_s = ((s.double() - rs) / rs).abs().max()
    assert torch.allclose(s.double(), rs, rtol=2e-5, atol=1e-6), f"sum_exp {msg}: {rel_s}"
    assert torch.allclose(zt.double(), rzt, rtol=1e-5, atol=atol), f"target {msg}: {(zt.double() - rzt).abs().max()}"
    zs_tol = 2e-5 * scale * max(1, z.shape[1]) ** 0.5
    assert torch.allclose(zs.double(), rzs, rtol=1e-5, atol=zs_tol), f"zsum {msg}: {(zs.double() - rzs).abs().max()}"
    assert am.dtype == torch.int64
    # the argmax is the first index whose logit is the maximum; where two logits tie within float32 rounding
    # either may win, so check the value and the index where the top two are apart
    picked = z.gather(1, (am - vocab_start)[:, None])[:, 0]
    assert torch.all(picked >= rm - 4 * atol), f"argmax value {msg}"
    top2 = z.topk(min(2, z.shape[1]), dim=1).values
    apart = (top2[:, 0] - top2[:, -1]) > 8 * atol if z.shape[1] > 1 else torch.ones_like(rm, dtype=torch.bool)
    assert torch.equal(am[apart], ram[apart]), f"argmax index {msg}"
