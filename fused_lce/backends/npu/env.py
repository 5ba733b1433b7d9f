"""What an NPU host has installed, shared by the two NPU providers (provider.py, cann.py): torch_npu with a
device, this project's custom OPP kernels as op-plugin will find them, and what setup.py recorded about
building them.

Importing this module imports neither torch nor torch_npu: ``fused_lce/__init__`` arms the loader snapshot
(``arm_snapshot``) before it imports torch, because ``import torch`` itself imports an installed torch_npu
(torch_npu registers itself under torch's ``torch.backends`` entry points unless
TORCH_DEVICE_BACKEND_AUTOLOAD=0).

How op-plugin (compiled into libtorch_npu) finds an aclnn function, ``GetOpApiFuncAddr`` in op-plugin's
``op_plugin/utils/op_api_common.cpp`` (helpers in ``op_api_common.h``):
* when libtorch_npu loads, it fixes, once, the list of custom library folders -- each ``:``-separated entry of
  ASCEND_CUSTOM_OPP_PATH plus ``/op_api/lib/`` -- and the folders of the vendors named on the first
  ``load_priority=`` line of ``$ASCEND_OPP_PATH/vendors/config.ini`` (comma-separated, in that order; a vendor
  folder missing at that moment is never searched). Changing the environment or config.ini later changes
  nothing;
* at the first call of a function it walks those folders in that order (custom ones first), dlopens
  ``libcust_opapi.so`` there (RTLD_LAZY) and takes the first library whose dlsym finds the name and whose
  owner passes ``checkOwner``; the vendor folder's name is not checked. Only then CANN's own op-api libraries.
``find_kernels`` answers the same question: the loader's view is snapshotted when torch_npu is imported after
fused_lce, and reconstructed (with a reason when it cannot be sure) when torch_npu came first.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import os
import sys
from typing import Callable, Mapping, NamedTuple, Optional

from .. import build_status as _build_status
from . import toolkit as _toolkit

OPP_VENDOR = "fused_lce"  # cmake/ascend_opp.cmake FUSED_LCE_OPP_VENDOR, cmake/npu_build.py OPP_VENDOR
CUST_LIB = "libcust_opapi.so"  # op-plugin op_api_common.h GetCustOpApiLibName
LOADER_VARS = ("ASCEND_CUSTOM_OPP_PATH", "ASCEND_OPP_PATH")


def import_torch_npu():
    """torch_npu, imported on first use only (importing it registers the NPU device with torch)."""
    return sys.modules.get("torch_npu") or importlib.import_module("torch_npu")


def usable_torch_npu():
    """(torch_npu, None) when it imports and sees a device, else (None, the first failing step)."""
    import torch

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
    """What a self-check verdict on an NPU depends on besides the kernels: torch_npu's version, the CANN
    toolkit it runs with, the device's name."""
    from importlib import metadata

    from ...core import device_name

    try:
        tnpu = metadata.version("torch_npu")
    except metadata.PackageNotFoundError:
        tnpu = "?"
    cann = toolkit_version() or os.environ.get("ASCEND_HOME_PATH", "?")
    return f"torch_npu {tnpu}|CANN {cann}|{device_name(device)}"


NEVER_ON_HARDWARE = "never run on NPU hardware by this project's tests"


def build_status() -> dict[str, Optional[dict]]:
    """What setup.py recorded about the NPU parts: {"npu_opp": ..., "npu_adapter": ...}, each
    ``{"ok": bool, "attempted": bool, "error": first error line or why not built, "log": path or None, ...}``
    (the OPP part also "vendor", "cann_version", "note"), or None when nothing was recorded
    (fused_lce/backends/ build_status.py)."""
    recorded = _build_status.read()
    return {k: recorded[k] for k in ("npu_opp", "npu_adapter")}


