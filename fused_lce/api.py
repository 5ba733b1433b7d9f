"""Public API: ``linear_cross_entropy``, ``LinearCrossEntropy``, ``backend_info``.

Validation and option normalisation happen here, once, for every backend; the math runs in the registered
custom op ``torch.ops.fused_lce.forward`` (see ``fused_lce.ops``).
"""
from __future__ import annotations

import numbers
import os
from typing import NamedTuple, Optional, Union

import torch

from . import ops, registry  # importing ops registers torch.ops.fused_lce.*
from .backends.base import OPTION_FIELDS, Options

REDUCTIONS = ("mean", "sum", "none")
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_LABEL_DTYPES = (torch.int64, torch.int32)


class LCEOutput(NamedTuple):
    """What ``return_stats=True`` returns. ``lse`` (float32, per token, detached) and ``token_accuracy``
    (fraction of valid tokens whose first argmax logit is the label) are statistics, not differentiable."""

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
    """Cross-entropy of ``hidden @ weight.T (+ bias)`` against ``labels`` without materialising the logits.

    Args:
        hidden: ``(..., D)`` float32/bfloat16/float16 activations.
        weight: ``(V, D)`` output-layer weight, same dtype as ``hidden`` (under autocast both are cast to the
            autocast dtype, as ``F.linear`` would). With ``process_group`` it is this rank's contiguous shard.
        labels: ``hidden.shape[:-1]`` int64/int32 class ids (global ids with ``process_group``).
        bias: optional ``(V,)`` bias.
        ignore_index: label value that contributes no loss and no gradient (a 64-bit integer).
        reduction: ``"mean"`` (sum / ``num_items`` or / number of valid tokens), ``"sum"`` or ``"none"``.
        label_smoothing: in [0, 1]; matches ``F.cross_entropy(label_smoothing=...)``.
        z_loss: >= 0; adds ``z_loss * lse**2`` per valid token.
        softcap: > 0 or None; logits become ``softcap * tanh(logits / softcap)``.
        shift: a bool; causal-LM shift by one position: ``hidden[..., t, :]`` predicts ``labels[..., t + 1]``,
            without copying hidden.
        num_items: divisor for ``"mean"`` instead of the count of valid tokens (HF ``num_items_in_batch``): a
            finite number >= 0 or a one-element tensor holding one (checked with one host sync; ``0`` gives 0).
        return_stats: return ``LCEOutput(loss, lse, token_accuracy, n_valid)`` instead of the loss.
        process_group: vocab-parallel group; ``weight``/``bias`` hold this rank's shard, every rank gets the
            loss of the unsharded problem, the full dX and its own dW shard.
        sequence_parallel: with ``process_group``: ``hidden`` holds this rank's ``1/world`` of the tokens along
            its first dimension (Megatron sequence parallelism, ``[s/tp, b, h]``), ``labels`` those of the whole
            group (``[s, b]``); the op all-gathers the rows and returns dX for this rank's rows (reduce-scatter).
        backend: ``"auto"`` or one of ``fused_lce.registry.NAMES``; env ``FUSED_LCE_BACKEND`` overrides auto.
        validate: check the label range eagerly (one reduction and a host sync). With False a bad label gives
            that token a NaN loss (and NaN gradients), never an out-of-bounds read.
        tile_budget_mb: MiB (2**20 bytes) of logits tiles a backend may keep live, a finite number > 0 (default:
            env ``FUSED_LCE_TILE_MB``, read once per call here so every backend means the same by it, else the
            backend's own default: 256 MiB for torch/cpp on CPU, a quarter of free memory (1-8 GiB) for torch on
            CUDA, planned from free memory for triton, 2 GiB of kept z / dz per launch for the npu backend's MIX
            kernels). Lower it when a call runs out of memory; the float32 gradient accumulators
            (``4 * (V*D + N*D + V)`` bytes) come on top.

    Returns:
        float32 loss (0-dim, or the labels' shape for ``"none"``; ``labels[..., 1:]`` with ``shift``). When no
        label is valid (all ``ignore_index``, no tokens, or ``num_items == 0``), ``"mean"`` and ``"sum"`` are 0.0
        with zero gradients, never NaN -- also with an empty vocabulary (``V == 0``); a valid label with
        ``V == 0`` is a bad label.

    Raises:
        TypeError: an argument of the wrong type (non-tensor inputs, non-float hidden, a weight/bias dtype that
            differs from hidden's, non-integer labels, ``shift`` / ``validate`` / ``sequence_parallel`` not a
            bool, ``ignore_index`` not an int, ``num_items`` not a number or tensor). The message names it.
        ValueError: a bad shape or value (mismatched D, labels not ``hidden.shape[:-1]``, bias not ``(V,)``,
            ``shift=True`` without a sequence dimension, a label outside ``[0, V)`` other than ``ignore_index``
            when ``validate``, an unknown reduction/backend, ``label_smoothing`` outside [0, 1], negative or
            non-finite ``z_loss``, ``softcap <= 0``, ``ignore_index`` outside 64 bits, ``num_items`` negative /
            NaN / infinite, a ``tile_budget_mb`` or ``FUSED_LCE_TILE_MB`` that is not a number > 0, a backend
            that is not available or cannot run this problem (the message says why). The message names it.
        torch.OutOfMemoryError / RuntimeError: an allocation failed (the type the allocator raised); the message
            starts with "fused_lce: out of memory" and gives the sizes and the tile budget to lower.
        RuntimeError: a second-order derivative was asked for (``create_graph=True`` double backward, nested
            ``torch.func.grad``, ``hessian``, ``jvp`` / ``jacfwd``): the gradients come from fused kernels and
            are not differentiable; use ``F.cross_entropy(F.linear(...))`` for those.

    Tracing and transforms:
        * ``torch.compile`` (``fullgraph=True`` works): shapes and options are checked while tracing, but label
          VALUES are not (no host sync in a graph): a bad label gives that token a NaN loss. For a check that
          stays in the graph, return :func:`label_errors` ``(labels, V)`` from the compiled step and test it
          after the step. Meta / fake tensors likewise propagate shapes without value checks.
        * ``torch.func``: ``grad``, ``grad_and_value``, ``vjp``, ``jacrev`` and ``vmap`` (one op call per batch
          element; per-sample gradients with ``vmap(grad(...))``) work; forward mode and nested reverse mode
          raise (see Raises). The gradients ``torch.func`` returns are first-order values: do not differentiate
          them again with ``torch.autograd`` either.
        * double backward (``create_graph=True``): raises at backward.
    """
    call = _normalise(hidden, weight, labels, bias, ignore_index=ignore_index, reduction=reduction,
                      label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap, shift=shift,
                      num_items=num_items, process_group=process_group, sequence_parallel=sequence_parallel,
                      backend=backend, validate=validate, tile_budget_mb=tile_budget_mb)
    grad_on = torch.is_grad_enabled()
    grad_mask = [grad_on and call.hidden.requires_grad, grad_on and call.weight.requires_grad,
                 grad_on and call.bias is not None and call.bias.requires_grad]
    o = call.opts
    args = (call.hidden, call.weight, call.labels, call.bias, call.num_items, reduction,
            *(getattr(o, f) for f in OPTION_FIELDS), grad_mask)
    if _functorch_active():  # torch.func.grad / vjp / jacrev / vmap: a functorch-compatible autograd.Function
        loss, lse, correct, _, _, _ = ops.FuncForward.apply(*args)
    else:
        loss, lse, correct, _, _, _ = torch.ops.fused_lce.forward(*args)
    if reduction == "none":
        loss = _unshift(loss, call.labels_shape, call.out_shape)
    if not return_stats:
        return loss
    n_valid = (call.labels != ignore_index).sum()
    accuracy = correct.sum().to(torch.float32) / n_valid.clamp(min=1).to(torch.float32)
    return LCEOutput(loss, _unshift(lse, call.labels_shape, call.out_shape), accuracy, n_valid)


