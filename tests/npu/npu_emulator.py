"""Python tile emulator of the AscendC kernels in ``csrc/ascend/`` (test-only: the spec they were written to).

It runs on any device with plain torch and follows the kernels step by step:

* ``plan()`` mirrors ``fused_lce::tiling::plan`` of ``csrc/include/fused_lce_tiling.h`` (a test compares the two
  on many shapes), so the emulator uses the very tile sizes, segments and task order the kernels get.
* ``stats()`` is the forward kernel ``FusedLceStats``: for each task (token block, vocabulary segment) in task
  order, each vocabulary block of the segment in increasing order: the cube tile ``z = h_blk @ w_blk.T`` with a
  float32 accumulator summed over K chunks of ``base_k`` (bf16/fp16 products are exact in float32), then in the
  vector core, all in float32: bias, softcap, and the online update of (max, sum-exp, target logit, sum of logits,
  first argmax). Partial statistics of the segments of a token block are merged in segment order.
* ``grads()`` is the backward kernel ``FusedLceGrad``: the same tiles recomputed, ``dz`` formed in float32 and
  rounded to the input dtype (the cube's operand type) before ``dX += dz @ W_blk`` and ``dW_blk += dz.T @ h_blk``,
  both accumulated in float32 in task order; ``db`` sums the float32 ``dz``.
* ``finish()`` turns the (combined) statistics into per-token loss, lse and correctness; the "npu" backend and the
  C++ host adapter do the same arithmetic.

What it does not model: the summation order inside one cube K chunk or one vector reduction (hardware trees differ
from BLAS / torch reductions at the float32 rounding level), and the order of the float32 atomic adds of dW (and of
dX when a token block has several segments) across cores, which is not fixed on hardware. Tests therefore compare
the emulator with the float64 reference at tolerances set by the dtype, not bit for bit with anything.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from fused_lce import driver
from fused_lce.backends.base import Options, Stats

# ---------------------------------------------------------------------------------------------- tiling mirror
FLAG_BIAS, FLAG_SMOOTHING, FLAG_SOFTCAP, FLAG_BACKWARD = 1, 2, 4, 8
OK, BAD_DTYPE, EMPTY_DIM, TOO_LARGE, NO_FIT = 0, 1, 2, 3, 4
UB_RESERVED = 16 * 1024
UB_ALIGN = 32
GM_ALIGN = 512
ROW_SLOTS = 12
STAT_BYTES = 20
MIN_BASE = 16
_U64 = 2**64 - 1


@dataclass(frozen=True)
class HwSpec:
    """On-chip memories of one AI core and its vector cores (defaults: Atlas A2 / 910B)."""

    cube_cores: int = 24
    vec_per_cube: int = 2
    ub_bytes: int = 192 * 1024
    l1_bytes: int = 512 * 1024
    l0a_bytes: int = 64 * 1024
    l0b_bytes: int = 64 * 1024
    l0c_bytes: int = 128 * 1024


@dataclass
class Plan:
    n: int
    d: int
    v: int
    elt_bytes: int
    flags: int
    status: int = OK
    base_m: int = 0
    base_n: int = 0
    base_k: int = 0
    base_d: int = 0
    depth_k: int = 0
    l0c_buffers: int = 0
    a_resident: int = 0
    vec_rows: int = 0
    m_blocks: int = 0
    n_blocks: int = 0
    tail_m: int = 0
    tail_n: int = 0
    segments: int = 0
    seg_blocks: int = 0
    tasks: int = 0
    used_cores: int = 0
    ub_used: int = 0
    l1_used: int = 0
    ws_stats: int = 0
    ws_dz: int = 0
    extra: dict = field(default_factory=dict)

    # index helpers, as in the header
    def task_coords(self, t: int) -> tuple[int, int]:
        return t // self.segments, t % self.segments

    def segment_blocks(self, s: int) -> range:
        return range(min(s * self.seg_blocks, self.n_blocks), min((s + 1) * self.seg_blocks, self.n_blocks))

    def block_rows(self, m_idx: int) -> tuple[int, int]:
        r0 = m_idx * self.base_m
        return r0, r0 + (self.tail_m if m_idx + 1 == self.m_blocks else self.base_m)

    def block_cols(self, nb: int) -> tuple[int, int]:
        c0 = nb * self.base_n
        return c0, c0 + (self.tail_n if nb + 1 == self.n_blocks else self.base_n)


def _ceil_div(a, b):
    return 0 if b == 0 else (a + b - 1) // b


def _align(a, b):
    return _ceil_div(a, b) * b


def _ub_bytes(vec_rows, base_n, elt, flags):
    bwd = bool(flags & FLAG_BACKWARD)
    tile = _align(vec_rows * base_n * 4, UB_ALIGN)
    sizes = [tile, tile, tile,
             tile if (flags & FLAG_SOFTCAP) or bwd else 0,
             vec_rows * base_n * elt if bwd and elt != 4 else 0,
             base_n * (4 + elt) if flags & FLAG_BIAS else 0,
             _align(vec_rows, 8) * ROW_SLOTS * 4,
             base_n * 4 if bwd and (flags & FLAG_BIAS) else 0]
    return sum(_align(s, UB_ALIGN) for s in sizes)


def plan(n: int, d: int, v: int, elt_bytes: int, flags: int, hw: HwSpec = HwSpec()) -> Plan:
    """Mirror of ``fused_lce::tiling::plan`` (same candidate order, same budgets, same grid)."""
    p = Plan(n, d, v, elt_bytes, flags)
    if elt_bytes not in (2, 4):
        p.status = BAD_DTYPE
        return p
    if d == 0 or v == 0:
        p.status = EMPTY_DIM
        return p
    if d > 0x7FFFFFFF or v > 0x7FFFFFFF or hw.cube_cores == 0 or hw.vec_per_cube == 0:
        p.status = TOO_LARGE
        return p
    bwd = bool(flags & FLAG_BACKWARD)
    ub_budget = max(hw.ub_bytes - UB_RESERVED, 0)
    m_cap = MIN_BASE if n == 0 else _align(n, MIN_BASE)
    d16 = _align(d, MIN_BASE)
    found = False
    for bm0 in (128, 64, 32, 16):
        bm = min(bm0, m_cap)
        if bm % (8 * hw.vec_per_cube):
            continue
        for bn in (256, 128, 64, 32, 16):
            if bm * bn * 4 > hw.l0c_bytes:
                continue
            vr = _ceil_div(bm, hw.vec_per_cube)
            if _ub_bytes(vr, bn, elt_bytes, flags) > ub_budget:
                continue
            bk = next((k for k in (256, 128, 64, 32, 16) if (k <= d16 or k == MIN_BASE)
                       and bm * k * elt_bytes * 2 <= hw.l0a_bytes and bn * k * elt_bytes * 2 <= hw.l0b_bytes), 0)
            if bk == 0:
                continue
            bd = 0
            if bwd:
                rows = max(bm, bn)
                bd = next((c for c in (256, 128, 64, 32, 16) if (c <= d16 or c == MIN_BASE)
                           and rows * c * 4 * 2 <= hw.l0c_bytes), 0)
                if bd == 0:
                    continue
            kd = _align(d, bk)
            a_res_bytes = bm * kd * elt_bytes
            a_res = a_res_bytes <= hw.l1_bytes // 2
            depth = l1 = 0
            for dk in (8, 4, 2, 1):
                if dk > 1 and dk * bk > kd:
                    continue
                sl = dk * bk * elt_bytes * 2
                need = (a_res_bytes if a_res else bm * sl) + bn * sl
                if need <= hw.l1_bytes:
                    depth, l1 = dk, need
                    break
            if depth == 0:
                continue
            p.base_m, p.base_n, p.base_k, p.base_d, p.depth_k = bm, bn, bk, bd, depth
            p.a_resident = int(a_res)
            p.l0c_buffers = 2 if bm * bn * 4 * 2 <= hw.l0c_bytes else 1
            p.vec_rows = vr
            p.l1_used = l1
            p.ub_used = _ub_bytes(vr, bn, elt_bytes, flags)
            found = True
            break
        if found:
            break
    if not found:
        p.status = NO_FIT
        return p
    p.m_blocks = _ceil_div(n, p.base_m)
    p.n_blocks = _ceil_div(v, p.base_n)
    p.tail_m = 0 if n == 0 else n - (p.m_blocks - 1) * p.base_m
    p.tail_n = v - (p.n_blocks - 1) * p.base_n
    segs = 1
    if 0 < p.m_blocks < hw.cube_cores:
        segs = max(1, min(hw.cube_cores // p.m_blocks, p.n_blocks))
    p.seg_blocks = _ceil_div(p.n_blocks, segs)
    p.segments = _ceil_div(p.n_blocks, p.seg_blocks)
    p.tasks = p.m_blocks * p.segments
    p.used_cores = min(p.tasks, hw.cube_cores)
    stats = p.segments * n * STAT_BYTES if p.segments > 1 else 0
    dz = p.used_cores * 2 * p.base_m * p.base_n * elt_bytes if bwd else 0
    if stats > _U64 or (bwd and (n * d * 4 > _U64 or v * d * 4 > _U64)) or stats > _U64 - 2 * GM_ALIGN - dz:
        p.status = TOO_LARGE
        return p
    p.ws_stats = _align(stats, GM_ALIGN)
    p.ws_dz = _align(dz, GM_ALIGN)
    return p


def plan_for(hidden: torch.Tensor, weight: torch.Tensor, has_bias: bool, smoothing: bool, softcap: bool,
             backward: bool, hw: HwSpec = HwSpec()) -> Plan:
    flags = (FLAG_BIAS if has_bias else 0) | (FLAG_SMOOTHING if smoothing else 0) | \
            (FLAG_SOFTCAP if softcap else 0) | (FLAG_BACKWARD if backward else 0)
    p = plan(hidden.shape[0], hidden.shape[1], weight.shape[0], hidden.element_size(), flags, hw)
    if p.status != OK:
        raise ValueError(f"no tiling for N={hidden.shape[0]} D={hidden.shape[1]} V={weight.shape[0]} "
                         f"dtype={hidden.dtype}: status {p.status}")
    return p


# ---------------------------------------------------------------------------------------------- kernel pieces
def cube_tile(h_blk: torch.Tensor, w_blk: torch.Tensor, base_k: int) -> torch.Tensor:
    """``h_blk @ w_blk.T`` as the cube computes it: float32 partial products of each K chunk added in chunk
    order into the float32 L0C accumulator."""
    acc = torch.zeros(h_blk.shape[0], w_blk.shape[0], dtype=torch.float32, device=h_blk.device)
    for k0 in range(0, h_blk.shape[1], base_k):
        k1 = min(k0 + base_k, h_blk.shape[1])
        acc += h_blk[:, k0:k1].float() @ w_blk[:, k0:k1].float().t()
    return acc


def vector_logits(z: torch.Tensor, bias_blk: Optional[torch.Tensor], softcap: float) -> torch.Tensor:
    """Vector-core epilogue of a C tile, float32: bias, then softcap."""
    if bias_blk is not None:
        z = z + bias_blk.float()
    if softcap:
        z = torch.tanh(z / softcap) * softcap
    return z


def online_update(state, z, local_labels, c0, global_c0, with_zsum):
    """One vocabulary block of the online softmax, per row, float32. ``state`` = [m, s, zt, zs, amax]."""
    m, s, zt, zs, amax = state
    tmax, targ = z.max(dim=1)  # first index of the maximum within the tile
    new_m = torch.maximum(m, tmax)
    # rows whose max stays -inf (every logit -inf so far) keep s = 0 instead of exp(-inf + inf) = NaN
    finite = new_m != -math.inf
    shift = torch.where(finite, new_m, torch.zeros_like(new_m))
    rescale = torch.where(m == new_m, torch.ones_like(m), torch.exp(m - shift))
    tile_sum = torch.exp(z - shift[:, None]).sum(dim=1)
    s = torch.where(finite, s * rescale + tile_sum, s)
    amax = torch.where(tmax > m, targ.to(torch.int64) + global_c0, amax)  # strict: the first argmax wins
    cols = z.shape[1]
    hit = (local_labels >= c0) & (local_labels < c0 + cols)
    idx = (local_labels - c0).clamp(0, cols - 1)
    zt = zt + torch.where(hit, z.gather(1, idx[:, None]).squeeze(1), torch.zeros_like(zt))
    if with_zsum:
        zs = zs + z.sum(dim=1)
    return [new_m, s, zt, zs, amax]


def merge_segments(parts):
    """Finishing phase of the forward kernel: merge the segments' partial stats of a token block in segment
    order (the lower segment holds the lower vocabulary ids, so the first maximum keeps the first argmax)."""
    m, s, zt, zs, amax = parts[0]
    for pm, ps, pzt, pzs, pam in parts[1:]:
        new_m = torch.maximum(m, pm)
        finite = new_m != -math.inf
        shift = torch.where(finite, new_m, torch.zeros_like(new_m))
        a = torch.where(m == new_m, torch.ones_like(m), torch.exp(m - shift))
        b = torch.where(pm == new_m, torch.ones_like(pm), torch.exp(pm - shift))
        s = torch.where(finite, s * a + ps * b, s + ps)
        amax = torch.where(pm > m, pam, amax)
        m = new_m
        zt = zt + pzt
        zs = zs + pzs
    return m, s, zt, zs, amax


# ---------------------------------------------------------------------------------------------- the kernels
def stats(hidden, weight, bias, labels, vocab_start: int, softcap: float, with_zsum: bool,
          hw: HwSpec = HwSpec(), the_plan: Optional[Plan] = None):
    """Forward kernel: per-token local (max, sum-exp, target logit, sum of logits, first argmax as a global id)
    over this rank's vocabulary rows. Same contract as ``torch.ops.fused_lce._npu_stats``."""
    p = the_plan or plan_for(hidden, weight, bias is not None, with_zsum, bool(softcap), False, hw)
    n = hidden.shape[0]
    dev = hidden.device
    out_m = torch.full((n,), -math.inf, device=dev)
    out_s = torch.zeros(n, device=dev)
    out_zt = torch.zeros(n, device=dev)
    out_zs = torch.zeros(n, device=dev)
    out_am = torch.zeros(n, dtype=torch.int64, device=dev)
    local = labels.to(torch.int64) - vocab_start
    partial: dict[int, list] = {}
    for t in range(p.tasks):
        m_idx, s_idx = p.task_coords(t)
        r0, r1 = p.block_rows(m_idx)
        h_blk = hidden[r0:r1]
        rows = r1 - r0
        state = [torch.full((rows,), -math.inf, device=dev), torch.zeros(rows, device=dev),
                 torch.zeros(rows, device=dev), torch.zeros(rows, device=dev),
                 torch.zeros(rows, dtype=torch.int64, device=dev)]
        for nb in p.segment_blocks(s_idx):
            c0, c1 = p.block_cols(nb)
            z = cube_tile(h_blk, weight[c0:c1], p.base_k)
            z = vector_logits(z, None if bias is None else bias[c0:c1], softcap)
            state = online_update(state, z, local[r0:r1], c0, vocab_start + c0, with_zsum)
        partial.setdefault(m_idx, []).append(state)
        if len(partial[m_idx]) == p.segments:  # all segments of this token block are done
            m, s, zt, zs, am = merge_segments(partial.pop(m_idx))
            out_m[r0:r1], out_s[r0:r1], out_zt[r0:r1], out_zs[r0:r1], out_am[r0:r1] = m, s, zt, zs, am
    return out_m, out_s, out_zt, out_zs, out_am


