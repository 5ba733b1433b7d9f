"""torch_npu availability, shared by the two NPU providers (fused_lce/backends/npu.py, npu_cann.py). torch_npu is
imported on first use only: importing it registers the NPU device with torch."""
from __future__ import annotations

import importlib
import sys

import torch


def import_torch_npu():
    """torch_npu, imported on first use only (importing it registers the NPU device with torch)."""
    return sys.modules.get("torch_npu") or importlib.import_module("torch_npu")


def usable_torch_npu():
    """(torch_npu, None) when it imports and sees a device, else (None, the first failing step)."""
    try:
        tnpu = import_torch_npu()
    except Exception as e:
        return None, f"torch_npu is not importable ({type(e).__name__}: {e})"
    npu = getattr(torch, "npu", None)
    if npu is None:
        return None, "torch_npu imported but torch.npu is missing"
    try:
        if not npu.is_available() or npu.device_count() < 1:
            return None, "no NPU device visible (torch.npu.is_available() is False)"
    except Exception as e:  # driver / runtime errors surface here on hosts without a card
        return None, f"no NPU device visible ({type(e).__name__}: {e})"
    return tnpu, None
