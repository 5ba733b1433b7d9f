"""The "npu" provider's kernel choice (fused_lce/backends/npu.py ``_AdapterKernels``, env FUSED_LCE_NPU_KERNELS):
"old" (FusedLceStats / FusedLceGrad) or "mix" (FusedLceStatsMix / FusedLceGradMix). The adapter's ops
(``_npu_*``) have exactly the twin ops' schemas (tests/npu/test_npu_adapter_build.py), so the twin's ``_twin_*`` ops
stand behind the adapter's names here: the provider's real Python path -- the kernel selection and, for "mix", the
coefficient planes a, t, b, u handed over one by one -- runs the kernel sources on the CPU twin, end to end through
``fused_lce.linear_cross_entropy`` and autograd, against the float64 reference."""
from __future__ import annotations

import os
import sys
from collections import Counter

import pytest
import torch

import fused_lce
from fused_lce.core import registry
from fused_lce.backends import npu as npu_ascendc
from fused_lce.core.formulas import reference_loss

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ascend"))


def test_kernel_choice_default_and_env():
    assert npu_ascendc.DEFAULT_KERNELS == "mix" and npu_ascendc.kernel_choice({}) == "mix"
    assert npu_ascendc.kernel_choice({"FUSED_LCE_NPU_KERNELS": " old "}) == "old"
    assert npu_ascendc.kernel_choice({"FUSED_LCE_NPU_KERNELS": ""}) == "mix"
    with pytest.raises(ValueError, match="FUSED_LCE_NPU_KERNELS: expected one of"):
        npu_ascendc.kernel_choice({"FUSED_LCE_NPU_KERNELS": "MIX"})
    with pytest.raises(ValueError, match="kind: expected one of"):
        npu_ascendc._AdapterKernels(kind="cube")


