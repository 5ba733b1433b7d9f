"""Dense float64 reference of the SPEC semantics (materialises the logits: small problems only).
Used by the tests and by ``fused-lce bench`` for error columns; never by a backend."""
from __future__ import annotations

from typing import Optional

import torch


def reference_loss(hidden, weight, labels, bias=None, *, ignore_index=-100, reduction="mean",
                   label_smoothing=0.0, z_loss=0.0, softcap: Optional[float] = None, shift=False, num_items=None,
                   dtype=torch.float64):
    """Loss of SPEC.md computed in ``dtype`` (float64 by default), differentiable w.r.t. its float inputs.
    Returns (loss, per_token_lse, token_accuracy, n_valid)."""
    h = hidden.to(dtype)
    w = weight.to(dtype)
    y = labels.long()
    if shift:
        h = h[..., :-1, :]
        y = y[..., 1:]
    z = h @ w.t()
    if bias is not None:
        z = z + bias.to(dtype)
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    lse = torch.logsumexp(z, dim=-1)
    valid = y != ignore_index
    safe = torch.where(valid, y, torch.zeros_like(y))
    zt = z.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    per = (1 - label_smoothing) * (lse - zt) + label_smoothing * (lse - z.mean(-1)) + z_loss * lse**2
    per = torch.where(valid, per, torch.zeros_like(per))
    n_valid = valid.sum()
    if z.shape[-1] > 0 and z.numel() > 0:
        acc = ((z.argmax(-1) == y) & valid).sum().to(dtype) / n_valid.clamp(min=1)
    else:
        acc = torch.zeros((), dtype=dtype)
    if reduction == "none":
        loss = per
    elif reduction == "sum":
        loss = per.sum()
    else:
        div = torch.as_tensor(num_items if num_items is not None else n_valid, dtype=dtype)
        loss = per.sum() / div if float(div) > 0 else per.sum() * 0
    return loss, lse, acc, n_valid