class _Call(NamedTuple):
    """A validated, flattened call of the op."""

    hidden: torch.Tensor  # (N, D), or (N / world, D) under sequence parallelism
    weight: torch.Tensor
    labels: torch.Tensor  # (N,), shifted when asked
    bias: Optional[torch.Tensor]
    num_items: Optional[torch.Tensor]
    opts: Options
    labels_shape: tuple  # shape of the (shifted) labels before flattening
    out_shape: tuple  # shape of a "none" loss


def _normalise(hidden, weight, labels, bias, *, ignore_index, reduction, label_smoothing, z_loss, softcap, shift,
               num_items, process_group, sequence_parallel, backend, validate, tile_budget_mb) -> _Call:
    """Check every argument (ValueError/TypeError naming it) and build the op's flattened inputs and Options."""
    _check_tensor("hidden", hidden)
    _check_tensor("weight", weight)
    _check_tensor("labels", labels)
    if not isinstance(sequence_parallel, bool):
        raise TypeError(f"sequence_parallel: expected a bool, got {type(sequence_parallel).__name__}")
    sp_world = 1
    if sequence_parallel:
        if process_group is None:
            raise ValueError("sequence_parallel=True: expected a process_group, got None")
        if hidden.dim() < 2:
            raise ValueError(f"hidden: sequence_parallel needs shape (T_local, ..., D), got {tuple(hidden.shape)}")
        # the op gathers the token rows itself and reduce-scatters dX (fused_lce.distributed.sp_gather_rows)
        sp_world = torch.distributed.get_world_size(process_group)
    if hidden.dtype not in _FLOATS:
        raise TypeError(f"hidden: expected dtype float32, bfloat16 or float16, got {hidden.dtype}")
    if hidden.dim() < 1:
        raise ValueError("hidden: expected shape (..., D) with at least one dimension, got a 0-dim tensor")
    d = hidden.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != d:
        raise ValueError(f"weight: expected shape (V, D) with D = hidden.shape[-1] = {d}, got {tuple(weight.shape)}")
    if labels.dtype not in _LABEL_DTYPES:
        raise TypeError(f"labels: expected an int64 or int32 tensor, got dtype {labels.dtype}")
    tokens = tuple(hidden.shape[:-1])
    if sp_world > 1:  # the labels of the whole group's tokens
        tokens = (hidden.shape[0] * sp_world,) + tokens[1:]
    if tuple(labels.shape) != tokens:
        what = "hidden.shape[:-1]" if sp_world == 1 else "(world * hidden.shape[0],) + hidden.shape[1:-1]"
        raise ValueError(f"labels: expected shape {what} = {tokens}, got {tuple(labels.shape)}")
    v = weight.shape[0]
    if bias is not None:
        _check_tensor("bias", bias)
        if tuple(bias.shape) != (v,):
            raise ValueError(f"bias: expected shape (V,) = ({v},), got {tuple(bias.shape)}")
    hidden, weight, bias = _common_dtype(hidden, weight, bias)
    for name, t in (("weight", weight), ("labels", labels), ("bias", bias)):
        if t is not None and t.device != hidden.device:
            raise ValueError(f"{name}: expected a tensor on hidden's device {hidden.device}, got {t.device}")
    if not isinstance(ignore_index, numbers.Integral) or isinstance(ignore_index, bool):
        raise TypeError(f"ignore_index: expected an int, got {type(ignore_index).__name__}")
    if not -2**63 <= int(ignore_index) < 2**63:
        raise ValueError(f"ignore_index: expected a 64-bit integer, got {ignore_index}")
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {REDUCTIONS}, got {reduction!r}")
    label_smoothing = _number("label_smoothing", label_smoothing)
    z_loss = _number("z_loss", z_loss)
    if softcap is not None:
        softcap = _number("softcap", softcap)
        if not softcap > 0.0 or softcap == float("inf"):
            raise ValueError(f"softcap: expected a finite value > 0 or None, got {softcap}")
    if not isinstance(shift, bool):
        raise TypeError(f"shift: expected a bool, got {type(shift).__name__} {shift!r} (it shifts by one position)")
    if not isinstance(validate, bool):
        raise TypeError(f"validate: expected a bool, got {type(validate).__name__}")
    if not isinstance(backend, str) or backend not in ("auto",) + registry.names():
        raise ValueError(f"backend: expected one of {('auto',) + registry.names()}, got {backend!r}")
    tile_bytes = _tile_bytes(tile_budget_mb)
    num_items_t = _num_items(num_items, hidden.device)

    out_shape = tuple(labels.shape)
    if shift:
        if hidden.dim() < 2:
            raise ValueError("shift=True: hidden needs a sequence dimension, expected shape (..., T, D), "
                             f"got {tuple(hidden.shape)}")
        # shift the labels, not the hidden states: position t is scored against label t+1 and the last
        # position against ignore_index, so hidden is used as is (no copy) and its last row gets zero gradient
        if labels.dtype == torch.int32 and not -2**31 <= ignore_index < 2**31:
            labels = labels.long()  # the ignore_index padding must be representable
        pad = torch.full_like(labels[..., :1], ignore_index)
        labels = torch.cat([labels[..., 1:], pad], dim=-1)
        out_shape = out_shape[:-1] + (max(out_shape[-1] - 1, 0),)

    group_name, vocab_start, vocab_total = "", 0, 0
    if process_group is not None:
        from . import distributed

        vocab_start, vocab_total = distributed.shard_layout(process_group, v)
        group_name = process_group.group_name
    total = vocab_total or v

    y = labels.reshape(-1)
    # explicit row count (reshape(-1, 0) is ambiguous when D == 0); under sequence parallelism hidden holds 1/world
    h2 = hidden.reshape(y.numel() // sp_world, d)
    if validate and y.numel() > 0 and not torch.compiler.is_compiling() and not _values_hidden(y):
        yv = _unwrapped(y)  # under vmap: the whole batch
        bad = (yv != ignore_index) & ((yv < 0) | (yv >= total))
        if bool(bad.any()):
            raise ValueError(f"labels: expected values in [0, {total}) or ignore_index={ignore_index}, "
                             f"got {int(yv[bad][0])}" + (" (the vocabulary is empty: V == 0)" if total == 0 else ""))
    opts = ops.make_options(int(ignore_index), label_smoothing, z_loss, softcap or 0.0, backend, group_name,
                            vocab_start, vocab_total, tile_bytes)
    return _Call(h2, weight, y, bias, num_items_t, opts, tuple(labels.shape), out_shape)


class LinearCrossEntropy(torch.nn.Module):
    """``nn.Module`` form of :func:`linear_cross_entropy`; the options (its keyword arguments) are fixed at
    construction, ``forward(hidden, weight, labels, bias=None)`` computes the loss. Unknown option names raise
    TypeError at construction; option values are checked by every forward call, which raises, returns and
    behaves under torch.compile / torch.func / double backward exactly as :func:`linear_cross_entropy` (see its
    Raises and Tracing sections): 0.0 with zero gradients when no label is valid, ``tile_budget_mb`` in MiB."""

    def __init__(self, **options):
        super().__init__()
        unknown = set(options) - _OPTION_NAMES
        if unknown:
            raise TypeError(f"LinearCrossEntropy: unexpected option(s) {sorted(unknown)}; "
                            f"expected any of {sorted(_OPTION_NAMES)}")
        self.options = options

    def forward(self, hidden, weight, labels, bias=None):
        return linear_cross_entropy(hidden, weight, labels, bias, **self.options)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items() if k != "process_group")


