"""The registered custom ops ``torch.ops.fused_lce.forward`` / ``torch.ops.fused_lce.backward``: schemas, input
checks, fake kernels and autograd -- once, for every device. Their kernels are ``fused_lce.driver.forward`` /
``backward``; native libraries register only private kernel ops (``fused_lce::_cpu_*``, ``_npu_*``).

Schemas (2-D problems; the public API flattens, shifts and validates labels first)::

    fused_lce::forward(Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor? num_items,
        str reduction, int ignore_index, float label_smoothing, float z_loss, float softcap, str backend,
        str group_name, int vocab_start, int vocab_total, int tile_bytes, bool[3] grad_mask)
        -> (Tensor loss, Tensor lse, Tensor correct, Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)

    fused_lce::backward(Tensor grad_loss, Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor lse,
        int ignore_index, float label_smoothing, float z_loss, float softcap, str backend, str group_name,
        int vocab_start, int vocab_total, int tile_bytes, bool[3] grad_mask)
        -> (Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)

The options block (``ignore_index`` .. ``tile_bytes``) is ``fused_lce.backends.base.Options`` field by field.
``forward`` returns the reduced float32 loss (0-dim for "sum"/"mean", (N,) for "none"), per-token ``lse``
(float32) and ``correct`` (bool), and -- when ``reduction != "none"`` and ``grad_mask`` asks for any gradient --
the gradients of the returned loss computed in the same pass (else empty tensors). ``softcap == 0`` means off,
``group_name == ""`` means one device, ``vocab_total == 0`` means ``weight.shape[0]``, ``tile_bytes == 0`` means
the provider's default, ``backend`` is a provider name or "auto". ``backward`` recomputes the gradients of
``sum_i grad_loss[i] * loss_i`` (``grad_loss`` float32, (N,)) from the saved ``lse``. With a group and
``hidden.shape[0] < labels.shape[0]`` (sequence parallelism), ``hidden`` holds this rank's ``N / world`` rows: the
ops all-gather them and return this rank's rows of the gradient (reduce-scatter in float32). Every input is
checked here (shapes, dtypes, devices, option ranges): a bad one raises ValueError/TypeError naming it; a label
outside ``[0, vocab_total)`` that is not ``ignore_index`` gives that token a NaN loss and NaN gradients.

Autograd: the backward of ``forward`` scales the gradients computed in forward by the upstream scalar, and calls
``backward`` for anything not precomputed (reduction "none", or a gradient the caller did not announce in
``grad_mask``). Double backward (``create_graph=True``) raises a RuntimeError naming fused_lce at backward.
torch.func: ``FuncForward`` (used by the public API while a transform is active) makes ``grad`` / ``vjp`` /
``jacrev`` work; both ops have vmap rules (one call per batch element).
"""
from __future__ import annotations

import functools

import torch

from . import distributed, driver, registry
from .backends.base import OPTION_FIELDS, Options, options_schema

REDUCTIONS = ("mean", "sum", "none")
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
LABEL_DTYPES = (torch.int64, torch.int32)

_OPTS = options_schema()
_FWD = (f"forward(Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor? num_items, str reduction, "
        f"{_OPTS}, bool[3] grad_mask) -> (Tensor loss, Tensor lse, Tensor correct, Tensor grad_hidden, "
        f"Tensor grad_weight, Tensor grad_bias)")
_BWD = (f"backward(Tensor grad_loss, Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, Tensor lse, "
        f"{_OPTS}, bool[3] grad_mask) -> (Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)")
_N_OPTS = len(OPTION_FIELDS)

_lib = torch.library.Library("fused_lce", "DEF")
_lib.define(_FWD)
_lib.define(_BWD)


