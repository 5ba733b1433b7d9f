"""cmake/ascendc_header_check.py against tiny fake asc-devkit / asc-tools checkouts (the real ones are run by
hand, docs/npu-status.md): it compiles each kernel of a project for every core side and dtype pair, counts an
error in a project file, ignores one inside a CANN header, and makes its inputs (the generated tiling header,
the stub of the closed layer's enums) as for the real checkouts. A few seconds: each source is a few lines."""
import importlib.util
import os
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GOOD = """\
    #include "kernel_operator.h"
    #include "lib/matmul_intf.h"
    struct GoodTiling { int rows; };
    extern "C" __aicore__ void good(GM_ADDR tiling) {
        REGISTER_TILING_DEFAULT(GoodTiling);
        GET_TILING_DATA(td, tiling);
        AscendC::Exp<DTYPE_HIDDEN>(td.rows, AscendC::Pipe<PIPE_V>{}, sizeof(DTYPE_LABELS), GeneratedTiling{});
    }
"""


def _tool():
    path = os.path.join(ROOT, "cmake", "ascendc_header_check.py")
    spec = importlib.util.spec_from_file_location("ascendc_header_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))


@pytest.fixture
def trees(tmp_path):
    devkit, tools, project = tmp_path / "asc-devkit", tmp_path / "asc-tools", tmp_path / "project"
    # the generator of kernel_tiling.h, called as asc-devkit's build calls it: (definitions dir, output)
    _write(str(devkit / "impl/adv_api/cmake/scripts/gen_kernel_tiling_data_def.py"), """\
        import os, sys
        assert sys.argv[1].endswith(os.path.join("include", "adv_api")), sys.argv
        os.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)
        open(sys.argv[2], "w").write("struct GeneratedTiling {};\\n")
    """)
    _write(str(devkit / "include/kernel_operator.h"), """\
        #pragma once
        #include <cstdint>
        #include "stub_fun.h"
        #include "kernel_tiling/kernel_tiling.h"
        #include "half.h"
        #define __aicore__
        #define GM_ADDR uint8_t*
        #define REGISTER_TILING_DEFAULT(t)
        namespace AscendC {
        template <pipe_t P> struct Pipe {};
        template <typename T> void Exp(int count, Pipe<PIPE_V>, unsigned long label_bytes, GeneratedTiling);
        int noise = closed_layer_symbol;  // what the missing intrinsics layer does to the real headers
        }
    """)
    _write(str(devkit / "include/adv_api/matmul/matmul_intf.h"), "#pragma once\n")
    _write(str(tools / "cpudebug/include/half.h"), "#pragma once\nstruct half {};\nstruct bfloat16_t {};\n")
    os.makedirs(tools / "cpudebug/utils")
    _write(str(project / "csrc/ascend/good/op_kernel/good.cpp"), GOOD)
    bad = GOOD.replace("struct GoodTiling", "struct BadTiling").replace("GoodTiling);", "BadTiling);")
    _write(str(project / "csrc/ascend/bad/op_kernel/bad.cpp"), bad.replace("td.rows,", "td.rows, td.rows,"))
    return str(devkit), str(tools), str(project)


def test_counts_project_errors_only(trees, capsys):
    devkit, tools, project = trees
    assert _tool().main([devkit, tools, "--project", project]) == 1
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if "project errors:" in line]
    assert len(rows) == 2 * 2 * 3 * 2  # kernels x sides x hidden dtypes x label dtypes
    good = [r for r in rows if r.startswith(os.path.join("csrc", "ascend", "good"))]
    bad = [r for r in rows if r.startswith(os.path.join("csrc", "ascend", "bad"))]
    assert len(good) == len(bad) == 12
    assert all(r.endswith("project errors: 0") for r in good), good
    assert all(r.endswith("project errors: 1") for r in bad), bad
    assert any("bad.cpp:7:" in line and "error:" in line for line in lines)
    assert {r.split()[1] for r in rows} == {"VEC", "CUBE"}
    assert {r.split()[2] for r in rows} == {"float", "half", "bfloat16_t"}


def test_passes_a_clean_kernel_and_refuses_a_wrong_checkout(trees, capsys):
    devkit, tools, project = trees
    good = os.path.join(project, "csrc", "ascend", "good", "op_kernel", "good.cpp")
    tool = _tool()
    assert tool.main([devkit, tools, good, "--project", project]) == 0
    assert tool.main([tools, devkit, good, "--project", project]) == 2
    assert "not an asc-devkit checkout" in capsys.readouterr().err
