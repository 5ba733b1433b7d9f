"""The public API: ``linear_cross_entropy``, ``LinearCrossEntropy``, ``linear_logprobs``, ``label_errors``,
``backend_info``.

These functions check what only they can see (the unflattened shapes, ``shift``, Python-side arguments such as
``process_group`` or a ``num_items`` number), flatten the problem and call the registered ops
(``torch.ops.fused_lce.forward`` / ``logprobs``), which check the rest (``fused_lce.core.validate``) and run
the driver.
"""
from __future__ import annotations

import inspect
from types import MappingProxyType
from typing import Callable, NamedTuple, Optional, Union

import torch

from . import ops
from .core import registry
from .core import validate as check
from .core.formulas import classify_labels


class LogprobsOutput(NamedTuple):
    """What ``linear_logprobs(..., extra_outputs=...)`` returns: per token, of ``labels``' shape; ``entropy``
    and each extra are None unless asked. The extras are metrics (not differentiable): ``mean_logit = sum_j
    z_j / V``, ``is_top1`` (bool: the label is the first argmax) and ``log_sum_sq_probs = log sum_j p_j^2``
    (WPO's weights; a second statistics pass). 0 / False where the label is ignored."""

    logprobs: torch.Tensor
    entropy: Optional[torch.Tensor] = None
    mean_logit: Optional[torch.Tensor] = None
    is_top1: Optional[torch.Tensor] = None
    log_sum_sq_probs: Optional[torch.Tensor] = None


EXTRA_OUTPUTS = ("mean_logit", "is_top1", "log_sum_sq_probs")


class LCEOutput(NamedTuple):
    """What ``return_stats=True`` returns. ``lse`` (float32, per token, 0 where ignored, detached) and
    ``token_accuracy`` (fraction of valid tokens whose first argmax logit is the label) are statistics, not
    differentiable."""

    loss: torch.Tensor
    lse: torch.Tensor
    token_accuracy: torch.Tensor
    n_valid: torch.Tensor


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    shift: bool = False,
    num_items: Union[None, int, float, torch.Tensor] = None,
    return_stats: bool = False,
    process_group=None,
    sequence_parallel: bool = False,
    backend: str = "auto",
    validate: bool = True,
    tile_budget_mb: Optional[float] = None,
) -> Union[torch.Tensor, LCEOutput]:
    """Cross-entropy of ``hidden @ weight.T (+ bias)`` against ``labels``, computed tile by tile so that the
    ``[tokens x vocab]`` logits never exist (the memory of an LM head's loss is the memory of a few tiles).

    The contract -- shapes, dtypes, every error, what ``torch.compile`` / ``torch.func`` / double backward
    do -- is docs/spec.md. In short:
        hidden, weight, labels, bias: ``(..., D)`` float32 / bfloat16 / float16, ``(V, D)`` of the same dtype,
            ``hidden.shape[:-1]`` int64 / int32 class ids, ``(V,)`` or None.
        ignore_index, reduction, label_smoothing: as in ``F.cross_entropy``; ``num_items`` (HF's
            ``num_items_in_batch``) replaces the count of valid tokens as the divisor of ``"mean"``.
        z_loss, softcap: adds ``z_loss * lse**2`` per token; logits become ``softcap * tanh(z / softcap)``.
        shift: causal-LM shift (``hidden[..., t, :]`` predicts ``labels[..., t + 1]``) without copying hidden.
        return_stats: return ``LCEOutput(loss, lse, token_accuracy, n_valid)`` instead of the loss.
        process_group, sequence_parallel: vocab-parallel group (``weight`` / ``bias`` its shard) and Megatron
            sequence parallelism.
        backend: ``"auto"`` or a provider name (``fused_lce.backend_info()``; env ``FUSED_LCE_BACKEND``).
        validate: check the label values without stalling the device; off, a bad label gives NaN.
        tile_budget_mb: MiB of logits tiles a backend may keep live; lower it when a call runs out of memory.

    Returns the float32 loss (0-dim, or per token for ``"none"``); 0.0 when no label is valid. Bad input
    raises ValueError / TypeError naming the argument.
    """
    _reject_unsupported_transforms(hidden, weight, labels, bias, plain="F.cross_entropy(F.linear(...))")
    check.reduction(reduction)
    call = _flatten(hidden, weight, labels, bias, ignore_index=ignore_index, softcap=softcap, shift=shift,
                    process_group=process_group, sequence_parallel=sequence_parallel, backend=backend,
                    validate_labels=validate, tile_budget_mb=tile_budget_mb)
    opts = dict(call.opts, label_smoothing=check.number("label_smoothing", label_smoothing),
                z_loss=check.number("z_loss", z_loss))
    grad_on = torch.is_grad_enabled()
    grad_mask = [grad_on and call.hidden.requires_grad, grad_on and call.weight.requires_grad,
                 grad_on and call.bias is not None and call.bias.requires_grad]
    args = ops.loss.FORWARD.args(hidden=call.hidden, weight=call.weight, labels=call.labels, bias=call.bias,
                                 num_items=check.num_items(num_items, call.hidden.device),
                                 reduction=reduction, grad_mask=grad_mask, **opts)
    if _functorch_active(ops.loss.DOUBLE_BACKWARD):  # torch.func: a functorch-compatible autograd.Function
        loss, lse, correct, _, _, _ = ops.loss.FuncForward.apply(*args)
    else:
        loss, lse, correct, _, _, _ = torch.ops.fused_lce.forward(*args)
    call.check_labels()
    if reduction == "none":
        loss = _unshift(loss, call.labels_shape, call.out_shape)
    if not return_stats:
        return loss
    n_valid = (call.labels != ignore_index).sum()
    accuracy = correct.sum().to(torch.float32) / n_valid.clamp(min=1).to(torch.float32)
    return LCEOutput(loss, _unshift(lse, call.labels_shape, call.out_shape), accuracy, n_valid)


def linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    temperature: float = 1.0,
    softcap: Optional[float] = None,
    return_entropy: bool = False,
    extra_outputs: tuple = (),
    ignore_index: int = -100,
    process_group=None,
    backend: str = "auto",
    validate: bool = True,
    tile_budget_mb: Optional[float] = None,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor], LogprobsOutput]:
    """Per-token ``log p(label)`` (and optionally the entropy of ``p``) of ``z = softcap(hidden @ weight.T +
    bias) / temperature``, without materialising the logits: the log-prob head of GRPO / PPO / DPO. Both are
    differentiable w.r.t. ``hidden``, ``weight`` and ``bias``.

    The contract is docs/spec.md ("Per-token log-probs and entropy"). In short:
        hidden, weight, labels, bias, ignore_index, process_group, backend, validate, tile_budget_mb: as for
            :func:`linear_cross_entropy`.
        temperature: > 0; divides the logits after the softcap (TRL's and verl's order).
        softcap: > 0 or None.
        return_entropy: also return the per-token entropy of ``softmax(z)``.
        extra_outputs: any of ``"mean_logit"``, ``"is_top1"``, ``"log_sum_sq_probs"`` (TRL's fused-head
            metrics).

    Returns float32 log-probs of ``labels``' shape (0 where the label is ignored), ``(logprobs, entropy)``
    with ``return_entropy``, or a ``LogprobsOutput`` when ``extra_outputs`` is non-empty.
    """
    _reject_unsupported_transforms(hidden, weight, labels, bias, plain="torch.log_softmax(F.linear(...), -1)")
    call = _flatten(hidden, weight, labels, bias, ignore_index=ignore_index, softcap=softcap, shift=False,
                    process_group=process_group, sequence_parallel=False, backend=backend,
                    validate_labels=validate, tile_budget_mb=tile_budget_mb)
    extras = _extras(extra_outputs)
    opts = dict(call.opts, temperature=check.number("temperature", temperature),
                entropy=check.flag("return_entropy", return_entropy), mean_logit="mean_logit" in extras,
                sum_sq="log_sum_sq_probs" in extras)
    args = ops.logprobs.FORWARD.args(hidden=call.hidden, weight=call.weight, labels=call.labels,
                                     bias=call.bias, **opts)
    # torch.func: a functorch-compatible autograd.Function
    if _functorch_active(ops.logprobs.DOUBLE_BACKWARD):
        lp, ent, _lse, _zmean, mean, top1, sq = ops.logprobs.FuncLogprobs.apply(*args)
    else:
        lp, ent, _lse, _zmean, mean, top1, sq = torch.ops.fused_lce.logprobs(*args)
    call.check_labels()
    shaped = lambda x, on=True: x.reshape(call.labels_shape) if on else None  # noqa: E731
    if extras:
        return LogprobsOutput(shaped(lp), shaped(ent, return_entropy), shaped(mean, "mean_logit" in extras),
                              shaped(top1, "is_top1" in extras), shaped(sq, "log_sum_sq_probs" in extras))
    return (shaped(lp), shaped(ent)) if return_entropy else shaped(lp)


