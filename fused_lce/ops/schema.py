"""Op schemas generated from ``Options``, and op arguments bound by name.

Every public op's schema is ``name(<tensors and per-op arguments>, <options block>, <tail>) -> <outputs>``;
the options block is the ``Options`` fields of its family (``LOSS`` or ``LOGPROBS``) in declaration order, so
an option added to ``Options`` reaches every op's schema, checks and kernels without touching this package.
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
    return ", ".join(f"{_SCHEMA_TYPES[f.type]} {f.name}" for f in dataclasses.fields(Options)
                     if f.name in names)


def _py_any_requires_grad(*args) -> bool:
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


# the test torch's own register_autograd kernel makes, in C++ (private, so with the Python fallback): part of
# the host time the Autograd kernel below saves
_any_requires_grad = getattr(torch._C, "_any_requires_grad", _py_any_requires_grad)


class OpSchema:
    """One op of the ``fused_lce`` library: its schema (defined on ``lib``) and its arguments by name."""

    def __init__(self, lib: torch.library.Library, name: str, head: str, family: str, tail: str,
                 returns: str):
        self.name = name
        self.schema = f"{name}({', '.join(x for x in (head, options_block(family), tail) if x)}) -> {returns}"
        lib.define(self.schema)
        # torch's schema parser (private; torch.library has no public one and parses with it too)
        self.arg_names = tuple(a.name for a in torch._C.parse_schema(f"fused_lce::{self.schema}").arguments)
        self.option_names = op_fields(family)

    def bind(self, args: tuple) -> dict[str, Any]:
        """The op's positional arguments (as kernels, fake kernels and ``setup_context`` receive them) by
        name."""
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

    def register_autograd(self, lib: torch.library.Library, backward, setup_context) -> None:
        """The op's Autograd kernel, in place of the public ``torch.library.register_autograd(op, backward,
        setup_context=...)``: the same ``autograd.Function`` around the op's kernels below the Autograd key
        (for inputs that need gradients), less one step. torch's re-adds the arguments the dispatcher
        dropped for equalling their defaults, walking the schema's argument list once per argument on every
        call; these schemas declare no defaults, so every argument arrives as passed. Measured: ~150 us of
        host time per call of these ~20-argument ops on an H200's host (yappi, a log-prob step at 2048 x
        1536), spent while the device waits for the next kernel; on a CPU host with torch 2.13, 124 -> 33 us
        per call of a 20-argument toy op with gradients. The price is private API (``_after_autograd_keyset``,
        ``_AutoDispatchBelowAutograd``, ``redispatch``). Refused (torch's kernel handles them, this one does
        not): defaults, keyword-only arguments, tensor lists and aliasing (out / in-place) arguments. Neither
        kernel works inside torch.func transforms (no ``setup_context`` staticmethod), hence
        ``func_function``."""
        for a in self.op._schema.arguments:
            if (a.has_default_value() or a.kwarg_only or a.alias_info is not None
                    or ("List" in str(a.type) and "Tensor" in str(a.type))):
                raise TypeError(f"{self.name}: argument {a.name} ({a.type}) needs "
                                "torch.library.register_autograd (a default, keyword-only, tensor-list or "
                                "aliasing argument)")
        op = self.op
        below = torch._C._after_autograd_keyset

        def forward(ctx, *args):
            *args, keyset = args
            with torch._C._AutoDispatchBelowAutograd():
                out = op.redispatch(keyset & below, *args)
            setup_context(ctx, tuple(args), out)
            return out

        def backward_(ctx, *grads):
            wanted = ctx.needs_input_grad
            ctx.needs_input_grad = wanted[:-1]  # the trailing key set is no input of the op
            try:
                r = backward(ctx, *grads)
                return (*r, None) if isinstance(r, tuple) else (r, None)
            finally:
                ctx.needs_input_grad = wanted

        # torch's name
        fn = type(f"GeneratedBackwardFor_fused_lce_{self.name}_default", (torch.autograd.Function,),
                  {"forward": staticmethod(forward), "backward": staticmethod(backward_)})

        def kernel(keyset, *args):
            if torch.is_grad_enabled() and _any_requires_grad(*args):
                return fn.apply(*args, keyset)
            with torch._C._AutoDispatchBelowAutograd():
                return op.redispatch(keyset & below, *args)

        lib.impl(self.name, kernel, "Autograd", with_keyset=True)

    def func_function(self, backward, setup_context) -> type:
        """The op as an ``autograd.Function`` with a ``setup_context`` staticmethod, which torch.func
        transforms (``grad``, ``grad_and_value``, ``vjp``, ``jacrev``, ``vmap``) accept where they refuse the
        ctx-style Autograd kernel above: the public API calls the op through it while a transform is active.
        ``backward`` is the Autograd kernel's formula: torch.func.grad runs the engine with create_graph=True
        by design, and ``fused_lce.api`` rejects nested grad levels and forward mode before the forward runs,
        so it is a first-order gradient."""
        op = self.op

        def forward(*args):
            return op(*args)

        return type(f"Func_{self.name}", (torch.autograd.Function,), {
            "generate_vmap_rule": True,  # vmap of forward / backward reaches the ops' vmap rules
            "forward": staticmethod(forward), "setup_context": staticmethod(setup_context),
            "backward": staticmethod(backward)})

    def register_vmap(self, lib: torch.library.Library, n_out: int) -> None:
        """vmap of the op: one call per batch element, outputs stacked along dim 0 (each element is an
        independent problem with its own reduction, so the rows cannot simply be folded together)."""
        op = self.op

        def rule(info, in_dims, *args):
            if info.batch_size == 0:
                raise ValueError("fused_lce: vmap over a dimension of size 0 is not supported "
                                 "(no problem to run)")
            outs = [op(*(a.select(d, b) if isinstance(a, torch.Tensor) and d is not None else a
                         for a, d in zip(args, in_dims))) for b in range(info.batch_size)]
            return tuple(torch.stack([o[k] for o in outs]) for k in range(n_out)), (0,) * n_out

        torch.library.register_vmap(f"fused_lce::{self.name}", rule, lib=lib)
