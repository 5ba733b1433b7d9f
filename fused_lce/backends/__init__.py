"""Backend registry: one module per backend, imported lazily so that ``import fused_lce`` never needs CUDA,
Triton, torch_npu or a compiler. ``auto`` picks, per device, the first available backend in AUTO_ORDER."""
from __future__ import annotations

import importlib
import os
from typing import Optional

import torch

from .base import Backend, Config, ForwardResult

# name -> module that defines BACKEND
MODULES = {
    "torch": "fused_lce.backends.torch_ref",
    "cpp": "fused_lce.backends.cpp_cpu",
    "triton": "fused_lce.backends.triton_cuda",
    "npu": "fused_lce.backends.npu_ascendc",
    "npu_cann": "fused_lce.backends.npu_cann",
}
AUTO_ORDER = {
    "cpu": ("cpp", "torch"),
    "cuda": ("triton", "torch"),
    "npu": ("npu", "npu_cann", "torch"),
}
NAMES = tuple(MODULES)

_loaded: dict[str, Backend] = {}
_failed: dict[str, str] = {}


def load(name: str) -> Optional[Backend]:
    """The backend object, or None if its module could not be imported (reason in ``_failed``)."""
    if name in _loaded:
        return _loaded[name]
    if name in _failed:
        return None
    try:
        backend = importlib.import_module(MODULES[name]).BACKEND
    except Exception as e:  # a missing optional dependency must never break import fused_lce
        _failed[name] = f"{type(e).__name__}: {e}"
        return None
    _loaded[name] = backend
    return backend


def unavailable_reason(name: str) -> Optional[str]:
    backend = load(name)
    if backend is None:
        return f"could not be imported ({_failed[name]})"
    return backend.unavailable_reason()


def info() -> dict[str, dict]:
    out = {}
    for name in NAMES:
        reason = unavailable_reason(name)
        backend = _loaded.get(name)
        out[name] = {
            "available": reason is None,
            "reason": reason,
            "devices": list(backend.device_types) if backend and backend.device_types else ["any"],
            # what has been verified of this backend, where that differs from "tested here" (e.g. NPU kernels)
            "status": getattr(backend, "status", None),
        }
    return out


def resolve(requested: str, device: torch.device, cfg: Config, dtype: torch.dtype) -> Backend:
    """The backend to run for ``requested`` ("auto" or a name); ValueError saying why when it cannot run."""
    if requested == "auto":
        requested = os.environ.get("FUSED_LCE_BACKEND", "auto") or "auto"
        if requested != "auto" and requested not in MODULES:
            raise ValueError(f"FUSED_LCE_BACKEND: expected one of {('auto',) + NAMES}, got {requested!r}")
    if requested != "auto":
        reason = unavailable_reason(requested)
        if reason is None:
            reason = _loaded[requested].unsupported_reason(device, cfg, dtype)
        if reason is not None:
            raise ValueError(f"backend={requested!r} is not available: {reason}")
        return _loaded[requested]
    reasons = []
    for name in AUTO_ORDER.get(device.type, ("torch",)):
        reason = unavailable_reason(name) or _loaded[name].unsupported_reason(device, cfg, dtype)
        if reason is None:
            return _loaded[name]
        reasons.append(f"{name}: {reason}")
    raise ValueError("backend='auto': no backend can run this problem (" + "; ".join(reasons) + ")")


__all__ = ["Backend", "Config", "ForwardResult", "NAMES", "load", "info", "resolve"]
