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
        pytest.skip(f"no torch-npu=={release} wheel could be downloaded ({e}); see "
                    "docs/npu-status.md for the command")
    assert os.path.isfile(os.path.join(tn, "include", "third_party", "op-plugin", "op_plugin", "include",
                                       "npu_cpp_extension.h"))
    so = nb.check_adapter(ROOT, tn, str(tmp_path))
    syms = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True).stdout
    # the two private kernel ops and nothing else (routing and reductions live in Python)
    assert all(f"npu_{op}" in syms for op in ("stats_cube", "grads_cube")) and "_vector" not in syms
    assert "forward_npu" not in syms and "backward_npu" not in syms
    blob = open(so, "rb").read()  # the schema strings of kernel_ops.h, no routing glue
    assert b"(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, int vocab_start" in blob
    assert (b"(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, Tensor lse, "
            b"Tensor a, Tensor t") in blob
    assert b"_route_" not in blob
    undefined = subprocess.run(["nm", "-D", "--undefined-only", so], capture_output=True, text=True).stdout
    assert "GetOpApiFuncAddr" in undefined  # EXEC_NPU_CMD_EXT looks the aclnn symbols up in the custom OPP


def test_npu_extensions_is_empty_without_cann(monkeypatch):
    nb = _npu_build()
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    assert nb.npu_extensions(ROOT) == []
    monkeypatch.setenv("ASCEND_HOME_PATH", "/nonexistent/cann")
    # no torch_npu installed: looked up, never imported
    monkeypatch.setattr(nb, "torch_npu_dir", lambda: None)
    with pytest.raises(nb.NpuBuildError, match="torch_npu is not installed"):  # setup.py records it
        nb.npu_extensions(ROOT)


def test_adapter_flags_match_op_plugin_versioning():
    nb = _npu_build()
    f = nb.adapter_flags("/x/torch_npu")
    _, minor = nb.torch_release()
    assert ("CURRENT_VERSION", str(minor - 1)) in f["define_macros"]
    assert "/x/torch_npu/include/third_party/op-plugin/op_plugin/include" in f["include_dirs"]


def test_adapter_and_twin_define_their_ops_from_one_schema_list():
    """The adapter and the twin extension define their kernel ops from csrc/npu/kernel_ops.h, so
    fused_lce/backends/npu/kernels.py calls both alike; neither spells a kernel op's schema itself."""
    import re

    for path, prefix in ((os.path.join(ROOT, "csrc", "npu", "fused_lce_npu.cpp"), "_npu"),
                         (os.path.join(ROOT, "tests", "support", "ascendc_twin", "ext", "ops.cpp"), "_twin")):
        code = open(path).read()
        assert f'fused_lce_npu::def_kernel_ops(m, "{prefix}")' in code, path
        assert not re.search(r'm\.def\("_[a-z]+_(stats|grads)_cube\(', code), path


@pytest.mark.twin
@pytest.mark.parametrize("op", ["_cpu_stats", "_cpu_grads", "_twin_stats_cube", "_twin_grads_cube"])
def test_private_kernel_ops_share_one_argument_order(op):
    """Every private kernel op of every device (the CPU ops, and the twin's, whose schemas are the adapter's):
    hidden, weight, bias?, labels, the op's tensors, vocab_start, softcap, temperature, the op's flags and
    sizes."""
    import torch

    from ...support.ascendc_twin import build as twin_build

    if op.startswith("_twin"):
        twin_build.load_twin()
    args = getattr(torch.ops.fused_lce, op).default._schema.arguments
    names = [a.name for a in args]
    assert names[:4] == ["hidden", "weight", "bias", "labels"], names
    i = names.index("vocab_start")
    assert names[i:i + 3] == ["vocab_start", "softcap", "temperature"], names
    assert all("Tensor" in str(a.type) for a in args[4:i]), names  # the op's own tensors
    assert all("Tensor" not in str(a.type) or a.has_default_value() for a in args[i:]), names  # extras last
