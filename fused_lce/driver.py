"""The one driver: statistics -> combine -> loss -> gradients, for every provider.

``forward`` and ``backward`` are the kernels of the registered ops ``torch.ops.fused_lce.forward`` / ``backward``
(``fused_lce.ops`` wires them to autograd). For a flattened problem they

1. pick the provider (``fused_lce.registry.resolve``: explicit name, ``FUSED_LCE_BACKEND`` or the ``auto`` order,
   each provider's ``supports`` seeing shapes, dtype, device and options);
2. plan token blocks (``provider.token_block``; the smallest proposal of a vocab-parallel group, so every rank
   runs the same collectives);
3. per block: ``provider.stats`` -> ``distributed.combine_stats`` (nothing on one device) -> ``lse`` -> (forward
   with gradients) ``provider.grads`` into float32 accumulators;
4. turn the statistics into per-token loss, lse and correctness (``loss_from_stats``, the SPEC formula, once),
   reduce, and sum dX over the group.

On one device a provider with a one-pass kernel (``has_fused``) does step 3 for all rows in one call. Per-token
weights (``token_weights``: 0 ignored, NaN bad label) and the per-token coefficients of the logits gradient
(``loss_coefs``, ``logprob_coefs``) are computed here, so no kernel needs ``ignore_index`` or a loss formula.

``logprobs_forward`` / ``logprobs_backward`` are the kernels of ``torch.ops.fused_lce.logprobs`` /
``logprobs_backward`` (``fused_lce.logprobs``): the same blocks, statistics and combine (with the entropy
statistic ``EntropyStats.ez`` when asked), per-token log-probs and entropy from them, and gradients always recomputed
from the saved per-token ``lse`` and ``E_p[z]``.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from . import distributed, registry
from .backends.base import Coefs, EntropyStats, Options, Problem, Provider, Stats, Tensors, loss_terms


# ------------------------------------------------------------------------------------------------ the formula
def lse_of(m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """log-sum-exp from (max, sum exp(z - max)); -inf when every logit is -inf."""
    return m + torch.log(s)


def label_classes(labels: torch.Tensor, opts: Options, v_local: int):
    """(valid, bad): not ignored, and valid but outside [0, vocab_total)."""
    y = labels.long()
    valid = y != opts.ignore_index
    bad = valid & ((y < 0) | (y >= opts.vocab(v_local)))
    return valid, bad


def token_weights(valid: torch.Tensor, bad: torch.Tensor, upstream: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-token weight of the gradient: ``upstream`` (1 when None) where valid, 0 where ignored, NaN where the
    label is out of range (a bad label must poison the gradients it would have produced, never index)."""
    one = torch.ones((), device=valid.device, dtype=torch.float32)
    up = one if upstream is None else upstream.to(torch.float32)
    g = torch.where(valid, up.expand(valid.shape), torch.zeros((), device=valid.device))
    return torch.where(bad, torch.full_like(g, math.nan), g)


def loss_from_stats(st: Stats, labels: torch.Tensor, opts: Options, v_local: int):
    """Per-token (loss, lse, correct) from global statistics -- the SPEC formula, for every provider.
    Ignored tokens get 0, a label outside [0, vocab_total) that is not ignore_index gets NaN."""
    vt = opts.vocab(v_local)
    valid, bad = label_classes(labels, opts, v_local)
    lse = lse_of(st.m, st.s)
    eps = opts.label_smoothing
    per = (1.0 - eps) * (lse - st.target)
    if eps:
        per = per + eps * (lse - st.zsum / vt)
    if opts.z_loss:
        per = per + opts.z_loss * lse * lse
    per = torch.where(valid, per, torch.zeros_like(per))
    per = torch.where(bad, torch.full_like(per, math.nan), per)
    return per, lse, valid & (st.argmax == labels.long())


