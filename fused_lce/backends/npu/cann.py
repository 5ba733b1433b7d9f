"""The "npu_cann" provider: CANN's fused vocab-parallel trio (torch_npu) as kernels of the driver.

The trio, as documented for torch_npu (bf16/fp16 operands, no autograd, no ignore_index, label_smoothing 0):

* ``npu_fused_linear_online_max_sum(input, weight, target, vocab_start, vocab_end, return_logits=False)`` ->
  per-token local max ``m``, ``sum exp(z - m)``, ``z[target] - m`` (0 when the target is not in
  ``[vocab_start, vocab_end)``), the out-of-shard bit mask (uint8, 8 tokens per byte, lowest token in the
  lowest bit), the shard-local target (0 when out of shard) and, with ``return_logits``, the logits;
* ``npu_fused_cross_entropy_loss_with_max_sum(...)`` (not needed: the driver computes the loss from the
  stats);
* ``npu_fused_linear_cross_entropy_loss_with_max_sum_backward(grad, input, weight, target_mask, masked_target,
  0.0, logits_max=, sum_exp_logits=)`` -> ``dX = dz @ W``, ``dW = dz.T @ X`` with
  ``dz = grad * (exp(z - logits_max) / sum_exp_logits - onehot(in-shard target))``.

``stats`` maps the first onto the driver's statistics (no sum of logits, so no label smoothing; "argmax" is
the label where the target logit equals the shard's maximum, else -1, so token accuracy counts "target logit
== max": a tie inside a shard counts as correct, across shards as wrong). ``grads`` calls the backward with
the softmax coefficient ``g (1 + 2 z_loss lse)`` and the saved lse in place of (max, sum-exp), and adds back
the one-hot difference z_loss makes with an O(N*D) gather / index_add in float32. Ignored tokens and bad
labels come in as token weights 0 / NaN from the driver. The trio rounds logits to the input dtype before its
float32 softmax, so its loss is less accurate than the "npu" / "torch" providers' float32 logits. The trio's
``vocab_end_index`` is exclusive in its kernel and golden test; the provider passes ``vocab_start + V_local``.

``supports`` declines (so ``auto`` takes the next provider, and an explicit request says why): float32,
label_smoothing != 0, softcap, a bias, D > 65534, fewer than 128 vocabulary rows on this rank, a vocabulary of
2**24 or more (its kernel compares ids as float32). Availability: torch_npu with the three functions and
CANN's op-api libraries exporting their aclnn kernels (looked up the way op-plugin does), not a CANN version
number: the kernels exist in ops-nn branches older than CANN 9.0.
"""
from __future__ import annotations

import ctypes
import glob
import os
from typing import Optional

import torch

from ...core import Coefs, Grads, Options, Problem, Stats, Tensors, WholeRowsProvider
from .env import NEVER_ON_HARDWARE, import_torch_npu, platform_id, usable_torch_npu

TRIO = ("npu_fused_linear_online_max_sum", "npu_fused_cross_entropy_loss_with_max_sum",
        "npu_fused_linear_cross_entropy_loss_with_max_sum_backward")
# the aclnn kernels behind the two functions used (op-plugin:
# ops/opapi/FusedLinearCrossEntropyLossKernelNpuOpApi.cpp)
ACLNN = ("aclnnFusedLinearOnlineMaxSum", "aclnnFusedLinearCrossEntropyLossGrad")
# where op-plugin looks kernels up (op_plugin/utils/op_api_common.cpp): $ASCEND_HOME_PATH/lib64/libopapi_*.so,
# then libopapi.so, then the feature libraries
OPAPI_LIBS = ("libopapi.so", "libaclnn_ops_train.so", "libaclnn_ops_infer.so", "libaclnn_math.so")
MAX_D = 65534        # input.size(1) limit of the forward op
MIN_V_LOCAL = 128    # weight.size(0) lower limit of the backward op
MAX_VOCAB_ID = 2**24  # targets are compared as float32 inside the kernel


def find_aclnn(names=ACLNN, env: Optional[dict] = None, load=ctypes.CDLL) -> Optional[str]:
    """None when every aclnn kernel in ``names`` (and its GetWorkspaceSize) is exported by CANN's op-api
    libraries, else which are missing and where they were looked for."""
    env = os.environ if env is None else env
    home = env.get("ASCEND_HOME_PATH") or env.get("ASCEND_TOOLKIT_HOME") or ""
    lib64 = os.path.join(home, "lib64") if home else ""
    paths = sorted(glob.glob(os.path.join(lib64, "libopapi_*.so"))) if lib64 else []
    paths += [os.path.join(lib64, n) if lib64 else n for n in OPAPI_LIBS]
    handles = []
    for path in paths:
        try:
            handles.append(load(path))
        except OSError:
            continue
    missing = [sym for name in names for sym in (name, name + "GetWorkspaceSize")
               if not any(hasattr(h, sym) for h in handles)]
    if missing:
        where = f"{lib64 or 'the library search path'} ({len(handles)} op-api libraries loaded)"
        return f"aclnn kernel(s) {', '.join(missing)} not found in {where}"
    return None


def pack_out_of_shard(out_of_shard: torch.Tensor) -> torch.Tensor:
    """The trio's ``target_mask`` layout: one bit per token, token 8k+j in bit j of byte k, padding bits
    set."""
    n = out_of_shard.shape[0]
    pad = (-n) % 8
    bits = torch.cat([out_of_shard.to(torch.uint8),
                      out_of_shard.new_ones(pad, dtype=torch.uint8)]).view(-1, 8)
    weights = 2 ** torch.arange(8, dtype=torch.int32, device=bits.device)
    return (bits.to(torch.int32) * weights).sum(dim=1).to(torch.uint8)


