"""The "torch" route is a real NPU fallback: every ATen op it runs on an NPU tensor, in the dtypes it runs it
in, is one torch_npu implements. The ops are recorded on the simulated npu device by torch_route_ops.py
(beside this file, in a subprocess: renaming PrivateUse1 is process-global) and checked against the committed
list tests/support/torch_npu_ops.py, which names the torch_npu sources of each entry."""
import os

import pytest
import torch

from tests.support import run_reporting_script
from tests.support.torch_npu_ops import COMPOSITE, NPU, OPS, VIEW, op_name, problems

HERE = os.path.dirname(os.path.abspath(__file__))
# 3 operand dtypes x 2 label dtypes x (12 loss + 4 log-prob cases), and _scale_grads_ in each operand dtype
N_CASES = 3 * 2 * (12 + 4) + 3


@pytest.fixture(scope="module")
def recorded():
    return run_reporting_script(os.path.join(HERE, "torch_route_ops.py"), "RECORDED ", timeout=900)


def test_the_sweep_ran_every_case(recorded):
    assert len(recorded["cases"]) == N_CASES
    assert len(set(recorded["cases"])) == N_CASES


def test_every_op_is_one_torch_npu_implements_for_its_dtypes(recorded):
    found = problems(recorded["ops"])
    assert not found, "the torch route uses ops torch_npu does not implement:\n" + "\n".join(found)


def test_the_list_holds_only_ops_the_route_uses(recorded):
    unused = sorted(set(OPS) - set(recorded["ops"]))
    assert not unused, f"tests/support/torch_npu_ops.py lists ops the torch route no longer runs: {unused}"


def _overload(name: str):
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


@pytest.mark.parametrize("name", sorted(OPS))
def test_each_entry_agrees_with_torch(name):
    """COMPOSITE entries decompose on every backend and VIEW entries are views, in this torch; NPU entries
    name their evidence."""
    entry, op = OPS[name], _overload(name)
    assert op_name(op) == name
    if entry.kind == COMPOSITE:
        assert any(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), k)
                   for k in ("CompositeImplicitAutograd", "CompositeExplicitAutograd")), name
    elif entry.kind == VIEW:
        assert op.is_view, name
    else:
        assert entry.kind == NPU and entry.source in ("OPP", "NATIVE"), entry
        assert entry.dtypes and (entry.api or entry.note), entry


def test_the_check_reports_a_new_op_and_a_new_dtype():
    assert not problems({"gather": {"float32,int64->float32": "case"}, "view": {"bool->bool": "case"}})
    new_op = problems({"index_put_": {"float32,int64,float32->float32": "case a"}})
    assert len(new_op) == 1 and "index_put_" in new_op[0] and "case a" in new_op[0]
    new_dtype = problems({"gather": {"bfloat16,int64->bfloat16": "case b"}})  # torch_npu's gather has no bf16
    assert len(new_dtype) == 1 and "['bfloat16']" in new_dtype[0] and "torch.gather" in new_dtype[0]
