"""The one driver: statistics -> combine -> loss -> gradients, for every provider.

``forward`` / ``backward`` are the kernels of the registered ops ``torch.ops.fused_lce.forward`` /
``backward``, ``logprobs_forward`` / ``logprobs_backward`` those of ``fused_lce::logprobs`` /
``logprobs_backward`` (``fused_lce.ops`` checks their inputs and wires them to autograd). For a flattened
problem they

1. pick the provider (``registry.resolve``: explicit name, ``FUSED_LCE_BACKEND`` or the ``auto`` order, each
   provider's ``supports`` seeing shapes, dtype, device and options);
2. plan token blocks (``provider.token_block``; the smallest proposal of a vocab-parallel group, so every rank
   runs the same collectives);
3. per block: ``provider.stats`` -> ``distributed.combine_stats`` (nothing on one device) -> ``lse`` ->
   (forward with gradients) ``provider.grads`` into float32 accumulators;
4. turn the statistics into per-token losses or log-probs (``fused_lce.core.formulas``), reduce, and sum dX
   over the group.

On one device a provider with a one-pass kernel (``has_fused``) does step 3 for all rows in one call.
Per-token weights (0 ignored, NaN bad label), the reduction's divisor and the gradient coefficients are formed
here from ``formulas``, so no kernel needs ``ignore_index``, a reduction or a loss formula. The process group
is resolved once per op call (by ``fused_lce.core.validate``) and passed down as an object.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import torch

from . import distributed, registry
from .formulas import (count_scale, label_classes, label_valid, logprob_coefs,
                       logprobs_from_stats, loss_coefs, loss_from_stats, loss_terms, lse_of, mean_divisor,
                       safe_inverse, token_weights)
from .provider import Provider
from .types import LOGPROBS, Coefs, EntropyStats, Options, Problem, Stats, Tensors, TokenWeights


def normalise_mask(grad_mask, bias) -> tuple[bool, bool, bool]:
    """The gradients wanted, as bools; none for a missing bias."""
    return bool(grad_mask[0]), bool(grad_mask[1]), bool(grad_mask[2]) and bias is not None


# ------------------------------------------------------------------------------------------------ the passes
def _stat_buffers(n: int, device, entropy: bool = False):
    f = lambda: torch.empty(n, device=device, dtype=torch.float32)  # noqa: E731
    st = Stats(f(), f(), f(), f(), torch.empty(n, device=device, dtype=torch.int64))
    return EntropyStats(*st, f()) if entropy else st


def combine(st, group):
    """Global statistics over the vocab-parallel group (one all-gather; the entropy statistic rides along)."""
    if not isinstance(st, EntropyStats):
        return Stats(*distributed.combine_stats(*st, group))
    return EntropyStats(*distributed.combine_stats(*st[:5], group, ez=st.ez))


def _blocks(provider: Provider, p: Problem, keep: bool, group=None):
    """Token blocks of the provider's size; with a group (a collective per block follows) every rank takes the
    smallest proposal, so all run the same blocks."""
    nb = distributed.agree_token_blocks(provider.token_block(p, keep), p.n, group)
    # at least one (possibly empty) block: a provider fills its gradient buffers even for N == 0
    return [slice(i, min(i + nb, p.n)) for i in range(0, max(p.n, 1), max(nb, 1))]


def _zero_grads(t: Tensors, mask, fp32_dh: bool):
    """Gradients of a problem without tokens (N == 0): zeros of the inputs' shapes, whatever the provider's
    buffer layout (a provider that allocates its outputs in ``grads`` never gets called)."""
    h, w, b = t.hidden, t.weight, t.bias
    return (torch.zeros(h.shape, device=h.device, dtype=torch.float32 if fp32_dh else h.dtype)
            if mask[0] else None,
            torch.zeros_like(w) if mask[1] else None,
            torch.zeros_like(b) if mask[2] and b is not None else None)


def run_forward(provider: Provider, t: Tensors, opts: Options, g, scale: Optional[torch.Tensor],
                mask, group=None, op: str = "loss") -> tuple[Stats, Optional[tuple]]:
    """Global statistics of every token and, when ``g`` is given, the gradients of ``scale * sum g_i loss_i``
    (``g``: per-token weights, or ``TokenWeights`` that form (g, scale) on first use)."""
    n = t.hidden.shape[0]
    p = Problem.of(t, opts, mask, op)
    want = g is not None and any(mask)
    if want and group is None and provider.has_fused:
        weights = g if isinstance(g, TokenWeights) else TokenWeights(g != 0, lambda: (g, scale))
        out = provider.new_grads(t, mask, fp32_dh=False, scaled=True)
        st = provider.fused(t, weights, loss_terms(opts, t.weight.shape[0]), opts, out)
        return st, provider.finish(t, out, weights.get()[1])
    if isinstance(g, TokenWeights):
        g, scale = g.get()
    fp32_dh = group is not None
    out = provider.new_grads(t, mask, fp32_dh=fp32_dh, scaled=scale is not None) if want else None
    if n == 0:  # no token block runs
        return (_stat_buffers(n, t.hidden.device, opts.entropy),
                (_zero_grads(t, mask, fp32_dh) if want else None))
    blocks = _blocks(provider, p, keep=want, group=group)
    st_all = None
    for rows in blocks:
        st, cache = provider.stats(t, rows, opts, keep=want)
        st = combine(st, group)
        if len(blocks) == 1 and all(x.dtype == (torch.int64 if i == 4 else torch.float32)
                                    for i, x in enumerate(st)):
            st_all = st  # one block of every token: its statistics are the result (no copy: host time per op)
        else:
            st_all = _stat_buffers(n, t.hidden.device, opts.entropy) if st_all is None else st_all
            for buf, val in zip(st_all, st):
                buf[rows] = val
        if want:
            coef = loss_coefs(lse_of(st.m, st.s), g[rows], opts, t.weight.shape[0])
            provider.grads(t, rows, lse_of(st.m, st.s), coef, scale, opts, out, cache)
        del cache
    return st_all, (provider.finish(t, out, scale) if want else None)


def run_backward(provider: Provider, t: Tensors, lse: torch.Tensor, coef: Coefs, opts: Options, mask,
                 fp32_dh: bool = False, op: str = "loss"):
    """Gradients of ``dz = p (a + b z) - t onehot - u`` from the saved lse (recomputes the logits)."""
    p = Problem.of(t, opts, mask, op)
    if p.n == 0:  # no token block runs
        return _zero_grads(t, mask, fp32_dh)
    out = provider.new_grads(t, mask, fp32_dh=fp32_dh)
    for rows in _blocks(provider, p, keep=False):  # no collective per block here: no group to agree with
        provider.grads(t, rows, lse[rows], Coefs(*(None if x is None else x[rows] for x in coef)), None, opts,
                       out, None)
    return provider.finish(t, out, None)


# ------------------------------------------------------------------------------------------------ op kernels
_OOM_MARKERS = ("out of memory", "can't allocate memory", "not enough memory", "bad_alloc", "cannot allocate")


def explains_oom(fn):
    """Re-raise an allocation failure of the wrapped kernel (torch.OutOfMemoryError, or the RuntimeError of
    the CPU allocator) as the same type, with the problem's sizes and the tile budget to lower; other errors
    pass as is. The kernel's ``hidden`` and ``weight`` are its first two tensor arguments after any per-token
    gradient."""

    @functools.wraps(fn)
    def run(*args):
        try:
            return fn(*args)
        except RuntimeError as e:
            text = str(e)
            if text.startswith("fused_lce: out of memory") or not (
                    isinstance(e, torch.OutOfMemoryError) or any(m in text.lower() for m in _OOM_MARKERS)):
                raise
            opts = next(a for a in args if isinstance(a, Options))
            hidden, weight = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 2][:2]
            raise type(e)(_oom_message(fn.__name__, hidden, weight, opts, text)) from e

    return run


def _oom_message(what: str, hidden, weight, opts: Options, text: str) -> str:
    (n, d), v = hidden.shape, weight.shape[0]
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    budget = (f"{mib(opts.tile_bytes)} (tile_budget_mb / FUSED_LCE_TILE_MB)" if opts.tile_bytes
              else "the provider's default (set tile_budget_mb= or env FUSED_LCE_TILE_MB to lower it)")
    return (f"fused_lce: out of memory in {what} (backend={opts.backend!r}, N={n} tokens, D={d}, V={v}, "
            f"{str(hidden.dtype).replace('torch.', '')} on {hidden.device}; logits tile budget: {budget}; "
            f"the float32 gradient accumulators take up to {mib(4 * (v * d + n * d + v))} and the inputs "
            f"{mib(hidden.element_size() * (n * d + v * d))}). Lower tile_budget_mb (MiB of logits tiles "
            f"kept live), or process fewer tokens per call. Allocator: {text}")


def _tensors(hidden, weight, labels, bias, ignore_index: int) -> Tensors:
    """The provider's view of a problem: contiguous, non-overlapping inputs (an expanded or strided tensor is
    copied here, so no kernel ever sees a stride it does not expect), and int64 labels when ``ignore_index``
    does not fit in int32 (a kernel comparing int32 labels with it would wrap it)."""
    c = lambda x: None if x is None else x.contiguous()  # noqa: E731
    if labels.dtype != torch.int64 and not -2**31 <= ignore_index < 2**31:
        labels = labels.long()
    return Tensors(c(hidden), c(weight), c(labels), c(bias))


def _token_weight(reduction: str, num_items, labels, opts: Options, v_local: int, grad_loss=None,
                  classes=None, weights: bool = True):
    """Per-token weights of the gradient of the reduced loss (times ``grad_loss``, the upstream gradient of
    the loss output: (N,) for "none", 0-dim otherwise; None when not ``weights``) and the reduction's ``1 /
    divisor`` (0-dim; None for "none"). ``classes``: the ``label_classes`` of ``labels`` when the caller has
    them."""
    valid, bad = classes if classes is not None else label_classes(labels, opts, v_local)
    inv = None
    if reduction != "none":
        inv = safe_inverse(mean_divisor(reduction, num_items, labels, opts.ignore_index, valid))
    if not weights:
        return None, inv
    up = None
    if grad_loss is not None:
        up = grad_loss.to(torch.float32)
        up = up if reduction == "none" else (up.reshape(()) * inv).expand(labels.shape)
    return token_weights(valid, bad, up), inv


@explains_oom
def forward(hidden, weight, labels, bias, num_items, reduction: str, opts: Options, group, grad_mask):
    """Kernel of ``fused_lce::forward`` (inputs checked by ``fused_lce.ops``; ``group`` the resolved process
    group or None). Returns (loss, lse, correct, dh | None, dw | None, db | None); gradients of the returned
    loss when ``reduction != "none"`` and asked."""
    mask = normalise_mask(grad_mask, bias)
    local_rows = hidden.shape[0]
    # sequence parallel: hidden holds this rank's N/world rows, labels all N (one all-gather)
    t = _tensors(distributed.sp_gather_rows(hidden, group, labels.shape[0]), weight, labels, bias,
                 opts.ignore_index)
    provider = registry.resolve(opts.backend, Problem.of(t, opts, mask))
    want = reduction != "none" and any(mask)
    valid = label_valid(labels, opts)
    classes = []  # formed once (every small op costs host time), after a one-pass kernel's first launch

    def weights():
        classes.extend(label_classes(labels, opts, weight.shape[0], valid))
        return _token_weight(reduction, num_items, labels, opts, weight.shape[0], classes=classes,
                             weights=want)

    # the scale from the live count alone, for a provider that reads it on the host (a tensor num_items is
    # not)
    by_count = (functools.partial(count_scale, reduction) if num_items is None and reduction != "none"
                else None)
    tw = TokenWeights(valid, weights, by_count)
    st, grads = run_forward(provider, t, opts, tw if want else None, None,
                            mask if want else (False,) * 3, group)
    _, inv = tw.get()
    per, lse, correct = loss_from_stats(st, labels, opts, weight.shape[0], classes)
    loss = per if reduction == "none" else per.sum() * inv
    dh, dw, db = grads if grads is not None else (None, None, None)
    if dh is not None:  # all-reduce, or reduce-scatter to this rank's rows (sequence parallel), in float32
        dh = distributed.reduce_grad_rows(dh, group, local_rows).to(hidden.dtype)
    return loss, lse, correct, dh, dw, db


@explains_oom
def backward(grad_loss, hidden, weight, labels, bias, lse, num_items, reduction: str, opts: Options, group,
             grad_mask):
    """Kernel of ``fused_lce::backward``: (dh | None, dw | None, db | None), the gradients of
    ``sum(grad_loss * loss)`` for the ``loss`` that ``forward`` returns with the same arguments, recomputing
    the logits from the saved ``lse``."""
    mask = normalise_mask(grad_mask, bias)
    if not any(mask):
        return None, None, None
    local_rows = hidden.shape[0]
    t = _tensors(distributed.sp_gather_rows(hidden, group, labels.shape[0]), weight, labels, bias,
                 opts.ignore_index)
    provider = registry.resolve(opts.backend, Problem.of(t, opts, mask))
    lse = lse.to(torch.float32).contiguous()
    g, _ = _token_weight(reduction, num_items, labels, opts, weight.shape[0], grad_loss)
    coef = loss_coefs(lse, g, opts, weight.shape[0])
    dh, dw, db = run_backward(provider, t, lse, coef, opts, mask, fp32_dh=group is not None)
    if dh is not None:
        dh = distributed.reduce_grad_rows(dh, group, local_rows).to(hidden.dtype)
    return dh, dw, db


# ------------------------------------------------------------------------------------------- log-prob kernels
def logprobs_forward(hidden, weight, labels, bias, opts: Options, group):
    """Kernel of ``fused_lce::logprobs``: the per-token outputs of ``formulas.logprobs_from_stats`` for
    ``p = softmax(z)``, ``z = softcap(hidden @ weight.T + bias) / T``. ``opts.sum_sq`` costs a second
    statistics pass at temperature ``T / 2`` (whose lse is ``lse(2 z)``); every provider with temperature
    support serves it."""
    t = _tensors(hidden, weight, labels, bias, opts.ignore_index)
    provider = registry.resolve(opts.backend, Problem.of(t, opts, op=LOGPROBS))
    st, _ = run_forward(provider, t, opts, None, None, (False, False, False), group, LOGPROBS)
    lse_half = None
    if opts.sum_sq:
        half = dataclasses.replace(opts, temperature=opts.temperature / 2, entropy=False, mean_logit=False,
                                   sum_sq=False)
        sth, _ = run_forward(provider, t, half, None, None, (False, False, False), group, LOGPROBS)
        lse_half = lse_of(sth.m, sth.s)
    return logprobs_from_stats(st, labels, opts, weight.shape[0], lse_half)


def logprobs_backward(grad_logprob, grad_entropy, hidden, weight, labels, bias, lse, zmean,
                      opts: Options, group, grad_mask):
    """Kernel of ``fused_lce::logprobs_backward``: (dh | None, dw | None, db | None) of
    ``sum_i grad_logprob[i] logprob_i + grad_entropy[i] entropy_i`` (either may be None), recomputing the
    logits from the saved ``lse`` and ``zmean = E_p[z]``."""
    mask = normalise_mask(grad_mask, bias)
    if not any(mask):
        return None, None, None
    t = _tensors(hidden, weight, labels, bias, opts.ignore_index)
    provider = registry.resolve(opts.backend, Problem.of(t, opts, mask, op=LOGPROBS))
    coef = logprob_coefs(grad_logprob, grad_entropy, zmean, *label_classes(labels, opts, weight.shape[0]),
                         opts.temperature)
    dh, dw, db = run_backward(provider, t, lse.to(torch.float32).contiguous(), coef, opts, mask,
                              fp32_dh=group is not None, op=LOGPROBS)
    if dh is not None:
        dh = distributed.all_reduce_sum_(dh, group).to(hidden.dtype)
    return dh, dw, db