# ------------------------------------------------------------------------------------------------ input checks
def make_options(*values) -> Options:
    """The Options of an op call, range-checked (ValueError/TypeError naming the argument)."""
    o = Options(*values)
    for name in ("ignore_index", "vocab_start", "vocab_total", "tile_bytes"):
        x = getattr(o, name)
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"{name}: expected an int, got {type(x).__name__}")
    for name in ("label_smoothing", "z_loss", "softcap"):
        x = getattr(o, name)
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"{name}: expected a float, got {type(x).__name__}")
    if not 0.0 <= o.label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing: expected a value in [0, 1], got {o.label_smoothing}")
    if not 0.0 <= o.z_loss < float("inf"):
        raise ValueError(f"z_loss: expected a finite value >= 0, got {o.z_loss}")
    if not 0.0 <= o.softcap < float("inf"):
        raise ValueError(f"softcap: expected a finite value > 0, or 0 for off, got {o.softcap}")
    for name in ("vocab_start", "vocab_total", "tile_bytes"):
        if getattr(o, name) < 0:
            raise ValueError(f"{name}: expected a value >= 0, got {getattr(o, name)}")
    if not isinstance(o.backend, str) or o.backend not in ("auto",) + registry.names():
        raise ValueError(f"backend: expected one of {('auto',) + registry.names()}, got {o.backend!r}")
    if not isinstance(o.group_name, str):
        raise TypeError(f"group_name: expected a str, got {type(o.group_name).__name__}")
    return o


def _is_traced(t: torch.Tensor) -> bool:
    """Fake / meta / functional tensors: shapes only, no values."""
    return t.device.type == "meta" or type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter)


def check_problem(hidden, weight, labels, bias, opts: Options) -> None:
    """Shapes, dtypes and devices of the tensors both ops share."""
    for name, t in (("hidden", hidden), ("weight", weight), ("labels", labels)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a Tensor, got {type(t).__name__}")
    if hidden.dim() != 2:
        raise ValueError(f"hidden: expected shape (N, D), got {tuple(hidden.shape)}")
    if hidden.dtype not in FLOATS:
        raise TypeError(f"hidden: expected dtype float32, bfloat16 or float16, got {hidden.dtype}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight: expected shape (V, D) with D = {hidden.shape[1]}, got {tuple(weight.shape)}")
    if weight.dtype != hidden.dtype:
        raise TypeError(f"weight: expected dtype {hidden.dtype} (same as hidden), got {weight.dtype}")
    if labels.dtype not in LABEL_DTYPES:
        raise TypeError(f"labels: expected dtype int64 or int32, got {labels.dtype}")
    rows = hidden.shape[0]
    if labels.dim() != 1 or labels.shape[0] not in (rows, rows * _sp_world(opts, rows, labels)):
        raise ValueError(f"labels: expected shape (N,) with N = hidden.shape[0] = {rows}, got {tuple(labels.shape)}")
    if bias is not None:
        if bias.dim() != 1 or bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias: expected shape (V,) = ({weight.shape[0]},), got {tuple(bias.shape)}")
        if bias.dtype != hidden.dtype:
            raise TypeError(f"bias: expected dtype {hidden.dtype} (same as hidden), got {bias.dtype}")
    for name, t in (("weight", weight), ("labels", labels), ("bias", bias)):
        if t is not None and t.device != hidden.device:
            raise ValueError(f"{name}: expected a tensor on hidden's device {hidden.device}, got {t.device}")
    if opts.group_name:
        try:
            distributed.resolve_group(opts.group_name)
        except Exception as e:  # torch.distributed raises RuntimeError / ValueError depending on its state
            raise ValueError(f"group_name: no torch.distributed process group is registered under "
                             f"{opts.group_name!r} ({type(e).__name__}: {e})") from None
    if not opts.group_name and (opts.vocab_start or opts.vocab_total not in (0, weight.shape[0])):
        raise ValueError(f"vocab_start/vocab_total: a vocabulary shard (vocab_start={opts.vocab_start}, "
                         f"vocab_total={opts.vocab_total}, weight.shape[0]={weight.shape[0]}) needs a group_name; "
                         f"on one device use vocab_start=0, vocab_total=0")
    if opts.vocab_total and opts.vocab_start + weight.shape[0] > opts.vocab_total:
        raise ValueError(f"vocab_start/vocab_total: the shard [{opts.vocab_start}, "
                         f"{opts.vocab_start + weight.shape[0]}) exceeds vocab_total={opts.vocab_total}")


def _sp_world(opts: Options, rows: int, labels) -> int:
    """World size when labels cover a sequence-parallel group's rows (else 1)."""
    if not opts.group_name or labels.dim() != 1 or labels.shape[0] == rows:
        return 1
    group = distributed.resolve_group(opts.group_name)
    return torch.distributed.get_world_size(group) if group is not None else 1


def check_per_token(name: str, t, n: int, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(t).__name__}")
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"{name}: expected shape ({n},) (one value per token), got {tuple(t.shape)}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on hidden's device {device}, got {t.device}")


