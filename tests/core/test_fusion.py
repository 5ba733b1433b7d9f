"""``fusion.one_kernel``: the per-token formulas compiled (as on CUDA, here with the CPU's Inductor backend) give the
eager numbers, through the formulas and through ``linear_logprobs``; a failing compile falls back to eager once,
with a warning; ``FUSED_LCE_COMPILE=0`` and non-listed devices stay eager."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import fused_lce
from fused_lce.core import Options, fusion, formulas
from fused_lce.core.types import EntropyStats

from ..conftest import rel_err

KERNELS = (formulas._logprob_outputs, formulas._coef_block, formulas._bad_count)


@pytest.fixture
def compiled(monkeypatch):
    """The compiled path on CPU tensors, each function's state restored afterwards."""
    monkeypatch.setattr(fusion, "DEVICE_TYPES", {"cuda", "cpu"})
    monkeypatch.setenv(fusion.ENV, "1")
    saved = [dict(k.state) for k in KERNELS]
    yield
    for k, s in zip(KERNELS, saved):
        k.state.clear()
        k.state.update(s)


def _stats(n, vt, g):
    m = torch.randn(n, generator=g) * 3
    s = torch.rand(n, generator=g) * 50 + 1
    st = EntropyStats(m, s, m + torch.randn(n, generator=g), torch.randn(n, generator=g) * n,
                      torch.randint(0, vt, (n,), generator=g), torch.randn(n, generator=g) * s)
    y = torch.randint(0, vt, (n,), generator=g)
    y[torch.rand(n, generator=g) < 0.2] = -100
    y[torch.rand(n, generator=g) < 0.05] = vt + 3  # out of range: NaN outputs
    y[: n // 10] = st.argmax[: n // 10]  # some top-1 labels
    return st, y


def _same(a, b):
    """Equal up to the compiled kernel's rounding of log and division, NaN where the other is NaN."""
    if a is None or b is None:
        return a is None and b is None
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.isnan(), b.isnan()) and torch.allclose(a.nan_to_num(), b.nan_to_num(), rtol=2e-6, atol=1e-6)


def _eager_lp(st, y, opts, vt):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(fusion.ENV, "0")
        return formulas.logprobs_from_stats(st, y, opts, vt)


@pytest.mark.parametrize("entropy", [True, False])
@pytest.mark.parametrize("labels_dtype", [torch.int64, torch.int32])
def test_logprob_outputs_compiled_match_eager(compiled, seed, entropy, labels_dtype):
    g = torch.Generator().manual_seed(seed)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for n, vt, ignore in ((37, 1000, -100), (1000, 151936, -100), (513, 5000, 7)):
        st, y = _stats(n, vt, g)
        y = torch.where(y == -100, ignore, y).to(labels_dtype)
        opts = Options(entropy=entropy, ignore_index=ignore, mean_logit=True)
        got = formulas.logprobs_from_stats(st, y, opts, vt)
        want = _eager_lp(st, y, opts, vt)
        assert all(_same(a, b) for a, b in zip(got, want))
        assert formulas._logprob_outputs.state["broken"] is None
    assert formulas._logprob_outputs.state["compiled"] is not None
    # token count, vocabulary and ignore_index are dynamic: at most one graph per flag combination, compiled once
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs <= 1


