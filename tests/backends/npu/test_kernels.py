"""The "npu" provider's kernels (fused_lce/backends/npu/kernels.py ``AdapterKernels``): FusedLceStatsCube /
FusedLceGradCube through the adapter's ops. The adapter's ops (``_npu_*``) and the twin's (``_twin_*``) are
defined from one schema list (csrc/npu/kernel_ops.h), so the twin's ops stand behind the adapter's names here:
the provider's real Python path -- the coefficient planes a, t, b, u handed over one by one -- runs the kernel
sources on the CPU twin, end to end through ``fused_lce.linear_cross_entropy`` and autograd, against the
float64 reference."""
from __future__ import annotations

import os
from collections import Counter

import pytest
import torch

import fused_lce
from fused_lce.core import registry
from fused_lce.backends.npu import kernels as npu_kernels, provider as npu_provider
from fused_lce.core.formulas import reference_loss

from ...support.ascendc_twin import build as twin_build


class Recorder:
    """An op namespace that records each call (name, args) and returns placeholders."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def op(*args):
            self.calls.append((name, args))
            return (None,) * (6 if "stats" in name else 3)

        return op


def test_the_adapter_ops_get_their_contract(seed):
    g = torch.Generator().manual_seed(seed)
    n, d, v = 7, 5, 11
    h, w = torch.randn(n, d, generator=g), torch.randn(v, d, generator=g)
    y = torch.randint(0, v, (n,), generator=g)
    coefs = torch.randn(4, n, generator=g, dtype=torch.float64)
    lse = torch.randn(n, generator=g, dtype=torch.float64)
    rec = Recorder()
    k = npu_kernels.AdapterKernels(ops=rec)
    k.stats(h, w, None, y, 3, 2.5, 0.75, True, False)
    k.grads(h, w, None, y, lse, coefs, 3, 2.5, 0.75, (True, False, True))
    (s_name, a_stats), (g_name, b_grads) = rec.calls
    assert (s_name, g_name) == ("_npu_stats_cube", "_npu_grads_cube")
    # one argument order (csrc/npu/kernel_ops.h): problem tensors, the op's tensors, vocab_start, softcap,
    # temperature, the op's flags
    # keep_z off
    assert a_stats[:4] == (h, w, None, y) and a_stats[4:] == (3, 2.5, 0.75, True, False, False, 0)
    # (hidden, weight, bias, labels, lse, a, t, b, u, ...) with float32 planes
    assert b_grads[:4] == (h, w, None, y) and b_grads[9:] == (3, 2.5, 0.75, [True, False, True], None,
                                                              False, None,
                                                                0)
    assert b_grads[4].dtype == torch.float32 and torch.equal(b_grads[4], lse.float())
    for i in range(4):
        assert b_grads[5 + i].dtype == torch.float32 and torch.equal(b_grads[5 + i], coefs[i].float())


def test_the_conservative_variants_follow_the_environment(monkeypatch):
    """FUSED_LCE_NPU_PLAIN_TILING / FUSED_LCE_NPU_SERIAL_MATMUL set the variant bits every launch passes (read
    at each call); a fixed variant ignores them; a value other than 0 / 1 is a ValueError naming the variable,
    nothing launched."""
    h, w, y = torch.randn(3, 4), torch.randn(5, 4), torch.zeros(3, dtype=torch.long)
    coefs, lse = torch.zeros(4, 3), torch.zeros(3)
    rec = Recorder()
    k = npu_kernels.AdapterKernels(ops=rec)
    for env, bits in (({}, 0), ({"FUSED_LCE_NPU_PLAIN_TILING": "1"}, 1),
                      ({"FUSED_LCE_NPU_SERIAL_MATMUL": "1"}, 2),
                      ({"FUSED_LCE_NPU_PLAIN_TILING": "1", "FUSED_LCE_NPU_SERIAL_MATMUL": " 1 "}, 3),
                      ({"FUSED_LCE_NPU_PLAIN_TILING": "0"}, 0)):
        for name in npu_kernels.VARIANT_ENV:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        k.stats(h, w, None, y, 0, 0.0, 1.0, False, False)
        k.grads(h, w, None, y, lse, coefs, 0, 0.0, 1.0, (True, True, False))
        assert rec.calls[-2][1][-1] == bits and rec.calls[-1][1][-1] == bits, (env, rec.calls[-2:])
    fixed = npu_kernels.AdapterKernels(ops=rec, variant=2)
    fixed.stats(h, w, None, y, 0, 0.0, 1.0, False, False)
    assert rec.calls[-1][1][-1] == 2
    monkeypatch.setenv("FUSED_LCE_NPU_SERIAL_MATMUL", "yes")
    n = len(rec.calls)
    with pytest.raises(ValueError, match="FUSED_LCE_NPU_SERIAL_MATMUL: expected 0 or 1"):
        k.stats(h, w, None, y, 0, 0.0, 1.0, False, False)
    assert len(rec.calls) == n


class TwinAsAdapterOps:
    """The twin's ops behind the adapter's names (``_npu_X`` -> ``_twin_X``), counting the calls."""

    def __init__(self, ops):
        self._ops = ops
        self.calls = Counter()

    def __getattr__(self, name):
        assert name.startswith("_npu_"), name
        self.calls[name] += 1
        return getattr(self._ops, "_twin_" + name[len("_npu_"):])


@pytest.fixture(scope="module")
def twin_ops():
    try:
        ops = twin_build.load_twin()
        twin_build.configure(twin_build.HW_TINY, seed=3)  # many tiles, tails, cores and segments
    except Exception as e:  # noqa: BLE001
        if os.environ.get("CI"):
            raise
        pytest.skip(f"the AscendC CPU twin could not be built here: {e}")
    return ops


def _run(backend, h, w, b, y, **opts):
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    bb = b.clone().requires_grad_() if b is not None else None
    loss = fused_lce.linear_cross_entropy(hh, ww, y, bb, backend=backend, **opts)
    loss.sum().backward()
    return loss.detach(), hh.grad, ww.grad, None if bb is None else bb.grad


@pytest.mark.twin
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
def test_the_adapter_path_runs_end_to_end_on_the_twin(dtype, tol, twin_ops, seed):
    shim = TwinAsAdapterOps(twin_ops)
    registry.register(npu_provider.AscendCProvider("npu_adapter_twin",
                                                   kernels=npu_kernels.AdapterKernels(ops=shim),
                                                   device_types=("cpu",)))
    try:
        g = torch.Generator().manual_seed(seed)
        n, d, v = 37, 45, 301  # tails in N, D and V
        h = (torch.randn(n, d, generator=g) * 0.5).to(dtype)
        w = (torch.randn(v, d, generator=g) * 0.5).to(dtype)
        b = (torch.randn(v, generator=g) * 0.1).to(dtype)
        y = torch.randint(0, v, (n,), generator=g)
        y[3] = -100
        opts = dict(label_smoothing=0.1, z_loss=1e-3, softcap=8.0)
        got = _run("npu_adapter_twin", h, w, b, y, **opts)
        h64, w64, b64 = (x.double().requires_grad_() for x in (h, w, b))
        ref = reference_loss(h64, w64, y, b64, **opts)[0]
        ref.backward()
        for x, r, what in zip(got, (ref.detach(), h64.grad, w64.grad, b64.grad), ("loss", "dX", "dW", "db")):
            err = float((x.double() - r).norm() / r.norm().clamp_min(1e-30))
            assert err < tol, f"{dtype} {what}: relative L2 error {err:.2e} (seed {seed})"
        assert set(shim.calls) == {"_npu_stats_cube", "_npu_grads_cube"}, shim.calls
    finally:
        registry.unregister("npu_adapter_twin")


@pytest.mark.twin
def test_the_adapter_path_equals_the_twin_provider(twin_ops, seed):
    """The adapter path hands the kernels the same arguments as the twin's TwinKernels (the npu_twin
    provider): results are bitwise equal (the cube-driven backward is deterministic), log-prob options
    included."""
    shim = TwinAsAdapterOps(twin_ops)
    registry.register(npu_provider.AscendCProvider("npu_adapter_twin",
                                                   kernels=npu_kernels.AdapterKernels(shim),
                                                   device_types=("cpu",)))
    twin = twin_build.TwinKernels(hw=twin_build.HW_TINY, seed=3)
    registry.register(npu_provider.AscendCProvider("npu_twin_direct", kernels=twin, device_types=("cpu",)))
    try:
        g = torch.Generator().manual_seed(seed)
        n, d, v = 29, 24, 270
        h, w = torch.randn(n, d, generator=g).bfloat16(), torch.randn(v, d, generator=g).bfloat16()
        y = torch.randint(0, v, (n,), generator=g)
        for opts in (dict(label_smoothing=0.1, softcap=5.0), dict(reduction="none")):
            a = _run("npu_adapter_twin", h, w, None, y, **opts)
            t = _run("npu_twin_direct", h, w, None, y, **opts)
            for x, z in zip(a[:3], t[:3]):
                assert torch.equal(x, z)
        outs = []
        for backend in ("npu_adapter_twin", "npu_twin_direct"):  # log-probs + entropy: b != 0 in the backward
            hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
            lp, ent = fused_lce.linear_logprobs(hh, ww, y, temperature=0.7, return_entropy=True,
                                                backend=backend)
            (lp.sum() + ent.sum()).backward()
            outs.append((lp.detach(), ent.detach(), hh.grad, ww.grad))
        for x, z in zip(*outs):
            assert torch.equal(x, z)
        assert shim.calls["_npu_stats_cube"] >= 3 and shim.calls["_npu_grads_cube"] >= 2
    finally:
        registry.unregister("npu_adapter_twin")
        registry.unregister("npu_twin_direct")


def test_vocabularies_past_the_exact_float_ids_are_declined():
    """The planner carries ids as exact floats: the provider declines V_local >= 2^24 with a reason, so auto
    falls back instead of failing in the kernel."""
    from fused_lce.core import Options, Problem

    prov = npu_provider.AscendCProvider("npu_choice", kernels=npu_kernels.AdapterKernels(),
                                        device_types=("cpu",))
    big = Problem(8, 8, 1 << 24, torch.bfloat16, torch.device("cpu"), False, Options())
    ok = Problem(8, 8, (1 << 24) - 1, torch.bfloat16, torch.device("cpu"), False, Options())
    assert prov.supports(ok) is None
    reason = prov.supports(big)
    assert reason is not None and "2^24" in reason, reason


def test_token_blocks_stay_below_the_exact_float_row_offsets():
    """Row offsets travel as exact floats too: a driver block never reaches 2^24 rows, whatever the tile
    budget."""
    from fused_lce.core import Options, Problem

    prov = npu_provider.AscendCProvider("npu_choice", kernels=npu_kernels.AdapterKernels(),
                                        device_types=("cpu",))
    p = Problem(1 << 25, 8, 1, torch.bfloat16, torch.device("cpu"), False, Options(tile_bytes=1 << 40))
    rows = prov.token_block(p, keep=True)
    assert 0 < rows < 1 << 24 and rows % 128 == 0, rows


def test_a_hidden_size_past_the_copy_stride_field_is_declined():
    """Every kernel reads h and W at row stride D through the GM -> L1 copy, whose Nd2NzParams::srcDValue is
    16 bits: D >= 65535 is declined with a reason naming that field (the planner refuses it too)."""
    from fused_lce.core import Options, Problem

    prov = npu_provider.AscendCProvider("npu_choice", kernels=npu_kernels.AdapterKernels(),
                                        device_types=("cpu",))
    assert prov.supports(Problem(8, 65534, 100, torch.bfloat16, torch.device("cpu"), False,
                                 Options())) is None
    reason = prov.supports(Problem(8, 65535, 100, torch.bfloat16, torch.device("cpu"), False, Options()))
    assert reason is not None and "srcDValue" in reason and "65535" in reason, reason
