"""The "triton" CUDA backend: both paths (the fused logits GEMM and cuBLAS + row kernel), every schedule,
kernel variant, graph capture and torch.compile on the GPU, and the "torch" provider's compiled CUDA tiles
(marked ``cuda``: run on the H200 with ``python -m pytest -m cuda -q tests/``), plus, on CPU (CI), the chunk
planners and every Triton kernel run under ``TRITON_INTERPRET=1`` in a subprocess (the interpreter has to be
switched on before Triton compiles anything, so it cannot share this process). The interpreter runs the same
kernels (tensor descriptors included) with small tile configurations; it cannot show TMA / wgmma code
generation or speed."""
from __future__ import annotations

import json
import math
import os
import itertools
import subprocess
import sys

import pytest
import torch

import fused_lce

from ..conftest import (GRAD_TOL, assert_grads_close, assert_loss_close, assert_lse_close, fp64_reference,
                        rel_err)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_TRITON = True
try:
    import triton  # noqa: F401
except Exception:  # noqa: BLE001
    HAS_TRITON = False

cuda = pytest.mark.cuda
needs_triton_cuda = pytest.mark.skipif(
    not (HAS_TRITON and torch.cuda.is_available()), reason="needs Triton and an NVIDIA GPU")


def _tc():
    from fused_lce.backends import triton as tc

    return tc


# ------------------------------------------------------------------------------------------- planner (CPU)
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("n,d,v", [(8192, 4096, 151936), (32768, 4096, 151936), (4096, 3584, 152064),
                                   (8191, 5120, 151936), (7, 3, 11), (100000, 512, 32000)])
