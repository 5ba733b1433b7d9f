"""The one interface every backend implements.

A backend receives 2-D problems that the public API has already validated and flattened:
``hidden (N, D)``, ``weight (V_local, D)``, ``labels (N,)`` (global vocabulary ids), ``bias (V_local,)`` or None.
It never reduces over tokens; the op layer (``fused_lce.ops``) does the reduction, the dX all-reduce across a
vocab-parallel group, and the autograd wiring, so every backend shares those semantics by construction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch


@dataclass(frozen=True)
class Config:
    """Loss options, normalised. ``softcap == 0`` means off; ``group_name == ""`` means one device."""

    ignore_index: int = -100
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    softcap: float = 0.0
    tile_bytes: int = 0  # 0: the backend's default
    group_name: str = ""
    vocab_start: int = 0  # first global vocabulary id held by this rank's weight shard
    vocab_total: int = 0  # global vocabulary size (== V_local on one device)


class ForwardResult(NamedTuple):
    loss: torch.Tensor  # (N,) float32 per-token loss; 0 where ignored, NaN where the label is out of range
    lse: torch.Tensor  # (N,) float32 global log-sum-exp
    correct: torch.Tensor  # (N,) bool: valid token whose (first) argmax logit is the label
    grad_hidden: Optional[torch.Tensor]  # (N, D); float32 when a group is set (all-reduced later), else hidden.dtype
    grad_weight: Optional[torch.Tensor]  # (V_local, D) weight.dtype
    grad_bias: Optional[torch.Tensor]  # (V_local,) bias.dtype


class Backend:
    """Subclass per backend. ``forward`` returns per-token results and, when ``grad_scale`` is given, the
    gradients of ``grad_scale * sum_i loss_i`` (computed in the same pass). ``backward`` recomputes the
    gradients of ``sum_i grad_loss_i * loss_i`` from the saved ``lse``."""

    name: str = ""
    #: device types this backend can run on ("cpu", "cuda", "npu", ...); None means any
    device_types: Optional[tuple[str, ...]] = None

    def unavailable_reason(self) -> Optional[str]:
        """None when usable on this host, else a sentence saying why not (shown by backend_info())."""
        return None

    def unsupported_reason(self, device: torch.device, cfg: Config, dtype: torch.dtype) -> Optional[str]:
        """None when this backend can run these tensors and options, else why not."""
        if self.device_types is not None and device.type not in self.device_types:
            return f"backend {self.name!r} runs on {'/'.join(self.device_types)} tensors, got device {device.type!r}"
        return None

    def forward(self, hidden, weight, labels, bias, cfg: Config, grad_scale: Optional[torch.Tensor],
                grad_mask: tuple[bool, bool, bool]) -> ForwardResult:
        raise NotImplementedError

    def backward(self, grad_loss, hidden, weight, labels, bias, lse, cfg: Config,
                 grad_mask: tuple[bool, bool, bool]):
        raise NotImplementedError


def loss_from_stats(m, s, target, zsum, argmax, labels, ignore_index: int, label_smoothing: float, z_loss: float,
                    vocab_total: int):
    """Per-token (loss, lse, correct, valid, bad) from global statistics -- the SPEC formula, shared by every backend.

    ``m``/``s``: max and sum-exp relative to it; ``target``: the label's logit; ``zsum``: sum of the logits;
    ``argmax``: first argmax as a global id. Ignored tokens get 0; a label outside [0, vocab_total) that is not
    ignore_index gets NaN (``bad``), so a bad label is visible instead of indexing out of bounds.
    """
    y = labels.long()
    lse = m + torch.log(s)
    valid = y != ignore_index
    bad = valid & ((y < 0) | (y >= vocab_total))
    per = (1.0 - label_smoothing) * (lse - target)
    if label_smoothing:
        per = per + label_smoothing * (lse - zsum / vocab_total)
    if z_loss:
        per = per + z_loss * lse * lse
    per = torch.where(valid, per, torch.zeros_like(per))
    per = torch.where(bad, torch.full_like(per, math.nan), per)
    return per, lse, valid & (argmax == y), valid, bad
