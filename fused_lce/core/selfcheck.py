"""First contact with an accelerator the project has not run a provider on: a self-check before first use.

The first time a process would use a provider on a device where it has never been verified
(``Provider.needs_check``: every NPU today; a GPU architecture the CUDA suite has not run on), a small fixed
battery runs it against the ``torch`` provider on the same device: bf16 and fp32, ignored labels, a vocabulary
wider than 65536, each route (the loss with its gradients in the forward, the recomputing backward, log-probs
with entropy), every output and gradient, with tolerances relative to the reference's norm. On a mismatch, a
non-finite value or an error, the provider is marked failed for that device (``backend_info()`` says why, with
a warning once per process) and the registry does not use it there: ``auto`` takes the next provider of its
order, an explicit request is refused. A suspect result is never returned. The verdict is cached on disk
(``FUSED_LCE_CACHE_DIR``, default ``~/.cache/fused_lce``) under the package version and ``Provider.check_id``
(kernel build, toolkit / driver, device), so a host pays for it once. ``FUSED_LCE_SELFCHECK=0`` turns the
check off; ``=1`` runs it for every accelerator provider once per process, ignoring the cache and the verified
list. ``fused-lce doctor`` prints the same evidence.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import threading
import time
import warnings
from typing import Optional

import torch

from .provider import sync
from .types import LOGPROBS, LOSS, Options, Problem

ENV = "FUSED_LCE_SELFCHECK"
CACHE_ENV = "FUSED_LCE_CACHE_DIR"
REPORT = ("run `fused-lce doctor` and attach its output to a bug report; FUSED_LCE_SELFCHECK=0 uses the "
          "backend without the check")

# relative L2 error against the torch provider, per operand dtype: (per-token values, gradients); bf16 / fp16
# providers may round the logits or dz to the operand dtype, a wrong kernel misses by far more
TOLERANCE = {torch.float32: (1e-4, 1e-3), torch.bfloat16: (2e-2, 5e-2), torch.float16: (5e-3, 2e-2)}
VALUE_KEYS = ("loss", "lse", "logprob", "entropy", "zmean", "mean_logit", "log_sum_sq")


@dataclasses.dataclass(frozen=True)
class Case:
    """One check of the battery: the op, its options, the operands' dtype and shape, and whether to try a
    bias."""

    name: str
    op: str
    dtype: torch.dtype
    n: int
    d: int
    v: int
    opts: tuple = ()
    bias: bool = False
    # "none": forward, then the recomputing backward with a non-uniform upstream gradient
    reduction: str = "mean"


BATTERY = (
    Case("loss fp32, smoothing + z-loss + softcap + bias", LOSS, torch.float32, 37, 64, 301,
         (("label_smoothing", 0.1), ("z_loss", 1e-4), ("softcap", 20.0)), bias=True),
    Case("loss bf16", LOSS, torch.bfloat16, 37, 64, 301),
    Case("loss bf16, reduction none (recompute)", LOSS, torch.bfloat16, 37, 64, 301, reduction="none"),
    Case("loss bf16, V 65600 (wide vocabulary)", LOSS, torch.bfloat16, 8, 32, 65600),
    Case("log-probs fp32, T 0.7 + entropy + extras", LOGPROBS, torch.float32, 37, 64, 301,
         (("temperature", 0.7), ("entropy", True), ("mean_logit", True), ("sum_sq", True))),
    Case("log-probs bf16, T 0.7 + entropy", LOGPROBS, torch.bfloat16, 37, 64, 301,
         (("temperature", 0.7), ("entropy", True))),
)


@dataclasses.dataclass
class Verdict:
    """The result of the battery for one (provider, device): ``ok``, the first failure (``reason``), the
    largest relative error per output over the cases run, the cases run / declined, the seconds it took, and
    whether it came from the disk cache."""

    ok: bool
    reason: Optional[str] = None
    # a failure by comparison ("mismatch") is a property of the kernels and is cached on disk; one by an error
    # ("error": a launch error, out of memory, the reference failing) may be the moment's, and is kept per
    # process
    kind: Optional[str] = None
    errors: dict = dataclasses.field(default_factory=dict)
    cases: list = dataclasses.field(default_factory=list)
    declined: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    cached: bool = False


_lock = threading.RLock()
_local = threading.local()
_verdicts: dict = {}  # (provider name, device string) -> Verdict
_warned: set = set()


def mode() -> str:
    """"off", "auto" or "force" from FUSED_LCE_SELFCHECK; ValueError naming the variable otherwise."""
    raw = os.environ.get(ENV, "").strip().lower()
    modes = {"": "auto", "auto": "auto", "0": "off", "off": "off", "1": "force", "force": "force"}
    if raw not in modes:
        raise ValueError(f"{ENV}: expected 0 (off), 1 (always) or unset (auto), got {os.environ[ENV]!r}")
    return modes[raw]


def failure(provider, device: torch.device) -> Optional[str]:
    """None when ``provider`` may serve ``device``; else why not: it failed its first-use self-check there."""
    if getattr(_local, "active", False):  # the battery itself runs the provider under test
        return None
    m = mode()
    if m == "off" or provider.name == "torch":
        return None
    if provider.needs_check(device) is None and not (m == "force" and device.type != "cpu"):
        return None
    key = (provider.name, str(device))
    v = _verdicts.get(key)
    if v is None:
        capturing = getattr(getattr(torch, device.type, None), "is_current_stream_capturing", None)
        if capturing is not None and capturing():
            return (f"its first-use self-check cannot run while a graph is captured on {device}: run one "
                    f"step with backend={provider.name!r} before capturing")
        v = verdict(provider, device)
    return None if v.ok else f"failed its first-use self-check on {device}: {v.reason}; {REPORT}"


def verdict(provider, device: torch.device, force: bool = False) -> Verdict:
    """The provider's verdict on ``device``: from this process, else the disk cache, else the battery (always
    the battery with ``force`` or FUSED_LCE_SELFCHECK=1). A failure warns once per process."""
    key = (provider.name, str(device))
    with _lock:
        if not force and key in _verdicts:
            return _verdicts[key]
        cache_key = _cache_key(provider, device)
        v = None if force or mode() == "force" else _load(cache_key)
        if v is None:
            print(f"fused_lce: first use of backend {provider.name!r} on {device}: checking it against the "
                  f"torch backend ({ENV}=0 skips this)", file=sys.stderr, flush=True)
            v = run_battery(provider, device)
            if v.kind != "error":
                _store(cache_key, v)
        _verdicts[key] = v
        if not v.ok and key not in _warned:
            _warned.add(key)
            warnings.warn(f"fused_lce: backend {provider.name!r} failed its first-use self-check on {device} "
                          f"({v.reason}); it is not used on this device in this process (backend='auto' "
                          f"takes the next backend of its order). Please {REPORT}.", RuntimeWarning,
                          stacklevel=3)
        return v


def recorded(provider, device: torch.device) -> Optional[Verdict]:
    """The provider's verdict on ``device`` from this process or the disk cache, without running the battery
    (None where there is none)."""
    key = (provider.name, str(device))
    with _lock:
        if key not in _verdicts:
            try:
                v = _load(_cache_key(provider, device))
            except Exception:  # noqa: BLE001 - a provider that cannot name its build here has no verdict
                v = None
            if v is None:
                return None
            _verdicts[key] = v
        return _verdicts[key]


def known() -> dict:
    """{provider name: {device: "passed" | "failed: <reason>"}} of the verdicts this process holds."""
    out: dict = {}
    for (name, dev), v in _verdicts.items():
        out.setdefault(name, {})[dev] = "passed" if v.ok else f"failed: {v.reason}"
    return out


def forget() -> None:
    """Drop this process's verdicts and warnings (tests; the disk cache stays)."""
    with _lock:
        _verdicts.clear()
        _warned.clear()


