"""NPU build steps for setup.py (imported by path) and for the header-only compile check.

setup.py, only when ASCEND_HOME_PATH is set (nothing here imports torch_npu: its ``__init__`` needs the CANN
runtime and an NPU; torch_npu is located with importlib.util.find_spec):
  * ``opp_step(repo_root)`` -- its ``build_npu_opp`` command, run once per build by ``build_ext`` before the
    extensions: checks the toolkit (CANN >= 9.0 and the ASC CMake package, ``check_toolkit``), then
    configures, builds, packages and installs the custom OPP package of csrc/ascend into
    ``<repo>/build/opp/vendors/fused_lce`` (``build_opp``), unless the installed package is newer than every
    file it is built from and was built with the same toolkit (``opp_up_to_date``). The whole output (cmake
    configure, ``--verbose`` build, package, the .run installer) goes to ``build/ascend_opp/build.log``.
    Returns the part's build status (never raises): setup.py records it in fused_lce/_build_status.json, where
    ``backend_info()["npu"]`` reads it. FUSED_LCE_SKIP_OPP_BUILD=1 skips the step (a package installed by
    other means).
  * ``npu_extensions(repo_root)`` -- the host adapter extension ``fused_lce._npu_C``
    (csrc/npu/fused_lce_npu.cpp) compiled against torch_npu's headers and linked to libtorch_npu; built even
    when the OPP package failed.

The OPP step alone, recorded like an install's: ``python setup.py build_npu_opp [--force]``.

Command line (no CANN needed):
  python cmake/npu_build.py fetch-wheel DEST           download the torch-npu wheel matching the installed
                                                       torch and unpack its include/ and libtorch_npu.so
                                                       into DEST
  python cmake/npu_build.py check-adapter TORCH_NPU_DIR OUT_DIR
                                                       compile csrc/npu/fused_lce_npu.cpp with the extension's
                                                       flags and link it (--no-undefined) against that
                                                       torch_npu: what
                                                       tests/backends/npu/test_adapter_build.py runs
Status: the OPP build is written and checked by reading against asc-devkit's custom_op example, and run in CI
against a stub cmake and a stub toolkit tree (tests/backends/npu/test_opp_build.py), never against CANN (no
toolkit here; the host side of the package is compiled and run against stub CANN headers in CI,
tests/ascend/host, docs/npu-host-build.md); the adapter compile is checked in CI.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from typing import Optional

OPP_VENDOR = "fused_lce"
ADAPTER_NAME = "fused_lce._npu_C"
ADAPTER_SOURCE = os.path.join("csrc", "npu", "fused_lce_npu.cpp")
SKIP_ENV = "FUSED_LCE_SKIP_OPP_BUILD"
BUILD_DIR = os.path.join("build", "ascend_opp")
INSTALL_DIR = os.path.join("build", "opp")
LOG_NAME = "build.log"
STAMP_NAME = "fused_lce_opp.json"  # in BUILD_DIR: what the installed package was built from
# the files the package is built from (besides csrc/ascend/**): its CMake modules
OPP_CMAKE_FILES = (os.path.join("cmake", "ascend_opp.cmake"), os.path.join("cmake", "FindCANN.cmake"))
# a line that states a build error: CMake, compilers and the linker, ninja, make, asc-devkit's scripts
# ([ERROR])
ERROR_LINE = re.compile(r"CMake Error|\berror\b\s*:|^FAILED:|\[ERROR\]|\*\*\*.*\bError\b", re.I)


def _load_toolkit():
    """fused_lce/backends/npu/toolkit.py, by path (the package is not importable while it is being built)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fused_lce",
                        "backends", "npu", "toolkit.py")
    spec = importlib.util.spec_from_file_location("fused_lce_npu_toolkit", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_toolkit = _load_toolkit()
MIN_CANN, toolkit_version, parse_version = _toolkit.MIN_CANN, _toolkit.toolkit_version, _toolkit.parse_version


class NpuBuildError(RuntimeError):
    """A failed NPU build step: the first error line and the log that has the rest."""

    def __init__(self, first_line: str, log: Optional[str] = None):
        super().__init__(first_line if log is None else f"{first_line} (full log: {log})")
        self.first_line = first_line
        self.log = log


def log(msg: str) -> None:
    print(f"fused_lce npu_build: {msg}", file=sys.stderr)


def torch_npu_dir() -> Optional[str]:
    """Directory of the installed torch_npu package, found without importing it."""
    spec = importlib.util.find_spec("torch_npu")
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.abspath(spec.origin))


