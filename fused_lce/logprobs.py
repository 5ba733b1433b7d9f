"""Per-token log-probabilities and entropy of an LM head (GRPO / PPO / DPO policy losses), without materialising the
``[tokens x vocab]`` logits: ``linear_logprobs`` and its registered custom ops.

Schemas (2-D problems; ``linear_logprobs`` flattens and validates labels first)::

    fused_lce::logprobs(Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, int ignore_index,
        float softcap, str backend, str group_name, int vocab_start, int vocab_total, int tile_bytes,
        float temperature, bool entropy) -> (Tensor logprob, Tensor entropy, Tensor lse, Tensor zmean)

    fused_lce::logprobs_backward(Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor lse,
        Tensor zmean, Tensor? grad_logprob, Tensor? grad_entropy, <the same options block>, bool[3] grad_mask)
        -> (Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)

The options block is ``fused_lce.backends.base.LOGPROB_FIELDS``. ``logprobs`` returns float32 per-token
``logprob = z[label] - lse`` and (with ``entropy``, else empty) ``entropy = lse - E_p[z]`` of ``p = softmax(z)``,
``z = softcap(hidden @ weight.T + bias) / temperature``, both 0 where the label is ``ignore_index`` and NaN where it
is outside ``[0, vocab_total)``; plus the per-token ``lse`` and (with ``entropy``) ``zmean = E_p[z]`` that the
backward needs (non-differentiable). ``logprobs_backward`` recomputes the logits tile by tile and returns the
gradients of ``sum_i grad_logprob[i] logprob_i + grad_entropy[i] entropy_i`` (a missing one counts as 0). Their
kernels are ``fused_lce.driver.logprobs_forward`` / ``logprobs_backward``; every input is checked here with the
errors of the loss ops (``fused_lce.ops``). The loss ops are unchanged by this module.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Union

import torch

from . import api, driver, ops
from .backends.base import LOGPROB_FIELDS, OPTION_FIELDS, Options, options_schema

_OPTS = options_schema("logprobs")
_FWD = (f"logprobs(Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, {_OPTS}) -> (Tensor logprob, "
        f"Tensor entropy, Tensor lse, Tensor zmean)")
_BWD = (f"logprobs_backward(Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor lse, Tensor zmean, "
        f"Tensor? grad_logprob, Tensor? grad_entropy, {_OPTS}, bool[3] grad_mask) -> (Tensor grad_hidden, "
        f"Tensor grad_weight, Tensor grad_bias)")
_N_OPTS = len(LOGPROB_FIELDS)

_lib = torch.library.Library("fused_lce", "FRAGMENT")
_lib.define(_FWD)
_lib.define(_BWD)


# ------------------------------------------------------------------------------------------------ input checks
def make_options(*values) -> Options:
    """The Options of a log-prob op call, range-checked (ValueError/TypeError naming the argument)."""
    o = Options(**dict(zip(LOGPROB_FIELDS, values)))
    ops.make_options(*(getattr(o, f) for f in OPTION_FIELDS))  # the checks the loss ops make
    if isinstance(o.temperature, bool) or not isinstance(o.temperature, (int, float)):
        raise TypeError(f"temperature: expected a float, got {type(o.temperature).__name__}")
    # 1 / temperature must be finite too: the kernels multiply by it
    if not 0.0 < o.temperature < math.inf or not math.isfinite(1.0 / o.temperature):
        raise ValueError(f"temperature: expected a finite value > 0, got {o.temperature}")
    if not isinstance(o.entropy, bool):
        raise TypeError(f"entropy: expected a bool, got {type(o.entropy).__name__}")
    return o


def _check_rows(hidden, labels) -> None:
    if labels.shape[0] != hidden.shape[0]:  # no sequence parallelism here
        raise ValueError(f"labels: expected shape (N,) with N = hidden.shape[0] = {hidden.shape[0]}, "
                         f"got {tuple(labels.shape)}")


def _split_forward(args):
    hidden, weight, labels, bias = args[:4]
    opts = make_options(*args[4:4 + _N_OPTS])
    ops.check_problem(hidden, weight, labels, bias, opts)
    _check_rows(hidden, labels)
    return hidden, weight, labels, bias, opts


def _split_backward(args):
    hidden, weight, labels, bias, lse, zmean, g_lp, g_ent = args[:8]
    opts = make_options(*args[8:8 + _N_OPTS])
    grad_mask = args[8 + _N_OPTS]
    ops.check_problem(hidden, weight, labels, bias, opts)
    _check_rows(hidden, labels)
    n = labels.shape[0]
    ops.check_per_token("lse", lse, n, hidden.device)
    if g_lp is not None:
        ops.check_per_token("grad_logprob", g_lp, n, hidden.device)
    if g_ent is not None:
        if not opts.entropy:
            raise ValueError("grad_entropy: given, but entropy=False (no entropy was computed)")
        ops.check_per_token("grad_entropy", g_ent, n, hidden.device)
        ops.check_per_token("zmean", zmean, n, hidden.device)
    return hidden, weight, labels, bias, lse, zmean, g_lp, g_ent, opts, grad_mask


# ------------------------------------------------------------------------------------------------ kernels
@ops._no_autocast
def _forward_kernel(*args):
    hidden, weight, labels, bias, opts = _split_forward(args)
    lp, ent, lse, zmean = driver.logprobs_forward(hidden, weight, labels, bias, opts)
    return lp, ops._empty(lp) if ent is None else ent, lse, ops._empty(lp) if zmean is None else zmean


@ops._no_autocast
def _backward_kernel(*args):
    hidden, weight, labels, bias, lse, zmean, g_lp, g_ent, opts, grad_mask = _split_backward(args)
    dh, dw, db = driver.logprobs_backward(g_lp, g_ent, hidden, weight, labels, bias, lse, zmean, opts, grad_mask)
    return (ops._empty(hidden) if dh is None else dh, ops._empty(weight) if dw is None else dw,
            ops._empty(weight) if db is None else db)


def _forward_fake(*args):
    hidden, _weight, labels, _bias, opts = _split_forward(args)
    n = labels.shape[0]
    f = lambda k: hidden.new_empty(k, dtype=torch.float32)  # noqa: E731
    return f(n), f(n if opts.entropy else 0), f(n), f(n if opts.entropy else 0)


def _backward_fake(*args):
    hidden, weight, _labels, bias, *_rest, grad_mask = _split_backward(args)
    mask = driver.normalise_mask(grad_mask, bias)
    return (torch.empty_like(hidden) if mask[0] else ops._empty(hidden),
            torch.empty_like(weight) if mask[1] else ops._empty(weight),
            torch.empty_like(bias) if mask[2] else ops._empty(weight))


_lib.impl("logprobs", _forward_kernel, "CompositeExplicitAutograd")
_lib.impl("logprobs_backward", _backward_kernel, "CompositeExplicitAutograd")
torch.library.register_fake("fused_lce::logprobs", _forward_fake, lib=_lib)
torch.library.register_fake("fused_lce::logprobs_backward", _backward_fake, lib=_lib)


# ------------------------------------------------------------------------------------------------ autograd
def _setup_context(ctx, inputs, output):
    hidden, weight, labels, bias = inputs[:4]
    ctx.opts = tuple(inputs[4:4 + _N_OPTS])
    ctx.entropy = bool(ctx.opts[LOGPROB_FIELDS.index("entropy")])
    _lp, _ent, lse, zmean = output
    ctx.mark_non_differentiable(lse, zmean)
    ctx.set_materialize_grads(False)  # an unused output gets no zero-filled gradient
    ctx.save_for_backward(hidden, weight, labels, bias, lse, zmean)


def _backward(ctx, g_lp, g_ent, *_unused):
    n_inputs = 4 + _N_OPTS
    if not ctx.entropy:
        g_ent = None
    if g_lp is None and g_ent is None:
        return (None,) * n_inputs
    if torch.is_grad_enabled():
        raise RuntimeError("fused_lce: double backward (create_graph=True) through linear_logprobs is not "
                           "supported; its gradients are computed by fused kernels, not by differentiable ops")
    hidden, weight, labels, bias, lse, zmean = ctx.saved_tensors
    want = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[3]]
    if not any(want):
        return (None,) * n_inputs
    dh, dw, db = torch.ops.fused_lce.logprobs_backward(hidden, weight, labels, bias, lse, zmean, g_lp, g_ent,
                                                       *ctx.opts, want)
    return ((dh if want[0] else None, dw if want[1] else None, None, db if want[2] else None)
            + (None,) * (n_inputs - 4))


torch.library.register_autograd("fused_lce::logprobs", _backward, setup_context=_setup_context, lib=_lib)


# ------------------------------------------------------------------------------------------------ public API
def linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    temperature: float = 1.0,
    softcap: Optional[float] = None,
    return_entropy: bool = False,
    ignore_index: int = -100,
    process_group=None,
    backend: str = "auto",
    validate: bool = True,
    tile_budget_mb: Optional[float] = None,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Per-token ``log p(label)`` (and optionally the entropy of ``p``) of ``hidden @ weight.T (+ bias)``, without
    materialising the logits: the log-prob head of GRPO / PPO / DPO.

    ``z = softcap(hidden @ weight.T + bias) / temperature`` -- softcap first, then temperature, as TRL does (its
    ``selective_log_softmax`` divides the model's logits, already softcapped by e.g. Gemma 2's forward, by the
    temperature; trl/kernels/chunked_logprob.py ``_torch_transform`` is ``softcap * tanh(z / softcap) * inv_t``)
    and verl. With ``p = softmax(z)``: ``logprob = z[label] - logsumexp(z)`` and ``entropy = -sum p log p =
    logsumexp(z) - E_p[z]``.

    Both outputs are differentiable w.r.t. ``hidden``, ``weight`` and ``bias`` for any upstream gradients (the
    backward recomputes the logits tile by tile from two saved floats per token). Tiling, float32 accumulation,
    validation and errors are those of :func:`fused_lce.linear_cross_entropy`.

    Args:
        hidden: ``(..., D)`` float32/bfloat16/float16 activations.
        weight: ``(V, D)`` output-layer weight, same dtype as ``hidden`` (this rank's contiguous vocabulary shard
            with ``process_group``).
        labels: ``hidden.shape[:-1]`` int64/int32 token ids (global ids with ``process_group``).
        bias: optional ``(V,)`` bias.
        temperature: > 0; the logits are divided by it (after the softcap).
        softcap: > 0 or None; logits become ``softcap * tanh(logits / softcap)``.
        return_entropy: also return the per-token entropy of ``softmax(z)``.
        ignore_index: label value whose log-prob and entropy are 0 (and get no gradient).
        process_group: vocab-parallel group; every rank gets the log-probs / entropy of the unsharded problem,
            the full dX and its own dW / db shard.
        backend: ``"auto"`` or a provider name; ``auto`` skips providers that do not implement log-probs yet.
        validate: check the label range eagerly; with False a bad label gives that token NaN outputs (and NaN
            gradients), never an out-of-bounds read.
        tile_budget_mb: MiB of logits tiles a backend may keep live (default: env ``FUSED_LCE_TILE_MB``, else
            the backend's default).

    Returns:
        float32 log-probs of ``labels``' shape, or ``(logprobs, entropy)`` with ``return_entropy``.
    """
    call = api._normalise(hidden, weight, labels, bias, ignore_index=ignore_index, reduction="none",
                          label_smoothing=0.0, z_loss=0.0, softcap=softcap, shift=False, num_items=None,
                          process_group=process_group, sequence_parallel=False, backend=backend, validate=validate,
                          tile_budget_mb=tile_budget_mb)
    if not isinstance(return_entropy, bool):
        raise TypeError(f"return_entropy: expected a bool, got {type(return_entropy).__name__}")
    opts = dataclasses.replace(call.opts, temperature=api._number("temperature", temperature),
                               entropy=return_entropy)
    values = [getattr(opts, f) for f in LOGPROB_FIELDS]
    make_options(*values)  # eager: a bad temperature raises here, before any work
    lp, ent, _lse, _zmean = torch.ops.fused_lce.logprobs(call.hidden, call.weight, call.labels, call.bias, *values)
    lp = lp.reshape(call.labels_shape)
    return (lp, ent.reshape(call.labels_shape)) if return_entropy else lp
