"""linear_logprobs: per-token log-probs and entropy on every provider that implements them, against float64.

Each case draws fresh inputs (the ``seed`` fixture), runs ``fused_lce.linear_logprobs`` forward and backward
with random upstream gradients on BOTH outputs, and compares values and the gradients of hidden, weight and
bias with a float64 reference that materialises the logits. Providers that do not implement the log-prob
contract yet must decline it with a reason (and ``auto`` must fall back); the ops pass opcheck and trace with
torch.compile.
"""
from __future__ import annotations

import math

import pytest
import torch

import fused_lce
from fused_lce.core import Coefs, Options, Problem, registry
from fused_lce.core.formulas import reference_logits, reference_logprob_extras
from fused_lce.core.formulas import reference_logprobs as reference
from fused_lce.backends.torch import TorchProvider

from ..conftest import BACKEND_DEVICE, GRAD_TOL, LOSS_TOL, rel_err
from ..support import options_block

TINY = 0.002  # MiB: many token blocks and vocabulary tiles


def _supports(bd) -> bool:
    name, dev = bd.values[0]
    p = Problem(8, 8, 8, torch.float32, torch.device(dev), False, Options(), op="logprobs")
    return registry.why_not(name, p) is None


LP_BACKENDS = [bd for bd in BACKEND_DEVICE if _supports(bd)]
DECLINING = [bd for bd in BACKEND_DEVICE if not _supports(bd)]


def make(shape, v, dtype, device, *, bias=False, ignore_frac=0.0, ignore_index=-100, scale=1.0, ignored=()):
    """Random inputs; ``ignored``: flat token positions whose label is ``ignore_index`` whatever the draw."""
    *lead, d = shape
    h = (torch.randn(*shape) * scale).to(dtype).to(device).requires_grad_()
    w = (torch.randn(v, d) * 2 / max(d, 1) ** 0.5).to(dtype).to(device).requires_grad_()
    b = (torch.randn(v) * 0.5).to(dtype).to(device).requires_grad_() if bias else None
    y = torch.randint(0, max(v, 1), tuple(lead))
    if ignore_frac:
        y[torch.rand(tuple(lead)) < ignore_frac] = ignore_index
    y.view(-1)[list(ignored)] = ignore_index
    return h, w, y.to(device), b


def logit_magnitude(h, w, b, softcap=None, temperature=1.0, **_) -> float:
    """max |z| of the tempered logits: log-probs and entropies are differences of terms this large (lse, the
    target logit, E_p[z]), so their float32 rounding scales with it, not with their own size."""
    z = reference_logits(h.detach().reshape(-1, h.shape[-1]), w.detach(), None if b is None else b.detach(),
                         softcap=softcap, temperature=temperature)
    return float(z.abs().max()) if z.numel() else 0.0


def close(ours, ref, dtype, what, zmag=0.0):
    mag = max(float(ref.abs().max()), zmag) if ref.numel() else 1.0
    err = float((ours.detach().cpu().double() - ref).abs().max()) if ref.numel() else 0.0
    assert err <= LOSS_TOL[dtype] * (1 + mag), (what, err, mag)


