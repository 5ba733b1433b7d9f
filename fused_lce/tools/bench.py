"""``fused-lce bench``: the plain path (F.linear + F.cross_entropy) against fused_lce, on this device.

Times forward+backward of the mean loss (median of ``--repeat`` runs after ``--warmup``) at each token count,
measures peak extra memory (CUDA: ``max_memory_allocated`` minus what was allocated before; CPU: RSS sampled
every millisecond minus RSS before; the weight gradient is part of it), checks the errors against a float64
reference at the smallest token count (loss absolute error, relative L2 error of dX and dW), and ends with how
much less extra memory each fused backend needed than the plain path at the largest count. Sizes are checked
against the memory available first: a path that would not fit is skipped with what would fit, and running out
of memory anyway (CPU or CUDA) is reported, not raised.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from typing import Optional

import torch
import torch.nn.functional as F

from ..core.formulas import reference_mean_loss_grads
from ..core.provider import sync

PRESETS = {  # LM heads: (hidden size, vocabulary)
    "qwen2.5-0.5b": (896, 151936), "qwen2.5-1.5b": (1536, 151936), "qwen2.5-3b": (2048, 151936),
    "qwen2.5-7b": (3584, 152064), "qwen2.5-14b": (5120, 152064), "qwen2.5-32b": (5120, 152064),
    "qwen3-0.6b": (1024, 151936), "qwen3-1.7b": (2048, 151936), "qwen3-4b": (2560, 151936),
    "qwen3-8b": (4096, 151936), "qwen3-14b": (5120, 151936), "qwen3-32b": (5120, 151936),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_TOKENS = (256, 512, 1024)  # the plain path's extra memory grows ~1.2 MiB a token on the default head


class _RssSampler:
    """Peak resident set size of this process while the block runs (Linux /proc; 0 elsewhere)."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()

    @staticmethod
    def rss() -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            return 0

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.001)

    def __enter__(self):
        self.base = self.rss()
        self.peak = self.base
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.rss())


def _plain(h, w, y, tile_mb):
    return F.cross_entropy(F.linear(h, w).float(), y, ignore_index=-100)


def _fused(name):
    import fused_lce

    def run(h, w, y, tile_mb):
        return fused_lce.linear_cross_entropy(h, w, y, backend=name, tile_budget_mb=tile_mb)

    return run


def measure(fn, h, w, y, device, repeat, warmup, tile_mb):
    """(median seconds, peak extra bytes, loss, dX, dW) of forward+backward."""
    def step():
        h.grad = None
        w.grad = None
        loss = fn(h, w, y, tile_mb)
        loss.backward()
        return loss

    for _ in range(warmup):
        step()
    h.grad = None  # measure from a state without gradients, so each timed step allocates its own
    w.grad = None
    sync(device)
    times = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    sampler = _RssSampler() if device.type == "cpu" else None
    if sampler:
        sampler.__enter__()
    try:
        for _ in range(repeat):
            h.grad = None
            w.grad = None
            sync(device)
            t0 = time.perf_counter()
            loss = step()
            sync(device)
            times.append(time.perf_counter() - t0)
    finally:
        if sampler:
            sampler.__exit__()
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - before
    else:
        peak = sampler.peak - sampler.base
    return statistics.median(times), peak, loss.item(), h.grad.detach().clone(), w.grad.detach().clone()


# --------------------------------------------------------------------------------------------- shared helpers
# (benchmarks/*.py import these: one way to make inputs and one environment record; the float64 reference is
# fused_lce.core.formulas)
IGNORE_FRAC = 0.15


def make_inputs(n: int, d: int, v: int, dtype=torch.float32, device="cpu", seed: int = 0,
                ignore_frac: float = IGNORE_FRAC, w_scale: float = 1.0):
    """Deterministic (hidden, weight, labels): N(0, 1) hidden, N(0, w_scale^2 / d) weight, ``ignore_frac`` of
    the labels -100. Generated in chunks on ``device``, straight into ``dtype`` (no large float32
    temporaries)."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.empty(n, d, dtype=dtype, device=device)
    w = torch.empty(v, d, dtype=dtype, device=device)
    for t, scale in ((h, 1.0), (w, w_scale * max(d, 1) ** -0.5)):
        for i in range(0, t.shape[0], 8192):
            rows = min(8192, t.shape[0] - i)
            t[i:i + rows] = torch.randn(rows, d, generator=g, device=device) * scale
    y = torch.randint(0, max(v, 1), (n,), generator=g, device=device)
    y[torch.rand(n, generator=g, device=device) < ignore_frac] = -100
    return h, w, y


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64 (on a's device)."""
    b = b.to(a.device).double()
    return float((a.double() - b).norm() / b.norm().clamp(min=1e-300))


