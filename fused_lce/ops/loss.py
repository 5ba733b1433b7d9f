"""The registered loss ops ``torch.ops.fused_lce.forward`` / ``torch.ops.fused_lce.backward``: schemas, input
checks, fake kernels and autograd -- once, for every device. Their kernels are
``fused_lce.core.driver.forward`` / ``backward``; native libraries register only private kernel ops
(``fused_lce::_cpu_*``, ``_npu_*``). Schemas, outputs and checks: docs/spec.md ("Public API"); the options
block of both schemas is the loss family of ``fused_lce.core.Options`` field by field (``FORWARD.schema``
shows it whole).

Autograd: the backward of ``forward`` scales the gradients computed in forward by the upstream scalar, and
calls ``backward`` for anything not precomputed (reduction "none", or a gradient the caller did not announce
in ``grad_mask``). Double backward (``create_graph=True``) raises a RuntimeError naming fused_lce at backward.
torch.func: ``FuncForward`` (used by the public API while a transform is active) makes ``grad`` / ``vjp`` /
``jacrev`` work; both ops have vmap rules (one call per batch element).
"""
from __future__ import annotations

import functools

import torch

from ..core import LOSS, driver, validate
from .schema import OpSchema

_lib = torch.library.Library("fused_lce", "DEF")
FORWARD = OpSchema(_lib, "forward", "Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor? "
                   "num_items, str reduction", LOSS, "bool[3] grad_mask",
                   "(Tensor loss, Tensor lse, Tensor correct, Tensor grad_hidden, Tensor grad_weight, "
                   "Tensor grad_bias)")
BACKWARD = OpSchema(_lib, "backward", "Tensor grad_loss, Tensor hidden, Tensor weight, Tensor labels, "
                    "Tensor? bias, Tensor lse, Tensor? num_items, str reduction", LOSS, "bool[3] grad_mask",
                    "(Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)")
# dW / dX / db computed in forward, scaled in place by the upstream gradient in backward: one kernel per
# device (a Triton one on CUDA that reads the scale on the device and skips the pass when it is 1),
# _foreach_mul_ else
_lib.define("_scale_grads_(Tensor(a!)[] grads, Tensor scale) -> ()")


@torch.library.impl(_lib, "_scale_grads_", "CompositeExplicitAutograd")
def _scale_grads_default(grads, scale):
    # vectorised, reads the scale on the device (a 0-dim broadcast mul_ is slow)
    torch._foreach_mul_(grads, scale)


# ----------------------------------------------------------------------------------------------- input checks
def _check(schema: OpSchema, args):
    """Bound, checked arguments of a loss op call: (bound, options, group)."""
    a = schema.bind(args)
    opts = schema.options(a)
    validate.grad_mask(a["grad_mask"])
    validate.reduction(a["reduction"])
    group = validate.problem(a["hidden"], a["weight"], a["labels"], a["bias"], opts)
    validate.num_items_tensor(a["num_items"], a["hidden"].device)
    if schema is BACKWARD:
        n = a["labels"].shape[0]
        validate.grad_loss(a["grad_loss"], a["reduction"], n, a["hidden"].device)
        validate.per_token("lse", a["lse"], n, a["hidden"].device)
    return a, opts, group


def no_autocast(fn):
    """Providers pick their own precisions (fp32 accumulation); an enclosing autocast region must not downcast
    the fp32 tile GEMMs inside them."""

    @functools.wraps(fn)
    def wrapper(*args):
        dev = next(a for a in args if isinstance(a, torch.Tensor)).device.type
        if dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev):
            with torch.autocast(dev, enabled=False):
                return fn(*args)
        return fn(*args)

    return wrapper


def empty_like(t):
    return t.new_empty(0)


def _or_empty(grads, hidden, weight):
    dh, dw, db = grads
    return (empty_like(hidden) if dh is None else dh, empty_like(weight) if dw is None else dw,
            empty_like(weight) if db is None else db)


# ------------------------------------------------------------------------------------------------ kernels
@no_autocast
def _forward_kernel(*args):
    a, opts, group = _check(FORWARD, args)
    loss, lse, correct, *grads = driver.forward(a["hidden"], a["weight"], a["labels"], a["bias"],
                                                a["num_items"], a["reduction"], opts, group, a["grad_mask"])
    return (loss, lse, correct) + _or_empty(grads, a["hidden"], a["weight"])


@no_autocast
def _backward_kernel(*args):
    a, opts, group = _check(BACKWARD, args)
    grads = driver.backward(a["grad_loss"], a["hidden"], a["weight"], a["labels"], a["bias"], a["lse"],
                            a["num_items"], a["reduction"], opts, group, a["grad_mask"])
    return _or_empty(grads, a["hidden"], a["weight"])


def _fake_grads(hidden, weight, bias, mask):
    return (torch.empty_like(hidden) if mask[0] else empty_like(hidden),
            torch.empty_like(weight) if mask[1] else empty_like(weight),
            torch.empty_like(bias) if mask[2] else empty_like(weight))


