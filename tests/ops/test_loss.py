"""The registered custom ops: opcheck, autograd, torch.compile(fullgraph=True), checkpointing, no_grad."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import fused_lce
from fused_lce.core import registry
from fused_lce.core.formulas import reference_loss

from ..conftest import BACKEND_DEVICE, rel_err
from ..support import options_block

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
    return (h, w, y, b, num_items, reduction, *options_block(backend=backend, **opts), list(grad_mask))


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
    opts = options_block(backend=backend, **o)
    _, lse, *_ = torch.ops.fused_lce.forward(h, w, y, b, None, "none", *opts, [False, False, False])
    opts = (*opts, [True, True, True])
    for up, num_items, reduction in ((torch.rand(13, device=device), None, "none"),
                                     (torch.tensor(0.5, device=device), torch.tensor(7.0), "mean")):
        args = (up, h.detach(), w.detach(), y, b.detach(), lse, num_items, reduction, *opts)
        torch.library.opcheck(torch.ops.fused_lce.backward.default, args)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_direct_op_call_with_autograd(bd):
    """torch.ops.fused_lce.forward used directly: gradients are right even when grad_mask under-announces."""
    backend, device = bd
    h, w, y, b, *rest = _fwd_args(device, "mean", OPT_VARIANTS["all"], backend,
                                  grad_mask=(False, True, False))
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
    out = torch.ops.fused_lce.forward(h, w, y, b, None, "mean", *options_block(backend=backend),
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
    """The public API (validate left at its default) traces without graph breaks; loss and grads match
    eager."""
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


# ----------------------------------------------------------------------------------------------- input checks
def _opts(be, **kw):
    return options_block(**{"backend": be, **kw})


def _bad_op_calls(backend, device):
    """(description, callable, exception type, argument the message must name) for the direct ops."""
    n, d, v = 7, 5, 11
    h = torch.randn(n, d, device=device)
    w = torch.randn(v, d, device=device)
    y = torch.randint(0, v, (n,), device=device)
    b = torch.randn(v, device=device)
    lse = torch.randn(n, device=device)
    g = torch.rand(n, device=device)
    mask = [True, True, True]
    fwd = lambda hh=h, ww=w, yy=y, bb=b, ni=None, red="mean", gm=mask, **o: (  # noqa: E731
        lambda: torch.ops.fused_lce.forward(hh, ww, yy, bb, ni, red, *_opts(backend, **o), gm))
    bwd = lambda gg=g, hh=h, ww=w, yy=y, bb=b, ll=lse, gm=mask, **o: (  # noqa: E731
        lambda: torch.ops.fused_lce.backward(gg, hh, ww, yy, bb, ll, None, "none", *_opts(backend, **o), gm))
    other = "meta"  # a device that is never hidden's
    cases = []
    for op, make in (("forward", fwd), ("backward", bwd)):
        cases += [
            (f"{op} short labels", make(yy=y[:3]), ValueError, "labels"),
            (f"{op} long labels", make(yy=torch.randint(0, v, (n + 2,), device=device)),
             ValueError, "labels"),
            (f"{op} 2-D labels", make(yy=y[None]), ValueError, "labels"),
            (f"{op} float labels", make(yy=y.float()), TypeError, "labels"),
            (f"{op} labels elsewhere", make(yy=y.to(other)), ValueError, "labels"),
            (f"{op} short bias", make(bb=b[:3]), ValueError, "bias"),
            (f"{op} long bias", make(bb=torch.randn(v + 1, device=device)), ValueError, "bias"),
            (f"{op} bias dtype", make(bb=b.half()), TypeError, "bias"),
            (f"{op} bias elsewhere", make(bb=b.to(other)), ValueError, "bias"),
            (f"{op} 3-D hidden", make(hh=h[None]), ValueError, "hidden"),
            (f"{op} float64 hidden", make(hh=h.double(), ww=w.double()), TypeError, "hidden"),
            (f"{op} weight D", make(ww=torch.randn(v, d + 1, device=device)), ValueError, "weight"),
            (f"{op} weight dtype", make(ww=w.half()), TypeError, "weight"),
            (f"{op} weight elsewhere", make(ww=w.to(other)), ValueError, "weight"),
            (f"{op} grad_mask", make(gm=[True, True]), ValueError, "grad_mask"),
            (f"{op} label_smoothing", make(label_smoothing=1.5), ValueError, "label_smoothing"),
            (f"{op} z_loss", make(z_loss=-1.0), ValueError, "z_loss"),
            (f"{op} softcap", make(softcap=-2.0), ValueError, "softcap"),
            (f"{op} softcap inf", make(softcap=float("inf")), ValueError, "softcap"),
            (f"{op} tile_bytes", make(tile_bytes=-1), ValueError, "tile_bytes"),
            (f"{op} vocab_start", make(vocab_start=-1), ValueError, "vocab_start"),
            (f"{op} vocab_total", make(vocab_total=3), ValueError, "vocab_total"),
            (f"{op} shard without a group", make(vocab_start=2, vocab_total=40), ValueError, "group_name"),
            (f"{op} vocab_total without a group", make(vocab_total=40), ValueError, "group_name"),
            (f"{op} backend", make(backend="cudnn"), ValueError, "backend"),
            (f"{op} group_name", make(group_name="no-such-group"), ValueError, "group_name"),
            (f"{op} ignore_index beyond 64 bits", make(ignore_index=2**70), RuntimeError, "ignore_index"),
        ]
    cases += [
        ("forward reduction", fwd(red="avg"), ValueError, "reduction"),
        ("forward num_items shape", fwd(ni=torch.ones(2, device=device)), ValueError, "num_items"),
        ("forward num_items negative", fwd(ni=torch.tensor(-3.0, device=device)), ValueError, "num_items"),
        ("forward num_items nan", fwd(ni=torch.tensor(float("nan"), device=device)), ValueError, "num_items"),
        ("forward num_items inf", fwd(ni=torch.tensor(float("inf"), device=device)), ValueError, "num_items"),
        ("forward num_items bool", fwd(ni=torch.tensor(True, device=device)), TypeError, "num_items"),
        ("backward short lse", bwd(ll=lse[:2]), ValueError, "lse"),
        ("backward long lse", bwd(ll=torch.randn(n + 1, device=device)), ValueError, "lse"),
        ("backward int lse", bwd(ll=lse.long()), TypeError, "lse"),
        ("backward lse elsewhere", bwd(ll=lse.to(other)), ValueError, "lse"),
        ("backward short grad_loss", bwd(gg=g[:1]), ValueError, "grad_loss"),
        ("backward 2-D grad_loss", bwd(gg=g[None]), ValueError, "grad_loss"),
        ("backward grad_loss elsewhere", bwd(gg=g.to(other)), ValueError, "grad_loss"),
    ]
    return cases


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_direct_ops_check_every_input(bd):
    """The documented ops check every size, dtype, device and option themselves (the C++ kernel used to read
    past short labels / bias / lse / grad_loss): a ValueError/TypeError naming the argument, nothing
    computed."""
    backend, device = bd
    for what, call, exc, name in _bad_op_calls(backend, device):
        with pytest.raises(exc, match=name):
            call()
            pytest.fail(f"{what}: no error")


SHORT_4M = r"""
import sys, torch, fused_lce
backend = sys.argv[1]
n, d, v = 4_000_000, 1, 3          # the sizes at which the C++ kernel used to crash (rc 139)
h, w = torch.randn(n, d), torch.randn(v, d)
y, b = torch.randint(0, v, (n,)), torch.randn(v)
from fused_lce.core.types import Options, op_fields
opts = tuple(getattr(Options(backend=backend), k) for k in op_fields("loss"))
calls = {  # the two that crashed first: a crash kills the process, and the test reports its exit status
    "lse": lambda: torch.ops.fused_lce.backward(torch.ones(n), h, w, y, None, torch.zeros(1), None,
                                                "none", *opts, [True, True, False]),
    "grad_loss": lambda: torch.ops.fused_lce.backward(torch.ones(1), h, w, y, None, torch.zeros(n), None,
                                                      "none", *opts, [True, True, False]),
    "labels": lambda: torch.ops.fused_lce.forward(h, w, y[:1], None, None, "mean", *opts,
                                                  [True, True, False]),
    "bias": lambda: torch.ops.fused_lce.forward(h, w, y, b[:1], None, "mean", *opts, [True, True, True]),
}
for name, call in calls.items():
    try:
        call()
        print(name, "NO ERROR", flush=True)
    except ValueError as e:
        print(name, "ValueError", str(e).split(":")[0], flush=True)
