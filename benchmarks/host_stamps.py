"""Host timeline of one fused_lce CUDA step, without a profiler's overhead: ``perf_counter`` stamps at the entry
and exit of the step's main functions (wrapped in place: ~1 us each), median microseconds from the step's start
over --reps steps, with the device synchronised before each step (as gpu.py's rounds are). The gaps between stamps
show where the host spends the time the device waits through before the first logits GEMM. --op picks the step:
``loss`` (fwd+bwd of the mean loss, as gpu.py: ``validate=False``), ``loss_checked`` (the same with
``validate=True``, the API's default and what the HF / TRL integrations call), ``logprobs`` (log-probs + entropy,
fwd+bwd of their sum) or ``logprobs_nograd`` (their forward under ``torch.no_grad``, as a reference model's).
With --queued-ms X each step first queues X ms of device work (a sleep kernel, in the step's time): the model's
forward that is still running when a training step reaches the head, which a host synchronisation before the
op's first launch waits for (the device then idles through the host's work up to that launch).

With --launch-profile also a self-time profile (cProfile) of 100 launches of the EXP logits GEMM alone (the queue
drained every 10), to see what one Triton launch costs on the host.

    PYTHONPATH=. python benchmarks/host_stamps.py --out bench-out [--shapes 2048x1536x151936] [--dtype bfloat16]
        [--op loss|loss_checked|logprobs|logprobs_nograd] [--queued-ms 3]
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu import _event_ms, fwd_bwd, sleep_cycles_per_ms  # noqa: E402

import fused_lce  # noqa: E402
from fused_lce.tools.bench import environment, make_inputs  # noqa: E402

STAMPS: list = []
_SAVED: list = []  # (owner, name, original) of every wrapped function, while installed


OPS = ("loss", "loss_checked", "logprobs", "logprobs_nograd")


def _loss(h, w, y, validate=False):
    """The step's loss call (``fused_lce.linear_cross_entropy`` looked up per call: the stamped one once installed)."""
    return fused_lce.linear_cross_entropy(h, w, y, backend="triton", validate=validate)


def _step(op, h, w, y, queued_cycles=0):
    """One step of ``op`` (the public function looked up per call, as ``_loss``), after ``queued_cycles`` of
    device sleep when given."""
    if queued_cycles:
        torch.cuda._sleep(queued_cycles)
    if op.startswith("loss"):
        return fwd_bwd(functools.partial(_loss, validate=op == "loss_checked"), h, w, y)
    if op == "logprobs_nograd":
        with torch.no_grad():
            return fused_lce.linear_logprobs(h, w, y, backend="triton", return_entropy=True)
    hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
    lp, ent = fused_lce.linear_logprobs(hh, ww, y, backend="triton", return_entropy=True)
    return torch.autograd.grad(lp.sum() + ent.sum(), (hh, ww))


def _wrap(owner, name, label=None):
    """Replace ``owner.name`` by a wrapper that stamps its entry and exit."""
    fn = getattr(owner, name)
    label = label or name

    @functools.wraps(fn)
    def stamped(*a, **k):
        STAMPS.append((label + " >", time.perf_counter()))
        try:
            return fn(*a, **k)
        finally:
            STAMPS.append((label + " <", time.perf_counter()))

    _SAVED.append((owner, name, fn))
    setattr(owner, name, stamped)


def uninstall():
    """Put every wrapped function back (the plain step of the next shape is timed without the stamps)."""
    while _SAVED:
        owner, name, fn = _SAVED.pop()
        setattr(owner, name, fn)
    from fused_lce import api

    api.linear_cross_entropy = fused_lce.linear_cross_entropy
    api.linear_logprobs = fused_lce.linear_logprobs


def install(op="loss"):
    """Wrap the main functions of ``op``'s step."""
    uninstall()
    from fused_lce import api
    from fused_lce.backends.triton import provider as tp
    from fused_lce.backends.triton.kernels import gemm as kg
    from fused_lce.backends.triton.kernels import rows as kr
    from fused_lce.core import driver, registry
    from fused_lce.ops import logprobs as ops_logprobs
    from fused_lce.ops import loss as ops_loss

    loss = op.startswith("loss")
    public = "linear_cross_entropy" if loss else "linear_logprobs"
    _wrap(fused_lce, public, "api")
    setattr(api, public, getattr(fused_lce, public))
    _wrap(ops_loss if loss else ops_logprobs, "_check", "op check")
    _wrap(registry, "resolve", "resolve")
    _wrap(driver, "run_forward")
    _wrap(tp, "_free_bytes")
    _wrap(kg, "lce_gemm", "lce_gemm launch")
    _wrap(kr, "combine")
    _wrap(kr, "target_logit")
    _wrap(torch.autograd, "grad", "autograd.grad")
    if loss:
        _wrap(driver, "forward", "driver.forward")
        _wrap(driver, "loss_from_stats")
        _wrap(tp.TritonProvider, "new_grads")
        _wrap(tp.TritonProvider, "fused")
        _wrap(tp, "_live_order", "live_order (sync)")
        _wrap(tp, "plan_token_chunk")
        _wrap(kr, "dz_from_exp")
        _wrap(tp.TritonProvider, "_token_gemms", "token_gemms")
        _wrap(tp.TritonProvider, "finish")
    else:
        _wrap(driver, "logprobs_forward")
        _wrap(driver, "logprobs_from_stats")
        _wrap(driver, "logprobs_backward")
        _wrap(driver, "logprob_coefs")
        _wrap(driver, "run_backward")
        _wrap(tp, "_live_order", "live_order (sync)")
        _wrap(tp.TritonProvider, "token_block")
        _wrap(tp.TritonProvider, "stats")
        _wrap(tp.TritonProvider, "grads")
        _wrap(tp, "_live_order_device", "live_order (device)")


