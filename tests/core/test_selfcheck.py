"""The first-use self-check (fused_lce/core/selfcheck.py), shown with the AscendC kernel sources on the CPU
twin behind the "npu" provider's Python, as a provider the registry must check before first use on this device
(what every NPU is today): a deliberately wrong kernel fails the battery, warns once, is reported by
backend_info and skipped by auto, which falls back to the next provider with the right loss; a correct one
passes and its verdict is cached on disk and reused; the environment turns the check off or forces it. (On a
simulated npu device, through the whole auto order: tests/backends/npu/dispatch_scenarios.py.)"""
from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

import fused_lce
from fused_lce.backends.npu import AscendCProvider
from fused_lce.core import registry, selfcheck
from fused_lce.core.formulas import reference_loss

from ..support.ascendc_twin import build as twin_build

pytestmark = pytest.mark.twin


class Unverified(AscendCProvider):
    """The npu provider over the twin's kernels, on CPU tensors, unverified on this device (as on an NPU)."""

    def needs_check(self, device):
        return "a test stands in for a device the kernels never ran on"


class WrongGrads(twin_build.TwinKernels):
    """The twin's kernels with dW off by 1% -- the kind of slip a first hardware run could show."""

    def grads(self, *args, **kw):
        dx, dw, db = super().grads(*args, **kw)
        return dx, dw * 1.01, db


class Counted(twin_build.TwinKernels):
    calls = 0

    def stats(self, *args, **kw):
        Counted.calls += 1
        return super().stats(*args, **kw)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSED_LCE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FUSED_LCE_SELFCHECK", raising=False)
    selfcheck.forget()
    yield tmp_path / "selfcheck.json"
    selfcheck.forget()


@pytest.fixture
def first_in_auto(monkeypatch):
    """Register a provider and put it first in the CPU auto order (as "npu" is on an NPU)."""
    names = []

    def add(provider):
        registry.register(provider)
        names.append(provider.name)
        monkeypatch.setitem(registry.AUTO_ORDER, "cpu", (provider.name, "cpp", "torch"))
        return provider

    yield add
    for n in names:
        registry.unregister(n)


def _problem(seed):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(29, 40, generator=g)
    w = torch.randn(211, 40, generator=g) * 0.4
    y = torch.randint(0, 211, (29,), generator=g)
    y[::6] = -100
    return h, w, y


def _loss_and_grads(h, w, y, **kw):
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = fused_lce.linear_cross_entropy(hh, ww, y, label_smoothing=0.1, **kw)
    loss.backward()
    return loss.detach(), hh.grad, ww.grad


def _reference(h, w, y):
    hd, wd = h.double().requires_grad_(), w.double().requires_grad_()
    loss = reference_loss(hd, wd, y, label_smoothing=0.1)[0]
    loss.backward()
    return loss.detach(), hd.grad, wd.grad


