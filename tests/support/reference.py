"""The float64 answer of a problem and the tolerances every comparison with it uses (relative to the
magnitudes that formed each value). The reference itself is ``fused_lce.core.formulas.reference_loss``; this
module adds its gradients and the magnitudes the tolerances scale with."""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from fused_lce.core.formulas import reference_loss, softcapped


def rel_err(a, b):
    a = a.double()
    b = b.double()
    denom = b.norm()
    diff = (a - b).norm()
    return float(diff / denom) if float(denom) > 0 else float(diff)


# Tolerances against the float64 reference, per input dtype: relative to the reference's own magnitude (rtol)
# plus absolute floors proportional to the magnitudes of the summands that formed the value: floating-point
# error scales with those, and cancellation can leave the result itself tiny (a gradient of 1e-4 summed from
# terms of 1: hypothesis once found n=1, d=1, v=25, smoothing=0.3, softcap=2).
#   logits z = h @ W.T + b carry an error ~ u * zmag with zmag = |h| @ |W|.T + |b| (u: float32 unit roundoff);
#   loss / lse: |ours - ref| <= LOSS_TOL |ref| + LOSS_ATOL * (sum of the per-token terms' magnitudes, in zmag)
#   gradients:  ||ours - ref|| <= GRAD_TOL ||ref|| + SUMMAND_TOL || B @ |W| || + LOGIT_TOL || P @ |W| ||
#               (dX; dW uses B.T @ |h|, db sum B) with B the magnitude of dz's terms and P = |dz's softmax
#               term| times the logit magnitudes (the softmax inherits the logits' error); with a softcap
#               the factor 1 - tanh^2 enters as 1 + tanh^2, its terms' magnitude (near saturation it cancels
#               to ~0), and a capped logit carries its own rounding on top of zmag: relative, so at most
#               u * min(zmag, softcap) (an absolute error ~u in tanh, times softcap, would let a softcap of
#               1e4 cost 1e-4 per logit)
# GRAD_TOL covers rounding the returned gradient to the input dtype; SUMMAND_TOL the gradient GEMMs (their
# float32 accumulation, and dz rounded to bf16/fp16 by some kernels: about one unit of that precision).
GRAD_TOL = {torch.float32: 1e-4, torch.bfloat16: 1.2e-2, torch.float16: 2e-3}
SUMMAND_TOL = {torch.float32: 1e-5, torch.bfloat16: 4e-3, torch.float16: 5e-4}
LOGIT_TOL = 1e-6  # ~16 float32 units: logits are float32 whatever the input dtype
LOSS_TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-5, torch.float16: 2e-5}
LOSS_ATOL = {torch.float32: 1e-6, torch.bfloat16: 1e-5, torch.float16: 1e-5}
LSE_TOL = 1e-5


class Reference(NamedTuple):
    """The float64 answer of a problem and the magnitudes its tolerances scale with (all float64, CPU)."""

    loss: torch.Tensor
    lse: torch.Tensor
    token_accuracy: torch.Tensor
    n_valid: torch.Tensor
    grads: tuple  # d(upstream . loss) / d(hidden, weight, bias); None where absent
    loss_scale: torch.Tensor  # like loss: sum of |per-token terms| that formed it
    lse_scale: torch.Tensor  # like lse: max logit magnitude (zmag) of the token
    grad_scales: tuple  # like grads: B @ |W|, B.T @ |h|, sum B
    grad_logit_scales: tuple  # like grads: P @ |W|, P.T @ |h|, sum P


