"""Every error of SPEC.md raises ValueError/TypeError naming the argument; the module form and
backend_info."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import torch

import fused_lce
from fused_lce import linear_cross_entropy as lce
from fused_lce.core.formulas import reference_logits

from .support import options_block


def _p(n=6, d=4, v=9, dtype=torch.float32):
    return torch.randn(n, d, dtype=dtype), torch.randn(v, d, dtype=dtype), torch.randint(0, v, (n,))


ERROR_CASES = [
    # (description, kwargs-transform, exception type, text that must appear)
    ("mismatched D", lambda h, w, y: dict(hidden=h, weight=torch.randn(9, 5), labels=y),
     ValueError, "weight"),
    ("weight not 2-D", lambda h, w, y: dict(hidden=h, weight=torch.randn(9), labels=y), ValueError, "weight"),
    ("labels shape", lambda h, w, y: dict(hidden=h, weight=w, labels=y[:-1]), ValueError, "labels"),
    ("float labels", lambda h, w, y: dict(hidden=h, weight=w, labels=y.float()), TypeError, "labels"),
    ("bool labels", lambda h, w, y: dict(hidden=h, weight=w, labels=y > 0), TypeError, "labels"),
    ("label too large", lambda h, w, y: dict(hidden=h, weight=w, labels=torch.full_like(y, 9)),
     ValueError, "labels"),
    ("negative label", lambda h, w, y: dict(hidden=h, weight=w, labels=torch.full_like(y, -3)),
     ValueError, "labels"),
    ("reduction", lambda h, w, y: dict(hidden=h, weight=w, labels=y, reduction="avg"), ValueError,
     "reduction"),
    ("backend", lambda h, w, y: dict(hidden=h, weight=w, labels=y, backend="cudnn"), ValueError, "backend"),
    ("smoothing < 0", lambda h, w, y: dict(hidden=h, weight=w, labels=y, label_smoothing=-0.1), ValueError,
     "label_smoothing"),
    ("smoothing > 1", lambda h, w, y: dict(hidden=h, weight=w, labels=y, label_smoothing=1.5), ValueError,
     "label_smoothing"),
    ("smoothing nan", lambda h, w, y: dict(hidden=h, weight=w, labels=y, label_smoothing=float("nan")),
     ValueError, "label_smoothing"),
    ("negative z_loss", lambda h, w, y: dict(hidden=h, weight=w, labels=y, z_loss=-1e-4),
     ValueError, "z_loss"),
    ("zero softcap", lambda h, w, y: dict(hidden=h, weight=w, labels=y, softcap=0.0), ValueError, "softcap"),
    ("negative softcap", lambda h, w, y: dict(hidden=h, weight=w, labels=y, softcap=-2.0),
     ValueError, "softcap"),
    ("bias shape", lambda h, w, y: dict(hidden=h, weight=w, labels=y, bias=torch.randn(8)),
     ValueError, "bias"),
    ("bias dtype", lambda h, w, y: dict(hidden=h, weight=w, labels=y,
                                        bias=torch.randn(9, dtype=torch.float64)),
     TypeError, "bias"),
    ("shift without sequence",
     lambda h, w, y: dict(hidden=h[0], weight=w, labels=y[0], shift=True), ValueError, "shift"),
    ("int hidden", lambda h, w, y: dict(hidden=h.long(), weight=w, labels=y), TypeError, "hidden"),
    ("float64 hidden", lambda h, w, y: dict(hidden=h.double(), weight=w.double(), labels=y),
     TypeError, "hidden"),
    ("weight dtype", lambda h, w, y: dict(hidden=h, weight=w.half(), labels=y), TypeError, "weight"),
    ("hidden not a tensor", lambda h, w, y: dict(hidden=h.tolist(), weight=w, labels=y), TypeError, "hidden"),
    ("num_items shape", lambda h, w, y: dict(hidden=h, weight=w, labels=y, num_items=torch.ones(2)),
     ValueError, "num_items"),
    ("num_items negative", lambda h, w, y: dict(hidden=h, weight=w, labels=y, num_items=-1), ValueError,
     "num_items"),
    ("num_items type", lambda h, w, y: dict(hidden=h, weight=w, labels=y, num_items="8"), TypeError,
     "num_items"),
    ("ignore_index type", lambda h, w, y: dict(hidden=h, weight=w, labels=y, ignore_index=1.5), TypeError,
     "ignore_index"),
    ("tile budget", lambda h, w, y: dict(hidden=h, weight=w, labels=y, tile_budget_mb=0), ValueError,
     "tile_budget_mb"),
    ("sequence_parallel without group",
     lambda h, w, y: dict(hidden=h, weight=w, labels=y, sequence_parallel=True), ValueError, "process_group"),
]


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_errors_name_the_argument(case):
    _, make, exc, text = case
    h, w, y = _p()
    with pytest.raises(exc, match=text):
        lce(**make(h, w, y))


def test_unavailable_backend_says_why():
    h, w, y = _p()
    for name, info in fused_lce.backend_info().items():
        if name == "auto" or info["available"]:
            continue
        with pytest.raises(ValueError, match=name) as e:
            lce(h, w, y, backend=name)
        assert info["reason"] in str(e.value)


def test_backend_on_wrong_device_says_why():
    h, w, y = _p()
    info = fused_lce.backend_info()
    for name in ("triton", "npu_cann", "npu"):
        if info[name]["available"]:  # only reachable on hosts with those devices
            with pytest.raises(ValueError, match="device"):
                lce(h, w, y, backend=name)


def test_env_override(monkeypatch):
    h, w, y = _p()
    monkeypatch.setenv("FUSED_LCE_BACKEND", "nonsense")
    with pytest.raises(ValueError, match="FUSED_LCE_BACKEND"):
        lce(h, w, y)
    monkeypatch.setenv("FUSED_LCE_BACKEND", "torch")
    ref = lce(h, w, y, backend="torch")
    torch.testing.assert_close(lce(h, w, y), ref)


def test_valid_ignore_index_inside_vocab_is_not_an_error():
    h, w, y = _p()
    y[0] = 3
    y[1:] = torch.where(y[1:] == 3, torch.zeros_like(y[1:]), y[1:])
    per = lce(h, w, y, ignore_index=3, reduction="none")
    plain = torch.nn.functional.cross_entropy(h @ w.t(), y, ignore_index=3, reduction="none")
    assert per[0] == 0.0
    torch.testing.assert_close(per, plain)


def test_label_checks_are_one_check():
    """The API, label_errors and the op reject non-integer labels with one message; the API's range check, the
    loss's NaN and label_errors find the same bad labels (int32 labels with a 64-bit ignore_index too)."""
    h, w, y = _p(n=5)
    messages = set()
    for call in (lambda: lce(h, w, y.float()), lambda: fused_lce.label_errors(y.float(), 9),
                 lambda: torch.ops.fused_lce.forward(h, w, y.float(), None, None, "mean", *options_block(),
                                                     [False, False, False])):
        with pytest.raises(TypeError, match="labels") as e:
            call()
        messages.add(str(e.value))
    assert len(messages) == 1, messages
    for dtype, ii in ((torch.int64, -100), (torch.int32, -100), (torch.int32, 2**32 + 9)):
        y = torch.tensor([0, 9, -100, 2**31 - 1, -1], dtype=dtype)  # 9 is 2**32 + 9 wrapped to int32
        bad = [False, True, ii != -100, True, True]
        assert int(fused_lce.label_errors(y, 9, ignore_index=ii)) == sum(bad)
        per = lce(h, w, y, ignore_index=ii, reduction="none", validate=False)
        assert per.isnan().tolist() == bad
        with pytest.raises(ValueError, match=r"labels: expected values in \[0, 9\) or ignore_index"):
            lce(h, w, y, ignore_index=ii)