def grads(grad_tok, hidden, weight, bias, labels, lse, vocab_start: int, vocab_total: int, label_smoothing: float,
          z_loss: float, softcap: float, grad_mask, hw: HwSpec = HwSpec(), the_plan: Optional[Plan] = None):
    """Backward kernel: float32 (dX, dW, db) of ``sum_i grad_tok[i] * loss_i`` (``grad_tok`` already 0 for ignored
    tokens and NaN for out-of-range labels). Same contract as ``torch.ops.fused_lce._npu_grads``."""
    p = the_plan or plan_for(hidden, weight, bias is not None, label_smoothing > 0, bool(softcap), True, hw)
    n, d = hidden.shape
    v = weight.shape[0]
    dev = hidden.device
    want_h, want_w, want_b = bool(grad_mask[0]), bool(grad_mask[1]), bool(grad_mask[2]) and bias is not None
    dx = torch.zeros(n, d, device=dev) if want_h else None
    dw = torch.zeros(v, d, device=dev) if want_w else None
    db = torch.zeros(v, device=dev) if want_b else None
    g = grad_tok.float()
    coef_p = g * (1.0 + 2.0 * z_loss * lse.float())   # softmax
    coef_t = g * (1.0 - label_smoothing)              # one-hot target
    coef_u = g * (label_smoothing / vocab_total)       # uniform smoothing target
    local = labels.to(torch.int64) - vocab_start
    lowp = hidden.dtype != torch.float32
    for t in range(p.tasks):
        m_idx, s_idx = p.task_coords(t)
        r0, r1 = p.block_rows(m_idx)
        h_blk = hidden[r0:r1]
        for nb in p.segment_blocks(s_idx):
            c0, c1 = p.block_cols(nb)
            w_blk = weight[c0:c1]
            z = vector_logits(cube_tile(h_blk, w_blk, p.base_k), None if bias is None else bias[c0:c1], softcap)
            dz = torch.exp(z - lse[r0:r1, None]) * coef_p[r0:r1, None] - coef_u[r0:r1, None]
            y = local[r0:r1]
            hit = (y >= c0) & (y < c1)
            onehot = torch.zeros_like(dz)
            onehot[torch.arange(r1 - r0, device=dev), (y - c0).clamp(0, c1 - c0 - 1)] = \
                torch.where(hit, coef_t[r0:r1], torch.zeros_like(coef_t[r0:r1]))
            dz = dz - onehot
            if softcap:
                dz = dz * (1.0 - (z / softcap) ** 2)
            if want_b:
                db[c0:c1] += dz.sum(dim=0)
            # the cube takes operands in the input dtype: dz is rounded once, products are exact in float32
            dz_op = dz.to(hidden.dtype).float() if lowp else dz
            if want_h:
                dx[r0:r1] += dz_op @ w_blk.float()
            if want_w:
                dw[c0:c1] += dz_op.t() @ h_blk.float()
    return dx, dw, db


# ---------------------------------------------------------------------------------------------- shared finish
def finish(m, s, zt, zs, amax, labels, ignore_index: int, label_smoothing: float, z_loss: float, vocab_total: int):
    """(loss, lse, correct) per token from global statistics: the driver's formula."""
    opts = Options(ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss, vocab_total=vocab_total)
    return driver.loss_from_stats(Stats(m, s, zt, zs, amax), labels, opts, vocab_total)


class Kernels:
    """The emulated kernels behind the interface the "npu" backend calls (``stats`` / ``grads``), so the backend's
    Python glue can be tested end to end without hardware."""

    def __init__(self, hw: HwSpec = HwSpec()):
        self.hw = hw

    def stats(self, hidden, weight, bias, labels, vocab_start, softcap, with_zsum):
        return stats(hidden, weight, bias, labels, vocab_start, softcap, with_zsum, self.hw)

    def grads(self, grad_tok, hidden, weight, bias, labels, lse, vocab_start, vocab_total, label_smoothing, z_loss,
              softcap, grad_mask):
        return grads(grad_tok, hidden, weight, bias, labels, lse, vocab_start, vocab_total, label_smoothing, z_loss,
                     softcap, grad_mask, self.hw)