def _extras(names) -> tuple:
    if isinstance(names, str) or not isinstance(names, (tuple, list, set, frozenset)):
        raise TypeError(f"extra_outputs: expected a tuple of names, got {type(names).__name__}")
    unknown = [n for n in names if n not in EXTRA_OUTPUTS]
    if unknown:
        raise ValueError(f"extra_outputs: expected names among {EXTRA_OUTPUTS}, got {unknown}")
    return tuple(names)


class _Call(NamedTuple):
    """A flattened call of an op: its tensors and the option values the API sets (as the schema types)."""

    hidden: torch.Tensor  # (N, D), or (N / world, D) under sequence parallelism
    weight: torch.Tensor
    labels: torch.Tensor  # (N,), shifted when asked
    bias: Optional[torch.Tensor]
    opts: dict  # the options shared by both op families
    labels_shape: tuple  # shape of the (shifted) labels before flattening
    out_shape: tuple  # shape of a "none" loss
    check_labels: Callable[[], None]  # raises for a bad label value; called once the op has returned


def _flatten(hidden, weight, labels, bias, *, ignore_index, softcap, shift, process_group, sequence_parallel,
             backend, validate_labels, tile_budget_mb) -> _Call:
    """What only the public functions can check (unflattened shapes, ``shift``, Python-side arguments), then
    the flattened op inputs. Dtypes, devices, the weight's and bias's shapes and every option's range are
    checked by the op (``fused_lce.core.validate``)."""
    for name, t in (("hidden", hidden), ("weight", weight), ("labels", labels)):
        check.tensor(name, t)
    if bias is not None:
        check.tensor("bias", bias)
    check.flag("sequence_parallel", sequence_parallel)
    check.flag("shift", shift)
    check.flag("validate", validate_labels)
    group = check.process_group(process_group)
    ignore_index = check.integer("ignore_index", ignore_index)
    check.backend(backend)
    if softcap is None:
        softcap = 0.0  # the ops' "off"
    elif not check.number("softcap", softcap) > 0.0:
        raise ValueError(f"softcap: expected a value > 0 or None, got {softcap}")
    sp_world = 1
    if sequence_parallel:
        if group is None:
            raise ValueError("sequence_parallel=True: expected a process_group, got None")
        if hidden.dim() < 2:
            raise ValueError("hidden: sequence_parallel needs shape (T_local, ..., D), got "
                             f"{tuple(hidden.shape)}")
        sp_world = torch.distributed.get_world_size(group)  # the op gathers the rows and reduce-scatters dX
    if hidden.dim() < 1:
        raise ValueError("hidden: expected shape (..., D) with at least one dimension, got a 0-dim tensor")
    tokens = tuple(hidden.shape[:-1])
    if sp_world > 1:  # the labels of the whole group's tokens
        tokens = (hidden.shape[0] * sp_world,) + tokens[1:]
    if tuple(labels.shape) != tokens:
        what = "hidden.shape[:-1]" if sp_world == 1 else "(world * hidden.shape[0],) + hidden.shape[1:-1]"
        raise ValueError(f"labels: expected shape {what} = {tokens}, got {tuple(labels.shape)}")
    check.label_dtype(labels)
    check.weight_shape(weight, hidden.shape[-1])  # V is needed for the label check below
    hidden, weight, bias = _autocast(hidden, weight, bias)

    out_shape = tuple(labels.shape)
    if labels.dtype == torch.int32 and not -2**31 <= ignore_index < 2**31:
        # compared with ignore_index (and padded with it): an int32 tensor would wrap it
        labels = labels.long()
    if shift:
        if hidden.dim() < 2:
            raise ValueError("shift=True: hidden needs a sequence dimension, expected shape (..., T, D), "
                             f"got {tuple(hidden.shape)}")
        # shift the labels, not the hidden states: position t is scored against label t+1 and the last
        # position against ignore_index, so hidden is used as is (no copy) and its last row gets zero gradient
        pad = torch.full_like(labels[..., :1], ignore_index)
        labels = torch.cat([labels[..., 1:], pad], dim=-1)
        out_shape = out_shape[:-1] + (max(out_shape[-1] - 1, 0),)

    group_name, vocab_start, vocab_total = "", 0, 0
    v = weight.shape[0]
    if group is not None:
        from .core import distributed

        vocab_start, vocab_total = distributed.shard_layout(group, v)
        group_name = group.group_name
    y = labels.reshape(-1)
    # explicit row count (reshape(-1, 0) is ambiguous when D == 0); under sequence parallelism hidden holds
    # 1/world
    h2 = hidden.reshape(y.numel() // sp_world, hidden.shape[-1])
    check_labels = _no_check
    if validate_labels and y.numel() > 0 and not torch.compiler.is_compiling() and not check.values_hidden(y):
        # under vmap, the labels of the whole batch (the unwrapped tensor is only read, never computed with)
        check_labels = _queue_label_check(torch.func.debug_unwrap(y), ignore_index, vocab_total or v)
    opts = dict(ignore_index=ignore_index, softcap=float(softcap), backend=backend, group_name=group_name,
                vocab_start=vocab_start, vocab_total=vocab_total, tile_bytes=check.tile_bytes(tile_budget_mb))
    return _Call(h2, weight, y, bias, opts, tuple(labels.shape), out_shape, check_labels)


def _no_check() -> None:
    return None


def _queue_label_check(y: torch.Tensor, ignore_index: int, total: int) -> Callable[[], None]:
    """The label-range check of ``validate``: queued before the op, read after it has returned. On CUDA the
    flag goes to pinned host memory behind an event, and the read waits for that event: for the work queued
    before the call (a model's forward) and the check, never for the op's own kernels, which are queued by
    then. A read before the op would drain the device, which then idles while the host prepares the op's first
    launch. Not while a CUDA graph is captured (nothing can be read then: a bad label gives NaN, as with
    ``validate=False``)."""
    if y.is_cuda and torch.cuda.is_current_stream_capturing():
        return _no_check
    bad = classify_labels(y, ignore_index, total)[1]
    if not bad.is_cuda:
        flag, done = bad.any(), None
    else:
        # pinned: copied behind the event
        flag, done = bad.any().to("cpu", non_blocking=True), torch.cuda.Event()
        done.record(torch.cuda.current_stream(bad.device))

    def check_labels() -> None:
        if done is not None:
            done.synchronize()
        if bool(flag):
            raise check.label_range_error(y, bad, ignore_index, total)
    return check_labels


# The options of linear_cross_entropy (its keyword-only arguments) and their defaults, read from its
# signature: the one list of them (LinearCrossEntropy; the subsets in fused_lce.integrations.hf.options).
OPTION_DEFAULTS = MappingProxyType({name: p.default for name, p in
                                    inspect.signature(linear_cross_entropy).parameters.items()
                                    if p.kind is inspect.Parameter.KEYWORD_ONLY})


class LinearCrossEntropy(torch.nn.Module):
    """``nn.Module`` form of :func:`linear_cross_entropy`: its options (keyword arguments) fixed at
    construction (an unknown name is a TypeError there), ``forward(hidden, weight, labels, bias=None)`` the
    loss, checked and computed as :func:`linear_cross_entropy` does (docs/spec.md)."""

    def __init__(self, **options):
        super().__init__()
        unknown = set(options) - set(OPTION_DEFAULTS)
        if unknown:
            raise TypeError(f"LinearCrossEntropy: unexpected option(s) {sorted(unknown)}; "
                            f"expected any of {sorted(OPTION_DEFAULTS)}")
        self.options = options

    def forward(self, hidden, weight, labels, bias=None):
        return linear_cross_entropy(hidden, weight, labels, bias, **self.options)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items() if k != "process_group")