def test_module_form_and_repr():
    h, w, y = _p()
    mod = fused_lce.LinearCrossEntropy(reduction="sum", label_smoothing=0.1)
    torch.testing.assert_close(mod(h, w, y), lce(h, w, y, reduction="sum", label_smoothing=0.1))
    assert "label_smoothing=0.1" in repr(mod)
    with pytest.raises(TypeError, match="smoothing"):
        fused_lce.LinearCrossEntropy(smoothing=0.1)


def test_backend_info_shape():
    info = fused_lce.backend_info()
    assert info["torch"]["available"] and info["auto"]["cpu"] in ("cpp", "torch")
    for name in ("cpp", "triton", "npu", "npu_cann"):
        assert name in info
        assert info[name]["available"] or isinstance(info[name]["reason"], str) and info[name]["reason"]


def test_autocast_promotes_like_f_linear():
    h, w, y = _p()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = lce(h, w, y)
    ref = lce(h.bfloat16(), w.bfloat16(), y)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref)


# ------------------------------------------------------------------------------------------------ more errors
def test_more_errors_name_the_argument():
    h, w, y = _p()
    cases = [
        (dict(shift=2), TypeError, "shift"),
        (dict(shift=1), TypeError, "shift"),
        (dict(shift="yes"), TypeError, "shift"),
        (dict(validate=1), TypeError, "validate"),
        (dict(ignore_index=2**70), ValueError, "ignore_index"),
        (dict(ignore_index=True), TypeError, "ignore_index"),
        (dict(num_items=torch.tensor(-7.0)), ValueError, "num_items"),
        (dict(num_items=torch.tensor(float("nan"))), ValueError, "num_items"),
        (dict(num_items=float("inf")), ValueError, "num_items"),
        (dict(num_items=True), TypeError, "num_items"),
        (dict(tile_budget_mb=-1), ValueError, "tile_budget_mb"),
        (dict(tile_budget_mb=float("nan")), ValueError, "tile_budget_mb"),
        (dict(z_loss=float("inf")), ValueError, "z_loss"),
        (dict(softcap=float("inf")), ValueError, "softcap"),
        (dict(label_smoothing="0.1"), TypeError, "label_smoothing"),
        (dict(reduction=None), ValueError, "reduction"),
        (dict(backend=None), ValueError, "backend"),
    ]
    for kw, exc, name in cases:
        with pytest.raises(exc, match=name):
            lce(h, w, y, **kw)
        with pytest.raises(exc, match=name):  # the module form checks its options on every call
            fused_lce.LinearCrossEntropy(**kw)(h, w, y)
    with pytest.raises(ValueError, match="weight"):
        lce(h, w.to("meta"), y)  # a tensor on another device is named
    with pytest.raises(ValueError, match="labels"):
        lce(h, w, y.to("meta"))


