"""What is allocated at the peak of one fwd+bwd step, ours beside CCE torch_compile (CUDA).

gpu.py reports each method's peak extra memory; this script says what makes it up. It records the caching
allocator's history (``torch.cuda.memory._record_memory_history``) over one step after a warm-up, replays the
allocations and frees to the moment of the peak and lists the blocks alive then, grouped by the innermost Python
frame outside torch and the standard library that allocated them (for a torch.compile'd peer: its generated
code's file). It sums the requested sizes: ``max_memory_allocated`` (gpu.py) also counts the allocator's rounding
of each block, so the two peaks differ by that. Writes mem_peak.json and .md into --out.

    python benchmarks/mem_peak.py --shapes 8192x4096x151936,4096x4096x128256 --out /tmp/m
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu import GiB, _Env, fwd_bwd, method_table  # noqa: E402

from fused_lce.tools.bench import make_inputs  # noqa: E402

MiB = 2**20
MAX_ENTRIES = 200000  # allocator events recorded (the history keeps the last ones)


def _site(frames) -> str:
    """The innermost frame outside torch's and Python's own files (who asked for the block)."""
    for f in frames:
        name = f.get("filename", "")
        if "/torch/" in name or name.startswith("<") or "/python3" in name and "site-packages" not in name:
            continue
        return f"{os.path.basename(name)}:{f.get('line')} {f.get('name')}"
    return "?"


def peak_blocks(fn, env, h, w, y):
    """(peak extra bytes, {site: [bytes, count]} alive at the peak) of one step of ``fn``."""
    with _Env(env):
        r = fwd_bwd(fn, h, w, y)
        del r
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
        try:
            r = fwd_bwd(fn, h, w, y)
            torch.cuda.synchronize()
            del r
            snap = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][torch.cuda.current_device()]
    if len(trace) >= MAX_ENTRIES:  # a ring buffer: the first events were dropped, the replay would be wrong
        raise RuntimeError(f"more than {MAX_ENTRIES} allocator events in one step")
    live, cur, best, best_live = {}, 0, 0, {}
    for ev in trace:
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], _site(ev.get("frames", [])))
            cur += ev["size"]
            if cur > best:
                best, best_live = cur, dict(live)
        elif ev["action"] in ("free_requested",) and ev["addr"] in live:
            cur -= live.pop(ev["addr"])[0]
    sites = {}
    for size, site in best_live.values():
        s = sites.setdefault(site, [0, 0])
        s[0] += size
        s[1] += 1
    return best, dict(sorted(sites.items(), key=lambda kv: -kv[1][0]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="8192x4096x151936,4096x4096x128256")
    ap.add_argument("--methods", default="fused_lce,cce_torch_compile")
    ap.add_argument("--out", default="mem-out")
    args = ap.parse_args(argv)
    methods, _ = method_table()
    report, lines = {}, ["# Blocks alive at the peak of one bf16 fwd+bwd step (bytes allocated during the step)", ""]
    for shape in args.shapes.split(","):
        n, d, v = (int(x) for x in shape.split("x"))
        h, w, y = make_inputs(n, d, v, torch.bfloat16, "cuda", seed=n + v)
        for name in args.methods.split(","):
            if name not in methods:
                continue
            peak, sites = peak_blocks(*methods[name], h, w, y)
            report[f"{shape} {name}"] = {"peak_bytes": peak, "sites": sites}
            lines += [f"## {shape} {name}: {peak / GiB:.4f} GiB ({peak} bytes)", "",
                      "| bytes | MiB | blocks | allocated at |", "|---|---|---|---|"]
            lines += [f"| {b} | {b / MiB:.3f} | {c} | {s} |" for s, (b, c) in sites.items()]
            lines.append("")
            print(f"{shape} {name}: {peak} bytes", flush=True)
        del h, w, y
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "mem_peak.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "mem_peak.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
