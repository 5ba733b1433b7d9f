"""Op schemas generated from ``Options``, and op arguments bound by name.

Every public op's schema is ``name(<tensors and per-op arguments>, <options block>, <tail>) -> <outputs>``; the
options block is the ``Options`` fields of its family (``LOSS`` or ``LOGPROBS``) in declaration order, so an
option added to ``Options`` reaches every op's schema, checks and kernels without touching this package.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..core import validate
from ..core.types import Options, op_fields

_SCHEMA_TYPES = {"int": "int", "float": "float", "str": "str", "bool": "bool"}


def options_block(family: str) -> str:
    """``"int ignore_index, float label_smoothing, ..."``: the options block of the ``family`` schemas."""
    names = op_fields(family)
    return ", ".join(f"{_SCHEMA_TYPES[f.type]} {f.name}" for f in dataclasses.fields(Options) if f.name in names)


class OpSchema:
    """One op of the ``fused_lce`` library: its schema (defined on ``lib``) and its arguments by name."""

    def __init__(self, lib: torch.library.Library, name: str, head: str, family: str, tail: str, returns: str):
        self.name = name
        self.schema = f"{name}({', '.join(x for x in (head, options_block(family), tail) if x)}) -> {returns}"
        lib.define(self.schema)
        self.arg_names = tuple(a.name for a in torch._C.parse_schema(f"fused_lce::{self.schema}").arguments)
        self.option_names = op_fields(family)

    def bind(self, args: tuple) -> dict[str, Any]:
        """The op's positional arguments (as kernels, fake kernels and ``setup_context`` receive them) by name."""
        return dict(zip(self.arg_names, args))

    def options(self, bound: dict[str, Any]) -> Options:
        """The checked ``Options`` of a bound call."""
        return validate.options({f: bound[f] for f in self.option_names})

    def args(self, **values) -> tuple:
        """Positional arguments in schema order from keyword values (every argument given)."""
        return tuple(values[n] for n in self.arg_names)

    @property
    def op(self):
        return getattr(torch.ops.fused_lce, self.name).default
