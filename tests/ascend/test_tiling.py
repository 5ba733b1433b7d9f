"""(a) The tiling header csrc/ascend/common/fused_lce_tiling.h: C++ unit tests (UB / L1 / L0 budgets, UB
regions, tails, V not a multiple of the block, N beyond 32 bits). The kernels run with this header's plan on
the AscendC CPU twin (tests/ascend), whose index helpers (task map, segments, tails) the C++ tests check to be
a bijection."""
import re
import subprocess


def test_header_unit_tests(tiling_binary):
    r = subprocess.run([tiling_binary], capture_output=True, text=True, timeout=120)
    m = re.search(r"(\d+) passed, (\d+) failed", r.stdout)
    assert m, r.stdout + r.stderr
    assert r.returncode == 0 and int(m.group(2)) == 0, r.stdout
    assert int(m.group(1)) > 100_000  # the shape grid ran


def test_tiling_headers_compile_as_cplusplus11(tmp_path):
    """op_host is compiled by opbuild with -std=c++11 (asc-devkit compile_ascendc_all_ops_so.py): the headers
    it includes -- the planners, the tiling data structs, the TCubeTiling POD -- must stay C++11, and both
    structs must fit the 2048-byte default tiling buffer."""
    import os
    import shutil

    cxx = os.environ.get("CXX") or shutil.which("g++")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    src = tmp_path / "c11.cpp"
    src.write_text('#include "fused_lce_cube_tiling_data.h"\n'
                   "static_assert(sizeof(FusedLceStatsCubeTilingData) <= 2048, \"tiling data too large\");\n"
                   "static_assert(sizeof(FusedLceGradCubeTilingData) <= 2048, \"tiling data too large\");\n"
                   "int main() { FusedLceGradCubeTilingData t{}; return static_cast<int>(t.plan.status); }\n")
    cmd = [cxx, "-std=c++11", "-pedantic", "-Wall", "-Wextra", "-Werror", "-fPIC",
           "-D_GLIBCXX_USE_CXX11_ABI=0", "-I", os.path.join(root, "csrc", "ascend", "common"),
           "-I", os.path.join(root, "tests", "support", "ascendc_twin", "kernel"), str(src),
           "-o", str(tmp_path / "c11")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
