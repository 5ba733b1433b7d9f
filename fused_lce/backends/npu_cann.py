"""The "npu_cann" backend: CANN's fused vocab-parallel trio (CANN >= 9.0, torch_npu) with what it lacks added.

The trio, as documented for torch_npu (bf16/fp16 operands, no autograd, no ignore_index, label_smoothing 0):

* ``npu_fused_linear_online_max_sum(input, weight, target, vocab_start, vocab_end, return_logits=False)`` ->
  per-token local max ``m``, ``sum exp(z - m)``, ``z[target] - m`` (0 when the target is not in
  ``[vocab_start, vocab_end)``), the out-of-shard bit mask (uint8, 8 tokens per byte, lowest token in the lowest
  bit), the shard-local target (0 when out of shard) and, with ``return_logits``, the logits;
* ``npu_fused_cross_entropy_loss_with_max_sum(logits_max, sum_exp_logits, predicted_logits)`` ->
  ``log(sum_exp_logits) - predicted_logits`` once the statistics are global;
* ``npu_fused_linear_cross_entropy_loss_with_max_sum_backward(grad, input, weight, target_mask, masked_target,
  0.0, logits_max=, sum_exp_logits=)`` -> ``dX = dz @ W``, ``dW = dz.T @ X`` with
  ``dz = grad * (exp(z - logits_max) / sum_exp_logits - onehot(in-shard target))``.

This wrapper adds: ignore_index (ignored tokens get loss 0 and upstream gradient 0), out-of-range labels (NaN loss
and gradients, as every backend), z_loss (the softmax term gets ``grad * (1 + 2 z_loss lse)``; the one-hot term's
difference is added back with an O(N*D) gather / index_add in float32), the vocab-parallel combine (the trio's local
max / sum-exp / target logit go through ``fused_lce.distributed.combine_stats``), and the per-token loss / lse /
correct of ``ForwardResult`` (the op layer reduces). ``correct`` is "the target logit equals the maximum logit"
(the trio gives no argmax): a tie with another vocabulary entry counts as correct within a shard and as wrong across
shards. The trio rounds logits to the input dtype before its float32 softmax, so its loss is less accurate than
the "npu" / "torch" backends' float32 logits.

Routed elsewhere (``unsupported_reason``, so ``backend="auto"`` falls through to "torch"): float32 inputs,
label_smoothing != 0, softcap. Shapes the trio rejects (a bias, D > 65534, fewer than 128 vocabulary rows on this
rank, vocabulary ids >= 2**24 which its kernel compares as float32) are not visible to ``unsupported_reason``; such
calls run the "torch" backend inside this one and the reason is kept in ``last_fallback``.
"""
from __future__ import annotations

import importlib
import math
import re
import sys
from typing import Optional

import torch

from .. import distributed
from .base import Backend, Config, ForwardResult
from .npu_emulator import token_weights

TRIO = ("npu_fused_linear_online_max_sum", "npu_fused_cross_entropy_loss_with_max_sum",
        "npu_fused_linear_cross_entropy_loss_with_max_sum_backward")
MIN_CANN = (9, 0)
MAX_D = 65534        # input.size(1) limit of the forward op
MIN_V_LOCAL = 128    # weight.size(0) lower limit of the backward op
MAX_VOCAB_ID = 2**24  # targets are compared as float32 inside the kernel


def import_torch_npu():
    """torch_npu, imported on first use only (importing it registers the NPU device with torch)."""
    mod = sys.modules.get("torch_npu")
    return mod if mod is not None else importlib.import_module("torch_npu")


def npu_device_reason(torch_npu) -> Optional[str]:
    """None when an NPU device is visible, else why not."""
    npu = getattr(torch, "npu", None)
    if npu is None:
        return "torch_npu imported but torch.npu is missing"
    try:
        if not npu.is_available() or npu.device_count() < 1:
            return "no NPU device visible (torch.npu.is_available() is False)"
    except Exception as e:  # driver / runtime errors surface here on hosts without a card
        return f"no NPU device visible ({type(e).__name__}: {e})"
    return None


def usable_torch_npu():
    """(torch_npu, None) when it imports and sees a device, else (None, the first failing step)."""
    try:
        tnpu = import_torch_npu()
    except Exception as e:
        return None, f"torch_npu is not importable ({type(e).__name__}: {e})"
    reason = npu_device_reason(tnpu)
    return (None, reason) if reason else (tnpu, None)


