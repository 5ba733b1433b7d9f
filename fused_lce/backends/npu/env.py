"""What an NPU host has installed, shared by the two NPU providers (provider.py, cann.py): torch_npu with a device,
and this project's custom OPP package. torch_npu is imported on first use only: importing it registers the NPU
device with torch."""
from __future__ import annotations

import importlib
import os
import sys
from typing import Optional

import torch

OPP_VENDOR = "fused_lce"  # cmake/ascend_opp.cmake FUSED_LCE_OPP_VENDOR, cmake/npu_build.py OPP_VENDOR


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


def platform_id(device) -> str:
    """What a self-check verdict on an NPU depends on besides the kernels: torch_npu's version, the CANN toolkit it
    runs with, the device's name."""
    from importlib import metadata

    from ...core import device_name

    try:
        tnpu = metadata.version("torch_npu")
    except metadata.PackageNotFoundError:
        tnpu = "?"
    return f"torch_npu {tnpu}|CANN {os.environ.get('ASCEND_HOME_PATH', '?')}|{device_name(device)}"


NEVER_ON_HARDWARE = "never run on NPU hardware by this project's tests"


def find_custom_opp(env: Optional[dict] = None) -> tuple[Optional[str], str]:
    """(path of the package's libcust_opapi.so, where it was looked for). ASCEND_CUSTOM_OPP_PATH is the
    ':'-separated list of vendor directories that the package's ``bin/set_env.bash`` extends; a package
    installed into the toolkit lives in ``$ASCEND_OPP_PATH/vendors/fused_lce``."""
    env = os.environ if env is None else env
    dirs = [p for p in env.get("ASCEND_CUSTOM_OPP_PATH", "").split(":") if p]
    if env.get("ASCEND_OPP_PATH"):
        dirs.append(os.path.join(env["ASCEND_OPP_PATH"], "vendors", OPP_VENDOR))
    for d in dirs:
        if os.path.basename(os.path.normpath(d)) != OPP_VENDOR:
            continue
        lib = os.path.join(d, "op_api", "lib", "libcust_opapi.so")
        if os.path.isfile(lib):
            return lib, d
    where = f"ASCEND_CUSTOM_OPP_PATH={env.get('ASCEND_CUSTOM_OPP_PATH', '')!r}"
    return None, where
