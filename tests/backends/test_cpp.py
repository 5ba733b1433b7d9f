"""The compiled "cpp" backend (fused_lce._C, csrc/cpu/).

It is really loaded and owns the CPU kernels of the ops; it matches the float64 reference on every code path
of the kernel (kept row block / recompute, each 16-bit GEMM path forced on and off for bf16 and fp16, each
row-kernel instruction set, both parallel schemes, 1 or 2 threads); it detects the CPU features its defaults
depend on; the registry routes to it and away from it as asked; it is deterministic; it indexes past 2^31
logits (float32 and the 16-bit paths); the ops pass opcheck with it. Random inputs come from the ``seed``
fixture (fixed per test in CI). The shared conformance suite (tests/backends/test_conformance.py) runs on
"cpp" too. In CI (env CI=1/true/yes) a missing extension fails these tests instead of skipping them.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

import fused_lce
from fused_lce.core import driver, formulas, registry
from fused_lce.core import Options, Problem, Tensors

from ..conftest import assert_grads_close, assert_loss_close, assert_lse_close, fp64_reference
from ..support import options_block

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REASON = registry.unavailable_reason("cpp")
pytestmark = pytest.mark.skipif(REASON is not None and not IN_CI, reason=f"cpp backend unavailable: {REASON}")


def test_compiled_library_is_loaded(monkeypatch, seed):
    """The installed package loaded fused_lce._C, whose private kernel ops run the "cpp" provider: the fused
    one-pass kernel for a training step, statistics + recompute for reduction "none"."""
    assert REASON is None, f"the C++ extension is missing: {REASON}"
    from fused_lce import _C
    from fused_lce.backends import cpp

    assert os.path.basename(_C.__file__).startswith("_C.") and _C.__file__.endswith((".so", ".pyd"))
    for kernel in ("_cpu_stats", "_cpu_grads", "_cpu_fused"):
        assert "csrc/ops.cpp" in \
            torch._C._dispatch_dump(f"fused_lce::{kernel}").split("CPU: registered at ")[1]
    # the public ops have one implementation for every device: the Python driver
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("fused_lce::forward", "CPU")
    assert fused_lce.backend_info()["auto"]["cpu"] == "cpp"
    assert cpp.describe(64, 1000, 32).startswith("isa=")
    calls = _count_kernel_calls(monkeypatch)
    h, w, y, _ = _problem(16, 8, 40, torch.float32, seed=seed)
    fused_lce.linear_cross_entropy(h, w, y, backend="cpp").backward()
    assert calls["cpp"] == ["fused"] and calls["torch"] == []
    calls["cpp"].clear()
    fused_lce.linear_cross_entropy(h, w, y, backend="cpp", reduction="none").sum().backward()
    assert calls["cpp"] == ["stats", "grads"] and calls["torch"] == []


# ------------------------------------------------------------------------------------------------- helpers
def _problem(n, d, v, dtype, *, seed, bias=False, ignore_frac=0.2, ignore_index=-100):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(v, d, generator=g) * 2 / max(d, 1) ** 0.5).to(dtype).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.5).to(dtype).requires_grad_() if bias else None
    y = torch.randint(0, v, (n,), generator=g)
    y[torch.rand(n, generator=g) < ignore_frac] = ignore_index
    return h, w, y, b


def _count_kernel_calls(monkeypatch):
    """Records which kernels of the torch and cpp providers the driver calls."""
    calls = {"torch": [], "cpp": []}
    for name in calls:
        impl = registry.load(name)
        for meth in ("stats", "grads", "fused"):
            orig = getattr(impl, meth)

            def wrapped(*a, _orig=orig, _name=name, _meth=meth, **k):
                calls[_name].append(_meth)
                return _orig(*a, **k)

            monkeypatch.setattr(impl, meth, wrapped)
    return calls


def _check(dtype, n=37, d=19, v=301, *, seed, reduction="mean", tile=None, bias=False, backend="cpp",
           want=(1, 1, 1), **opts):
    """Forward + backward through the public API against the float64 reference; returns the output."""
    ignore_frac = opts.pop("ignore_frac", 0.2)
    h, w, y, b = _problem(n, d, v, dtype, seed=seed, bias=bias, ignore_frac=ignore_frac,
                          ignore_index=opts.get("ignore_index", -100))
    leaves = [t for t, on in zip((h, w, b), want) if t is not None and on]
    for t, on in zip((h, w, b), want):
        if t is not None and not on:
            t.requires_grad_(False)
    out = fused_lce.linear_cross_entropy(h, w, y, b, reduction=reduction, backend=backend,
                                         tile_budget_mb=tile, return_stats=True, **opts)
    assert out.loss.dtype == torch.float32
    g = torch.rand_like(out.loss) if reduction == "none" else torch.ones_like(out.loss)
    ref = fp64_reference(h, w, y, b, upstream=g, reduction=reduction, **opts)
    assert_loss_close(out.loss, ref, dtype)
    assert_lse_close(out.lse, ref)
    if dtype == torch.float32:
        assert abs(float(out.token_accuracy) - float(ref.token_accuracy)) < 1e-6
    if leaves:
        got = iter(torch.autograd.grad(out.loss, leaves, g))
        grads = tuple(next(got) if t is not None and t.requires_grad else None for t in (h, w, b))
        for ours, leaf in zip(grads, (h, w, b)):
            assert ours is None or (ours.dtype == leaf.dtype and ours.shape == leaf.shape)
        assert_grads_close(grads, ref, dtype)
    return out


# ---------------------------------------------------------------------------------------- kernel code paths
PATHS = {  # kept row block (softmax from stored exp / from stored logits), recompute, backward-only recompute
    "keep": dict(),
    "keep_softcap": dict(softcap=4.0, label_smoothing=0.1),
    "recompute": dict(tile=0.02, z_loss=0.01, bias=True),
    "none_reduction": dict(reduction="none", label_smoothing=0.2, bias=True),
    "everything": dict(tile=0.004, softcap=2.5, z_loss=0.02, label_smoothing=0.3, bias=True, ignore_index=3,
                       num_items=50),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("path", list(PATHS))
def test_paths_match_reference(dtype, path, seed):
    _check(dtype, seed=seed, **dict(PATHS[path]))


# ------------------------------------------------------------------------------------------- 16-bit GEMMs
def _gemm_paths():
    """{dtype name: GEMM path} that the kernel picks now (describe's "gemm=bf16:<path>,fp16:<path>")."""
    from fused_lce.backends import cpp as cpp_cpu

    field = next(f for f in cpp_cpu.describe(64, 1000, 32, torch.bfloat16).split() if f.startswith("gemm="))
    return dict(kv.split(":") for kv in field[len("gemm="):].split(","))


def _cpu_flags():
    """The x86 feature flags of /proc/cpuinfo (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(next(ln for ln in f if ln.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return set()


def _forced_path_available(monkeypatch, dtype_key, path):
    monkeypatch.setenv("FUSED_LCE_CPP_LOW_GEMM", path)
    return _gemm_paths()[dtype_key] == path


@pytest.mark.parametrize("gemm", ["auto", "mkl", "brgemm", "convert"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(64, 32, 1000), (33, 7, 517), (70, 40, 2049)],
                         ids=["even", "odd", "tiles"])
def test_16bit_gemm_paths(monkeypatch, gemm, dtype, shape, seed):
    """Each way of multiplying 16-bit operands (gemm.h), forced through FUSED_LCE_CPP_LOW_GEMM: MKL's 16-bit x
    16-bit -> fp32 GEMMs, ATen's brgemm (bf16 only), float32 tiles; a forced path this machine lacks falls
    back to the converted tiles (said by describe). Every kernel path (kept block, recompute, backward from
    lse) against float64, with several vocabulary tiles and token blocks in the "tiles" shape."""
    key = "bf16" if dtype == torch.bfloat16 else "fp16"
    monkeypatch.setenv("FUSED_LCE_CPP_LOW_GEMM", gemm)
    picked = _gemm_paths()[key]
    if gemm == "convert" or (gemm == "brgemm" and dtype == torch.float16):
        assert picked == "convert", picked  # float16 dZ needs the GEMM's alpha, which brgemm lacks
    elif gemm != "auto":
        assert picked in (gemm, "convert"), picked
    n, d, v = shape
    tile = 0.1 if shape[2] > 2000 else None  # several tiles per slot and token blocks
    for i, path in enumerate(("keep", "keep_softcap", "recompute", "none_reduction", "everything")):
        opts = dict(PATHS[path])
        if tile is not None and path in ("keep", "keep_softcap"):
            opts["tile"] = tile
        _check(dtype, n, d, v, seed=seed + i, **opts)


def test_16bit_gemm_defaults_follow_the_cpu(monkeypatch):
    """describe's cpu= flags agree with /proc/cpuinfo (cpuid decoding), and the automatic choice follows the
    documented rule: bf16 uses MKL's GEMM when this process has an exact one (native on AVX512_BF16 / AMX,
    converted while packing elsewhere), float16 only where the CPU has fp16 instructions."""
    from fused_lce.backends import cpp as cpp_cpu

    flags = _cpu_flags()
    cpu = next(f for f in cpp_cpu.describe(8, 8, 8).split() if f.startswith("cpu="))[4:].split(",")
    if flags:
        for ours, theirs in (("avx2", "avx2"), ("f16c", "f16c"), ("avx512_bf16", "avx512_bf16"),
                             ("avx512_fp16", "avx512_fp16"), ("amx_bf16", "amx_bf16"),
                             ("amx_fp16", "amx_fp16")):
            assert (ours in cpu) == (theirs in flags), (ours, cpu, sorted(flags))
    mkl = {k: _forced_path_available(monkeypatch, k, "mkl") for k in ("bf16", "fp16")}
    brgemm = _forced_path_available(monkeypatch, "bf16", "brgemm")
    monkeypatch.delenv("FUSED_LCE_CPP_LOW_GEMM")
    auto = _gemm_paths()
    native_bf16 = bool({"avx512_bf16", "amx_bf16"} & set(cpu))
    native_fp16 = bool({"avx512_fp16", "amx_fp16"} & set(cpu))
    assert auto["bf16"] == ("mkl" if mkl["bf16"] else "brgemm" if native_bf16 and brgemm else "convert"), auto
    assert auto["fp16"] == ("mkl" if mkl["fp16"] and native_fp16 else "convert"), auto
    monkeypatch.setenv("FUSED_LCE_CPP_BF16_GEMM", "0")  # the older knob still turns bf16 GEMMs off
    assert _gemm_paths()["bf16"] == "convert"


@pytest.mark.parametrize("gemm", ["mkl", "brgemm", "convert"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16bit_gemm_paths_logprobs(monkeypatch, gemm, dtype, seed):
    """linear_logprobs on each forced 16-bit GEMM path (statistics with temperature and the entropy sum,
    gradients from the driver's coefficients with b != 0 and a softcap) against float64: values and dX, dW, db
    of both outputs; odd sizes with many tiles, and several token blocks with vocabulary tiles of 512."""
    from ..ops.test_logprobs import check

    monkeypatch.setenv("FUSED_LCE_CPP_LOW_GEMM", gemm)
    check("cpp", "cpu", (3, 11, 19), 517, dtype, tile=0.002, temperature=0.7, softcap=4.0, bias=True,
          ignore_frac=0.25)
    check("cpp", "cpu", (300, 40), 2049, dtype, tile=0.5, temperature=1.3)


@pytest.mark.parametrize("gemm", ["mkl", "convert"])
def test_float16_gradients_do_not_underflow(monkeypatch, gemm, seed):
    """Mean over many tokens makes dZ ~ softmax / N, far below float16's normal range: the 16-bit dX/dW GEMMs
    get dZ scaled by a power of two per tile (undone by the GEMM's alpha), so the gradients keep float16
    accuracy. Tiles where every token is ignored (dZ = 0) and a bad label (NaN poisons dW) are handled too."""
    if not _forced_path_available(monkeypatch, "fp16", gemm):
        assert not IN_CI, f"no exact float16 {gemm} GEMM in CI"
        pytest.skip(f"no exact float16 {gemm} GEMM on this machine")
    _check(torch.float16, 3000, 12, 700, seed=seed, tile=0.5)
    _check(torch.float16, 300, 12, 700, seed=seed + 1, reduction="none", bias=True, softcap=5.0)
    _check(torch.float16, 64, 12, 700, seed=seed + 2, ignore_frac=1.0)
    h, w, y, _ = _problem(40, 8, 600, torch.float16, seed=seed + 3, ignore_frac=0.0)
    y[5] = 600
    loss = fused_lce.linear_cross_entropy(h, w, y, validate=False, backend="cpp")
    loss.backward()
    assert loss.isnan() and h.grad[5].isnan().all() and h.grad[0].isfinite().all() and w.grad.isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_zero_hidden_size(dtype, seed):
    """D = 0 (on the op: the public API's reshape rejects it): logits are the bias, dX and dW are empty."""
    n, v = 6, 9
    b = torch.randn(v, generator=torch.Generator().manual_seed(seed)).to(dtype)
    y = torch.tensor([0, 3, -100, 8, 1, 2])
    opts = options_block(backend="cpp")
    out = torch.ops.fused_lce.forward(torch.empty(n, 0, dtype=dtype),
                                      torch.empty(v, 0, dtype=dtype), y, b, None, "none", *opts,
                                      [True, True, True])
    z = b.double().expand(n, v)
    want = torch.logsumexp(z, 1) - z.gather(1, y.clamp(min=0)[:, None])[:, 0]
    torch.testing.assert_close(out[0].double(), torch.where(y != -100, want, 0.0), rtol=1e-5, atol=1e-5)
    lse = out[1]
    dh, dw, db = torch.ops.fused_lce.backward(torch.ones(n), torch.empty(n, 0, dtype=dtype),
                                              torch.empty(v, 0, dtype=dtype), y, b, lse, None, "none", *opts,
                                              [True, True, True])
    assert dh.shape == (n, 0) and dw.shape == (v, 0) and db.shape == (v,) and db.dtype == dtype
    p = torch.softmax(z, 1) - torch.nn.functional.one_hot(y.clamp(min=0), v) * 1.0
    torch.testing.assert_close(db.double(), (p * (y != -100)[:, None]).sum(0), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("want", [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 0, 1)],
                         ids=["dX", "dW", "db", "dX+db"])
def test_partial_gradients(want, seed):
    for i, reduction in enumerate(("mean", "none")):
        _check(torch.float32, seed=seed + i, reduction=reduction, bias=True, want=want, label_smoothing=0.1)


@pytest.mark.parametrize("isa", ["default", "avx2", "avx512"])
def test_row_kernel_isas_agree(monkeypatch, isa, seed):
    """Every instruction-set variant of the row kernels (the best one the CPU has, when it lacks `isa`)."""
    from fused_lce.backends import cpp as cpp_cpu

    monkeypatch.setenv("FUSED_LCE_CPP_ISA", isa)
    picked = cpp_cpu.describe(64, 1000, 32).split()[0]
    assert picked == f"isa={isa}" or (isa != "default" and picked in ("isa=avx2", "isa=default")), picked
    _check(torch.float32, seed=seed, **dict(PATHS["everything"]))
    _check(torch.float32, n=45, d=16, v=700, seed=seed + 1, reduction="none", softcap=3.0, bias=True)


@pytest.mark.parametrize("mode", ["tiles", "gemm"])
@pytest.mark.parametrize("threads", [1, 2])
def test_parallel_schemes(monkeypatch, mode, threads, seed):
    from fused_lce.backends import cpp as cpp_cpu

    monkeypatch.setenv("FUSED_LCE_CPP_PARALLEL", mode)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert f"parallel={mode} threads={threads}" in cpp_cpu.describe(70, 2000, 24)
        _check(torch.float32, n=70, d=24, v=2000, seed=seed, bias=True, label_smoothing=0.1)
        _check(torch.float32, n=70, d=24, v=2000, seed=seed + 1, reduction="none", tile=0.05)
        _check(torch.bfloat16, n=70, d=24, v=2000, seed=seed + 2, reduction="none", tile=0.05)
    finally:
        torch.set_num_threads(old)


def test_bad_labels_and_all_ignored(seed):
    h, w, y, b = _problem(12, 8, 30, torch.float32, seed=seed, bias=True, ignore_frac=0.0)
    y[2], y[7] = 30, -5
    loss = fused_lce.linear_cross_entropy(h, w, y, b, reduction="none", validate=False, backend="cpp")
    assert loss[2].isnan() and loss[7].isnan() and loss[[0, 1, 3]].isfinite().all()
    mean = fused_lce.linear_cross_entropy(h, w, y, b, validate=False, backend="cpp")
    mean.backward()
    # a bad label poisons its own dX row and, through dZ^T H, all of dW; other tokens' dX rows stay finite
    assert mean.isnan() and h.grad[2].isnan().all() and h.grad[0].isfinite().all() and w.grad.isnan().all()
    y[:] = -100
    h.grad = w.grad = b.grad = None
    zero = fused_lce.linear_cross_entropy(h, w, y, b, backend="cpp")
    zero.backward()
    assert zero.item() == 0.0 and (h.grad == 0).all() and (w.grad == 0).all() and (b.grad == 0).all()


# ----------------------------------------------------------------------------------------------- routing
def test_registry_routes_to_and_away_from_cpp(monkeypatch, seed):
    calls = _count_kernel_calls(monkeypatch)
    _check(torch.float32, seed=seed, backend="torch", bias=True)
    assert calls["torch"] and not calls["cpp"]
    calls["torch"].clear()
    _check(torch.float32, seed=seed + 1, backend="auto", reduction="none")
    assert calls["cpp"] == ["stats", "grads"] and not calls["torch"]  # auto on CPU: cpp
    monkeypatch.setenv("FUSED_LCE_BACKEND", "torch")
    _check(torch.float32, seed=seed + 2, backend="auto")
    assert calls["torch"]
    monkeypatch.setenv("FUSED_LCE_BACKEND", "cpp")
    calls["torch"].clear()
    _check(torch.float32, seed=seed + 3, backend="auto")
    assert not calls["torch"] and calls["cpp"][-1] == "fused"
    p = Problem(4, 4, 4, torch.float64, torch.device("cpu"), False, Options())
    with pytest.raises(ValueError, match="backend='cpp' is not available: .*float64"):
        registry.resolve("cpp", p)


def test_vocab_parallel_kernels(monkeypatch, seed):
    """The kernels the driver uses for a vocab-parallel group: shard statistics (checked on two emulated
    shards against the full vocabulary), and the whole group path with an identity combine (one rank holding
    the full vocabulary): statistics, combine, gradients from the global lse, float32 dX for the
    all-reduce."""
    n, d, v, cut = 29, 12, 90, 41
    h, w, y, b = _problem(n, d, v, torch.float32, seed=seed, bias=True)
    hd, wd, bd = h.detach(), w.detach(), b.detach()
    full = torch.ops.fused_lce._cpu_stats(hd, wd, bd, y, 0, 3.0, 1.0, True, False, 0)
    shards = [torch.ops.fused_lce._cpu_stats(hd, wd[a:z], bd[a:z], y, a, 3.0, 1.0, True, False, 0)
              for a, z in ((0, cut), (cut, v))]
    m = torch.maximum(shards[0][0], shards[1][0])
    s = sum(sh[1] * torch.exp(sh[0] - m) for sh in shards)
    # lowest id among shards holding the max
    first = torch.where(shards[0][0] == m, shards[0][4], shards[1][4])
    torch.testing.assert_close(m + s.log(), full[0] + full[1].log())
    # target logit lives in exactly one shard
    torch.testing.assert_close(shards[0][2] + shards[1][2], full[2])
    torch.testing.assert_close(shards[0][3] + shards[1][3], full[3])
    assert torch.equal(first, full[4])
    monkeypatch.setattr(driver.distributed, "combine_stats", lambda *t: t[:5])
    monkeypatch.setattr(driver.distributed, "agree_token_blocks", lambda nb, n, g: nb)
    opts = Options(label_smoothing=0.1, z_loss=0.01, softcap=3.0, group_name="emulated", vocab_total=v)
    valid = (y != -100).sum()
    inv = torch.tensor(1.0) / valid
    g = formulas.token_weights(*formulas.label_classes(y, opts, v))
    t = Tensors(hd, wd, y, bd)
    st, (dh, dw, db) = driver.run_forward(registry.load("cpp"), t, opts, g, inv, (True, True, True),
                                          group="emulated")
    per, lse, _ = formulas.loss_from_stats(st, y, opts, v)
    ref = fp64_reference(h, w, y, b, label_smoothing=0.1, z_loss=0.01, softcap=3.0)
    assert_loss_close(per.sum() / valid, ref, torch.float32)
    assert_lse_close(lse, ref)
    assert dh.dtype == torch.float32  # the driver all-reduces it before casting
    assert_grads_close((dh, dw, db), ref, torch.float32)


# ------------------------------------------------------------------------------------------ determinism
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_deterministic_for_a_thread_count(dtype, seed):
    h, w, y, b = _problem(300, 40, 5000, dtype, seed=seed, bias=True)
    runs = []
    for _ in range(2):
        hh, ww, bb = (t.detach().clone().requires_grad_() for t in (h, w, b))
        loss = fused_lce.linear_cross_entropy(hh, ww, y, bb, backend="cpp", label_smoothing=0.1,
                                              tile_budget_mb=2)
        loss.backward()
        runs.append([loss.detach(), hh.grad, ww.grad, bb.grad])
    for a, b_ in zip(*runs):
        assert torch.equal(a, b_)


# ---------------------------------------------------------------------------------------- 64-bit indexing
@pytest.mark.parametrize("dtype,gemm,tol", [(torch.float32, "auto", 1e-4), (torch.bfloat16, "auto", 1e-2),
                                            (torch.float16, "mkl", 2e-3)],
                         ids=["float32", "bfloat16", "float16"])
def test_more_than_2_31_logits(monkeypatch, dtype, gemm, tol, seed):
    """N * V > 2^31 (D = 1 keeps it cheap): sampled rows of the loss, lse and dX, and sampled rows of dW,
    against float64 computed row by row from the (rounded) inputs; 16-bit inputs on their GEMM paths
    (gradients rounded to the input dtype, hence the wider tolerance)."""
    monkeypatch.setenv("FUSED_LCE_CPP_LOW_GEMM", gemm)
    n, v = 2**16 + 3, 2**15 + 5
    assert n * v > 2**31
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, 1, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(v, 1, generator=g) * 3).to(dtype).requires_grad_()
    y = torch.randint(0, v, (n,), generator=g)
    y[-1], y[-2], y[0] = v - 1, -100, v - 2
    up = torch.rand(n, generator=g)
    out = fused_lce.linear_cross_entropy(h, w, y, backend="cpp", reduction="none", return_stats=True)
    out.loss.backward(up)
    loss = out.loss.detach()
    h64, w64 = h.detach().double(), w.detach().double()
    rows = torch.cat([torch.tensor([0, 1, n // 2, n - 2, n - 1]), torch.randint(0, n, (16,), generator=g)])
    for i in rows.tolist():
        z = h64[i] @ w64.t()
        lse = torch.logsumexp(z, 0)
        if y[i] == -100:  # an ignored token: no statistics (lse 0), no loss, no gradient
            assert out.lse[i] == 0 and loss[i] == 0 and h.grad[i].abs().max() == 0
            continue
        assert abs(float(out.lse[i]) - float(lse)) < 1e-4 * (1 + float(lse))
        assert abs(float(loss[i]) - float(lse - z[y[i]])) < 1e-4 * (1 + float(lse))
        p = torch.softmax(z, 0)
        p[y[i]] -= 1
        dx = up[i].double() * (p @ w64)
        assert abs(float(h.grad[i, 0]) - float(dx)) < tol * (1 + abs(float(dx)))
    lse_all = out.lse.double()  # checked above on samples; used for the dW columns
    gv = torch.where(y != -100, up.double(), torch.zeros(n, dtype=torch.float64))
    for j in [0, 1, v // 2, v - 2, v - 1]:
        p = torch.exp(h64[:, 0] * w64[j, 0] - lse_all) - (y == j).double()
        dw = float((gv * p * h64[:, 0]).sum())
        assert abs(float(w.grad[j, 0]) - dw) < tol * (1 + abs(dw)), (j, float(w.grad[j, 0]), dw)


# ------------------------------------------------------------------------------------------------ opcheck
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_opcheck(dtype, reduction, seed):
    h, w, y, b = _problem(11, 8, 37, dtype, seed=seed, bias=True)
    opts = options_block(label_smoothing=0.1, z_loss=0.01, softcap=3.0, backend="cpp")
    fwd = (h, w, y, b, None, reduction, *opts, [True, True, True])
    # the private kernel's schema against what it does (no fake kernel: it only runs inside the public op)
    g = torch.rand(11, generator=torch.Generator().manual_seed(seed))
    terms = (1.0, 0.02, 0.9, 0.1 / 37)  # LossTerms of label_smoothing 0.1, z_loss 0.01, V 37
    torch.library.opcheck(torch.ops.fused_lce._cpu_fused,
                          (h.detach(), w.detach(), b.detach(), y, g, *terms, 3.0,
                           True, [True, True, True], 0.5, 0), test_utils="test_schema")
    torch.library.opcheck(torch.ops.fused_lce.forward, fwd)
    lse = torch.ops.fused_lce.forward(*fwd)[1]
    up = g if reduction == "none" else g[0]
    bwd = (up, h.detach(), w.detach(), y, b.detach(), lse, None, reduction, *opts, [True, False, True])
    torch.library.opcheck(torch.ops.fused_lce.backward, bwd)
    assert math.isfinite(float(torch.ops.fused_lce.forward(*fwd)[0].sum()))
