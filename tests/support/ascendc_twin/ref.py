"""What the twin tests share: the loss's grad kernel call, inputs, tolerances and the parts they run on (the
float64 references of the kernels' contracts are ``fused_lce.core.formulas``')."""
from __future__ import annotations

import os
import random

import torch

from fused_lce.core import formulas
from fused_lce.core.types import Options

from .build import HW_910B, HW_TINY  # noqa: F401  (the parts the tests pick from here)


def fresh_seed() -> int:
    """A new seed each run, fixed under CI (printed in failure messages)."""
    return 20261201 if os.environ.get("CI") else random.randrange(2**31)


# ---------------------------------------------------------------------------------------------- references
# The float64 references are fused_lce.core.formulas' (reference_stats, reference_coef_grads, reference_loss);
# the loss's coefficients are the driver's (formulas.loss_coefs).
def twin_loss_grads(ops, grad_tok, hidden, weight, bias, labels, lse, vocab_start, vocab_total, eps,
                    z_loss, softcap, mask):
    """The grad kernel on the twin with the loss's coefficients (what the npu provider sends for the loss)."""
    opts = Options(label_smoothing=eps, z_loss=z_loss, vocab_total=vocab_total)
    a, t, _, u = formulas.loss_coefs(lse.float(), grad_tok.float(), opts, weight.shape[0])
    return ops._twin_grads_cube(hidden, weight, bias, labels, lse.float(), a, t, None, u, vocab_start,
                                softcap, 1.0, list(mask))


def make_stats_inputs(n, d, v, dtype, bias, scale=1.0):
    """Hidden (scaled), a weight whose logits spread over a few units, an optional bias: the statistics
    tests'."""
    h = (torch.randn(n, d) * scale).to(dtype)
    w = (torch.randn(v, d) / d**0.5 * 3).to(dtype)
    b = torch.randn(v).to(dtype) if bias else None
    return h, w, b


# ---------------------------------------------------------------------------------------------- tolerances
# relative L2 error of the gradients against float64: bf16 / fp16 round dz to the operand dtype before the
# GEMMs
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
    assert torch.allclose(zt.double(), rzt, rtol=1e-5, atol=atol), \
        f"target {msg}: {(zt.double() - rzt).abs().max()}"
    zs_tol = 2e-5 * scale * max(1, z.shape[1]) ** 0.5
    assert torch.allclose(zs.double(), rzs, rtol=1e-5, atol=zs_tol), \
        f"zsum {msg}: {(zs.double() - rzs).abs().max()}"
    assert am.dtype == torch.int64
    # the argmax is the first index whose logit is the maximum; where two logits tie within float32 rounding
    # either may win, so check the value and the index where the top two are apart
    picked = z.gather(1, (am - vocab_start)[:, None])[:, 0]
    assert torch.all(picked >= rm - 4 * atol), f"argmax value {msg}"
    top2 = z.topk(min(2, z.shape[1]), dim=1).values
    apart = (top2[:, 0] - top2[:, -1]) > 8 * atol if z.shape[1] > 1 else torch.ones_like(rm, dtype=torch.bool)
    assert torch.equal(am[apart], ram[apart]), f"argmax index {msg}"
