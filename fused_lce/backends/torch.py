"""The "torch" provider: the reference tiling in plain PyTorch, and the fallback on every device.

Token blocks (planned here, run by the driver) are walked over vocabulary tiles. ``stats`` does an online
softmax (running max / sum-exp, float32) over the tiles; ``grads`` turns each logits tile into its gradient
and adds ``dX_blk += dz @ W_tile`` and ``dW_tile += dz.T @ h_blk`` into float32 accumulators. When the whole
logits row block of a token block fits the tile budget and gradients follow, ``stats`` keeps its tiles for
``grads`` (3 GEMM-equivalents in total); otherwise ``grads`` recomputes them (4). Extra memory: the tile
budget (``Options.tile_bytes``; default 256 MiB on CPU, on CUDA a quarter of free memory between 1 and 8 GiB,
512 MiB elsewhere) plus the float32 accumulators. Only standard tensor ops, so it runs on CPU, CUDA and NPU
(torch_npu) unchanged; the ops it runs on an NPU are checked against what torch_npu implements by
tests/backends/npu/test_torch_route_ops.py.

On CUDA, tiles of at least ``COMPILE_MIN_LOGITS`` logits run the same per-tile arithmetic through
``torch.compile``d functions (``FUSED_LCE_TORCH_COMPILE``: ``0`` never, ``1`` for every tile): one fused
kernel per pass instead of one per elementwise op, the same float32 formulas, the same tiling and memory. The
GEMMs stay ``torch.mm`` either way; CPU (the reference) always runs eagerly.
"""
from __future__ import annotations

import math
import os
import warnings

import torch

from ..core import Coefs, EntropyStats, Grads, Options, Problem, Provider, Stats, Tensors

DEFAULT_TILE_MB = {"cpu": 256, "cuda": 8192}
MIN_BLOCK_TOKENS = 8
COMPILE_MIN_LOGITS = 1 << 24  # CUDA tiles this large run the compiled per-tile functions