def parse_cann_version(text: str) -> Optional[tuple[int, int]]:
    """(major, minor) of a CANN version string such as '9.0.0', '8.3.RC1' or '9.0.T5'; None if unreadable."""
    m = re.match(r"\s*(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def pack_out_of_shard(out_of_shard: torch.Tensor) -> torch.Tensor:
    """The trio's ``target_mask`` layout: one bit per token, token 8k+j in bit j of byte k, padding bits set."""
    n = out_of_shard.shape[0]
    pad = (-n) % 8
    bits = torch.cat([out_of_shard.to(torch.uint8), out_of_shard.new_ones(pad, dtype=torch.uint8)]).view(-1, 8)
    weights = 2 ** torch.arange(8, dtype=torch.int32, device=bits.device)
    return (bits.to(torch.int32) * weights).sum(dim=1).to(torch.uint8)


class CannTrioBackend(Backend):
    name = "npu_cann"
    device_types = ("npu",)

    def __init__(self):
        self.last_fallback: Optional[str] = None

    # -- availability --------------------------------------------------------------------------------------
    def unavailable_reason(self) -> Optional[str]:
        tnpu, reason = usable_torch_npu()
        if reason:
            return reason
        missing = [f for f in TRIO if not callable(getattr(tnpu, f, None))]
        if missing:
            return (f"torch_npu {getattr(tnpu, '__version__', '?')} has no {', '.join(missing)} "
                    "(the fused trio needs a torch_npu built for CANN >= 9.0)")
        try:
            text = tnpu.utils.get_cann_version(module="CANN")
        except Exception as e:
            return f"cannot read the CANN version ({type(e).__name__}: {e}); the fused trio needs CANN >= 9.0"
        version = parse_cann_version(text)
        if version is None:
            return f"cannot parse the CANN version {text!r}; the fused trio needs CANN >= 9.0"
        if version < MIN_CANN:
            return f"CANN {text} < 9.0: the fused trio (aclnnFusedLinearOnlineMaxSum & co.) needs CANN >= 9.0"
        return None

    def unsupported_reason(self, device, cfg: Config, dtype) -> Optional[str]:
        reason = super().unsupported_reason(device, cfg, dtype)
        if reason:
            return reason
        if dtype not in (torch.bfloat16, torch.float16):
            return f"the CANN trio takes bfloat16/float16 operands only, got {dtype}"
        if cfg.label_smoothing != 0.0:
            return "the CANN trio supports label_smoothing=0 only"
        if cfg.softcap:
            return "the CANN trio has no softcap (its logits come straight from the matmul)"
        return None

    # -- helpers -------------------------------------------------------------------------------------------
    def _shape_reason(self, hidden, weight, bias, cfg: Config) -> Optional[str]:
        vt = cfg.vocab_total or weight.shape[0]
        if bias is not None:
            return "the CANN trio has no bias input"
        if hidden.shape[1] > MAX_D:
            return f"the CANN trio needs D <= {MAX_D}, got {hidden.shape[1]}"
        if weight.shape[0] < MIN_V_LOCAL:
            return f"the CANN trio's backward needs >= {MIN_V_LOCAL} vocabulary rows per rank, got {weight.shape[0]}"
        if vt > MAX_VOCAB_ID:
            return f"the CANN trio compares vocabulary ids as float32: needs a vocabulary < 2**24, got {vt}"
        return None

    def _fallback(self, reason: str):
        from .torch_ref import BACKEND as torch_backend

        self.last_fallback = reason
        return torch_backend

    @staticmethod
    def _masks(labels, cfg: Config, v_local: int):
        y = labels.to(torch.int64)
        vt = cfg.vocab_total or v_local
        valid = y != cfg.ignore_index
        bad = valid & ((y < 0) | (y >= vt))
        in_shard = (y >= cfg.vocab_start) & (y < cfg.vocab_start + v_local)
        return y, valid, bad, in_shard

    # -- forward / backward --------------------------------------------------------------------------------
    def forward(self, hidden, weight, labels, bias, cfg: Config, grad_scale, grad_mask) -> ForwardResult:
        reason = self._shape_reason(hidden, weight, bias, cfg)
        if reason:
            return self._fallback(reason).forward(hidden, weight, labels, bias, cfg, grad_scale, grad_mask)
        tnpu = import_torch_npu()
        v_local = weight.shape[0]
        y, valid, bad, in_shard = self._masks(labels, cfg, v_local)
        # int32 targets halve the traffic; out-of-range values only need to stay out of the shard
        target = y.clamp(-1, 2**31 - 1).to(torch.int32)
        m_loc, s_loc, pred_loc, _mask, _masked, _ = tnpu.npu_fused_linear_online_max_sum(
            hidden, weight, target, cfg.vocab_start, cfg.vocab_start + v_local, return_logits=False)
        m_loc, s_loc, pred_loc = m_loc.float(), s_loc.float(), pred_loc.float()
        zt_loc = torch.where(in_shard, pred_loc + m_loc, torch.zeros_like(pred_loc))  # z[target], shard-local
        # "is the target the maximum" as an argmax candidate: the label where it is, -1 elsewhere; the combine
        # takes the smallest candidate over the shards holding the global maximum
        cand = torch.where(in_shard & (pred_loc == 0), y, torch.full_like(y, -1))
        m, s, zt, _, amax = distributed.combine_stats(m_loc, s_loc, zt_loc, torch.zeros_like(m_loc), cand,
                                                      cfg.group_name)
        loss, _softmax = tnpu.npu_fused_cross_entropy_loss_with_max_sum(m, s, zt - m)
        lse = m + torch.log(s)
        per = loss.float()
        if cfg.z_loss:
            per = per + cfg.z_loss * lse * lse
        per = torch.where(valid, per, torch.zeros_like(per))
        per = torch.where(bad, torch.full_like(per, math.nan), per)
        correct = valid & ~bad & (amax == y)
        dh = dw = None
        mask = (bool(grad_mask[0]), bool(grad_mask[1]))
        if grad_scale is not None and any(mask):
            g = token_weights(valid, bad, grad_scale)
            dh, dw = self._grads(tnpu, g, hidden, weight, y, in_shard, lse, cfg, mask)
        return ForwardResult(per, lse, correct, dh, dw, None)

    def backward(self, grad_loss, hidden, weight, labels, bias, lse, cfg: Config, grad_mask):
        reason = self._shape_reason(hidden, weight, bias, cfg)
        if reason:
            return self._fallback(reason).backward(grad_loss, hidden, weight, labels, bias, lse, cfg, grad_mask)
        tnpu = import_torch_npu()
        y, valid, bad, in_shard = self._masks(labels, cfg, weight.shape[0])
        g = token_weights(valid, bad, grad_loss)
        mask = (bool(grad_mask[0]), bool(grad_mask[1]))
        dh, dw = self._grads(tnpu, g, hidden, weight, y, in_shard, lse, cfg, mask) if any(mask) else (None, None)
        return dh, dw, None

    def _grads(self, tnpu, g, hidden, weight, y, in_shard, lse, cfg: Config, mask):
        """dX, dW of sum_i g_i * loss_i. The trio computes grad * (softmax - onehot); z_loss scales the softmax
        term only, so the trio gets the softmax coefficient and the one-hot difference is added back here."""
        coef = g * (1.0 + 2.0 * cfg.z_loss * lse) if cfg.z_loss else g
        local = torch.where(in_shard, y - cfg.vocab_start, torch.zeros_like(y))
        target_mask = pack_out_of_shard(~in_shard)
        # softmax = exp(z - lse) / 1: the saved lse replaces the (max, sum-exp) pair
        dh, dw = tnpu.npu_fused_linear_cross_entropy_loss_with_max_sum_backward(
            coef.contiguous(), hidden, weight, target_mask, local.to(torch.int32), 0.0,
            logits_max=lse.float().contiguous(), sum_exp_logits=torch.ones_like(lse, dtype=torch.float32))
        if cfg.z_loss:
            extra = torch.where(in_shard, coef - g, torch.zeros_like(g))  # (a - g) on the target column
            if mask[0]:
                dh = (dh.float() + extra[:, None] * weight.index_select(0, local).float()).to(hidden.dtype)
            if mask[1]:
                rows = in_shard.nonzero().squeeze(1)
                uniq, inv = torch.unique(local[rows], return_inverse=True)
                acc = torch.zeros(uniq.shape[0], weight.shape[1], device=weight.device)
                acc.index_add_(0, inv, extra[rows, None] * hidden[rows].float())
                dw = dw.clone()
                dw[uniq] = (dw[uniq].float() + acc).to(dw.dtype)  # one rounding per touched row
        if cfg.group_name and dh is not None:
            dh = dh.float()  # summed over the group by the op layer, then cast
        return (dh if mask[0] else None), (dw if mask[1] else None)


BACKEND = CannTrioBackend()
