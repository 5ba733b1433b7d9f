"""Benchmark of fused_lce.linear_logprobs (per-token log-probs, with and without the entropy) against the logits
path (logits / temperature -> log_softmax -> gather, entropy from the logits: what an RL trainer does without a
fused head), forward + backward with random upstream gradients on both outputs.

Each (shape, method) runs in a fresh subprocess and records:
  - time: min (and all values) of --reps forward+backward runs (CUDA: synchronised), and the process CPU time,
  - peak extra memory: CPU: peak RSS (VmHWM) of the runs minus the RSS once the inputs exist (gradients included);
    CUDA: max_memory_allocated minus what was allocated before the runs,
  - the load average before / after (the machine may be shared: a case run under load is slower),
  - the per-token outputs, so the parent reports their error against a float64 reference of the same inputs
    (chunked over tokens; on the GPU for --device cuda) and the relative difference of dX against the logits path,
  - which provider ran the fused methods (and, for "triton", which of its two paths: the fused-GEMM path or cuBLAS
    + the row kernel, which takes temperature != 1 and entropy).
Inputs come from fused_lce.tools.bench.make_inputs (15% of labels ignored), the environment from fused_lce.tools.bench.environment.
Writes <--name>.json and .md (default logprobs_<device>) into --out (default benchmarks/results).

    python benchmarks/logprobs.py                                  # CPU: a small shape and the Qwen2.5-0.5B head
    python benchmarks/logprobs.py --device cuda --dtype bfloat16 --shapes 8192x4096x151936 --reps 3 \
        --backend triton --name logprobs_h200                      # the H200 run of benchmarks/results/
    python benchmarks/logprobs.py --shapes 512x896x32768 --reps 2 --out /tmp/b
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = ["512x896x32768", "2048x896x151936"]  # small; Qwen2.5-0.5B head (tokens x hidden x vocab)
METHODS = ["fused", "fused_no_entropy", "logits", "logits_no_entropy"]
MIB = 2**20


def _load():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm() -> int:
    """Peak RSS of this process image (VmHWM). Not ru_maxrss: a child started by subprocess inherits the
    parent's maximum RSS at the fork in ru_maxrss, which would count the parent's memory."""
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))


def _reset_hwm() -> None:
    """Start VmHWM afresh from the current RSS (Linux >= 4.0), so input generation does not count."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _run(method, h, w, y, temperature, backend):
    import torch

    entropy = not method.endswith("no_entropy")
    if method.startswith("fused"):
        import fused_lce

        out = fused_lce.linear_logprobs(h, w, y, temperature=temperature, return_entropy=entropy, backend=backend)
        return out if entropy else (out, None)
    logits = (h @ w.t()).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    valid = y != -100
    lp = torch.where(valid, logp_all.gather(-1, y.clamp(min=0)[:, None]).squeeze(-1), 0.0)
    ent = torch.where(valid, -(logp_all.exp() * logp_all).sum(-1), 0.0) if entropy else None
    return lp, ent


def _provider(args, h, w, y, entropy):
    """(provider name, its path) that linear_logprobs resolves for these inputs."""
    from fused_lce.core import registry
    from fused_lce.core import Options, Problem, Tensors

    opts = Options(backend=args.backend, temperature=args.temperature, entropy=entropy)
    t = Tensors(h, w, y, None)
    prov = registry.resolve(args.backend, Problem.of(t, opts, op="logprobs"))
    path = None
    if prov.name == "triton":
        path = "fused-GEMM" if prov.path_reason(t, opts) is None else "cuBLAS + row kernel"
    return prov.name, path


def child(args):
    """One method on one shape in this fresh process; prints one JSON line, saves outputs to args.save."""
    import torch

    from fused_lce.tools.bench import make_inputs

    n, d, v = (int(x) for x in args.shape.split("x"))
    dev = torch.device(args.device)
    h, w, y = make_inputs(n, d, v, getattr(torch, args.dtype), dev, seed=args.seed)
    provider = path = None
    if args.method.startswith("fused"):
        provider, path = _provider(args, h, w, y, not args.method.endswith("no_entropy"))
    h.requires_grad_()
    w.requires_grad_()
    g = torch.Generator(device=dev).manual_seed(args.seed + 1)
    g_lp, g_ent = torch.randn(n, generator=g, device=dev), torch.randn(n, generator=g, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
    else:
        base = _rss()
        _reset_hwm()
    load0 = _load()
    walls, cpus = [], []
    for _ in range(args.reps):
        h.grad = w.grad = None
        sync()
        c0, t0 = time.process_time(), time.perf_counter()
        lp, ent = _run(args.method, h, w, y, args.temperature, args.backend)
        obj = (lp * g_lp).sum() + ((ent * g_ent).sum() if ent is not None else 0)
        obj.backward()
        sync()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        del obj
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev) - base
    else:
        peak = _hwm() - base
    torch.save({"lp": lp.detach().cpu(), "ent": None if ent is None else ent.detach().cpu(),
                "dh": h.grad.detach().float().cpu()}, args.save)
    print(json.dumps({"wall_s": min(walls), "walls": walls, "cpu_s": cpus[walls.index(min(walls))],
                      "peak_extra_mib": peak / MIB, "load_before": load0, "load_after": _load(),
                      "provider": provider, "path": path}), flush=True)