def check(backend, device, shape, v, dtype, *, tile=None, entropy=True, bias=False, ignore_frac=0.0,
          ignore_index=-100, temperature=1.0, softcap=None, scale=1.0, ignored=()):
    h, w, y, b = make(shape, v, dtype, device, bias=bias, ignore_frac=ignore_frac, ignore_index=ignore_index,
                      scale=scale, ignored=ignored)
    kw = dict(temperature=temperature, softcap=softcap, ignore_index=ignore_index)
    out = fused_lce.linear_logprobs(h, w, y, b, return_entropy=entropy, backend=backend,
                                    tile_budget_mb=tile, **kw)
    lp, ent = out if entropy else (out, None)
    leaves = [t for t in (h, w, b) if t is not None]
    refs = [t.detach().cpu().double().requires_grad_() for t in leaves]
    rlp, rent = reference(refs[0], refs[1], y.cpu(), refs[2] if b is not None else None, **kw)
    assert lp.dtype == torch.float32 and lp.shape == y.shape
    zmag = logit_magnitude(refs[0], refs[1], refs[2] if b is not None else None, **kw)
    close(lp, rlp.detach(), dtype, "logprob", zmag)
    g_lp = torch.randn(y.shape)
    objective, ref_objective = (lp * g_lp.to(device)).sum(), (rlp * g_lp.double()).sum()
    if entropy:
        assert ent.dtype == torch.float32 and ent.shape == y.shape
        close(ent, rent.detach(), dtype, "entropy", zmag)
        g_ent = torch.randn(y.shape)
        objective = objective + (ent * g_ent.to(device)).sum()
        ref_objective = ref_objective + (rent * g_ent.double()).sum()
    grads = torch.autograd.grad(objective, leaves)
    ref_grads = torch.autograd.grad(ref_objective, refs)
    for name, ours, want, leaf in zip("hwb", grads, ref_grads, leaves):
        assert ours.dtype == leaf.dtype and ours.shape == leaf.shape, name
        assert torch.isfinite(ours).all(), name
        assert rel_err(ours.cpu(), want) <= GRAD_TOL[dtype], (name, rel_err(ours.cpu(), want))
    valid = y != ignore_index
    assert (lp[~valid] == 0).all() and (entropy is False or (ent[~valid] == 0).all())
    return lp, ent, grads, y


OPTION_SETS = {
    "plain": {},
    "cold": {"temperature": 0.7},
    "hot": {"temperature": 1.3},
    "softcap": {"softcap": 3.0},
    "softcap_temperature": {"softcap": 2.5, "temperature": 0.7},
    "bias": {"bias": True, "temperature": 1.3},
    "ignore": {"ignore_frac": 0.3},
    "ignore_in_vocab": {"ignore_index": 2, "ignore_frac": 0.2},
    "peaked": {"scale": 6.0, "temperature": 0.7},  # near-one-hot p: entropy small next to lse
    "everything": {"softcap": 4.0, "temperature": 0.7, "bias": True, "ignore_frac": 0.25},
}


@pytest.mark.parametrize("opts", list(OPTION_SETS), ids=list(OPTION_SETS))
@pytest.mark.parametrize("bd", LP_BACKENDS)
def test_options_fp32(bd, opts, seed):
    backend, device = bd
    for tile in (None, TINY):
        for entropy in (True, False):
            check(backend, device, (37, 24), 301, torch.float32, tile=tile, entropy=entropy,
                  **OPTION_SETS[opts])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("bd", LP_BACKENDS)
def test_low_precision(bd, dtype, seed):
    backend, device = bd
    for opts in ("plain", "everything"):
        for tile in (None, TINY):
            check(backend, device, (29, 32), 257, dtype, tile=tile, **OPTION_SETS[opts])


@pytest.mark.parametrize("bd", LP_BACKENDS)
def test_odd_shapes(bd, seed):
    """Leading dims, D and V not multiples of any vector width, a vocabulary of one, N=1."""
    backend, device = bd
    check(backend, device, (3, 7, 19), 101, torch.float32, tile=TINY, temperature=1.3, softcap=5.0)
    check(backend, device, (1, 5), 1, torch.float32, temperature=0.7)
    check(backend, device, (1, 17), 33, torch.float32, bias=True)
    check(backend, device, (5, 1), 65, torch.float32, tile=TINY)