# ------------------------------------------------------------------------------------------------ the battery
def run_battery(provider, device: torch.device, cases=BATTERY) -> Verdict:
    """Every case the provider supports on ``device``, against the torch provider on the same inputs (through
    the driver, by name: the provider must be the registry's)."""
    from . import registry

    if registry.load(provider.name) is not provider:
        raise ValueError(f"provider: {provider.name!r} is not the registry's provider of that name")
    return _battery(provider, device, cases, registry.load("torch"))


@contextlib.contextmanager
def bypassed():
    """Providers serve without their self-check inside (the battery itself; `fused-lce doctor`'s
    comparisons)."""
    before = getattr(_local, "active", False)
    _local.active = True
    try:
        yield
    finally:
        _local.active = before


def _battery(provider, device, cases, reference) -> Verdict:
    start = time.perf_counter()
    v = Verdict(ok=True)
    with bypassed(), torch.no_grad(), _no_autocast(device):
        for case in cases:
            inputs, opts, problem = case_inputs(case, device, provider)
            if problem is None:
                v.declined.append(case.name)
                continue
            got, bad = _attempt(case, provider.name, inputs, opts, device)
            if bad is None:
                want, bad = _attempt(case, reference.name, inputs, opts, device)
                bad = (None if bad is None
                       else f"the torch backend's reference failed ({bad}): nothing to check against")
            if bad is not None:  # a launch error is a verdict, not a crash
                v.ok, v.kind, v.reason = False, "error", f"case {case.name!r}: {bad}"
                break
            v.cases.append(case.name)
            bad = _compare(case, got, want, v.errors)
            if bad:
                v.ok, v.kind, v.reason = False, "mismatch", f"case {case.name!r}: {bad}"
                break
    v.seconds = time.perf_counter() - start
    return v


def _attempt(case: Case, backend: str, inputs, opts, device):
    """(outputs, None), or (None, the error) when the run or the device's queued work failed."""
    try:
        out = run_case(case, backend, inputs, opts)
        sync(device)  # an asynchronous kernel fault surfaces here, inside the battery
        return out, None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {str(e)[:300]}"