@pytest.mark.parametrize("which", ["lp", "ent", "both"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_coefs_compiled_match_eager(compiled, seed, which, temperature):
    g = torch.Generator().manual_seed(seed)
    n, vt = 301, 4000
    st, y = _stats(n, vt, g)
    w_lp = torch.randn(n, generator=g) if which in ("lp", "both") else None
    w_ent = torch.randn(n, generator=g).to(torch.bfloat16) if which in ("ent", "both") else None
    zmean = torch.randn(n, generator=g)
    opts = Options(entropy=w_ent is not None, temperature=temperature)
    got = formulas.logprob_coefs(w_lp, w_ent, zmean, y, opts, vt)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(fusion.ENV, "0")
        want = formulas.logprob_coefs(w_lp, w_ent, zmean, y, opts, vt)
    assert all(_same(a, b) for a, b in zip(got, want))
    valid = y != -100
    bad = valid & (y >= vt)
    assert bool(got.a[bad].isnan().all()) and bool((got.a[~valid] == 0).all())
    assert formulas._coef_block.state["broken"] is None and formulas._coef_block.state["compiled"] is not None


def test_linear_logprobs_compiled_against_float64(compiled, seed):
    g = torch.Generator().manual_seed(seed)
    n, d, v = 29, 16, 53
    h = torch.randn(n, d, generator=g, dtype=torch.float64).float().requires_grad_()
    w = (torch.randn(v, d, generator=g) / 2).requires_grad_()
    y = torch.randint(0, v, (n,), generator=g)
    y[::5] = -100
    lp, ent = fused_lce.linear_logprobs(h, w, y, temperature=0.8, return_entropy=True, backend="torch")
    gl, ge = torch.randn(n, generator=g), torch.randn(n, generator=g)
    dh, dw = torch.autograd.grad((lp * gl).sum() + (ent * ge).sum(), (h, w))
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    rlp, rent = formulas.reference_logprobs(h64, w64, y, temperature=0.8)
    rdh, rdw = torch.autograd.grad((rlp * gl.double()).sum() + (rent * ge.double()).sum(), (h64, w64))
    assert rel_err(lp.detach(), rlp) < 1e-5 and rel_err(ent.detach(), rent) < 1e-5
    assert rel_err(dh, rdh) < 1e-5 and rel_err(dw, rdw) < 1e-5
    assert all(k.state["compiled"] is not None and k.state["broken"] is None for k in KERNELS)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_bad_labels_compiled_match_eager(compiled, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    for n, vt, ignore in ((1, 10, -100), (999, 151936, -100), (500, 300, -1), (64, 50, 7)):
        y = torch.randint(-3, vt + 3, (n,), generator=g)
        y[torch.rand(n, generator=g) < 0.3] = ignore
        want = int(((y != ignore) & ((y < 0) | (y >= vt))).sum())
        assert int(fused_lce.label_errors(y.to(dtype), vt, ignore_index=ignore)) == want
        y[(y < 0) | (y >= vt)] = ignore
        assert int(fused_lce.label_errors(y.to(dtype), vt, ignore_index=ignore)) == 0
    assert formulas._bad_count.state["compiled"] is not None and formulas._bad_count.state["broken"] is None


def test_failing_compile_warns_once_and_runs_eagerly(compiled, monkeypatch, seed):
    def broken(fn, **_kw):
        def run(*a):
            raise RuntimeError("no backend here")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    formulas._logprob_outputs.state.update(compiled=None, broken=None)
    st, y = _stats(50, 300, torch.Generator().manual_seed(seed))
    opts = Options(entropy=True)
    with pytest.warns(RuntimeWarning, match="no backend here"):
        got = formulas.logprobs_from_stats(st, y, opts, 300)
    assert all(_same(a, b) for a, b in zip(got, _eager_lp(st, y, opts, 300)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: later calls are eager and silent
        formulas.logprobs_from_stats(st, y, opts, 300)


def test_eager_unless_asked(monkeypatch):
    called = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: called.append(fn) or fn)
    x = torch.ones(3)
    k = fusion.one_kernel(lambda t: t * 2)
    assert torch.equal(k(x), x * 2) and not called  # a CPU tensor: not in DEVICE_TYPES
    monkeypatch.setattr(fusion, "DEVICE_TYPES", {"cpu"})
    monkeypatch.setenv(fusion.ENV, "0")
    assert torch.equal(k(x), x * 2) and not called
    monkeypatch.setenv(fusion.ENV, "1")
    assert torch.equal(k(x), x * 2) and len(called) == 1
    assert not math.isnan(float(k(x)[0]))