def reference(shape, dtype, device, seed, temperature, chunk_elems=2**26):
    """float64 per-token (logprob, entropy) of the same inputs, chunked over tokens (on the GPU for a CUDA device,
    else on CPU); returned on CPU."""
    import torch

    from fused_lce.tools.bench import make_inputs

    n, d, v = (int(x) for x in shape.split("x"))
    h, w, y = make_inputs(n, d, v, getattr(torch, dtype), device, seed=seed)
    if torch.device(device).type != "cuda":
        h, y = h.cpu(), y.cpu()
    w = w.to(h.device).double()
    lp = torch.zeros(n, dtype=torch.float64, device=h.device)
    ent = torch.zeros(n, dtype=torch.float64, device=h.device)
    step = max(1, chunk_elems // v)
    for i in range(0, n, step):
        logp = torch.log_softmax((h[i:i + step].double() @ w.t()) / temperature, dim=-1)
        yy = y[i:i + step]
        ok = yy != -100
        lp[i:i + step] = torch.where(ok, logp.gather(1, yy.clamp(min=0)[:, None]).squeeze(1), 0.0)
        ent[i:i + step] = torch.where(ok, -(logp.exp() * logp).sum(1), 0.0)
        del logp
    return lp.cpu(), ent.cpu()


def run_case(args, shape, method, save):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--shape", shape, "--method", method, "--device",
           args.device, "--dtype", args.dtype, "--reps", str(args.reps), "--seed", str(args.seed), "--temperature",
           str(args.temperature), "--backend", args.backend, "--save", save]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr or p.stdout)[-600:]}
    return json.loads(lines[-1])


def render(report) -> str:
    env = report["environment"]
    out = [f"# linear_logprobs vs the logits path ({env['device']}, {report['args']['dtype']}, temperature "
           f"{report['args']['temperature']})", "",
           f"torch {env['torch']}, {env.get('gpu') or env.get('cpu', '')}, {env['threads']} threads, commit "
           f"{env.get('commit')}, {env['date']}; load average at start {env.get('loadavg')} (shared machine: "
           f"times are under that load). Forward + backward with random upstream gradients on both outputs; "
           f"min of {report['args']['reps']} runs; peak extra memory includes the gradients (dW = V x D).", "",
           "| shape (N x D x V) | method | provider (path) | fwd+bwd s | CPU s | peak extra MiB | logp max abs err "
           "| entropy max abs err | dX rel diff vs logits | load before / after |", "|" + "---|" * 10]
    for r in report["results"]:
        if "error" in r:
            out.append(f"| {r['shape']} | {r['method']} | | error: {r['error'][-60:]!r} | | | | | | |")
            continue
        f = lambda k, fmt: (fmt.format(r[k]) if r.get(k) is not None else "-")  # noqa: E731
        prov = "-" if not r.get("provider") else r["provider"] + (f" ({r['path']})" if r.get("path") else "")
        out.append(f"| {r['shape']} | {r['method']} | {prov} | {r['wall_s']:.4f} | {r['cpu_s']:.2f} | "
                   f"{r['peak_extra_mib']:.0f} | {f('logp_err', '{:.1e}')} | {f('entropy_err', '{:.1e}')} | "
                   f"{f('dx_rel_diff', '{:.1e}')} | {r['load_before']} / {r['load_after']} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma list of NxDxV")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--backend", default="auto", help="fused_lce backend of the fused methods")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=int, default=1800, help="seconds per case")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--name", default="", help="file stem of the results (default logprobs_<device type>)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0
    import torch

    sys.path.insert(0, ROOT)
    from fused_lce.tools.bench import environment, rel_err

    env = environment(args.device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            ref_lp, ref_ent = reference(shape, args.dtype, args.device, args.seed, args.temperature)
            outs = {}
            for method in args.methods.split(","):
                save = os.path.join(tmp, f"{shape}_{method}.pt")
                r = {"shape": shape, "method": method, **run_case(args, shape, method, save)}
                if "error" not in r:
                    outs[method] = torch.load(save)
                    o = outs[method]
                    r["logp_err"] = float((o["lp"].double() - ref_lp).abs().max())
                    r["entropy_err"] = float((o["ent"].double() - ref_ent).abs().max()) if o["ent"] is not None else None
                print(json.dumps({k: v for k, v in r.items() if k != "walls"}), flush=True)
                rows.append(r)
            for r in rows:  # dX against the logits path with the same outputs differentiated
                if r["shape"] != shape or "error" in r:
                    continue
                base = "logits_no_entropy" if r["method"].endswith("no_entropy") else "logits"
                if base in outs and r["method"] in outs:
                    r["dx_rel_diff"] = rel_err(outs[r["method"]]["dh"], outs[base]["dh"])
    report = {"environment": env, "args": vars(args), "results": rows}
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, args.name or f"logprobs_{torch.device(args.device).type}")
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(render(report))
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
