"""Small kernels around the logits GEMM: tile statistics -> row statistics, exp tiles -> dz, the label's
logit, fused scale + cast, and the in-place upstream scale that costs nothing when the upstream gradient
is 1."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from .gemm import TileStats, row_coefs


# ---------------------------------------------------------------------------------------------- statistics
@triton.jit
def store_stats(m_ptr, s_ptr, am_ptr, ez_ptr, row, m, s, am, ez, MERGE: tl.constexpr, ENTROPY: tl.constexpr):
    """Stores the row's statistics ``(m, s, am, ez)``, merged first (MERGE) into the stored ones of the
    columns to their left; returns the stored ``(m, s)``."""
    if MERGE:
        m, s, am, ez = merge_stats(m_ptr, s_ptr, am_ptr, ez_ptr, row, m, s, am, ez, ENTROPY)
    tl.store(m_ptr + row, m)
    tl.store(s_ptr + row, s)
    tl.store(am_ptr + row, am)
    if ENTROPY:
        tl.store(ez_ptr + row, ez)
    return m, s


@triton.jit
def merge_stats(m_ptr, s_ptr, am_ptr, ez_ptr, row, m, s, am, ez, ENTROPY: tl.constexpr):
    """The row's stored statistics (max, sum-exp, first argmax, entropy sum ``ez``: columns to the left)
    merged with ``(m, s, am, ez)`` of the columns to its right (lower ids win argmax ties); sums moved to the
    common max, their ``z - m`` factors floored where the exp underflows (a -inf logit adds 0)."""
    m0 = tl.load(m_ptr + row)
    s0 = tl.load(s_ptr + row)
    new_m = tl.maximum(m0, m)
    ref = tl.where(new_m == float("-inf"), 0.0, new_m)
    d0 = m0 - ref
    d1 = m - ref
    f0 = tl.exp(d0)
    f1 = tl.exp(d1)
    if ENTROPY:
        ez = (f0 * (tl.load(ez_ptr + row) + tl.maximum(d0, -104.0) * s0)
              + f1 * (ez + tl.maximum(d1, -104.0) * s))
    am = tl.where(m > m0, am, tl.load(am_ptr + row))
    return new_m, s0 * f0 + s * f1, am, ez


@triton.jit(do_not_specialize=["stride_t", "ntiles", "col_off"])
def _combine_kernel(
    tm_ptr, ts_ptr, ta_ptr, tz_ptr, te_ptr, stride_t, ntiles,
    m_ptr, s_ptr, zs_ptr, am_ptr, ez_ptr, lse_ptr, col_off, map_ptr, count_ptr,
    MERGE: tl.constexpr, SMOOTH: tl.constexpr, ENTROPY: tl.constexpr, WRITE_LSE: tl.constexpr,
    MAP: tl.constexpr, COUNT: tl.constexpr, BLOCK_T: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    dst = row  # the output row of the statistics (the lse stays at ``row``)
    if MAP:
        dst = tl.load(map_ptr + row).to(tl.int64)
    base = row * stride_t
    offs = tl.arange(0, BLOCK_T)
    m_v = tl.full([BLOCK_T], float("-inf"), tl.float32)
    for t0 in range(0, ntiles, BLOCK_T):
        msk = t0 + offs < ntiles
        m_v = tl.maximum(m_v, tl.load(tm_ptr + base + t0 + offs, mask=msk, other=float("-inf")))
    m = tl.max(m_v, axis=0)
    ref = tl.where(m == float("-inf"), 0.0, m)
    s_v = tl.zeros([BLOCK_T], tl.float32)
    z_v = tl.zeros([BLOCK_T], tl.float32)
    e_v = tl.zeros([BLOCK_T], tl.float32)
    a_v = tl.full([BLOCK_T], 2147483647, tl.int32)
    for t0 in range(0, ntiles, BLOCK_T):
        msk = t0 + offs < ntiles
        mt = tl.load(tm_ptr + base + t0 + offs, mask=msk, other=float("-inf"))
        st = tl.load(ts_ptr + base + t0 + offs, mask=msk, other=0.0)
        # exp(-inf - ref) = 0 for empty tiles; a NaN in st (a NaN logit) poisons the sum
        f = tl.exp(mt - ref)
        s_v += tl.where(mt == float("-inf"), tl.where(st != st, st, 0.0), st * f)
        # each tile's sum moved to the row max: e^(m_t - m) (ez_t + (m_t - m) s_t), floored like s
        if ENTROPY:
            et = tl.load(te_ptr + base + t0 + offs, mask=msk, other=0.0)
            e_v += tl.where(mt == float("-inf"), 0.0, f * (et + tl.maximum(mt - ref, -104.0) * st))
        a_v = tl.minimum(a_v, tl.where(msk & (mt == m), tl.load(ta_ptr + base + t0 + offs, mask=msk, other=0),
                                       2147483647))
        if SMOOTH:
            z_v += tl.load(tz_ptr + base + t0 + offs, mask=msk, other=0.0)
    s = tl.sum(s_v, axis=0)
    ez = tl.sum(e_v, axis=0)
    am = tl.min(a_v, axis=0)
    am = tl.where(am == 2147483647, 0, am).to(tl.int64) + col_off  # global id
    zs = tl.sum(z_v, axis=0)
    if COUNT:  # rows from count on were not computed (their tiles are unset): neutral statistics, lse 0
        dead = row >= tl.load(count_ptr)
        zs = tl.where(dead, 0.0, zs)
        ez = tl.where(dead, 0.0, ez)
        am = tl.where(dead, 0, am)
        if MERGE:  # an empty right part: the merge keeps the neutral left part
            m = tl.where(dead, float("-inf"), m)
            s = tl.where(dead, 0.0, s)
        else:
            m = tl.where(dead, 0.0, m)
            s = tl.where(dead, 1.0, s)
    if MERGE:  # fold into the statistics of the vocabulary chunks to the left
        zs += tl.load(zs_ptr + dst)
    tl.store(zs_ptr + dst, zs)
    m, s = store_stats(m_ptr, s_ptr, am_ptr, ez_ptr, dst, m, s, am, ez, MERGE, ENTROPY)
    if WRITE_LSE:
        tl.store(lse_ptr + row, m + tl.log(s))


def combine(tiles: TileStats, ntiles: int, m, s, zs, am, *, col_off: int, merge: bool = False,
            lse: Optional[torch.Tensor] = None, ez: Optional[torch.Tensor] = None,
            rows_out: Optional[torch.Tensor] = None, count: Optional[torch.Tensor] = None) -> None:
    """Row statistics from tile statistics (``ntiles`` columns of the tile arrays), optionally merged into
    ``m, s, zs, am`` (and ``ez``, the entropy sum, when the tiles have one); the lse too when ``lse`` is given
    (one device: the row's statistics are global). ``rows_out``: tile row ``r``'s statistics go to row
    ``rows_out[r]`` of the outputs (its lse stays at ``r``). ``count`` (a device integer): tile rows from
    ``count`` on were not computed; their outputs get neutral statistics (m 0, s 1, the rest 0)."""
    rows = rows_out.shape[0] if rows_out is not None else m.shape[0]
    if rows == 0:
        return
    entropy = tiles.ez is not None
    if entropy and ez is None:
        raise ValueError("combine: tiles with entropy sums need an ez output")
    _combine_kernel[(rows,)](
        tiles.m, tiles.s, tiles.am, tiles.zs if tiles.zs is not None else tiles.m,
        tiles.ez if entropy else tiles.m, tiles.m.stride(0), ntiles,
        m, s, zs, am, ez if entropy else m, lse if lse is not None else m, int(col_off),
        rows_out if rows_out is not None else m, count if count is not None else m,
        MERGE=bool(merge), SMOOTH=tiles.zs is not None, ENTROPY=entropy, WRITE_LSE=lse is not None,
        MAP=rows_out is not None, COUNT=count is not None,
        BLOCK_T=max(16, min(256, triton.next_power_of_2(max(ntiles, 1)))),
        num_warps=1 if ntiles <= 64 else 4,
    )


@triton.jit(do_not_specialize=["label_off", "V", "inv_temp"])
def _target_kernel(h_ptr, w_ptr, b_ptr, y_ptr, out_ptr, stride_h, stride_w, label_off, V, D, inv_temp,
                   HAS_BIAS: tl.constexpr, TEMP: tl.constexpr, BD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    yl = tl.load(y_ptr + row).to(tl.int64) - label_off
    inside = (yl >= 0) & (yl < V)
    ys = tl.where(inside, yl, 0)
    offs = tl.arange(0, BD)
    acc = tl.zeros([BD], tl.float32)
    for k0 in range(0, D, BD):
        msk = k0 + offs < D
        hv = tl.load(h_ptr + row * stride_h + k0 + offs, mask=msk, other=0.0).to(tl.float32)
        wv = tl.load(w_ptr + ys * stride_w + k0 + offs, mask=msk, other=0.0).to(tl.float32)
        acc += hv * wv
    z = tl.sum(acc, axis=0)
    if HAS_BIAS:
        z += tl.load(b_ptr + ys, mask=inside, other=0.0).to(tl.float32)
    if TEMP:
        z = z * inv_temp
    tl.store(out_ptr + row, tl.where(inside, z, 0.0))


def target_logit(h, w, bias, labels, label_off: int, out, inv_temp: float = 1.0) -> None:
    """out[i] = (h[i] . w[label_i - label_off] (+ bias)) * inv_temp in float32 where the label is a row of
    ``w``, else 0."""
    n, d = h.shape
    if n == 0:
        return
    _target_kernel[(n,)](h, w, bias if bias is not None else h, labels, out, h.stride(0), w.stride(0),
                         int(label_off), w.shape[0], d, float(inv_temp), HAS_BIAS=bias is not None,
                         TEMP=inv_temp != 1.0, BD=min(1024, triton.next_power_of_2(max(d, 16))), num_warps=4)


# ---------------------------------------------------------------------------------------------- gradient
# ``ld`` (a multiple of 64) stays specialized: with it Triton proves 16-byte alignment and vectorizes the row
# accesses; columns are masked against ``ld``, not V, for the same reason (the padding columns are scratch)
@triton.jit(do_not_specialize=["stride_t", "label_off", "M", "a0", "a1", "t0", "u0"])
def _dz_from_exp_kernel(
    e_ptr, ld, tm_ptr, stride_t, lse_ptr, a_ptr, t_ptr, u_ptr, scale_ptr, y_ptr, label_off, M,
    a0, a1, t0, u0,
    LOSS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_U: tl.constexpr, HAS_A1: tl.constexpr,
    TILE_N: tl.constexpr, BR: tl.constexpr,
):
    pid_r = tl.program_id(0)
    t = tl.program_id(1)
    rows = pid_r * BR + tl.arange(0, BR)
    rmask = rows < M
    rows64 = rows.to(tl.int64)
    m_t = tl.load(tm_ptr + rows64 * stride_t + t, mask=rmask, other=0.0)
    lse = tl.load(lse_ptr + rows, mask=rmask, other=0.0)
    # the one-pass loss: a = g (a0 + a1 lse), t = g t0, u = g u0 (``fused_lce.core.formulas.loss_terms``), g
    # from a_ptr
    if LOSS:
        g = tl.load(a_ptr + rows, mask=rmask, other=0.0)
        if HAS_SCALE:
            g = g * tl.load(scale_ptr)
        coef = g * a0
        if HAS_A1:
            coef = g * (a0 + a1 * lse)
        tgt = g * t0
        u = g * u0
        keep = g != 0.0
    else:  # the driver's per-row coefficients
        coef, tgt, u, _ = row_coefs(a_ptr, t_ptr, u_ptr, a_ptr, scale_ptr, rows, rmask, HAS_U, False,
                                    HAS_SCALE, BR)
        keep = (coef != 0.0) | (tgt != 0.0) | (u != 0.0)  # a NaN is not 0: it poisons its row
    ref = tl.where(m_t == float("-inf"), 0.0, m_t)
    c = coef * tl.exp(ref - lse)  # the tile's exp values were taken relative to its max
    yl = tl.load(y_ptr + rows, mask=rmask, other=-1).to(tl.int64) - label_off
    cols = t * TILE_N + tl.arange(0, TILE_N)
    msk = rmask[:, None] & (cols < ld)[None, :]
    ptr = e_ptr + rows64[:, None] * ld + cols[None, :]
    e = tl.load(ptr, mask=msk, other=0.0).to(tl.float32)
    d = c[:, None] * e
    if HAS_U:
        d = d - u[:, None]
    d = tl.where(cols[None, :] == yl[:, None], d - tgt[:, None], d)
    d = tl.where(keep[:, None], d, 0.0)
    tl.store(ptr, d.to(e_ptr.dtype.element_ty), mask=msk)


def dz_from_exp(e: torch.Tensor, tile_m: torch.Tensor, tile_n: int, lse, coef, scale, labels,
                label_off: int, *, terms=(1.0, 0.0, 1.0, 0.0)) -> None:
    """In place over the EXP tiles ``e [M, V]`` (a column slice of a buffer whose row stride is a multiple of
    64 elements; the padding columns are overwritten): ``dz = a exp(m_t - lse) e - t [col == label] - u``, 0
    on rows whose coefficients are all 0; ``scale`` (0-dim) multiplies them. ``coef``: the driver's per-row
    ``(a, t, u)`` (``u`` may be None), or a tensor ``g`` of token weights (the one-pass loss), whose
    coefficients are formed here from the loss's ``terms`` (``fused_lce.core.LossTerms``): ``a = g (a0 + a1
    lse)``, ``t = g t0``, ``u = g u0``."""
    m, v = e.shape
    if m == 0 or v == 0:
        return
    ld = e.stride(0)
    assert ld % 64 == 0 and e.stride(1) == 1, "dz_from_exp wants rows padded to 64 elements"
    loss = isinstance(coef, torch.Tensor)
    a, t, u = (coef, None, None) if loss else coef
    a0, a1, t0, u0 = (float(x) for x in terms)
    br = 16
    _dz_from_exp_kernel[(triton.cdiv(m, br), triton.cdiv(v, tile_n))](
        e, ld, tile_m, tile_m.stride(0), lse, a, t if t is not None else a, u if u is not None else a,
        scale if scale is not None else a, labels, int(label_off), m, a0, a1, t0, u0,
        LOSS=loss, HAS_SCALE=scale is not None, HAS_U=bool(u0) if loss else u is not None, HAS_A1=bool(a1),
        TILE_N=tile_n, BR=br, num_warps=4,
    )


# ---------------------------------------------------------------------------------------------- scaling
@triton.jit  # n stays specialized: its divisibility lets the masked accesses vectorize
def _scale_cast_kernel(src_ptr, dst_ptr, n, scale_ptr, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    msk = offs < n
    x = tl.load(src_ptr + offs, mask=msk, other=0.0).to(tl.float32)
    if HAS_SCALE:
        x = x * tl.load(scale_ptr)
    tl.store(dst_ptr + offs, x.to(dst_ptr.dtype.element_ty), mask=msk)


def scale_cast(src: torch.Tensor, dtype: torch.dtype, scale: Optional[torch.Tensor],
               out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(src * scale).to(dtype)`` in one pass (contiguous ``src`` and ``out``; ``scale`` a 0-dim float32
    tensor or None), into ``out`` when given."""
    if src.dtype == dtype and scale is None and out is None:
        return src
    dst = torch.empty(src.shape, device=src.device, dtype=dtype) if out is None else out
    n = src.numel()
    if n:
        block = 4096
        _scale_cast_kernel[(triton.cdiv(n, block),)](src, dst, n, scale if scale is not None else src,
                                                     HAS_SCALE=scale is not None, BLOCK=block, num_warps=8)
    return dst