def check_num_items(num_items, device) -> None:
    if num_items is None:
        return
    if num_items.numel() != 1:
        raise ValueError(f"num_items: expected a one-element tensor, got shape {tuple(num_items.shape)}")
    if num_items.dtype == torch.bool or num_items.is_complex():
        raise TypeError(f"num_items: expected a real number, got dtype {num_items.dtype}")
    if not _is_traced(num_items) and not torch.compiler.is_compiling():
        value = float(num_items.detach().reshape(()).to("cpu", torch.float64))
        if not value >= 0 or value == float("inf"):  # NaN fails too
            raise ValueError(f"num_items: expected a finite value >= 0, got {value}")


def _no_autocast(fn):
    """Providers pick their own precisions (fp32 accumulation); an enclosing autocast region must not downcast the
    fp32 tile GEMMs inside them."""

    @functools.wraps(fn)
    def wrapper(*args):
        dev = args[1].device.type
        if dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev):
            with torch.autocast(dev, enabled=False):
                return fn(*args)
        return fn(*args)

    return wrapper


def _empty(t):
    return t.new_empty(0)


def check_grad_mask(grad_mask) -> None:
    if len(grad_mask) != 3:
        raise ValueError(f"grad_mask: expected 3 bools (hidden, weight, bias), got {list(grad_mask)}")


def _split_forward(args):
    hidden, weight, labels, bias, num_items, reduction = args[:6]
    opts = make_options(*args[6:6 + _N_OPTS])
    grad_mask = args[6 + _N_OPTS]
    check_grad_mask(grad_mask)
    check_problem(hidden, weight, labels, bias, opts)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {REDUCTIONS}, got {reduction!r}")
    check_num_items(num_items, hidden.device)
    return hidden, weight, labels, bias, num_items, reduction, opts, grad_mask


def _split_backward(args):
    grad_loss, hidden, weight, labels, bias, lse = args[:6]
    opts = make_options(*args[6:6 + _N_OPTS])
    grad_mask = args[6 + _N_OPTS]
    check_grad_mask(grad_mask)
    check_problem(hidden, weight, labels, bias, opts)
    check_per_token("grad_loss", grad_loss, labels.shape[0], hidden.device)
    check_per_token("lse", lse, labels.shape[0], hidden.device)
    return grad_loss, hidden, weight, labels, bias, lse, opts, grad_mask


# ------------------------------------------------------------------------------------------------ kernels
@_no_autocast
def _forward_kernel(*args):
    hidden, weight, labels, bias, num_items, reduction, opts, grad_mask = _split_forward(args)
    loss, lse, correct, dh, dw, db = driver.forward(hidden, weight, labels, bias, num_items, reduction, opts,
                                                    grad_mask)
    return (loss, lse, correct, _empty(hidden) if dh is None else dh, _empty(weight) if dw is None else dw,
            _empty(weight) if db is None else db)


