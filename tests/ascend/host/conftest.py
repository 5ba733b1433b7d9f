"""Fixtures of the host build check (tests/ascend/host; helpers in tests/support/ascendc_twin/host_build.py).
See docs/npu-host-build.md."""
from __future__ import annotations

import os
import shutil

import pytest

from ...support.ascendc_twin.host_build import Driver, build_driver


def pytest_configure(config):
    config.addinivalue_line("markers", "twin: runs on the CPU twin of the AscendC API / CANN host runtime")


@pytest.fixture(scope="session")
def cxx() -> str:
    c = os.environ.get("CXX") or shutil.which("g++")
    if c is None:
        pytest.skip("no g++ on this host")
    return c


@pytest.fixture(scope="session")
def driver(cxx, tmp_path_factory) -> Driver:
    """The tiling driver with the op_host sources compiled as the TILING library (OP_TILING_LIB), as the
    runtime loads them."""
    return Driver(build_driver(cxx, str(tmp_path_factory.mktemp("host_twin")), "OP_TILING_LIB",
                               "tiling_driver"))
