"""The conformance suite: every available backend on every device, against the float64 reference of SPEC.md.

Each case draws fresh random inputs (seed printed on failure), runs forward + backward through the public API and
compares the loss and the gradients of hidden, weight and bias with ``fused_lce.reference.reference_loss``.
"""
from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fused_lce
from fused_lce import registry
from fused_lce.backends.base import Options, Problem
from fused_lce.reference import reference_loss

from .conftest import BACKEND_DEVICE, GRAD_TOL, LOSS_TOL, rel_err

TINY = 0.002  # MiB: forces many token blocks and vocabulary tiles
OPTION_SETS = {
    "plain": {},
    "ignore": {"ignore_frac": 0.3},
    "ignore_in_vocab": {"ignore_index": 2, "ignore_frac": 0.2},
    "smooth": {"label_smoothing": 0.1, "ignore_frac": 0.2},
    "zloss": {"z_loss": 0.05},
    "softcap": {"softcap": 3.0},
    "bias": {"bias": True},
    "num_items": {"num_items": 37, "ignore_frac": 0.2},
    "everything": {"label_smoothing": 0.25, "z_loss": 0.02, "softcap": 4.0, "bias": True, "ignore_frac": 0.25},
}


def make_problem(shape, v, dtype, device, *, bias=False, ignore_frac=0.0, ignore_index=-100, scale=1.0):
    *lead, d = shape
    h = (torch.randn(*shape, dtype=torch.float32) * scale).to(dtype).to(device).requires_grad_()
    w = (torch.randn(v, d, dtype=torch.float32) / max(d, 1) ** 0.5 * 2).to(dtype).to(device).requires_grad_()
    b = (torch.randn(v) * 0.5).to(dtype).to(device).requires_grad_() if bias else None
    y = torch.randint(0, max(v, 1), tuple(lead))
    if ignore_frac:
        y[torch.rand(tuple(lead)) < ignore_frac] = ignore_index
    return h, w, y.to(device), b


def check(backend, device, shape, v, dtype, reduction="mean", shift=False, tile=None, upstream=None, **opts):
    ignore_frac = opts.pop("ignore_frac", 0.0)
    use_bias = opts.pop("bias", False)
    scale = opts.pop("scale", 1.0)
    ii = opts.get("ignore_index", -100)
    h, w, y, b = make_problem(shape, v, dtype, device, bias=use_bias, ignore_frac=ignore_frac, ignore_index=ii,
                              scale=scale)
    out = fused_lce.linear_cross_entropy(h, w, y, b, reduction=reduction, shift=shift, backend=backend,
                                         tile_budget_mb=tile, return_stats=True, **opts)
    leaves = [t for t in (h, w, b) if t is not None]
    refs = [t.detach().cpu().double().requires_grad_() for t in leaves]
    rb = refs[2] if b is not None else None
    ref, ref_lse, ref_acc, ref_n = reference_loss(refs[0], refs[1], y.cpu(), rb, reduction=reduction, shift=shift,
                                                  **opts)
    assert out.loss.dtype == torch.float32
    assert out.loss.shape == ref.shape
    g = upstream if upstream is not None else torch.ones_like(out.loss)
    if reduction == "none" and upstream is None and out.loss.numel():
        g = torch.rand_like(out.loss)  # non-uniform upstream gradient exercises the recompute path
    grads = torch.autograd.grad(out.loss, leaves, g, allow_unused=True)
    ref_grads = torch.autograd.grad(ref, refs, g.cpu().double(), allow_unused=True)
    loss_err = (out.loss.detach().cpu().double() - ref.detach()).abs().max() if ref.numel() else 0.0
    mag = ref.detach().abs().max() if ref.numel() else 1.0
    assert float(loss_err) <= LOSS_TOL[dtype] * (1 + float(mag)), (loss_err, mag)
    for name, ours, want, leaf in zip("hwb", grads, ref_grads, leaves):
        assert ours is not None and ours.dtype == leaf.dtype and ours.shape == leaf.shape, name
        assert torch.isfinite(ours).all(), name
        assert rel_err(ours.cpu(), want) <= GRAD_TOL[dtype], (name, rel_err(ours.cpu(), want))
    # statistics
    assert out.n_valid.item() == ref_n.item()
    torch.testing.assert_close(out.lse.cpu().double(), ref_lse.detach(), rtol=1e-4, atol=1e-4)
    if dtype == torch.float32:  # low precision can flip near-ties of the argmax
        assert abs(out.token_accuracy.item() - ref_acc.item()) < 1e-6
    return out


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("opts", list(OPTION_SETS), ids=list(OPTION_SETS))
def test_options(bd, dtype, reduction, opts, seed):
    backend, device = bd
    check(backend, device, (29, 24), 53, dtype, reduction, **dict(OPTION_SETS[opts]))


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
@pytest.mark.parametrize("tile", [TINY, 0.05, None], ids=["tiny", "small", "default"])
@pytest.mark.parametrize("opts", ["plain", "everything"])
def test_tiling(bd, tile, opts, seed):
    """N*V larger than one tile; V not a multiple of any tile; many token blocks."""
    backend, device = bd
    for reduction in ("mean", "none"):
        check(backend, device, (67, 9), 301, torch.float32, reduction, tile=tile, **dict(OPTION_SETS[opts]))


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
@pytest.mark.parametrize("shape,v", [((1, 1), 1), ((1, 5), 7), ((3, 1), 1), ((2, 1), 5), ((5, 3), 1)],
                         ids=["N1D1V1", "N1", "D1V1", "D1", "V1"])
