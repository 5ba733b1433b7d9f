"""In CI (env CI=true) every optional dependency that a test module would otherwise importorskip must be
present, so a missing install step fails loudly instead of turning tests into skips."""
from __future__ import annotations

import importlib
import os

import pytest

import fused_lce

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REQUIRED = ["transformers", "peft", "trl", "accelerate", "datasets", "tokenizers", "hypothesis", "matplotlib",
            "megatron.core", "triton"]


@pytest.mark.skipif(not IN_CI, reason="only enforced in CI (CI=true)")
@pytest.mark.parametrize("module", REQUIRED)
def test_dependency_installed_in_ci(module):
    assert importlib.import_module(module).__name__ == module


@pytest.mark.skipif(not IN_CI, reason="only enforced in CI (CI=true)")
def test_native_cpu_backend_built_in_ci():
    info = fused_lce.backend_info()
    assert info["cpp"]["available"], info["cpp"]["reason"]
    assert info["auto"]["cpu"] == "cpp"


@pytest.mark.skipif(not IN_CI or os.environ.get("FUSED_LCE_CI_SWIFT", "1") != "1",
                    reason="only enforced in CI (CI=true) unless FUSED_LCE_CI_SWIFT=0")
def test_swift_environment_built_in_ci():
    # .ci/run builds ms-swift's own environment and points FUSED_LCE_SWIFT_PYTHON at it; without it test_swift
    # skips
    path = os.environ.get("FUSED_LCE_SWIFT_PYTHON", "")
    assert path and os.access(path, os.X_OK), f"FUSED_LCE_SWIFT_PYTHON={path!r}"
