"""The registered log-prob ops ``torch.ops.fused_lce.logprobs`` / ``logprobs_backward`` (the kernels of
``fused_lce.linear_logprobs``): schemas, input checks, fake kernels and autograd. Their kernels are
``fused_lce.core.driver.logprobs_forward`` / ``logprobs_backward``. Schemas, outputs and semantics:
docs/spec.md ("Per-token log-probs and entropy"); the options block is the log-prob family of
``fused_lce.core.Options``.

``logprobs_backward`` recomputes the logits tile by tile from the saved ``lse`` and ``zmean = E_p[z]`` and
returns the gradients of ``sum_i grad_logprob[i] logprob_i + grad_entropy[i] entropy_i`` (a missing one counts
as 0). Double backward raises a RuntimeError naming fused_lce; under torch.func ``FuncLogprobs`` (used by the
public API while a transform is active) makes ``grad`` / ``vjp`` / ``jacrev`` work, and both ops have vmap
rules (one call per batch element).
"""
from __future__ import annotations

import torch

from ..core import LOGPROBS, driver, validate
from .loss import empty_like, no_autocast
from .schema import OpSchema

_lib = torch.library.Library("fused_lce", "FRAGMENT")
FORWARD = OpSchema(_lib, "logprobs", "Tensor hidden, Tensor weight, Tensor labels, Tensor? bias",
                   LOGPROBS, "", "(Tensor logprob, Tensor entropy, Tensor lse, Tensor zmean, Tensor "
                   "mean_logit, Tensor is_top1, Tensor log_sum_sq)")
BACKWARD = OpSchema(_lib, "logprobs_backward", "Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, "
                    "Tensor lse, Tensor zmean, Tensor? grad_logprob, Tensor? grad_entropy", LOGPROBS,
                    "bool[3] grad_mask", "(Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)")


# ----------------------------------------------------------------------------------------------- input checks
def _check(schema: OpSchema, args):
    """Bound, checked arguments of a log-prob op call: (bound, options, group)."""
    a = schema.bind(args)
    opts = schema.options(a)
    h, labels = a["hidden"], a["labels"]
    group = validate.problem(h, a["weight"], labels, a["bias"], opts, sequence_parallel_ok=False)
    if schema is BACKWARD:
        validate.grad_mask(a["grad_mask"])
        n = labels.shape[0]
        validate.per_token("lse", a["lse"], n, h.device)
        if a["grad_logprob"] is not None:
            validate.per_token("grad_logprob", a["grad_logprob"], n, h.device)
        if a["grad_entropy"] is not None:
            if not opts.entropy:
                raise ValueError("grad_entropy: given, but entropy=False (no entropy was computed)")
            validate.per_token("grad_entropy", a["grad_entropy"], n, h.device)
            validate.per_token("zmean", a["zmean"], n, h.device)
    return a, opts, group


# ------------------------------------------------------------------------------------------------ kernels
@no_autocast
def _forward_kernel(*args):
    a, opts, group = _check(FORWARD, args)
    out = driver.logprobs_forward(a["hidden"], a["weight"], a["labels"], a["bias"], opts, group)
    return tuple(empty_like(out[0]) if x is None else x for x in out)


@no_autocast
def _backward_kernel(*args):
    a, opts, group = _check(BACKWARD, args)
    dh, dw, db = driver.logprobs_backward(a["grad_logprob"], a["grad_entropy"], a["hidden"], a["weight"],
                                          a["labels"], a["bias"], a["lse"], a["zmean"], opts, group,
                                          a["grad_mask"])
    h, w = a["hidden"], a["weight"]
    return (empty_like(h) if dh is None else dh, empty_like(w) if dw is None else dw,
            empty_like(w) if db is None else db)


def _forward_fake(*args):
    a, opts, _group = _check(FORWARD, args)
    n = a["labels"].shape[0]
    f = lambda k: a["hidden"].new_empty(k, dtype=torch.float32)  # noqa: E731
    return (f(n), f(n if opts.entropy else 0), f(n), f(n if opts.entropy else 0),
            f(n if opts.mean_logit else 0), a["hidden"].new_empty(n, dtype=torch.bool),
            f(n if opts.sum_sq else 0))


def _backward_fake(*args):
    a, _opts, _group = _check(BACKWARD, args)
    h, w, b = a["hidden"], a["weight"], a["bias"]
    mask = driver.normalise_mask(a["grad_mask"], b)
    return (torch.empty_like(h) if mask[0] else empty_like(h),
            torch.empty_like(w) if mask[1] else empty_like(w),
            torch.empty_like(b) if mask[2] else empty_like(w))


_lib.impl("logprobs", _forward_kernel, "CompositeExplicitAutograd")
_lib.impl("logprobs_backward", _backward_kernel, "CompositeExplicitAutograd")
torch.library.register_fake("fused_lce::logprobs", _forward_fake, lib=_lib)
torch.library.register_fake("fused_lce::logprobs_backward", _backward_fake, lib=_lib)


# ------------------------------------------------------------------------------------------------ autograd
DOUBLE_BACKWARD = ("fused_lce: double backward (create_graph=True) and forward-mode derivatives through "
                   "linear_logprobs are not supported (torch.func.hessian / jacfwd / jvp, grad of grad, "
                   "torch.autograd.forward_ad dual tensors): its gradients are computed by fused kernels, "
                   "not by differentiable ops. For those use the plain path "
                   "torch.log_softmax(F.linear(hidden, weight, bias) / temperature, -1), which "
                   "materialises the logits.")


def _setup_context(ctx, inputs, output):
    a = FORWARD.bind(inputs)
    ctx.opts = tuple(a[f] for f in FORWARD.option_names)
    ctx.entropy = bool(a["entropy"])
    _lp, _ent, *stats = output
    ctx.mark_non_differentiable(*stats)
    lse, zmean = stats[:2]
    ctx.set_materialize_grads(False)  # an unused output gets no zero-filled gradient
    ctx.save_for_backward(a["hidden"], a["weight"], a["labels"], a["bias"], lse, zmean)


def _backward(ctx, g_lp, g_ent, *_unused):
    if (g_lp is not None or (ctx.entropy and g_ent is not None)) and torch.is_grad_enabled():
        raise RuntimeError(DOUBLE_BACKWARD)
    return _backward_impl(ctx, g_lp, g_ent)


def _backward_impl(ctx, g_lp, g_ent, *_unused):
    n_inputs = len(FORWARD.arg_names)
    if not ctx.entropy:
        g_ent = None
    if g_lp is None and g_ent is None:
        return (None,) * n_inputs
    hidden, weight, labels, bias, lse, zmean = ctx.saved_tensors
    want = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[3]]
    if not any(want):
        return (None,) * n_inputs
    dh, dw, db = torch.ops.fused_lce.logprobs_backward(hidden, weight, labels, bias, lse, zmean, g_lp, g_ent,
                                                       *ctx.opts, want)
    return ((dh if want[0] else None, dw if want[1] else None, None, db if want[2] else None)
            + (None,) * (n_inputs - 4))


FORWARD.register_autograd(_lib, _backward, _setup_context)


# ------------------------------------------------------------------------------------------------ torch.func
FuncLogprobs = FORWARD.func_function(_backward_impl, _setup_context)
FORWARD.register_vmap(_lib, 7)
BACKWARD.register_vmap(_lib, 3)
