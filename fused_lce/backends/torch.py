"""The "torch" provider: the reference tiling in plain PyTorch, and the fallback on every device.

Token blocks (planned here, run by the driver) are walked over vocabulary tiles. ``stats`` does an online softmax
(running max / sum-exp, float32) over the tiles; ``grads`` turns each logits tile into its gradient and adds
``dX_blk += dz @ W_tile`` and ``dW_tile += dz.T @ h_blk`` into float32 accumulators. When the whole logits row
block of a token block fits the tile budget and gradients follow, ``stats`` keeps its tiles for ``grads``
(3 GEMM-equivalents in total); otherwise ``grads`` recomputes them (4). Extra memory: the tile budget
(``Options.tile_bytes``, default 256 MiB on CPU, 1 GiB on CUDA, 512 MiB elsewhere) plus the float32 accumulators.
Only standard tensor ops, so it runs on CPU, CUDA and NPU (torch_npu) unchanged.
"""
from __future__ import annotations

import math

import torch

from .base import Grads, Options, Problem, Provider, Stats, Tensors

DEFAULT_TILE_MB = {"cpu": 256, "cuda": 1024}
MIN_BLOCK_TOKENS = 8


def default_tile_bytes(device: torch.device) -> int:
    return DEFAULT_TILE_MB.get(device.type, 512) * 2**20


def plan_tiles(n: int, v: int, d: int, budget: int, keep_wanted: bool, upcast_w: bool) -> tuple[int, int, bool]:
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


class _Tiles:
    """The tile geometry and arithmetic of one problem on one device."""

    def __init__(self, t: Tensors, opts: Options, keep_wanted: bool):
        self.t, self.opts = t, opts
        self.n, self.d = t.hidden.shape
        self.v = t.weight.shape[0]
        self.low = t.hidden.dtype != torch.float32
        # CUDA has fp32-output GEMMs for bf16/fp16 operands; elsewhere the tiles are upcast
        self.native_lowp = self.low and t.hidden.device.type == "cuda"
        budget = opts.tile_bytes or default_tile_bytes(t.hidden.device)
        self.nb, self.vb, self.keep = plan_tiles(self.n, self.v, self.d, budget, keep_wanted,
                                                 self.low and not self.native_lowp)

    def operand(self, x):
        return x if (not self.low or self.native_lowp) else x.float()

    def mm(self, a, b):
        """a @ b with a float32 result (fp32 accumulation) whatever the operand dtype."""
        if a.dtype == torch.float32 and b.dtype == torch.float32:
            return a @ b
        if self.native_lowp:
            lp = self.t.hidden.dtype
            return torch.mm(a.to(lp), b.to(lp), out_dtype=torch.float32)
        return a.float() @ b.float()

    def addmm_(self, acc, a, b):
        """acc += a @ b in place (no temporary the size of acc), fp32 accumulation."""
        if self.native_lowp:
            lp = self.t.hidden.dtype
            torch.addmm(acc, a.to(lp), b.to(lp), out_dtype=torch.float32, out=acc)
        else:
            acc.addmm_(a if a.dtype == torch.float32 else a.float(), b if b.dtype == torch.float32 else b.float())

    def logits(self, h, v0, v1, w=None):
        z = self.mm(h, (self.operand(self.t.weight[v0:v1]) if w is None else w).t())
        if self.t.bias is not None:
            z += self.t.bias[v0:v1].float()
        if self.opts.softcap:
            c = self.opts.softcap
            z = torch.tanh(z.div_(c)).mul_(c)
        return z


