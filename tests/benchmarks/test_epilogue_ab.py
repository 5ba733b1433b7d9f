"""benchmarks/epilogue_ab.py on the CPU: its text edits still apply to the committed kernel source, and every
variant computes what the committed kernel computes (EXP tile, tile statistics, DZ tile; bit for bit) under
TRITON_INTERPRET=1 on a few odd-sized tiles with dead rows, a device row count and the entropy term."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import triton  # noqa: F401
    HAS_TRITON = True
except ImportError:  # pragma: no cover
    HAS_TRITON = False

SCRIPT = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/benchmarks")
import epilogue_ab
res = {}
for name in ("base", "early", "dzhalf"):
    kg = epilogue_ab.load(name, sys.argv[2])
    cfg = kg.GemmConfig.parse("32,64,16,2,4,2,2,1")  # persistent, the output stored in two column halves
    g = torch.Generator().manual_seed(int(sys.argv[3]))
    n, d, v = 45, 32, 333
    h = torch.randn(n, d, generator=g).bfloat16()
    w = (torch.randn(v, d, generator=g) / 3).bfloat16()
    y = torch.randint(0, v, (n,), generator=g)
    y[::5] = -100
    e = torch.zeros(n, 384, dtype=torch.bfloat16)[:, :v]
    tiles = kg.TileStats.new(n, kg.num_tiles_n(v, cfg), "cpu", True, False)
    kg.lce_gemm(kg.MODE_EXP, h, w, e, cfg, tiles=tiles, smooth=True, live=torch.tensor(40))
    dz = torch.zeros(n, 384, dtype=torch.bfloat16)[:, :v]
    lse = torch.randn(n, generator=g) + 5
    a, t, b = torch.rand(n, generator=g), torch.rand(n, generator=g), torch.randn(n, generator=g)
    a[3] = t[3] = b[3] = 0  # a dead row: exact zeros
    kg.lce_gemm(kg.MODE_DZ, h, w, dz, cfg, labels=y, lse=lse, a=a, t=t, b=b, scale=torch.tensor(0.5))
    res[name] = [x.float() for x in (e, tiles.m[:40], tiles.s[:40], tiles.am[:40], tiles.zs[:40], dz)]
out = {k: [float((x - y_).abs().max()) for x, y_ in zip(res[k], res["base"])] for k in ("early", "dzhalf")}
out["nonzero"] = [int((res["base"][0] != 0).sum()), int((res["base"][5] != 0).sum())]
print("RESULT" + json.dumps(out))
"""


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_variants_match_the_committed_kernel(tmp_path, seed):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, ROOT, str(tmp_path), str(seed % 2**31)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1][len("RESULT"):])
    assert min(out["nonzero"]) > 1000, out  # the tiles were written
    assert out["early"] == [0.0] * 6 and out["dzhalf"] == [0.0] * 6, out