def test_token_plan_respects_memory_rule(n, d, v):
    tc = _tc()
    for want_dw, free, full in itertools.product((True, False), (None, 140 * 2**30, 6 * 2**30),
                                                 (0, tc.planner.FULL_RATE_ROWS)):
        rows, acc = tc.plan_token_chunk(n, v, d, 2, want_dw, False, 0, free, None, full)
        assert 1 <= rows <= n
        buf = rows * v * 4
        fewest = -(-n // -(-n // full)) if full else 0  # the rows of ceil(n / full) balanced chunks
        if rows == n and not acc:
            # one chunk: the buffer replaces the fp32 accumulator (or no more than ceil(n / full) chunks)
            assert buf <= tc.SLACK + (4 * v * d if want_dw else 0) or rows <= max(tc.MIN_ROWS, fewest)
        else:
            assert acc == want_dw
            assert (buf <= tc.SLACK + (2 * v * d if want_dw else 0) + 8 * 4 * v or rows == min(n, tc.MIN_ROWS)
                    or rows <= fewest + 8)
        if free is not None and rows > tc.MIN_ROWS:
            assert buf + (4 * v * d if acc else 2 * v * d if want_dw else 0) <= 0.75 * free + 8 * 4 * v
        if full and (free is None or free > 100 * 2**30):
            # never more chunks than ceil(n / full) with memory to spare
            assert -(-n // rows) <= -(-n // full)
    for free, full in itertools.product((140 * 2**30, 6 * 2**30), (0, tc.planner.FULL_RATE_ROWS)):
        # float32 results (CUDA-graph capture): even one chunk accumulates dW in float32, within the cap too
        rows, acc = tc.plan_token_chunk(n, v, d, 2, True, True, 0, free, None, full)
        if rows > tc.MIN_ROWS:
            assert acc and rows * v * 4 + 4 * v * d <= 0.75 * free + 8 * 4 * v, (free, full, rows)
    rows, _ = tc.plan_token_chunk(n, v, d, 2, True, False, 1000, None)  # explicit tile budget wins
    assert rows == max(1, min(n, 1000 // (4 * v)))


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("op", ["loss", "logprobs"])
def test_recompute_blocks_leave_room_for_the_dw_accumulator(monkeypatch, op):
    """The recompute backward's token blocks (several of them accumulate dW in float32) fit the free memory
    with that accumulator: full-rate blocks only where the plan counts it."""
    # the fused-GEMM path on CPU tensors (planning only, no kernel)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FUSED_LCE_TRITON_GEMM", "1")
    from fused_lce.backends.triton import provider as P
    from fused_lce.core import Options, Problem

    free = 5 * 10**9
    monkeypatch.setattr(P, "_free_bytes", lambda device: free)
    n, d, v = 32768, 4096, 151936
    p = Problem(n, d, v, torch.bfloat16, torch.device("cpu"), False, Options(), (True, True, False), op)
    rows = P.PROVIDER.token_block(p, keep=False)
    row = P.PROVIDER._row_bytes(v, d, 2, p.opts, True)
    assert rows < n and rows * row + 4 * v * d <= 0.75 * free, (rows, rows * row + 4 * v * d)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_statistics_only_pass_is_one_block(monkeypatch):
    """A pass without gradients stores no logit (STATS epilogue): its token block counts the tile statistics
    only, so 16384 tokens of a 256000 vocabulary are one block, where the one-pass loss's buffer needs
    several."""
    # the fused-GEMM path on CPU tensors (planning only, no kernel)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FUSED_LCE_TRITON_GEMM", "1")
    from fused_lce.backends.triton.provider import PROVIDER
    from fused_lce.core import Options, Problem
    for op in ("loss", "logprobs"):
        p = Problem(16384, 2304, 256000, torch.bfloat16, torch.device("cpu"), False, Options(), op=op)
        assert PROVIDER.token_block(p, keep=False) == 16384, op
        p_grad = Problem(16384, 2304, 256000, torch.bfloat16, torch.device("cpu"), False, Options(),
                         (True, True, False), op)
        assert PROVIDER.token_block(p_grad, keep=op == "loss") < 16384, op


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("by_count", [False, True], ids=["scale-on-device", "scale-by-count"])
def test_one_pass_forms_token_weights_after_first_gemm(monkeypatch, dtype, by_count):
    """Until the first logits GEMM is queued the device waits for the host: bf16 queues only the live-row
    gather before it and forms the token weights and scale after it. fp16 takes its scale on the host
    (cuBLAS's alpha): from the live count when the weights give ``scale_of_count`` (then it forms them late
    too), else it forms them first and reads the scale right after the live count's synchronisation."""
    # the fused-GEMM path on CPU tensors (stopped at its first GEMM)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FUSED_LCE_TRITON_GEMM", "1")
    from fused_lce.backends.triton import provider as P
    from fused_lce.core import Options, Tensors, TokenWeights, formulas

    class Stop(Exception):
        pass

    formed, seen = [], []

    def gemm(*args, **kwargs):
        seen.append(bool(formed))
        raise Stop

    monkeypatch.setattr(P.kgemm, "lce_gemm", gemm)
    n, d, v = 40, 16, 64
    t = Tensors(torch.randn(n, d, dtype=dtype), torch.randn(v, d, dtype=dtype),
                torch.randint(0, v, (n,)), None)
    t.labels[::3] = -100
    tw = TokenWeights(t.labels != -100, lambda: formed.append(1) or
                                                ((t.labels != -100).float(), torch.tensor(0.5)),
                      (lambda count: 0.5 if count == int((t.labels != -100).sum()) else None)
                      if by_count else None)
    out = P.PROVIDER.new_grads(t, (True, True, False), fp32_dh=False, scaled=True)
    with pytest.raises(Stop):
        P.PROVIDER.fused(t, tw, formulas.loss_terms(Options(), v), Options(), out)
    assert seen == [dtype == torch.float16 and not by_count]
    st = out.extra[0]
    assert st.product_alpha() == (0.5 if dtype == torch.float16 else 1.0)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_vocab_plan():
    tc = _tc()
    for buf_elt in (4, 2):
        n, d, v = 8192, 4096, 151936
        cols = tc.plan_vocab_chunk(n, v, d, 2, (True, True, False), 0, buf_elt)
        assert 256 <= cols <= v and cols % 256 == 0
        grads = (n + v) * d * 2
        # the buffer fits what 1.15 (dX + dW) leaves after the float32 dX accumulator (or the 32 MiB floor)
        assert cols * n * buf_elt <= max(32 * 2**20, 0.15 * grads - 4 * n * d)
    assert tc.plan_vocab_chunk(10, 50, 4, 4, (True, True, True), 0) == 50
    assert tc.plan_vocab_chunk(10, 50, 4, 4, (True, True, True), 160) == 4


# ------------------------------------------------------------------------------------------ interpreter (CPU)
INTERP_SCRIPT = r"""
import json, os, sys, torch
sys.path.insert(0, sys.argv[1])
from fused_lce.core import driver, formulas
from fused_lce.backends import triton as tc
from fused_lce.core import Options, Tensors
from tests import conftest as C  # the fp64 reference and the tolerances of every test
torch.manual_seed(int(sys.argv[2]))
out = []
cases = [
    # (path, dtype, mode, n, d, v, options, tile bytes, GEMM tile configuration)
    ("cublas", "float32", "default", 23, 12, 2100, dict(label_smoothing=0.2, z_loss=0.01, softcap=4.0),
     9 * 2100 * 4, ""),
    ("cublas", "bfloat16", "default", 23, 12, 2100, dict(label_smoothing=0.1), 0, ""),
    ("cublas", "float16", "default", 23, 12, 2100, dict(z_loss=0.02), 0, ""),
    ("cublas", "bfloat16", "split", 19, 8, 2100, dict(softcap=3.0, label_smoothing=0.1), 7 * 2100 * 4, ""),
    ("cublas", "float32", "compact", 17, 8, 2100, dict(label_smoothing=0.3, z_loss=0.01), 17 * 4 * 900, ""),
    ("cublas", "bfloat16", "compact", 17, 8, 700, dict(softcap=2.0), 17 * 4 * 300, ""),
    ("cublas", "float16", "compact", 17, 8, 701, dict(), 0, ""),
    # the fused-GEMM path: EXP epilogue + dz from exp tiles (default), kept exp tiles (split), STATS + DZ
    # epilogues (compact, and the recompute backward of every case); odd V; one-tile and persistent grids
    ("gemm", "bfloat16", "default", 23, 24, 701, dict(label_smoothing=0.1, z_loss=0.01), 0,
     "32,64,16,2,4,2,2,0"),
    ("gemm", "float16", "default", 37, 16, 301, dict(), 9 * 310 * 2, "32,64,16,2,4,2,1,2"),
    ("gemm", "bfloat16", "split", 19, 16, 515, dict(label_smoothing=0.2), 7 * 520 * 2, "16,64,16,2,4,1,2,0"),
    ("gemm", "float16", "compact", 21, 24, 333, dict(z_loss=0.02, label_smoothing=0.1), 21 * 2 * 128,
     "16,64,16,2,4,2,2,1"),
    ("gemm", "bfloat16", "compact", 17, 8, 200, dict(), 0, "32,64,16,2,4,2,1,0"),
    # ignored tokens with logits ~1e3 (their saved lse is 0): the row kernel's and the DZ epilogue's zero
    # rows, the epilogue also with ignored rows computed (FUSED_LCE_SKIP_IGNORED=0)
    ("cublas", "float32", "default", 17, 8, 301, dict(scale=300.0), 0, ""),
    ("gemm", "bfloat16", "default", 23, 16, 301, dict(scale=300.0), 0, "32,64,16,2,4,2,2,0"),
    ("gemm", "bfloat16", "default", 23, 16, 301, dict(scale=300.0, skip="0"), 0, "32,64,16,2,4,2,2,0"),
    # softcap across its range: tiny, large (the logits to float32 rounding), the largest float
    ("cublas", "float32", "default", 17, 8, 301, dict(softcap=1e-3), 0, ""),
    ("cublas", "float32", "default", 17, 8, 301, dict(softcap=1e4, label_smoothing=0.1), 0, ""),
    ("cublas", "float32", "default", 17, 8, 301, dict(softcap=3.4028234663852886e38, scale=300.0), 0, ""),
]
fused = tc.TritonProvider.has_fused
for path, dt, mode, n, d, v, opts, tile, cfg in cases:
    os.environ["FUSED_LCE_TRITON_GEMM"] = "1" if path == "gemm" else "0"
    os.environ["FUSED_LCE_GEMM_CONFIG"] = cfg
    os.environ["FUSED_LCE_SKIP_IGNORED"] = opts.get("skip", "1")
    dtype = getattr(torch, dt)
    h = (torch.randn(n, d) * opts.get("scale", 1.0)).to(dtype)
    w = (torch.randn(v, d) / d ** 0.5 * 2).to(dtype)
    b = (torch.randn(v) * 0.5).to(dtype)
    y = torch.randint(0, v, (n,))
    y[torch.rand(n) < 0.25] = -100
    y[0] = int(torch.randint(0, v, ()))
    o = Options(label_smoothing=opts.get("label_smoothing", 0.0), z_loss=opts.get("z_loss", 0.0),
                softcap=opts.get("softcap", 0.0), tile_bytes=tile, vocab_total=v, backend="triton")
    os.environ["FUSED_LCE_COMPACT"] = "1" if mode == "compact" else "0"
    # "split": the statistics -> combine -> gradients path a vocab-parallel group takes (kept logits tiles)
    tc.TritonProvider.has_fused = property(lambda self: False) if mode == "split" else fused
    t = Tensors(h, w, y, b)
    assert (tc.TritonProvider.path_reason(t, o) is None) == (path == "gemm"), \
        (path, tc.TritonProvider.path_reason(t, o))
    scale = torch.tensor(1.0 / n)
    g = formulas.token_weights(*formulas.label_classes(y, o, v))
    st, grads = driver.run_forward(tc.PROVIDER, t, o, g, scale, (True, True, True))
    per, lse_ours, correct_ours = formulas.loss_from_stats(st, y, o, v)
    gl = torch.rand(n)
    gw = formulas.token_weights(*formulas.label_classes(y, o, v), gl)
    bk = driver.run_backward(tc.PROVIDER, t, lse_ours, formulas.loss_coefs(lse_ours, gw, o, v), o,
                             (True, True, True))
    ref_opts = dict(reduction="none", label_smoothing=o.label_smoothing, z_loss=o.z_loss,
                    softcap=o.softcap or None)
    r1 = C.fp64_reference(h, w, y, b, upstream=torch.full((n,), 1.0 / n), **ref_opts)
    r2 = C.fp64_reference(h, w, y, b, upstream=gl, **ref_opts)
    z = formulas.reference_logits(h, w, b, softcap=o.softcap)
    valid = y != -100
    correct = valid & (z.argmax(1) == y)
    def close(check, *args):
        try:
            check(*args)
            return True
        except AssertionError:
            return False
    out.append(dict(case=f"{path}-{dt}-{mode}-{n}x{d}x{v}-{sorted(opts)}",
                    loss=close(C.assert_loss_close, per, r1, dtype),
                    lse=close(C.assert_lse_close, lse_ours, r1),
                    correct=bool((correct_ours == correct).all()), dtypes=[t_.dtype == dtype for t_ in grads],
                    fwd=[C.grad_close(a, *r, dtype)[1:] for a, *r in zip(grads, r1.grads, r1.grad_scales,
                                                                       r1.grad_logit_scales)],
                    bwd=[C.grad_close(a, *r, dtype)[1:] for a, *r in zip(bk, r2.grads, r2.grad_scales,
                                                                       r2.grad_logit_scales)], dtype=dt,
                    zero_ignored=bool((bk[0][~valid] == 0).all())))
os.environ.pop("FUSED_LCE_SKIP_IGNORED")
# no tokens / an empty vocabulary, both paths: zero gradients of the right shapes, no out-of-bounds access
for path in ("1", "0"):
    os.environ["FUSED_LCE_TRITON_GEMM"] = path
    os.environ["FUSED_LCE_GEMM_CONFIG"] = "32,64,16,2,4,2,2,0"
    os.environ["FUSED_LCE_COMPACT"] = "0"
    tc.TritonProvider.has_fused = fused
    for n, v in ((0, 300), (5, 0), (0, 0)):
        h = torch.randn(n, 16).bfloat16(); w = torch.randn(v, 16).bfloat16(); y = torch.full((n,), -100)
        o = Options(vocab_total=v, backend="triton")
        g = formulas.token_weights(*formulas.label_classes(y, o, v))
        st, gr = driver.run_forward(tc.PROVIDER, Tensors(h, w, y, None), o, g, torch.tensor(0.0),
                                    (True, True, False))
        assert gr[0].shape == (n, 16) and gr[1].shape == (v, 16) and gr[2] is None, (path, n, v)
        assert float(gr[0].float().abs().sum()) == 0 and float(gr[1].float().abs().sum()) == 0, (path, n, v)
# the fused-GEMM path with ignored tokens skipped (no logit of theirs computed) or kept: the same statistics
# of the other tokens and the same gradients; every token ignored: gradients zero
os.environ["FUSED_LCE_TRITON_GEMM"] = "1"
for n, frac in ((29, 0.4), (9, 1.0)):
    h = torch.randn(n, 16).bfloat16(); w = (torch.randn(333, 16) / 2).bfloat16()
    y = torch.randint(0, 333, (n,))
    y[torch.rand(n) < frac] = -100
    y[-1] = -100
    o = Options(vocab_total=333, backend="triton", tile_bytes=7 * 384 * 2 if n > 9 else 0)
    g = formulas.token_weights(*formulas.label_classes(y, o, 333))
    res = {}
    for skip in ("1", "0"):
        os.environ["FUSED_LCE_SKIP_IGNORED"] = skip
        res[skip] = driver.run_forward(tc.PROVIDER, Tensors(h, w, y, None), o, g, torch.tensor(0.5),
                                       (True, True, False))
    os.environ.pop("FUSED_LCE_SKIP_IGNORED")
    keep = y != -100  # skipped: an ignored token's logits are never computed, its statistics left unset
    for a, b in zip(res["1"][0], res["0"][0]):
        assert torch.equal(a[keep], b[keep]), (n, a, b)
    for x in res["1"][0]:  # what unset statistics may hold: the driver's outputs must not read them
        x[~keep] = float("nan") if x.is_floating_point() else -7
    outs = [formulas.loss_from_stats(res[k][0], y, o, 333) for k in ("1", "0")]
    for a, b in zip(*outs):  # per-token loss, lse (0 where ignored), correct
        assert torch.equal(a, b), (n, a, b)
    lse_skip = outs[0][1].double()
    assert bool((lse_skip[~keep] == 0).all()), (n, lse_skip)
    # token chunks of other rows: float32 sums in another order,
    for a, b in zip(res["1"][1][:2], res["0"][1][:2]):
        a, b = a.float(), b.float()                        # so up to one bf16 rounding step apart
        assert bool(((a - b).abs() <= 2**-7 * b.abs() + 1e-6 * (1 + float(b.abs().max()))).all()), n
    ref_lse = torch.logsumexp(h.double() @ w.double().t(), 1)
    assert float(torch.where(keep, lse_skip - ref_lse, 0.0).abs().max()) < 1e-4, n
    if frac == 1.0:
        assert float(res["1"][1][0].float().abs().sum()) == 0 and \
            float(res["1"][1][1].float().abs().sum()) == 0
# the statistics-only pass (log-probs, reduction "none") over gathered rows: the combine kernel writes token
# order, neutral statistics (m 0, s 1, the rest 0) where the label is ignored, the others as when every row is
# computed; one vocabulary chunk and merged chunks (compact), entropy and the logit sum on
for compact, tile, frac in (("0", 0, 0.4), ("1", 17 * 2 * 128, 0.4), ("0", 0, 1.0), ("1", 17 * 2 * 128, 0.0)):
    os.environ["FUSED_LCE_COMPACT"] = compact
    os.environ["FUSED_LCE_GEMM_CONFIG"] = "16,64,16,2,4,2,2,0"
    h = torch.randn(17, 16).bfloat16(); w = (torch.randn(333, 16) / 2).bfloat16()
    y = torch.randint(0, 333, (17,))
    y[torch.rand(17) < frac] = -100
    if 0 < frac < 1:
        y[0], y[-1] = 5, -100
    o = Options(vocab_total=333, backend="triton", tile_bytes=tile, entropy=True, temperature=0.7,
                label_smoothing=0.1)
    res = {}
    for skip in ("1", "0"):
        os.environ["FUSED_LCE_SKIP_IGNORED"] = skip
        res[skip], _ = tc.PROVIDER.stats(Tensors(h, w, y, None), slice(0, 17), o, keep=False)
    os.environ.pop("FUSED_LCE_SKIP_IGNORED")
    keep = y != -100
    for name, a, b in zip(res["1"]._fields, res["1"], res["0"]):
        assert torch.allclose(a[keep].double(), b[keep].double(), rtol=1e-5, atol=1e-5), (compact, name, a, b)
        want = 1 if name == "s" else 0
        assert bool((a[~keep] == want).all()), (compact, name, a)
os.environ["FUSED_LCE_COMPACT"] = "0"
# fp16 with a loss scale of 0 (num_items=0): cuBLAS's alpha is not used for it, the results are multiplied at
# the end, so a bad label's NaN still poisons its dX row and dW and every other dX row is 0
os.environ["FUSED_LCE_GEMM_CONFIG"] = "32,64,16,2,4,2,2,0"
for path in ("1", "0"):
    os.environ["FUSED_LCE_TRITON_GEMM"] = path
    h = torch.randn(9, 16).half(); w = (torch.randn(300, 16) / 4).half(); y = torch.randint(0, 300, (9,))
    y[2], y[5] = -100, 300  # ignored, out of range
    o = Options(vocab_total=300, backend="triton")
    g = formulas.token_weights(*formulas.label_classes(y, o, 300))
    st, gr = driver.run_forward(tc.PROVIDER, Tensors(h, w, y, None), o, g, torch.tensor(0.0),
                                (True, True, False))
    assert gr[0].dtype == torch.float16 and bool(gr[0][5].isnan().all()) and bool(gr[1].isnan().any()), path
    assert float(gr[0][[0, 1, 2, 3, 4, 6, 7, 8]].float().abs().sum()) == 0, path
# fp16 with the scale from the live count on the host (the public loss's "mean" and "sum"): the same
# gradients, bit for bit, as when the weights are formed first and the scale is read from the device; also
# with ignored tokens kept in the products (FUSED_LCE_SKIP_IGNORED=0: the count is not taken then) and with
# every token ignored
import functools
from fused_lce.core import TokenWeights
os.environ["FUSED_LCE_TRITON_GEMM"] = "1"
h = torch.randn(23, 16).half(); w = (torch.randn(301, 16) / 4).half()
o = Options(vocab_total=301, backend="triton")
for y in (torch.where(torch.arange(23) % 4 == 0, -100, torch.randint(0, 301, (23,))),
          torch.full((23,), -100)):
    valid, bad = formulas.label_classes(y, o, 301)
    for red in ("mean", "sum"):
        make = lambda: (formulas.token_weights(valid, bad),
                        formulas.safe_inverse(formulas.mean_divisor(red, None, y, -100, valid)))
        for skip in ("1", "0"):
            os.environ["FUSED_LCE_SKIP_IGNORED"] = skip
            got = [driver.run_forward(tc.PROVIDER, Tensors(h, w, y, None), o,
                                      TokenWeights(valid, make, by), None, (True, True, False))[1]
                   for by in (None, functools.partial(formulas.count_scale, red))]
            assert all(a.dtype == torch.float16 and torch.equal(a, b)
                       for a, b in zip(got[0][:2], got[1][:2])), \
                (red, skip, int(valid.sum()))
os.environ.pop("FUSED_LCE_SKIP_IGNORED")
# a device row count (the statistics pass over gathered rows): the row tiles holding rows [0, live) are
# computed, the others never written; one program per tile and persistent
from fused_lce.backends.triton.kernels import gemm as kg
h = torch.randn(70, 16).bfloat16(); w = torch.randn(200, 16).bfloat16()
z = h.double() @ w.double().t()
for cfg_text in ("16,64,16,2,4,2,2,0", "16,64,16,2,4,2,2,1"):
    cfg = kg.GemmConfig.parse(cfg_text)
    for live in (0, 1, 33, 70):
        tiles = kg.TileStats.new(70, kg.num_tiles_n(200, cfg), "cpu", False)
        tiles.m.fill_(float("nan"))
        kg.lce_gemm(kg.MODE_STATS, h, w, None, cfg, tiles=tiles, live=torch.tensor(live))
        done = -(-live // cfg.bm) * cfg.bm
        want = torch.stack([z[:, j:j + 64].amax(1) for j in range(0, 200, 64)], 1).float()
        assert torch.allclose(tiles.m[:done], want[:done], atol=1e-3), (cfg_text, live)
        assert bool(tiles.m[done:].isnan().all()), (cfg_text, live)
# the upstream scale, one launch per three tensors of any dtypes and sizes: bit-identical when g == 1
from fused_lce.backends.triton.kernels import rows as kr
xs = [torch.randn(9001).bfloat16(), torch.randn(37), torch.randn(5000).half(), torch.randn(3, 3).bfloat16()]
keep = [x.clone() for x in xs]
kr.scale_unless_one_(xs, torch.ones(()))
assert all(torch.equal(x, k) for x, k in zip(xs, keep))
kr.scale_unless_one_(xs, torch.full((), -2.5))
for x, k in zip(xs, keep):  # the interpreter rounds to bf16 its own way: one bf16 step there
    want = (k.float() * -2.5).to(k.dtype).float()
    tol = 2**-7 if x.dtype == torch.bfloat16 else 0.0
    assert torch.allclose(x.float(), want, rtol=tol, atol=0), x.dtype
print("RESULT" + json.dumps(out))
"""


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_kernel_under_triton_interpreter(tmp_path, seed):
    """Every kernel variant of both paths on CPU tensors under TRITON_INTERPRET=1, through the backend's own
    schedules, against the float64 reference. cuBLAS path: fused stats+gradient, split statistics with merge,
    gradient only, in-place half-width dz. Fused-GEMM path: EXP / STATS / DZ epilogues, tile combine (merged
    over vocabulary chunks), dz from exp tiles, the label-logit dot, fused scale+cast. Bias, softcap,
    smoothing, z-loss, odd V, several chunks. The cuBLAS products fall back to CPU matmuls."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", INTERP_SCRIPT, ROOT, str(seed)], env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "interpret" in proc.stderr.lower() and "not supported" in proc.stderr.lower():
        pytest.skip("this Triton's interpreter cannot run the kernel: " + proc.stderr[-400:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    for r in json.loads(line[len("RESULT"):]):
        assert r["loss"] and r["lse"], r
        assert all(r["dtypes"]), r
        assert all(diff <= tol for diff, tol in r["fwd"] + r["bwd"]), r  # conftest's tolerances
        assert r["zero_ignored"], r  # the recompute backward's dX rows of ignored tokens
        if r["dtype"] == "float32":
            assert r["correct"], r


LOGPROB_INTERP_SCRIPT = r"""
import json, math, os, sys, torch
sys.path.insert(0, sys.argv[1])
import tests  # noqa: F401  (one single-threaded call into MKL's vector math first: tests/__init__.py)
import fused_lce
from fused_lce.core import registry
from fused_lce.core.formulas import reference_logprobs
from fused_lce.backends import triton as tc
torch.manual_seed(int(sys.argv[2]))

class Interp(tc.TritonProvider):  # the triton provider's kernels on CPU tensors (the interpreter)
    name = "triton_interp"
    device_types = ("cpu",)
    def unavailable_reason(self):
        return None

registry.register(Interp())

def rel(a, b):
    a = a.double(); b = b.double()
    return float((a - b).norm() / b.norm()) if float(b.norm()) > 0 else float((a - b).norm())

cases = [
    # (name, path, schedule, dtype, n, d, v, temperature, softcap, bias, masked columns, entropy, tile MiB)
    ("temp-softcap-bias-blocks", "cublas", "default", "float32", 23, 12, 4500, 0.7, 3.0, True, 0, True, 0.1),
    ("hot-bf16", "cublas", "default", "bfloat16", 17, 16, 2100, 1.3, 0.0, True, 0, True, None),
    ("entropy-t1-fp16", "cublas", "default", "float16", 13, 8, 700, 1.0, 0.0, False, 0, True, None),
    ("masked-vocab", "cublas", "default", "float32", 11, 8, 2100, 1.3, 0.0, True, 2060, True, None),
    ("compact-merge", "cublas", "compact", "float32", 23, 12, 2100, 0.8, 4.0, True, 700, True, 0.05),
    ("no-entropy-temp", "cublas", "default", "float32", 19, 8, 301, 0.5, 2.0, False, 0, False, None),
    ("gemm-t1-lp-only", "gemm", "default", "bfloat16", 21, 16, 333, 1.0, 0.0, True, 0, False, None),
    # the fused-GEMM path's temperature, entropy tile sums (whole -inf tiles of a masked bias) and entropy DZ
    # term
    ("gemm-temp-entropy-masked", "gemm", "default", "bfloat16", 23, 16, 700, 0.7, 0.0, True, 300, True, None),
    ("gemm-entropy-fp16-blocks", "gemm", "default", "float16", 19, 16, 333, 1.0, 0.0, False, 0, True, 0.01),
    ("gemm-compact-entropy", "gemm", "compact", "bfloat16", 17, 16, 515, 1.3, 0.0, True, 0, True, 0.005),
    # a low temperature: ignored tokens' tempered logits ~100s (their saved lse is 0); the DZ epilogue also
    # with the ignored rows computed
    ("cold-ignored", "cublas", "default", "float32", 17, 8, 301, 0.02, 0.0, True, 0, True, None),
    ("gemm-cold-ignored", "gemm", "default", "bfloat16", 21, 16, 333, 0.02, 0.0, True, 0, True, None),
    ("gemm-cold-keep-ignored", "gemm", "default", "bfloat16", 21, 16, 333, 0.02, 0.0, False, 0, True, None,
     {"FUSED_LCE_SKIP_IGNORED": "0"}),
    # softcaps large and tiny, with a temperature
    ("softcap-1e4", "cublas", "default", "float32", 17, 8, 301, 0.7, 1e4, True, 0, True, None),
    ("softcap-max", "cublas", "default", "float32", 17, 8, 301, 1.0, 3.4028234663852886e38, False, 0,
     True, None),
]
out = []
for name, path, sched, dt, n, d, v, temp, cap, has_b, masked, entropy, tile, *env in cases:
    os.environ.update(env[0] if env else {"FUSED_LCE_SKIP_IGNORED": "1"})
    os.environ["FUSED_LCE_TRITON_GEMM"] = "1" if path == "gemm" else "0"
    os.environ["FUSED_LCE_GEMM_CONFIG"] = ("32,64,16,2,4,2,2,1" if sched == "compact"
                                           else "32,64,16,2,4,2,2,0") \
        if path == "gemm" else ""  # one program per tile / persistent
    os.environ["FUSED_LCE_COMPACT"] = "1" if sched == "compact" else "0"
    dtype = getattr(torch, dt)
    h = torch.randn(n, d).to(dtype).requires_grad_()
    w = (torch.randn(v, d) / d ** 0.5 * 2).to(dtype).requires_grad_()
    b = None
    if has_b:
        b0 = torch.randn(v) * 0.5
        b0[:masked] = -math.inf  # whole row-kernel blocks and parts of one masked (a masked bias)
        b = b0.to(dtype).requires_grad_()
    y = torch.randint(masked, v, (n,))
    y[torch.rand(n) < 0.25] = -100
    y[0] = int(torch.randint(masked, v, ()))
    from fused_lce.core import Options, Tensors
    o = Options(softcap=cap, temperature=temp, entropy=entropy)
    got_path = "gemm" if tc.TritonProvider.path_reason(Tensors(h, w, y, b), o) is None else "cublas"
    res = fused_lce.linear_logprobs(h, w, y, b, temperature=temp, softcap=cap or None, return_entropy=entropy,
                                    backend="triton_interp", tile_budget_mb=tile)
    lp, ent = res if entropy else (res, None)
    leaves = [x for x in (h, w, b) if x is not None]
    refs = [x.detach().double().requires_grad_() for x in leaves]
    rlp, rent = reference_logprobs(refs[0], refs[1], y, refs[2] if b is not None else None, temperature=temp,
                                   softcap=cap or None)
    g_lp, g_ent = torch.randn(n), torch.randn(n)
    obj = (lp * g_lp).sum() + ((ent * g_ent).sum() if entropy else 0.0)
    robj = (rlp * g_lp.double()).sum() + ((rent * g_ent.double()).sum() if entropy else 0.0)
    ours = torch.autograd.grad(obj, leaves)
    want = torch.autograd.grad(robj, refs)
    if b is not None and masked:  # no gradient reaches a -inf bias: compare the finite columns
        ours = ours[:2] + (ours[2][masked:],)
        want = want[:2] + (want[2][masked:],)
    out.append(dict(case=name, dtype=dt, path=got_path, want_path=path,
                    lp=float((lp.double() - rlp.detach()).abs().max()),
                    lp_mag=float(rlp.detach().abs().max()),
                    ent=float((ent.double() - rent.detach()).abs().max()) if entropy else 0.0,
                    ent_mag=float(rent.detach().abs().max()) if entropy else 0.0,
                    finite=all(bool(torch.isfinite(g).all()) for g in ours),
                    dtypes=[g.dtype == x.dtype for g, x in zip(ours, leaves)],
                    grads=[rel(a, c) for a, c in zip(ours, want)],
                    zero_ignored=bool((lp[y == -100] == 0).all()) and
                    (not entropy or bool((ent[y == -100] == 0).all()))
                    and bool((ours[0][y == -100] == 0).all())))
print("RESULT" + json.dumps(out))
"""


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_logprobs_under_triton_interpreter(seed):
    """linear_logprobs through the public API on the triton provider's kernels (CPU tensors,
    TRITON_INTERPRET=1), values and gradients (random upstream gradients on both outputs) against float64: the
    row kernel's entropy statistic (per-lane online merge, lanes and blocks that stay -inf), the entropy
    coefficient b, temperature after softcap, bias, a -inf masked vocabulary, ignored tokens, several token
    blocks, the compact schedule's vocabulary-chunk merge of ez, bf16 / fp16 operands; and the fused-GEMM path
    (STATS epilogue with temperature and the entropy's tile sums, their combine and vocabulary-chunk merge, DZ
    epilogue from the driver's coefficients with the entropy term, live rows gathered in the backward) with
    and without entropy."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", LOGPROB_INTERP_SCRIPT, ROOT, str(seed)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    value_tol = {"float32": 2e-6, "bfloat16": 2e-5, "float16": 2e-5}
    results = json.loads(line[len("RESULT"):])
    assert len(results) == 15
    for r in results:
        assert r["path"] == r["want_path"], r
        assert r["lp"] <= value_tol[r["dtype"]] * (1 + r["lp_mag"]), r
        assert r["ent"] <= value_tol[r["dtype"]] * (1 + r["ent_mag"]), r
        assert r["finite"] and all(r["dtypes"]) and r["zero_ignored"], r
        assert max(r["grads"]) <= GRAD_TOL[getattr(torch, r["dtype"])], r


# ------------------------------------------------------------------------------------------- CUDA
def _problem(n, d, v, dtype, *, bias=False, ignore=0.15, scale=1.0, seed=None):
    """Random inputs; without ``seed`` drawn from torch's global generator, which the ``seed`` fixture
    seeds."""
    g = torch.Generator().manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ())))
    h = (torch.randn(n, d, generator=g) * scale).to(dtype).cuda().requires_grad_()
    w = (torch.randn(v, d, generator=g) / d**0.5 * 2).to(dtype).cuda().requires_grad_()
    b = (torch.randn(v, generator=g) * 0.5).to(dtype).cuda().requires_grad_() if bias else None
    y = torch.randint(0, v, (n,), generator=g)
    y[torch.rand(n, generator=g) < ignore] = -100
    return h, w, y.cuda(), b


def _compare(h, w, y, b, out, opts, reduction, upstream, dtype):
    leaves = [t for t in (h, w, b) if t is not None]
    got = iter(torch.autograd.grad(out.loss, leaves, upstream))
    grads = tuple(None if t is None else next(got) for t in (h, w, b))
    ref = fp64_reference(h, w, y, b, upstream=upstream, reduction=reduction, **opts)
    assert_loss_close(out.loss, ref, dtype)
    assert_lse_close(out.lse, ref)
    for ours, leaf in zip(grads, (h, w, b)):
        assert ours is None or (ours.dtype == leaf.dtype and ours.shape == leaf.shape)
    assert_grads_close(grads, ref, dtype)


# split: the statistics -> combine -> gradients path of a vocab-parallel group (kept logits tiles), on one
# device
MODES = {"default": ({}, False), "compact": ({"FUSED_LCE_COMPACT": "1"}, False), "split": ({}, True)}
OPTS = {
    "plain": {},
    "everything": {"label_smoothing": 0.2, "z_loss": 0.01, "softcap": 5.0},
    "smooth_zloss": {"label_smoothing": 0.1, "z_loss": 0.02},
}


PATHS = {"gemm": "1", "cublas": "0"}


# the fused-GEMM path takes bf16 / fp16 problems without softcap (the others run the cuBLAS path, tested
# there)
PATH_CASES = [pytest.param(p, dt, o, id=f"{p}-{str(dt).replace('torch.', '')}-{o}")
              for p in PATHS for dt in (torch.float32, torch.bfloat16, torch.float16) for o in OPTS
              if p == "cublas" or (dt != torch.float32 and not OPTS[o].get("softcap"))]


@cuda
@needs_triton_cuda
@pytest.mark.parametrize("path,dtype,opts", PATH_CASES)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("tile", [None, 0.3], ids=["auto", "chunks"])
def test_schedules_against_reference(path, mode, dtype, opts, tile, monkeypatch, seed):
    """Odd V (not a multiple of any kernel tile), odd N, bias, every option, mean (fused gradients) and none
    (recompute path with a random upstream gradient), default / compact / split schedules, on the fused-GEMM
    path (bf16 / fp16 without softcap) and the cuBLAS path."""
    env, split = MODES[mode]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FUSED_LCE_TRITON_GEMM", PATHS[path])
    tc = _tc()
    if split:
        monkeypatch.setattr(tc.TritonProvider, "has_fused", property(lambda self: False))
    n, d, v = 157, 40, 2 * tc.BLOCK + 37
    for reduction in ("mean", "none"):
        h, w, y, b = _problem(n, d, v, dtype, bias=opts != "plain", seed=seed)
        from fused_lce.core import Options, Tensors

        o = Options(**{k: x for k, x in OPTS[opts].items()})
        assert (tc.TritonProvider.path_reason(Tensors(h, w, y, b), o) is None) == (path == "gemm")
        out = fused_lce.linear_cross_entropy(h, w, y, b, reduction=reduction, backend="triton",
                                             return_stats=True, tile_budget_mb=tile, **OPTS[opts])
        up = torch.ones_like(out.loss) if reduction == "mean" else torch.rand_like(out.loss)
        _compare(h, w, y, b, out, OPTS[opts], reduction, up, dtype)


@cuda
@needs_triton_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("plan", ["one_chunk", "chunks", "all_live"])
def test_one_pass_releases_token_weights_before_the_products(monkeypatch, dtype, plan):
    """The one-pass loss drops the token weights (and its gathered labels, weights and lse) once the last dz
    is formed, so with one chunk they are not alive at the peak of the gradient products; the gradients are
    those of the weighted sum, with one chunk (dX written over the gathered rows), several, or every row live
    (nothing gathered)."""
    import weakref

    from fused_lce.backends.triton import provider as P
    from fused_lce.core import Options, Tensors, TokenWeights, formulas

    monkeypatch.setenv("FUSED_LCE_TRITON_GEMM", "1")
    n, v = 300, 1000
    h, w, y, _ = _problem(n, 64, v, dtype, seed=5, ignore=0.0 if plan == "all_live" else 0.15)
    t = Tensors(h.detach(), w.detach(), y, None)
    opts = Options(tile_bytes=100 * 2 * 1024 if plan == "chunks" else 0)  # about 100 rows per chunk: 3 chunks
    assert P.PROVIDER.path_reason(t, opts) is None  # the fused-GEMM path
    made = []

    def make():  # the weights are referenced from here only through the TokenWeights
        g = (y != -100).float()
        made.append(weakref.ref(g))
        return g, torch.tensor(1.0 / n, device="cuda")

    tw = TokenWeights(y != -100, make)
    out = P.PROVIDER.new_grads(t, (True, True, False), fp32_dh=False, scaled=True)
    P.PROVIDER.fused(t, tw, formulas.loss_terms(opts, v), opts, out)
    dh, dw, _ = P.PROVIDER.finish(t, out, tw.get()[1])
    assert tw.get()[0] is None and made[0]() is None  # released, and nothing else holds it
    z = h.float() @ w.float().t()
    ref = torch.nn.functional.cross_entropy(z, y, ignore_index=-100, reduction="sum") / n
    rh, rw = torch.autograd.grad(ref, (h, w))
    torch.testing.assert_close(dh.float(), rh.float(), rtol=2e-2, atol=2e-2 * float(rh.abs().max()))
    torch.testing.assert_close(dw.float(), rw.float(), rtol=2e-2, atol=2e-2 * float(rw.abs().max()))


@cuda
@needs_triton_cuda
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("mode", ["default", "compact"])
def test_logprobs_paths(path, dtype, mode, monkeypatch, seed):
    """linear_logprobs on the GPU against float64 (values; gradients for random upstream gradients on both
    outputs): rows of several row-kernel blocks, bias, ignored tokens, token chunks, temperature and entropy
    on the cuBLAS path, and the fused-GEMM path (STATS / DZ epilogues from the driver's coefficients,
    temperature, entropy tile sums and the entropy's DZ term) for bf16 / fp16; both schedules."""
    from fused_lce.core import Options

    from ..ops.test_logprobs import check

    if mode == "compact":
        monkeypatch.setenv("FUSED_LCE_COMPACT", "1")
    monkeypatch.setenv("FUSED_LCE_TRITON_GEMM", PATHS[path])
    tc = _tc()
    v = 2 * tc.BLOCK + 37
    for entropy, temp in ((False, 1.0), (True, 1.0), (True, 0.7), (False, 1.3)):
        o = Options(temperature=temp, entropy=entropy)
        gemm = path == "gemm" and dtype != torch.float32
        assert (tc.gemm_path_reason(dtype, 40, torch.device("cuda"), o) is None) == gemm
        for tile in (None, 0.3):
            check("triton", "cuda", (157, 40), v, dtype, tile=tile, entropy=entropy, bias=True,
                  ignore_frac=0.2, temperature=temp)


@cuda
@needs_triton_cuda
@pytest.mark.parametrize("cfg", ["128,256,64,3,8,8,2,0", "128,128,64,4,4,8,1,2", "64,256,64,4,4,8,2,0",
                                 "128,256,64,3,8,8,2,1,1", "128,256,64,4,8,8,2,1,1"])
def test_gemm_tile_configurations(cfg, monkeypatch, seed):
    """The fused GEMM's other tile configurations (one tile per program, persistent grid, split store, warp
    specialisation) against the reference: rows and columns not multiples of the tiles, several token
    chunks."""
    monkeypatch.setenv("FUSED_LCE_GEMM_CONFIG", cfg)
    monkeypatch.setenv("FUSED_LCE_TRITON_GEMM", "1")
    h, w, y, b = _problem(1000, 64, 3001, torch.bfloat16, bias=True, seed=seed)
    opts = {"label_smoothing": 0.1}
    out = fused_lce.linear_cross_entropy(h, w, y, b, backend="triton", return_stats=True, tile_budget_mb=2.0,
                                         **opts)
    _compare(h, w, y, b, out, opts, "mean", torch.ones_like(out.loss), torch.bfloat16)


@cuda
@needs_triton_cuda
def test_upstream_scale_kernel(seed):
    """The in-place upstream scale of the forward-computed gradients: untouched bytes when g == 1 (a buffer of
    NaN-free junk stays bit-identical), x * g otherwise; and through autograd with a non-unit upstream."""
    from fused_lce.backends.triton.kernels import rows as kr

    x = torch.randn(3, 100001, device="cuda", dtype=torch.bfloat16)
    keep = x.clone()
    kr.scale_unless_one_([x], torch.ones((), device="cuda"))
    assert torch.equal(x, keep)
    kr.scale_unless_one_([x], torch.full((), 2.5, device="cuda"))
    torch.testing.assert_close(x.float(), keep.float() * 2.5, rtol=1e-2, atol=0)
    h, w, y, _ = _problem(70, 32, 2500, torch.bfloat16, seed=seed)
    loss = fused_lce.linear_cross_entropy(h, w, y, backend="triton")
    gh, gw = torch.autograd.grad(loss * 3.0, (h, w))
    rh, rw = torch.autograd.grad(fused_lce.linear_cross_entropy(h, w, y, backend="triton"), (h, w))
    torch.testing.assert_close(gh.float(), 3.0 * rh.float(), rtol=1e-2, atol=1e-6)
    torch.testing.assert_close(gw.float(), 3.0 * rw.float(), rtol=1e-2, atol=1e-6)


@cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_torch_provider_compiled_tiles(dtype, monkeypatch, seed):
    """The "torch" provider's compiled CUDA tile functions (forced for every tile) against the reference, kept
    tiles (mean) and recomputed tiles (none), with bias, softcap, smoothing and z-loss; and equal to its eager
    tiles within rounding."""
    opts = {"label_smoothing": 0.1, "z_loss": 0.01, "softcap": 7.0}
    for reduction in ("mean", "none"):
        res = {}
        for mode in ("1", "0"):
            monkeypatch.setenv("FUSED_LCE_TORCH_COMPILE", mode)
            h, w, y, b = _problem(157, 40, 2100, dtype, bias=True, seed=seed)
            out = fused_lce.linear_cross_entropy(h, w, y, b, reduction=reduction, backend="torch",
                                                 return_stats=True, tile_budget_mb=0.3, **opts)
            up = torch.ones_like(out.loss) if reduction == "mean" else torch.rand_like(out.loss)
            _compare(h, w, y, b, out, opts, reduction, up, dtype)
            res[mode] = out.loss.detach()
        torch.testing.assert_close(res["1"], res["0"], rtol=1e-5, atol=1e-5)


@cuda
@needs_triton_cuda
@pytest.mark.parametrize("mode", ["default", "compact"])
def test_offsets_beyond_int32(mode, monkeypatch, seed):
    """One logits buffer of N*V > 2**31 elements: rows near the end must be read and written correctly."""
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs a GPU with >= 40 GiB")
    if mode == "compact":
        monkeypatch.setenv("FUSED_LCE_COMPACT", "1")
    n, d, v = 16640, 32, 131072  # n * v = 2.18e9 > 2**31 - 1
    tile = (n * v * 4) / 2**20 + 1  # MiB: one chunk covering everything
    h, w, y, _ = _problem(n, d, v, torch.bfloat16, ignore=0.0, seed=seed)
    y[: n - 48] = -100  # only the last rows (the highest offsets) carry loss and gradient
    out = fused_lce.linear_cross_entropy(h, w, y, backend="triton", tile_budget_mb=tile, return_stats=True)
    gh, gw = torch.autograd.grad(out.loss, (h, w))
    hv = h.detach()[n - 48:].double()
    z = hv @ w.detach().double().t()
    lse = torch.logsumexp(z, 1)
    yy = y[n - 48:]
    ref = (lse - z.gather(1, yy[:, None]).squeeze(1)).mean()
    assert abs(float(out.loss) - float(ref)) < 1e-4
    torch.testing.assert_close(out.lse[n - 48:].double(), lse, rtol=1e-4, atol=1e-4)
    dz = torch.softmax(z, 1)
    dz[torch.arange(48, device=z.device), yy] -= 1
    dz /= 48
    assert rel_err(gh[n - 48:], dz @ w.detach().double()) < 1.2e-2
    assert float(gh[: n - 48].abs().max()) == 0.0
    assert rel_err(gw, dz.t() @ hv) < 1.2e-2


@cuda
@needs_triton_cuda
def test_bad_label_nan_no_fault(seed):
    h, w, y, _ = _problem(33, 16, 5000, torch.bfloat16, seed=seed)
    y[3] = 5000
    y[7] = -3
    loss = fused_lce.linear_cross_entropy(h, w, y, reduction="none", validate=False, backend="triton")
    assert loss[3].isnan() and loss[7].isnan() and loss[[0, 1, 2]].isfinite().all()
    mean = fused_lce.linear_cross_entropy(h, w, y, validate=False, backend="triton")
    gh, gw = torch.autograd.grad(mean, (h, w))
    assert mean.isnan() and gh.isnan().any() and gw.isnan().any()
    torch.cuda.synchronize()  # a device-side fault would surface here


@cuda
@needs_triton_cuda
def test_label_check_reads_after_the_op_without_draining(seed, monkeypatch):
    """validate=True on CUDA: a bad label is a ValueError naming its value (the loss with gradients, the
    log-probs); the check is read after the op's kernels are queued, so a log-prob call with good labels
    queues its logits GEMM while work queued before the call still runs (no drain of the device before the
    op's first launch; the loss's gradient products read the live-row count on the host, which drains it
    there)."""
    h, w, y, _ = _problem(64, 32, 3000, torch.bfloat16, seed=seed)
    fused_lce.linear_logprobs(h, w, y, backend="triton")  # compiled and warm
    for bad in (3000, -3):
        yb = y.clone()
        yb[5], yb[9] = bad, 3001
        for call in (lambda: fused_lce.linear_cross_entropy(h, w, yb, backend="triton").backward(),
                     lambda: fused_lce.linear_logprobs(h, w, yb, return_entropy=True, backend="triton")):
            with pytest.raises(ValueError, match=rf"labels: expected values in \[0, 3000\).*got {bad}$"):
                call()
    from fused_lce.backends.triton.kernels import gemm as kg

    earlier, busy, launch = torch.cuda.Event(), [], kg.lce_gemm

    def spy(*a, **k):
        busy.append(not earlier.query())  # the work queued before the call still runs
        return launch(*a, **k)

    monkeypatch.setattr(kg, "lce_gemm", spy)
    torch.cuda._sleep(int(1e9))  # about half a second of device time, queued before the call
    earlier.record()
    lp = fused_lce.linear_logprobs(h, w, y, backend="triton")
    assert busy and busy[0]
    torch.testing.assert_close(lp, fused_lce.linear_logprobs(h, w, y, validate=False, backend="triton"))


def _step(h, w, y, b, **opts):
    loss = fused_lce.linear_cross_entropy(h, w, y, b, backend="triton", validate=False, **opts)
    return (loss,) + torch.autograd.grad(loss, (h, w, b))


def _logprob_step(h, w, y, b, up, validate=False, **opts):
    """Log-probs and entropy at a temperature, and the gradients of ``up``-weighted sums of both."""
    lp, ent = fused_lce.linear_logprobs(h, w, y, b, backend="triton", validate=validate,
                                        return_entropy=True, **opts)
    return (lp, ent) + torch.autograd.grad((lp * up[0]).sum() + (ent * up[1]).sum(), (h, w, b))


def _replay_matches_eager(step, inputs, new_inputs, opts):
    """``step(*inputs, **opts)`` captured in a CUDA graph (after two warm-up calls on a side stream), replayed
    on ``new_inputs`` copied into ``inputs``: the same results as ``step(*new_inputs, **opts)`` in eager
    mode."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step(*inputs, **opts)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step(*inputs, **opts)
    with torch.no_grad():
        for dst, src in zip(inputs, new_inputs):
            dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    eager = step(*new_inputs, **opts)
    for a, e in zip(static, eager):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@cuda
@needs_triton_cuda
@pytest.mark.parametrize("mode", ["default", "compact"])
def test_cuda_graph_capture(mode, monkeypatch, seed):
    """Forward + backward captured in a CUDA graph (validate=False): no host synchronisation anywhere; replays
    on new inputs match eager (which keeps ignored tokens in the gradient products, as a capture does:
    gathering the live rows reads their count on the host)."""
    if mode == "compact":
        monkeypatch.setenv("FUSED_LCE_COMPACT", "1")
    monkeypatch.setenv("FUSED_LCE_SKIP_IGNORED", "0")
    opts = dict(label_smoothing=0.1, z_loss=0.01, softcap=20.0, tile_budget_mb=1.0)  # several chunks
    _replay_matches_eager(_step, _problem(300, 64, 3000, torch.bfloat16, bias=True, seed=seed),
                          _problem(300, 64, 3000, torch.bfloat16, bias=True, seed=seed + 1), opts)


@cuda
@needs_triton_cuda
@pytest.mark.parametrize("mode", ["default", "compact"])
@pytest.mark.parametrize("validate", [False, True])
def test_cuda_graph_capture_logprobs(mode, validate, monkeypatch, seed):
    """linear_logprobs forward + backward captured in a CUDA graph, as a host-bound RL step at few tokens
    would be: no host synchronisation on either pass (with validate=True the label check, a host read, is
    skipped while capturing and runs in eager); replays on new inputs match eager with ignored tokens kept in
    the products (as a capture keeps them)."""
    if mode == "compact":
        monkeypatch.setenv("FUSED_LCE_COMPACT", "1")
    monkeypatch.setenv("FUSED_LCE_SKIP_IGNORED", "0")
    opts = dict(temperature=0.7, softcap=20.0, tile_budget_mb=1.0, validate=validate)  # several chunks
    inputs, new_inputs = ((*_problem(300, 64, 3000, torch.bfloat16, bias=True, seed=seed + i),
                           torch.rand(2, 300, device="cuda")) for i in (0, 1))
    _replay_matches_eager(_logprob_step, inputs, new_inputs, opts)


@cuda
@needs_triton_cuda
def test_compile_reduce_overhead_records_cuda_graphs(monkeypatch, seed):
    """``torch.compile(mode="reduce-overhead")``, the one-line way a trainer captures its step: Inductor
    records the loss's forward and backward as CUDA graphs (none skipped: no CPU tensor, no host read while
    recording), and every replay, on new inputs each step, matches eager with ignored tokens kept in the
    products."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("FUSED_LCE_SKIP_IGNORED", "0")  # eager computes every row too, as a recording does
    torch._dynamo.reset()
    counters.clear()

    def step(h, w, y, b):
        return fused_lce.linear_cross_entropy(h, w, y, b, backend="triton", label_smoothing=0.1, z_loss=0.01)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for i in range(4):  # warm-up, recording, replays
        h, w, y, b = _problem(300, 64, 3000, torch.bfloat16, bias=True, seed=seed + i)
        got, want = [], []
        for fn, out in ((compiled, got), (step, want)):
            hh, ww, bb = (x.detach().requires_grad_() for x in (h, w, b))
            torch.compiler.cudagraph_mark_step_begin()
            loss = fn(hh, ww, y, bb)
            loss.backward()
            out += [loss.detach().clone(), hh.grad, ww.grad, bb.grad]
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    torch._dynamo.reset()


