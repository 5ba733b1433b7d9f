"""The registered custom ops ``torch.ops.fused_lce.forward`` / ``torch.ops.fused_lce.backward``.

Schemas (2-D problems; the public API flattens, shifts and validates first)::

    fused_lce::forward(Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor? num_items,
        str reduction, int ignore_index, float label_smoothing, float z_loss, float softcap, str backend,
        str group_name, int vocab_start, int vocab_total, int tile_bytes, bool[3] grad_mask)
        -> (Tensor loss, Tensor lse, Tensor correct, Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)

    fused_lce::backward(Tensor grad_loss, Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor lse,
        int ignore_index, float label_smoothing, float z_loss, float softcap, str backend, str group_name,
        int vocab_start, int vocab_total, int tile_bytes, bool[3] grad_mask)
        -> (Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)

``forward`` returns the reduced float32 loss (0-dim for "sum"/"mean", (N,) for "none"), per-token ``lse``
(float32) and ``correct`` (bool), and -- when ``reduction != "none"`` and ``grad_mask`` asks for any gradient --
the gradients of the returned loss computed in the same pass (else empty tensors). ``softcap == 0`` means off,
``group_name == ""`` means one device, ``vocab_total == 0`` means ``weight.shape[0]``, ``tile_bytes == 0`` means
the backend's default, ``backend`` is a backend name or "auto". ``backward`` recomputes the gradients of
``sum_i grad_loss[i] * loss_i`` (``grad_loss`` float32, (N,)) from the saved ``lse``. With a group and
``hidden.shape[0] < labels.shape[0]`` (sequence parallelism), ``hidden`` holds this rank's ``N / world`` rows: the
ops all-gather them and return this rank's rows of the gradient (reduce-scatter in float32).

Autograd: the backward of ``forward`` scales the gradients computed in forward by the upstream scalar, and calls
``backward`` for anything not precomputed (reduction "none", or a gradient the caller did not announce in
``grad_mask``). Every device runs the Python router below unless a native library owns its dispatch key (the C++
CPU kernel in ``fused_lce._C``); such a kernel hands other backends back through ``fused_lce::_route_forward``
/ ``_route_backward``, which have the same schemas.
"""
from __future__ import annotations

import torch

from . import backends, distributed
from .backends.base import Config

_FWD_ARGS = ("Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor? num_items, str reduction, "
             "int ignore_index, float label_smoothing, float z_loss, float softcap, str backend, str group_name, "
             "int vocab_start, int vocab_total, int tile_bytes, bool[3] grad_mask")
_FWD_RET = "(Tensor loss, Tensor lse, Tensor correct, Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)"
_BWD_ARGS = ("Tensor grad_loss, Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor lse, "
             "int ignore_index, float label_smoothing, float z_loss, float softcap, str backend, str group_name, "
             "int vocab_start, int vocab_total, int tile_bytes, bool[3] grad_mask")
_BWD_RET = "(Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)"

_lib = torch.library.Library("fused_lce", "DEF")
for _name in ("forward", "_route_forward"):
    _lib.define(f"{_name}({_FWD_ARGS}) -> {_FWD_RET}")
for _name in ("backward", "_route_backward"):
    _lib.define(f"{_name}({_BWD_ARGS}) -> {_BWD_RET}")


def _config(ignore_index, label_smoothing, z_loss, softcap, group_name, vocab_start, vocab_total, tile_bytes):
    return Config(int(ignore_index), float(label_smoothing), float(z_loss), float(softcap), int(tile_bytes),
                  str(group_name), int(vocab_start), int(vocab_total))


def _divisor(reduction, num_items, labels, ignore_index):
    """0-dim float32 divisor of the summed loss: 1 for "sum", num_items or the count of valid tokens for "mean"."""
    if reduction != "mean":
        return torch.ones((), device=labels.device)
    if num_items is not None:
        return num_items.to(device=labels.device, dtype=torch.float32).reshape(())
    return (labels != ignore_index).sum().to(torch.float32)


def _safe_inverse(div):
    # all tokens ignored (or num_items == 0): the loss and its gradients are 0, never NaN
    return torch.where(div > 0, 1.0 / torch.where(div > 0, div, torch.ones_like(div)), torch.zeros_like(div))


