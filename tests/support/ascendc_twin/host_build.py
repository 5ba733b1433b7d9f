"""Shared helpers of the host build check of the AscendC op package (no CANN, no NPU): the op_host sources
compiled with the flags opbuild uses against the host twin's stub CANN headers (host/include), and
their tiling / inference functions run under the twin's host runtime. See docs/npu-host-build.md."""
from __future__ import annotations

import glob
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HERE = os.path.dirname(os.path.abspath(__file__))
ASCEND = os.path.join(ROOT, "csrc", "ascend")
TWIN_HOST = os.path.join(HERE, "host")
STUB_INCLUDE = os.path.join(TWIN_HOST, "include")  # plays ${CANN}/include
OP_HOST_SOURCES = sorted(glob.glob(os.path.join(ASCEND, "*", "op_host", "*.cpp")))

# opbuild (npu_op_code_gen -> asc-devkit cmake/asc/fwk_modules/util/compile_ascendc_all_ops_so.py,
# gen_compile_make_file) compiles every op_host source with exactly
#   $(CXX) -fPIC -D_GLIBCXX_USE_CXX11_ABI=0 -std=c++11 <COMPILE_OPTIONS> -I${CANN}/include -c
# and csrc/ascend/CMakeLists.txt passes no COMPILE_OPTIONS.
OPBUILD_FLAGS = ["-fPIC", "-D_GLIBCXX_USE_CXX11_ABI=0", "-std=c++11", f"-I{STUB_INCLUDE}"]

# The TILING / GRAPH object libraries of npu_op_library (asc-devkit cmake/asc/fwk_modules/func.cmake) compile
# the same sources with intf_pub (cmake/asc/fwk_modules/intf.cmake, Release) and OP_TILING_LIB / OP_PROTO_LIB;
# intf_pub asks for cxx_std_11 only, so g++ 12 uses its default standard there. -Wall -Wextra -Werror are this
# project's additions.
CMAKE_LIB_FLAGS = ["-fPIC", "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-O2",
                   "-fstack-protector-strong", "-D_GLIBCXX_USE_CXX11_ABI=0", "-D_FORTIFY_SOURCE=2",
                   f"-I{STUB_INCLUDE}"]
STRICT = ["-Wall", "-Wextra", "-Werror"]


def compile_cmd(cxx: str, flags: list[str], src: str, out: str) -> list[str]:
    return [cxx, *flags, "-c", src, "-o", out]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def build_driver(cxx: str, out_dir: str, op_host_define: str | None, name: str) -> str:
    """tiling_driver.cpp linked with the op_host sources (compiled with opbuild's flags, plus
    `-D<op_host_define>` to select OP_ADD's mode) and the twin's host runtime."""
    objs = []
    for src in OP_HOST_SOURCES:
        obj = os.path.join(out_dir, f"{name}_{os.path.basename(src)}.o")
        flags = OPBUILD_FLAGS + ([f"-D{op_host_define}"] if op_host_define else [])
        r = run(compile_cmd(cxx, flags, src, obj))
        assert r.returncode == 0, f"{' '.join(compile_cmd(cxx, flags, src, obj))}\n{r.stderr}"
        objs.append(obj)
    common = ["-std=c++11", "-D_GLIBCXX_USE_CXX11_ABI=0", "-O1", *STRICT, f"-I{STUB_INCLUDE}"]
    for src, extra in ((os.path.join(TWIN_HOST, "src", "host_runtime.cpp"), []),
                       (os.path.join(HERE, "tiling_driver.cpp"),
                        [f"-I{TWIN_HOST}", f"-I{os.path.join(ASCEND, 'common')}"])):
        obj = os.path.join(out_dir, f"{name}_{os.path.basename(src)}.o")
        r = run(compile_cmd(cxx, common + extra, src, obj))
        assert r.returncode == 0, f"{src}\n{r.stderr}"
        objs.append(obj)
    exe = os.path.join(out_dir, name)
    r = run([cxx, *objs, "-o", exe])
    assert r.returncode == 0, r.stderr
    return exe


class Driver:
    def __init__(self, exe: str):
        self.exe = exe
        self.stderr = ""  # of the last call: the tilings' error messages

    def __call__(self, lines: list[str]) -> list[dict]:
        r = subprocess.run([self.exe], input="\n".join(lines) + "\n", capture_output=True, text=True,
                           timeout=300)
        self.stderr = r.stderr
        outs = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
        if r.returncode != 0 or len(outs) != len(lines):
            at = lines[len(outs)] if len(outs) < len(lines) else "?"
            raise AssertionError(f"the tiling driver died (exit {r.returncode}) on case `{at}` "
                                 f"after {len(outs)} of {len(lines)} cases\n{r.stderr[-2000:]}")
        return outs

    def one(self, line: str) -> dict:
        return self([line])[0]
