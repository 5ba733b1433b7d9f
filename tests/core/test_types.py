"""``fused_lce.core.types``: the token weights' lifetime."""
import torch

from fused_lce.core import TokenWeights


def test_token_weights_form_once_and_release_keeps_the_scale():
    calls = []
    g, scale = torch.tensor([1.0, 0.0, 2.0]), torch.tensor(0.5)
    tw = TokenWeights(g != 0, lambda: calls.append(1) or (g, scale))
    assert calls == []  # nothing formed until asked
    assert tw.get()[0] is g and tw.get()[1] is scale and calls == [1]
    tw.release()
    got_g, got_scale = tw.get()
    assert got_g is None and got_scale is scale and calls == [1]


def test_release_before_get_forms_the_scale():
    tw = TokenWeights(torch.ones(2, dtype=torch.bool), lambda: (torch.ones(2), torch.tensor(3.0)))
    tw.release()
    assert tw.get()[0] is None and float(tw.get()[1]) == 3.0
