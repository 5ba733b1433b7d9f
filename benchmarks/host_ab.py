"""A/B of host-time changes: ``host_stamps.py`` for several variants of the package, in interleaved rounds.

The H200's host runs 25-40% faster or slower from one process to the next, so one run of each variant cannot
resolve a change of ~0.2 ms; rounds of (variant A, B, C, ...) in turn, each a fresh process, can: compare the
variants round by round, where the host's speed is similar. A variant is ``name=TREE`` (a directory holding the
``fused_lce`` package to import first; ``.`` for this checkout; no ``+`` in it) with optional ``+VAR=value``
environment settings, e.g. ``base=/tmp/base`` and ``eager=.+FUSED_LCE_X=0``. Every run's ``host_stamps``
JSON is kept under ``--out/<op>_<variant>_<round>/``; the summary (``host_ab.json`` / ``host_ab.md``) lists
per op and variant the step time of each round and the time from the step's start at which chosen stamps
return.

    PYTHONPATH=. python benchmarks/host_ab.py --out bench-out --variant base=/tmp/base --variant new=. \
        [--ops logprobs,logprobs_nograd,loss] [--rounds 3] [--shape 2048x1536x151936] [--queued-ms 3]
    python benchmarks/host_ab.py --out DIR --summary-only    # the summary of runs already in DIR
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# the stamps a summary shows per op: where the GEMMs' launches return, and the large host pieces between them
MARKS = {
    "logprobs": ["lce_gemm launch <", "logprobs_from_stats <", "api <", "op check > #2", "logprob_coefs <",
                 "lce_gemm launch < #2", "step issued"],
    "logprobs_nograd": ["op check >", "lce_gemm launch <", "logprobs_from_stats <", "api <"],
    "loss": ["op check >", "lce_gemm launch <", "api <", "step issued"],
    "loss_checked": ["op check >", "lce_gemm launch <", "api <", "step issued"],
}


def _variant(spec: str) -> tuple[str, str, dict]:
    name, _, rest = spec.partition("=")
    tree, *env = rest.split("+")
    if not name or not tree or "_" in name:
        raise SystemExit(f"--variant: expected name=TREE[+VAR=value...] (name without '_'), got {spec!r}")
    return name, os.path.abspath(tree), dict(e.split("=", 1) for e in env)


def run(args) -> None:
    variants = [_variant(v) for v in args.variant]
    for rnd in range(1, args.rounds + 1):
        for name, tree, env in variants:
            for op in args.ops.split(","):
                out = os.path.join(args.out, f"{op}_{name}_{rnd}")
                e = dict(os.environ, **env)
                e["PYTHONPATH"] = os.pathsep.join([tree, ROOT, e.get("PYTHONPATH", "")])
                cmd = [sys.executable, os.path.join(HERE, "host_stamps.py"), "--op", op, "--shapes", args.shape,
                       "--reps", str(args.reps), "--queued-ms", str(args.queued_ms), "--out", out]
                try:
                    r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=args.timeout)
                    text, rc = r.stdout + r.stderr, r.returncode
                except subprocess.TimeoutExpired as t:  # a hung run: the next ones still run
                    text, rc = f"{t.stdout or ''}{t.stderr or ''}\ntimed out after {args.timeout} s", "timeout"
                os.makedirs(out, exist_ok=True)
                with open(os.path.join(out, "log.txt"), "w") as f:
                    f.write(text if isinstance(text, str) else str(text))
                print(f"round {rnd} {name} {op}: rc {rc}", flush=True)


def summary(out_dir: str) -> dict:
    runs: dict = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "*_*_*", "host_stamps_*.json"))):
        op, name, rnd = os.path.basename(os.path.dirname(path)).rsplit("_", 2)
        with open(path) as f:
            data = json.load(f)
        for row in data["rows"]:
            runs.setdefault(op, {}).setdefault(name, []).append(
                {"round": int(rnd), "shape": row["shape"], "step_ms": round(row["step_ms"], 3),
                 "marks_us": {m: row["stamps_us"].get(m) for m in MARKS.get(op, [])},
                 "commit": data["meta"]["environment"].get("commit")})
    for op in runs.values():
        for rows in op.values():
            rows.sort(key=lambda r: r["round"])
    return runs


def write_summary(out_dir: str, runs: dict) -> None:
    with open(os.path.join(out_dir, "host_ab.json"), "w") as f:
        json.dump(runs, f, indent=1)
    lines = ["# Host A/B (host_ab.py): interleaved rounds, one process per run", "",
             "Per op and variant: the step's median time (ms, CUDA events, device synchronised before each step) "
             "in each round, and when the named stamps return (us from the step's start), round by round.", ""]
    for op, variants in runs.items():
        lines += [f"## {op}", "", "| variant | step ms by round | median | " +
                  " | ".join(MARKS.get(op, [])) + " |", "|---|---|---|" + "---|" * len(MARKS.get(op, []))]
        for name, rows in variants.items():
            steps = [r["step_ms"] for r in rows]
            marks = [" / ".join("-" if r["marks_us"][m] is None else f"{r['marks_us'][m]:.0f}" for r in rows)
                     for m in MARKS.get(op, [])]
            lines.append(f"| {name} | {' / '.join(f'{s:.2f}' for s in steps)} | {statistics.median(steps):.2f} | "
                         + " | ".join(marks) + " |")
        lines.append("")
    with open(os.path.join(out_dir, "host_ab.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", action="append", default=[], help="name=TREE[+VAR=value...] (repeat)")
    ap.add_argument("--ops", default="logprobs,logprobs_nograd,loss")
    ap.add_argument("--shape", default="2048x1536x151936")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per run")
    ap.add_argument("--queued-ms", type=float, default=0.0, help="host_stamps.py --queued-ms of every run")
    ap.add_argument("--summary-only", action="store_true", help="summarise the runs already under --out")
    args = ap.parse_args(argv)
    if not args.summary_only:
        if len(args.variant) < 2 or args.rounds < 1:
            ap.error("give at least two --variant and --rounds >= 1")
        run(args)
    write_summary(args.out, summary(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