def toolkit_version(home: Optional[str] = None) -> Optional[str]:
    """The CANN version the toolkit at ``home`` (default: ASCEND_HOME_PATH) states (toolkit.py), None if
    unknown."""
    home = home or os.environ.get("ASCEND_HOME_PATH")
    return _toolkit.toolkit_version(home)[0] if home else None


# ------------------------------------------------------------------------------------------- op-plugin's view
class LoaderView(NamedTuple):
    """What op-plugin fixed when libtorch_npu loaded: the loader variables' values and the library folders it
    will search, in order (``custom``: from ASCEND_CUSTOM_OPP_PATH; ``vendors``: (vendor, resolved folder or
    "") from config.ini)."""

    env: tuple
    custom: tuple
    vendors: tuple
    load_priority: Optional[str]


def loader_view(env: Mapping[str, str]) -> LoaderView:
    """The folders op-plugin would fix if libtorch_npu loaded now with ``env`` (config.ini is read now)."""
    custom = env.get("ASCEND_CUSTOM_OPP_PATH")
    # op-plugin splits on ':' keeping empty entries, and appends the suffix by plain concatenation
    dirs = tuple(entry + "/op_api/lib/" for entry in custom.split(":")) if custom is not None else ()
    vendors, priority = (), None
    opp = env.get("ASCEND_OPP_PATH")
    if opp is not None:
        try:  # lines as std::getline splits them (a '\r' stays part of the line)
            with open(os.path.realpath(opp + "/vendors/config.ini"), "rb") as f:
                lines = f.read().decode(errors="surrogateescape").split("\n")
        except OSError:
            lines = []
        priority = next((line for line in lines if line.startswith("load_priority=")), None)
        if priority is not None:
            names = priority[len("load_priority="):].split(",")
            vendors = tuple((v, _real_dir(opp + "/vendors/" + v + "/op_api/lib/")) for v in names)
    return LoaderView(tuple((k, env.get(k)) for k in LOADER_VARS), dirs, vendors, priority)


def _real_dir(path: str) -> str:
    """op-plugin's real_path: the resolved path if it exists, else ""."""
    return os.path.realpath(path) if os.path.exists(path) else ""


_snapshot: Optional[LoaderView] = None
_torch_npu_first = "torch_npu" in sys.modules  # before fused_lce was imported: no snapshot possible


class _SnapshotBeforeTorchNpu:
    """A meta-path finder that only wraps the loading of ``torch_npu``: the loader view is taken right before
    its module runs (which loads libtorch_npu), then the finder removes itself."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch_npu":
            return None
        spec = None
        for finder in sys.meta_path:  # the finder that would have loaded it
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def snapshot_then_exec(module):
            take_snapshot()
            exec_module(module)

        spec.loader.exec_module = snapshot_then_exec
        return spec


def take_snapshot(env: Optional[Mapping[str, str]] = None) -> None:
    """Record op-plugin's view now (torch_npu is about to load); only the first call counts."""
    global _snapshot
    if _snapshot is None:
        _snapshot = loader_view(os.environ if env is None else env)
    for f in [f for f in sys.meta_path if isinstance(f, _SnapshotBeforeTorchNpu)]:
        sys.meta_path.remove(f)


def arm_snapshot() -> None:
    """Take the snapshot when torch_npu is imported (idempotent; nothing to arm when it already was)."""
    if "torch_npu" in sys.modules or _snapshot is not None:
        return
    if not any(isinstance(f, _SnapshotBeforeTorchNpu) for f in sys.meta_path):
        sys.meta_path.insert(0, _SnapshotBeforeTorchNpu())


def start_environ() -> Optional[dict]:
    """The environment this process started with (Linux: /proc/self/environ, which later changes do not
    touch), or None when unreadable."""
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="surrogateescape"): v.decode(errors="surrogateescape") for k, v in pairs}