"""


@pytest.mark.parametrize("backend", [n for n in ("torch", "cpp") if fused_lce.backend_info()[n]["available"]])
def test_short_inputs_at_4m_rows_raise_in_a_fresh_process(backend):
    """A crash seen once (segfault, rc 139, of the C++ kernel's backward with a short lse / grad_loss at 4M
    rows; garbage from forward with short labels / bias), run in a subprocess so a crash cannot take pytest
    down: each is now a ValueError naming the argument."""
    out = subprocess.run([sys.executable, "-c", SHORT_4M, backend], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, (f"exit status {out.returncode} (-11: segfault)", out.stdout,
                                 out.stderr[-2000:])
    lines = out.stdout.split("\n")
    for name in ("labels", "bias", "lse", "grad_loss"):
        assert f"{name} ValueError {name}" in lines, out.stdout


# ------------------------------------------------------------------------------------------------ autograd
@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_double_backward_raises(bd):
    """create_graph=True used to return a first-order gradient without a graph, silently; now a RuntimeError
    naming fused_lce and the alternative, at backward."""
    backend, device = bd
    h, w, y, b, *_ = _fwd_args(device, "mean", OPT_VARIANTS["all"], backend)
    for reduction in ("mean", "none"):
        loss = fused_lce.linear_cross_entropy(h, w, y, b, backend=backend, reduction=reduction).sum()
        with pytest.raises(RuntimeError, match="fused_lce.*create_graph.*F.cross_entropy"):
            torch.autograd.grad(loss, (h, w), create_graph=True)
        loss = fused_lce.linear_cross_entropy(h, w, y, b, backend=backend, reduction=reduction).sum()
        with pytest.raises(RuntimeError, match="fused_lce"):
            loss.backward(create_graph=True)
    # a first-order backward still works afterwards
    h.grad = None
    fused_lce.linear_cross_entropy(h, w, y, b, backend=backend).backward()
    assert h.grad is not None and torch.isfinite(h.grad).all()


def _plain_loss(h, w, y, b, reduction="mean", **kw):
    return torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w, b).float(), y,
                                             reduction=reduction, **kw)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_torch_func_transforms(bd, seed):
    """torch.func.grad / grad_and_value / vjp / jacrev / vmap and per-sample gradients (vmap of grad) match
    the plain path; they used to fail inside torch ("must override setup_context", "data-dependent control
    flow")."""
    import warnings

    backend, device = bd
    n, d, v = 6, 5, 13
    h = torch.randn(n, d, device=device)
    w = torch.randn(v, d, device=device)
    b = torch.randn(v, device=device)
    y = torch.randint(0, v, (n,), device=device)
    y[2] = -100
    kw = dict(label_smoothing=0.1)
    ours = lambda hh, ww, bb, yy, red="mean": fused_lce.linear_cross_entropy(  # noqa: E731
        hh, ww, yy, bb, backend=backend, reduction=red, **kw)
    plain = lambda hh, ww, bb, yy, red="mean": _plain_loss(hh, ww, yy, bb, red, **kw)  # noqa: E731
    tf = torch.func
    close = lambda a, c: torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. torch's "no batching rule, performance drop"
        for a, c in zip(tf.grad(ours, argnums=(0, 1, 2))(h, w, b, y),
                        tf.grad(plain, argnums=(0, 1, 2))(h, w, b, y)):
            close(a, c)
        (ga, la), (gc, lc) = tf.grad_and_value(ours)(h, w, b, y), tf.grad_and_value(plain)(h, w, b, y)
        close(ga, gc)
        close(la, lc)
        up = torch.rand(n, device=device)
        out_a, vjp_a = tf.vjp(lambda ww: ours(h, ww, b, y, "none"), w)
        out_c, vjp_c = tf.vjp(lambda ww: plain(h, ww, b, y, "none"), w)
        close(out_a, out_c)
        close(vjp_a(up)[0], vjp_c(up)[0])
        close(tf.jacrev(lambda hh: ours(hh, w, b, y, "none"))(h),
              tf.jacrev(lambda hh: plain(hh, w, b, y, "none"))(h))
        hb = torch.randn(3, n, d, device=device)
        yb = torch.randint(0, v, (3, n), device=device)
        close(tf.vmap(ours, in_dims=(0, None, None, 0))(hb, w, b, yb),
              tf.vmap(plain, in_dims=(0, None, None, 0))(hb, w, b, yb))
        per_sample = tf.vmap(tf.grad(ours, argnums=1), in_dims=(0, None, None, 0))(hb, w, b, yb)
        close(per_sample, tf.vmap(tf.grad(plain, argnums=1), in_dims=(0, None, None, 0))(hb, w, b, yb))
        # vmap with the ordinary autograd outside it
        wa, wc = w.clone().requires_grad_(), w.clone().requires_grad_()
        tf.vmap(ours, in_dims=(0, None, None, 0))(hb, wa, b, yb).sum().backward()
        tf.vmap(plain, in_dims=(0, None, None, 0))(hb, wc, b, yb).sum().backward()
        close(wa.grad, wc.grad)
    # label values are still checked under vmap (over the whole batch)
    yb[1, 3] = v
    with pytest.raises(ValueError, match="labels"):
        tf.vmap(ours, in_dims=(0, None, None, 0))(hb, w, b, yb)
    # higher order / forward mode: a clear error naming fused_lce and the plain path
    for call in (lambda: tf.hessian(lambda hh: ours(hh, w, b, y))(h),
                 lambda: tf.grad(lambda hh: tf.grad(ours)(hh, w, b, y).sum())(h),
                 lambda: tf.jvp(lambda hh: ours(hh, w, b, y), (h,), (h,)),
                 lambda: tf.jacfwd(lambda hh: ours(hh, w, b, y))(h)):
        with pytest.raises(RuntimeError, match="fused_lce.*F.cross_entropy"):
            call()


# --------------------------------------------------------------------------------------------- meta / compile
def test_meta_tensors_propagate_shapes():
    """device="meta" through the public API and the ops: shapes (and grads' shapes) propagate, values are not
    checked (they do not exist: .item() used to fail), shapes still are."""
    meta = dict(device="meta")
    h = torch.randn(2, 9, 8, requires_grad=True, **meta)
    w = torch.randn(31, 8, requires_grad=True, **meta)
    b = torch.randn(31, requires_grad=True, **meta)
    y = torch.randint(0, 31, (2, 9), **meta)
    for backend in ("auto", "torch"):
        out = fused_lce.linear_cross_entropy(h, w, y, b, shift=True, reduction="none", return_stats=True,
                                             backend=backend, num_items=torch.tensor(3.0, **meta))
        assert out.loss.shape == (2, 8) and out.loss.device.type == "meta" and out.loss.dtype == torch.float32
        assert out.lse.shape == (2, 8) and out.token_accuracy.shape == ()
        loss = fused_lce.linear_cross_entropy(h, w, y, b, backend=backend, label_smoothing=0.1,
                                              num_items=torch.tensor(3.0, **meta))
        assert loss.shape == () and loss.device.type == "meta"
        gh, gw, gb = torch.autograd.grad(loss, (h, w, b))
        assert gh.shape == h.shape and gw.shape == w.shape and gb.shape == b.shape
        assert gh.device.type == "meta"
        gh, = torch.autograd.grad(out.loss, h, torch.ones(2, 8, **meta))
        assert gh.shape == h.shape
    with pytest.raises(ValueError, match="labels"):
        fused_lce.linear_cross_entropy(h, w, y[:, :-1], b)
    with pytest.raises(ValueError, match="weight"):
        fused_lce.linear_cross_entropy(h, w[:, :4], y, b)
    # the ops directly (FakeTensor/meta kernels)
    h2, w2, y2 = h.detach().reshape(18, 8), w.detach(), y.reshape(18)
    loss, lse, correct, dh, dw, db = torch.ops.fused_lce.forward(h2, w2, y2, b.detach(), None, "sum",
                                                                 *_opts("auto"), [True, True, True])
    assert loss.shape == () and lse.shape == (18,) and correct.dtype == torch.bool
    assert dh.shape == (18, 8) and dw.shape == (31, 8) and db.shape == (31,)
    dh, dw, db = torch.ops.fused_lce.backward(torch.ones(18, **meta), h2, w2, y2, None, lse, None, "none",
                                              *_opts("auto"), [True, False, False])
    assert dh.shape == (18, 8) and dw.numel() == 0
    with pytest.raises(ValueError, match="lse"):
        torch.ops.fused_lce.backward(torch.ones(18, **meta), h2, w2, y2, None, lse[:3], None, "none",
                                     *_opts("auto"), [True, True, False])


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_compile_bad_label_is_nan_and_label_errors_counts_it(bd):
    """Under torch.compile label values are not checked (documented): a bad label gives NaN, and
    fused_lce.label_errors is the check that stays inside the graph (fullgraph=True, no host sync)."""
    backend, device = bd
    torch._dynamo.reset()
    h = torch.randn(2, 6, 8, device=device)
    w = torch.randn(11, 8, device=device)
    y = torch.randint(0, 11, (2, 6), device=device)

    def step(h, w, y):
        loss = fused_lce.linear_cross_entropy(h, w, y, shift=True, backend=backend)
        return loss, fused_lce.label_errors(y, w.shape[0], shift=True)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss, bad = compiled(h, w, y)
    assert torch.isfinite(loss) and bad.item() == 0
    y[1, 3] = 11
    y[0, 0] = 99  # never scored with shift=True: not an error
    loss, bad = compiled(h, w, y)
    assert loss.isnan() and bad.item() == 1
    with pytest.raises(ValueError, match="labels"):
        step(h, w, y)  # eager: checked
    with pytest.raises(TypeError, match="labels"):
        fused_lce.label_errors(y.float(), 11)
    with pytest.raises(ValueError, match="vocab_size"):
        fused_lce.label_errors(y, -1)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_int32_labels_with_a_64_bit_ignore_index(bd, seed):
    """int32 labels and an ignore_index outside the int32 range: no label equals it (none is ignored), through
    the public API and the registered op alike, with the results of the same labels as int64. Compared as
    int32, the index would wrap (2**40 to 0) and label 0 would count as ignored."""
    backend, device = bd
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(9, 8, generator=g).to(device).requires_grad_()
    w = torch.randn(50, 8, generator=g).to(device).requires_grad_()
    y64 = torch.randint(0, 50, (9,), generator=g)
    y64[:3] = 0  # the labels an int32 comparison with 2**40 would take for ignored
    y64, y32 = y64.to(device), y64.to(device, torch.int32)
    ii = 2**40
    res = {}
    for name, y in (("int64", y64), ("int32", y32)):
        out = fused_lce.linear_cross_entropy(h, w, y, ignore_index=ii, backend=backend, return_stats=True)
        grads = torch.autograd.grad(out.loss, (h, w))
        op = torch.ops.fused_lce.forward(h.detach(), w.detach(), y, None, None, "mean",
                                         *_opts(backend, ignore_index=ii), [True, True, False])
        res[name] = (out.loss, out.lse, out.token_accuracy, out.n_valid, *grads, op[0], *op[3:5])
    assert int(res["int32"][3]) == 9
    for a, b in zip(res["int64"], res["int32"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
