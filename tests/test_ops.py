"""The registered custom ops: opcheck, autograd, torch.compile(fullgraph=True), checkpointing, no_grad."""
from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import fused_lce
from fused_lce import registry
from fused_lce.reference import reference_loss

from .conftest import BACKEND_DEVICE, rel_err

OPT_VARIANTS = {
    "plain": dict(ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=0.0),
    "all": dict(ignore_index=-100, label_smoothing=0.2, z_loss=0.01, softcap=5.0),
}


def _fwd_args(device, reduction, opts, backend, bias=True, num_items=None, grad_mask=(True, True, True)):
    h = torch.randn(13, 6, device=device, requires_grad=True)
    w = torch.randn(17, 6, device=device, requires_grad=True)
    b = torch.randn(17, device=device, requires_grad=True) if bias else None
    y = torch.randint(0, 17, (13,), device=device)
    y[::4] = -100
    return (h, w, y, b, num_items, reduction, opts["ignore_index"], opts["label_smoothing"], opts["z_loss"],
            opts["softcap"], backend, "", 0, 0, 0, list(grad_mask))


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("opts", list(OPT_VARIANTS))
def test_opcheck_forward(bd, reduction, opts):
    backend, device = bd
    args = _fwd_args(device, reduction, OPT_VARIANTS[opts], backend)
    torch.library.opcheck(torch.ops.fused_lce.forward.default, args)
    nargs = list(args)
    nargs[4] = torch.tensor(7.0, device=device)  # num_items
    nargs[3] = None
    nargs[-1] = [True, False, False]
    torch.library.opcheck(torch.ops.fused_lce.forward.default, tuple(nargs))


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_opcheck_backward(bd):
    backend, device = bd
    h, w, y, b, *_ = _fwd_args(device, "none", OPT_VARIANTS["all"], backend)
    o = OPT_VARIANTS["all"]
    _, lse, *_ = torch.ops.fused_lce.forward(h, w, y, b, None, "none", -100, o["label_smoothing"], o["z_loss"],
                                             o["softcap"], backend, "", 0, 0, 0, [False, False, False])
    g = torch.rand(13, device=device)
    args = (g, h.detach(), w.detach(), y, b.detach(), lse, -100, o["label_smoothing"], o["z_loss"], o["softcap"],
            backend, "", 0, 0, 0, [True, True, True])
    torch.library.opcheck(torch.ops.fused_lce.backward.default, args)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_direct_op_call_with_autograd(bd):
    """torch.ops.fused_lce.forward used directly: gradients are right even when grad_mask under-announces."""
    backend, device = bd
    h, w, y, b, *rest = _fwd_args(device, "mean", OPT_VARIANTS["all"], backend, grad_mask=(False, True, False))
    loss = torch.ops.fused_lce.forward(h, w, y, b, *rest)[0]
    loss.backward()
    hr, wr, br = (t.detach().double().cpu().requires_grad_() for t in (h, w, b))
    o = OPT_VARIANTS["all"]
    ref, *_ = reference_loss(hr, wr, y.cpu(), br, label_smoothing=o["label_smoothing"], z_loss=o["z_loss"],
                             softcap=o["softcap"])
    ref.backward()
    for ours, want in ((h.grad, hr.grad), (w.grad, wr.grad), (b.grad, br.grad)):
        assert rel_err(ours.cpu(), want) < 1e-5


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_no_grad_does_no_gradient_work(bd, monkeypatch):
    backend, device = bd
    calls = []
    impl = registry.load(backend)
    for kernel in ("grads", "fused"):
        original = getattr(type(impl), kernel)

        def spy(self, *args, _name=kernel, _orig=original, **kw):
            calls.append(_name)
            return _orig(self, *args, **kw)

        monkeypatch.setattr(type(impl), kernel, spy)
    h, w, y, b, *_ = _fwd_args(device, "mean", OPT_VARIANTS["plain"], backend)
    with torch.no_grad():
        loss = fused_lce.linear_cross_entropy(h, w, y, b, backend=backend)
    assert not loss.requires_grad
    assert calls == []  # no gradient kernel ran
    # the op itself returns empty gradient buffers
    out = torch.ops.fused_lce.forward(h, w, y, b, None, "mean", -100, 0.0, 0.0, 0.0, backend, "", 0, 0, 0,
                                      [False, False, False])
    assert all(t.numel() == 0 for t in out[3:])
    assert calls == []
    # and the spies are live: a training call reaches a gradient kernel
    fused_lce.linear_cross_entropy(h.requires_grad_(), w, y, b, backend=backend).backward()
    assert calls


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_gradient_checkpointing(bd):
    """Forward run twice (recompute under checkpoint) gives the same gradients as a plain run."""
    backend, device = bd
    torch.manual_seed(0)
    proj = torch.nn.Linear(8, 8).to(device)
    head = torch.randn(23, 8, device=device, requires_grad=True)
    x = torch.randn(4, 9, 8, device=device)
    y = torch.randint(0, 23, (4, 9), device=device)

    def body(inp):
        return fused_lce.linear_cross_entropy(torch.tanh(proj(inp)), head, y, shift=True, backend=backend,
                                              z_loss=0.01)

    grads = []
    for use_ckpt in (False, True):
        proj.zero_grad()
        head.grad = None
        loss = checkpoint(body, x, use_reentrant=False) if use_ckpt else body(x)
        loss.backward()
        grads.append([head.grad.clone()] + [p.grad.clone() for p in proj.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_compile_fullgraph(bd, compiler):
    """The public API (validate left at its default) traces without graph breaks; loss and grads match eager."""
    backend, device = bd
    torch._dynamo.reset()
    torch.manual_seed(1)
    h = torch.randn(2, 7, 16, device=device, requires_grad=True)
    w = torch.randn(31, 16, device=device, requires_grad=True)
    y = torch.randint(0, 31, (2, 7), device=device)
    y[0, :3] = -100

    def f(h, w, y):
        return fused_lce.linear_cross_entropy(torch.relu(h), w, y, shift=True, label_smoothing=0.1,
                                              backend=backend, ignore_index=-100)

    compiled = torch.compile(f, fullgraph=True, backend=compiler)
    loss_c = compiled(h, w, y)
    gh_c, gw_c = torch.autograd.grad(loss_c, (h, w))
    loss_e = f(h, w, y)
    gh_e, gw_e = torch.autograd.grad(loss_e, (h, w))
    torch.testing.assert_close(loss_c, loss_e)
    torch.testing.assert_close(gh_c, gh_e)
    torch.testing.assert_close(gw_c, gw_e)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_retain_graph_second_backward(bd):
    """The forward-computed gradients are scaled in place; a second backward must still be right."""
    backend, device = bd
    h, w, y, b, *_ = _fwd_args(device, "mean", OPT_VARIANTS["all"], backend)
    o = OPT_VARIANTS["all"]
    loss = fused_lce.linear_cross_entropy(h, w, y, b, backend=backend, label_smoothing=o["label_smoothing"],
                                          z_loss=o["z_loss"], softcap=o["softcap"])
    g1 = torch.autograd.grad(loss * 3.0, (h, w, b), retain_graph=True)
    g2 = torch.autograd.grad(loss * 3.0, (h, w, b))
    for a, c in zip(g1, g2):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)