def default_tile_bytes(device: torch.device) -> int:
    budget = DEFAULT_TILE_MB.get(device.type, 512) * 2**20
    # large token blocks keep the float32 dW accumulator passes few; a quarter of free
    if device.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(device)
            budget = max(1024 * 2**20, min(budget, free // 4))
        except Exception:  # pragma: no cover
            pass
    return budget


# ---------------------------------------------------------------------------------------------- per-tile math
SOFTCAP_LINEAR = 2.0**-12  # |z / c| below this, c tanh(z / c) rounds to z in float32 (cubic term < 2**-25 z)


def capped(z: torch.Tensor, c: float, out=None) -> torch.Tensor:
    """``c * tanh(z / c)``, accurate for every ``c``: ``z`` itself where ``|z / c| < 2**-12``, so a large
    ``c`` leaves the logits as they are, also where ``z / c`` would be subnormal (or flushed to 0)."""
    y = z / c
    big = (y >= SOFTCAP_LINEAR) | (y <= -SOFTCAP_LINEAR)  # (NaN: neither, z passes through)
    return torch.where(big, y.tanh_().mul_(c), z, out=out)


def _tile_stats(z, bias, softcap: float, m, s, zt, zs, amax, yl, v0: int, id0: int, smooth: bool):
    """Bias / softcap on a raw logits tile, then its statistics folded into the running (m, s, zt, zs, amax).
    ``id0``: the global id of column 0 of the tile. Returns the tile (as kept for the gradients) and the
    stats."""
    if bias is not None:
        z = z + bias.float()
    if softcap:
        z = capped(z, softcap)
    tmax, targ = z.max(dim=1)
    new_m = torch.maximum(m, tmax)
    ref = torch.where(new_m == -math.inf, torch.zeros_like(new_m), new_m)
    s = s * torch.exp(m - ref) + torch.exp(z - ref[:, None]).sum(dim=1)
    amax = torch.where(tmax > m, targ + id0, amax)
    hit = (yl >= v0) & (yl < v0 + z.shape[1])
    idx = (yl - v0).clamp(0, z.shape[1] - 1)
    zt = zt + torch.where(hit, z.gather(1, idx[:, None]).squeeze(1), torch.zeros_like(zt))
    if smooth:
        zs = zs + z.sum(dim=1)
    return z, new_m, s, zt, zs, amax


def _tile_logits(z, bias, softcap: float):
    """Bias / softcap on a raw logits tile (the recompute path)."""
    if bias is not None:
        z = z + bias.float()
    if softcap:
        z = capped(z, softcap)
    return z


def _tile_grad(z, lse, a, u, tgt, yl, v0: int, softcap: float, eps: bool, want_db: bool,
               out_dtype: torch.dtype):
    """The gradient tile ``dz`` (in ``out_dtype``, the GEMM operand dtype) of a (bias- and softcap-applied)
    logits tile, and its column sums in float32 when ``want_db``."""
    dz = torch.exp((z - lse[:, None]).clamp(max=0.0)) * a[:, None]  # p <= 1 (see TorchProvider.grads)
    if eps:
        dz = dz - u[:, None]
    cols = torch.arange(z.shape[1], device=z.device) + v0
    dz = dz - torch.where(cols[None, :] == yl[:, None], tgt[:, None], torch.zeros_like(tgt)[:, None])
    if softcap:
        dz = dz * (1.0 - (z / softcap) ** 2)
    return dz.to(out_dtype), (dz.sum(dim=0) if want_db else None)


_COMPILED: dict = {}


def _compiled(fn):
    """``torch.compile(fn, dynamic=True)``, or None when compiling is off or has failed here before."""
    if _COMPILED.get("broken"):
        return None
    if fn not in _COMPILED:
        try:
            _COMPILED[fn] = torch.compile(fn, dynamic=True)
        except Exception as e:  # pragma: no cover - a torch without a working Inductor
            _COMPILED["broken"] = True
            warnings.warn(f"fused_lce torch backend: torch.compile unavailable ({e}); running eagerly")
            return None
    return _COMPILED[fn]


def _use_compiled(z: torch.Tensor) -> bool:
    mode = os.environ.get("FUSED_LCE_TORCH_COMPILE", "auto").strip().lower()
    if z.device.type != "cuda" or mode in ("0", "off", "false", "no") or _COMPILED.get("broken"):
        return False
    if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return False  # traced already / inside a graph capture: plain ops
    return mode in ("1", "on", "true", "yes") or z.numel() >= COMPILE_MIN_LOGITS


def _run(fn, z, *args):
    """``fn(z, *args)`` compiled where ``_use_compiled``; a compile failure falls back to eager (once,
    warned)."""
    if _use_compiled(z):
        cfn = _compiled(fn)
        if cfn is not None:
            try:
                return cfn(z, *args)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # pragma: no cover - Inductor failing on this host
                _COMPILED["broken"] = True
                warnings.warn(f"fused_lce torch backend: compiled tile function failed ({type(e).__name__}: "
                              f"{e}); running eagerly")
    return None


def plan_tiles(n: int, v: int, d: int, budget: int, keep_wanted: bool,
               upcast_w: bool) -> tuple[int, int, bool]:
    """(token block, vocab tile, keep logits between passes) so that the live tiles stay within ``budget``
    bytes.

    Per logits element a tile costs ~8 bytes of temporaries (fp32 logits + fp32 probabilities/dz); a kept row
    block costs 4 more bytes per element of the whole row; a bf16/fp16 weight tile upcast on CPU costs 4*D per
    vocab row.
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


_ALIGN = 64


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
        self.cuda = t.hidden.device.type == "cuda"
        if self.cuda and self.vb < self.v and self.vb > _ALIGN:
            self.vb -= self.vb % _ALIGN

    def bounds(self, vb: int):
        """Vocabulary tiles [v0, v1) of width ``vb``. On CUDA a tile whose width is not a multiple of 64 is
        split into its first multiple of 64 and a small remainder: an odd width (an odd vocabulary) sends
        cuBLAS to kernels several times slower (measured on the H200: 256 ms against 53 ms at
        8192x4096x151931)."""
        out = []
        for v0 in range(0, self.v, vb):
            v1 = min(v0 + vb, self.v)
            w = v1 - v0
            if self.cuda and w % _ALIGN and w > _ALIGN:
                out += [(v0, v1 - w % _ALIGN), (v1 - w % _ALIGN, v1)]
            else:
                out.append((v0, v1))
        return out

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
            acc.addmm_(a if a.dtype == torch.float32 else a.float(),
                       b if b.dtype == torch.float32 else b.float())

    def logits(self, h, v0, v1, w=None):
        return self.finish_logits(self.mm(h, (self.operand(self.t.weight[v0:v1]) if w is None else w).t()),
                                  v0, v1)

    def finish_logits(self, z, v0, v1):
        """Bias and softcap, in place on a raw float32 logits tile."""
        if self.t.bias is not None:
            z += self.t.bias[v0:v1].float()
        if self.opts.softcap:
            z = capped(z, self.opts.softcap, out=z)
        if self.opts.temperature != 1.0:  # after the softcap (the order of TRL / verl)
            z = z.div_(self.opts.temperature)
        return z


class TorchProvider(Provider):
    name = "torch"
    device_types = None  # any torch device
    supports_logprobs = True

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
        ez = torch.zeros(nb, device=dev) if opts.entropy else None
        yl = t.labels[rows].long() - opts.vocab_start  # label as an index into this shard (may be outside it)
        kept = []
        for v0, v1 in tl.bounds(tl.vb):
            raw = tl.mm(h, tl.operand(t.weight[v0:v1]).t())
            got = None
            # the loss statistics, which the compiled function computes
            if ez is None and opts.temperature == 1.0:
                got = _run(_tile_stats, raw, None if t.bias is None else t.bias[v0:v1],
                           float(opts.softcap or 0.0), m, s, zt, zs, amax, yl, v0, v0 + opts.vocab_start,
                           opts.wants_zsum)
            if got is not None:
                z, m, s, zt, zs, amax = got
                if keep and tl.keep:
                    kept.append(z)
                continue
            z = tl.finish_logits(raw, v0, v1)
            tmax, targ = z.max(dim=1)
            new_m = torch.maximum(m, tmax)
            # rows whose max is still -inf (every logit so far -inf, e.g. a masked bias) add nothing:
            # subtracting -inf would give exp(nan)
            ref = torch.where(new_m == -math.inf, torch.zeros_like(new_m), new_m)
            if ez is not None:  # sum e (z - ref), moved from the old max to ref like s
                # not clamp_, which torch_npu documents may fall back to the CPU; same peak (z - ref is freed)
                zr = torch.clamp(z - ref[:, None], min=-200.0)  # exp -> 0 there: -inf logits add 0, not NaN
                e = torch.exp(zr)
                old = torch.exp(m - ref)
                shift = torch.where(m == -math.inf, torch.zeros_like(m), m - ref)
                ez = old * (ez + shift * s) + (e * zr).sum(dim=1)
                s = s * old + e.sum(dim=1)
                del zr, e
            else:
                s = s * torch.exp(m - ref) + torch.exp(z - ref[:, None]).sum(dim=1)
            # strict: the first argmax wins
            amax = torch.where(tmax > m, targ + (v0 + opts.vocab_start), amax)
            m = new_m
            hit = (yl >= v0) & (yl < v1)
            idx = (yl - v0).clamp(0, v1 - v0 - 1)
            zt += torch.where(hit, z.gather(1, idx[:, None]).squeeze(1), torch.zeros_like(zt))
            if opts.wants_zsum:
                zs += z.sum(dim=1)
            if keep and tl.keep:
                kept.append(z)
        st = Stats(m, s, zt, zs, amax) if ez is None else EntropyStats(m, s, zt, zs, amax, ez)
        return st, (kept if keep and tl.keep else None)

    def grads(self, t: Tensors, rows: slice, lse, coef: Coefs, scale, opts: Options, out: Grads,
              cache=None) -> None:
        tl = _Tiles(t, opts, False)
        h = tl.operand(t.hidden[rows])
        a, tgt, b, u = coef.a, coef.t, coef.b, coef.u  # of softmax, the one-hot target, softmax * z, uniform
        temp = opts.temperature
        # a row whose logits are all -inf has lse = -inf: p = exp(-inf - 0) = 0 there instead of exp(NaN)
        lse = torch.where(lse == -math.inf, torch.zeros_like(lse), lse)
        yl = t.labels[rows].long() - opts.vocab_start
        dh = None if out.dh is None else out.dh[rows]  # float32 accumulator rows of this block
        vb = cache[0].shape[1] if cache else tl.vb  # kept tiles have the width stats() planned
        for k, (v0, v1) in enumerate(tl.bounds(vb)):
            wt = tl.operand(t.weight[v0:v1])
            plain = b is None and temp == 1.0  # the loss form, which the compiled tile functions implement
            if cache:
                z = cache[k]  # after softcap and temperature
            else:
                raw = tl.mm(h, wt.t())
                z = None
                if plain and (t.bias is not None or opts.softcap) and _use_compiled(raw):
                    z = _run(_tile_logits, raw, None if t.bias is None else t.bias[v0:v1],
                             float(opts.softcap))
                if z is None:
                    z = tl.finish_logits(raw, v0, v1)
            got = None
            if plain:
                lowp = t.hidden.dtype if tl.native_lowp else torch.float32
                got = _run(_tile_grad, z, lse, a, u, tgt, yl, v0, float(opts.softcap or 0.0), u is not None,
                           out.db is not None, lowp)
            if got is not None:
                dz, dbs = got
                if dbs is not None:
                    out.db[v0:v1] += dbs
                if dh is not None:
                    tl.addmm_(dh, dz, wt)
                if out.dw is not None:
                    tl.addmm_(out.dw[v0:v1], dz.t(), h)
                if cache:
                    cache[k] = None
                continue
            cap = None
            if opts.softcap:  # d softcap(x) / dx expressed in the capped value (z * temperature)
                cap = 1.0 - ((z / opts.softcap) if temp == 1.0 else z * (temp / opts.softcap)) ** 2
            w = None
            # a + b z (entropy), z floored where p underflows to 0 so that -inf logits give 0 * finite
            if b is not None:
                w = torch.maximum(z, (lse - 200.0)[:, None]).mul_(b[:, None]).add_(a[:, None])
            # p = exp(z - lse), its exponent clamped at 0 (p <= 1): the saved lse of a token with no gradient
            # (ignored: 0 by contract) bounds none of its logits, whose exp would overflow to inf, and its
            # coefficient 0 times inf is NaN. z is this function's own tile (kept or recomputed); clamp with
            # out=, not clamp_, which torch_npu documents may fall back to the CPU.
            dz = torch.clamp(z.sub_(lse[:, None]), max=0.0, out=z).exp_()
            dz.mul_(a[:, None] if w is None else w)
            del w
            if u is not None:
                dz.sub_(u[:, None])
            hit = (yl >= v0) & (yl < v1)
            idx = (yl - v0).clamp(0, v1 - v0 - 1)  # no host sync: rows whose label is elsewhere subtract 0
            # not dz[rows, idx] -= t: torch_npu documents index_put_ for int64 only; + (-t) is bitwise - t
            dz.scatter_add_(1, idx[:, None], torch.where(hit, tgt, torch.zeros_like(tgt)).neg()[:, None])
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