class Recorder:
    """An op namespace that records each call (name, args) and returns placeholders."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def op(*args):
            self.calls.append((name, args))
            return (None,) * (6 if "stats" in name else 3)

        return op


def test_each_kind_calls_its_ops_with_its_contract(monkeypatch, seed):
    g = torch.Generator().manual_seed(seed)
    n, d, v = 7, 5, 11
    h, w = torch.randn(n, d, generator=g), torch.randn(v, d, generator=g)
    y = torch.randint(0, v, (n,), generator=g)
    coefs = torch.randn(4, n, generator=g, dtype=torch.float64)
    lse = torch.randn(n, generator=g, dtype=torch.float64)
    rec = Recorder()
    k = npu_ascendc._AdapterKernels(ops=rec)  # follows the env at every call
    for kind in ("old", "mix"):
        monkeypatch.setenv("FUSED_LCE_NPU_KERNELS", kind)
        k.stats(h, w, None, y, 3, 2.5, True, 0.75, False)
        k.grads(coefs, h, w, None, y, lse, 3, 2.5, 0.75, (True, False, True))
    (s_old, a_old), (g_old, b_old), (s_mix, a_mix), (g_mix, b_mix) = rec.calls
    assert (s_old, g_old, s_mix, g_mix) == ("_npu_stats", "_npu_grads", "_npu_stats_mix", "_npu_grads_mix")
    assert a_old[4:] == (3, 2.5, True, 0.75, False)  # _npu_stats: with_zsum before temperature
    assert a_mix[4:] == (3, 2.5, 0.75, True, False, False)  # _npu_stats_mix: the twin's order, keep_z off
    assert b_old[0] is coefs and b_old[6:] == (3, 2.5, 0.75, [True, False, True])
    # mix: (hidden, weight, bias, labels, lse, a, t, b, u, ...) with float32 planes, as TwinKernels(kernels="mix")
    assert b_mix[:4] == (h, w, None, y) and b_mix[9:] == (3, 2.5, 0.75, [True, False, True], None, False, None)
    assert b_mix[4].dtype == torch.float32 and torch.equal(b_mix[4], lse.float())
    for i in range(4):
        assert b_mix[5 + i].dtype == torch.float32 and torch.equal(b_mix[5 + i], coefs[i].float())
    monkeypatch.setenv("FUSED_LCE_NPU_KERNELS", "fast")
    with pytest.raises(ValueError, match="FUSED_LCE_NPU_KERNELS"):
        k.stats(h, w, None, y, 0, 0.0, False, 1.0, False)
    assert len(rec.calls) == 4  # nothing launched on a bad value
    fixed = npu_ascendc._AdapterKernels(kind="mix", ops=rec)
    fixed.stats(h, w, None, y, 0, 0.0, False, 1.0, False)  # a fixed kind ignores the env
    assert rec.calls[-1][0] == "_npu_stats_mix"


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
        import twin_build

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
@pytest.mark.parametrize("kind", ["old", "mix"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
def test_the_chosen_kernels_run_end_to_end_on_the_twin(kind, dtype, tol, twin_ops, monkeypatch, seed):
    shim = TwinAsAdapterOps(twin_ops)
    registry.register(npu_ascendc.AscendCProvider("npu_adapter_twin", kernels=npu_ascendc._AdapterKernels(ops=shim),
                                                  device_types=("cpu",)))
    monkeypatch.setenv("FUSED_LCE_NPU_KERNELS", kind)
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
            assert err < tol, f"{kind} {dtype} {what}: relative L2 error {err:.2e} (seed {seed})"
        want = {"old": {"_npu_stats", "_npu_grads"}, "mix": {"_npu_stats_mix", "_npu_grads_mix"}}[kind]
        assert set(shim.calls) == want, shim.calls
    finally:
        registry.unregister("npu_adapter_twin")


@pytest.mark.twin
def test_mix_choice_equals_the_twin_provider_mix_path(twin_ops, monkeypatch, seed):
    """With "mix" the adapter path hands the kernels the same arguments as tests/ascend/twin_build.py
    TwinKernels(kernels="mix") (the npu_twin provider's mix mode): results are bitwise equal (the MIX backward is
    deterministic), log-prob options included."""
    import twin_build

    shim = TwinAsAdapterOps(twin_ops)
    registry.register(npu_ascendc.AscendCProvider("npu_adapter_twin", kernels=npu_ascendc._AdapterKernels("mix", shim),
                                                  device_types=("cpu",)))
    twin = twin_build.TwinKernels(hw=twin_build.HW_TINY, seed=3, kernels="mix")
    registry.register(npu_ascendc.AscendCProvider("npu_twin_mix", kernels=twin, device_types=("cpu",)))
    try:
        g = torch.Generator().manual_seed(seed)
        n, d, v = 29, 24, 270
        h, w = torch.randn(n, d, generator=g).bfloat16(), torch.randn(v, d, generator=g).bfloat16()
        y = torch.randint(0, v, (n,), generator=g)
        for opts in (dict(label_smoothing=0.1, softcap=5.0), dict(reduction="none")):
            a = _run("npu_adapter_twin", h, w, None, y, **opts)
            t = _run("npu_twin_mix", h, w, None, y, **opts)
            for x, z in zip(a[:3], t[:3]):
                assert torch.equal(x, z)
        outs = []
        for backend in ("npu_adapter_twin", "npu_twin_mix"):  # log-probs + entropy: b != 0 in the backward
            hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
            lp, ent = fused_lce.linear_logprobs(hh, ww, y, temperature=0.7, return_entropy=True, backend=backend)
            (lp.sum() + ent.sum()).backward()
            outs.append((lp.detach(), ent.detach(), hh.grad, ww.grad))
        for x, z in zip(*outs):
            assert torch.equal(x, z)
        assert shim.calls["_npu_stats_mix"] >= 3 and shim.calls["_npu_grads_mix"] >= 2
    finally:
        registry.unregister("npu_adapter_twin")
        registry.unregister("npu_twin_mix")


@pytest.mark.parametrize("kind", ["old", "mix"])
def test_mix_pair_declines_vocabularies_past_its_exact_float_ids(kind):
    """The MIX planner carries ids as exact floats: with the MIX pair (the default) the provider declines
    V_local >= 2^24 with a reason naming the way out, so auto falls back instead of failing in the kernel; the old
    pair takes it."""
    from fused_lce.core import Options, Problem

    prov = npu_ascendc.AscendCProvider("npu_choice", kernels=npu_ascendc._AdapterKernels(kind), device_types=("cpu",))
    big = Problem(8, 8, 1 << 24, torch.bfloat16, torch.device("cpu"), False, Options())
    ok = Problem(8, 8, (1 << 24) - 1, torch.bfloat16, torch.device("cpu"), False, Options())
    assert prov.supports(ok) is None
    reason = prov.supports(big)
    if kind == "mix":
        assert reason is not None and "2^24" in reason and "FUSED_LCE_NPU_KERNELS=old" in reason, reason
    else:
        assert reason is None


@pytest.mark.parametrize("kind", ["old", "mix"])
def test_both_pairs_decline_a_hidden_size_past_the_copy_stride_field(kind):
    """Every kernel reads h and W at row stride D through the GM -> L1 copy, whose Nd2NzParams::srcDValue is 16
    bits: D >= 65535 is declined with a reason naming that field (the planner refuses it too)."""
    from fused_lce.core import Options, Problem

    prov = npu_ascendc.AscendCProvider("npu_choice", kernels=npu_ascendc._AdapterKernels(kind), device_types=("cpu",))
    assert prov.supports(Problem(8, 65534, 100, torch.bfloat16, torch.device("cpu"), False, Options())) is None
    reason = prov.supports(Problem(8, 65535, 100, torch.bfloat16, torch.device("cpu"), False, Options()))
    assert reason is not None and "srcDValue" in reason and "65535" in reason, reason