# (kwargs, exception, the name the message must contain): values that used to give wrong numbers
EDGE_CASES = [
    (dict(softcap=1e-50), ValueError, "softcap"),  # 0 in float32: the kernels read it as "off"
    (dict(softcap=1e39), ValueError, "softcap"),  # inf in float32
    (dict(num_items=1e-300), ValueError, "num_items"),  # 0 in float32: the loss became 0
    (dict(num_items=torch.tensor(1e-300, dtype=torch.float64)), ValueError, "num_items"),
    (dict(num_items=10**400), ValueError, "num_items"),  # OverflowError in float()
    (dict(num_items=torch.tensor(3.0, device="meta")), ValueError, "num_items"),  # no value to read
    (dict(process_group="abc"), TypeError, "process_group"),
    (dict(process_group=object()), TypeError, "process_group"),
    (dict(process_group="abc", sequence_parallel=True), TypeError, "process_group"),
]
LOGPROB_EDGE_CASES = [
    (dict(temperature=1e-40), ValueError, "temperature"),  # 1 / T is inf in float32: log-probs were inf
    (dict(temperature=1e39), ValueError, "temperature"),
    (dict(softcap=1e-50), ValueError, "softcap"),
    (dict(process_group="abc"), TypeError, "process_group"),
    (dict(return_entropy=1), TypeError, "return_entropy"),
]


@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: next(iter(c[0])) if isinstance(c, tuple)
                                                 else str(c))
def test_extreme_scalars_and_wrong_types_are_rejected(case):
    kw, exc, name = case
    h, w, y = _p()
    with pytest.raises(exc, match=name):
        lce(h, w, y, **kw)


@pytest.mark.parametrize("case", LOGPROB_EDGE_CASES, ids=lambda c: next(iter(c[0])) if isinstance(c, tuple)
                         else str(c))
def test_logprob_extreme_scalars_are_rejected(case):
    kw, exc, name = case
    h, w, y = _p()
    with pytest.raises(exc, match=name):
        fused_lce.linear_logprobs(h, w, y, **kw)