def loader_views(
        start: Optional[Callable[[], Optional[dict]]] = None) -> tuple[list[LoaderView], Optional[str]]:
    """The views op-plugin may have taken, and a note when there is more than one candidate or the view is
    assumed: exactly the snapshot when fused_lce was imported before torch_npu; otherwise the process's start
    environment and the current one (op-plugin read one of them, or another in between)."""
    if _snapshot is not None:
        return [_snapshot], None
    now = loader_view(os.environ)
    if "torch_npu" not in sys.modules:
        return ([now],
                "torch_npu is not imported yet: op-plugin will see the current environment if it stays so")
    how = ("torch_npu was imported before fused_lce" if _torch_npu_first else
           "torch_npu was imported without fused_lce's import hook seeing it")
    env0 = (start or start_environ)()
    if env0 is None:
        return [now], f"{how} and the process's start environment is unreadable: the current one is assumed"
    first = loader_view(env0)
    # not changed inside this process (config.ini is read now: op-plugin read it then)
    if first.env == now.env:
        return [now], None
    return [first, now], (f"{how} (e.g. by `import torch`, which imports an installed torch_npu), and "
                          f"{', '.join(k for (k, a), (_, b) in zip(first.env, now.env) if a != b)} changed "
                          "since the process started, so it is not known which value op-plugin read when "
                          "libtorch_npu loaded")


# --------------------------------------------------------------------------------------------- dlopen / dlsym
def _libdl():
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "dlsym"):  # glibc < 2.34 keeps them in libdl
        libc = ctypes.CDLL(ctypes.util.find_library("dl") or "libdl.so.2")
    libc.dlopen.restype, libc.dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    libc.dlsym.restype, libc.dlsym.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    libc.dlerror.restype, libc.dlerror.argtypes = ctypes.c_char_p, []
    return libc


_DL = None
_handles: dict = {}


def dlopen(path: str):
    """(handle, None) or (None, dlerror) for ``path`` opened as op-plugin opens it (RTLD_LAZY, local)."""
    global _DL
    if path not in _handles:
        if _DL is None:
            _DL = _libdl()
        handle = _DL.dlopen(path.encode(), os.RTLD_LAZY)
        err = None if handle else (_DL.dlerror() or b"dlopen failed").decode(errors="replace")
        _handles[path] = (handle, err)
    return _handles[path]


def dlsym(handle, name: str) -> bool:
    return bool(_DL.dlsym(handle, name.encode()))


def owner_allows(owner: int, uid: int) -> bool:
    """op-plugin's checkOwner (op_api_common.cpp): a root process takes only root's libraries; any other user
    takes root's or its own."""
    return owner == uid or (owner == 0 and uid != 0)


def owner_ok(path: str, uid: Optional[int] = None) -> bool:
    return owner_allows(os.stat(path).st_uid, os.getuid() if uid is None else uid)


def _real_file(path: str) -> str:
    return os.path.realpath(path) if os.path.exists(path) else ""


def resolve(symbols, view: LoaderView, uid: Optional[int] = None) -> tuple[dict, list[str]]:
    """({symbol: the library op-plugin takes it from, or None}, what was seen on the way: libraries that
    failed to load, lacked a symbol or failed the owner check)."""
    libs = [_real_file(d + "/" + CUST_LIB) for d in view.custom] + [_real_file(d + "/" + CUST_LIB)
                                                                  for _, d in view.vendors]
    found, seen = {}, []
    for sym in symbols:
        found[sym] = None
        for lib in libs:
            if not lib:
                continue
            handle, err = dlopen(lib)
            if handle is None:
                seen.append(f"{lib} does not load ({err})")
            elif not dlsym(handle, sym):
                seen.append(f"{lib} has no {sym}")
            elif not owner_ok(lib, uid):
                seen.append(f"{lib} is skipped by op-plugin's owner check (owner uid {os.stat(lib).st_uid}, "
                            f"this process {os.getuid() if uid is None else uid})")
            else:
                found[sym] = lib
                break
    return found, list(dict.fromkeys(seen))


