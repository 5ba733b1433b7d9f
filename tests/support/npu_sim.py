"""A simulated "npu" device on CPU, for dispatch tests without hardware.

``setup_device()`` renames the PrivateUse1 backend to "npu" and registers a Python device guard and a
``torch.npu`` module (``torch.utils.backend_registration._setup_privateuseone_for_python_backend``). This is
process-global and cannot be undone, so only subprocesses call it (tests/backends/npu/dispatch_scenarios.py).

Tensors on the device are ``NpuTensor`` wrappers (device ``npu:0``, dispatch key PrivateUse1) around CPU
tensors. While ``NpuMode`` is active every aten op on them -- and every factory call with ``device="npu"`` --
runs on the CPU data and is wrapped again; ``fused_lce::*`` ops are re-dispatched to their PrivateUse1 kernel
(what a real NPU tensor would hit), so the Python router, the backend selection for device type "npu" and
autograd all run as they would with torch_npu. Not simulated: streams, memory, the ACL runtime, anything
numerical of the real device.
"""
from __future__ import annotations

import os
import types

import torch
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils._python_dispatch import TorchDispatchMode

NPU = None  # torch.device("npu", 0) once setup_device() renamed PrivateUse1
_ready = False
# When set, every aten op NpuMode sees goes to OBSERVER(func, args, kwargs, run) instead; ``run()`` runs it as
# usual (tests/backends/npu/torch_route_ops.py records the ops of the "torch" route with it).
OBSERVER = None


def _device_module():
    mod = types.ModuleType("torch.npu")
    # read at call time so a scenario can hide the device (FAKE_NPU_DEVICES=0)
    mod.device_count = lambda: int(os.environ.get("FAKE_NPU_DEVICES", "1"))
    mod.is_available = lambda: mod.device_count() > 0
    mod.current_device = lambda: 0
    mod.is_initialized = lambda: True
    mod._is_in_bad_fork = lambda: False
    mod.manual_seed_all = lambda seed: None
    mod.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    mod.synchronize = lambda device=None: None
    return mod


def setup_device():
    global _ready, NPU
    if _ready:
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend("npu", backend_module=_device_module())
    NPU = torch.device("npu", 0)
    _register_factories()
    _ready = True


_lib = None


def _register_factories():
    """Kernels for the few ops that C++ factories (``torch.tensor(..., device="npu")``) call with the Python
    dispatch key excluded: allocate and copy on the CPU data."""
    global _lib
    _lib = torch.library.Library("aten", "IMPL")

    def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
        return NpuTensor(torch.empty_strided(size, stride, dtype=dtype))

    def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return NpuTensor(torch.empty(size, dtype=dtype))

    def copy_from(src, dst, non_blocking=False):
        dst_data = dst._data if isinstance(dst, NpuTensor) else dst
        dst_data.copy_(src._data if isinstance(src, NpuTensor) else src)
        return dst

    _lib.impl("empty_strided", empty_strided, "PrivateUse1")
    _lib.impl("empty.memory_format", empty, "PrivateUse1")
    _lib.impl("_copy_from", copy_from, "PrivateUse1")


def _is_npu_device(x) -> bool:
    if isinstance(x, torch.device):
        return x.type == "npu"
    return isinstance(x, str) and x.split(":")[0] == "npu"


def _unwrap(x):
    if isinstance(x, NpuTensor):
        return x._data
    if _is_npu_device(x):
        return torch.device("cpu")
    return x


class NpuTensor(torch.Tensor):
    """A tensor on the simulated device; ``_data`` is its CPU storage."""

    @staticmethod
    def __new__(cls, data: torch.Tensor):
        assert not isinstance(data, NpuTensor)
        r = torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), storage_offset=data.storage_offset(), dtype=data.dtype,
            device=NPU, requires_grad=data.requires_grad)
        r._data = data
        return r

    def __repr__(self):
        return f"NpuTensor({self._data!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        with NpuMode():
            return func(*args, **(kwargs or {}))


class NpuMode(TorchDispatchMode):
    """Runs ops on simulated-device tensors (and npu factory calls) on the CPU data; see the module
    docstring."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "fused_lce":
            # a real NPU tensor reaches the op's PrivateUse1 kernel; the mode is re-entered for the ops inside
            # it
            with NpuMode():
                return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1),
                                       *args, **kwargs)
        if OBSERVER is not None:
            return OBSERVER(func, args, kwargs, lambda: _run(func, args, kwargs))
        return _run(func, args, kwargs)


def _run(func, args, kwargs):
    """An aten op on the CPU data; its results are simulated-device tensors when it runs on the device."""
    if "device" in kwargs and kwargs["device"] is not None:
        to_npu = _is_npu_device(kwargs["device"])
    else:
        to_npu = any(isinstance(a, NpuTensor) or _is_npu_device(a) for a in tree_leaves((args, kwargs)))
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    if not to_npu:
        return out
    return tree_map(lambda t: NpuTensor(t) if isinstance(t, torch.Tensor) and not isinstance(t, NpuTensor)
                    else t, out)


def cpu(t: torch.Tensor) -> torch.Tensor:
    """The CPU data of a simulated-device tensor (detached), or ``t`` itself."""
    return t._data.detach() if isinstance(t, NpuTensor) else t.detach()