def _empty(t):
    return t.new_empty(0)


def _no_autocast(fn):
    """Backends pick their own precisions (fp32 accumulation); an enclosing autocast region must not downcast the
    fp32 tile GEMMs inside them."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args):
        dev = args[1].device.type
        if dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev):
            with torch.autocast(dev, enabled=False):
                return fn(*args)
        return fn(*args)

    return wrapper


@_no_autocast
def _forward_kernel(hidden, weight, labels, bias, num_items, reduction, ignore_index, label_smoothing, z_loss,
                    softcap, backend, group_name, vocab_start, vocab_total, tile_bytes, grad_mask):
    cfg = _config(ignore_index, label_smoothing, z_loss, softcap, group_name, vocab_start, vocab_total, tile_bytes)
    impl = backends.resolve(backend, hidden.device, cfg, hidden.dtype)
    mask = (bool(grad_mask[0]), bool(grad_mask[1]), bool(grad_mask[2]) and bias is not None)
    fused = reduction != "none" and any(mask)
    inv = _safe_inverse(_divisor(reduction, num_items, labels, ignore_index))
    # sequence parallel: hidden holds this rank's N/world token rows, labels all N (one all-gather)
    full = distributed.sp_gather_rows(hidden, cfg.group_name, labels.shape[0])
    r = impl.forward(full, weight, labels, bias, cfg, inv if fused else None, mask)
    if reduction == "none":
        loss = r.loss
    else:
        loss = r.loss.sum() * inv
    dh = r.grad_hidden
    if dh is not None:  # all-reduce, or reduce-scatter to this rank's rows (sequence parallel), in float32
        dh = distributed.reduce_grad_rows(dh, cfg.group_name, hidden.shape[0]).to(hidden.dtype)
    return (loss, r.lse, r.correct, _empty(hidden) if dh is None else dh,
            _empty(weight) if r.grad_weight is None else r.grad_weight,
            _empty(weight) if r.grad_bias is None else r.grad_bias)


@_no_autocast
def _backward_kernel(grad_loss, hidden, weight, labels, bias, lse, ignore_index, label_smoothing, z_loss, softcap,
                     backend, group_name, vocab_start, vocab_total, tile_bytes, grad_mask):
    cfg = _config(ignore_index, label_smoothing, z_loss, softcap, group_name, vocab_start, vocab_total, tile_bytes)
    impl = backends.resolve(backend, hidden.device, cfg, hidden.dtype)
    mask = (bool(grad_mask[0]), bool(grad_mask[1]), bool(grad_mask[2]) and bias is not None)
    full = distributed.sp_gather_rows(hidden, cfg.group_name, labels.shape[0])
    dh, dw, db = impl.backward(grad_loss, full, weight, labels, bias, lse, cfg, mask)
    if dh is not None:
        dh = distributed.reduce_grad_rows(dh, cfg.group_name, hidden.shape[0]).to(hidden.dtype)
    return (_empty(hidden) if dh is None else dh, _empty(weight) if dw is None else dw,
            _empty(weight) if db is None else db)


def _forward_fake(hidden, weight, labels, bias, num_items, reduction, ignore_index, label_smoothing, z_loss,
                  softcap, backend, group_name, vocab_start, vocab_total, tile_bytes, grad_mask):
    n = labels.shape[0]  # hidden has N/world rows under sequence parallelism
    mask = (bool(grad_mask[0]), bool(grad_mask[1]), bool(grad_mask[2]) and bias is not None)
    fused = reduction != "none" and any(mask)
    f32 = torch.float32
    loss = hidden.new_empty((n,) if reduction == "none" else (), dtype=f32)
    return (loss, hidden.new_empty(n, dtype=f32), hidden.new_empty(n, dtype=torch.bool),
            torch.empty_like(hidden) if fused and mask[0] else _empty(hidden),
            torch.empty_like(weight) if fused and mask[1] else _empty(weight),
            torch.empty_like(bias) if fused and mask[2] else _empty(weight))


def _backward_fake(grad_loss, hidden, weight, labels, bias, lse, ignore_index, label_smoothing, z_loss, softcap,
                   backend, group_name, vocab_start, vocab_total, tile_bytes, grad_mask):
    mask = (bool(grad_mask[0]), bool(grad_mask[1]), bool(grad_mask[2]) and bias is not None)
    return (torch.empty_like(hidden) if mask[0] else _empty(hidden),
            torch.empty_like(weight) if mask[1] else _empty(weight),
            torch.empty_like(bias) if mask[2] else _empty(weight))


for _name in ("forward", "_route_forward"):
    _lib.impl(_name, _forward_kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"fused_lce::{_name}", _forward_fake, lib=_lib)
for _name in ("backward", "_route_backward"):
    _lib.impl(_name, _backward_kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"fused_lce::{_name}", _backward_fake, lib=_lib)


# ---------------------------------------------------------------------------------------------- autograd
_OPTS = ("ignore_index", "label_smoothing", "z_loss", "softcap", "backend", "group_name", "vocab_start",
         "vocab_total", "tile_bytes")


def _setup_context(ctx, inputs, output):
    hidden, weight, labels, bias, num_items, reduction = inputs[:6]
    ctx.opts = inputs[6:15]
    grad_mask = inputs[15]
    loss, lse, correct, dh, dw, db = output
    ctx.reduction = reduction
    ctx.fused = reduction != "none" and any(grad_mask)
    ctx.mark_non_differentiable(lse, correct, dh, dw, db)
    # no zero-filled gradients for the non-differentiable outputs (one would be the size of dW)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(hidden, weight, labels, bias, num_items, lse)
    # held outside save_for_backward: they are scaled in place by the first backward (no version-counter check)
    ctx.precomputed = (dh, dw, db)
    # which were computed: an empty tensor can be a real gradient (an empty vocabulary shard's dW), and every rank
    # of a group must take the same path here (the recompute path has collectives under sequence parallelism)
    ctx.pre_mask = (bool(grad_mask[0]), bool(grad_mask[1]), bool(grad_mask[2]) and bias is not None)


def _backward(ctx, g_loss, *_unused):
    if g_loss is None:
        return (None,) * 16
    hidden, weight, labels, bias, num_items, lse = ctx.saved_tensors
    dh, dw, db = ctx.precomputed
    want = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[3])
    out = [None, None, None]
    if ctx.fused and dh is not None:
        # Eager: scale the gradients computed in forward in place, since a copy would double the peak memory (dW is
        # V x D); the buffers are then spent and a second backward (retain_graph=True) takes the recompute path.
        # Traced (FakeTensor/FunctionalTensor subclasses): out of place, the compiler plans the buffers.
        eager = all(type(t) is torch.Tensor for t in (dh, dw, db, g_loss))
        if eager:
            ctx.precomputed = (None, None, None)
        ready = [k for k, pre in enumerate((dh, dw, db)) if want[k] and ctx.pre_mask[k]]
        pres = [(dh, dw, db)[k] for k in ready]
        g = g_loss.to(torch.float32)  # exact when the upstream gradient is 1 (the usual case)
        if eager and pres:
            torch._foreach_mul_(pres, g)  # vectorised, reads g on the device (a 0-dim broadcast mul_ is slow)
        for k, pre in zip(ready, pres):
            out[k] = pre if eager else pre * g.to(pre.dtype)
    missing = tuple(want[k] and out[k] is None for k in range(3))
    if any(missing):
        n = labels.shape[0]
        if ctx.reduction == "none":
            g_tok = g_loss.to(torch.float32)
        else:
            inv = _safe_inverse(_divisor(ctx.reduction, num_items, labels, ctx.opts[0]))
            g_tok = (g_loss.to(torch.float32) * inv).expand(n).contiguous()
        rh, rw, rb = torch.ops.fused_lce.backward(g_tok, hidden, weight, labels, bias, lse, *ctx.opts, list(missing))
        for k, r in enumerate((rh, rw, rb)):
            if missing[k]:
                out[k] = r
    return out[0], out[1], None, out[2], None, *([None] * 11)


torch.library.register_autograd("fused_lce::forward", _backward, setup_context=_setup_context, lib=_lib)


# A compiled backend registers its native kernels when its module imports (the C++ CPU kernel owns the CPU key
# from then on), so load it now: dispatch must not change half-way through a run. Failure is recorded, not raised.
backends.load("cpp")