_OPTION_NAMES = {"ignore_index", "reduction", "label_smoothing", "z_loss", "softcap", "shift", "num_items",
                 "return_stats", "process_group", "sequence_parallel", "backend", "validate", "tile_budget_mb"}


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
    _check_tensor("labels", labels)
    if labels.dtype not in _LABEL_DTYPES:
        raise TypeError(f"labels: expected an int64 or int32 tensor, got dtype {labels.dtype}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < 0:
        raise ValueError(f"vocab_size: expected an int >= 0, got {vocab_size!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index: expected an int, got {type(ignore_index).__name__}")
    if not isinstance(shift, bool):
        raise TypeError(f"shift: expected a bool, got {type(shift).__name__}")
    y = labels[..., 1:] if shift and labels.dim() > 0 else labels
    bad = (y != ignore_index) & ((y < 0) | (y >= vocab_size))
    return bad.sum()


def backend_info() -> dict:
    """Which backends exist on this host: ``{name: {"available": bool, "reason": str | None, "devices": [...],
    "status": str | None}}``, plus ``"auto"``: the backend ``backend="auto"`` picks for a float32 problem on
    each device type present (a provider may still decline a particular shape: ``resolve`` then takes the next)."""
    info = registry.info()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if hasattr(torch, "npu"):
        devices.append("npu")
    info["auto"] = {dev: registry.auto_choice(dev) for dev in devices}
    return info


# ------------------------------------------------------------------------------------------------ helpers
def _check_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")


def _number(name, x) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(x).__name__}")
    return float(x)