def torch_release() -> tuple[str, int]:
    """('2.13.0', 13): the installed torch's release (local suffix dropped) and minor version."""
    import torch

    release = torch.__version__.split("+")[0]
    m = re.match(r"(\d+)\.(\d+)", release)
    return release, int(m.group(2)) if m else 0


def adapter_flags(tn_dir: str) -> dict:
    """Include dirs, macros, libraries of the adapter for the torch_npu at ``tn_dir`` (an installed package or
    an unpacked wheel). op-plugin's headers expect CURRENT_VERSION (V2R<minor> == minor - 1) from their own
    build."""
    _, minor = torch_release()
    inc = os.path.join(tn_dir, "include")
    return {
        "include_dirs": [inc, os.path.join(inc, "third_party", "op-plugin"),
                         os.path.join(inc, "third_party", "op-plugin", "op_plugin", "include"),
                         os.path.join(inc, "third_party", "acl", "inc"),
                         os.path.join(inc, "third_party", "hccl", "inc")],
        "define_macros": [("CURRENT_VERSION", str(max(minor - 1, 0)))],
        "library_dirs": [os.path.join(tn_dir, "lib")],
        "libraries": ["torch_npu"],
    }


def adapter_extension(repo_root: str, tn_dir: str):
    from torch.utils import cpp_extension

    f = adapter_flags(tn_dir)
    return cpp_extension.CppExtension(
        ADAPTER_NAME, [os.path.join(repo_root, ADAPTER_SOURCE)],
        include_dirs=f["include_dirs"], define_macros=f["define_macros"], library_dirs=f["library_dirs"],
        libraries=f["libraries"], extra_compile_args={"cxx": ["-O2"]},
        extra_link_args=[f"-Wl,-rpath,{f['library_dirs'][0]}"])


# ------------------------------------------------------------------------------------------------ the toolkit
def find_asc_config(home: str) -> tuple[Optional[str], list[str]]:
    """(path of the ASC CMake package's asc-config.cmake, or None; where it was looked for): asc-devkit's
    cmake/CMakeLists.txt installs it to <arch>-linux/lib64/cmake; cmake/FindCANN.cmake looks in the same
    places."""
    dirs = [os.path.join(home, f"{platform.machine()}-linux", "lib64", "cmake"),
            os.path.join(home, "lib64", "cmake"), os.path.join(home, "compiler", "lib64", "cmake")]
    for d in dirs:
        if os.path.isfile(os.path.join(d, "asc-config.cmake")):
            return os.path.join(d, "asc-config.cmake"), dirs
    found = sorted(glob.glob(os.path.join(home, "*", "lib64", "cmake", "asc-config.cmake")))
    return (found[0] if found else None), dirs + [os.path.join(home, "*", "lib64", "cmake")]


def check_toolkit(home: str) -> dict:
    """What the OPP build needs of the toolkit at ``home`` (ASCEND_HOME_PATH): CANN >= MIN_CANN and
    asc-devkit's asc-config.cmake. {"home", "version", "version_file", "asc_config"}; NpuBuildError naming
    what was found."""
    need = ".".join(map(str, MIN_CANN))
    if not os.path.isdir(home):
        raise NpuBuildError(f"ASCEND_HOME_PATH={home} is not a directory: source <cann>/set_env.sh first")
    version, files = toolkit_version(home)
    parsed = parse_version(version) if version else None
    if version is not None and (parsed is None or parsed < MIN_CANN):
        raise NpuBuildError(f"CANN {version} found ({files[0]}), the OPP build needs CANN >= {need} "
                            "(asc-devkit's CMake package: find_package(ASC), npu_op_package)")
    asc, looked = find_asc_config(home)
    if asc is None:
        raise NpuBuildError(f"no asc-config.cmake (asc-devkit's ASC CMake package, CANN >= {need}) under "
                            f"{home}: looked in {', '.join(looked)}; CANN version found: "
                            f"{version or 'unknown'}")
    if version is None:
        log(f"the CANN version at {home} is unknown (none of {', '.join(files)}); building since "
            f"asc-config.cmake is there (needs CANN >= {need})")
    return {"home": os.path.realpath(home), "version": version, "version_file": files[0] if version else None,
            "asc_config": asc}


# -------------------------------------------------------------------------------------------- the OPP package
def opp_sources(repo_root: str) -> list[str]:
    """Every file the OPP package is built from: csrc/ascend/** and the CMake modules it includes."""
    out = [os.path.join(d, f) for d, _, files in os.walk(os.path.join(repo_root, "csrc", "ascend"))
           for f in files]
    return sorted(out) + [os.path.join(repo_root, p) for p in OPP_CMAKE_FILES]


def _installed_lib(install_dir: str) -> str:
    return os.path.join(install_dir, "vendors", OPP_VENDOR, "op_api", "lib", "libcust_opapi.so")


def _commands(cmake: str, src: str, build_dir: str, jobs: str) -> list[list[str]]:
    """Configure, then build the kernel binaries and the .run package, with every command line in the log."""
    return [[cmake, "-S", src, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release"],
            [cmake, "--build", build_dir, "--verbose", "-j", jobs, "--target", "binary", "package"]]


def _stamp(install_dir: str, toolkit: dict) -> dict:
    """What the installed package was built with: the toolkit, the build's command lines, where it went."""
    return {"toolkit": {k: toolkit[k] for k in ("home", "version")}, "lib": _installed_lib(install_dir),
            "commands": _commands("cmake", "<src>", "<build>", "<jobs>")}


def opp_up_to_date(repo_root: str, install_dir: str, stamp_path: str, toolkit: dict) -> Optional[str]:
    """None when the installed package must be (re)built, else why not: its libcust_opapi.so is newer than
    every source and the stamp says it was built the same way (toolkit, commands). asc-devkit's kernel targets
    are always out of date (cmake/asc/fwk_modules/func.cmake), so CMake itself would rebuild every kernel
    binary."""
    lib = _installed_lib(install_dir)
    try:
        with open(stamp_path) as f:
            stamp = json.load(f)
        built = os.path.getmtime(lib)
    except (OSError, ValueError):
        return None
    if stamp != _stamp(install_dir, toolkit):
        return None
    newest = max((os.path.getmtime(p) for p in opp_sources(repo_root) if os.path.exists(p)), default=0.0)
    if newest >= built:
        return None
    return (f"up to date: {lib} is newer than csrc/ascend and the OPP CMake files (built with CANN "
            f"{toolkit['version']})")


def first_error_line(text: str) -> Optional[str]:
    """The first line of ``text`` that states an error (ERROR_LINE), else None."""
    for line in text.splitlines():
        if ERROR_LINE.search(line):
            return line.strip()[:500]
    return None


def _run_logged(cmd: list[str], logf, log_path: str) -> None:
    """Run ``cmd`` with stdout and stderr appended to the open binary log; NpuBuildError with its first error
    line (else its last line) when it fails."""
    logf.write(f"\n$ {shlex.join(cmd)}\n".encode())
    logf.flush()
    start = logf.tell()
    rc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    logf.flush()
    if rc != 0:
        with open(log_path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        first = first_error_line(text)
        if first is None:
            lines = [x.strip() for x in text.splitlines() if x.strip()]
            first = f"{os.path.basename(cmd[0])} exited with status {rc}" + (f": {lines[-1][:500]}"
                                                                             if lines else "")
        raise NpuBuildError(first, log_path)


def build_opp(repo_root: str, build_dir: Optional[str] = None, install_dir: Optional[str] = None,
              log_path: Optional[str] = None) -> str:
    """Configure, build and install the custom OPP package, all output into ``log_path`` (default
    <build_dir>/build.log); returns the vendor directory to put on ASCEND_CUSTOM_OPP_PATH. NpuBuildError on
    failure."""
    # the package's install.sh rejects a relative --install-path (asc-devkit
    # cmake/asc/fwk_modules/scripts/install.sh)
    build_dir = os.path.abspath(build_dir or os.path.join(repo_root, BUILD_DIR))
    install_dir = os.path.abspath(install_dir or os.path.join(repo_root, INSTALL_DIR))
    log_path = os.path.abspath(log_path or os.path.join(build_dir, LOG_NAME))
    cmake = shutil.which("cmake")
    if cmake is None:
        raise NpuBuildError("cmake not found: the custom OPP package needs CMake >= 3.16")
    if not os.environ.get("ASCEND_HOME_PATH"):  # the ASC CMake package stops without it (asc-config.cmake)
        raise NpuBuildError("ASCEND_HOME_PATH is not set: source <cann>/set_env.sh before "
                            "building the OPP package")
    os.makedirs(build_dir, exist_ok=True)
    with open(log_path, "ab") as logf:
        for cmd in _commands(cmake, os.path.join(repo_root, "csrc", "ascend"), build_dir,
                             str(os.cpu_count() or 2)):
            _run_logged(cmd, logf, log_path)
        runs = sorted(glob.glob(os.path.join(build_dir, "custom_opp_*.run")))
        if not runs:
            raise NpuBuildError(f"the OPP build produced no custom_opp_*.run in {build_dir}", log_path)
        os.makedirs(install_dir, exist_ok=True)
        _run_logged(["bash", runs[-1], "--quiet", f"--install-path={install_dir}"], logf, log_path)
    if not os.path.isfile(_installed_lib(install_dir)):
        raise NpuBuildError(f"the OPP installer left no {_installed_lib(install_dir)}", log_path)
    return os.path.join(install_dir, "vendors", OPP_VENDOR)


def _forget_other_toolkit(build_dir: str, stamp_path: str, toolkit: dict) -> None:
    """Drop the CMake cache of a build configured with another toolkit: CMake keeps the old root in its cache
    (FindCANN's CANN_ROOT; asc-devkit's cmake/asc/fwk_modules/config.cmake caches the package path) while
    asc-config.cmake reads the new ASCEND_HOME_PATH, and a reconfigure would mix the two."""
    try:
        with open(stamp_path) as f:
            before = json.load(f).get("toolkit")
    except (OSError, ValueError, AttributeError):
        before = None
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if before != {k: toolkit[k] for k in ("home", "version")} and os.path.exists(cache):
        os.remove(cache)


def opp_step(repo_root: str, force: bool = False) -> dict:
    """The OPP part of a setup.py build, once: its build status {"ok", "attempted", "error", "log", "vendor",
    "cann_version", "note"} ("error": the first error line). Never raises."""
    home = os.environ.get("ASCEND_HOME_PATH", "")
    status = {"ok": False, "attempted": False, "error": None, "log": None, "vendor": None,
              "cann_version": None, "note": None}
    if not home:
        return {**status, "error": "not built: ASCEND_HOME_PATH was not set at install time"}
    if os.environ.get(SKIP_ENV, "") not in ("", "0"):
        return {**status, "error": f"not built: {SKIP_ENV}=1 was set at install time (a package installed by "
                                   "other means is used as found)"}
    build_dir = os.path.abspath(os.path.join(repo_root, BUILD_DIR))
    install_dir = os.path.abspath(os.path.join(repo_root, INSTALL_DIR))
    log_path = os.path.join(build_dir, LOG_NAME)
    stamp_path = os.path.join(build_dir, STAMP_NAME)
    status["attempted"] = True
    try:
        toolkit = check_toolkit(home)
        status["cann_version"] = toolkit["version"]
        vendor = os.path.join(install_dir, "vendors", OPP_VENDOR)
        fresh = None if force else opp_up_to_date(repo_root, install_dir, stamp_path, toolkit)
        if fresh is not None:
            log(f"custom OPP package {fresh}; not rebuilt (force with `python setup.py "
                "build_npu_opp --force`)")
            return {**status, "ok": True, "vendor": vendor,
                    "log": log_path if os.path.exists(log_path) else None, "note": fresh}
        os.makedirs(build_dir, exist_ok=True)
        with open(log_path, "w") as f:
            f.write(f"fused_lce custom OPP build, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                    f"toolkit: {json.dumps(toolkit)}\n")
        if os.path.exists(stamp_path):
            _forget_other_toolkit(build_dir, stamp_path, toolkit)
            os.remove(stamp_path)
        log(f"building the custom OPP package with CANN {toolkit['version'] or '(version unknown)'} "
            f"(minutes; full log: {log_path})")
        vendor = build_opp(repo_root, build_dir, install_dir, log_path)
        with open(stamp_path, "w") as f:
            json.dump(_stamp(install_dir, toolkit), f)
    except NpuBuildError as e:
        if e.log is None:  # refused before building: the log says why (over an older build's log)
            os.makedirs(build_dir, exist_ok=True)
            with open(log_path, "w") as f:
                f.write(f"fused_lce custom OPP build, {time.strftime('%Y-%m-%d %H:%M:%S')}\nerror: "
                        f"{e.first_line}\n")
            e.log = log_path
        log(f"the custom OPP package was not built: {e.first_line} (full log: {e.log})")
        return {**status, "error": e.first_line, "log": e.log}
    except Exception as e:  # anything else (a full disk, a permission error) is a failed part, not a crash
        return {**status, "error": f"{type(e).__name__}: {e}",
                "log": log_path if os.path.exists(log_path) else None}
    log(f"custom OPP installed: export ASCEND_CUSTOM_OPP_PATH={vendor}:$ASCEND_CUSTOM_OPP_PATH "
        f"(or source {vendor}/bin/set_env.bash)")
    return {**status, "ok": True, "vendor": vendor, "log": log_path}


def npu_extensions(repo_root: str) -> list:
    """setup.py hook: [the host adapter extension] when ASCEND_HOME_PATH is set, [] when it is not;
    NpuBuildError when it is set but torch_npu is not installed."""
    if not os.environ.get("ASCEND_HOME_PATH"):
        return []
    tn = torch_npu_dir()
    if tn is None:
        raise NpuBuildError("not built: ASCEND_HOME_PATH is set but torch_npu is not installed (the host "
                            "adapter is compiled against its headers)")
    return [adapter_extension(repo_root, tn)]


# ------------------------------------------------------------------------------------------------ CLI checks
def fetch_wheel(dest: str) -> str:
    """Download the torch-npu wheel for the installed torch (same release) and unpack what the adapter
    needs."""
    release, _ = torch_release()
    os.makedirs(dest, exist_ok=True)
    wheels = glob.glob(os.path.join(dest, f"torch_npu-{release}-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", dest, f"torch-npu=={release}"], check=True)
        wheels = glob.glob(os.path.join(dest, f"torch_npu-{release}-*.whl"))
    out = os.path.join(dest, "unpacked")
    marker = os.path.join(out, "torch_npu", ".unpacked")
    if not os.path.exists(marker):
        with zipfile.ZipFile(wheels[0]) as z:
            for name in z.namelist():
                if name.startswith("torch_npu/include/") or name == "torch_npu/lib/libtorch_npu.so":
                    z.extract(name, out)
        open(marker, "w").close()
    return os.path.join(out, "torch_npu")


def check_adapter(repo_root: str, tn_dir: str, out_dir: str) -> str:
    """Compile and link the adapter the way the extension would be built; returns the .so path (never
    loaded)."""
    from torch.utils import cpp_extension

    f = adapter_flags(tn_dir)
    os.makedirs(out_dir, exist_ok=True)
    obj = os.path.join(out_dir, "fused_lce_npu.o")
    so = os.path.join(out_dir, "_npu_C.so")
    cxx = os.environ.get("CXX", "c++")
    abi = int(__import__("torch")._C._GLIBCXX_USE_CXX11_ABI)
    cflags = ["-std=c++20", "-fPIC", "-O0", "-Wall", "-Werror=return-type", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    cflags += [f"-D{k}={v}" for k, v in f["define_macros"]]
    incs = f["include_dirs"] + cpp_extension.include_paths() + [sysconfig.get_paths()["include"]]
    subprocess.run([cxx, *cflags, *[f"-I{i}" for i in incs], "-c", os.path.join(repo_root, ADAPTER_SOURCE),
                    "-o", obj], check=True)
    libdirs = f["library_dirs"] + cpp_extension.library_paths()
    subprocess.run([cxx, "-shared", obj, "-o", so, *[f"-L{d}" for d in libdirs], "-Wl,--no-undefined",
                    "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_npu"], check=True)
    return so


if __name__ == "__main__":
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if len(sys.argv) == 3 and sys.argv[1] == "fetch-wheel":
        print(fetch_wheel(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "check-adapter":
        print(check_adapter(root, sys.argv[2], sys.argv[3]))
    else:
        print(__doc__)
        sys.exit(2)