def test_smallest_accepted_scalars_give_the_reference():
    """The edges of the accepted ranges still compute the right numbers: a normal-float32 softcap (every logit
    saturates to +-softcap), a tiny temperature (log-probs of the sharpened distribution), a tiny
    num_items."""
    h, w, y = _p()
    z = reference_logits(h, w)
    cap = 2.0**-126
    zc = reference_logits(h, w, softcap=cap)
    want = torch.nn.functional.cross_entropy(zc, y, reduction="none")
    torch.testing.assert_close(lce(h, w, y, softcap=cap, reduction="none").double(), want,
                               rtol=1e-6, atol=1e-6)
    t = 1e-3
    lp = fused_lce.linear_logprobs(h, w, y, temperature=t)
    want_lp = torch.log_softmax(z / t, -1).gather(1, y[:, None])[:, 0]
    torch.testing.assert_close(lp.double(), want_lp, rtol=1e-5, atol=1e-2)  # |z / T| ~ 1e3: float32 logits
    # a tiny divisor scales the float32 loss up (beyond float32's range it is inf, as in the plain float32
    # path)
    want = torch.nn.functional.cross_entropy(z, y, reduction="sum") / 1e-30
    torch.testing.assert_close(lce(h, w, y, num_items=1e-30).double(), want, rtol=1e-6, atol=0.0)


def test_forward_mode_ad_is_refused():
    import torch.autograd.forward_ad as fwad

    h, w, y = _p()
    with fwad.dual_level():
        hd = fwad.make_dual(h, torch.randn_like(h))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            lce(hd, w, y)
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            fused_lce.linear_logprobs(hd, w, y)
        wd = fwad.make_dual(w, torch.randn_like(w))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            lce(h, wd, y)
        assert torch.isfinite(lce(h, w, y))  # a dual level alone (no tangent on our inputs) is fine


def test_vmap_over_an_empty_batch_says_so():
    h, w, y = _p()
    f = lambda hh, yy: lce(hh, w, yy)  # noqa: E731
    with pytest.raises(ValueError, match="vmap over a dimension of size 0"):
        torch.func.vmap(f)(h[None][:0], y[None][:0])
    with pytest.raises(ValueError, match="vmap over a dimension of size 0"):  # only the labels batched
        torch.func.vmap(lambda yy: lce(h, w, yy))(y[None][:0])
    with pytest.raises(ValueError, match="vmap over a dimension of size 0"):  # the inner of two
        hb, yb = h[None, None].expand(2, 0, -1, -1), y[None, None].expand(2, 0, -1)
        torch.func.vmap(torch.func.vmap(f))(hb, yb)
    torch.testing.assert_close(torch.func.vmap(f)(h[None].expand(2, -1, -1), y[None].expand(2, -1)),
                               lce(h, w, y).expand(2))


@pytest.mark.parametrize("name", ["npu", "triton", "npu_cann"])
def test_backend_variable_names_itself_when_unusable(monkeypatch, name):
    if fused_lce.backend_info()[name]["available"]:
        pytest.skip(f"{name} is available here")
    monkeypatch.setenv("FUSED_LCE_BACKEND", name)
    h, w, y = _p()
    with pytest.raises(ValueError, match=f"FUSED_LCE_BACKEND='{name}' \\(set in the environment\\).*unset "
                                         "FUSED_LCE_BACKEND"):
        lce(h, w, y)


@pytest.mark.parametrize("value", ["abc", "-1", "0", "1e999", "nan"])
def test_tile_env_is_read_once_by_the_api(monkeypatch, value):
    h, w, y = _p()
    monkeypatch.setenv("FUSED_LCE_TILE_MB", value)
    with pytest.raises(ValueError, match="FUSED_LCE_TILE_MB") as e:
        lce(h, w, y)
    assert repr(value) in str(e.value)  # the text as set


def test_docstrings_name_every_argument_and_point_to_the_contract():
    """help() stays short, names every argument and points to docs/spec.md, which holds the errors and what
    torch.compile / torch.func / double backward do."""
    for fn in (fused_lce.linear_cross_entropy, fused_lce.linear_logprobs):
        doc = fn.__doc__
        assert "docs/spec.md" in doc and len(doc.splitlines()) <= 25, fn.__name__
        for name in inspect.signature(fn).parameters:
            assert name in doc, (fn.__name__, name)
    assert "linear_cross_entropy" in fused_lce.LinearCrossEntropy.__doc__
    assert "torch.compile" in fused_lce.label_errors.__doc__
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "spec.md")) as f:
        spec = f.read()
    for text in ("TypeError", "ValueError", "OutOfMemoryError", "MiB", "torch.compile", "torch.func",
                 "create_graph", "label_errors", "vmap", "autocast", "first-order"):
        assert text in spec, text


