"""Stand-ins for the NPU build's tools, for tests of setup.py / cmake/npu_build.py on a host without CANN:

* ``make_toolkit``: an $ASCEND_HOME_PATH tree with the files the build checks (a version file in one of the
  places a CANN install states its version, asc-devkit's asc-config.cmake at <arch>-linux/lib64/cmake);
* ``make_cmake``: a ``cmake`` for PATH that appends each invocation to $FAKE_CMAKE_CALLS and, per
  $FAKE_CMAKE_MODE, configures and builds a ``custom_opp_*.run`` whose installer writes the vendor tree
  (``vendors/fused_lce/op_api/lib/libcust_opapi.so``, ``bin/set_env.bash``) ("ok", the default), fails to
  configure ("configure_error") or fails to compile a kernel ("compile_error");
* ``make_cxx``: a C/C++ compiler and linker for CC / CXX / LDSHARED that writes the ``-o`` (and ``-MF``) files
  and appends its arguments to $FAKE_CXX_CALLS, so extension builds take no time.
Nothing here resembles what CANN's tools print beyond the error lines the build log scan must find.
"""
from __future__ import annotations

import os
import platform
import stat
import sys

CMAKE = r'''
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_CMAKE_CALLS"], "a") as f:
    f.write(json.dumps(args) + "\n")
mode = os.environ.get("FAKE_CMAKE_MODE", "ok")
if "-S" in args:
    print("-- The CXX compiler identification is GNU")
    if mode == "configure_error":
        print("CMake Error at CMakeLists.txt:21 (find_package):", file=sys.stderr)
        print('  Could not find a package configuration file provided by "ASC"', file=sys.stderr)
        sys.exit(1)
    os.makedirs(args[args.index("-B") + 1], exist_ok=True)
    print("-- Configuring done")
    sys.exit(0)
build = args[args.index("--build") + 1]
print("[1/48] cd op_kernel && bash compile fused_lce_stats_cube.cpp -Werror=return-type")
if mode == "compile_error":
    print("fused_lce_stats/op_kernel/fused_lce_stats_cube.cpp:42:7: error: no member named "
          "'Foo' in 'AscendC'")
    print("1 error generated.")
    print("FAILED: op_kernel/fused_lce_stats_cube")
    sys.exit(1)
run = os.path.join(build, "custom_opp_" + os.uname().machine + ".run")
with open(run, "w") as f:
    f.write("""#!/bin/bash
for a in "$@"; do case $a in --install-path=*) dest=${a#--install-path=};; esac; done
v=$dest/vendors/fused_lce
mkdir -p $v/op_api/lib $v/bin
echo fake > $v/op_api/lib/libcust_opapi.so
echo "export ASCEND_CUSTOM_OPP_PATH=$v:\\${ASCEND_CUSTOM_OPP_PATH}" > $v/bin/set_env.bash
echo "[ops_custom] [INFO] SUCCESS"
""")
print("[48/48] package")
'''

CXX = r'''
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_CXX_CALLS"], "a") as f:
    f.write(json.dumps(args) + "\n")
if "-o" not in args and {"-v", "--version", "-dumpversion", "-dumpfullversion"} & set(args):
    print("12.2.0" if "-dumpfullversion" in args or "-dumpversion" in args else "gcc version 12.2.0 (fake)")
    sys.exit(0)
for flag in ("-o", "-MF"):
    if flag in args:
        out = args[args.index(flag) + 1]
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write("" if flag == "-o" else out + ":\n")
'''


def _script(path: str, body: str) -> str:
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\n{body}")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def make_cmake(bindir: str) -> str:
    os.makedirs(bindir, exist_ok=True)
    return _script(os.path.join(bindir, "cmake"), CMAKE)


def make_cxx(bindir: str) -> str:
    os.makedirs(bindir, exist_ok=True)
    return _script(os.path.join(bindir, "fake-c++"), CXX)


def make_toolkit(root: str, version: str | None = "9.0.0", where: str = "asc-devkit",
                 asc_config: bool = True) -> str:
    """A toolkit tree stating ``version`` in one place: "asc-devkit" (share/info/asc-devkit/version.info),
    "runtime" (share/info/runtime/version.info), "compiler" (compiler/version.info) or "install_info"
    (<arch>-linux/ascend_toolkit_install.info)."""
    arch = f"{platform.machine()}-linux"
    files = {"asc-devkit": (os.path.join("share", "info", "asc-devkit", "version.info"), "Version"),
             "runtime": (os.path.join("share", "info", "runtime", "version.info"), "Version"),
             "compiler": (os.path.join("compiler", "version.info"), "Version"),
             "install_info": (os.path.join(arch, "ascend_toolkit_install.info"), "version")}
    os.makedirs(root, exist_ok=True)
    if version is not None:
        rel, key = files[where]
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(f"package_name=Ascend-cann-toolkit\n{key}={version}\ninnerversion=V100R001\n")
    if asc_config:
        d = os.path.join(root, arch, "lib64", "cmake")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "asc-config.cmake"), "w") as f:
            f.write("# stand-in for asc-devkit cmake/asc/asc-config.cmake\n")
    return root
