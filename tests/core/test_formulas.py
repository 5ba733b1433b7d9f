"""``fused_lce.core.formulas``: the host's reduction scale against the device's formula."""
import random

import torch

from fused_lce.core import formulas


def test_count_scale_is_the_float32_inverse_bit_for_bit(seed):
    """``count_scale`` must give cuBLAS the value the device forms, ``safe_inverse(mean_divisor(...))``, exactly:
    small counts, every power of two and its neighbours, random counts up to 2**24, and None beyond."""
    rng = random.Random(seed)
    counts = list(range(0, 5000)) + [c + k for c in (2**e for e in range(13, 25)) for k in (-1, 0, 1)]
    counts += [rng.randrange(1, 2**24 + 1) for _ in range(20000)]
    counts = [c for c in counts if c <= 2**24]
    div = torch.tensor(counts, dtype=torch.float64).to(torch.float32)  # exact: every count <= 2**24
    want = formulas.safe_inverse(div)
    got = torch.tensor([formulas.count_scale("mean", c) for c in counts], dtype=torch.float32)
    assert torch.equal(got, want)
    assert formulas.count_scale("mean", 2**24 + 1) is None and formulas.count_scale("mean", -1) is None
    assert formulas.count_scale("sum", 7) == 1.0 and formulas.count_scale("none", 7) is None
