"""Fixtures of the twin tests: the extension (JIT-built once), the part / scheduler configuration and fresh seeds.
The float64 references and tolerances are in twin_ref.py (a module of its own: test directories share the module
name `conftest`)."""
from __future__ import annotations

import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import twin_build  # noqa: E402

from twin_ref import HW_910B, fresh_seed  # noqa: E402


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
    """Call part(hw, seed) to select the simulated part and the scheduler seed (and mm_variant, the Matmul tiling
    variant); restored to the 910B and the default tiling afterwards."""
    def select(hw=HW_910B, sched_seed=1, switch_prob=0.3, hazards=True, mm_variant=0):
        twin_build.configure(hw, sched_seed, switch_prob, hazards, mm_variant)
    yield select
    twin_build.configure(HW_910B, 1, 0.3, True)