OOM_SCRIPT = r"""
import resource, sys, torch, fused_lce
torch.set_num_threads(1)
backend = sys.argv[1]
n, d, v = 512, 4, 500_000
g = torch.Generator().manual_seed(0)
h = torch.randn(n, d, generator=g, requires_grad=True)
w = (torch.randn(v, d, generator=g) * 0.5).requires_grad_()
y = torch.randint(0, v, (n,), generator=g)
fused_lce.linear_cross_entropy(h[:8], w, y[:8], backend=backend).backward()  # lazy initialisation first
h.grad = w.grad = None
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
limit = vm + 160 * 2**20  # inputs 8 MiB, accumulators 8 MiB: room for small tiles, not for 512 x 500k logits
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    fused_lce.linear_cross_entropy(h, w, y, backend=backend, tile_budget_mb=4096).backward()
    print("NO ERROR")
except RuntimeError as e:
    print("TYPE", type(e).__name__)
    print("MESSAGE", str(e).replace("\n", " "))
h.grad = w.grad = None
loss = fused_lce.linear_cross_entropy(h, w, y, backend=backend, tile_budget_mb=8)
loss.backward()
print("SMALL", loss.item(), bool(torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all()))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                    reason="needs Linux /proc for the address-space limit")
@pytest.mark.parametrize("backend", [n for n in ("torch", "cpp") if fused_lce.backend_info()[n]["available"]])
def test_out_of_memory_names_the_tile_budget(backend):
    """Under a small address-space limit (RLIMIT_AS, fresh process), a tile budget too large for the memory
    left raises the allocator's error type (RuntimeError on CPU, torch.OutOfMemoryError on CUDA) with a
    message naming fused_lce, the sizes and the tile budget to lower; the same problem with a small budget
    then runs."""
    out = subprocess.run([sys.executable, "-c", OOM_SCRIPT, backend], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, (out.stdout, out.stderr[-3000:])
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert lines.get("TYPE") == "RuntimeError", out.stdout
    msg = lines["MESSAGE"]
    assert msg.startswith("fused_lce: out of memory"), msg
    for text in ("tile_budget_mb", "FUSED_LCE_TILE_MB", "N=512", "V=500000", "D=4", "4096.0 MiB",
                 "can't allocate memory"):
        assert text in msg, (text, msg)
    loss, finite = lines["SMALL"].split()
    # ~log(500k) = 13.1 for random logits
    assert 12.0 < float(loss) < 15.5 and finite == "True", lines["SMALL"]


@pytest.mark.cuda
def test_cuda_out_of_memory_names_the_tile_budget():
    """CUDA: the caching allocator limited to a small fraction of the GPU; torch.OutOfMemoryError is re-raised
    as torch.OutOfMemoryError with the fused_lce message."""
    dev = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(dev).total_memory
    n, d, v = 4096, 16, 200_000
    h = torch.randn(n, d, device=dev, requires_grad=True)
    w = torch.randn(v, d, device=dev, requires_grad=True)
    y = torch.randint(0, v, (n,), device=dev)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    frac = (torch.cuda.memory_allocated(dev) + 200 * 2**20) / total
    torch.cuda.set_per_process_memory_fraction(frac, dev)
    try:
        for backend in [b for b in ("torch", "triton") if fused_lce.backend_info()[b]["available"]]:
            with pytest.raises(torch.OutOfMemoryError, match="fused_lce: out of memory.*tile_budget_mb"):
                fused_lce.linear_cross_entropy(h, w, y, backend=backend, tile_budget_mb=8192).backward()
            h.grad = w.grad = None
            fused_lce.linear_cross_entropy(h, w, y, backend=backend, tile_budget_mb=16).backward()
            assert torch.isfinite(h.grad).all()
            h.grad = w.grad = None
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
        torch.cuda.empty_cache()