def case_inputs(case: Case, device, provider):
    """The case's tensors on ``device`` (fixed values, every fifth label ignored) and its Options; the problem
    is None when the provider declines every form of it (with its options, then without them and without a
    bias)."""
    g = torch.Generator().manual_seed(1234 + case.n * 7 + case.v)
    h = torch.randn(case.n, case.d, generator=g)
    w = torch.randn(case.v, case.d, generator=g) * (3.0 / math.sqrt(case.d))
    b = torch.randn(case.v, generator=g) * 0.5
    y = torch.randint(0, case.v, (case.n,), generator=g)
    y[::5] = -100
    cast = lambda x: x.to(device=device, dtype=case.dtype)  # noqa: E731
    for opts_items, bias in ((case.opts, case.bias), ((), False)):
        opts = Options(backend=provider.name, **dict(opts_items))
        p = Problem(case.n, case.d, case.v, case.dtype, device, bias, opts, (True, True, bias), case.op)
        if provider.supports(p) is None:
            return (cast(h), cast(w), y.to(device), cast(b) if bias else None), opts, p
    return None, None, None


def run_case(case: Case, backend: str, inputs, opts: Options) -> dict:
    """Every output and gradient of the case through the driver with ``backend`` (a registered provider)."""
    from . import driver

    h, w, y, b = inputs
    opts = dataclasses.replace(opts, backend=backend)
    mask = (True, True, b is not None)
    g = torch.Generator().manual_seed(99)
    up = (torch.rand(case.n, generator=g) + 0.5).to(h.device)  # a non-uniform upstream gradient
    if case.op == LOGPROBS:
        lp, ent, lse, zmean, mean, top1, sq = driver.logprobs_forward(h, w, y, b, opts, None)
        gent = -up if ent is not None else None
        grads = driver.logprobs_backward(up, gent, h, w, y, b, lse, zmean, opts, None, mask)
        out = dict(logprob=lp, entropy=ent, lse=lse, zmean=zmean, mean_logit=mean, log_sum_sq=sq, top1=top1)
    elif case.reduction == "none":
        loss, lse, correct, *_ = driver.forward(h, w, y, b, None, "none", opts, None, (False, False, False))
        grads = driver.backward(up, h, w, y, b, lse, None, "none", opts, None, mask)
        out = dict(loss=loss, lse=lse, top1=correct)
    else:
        loss, lse, correct, *grads = driver.forward(h, w, y, b, None, case.reduction, opts, None, mask)
        out = dict(loss=loss, lse=lse, top1=correct)
    out.update(zip(("dX", "dW", "db"), grads))
    return out


def _compare(case: Case, got: dict, want: dict, errors: dict) -> Optional[str]:
    """None when every output is within tolerance of the reference (the largest error per output kept in
    ``errors``), else what differs."""
    tol_value, tol_grad = TOLERANCE[case.dtype]
    for key, r in want.items():
        x = got.get(key)
        if r is None:
            continue
        if x is None:
            return f"{key} missing"
        if key == "top1":  # the first argmax: near-ties may resolve differently in 16-bit logits
            flips = int((x.cpu() != r.cpu()).sum())
            errors[key] = max(errors.get(key, 0), flips)
            if flips > max(2, case.n // 10):
                return f"{key}: {flips} of {case.n} tokens differ from the torch backend"
            continue
        x64, r64 = x.detach().double().cpu(), r.detach().double().cpu()
        if x64.shape != r64.shape:
            return f"{key} has shape {tuple(x64.shape)}, the torch backend's {tuple(r64.shape)}"
        finite = torch.isfinite(r64)
        if not torch.equal(torch.isfinite(x64), finite):
            return f"{key} is non-finite where the torch backend's is finite (or the reverse)"
        err = float((x64[finite] - r64[finite]).norm() / max(float(r64[finite].norm()), 1e-30))
        errors[key] = max(errors.get(key, 0.0), err)
        tol = tol_value if key in VALUE_KEYS else tol_grad
        if err > tol:
            return f"{key} differs from the torch backend: relative error {err:.3g} > {tol:g}"
    return None


def _no_autocast(device: torch.device):
    try:
        return torch.autocast(device_type=device.type, enabled=False)
    except Exception:  # noqa: BLE001 - a device type without autocast
        return contextlib.nullcontext()


# ------------------------------------------------------------------------------------------------ disk cache
def cache_path() -> str:
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fused_lce")
    return os.path.join(base, "selfcheck.json")


def _cache_key(provider, device) -> str:
    return f"{_package_version()}|{provider.name}|{provider.check_id(device)}"


def _package_version() -> str:
    from .. import __version__

    return __version__


def _read_cache() -> dict:
    try:
        with open(cache_path()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _load(key: str) -> Optional[Verdict]:
    entry = _read_cache().get(key)
    if not isinstance(entry, dict):
        return None
    try:
        return Verdict(**{**entry, "cached": True})
    except TypeError:  # written by another version of this module
        return None


def _store(key: str, v: Verdict) -> None:
    """Best effort: an unwritable cache costs a second battery in the next process, nothing else."""
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = _read_cache()
        data[key] = {**dataclasses.asdict(v), "cached": False}
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass
