"""The "torch" backend: the reference tiling in plain PyTorch, and the fallback on every device.

Tokens are processed in blocks and the vocabulary in tiles. Pass 1 walks the vocabulary tiles of a token block
with an online softmax (running max / sum-exp, float32) and collects the per-token statistics; after the
(optional) vocab-parallel combine, pass 2 turns each logits tile into its gradient and accumulates
``dX += dz @ W_tile`` and ``dW_tile += dz.T @ h_block`` in float32. When the whole logits row block of a token
block fits the tile budget, pass 1 keeps its tiles and pass 2 reuses them (3 GEMM-equivalents in total);
otherwise pass 2 recomputes them (4). Extra memory: the tile budget, plus a float32 dW accumulator (V_local x D)
when the weight is bf16/fp16 and its gradient is wanted. Only standard tensor ops, so it runs on CPU, CUDA and
NPU (torch_npu) unchanged.
"""
from __future__ import annotations

import math
import os
from typing import Optional

import torch

from .. import distributed
from .base import Backend, Config, ForwardResult, loss_from_stats

DEFAULT_TILE_MB = {"cpu": 256, "cuda": 1024}
MIN_BLOCK_TOKENS = 8


def default_tile_bytes(device: torch.device) -> int:
    env = os.environ.get("FUSED_LCE_TILE_MB")
    if env:
        return max(1, int(float(env) * 2**20))
    return DEFAULT_TILE_MB.get(device.type, 512) * 2**20


