"""``fused-lce doctor``: what this host has and how each backend behaves on it -- the report to attach to a
bug.

Sections: versions (Python, torch, torch_npu, CANN, the NPU and its driver, Triton, CUDA, the GPU and its
driver); every backend's availability and reason; the build status of the C++ and NPU parts; the first-use
self-check of every available backend on every device here (forced: the battery runs now; then the same
verdict read back from the disk cache, both timed), with the largest error per output; the NPU kernels'
conservative variants against the default, bit for bit; and a timing of each available backend against
``torch`` at one Qwen head shape.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from importlib import metadata
from typing import Optional

import torch

from ..backends.npu.env import toolkit_version
from ..core.provider import sync

DEFAULT_SHAPE = {"cpu": "128x896x151936", "accelerator": "4096x896x151936"}  # Qwen2.5-0.5B's head
VARIANTS = {1: "plain tiling", 2: "serial matmul", 3: "plain tiling + serial matmul"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--shape", default=None,
                   help="NxDxV of the timing (default: 128x896x151936 on CPU, 4096x896x151936 "
                        "on an accelerator)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per backend (median; default 3)")
    p.add_argument("--no-timing", action="store_true", help="skip the timing section")
    p.add_argument("--backends", default=None,
                   help="comma-separated backends to check and time (default: every available one)")


def check_args(parser: argparse.ArgumentParser, args) -> None:
    from ..core import registry

    for name in _names(args.backends) or ():
        if name not in registry.names():
            parser.error(f"--backends: unknown backend {name!r}; expected some of "
                         f"{', '.join(registry.names())}")
    if args.shape is not None:
        _shape(parser, args.shape)
    if args.reps < 1:
        parser.error(f"--reps: expected an integer >= 1, got {args.reps}")


def _names(text: Optional[str]) -> Optional[list]:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def _shape(parser, text: str) -> tuple:
    try:
        n, d, v = (int(x) for x in text.lower().split("x"))
    except ValueError:
        parser.error(f"--shape: expected NxDxV (three integers), got {text!r}")
    if n < 1 or d < 1 or v < 1:
        parser.error(f"--shape: every size must be >= 1, got {text!r}")
    return n, d, v


# ------------------------------------------------------------------------------------------------ sections
def _pkg(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _first_line(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return " ".join(f.read().split())[:200] or None
    except OSError:
        return None


def versions() -> dict:
    import fused_lce

    out = {"fused_lce": fused_lce.__version__, "python": sys.version.split()[0],
           "platform": platform.platform(), "torch": torch.__version__, "torch_npu": _pkg("torch_npu"),
           "triton": _pkg("triton"), "cuda_runtime": torch.version.cuda}
    home = os.environ.get("ASCEND_HOME_PATH")
    out["ascend_home_path"] = home
    out["cann"] = toolkit_version(home)
    out["npu_driver"] = _first_line("/usr/local/Ascend/driver/version.info")
    if out["torch_npu"] is not None:
        from ..backends.npu.env import usable_torch_npu

        _, why = usable_torch_npu()
        out["npu_devices"] = why or [torch.npu.get_device_name(i) for i in range(torch.npu.device_count())]
    if torch.cuda.is_available():
        out["gpus"] = [f"{torch.cuda.get_device_name(i)} "
                       f"(sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
                       for i in range(torch.cuda.device_count())]
        out["nvidia_driver"] = _nvidia_driver()
    return out


def _nvidia_driver() -> Optional[str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=20)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def build_status() -> dict:
    """What setup.py recorded about the compiled parts (the C++ CPU extension, the NPU kernel package and
    adapter): per part ``{"ok", "attempted", "error", "log", ...}``, None where nothing was recorded
    (fused_lce/backends/build_status.py)."""
    from ..backends import build_status as recorded

    return recorded.read()


def _devices(provider) -> list:
    """The devices here a provider serves: device 0 of each present device type it runs on."""
    from ..core import registry

    types = [t for t in registry.present_device_types()
             if provider.device_types is None or t in provider.device_types]
    return [torch.device(t, 0) if t != "cpu" else torch.device("cpu") for t in types]


def _available(only=None):
    from ..core import registry

    for name in registry.names():
        if name != "torch" and (only is None or name in only) and registry.unavailable_reason(name) is None:
            provider = registry.load(name)
            for dev in _devices(provider):
                yield name, provider, dev


def selfchecks(only=None) -> dict:
    """The battery on every available backend and device, forced, then the verdict as the next process reads
    it."""
    from ..core import selfcheck

    out = {}
    for name, provider, dev in _available(only):
        key = f"{name} on {dev}"
        try:
            v = selfcheck.verdict(provider, dev, force=True)
            selfcheck.forget()
            t0 = time.perf_counter()
            again = selfcheck.verdict(provider, dev)
            cached_s = time.perf_counter() - t0
            row = dataclasses.asdict(v)
            row["cached_seconds"] = round(cached_s, 4) if again.cached else None
            row["seconds"] = round(v.seconds, 3)
            row["errors"] = {k: (float(f"{x:.3g}") if isinstance(x, float) else x)
                                for k, x in v.errors.items()}
            out[key] = row
        except Exception as e:  # noqa: BLE001 - a report, not a crash
            out[key] = {"ok": False, "reason": f"{type(e).__name__}: {e}"}
    return out


def variants(only=None) -> dict:
    """The NPU kernels' conservative variants against the default on the battery's cases, bit for bit."""
    from ..core import registry, selfcheck

    out = {}
    for name, provider, dev in _available(only):
        if not hasattr(provider, "with_variant"):
            continue
        base_name = f"{name}_variant0"  # the default kernels, whatever the FUSED_LCE_NPU_* variables say
        names = [base_name] + [f"{name}_variant{bits}" for bits in VARIANTS]
        for bits, vname in enumerate(names):
            registry.register(provider.with_variant(vname, bits))
        try:
            # run against each other without their self-check: the comparison matters most where the default
            # fails it
            with selfcheck.bypassed():
                runs = {vname: [] for vname in names}
                for case in selfcheck.BATTERY:
                    inputs, opts, problem = selfcheck.case_inputs(case, dev, provider)
                    if problem is not None:
                        for vname in names:
                            runs[vname].append((case, selfcheck.run_case(case, vname, inputs, opts)))
            for bits, label in VARIANTS.items():
                row = {"variant": label, "bitwise_equal": True, "cases": []}
                for (case, base), (_, got) in zip(runs[base_name], runs[names[bits]]):
                    diff = {k: _max_diff(got[k], x) for k, x in base.items() if x is not None}
                    same = all(d == 0.0 for d in diff.values())
                    row["bitwise_equal"] &= same
                    row["cases"].append({"case": case.name, "equal": same,
                                         "max_abs_diff": {k: d for k, d in diff.items() if d}})
                out[f"{name} on {dev}: {label}"] = row
        except Exception as e:  # noqa: BLE001 - a report, not a crash
            out[f"{name} on {dev}"] = {"bitwise_equal": False, "error": f"{type(e).__name__}: {e}"}
        finally:
            for vname in names:
                registry.unregister(vname)
    return out or {"skipped": "no backend with conservative variants (npu) is available here"}


def _max_diff(a, b) -> float:
    if a is None or b is None or a.shape != b.shape:
        return float("inf")
    a, b = a.detach().cpu(), b.detach().cpu()
    if torch.equal(a, b):
        return 0.0
    a, b = a.double(), b.double()
    both_nan = a.isnan() & b.isnan()
    d = (a - b).abs().masked_fill(both_nan, 0.0)
    return float(d.nan_to_num(float("inf")).max())


def timings(shape: Optional[tuple], reps: int, only=None) -> dict:
    """Forward + backward of the mean loss, median ms of ``reps`` after one warm-up, each backend against
    torch."""
    import fused_lce

    out = {}
    for name, provider, dev in list(_available(only)):
        n, d, v = shape or tuple(int(x) for x in DEFAULT_SHAPE["cpu" if dev.type == "cpu" else "accelerator"]
                                 .split("x"))
        dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
        if dtype not in provider.dtypes:
            dtype = provider.dtypes[0]
        g = torch.Generator().manual_seed(0)
        h = torch.randn(n, d, generator=g).to(dev, dtype).requires_grad_()
        w = (torch.randn(v, d, generator=g) * d ** -0.5).to(dev, dtype).requires_grad_()
        y = torch.randint(0, v, (n,), generator=g).to(dev)
        row = {"shape": f"{n}x{d}x{v}", "dtype": str(dtype).replace("torch.", "")}
        for backend in (name, "torch"):
            try:
                row[f"{backend}_ms"] = _time(lambda: fused_lce.linear_cross_entropy(h, w, y, backend=backend),
                                             h, w, dev, reps)
            except Exception as e:  # noqa: BLE001
                row[f"{backend}_ms"] = None
                row[f"{backend}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        if row.get(f"{name}_ms") and row.get("torch_ms"):
            row["speedup_vs_torch"] = round(row["torch_ms"] / row[f"{name}_ms"], 2)
        out[f"{name} on {dev}"] = row
    return out


def _time(fn, h, w, dev, reps: int) -> float:
    times = []
    for i in range(reps + 1):
        h.grad = w.grad = None
        sync(dev)
        t0 = time.perf_counter()
        fn().backward()
        sync(dev)
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 2)


def collect(shape: Optional[tuple] = None, reps: int = 3, timing: bool = True, only=None) -> dict:
    """The report; ``only``: the backends to check and time (default every available one)."""
    import fused_lce

    def section(fn, *a):
        try:
            return fn(*a)
        except Exception as e:  # noqa: BLE001 - every section reports, none stops the others
            return {"error": f"{type(e).__name__}: {e}"}

    report = {"versions": section(versions), "backends": section(fused_lce.backend_info),
              "build": section(build_status), "selfcheck": section(selfchecks, only),
              "variants": section(variants, only)}
    report["timing"] = section(timings, shape, reps, only) if timing else {"skipped": "--no-timing"}
    report["backends_after_selfcheck"] = {k: {"available": v["available"], "reason": v["reason"]}
                                          for k, v in section(fused_lce.backend_info).items() if k != "auto"}
    return report


def render(report: dict) -> str:
    lines = []
    for title, body in report.items():
        lines.append(f"== {title}")
        if isinstance(body, dict):
            for k, v in body.items():
                lines.append(f"  {k}: {json.dumps(v, default=str) if isinstance(v, (dict, list)) else v}")
        else:
            lines.append(f"  {body}")
    return "\n".join(lines)


def main_from_args(parser: argparse.ArgumentParser, args) -> int:
    shape = _shape(parser, args.shape) if args.shape else None
    report = collect(shape, args.reps, not args.no_timing, _names(args.backends))
    print(json.dumps(report, indent=1, default=str) if args.json else render(report))
    return 0
