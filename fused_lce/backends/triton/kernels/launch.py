"""Launches of the provider's Triton kernels without Triton's per-call binding.

``kernel[grid](*args, **kw)`` re-derives on every call what the compiled kernel depends on (each argument's type,
a pointer's 16-byte alignment, a specialised integer's value 1 / multiple of 16), builds its cache key from that,
looks the kernel up and assembles launch metadata for launch hooks: on the H200's host ~50 of the ~70 us that one
launch of the logits GEMM took (``benchmarks/launch_probe.py``), host time the device waits through when the launch
starts a step. ``fast(kernel)[grid](...)`` keeps its own cache keyed by the same properties, read straight from the
arguments by the rules of Triton's specialisation (``native_specialize_impl``: its tensor, tensor-descriptor, int,
float and bool cases), so an entry is the compiled kernel Triton's own lookup gives for those arguments (a CUDA test
checks that it is the same object), and calls that kernel's launcher. Triton's own path runs instead for a key's
first call (it compiles), with a launch hook installed (profilers see every launch), under the interpreter, for an
argument kind outside those cases, with a Triton version whose launch path was not checked (``VERIFIED``) and with
``FUSED_LCE_TRITON_DIRECT=0``; ``=check`` also asks Triton's lookup on every direct launch and raises where it
gives another kernel (what the CUDA suite runs under).
"""
from __future__ import annotations

import os

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

VERIFIED = ("3.6.",)  # Triton versions whose JITFunction.run / launcher signature and specialisation this follows
_OK = triton.__version__.startswith(VERIFIED)

try:
    from triton import knobs as _knobs
    from triton.runtime import driver as _driver
    from triton.runtime.jit import JITFunction as _JIT
except ImportError:  # pragma: no cover - an older Triton: its own launch path
    _OK = False


def _hooked() -> bool:
    """A launch hook is installed (a HookChain with calls, or a plain function on older Tritons)."""
    rt = _knobs.runtime
    return any(getattr(h, "calls", h) for h in (rt.launch_enter_hook, rt.launch_exit_hook))


# how Triton specialises a parameter (``KernelParam``): its value is a constexpr; values and pointer alignment;
# neither (do_not_specialize); the value but not the alignment; a typed parameter (not handled here)
_CONST, _FULL, _NONE, _NO_ALIGN, _TYPED = range(5)


def _kind(p) -> int:
    if p.is_constexpr:
        return _CONST
    if p.annotation_type:
        return _TYPED
    if p.do_not_specialize:
        return _NONE
    return _NO_ALIGN if p.do_not_specialize_on_alignment else _FULL


class _Fast:
    def __init__(self, fn):
        self.fn = fn
        params = tuple(getattr(fn, "params", ()))
        self.names = tuple(p.name for p in params)
        self.kinds = tuple(_kind(p) for p in params)
        self.name_set = frozenset(self.names)
        self.cache: dict = {}
        self.on = _OK and isinstance(fn, _JIT) and _TYPED not in self.kinds
        self.direct = 0  # launches that took the direct path (tests read it)

    def key(self, args: tuple, kwargs: dict, device: int):
        """(key, arguments in parameter order) of a call on ``device``, or None where Triton's own path must run.
        Per argument what Triton's ``native_specialize_impl`` reads: a tensor's dtype and 16-byte alignment, a
        tensor descriptor's dtype and block shape, an integer's width (and, specialised, whether it is 1 or a
        multiple of 16), a float or bool as such; a constexpr's value; the launch options."""
        try:
            full = args + tuple([kwargs[k] for k in self.names[len(args):]])
        except KeyError:
            return None
        if len(full) != len(self.names):
            return None
        parts = []
        add = parts.append
        for kind, x in zip(self.kinds, full):
            t = type(x)
            if kind == _CONST:
                add(x)
            elif t is torch.Tensor or t is torch.nn.Parameter:
                add((x.dtype, x.data_ptr() & 15 == 0) if kind == _FULL else (x.dtype, kind))
            elif t is int:  # i32, i64 or u64 by value
                width = 0 if -0x80000000 <= x <= 0x7FFFFFFF else (1 if x < 2**63 else 2)
                add(width if kind == _NONE else (width, x == 1, kind == _FULL and x & 15 == 0))
            elif t is TensorDescriptor:
                add((x.base.dtype, tuple(x.block_shape)))
            elif t is float or t is bool:
                add(t)
            else:
                return None
        opts = tuple([(k, v) for k, v in kwargs.items() if k not in self.name_set])
        mode = getattr(_knobs.compilation, "instrumentation_mode", None)
        return (device, opts, self.fn.debug, _knobs.runtime.debug, mode, tuple(parts)), full

    def launch(self, grid: tuple, args: tuple, kwargs: dict) -> None:
        mode = os.environ.get("FUSED_LCE_TRITON_DIRECT", "1")
        got = None
        if self.on and mode != "0" and not callable(grid) and not self.fn.pre_run_hooks and not _hooked():
            got = self.key(args, kwargs, _driver.active.get_current_device())
        if got is None:
            self.fn[grid](*args, **kwargs)
            return
        key, full = got
        k = self.cache.get(key)
        if k is None:  # Triton compiles (or finds) the kernel and launches it; later calls of the key come here
            k = self.fn[grid](*args, **kwargs)
            if hasattr(k, "packed_metadata"):
                self.cache[key] = k
            return
        if mode == "check":  # the kernel Triton's own lookup gives for these arguments (no launch)
            want = self.fn.run(*args, grid=grid, warmup=True, **kwargs)
            if want is not k:
                raise RuntimeError(f"fused_lce: the direct launch of {self.fn.__name__} picked another compiled "
                                   "kernel than Triton's lookup")
        self.direct += 1
        g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
        k.run(g0, g1, g2, _driver.active.get_current_stream(key[0]), k.function, k.packed_metadata, None, None,
              None, *full)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)


_FAST: dict = {}


def fast(fn) -> _Fast:
    """``fn``'s direct launcher (one per kernel: its cache lives as long as the process)."""
    f = _FAST.get(fn)
    if f is None:
        f = _FAST[fn] = _Fast(fn)
    return f
