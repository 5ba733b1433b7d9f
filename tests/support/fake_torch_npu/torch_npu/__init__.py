"""A fake ``torch_npu`` for tests: the simulated "npu" device (tests/support/npu_sim.py) plus the CANN fused
trio implemented in torch from its documentation (torch_npu API docs and the aclnn docs in hicann/ops-nn),
including the argument checks those documents list, so the "npu_cann" wrapper is exercised against the
documented contract.

Documented semantics implemented here:
* ``npu_fused_linear_online_max_sum``: logits ``input @ weight.T`` (float32 accumulate, then rounded to the
  input dtype as the kernel's bf16/fp16 workspace does), per-row local max, sum of ``exp(z - max)``, ``z[t] -
  max`` for targets in ``[vocab_start, vocab_end)`` (end exclusive, as the kernel and its golden test compare
  with >=), the out-of-range bit mask (token 8k+j in bit j of byte k, padding bits 1), the shard-local target
  (0 when out).
* ``npu_fused_cross_entropy_loss_with_max_sum``: ``log(sum_exp_logits) - predicted_logits`` (label_smoothing 0
  only).
* ``npu_fused_linear_cross_entropy_loss_with_max_sum_backward`` (memory-saving branch):
  ``dz = grad * (exp(z - logits_max) / sum_exp_logits - onehot)``, ``dX = dz @ W``, ``dW = dz.T @ X`` in the
  input dtype (dz rounded to it before the matmuls).

Knobs for scenarios (read at call time): FAKE_CANN_VERSION (default "9.0.0"), FAKE_NPU_DEVICES (default 1),
FAKE_NO_TRIO=1 (hide the trio, as an older torch_npu), FAKE_TRIO_FAIL=1 (the functions raise). ``calls``
counts calls.
"""
from __future__ import annotations

import os
import sys
import types
from collections import Counter

import torch

from tests.support import npu_sim  # the repository root is on sys.path wherever the fake is used

npu_sim.setup_device()

__version__ = "2.13.0"
calls: Counter = Counter()

utils = types.ModuleType("torch_npu.utils")
utils.get_cann_version = (lambda module="CANN": os.environ.get("FAKE_CANN_VERSION", "9.0.0")
                          if module == "CANN" else "")
sys.modules["torch_npu.utils"] = utils


def _check(cond, msg):
    if not cond:
        raise RuntimeError(f"fake aclnn parameter check failed: {msg}")


def _trio_on():
    if os.environ.get("FAKE_TRIO_FAIL") == "1":
        raise RuntimeError("fake aclnn: forced failure")


def _logits(input, weight):
    return (input.float() @ weight.float().t()).to(input.dtype).float()


def _npu_fused_linear_online_max_sum(input, weight, target, vocab_start_index, vocab_end_index,
                                     return_logits=False):
    _trio_on()
    calls["npu_fused_linear_online_max_sum"] += 1
    _check(input.dim() == 2 and weight.dim() == 2 and target.dim() == 1, "input/weight 2-D, target 1-D")
    _check(input.dtype in (torch.bfloat16, torch.float16) and weight.dtype == input.dtype,
           "bf16/fp16, same dtype")
    _check(target.dtype in (torch.int32, torch.int64), "target int32/int64")
    _check(input.shape[1] <= 65534 and weight.shape[1] == input.shape[1], "input.size(1) <= 65534, same K")
    _check(target.shape[0] == input.shape[0] and weight.shape[0] > 0, "target.size(0) == input.size(0)")
    _check(0 <= vocab_start_index <= vocab_end_index, "0 <= vocab_start_index <= vocab_end_index")
    n = input.shape[0]
    z = _logits(input, weight)
    m = z.max(dim=1).values
    s = torch.exp(z - m[:, None]).sum(dim=1)
    t = target.to(torch.int64)
    out = (t < vocab_start_index) | (t >= vocab_end_index)
    masked = torch.where(out, torch.zeros_like(t), t - vocab_start_index)
    pred = torch.where(out, torch.zeros_like(m), z.gather(1, masked[:, None]).squeeze(1) - m)
    pad = (-n) % 8
    bits = torch.cat([out.to(torch.uint8), torch.ones(pad, dtype=torch.uint8, device=out.device)]).view(-1, 8)
    packed = (bits.to(torch.int32) * 2 ** torch.arange(8, dtype=torch.int32, device=bits.device)).sum(1)
    packed = packed.to(torch.uint8)
    logits = z.to(input.dtype) if return_logits else input.new_empty(0)
    return m, s, pred, packed, masked.to(target.dtype), logits


