"""Every input check, once: a bad value raises ValueError / TypeError naming the argument and what was
expected.

The registered ops check what reaches them (``options``, ``problem``, ``per_token``, ``num_items_tensor``), so
they are safe to call directly; the public functions of ``fused_lce.api`` check only what the ops cannot see
(the unflattened shapes, ``shift``, Python-side types such as ``process_group`` or a ``num_items`` number) and
leave the rest to the op.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
from typing import Optional

import torch

from . import distributed, registry
from .types import Options

REDUCTIONS = ("mean", "sum", "none")
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
LABEL_DTYPES = (torch.int64, torch.int32)
_TYPES = {"int": (int, "an int"), "float": ((int, float), "a float"), "str": (str, "a str"),
          "bool": (bool, "a bool")}


# ------------------------------------------------------------------------------------------------ op inputs
# the Options of recent option values (each op call checks ~15 of them: host time per call)
_CHECKED: dict = {}


def options(values: dict) -> Options:
    """The ``Options`` of an op call from its bound arguments (every field present in ``values``; absent
    fields keep their defaults), type- and range-checked field by field from the field's own metadata."""
    key = tuple((k, type(x), x) for k, x in values.items())
    try:
        o = _CHECKED.get(key)
    except TypeError:  # an unhashable value: checked (and refused) below
        key, o = None, None
    if o is None:
        o = _checked_options(values)
        if key is not None and len(_CHECKED) < 256:
            _CHECKED[key] = o
    backend(o.backend)  # the registry may have changed
    return o


def _checked_options(values: dict) -> Options:
    kept = {}
    for f in dataclasses.fields(Options):
        if f.name not in values:
            continue
        x = values[f.name]
        types, what = _TYPES[f.type]
        if (isinstance(x, bool) and f.type != "bool") or not isinstance(x, types):
            raise TypeError(f"{f.name}: expected {what}, got {type(x).__name__}")
        ok = f.metadata["ok"]
        if ok is not None and not ok(x):
            raise ValueError(f"{f.name}: expected {f.metadata['expect']}, got {x}")
        kept[f.name] = x
    return Options(**kept)


def backend(name) -> str:
    if not isinstance(name, str) or name not in ("auto",) + registry.names():
        raise ValueError(f"backend: expected one of {('auto',) + registry.names()}, got {name!r}")
    return name


def problem(hidden, weight, labels, bias, opts: Options, *, sequence_parallel_ok: bool = True):
    """Shapes, dtypes and devices of the tensors every op shares, and the vocabulary shard. Returns the
    process group of ``opts.group_name`` (resolved here, once per op call) or None."""
    for name, t in (("hidden", hidden), ("weight", weight), ("labels", labels)):
        tensor(name, t)
    if hidden.dim() != 2:
        raise ValueError(f"hidden: expected shape (N, D), got {tuple(hidden.shape)}")
    if hidden.dtype not in FLOATS:
        raise TypeError(f"hidden: expected dtype float32, bfloat16 or float16, got {hidden.dtype}")
    weight_shape(weight, hidden.shape[1])
    if weight.dtype != hidden.dtype:
        raise TypeError(f"weight: expected dtype {hidden.dtype} (same as hidden), got {weight.dtype}")
    label_dtype(labels)
    if bias is not None:
        tensor("bias", bias)
        if bias.dim() != 1 or bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias: expected shape (V,) = ({weight.shape[0]},), got {tuple(bias.shape)}")
        if bias.dtype != hidden.dtype:
            raise TypeError(f"bias: expected dtype {hidden.dtype} (same as hidden), got {bias.dtype}")
    for name, t in (("weight", weight), ("labels", labels), ("bias", bias)):
        if t is not None and t.device != hidden.device:
            raise ValueError(f"{name}: expected a tensor on hidden's device {hidden.device}, got {t.device}")
    group = None
    if opts.group_name:
        try:
            group = distributed.resolve_group(opts.group_name)
        except Exception as e:  # torch.distributed raises RuntimeError / ValueError depending on its state
            raise ValueError(f"group_name: no torch.distributed process group is registered under "
                             f"{opts.group_name!r} ({type(e).__name__}: {e})") from None
    rows = hidden.shape[0]
    world = torch.distributed.get_world_size(group) if group is not None and sequence_parallel_ok else 1
    if labels.dim() != 1 or labels.shape[0] not in (rows, rows * world):
        raise ValueError(f"labels: expected shape (N,) with N = hidden.shape[0] = {rows}, got "
                         f"{tuple(labels.shape)}")
    if group is None and (opts.vocab_start or opts.vocab_total not in (0, weight.shape[0])):
        raise ValueError(f"vocab_start/vocab_total: a vocabulary shard (vocab_start={opts.vocab_start}, "
                         f"vocab_total={opts.vocab_total}, weight.shape[0]={weight.shape[0]}) needs a "
                         "group_name; on one device use vocab_start=0, vocab_total=0")
    if opts.vocab_total and opts.vocab_start + weight.shape[0] > opts.vocab_total:
        raise ValueError(f"vocab_start/vocab_total: the shard [{opts.vocab_start}, "
                         f"{opts.vocab_start + weight.shape[0]}) exceeds vocab_total={opts.vocab_total}")
    return group


def label_dtype(labels) -> None:
    """Labels are int64 or int32 class ids (the ops, the public functions and ``label_errors`` check it
    here)."""
    if labels.dtype not in LABEL_DTYPES:
        raise TypeError(f"labels: expected dtype int64 or int32, got {labels.dtype}")