def test_a_wrong_kernel_fails_warns_and_auto_falls_back(cache, first_in_auto, seed):
    bad = first_in_auto(Unverified("npu_wrong", kernels=WrongGrads(), device_types=("cpu",)))
    h, w, y = _problem(seed)
    with pytest.warns(RuntimeWarning, match=r"backend 'npu_wrong' failed its first-use self-check on cpu "
                                            r".*dW differs .*fused-lce doctor"):
        got = _loss_and_grads(h, w, y)
    for x, r in zip(got, _reference(h, w, y)):  # the next provider's answer: right
        assert float((x.double() - r).norm() / r.norm()) < 1e-5
    info = fused_lce.backend_info()["npu_wrong"]
    assert info["available"] is False and "failed its first-use self-check" in info["reason"], info
    assert "dW differs" in info["selfcheck"]["cpu"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per process: the second call is silent
        _loss_and_grads(h, w, y)
    with pytest.raises(ValueError,
                       match="backend='npu_wrong' is not available: failed its first-use self-check"):
        _loss_and_grads(h, w, y, backend="npu_wrong")
    entry = json.loads(cache.read_text())
    assert len(entry) == 1 and not next(iter(entry.values()))["ok"]  # the failure is cached too
    assert bad.kernels is not None


def test_a_correct_kernel_passes_is_cached_and_used(cache, first_in_auto, seed, monkeypatch):
    first_in_auto(Unverified("npu_right", kernels=Counted(), device_types=("cpu",)))
    runs = []
    real = selfcheck.run_battery
    monkeypatch.setattr(selfcheck, "run_battery", lambda *a, **k: runs.append(1) or real(*a, **k))
    h, w, y = _problem(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = Counted.calls
        got = _loss_and_grads(h, w, y)
    # the battery, then the user's call on the checked provider
    assert runs == [1] and Counted.calls > before + 1
    for x, r in zip(got, _reference(h, w, y)):
        assert float((x.double() - r).norm() / r.norm()) < 1e-5
    v = next(iter(json.loads(cache.read_text()).values()))
    assert v["ok"] and v["cases"] and v["errors"]["dW"] < 5e-2 and v["seconds"] > 0
    assert fused_lce.backend_info()["npu_right"]["selfcheck"] == {"cpu": "passed"}
    selfcheck.forget()  # a new process: the verdict comes from the disk cache, no battery
    _loss_and_grads(h, w, y)
    assert runs == [1] and selfcheck.verdict(registry.load("npu_right"), torch.device("cpu")).cached
    monkeypatch.setenv("FUSED_LCE_SELFCHECK", "1")  # forced: the battery again, whatever the cache holds
    selfcheck.forget()
    _loss_and_grads(h, w, y)
    assert runs == [1, 1]


def test_the_cache_key_follows_the_kernels(cache, first_in_auto, monkeypatch):
    """Another kernel build (here: a conservative variant of the kernels) is another verdict."""
    prov = first_in_auto(Unverified("npu_key", kernels=twin_build.TwinKernels(), device_types=("cpu",)))
    key = prov.check_id(torch.device("cpu"))
    monkeypatch.setenv("FUSED_LCE_NPU_SERIAL_MATMUL", "1")
    assert prov.check_id(torch.device("cpu")) != key


def test_off_and_bad_values_of_the_environment(cache, first_in_auto, monkeypatch, seed):
    first_in_auto(Unverified("npu_off", kernels=WrongGrads(), device_types=("cpu",)))
    h, w, y = _problem(seed)
    # trusted as is: the wrong kernel serves (the user's choice)
    monkeypatch.setenv("FUSED_LCE_SELFCHECK", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, _, dw = _loss_and_grads(h, w, y)
    ref = _reference(h, w, y)
    assert float((dw.double() - ref[2]).norm() / ref[2].norm()) > 5e-3 and not cache.exists()
    monkeypatch.setenv("FUSED_LCE_SELFCHECK", "maybe")
    with pytest.raises(ValueError, match="FUSED_LCE_SELFCHECK: expected 0"):
        _loss_and_grads(h, w, y)


def test_an_unwritable_cache_costs_only_a_rerun(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("FUSED_LCE_CACHE_DIR", str(blocker / "sub"))  # a directory that cannot be created
    selfcheck.forget()
    prov = Unverified("npu_nocache", kernels=twin_build.TwinKernels(), device_types=("cpu",))
    registry.register(prov)
    try:
        assert selfcheck.verdict(prov, torch.device("cpu")).ok
        assert not os.path.exists(blocker / "sub")
    finally:
        registry.unregister(prov.name)
        selfcheck.forget()


def test_every_case_runs_on_a_provider_that_supports_everything(cache, first_in_auto):
    """The twin-backed provider takes every option: the whole battery runs (no case declined), every output of
    the loss and the log-probs is compared, each within its tolerance."""
    prov = first_in_auto(Unverified("npu_all", kernels=twin_build.TwinKernels(), device_types=("cpu",)))
    v = selfcheck.verdict(prov, torch.device("cpu"))
    assert v.ok and not v.declined and len(v.cases) == len(selfcheck.BATTERY), v
    want = {"loss", "lse", "top1", "dX", "dW", "db", "logprob", "entropy", "zmean", "mean_logit",
            "log_sum_sq"}
    assert set(v.errors) == want


class Faulting(twin_build.TwinKernels):
    """Kernels whose backward raises, as a launch error would."""

    def grads(self, *args, **kw):
        raise RuntimeError("aclnnFusedLceGradCube failed: 507015 (a stand-in launch error)")


def test_an_error_is_kept_for_this_process_only(cache, first_in_auto, seed, monkeypatch):
    """A failure by an error (a launch error, out of memory, the reference failing) may be the moment's: the
    provider is skipped in this process, nothing is written to disk, the next process checks again."""
    first_in_auto(Unverified("npu_fault", kernels=Faulting(), device_types=("cpu",)))
    runs = []
    real = selfcheck.run_battery
    monkeypatch.setattr(selfcheck, "run_battery", lambda *a, **k: runs.append(1) or real(*a, **k))
    h, w, y = _problem(seed)
    with pytest.warns(RuntimeWarning, match="RuntimeError: aclnnFusedLceGradCube failed"):
        _loss_and_grads(h, w, y)
    assert not cache.exists() or "npu_fault" not in cache.read_text()
    selfcheck.forget()
    with pytest.warns(RuntimeWarning):
        _loss_and_grads(h, w, y)
    assert runs == [1, 1]


def test_a_failure_on_disk_is_reported_before_first_use(cache, first_in_auto, seed):
    """A new process holding a failed verdict in the disk cache: backend_info says so and auto's choice skips
    the provider before any call (no battery runs for that)."""
    first_in_auto(Unverified("npu_stale", kernels=WrongGrads(), device_types=("cpu",)))
    h, w, y = _problem(seed)
    with pytest.warns(RuntimeWarning):
        _loss_and_grads(h, w, y)
    selfcheck.forget()  # a new process
    runs = []
    real = selfcheck.run_battery
    selfcheck.run_battery = lambda *a, **k: runs.append(1) or real(*a, **k)
    try:
        info = fused_lce.backend_info()
    finally:
        selfcheck.run_battery = real
    assert runs == []
    assert not info["npu_stale"]["available"] and "dW differs" in info["npu_stale"]["reason"], \
        info["npu_stale"]
    assert info["auto"]["cpu"] == "cpp"
