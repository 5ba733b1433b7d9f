"""Records the ATen ops the "torch" provider runs on the simulated "npu" device (tests/support/npu_sim.py),
run in a subprocess by test_torch_route_ops.py (renaming PrivateUse1 is process-global). Prints one line
``RECORDED {"cases": [...], "ops": {op: {signature: first case}}}``; a signature lists the dtypes of the op's
device tensors, inputs then outputs (``cpu`` for a host tensor).

The sweep: ``linear_cross_entropy`` (every reduction, label smoothing, z-loss, softcap, bias, ignore_index,
shift, num_items, return_stats, several token blocks and vocabulary tiles, a second backward, a bad label with
and without ``validate``) and ``linear_logprobs`` (temperature, entropy, the extras, bias, each upstream
gradient), forward and backward, bf16 / fp16 / fp32 with int32 / int64 labels, ``backend="torch"``.

Where the simulation differs from a real NPU, this records what the NPU would run:
* a composite op (``COMPOSITE`` in tests/support/torch_npu_ops.py) is decomposed by torch on every backend
  without a kernel of its own for it: it runs through its decomposition here, so the ops it becomes are
  recorded too;
* on a real device the tensors are plain ``torch.Tensor``: the label-range check and the host read of
  ``num_items`` run (``validate.values_hidden`` is told so), and the fused backward scales its gradients with
  ``fused_lce::_scale_grads_`` (called directly here, since the simulated tensors take its traced path).
"""
from __future__ import annotations

import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path[:0] = [os.path.join(ROOT, "tests", "support", "fake_torch_npu"), ROOT]

import torch  # noqa: E402

import fused_lce  # noqa: E402
import torch_npu  # noqa: E402,F401  (the fake: sets up the simulated device)
from fused_lce.core import validate  # noqa: E402
from tests.support import npu_sim  # noqa: E402
from tests.support.npu_sim import NpuMode, NpuTensor  # noqa: E402
from tests.support.torch_npu_ops import COMPOSITE, OPS, op_name  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

PRIVATEUSE1 = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
RECORDED: dict[str, dict[str, str]] = {}
CASE = [None]  # the case running now; None: not recording (setting up inputs)


def _dtypes(xs) -> list[str]:
    return [str(x.dtype).replace("torch.", "") if isinstance(x, NpuTensor) else "cpu"
            for x in tree_leaves(xs) if isinstance(x, torch.Tensor)]


def observer(func, args, kwargs, run):
    if CASE[0] is None or func.namespace != "aten":
        return run()
    name = op_name(func)
    entry = OPS.get(name)
    if entry is not None and entry.kind == COMPOSITE:
        with NpuMode():  # the decomposition's ops come back here
            if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
                out = func.decompose(*args, **kwargs)
            else:  # CompositeExplicitAutograd: the kernel a device without its own runs
                out = func.redispatch(PRIVATEUSE1, *args, **kwargs)
    else:
        out = run()
    ins, outs = _dtypes((args, kwargs)), _dtypes(out)
    on_device = npu_sim._is_npu_device(kwargs.get("device")) or any(d != "cpu" for d in ins + outs)
    if on_device:
        RECORDED.setdefault(name, {}).setdefault(",".join(ins) + "->" + ",".join(outs), CASE[0])
    return out


_plain_values_hidden = validate.values_hidden


def _values_hidden(t):
    """A simulated-device tensor stands for a plain NPU tensor, whose values the checks read."""
    return not isinstance(t, NpuTensor) and _plain_values_hidden(t)


# ------------------------------------------------------------------------------------------------ the sweep
def problem(dtype, label_dtype, ignore_index, seed, lead=(), n=37, d=16, v=150):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, n, d, generator=g).to(dtype)
    w = (torch.randn(v, d, generator=g) * (3.0 / math.sqrt(d))).to(dtype)
    b = torch.randn(v, generator=g).to(dtype)
    y = torch.randint(0, v, (*lead, n), generator=g)
    if label_dtype == torch.int64 or -2**31 <= ignore_index < 2**31:  # (int32 labels cannot hold 2**40)
        y.view(-1)[::5] = ignore_index
    return h, w, b, y.to(label_dtype)


def on_npu(*xs):
    with NpuMode():
        return [None if x is None else x.to("npu").requires_grad_(x.is_floating_point()) for x in xs]