def plan_tiles(n: int, v: int, d: int, budget: int, keep_wanted: bool, upcast_w: bool):
    """(token block, vocab tile, keep logits between passes) so that the live tiles stay within ``budget`` bytes.

    Per logits element a tile costs ~8 bytes of temporaries (fp32 logits + fp32 probabilities/dz); a kept row block
    costs 4 more bytes per element of the whole row; a bf16/fp16 weight tile upcast on CPU costs 4*D per vocab row.
    """
    n, v = max(n, 1), max(v, 1)
    wrow = 4 * d if upcast_w else 0
    nb = min(n, max(1, budget // (12 * v + wrow)))  # full-vocabulary tiles if they fit
    if nb >= min(n, MIN_BLOCK_TOKENS):
        return nb, v, keep_wanted
    nb = min(n, MIN_BLOCK_TOKENS)
    keep = keep_wanted and 4 * nb * v < budget // 2
    room = budget - (4 * nb * v if keep else 0)
    vb = min(v, max(1, room // (8 * nb + wrow)))
    return nb, vb, keep


class _Problem:
    """One flattened problem and its options; methods are the two passes over a token block."""

    def __init__(self, hidden, weight, labels, bias, cfg: Config):
        self.h, self.w, self.b, self.cfg = hidden, weight, bias, cfg
        self.n, self.d = hidden.shape
        self.v = weight.shape[0]
        self.vt = cfg.vocab_total or self.v
        self.labels = labels.long()
        self.low = hidden.dtype != torch.float32
        # CUDA has fp32-output GEMMs for bf16/fp16 operands; elsewhere the tiles are upcast
        self.native_lowp = self.low and hidden.device.type == "cuda"
        self.budget = cfg.tile_bytes or default_tile_bytes(hidden.device)

    # -- building blocks ------------------------------------------------------------------------------
    def w_tile(self, v0, v1):
        w = self.w[v0:v1]
        return w if (not self.low or self.native_lowp) else w.float()

    def h_block(self, i0, i1):
        h = self.h[i0:i1]
        return h if (not self.low or self.native_lowp) else h.float()

    def mm(self, a, b):
        """a @ b with a float32 result (fp32 accumulation) whatever the operand dtype."""
        if a.dtype == torch.float32 and b.dtype == torch.float32:
            return a @ b
        if self.native_lowp:
            return torch.mm(a.to(self.h.dtype), b.to(self.h.dtype), out_dtype=torch.float32)
        return a.float() @ b.float()

    def addmm_(self, acc, a, b):
        """acc += a @ b in place (no temporary the size of acc), fp32 accumulation."""
        if self.native_lowp:
            lp = self.h.dtype
            torch.addmm(acc, a.to(lp), b.to(lp), out_dtype=torch.float32, out=acc)
        else:
            acc.addmm_(a if a.dtype == torch.float32 else a.float(), b if b.dtype == torch.float32 else b.float())

    def logits(self, h, v0, v1, w=None):
        z = self.mm(h, (self.w_tile(v0, v1) if w is None else w).t())
        if self.b is not None:
            z += self.b[v0:v1].float()
        if self.cfg.softcap:
            c = self.cfg.softcap
            z = torch.tanh(z.div_(c)).mul_(c)
        return z

    # -- pass 1: statistics -----------------------------------------------------------------------------
    def stats(self, h, y, vb, keep):
        nb = h.shape[0]
        dev = h.device
        m = torch.full((nb,), -math.inf, device=dev)
        s = torch.zeros(nb, device=dev)
        zt = torch.zeros(nb, device=dev)
        zs = torch.zeros(nb, device=dev)
        amax = torch.zeros(nb, dtype=torch.long, device=dev)
        yl = y - self.cfg.vocab_start  # label as an index into this shard (may be outside it)
        kept = []
        for v0 in range(0, self.v, vb):
            v1 = min(v0 + vb, self.v)
            z = self.logits(h, v0, v1)
            tmax, targ = z.max(dim=1)
            new_m = torch.maximum(m, tmax)
            rescale = torch.where(m == new_m, torch.ones_like(m), torch.exp(m - new_m))
            s = s * rescale + torch.exp(z - new_m[:, None]).sum(dim=1)
            amax = torch.where(tmax > m, targ + (v0 + self.cfg.vocab_start), amax)
            m = new_m
            hit = (yl >= v0) & (yl < v1)
            idx = (yl - v0).clamp(0, v1 - v0 - 1)
            zt += torch.where(hit, z.gather(1, idx[:, None]).squeeze(1), torch.zeros_like(zt))
            if self.cfg.label_smoothing:
                zs += z.sum(dim=1)
            if keep:
                kept.append(z)
        return (m, s, zt, zs, amax), kept

    # -- pass 2: gradients --------------------------------------------------------------------------------
    def grads(self, i0, i1, h, y, lse, g, vb, kept, dh_acc, dw_acc, db_acc, mask):
        """Accumulate the gradients of sum_i g_i * loss_i for tokens [i0, i1) into the fp32 accumulators."""
        cfg = self.cfg
        eps = cfg.label_smoothing
        a = g * (1.0 + 2.0 * cfg.z_loss * lse)  # coefficient of softmax
        t = g * (1.0 - eps)  # coefficient of the one-hot target
        u = g * (eps / self.vt)  # coefficient of the uniform smoothing target
        yl = y - cfg.vocab_start
        rows = torch.arange(h.shape[0], device=h.device)
        for k, v0 in enumerate(range(0, self.v, vb)):
            v1 = min(v0 + vb, self.v)
            wt = self.w_tile(v0, v1)
            z = kept[k] if kept else self.logits(h, v0, v1, wt)
            cap = None
            if cfg.softcap:
                cap = 1.0 - (z / cfg.softcap) ** 2  # d softcap(x) / dx expressed in the capped value
            dz = z.sub_(lse[:, None]).exp_() if kept else torch.exp(z - lse[:, None])
            dz.mul_(a[:, None])
            if eps:
                dz.sub_(u[:, None])
            hit = (yl >= v0) & (yl < v1)
            idx = (yl - v0).clamp(0, v1 - v0 - 1)  # no host sync: rows whose label is elsewhere subtract 0
            dz[rows, idx] -= torch.where(hit, t, torch.zeros_like(t))
            if cap is not None:
                dz.mul_(cap)
            if mask[2]:
                db_acc[v0:v1] += dz.sum(dim=0)
            if mask[0]:
                self.addmm_(dh_acc[i0:i1], dz, wt)
            if mask[1]:
                self.addmm_(dw_acc[v0:v1], dz.t(), h)
            if kept:
                kept[k] = None  # free the tile as soon as it is used


def _finish(acc: Optional[torch.Tensor], like: Optional[torch.Tensor]):
    if acc is None or like is None:
        return None
    return acc if acc.dtype == like.dtype else acc.to(like.dtype)


class TorchBackend(Backend):
    name = "torch"
    device_types = None  # any torch device

    def _accumulators(self, p: _Problem, mask, fp32_dh: bool):
        dev = p.h.device
        # dX accumulates over vocabulary tiles only within a token block, but a vocab-parallel group sums it
        # across ranks afterwards, so keep it in fp32 then (the op layer casts after the all-reduce)
        dh = torch.zeros(p.n, p.d, device=dev, dtype=torch.float32) if mask[0] else None
        dw = torch.zeros(p.v, p.d, device=dev, dtype=torch.float32) if mask[1] else None
        db = torch.zeros(p.v, device=dev, dtype=torch.float32) if mask[2] and p.b is not None else None
        return dh, dw, db

    def forward(self, hidden, weight, labels, bias, cfg, grad_scale, grad_mask):
        p = _Problem(hidden, weight, labels, bias, cfg)
        fused = grad_scale is not None and any(grad_mask)
        mask = tuple(bool(x) for x in grad_mask) if fused else (False, False, False)
        mask = (mask[0], mask[1], mask[2] and bias is not None)
        nb, vb, keep = plan_tiles(p.n, p.v, p.d, p.budget, fused, p.low and not p.native_lowp)
        # one combine_stats per token block: every rank of a vocab-parallel group must run the same blocks
        nb = distributed.agree_token_blocks(nb, p.n, cfg.group_name)
        dev = hidden.device
        loss = torch.empty(p.n, device=dev)
        lse_out = torch.empty(p.n, device=dev)
        correct = torch.empty(p.n, device=dev, dtype=torch.bool)
        dh, dw, db = self._accumulators(p, mask, bool(cfg.group_name))
        for i0 in range(0, p.n, nb):
            i1 = min(i0 + nb, p.n)
            h = p.h_block(i0, i1)
            y = p.labels[i0:i1]
            (m, s, zt, zs, amax), kept = p.stats(h, y, vb, keep)
            m, s, zt, zs, amax = distributed.combine_stats(m, s, zt, zs, amax, cfg.group_name)
            per, lse, corr, valid, bad = loss_from_stats(m, s, zt, zs, amax, y, cfg.ignore_index,
                                                         cfg.label_smoothing, cfg.z_loss, p.vt)
            loss[i0:i1] = per
            lse_out[i0:i1] = lse
            correct[i0:i1] = corr
            if fused:
                g = _token_weights(valid, bad, grad_scale.to(torch.float32))
                p.grads(i0, i1, h, y, lse, g, vb, kept, dh, dw, db, mask)
        dh_out = dh if cfg.group_name else _finish(dh, hidden)
        return ForwardResult(loss, lse_out, correct, dh_out, _finish(dw, weight), _finish(db, bias))

    def backward(self, grad_loss, hidden, weight, labels, bias, lse, cfg, grad_mask):
        p = _Problem(hidden, weight, labels, bias, cfg)
        mask = (bool(grad_mask[0]), bool(grad_mask[1]), bool(grad_mask[2]) and bias is not None)
        nb, vb, _ = plan_tiles(p.n, p.v, p.d, p.budget, False, p.low and not p.native_lowp)
        dh, dw, db = self._accumulators(p, mask, bool(cfg.group_name))
        if any(mask):
            for i0 in range(0, p.n, nb):
                i1 = min(i0 + nb, p.n)
                y = p.labels[i0:i1]
                valid = y != cfg.ignore_index
                bad = valid & ((y < 0) | (y >= p.vt))
                g = _token_weights(valid, bad, grad_loss[i0:i1].to(torch.float32))
                p.grads(i0, i1, p.h_block(i0, i1), y, lse[i0:i1], g, vb, None, dh, dw, db, mask)
        dh_out = dh if cfg.group_name else _finish(dh, hidden)
        return dh_out, _finish(dw, weight), _finish(db, bias)


def _token_weights(valid, bad, scale):
    """Upstream weight per token: the scale where valid, 0 where ignored, NaN where the label is out of range
    (a bad label must poison the gradients it would have produced, never index out of bounds)."""
    g = torch.where(valid, scale.expand(valid.shape), torch.zeros((), device=valid.device))
    return torch.where(bad, torch.full_like(g, math.nan), g)


BACKEND = TorchBackend()
