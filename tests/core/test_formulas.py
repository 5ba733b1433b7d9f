"""``fused_lce.core.formulas``: the host's reduction scale against the device's formula."""
import random

import pytest
import torch

from fused_lce.core import formulas

COUNTS = 2**24  # every count a float32 holds exactly: count_scale's domain


def _device_inverse(device):
    """The device's scale for every count 1..2**24: ``safe_inverse`` of the float32 count."""
    return formulas.safe_inverse(torch.arange(1, COUNTS + 1, device=device).to(torch.float32)).cpu()


def test_count_scale_is_the_float32_inverse_bit_for_bit(seed):
    """``count_scale`` must give cuBLAS the value the device forms, ``safe_inverse(mean_divisor(...))``, exactly:
    small counts, every power of two and its neighbours, and random counts up to 2**24 through its own code; and
    for every count, the float64 quotient rounded to float32 (what it computes) against float32's own."""
    rng = random.Random(seed)
    counts = list(range(0, 5000)) + [c + k for c in (2**e for e in range(13, 25)) for k in (-1, 0, 1)]
    counts = [c for c in counts + [rng.randrange(1, COUNTS + 1) for _ in range(20000)] if c <= COUNTS]
    want = formulas.safe_inverse(torch.tensor(counts, dtype=torch.float64).to(torch.float32))
    assert torch.equal(torch.tensor([formulas.count_scale("mean", c) for c in counts], dtype=torch.float32), want)
    double = (1.0 / torch.arange(1, COUNTS + 1, dtype=torch.float64)).to(torch.float32)
    assert torch.equal(double, _device_inverse("cpu"))
    assert formulas.count_scale("mean", COUNTS + 1) is None and formulas.count_scale("mean", -1) is None
    assert formulas.count_scale("sum", 7) == 1.0 and formulas.count_scale("none", 7) is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_count_scale_matches_the_cuda_inverse():
    """The scale the CUDA device forms, for every count, equals the host's (float64 quotient -> float32)."""
    double = (1.0 / torch.arange(1, COUNTS + 1, dtype=torch.float64)).to(torch.float32)
    assert torch.equal(double, _device_inverse("cuda"))