@_no_autocast
def _backward_kernel(*args):
    grad_loss, hidden, weight, labels, bias, lse, opts, grad_mask = _split_backward(args)
    dh, dw, db = driver.backward(grad_loss, hidden, weight, labels, bias, lse, opts, grad_mask)
    return (_empty(hidden) if dh is None else dh, _empty(weight) if dw is None else dw,
            _empty(weight) if db is None else db)


def _forward_fake(*args):
    hidden, weight, labels, bias, _num_items, reduction, _opts, grad_mask = _split_forward(args)
    n = labels.shape[0]  # hidden has N/world rows under sequence parallelism
    mask = driver.normalise_mask(grad_mask, bias)
    fused = reduction != "none" and any(mask)
    f32 = torch.float32
    loss = hidden.new_empty((n,) if reduction == "none" else (), dtype=f32)
    return (loss, hidden.new_empty(n, dtype=f32), hidden.new_empty(n, dtype=torch.bool),
            torch.empty_like(hidden) if fused and mask[0] else _empty(hidden),
            torch.empty_like(weight) if fused and mask[1] else _empty(weight),
            torch.empty_like(bias) if fused and mask[2] else _empty(weight))


def _backward_fake(*args):
    _g, hidden, weight, _labels, bias, _lse, _opts, grad_mask = _split_backward(args)
    mask = driver.normalise_mask(grad_mask, bias)
    return (torch.empty_like(hidden) if mask[0] else _empty(hidden),
            torch.empty_like(weight) if mask[1] else _empty(weight),
            torch.empty_like(bias) if mask[2] else _empty(weight))


_lib.impl("forward", _forward_kernel, "CompositeExplicitAutograd")
_lib.impl("backward", _backward_kernel, "CompositeExplicitAutograd")
torch.library.register_fake("fused_lce::forward", _forward_fake, lib=_lib)
torch.library.register_fake("fused_lce::backward", _backward_fake, lib=_lib)


# ------------------------------------------------------------------------------------------------ autograd
def _setup_context(ctx, inputs, output):
    hidden, weight, labels, bias, num_items, reduction = inputs[:6]
    ctx.opts = tuple(inputs[6:6 + _N_OPTS])
    grad_mask = inputs[6 + _N_OPTS]
    _loss, lse, correct, dh, dw, db = output
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
    ctx.pre_mask = driver.normalise_mask(grad_mask, bias)


def _scale_precomputed_(pres, g) -> None:
    """In place ``pre *= g`` for the gradients computed in forward (``g``: 0-dim float32, on their device). On CUDA a
    Triton kernel that reads ``g`` on the device and touches no byte when it is 1 (the usual upstream gradient of a
    mean loss): no pass over dW-sized buffers and no host synchronisation. Elsewhere ``torch._foreach_mul_``."""
    if pres[0].is_cuda and all(p.is_contiguous() for p in pres):
        from .backends import triton as _tb

        if _tb.krows is not None:
            _tb.krows.scale_unless_one_(pres, g)
            return
    torch._foreach_mul_(pres, g)  # vectorised, reads g on the device (a 0-dim broadcast mul_ is slow)


DOUBLE_BACKWARD = ("fused_lce: higher-order and forward-mode derivatives through linear_cross_entropy are not "
                   "supported (double backward with create_graph=True, torch.func.hessian / jacfwd / jvp, grad of "
                   "grad): its gradients come from fused kernels, not from differentiable ops. For those use the "
                   "plain path F.cross_entropy(F.linear(hidden, weight, bias), labels), which materialises the "
                   "logits.")


def _backward(ctx, g_loss, *_unused):
    if g_loss is not None and torch.is_grad_enabled():
        raise RuntimeError(DOUBLE_BACKWARD)
    return _backward_impl(ctx, g_loss)


