"""A per-token formula as one kernel on CUDA: ``torch.compile`` of the same function, eager everywhere else.

The formulas that turn statistics into log-probs and gradient coefficients are a dozen or two small elementwise ops
over N tokens. On the GPU each costs a launch and ~10-20 us of host time, and between a log-prob forward and its
backward the device waits for all of them (the H200's host: 233 us eager vs 63 us compiled for the forward's
outputs, 157 vs 55 for the backward's coefficients). Compiled, the ops fuse into one Triton kernel; the numbers
are those of the eager ops up to their rounding of ``log`` and division (an ulp).

``FUSED_LCE_COMPILE=0`` keeps them eager. A compiled function that fails (no working Triton or C compiler, a
dynamo limit) is reported once with a warning and the eager function used from then on in this process. Not
compiled: while a CUDA graph is being captured (the first call may compile and benchmark kernels), while torch.compile
traces, and under functorch transforms. A compiled function runs with autograd off (the formulas run inside the
ops' kernels, on non-differentiable statistics): one compiled variant per flag combination, not two per grad mode.
"""
from __future__ import annotations

import functools
import os
import warnings

import torch

ENV = "FUSED_LCE_COMPILE"
DEVICE_TYPES = {"cuda"}  # where compiling pays (tests add "cpu" to run the compiled path in CI)


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def one_kernel(fn):
    """``fn`` (tensors, ints and bools in; per-token tensors out), compiled on first use on a device of
    ``DEVICE_TYPES`` (dynamic shapes: the token count and integer options do not recompile)."""
    state = {"compiled": None, "broken": None}

    @functools.wraps(fn)
    def run(*args):
        t = next(a for a in args if isinstance(a, torch.Tensor))
        if (state["broken"] is not None or t.device.type not in DEVICE_TYPES or not enabled()
                or torch.compiler.is_compiling() or torch._C._functorch.is_functorch_wrapped_tensor(t)
                or (t.is_cuda and torch.cuda.is_current_stream_capturing())):
            return fn(*args)
        if state["compiled"] is None:
            state["compiled"] = torch.compile(fn, dynamic=True, options={"compile_threads": 1})
        try:
            with torch.no_grad():
                return state["compiled"](*args)
        except Exception as e:  # noqa: BLE001  (the eager call below raises a genuine error again)
            state["broken"] = f"{type(e).__name__}: {e}"
            warnings.warn(f"fused_lce: torch.compile of {fn.__name__} failed, running it eagerly from now on "
                          f"(set {ENV}=0 to skip the attempt): {state['broken'][:500]}", RuntimeWarning,
                          stacklevel=2)
            return fn(*args)

    run.eager = fn
    run.state = state
    return run
