"""The maths, once: per-token loss, log-prob and gradient-coefficient formulas (what the driver evaluates on
the statistics the kernels return), and beside them the dense float64 reference of the same semantics
(docs/spec.md), which the tests and benchmarks compare every provider with.

No kernel holds a loss formula: the driver turns statistics into losses here, and gives providers either
per-token ``Coefs`` (``loss_coefs``, ``logprob_coefs``) or, for one-pass kernels that learn ``lse`` inside,
the four numbers of ``LossTerms`` (``loss_terms``).
"""
from __future__ import annotations

import math
import struct
from typing import Optional

import torch

from .types import Coefs, EntropyStats, LossTerms, Options, Stats


# ----------------------------------------------------------------------------------------- per-token formulas
def lse_of(m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """log-sum-exp from (max, sum exp(z - max)); -inf when every logit is -inf."""
    return m + torch.log(s)


def classify_labels(labels: torch.Tensor, ignore_index: int, vocab: int,
                    valid: Optional[torch.Tensor] = None):
    """(valid, bad) of integer ``labels``: not ``ignore_index`` (``valid``: that mask when the caller has it),
    and valid but outside ``[0, vocab)``. The one label-range test: the API's ``validate`` check,
    ``label_errors`` and the NaN of a bad label in the loss and log-probs all use it."""
    y = _comparable(labels, ignore_index, vocab)
    valid = y != ignore_index if valid is None else valid
    return valid, valid & ((y < 0) | (y >= vocab))


def label_valid(labels: torch.Tensor, opts: Options) -> torch.Tensor:
    """The tokens whose label is not ``ignore_index`` (bool)."""
    return _comparable(labels, opts.ignore_index, 0) != opts.ignore_index


def label_classes(labels: torch.Tensor, opts: Options, v_local: int, valid: Optional[torch.Tensor] = None):
    """``classify_labels`` against the global vocabulary of ``opts``."""
    return classify_labels(labels, opts.ignore_index, opts.vocab(v_local), valid)


def _comparable(labels: torch.Tensor, ignore_index: int, vocab: int) -> torch.Tensor:
    """Labels that compare exactly with the Python ints ``ignore_index`` and ``vocab``: a Python int compared
    with an int32 tensor is cast to int32 (2**32 + 1 would equal 1), so int32 labels become int64 unless both
    fit in int32 (no copy, no launch in the usual case)."""
    if labels.dtype == torch.int64 or (-2**31 <= ignore_index < 2**31 and vocab < 2**31):
        return labels
    return labels.long()


# Few, scalar-operand ops below: each costs a launch and tens of microseconds of host time per step on the
# GPU, which at small token counts is the step's critical path.
def per_token(x: torch.Tensor, valid: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """``x`` where the label is valid, 0 where it is ignored, NaN where it is out of range."""
    return torch.where(bad, math.nan, torch.where(valid, x, 0.0))


def token_weights(valid: torch.Tensor, bad: torch.Tensor,
                  upstream: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-token weight of the gradient: ``upstream`` (1 when None) where valid, 0 where ignored, NaN where
    the label is out of range (a bad label must poison the gradients it would have produced, never index)."""
    if upstream is None:
        return valid.to(torch.float32).masked_fill_(bad, math.nan)
    return per_token(upstream.to(torch.float32).expand(valid.shape), valid, bad)


def loss_from_stats(st: Stats, labels: torch.Tensor, opts: Options, v_local: int, classes=None):
    """Per-token (loss, lse, correct) from global statistics: the SPEC loss
    ``(1 - eps) (lse - z_y) + eps (lse - mean z) + z_loss lse^2``, 0 where ignored, NaN for a bad label. The
    statistics of an ignored token are not read (a provider may skip its logits): its lse is 0. ``classes``:
    the ``label_classes`` of ``labels`` when the caller has them."""
    vt = opts.vocab(v_local)
    valid, bad = classes if classes is not None else label_classes(labels, opts, v_local)
    lse = torch.where(valid, lse_of(st.m, st.s), 0.0)
    eps = opts.label_smoothing
    per = lse - st.target
    if eps:
        per = (1.0 - eps) * per + eps * (lse - st.zsum / vt)
    if opts.z_loss:
        per = per + opts.z_loss * lse * lse
    return per_token(per, valid, bad), lse, valid & (st.argmax == labels)


def loss_terms(opts: Options, v_local: int) -> LossTerms:
    """The gradient of that loss, ``dz = g (1 + 2 z_loss lse) p - g (1 - eps) onehot - g eps / V``, as the
    affine form of ``LossTerms``."""
    eps = float(opts.label_smoothing)
    return LossTerms(1.0, 2.0 * float(opts.z_loss), 1.0 - eps, eps / max(opts.vocab(v_local), 1))


def loss_coefs(lse: torch.Tensor, g: torch.Tensor, opts: Options, v_local: int) -> Coefs:
    """Per-token coefficients of the loss gradient (``loss_terms`` evaluated at each token's lse). A token of
    weight 0 (ignored) gets exactly 0, also where its lse is -inf (every logit masked) and z-loss would give
    ``0 * -inf``; a NaN weight (bad label) stays NaN."""
    k = loss_terms(opts, v_local)
    a = g * (k.a0 + k.a1 * lse) if k.a1 else g * k.a0
    if k.a1:
        a = torch.where(g == 0, torch.zeros_like(a), a)
    return Coefs(a=a, t=g * k.t0, u=g * k.u0 if k.u0 else None)


def logprobs_from_stats(st, labels: torch.Tensor, opts: Options, v_local: int, lse_half=None):
    """Per-token outputs of ``p = softmax(z)`` from the statistics: (logprob, entropy | None, lse, E_p[z] |
    None, mean_logit | None, is_top1, log_sum_sq | None) with ``logprob = z_y - lse``, ``entropy = log s - ez
    / s = lse - E_p[z]``, ``mean_logit = sum z / V``, ``is_top1``: the label is the first argmax, and ``log
    sum p^2 = lse(2 z) - 2 lse(z)`` (``lse_half``: the lse of the logits at half the temperature, i.e. of ``2
    z``). 0 (False) where ignored, NaN for a bad label; the statistics of an ignored token are not read (its
    lse and E_p[z], saved for the backward, are 0)."""
    valid, bad = label_classes(labels, opts, v_local)
    lse = torch.where(valid, lse_of(st.m, st.s), 0.0)
    logprob = per_token(st.target - lse, valid, bad)
    entropy = zmean = None
    if opts.entropy:
        q = st.ez / st.s  # E_p[z] - m
        entropy, zmean = per_token(torch.log(st.s) - q, valid, bad), torch.where(valid, st.m + q, 0.0)
    mean_logit = per_token(st.zsum / max(opts.vocab(v_local), 1), valid, bad) if opts.mean_logit else None
    log_sum_sq = per_token(lse_half - 2.0 * lse, valid, bad) if lse_half is not None else None
    is_top1 = valid & ~bad & (st.argmax == labels.long())
    return logprob, entropy, lse, zmean, mean_logit, is_top1, log_sum_sq


def logprob_coefs(w_lp: Optional[torch.Tensor], w_ent: Optional[torch.Tensor], zmean: Optional[torch.Tensor],
                  valid: torch.Tensor, bad: torch.Tensor, temperature: float) -> Coefs:
    """Coefficients of the gradient of ``sum_i w_lp[i] logprob_i + w_ent[i] entropy_i`` (either weight may be
    None: 0), with ``z`` the tempered logits and ``zmean = E_p[z]``:

        d logprob / dz = onehot - p,      d entropy / dz = -p (z - E_p[z])
        => dz = p (a + b z) - t onehot    with a = -w_lp + w_ent E_p[z], b = -w_ent, t = -w_lp,

    divided by the temperature (the chain rule to the softcapped logits). 0 where ignored, NaN where the label
    is out of range, as the token weights of the loss."""
    # few ops (each costs host time the device waits through before the backward's GEMM): without entropy a
    # and t hold the same numbers (one row of the block); with it the three are masked as one block
    t = torch.zeros(valid.shape, device=valid.device) if w_lp is None else w_lp.to(torch.float32).neg()
    if w_ent is None:
        blk = t.unsqueeze(0)
    else:
        we = w_ent.to(torch.float32)
        blk = torch.stack([torch.addcmul(t, we, zmean), t, we.neg()])
    if temperature != 1.0:
        blk = blk * (1.0 / temperature)
    blk = per_token(blk, valid, bad)
    return Coefs(a=blk[0], t=blk[0], b=None) if w_ent is None else Coefs(a=blk[0], t=blk[1], b=blk[2])


def mean_divisor(reduction: str, num_items: Optional[torch.Tensor], labels: torch.Tensor, ignore_index: int,
                 valid: Optional[torch.Tensor] = None):
    """0-dim float32 divisor of the summed loss: 1 for "sum", num_items or the count of valid tokens for
    "mean" (``valid``: the mask of those tokens when the caller has it)."""
    if reduction != "mean":
        return torch.ones((), device=labels.device)
    if num_items is not None:
        return num_items.to(device=labels.device, dtype=torch.float32).reshape(())
    return (labels != ignore_index if valid is None else valid).sum(dtype=torch.float32)


def count_scale(reduction: str, count: int) -> Optional[float]:
    """``safe_inverse(mean_divisor(reduction, None, ...))`` on the host when ``count`` tokens are valid: 1 for
    "sum", float32 ``1 / count`` for "mean" (0 for no token), equal to the device's value: the count is exact
    in float32 up to 2**24 (None above), and 1 / count rounded to double and then to float32 is the correctly
    rounded float32 quotient (the double has more than 2 * 24 + 2 bits). None for "none"."""
    if reduction == "sum":
        return 1.0
    if reduction != "mean" or not 0 <= count <= 2**24:
        return None
    return struct.unpack("f", struct.pack("f", 1.0 / count))[0] if count else 0.0


def safe_inverse(div: torch.Tensor) -> torch.Tensor:
    """1 / div, and 0 where div is not > 0: all tokens ignored (or num_items == 0) gives loss 0 and zero
    gradients."""
    return torch.where(div > 0, div.reciprocal(), 0.0)


# ------------------------------------------------------------------------------------ the float64 reference
def softcapped(z: torch.Tensor, softcap: Optional[float]) -> torch.Tensor:
    """``softcap * tanh(z / softcap)``; ``z`` itself when ``softcap`` is None or 0 (off)."""
    return softcap * torch.tanh(z / softcap) if softcap else z


def reference_logits(hidden, weight, bias=None, *, softcap: Optional[float] = None, temperature: float = 1.0,
                     dtype=torch.float64):
    """``softcap(hidden @ weight.T + bias) / temperature`` in ``dtype``, materialised (small problems
    only)."""
    z = hidden.to(dtype) @ weight.to(dtype).t()
    if bias is not None:
        z = z + bias.to(dtype)
    z = softcapped(z, softcap)
    return z / temperature if temperature != 1.0 else z


def reference_stats(hidden, weight, labels, bias=None, *, vocab_start: int = 0,
                    softcap: Optional[float] = None, temperature: float = 1.0,
                    dtype=torch.float64) -> EntropyStats:
    """What a provider's ``stats`` returns for one vocabulary shard (``weight`` / ``bias``: its rows, their
    first global id ``vocab_start``), in ``dtype``, of the logits ``z`` after softcap and temperature: max
    ``m``, ``s = sum exp(z - m)``, the target logit (0 unless the label is in the shard), ``sum z``, the first
    argmax as a global id and ``ez = sum exp(z - m) (z - m)``. ``-inf`` logits add 0 (a row of them:
    ``m = -inf``, ``s = 0``); an empty shard has ``m = -inf`` and no meaningful argmax."""
    z = reference_logits(hidden, weight, bias, softcap=softcap, temperature=temperature, dtype=dtype)
    n, v = z.shape
    if v == 0:
        zero = torch.zeros(n, dtype=dtype, device=z.device)
        return EntropyStats(zero - math.inf, zero, zero, zero, zero.long() + vocab_start, zero)
    m = z.max(dim=1).values
    d = z - torch.where(m == -math.inf, 0.0, m)[:, None]
    e = torch.exp(d)
    local = labels.long() - vocab_start
    hit = (local >= 0) & (local < v)
    target = torch.where(hit, z.gather(1, local.clamp(0, v - 1)[:, None])[:, 0], 0.0)
    ez = torch.where(e > 0, e * d, 0.0).sum(dim=1)
    return EntropyStats(m, e.sum(dim=1), target, z.sum(dim=1), z.argmax(dim=1) + vocab_start, ez)


def reference_coef_grads(hidden, weight, labels, lse, coefs: Coefs, bias=None, *, vocab_start: int = 0,
                         softcap: Optional[float] = None, temperature: float = 1.0, dtype=torch.float64):
    """(dX, dW, db) in ``dtype`` that a provider's ``grads`` adds for one vocabulary shard from ``Coefs``:
    ``dz = p (a + b z) - t onehot(label) - u`` with ``p = exp(z - lse)`` (``lse``: the global one), ``z`` the
    logits after softcap and temperature, chained through the softcap derivative (the driver has folded
    ``1 / temperature`` into the coefficients). A ``-inf`` logit (``p = 0``) adds 0."""
    raw = reference_logits(hidden, weight, bias, dtype=dtype)
    z = reference_logits(hidden, weight, bias, softcap=softcap, temperature=temperature, dtype=dtype)
    a, t, b, u = (None if c is None else c.to(dtype)[:, None] for c in coefs)
    p = torch.exp(z - lse.to(dtype)[:, None])
    dz = p * a if b is None else p * a + torch.where(p > 0, p * b * z, 0.0)
    if u is not None:
        dz = dz - u
    local = labels.long() - vocab_start
    hit = (local >= 0) & (local < z.shape[1])
    dz[hit, local[hit]] -= t[hit, 0]
    if softcap:
        dz = dz * (1 - torch.tanh(raw / softcap) ** 2)
    return dz @ weight.to(dtype), dz.t() @ hidden.to(dtype), dz.sum(dim=0)


def reference_loss(hidden, weight, labels, bias=None, *, ignore_index=-100, reduction="mean",
                   label_smoothing=0.0, z_loss=0.0, softcap: Optional[float] = None, shift=False,
                   num_items=None, dtype=torch.float64):
    """The SPEC loss computed densely in ``dtype`` (float64 by default), differentiable w.r.t. its float
    inputs. Returns (loss, per_token_lse, token_accuracy, n_valid)."""
    y = labels.long()
    if shift:
        hidden, y = hidden[..., :-1, :], y[..., 1:]
    z = reference_logits(hidden, weight, bias, softcap=softcap, dtype=dtype)
    valid = y != ignore_index
    # of every valid token (-inf where every logit is), 0 where ignored; not differentiated
    with torch.no_grad():
        lse = torch.where(valid, torch.logsumexp(z, dim=-1), 0.0)
    # an ignored token contributes nothing, also no 0 * NaN where all its logits are -inf
    z = torch.where(valid[..., None], z, torch.zeros_like(z))
    lse_v = torch.logsumexp(z, dim=-1)
    safe = torch.where(valid, y, torch.zeros_like(y))
    zt = z.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    per = (1 - label_smoothing) * (lse_v - zt)
    if label_smoothing:  # (not 0 * inf where a masked vocabulary makes the mean logit -inf)
        per = per + label_smoothing * (lse_v - z.mean(-1))
    if z_loss:
        per = per + z_loss * lse_v**2
    per = torch.where(valid, per, torch.zeros_like(per))
    n_valid = valid.sum()
    if z.shape[-1] > 0 and z.numel() > 0:
        acc = ((z.argmax(-1) == y) & valid).sum().to(dtype) / n_valid.clamp(min=1)
    else:
        acc = torch.zeros((), dtype=dtype)
    if reduction == "none":
        loss = per
    elif reduction == "sum":
        loss = per.sum()
    else:
        div = torch.as_tensor(num_items if num_items is not None else n_valid, dtype=dtype)
        loss = per.sum() / div if float(div) > 0 else per.sum() * 0
    return loss, lse, acc, n_valid


def reference_logprobs(hidden, weight, labels, bias=None, *, temperature=1.0, softcap=None, ignore_index=-100,
                       dtype=torch.float64):
    """Per-token (logprob, entropy) in ``dtype``, 0 at ignored positions; ``0 log 0 = 0`` for masked (-inf)
    logits. Differentiable."""
    z = reference_logits(hidden, weight, bias, softcap=softcap, temperature=temperature, dtype=dtype)
    logp = torch.log_softmax(z, dim=-1)
    y = labels.long()
    valid = y != ignore_index
    lp = logp.gather(-1, torch.where(valid, y, 0).unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * torch.where(logp > -math.inf, logp, torch.zeros_like(logp))).sum(-1)
    zero = torch.zeros_like(lp)
    return torch.where(valid, lp, zero), torch.where(valid, ent, zero)


def reference_logprob_extras(hidden, weight, labels, bias=None, *, temperature=1.0, softcap=None,
                             ignore_index=-100, dtype=torch.float64):
    """Per-token (mean logit, is_top1, log sum p^2) in ``dtype`` (0 / False at ignored positions)."""
    z = reference_logits(hidden, weight, bias, softcap=softcap, temperature=temperature, dtype=dtype)
    y = labels.long()
    valid = y != ignore_index
    zero = torch.zeros(y.shape, dtype=dtype)
    mean = torch.where(valid, z.mean(-1), zero)
    top1 = valid & (z.argmax(-1) == y)
    sq = torch.where(valid, torch.logsumexp(2 * torch.log_softmax(z, -1), -1), zero)
    return mean, top1, sq


def reference_mean_loss_grads(h, w, y, dtype=torch.float64, chunk_elems: int = 2**26, ignore_index=-100):
    """(loss as a float, dX, dW) of the mean cross-entropy of ``h @ w.T`` in ``dtype``, through
    ``reference_loss`` on token chunks of at most ``chunk_elems`` logits, so large benchmark shapes stay
    within memory (float32 without TF32 is the GPU benchmarks' cheaper choice)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        wd = w.detach().to(dtype).requires_grad_()
        n = h.shape[0]
        nv = float((y != ignore_index).sum())
        inv = 1.0 / nv if nv else 0.0
        loss = 0.0
        dh = torch.empty(n, h.shape[1], dtype=dtype, device=h.device)
        dw = torch.zeros_like(wd)
        chunk = max(1, chunk_elems // max(w.shape[0], 1))
        for i in range(0, n, chunk):
            hc = h[i:i + chunk].detach().to(dtype).requires_grad_()
            part = reference_loss(hc, wd, y[i:i + chunk], reduction="sum", ignore_index=ignore_index,
                                  dtype=dtype)[0] * inv
            gh, gw = torch.autograd.grad(part, (hc, wd))
            dh[i:i + chunk] = gh
            dw += gw
            loss += float(part.detach())
        return loss, dh, dw.detach()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
