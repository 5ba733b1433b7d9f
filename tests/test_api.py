"""Every error of SPEC.md raises ValueError/TypeError naming the argument; the module form and backend_info."""
from __future__ import annotations

import pytest
import torch

import fused_lce
from fused_lce import linear_cross_entropy as lce


def _p(n=6, d=4, v=9, dtype=torch.float32):
    return torch.randn(n, d, dtype=dtype), torch.randn(v, d, dtype=dtype), torch.randint(0, v, (n,))


ERROR_CASES = [
    # (description, kwargs-transform, exception type, text that must appear)
    ("mismatched D", lambda h, w, y: dict(hidden=h, weight=torch.randn(9, 5), labels=y), ValueError, "weight"),
    ("weight not 2-D", lambda h, w, y: dict(hidden=h, weight=torch.randn(9), labels=y), ValueError, "weight"),
    ("labels shape", lambda h, w, y: dict(hidden=h, weight=w, labels=y[:-1]), ValueError, "labels"),
    ("float labels", lambda h, w, y: dict(hidden=h, weight=w, labels=y.float()), TypeError, "labels"),
    ("bool labels", lambda h, w, y: dict(hidden=h, weight=w, labels=y > 0), TypeError, "labels"),
    ("label too large", lambda h, w, y: dict(hidden=h, weight=w, labels=torch.full_like(y, 9)), ValueError, "labels"),
    ("negative label", lambda h, w, y: dict(hidden=h, weight=w, labels=torch.full_like(y, -3)), ValueError, "labels"),
    ("reduction", lambda h, w, y: dict(hidden=h, weight=w, labels=y, reduction="avg"), ValueError, "reduction"),
    ("backend", lambda h, w, y: dict(hidden=h, weight=w, labels=y, backend="cudnn"), ValueError, "backend"),
    ("smoothing < 0", lambda h, w, y: dict(hidden=h, weight=w, labels=y, label_smoothing=-0.1), ValueError,
     "label_smoothing"),
    ("smoothing > 1", lambda h, w, y: dict(hidden=h, weight=w, labels=y, label_smoothing=1.5), ValueError,
     "label_smoothing"),
    ("smoothing nan", lambda h, w, y: dict(hidden=h, weight=w, labels=y, label_smoothing=float("nan")), ValueError,
     "label_smoothing"),
    ("negative z_loss", lambda h, w, y: dict(hidden=h, weight=w, labels=y, z_loss=-1e-4), ValueError, "z_loss"),
    ("zero softcap", lambda h, w, y: dict(hidden=h, weight=w, labels=y, softcap=0.0), ValueError, "softcap"),
    ("negative softcap", lambda h, w, y: dict(hidden=h, weight=w, labels=y, softcap=-2.0), ValueError, "softcap"),
    ("bias shape", lambda h, w, y: dict(hidden=h, weight=w, labels=y, bias=torch.randn(8)), ValueError, "bias"),
    ("bias dtype", lambda h, w, y: dict(hidden=h, weight=w, labels=y, bias=torch.randn(9, dtype=torch.float64)),
     TypeError, "bias"),
    ("shift without sequence", lambda h, w, y: dict(hidden=h[0], weight=w, labels=y[0], shift=True), ValueError,
     "shift"),
    ("int hidden", lambda h, w, y: dict(hidden=h.long(), weight=w, labels=y), TypeError, "hidden"),
    ("float64 hidden", lambda h, w, y: dict(hidden=h.double(), weight=w.double(), labels=y), TypeError, "hidden"),
    ("weight dtype", lambda h, w, y: dict(hidden=h, weight=w.half(), labels=y), TypeError, "weight"),
    ("hidden not a tensor", lambda h, w, y: dict(hidden=h.tolist(), weight=w, labels=y), TypeError, "hidden"),
    ("num_items shape", lambda h, w, y: dict(hidden=h, weight=w, labels=y, num_items=torch.ones(2)), ValueError,
     "num_items"),
    ("num_items negative", lambda h, w, y: dict(hidden=h, weight=w, labels=y, num_items=-1), ValueError, "num_items"),
    ("num_items type", lambda h, w, y: dict(hidden=h, weight=w, labels=y, num_items="8"), TypeError, "num_items"),
    ("ignore_index type", lambda h, w, y: dict(hidden=h, weight=w, labels=y, ignore_index=1.5), TypeError,
     "ignore_index"),
    ("tile budget", lambda h, w, y: dict(hidden=h, weight=w, labels=y, tile_budget_mb=0), ValueError,
     "tile_budget_mb"),
    ("sequence_parallel without group", lambda h, w, y: dict(hidden=h, weight=w, labels=y, sequence_parallel=True),
     ValueError, "process_group"),
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