@pytest.mark.parametrize("bd", LP_BACKENDS)
def test_only_one_output_differentiated(bd, seed):
    """The gradient of the entropy alone (log-probs unused) and of the log-probs alone (entropy returned but
    unused), against the reference."""
    backend, device = bd
    h, w, y, b = make((23, 16), 97, torch.float32, device, bias=True, ignore_frac=0.2)
    refs = [t.detach().cpu().double().requires_grad_() for t in (h, w, b)]
    rlp, rent = reference(*refs[:2], y.cpu(), refs[2], temperature=0.7, softcap=3.0)
    for k in (0, 1):
        out = fused_lce.linear_logprobs(h, w, y, b, temperature=0.7, softcap=3.0, return_entropy=True,
                                        backend=backend)
        g = torch.rand(y.shape)
        ours = torch.autograd.grad((out[k] * g.to(device)).sum(), (h, w, b))
        want = torch.autograd.grad(((rlp, rent)[k] * g.double()).sum(), refs, retain_graph=True)
        for a, c in zip(ours, want):
            assert rel_err(a.cpu(), c) <= GRAD_TOL[torch.float32]


@pytest.mark.parametrize("bd", LP_BACKENDS)
def test_ignored_bad_and_empty(bd, seed):
    """ignore_index gives exact zeros (values and dX rows); a label outside [0, V) with validate=False gives
    NaN values and poisons its gradients, never an out-of-bounds read; all ignored and N = 0 give zeros /
    empty."""
    backend, device = bd
    h, w, y, b = make((12, 8), 30, torch.float32, device, bias=True)
    y[2], y[5], y[7], y[9] = 30, -5, 2**40, -100
    lp, ent = fused_lce.linear_logprobs(h, w, y, b, return_entropy=True, validate=False, backend=backend)
    bad = torch.zeros(12, dtype=torch.bool)
    bad[[2, 5, 7]] = True
    assert lp[bad].isnan().all() and ent[bad].isnan().all()
    assert lp[~bad].isfinite().all() and ent[~bad].isfinite().all() and lp[9] == 0 and ent[9] == 0
    (lp.sum() + ent.sum()).backward()
    assert h.grad[2].isnan().all() and h.grad[0].isfinite().all() and (h.grad[9] == 0).all()
    with pytest.raises(ValueError, match="labels"):
        fused_lce.linear_logprobs(h, w, y, b, backend=backend)
    # all ignored
    for t in (h, w, b):
        t.grad = None
    y[:] = -100
    lp, ent = fused_lce.linear_logprobs(h, w, y, b, return_entropy=True, temperature=0.5, backend=backend)
    assert (lp == 0).all() and (ent == 0).all()
    (lp.sum() + ent.sum()).backward()
    assert all((t.grad == 0).all() for t in (h, w, b))
    # no tokens
    h0 = torch.zeros(0, 8, device=device, requires_grad=True)
    lp, ent = fused_lce.linear_logprobs(h0, w, y[:0], b, return_entropy=True, backend=backend)
    assert lp.shape == (0,) and ent.shape == (0,)
    (lp.sum() + ent.sum()).backward()
    assert h0.grad.shape == (0, 8) and (w.grad == 0).all()


