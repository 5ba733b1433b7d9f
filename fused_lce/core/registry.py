"""The provider registry: which providers exist, which one runs a problem, and why the others do not.

Provider modules live in ``fused_lce/backends/<name>`` (the name is the ``backend=`` string; each module has a
``PROVIDER``) and are imported lazily, so ``import fused_lce`` never needs CUDA, Triton, torch_npu or a
compiler. ``auto`` takes, per device type, the first provider in ``AUTO_ORDER`` that is available and
``supports`` the problem. ``AUTO_ORDER`` is also the one list of the device types the project knows.
"""
from __future__ import annotations

import importlib
import os
from typing import Optional

import torch

from .provider import Provider
from .types import Problem

NAMES = ("torch", "cpp", "triton", "npu", "npu_cann")
AUTO_ORDER = {
    "cpu": ("cpp", "torch"),
    "cuda": ("triton", "torch"),
    "npu": ("npu", "npu_cann", "torch"),
}


def present_device_types() -> list[str]:
    """The device types of ``AUTO_ORDER`` that this process can use now (CPU always; an accelerator when its
    torch module says a device is there; "npu" only once torch_npu has been imported by someone)."""
    out = []
    for dev in AUTO_ORDER:
        mod = getattr(torch, dev, None)
        try:
            if dev == "cpu" or (mod is not None and mod.is_available()):
                out.append(dev)
        except Exception:  # a driver / runtime error means "not usable here"
            pass
    return out


_loaded: dict[str, Provider] = {}
_failed: dict[str, str] = {}
_extra: dict[str, Provider] = {}  # registered at run time (tests: the AscendC kernels on the CPU twin)


def register(provider: Provider) -> None:
    """Make ``provider`` selectable as ``backend=provider.name`` (not part of ``auto``)."""
    _extra[provider.name] = provider


def unregister(name: str) -> None:
    _extra.pop(name, None)


def names() -> tuple[str, ...]:
    return NAMES + tuple(n for n in _extra if n not in NAMES)


def load(name: str) -> Optional[Provider]:
    """The provider object, or None if its module could not be imported (reason in ``_failed``)."""
    if name in _extra:
        return _extra[name]
    if name in _loaded:
        return _loaded[name]
    if name in _failed:
        return None
    try:
        provider = importlib.import_module(f"fused_lce.backends.{name}").PROVIDER
    except Exception as e:  # a missing optional dependency must never break import fused_lce
        _failed[name] = f"{type(e).__name__}: {e}"
        return None
    _loaded[name] = provider
    return provider


def unavailable_reason(name: str) -> Optional[str]:
    provider = load(name)
    if provider is None:
        return f"could not be imported ({_failed[name]})"
    return provider.unavailable_reason()


def info() -> dict[str, dict]:
    from . import selfcheck

    out = {}
    for name in names():
        reason = unavailable_reason(name)
        provider = load(name)
        if reason is None:  # verdicts on this host's devices from the disk cache too (no battery runs here)
            for dev in _checked_devices(provider):
                selfcheck.recorded(provider, dev)
        verdicts = selfcheck.known().get(name, {})
        failed = [f"{dev}: {v}" for dev, v in verdicts.items() if v != "passed"]
        if reason is None and failed:
            reason = "failed its first-use self-check (" + "; ".join(failed) + ")"
        out[name] = {
            "available": reason is None,
            "reason": reason,
            "devices": list(provider.device_types) if provider and provider.device_types else ["any"],
            # what has been verified of this provider, where that differs from "tested here" (e.g. NPU
            # kernels)
            "status": getattr(provider, "status", None),
            # first-use self-checks this process ran or read (fused_lce.core.selfcheck): {device: verdict}
            "selfcheck": verdicts,
        }
    return out


def _checked_devices(provider: Provider) -> list:
    """Device 0 of each present device type where the provider must pass the first-use self-check."""
    from . import selfcheck

    out = []
    for dev in present_device_types():
        if provider.device_types is None or dev in provider.device_types:
            device = torch.device(dev) if dev == "cpu" else torch.device(dev, 0)
            if selfcheck.mode() != "off" and provider.needs_check(device) is not None:
                out.append(device)
    return out


def _failed_check(name: str, device_type: str) -> bool:
    """Whether provider ``name`` holds a failed self-check verdict for device 0 of ``device_type`` (this
    process's or the disk cache's; none is run)."""
    from . import selfcheck

    provider = load(name)
    dev = [d for d in _checked_devices(provider) if d.type == device_type]
    v = selfcheck.recorded(provider, dev[0]) if dev else None
    return v is not None and not v.ok


def why_not(name: str, p: Problem) -> Optional[str]:
    """None when provider ``name`` can run ``p`` here, else why not (unavailable, declines the problem, or
    failed its first-use self-check on the problem's device)."""
    from . import selfcheck

    return unavailable_reason(name) or load(name).supports(p) or selfcheck.failure(load(name), p.device)


ENV_HINT = "unset it (`unset FUSED_LCE_BACKEND`) to let backend='auto' choose"


def env_backend() -> str:
    """``FUSED_LCE_BACKEND`` ("auto" when unset); ValueError naming the variable when it is not a provider."""
    requested = os.environ.get("FUSED_LCE_BACKEND", "").strip() or "auto"
    if requested != "auto" and requested not in names():
        raise ValueError(f"FUSED_LCE_BACKEND: expected one of {('auto',) + names()}, got {requested!r}; "
                         f"{ENV_HINT}")
    return requested


def resolve(requested: str, p: Problem) -> Provider:
    """The provider for ``requested`` ("auto" or a name); ValueError saying why when none can run ``p``."""
    from_env = requested == "auto"
    if from_env:
        requested = env_backend()
    if requested != "auto":
        reason = why_not(requested, p)
        if reason is not None:
            if from_env:
                raise ValueError(f"FUSED_LCE_BACKEND={requested!r} (set in the environment) cannot run this "
                                 f"problem: {reason}; {ENV_HINT}")
            raise ValueError(f"backend={requested!r} is not available: {reason}")
        return load(requested)
    reasons = []
    for name in AUTO_ORDER.get(p.device.type, ("torch",)):
        reason = why_not(name, p)
        if reason is None:
            return load(name)
        reasons.append(f"{name}: {reason}")
    raise ValueError("backend='auto': no backend can run this problem (" + "; ".join(reasons) + ")")


def auto_choice(device_type: str, p: Optional[Problem] = None) -> str:
    """The provider ``auto`` picks for a device type (for a default float32 problem when ``p`` is None)."""
    for name in AUTO_ORDER.get(device_type, ("torch",)):
        if unavailable_reason(name) is None and (p is None or load(name).supports(p) is None) \
                and not _failed_check(name, device_type):
            return name
    return "torch"