def fp64_reference(h, w, y, b=None, *, upstream=None, reduction="mean", shift=False, ignore_index=-100,
                   label_smoothing=0.0, z_loss=0.0, softcap=None, num_items=None) -> Reference:
    """``fused_lce.core.formulas.reference_loss`` (float64, CPU) with its gradients for the upstream gradient
    ``upstream`` (ones when None), and the magnitudes the comparison tolerances scale with."""
    f64 = torch.float64
    leaf = lambda t: None if t is None else t.detach().cpu().to(f64).requires_grad_()  # noqa: E731
    hr, wr, br = leaf(h), leaf(w), leaf(b)
    y = y.cpu()
    opts = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap)
    if wr.shape[0] == 0:  # empty vocabulary: every label must be ignored (else it is a bad label: NaN)
        ys = y[..., 1:] if shift else y
        assert not (ys != ignore_index).any(), "V == 0 has no reference answer for a valid label"
        per = torch.zeros(ys.shape, dtype=f64)
        loss = per if reduction == "none" else per.sum()
        lse, acc, n_valid = torch.zeros(ys.shape, dtype=f64), torch.zeros((), dtype=f64), (ys < 0).sum() * 0
        g = torch.ones_like(loss) if upstream is None else upstream.detach().cpu().to(f64).reshape(loss.shape)
        grads = tuple(None if t is None else torch.zeros_like(t) for t in (hr, wr, br))
    else:
        loss, lse, acc, n_valid = reference_loss(hr, wr, y, br, reduction=reduction, shift=shift,
                                                 num_items=num_items, **opts)
        g = torch.ones_like(loss) if upstream is None else upstream.detach().cpu().to(f64).reshape(loss.shape)
        leaves = [t for t in (hr, wr, br) if t is not None]
        got = iter(torch.autograd.grad(loss, leaves, g, allow_unused=True))
        grads = tuple(None if t is None else next(got) for t in (hr, wr, br))
        # unused: zero gradient
        grads = tuple(None if t is None else (torch.zeros_like(t) if gr is None else gr)
                      for t, gr in zip((hr, wr, br), grads))
    with torch.no_grad():
        hh, yy = (hr[..., :-1, :], y[..., 1:]) if shift else (hr, y)
        v, d = wr.shape
        yf = yy.reshape(-1).long()
        n = yf.shape[0]
        hf = hh.reshape(n, d)  # explicit rows: reshape(-1, 0) is ambiguous
        z = hf @ wr.t() + (br if br is not None else 0.0)
        finite = torch.isfinite(z)
        zmag = hf.abs() @ wr.abs().t() + (br.abs() if br is not None else 0.0)
        zmag = torch.where(finite, zmag, torch.zeros_like(zmag))  # a -inf (masked) logit is exact
        dcap = torch.ones_like(z)  # magnitude of the softcap derivative's terms: 1 + t^2 (1 - t^2 cancels)
        if softcap:
            z = softcapped(z, softcap)
            t = z / softcap
            dcap = 1 + t * t
            # softcap * tanh(z / softcap) is rounded relative to its size, which is at most min(|z|, softcap)
            zmag = torch.where(finite, zmag + zmag.clamp(max=softcap), zmag)
        valid = yf != ignore_index
        zeros = torch.zeros(n, dtype=f64)
        zmax = zmag.amax(-1) if v else zeros
        lse_f = torch.logsumexp(z, -1) if v else torch.full((n,), -math.inf, dtype=f64)
        alse = torch.where(torch.isfinite(lse_f), lse_f.abs(), zeros)
        eps = label_smoothing
        safe = torch.where(valid, yf, torch.zeros_like(yf)).clamp(0, max(v - 1, 0))
        zy = zmag.gather(1, safe[:, None]).squeeze(1) if v else zeros
        zmean = zmag.mean(-1) if v else zeros
        per = (1 - eps) * (alse + zy) + eps * (alse + zmean) + z_loss * (alse + zmax) ** 2 + zmax
        per = torch.where(valid, per, zeros)
        if reduction == "none":
            c = g.reshape(-1).abs()
            loss_scale = per.reshape(loss.shape)
        else:
            div = float(num_items) if num_items is not None else float(valid.sum())
            inv = (1.0 / div if div > 0 else 0.0) if reduction == "mean" else 1.0
            c = (g.abs() * inv).expand(n)
            loss_scale = per.sum() * inv
        c = torch.where(valid, c, zeros)
        p = torch.softmax(z, -1).nan_to_num(0.0) if v else z  # a row of -inf logits has no p: 0 (not NaN)
        onehot = torch.zeros_like(z)
        if v:
            onehot[torch.arange(n), safe] = 1.0
        soft = c[:, None] * (1 + 2 * z_loss * alse)[:, None] * p * dcap.abs()
        big_b = soft + c[:, None] * ((1 - eps) * onehot + eps / max(v, 1)) * dcap.abs()
        big_p = soft * (1 + zmag + zmax[:, None])

        def spread(m):
            sh = torch.zeros_like(hr)
            (sh[..., :-1, :] if shift else sh).copy_((m @ wr.abs()).reshape(hh.shape))
            return sh, m.t() @ hf.abs(), m.sum(0) if br is not None else None

        scales, logit_scales = spread(big_b), spread(big_p)
    return Reference(loss.detach(), lse.detach(), acc.detach(), n_valid, grads, loss_scale,
                     zmax.reshape(lse.shape), scales, logit_scales)


def assert_loss_close(ours, ref: Reference, dtype, what="loss"):
    ours = ours.detach().cpu().double()
    assert ours.shape == ref.loss.shape, (what, ours.shape, ref.loss.shape)
    err = (ours - ref.loss).abs()
    tol = LOSS_TOL[dtype] * ref.loss.abs() + LOSS_ATOL[dtype] * ref.loss_scale
    assert bool((err <= tol).all()), (what, float(err.max()), float(tol.min()))


def assert_lse_close(ours, ref: Reference):
    ours = ours.detach().cpu().double()
    err = (ours - ref.lse).abs()
    tol = LSE_TOL * (ref.lse.abs() + ref.lse_scale)
    ok = (err <= tol) | (ours == ref.lse)  # -inf == -inf (V == 0)
    assert bool(ok.all()), ("lse", float(err.max()))


def grad_close(ours, want, scale, logit_scale, dtype) -> tuple[bool, float, float]:
    """(within tolerance, ||ours - want||, the tolerance) for one gradient (norms in float64)."""
    diff = float((ours.detach().cpu().double() - want).norm())
    tol = (GRAD_TOL[dtype] * float(want.norm()) + SUMMAND_TOL[dtype] * float(scale.norm())
           + LOGIT_TOL * float(logit_scale.norm()))
    return diff <= tol, diff, tol


def assert_grads_close(grads, ref: Reference, dtype, names="hwb"):
    """``grads``: (dh, dw, db) as returned (None where not computed); each present one is compared."""
    for name, ours, want, scale, lscale in zip(names, grads, ref.grads, ref.grad_scales,
                                               ref.grad_logit_scales):
        if ours is None or want is None:
            continue
        assert ours.shape == want.shape, (name, ours.shape, want.shape)
        assert torch.isfinite(ours).all(), name
        ok, diff, tol = grad_close(ours, want, scale, lscale, dtype)
        assert ok, (name, diff, tol, float(want.norm()))
