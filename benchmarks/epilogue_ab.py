"""A/B of epilogue variants of the fused logits GEMM (kernels/gemm.py), one process, shuffled rounds.

The variants are text edits of the committed kernel source, written next to the results and imported as separate
modules, so the committed kernel is the "base" of every comparison:

* ``early``: EXP issues the first column half's store before the row sums (the base waits for that store to leave
  shared memory right after issuing it, before the second half can be written there).
* ``dzhalf``: DZ forms and stores the tile one column half at a time (the first half's store overlaps the second
  half's arithmetic).

Rows are the live rows of a 15%-ignored batch (the one-pass loss and the log-probs compute only those). Every
variant's outputs are compared with the base's on each shape (max abs difference, expected 0).
    PYTHONPATH=. python benchmarks/epilogue_ab.py --out DIR [--rounds 12]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import statistics
import sys
import time

import torch

# Each variant replaces these exact pieces of kernels/gemm.py (build() raises when one is no longer there).
OLD_STATS = '''    else:
        m_t = tl.max(z, axis=1)
        ref = tl.where(m_t == float("-inf"), 0.0, m_t)
        out = tl.exp2((z - ref[:, None]) * 1.4426950408889634)
        s_t = tl.sum(out, axis=1)
        # first argmax: the lowest column holding the max (cheaper than tl.argmax's (value, index) reduction)
        am = tl.min(tl.where(z == m_t[:, None], cols[None, :], 2147483647), axis=1)
'''
NEW_STATS_EARLY = '''    else:
        m_t = tl.max(z, axis=1)
        ref = tl.where(m_t == float("-inf"), 0.0, m_t)
        # first argmax: the lowest column holding the max (cheaper than tl.argmax's (value, index) reduction)
        am = tl.min(tl.where(z == m_t[:, None], cols[None, :], 2147483647), axis=1)
        out = tl.exp2((z - ref[:, None]) * 1.4426950408889634)
        if MODE == 0:
            if SUBTILE == 2:  # the first half's store runs while the row sums are formed
                e_halves = tl.permute(tl.reshape(out, (BM, 2, BN // 2)), (0, 2, 1))
                e0, e1 = tl.split(e_halves)
                o_desc.store([off_m, off_n], e0.to(tl.bfloat16 if OUT_BF16 else tl.float16))
        s_t = tl.sum(out, axis=1)
'''
OLD_STORE = '''    if MODE != 1:
        out_ty = tl.bfloat16 if OUT_BF16 else tl.float16
        if SUBTILE == 2:'''
NEW_STORE_EARLY = '''    if MODE == 0 and SUBTILE == 2:
        o_desc.store([off_m, off_n + BN // 2], e1.to(tl.bfloat16 if OUT_BF16 else tl.float16))
    elif MODE != 1:
        out_ty = tl.bfloat16 if OUT_BF16 else tl.float16
        if SUBTILE == 2:'''

# DZ per column half: the first half's store runs while the second half's values are formed
OLD_DZ_HEAD = '''        yl = tl.load(y_ptr + rows, mask=rmask, other=-1).to(tl.int64) - label_off
        p = tl.exp2((z - lse[:, None]) * 1.4426950408889634)'''
NEW_DZ_HEAD = '''        yl = tl.load(y_ptr + rows, mask=rmask, other=-1).to(tl.int64) - label_off
        if SUBTILE == 2:
            z0, z1 = tl.split(tl.permute(tl.reshape(z, (BM, 2, BN // 2)), (0, 2, 1)))
            c0 = off_n + tl.arange(0, BN // 2)
            d0 = _dz_part(z0, c0, lse, a, tc, uc, cb, yl, HAS_B, HAS_U)
            o_desc.store([off_m, off_n], d0.to(tl.bfloat16 if OUT_BF16 else tl.float16))
            d1 = _dz_part(z1, c0 + BN // 2, lse, a, tc, uc, cb, yl, HAS_B, HAS_U)
            o_desc.store([off_m, off_n + BN // 2], d1.to(tl.bfloat16 if OUT_BF16 else tl.float16))
        p = tl.exp2((z - lse[:, None]) * 1.4426950408889634)'''
OLD_DZ_STORE = '''    if MODE != 1:
        out_ty'''
NEW_DZ_STORE = '''    if MODE == 0 or (MODE == 2 and SUBTILE != 2):
        out_ty'''
DZ_PART = '''
@triton.jit
def _dz_part(z, cols, lse, a, tc, uc, cb, yl, HAS_B: tl.constexpr, HAS_U: tl.constexpr):
    p = tl.exp2((z - lse[:, None]) * 1.4426950408889634)
    if HAS_B:
        out = p * (a[:, None] + cb[:, None] * tl.maximum(z, lse[:, None] - 104.0))
    else:
        out = a[:, None] * p
    if HAS_U:
        out = out - uc[:, None]
    out = tl.where(cols[None, :] == yl[:, None], out - tc[:, None], out)
    dead = (a == 0.0) & (tc == 0.0) & (uc == 0.0) & (cb == 0.0)
    return tl.where(dead[:, None], 0.0, out)


@triton.jit
def _one_tile('''


def _edit(src: str, old: str, new: str) -> str:
    if old not in src:
        raise RuntimeError("kernels/gemm.py changed: a piece this script edits is gone:\n" + old)
    return src.replace(old, new, 1)


def build(src: str, name: str) -> str:
    """The source of variant ``name`` of the committed kernel source ``src``."""
    if name == "early":
        return _edit(_edit(src, OLD_STATS, NEW_STATS_EARLY), OLD_STORE, NEW_STORE_EARLY)
    if name == "dzhalf":
        s = _edit(_edit(src, OLD_DZ_HEAD, NEW_DZ_HEAD), OLD_DZ_STORE, NEW_DZ_STORE)
        return _edit(s, "\n@triton.jit\ndef _one_tile(", DZ_PART)
    raise KeyError(name)


def load(name: str, outdir: str):
    from fused_lce.backends.triton.kernels import gemm
    src = open(gemm.__file__).read()
    if name == "base":
        return gemm
    path = os.path.join(outdir, f"gemm_{name}.py")
    with open(path, "w") as f:
        f.write(build(src, name))
    spec = importlib.util.spec_from_file_location(f"gemm_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


SHAPES = ["6963x4096x151936", "3482x3584x152064", "13926x2048x151936", "6963x2304x256000", "1741x1536x151936"]


def _timed(fn, launches=2):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(launches):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / launches


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    mods = {name: load(name, args.out) for name in ("base", "early", "dzhalf")}
    kg = mods["base"]
    cfg = kg.default_config(4096)
    g16 = kg.GemmConfig.parse("128,256,64,3,8,16,2,1,0")
    results = []
    for shape in args.shapes.split(","):
        n, d, v = (int(x) for x in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(0)
        h = torch.randn(n, d, device="cuda", generator=g).bfloat16()
        w = (torch.randn(v, d, device="cuda", generator=g) / d ** 0.5 * 2).bfloat16()
        y = torch.randint(0, v, (n,), device="cuda", generator=g)
        vp = (v + 63) // 64 * 64
        outs = {k: torch.empty(n, vp, device="cuda", dtype=torch.bfloat16)[:, :v] for k in ("a", "b")}
        nt = kg.num_tiles_n(v, cfg)
        tiles = {k: kg.TileStats.new(n, nt, "cuda", False) for k in ("a", "b")}
        lse = torch.logsumexp((h[:64].float() @ w.float().t()), 1).mean().expand(n).contiguous() + 0.0
        a = torch.rand(n, device="cuda", generator=g)
        t = torch.rand(n, device="cuda", generator=g)
        b = torch.randn(n, device="cuda", generator=g) * 0.1
        sc = torch.tensor(0.5, device="cuda")
        items = {
            "cublas_bf16": lambda: torch.mm(h, w.t()),
            "stats": lambda: kg.lce_gemm(kg.MODE_STATS, h, w, None, cfg, tiles=tiles["a"]),
            "exp_base": lambda: kg.lce_gemm(kg.MODE_EXP, h, w, outs["a"], cfg, tiles=tiles["a"]),
            "exp_early": lambda: mods["early"].lce_gemm(kg.MODE_EXP, h, w, outs["b"], cfg, tiles=tiles["b"]),
            "exp_group16": lambda: kg.lce_gemm(kg.MODE_EXP, h, w, outs["b"], g16, tiles=tiles["b"]),
            "dz_base": lambda: kg.lce_gemm(kg.MODE_DZ, h, w, outs["a"], cfg, labels=y, lse=lse, a=a, t=t, b=b,
                                           scale=sc),
            "dz_half": lambda: mods["dzhalf"].lce_gemm(kg.MODE_DZ, h, w, outs["b"], cfg, labels=y, lse=lse, a=a, t=t,
                                                       b=b, scale=sc),
        }
        # identical outputs: base vs variant on the same inputs
        check = {}
        for base_k, var_k in (("exp_base", "exp_early"), ("exp_base", "exp_group16"), ("dz_base", "dz_half")):
            items[base_k]()
            items[var_k]()
            torch.cuda.synchronize()
            diff = float((outs["a"].float() - outs["b"].float()).abs().max())
            if base_k == "exp_base":
                diff = max(diff, *(float((x - y_).abs().max().float()) for x, y_ in
                                   zip((tiles["a"].m, tiles["a"].s, tiles["a"].am),
                                       (tiles["b"].m, tiles["b"].s, tiles["b"].am))))
            check[var_k] = diff
        for fn in items.values():  # compile and warm
            fn()
        torch.cuda.synchronize()
        times = {k: [] for k in items}
        rng = random.Random(1)
        for _ in range(args.rounds):
            order = list(items)
            rng.shuffle(order)
            for k in order:
                times[k].append(_timed(items[k]))
        med = {k: statistics.median(x) for k, x in times.items()}
        row = {"shape": shape, "ms": med, "spread": {k: [min(x), max(x)] for k, x in times.items()},
               "max_abs_diff_vs_base": check}
        results.append(row)
        print(shape, " ".join(f"{k} {m:.3f}" for k, m in med.items()), "diff", check, flush=True)
        del h, w, outs, tiles
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "python": platform.python_version(),
            "commit": os.environ.get("FUSED_LCE_COMMIT", "unknown"), "rounds": args.rounds,
            "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    with open(os.path.join(args.out, "epilogue_ab.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    lines = [f"# Epilogue A/B ({meta['device']}, torch {meta['torch']}, Triton {meta['triton']}, commit "
             f"{meta['commit']}, {meta['time']})", "",
             f"Median ms of {args.rounds} shuffled rounds (2 launches each); rows = live rows of a 15%-ignored batch.",
             "", "| shape | " + " | ".join(results[0]["ms"]) + " |", "|---|" + "---|" * len(results[0]["ms"])]
    for r in results:
        lines.append(f"| {r['shape']} | " + " | ".join(f"{m:.3f}" for m in r["ms"].values()) + " |")
    with open(os.path.join(args.out, "epilogue_ab.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