def per_token(x: torch.Tensor, valid: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """``x`` where the label is valid, 0 where it is ignored, NaN where it is out of range."""
    x = torch.where(valid, x, torch.zeros_like(x))
    return torch.where(bad, torch.full_like(x, math.nan), x)


def loss_coefs(lse: torch.Tensor, g: torch.Tensor, opts: Options, v_local: int) -> Coefs:
    """Per-token coefficients of the loss gradient (``loss_terms`` evaluated at each token's lse)."""
    k = loss_terms(opts, v_local)
    return Coefs(a=g * (k.a0 + k.a1 * lse), t=g * k.t0, u=g * k.u0 if k.u0 else None)


def logprob_coefs(w_lp: Optional[torch.Tensor], w_ent: Optional[torch.Tensor], zmean: Optional[torch.Tensor],
                  valid: torch.Tensor, bad: torch.Tensor, temperature: float) -> Coefs:
    """Coefficients of the gradient of ``sum_i w_lp[i] logprob_i + w_ent[i] entropy_i`` (either weight may be
    None: 0), with ``z`` the tempered logits and ``zmean = E_p[z]``:

        d logprob / dz = onehot - p,      d entropy / dz = -p (z - E_p[z])
        => dz = p (a + b z) - t onehot    with a = -w_lp + w_ent E_p[z], b = -w_ent, t = -w_lp,

    divided by the temperature (the chain rule to the softcapped logits). 0 where ignored, NaN where the label is
    out of range, as the token weights of the loss."""
    wl = torch.zeros(valid.shape, device=valid.device) if w_lp is None else w_lp.to(torch.float32)
    a, t = -wl, -wl
    b = None
    if w_ent is not None:
        we = w_ent.to(torch.float32)
        a = a + we * zmean
        b = -we
    inv_t = 1.0 / temperature
    coef = lambda x: per_token(x * inv_t if inv_t != 1.0 else x, valid, bad)  # noqa: E731
    return Coefs(a=coef(a), t=coef(t), b=None if b is None else coef(b))


def grads(provider: Provider, t: Tensors, rows: slice, lse: torch.Tensor, g: torch.Tensor, scale, opts: Options,
          out, cache) -> None:
    """The loss's gradient kernel: coefficients formed here for providers on the coefficient contract, the
    per-token weight ``g`` for the others (their kernels form the loss coefficients)."""
    coef = loss_coefs(lse, g, opts, t.weight.shape[0]) if provider.supports_logprobs else g
    provider.grads(t, rows, lse, coef, scale, opts, out, cache)


def mean_divisor(reduction: str, num_items: Optional[torch.Tensor], labels: torch.Tensor, ignore_index: int):
    """0-dim float32 divisor of the summed loss: 1 for "sum", num_items or the count of valid tokens for "mean"."""
    if reduction != "mean":
        return torch.ones((), device=labels.device)
    if num_items is not None:
        return num_items.to(device=labels.device, dtype=torch.float32).reshape(())
    return (labels != ignore_index).sum().to(torch.float32)


def safe_inverse(div: torch.Tensor) -> torch.Tensor:
    """1 / div, and 0 where div is 0: all tokens ignored (or num_items == 0) gives loss 0 and zero gradients."""
    pos = div > 0
    return torch.where(pos, 1.0 / torch.where(pos, div, torch.ones_like(div)), torch.zeros_like(div))


def normalise_mask(grad_mask, bias) -> tuple[bool, bool, bool]:
    """The gradients wanted, as bools; none for a missing bias."""
    return bool(grad_mask[0]), bool(grad_mask[1]), bool(grad_mask[2]) and bias is not None


# ------------------------------------------------------------------------------------------------ the passes
def _stat_buffers(n: int, device, entropy: bool = False):
    f = lambda: torch.empty(n, device=device, dtype=torch.float32)  # noqa: E731
    st = Stats(f(), f(), f(), f(), torch.empty(n, device=device, dtype=torch.int64))
    return EntropyStats(*st, f()) if entropy else st


def combine(st, group_name: str):
    """Global statistics over the vocab-parallel group (one all-gather; the entropy statistic rides along)."""
    if not isinstance(st, EntropyStats):
        return Stats(*distributed.combine_stats(*st, group_name))
    return EntropyStats(*distributed.combine_stats(*st[:5], group_name, ez=st.ez))


def _blocks(provider: Provider, p: Problem, keep: bool, agree: bool = True):
    """Token blocks of the provider's size; with a group (``agree``: a collective per block follows) every rank
    takes the smallest proposal, so all run the same blocks."""
    nb = provider.token_block(p, keep)
    if agree:
        nb = distributed.agree_token_blocks(nb, p.n, p.opts.group_name)
    # at least one (possibly empty) block: a provider fills its gradient buffers even for N == 0
    return [slice(i, min(i + nb, p.n)) for i in range(0, max(p.n, 1), max(nb, 1))]


def _zero_grads(t: Tensors, mask, fp32_dh: bool):
    """Gradients of a problem without tokens (N == 0): zeros of the inputs' shapes, whatever the provider's buffer
    layout (a provider that allocates its outputs in ``grads`` never gets called)."""
    h, w, b = t.hidden, t.weight, t.bias
    return (torch.zeros(h.shape, device=h.device, dtype=torch.float32 if fp32_dh else h.dtype) if mask[0] else None,
            torch.zeros_like(w) if mask[1] else None, torch.zeros_like(b) if mask[2] and b is not None else None)


def run_forward(provider: Provider, t: Tensors, opts: Options, g: Optional[torch.Tensor],
                scale: Optional[torch.Tensor], mask) -> tuple[Stats, Optional[tuple]]:
    """Global statistics of every token and, when ``g`` is given, the gradients of ``scale * sum g_i loss_i``."""
    n = t.hidden.shape[0]
    p = Problem.of(t, opts, mask)
    want = g is not None and any(mask)
    group = bool(opts.group_name)
    if want and not group and provider.has_fused:
        out = provider.new_grads(t, mask, fp32_dh=False, scaled=True)
        st = provider.fused(t, g, scale, opts, out)
        return st, provider.finish(t, out, scale)
    out = provider.new_grads(t, mask, fp32_dh=group, scaled=scale is not None) if want else None
    st_all = _stat_buffers(n, t.hidden.device, opts.entropy)
    if n == 0:  # no token block runs
        return st_all, (_zero_grads(t, mask, group) if want else None)
    for rows in _blocks(provider, p, keep=want):
        st, cache = provider.stats(t, rows, opts, keep=want)
        st = combine(st, opts.group_name)
        for buf, val in zip(st_all, st):
            buf[rows] = val
        if want:
            grads(provider, t, rows, lse_of(st.m, st.s), g[rows], scale, opts, out, cache)
        del cache
    return st_all, (provider.finish(t, out, scale) if want else None)


def run_backward(provider: Provider, t: Tensors, lse: torch.Tensor, g: torch.Tensor, opts: Options, mask):
    """Gradients of ``sum_i g_i * loss_i`` from the saved lse (recomputes the logits)."""
    p = Problem.of(t, opts, mask)
    if p.n == 0:  # no token block runs
        return _zero_grads(t, mask, bool(opts.group_name))
    out = provider.new_grads(t, mask, fp32_dh=bool(opts.group_name))
    for rows in _blocks(provider, p, keep=False, agree=False):  # no collective per block here
        grads(provider, t, rows, lse[rows], g[rows], None, opts, out, None)
    return provider.finish(t, out, None)


# ------------------------------------------------------------------------------------------------ op kernels
_OOM_MARKERS = ("out of memory", "can't allocate memory", "not enough memory", "bad_alloc", "cannot allocate")


def explains_oom(hidden_arg: int):
    """Re-raise an allocation failure of the wrapped kernel (torch.OutOfMemoryError, or the RuntimeError of the CPU
    allocator) as the same type, with the problem's sizes and the tile budget to lower; other errors pass as is."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args):
            try:
                return fn(*args)
            except RuntimeError as e:
                text = str(e)
                if text.startswith("fused_lce: out of memory") or not (
                        isinstance(e, torch.OutOfMemoryError) or any(m in text.lower() for m in _OOM_MARKERS)):
                    raise
                raise type(e)(_oom_message(fn.__name__, args[hidden_arg], args[hidden_arg + 1],
                                           next(a for a in args if isinstance(a, Options)), text)) from e

        return run

    return wrap


def _oom_message(what: str, hidden, weight, opts: Options, text: str) -> str:
    (n, d), v = hidden.shape, weight.shape[0]
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    budget = (f"{mib(opts.tile_bytes)} (tile_budget_mb / FUSED_LCE_TILE_MB)" if opts.tile_bytes
              else "the provider's default (set tile_budget_mb= or env FUSED_LCE_TILE_MB to lower it)")
    return (f"fused_lce: out of memory in {what} (backend={opts.backend!r}, N={n} tokens, D={d}, V={v}, "
            f"{str(hidden.dtype).replace('torch.', '')} on {hidden.device}; logits tile budget: {budget}; the "
            f"float32 gradient accumulators take up to {mib(4 * (v * d + n * d + v))} and the inputs "
            f"{mib(hidden.element_size() * (n * d + v * d))}). Lower tile_budget_mb (MiB of logits tiles kept "
            f"live), or process fewer tokens per call. Allocator: {text}")


@explains_oom(hidden_arg=0)
def forward(hidden, weight, labels, bias, num_items, reduction: str, opts: Options, grad_mask):
    """Kernel of ``fused_lce::forward`` (inputs validated by ``fused_lce.ops``). Returns (loss, lse, correct,
    dh | None, dw | None, db | None); gradients of the returned loss when ``reduction != "none"`` and asked."""
    mask = normalise_mask(grad_mask, bias)
    local_rows = hidden.shape[0]
    # sequence parallel: hidden holds this rank's N/world rows, labels all N (one all-gather)
    full = distributed.sp_gather_rows(hidden, opts.group_name, labels.shape[0])
    t = Tensors(full.contiguous(), weight.contiguous(), labels.contiguous(),
                None if bias is None else bias.contiguous())
    provider = registry.resolve(opts.backend, Problem.of(t, opts, mask))
    want = reduction != "none" and any(mask)
    inv = safe_inverse(mean_divisor(reduction, num_items, labels, opts.ignore_index))
    g = token_weights(*label_classes(labels, opts, weight.shape[0])) if want else None
    st, grads = run_forward(provider, t, opts, g, inv if want else None, mask if want else (False,) * 3)
    per, lse, correct = loss_from_stats(st, labels, opts, weight.shape[0])
    loss = per if reduction == "none" else per.sum() * inv
    dh, dw, db = grads if grads is not None else (None, None, None)
    if dh is not None:  # all-reduce, or reduce-scatter to this rank's rows (sequence parallel), in float32
        dh = distributed.reduce_grad_rows(dh, opts.group_name, local_rows).to(hidden.dtype)
    return loss, lse, correct, dh, dw, db


@explains_oom(hidden_arg=1)
def backward(grad_loss, hidden, weight, labels, bias, lse, opts: Options, grad_mask):
    """Kernel of ``fused_lce::backward``: (dh | None, dw | None, db | None) of ``sum_i grad_loss[i] * loss_i``."""
    mask = normalise_mask(grad_mask, bias)
    if not any(mask):
        return None, None, None
    local_rows = hidden.shape[0]
    full = distributed.sp_gather_rows(hidden, opts.group_name, labels.shape[0])
    t = Tensors(full.contiguous(), weight.contiguous(), labels.contiguous(),
                None if bias is None else bias.contiguous())
    provider = registry.resolve(opts.backend, Problem.of(t, opts, mask))
    g = token_weights(*label_classes(labels, opts, weight.shape[0]), grad_loss)
    dh, dw, db = run_backward(provider, t, lse.to(torch.float32).contiguous(), g, opts, mask)
    if dh is not None:
        dh = distributed.reduce_grad_rows(dh, opts.group_name, local_rows).to(hidden.dtype)
    return dh, dw, db


# ------------------------------------------------------------------------------------------- log-prob kernels
def _tensors(hidden, weight, labels, bias) -> Tensors:
    return Tensors(hidden.contiguous(), weight.contiguous(), labels.contiguous(),
                   None if bias is None else bias.contiguous())


def logprobs_forward(hidden, weight, labels, bias, opts: Options):
    """Kernel of ``fused_lce::logprobs`` (inputs validated by ``fused_lce.logprobs``): per token (logprob,
    entropy | None, lse, E_p[z] | None) of ``p = softmax(z)``, ``z = softcap(hidden @ weight.T + bias) / T``.
    logprob and entropy are 0 where the label is ignored and NaN where it is out of range."""
    t = _tensors(hidden, weight, labels, bias)
    provider = registry.resolve(opts.backend, Problem.of(t, opts, op="logprobs"))
    st, _ = run_forward(provider, t, opts, None, None, (False, False, False))
    valid, bad = label_classes(labels, opts, weight.shape[0])
    lse = lse_of(st.m, st.s)
    logprob = per_token(st.target - lse, valid, bad)
    if not opts.entropy:
        return logprob, None, lse, None
    q = st.ez / st.s  # E_p[z] - m
    return logprob, per_token(torch.log(st.s) - q, valid, bad), lse, st.m + q


def logprobs_backward(grad_logprob, grad_entropy, hidden, weight, labels, bias, lse, zmean, opts: Options,
                      grad_mask):
    """Kernel of ``fused_lce::logprobs_backward``: (dh | None, dw | None, db | None) of
    ``sum_i grad_logprob[i] logprob_i + grad_entropy[i] entropy_i`` (either may be None), recomputing the logits
    from the saved ``lse`` and ``zmean = E_p[z]``."""
    mask = normalise_mask(grad_mask, bias)
    if not any(mask):
        return None, None, None
    t = _tensors(hidden, weight, labels, bias)
    p = Problem.of(t, opts, mask, op="logprobs")
    provider = registry.resolve(opts.backend, p)
    coef = logprob_coefs(grad_logprob, grad_entropy, zmean, *label_classes(labels, opts, weight.shape[0]),
                         opts.temperature)
    lse = lse.to(torch.float32).contiguous()
    out = provider.new_grads(t, mask, fp32_dh=bool(opts.group_name))
    for rows in _blocks(provider, p, keep=False, agree=False):
        c = Coefs(*(None if x is None else x[rows] for x in coef))
        provider.grads(t, rows, lse[rows], c, None, opts, out, None)
    dh, dw, db = provider.finish(t, out, None)
    if dh is not None:
        dh = distributed.all_reduce_sum_(dh, opts.group_name).to(hidden.dtype)
    return dh, dw, db
