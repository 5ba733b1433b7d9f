"""Build script: the pure-Python package plus, when possible, the C++ extension ``fused_lce._C``.

    pip install --no-build-isolation .     # builds _C against the torch installed here (C++ compiler needed)
    pip install --no-build-isolation -e .  # the same, in place
    pip install .                          # isolated build: torch is not importable there, so no _C

Metadata lives in pyproject.toml. A missing torch, a missing compiler or a failed compile never fails the install:
the package then runs on its torch backend and ``fused_lce.backend_info()["cpp"]["reason"]`` says why (read from
``fused_lce/_build_status.txt``, written here). Environment:
  FUSED_LCE_REQUIRE_EXT=1  a build that cannot produce _C (or an NPU extension it was asked for) is an error;
                           CI sets it: the extension must be there
  FUSED_LCE_NO_EXT=1       do not build any extension
  ASCEND_HOME_PATH         with cmake/npu_build.py present, its ``npu_extensions(repo_root)`` adds the NPU
                           extensions (imported by path; it must not need torch_npu to be imported here)

Every install (wheel or editable) also puts the start-up hook ``fused_lce-autopatch.pth`` in site-packages, so that
``FUSED_LINEAR_CE=1`` alone enables fused_lce (see fused_lce_autopatch.py).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import sys
import traceback

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
STATUS = os.path.join("fused_lce", "_build_status.txt")
PTH = "fused_lce-autopatch.pth"  # start-up hook for site-packages (a .pth runs only from a site directory)  # present only when _C was not built: says why
REQUIRE = os.environ.get("FUSED_LCE_REQUIRE_EXT", "") not in ("", "0")


def note(msg: str) -> None:
    print(f"fused_lce setup: {msg}", file=sys.stderr)


def write_status(reason: str, build_lib: str | None = None) -> None:
    """Record why _C is missing, in the source tree and (for wheels) in the build directory."""
    for base in filter(None, (ROOT, build_lib)):
        path = os.path.join(base, STATUS)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(reason + "\n")


def clear_status(build_lib: str | None = None) -> None:
    for base in filter(None, (ROOT, build_lib)):
        path = os.path.join(base, STATUS)
        if os.path.exists(path):
            os.remove(path)


def skip(reason: str) -> None:
    if REQUIRE:
        raise SystemExit(f"fused_lce setup: FUSED_LCE_REQUIRE_EXT=1 but the C++ extension cannot be built: {reason}")
    note(f"building the pure-Python package only: {reason}")
    write_status(reason)


def npu_extensions() -> list:
    """Extensions from cmake/npu_build.py (owned by the NPU build) when ASCEND_HOME_PATH is set."""
    path = os.path.join(ROOT, "cmake", "npu_build.py")
    if not os.environ.get("ASCEND_HOME_PATH") or not os.path.exists(path):
        return []
    try:
        spec = importlib.util.spec_from_file_location("fused_lce_npu_build", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return list(module.npu_extensions(ROOT) or [])
    except Exception:
        if REQUIRE:
            raise
        note("cmake/npu_build.py failed; NPU extensions skipped:\n" + traceback.format_exc())
        return []


def cpu_extension(cpp_extension):
    """fused_lce._C: csrc/ops.cpp + csrc/cpu/*.cpp, -O3, OpenMP the way torch uses it (at::parallel_for is inline
    OpenMP code, so without -fopenmp the kernel would run on one thread)."""
    import torch

    cflags, ldflags = ["-O3"], []
    if sys.platform.startswith("linux") and torch.backends.openmp.is_available():
        cflags.append("-fopenmp")
        ldflags.append("-fopenmp")
    sources = ["csrc/ops.cpp"] + sorted(glob.glob("csrc/cpu/*.cpp"))
    return cpp_extension.CppExtension(
        "fused_lce._C",
        sources,
        include_dirs=[os.path.join(ROOT, "csrc")],
        depends=glob.glob("csrc/cpu/*.h") + glob.glob("csrc/cpu/*.inc"),
        extra_compile_args={"cxx": cflags},
        extra_link_args=ldflags,
    )


def build_config() -> dict:
    """ext_modules and cmdclass for setup(); empty when the extension cannot or must not be built."""
    if os.environ.get("FUSED_LCE_NO_EXT", "") not in ("", "0"):
        skip("not built: FUSED_LCE_NO_EXT was set at install time")
        return {}
    try:
        import torch  # noqa: F401
        from torch.utils import cpp_extension
    except ImportError as e:
        skip(f"built without torch ({e}): install with `pip install --no-build-isolation .` so the extension "
             "is compiled against the installed torch")
        return {}
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx.split()[0]) is None:
        skip(f"not built: no C++ compiler ({cxx}) at install time")
        return {}

    class OptionalBuildExt(cpp_extension.BuildExtension):
        """Builds each extension; a failure is recorded (or raised with FUSED_LCE_REQUIRE_EXT=1), never fatal."""

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as e:
                if REQUIRE:
                    raise
                reason = f"not built: compiling {ext.name} failed ({type(e).__name__}: {e}); see the pip -v log"
                note(reason)
                if ext.name == "fused_lce._C":
                    write_status(reason, None if self.inplace else self.build_lib)
                return
            if ext.name == "fused_lce._C":
                clear_status(None if self.inplace else self.build_lib)

    clear_status()
    return {"ext_modules": [cpu_extension(cpp_extension)] + npu_extensions(),
            "cmdclass": {"build_ext": OptionalBuildExt.with_options(use_ninja=shutil.which("ninja") is not None)}}


def startup_hook_commands() -> dict:
    """Commands that put PTH at the root of what is installed: build_py copies it beside the packages (wheels);
    editable wheels install the packages through a finder and copy only data files, so it is added to the editable
    wheel's root there (setuptools >= 64)."""
    from setuptools.command.build_py import build_py

    class BuildPyWithHook(build_py):
        def run(self):
            super().run()
            self.copy_file(os.path.join(ROOT, PTH), os.path.join(self.build_lib, PTH))

        def get_outputs(self, include_bytecode=True):
            return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]

    commands = {"build_py": BuildPyWithHook}
    try:
        from setuptools.command.editable_wheel import editable_wheel
    except ImportError:
        return commands

    class EditableWheelWithHook(editable_wheel):
        def _run_install(self, category):
            super()._run_install(category)
            if category == "data":  # the last install step; install_lib is the editable wheel's root
                shutil.copy(os.path.join(ROOT, PTH), self.get_finalized_command("install").install_lib)

    commands["editable_wheel"] = EditableWheelWithHook
    return commands


config = build_config()
config["cmdclass"] = {**startup_hook_commands(), **config.get("cmdclass", {})}
setup(package_data={"fused_lce": ["_build_status.txt"]}, **config)