_rel = rel_err


def is_oom(e: BaseException) -> bool:
    """Out of memory, as CUDA's allocator (OutOfMemoryError) or the CPU's ("can't allocate memory") says
    it."""
    text = str(e).lower()
    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text or "cannot allocate memory" in text))


def _oom_text(e) -> str:
    return "out of memory: " + str(e).strip().splitlines()[0][:160]


def run_bench(tokens, hidden, vocab, dtype, device, backends, repeat, warmup, tile_mb, check, progress=True,
              skip=None):
    """Rows of results, one per (token count, path). ``check``: compare with the float64 reference at the
    smallest token count. ``skip``: {(tokens, path): why} for pairs not to run (they would not fit); out of
    memory while running is recorded in the row, not raised."""
    from tqdm import tqdm

    skip = skip or {}
    rows = []
    total = len(tokens) * len(backends)
    bar = tqdm(total=total, desc="bench", disable=not progress, file=sys.stderr)
    for n in tokens:
        base = {"tokens": n, "hidden": hidden, "vocab": vocab}
        ref = h = w = y = None
        why = None
        try:
            if not all((n, name) in skip for name in backends):
                h, w, y = make_inputs(n, hidden, vocab, dtype, device, seed=n)
                h.requires_grad_()
                w.requires_grad_()
                if check and n == min(tokens) and (n, "reference") not in skip:
                    ref = reference_mean_loss_grads(h, w, y)
        except RuntimeError as e:
            if not is_oom(e):
                raise
            why = _oom_text(e) + " (the inputs or the float64 reference)"
        for name in backends:
            bar.set_postfix_str(f"N={n} {name}")
            if why or (n, name) in skip:
                rows.append({**base, "path": name, "error": why or skip[(n, name)]})
                bar.update()
                continue
            fn = _plain if name == "plain" else _fused(name)
            try:
                sec, peak, loss, dh, dw = measure(fn, h, w, y, device, repeat, warmup, tile_mb)
                row = {**base, "path": name, "ms": sec * 1e3, "peak_extra_mib": peak / 2**20, "loss": loss}
                if ref is not None:
                    row.update(loss_abs_err=abs(loss - ref[0]), dx_rel_err=_rel(dh, ref[1]),
                               dw_rel_err=_rel(dw, ref[2]))
                del dh, dw
            except RuntimeError as e:  # the plain path is expected to run out first
                if not is_oom(e):
                    raise
                row = {**base, "path": name, "error": _oom_text(e)}
            rows.append(row)
            if h is not None:
                h.grad = w.grad = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
            bar.update()
        del ref, h, w, y
    bar.close()
    return rows


# ---------------------------------------------------------------------------------------------- memory plan
# Bytes per logit the plain path keeps live at its peak (logits, their float32 copy, log-softmax, its
# gradient; measured: two float32 copies at float32 on CPU, so this errs on the safe side).
_PLAIN_LOGIT_BYTES = {4: 12, 2: 16}


def available_bytes(device) -> Optional[int]:
    """Bytes this process can still allocate on ``device``: CUDA's free memory (plus what the caching
    allocator holds unused); on CPU the least of MemAvailable, the cgroup's limit less its usage, and the
    address-space / data-segment limits less what is mapped. None when it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    found = []
    meminfo = _read_kib_fields("/proc/meminfo")
    if "MemAvailable" in meminfo:
        found.append(meminfo["MemAvailable"])
    found += _cgroup_room()
    try:
        import resource

        status = _read_kib_fields("/proc/self/status")
        for limit, used in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
            soft = resource.getrlimit(limit)[0]
            if soft != resource.RLIM_INFINITY and used in status:
                found.append(max(0, soft - status[used]))
    except (ImportError, OSError, ValueError):
        pass
    return min(found) if found else None


def _read_kib_fields(path) -> dict:
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _cgroup_room() -> list:
    """The memory cgroup's limit less its usage (cgroup v2, then v1), if a limit is set."""
    rel = ""
    try:
        with open("/proc/self/cgroup") as f:
            rel = next((ln.strip().split(":", 2)[2] for ln in f if ln.startswith("0::")), "")
    except (OSError, IndexError):
        pass
    for limit_path, usage_path in ((f"/sys/fs/cgroup{rel}/memory.max", f"/sys/fs/cgroup{rel}/memory.current"),
                                   ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_path) as f:
                limit = f.read().strip()
            with open(usage_path) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:
            return [max(0, int(limit) - usage)]
        return []
    return []