def label_errors(labels: torch.Tensor, vocab_size: int, *, ignore_index: int = -100,
                 shift: bool = False) -> torch.Tensor:
    """How many labels are outside ``[0, vocab_size)`` and not ``ignore_index`` (with ``shift``: among
    ``labels[..., 1:]``, the ones that are scored), as a 0-dim int64 tensor on the labels' device.

    No host sync, so it can run inside ``torch.compile(fullgraph=True)`` or a CUDA graph, where
    :func:`linear_cross_entropy` does not check label values. Return it from the compiled step and raise after
    it::

        loss, bad = step(batch)   # step returns (loss, fused_lce.label_errors(labels, V))
        if bad.item():
            raise ValueError(f"labels: {bad.item()} outside [0, V)")
    """
    check.tensor("labels", labels)
    check.label_dtype(labels)
    vocab_size = check.integer("vocab_size", vocab_size)
    if vocab_size < 0:
        raise ValueError(f"vocab_size: expected an int >= 0, got {vocab_size!r}")
    ignore_index = check.integer("ignore_index", ignore_index)
    y = labels[..., 1:] if check.flag("shift", shift) and labels.dim() > 0 else labels
    return classify_labels(y, ignore_index, vocab_size)[1].sum()


def backend_info() -> dict:
    """Which backends exist on this host: ``{name: {"available": bool, "reason": str | None, "devices": [...],
    "status": str | None}}``, plus ``"auto"``: the backend ``backend="auto"`` picks for a float32 problem on
    each device type present (a provider may still decline a particular shape: ``resolve`` then takes the
    next)."""
    info = registry.info()
    info["auto"] = {dev: registry.auto_choice(dev) for dev in registry.present_device_types()}
    return info