@pytest.mark.parametrize("bd", LP_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_ignored_tokens_with_large_logits(bd, dtype, seed):
    """Ignored tokens whose tempered logits are far beyond exp's float32 range (~88): large logits, or a low
    temperature (normal in RL): the lse saved for them is 0 (the contract), so a backward that forms
    exp(z - lse) before their coefficient 0 masks them gets inf * 0 = NaN in their dX rows and in dW / db.
    Their outputs and dX rows are exactly 0, the rest against float64."""
    backend, device = bd
    for scale, temperature in ((300.0, 1.0), (3.0, 0.02)):
        for entropy in (False, True):
            for tile in (None, TINY):
                _lp, _ent, grads, y = check(backend, device, (19, 8), 41, dtype, tile=tile, entropy=entropy,
                                            bias=True, ignore_frac=0.3, scale=scale, temperature=temperature,
                                            ignored=(2, 7))
                assert (grads[0][y == -100] == 0).all()


# from the bottom of the range Options accepts to its top. Not a softcap small against the logits but not
# tiny: it saturates most of them, where 1 - tanh^2 has float32's absolute accuracy, not a relative one (as
# autograd's tanh backward), and this file's tolerance is relative; the loss suite (tolerances that count it)
# covers those
SOFTCAPS = [2.0**-126, 0.5, 30.0, 1e4, 1e6, 1e30, 3.4028234663852886e38]


@pytest.mark.parametrize("bd", LP_BACKENDS)
@pytest.mark.parametrize("softcap", SOFTCAPS, ids=lambda c: f"{c:.3g}")
def test_softcap_whole_range(bd, softcap, seed):
    """Softcaps across the range Options accepts, with a temperature, against float64 (log-probs, entropy and
    gradients): a large softcap leaves the logits as they are (cpp used to flatten them all to 0)."""
    backend, device = bd
    for temperature in (1.0, 0.7):
        check(backend, device, (23, 12), 97, torch.float32, bias=True, ignore_frac=0.2, softcap=softcap,
              temperature=temperature)


@pytest.mark.parametrize("bd", LP_BACKENDS)
@pytest.mark.parametrize("mask", ["tiles", "scattered"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_masked_vocabulary(bd, mask, dtype, seed):
    """-inf logits (a masked bias) over whole tiles or scattered: finite log-probs and entropy (0 log 0 = 0),
    and every gradient finite and right -- a -inf logit contributes exactly 0, to db too."""
    backend, device = bd
    h, w, y, b = make((11, 8), 300, dtype, device, bias=True)
    with torch.no_grad():
        masked = torch.arange(300) < 200 if mask == "tiles" else torch.rand(300) < 0.6
        b[masked.to(device)] = -math.inf
    allowed = (~masked).nonzero()[:, 0]
    y = allowed[torch.randint(0, allowed.numel(), (11,))].to(device)
    for temperature in (1.0, 1.3):
        lp, ent = fused_lce.linear_logprobs(h, w, y, b, return_entropy=True, temperature=temperature,
                                            backend=backend, tile_budget_mb=TINY)
        refs = [t.detach().cpu().double().requires_grad_() for t in (h, w, b)]
        rlp, rent = reference(refs[0], refs[1], y.cpu(), refs[2], temperature=temperature)
        close(lp, rlp.detach(), dtype, "logprob")
        close(ent, rent.detach(), dtype, "entropy")
        g = torch.randn(11)
        ours = torch.autograd.grad((lp * g.to(device) + ent).sum(), (h, w, b))
        want = torch.autograd.grad((rlp * g.double() + rent).sum(), refs)
        for name, a, c in zip("hwb", ours, want):
            assert torch.isfinite(a).all(), name
            assert rel_err(a.cpu(), c.nan_to_num(0.0)) <= GRAD_TOL[dtype], (name, rel_err(a.cpu(), c))
        assert (ours[2][masked.to(device)] == 0).all()  # a -inf logit has p = 0: no gradient at all


@pytest.mark.parametrize("bd", LP_BACKENDS)
def test_matches_the_loss(bd, seed):
    """-logprob is the per-token cross-entropy of the loss path (same statistics, temperature 1)."""
    backend, device = bd
    h, w, y, b = make((19, 12), 77, torch.float32, device, bias=True, ignore_frac=0.2)
    lp = fused_lce.linear_logprobs(h, w, y, b, softcap=3.0, backend=backend)
    ce = fused_lce.linear_cross_entropy(h, w, y, b, softcap=3.0, reduction="none", backend=backend)
    torch.testing.assert_close(-lp, ce, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bd", LP_BACKENDS)
def test_extra_outputs(bd, seed):
    """TRL's fused-head metrics: mean logit, is_top1 and log sum p^2, against float64, with softcap,
    temperature, bias, ignored labels and a tile budget that splits the vocabulary; asked for one at a time or
    together."""
    backend, device = bd
    h, w, y, b = make((23, 16), 211, torch.float32, device, bias=True, ignore_frac=0.25)
    kw = dict(temperature=0.7, softcap=4.0)
    refs = [t.detach().cpu().double() for t in (h, w, b)]
    mean, top1, sq = reference_logprob_extras(refs[0], refs[1], y.cpu(), refs[2], **kw)
    lp_ref, ent_ref = reference(refs[0], refs[1], y.cpu(), refs[2], **kw)
    zmag = logit_magnitude(*refs, **kw)
    for tile in (None, TINY):
        out = fused_lce.linear_logprobs(h, w, y, b, return_entropy=True, backend=backend, tile_budget_mb=tile,
                                        extra_outputs=("mean_logit", "is_top1", "log_sum_sq_probs"), **kw)
        assert isinstance(out, fused_lce.LogprobsOutput)
        close(out.logprobs, lp_ref, torch.float32, "logprob", zmag)
        close(out.entropy, ent_ref, torch.float32, "entropy", zmag)
        close(out.mean_logit, mean, torch.float32, "mean_logit", zmag)
        close(out.log_sum_sq_probs, sq, torch.float32, "log_sum_sq_probs", zmag)
        assert out.is_top1.dtype == torch.bool and torch.equal(out.is_top1.cpu(), top1)
        assert not out.mean_logit.requires_grad and not out.log_sum_sq_probs.requires_grad
    only = fused_lce.linear_logprobs(h, w, y, b, backend=backend, extra_outputs=("is_top1",), **kw)
    assert only.entropy is None and only.mean_logit is None and only.log_sum_sq_probs is None
    assert torch.equal(only.is_top1.cpu(), top1)
    with pytest.raises(ValueError, match="extra_outputs"):
        fused_lce.linear_logprobs(h, w, y, extra_outputs=("logits",))
    with pytest.raises(TypeError, match="extra_outputs"):
        fused_lce.linear_logprobs(h, w, y, extra_outputs="is_top1")


@pytest.mark.parametrize("bd", LP_BACKENDS)
def test_opcheck(bd, seed):
    backend, device = bd
    h, w, y, b = make((11, 8), 37, torch.float32, device, bias=True, ignore_frac=0.2)
    h, w, b = h.detach(), w.detach(), b.detach()
    plain = options_block("logprobs", softcap=3.0, backend=backend, temperature=0.7)
    opts = options_block("logprobs", softcap=3.0, backend=backend, temperature=0.7, entropy=True,
                         mean_logit=True, sum_sq=True)
    torch.library.opcheck(torch.ops.fused_lce.logprobs, (h, w, y, b, *opts))
    torch.library.opcheck(torch.ops.fused_lce.logprobs, (h, w, y, None, *plain))
    _lp, _ent, lse, zmean, *_ = torch.ops.fused_lce.logprobs(h, w, y, b, *opts)
    g1, g2 = torch.randn(11, device=device), torch.randn(11, device=device)
    torch.library.opcheck(torch.ops.fused_lce.logprobs_backward, (h, w, y, b, lse, zmean, g1, g2, *opts,
                                                                  [True, True, True]))
    torch.library.opcheck(torch.ops.fused_lce.logprobs_backward, (h, w, y, b, lse, zmean, None, g2, *opts,
                                                                  [True, False, True]))
    torch.library.opcheck(torch.ops.fused_lce.logprobs_backward, (h, w, y, b, lse, zmean, g1, None, *opts,
                                                                  [False, True, False]))


@pytest.mark.parametrize("bd", LP_BACKENDS)
def test_torch_func_transforms(bd, seed):
    """torch.func.grad / grad_and_value / vjp / jacrev / vmap and per-sample gradients (vmap of grad) of the
    log-probs and the entropy match the plain path (they used to fail inside torch: "must override the
    setup_context staticmethod"); hessian, grad of grad and forward mode raise an error naming fused_lce and
    the plain path."""
    import warnings

    backend, device = bd
    n, d, v = 6, 5, 13
    h, w, b = (torch.randn(n, d, device=device), torch.randn(v, d, device=device),
               torch.randn(v, device=device))
    y = torch.randint(0, v, (n,), device=device)
    y[2] = -100
    g = torch.randn(n, device=device)

    def ours(hh, ww, bb, yy, entropy=False):
        lp, ent = fused_lce.linear_logprobs(hh, ww, yy, bb, temperature=0.7, softcap=3.0, return_entropy=True,
                                            backend=backend)
        return (ent if entropy else lp) * g

    def plain(hh, ww, bb, yy, entropy=False):
        lp, ent = reference(hh, ww, yy, bb, temperature=0.7, softcap=3.0, dtype=torch.float32)
        return (ent if entropy else lp) * g

    tf = torch.func
    close = lambda a, c: torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)  # noqa: E731
    total = lambda f, entropy=False: lambda *a: f(*a, entropy=entropy).sum()  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. torch's "no batching rule, performance drop"
        for entropy in (False, True):
            got = tf.grad(total(ours, entropy), argnums=(0, 1, 2))(h, w, b, y)
            for a, c in zip(got, tf.grad(total(plain, entropy), argnums=(0, 1, 2))(h, w, b, y)):
                close(a, c)
        (ga, la), (gc, lc) = (tf.grad_and_value(total(ours))(h, w, b, y),
                              tf.grad_and_value(total(plain))(h, w, b, y))
        close(ga, gc)
        close(la, lc)
        up = torch.rand(n, device=device)
        out_a, vjp_a = tf.vjp(lambda ww: ours(h, ww, b, y, True), w)
        out_c, vjp_c = tf.vjp(lambda ww: plain(h, ww, b, y, True), w)
        close(out_a, out_c)
        close(vjp_a(up)[0], vjp_c(up)[0])
        close(tf.jacrev(lambda hh: ours(hh, w, b, y))(h), tf.jacrev(lambda hh: plain(hh, w, b, y))(h))
        hb = torch.randn(3, n, d, device=device)
        yb = torch.randint(0, v, (3, n), device=device)
        close(tf.vmap(ours, in_dims=(0, None, None, 0))(hb, w, b, yb),
              tf.vmap(plain, in_dims=(0, None, None, 0))(hb, w, b, yb))
        per_sample = tf.vmap(tf.grad(total(ours), argnums=1), in_dims=(0, None, None, 0))(hb, w, b, yb)
        close(per_sample, tf.vmap(tf.grad(total(plain), argnums=1), in_dims=(0, None, None, 0))(hb, w, b, yb))
    for call in (lambda: tf.hessian(lambda hh: total(ours)(hh, w, b, y))(h),
                 lambda: tf.grad(lambda hh: tf.grad(total(ours))(hh, w, b, y).sum())(h),
                 lambda: tf.jvp(lambda hh: ours(hh, w, b, y), (h,), (h,)),
                 lambda: tf.jacfwd(lambda hh: ours(hh, w, b, y))(h)):
        with pytest.raises(RuntimeError, match="fused_lce.*log_softmax"):
            call()


@pytest.mark.parametrize("bd", LP_BACKENDS)
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_compile_fullgraph(bd, compiler, seed):
    """A GRPO-style objective around linear_logprobs traces without graph breaks and matches eager."""
    backend, device = bd
    torch._dynamo.reset()
    h = torch.randn(2, 7, 16, device=device, requires_grad=True)
    w = torch.randn(31, 16, device=device, requires_grad=True)
    y = torch.randint(0, 31, (2, 7), device=device)
    y[0, :3] = -100
    adv = torch.randn(2, 1, device=device)

    def f(h, w, y):
        lp, ent = fused_lce.linear_logprobs(torch.relu(h), w, y, temperature=0.7, return_entropy=True,
                                            backend=backend)
        return -(adv * lp).mean() - 0.01 * ent.mean()

    loss_c = torch.compile(f, fullgraph=True, backend=compiler)(h, w, y)
    gh_c, gw_c = torch.autograd.grad(loss_c, (h, w))
    loss_e = f(h, w, y)
    gh_e, gw_e = torch.autograd.grad(loss_e, (h, w))
    torch.testing.assert_close(loss_c, loss_e)
    torch.testing.assert_close(gh_c, gh_e)
    torch.testing.assert_close(gw_c, gw_e)


def test_errors():
    h, w, y = torch.randn(4, 3), torch.randn(5, 3), torch.zeros(4, dtype=torch.long)
    for bad in (0.0, -1.0, math.inf, math.nan, 1e-320):
        with pytest.raises(ValueError, match="temperature"):
            fused_lce.linear_logprobs(h, w, y, temperature=bad)
    for bad in ("1", True, None):
        with pytest.raises(TypeError, match="temperature"):
            fused_lce.linear_logprobs(h, w, y, temperature=bad)
    with pytest.raises(TypeError, match="return_entropy"):
        fused_lce.linear_logprobs(h, w, y, return_entropy=1)
    with pytest.raises(ValueError, match="softcap"):
        fused_lce.linear_logprobs(h, w, y, softcap=0.0)
    with pytest.raises(ValueError, match="weight"):
        fused_lce.linear_logprobs(h, torch.randn(5, 4), y)
    with pytest.raises(ValueError, match="labels"):
        fused_lce.linear_logprobs(h, w, y[:3])
    with pytest.raises(TypeError, match="labels"):
        fused_lce.linear_logprobs(h, w, y.float())
    with pytest.raises(ValueError, match="labels"):
        fused_lce.linear_logprobs(h, w, y + 5)
    with pytest.raises(ValueError, match="bias"):
        fused_lce.linear_logprobs(h, w, y, torch.randn(4))
    with pytest.raises(ValueError, match="backend"):
        fused_lce.linear_logprobs(h, w, y, backend="nope")
    with pytest.raises(ValueError, match="tile_budget_mb"):
        fused_lce.linear_logprobs(h, w, y, tile_budget_mb=0)
    # the ops check their own inputs
    opts = options_block("logprobs")
    with pytest.raises(ValueError, match="temperature"):
        torch.ops.fused_lce.logprobs(h, w, y, None, *options_block("logprobs", temperature=-2.0))
    with pytest.raises(ValueError, match="labels"):
        torch.ops.fused_lce.logprobs(h, w, y[:2], None, *opts)
    lp, _, lse, zmean, *_ = torch.ops.fused_lce.logprobs(h, w, y, None, *opts)
    with pytest.raises(ValueError, match="grad_entropy"):
        torch.ops.fused_lce.logprobs_backward(h, w, y, None, lse, zmean, None, torch.ones(4), *opts,
                                              [True, True, False])
    with pytest.raises(ValueError, match="grad_logprob"):
        torch.ops.fused_lce.logprobs_backward(h, w, y, None, lse, zmean, torch.ones(3), None, *opts,
                                              [True, True, False])
    # double backward is refused, not silently wrong
    hh = h.clone().requires_grad_()
    out = fused_lce.linear_logprobs(hh, w, y)
    (gh,) = torch.autograd.grad(out.sum(), hh, create_graph=False)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(fused_lce.linear_logprobs(hh, w, y).sum(), hh, create_graph=True)


class _NoLogprobs(TorchProvider):
    """The torch kernels behind a provider that has not opted into the log-prob contract (as npu_cann): its
    ``grads`` sees only the loss's coefficients (no ``b``)."""

    name = "no_logprobs"
    supports_logprobs = False

    def grads(self, t, rows, lse, coef, scale, opts, out, cache=None):
        assert isinstance(coef, Coefs) and coef.b is None  # the loss's coefficients only
        super().grads(t, rows, lse, coef, scale, opts, out, cache)


def test_providers_without_logprobs_decline(monkeypatch, seed):
    """A provider without supports_logprobs declines linear_logprobs with a reason when asked by name, auto
    falls back to the next provider, and its loss still runs."""
    p = _NoLogprobs()
    registry.register(p)
    try:
        h, w, y, b = make((9, 8), 41, torch.float32, "cpu", bias=True, ignore_frac=0.2)
        with pytest.raises(ValueError, match="backend='no_logprobs' is not available: .*does not implement "
                                             "linear_logprobs"):
            fused_lce.linear_logprobs(h, w, y, b, backend="no_logprobs")
        loss = fused_lce.linear_cross_entropy(h, w, y, b, backend="no_logprobs", label_smoothing=0.1,
                                              z_loss=0.01, reduction="none")
        ref = fused_lce.linear_cross_entropy(h, w, y, b, backend="torch", label_smoothing=0.1, z_loss=0.01,
                                             reduction="none")
        g = torch.rand(9)
        ours = torch.autograd.grad((loss * g).sum(), (h, w, b))
        want = torch.autograd.grad((ref * g).sum(), (h, w, b))
        torch.testing.assert_close(loss, ref)
        for a, c in zip(ours, want):
            torch.testing.assert_close(a, c)
        monkeypatch.setitem(registry.AUTO_ORDER, "cpu", ("no_logprobs", "torch"))
        calls = []
        orig = TorchProvider.stats
        monkeypatch.setattr(TorchProvider, "stats",
                            lambda self, *a, **k: calls.append(self.name) or orig(self, *a, **k))
        fused_lce.linear_logprobs(h, w, y, b, backend="auto")
        assert calls == ["torch"]
    finally:
        registry.unregister(p.name)
    # the providers of this host that have not implemented the contract yet (their helpers add it) do the same
    for backend, device in (bd.values[0] for bd in DECLINING):
        h, w = torch.randn(4, 8, device=device), torch.randn(9, 8, device=device)
        y = torch.zeros(4, dtype=torch.long, device=device)
        with pytest.raises(ValueError, match="does not implement linear_logprobs"):
            fused_lce.linear_logprobs(h, w, y, backend=backend)
        torch.testing.assert_close(fused_lce.linear_logprobs(h, w, y),
                                   fused_lce.linear_logprobs(h, w, y, backend="torch"))




def test_grpo_example_runs():
    """examples/grpo_qwen.py at a small size: the GRPO loss and every parameter's gradient agree between the
    fused log-prob head and the logits path (with part of the batch clipped), and its memory part runs."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "examples", "grpo_qwen.py")
    spec = importlib.util.spec_from_file_location("grpo_qwen", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = \
        mod.compare(mod.parse_args(["--vocab-size", "512", "--hidden-size", "32", "--completion-len", "12"]))
    assert res["ok"] and res["grad_rel_diff"] < 1e-4 and 0 < res["clipped_fraction"] < 1, res
    args = mod.parse_args(["--tokens", "64", "--head-hidden", "16", "--head-vocab", "700"])
    rows = mod.memory(args)
    # both paths against the float64 values of the same inputs: ours tightly; the plain float32 logits path
    # once printed an entropy sum 1.4e-5 (relative) off inside the full suite, so it gets 1e-4
    from fused_lce.tools.bench import make_inputs

    h, w, y = make_inputs(args.tokens, args.head_hidden, args.head_vocab, torch.float32, "cpu",
                          seed=args.seed)
    lp = torch.log_softmax((h.double() @ w.double().t()) / args.temperature, -1)
    keep = y != -100
    ref_lp = float(torch.where(keep, lp.gather(-1, y.clamp(min=0)[:, None]).squeeze(-1), 0.0).sum())
    ref_ent = float(torch.where(keep, -(lp.exp() * lp).sum(-1), 0.0).sum())
    for path, rel in (("fused", 1e-5), ("logits", 1e-4)):
        assert rows[path]["logp_sum"] == pytest.approx(ref_lp, rel=rel), (path, rows)
        assert rows[path]["entropy_sum"] == pytest.approx(ref_ent, rel=rel), (path, rows)