def _forward_fake(*args):
    a, _opts, _group = _check(FORWARD, args)
    hidden, n = a["hidden"], a["labels"].shape[0]  # hidden has N/world rows under sequence parallelism
    mask = driver.normalise_mask(a["grad_mask"], a["bias"])
    fused = a["reduction"] != "none" and any(mask)
    f32 = torch.float32
    loss = hidden.new_empty((n,) if a["reduction"] == "none" else (), dtype=f32)
    return ((loss, hidden.new_empty(n, dtype=f32), hidden.new_empty(n, dtype=torch.bool))
            + _fake_grads(hidden, a["weight"], a["bias"], mask if fused else (False,) * 3))


def _backward_fake(*args):
    a, _opts, _group = _check(BACKWARD, args)
    return _fake_grads(a["hidden"], a["weight"], a["bias"], driver.normalise_mask(a["grad_mask"], a["bias"]))


_lib.impl("forward", _forward_kernel, "CompositeExplicitAutograd")
_lib.impl("backward", _backward_kernel, "CompositeExplicitAutograd")
torch.library.register_fake("fused_lce::forward", _forward_fake, lib=_lib)
torch.library.register_fake("fused_lce::backward", _backward_fake, lib=_lib)


# ------------------------------------------------------------------------------------------------ autograd
def _setup_context(ctx, inputs, output):
    a = FORWARD.bind(inputs)
    ctx.opts = tuple(a[f] for f in FORWARD.option_names)
    _loss, lse, correct, dh, dw, db = output
    ctx.reduction = a["reduction"]
    ctx.fused = a["reduction"] != "none" and any(a["grad_mask"])
    ctx.mark_non_differentiable(lse, correct, dh, dw, db)
    # no zero-filled gradients for the non-differentiable outputs (one would be the size of dW)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(a["hidden"], a["weight"], a["labels"], a["bias"], a["num_items"], lse)
    # held outside save_for_backward: they are scaled in place by the first backward (no version-counter
    # check)
    ctx.precomputed = (dh, dw, db)
    # which were computed: an empty tensor can be a real gradient (an empty vocabulary shard's dW), and every
    # rank of a group must take the same path here (the recompute path has collectives under sequence
    # parallelism)
    ctx.pre_mask = driver.normalise_mask(a["grad_mask"], a["bias"])


DOUBLE_BACKWARD = ("fused_lce: higher-order and forward-mode derivatives through linear_cross_entropy are "
                   "not supported (double backward with create_graph=True, torch.func.hessian / jacfwd / "
                   "jvp, grad of grad, torch.autograd.forward_ad dual tensors): its gradients come from "
                   "fused kernels, not from differentiable ops. For those use the plain path "
                   "F.cross_entropy(F.linear(hidden, weight, bias), labels), which materialises the logits.")


def _backward(ctx, g_loss, *_unused):
    if g_loss is not None and torch.is_grad_enabled():
        raise RuntimeError(DOUBLE_BACKWARD)
    return _backward_impl(ctx, g_loss)


def _backward_impl(ctx, g_loss, *_unused):
    n_inputs = len(FORWARD.arg_names)
    if g_loss is None:
        return (None,) * n_inputs
    hidden, weight, labels, bias, num_items, lse = ctx.saved_tensors
    dh, dw, db = ctx.precomputed
    want = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[3])
    out = [None, None, None]
    if ctx.fused and dh is not None:
        # Eager: scale the gradients computed in forward in place, since a copy would double the peak memory
        # (dW is V x D); the buffers are then spent and a second backward (retain_graph=True) takes the
        # recompute path. Traced (FakeTensor/FunctionalTensor subclasses) or under torch.func (batched tensors
        # have no in-place foreach rule): out of place.
        eager = all(type(t) is torch.Tensor and torch.func.debug_unwrap(t, recurse=False) is t
                    for t in (dh, dw, db, g_loss))
        if eager:
            ctx.precomputed = (None, None, None)
        ready = [k for k, pre in enumerate((dh, dw, db)) if want[k] and ctx.pre_mask[k]]
        pres = [(dh, dw, db)[k] for k in ready]
        g = g_loss.to(torch.float32)  # exact when the upstream gradient is 1 (the usual case)
        if eager and pres:
            torch.ops.fused_lce._scale_grads_(pres, g)
        for k, pre in zip(ready, pres):
            out[k] = pre if eager else pre * g.to(pre.dtype)
    missing = tuple(want[k] and out[k] is None for k in range(3))
    if any(missing):
        rh, rw, rb = torch.ops.fused_lce.backward(g_loss, hidden, weight, labels, bias, lse, num_items,
                                                  ctx.reduction, *ctx.opts, list(missing))
        for k, r in enumerate((rh, rw, rb)):
            if missing[k]:
                out[k] = r
    return (out[0], out[1], None, out[2]) + (None,) * (n_inputs - 4)


FORWARD.register_autograd(_lib, _backward, _setup_context)


# ------------------------------------------------------------------------------------------------ torch.func
FuncForward = FORWARD.func_function(_backward_impl, _setup_context)
FORWARD.register_vmap(_lib, 6)
BACKWARD.register_vmap(_lib, 3)