def test_degenerate_sizes(bd, shape, v, seed):
    backend, device = bd
    for reduction in ("mean", "sum", "none"):
        check(backend, device, shape, v, torch.float32, reduction, tile=TINY)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_shift_3d(bd, dtype, seed):
    backend, device = bd
    for reduction in ("mean", "none"):
        out = check(backend, device, (3, 11, 16), 45, dtype, reduction, shift=True, ignore_frac=0.2,
                    label_smoothing=0.1)
        if reduction == "none":
            assert out.loss.shape == (3, 10)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_chunk_size_invariance(bd, seed):
    backend, device = bd
    h, w, y, b = make_problem((50, 12), 97, torch.float32, device, bias=True, ignore_frac=0.2)
    results = []
    for tile in (TINY, 0.01, 0.1, None):
        hh, ww, bb = (t.detach().clone().requires_grad_() for t in (h, w, b))
        loss = fused_lce.linear_cross_entropy(hh, ww, y, bb, backend=backend, tile_budget_mb=tile, z_loss=0.01,
                                              label_smoothing=0.1, softcap=5.0)
        loss.backward()
        results.append([loss.detach()] + [t.grad for t in (hh, ww, bb)])
    for other in results[1:]:
        for a, b_ in zip(results[0], other):
            torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
@pytest.mark.parametrize("n", [0, 6])
def test_all_ignored_and_empty(bd, n, seed):
    """All labels ignored (or N == 0): mean and sum are 0.0 with zero gradients, never NaN."""
    backend, device = bd
    h, w, y, b = make_problem((n, 8), 13, torch.float32, device, bias=True)
    y = torch.full_like(y, -100)
    for reduction in ("mean", "sum"):
        hh, ww, bb = (t.detach().clone().requires_grad_() for t in (h, w, b))
        out = fused_lce.linear_cross_entropy(hh, ww, y, bb, reduction=reduction, backend=backend, return_stats=True)
        assert out.loss.item() == 0.0
        out.loss.backward()
        for t in (hh, ww, bb):
            assert t.grad is not None and not t.grad.isnan().any() and (t.grad == 0).all()
        assert out.n_valid.item() == 0 and out.token_accuracy.item() == 0.0
    hh, ww, bb = (t.detach().clone().requires_grad_() for t in (h, w, b))
    none = fused_lce.linear_cross_entropy(hh, ww, y, bb, reduction="none", backend=backend)
    assert none.shape == (n,) and (none == 0).all()
    grads = torch.autograd.grad(none, (hh, ww, bb), torch.rand_like(none))  # the recompute path, also for N == 0
    for t, g in zip((hh, ww, bb), grads):
        assert g.shape == t.shape and (g == 0).all()


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_accumulation_is_fp32(bd, seed):
    """dW summed over ~500 token blocks of a bf16 problem stays at bf16 output-rounding accuracy; a bf16 running
    sum would drift to several percent."""
    backend, device = bd
    check(backend, device, (4096, 16), 24, torch.bfloat16, "sum", tile=0.0005)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_bad_label_without_validation_is_nan(bd, seed):
    backend, device = bd
    h, w, y, _ = make_problem((9, 8), 11, torch.float32, device)
    y[3] = 11  # == V: out of range
    y[5] = -7
    loss = fused_lce.linear_cross_entropy(h, w, y, reduction="none", validate=False, backend=backend)
    assert loss[3].isnan() and loss[5].isnan()
    good = [i for i in range(9) if i not in (3, 5)]
    ref, *_ = reference_loss(h.detach().double().cpu(), w.detach().double().cpu(), y.cpu().clamp(0, 10),
                             reduction="none")
    torch.testing.assert_close(loss.detach()[good].cpu().double(), ref[good], rtol=1e-5, atol=1e-5)
    mean = fused_lce.linear_cross_entropy(h, w, y, validate=False, backend=backend)
    assert mean.isnan()
    mean.backward()
    assert h.grad.isnan().any()  # a bad label poisons its gradients instead of training silently


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_non_finite_inputs_propagate(bd, seed):
    backend, device = bd
    h, w, y, _ = make_problem((7, 8), 11, torch.float32, device)
    with torch.no_grad():
        h[2, 0] = float("inf")
        w[4, 1] = float("nan")
    loss = fused_lce.linear_cross_entropy(h, w, y, reduction="none", backend=backend)
    plain = torch.nn.functional.cross_entropy((h @ w.t()).detach(), y, reduction="none")
    assert torch.equal(loss.isfinite().cpu(), plain.isfinite().cpu())
    assert not fused_lce.linear_cross_entropy(h, w, y, backend=backend).isfinite()


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_partial_requires_grad_and_int32_labels(bd, seed):
    """A frozen output layer (LoRA fine-tuning) gets no weight gradient work; int32 labels work."""
    backend, device = bd
    h, w, y, _ = make_problem((21, 10), 33, torch.float32, device, ignore_frac=0.2)
    w.requires_grad_(False)
    loss = fused_lce.linear_cross_entropy(h, w, y.to(torch.int32), backend=backend)
    loss.backward()
    assert w.grad is None
    hr = h.detach().double().cpu().requires_grad_()
    ref, *_ = reference_loss(hr, w.double().cpu(), y.cpu())
    ref.backward()
    assert rel_err(h.grad.cpu(), hr.grad) < GRAD_TOL[torch.float32]


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_large_logits_are_stable(bd, seed):
    """Logits of magnitude ~1e4 (no softcap): the online softmax must not overflow."""
    backend, device = bd
    check(backend, device, (17, 8), 29, torch.float32, "mean", scale=3000.0)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(0, 40), d=st.integers(1, 20), v=st.integers(1, 70),
       reduction=st.sampled_from(["mean", "sum", "none"]), smoothing=st.sampled_from([0.0, 0.3, 1.0]),
       z=st.sampled_from([0.0, 0.01]), cap=st.sampled_from([None, 2.0, 30.0]), bias=st.booleans(),
       ignore=st.sampled_from([0.0, 0.5, 1.0]), tile=st.sampled_from([TINY, None]),
       num_items=st.sampled_from([None, 5, 0]))
