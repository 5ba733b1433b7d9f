"""Shared fixtures: which (backend, device) pairs exist here, and the fp64 comparison helpers."""
from __future__ import annotations

import os

import pytest
import torch

import fused_lce
from fused_lce import backends
from fused_lce.backends.base import Config

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available():
        devs.append("cuda")
    return devs


def backend_device_params():
    """Every available backend on every device it supports here; CUDA cases carry the `cuda` mark.
    Unavailable backends are not parametrised at all (a skip must never look like a pass);
    tests/test_backends_present.py says which ones are expected in CI."""
    params = []
    for dev in _devices():
        for name in backends.NAMES:
            if backends.unavailable_reason(name) is not None:
                continue
            impl = backends.load(name)
            if impl.unsupported_reason(torch.device(dev), Config(), torch.float32) is not None:
                continue
            marks = [pytest.mark.cuda] if dev == "cuda" else []
            params.append(pytest.param((name, dev), id=f"{name}-{dev}", marks=marks))
    return params


BACKEND_DEVICE = backend_device_params()


def rel_err(a, b):
    a = a.double()
    b = b.double()
    denom = b.norm()
    diff = (a - b).norm()
    return float(diff / denom) if float(denom) > 0 else float(diff)


# bound on ||ours - fp64|| / ||fp64|| for each input dtype (gradients are returned in the input dtype)
GRAD_TOL = {torch.float32: 1e-4, torch.bfloat16: 1.2e-2, torch.float16: 2e-3}
LOSS_TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-5, torch.float16: 2e-5}


@pytest.fixture
def seed():
    """A fresh seed per test run (printed on failure) so every run draws new inputs."""
    s = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(s)
    return s


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the H200 with the device tool)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