def need_bytes(n, d, v, dtype, device, path, tile_mb=None, reference=False) -> int:
    """Estimated peak bytes of one run of ``path`` at ``n`` tokens: the inputs and their gradients (and the
    copies measure() returns), plus the path's own memory; with ``reference``, the float64 reference's peak
    instead of a path's."""
    es = torch.empty((), dtype=dtype).element_size()
    inputs = (n * d + v * d) * es + n * 8
    grads = (n * d + v * d) * es
    if reference:  # float64 copies of W and dW, dX, the result kept, chunks of at most 2**26 logits (x3)
        return inputs + 16 * v * d + 16 * n * d + 24 * min(2**26, max(n, 1) * v)
    if path == "plain":
        own = n * v * _PLAIN_LOGIT_BYTES.get(es, 16)
    else:
        if tile_mb:
            tile = int(tile_mb * 2**20)
        elif torch.device(device).type == "cuda":
            tile = 8 * 2**30
        else:
            tile = 256 * 2**20
        own = tile + n * d * 4 + n * 64  # logits tiles, a float32 dX accumulator, per-token statistics
    return inputs + 2 * grads + own


def max_tokens(d, v, dtype, device, path, room, tile_mb=None) -> int:
    """The largest token count whose ``need_bytes`` stays within ``room`` bytes (0 if none)."""
    a = need_bytes(0, d, v, dtype, device, path, tile_mb)
    b = need_bytes(1, d, v, dtype, device, path, tile_mb) - a
    return max(0, int((room - a) // b)) if b > 0 else 0


def dtype_name(dtype) -> str:
    return next((k for k, v in DTYPES.items() if v == dtype), str(dtype))


def _gib(x) -> str:
    return f"{x / 2**30:.1f} GiB"


def plan_skips(tokens, hidden, vocab, dtype, device, paths, tile_mb, check, room):
    """{(tokens, path): why} for the runs whose estimated peak exceeds ``room`` bytes (9/10 of it: estimates
    are estimates), each reason saying what would fit; (n, "reference") when the float64 check would not."""
    skips = {}
    if room is None:
        return skips
    usable = int(room * 0.9)
    for n in tokens:
        for path in paths:
            need = need_bytes(n, hidden, vocab, dtype, device, path, tile_mb)
            if need <= usable:
                continue
            fit = max_tokens(hidden, vocab, dtype, device, path, usable, tile_mb)
            one = _gib(need_bytes(1, hidden, vocab, dtype, device, path, tile_mb))
            what = (f"up to {fit} tokens would fit (--tokens {fit})" if fit else
                    f"not even 1 token fits: the {vocab}x{hidden} {dtype_name(dtype)} weight with its "
                    f"gradient and working memory needs {one}; lower --vocab or --hidden"
                    + (", or use --dtype bfloat16" if dtype == torch.float32 else ""))
            skips[(n, path)] = (f"would not fit: needs ~{_gib(need)}, {_gib(room)} available here; {what}")
        if check and n == min(tokens) and need_bytes(n, hidden, vocab, dtype, device, None, tile_mb,
                                                     reference=True) > usable:
            skips[(n, "reference")] = "the float64 reference would not fit"
    return skips


def summary(rows) -> list:
    """One line per fused path: how much less extra memory than the plain path it needed at the largest token
    count both ran, how each grew per token, and the time ratio."""
    ok = {(r["tokens"], r["path"]): r for r in rows if "ms" in r}
    lines = []
    for name in dict.fromkeys(r["path"] for r in rows if r["path"] != "plain"):
        both = sorted(n for (n, p) in ok if p == name and (n, "plain") in ok)
        if not both:
            continue
        n = both[-1]
        a, b = ok[(n, "plain")]["peak_extra_mib"], ok[(n, name)]["peak_extra_mib"]
        if max(a, b) < 1:
            lines.append(f"summary: {name} and plain both needed < 1 MiB of extra memory at {n} tokens")
            continue
        ratio = (f"{a / b:.1f}x less" if a >= b else f"{b / a:.1f}x more") if min(a, b) > 0 else \
            f"{a - b:+.0f} MiB less"
        line = f"summary: {name} needs {ratio} extra memory than plain at {n} tokens ({b:.0f} vs {a:.0f} MiB"
        if len(both) > 1:
            n0 = both[0]
            def per(p):
                return (ok[(n, p)]["peak_extra_mib"] - ok[(n0, p)]["peak_extra_mib"]) / (n - n0)

            line += f"; per extra token: plain {per('plain'):+.2f} MiB, {name} {per(name):+.2f} MiB"
        line += f"), {ok[(n, name)]['ms'] / ok[(n, 'plain')]['ms']:.2f}x plain's time"
        lines.append(line)
    return lines


def environment(device) -> dict:
    """What a result was measured on: versions, CPU / GPU, threads, load, the git commit of this checkout."""
    device = torch.device(device)
    env = {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
           "device": str(device), "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        import fused_lce

        env["fused_lce"] = fused_lce.__version__
    except ImportError:  # pragma: no cover
        pass
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            pass
    try:
        with open("/proc/cpuinfo") as f:
            env["cpu"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    try:
        env["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # a copy of the tree without its own .git (e.g. sent to a remote GPU)
    if os.environ.get("FUSED_LCE_COMMIT"):
        env["commit"] = os.environ["FUSED_LCE_COMMIT"]
        return env
    try:
        import subprocess

        git = ["git", "-C", root]
        head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
        env["commit"] = (head + (" + uncommitted changes" if dirty else "")) if head else "not a git checkout"
    except OSError:
        env["commit"] = "unknown"
    return env


def table(rows) -> str:
    head = "| tokens | path | fwd+bwd ms | peak extra MiB | loss | loss abs err | dX rel err | dW rel err |"
    out = [head, "|" + "---|" * 8]
    for r in rows:
        if "error" in r:
            what = ("would not fit" if r["error"].startswith("would not fit") else
                    "out of memory" if r["error"].startswith("out of memory") else r["error"][:40])
            out.append(f"| {r['tokens']} | {r['path']} | {what} (below) | | | | | |")
            continue
        err = lambda k: f"{r[k]:.2e}" if k in r else "-"  # noqa: E731
        out.append(f"| {r['tokens']} | {r['path']} | {r['ms']:.1f} | {r['peak_extra_mib']:.1f} | "
                   f"{r['loss']:.5f} | {err('loss_abs_err')} | {err('dx_rel_err')} | {err('dw_rel_err')} |")
    return "\n".join(out)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r["path"] for r in rows):
        pts = [r for r in rows if r["path"] == name and "ms" in r]
        xs = [r["tokens"] for r in pts]
        axes[0].plot(xs, [r["ms"] for r in pts], marker="o", label=name)
        axes[1].plot(xs, [r["peak_extra_mib"] for r in pts], marker="o", label=name)
    axes[0].set(xlabel="tokens", ylabel="fwd+bwd ms", title="time")
    axes[1].set(xlabel="tokens", ylabel="peak extra MiB", title="memory")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------------------------- arguments
def _int_at_least(low: int, what: str):
    """An argparse type: an integer >= low, with a usage error that says what was expected."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1, "a positive integer")
_non_negative_int = _int_at_least(0, "an integer >= 0")


def _token_list(text: str) -> list:
    parts = [t.strip() for t in str(text).split(",") if t.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("expected positive integers, e.g. 256 or "
                                         f"256,512,1024, got {text!r}")
    try:
        return [_positive_int(t) for t in parts]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError("expected positive integers, e.g. 256 or "
                                         f"256,512,1024, got {text!r}") \
            from None


def _mib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of MiB > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of MiB > 0, got {text}")
    return value


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("--preset", default="qwen2.5-0.5b", choices=sorted(PRESETS),
                   help="LM head shape (hidden, vocab) of a Qwen model (default: qwen2.5-0.5b)")
    p.add_argument("--tokens", default=list(DEFAULT_TOKENS), type=_token_list,
                   help="tokens per step; a comma list sweeps (default: 256,512,1024)")
    p.add_argument("--hidden", type=_positive_int, help="override the preset's hidden size")
    p.add_argument("--vocab", type=_positive_int, help="override the preset's vocabulary size")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:1, ... (default: cuda if available, else cpu)")
    p.add_argument("--backends", default=None,
                   help="comma list of paths to run: plain and backend names, or 'all' (plain + every "
                        "backend available on the device); default: plain + the backend fused_lce picks here")
    p.add_argument("--repeat", type=_positive_int, default=1,
                   help="timed runs per path (>= 1; the median is shown)")
    p.add_argument("--warmup", type=_non_negative_int, default=1, help="untimed runs first (>= 0)")
    p.add_argument("--tile-mb", type=_mib, default=None,
                   help="tile budget in MiB for the fused backends (> 0)")
    p.add_argument("--no-check", action="store_true",
                   help="skip the float64 reference (error columns, at the smallest token count)")
    p.add_argument("--json", metavar="PATH", help="write the raw results and the environment as JSON")
    p.add_argument("--plot", metavar="PNG", help="plot time and memory vs tokens (sweeps N/4, N/2, N when "
                                                 "--tokens is a single value; needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _device_problem(text: Optional[str]):
    """(torch.device, None) or (None, why it cannot be benchmarked here)."""
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu"), None
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        return None, f"not a torch device: {text!r} (expected cpu, cuda, cuda:1, ...)"
    if device.type == "cpu":
        return device, None
    if device.type == "meta":
        return None, "meta tensors have no values to time"
    module = getattr(torch, device.type, None)
    if module is None or not hasattr(module, "is_available") or not module.is_available():
        return None, f"{device.type} is not available here (torch.{device.type}.is_available() is False)"
    count = module.device_count() if hasattr(module, "device_count") else 1
    if device.index is not None and device.index >= count:
        return None, f"{device} does not exist: {count} {device.type} device(s) here"
    return device, None


def check_args(parser: argparse.ArgumentParser, args) -> None:
    """Checks that need more than one argument or this host (device, backends, optional dependencies), before
    anything runs; a failure is a usage error (exit status 2), like argparse's own."""
    from fused_lce.core import Options, Problem, registry

    hidden, vocab = PRESETS[args.preset]
    hidden, vocab = args.hidden or hidden, args.vocab or vocab
    device, why = _device_problem(args.device)
    if why:
        parser.error(f"argument --device: {why}")
    args.device = str(device)
    if args.backends is not None:
        paths = [b.strip() for b in args.backends.split(",") if b.strip()]
        if paths == ["all"]:
            return _check_files(parser, args)
        if not paths:
            parser.error(f"argument --backends: expected a comma list of plain and {registry.NAMES}, "
                         f"got {args.backends!r}")
        unknown = [b for b in paths if b != "plain" and b not in registry.NAMES]
        if unknown:
            parser.error(f"argument --backends: unknown {unknown}; expected plain or any of {registry.NAMES}")
        p = Problem(256, hidden, vocab, DTYPES[args.dtype], device, False, Options())
        for name in paths:
            reason = None if name == "plain" else registry.why_not(name, p)
            if reason:
                parser.error(f"argument --backends: {name} cannot run here: {reason}")
    _check_files(parser, args)


def _check_files(parser, args) -> None:
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError as e:
            parser.error(f"argument --plot: needs matplotlib ({e}); pip install matplotlib, or drop --plot")
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            parser.error(f"argument {flag}: the folder {folder} does not exist")


def main_from_args(args) -> int:
    """Runs the benchmark for parsed (and ``check_args``-checked) arguments."""
    import fused_lce
    from fused_lce.core import Options, Problem, registry

    hidden, vocab = PRESETS[args.preset]
    hidden = args.hidden or hidden
    vocab = args.vocab or vocab
    tokens = args.tokens if isinstance(args.tokens, list) else _token_list(str(args.tokens))
    if args.plot and len(tokens) == 1:
        tokens = sorted({max(1, tokens[0] // 4), max(1, tokens[0] // 2), tokens[0]})
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype]
    p = Problem(256, hidden, vocab, dtype, device, False, Options())
    if args.backends and args.backends.strip() != "all":
        paths = [b.strip() for b in args.backends.split(",") if b.strip()]
    elif args.backends:
        paths = ["plain"] + [n for n in registry.NAMES if registry.why_not(n, p) is None]
    else:
        paths = ["plain", registry.auto_choice(device.type, p)]
    room = available_bytes(device)
    skips = plan_skips(tokens, hidden, vocab, dtype, device, paths, args.tile_mb, not args.no_check, room)
    rows = run_bench(tokens, hidden, vocab, dtype, device, paths, args.repeat, args.warmup, args.tile_mb,
                     not args.no_check, progress=not args.quiet, skip=skips)
    env = environment(device)
    print(f"# fused-lce bench: {args.preset} head D={hidden} V={vocab}, {args.dtype}, {device}, "
          f"torch {torch.__version__}, {env.get('gpu') or env.get('cpu', '')} ({env['threads']} threads)")
    print(table(rows))
    for line in summary(rows):
        print(line)
    if (min(tokens), "reference") in skips:
        print(f"note: no float64 check at {min(tokens)} tokens: {skips[(min(tokens), 'reference')]}")
    failed = [r for r in rows if "error" in r]
    for r in failed:
        print(f"fused-lce bench: {r['path']} at {r['tokens']} tokens: {r['error']}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "args": vars(args), "backend_info": fused_lce.backend_info(),
                       "available_bytes": room, "results": rows}, f, indent=1)
    if args.plot and len(failed) < len(rows):
        plot(rows, args.plot)
    return 1 if len(failed) == len(rows) else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="fused-lce bench", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    check_args(p, args)
    return main_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
