"""The ATen ops the "torch" provider runs on an NPU, and what torch_npu implements of each: the committed list
that tests/backends/npu/test_torch_route_ops.py checks the ops recorded on the simulated npu device against.
It holds only the ops the route needs; a new op, or a new dtype of one, fails that test until it has been
checked against the sources below and added here.

Sources, as read (only op and dtype names are taken from them):
  OPP     Ascend/op-plugin, branch master at 517f2e7d0f202f38b76310706cb977ca2388ad21 (torch_npu v2.1 to
          v2.15): op_plugin/config/op_plugin_functions.yaml, the ATen ops torch_npu registers for the NPU (an
          entry counts when its acl_op or op_api versions include v2.13); the kernels a note names are under
          op_plugin/ops/.
  NATIVE  Ascend/pytorch, branch master at 9e73e708ab9350d203475609f36f8a43f6a0c2ab (torch_npu 2.13.0 to
          2.15.0; there is no v2.13 branch): torch_npu/csrc/aten/npu_native_functions.yaml, the ops torch_npu
          registers itself; the kernels a note names are under torch_npu/csrc/.
  DOCS    the same Ascend/pytorch commit, docs/zh/api/native_api/pytorch_2-13-0/torch.md and torch-Tensor.md:
          per API, the products it runs on and the dtypes it supports. ``api`` names the entry; ``dtypes`` is
          its list for Atlas A2 / A3 training products, of the six dtypes the route can use.
  TORCH   torch 2.13's dispatcher (the test checks it): a COMPOSITE op has a CompositeImplicitAutograd or
          CompositeExplicitAutograd kernel and no torch_npu kernel, so on the NPU it runs as the ops it
          decomposes into, which are recorded and checked in its place; a VIEW op only makes a view of its
          input (no device kernel, any dtype).
"""
from __future__ import annotations

from typing import NamedTuple

NPU, COMPOSITE, VIEW = "npu", "composite", "view"


class Entry(NamedTuple):
    kind: str  # NPU: a torch_npu kernel; COMPOSITE / VIEW: see TORCH above
    source: str  # where the kind is stated: OPP, NATIVE or TORCH
    api: str = ""  # the DOCS entry whose dtype list ``dtypes`` is ("" where DOCS has none: see ``note``)
    dtypes: frozenset = frozenset()  # dtypes allowed on the device (NPU entries)
    note: str = ""


def _d(names: str) -> frozenset:
    return frozenset(names.split())


ALL = _d("bfloat16 float16 float32 int32 int64 bool")
NO_BOOL = _d("bfloat16 float16 float32 int32 int64")
FLOATS = _d("bfloat16 float16 float32")
BITS = _d("int32 int64 bool")
NOT_950 = "Ascend 950DT is marked unsupported for this API in DOCS"


def npu(source: str, api: str, dtypes: frozenset, note: str = "") -> Entry:
    return Entry(NPU, source, api, dtypes, note)