class TorchProvider(Provider):
    name = "torch"
    device_types = None  # any torch device

    def token_block(self, p: Problem, keep: bool) -> int:
        budget = p.opts.tile_bytes or default_tile_bytes(p.device)
        low = p.dtype != torch.float32
        return plan_tiles(p.n, p.v, p.d, budget, keep, low and p.device.type != "cuda")[0]

    def stats(self, t: Tensors, rows: slice, opts: Options, keep: bool):
        tl = _Tiles(t, opts, keep)
        h = tl.operand(t.hidden[rows])
        nb = h.shape[0]
        dev = h.device
        m = torch.full((nb,), -math.inf, device=dev)
        s = torch.zeros(nb, device=dev)
        zt = torch.zeros(nb, device=dev)
        zs = torch.zeros(nb, device=dev)
        amax = torch.zeros(nb, dtype=torch.long, device=dev)
        yl = t.labels[rows].long() - opts.vocab_start  # label as an index into this shard (may be outside it)
        kept = []
        for v0 in range(0, tl.v, tl.vb):
            v1 = min(v0 + tl.vb, tl.v)
            z = tl.logits(h, v0, v1)
            tmax, targ = z.max(dim=1)
            new_m = torch.maximum(m, tmax)
            # rows whose max is still -inf (every logit so far -inf, e.g. a masked bias) add nothing: subtracting
            # -inf would give exp(nan)
            ref = torch.where(new_m == -math.inf, torch.zeros_like(new_m), new_m)
            s = s * torch.exp(m - ref) + torch.exp(z - ref[:, None]).sum(dim=1)
            amax = torch.where(tmax > m, targ + (v0 + opts.vocab_start), amax)  # strict: the first argmax wins
            m = new_m
            hit = (yl >= v0) & (yl < v1)
            idx = (yl - v0).clamp(0, v1 - v0 - 1)
            zt += torch.where(hit, z.gather(1, idx[:, None]).squeeze(1), torch.zeros_like(zt))
            if opts.label_smoothing:
                zs += z.sum(dim=1)
            if keep and tl.keep:
                kept.append(z)
        return Stats(m, s, zt, zs, amax), (kept if keep and tl.keep else None)

    def grads(self, t: Tensors, rows: slice, lse, g, scale, opts: Options, out: Grads, cache=None) -> None:
        tl = _Tiles(t, opts, False)
        h = tl.operand(t.hidden[rows])
        eps = opts.label_smoothing
        a = g * (1.0 + 2.0 * opts.z_loss * lse)  # coefficient of softmax
        tgt = g * (1.0 - eps)  # coefficient of the one-hot target
        u = g * (eps / max(opts.vocab(tl.v), 1))  # uniform smoothing target (V == 0: no column uses it)
        yl = t.labels[rows].long() - opts.vocab_start
        idx_rows = torch.arange(h.shape[0], device=h.device)
        dh = None if out.dh is None else out.dh[rows]  # float32 accumulator rows of this block
        vb = cache[0].shape[1] if cache else tl.vb  # kept tiles have the width stats() planned
        for k, v0 in enumerate(range(0, tl.v, vb)):
            v1 = min(v0 + vb, tl.v)
            wt = tl.operand(t.weight[v0:v1])
            z = cache[k] if cache else tl.logits(h, v0, v1, wt)
            cap = None
            if opts.softcap:
                cap = 1.0 - (z / opts.softcap) ** 2  # d softcap(x) / dx expressed in the capped value
            dz = z.sub_(lse[:, None]).exp_()  # z is this function's own tile (kept or recomputed)
            dz.mul_(a[:, None])
            if eps:
                dz.sub_(u[:, None])
            hit = (yl >= v0) & (yl < v1)
            idx = (yl - v0).clamp(0, v1 - v0 - 1)  # no host sync: rows whose label is elsewhere subtract 0
            dz[idx_rows, idx] -= torch.where(hit, tgt, torch.zeros_like(tgt))
            if cap is not None:
                dz.mul_(cap)
            if out.db is not None:
                out.db[v0:v1] += dz.sum(dim=0)
            if dh is not None:
                tl.addmm_(dh, dz, wt)
            if out.dw is not None:
                tl.addmm_(out.dw[v0:v1], dz.t(), h)
            if cache:
                cache[k] = None  # free the tile as soon as it is used


PROVIDER = TorchProvider()