def test_random_problems(bd, n, d, v, reduction, smoothing, z, cap, bias, ignore, tile, num_items):
    backend, device = bd
    torch.manual_seed(n * 7919 + d * 104729 + v)
    check(backend, device, (n, d), v, torch.float32, reduction, tile=tile, label_smoothing=smoothing, z_loss=z,
          softcap=cap, bias=bias, ignore_frac=ignore, num_items=num_items)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
def test_zero_hidden_size(bd, seed):
    """D == 0: every logit is the bias (or 0), so the loss is that of a constant row. A provider may decline the
    problem (its supports() says why): then an explicit request raises that reason and auto runs it elsewhere."""
    backend, device = bd
    p = Problem(5, 0, 7, torch.float32, torch.device(device), True, Options())
    declined = registry.why_not(backend, p)
    for use_bias in (False, True):
        if declined is None:
            check(backend, device, (5, 0), 7, torch.float32, "mean", bias=use_bias)
            continue
        h, w, y, b = make_problem((5, 0), 7, torch.float32, device, bias=use_bias)
        with pytest.raises(ValueError, match=re.escape(declined)):
            fused_lce.linear_cross_entropy(h, w, y, b, backend=backend)
        check("auto", device, (5, 0), 7, torch.float32, "mean", bias=use_bias)


@pytest.mark.parametrize("bd", BACKEND_DEVICE)
@pytest.mark.parametrize("tile", [TINY, None], ids=["tiny", "default"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_masked_first_vocabulary_tiles(bd, tile, reduction, seed):
    """A -inf bias over the first 200 vocabulary entries (a masked vocabulary): the online softmax starts on rows
    whose running max is -inf for several whole tiles, which must not become NaN (F.cross_entropy is finite)."""
    backend, device = bd
    h, w, _, b = make_problem((13, 8), 301, torch.float32, device, bias=True)
    with torch.no_grad():
        b[:200] = -math.inf
    y = torch.randint(200, 301, (13,))
    y[::4] = -100
    y = y.to(device)
    loss = fused_lce.linear_cross_entropy(h, w, y, b, backend=backend, tile_budget_mb=tile, reduction=reduction)
    hr, wr, br = (t.detach().cpu().double().requires_grad_() for t in (h, w, b))
    ref = torch.nn.functional.cross_entropy(hr @ wr.t() + br, y.cpu(), reduction=reduction)
    assert torch.isfinite(loss).all()
    torch.testing.assert_close(loss.detach().cpu().double(), ref.detach(), rtol=1e-5, atol=1e-5)
    g = torch.rand_like(loss)
    grads = torch.autograd.grad(loss, (h, w, b), g)
    ref_grads = torch.autograd.grad(ref, (hr, wr, br), g.cpu().double())
    for name, ours, want in zip("hwb", grads, ref_grads):
        assert torch.isfinite(ours).all(), name
        assert rel_err(ours.cpu(), want) <= GRAD_TOL[torch.float32], (name, rel_err(ours.cpu(), want))