# ------------------------------------------------------------------------------------------------ helpers
def _transforms() -> list:
    """The active torch.func transforms (empty outside them, and while compiling). Private API: torch.func has
    no public query of them (which, and how many grad levels), and the API needs it: the ops' Autograd kernel,
    like torch.library.register_autograd's (torch 2.13: grad / vjp / jacrev raise, jvp returns a zero
    tangent), does not work inside them, so calls there go through the ops' Func* autograd.Functions."""
    if torch.compiler.is_compiling():
        return []
    return torch._C._functorch.get_interpreter_stack() or []


def _functorch_active(higher_order_message: str) -> bool:
    """True inside a torch.func transform; RuntimeError for what the op cannot do there (higher order)."""
    stack = _transforms()
    if not stack:
        return False
    kinds = [i.key() for i in stack]
    tt = torch._C._functorch.TransformType
    if tt.Jvp in kinds or kinds.count(tt.Grad) > 1:
        raise RuntimeError(higher_order_message)
    return True


def _reject_unsupported_transforms(*tensors, plain: str) -> None:
    """Forward-mode AD (``torch.autograd.forward_ad`` dual tensors) has no formula here (``plain``: the path
    to use instead), and a ``torch.func.vmap`` over an empty dimension has no problem to run: say so instead
    of returning a result without a tangent or failing inside a reshape."""
    from torch.autograd import forward_ad

    if getattr(forward_ad, "_current_level", -1) >= 0:
        for t in tensors:
            if isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None:
                raise NotImplementedError(
                    "fused_lce: forward-mode AD (torch.autograd.forward_ad dual tensors, jvp) is not "
                    f"supported: the gradients come from fused kernels; use {plain} for forward-mode AD")
    if not _transforms():
        return
    for t in tensors:
        # vmap over an empty dimension: the batched tensor's storage has one more dimension of size 0 than the
        # tensor the function sees
        if isinstance(t, torch.Tensor) and torch.func.debug_unwrap(t).shape.count(0) > t.shape.count(0):
            raise ValueError("fused_lce: torch.func.vmap over a dimension of size 0 is not supported (there "
                             "is no problem to run); skip the call for an empty batch")


def _autocast(hidden, weight, bias):
    """Under autocast, every operand in the autocast dtype, as F.linear would use (else unchanged: the op
    checks that the dtypes agree)."""
    dev = hidden.device.type
    if dev in registry.AUTO_ORDER and torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        cast = lambda t: t if t is None or t.dtype == dt else t.to(dt)  # noqa: E731
        return cast(hidden), cast(weight), cast(bias)
    return hidden, weight, bias


def _unshift(t, shifted_shape, out_shape):
    t = t.reshape(shifted_shape)
    if tuple(shifted_shape) != tuple(out_shape):
        t = t[..., : out_shape[-1]]
    return t
