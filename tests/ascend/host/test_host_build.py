"""The op_host sources compile the way the CANN custom-op build compiles them, against the host twin's stub
CANN headers: with opbuild's exact flags (only ${CANN}/include on the include path, C++11) and as the TILING /
GRAPH libraries of the CMake build (warnings are errors here). Also: the stub headers stand alone, and every
header the op_host code reaches is either a modelled CANN header or one of ours found by a relative
include."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from ...support.ascendc_twin.host_build import (ASCEND, CMAKE_LIB_FLAGS, HERE as TWIN, OP_HOST_SOURCES,
                                                OPBUILD_FLAGS, ROOT, STRICT, STUB_INCLUDE, build_driver,
                                                compile_cmd, run)

pytestmark = pytest.mark.twin  # runs on the host twin (stub CANN headers + runtime)

IDS = [os.path.relpath(s, ASCEND) for s in OP_HOST_SOURCES]

# Every stub header and where its declarations were checked. The op_host code may include only these (and its
# own headers through relative includes); a new CANN header needs a stub modelled on the real one first.
MODELLED = {
    "register/op_def_registry.h": "hicann/metadef inc/external/asc/register/op_def_registry.h",
    "register/op_def.h": "hicann/metadef inc/external/asc/register/op_def.h",
    "register/op_def_factory.h": "hicann/metadef inc/external/asc/register/op_def_factory.h",
    "register/op_impl_registry.h": "hicann/metadef inc/external/register/op_impl_registry.h",
    "exe_graph/runtime/tiling_context.h": "hicann/metadef inc/external/exe_graph/runtime/tiling_context.h",
    "exe_graph/runtime/tiling_data.h": "hicann/metadef inc/external/exe_graph/runtime/tiling_data.h",
    "exe_graph/runtime/tiling_parse_context.h": "hicann/metadef "
                                                "inc/external/exe_graph/runtime/tiling_parse_context.h",
    "exe_graph/runtime/infer_shape_context.h": "hicann/metadef "
                                               "inc/external/exe_graph/runtime/infer_shape_context.h",
    "exe_graph/runtime/infer_datatype_context.h":
        "hicann/metadef inc/external/exe_graph/runtime/infer_datatype_context.h",
    "exe_graph/runtime/extended_kernel_context.h":
        "hicann/metadef inc/external/exe_graph/runtime/extended_kernel_context.h",
    "exe_graph/runtime/compute_node_info.h": "hicann/metadef "
                                             "inc/external/exe_graph/runtime/compute_node_info.h",
    "exe_graph/runtime/runtime_attrs.h": "hicann/metadef inc/external/exe_graph/runtime/runtime_attrs.h",
    "exe_graph/runtime/shape.h": "hicann/metadef inc/external/exe_graph/runtime/shape.h",
    "exe_graph/runtime/storage_shape.h": "hicann/metadef inc/external/exe_graph/runtime/storage_shape.h",
    "graph/types.h": "hicann/metadef inc/external/graph/types.h",
    "graph/ge_error_codes.h": "hicann/metadef inc/external/graph/ge_error_codes.h (-> error_codes.h)",
    "graph/ascend_string.h": "hicann/metadef inc/external/graph/ascend_string.h",
    "platform/soc_spec.h": "asc-devkit include/utils/tiling/platform/platform_ascendc.h (its include)",
    "tiling/platform/platform_ascendc.h": "asc-devkit include/utils/tiling/platform/platform_ascendc.h",
    "tiling/tiling_api.h": "asc-devkit include/adv_api/tiling_api.h",
    "tiling/matmul/matmul_tiling.h": "asc-devkit include/adv_api/matmul/matmul_tiling.h",
    "tiling/matmul/matmul_tiling_base.h": "asc-devkit include/adv_api/matmul/matmul_tiling_base.h",
    "tiling/matmul/matmul_tilingdata.h": "asc-devkit include/adv_api/matmul/matmul_tilingdata.h",
    "kernel_tiling/kernel_tiling.h": "asc-devkit "
                                     "impl/adv_api/cmake/scripts/gen_kernel_tiling_data_def.py output",
}


def test_the_two_op_host_sources_are_checked():
    assert IDS == ["fused_lce_grad/op_host/fused_lce_grad_cube.cpp",
                   "fused_lce_stats/op_host/fused_lce_stats_cube.cpp"]


def test_cmake_builds_every_op_host_source_and_kernel():
    """csrc/ascend/CMakeLists.txt lists each op_host source (opbuild and the TILING / GRAPH libraries) and
    each op's kernel file; an op_host source checked here but missing there would never reach the package."""
    cmake = open(os.path.join(ASCEND, "CMakeLists.txt")).read()
    for src in IDS:
        assert "${CMAKE_CURRENT_SOURCE_DIR}/" + src in cmake, src
    for op, kernel in (("FusedLceStatsCube", "fused_lce_stats_cube.cpp"),
                       ("FusedLceGradCube", "fused_lce_grad_cube.cpp")):
        assert re.search(rf"OP_TYPE {op}\s+KERNEL_DIR \w+/op_kernel\s+KERNEL_FILE {kernel}", cmake), op


@pytest.mark.parametrize("src", OP_HOST_SOURCES, ids=IDS)
def test_op_host_compiles_with_exactly_opbuilds_flags(src, cxx, tmp_path):
    """opbuild (configure time) has only ${CANN}/include on the include path and -std=c++11: every header of
    ours is reached by a relative include."""
    cmd = compile_cmd(cxx, OPBUILD_FLAGS, src, str(tmp_path / "o.o"))
    r = run(cmd)
    assert r.returncode == 0, f"opbuild's compile fails:\n{' '.join(cmd)}\n{r.stderr}"