def label_range_error(labels: torch.Tensor, bad: torch.Tensor, ignore_index: int, vocab: int) -> ValueError:
    """The error for labels with a ``bad`` one (``fused_lce.core.formulas.classify_labels``)."""
    empty = " (the vocabulary is empty: V == 0)" if vocab == 0 else ""
    return ValueError(f"labels: expected values in [0, {vocab}) or ignore_index={ignore_index}, "
                      f"got {int(labels[bad][0])}{empty}")


def weight_shape(weight, d: int) -> None:
    if weight.dim() != 2 or weight.shape[1] != d:
        raise ValueError(f"weight: expected shape (V, D) with D = {d}, got {tuple(weight.shape)}")


def per_token(name: str, t, n: int, device) -> None:
    """A (N,) floating-point tensor on ``device`` (an upstream gradient, a saved statistic)."""
    tensor(name, t)
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"{name}: expected shape ({n},) (one value per token), got {tuple(t.shape)}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on hidden's device {device}, got {t.device}")


def grad_loss(t, reduction: str, n: int, device) -> None:
    """The upstream gradient of the loss output: (N,) for "none", one element otherwise."""
    if reduction == "none":
        return per_token("grad_loss", t, n, device)
    tensor("grad_loss", t)
    if t.numel() != 1 or not t.dtype.is_floating_point:
        raise ValueError("grad_loss: expected a one-element floating-point tensor for "
                         f"reduction={reduction!r}, got shape {tuple(t.shape)} and dtype {t.dtype}")
    if t.device != device:
        raise ValueError(f"grad_loss: expected a tensor on hidden's device {device}, got {t.device}")


def reduction(value) -> str:
    if not isinstance(value, str) or value not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {REDUCTIONS}, got {value!r}")
    return value


def grad_mask(mask) -> None:
    if len(mask) != 3:
        raise ValueError(f"grad_mask: expected 3 bools (hidden, weight, bias), got {list(mask)}")


def num_items_tensor(t, device) -> None:
    """``num_items`` as the ops take it: None or a one-element real tensor holding a finite value >= 0 (its
    value is read with one host sync, except while tracing)."""
    if t is None:
        return
    tensor("num_items", t)
    if t.numel() != 1:
        raise ValueError(f"num_items: expected a one-element tensor, got shape {tuple(t.shape)}")
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"num_items: expected a real number, got dtype {t.dtype}")
    if t.device.type == "meta" and device.type != "meta":
        raise ValueError("num_items: a meta tensor has no value; pass a number or a tensor on a real device")
    if not values_hidden(t) and not torch.compiler.is_compiling():
        value = float(t.detach().reshape(()).to("cpu", torch.float64))
        _num_items_value(value)


def _num_items_value(value: float) -> None:
    if not value >= 0 or value == math.inf:  # NaN fails too
        raise ValueError(f"num_items: expected a finite value >= 0, got {value}")
    if 0 < value < 2.0**-126:  # 1 / num_items must be a finite float32, as the loss is
        raise ValueError(f"num_items: expected 0 or a value >= 2**-126 (its inverse scales a float32 loss), "
                         f"got {value}")


# ------------------------------------------------------------------------------------------ public arguments
def tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")


def number(name: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(x).__name__}")
    try:
        return float(x)
    except OverflowError:
        raise ValueError(f"{name}: expected a value representable as a float, got {x}") from None


def flag(name: str, x) -> bool:
    if not isinstance(x, bool):
        raise TypeError(f"{name}: expected a bool, got {type(x).__name__}")
    return x


def integer(name: str, x) -> int:
    """A Python / NumPy integer that fits the ops' 64-bit ``int``."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(x).__name__}")
    if not -2**63 <= int(x) < 2**63:
        raise ValueError(f"{name}: expected a 64-bit integer, got {x}")
    return int(x)


def process_group(group):
    """A ``torch.distributed`` ProcessGroup or None."""
    if group is None:
        return None
    if not torch.distributed.is_available() or not isinstance(group, torch.distributed.ProcessGroup):
        raise TypeError(f"process_group: expected a torch.distributed.ProcessGroup or None, got "
                        f"{type(group).__name__}")
    return group


def num_items(x, device) -> Optional[torch.Tensor]:
    """``num_items`` of the public API: None, a finite number >= 0 or a one-element tensor (checked by the
    op)."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError("num_items: expected a number or a one-element tensor, got shape "
                             f"{tuple(x.shape)}")
        if x.device.type == "meta" and device.type != "meta":
            raise ValueError("num_items: a meta tensor has no value; pass a number or a tensor "
                             "on a real device")
        return x.detach().reshape(()).to(device)
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"num_items: expected None, a number or a one-element tensor, got {type(x).__name__}")
    value = number("num_items", x)
    _num_items_value(value)
    return torch.tensor(value, device=device)


def tile_bytes(tile_budget_mb) -> int:
    """Bytes of logits tiles a provider may keep live: the argument, else env FUSED_LCE_TILE_MB, else 0 (each
    provider's default). Read here, once, so every provider means the same thing by it."""
    if tile_budget_mb is None:
        env = os.environ.get("FUSED_LCE_TILE_MB", "").strip()
        if not env:
            return 0
        try:
            value = float(env)
        except ValueError:
            value = math.nan
        if not 0 < value < math.inf:
            raise ValueError(f"FUSED_LCE_TILE_MB: expected a number of MiB > 0, got {env!r}")
    else:
        value = number("tile_budget_mb", tile_budget_mb)
        if not 0 < value < math.inf:
            raise ValueError(f"tile_budget_mb: expected a number of MiB > 0, got {value}")
    return max(1, min(int(value * 2**20), 2**62))


def values_hidden(t: torch.Tensor) -> bool:
    """Meta / fake / functional tensors (tracing): shapes only, values cannot be checked."""
    return t.device.type == "meta" or (type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter))
