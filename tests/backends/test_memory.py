"""A CPU problem whose logits alone would need > 4 GiB runs in far less memory (peak RSS of a fresh
process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import fused_lce

SCRIPT = r"""
import json, resource, sys, time, torch, fused_lce
backend = sys.argv[1]
def high_water():
    # this process's own peak RSS: ru_maxrss keeps the parent's across fork + exec (a large pytest process
    # would set the floor), VmHWM belongs to the memory map exec made
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) * 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
# fp32 logits: 8192 * 140000 * 4 B = 4.27 GiB (and as much again for their gradient)
n, d, v = 8192, 32, 140000
torch.manual_seed(0)
h = torch.randn(n, d, requires_grad=True)
w = (torch.randn(v, d) * 0.2).requires_grad_()
y = torch.randint(0, v, (n,))
base = high_water()
t0 = time.perf_counter()
loss = fused_lce.linear_cross_entropy(h, w, y, backend=backend)
loss.backward()
dt = time.perf_counter() - t0
peak = high_water()
# sanity: the loss of random logits of this scale is near log(V)
print(json.dumps({"peak": peak, "base": base, "loss": loss.item(), "seconds": dt,
                  "grad_finite": bool(torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all())}))
"""

LOGITS_BYTES = 8192 * 140000 * 4


@pytest.mark.slow
@pytest.mark.parametrize("backend", [n for n in ("torch", "cpp") if fused_lce.backend_info()[n]["available"]])
def test_peak_rss_far_below_logits(backend):
    env = dict(os.environ, FUSED_LCE_TILE_MB="256")
    out = subprocess.run([sys.executable, "-c", SCRIPT, backend], capture_output=True, text=True, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert LOGITS_BYTES > 4 * 2**30
    extra = r["peak"] - r["base"]
    # inputs are ~19 MiB, gradients as much, tiles 256 MiB; the plain path would need > 8 GiB here
    assert r["peak"] < 1.5 * 2**30, r
    assert extra < 0.75 * 2**30, r
    assert 11.0 < r["loss"] < 13.0 and r["grad_finite"], r