@pytest.mark.parametrize("lib", ["OP_TILING_LIB", "OP_PROTO_LIB"])
@pytest.mark.parametrize("src", OP_HOST_SOURCES, ids=IDS)
def test_op_host_compiles_as_cmake_library(src, lib, cxx, tmp_path):
    cmd = compile_cmd(cxx, CMAKE_LIB_FLAGS + STRICT + [f"-D{lib}"], src, str(tmp_path / "o.o"))
    r = run(cmd)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"


def _stub_headers():
    out = []
    for d, _, files in os.walk(STUB_INCLUDE):
        out += [os.path.relpath(os.path.join(d, f), STUB_INCLUDE) for f in files if f.endswith(".h")]
    return sorted(out)


def test_every_stub_header_says_what_it_models():
    assert set(_stub_headers()) == set(MODELLED), "a stub header without a reference (or a stale entry)"
    for h in _stub_headers():
        text = open(os.path.join(STUB_INCLUDE, h)).read()
        assert "Stub of" in text.split("\n", 3)[0] + text.split("\n", 3)[1], \
            f"{h}: first lines must cite the original"


@pytest.mark.parametrize("header", _stub_headers())
def test_stub_header_compiles_alone(header, cxx, tmp_path):
    src = tmp_path / "h.cpp"
    src.write_text(f'#include "{header}"\n#include "{header}"\n')  # self-contained and include-guarded
    cmd = compile_cmd(cxx, ["-std=c++11", "-pedantic", *STRICT, f"-I{STUB_INCLUDE}"], str(src),
                      str(tmp_path / "o.o"))
    r = run(cmd)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("src", OP_HOST_SOURCES, ids=IDS)
def test_op_host_reaches_only_modelled_cann_headers_and_its_own(src, cxx):
    """Every non-system header an op_host source pulls in is a stub standing for a real CANN header, or one of
    ours under csrc/ (necessarily reached by relative includes: the stub root is the only -I)."""
    r = run([cxx, *OPBUILD_FLAGS, "-MM", src])
    assert r.returncode == 0, r.stderr
    deps = [os.path.realpath(d) for d in r.stdout.replace("\\\n", " ").split()[2:]]
    # the stubs reach the twin's own
    ours = [d for d in deps if not d.startswith(os.path.realpath(TWIN) + os.sep)]
    assert all(d.startswith(os.path.realpath(os.path.join(ROOT, "csrc")) + os.sep) for d in ours), ours
    assert any(d.endswith("fused_lce_tiling.h") for d in ours) and any(d.endswith("fused_lce_host.h")
                                                                       for d in ours)
    cann = {os.path.relpath(d, os.path.realpath(STUB_INCLUDE)) for d in deps} & set(MODELLED)
    assert {"register/op_def_registry.h", "tiling/platform/platform_ascendc.h", "tiling/tiling_api.h",
            "kernel_tiling/kernel_tiling.h"} <= cann


def test_opbuild_mode_registers_the_same_opdefs(cxx, tmp_path, driver):
    """OP_ADD without OP_TILING_LIB / OP_PROTO_LIB (what opbuild's libascend_all_ops.so is built as) registers
    the op definitions opbuild generates the aclnn API from; they are the ones the tiling library sees."""
    opbuild = build_driver(cxx, str(tmp_path), None, "opbuild_driver")
    for op in ("FusedLceStatsCube", "FusedLceGradCube"):
        seen = [subprocess.run([exe], input=f"opdef={op}\n", capture_output=True, text=True).stdout.strip()
                for exe in (opbuild, driver.exe)]
        assert '"error"' not in seen[0] and seen[0] == seen[1], seen


def test_no_cann_log_macro_without_its_header():
    """OP_LOGE & co. are ops-nn's (opbase log/log.h), not part of ${CANN}/include for custom ops; the
    compile tests catch a use, this names the cause directly."""
    for src in OP_HOST_SOURCES + [os.path.join(ASCEND, "common", "fused_lce_host.h")]:
        code = re.sub(r"//[^\n]*", "", open(src).read())
        assert not re.search(r"\bOP_LOG[DIWE]\s*\(", code), f"{os.path.relpath(src, ROOT)} uses OP_LOG*"


def _tcube_fields(path: str) -> list[str]:
    code = re.sub(r"//[^\n]*", "", open(path).read())
    body = code[code.index("struct TCubeTiling"):]
    body = body[:body.index("};")]
    return [n for decl in re.findall(r"int32_t\s+([^;]+);", body)
            for n in re.split(r"\s*,\s*", decl.split("=")[0])]


def test_host_tcube_tiling_is_the_kernel_twins():
    """Host and kernel see one AscendC::tiling::TCubeTiling, the real field list: the host stub includes the
    device twin's header."""
    host = open(os.path.join(STUB_INCLUDE, "kernel_tiling", "kernel_tiling.h")).read()
    assert '#include "../../../kernel/kernel_tiling/kernel_tiling.h"' in host and \
        "struct TCubeTiling" not in host
    fields = _tcube_fields(os.path.join(TWIN, "kernel", "kernel_tiling", "kernel_tiling.h"))
    assert fields[:11] == ["usedCoreNum", "M", "N", "Ka", "Kb", "singleCoreM", "singleCoreN",
                           "singleCoreK", "baseM", "baseN",
                           "baseK"] and fields[-2:] == ["BatchNum", "mxTypePara"] and len(fields) == 50