def _values_hidden(t: torch.Tensor) -> bool:
    """Meta / fake tensors (tracing): shapes only, values cannot be checked."""
    return t.device.type == "meta" or (type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter))


def _unwrapped(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor under torch.func wrappers (vmap's batched / grad's tracking tensors), for value checks."""
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


def _functorch_active() -> bool:
    """True inside a torch.func transform; RuntimeError for what the op cannot do there (higher order)."""
    if torch.compiler.is_compiling():
        return False
    stack = torch._C._functorch.get_interpreter_stack()
    if not stack:
        return False
    kinds = [i.key() for i in stack]
    tt = torch._C._functorch.TransformType
    if tt.Jvp in kinds or kinds.count(tt.Grad) > 1:
        raise RuntimeError(ops.DOUBLE_BACKWARD)
    return True


def _tile_bytes(tile_budget_mb) -> int:
    """Bytes of logits tiles a provider may keep live: the argument, else env FUSED_LCE_TILE_MB, else 0 (each
    provider's default). Read here, once, so every provider means the same thing by it."""
    if tile_budget_mb is None:
        env = os.environ.get("FUSED_LCE_TILE_MB", "").strip()
        if not env:
            return 0
        try:
            value = float(env)
        except ValueError:
            value = float("nan")
        if not 0 < value < float("inf"):
            raise ValueError(f"FUSED_LCE_TILE_MB: expected a number of MiB > 0, got {env!r}")
    else:
        value = _number("tile_budget_mb", tile_budget_mb)
        if not 0 < value < float("inf"):
            raise ValueError(f"tile_budget_mb: expected a number of MiB > 0, got {value}")
    return max(1, int(value * 2**20))


def _num_items(num_items, device):
    if num_items is None:
        return None
    if isinstance(num_items, torch.Tensor):
        if num_items.numel() != 1:
            raise ValueError(f"num_items: expected a number or a one-element tensor, got shape "
                             f"{tuple(num_items.shape)}")
        return num_items.detach().reshape(()).to(device)  # its value is checked by the op (ops.check_num_items)
    if isinstance(num_items, bool) or not isinstance(num_items, numbers.Real):
        raise TypeError(f"num_items: expected None, a number or a one-element tensor, got {type(num_items).__name__}")
    if not 0 <= num_items < float("inf"):
        raise ValueError(f"num_items: expected a finite value >= 0, got {num_items}")
    return torch.tensor(float(num_items), device=device)


def _common_dtype(hidden, weight, bias):
    """Same dtype for all operands; under autocast the autocast dtype, as F.linear would use."""
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev) if dev in ("cpu", "cuda", "npu") else False:
        dt = torch.get_autocast_dtype(dev)
        cast = lambda t: t if t is None or t.dtype == dt else t.to(dt)  # noqa: E731
        return cast(hidden), cast(weight), cast(bias)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != hidden.dtype:
            raise TypeError(f"{name}: expected dtype {hidden.dtype} (same as hidden), got {t.dtype}")
    return hidden, weight, bias


def _unshift(t, shifted_shape, out_shape):
    t = t.reshape(shifted_shape)
    if tuple(shifted_shape) != tuple(out_shape):
        t = t[..., : out_shape[-1]]
    return t