@cuda
@needs_triton_cuda
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_live_rows_match_all_rows(reduction, monkeypatch, seed):
    """Ignored tokens gathered out of the gradient products (the default) or kept (FUSED_LCE_SKIP_IGNORED=0):
    the same loss and lse, gradients equal within the rounding of a reordered bf16 sum; both against
    float64."""
    h, w, y, b = _problem(1500, 64, 3001, torch.bfloat16, bias=True, ignore=0.4, seed=seed)
    y[-7:] = -100
    res = {}
    for skip in ("1", "0"):
        monkeypatch.setenv("FUSED_LCE_SKIP_IGNORED", skip)
        out = fused_lce.linear_cross_entropy(h, w, y, b, backend="triton", reduction=reduction,
                                             return_stats=True, label_smoothing=0.1)
        up = torch.ones_like(out.loss) if reduction == "mean" else torch.rand_like(out.loss)
        _compare(h, w, y, b, out, {"label_smoothing": 0.1}, reduction, up, torch.bfloat16)
        res[skip] = out
    torch.testing.assert_close(res["1"].loss, res["0"].loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(res["1"].lse, res["0"].lse, rtol=0, atol=1e-6)


@cuda
@needs_triton_cuda
def test_compile_fullgraph(seed):
    """The public API with validate=False compiles with fullgraph=True and matches eager."""
    import torch._dynamo

    torch._dynamo.reset()
    h, w, y, b = _problem(70, 32, 2500, torch.bfloat16, bias=True, seed=seed)

    @torch.compile(fullgraph=True)
    def f(h, w, y, b):
        return fused_lce.linear_cross_entropy(h, w, y, b, validate=False, label_smoothing=0.1, z_loss=0.01)

    loss = f(h, w, y, b)
    grads = torch.autograd.grad(loss, (h, w, b))
    ref = _step(h, w, y, b, label_smoothing=0.1, z_loss=0.01)
    for a, e in zip((loss,) + grads, ref):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@cuda
@needs_triton_cuda
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("mode", ["default", "compact"])
def test_peak_memory_bounds(path, mode, monkeypatch, seed):
    """Peak extra memory of the backend's fused forward (loss + dX + dW in one call): default <= dX + dW +
    4*V*D + 0.5 GiB, or on the fused-GEMM path a buffer of up to FULL_RATE_ROWS tokens' logits (and their tile
    statistics) in its place; compact <= 1.15 (dX + dW) on the fused-GEMM path (its bf16 dz chunks), + 2 dX on
    the cuBLAS path (float32 logits chunks of at least 32 MiB). The op layer's backward scales these gradients
    in place."""
    if mode == "compact":
        monkeypatch.setenv("FUSED_LCE_COMPACT", "1")
    monkeypatch.setenv("FUSED_LCE_TRITON_GEMM", PATHS[path])
    from fused_lce.core import driver, formulas
    from fused_lce.core import Options, Tensors

    tc = _tc()
    n, d, v = 6144, 1024, 200000
    h, w, y, _ = _problem(n, d, v, torch.bfloat16, seed=seed)
    opts = Options(vocab_total=v)
    t = Tensors(h.detach(), w.detach(), y, None)
    assert (tc.TritonProvider.path_reason(t, opts) is None) == (path == "gemm")
    scale = (1.0 / (y != -100).sum().float()).reshape(())
    g = formulas.token_weights(*formulas.label_classes(y, opts, v))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    st, (dh, dw_, _) = driver.run_forward(tc.PROVIDER, t, opts, g, scale, (True, True, False))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    dx, dw = n * d * 2, v * d * 2
    if mode == "default":
        full_rate = min(n, tc.planner.FULL_RATE_ROWS) * (2 * v + 12 * -(-v // 128)) if path == "gemm" else 0
        assert peak <= dx + dw + max(4 * v * d, full_rate) + 0.5 * 2**30, peak / 2**30
    elif path == "gemm":
        assert peak <= 1.15 * (dx + dw), (peak / 2**30, 1.15 * (dx + dw) / 2**30)
    else:
        assert peak <= 1.15 * (dx + dw) + 2 * dx, peak / 2**30
    assert dh.dtype == torch.bfloat16 and dw_.dtype == torch.bfloat16
    assert math.isfinite(float(formulas.loss_from_stats(st, y, opts, v)[0].nansum()))


@cuda
@needs_triton_cuda
def test_allocator_bytes_match_torch_cuda_counters():
    """The planner reads the allocator's counters from the nested statistics (cheaper on the host): the same
    numbers as torch.cuda.memory_allocated / memory_reserved, and the free-memory estimate moves with an
    allocation."""
    from fused_lce.backends.triton import planner

    idx = torch.cuda.current_device()
    keep = torch.empty(3 << 20, device="cuda")
    assert planner._allocator_bytes(idx) == (torch.cuda.memory_allocated(idx),
                                             torch.cuda.memory_reserved(idx))
    before = planner._free_bytes(torch.device("cuda"))
    more = torch.empty(16 << 20, device="cuda")
    after = planner._free_bytes(torch.device("cuda"))
    assert before - after == more.numel() * 4, (before, after)
    del keep, more
