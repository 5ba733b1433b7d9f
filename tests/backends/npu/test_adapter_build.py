"""(c) The C++ host adapter (csrc/npu/fused_lce_npu.cpp) compiled and linked -- never loaded -- against the
headers and libtorch_npu.so of the torch-npu wheel that matches the installed torch, unpacked outside any venv
(installing torch-npu would break `import torch` without TORCH_DEVICE_BACKEND_AUTOLOAD=0). Needs the package
index (PyPI) once; the wheel is cached in ~/.cache/fused_lce. About 45 s on 2 cores."""
import importlib.util
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _npu_build():
    spec = importlib.util.spec_from_file_location("npu_build", os.path.join(ROOT, "cmake", "npu_build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_adapter_compiles_and_links_against_torch_npu_wheel(tmp_path):
    nb = _npu_build()
    cache = os.path.join(os.path.expanduser("~"), ".cache", "fused_lce", "torch_npu_wheel")
    try:
        tn = nb.fetch_wheel(cache)
    except subprocess.CalledProcessError as e:
        release, _ = nb.torch_release()
        pytest.skip(f"no torch-npu=={release} wheel could be downloaded ({e}); see docs/npu.md for the command")
    assert os.path.isfile(os.path.join(tn, "include", "third_party", "op-plugin", "op_plugin", "include",
                                       "npu_cpp_extension.h"))
    so = nb.check_adapter(ROOT, tn, str(tmp_path))
    syms = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True).stdout
    # the four private kernel ops (both pairs) and nothing else (routing and reductions live in Python)
    assert all(f"npu_{op}" in syms for op in ("stats_vector", "grads_vector", "stats_cube", "grads_cube"))
    assert "forward_npu" not in syms and "backward_npu" not in syms
    blob = open(so, "rb").read()  # schema strings: exactly the four private ops are defined, no routing glue
    assert b"_npu_stats_vector(Tensor hidden" in blob and b"_npu_grads_vector(Tensor coefs" in blob
    assert b"_npu_stats_cube(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, int vocab_start" in blob
    assert b"_npu_grads_cube(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, Tensor lse, Tensor a" in blob
    assert b"_route_" not in blob
    undefined = subprocess.run(["nm", "-D", "--undefined-only", so], capture_output=True, text=True).stdout
    assert "GetOpApiFuncAddr" in undefined  # EXEC_NPU_CMD_EXT looks the aclnn symbols up in the custom OPP


def test_npu_extensions_is_empty_without_cann(monkeypatch):
    nb = _npu_build()
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    assert nb.npu_extensions(ROOT) == []
    monkeypatch.setenv("ASCEND_HOME_PATH", "/nonexistent/cann")
    monkeypatch.setattr(nb, "torch_npu_dir", lambda: None)
    assert nb.npu_extensions(ROOT) == []  # no torch_npu installed: skipped, never imported


def test_adapter_flags_match_op_plugin_versioning():
    nb = _npu_build()
    f = nb.adapter_flags("/x/torch_npu")
    _, minor = nb.torch_release()
    assert ("CURRENT_VERSION", str(minor - 1)) in f["define_macros"]
    assert "/x/torch_npu/include/third_party/op-plugin/op_plugin/include" in f["include_dirs"]


def _schemas(path: str, prefix: str) -> dict:
    """{op name without prefix: schema after the name} of the m.def(...) strings of a C++ source."""
    import re

    code = open(path).read()
    out = {}
    for m in re.finditer(r'm\.def\(((?:\s*"[^"]*")+)', code):
        schema = "".join(re.findall(r'"([^"]*)"', m.group(1)))
        name, rest = schema.split("(", 1)
        if name.startswith(prefix):
            out[name[len(prefix):]] = rest
    return out


def test_adapter_ops_have_the_twin_ops_contracts():
    """The adapter's _npu_* ops take exactly the arguments of the twin's _twin_* ops,
    so fused_lce/backends/npu/kernels.py calls both alike (the twin provider runs the same Python over the twin ops)."""
    adapter = _schemas(os.path.join(ROOT, "csrc", "npu", "fused_lce_npu.cpp"), "_npu_")
    twin = _schemas(os.path.join(ROOT, "tests", "support", "ascendc_twin", "ext", "ops.cpp"), "_twin_")
    assert {"stats_vector", "grads_vector", "stats_cube", "grads_cube"} <= set(adapter)
    for op in ("stats_vector", "grads_vector", "stats_cube", "grads_cube"):
        assert adapter[op] == twin[op], f"_npu_{op}({adapter[op]} != _twin_{op}({twin[op]}"
