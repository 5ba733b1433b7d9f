"""Fixtures of the NPU tests (no NPU needed): the g++-built tiling test binary."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="session")
def tiling_binary(tmp_path_factory):
    """tests/npu/tiling_test.cpp compiled against csrc/include/fused_lce_tiling.h (warnings are errors)."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) on this host")
    out = str(tmp_path_factory.mktemp("tiling") / "tiling_test")
    cmd = [cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "csrc", "include"),
           os.path.join(HERE, "tiling_test.cpp"), "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return out