def _backward_impl(ctx, g_loss):
    n_inputs = 7 + _N_OPTS
    if g_loss is None:
        return (None,) * n_inputs
    hidden, weight, labels, bias, num_items, lse = ctx.saved_tensors
    dh, dw, db = ctx.precomputed
    want = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[3])
    out = [None, None, None]
    if ctx.fused and dh is not None:
        # Eager: scale the gradients computed in forward in place, since a copy would double the peak memory (dW is
        # V x D); the buffers are then spent and a second backward (retain_graph=True) takes the recompute path.
        # Traced (FakeTensor/FunctionalTensor subclasses) or under torch.func (batched tensors have no in-place
        # foreach rule): out of place.
        eager = all(type(t) is torch.Tensor and not torch._C._functorch.is_functorch_wrapped_tensor(t)
                    for t in (dh, dw, db, g_loss))
        if eager:
            ctx.precomputed = (None, None, None)
        ready = [k for k, pre in enumerate((dh, dw, db)) if want[k] and ctx.pre_mask[k]]
        pres = [(dh, dw, db)[k] for k in ready]
        g = g_loss.to(torch.float32)  # exact when the upstream gradient is 1 (the usual case)
        if eager and pres:
            _scale_precomputed_(pres, g)
        for k, pre in zip(ready, pres):
            out[k] = pre if eager else pre * g.to(pre.dtype)
    missing = tuple(want[k] and out[k] is None for k in range(3))
    if any(missing):
        n = labels.shape[0]
        if ctx.reduction == "none":
            g_tok = g_loss.to(torch.float32)
        else:
            inv = driver.safe_inverse(driver.mean_divisor(ctx.reduction, num_items, labels, ctx.opts[0]))
            g_tok = (g_loss.to(torch.float32) * inv).expand(n).contiguous()
        rh, rw, rb = torch.ops.fused_lce.backward(g_tok, hidden, weight, labels, bias, lse, *ctx.opts, list(missing))
        for k, r in enumerate((rh, rw, rb)):
            if missing[k]:
                out[k] = r
    return (out[0], out[1], None, out[2]) + (None,) * (n_inputs - 4)


torch.library.register_autograd("fused_lce::forward", _backward, setup_context=_setup_context, lib=_lib)


# ------------------------------------------------------------------------------------------------ torch.func
class FuncForward(torch.autograd.Function):
    """``fused_lce::forward`` under torch.func transforms (``grad``, ``grad_and_value``, ``vjp``, ``jacrev``,
    ``vmap``). The autograd formula that ``torch.library.register_autograd`` installs is not functorch-compatible
    (it is a ctx-style ``autograd.Function``), so while a transform is active the public API calls the op through
    this Function, whose backward is the same formula. One level of reverse mode: ``fused_lce.api`` rejects nested
    grad levels and forward mode (``DOUBLE_BACKWARD``) before the forward runs."""

    generate_vmap_rule = True  # vmap of forward / backward reaches the ops' vmap rules below

    @staticmethod
    def forward(*args):
        return torch.ops.fused_lce.forward(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _setup_context(ctx, inputs, output)

    @staticmethod
    def backward(ctx, g_loss, *_unused):
        # torch.func.grad runs the engine with create_graph=True by design; nested levels were rejected up front,
        # so this is a first-order gradient
        return _backward_impl(ctx, g_loss)


def _vmap_rule(op, n_out: int):
    """vmap of an op: one call per batch element, outputs stacked along dim 0 (each element is an independent
    problem with its own reduction, so the rows cannot simply be folded together)."""

    def rule(info, in_dims, *args):
        if info.batch_size == 0:
            raise ValueError("fused_lce: vmap over a dimension of size 0 is not supported")
        outs = [op(*(a.select(d, b) if isinstance(a, torch.Tensor) and d is not None else a
                     for a, d in zip(args, in_dims))) for b in range(info.batch_size)]
        return tuple(torch.stack([o[k] for o in outs]) for k in range(n_out)), (0,) * n_out

    return rule


torch.library.register_vmap("fused_lce::forward", _vmap_rule(torch.ops.fused_lce.forward.default, 6), lib=_lib)
torch.library.register_vmap("fused_lce::backward", _vmap_rule(torch.ops.fused_lce.backward.default, 3), lib=_lib)
