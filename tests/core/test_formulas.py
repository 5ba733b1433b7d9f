"""``fused_lce.core.formulas``: the host's reduction scale against the device's formula; the float64
references of the providers' statistics and coefficient-form gradients against the loss's own reference."""
import random

import pytest
import torch

from fused_lce.core import formulas

COUNTS = 2**24  # every count a float32 holds exactly: count_scale's domain


def _device_inverse(device):
    """The device's scale for every count 1..2**24: ``safe_inverse`` of the float32 count."""
    return formulas.safe_inverse(torch.arange(1, COUNTS + 1, device=device).to(torch.float32)).cpu()


def test_count_scale_is_the_float32_inverse_bit_for_bit(seed):
    """``count_scale`` must give cuBLAS the value the device forms, ``safe_inverse(mean_divisor(...))``,
    exactly: small counts, every power of two and its neighbours, and random counts up to 2**24 through its
    own code; and for every count, the float64 quotient rounded to float32 (what it computes) against
    float32's own."""
    rng = random.Random(seed)
    counts = list(range(0, 5000)) + [c + k for c in (2**e for e in range(13, 25)) for k in (-1, 0, 1)]
    counts = [c for c in counts + [rng.randrange(1, COUNTS + 1) for _ in range(20000)] if c <= COUNTS]
    want = formulas.safe_inverse(torch.tensor(counts, dtype=torch.float64).to(torch.float32))
    assert torch.equal(torch.tensor([formulas.count_scale("mean", c) for c in counts], dtype=torch.float32),
                       want)
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


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_reference_coef_grads_of_the_loss_coefs_are_the_loss_gradient(softcap, seed):
    """The coefficient-form gradient (what a provider's ``grads`` adds) of ``loss_coefs`` is the autograd
    gradient of ``reference_loss``, with label smoothing, z-loss, a bias, an ignored token and two vocabulary
    shards."""
    from fused_lce.core.types import Options

    n, d, v, vs = 9, 5, 13, 6
    h, w, b = torch.randn(n, d, dtype=torch.float64), torch.randn(v, d, dtype=torch.float64), torch.randn(v)
    y = torch.randint(0, v, (n,))
    y[2] = -100
    leaves = [x.detach().double().requires_grad_() for x in (h, w, b)]
    loss, lse, _, _ = formulas.reference_loss(*leaves[:2], y, leaves[2], reduction="sum", label_smoothing=0.2,
                                              z_loss=0.01, softcap=softcap)
    want = torch.autograd.grad(loss, leaves)
    opts = Options(label_smoothing=0.2, z_loss=0.01, softcap=softcap or 0.0, vocab_total=v)
    coefs = formulas.loss_coefs(lse, (y != -100).double(), opts, v)
    shards = [formulas.reference_coef_grads(h, w[a:c], y, lse, coefs, b[a:c], vocab_start=a, softcap=softcap)
              for a, c in ((0, vs), (vs, v))]
    torch.testing.assert_close(shards[0][0] + shards[1][0], want[0])
    torch.testing.assert_close(torch.cat([shards[0][1], shards[1][1]]), want[1])
    torch.testing.assert_close(torch.cat([shards[0][2], shards[1][2]]), want[2])


def test_reference_stats_of_shards_merge_to_the_whole(seed):
    """Per-shard statistics (-inf logits included: a whole masked shard) merged as the vocab-parallel combine
    merges them give the statistics of the whole vocabulary; ``s`` and ``ez`` give the lse and the entropy."""
    from fused_lce.core.distributed import merge_stats

    n, d, v = 7, 4, 12
    h, w, b = torch.randn(n, d), torch.randn(v, d), torch.randn(v)
    b[4:8] = -float("inf")
    y = torch.randint(0, v, (n,))
    whole = formulas.reference_stats(h, w, y, b, temperature=0.7)
    parts = [formulas.reference_stats(h, w[a:c], y, b[a:c], vocab_start=a, temperature=0.7)
             for a, c in ((0, 4), (4, 8), (8, 12))]
    masked = parts[1]
    assert torch.all(masked.m == -float("inf")) and torch.all(masked.s == 0) and torch.all(masked.ez == 0)
    merged = merge_stats(*(torch.stack(f) for f in zip(*parts)))
    for got, want in zip(merged, whole):
        torch.testing.assert_close(got, want)
    z = formulas.reference_logits(h, w, b, temperature=0.7)
    torch.testing.assert_close(whole.m + whole.s.log(), torch.logsumexp(z, 1))
    _, entropy = formulas.reference_logprobs(h, w, y, b, temperature=0.7)
    torch.testing.assert_close(whole.s.log() - whole.ez / whole.s, entropy)