def _npu_fused_cross_entropy_loss_with_max_sum(logits_max, sum_exp_logits, predicted_logits, *,
                                               label_smoothing=0.0,
                                              input=None, weight=None, vocab_parallel_logits=None):
    _trio_on()
    calls["npu_fused_cross_entropy_loss_with_max_sum"] += 1
    _check(label_smoothing == 0.0, "label_smoothing must be 0")
    _check(input is None and weight is None, "input/weight must be None")
    for t in (logits_max, sum_exp_logits, predicted_logits):
        _check(t.dtype == torch.float32 and t.shape == logits_max.shape, "float32, same shape")
    loss = torch.log(sum_exp_logits) - predicted_logits
    softmax = logits_max.new_empty(0)
    if vocab_parallel_logits is not None:
        softmax = torch.exp(vocab_parallel_logits.float() - logits_max[:, None]) / sum_exp_logits[:, None]
    return loss, softmax


def _npu_fused_linear_cross_entropy_loss_with_max_sum_backward(grad, input, weight, target_mask,
                                                               masked_target,
                                                              label_smoothing=0.0, logits_max=None,
                                                              sum_exp_logits=None, softmax=None):
    _trio_on()
    calls["npu_fused_linear_cross_entropy_loss_with_max_sum_backward"] += 1
    _check(label_smoothing == 0.0, "label_smoothing must be 0")
    _check(grad.dtype == torch.float32 and grad.shape[0] == input.shape[0], "grad float32 (N,)")
    _check(input.dtype in (torch.bfloat16, torch.float16) and weight.dtype == input.dtype, "bf16/fp16")
    _check(weight.shape[0] >= 128 and weight.shape[1] == input.shape[1], "weight.size(0) >= 128")
    _check(target_mask.dtype == torch.uint8 and target_mask.shape[0] * 8 >= grad.shape[0], "uint8 bit mask")
    _check(masked_target.dtype in (torch.int32, torch.int64) and masked_target.shape[0] == grad.shape[0],
           "masked_target int32/int64 (N,)")
    n = grad.shape[0]
    bits = ((target_mask.to(torch.int32)[:, None] >> torch.arange(8, device=target_mask.device))
            & 1).reshape(-1)[:n]
    if softmax is None:
        _check(logits_max is not None and sum_exp_logits is not None,
               "logits_max and sum_exp_logits required")
        p = torch.exp(_logits(input, weight) - logits_max[:, None]) / sum_exp_logits[:, None]
    else:
        p = softmax.float().clone()
    rows = torch.arange(n, device=grad.device)
    p[rows, masked_target.to(torch.int64)] -= (1 - bits).float()
    dz = (p * grad[:, None]).to(input.dtype)
    return (dz.float() @ weight.float()).to(input.dtype), (dz.float().t() @ input.float()).to(input.dtype)


_TRIO = ("npu_fused_linear_online_max_sum", "npu_fused_cross_entropy_loss_with_max_sum",
         "npu_fused_linear_cross_entropy_loss_with_max_sum_backward")


def __getattr__(name):
    # FAKE_NO_TRIO=1 makes this look like a torch_npu built for CANN < 9.0
    if name in _TRIO and os.environ.get("FAKE_NO_TRIO") != "1":
        return globals()["_" + name]
    raise AttributeError(f"module 'torch_npu' has no attribute {name!r}")
