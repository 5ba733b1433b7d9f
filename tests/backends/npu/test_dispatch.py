"""(d) Backend selection and the CANN-trio wrapper on a simulated "npu" device, plus availability reasons
on this host. The scenarios run in one subprocess (dispatch_scenarios.py, beside this file) because renaming
PrivateUse1 to "npu" is process-global; each scenario is reported as its own test."""
import os
import sys

import pytest

import fused_lce
from fused_lce.backends.npu import cann as npu_cann, provider as npu_provider
from tests.support import run_reporting_script

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = ["import_and_backend_info", "auto_uses_trio_bf16_all_reductions", "trio_shift_3d_and_stats",
             "fp32_and_unsupported_options_route_to_torch", "trio_shape_limits_route_to_torch",
             "env_override_and_explicit_backends", "first_failing_step_is_reported",
             "auto_falls_back_to_torch_without_npu_providers", "own_kernels_first_when_available",
             "selfcheck_guards_the_npu_providers"]


@pytest.fixture(scope="module")
def scenario_results():
    return run_reporting_script(os.path.join(HERE, "dispatch_scenarios.py"), "RESULTS ", timeout=600)


def test_every_scenario_ran(scenario_results):
    assert sorted(scenario_results) == sorted(SCENARIOS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario(scenario_results, name):
    result = scenario_results[name]
    assert result == "ok", result


def test_this_host_reports_the_first_failing_step():
    # no torch_npu here: both NPU backends stop at the first step; the package still imports and runs on CPU
    if "torch_npu" in sys.modules:
        pytest.skip("a torch_npu is imported in this process")
    info = fused_lce.backend_info()
    assert info["npu"]["reason"].startswith("torch_npu is not importable")
    assert info["npu"]["reason"].endswith(npu_provider.STATUS)
    assert info["npu_cann"]["reason"].startswith("torch_npu is not importable")


def test_trio_mask_packing():
    import torch

    out = torch.tensor([True, False, False, True, False, False, False, False, True, False])
    packed = npu_cann.pack_out_of_shard(out)
    assert packed.tolist() == [0b00001001, 0b11111101]  # token 8k+j -> bit j of byte k, padding bits set


def test_trio_detected_by_its_kernels_not_a_version(tmp_path):
    """npu_cann is available when CANN's op-api libraries export the trio's aclnn kernels (ops-nn ships them
    before CANN 9.0), looked up where op-plugin looks: $ASCEND_HOME_PATH/lib64/libopapi_*.so, libopapi.so,
    ..."""
    loaded = {}

    class Lib:
        def __init__(self, syms):
            for s in syms:
                setattr(self, s, object())

    def load(path):
        if path not in loaded:
            raise OSError(path)
        return Lib(loaded[path])

    lib64 = tmp_path / "lib64"
    lib64.mkdir()
    (lib64 / "libopapi_nn.so").write_bytes(b"")
    env = {"ASCEND_HOME_PATH": str(tmp_path)}
    all_syms = [n + s for n in npu_cann.ACLNN for s in ("", "GetWorkspaceSize")]
    loaded[str(lib64 / "libopapi_nn.so")] = all_syms
    assert npu_cann.find_aclnn(env=env, load=load) is None
    loaded[str(lib64 / "libopapi_nn.so")] = all_syms[:3]
    assert "aclnnFusedLinearCrossEntropyLossGradGetWorkspaceSize" in npu_cann.find_aclnn(env=env, load=load)
    loaded[str(lib64 / "libopapi.so")] = all_syms[3:]  # split across two libraries is fine
    assert npu_cann.find_aclnn(env=env, load=load) is None