OPS = {
    "_local_scalar_dense": npu("NATIVE", "", ALL, "LocalScalarDenseNpu.cpp dispatches over every dtype, bool "
                               "included (DOCS lists fp32 only for Tensor.item)"),
    "_to_copy": npu("NATIVE", "Tensor.to", ALL),
    "add.Tensor": npu("OPP", "torch.add", ALL),
    "add_.Tensor": npu("OPP", "Tensor.add_", ALL),
    "addcmul": npu("OPP", "torch.addcmul", NO_BOOL),
    "addmm_": npu("OPP", "Tensor.addmm_", _d("float16 float32")),
    "any": npu("OPP", "torch.any", ALL),
    "bitwise_and.Tensor": npu("OPP", "torch.bitwise_and", BITS),
    "bitwise_not": npu("OPP", "torch.bitwise_not", BITS),
    "bitwise_or.Tensor": npu("OPP", "torch.bitwise_or", BITS),
    "cat": npu("OPP", "torch.cat", ALL),
    "clamp": npu("OPP", "torch.clamp", NO_BOOL),
    "copy_": npu("NATIVE", "Tensor.copy_", ALL),
    "div.Tensor": npu("OPP", "torch.div", ALL),
    "div_.Tensor": npu("OPP", "Tensor.div_", FLOATS),
    "empty.memory_format": npu("NATIVE", "torch.empty", ALL),
    "empty_like": npu("NATIVE", "torch.empty_like", ALL),
    "eq.Scalar": npu("OPP", "torch.eq", ALL),
    "eq.Tensor": npu("OPP", "torch.eq", ALL),
    "exp": npu("OPP", "torch.exp", _d("bfloat16 float16 float32 int64 bool")),
    "exp_": npu("OPP", "Tensor.exp_", FLOATS),
    "fill_.Scalar": npu("OPP", "Tensor.fill_", ALL),
    "full": npu("NATIVE", "torch.full", ALL),
    "gather": npu("OPP", "torch.gather", _d("float16 float32 int32 int64 bool")),
    "ge.Scalar": npu("OPP", "torch.ge", ALL),
    "gt.Scalar": npu("OPP", "torch.gt", ALL),
    "gt.Tensor": npu("OPP", "torch.gt", ALL),
    "index.Tensor": npu("OPP", "", BITS, "no DOCS entry (Tensor.__getitem__): the dtypes the route uses, in "
                        "the label check's error message only (labels[bad])"),
    "log": npu("OPP", "torch.log", ALL),
    "lt.Scalar": npu("OPP", "torch.lt", ALL),
    "masked_fill_.Scalar": npu("OPP", "Tensor.masked_fill_", ALL),
    "matmul": npu("OPP", "torch.matmul", _d("float16 float32"), NOT_950),
    "max.dim": npu("OPP", "torch.max", _d("bfloat16 float16 float32 int64 bool")),
    "maximum": npu("OPP", "torch.maximum", ALL),
    "mul.Tensor": npu("OPP", "torch.mul", ALL),
    "mul_.Tensor": npu("OPP", "Tensor.mul_", ALL),
    "ne.Scalar": npu("OPP", "torch.ne", ALL),
    "neg": npu("OPP", "torch.neg", NO_BOOL),
    "ones": npu("OPP", "torch.ones", ALL),
    "ones_like": npu("OPP", "torch.ones_like", ALL),
    "pow.Tensor_Scalar": npu("OPP", "torch.pow", _d("bfloat16 float16 float32 int64")),
    "reciprocal": npu("OPP", "torch.reciprocal", ALL),
    "rsub.Scalar": npu("OPP", "torch.sub", NO_BOOL, "no public rsub API (scalar - tensor): torch.sub's"),
    "scatter_add_": npu("OPP", "Tensor.scatter_add_", ALL),
    "stack": npu("OPP", "torch.stack", ALL),
    "sub.Tensor": npu("OPP", "torch.sub", NO_BOOL),
    "sub_.Tensor": npu("OPP", "Tensor.sub_", NO_BOOL),
    "sum": npu("OPP", "torch.sum", ALL, "DOCS says torch.sum takes no dtype argument, but op-plugin's sum "
               "(SumKernelNpuOpApi.cpp) passes it to aclnnReduceSum as the output dtype"),
    "sum.dim_IntList": npu("OPP", "torch.sum", ALL),
    "tanh": npu("OPP", "torch.tanh", ALL),
    "where.self": npu("OPP", "torch.where", ALL),
    "zero_": npu("OPP", "Tensor.zero_", ALL),
    "zeros": npu("OPP", "torch.zeros", ALL, "DOCS states no dtype restriction"),
    # composites: decomposed by torch (torch_npu registers none of these; op-plugin's _foreach_mul_ has the
    # List / Scalar / ScalarList overloads only)
    "__and__.Tensor": Entry(COMPOSITE, "TORCH"),
    "__or__.Tensor": Entry(COMPOSITE, "TORCH"),
    "_foreach_mul_.Tensor": Entry(COMPOSITE, "TORCH"),
    "full_like": Entry(COMPOSITE, "TORCH"),
    "new_empty": Entry(COMPOSITE, "TORCH"),
    "reshape": Entry(COMPOSITE, "TORCH"),
    "scalar_tensor": Entry(COMPOSITE, "TORCH"),
    "to.device": Entry(COMPOSITE, "TORCH"),
    "to.dtype": Entry(COMPOSITE, "TORCH"),
    "where.ScalarOther": Entry(COMPOSITE, "TORCH"),
    "where.ScalarSelf": Entry(COMPOSITE, "TORCH"),
    "zeros_like": Entry(COMPOSITE, "TORCH"),
    # views
    "detach": Entry(VIEW, "TORCH"),
    "expand": Entry(VIEW, "TORCH"),
    "lift_fresh": Entry(VIEW, "TORCH"),
    "select.int": Entry(VIEW, "TORCH"),
    "slice.Tensor": Entry(VIEW, "TORCH"),
    "squeeze.dim": Entry(VIEW, "NATIVE"),
    "t": Entry(VIEW, "TORCH"),
    "unsqueeze": Entry(VIEW, "NATIVE"),
    "view": Entry(VIEW, "NATIVE"),
}


def op_name(func) -> str:
    """An ATen overload as op_plugin_functions.yaml names it: ``add.Tensor``, ``exp`` (a default overload)."""
    base = func._schema.name.split("::", 1)[1]
    return base if func._overloadname == "default" else f"{base}.{func._overloadname}"


def problems(recorded: dict) -> list[str]:
    """What in ``recorded`` ({op: {signature: first case}}, a signature the dtypes of the op's device tensors,
    ``cpu`` for a host tensor) is not in ``OPS``, or uses a dtype its entry does not allow."""
    out = []
    for name, sigs in sorted(recorded.items()):
        entry = OPS.get(name)
        if entry is None:
            sig, case = next(iter(sigs.items()))
            out.append(f"{name} ({sig}, first in: {case}): not in tests/support/torch_npu_ops.py; check that "
                       "torch_npu implements it for these dtypes (the sources are named there) and add it, "
                       "or add it as COMPOSITE if torch decomposes it there (its parts are then checked)")
            continue
        if entry.kind != NPU:
            continue
        for sig, case in sigs.items():
            used = {d for part in sig.split("->") for d in part.split(",") if d and d != "cpu"}
            if not used <= entry.dtypes:
                out.append(f"{name} ({sig}, first in: {case}): {sorted(used - entry.dtypes)} not among the "
                           f"dtypes torch_npu supports for it ({entry.api or entry.note}: "
                           f"{sorted(entry.dtypes)})")
    return out
