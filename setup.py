"""Build script: the pure-Python package plus, when possible, the C++ extension ``fused_lce._C`` and, on an
Ascend host, the NPU parts (the custom OPP kernel package and the host adapter ``fused_lce._npu_C``).

    pip install --no-build-isolation .     # builds _C against the torch installed here (C++ compiler needed)
    pip install --no-build-isolation -e .  # the same, in place
    pip install .                          # isolated build: torch is not importable there, so no _C

Metadata lives in pyproject.toml. A missing torch, a missing compiler or a failed compile never fails the
install: the package then runs on its torch backend. Each part's outcome is recorded in
``fused_lce/_build_status.json`` ({"cpp" | "npu_opp" | "npu_adapter": {"ok", "error", "log", ...}}), which
``fused_lce.backend_info()`` reads for its reasons. Every extension and the OPP package are built by
``build_ext`` only (pip runs this script three times per install; the metadata runs build nothing).
Environment:
  FUSED_LCE_REQUIRE_EXT=1  a build that cannot produce _C, or (with ASCEND_HOME_PATH set) any NPU part, is an
                           error; CI sets it: the extension must be there
  FUSED_LCE_NO_EXT=1       do not build any extension
  ASCEND_HOME_PATH         (set by CANN's set_env.sh) builds the NPU parts with cmake/npu_build.py (imported
                           by path): ``build_ext`` first runs the ``build_npu_opp`` command (CANN >= 9.0;
                           skipped when the installed package is newer than its sources; log in
                           build/ascend_opp/build.log), then compiles ``_npu_C`` whether or not the package
                           built
  FUSED_LCE_SKIP_OPP_BUILD=1  build the adapter but not the OPP package (one installed by other means)

Every install (wheel or editable) also puts the start-up hook ``fused_lce-autopatch.pth`` in site-packages, so
that ``FUSED_LINEAR_CE=1`` alone enables fused_lce (see fused_lce_autopatch.py).
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import sys

from setuptools import Command, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
STATUS = os.path.join("fused_lce", "_build_status.json")  # read by fused_lce/backends/build_status.py
PTH = "fused_lce-autopatch.pth"  # start-up hook for site-packages (a .pth runs only from a site directory)
REQUIRE = os.environ.get("FUSED_LCE_REQUIRE_EXT", "") not in ("", "0")
NPU_REQUESTED = bool(os.environ.get("ASCEND_HOME_PATH"))
PARTS: dict = {}  # this build's status per part, written by write_status
NO_ASCEND = "not built: ASCEND_HOME_PATH was not set at install time"


def note(msg: str) -> None:
    print(f"fused_lce setup: {msg}", file=sys.stderr)


def part(ok: bool, error: str | None = None, log: str | None = None, attempted: bool = True, **extra) -> dict:
    return {"ok": ok, "attempted": attempted, "error": error, "log": log, **extra}


def write_status(build_lib: str | None = None, parts: dict | None = None) -> None:
    """Record ``parts`` (default: every part known so far) over the recorded ones, in the source tree and (for
    wheels) in the build directory: a build_ext run records every part; ``setup.py build_npu_opp`` alone, the
    OPP package only."""
    parts = PARTS if parts is None else parts
    for base in filter(None, (ROOT, build_lib)):
        path = os.path.join(base, STATUS)
        try:
            with open(path) as f:
                recorded = json.load(f)
        except (OSError, ValueError):
            recorded = {}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump({**(recorded if isinstance(recorded, dict) else {}), **parts}, f, indent=1)


def skip(reason: str) -> None:
    """No extension is built (decided before build_ext): every part records why."""
    if REQUIRE:
        raise SystemExit("fused_lce setup: FUSED_LCE_REQUIRE_EXT=1 but the C++ extension cannot "
                         f"be built: {reason}")
    note(f"building the pure-Python package only: {reason}")
    PARTS.update(cpp=part(False, reason, attempted=False), npu_opp=part(False, reason, attempted=False),
                 npu_adapter=part(False, reason, attempted=False))
    write_status()


def npu_build():
    """cmake/npu_build.py (owned by the NPU build), imported by path: it must not need torch_npu imported
    here."""
    spec = importlib.util.spec_from_file_location("fused_lce_npu_build",
                                                  os.path.join(ROOT, "cmake", "npu_build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def npu_extensions() -> list:
    """The host adapter extension when ASCEND_HOME_PATH is set; why there is none goes into PARTS."""
    if not NPU_REQUESTED:
        PARTS["npu_adapter"] = part(False, NO_ASCEND, attempted=False)
        return []
    try:
        return list(npu_build().npu_extensions(ROOT))
    except Exception as e:  # an install error in build_ext under FUSED_LCE_REQUIRE_EXT=1
        reason = (getattr(e, "first_line", None) or
                  f"not built: cmake/npu_build.py failed ({type(e).__name__}: {e})")
        note(reason)
        PARTS["npu_adapter"] = part(False, reason)
        return []


def cpu_extension(cpp_extension):
    """fused_lce._C: csrc/ops.cpp + csrc/cpu/*.cpp, -O3, OpenMP the way torch uses it (at::parallel_for is
    inline OpenMP code, so without -fopenmp the kernel would run on one thread)."""
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


class BuildNpuOpp(Command):
    """Build and install the custom OPP kernel package (cmake/npu_build.py ``opp_step``): once per build,
    before the extensions (``build_ext`` runs it); a no-op without ASCEND_HOME_PATH."""

    description = "build the Ascend custom OPP kernel package (csrc/ascend) with CMake against CANN"
    user_options = [("force", "f", "rebuild even when the installed package is newer than its sources")]
    boolean_options = ["force"]

    def initialize_options(self):
        self.force = False

    def finalize_options(self):
        pass

    def run(self):
        PARTS["npu_opp"] = (npu_build().opp_step(ROOT, force=bool(self.force)) if NPU_REQUESTED
                            else part(False, NO_ASCEND, attempted=False))
        write_status(parts={"npu_opp": PARTS["npu_opp"]})


def build_config() -> dict:
    """ext_modules and cmdclass for setup(); empty when no extension can or may be built."""
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
        """Runs build_npu_opp, then builds each extension; a failure is recorded (or raised with
        FUSED_LCE_REQUIRE_EXT=1), never fatal. The status file is written once every part is known."""

        def run(self):
            build_lib = None if self.inplace else self.build_lib
            self.run_command("build_npu_opp")  # before _npu_C; once per setup.py run
            npu_failed = [PARTS[k] for k in ("npu_opp", "npu_adapter") if k in PARTS and PARTS[k]["attempted"]
                          and not PARTS[k]["ok"]]
            if REQUIRE and NPU_REQUESTED and npu_failed:
                write_status(build_lib)
                raise SystemExit("fused_lce setup: FUSED_LCE_REQUIRE_EXT=1 and ASCEND_HOME_PATH is set, but "
                                 f"an NPU part failed: {describe(npu_failed[0])}")
            try:
                super().run()
            finally:
                write_status(build_lib)

        def build_extension(self, ext):
            key = {"fused_lce._C": "cpp"}.get(ext.name, "npu_adapter")
            try:
                super().build_extension(ext)
            except Exception as e:
                reason = (f"not built: compiling {ext.name} failed ({type(e).__name__}: {e}); "
                          "see the pip -v log")
                PARTS[key] = part(False, reason)
                if REQUIRE:
                    raise
                note(reason)
                return
            PARTS[key] = part(True)

    exts = [cpu_extension(cpp_extension)] + npu_extensions()
    return {"ext_modules": exts,
            "cmdclass": {"build_ext":
                         OptionalBuildExt.with_options(use_ninja=shutil.which("ninja") is not None),
                         "build_npu_opp": BuildNpuOpp}}


def describe(p: dict) -> str:
    return p["error"] + (f" (full log: {p['log']})" if p.get("log") else "")


def startup_hook_commands() -> dict:
    """Commands that put PTH at the root of what is installed: build_py copies it beside the packages
    (wheels); editable wheels install the packages through a finder and copy only data files, so it is added
    to the editable wheel's root there (setuptools >= 64)."""
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
setup(package_data={"fused_lce": ["_build_status.json"]}, **config)
