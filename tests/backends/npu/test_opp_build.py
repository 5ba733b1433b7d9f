"""The NPU build path without CANN: cmake/npu_build.py's toolkit check, OPP step and log scan against a stub
cmake and stub toolkit trees (tests/support/fake_cann.py), and setup.py under pip with them: the OPP package
is built once per install (not once per setup.py run), not again while it is newer than its sources, a failed
kernel build is recorded with its first error line and log while the host adapter is still built, and
FUSED_LCE_REQUIRE_EXT=1 turns any NPU failure into an install error."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile

import pytest

from ...support import clean_env, fake_cann

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FAKE_TORCH_NPU = os.path.join(ROOT, "tests", "support", "fake_torch_npu")


@pytest.fixture(scope="module")
def nb():
    spec = importlib.util.spec_from_file_location("npu_build", os.path.join(ROOT, "cmake", "npu_build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------- toolkit check
@pytest.mark.parametrize("where", ["asc-devkit", "runtime", "compiler", "install_info"])
def test_toolkit_version_read_where_cann_states_it(nb, tmp_path, where):
    home = fake_cann.make_toolkit(str(tmp_path / "cann"), "9.1.0", where)
    tk = nb.check_toolkit(home)
    assert tk["version"] == "9.1.0" and tk["asc_config"].endswith("lib64/cmake/asc-config.cmake")
    assert os.path.isfile(tk["version_file"])
    from fused_lce.backends.npu import env  # what backend_info / fused-lce doctor report: the same files

    assert env.toolkit_version(home) == "9.1.0"


@pytest.mark.parametrize("version", ["8.0.RC1", "8.5.0", "7.0.0"])
def test_old_cann_is_refused_naming_found_and_minimum(nb, tmp_path, version):
    home = fake_cann.make_toolkit(str(tmp_path / "cann"), version)
    with pytest.raises(nb.NpuBuildError) as e:
        nb.check_toolkit(home)
    assert f"CANN {version} found" in str(e.value) and "needs CANN >= 9.0" in str(e.value)


def test_missing_asc_config_is_refused(nb, tmp_path):
    home = fake_cann.make_toolkit(str(tmp_path / "cann"), "9.0.0", asc_config=False)
    with pytest.raises(nb.NpuBuildError) as e:
        nb.check_toolkit(home)
    assert "no asc-config.cmake" in str(e.value) and "CANN version found: 9.0.0" in str(e.value)


def test_unknown_version_builds_when_asc_config_is_there(nb, tmp_path):
    home = fake_cann.make_toolkit(str(tmp_path / "cann"), None)
    assert nb.check_toolkit(home)["version"] is None


def test_version_parsing(nb):
    assert nb.parse_version("9.0.0") == (9, 0) and nb.parse_version("8.0.RC1") == (8, 0)
    assert nb.parse_version("9.1.0-beta.1") == (9, 1) and nb.parse_version("RC1") is None
    assert nb.MIN_CANN == (9, 0)


def test_first_error_line(nb):
    log = ("-- Looking for pthread\n[3/48] g++ -Werror=return-type -c a.cpp\nwarning: unused\n"
           "op_kernel/k.cpp:12:3: error: no matching function for call to 'Foo'\nmake: *** [all] Error 2\n")
    assert nb.first_error_line(log) == "op_kernel/k.cpp:12:3: error: no matching function for call to 'Foo'"
    assert nb.first_error_line("CMake Error at x.cmake:3 (message):\n  boom").startswith("CMake Error at")
    assert nb.first_error_line("[ops_custom] [2026-01-01] [ERROR] copy new "
                               "op_api files failed").endswith("failed")
    assert nb.first_error_line("FAILED: op_kernel/x\nninja: build stopped") == "FAILED: op_kernel/x"
    assert nb.first_error_line("all good\n-Werror -ferror-limit=0") is None


# ----------------------------------------------------------------------------------------------- the OPP step
@pytest.fixture()
def opp_env(tmp_path, monkeypatch):
    """A repository root with OPP sources, a stub toolkit and a stub cmake on PATH."""
    repo = tmp_path / "repo"
    (repo / "csrc" / "ascend" / "common").mkdir(parents=True)
    (repo / "csrc" / "ascend" / "CMakeLists.txt").write_text("project(x)\n")
    (repo / "csrc" / "ascend" / "common" / "k.h").write_text("// kernel\n")
    (repo / "cmake").mkdir()
    for name in ("ascend_opp.cmake", "FindCANN.cmake"):
        (repo / "cmake" / name).write_text("#\n")
    old = time.time() - 100
    for d, _, files in os.walk(repo):
        for f in files:
            os.utime(os.path.join(d, f), (old, old))
    bindir = tmp_path / "bin"
    fake_cann.make_cmake(str(bindir))
    calls = tmp_path / "cmake_calls"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CMAKE_CALLS", str(calls))
    monkeypatch.setenv("ASCEND_HOME_PATH", fake_cann.make_toolkit(str(tmp_path / "cann"), "9.0.0"))
    monkeypatch.delenv("FUSED_LCE_SKIP_OPP_BUILD", raising=False)
    monkeypatch.delenv("FAKE_CMAKE_MODE", raising=False)

    def builds():
        return sum(1 for line in calls.read_text().splitlines() if "--build" in json.loads(line)) \
            if calls.exists() else 0

    return repo, builds


def test_opp_step_builds_installs_and_logs(nb, opp_env):
    repo, builds = opp_env
    st = nb.opp_step(str(repo))
    assert st["ok"] and st["attempted"] and st["error"] is None and st["cann_version"] == "9.0.0", st
    assert builds() == 1
    lib = repo / "build" / "opp" / "vendors" / "fused_lce" / "op_api" / "lib" / "libcust_opapi.so"
    assert lib.is_file() and st["vendor"] == str(lib.parent.parent.parent)
    log = open(st["log"]).read()
    assert st["log"] == str(repo / "build" / "ascend_opp" / "build.log")
    # the whole output: every command line, cmake's configure and verbose build output, the installer's
    assert "-DCMAKE_BUILD_TYPE=Release" in log and "--verbose" in log and "-- Configuring done" in log
    assert "[48/48] package" in log and "SUCCESS" in log and "--install-path=" in log


def _edit(repo, rel):
    """A source edited after the installed package was built."""
    lib = repo / "build" / "opp" / "vendors" / "fused_lce" / "op_api" / "lib" / "libcust_opapi.so"
    now = time.time()
    os.utime(lib, (now - 50, now - 50))
    os.utime(repo / rel, (now - 10, now - 10))


def test_opp_step_skips_an_up_to_date_package_and_rebuilds_a_stale_one(nb, opp_env, monkeypatch, tmp_path):
    repo, builds = opp_env
    assert nb.opp_step(str(repo))["ok"] and builds() == 1
    again = nb.opp_step(str(repo))
    assert again["ok"] and builds() == 1 and again["note"].startswith("up to date"), again
    assert again["log"].endswith("build.log")  # the log of the build that made the package
    _edit(repo, "csrc/ascend/common/k.h")  # a kernel source
    assert nb.opp_step(str(repo))["ok"] and builds() == 2
    assert nb.opp_step(str(repo))["ok"] and builds() == 2
    _edit(repo, "cmake/FindCANN.cmake")  # a CMake module of the package
    assert nb.opp_step(str(repo))["ok"] and builds() == 3
    assert nb.opp_step(str(repo), force=True)["ok"] and builds() == 4
    cache = repo / "build" / "ascend_opp" / "CMakeCache.txt"
    cache.write_text("CANN_ROOT:PATH=/old/toolkit\n")  # what CMake keeps from the last configure
    assert nb.opp_step(str(repo), force=True)["ok"] and builds() == 5 and cache.exists()  # the same toolkit
    monkeypatch.setenv("ASCEND_HOME_PATH", fake_cann.make_toolkit(str(tmp_path / "cann2"), "9.1.0"))
    cache.write_text("CANN_ROOT:PATH=/old/toolkit\n")
    assert nb.opp_step(str(repo))["ok"] and builds() == 6  # another toolkit: reconfigured from scratch
    assert not cache.exists() or "/old/toolkit" not in cache.read_text()
    shutil.rmtree(repo / "build" / "opp")
    assert nb.opp_step(str(repo))["ok"] and builds() == 7  # the installed package is gone


@pytest.mark.parametrize("mode, first", [
    ("compile_error", "fused_lce_stats/op_kernel/fused_lce_stats_cube.cpp:42:7: error: no member named 'Foo' "
                      "in 'AscendC'"),
    ("configure_error", "CMake Error at CMakeLists.txt:21 (find_package):")])
def test_failed_opp_build_reports_first_error_line_and_log(nb, opp_env, monkeypatch, mode, first):
    repo, builds = opp_env
    assert nb.opp_step(str(repo))["ok"]
    monkeypatch.setenv("FAKE_CMAKE_MODE", mode)
    _edit(repo, "csrc/ascend/CMakeLists.txt")
    st = nb.opp_step(str(repo))
    assert not st["ok"] and st["attempted"] and st["error"] == first, st
    assert st["log"] == str(repo / "build" / "ascend_opp" / "build.log") and first in open(st["log"]).read()
    monkeypatch.setenv("FAKE_CMAKE_MODE", "ok")
    n = builds()
    assert nb.opp_step(str(repo))["ok"] and builds() == n + 1  # a failed build leaves nothing "up to date"


def test_toolkit_refusal_is_logged_and_builds_nothing(nb, opp_env, monkeypatch, tmp_path):
    repo, builds = opp_env
    monkeypatch.setenv("ASCEND_HOME_PATH", fake_cann.make_toolkit(str(tmp_path / "old"), "8.0.RC1",
                                                                  "compiler"))
    st = nb.opp_step(str(repo))
    assert not st["ok"] and builds() == 0 and st["error"].startswith("CANN 8.0.RC1 found")
    assert "needs CANN >= 9.0" in st["error"] and st["error"] in open(st["log"]).read()


def test_opp_step_not_attempted(nb, opp_env, monkeypatch):
    repo, builds = opp_env
    monkeypatch.setenv("FUSED_LCE_SKIP_OPP_BUILD", "1")
    st = nb.opp_step(str(repo))
    assert not st["ok"] and not st["attempted"] and "FUSED_LCE_SKIP_OPP_BUILD" in st["error"]
    monkeypatch.delenv("FUSED_LCE_SKIP_OPP_BUILD")
    monkeypatch.delenv("ASCEND_HOME_PATH")
    st = nb.opp_step(str(repo))
    assert not st["attempted"] and "ASCEND_HOME_PATH was not set" in st["error"] and builds() == 0


# ------------------------------------------------------------------------------------------- setup.py via pip
def _source_copy(dst):
    """The files an install reads (a copy: the build writes build/, the status file and egg-info beside
    them)."""
    dst.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", "fused_lce-autopatch.pth",
                 "fused_lce_autopatch.py"):
        shutil.copy(os.path.join(ROOT, name), dst / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "_build_status.*")
    for name in ("fused_lce", "cmake", "csrc"):
        shutil.copytree(os.path.join(ROOT, name), dst / name, ignore=ignore)
    return dst


@pytest.fixture()
def pip_env(tmp_path):
    """Environment of a pip build on a pretend Ascend host: stub toolkit, stub cmake and compiler, the fake
    torch_npu findable (never imported by the build)."""
    bindir = tmp_path / "bin"
    fake_cann.make_cmake(str(bindir))
    cxx = fake_cann.make_cxx(str(bindir))
    env = clean_env()
    env.update(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}",
               FAKE_CMAKE_CALLS=str(tmp_path / "cmake_calls"), FAKE_CXX_CALLS=str(tmp_path / "cxx_calls"),
               CC=cxx, CXX=cxx, LDSHARED=f"{cxx} -shared",
               ASCEND_HOME_PATH=fake_cann.make_toolkit(str(tmp_path / "cann"), "9.0.0"),
               PYTHONPATH=FAKE_TORCH_NPU, MAX_JOBS="1")
    return env


def _pip_wheel(src, out, env):
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(src)], env=env, capture_output=True, text=True, timeout=600)


def _cmake_runs(env):
    path = env["FAKE_CMAKE_CALLS"]
    calls = [json.loads(x) for x in open(path)] if os.path.exists(path) else []
    return sum("-S" in c for c in calls), sum("--build" in c for c in calls)


def _wheel_status(out):
    (wheel,) = out.glob("fused_lce-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return json.loads(z.read("fused_lce/_build_status.json"))


@pytest.mark.slow
def test_pip_builds_the_opp_package_once_and_the_adapter_even_when_it_fails(tmp_path, pip_env):
    src = _source_copy(tmp_path / "src")
    r = _pip_wheel(src, tmp_path / "dist", pip_env)
    assert r.returncode == 0, r.stderr[-4000:] + r.stdout[-4000:]
    # pip ran setup.py for the metadata and for the wheel (without build isolation it skips the requirements
    # hook, which the three-run test below covers); the OPP package was configured and built once
    for hook in ("Preparing metadata (pyproject.toml)", "Building wheel"):
        assert hook in r.stdout + r.stderr, hook
    assert _cmake_runs(pip_env) == (1, 1)
    status = _wheel_status(tmp_path / "dist")
    assert status["npu_opp"]["ok"] and status["npu_opp"]["log"] \
        == str(src / "build" / "ascend_opp" / "build.log")
    assert status["npu_adapter"]["ok"] and status["cpp"]["ok"], status
    compiled = open(pip_env["FAKE_CXX_CALLS"]).read()
    assert "fused_lce_npu.cpp" in compiled and "ops.cpp" in compiled
    # again: the installed package is newer than its sources, nothing is configured or built
    r = _pip_wheel(src, tmp_path / "dist2", pip_env)
    assert r.returncode == 0 and _cmake_runs(pip_env) == (1, 1), r.stderr[-3000:]
    assert _wheel_status(tmp_path / "dist2")["npu_opp"]["note"].startswith("up to date")
    # a kernel that does not compile: recorded with its first error line and the log; _npu_C is still built
    os.utime(src / "csrc" / "ascend" / "CMakeLists.txt")
    open(pip_env["FAKE_CXX_CALLS"], "w").close()
    r = _pip_wheel(src, tmp_path / "dist3", {**pip_env, "FAKE_CMAKE_MODE": "compile_error"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert _cmake_runs(pip_env) == (2, 2)
    status = _wheel_status(tmp_path / "dist3")
    opp = status["npu_opp"]
    assert not opp["ok"] and opp["error"].endswith("error: no member named 'Foo' in 'AscendC'"), opp
    assert os.path.isfile(opp["log"]) and "FAILED: op_kernel" in open(opp["log"]).read()
    assert status["npu_adapter"]["ok"] and "_npu_C" in open(pip_env["FAKE_CXX_CALLS"]).read()  # linked again
    # the same with FUSED_LCE_REQUIRE_EXT=1: an install error that names the first error line and the log
    r = _pip_wheel(src, tmp_path / "dist4", {**pip_env, "FAKE_CMAKE_MODE": "compile_error",
                                             "FUSED_LCE_REQUIRE_EXT": "1"})
    assert r.returncode != 0
    assert "no member named 'Foo'" in r.stdout + r.stderr and \
        "build/ascend_opp/build.log" in r.stdout + r.stderr


@pytest.mark.slow
def test_setup_py_three_runs_build_the_package_once(tmp_path, pip_env):
    """setup.py run as pip's three hooks run it (egg_info, dist_info, bdist_wheel), each a new process."""
    src = _source_copy(tmp_path / "src")
    for cmd in (["egg_info"], ["dist_info"], ["bdist_wheel", "-d", str(tmp_path / "dist")]):
        r = subprocess.run([sys.executable, "setup.py", *cmd], cwd=src, env=pip_env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert _cmake_runs(pip_env) == ((1, 1) if cmd[0] == "bdist_wheel" else (0, 0)), cmd
    recorded = json.load(open(src / "fused_lce" / "_build_status.json"))
    assert recorded["npu_opp"]["ok"] and recorded == _wheel_status(tmp_path / "dist")
    # the OPP step alone: up to date, then forced; its record replaces the OPP part only
    for force, builds in (([], 1), (["--force"], 2)):
        r = subprocess.run([sys.executable, "setup.py", "build_npu_opp", *force], cwd=src, env=pip_env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and _cmake_runs(pip_env) == (builds, builds), r.stderr[-3000:]
    again = json.load(open(src / "fused_lce" / "_build_status.json"))
    assert again["npu_opp"]["ok"] and again["npu_opp"]["note"] is None and again["cpp"] == recorded["cpp"]


@pytest.mark.slow
def test_require_ext_makes_a_missing_torch_npu_an_install_error(tmp_path, pip_env):
    src = _source_copy(tmp_path / "src")
    env = {**pip_env, "PYTHONPATH": "", "FUSED_LCE_REQUIRE_EXT": "1"}
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=src, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "torch_npu is not installed" in r.stderr, r.stderr[-3000:]
    recorded = json.load(open(src / "fused_lce" / "_build_status.json"))
    assert not recorded["npu_adapter"]["ok"] and recorded["npu_opp"]["ok"]