def _where(view: LoaderView) -> str:
    env = dict(view.env)
    custom = env["ASCEND_CUSTOM_OPP_PATH"]
    out = "ASCEND_CUSTOM_OPP_PATH unset" if custom is None else f"ASCEND_CUSTOM_OPP_PATH={custom!r}"
    if env["ASCEND_OPP_PATH"] is not None:
        out += f", $ASCEND_OPP_PATH/vendors/config.ini {view.load_priority or 'without load_priority'}"
    return out


def _verdict(symbols, view: LoaderView, uid: Optional[int]) -> tuple[Optional[str], Optional[str]]:
    found, seen = resolve(symbols, view, uid)
    missing = [s for s in symbols if found[s] is None]
    if missing:
        detail = f"; {'; '.join(seen[:4])}" if seen else ""
        return None, (f"aclnn symbol(s) {', '.join(missing)} not found where op-plugin looks "
                      f"({_where(view)}: ASCEND_CUSTOM_OPP_PATH's <dir>/op_api/lib/{CUST_LIB}, then the "
                      f"vendors of config.ini){detail}")
    libs = sorted(set(found.values()))
    if len(libs) > 1:
        split = ", ".join(f"{s} from {found[s]}" for s in symbols)
        return (None,
                f"op-plugin would take the aclnn symbols from different libraries ({split}): "
                "two builds mixed")
    return libs[0], None


# The generated aclnn headers the package installs beside its library (asc-devkit opbuild's aclnn generator
# writes aclnn_<op in snake case>.h, func.cmake installs them into op_api/include): their declarations show
# the interface the package was built with. A package built before an attribute was added exports the same
# names with fewer arguments, and the adapter's arguments would land in the wrong places.
ACLNN_HEADERS = {"aclnn_fused_lce_stats_cube.h": "variant", "aclnn_fused_lce_grad_cube.h": "variant"}


def interface_mismatch(lib: str) -> Optional[str]:
    """None when the package of ``lib`` (<vendor>/op_api/lib/libcust_opapi.so) declares the interface the
    adapter calls, else why not."""
    inc = os.path.join(os.path.dirname(os.path.dirname(lib)), "include")
    for name, argument in ACLNN_HEADERS.items():
        path = os.path.join(inc, name)
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            return f"{path} is missing: an incomplete kernel package"
        if argument not in text:
            return (f"{path} declares no '{argument}' argument: the package was built from older "
                    "sources (rebuild it)")
    return None


def kernel_files(lib: str) -> list:
    """The files of the package of ``lib`` a verdict on its kernels depends on: the aclnn and tiling libraries
    and the kernel binaries (a rebuild that only changed a kernel changes these, not the aclnn library)."""
    vendor = os.path.dirname(os.path.dirname(os.path.dirname(lib)))
    out = []
    for sub in ("op_api", "op_impl"):
        for root, _, files in os.walk(os.path.join(vendor, sub)):
            out += [os.path.join(root, f) for f in files]
    return sorted(out)


def find_kernels(symbols, uid: Optional[int] = None,
                 start: Optional[Callable[[], Optional[dict]]] = None) -> tuple[Optional[str], Optional[str]]:
    """(the libcust_opapi.so op-plugin will take every symbol in ``symbols`` from, None), or (None, why not),
    resolved with dlsym on the exact library op-plugin would open, for every view it may have taken (they must
    agree)."""
    views, note = loader_views(start)
    verdicts = [_verdict(symbols, v, uid) for v in views]
    if len(verdicts) == 1:
        lib, reason = verdicts[0]
        return (lib, None) if lib else (None, reason + (f" ({note})" if note else ""))
    if verdicts[0] == verdicts[1] and verdicts[0][0]:
        return verdicts[0][0], None
    said = "; ".join(f"with {_where(v)}: " + (lib or reason) for v, (lib, reason) in zip(views, verdicts))
    return None, (f"cannot tell which custom OPP library op-plugin will use: {note} ({said}); set the "
                  "variables before Python starts (source <vendor>/bin/set_env.bash), or import "
                  "fused_lce before torch")

