"""NPU build steps for setup.py (imported by path) and for the header-only compile check.

``npu_extensions(repo_root)`` -- called by setup.py only when ASCEND_HOME_PATH is set:
  1. builds and installs the custom OPP package of csrc/ascend with CMake against CANN (``build_opp``) into
     ``<repo>/build/opp/vendors/fused_lce`` (skip with FUSED_LCE_SKIP_OPP_BUILD=1, e.g. when installed already);
  2. returns the host adapter extension ``fused_lce._npu_C`` (csrc/npu/fused_lce_npu.cpp) compiled against
     torch_npu's headers and linked to libtorch_npu. torch_npu is located with importlib.util.find_spec (its
     ``__init__`` is never run at build time: importing it needs the CANN runtime and an NPU).

Command line (no CANN needed):
  python cmake/npu_build.py fetch-wheel DEST           download the torch-npu wheel matching the installed torch
                                                       and unpack its include/ and libtorch_npu.so into DEST
  python cmake/npu_build.py check-adapter TORCH_NPU_DIR OUT_DIR
                                                       compile csrc/npu/fused_lce_npu.cpp with the extension's
                                                       flags and link it (--no-undefined) against that
                                                       torch_npu: what tests/backends/npu/test_adapter_build.py runs
Status: the OPP build (1) is written and checked by reading against asc-devkit's custom_op example, not run here (no
CANN toolkit; the host side of the package is compiled and run against stub CANN headers in CI, tests/ascend/host,
docs/npu-host-build.md); the adapter compile (2) is checked in CI.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from typing import Optional

OPP_VENDOR = "fused_lce"
ADAPTER_NAME = "fused_lce._npu_C"
ADAPTER_SOURCE = os.path.join("csrc", "npu", "fused_lce_npu.cpp")


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
    """Include dirs, macros, libraries of the adapter for the torch_npu at ``tn_dir`` (an installed package or an
    unpacked wheel). op-plugin's headers expect CURRENT_VERSION (V2R<minor> == minor - 1) from their own build."""
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


def build_opp(repo_root: str, build_dir: Optional[str] = None, install_dir: Optional[str] = None) -> str:
    """Configure, build and install the custom OPP package; returns the vendor directory to put on
    ASCEND_CUSTOM_OPP_PATH."""
    # the package's install.sh rejects a relative --install-path (asc-devkit cmake/asc/fwk_modules/scripts/install.sh)
    build_dir = os.path.abspath(build_dir or os.path.join(repo_root, "build", "ascend_opp"))
    install_dir = os.path.abspath(install_dir or os.path.join(repo_root, "build", "opp"))
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("cmake not found: the custom OPP package needs CMake >= 3.16")
    if not os.environ.get("ASCEND_HOME_PATH"):  # the ASC CMake package stops without it (asc-config.cmake)
        raise RuntimeError("ASCEND_HOME_PATH is not set: source <cann>/set_env.sh before building the OPP package")
    src = os.path.join(repo_root, "csrc", "ascend")
    subprocess.run([cmake, "-S", src, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release"], check=True)
    subprocess.run([cmake, "--build", build_dir, "-j", str(os.cpu_count() or 2), "--target", "binary", "package"],
                   check=True)
    runs = sorted(glob.glob(os.path.join(build_dir, "custom_opp_*.run")))
    if not runs:
        raise RuntimeError(f"the OPP build produced no custom_opp_*.run in {build_dir}")
    os.makedirs(install_dir, exist_ok=True)
    subprocess.run(["bash", runs[-1], "--quiet", f"--install-path={install_dir}"], check=True)
    vendor = os.path.join(install_dir, "vendors", OPP_VENDOR)
    log(f"custom OPP installed: export ASCEND_CUSTOM_OPP_PATH={vendor}:$ASCEND_CUSTOM_OPP_PATH "
        f"(or source {vendor}/bin/set_env.bash)")
    return vendor


def npu_extensions(repo_root: str) -> list:
    """setup.py hook: [] unless ASCEND_HOME_PATH is set and torch_npu is installed."""
    if not os.environ.get("ASCEND_HOME_PATH"):
        return []
    tn = torch_npu_dir()
    if tn is None:
        log("ASCEND_HOME_PATH is set but torch_npu is not installed: NPU extensions skipped")
        return []
    if os.environ.get("FUSED_LCE_SKIP_OPP_BUILD", "") in ("", "0"):
        build_opp(repo_root)
    return [adapter_extension(repo_root, tn)]


# ------------------------------------------------------------------------------------------------ CLI checks
def fetch_wheel(dest: str) -> str:
    """Download the torch-npu wheel for the installed torch (same release) and unpack what the adapter needs."""
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
    """Compile and link the adapter the way the extension would be built; returns the .so path (never loaded)."""
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