@triton.jit
def _scale_part(x_ptr, n, g, BLOCK: tl.constexpr, NPROG: tl.constexpr):
    for start in range(tl.program_id(0).to(tl.int64) * BLOCK, n, NPROG * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        msk = offs < n
        x = tl.load(x_ptr + offs, mask=msk, other=0.0).to(tl.float32)
        tl.store(x_ptr + offs, (x * g).to(x_ptr.dtype.element_ty), mask=msk)


@triton.jit
def _scale_unless_one_kernel(x0_ptr, n0, x1_ptr, n1, x2_ptr, n2, g_ptr, COUNT: tl.constexpr,
                             BLOCK: tl.constexpr, NPROG: tl.constexpr):
    g = tl.load(g_ptr).to(tl.float32)
    if g != 1.0:  # the usual upstream gradient is exactly 1: then no byte of x is read or written
        _scale_part(x0_ptr, n0, g, BLOCK, NPROG)
        if COUNT > 1:
            _scale_part(x1_ptr, n1, g, BLOCK, NPROG)
        if COUNT > 2:
            _scale_part(x2_ptr, n2, g, BLOCK, NPROG)


def scale_unless_one_(tensors: Sequence[torch.Tensor], g: torch.Tensor) -> None:
    """In place ``x *= g`` for each contiguous tensor (``g`` a 0-dim float32 tensor on the same device),
    reading ``g`` on the device: a few microseconds when ``g == 1``, one pass otherwise. No host
    synchronisation; one launch for up to three tensors (dX, dW, db: each launch costs tens of microseconds of
    host time)."""
    block, nprog = 4096, 1024
    xs = [x for x in tensors if x.numel()]
    for k in range(0, len(xs), 3):
        part = xs[k:k + 3]
        args = []
        for j in range(3):
            x = part[j] if j < len(part) else part[0]
            args += [x, x.numel() if j < len(part) else 0]
        grid = min(nprog, triton.cdiv(max(x.numel() for x in part), block))
        _scale_unless_one_kernel[(grid,)](*args, g, COUNT=len(part), BLOCK=block, NPROG=nprog, num_warps=8)
