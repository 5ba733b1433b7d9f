"""How much of the logits GEMM's launch is Triton's Python launch path: the EXP GEMM's launch through
``lce_gemm`` with Triton's own launch path (FUSED_LCE_TRITON_DIRECT=0: the JIT's binding, specialisation key and
cache lookup, then the launcher) and with the direct launch (kernels/launch.py), the compiled kernel's launcher
called alone with the same arguments, and the three host tensor descriptors' encoding alone. Median host
microseconds of back-to-back launches (synchronised every 20).

    PYTHONPATH=. python benchmarks/launch_probe.py [--shape 2048x1536x151936] [--reps 200]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="2048x1536x151936")
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    from fused_lce.backends.triton.kernels import gemm as kg
    from triton.backends.nvidia import driver as nvd

    n, d, v = (int(x) for x in a.shape.split("x"))
    dev = torch.device("cuda")
    h = torch.randn(n, d, device=dev, dtype=torch.bfloat16)
    w = torch.randn(v, d, device=dev, dtype=torch.bfloat16) * 0.02
    cfg = kg.default_config(d)
    e = torch.empty(n, -(-v // 64) * 64, device=dev, dtype=torch.bfloat16)[:, :v]
    tiles = kg.TileStats.new(n, kg.num_tiles_n(v, cfg), dev, False)

    def via_lce_gemm():
        kg.lce_gemm(kg.MODE_EXP, h, w, e, cfg, tiles=tiles)

    via_lce_gemm()
    torch.cuda.synchronize()
    kernel = next(iter(next(iter(kg._lce_gemm_kernel.device_caches.values()))[0].values()))
    captured = []
    run = kernel._run
    kernel._run = lambda *args: captured.append(args) or run(*args)
    os.environ["FUSED_LCE_TRITON_DIRECT"] = "0"  # Triton's own path hands the launcher its arguments
    via_lce_gemm()
    os.environ.pop("FUSED_LCE_TRITON_DIRECT")
    kernel._run = run
    args = captured[0]

    def direct():
        run(*args)

    descs = [x for x in args if isinstance(x, kg.TensorDescriptor)]
    meta = getattr(kernel.metadata, "tensordesc_meta", None) or [None] * len(descs)

    def encode():
        for x, m in zip(descs, meta):
            nvd.make_tensordesc_arg(x, m)

    out = {}
    via_lce_gemm()
    for name, fn, mode in (("triton_path", via_lce_gemm, "0"), ("direct_path", via_lce_gemm, "1"),
                           ("launcher", direct, "1"), ("descriptors", encode, "1")):
        os.environ["FUSED_LCE_TRITON_DIRECT"] = mode
        times = []
        for i in range(a.reps):
            if i % 20 == 0:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        out[name] = round(statistics.median(times), 1)
    print("LAUNCH " + json.dumps(dict(shape=a.shape, us=out)))


if __name__ == "__main__":
    main()