class CannTrioProvider(WholeRowsProvider):
    name = "npu_cann"
    device_types = ("npu",)
    dtypes = (torch.bfloat16, torch.float16)

    # -- availability --------------------------------------------------------------------------------------
    def unavailable_reason(self) -> Optional[str]:
        tnpu, reason = usable_torch_npu()
        if reason:
            return reason
        missing = [f for f in TRIO if not callable(getattr(tnpu, f, None))]
        if missing:
            return (f"torch_npu {getattr(tnpu, '__version__', '?')} has no {', '.join(missing)} "
                    "(the fused trio of CANN's ops-nn)")
        return find_aclnn()

    def needs_check(self, device: torch.device) -> Optional[str]:
        return f"CANN's fused ops behind it were {NEVER_ON_HARDWARE}" if device.type == "npu" else None

    def check_id(self, device: torch.device) -> str:
        return platform_id(device)

    def supports(self, p: Problem) -> Optional[str]:
        reason = super().supports(p)
        if reason:
            return reason
        vt = p.opts.vocab(p.v)
        if p.opts.label_smoothing != 0.0:
            return "the CANN trio supports label_smoothing=0 only"
        if p.opts.softcap:
            return "the CANN trio has no softcap (its logits come straight from the matmul)"
        if p.has_bias:
            return "the CANN trio has no bias input"
        if p.d > MAX_D:
            return f"the CANN trio needs D <= {MAX_D}, got {p.d}"
        if p.v < MIN_V_LOCAL:
            return f"the CANN trio's backward needs >= {MIN_V_LOCAL} vocabulary rows per rank, got {p.v}"
        if vt > MAX_VOCAB_ID:
            return f"the CANN trio compares vocabulary ids as float32: needs a vocabulary < 2**24, got {vt}"
        return None

    @staticmethod
    def _in_shard(labels, opts: Options, v_local: int):
        y = labels.to(torch.int64)
        return y, (y >= opts.vocab_start) & (y < opts.vocab_start + v_local)

    # -- kernels ---------------------------------------------------------------------------------------------
    def stats(self, t: Tensors, rows: slice, opts: Options, keep: bool):
        tnpu = import_torch_npu()
        v_local = t.weight.shape[0]
        y, in_shard = self._in_shard(t.labels[rows], opts, v_local)
        # int32 targets halve the traffic; out-of-range values only need to stay out of the shard
        target = y.clamp(-1, 2**31 - 1).to(torch.int32)
        m, s, pred, _mask, _masked, _ = tnpu.npu_fused_linear_online_max_sum(
            t.hidden[rows], t.weight, target, opts.vocab_start, opts.vocab_start + v_local,
            return_logits=False)
        m, s, pred = m.float(), s.float(), pred.float()
        zt = torch.where(in_shard, pred + m, torch.zeros_like(pred))  # z[target], shard-local
        # "is the target the maximum" as an argmax candidate: the label where it is, -1 elsewhere; the combine
        # takes the smallest candidate over the shards holding the global maximum
        cand = torch.where(in_shard & (pred == 0), y, torch.full_like(y, -1))
        return Stats(m, s, zt, torch.zeros_like(m), cand), None

    def grads(self, t: Tensors, rows: slice, lse, coef: Coefs, scale, opts: Options, out: Grads,
              cache=None) -> None:
        """dX, dW of ``dz = a p - t onehot`` (this provider declines label smoothing and log-probs: no ``b``,
        ``u``). The trio computes ``c (softmax - onehot)`` for a per-token ``c``: it gets ``a``, and ``(a -
        t)`` on the target column is added back where the two differ (z-loss)."""
        tnpu = import_torch_npu()
        hidden, weight = t.hidden[rows], t.weight
        a, g = (coef.a, coef.t) if scale is None else (coef.a * scale, coef.t * scale)
        y, in_shard = self._in_shard(t.labels[rows], opts, weight.shape[0])
        local = torch.where(in_shard, y - opts.vocab_start, torch.zeros_like(y))
        # softmax = exp(z - lse) / 1: the saved lse replaces the (max, sum-exp) pair
        dh, dw = tnpu.npu_fused_linear_cross_entropy_loss_with_max_sum_backward(
            a.contiguous(), hidden, weight, pack_out_of_shard(~in_shard), local.to(torch.int32), 0.0,
            logits_max=lse.float().contiguous(), sum_exp_logits=torch.ones_like(lse, dtype=torch.float32))
        if opts.z_loss:
            extra = torch.where(in_shard, a - g, torch.zeros_like(g))  # (a - t) on the target column
            if out.extra[0]:
                dh = (dh.float() + extra[:, None] * weight.index_select(0, local).float()).to(hidden.dtype)
            if out.extra[1]:
                r = in_shard.nonzero().squeeze(1)
                uniq, inv = torch.unique(local[r], return_inverse=True)
                acc = torch.zeros(uniq.shape[0], weight.shape[1], device=weight.device)
                acc.index_add_(0, inv, extra[r, None] * hidden[r].float())
                dw = dw.clone()
                dw[uniq] = (dw[uniq].float() + acc).to(dw.dtype)  # one rounding per touched row
        if out.fp32_dh and dh is not None:
            dh = dh.float()  # summed over the group by the driver, then cast
        self.store(t, rows, out, dh, dw, None)


PROVIDER = CannTrioProvider()
