"""``OpSchema``: the ops' Autograd kernel (``register_autograd``) on toy ops of the library."""
from __future__ import annotations

import pytest
import torch

from fused_lce.core import LOGPROBS, Options
from fused_lce.ops.schema import OpSchema

_lib = torch.library.Library("fused_lce", "FRAGMENT")
TOY = OpSchema(_lib, "_schema_test_scale", "Tensor x, Tensor y, float k", LOGPROBS, "",
               "(Tensor out, Tensor aux)")
_lib.impl(TOY.name, lambda *a: (a[0] * a[2] + a[1], a[0].sum()), "CompositeExplicitAutograd")
SEEN = {}


def _setup(ctx, inputs, output):
    a = TOY.bind(inputs)
    SEEN["setups"] = SEEN.get("setups", 0) + 1
    SEEN["inputs"] = len(inputs)
    ctx.k = a["k"]
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, g_out, _g_aux):
    SEEN["needs"] = tuple(ctx.needs_input_grad)
    return (g_out * ctx.k if ctx.needs_input_grad[0] else None,
            g_out if ctx.needs_input_grad[1] else None) + (None,) * (len(TOY.arg_names) - 2)


TOY.register_autograd(_lib, _backward, _setup)


OPTS = {f: getattr(Options(), f) for f in TOY.option_names}  # every option of the family, at its default


def _call(x, y, k=3.0):
    return TOY.op(*TOY.args(x=x, y=y, k=k, **OPTS))


@pytest.mark.parametrize("needs", [(True, True), (True, False), (False, True)])
def test_gradients_and_needs_input_grad(needs):
    x = torch.randn(5, requires_grad=needs[0])
    y = torch.randn(5, requires_grad=needs[1])
    out, aux = _call(x, y)
    assert not aux.requires_grad
    g = torch.randn(5)
    leaves = [t for t in (x, y) if t.requires_grad]
    got = torch.autograd.grad(out, leaves, g)
    want = [g * 3.0 if t is x else g for t in leaves]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    # setup_context sees the op's inputs, the backward their needs (no trailing key set)
    assert SEEN["inputs"] == len(TOY.arg_names)
    assert SEEN["needs"] == (needs[0], needs[1]) + (False,) * (len(TOY.arg_names) - 2)


def test_no_graph_without_grad():
    """No autograd.Function (no setup_context, nothing saved) when no gradient can flow."""
    setups = SEEN.get("setups", 0)
    x = torch.randn(4, requires_grad=True)
    with torch.no_grad():
        out, _ = _call(x, torch.randn(4))
    assert out.grad_fn is None and not out.requires_grad
    out, _ = _call(torch.randn(4), torch.randn(4))
    assert out.grad_fn is None
    assert SEEN.get("setups", 0) == setups
    out, _ = _call(x, torch.randn(4))
    assert type(out.grad_fn).__name__ == "GeneratedBackwardFor_fused_lce__schema_test_scale_defaultBackward"
    assert SEEN["setups"] == setups + 1


def test_opcheck():
    args = TOY.args(x=torch.randn(3, requires_grad=True), y=torch.randn(3, requires_grad=True), k=2.0, **OPTS)
    torch.library.opcheck(TOY.op, args, test_utils=("test_schema", "test_autograd_registration",
                                                    "test_aot_dispatch_dynamic"))


# schemas this kernel does not handle (torch's register_autograd re-adds defaults the dispatcher drops, passes
# keyword-only arguments, handles tensor lists and refuses aliasing outputs)
UNSUPPORTED = {
    "defaults": ("Tensor x", "int k=1"),
    "kwarg_only": ("Tensor x", "*, int k"),
    "tensor_list": ("Tensor x, Tensor[] xs", ""),
    "optional_tensor_list": ("Tensor x, Tensor?[] xs", ""),
    "aliasing": ("Tensor(a!) x", ""),
}
UNSUPPORTED_SCHEMAS = {k: OpSchema(_lib, f"_schema_test_{k}", head, LOGPROBS, tail, "Tensor")
                       for k, (head, tail) in UNSUPPORTED.items()}


@pytest.mark.parametrize("kind", list(UNSUPPORTED))
def test_refuses_schemas_it_does_not_handle(kind):
    with pytest.raises(TypeError, match="needs torch.library.register_autograd"):
        UNSUPPORTED_SCHEMAS[kind].register_autograd(_lib, _backward, _setup)
