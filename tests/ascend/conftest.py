"""Fixtures of the tests of csrc/ascend: the twin extension (JIT-built once), the part / scheduler
configuration, fresh seeds, and the planner's C++ unit-test binary. The twin and its tolerances are in
tests/support/ascendc_twin, the float64 references in fused_lce.core.formulas."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch

from ..support.ascendc_twin import build as twin_build
from ..support.ascendc_twin.ref import HW_910B, fresh_seed

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.fspath).startswith(HERE):
            item.add_marker(pytest.mark.twin)


@pytest.fixture(scope="session")
def ops():
    """torch.ops.fused_lce with the _twin_* ops registered (built on first use)."""
    return twin_build.load_twin()


@pytest.fixture
def seed():
    s = fresh_seed()
    torch.manual_seed(s)
    return s


@pytest.fixture
def part(ops):
    """Call part(hw, seed) to select the simulated part and the scheduler seed (and mm_variant, the Matmul
    tiling variant); restored to the 910B and the default tiling afterwards."""
    def select(hw=HW_910B, sched_seed=1, switch_prob=0.3, hazards=True, mm_variant=0):
        twin_build.configure(hw, sched_seed, switch_prob, hazards, mm_variant)
    yield select
    twin_build.configure(HW_910B, 1, 0.3, True)


@pytest.fixture(scope="session")
def tiling_binary(tmp_path_factory):
    """tiling_test.cpp compiled against the planner, csrc/ascend/common/fused_lce_tiling.h (warnings are
    errors)."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) on this host")
    out = str(tmp_path_factory.mktemp("tiling") / "tiling_test")
    cmd = [cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror",
           "-I", os.path.join(ROOT, "csrc", "ascend", "common"),
           os.path.join(HERE, "tiling_test.cpp"), "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return out
