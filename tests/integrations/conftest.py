"""Integration tests count fused_lce's work where every public function ends (the driver's forward entries)
and share a tiny random Qwen3."""
from __future__ import annotations

from typing import NamedTuple, Optional

import pytest


class Call(NamedTuple):
    """One forward of the fused op, as the driver saw it."""

    op: str  # "loss" (linear_cross_entropy) or "logprobs" (linear_logprobs)
    reduction: Optional[str]  # the loss op's reduction
    num_items: object  # the loss op's num_items (None: the mean over valid tokens, or patch()'s option probe)
    weight_shape: tuple
    extras: tuple  # the log-prob op's outputs besides log-probs: "entropy", "mean_logit", "sum_sq"
    temperature: Optional[float]


def record_driver_calls(setattr_):
    """Record every driver forward into the returned list; ``setattr_(obj, name, value)`` installs the spies
    (pytest's ``monkeypatch.setattr``, or ``setattr`` in a subprocess)."""
    from fused_lce.core import driver

    calls = []
    loss_forward, logprobs_forward = driver.forward, driver.logprobs_forward

    def forward(hidden, weight, labels, bias, num_items, reduction, opts, group, grad_mask):
        calls.append(Call("loss", reduction, num_items, tuple(weight.shape), (), None))
        return loss_forward(hidden, weight, labels, bias, num_items, reduction, opts, group, grad_mask)

    def logprobs(hidden, weight, labels, bias, opts, group):
        extras = tuple(k for k in ("entropy", "mean_logit", "sum_sq") if getattr(opts, k))
        calls.append(Call("logprobs", None, None, tuple(weight.shape), extras, opts.temperature))
        return logprobs_forward(hidden, weight, labels, bias, opts, group)

    setattr_(driver, "forward", forward)
    setattr_(driver, "logprobs_forward", logprobs)
    return calls


@pytest.fixture
def driver_calls(monkeypatch):
    """The driver forwards made during the test (see :class:`Call`)."""
    return record_driver_calls(monkeypatch.setattr)


def tiny_qwen3(seed, tie, vocab=96):
    """A 2-layer random Qwen3ForCausalLM in training mode (float32), the same for every ``seed``."""
    import torch
    import transformers

    cfg = transformers.Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                                   tie_word_embeddings=tie, pad_token_id=0, bos_token_id=None,
                                   eos_token_id=None)
    torch.manual_seed(seed)
    return transformers.Qwen3ForCausalLM(cfg).float().train()
