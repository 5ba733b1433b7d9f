"""How a CANN toolkit states its version, and the minimum this project's kernel package needs. Standalone (no
package-relative import): cmake/npu_build.py loads this file by path at build time, fused_lce.backends.npu.env
and ``fused-lce doctor`` import it at run time."""
from __future__ import annotations

import os
import platform
import re
from typing import Optional

# asc-devkit's CMake flow (find_package(ASC), npu_op_package, ...): its custom_op example
# (examples/01_simd_cpp_api/02_features/99_acl_based/00_acl_compilation/custom_op/README.md) lists Atlas A2 /
# A3 at CANN >= 9.0.0
MIN_CANN = (9, 0)


def version_files(home: str) -> list[tuple[str, str]]:
    """(file, key) pairs that state a CANN version, in the order they are read: asc-devkit's version.info (the
    package whose CMake flow the build uses; asc-devkit cmake/package.cmake installs it to
    share/info/asc-devkit), the runtime's (what CANN's ACL reads, hicann/runtime
    src/acl/utils/cann_info_utils.cpp), the compiler's (what the OPP build itself records, asc-devkit
    cmake/asc/fwk_modules/util/gen_version_info.sh), the toolkit's install info of the older layout
    (asc-devkit docs/zh/quick_start.md; torch_npu's collect_env reads its ``version=`` line)."""
    arch = f"{platform.machine()}-linux"
    return [(os.path.join(home, "share", "info", "asc-devkit", "version.info"), "Version"),
            (os.path.join(home, "share", "info", "runtime", "version.info"), "Version"),
            (os.path.join(home, "compiler", "version.info"), "Version"),
            (os.path.join(home, arch, "ascend_toolkit_install.info"), "version"),
            (os.path.join(home, "ascend_toolkit_install.info"), "version")]


def toolkit_version(home: str) -> tuple[Optional[str], list[str]]:
    """(the version the toolkit at ``home`` states, or None; the files read or looked for, first the one
    used)."""
    looked = []
    for path, key in version_files(home):
        looked.append(path)
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    k, sep, v = line.partition("=")
                    if sep and k.strip() == key and v.strip():
                        return v.strip().strip('"'), [path]
        except OSError:
            continue
    return None, looked


def parse_version(text: str) -> Optional[tuple[int, int]]:
    """(major, minor) of a CANN version string ("9.0.0", "8.0.RC1", "9.1.0-beta.1"), None if it has none."""
    m = re.match(r"\s*(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None