def step_stamps(op, h, w, y, queued_cycles=0):
    torch.cuda.synchronize()
    STAMPS.clear()
    t0 = time.perf_counter()
    r = _step(op, h, w, y, queued_cycles)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    del r
    seen, out = {}, []
    for label, t in STAMPS:  # the k-th occurrence of a label gets its own row
        seen[label] = seen.get(label, 0) + 1
        out.append((f"{label} #{seen[label]}" if seen[label] > 1 else label, (t - t0) * 1e6))
    return out + [("step issued", (t1 - t0) * 1e6)]


def launch_profile(h, w, reps=100, k=30):
    """Median host microseconds of one EXP logits-GEMM launch and the self-time profile of ``reps`` of them."""
    from fused_lce.backends.triton.kernels import gemm as kg

    n, d = h.shape
    v = w.shape[0]
    cfg = kg.default_config(d)
    out = torch.empty(n, -(-v // 64) * 64, device=h.device, dtype=h.dtype)[:, :v]
    tiles = kg.TileStats.new(n, kg.num_tiles_n(v, cfg), h.device, False)
    launch = getattr(kg.lce_gemm, "__wrapped__", kg.lce_gemm)
    times, pr = [], cProfile.Profile()
    for k_ in range(2 * reps):
        if k_ % 10 == 0:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if k_ >= reps:
            pr.enable()
        launch(kg.MODE_EXP, h, w, out, cfg, tiles=tiles)
        if k_ >= reps:
            pr.disable()
        else:
            times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(k)
    return statistics.median(times), s.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="2048x1536x151936,8192x4096x151936")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--op", choices=OPS, default="loss", help="the step timed (default: the loss, fwd+bwd)")
    ap.add_argument("--launch-profile", action="store_true", help="profile the EXP GEMM's launch alone")
    ap.add_argument("--queued-ms", type=float, default=0.0, help="device work queued before each step's call (ms)")
    args = ap.parse_args()
    cycles = int(args.queued_ms * sleep_cycles_per_ms()) if args.queued_ms > 0 else 0
    os.makedirs(args.out, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    rows = []
    for shape in args.shapes.split(","):
        n, d, v = map(int, shape.split("x"))
        h, w, y = make_inputs(n, d, v, dtype, "cuda", seed=n + v)
        step = functools.partial(_step, args.op, h, w, y, cycles)
        for _ in range(3):
            step()
        plain = statistics.median(_event_ms(step) for _ in range(args.reps))
        install(args.op)
        runs = [step_stamps(args.op, h, w, y, cycles) for _ in range(args.reps + 2)][2:]
        stamped = statistics.median(_event_ms(step) for _ in range(args.reps))
        uninstall()
        labels = [k for k, _ in runs[0]]
        med = {k: statistics.median(dict(r)[k] for r in runs if k in dict(r)) for k in labels}
        row = {"shape": shape, "dtype": args.dtype, "op": args.op, "queued_ms": args.queued_ms, "step_ms": plain,
               "step_ms_stamped": stamped,
               "stamps_us": {k: round(t, 1) for k, t in med.items()}}
        if args.launch_profile:
            row["launch_us"], row["launch_self"] = launch_profile(h, w)
            print(f"EXP GEMM launch: {row['launch_us']:.1f} us on the host\n{row['launch_self']}", flush=True)
        rows.append(row)
        print(json.dumps({"shape": shape, "step_ms": round(plain, 3), "stamped_ms": round(stamped, 3)}), flush=True)
        prev = 0.0
        for k, t in med.items():
            print(f"  {t:9.1f} us  (+{t - prev:7.1f})  {k}", flush=True)
            prev = t
        del h, w, y
        torch.cuda.empty_cache()
    env = environment("cuda")
    env["commit"] = os.environ.get("FUSED_LCE_COMMIT") or env.get("commit")
    base = os.path.join(args.out, f"host_stamps_{args.dtype}" if args.op == "loss" else
                        f"host_stamps_{args.op}_{args.dtype}")
    with open(base + ".json", "w") as f:
        json.dump({"meta": {"environment": env}, "rows": rows}, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(f"# Host timeline of one {args.op} step, {args.dtype} ({env.get('gpu')}, torch {env['torch']}, "
                f"Triton {env.get('triton')}, commit {env['commit']})\n\nMedian microseconds from the step's start "
                f"over {args.reps} steps, the device synchronised before each.\n")
        for r in rows:
            f.write(f"\n## {r['shape']}: step {r['step_ms']:.3f} ms (stamped {r['step_ms_stamped']:.3f})\n\n"
                    "| us from start | gap us | stamp |\n|---|---|---|\n")
            prev = 0.0
            for k, t in r["stamps_us"].items():
                f.write(f"| {t:.1f} | {t - prev:.1f} | {k} |\n")
                prev = t
            if "launch_us" in r:
                f.write(f"\nEXP GEMM launch alone: {r['launch_us']:.1f} us on the host\n\n```\n{r['launch_self']}```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