def loss_case(name, dtype, ldt, opts, bias=False, lead=(), bad=False, twice=False, upstream=False):
    h, w, b, y = problem(dtype, ldt, opts.get("ignore_index", -100), 1, lead)
    if bad:
        y.view(-1)[3] = 150  # out of range: NaN without validate, a ValueError with it
    hn, wn, bn, yn = on_npu(h, w, b if bias else None, y)
    opts = dict(opts)
    if isinstance(opts.get("num_items"), torch.Tensor):
        opts["num_items"] = on_npu(opts["num_items"])[0]
    CASE[0] = name
    try:
        with NpuMode():
            try:
                out = fused_lce.linear_cross_entropy(hn, wn, yn, bn, backend="torch", **opts)
            except ValueError as e:
                assert bad and "labels: expected values" in str(e), e
                return
            loss = out.loss if opts.get("return_stats") else out
            up = torch.rand(loss.shape).to("npu") if upstream else torch.ones_like(loss)
            loss.backward(up, retain_graph=twice)
            if twice:  # the second backward recomputes (fused_lce::backward)
                loss.backward(up)
    finally:
        CASE[0] = None


def logprobs_case(name, dtype, ldt, opts, grads=("logprobs", "entropy")):
    h, w, b, y = problem(dtype, ldt, opts.get("ignore_index", -100), 2)
    hn, wn, bn, yn = on_npu(h, w, b, y)
    CASE[0] = name
    try:
        with NpuMode():
            out = fused_lce.linear_logprobs(hn, wn, yn, bn, backend="torch", **opts)
            if isinstance(out, torch.Tensor):
                parts = {"logprobs": out}
            elif isinstance(out, tuple) and not hasattr(out, "logprobs"):
                parts = {"logprobs": out[0], "entropy": out[1]}
            else:
                parts = {"logprobs": out.logprobs, "entropy": out.entropy}
            total = sum(parts[k].sum() for k in grads if parts.get(k) is not None)
            total.backward()
    finally:
        CASE[0] = None


def scale_grads_case(name, dtype):
    """What the fused backward runs on a real device: fused_lce::_scale_grads_ on dX / dW / db in place."""
    grads = on_npu(*(torch.randn(5).to(dtype) for _ in range(3)), torch.tensor(0.5))
    CASE[0] = name
    try:
        with NpuMode():
            torch.ops.fused_lce._scale_grads_([g.detach() for g in grads[:3]], grads[3].detach())
    finally:
        CASE[0] = None


EXTRAS = ("mean_logit", "is_top1", "log_sum_sq_probs")
TINY = 0.004  # MiB of logits tiles: several token blocks and vocabulary tiles


def cases():
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for ldt in (torch.int64, torch.int32):
            tag = f"{str(dtype)[6:]}/{str(ldt)[6:]}"
            for opts, kw in (({}, {}), ({"reduction": "sum"}, {"bias": True}),
                             ({"reduction": "none"}, {"upstream": True}),
                             ({"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 5.0}, {"bias": True}),
                             ({"ignore_index": -1, "num_items": 50}, {}),
                             ({"ignore_index": 2**40, "num_items": torch.tensor(50.0)}, {}),
                             ({"shift": True, "return_stats": True}, {"lead": (2,)}),
                             ({"tile_budget_mb": TINY, "label_smoothing": 0.1}, {"bias": True}),
                             ({"tile_budget_mb": TINY, "reduction": "none"}, {"upstream": True}),
                             ({}, {"twice": True}),
                             ({"validate": False}, {"bad": True}), ({}, {"bad": True})):
                name = f"loss {tag} {opts} {kw}"
                yield name, lambda n=name, o=opts, k=kw, dt=dtype, lt=ldt: loss_case(n, dt, lt, o, **k)
            for opts, grads in (({}, ("logprobs",)),
                                ({"temperature": 0.7, "return_entropy": True}, ("entropy",)),
                                ({"softcap": 4.0, "return_entropy": True, "extra_outputs": EXTRAS},
                                 ("logprobs", "entropy")),
                                ({"ignore_index": -1, "return_entropy": True, "tile_budget_mb": TINY},
                                 ("logprobs", "entropy"))):
                name = f"logprobs {tag} {opts} {grads}"
                yield name, lambda n=name, o=opts, g=grads, dt=dtype, lt=ldt: logprobs_case(n, dt, lt, o, g)
        name = f"_scale_grads_ {str(dtype)[6:]}"
        yield name, lambda n=name, dt=dtype: scale_grads_case(n, dt)


def main():
    npu_sim.OBSERVER = observer
    validate.values_hidden = _values_hidden
    names = []
    for name, run in cases():
        run()
        names.append(name)
    print("RECORDED " + json.dumps({"cases": names, "ops": RECORDED}), flush=True)


if __name__ == "__main__":
    main()
