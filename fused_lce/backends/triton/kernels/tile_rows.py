"""The row kernel of the cuBLAS path: over float32 logits rows (bias, softcap and temperature applied here),
the per-row statistics (online softmax, first argmax, sums) and / or the gradient rows ``dz``, written in
place."""
from __future__ import annotations

from typing import Optional

import triton
import triton.language as tl

from ....core import Coefs, EntropyStats, LossTerms, Options, Tensors
from . import rows

BLOCK = 2048  # logits per loop iteration of the row kernel
NUM_WARPS = 8


@triton.jit
def _softcap(x, cap):
    """``cap * tanh(x / cap)`` to about one float32 unit for every ``cap`` (as Cephes' tanhf), no libdevice
    (runs under the interpreter): with ``y = x / cap``, ``x (1 + y^2 P(y^2))`` for ``|y| < 0.625`` (tanhf's
    odd polynomial; ``x`` itself where ``y^2`` underflows), else ``cap * sign(y) (1 - e) / (1 + e)``, ``e =
    exp(-2|y|)`` in (0, 1] (exact limits at +-inf, no overflow). The quotient alone loses small ``|y|``: ``1 -
    e`` cancels."""
    y = x / cap
    q = y * y
    p = -5.70498872745e-3 * q + 2.06390887954e-2
    p = p * q - 5.37397155531e-2
    p = p * q + 1.33314422036e-1
    p = p * q - 3.33332819422e-1
    e = tl.exp(-2.0 * tl.abs(y))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(tl.abs(y) < 0.625, x + x * (q * p), cap * tl.where(y < 0, -t, t))


@triton.jit
def _capped(z_row, bias_ptr, cols, msk, cap, HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr):
    """The logits of ``cols`` of one row as the loss sees them: plus the bias, then softcapped (0 where
    masked)."""
    z = tl.load(z_row + cols, mask=msk, other=0.0)
    if HAS_BIAS:
        z += tl.load(bias_ptr + cols, mask=msk, other=0.0).to(tl.float32)
    if SOFTCAP:
        z = _softcap(z, cap)
    return z


@triton.jit
def _rows_kernel(
    z_ptr, stride_z,  # float32 logits rows (bias, softcap and temperature not applied yet)
    dz_ptr, stride_dz,  # gradient rows; may alias z_ptr (COMPACT: half-width elements in the same row)
    bias_ptr,  # bias of these columns (HAS_BIAS)
    y_ptr,  # labels of these rows (global ids, int32/int64)
    # GRAD: per-row float32 coefficients of dz = p (a + b z) - t onehot - u (b: HAS_B, u: HAS_U), formed by
    # the driver; LOSS (the one-pass loss only): a_ptr holds the token weight g and the loss's coefficients
    # a = g (a0 + a1 lse), t = g t0, u = g u0 (the driver's LossTerms) are formed here from the row's own lse
    # (0 ignored, NaN bad label either way)
    a_ptr, t_ptr, b_ptr, u_ptr,
    scale_ptr,  # 0-dim float32 factor of every gradient (HAS_SCALE)
    lse_ptr,  # STATS == 0 and GRAD: the row's global lse (read)
    # STATS: raw statistics (read first when MERGE); ez: ENTROPY
    m_ptr, s_ptr, zt_ptr, zs_ptr, am_ptr, ez_ptr,
    ncols, label_off, a0, a1, t0, u0, cap, inv_temp,
    STATS: tl.constexpr, MERGE: tl.constexpr, GRAD: tl.constexpr, LOSS: tl.constexpr, HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, TEMP: tl.constexpr, SMOOTH: tl.constexpr,
    HAS_A1: tl.constexpr, ENTROPY: tl.constexpr, HAS_B: tl.constexpr, HAS_U: tl.constexpr,
    COMPACT: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # 64-bit offsets: rows * columns exceeds 2**31 on real shapes
    z_row = z_ptr + row * stride_z
    offs = tl.arange(0, BLOCK)
    nblk = tl.cdiv(ncols, BLOCK)
    y = tl.load(y_ptr + row).to(tl.int64)
    yl = y - label_off  # label as a column of this chunk (ignored / bad / other shard: outside it)
    inside = (yl >= 0) & (yl < ncols)

    if STATS:
        # per-lane online softmax: each lane keeps its own max / sum-exp / first argmax / sum (/ entropy sum
        # ez = sum e^(z - m) (z - m)), reduced across lanes once at the end (the loop just streams)
        m_v = tl.full([BLOCK], float("-inf"), tl.float32)
        s_v = tl.zeros([BLOCK], tl.float32)
        zs_v = tl.zeros([BLOCK], tl.float32)
        ez_v = tl.zeros([BLOCK], tl.float32)
        am_v = tl.zeros([BLOCK], tl.int32)
        # last block first: the gradient pass below starts at the first block, which is then still in L2
        for kk in range(0, nblk):
            k = nblk - 1 - kk
            cols = k * BLOCK + offs
            msk = cols < ncols
            z = _capped(z_row, bias_ptr, cols, msk, cap, HAS_BIAS, SOFTCAP)
            if TEMP:  # after the softcap
                z = z * inv_temp
            if SMOOTH:
                zs_v += tl.where(msk, z, 0.0)
            z = tl.where(msk, z, float("-inf"))
            up = z > m_v
            # columns arrive right to left, so a tie moves the lane's first argmax left
            am_v = tl.where(msk & (z >= m_v), cols, am_v)
            new_m = tl.maximum(m_v, z)
            ref = tl.where(new_m == float("-inf"), 0.0, new_m)
            dlt = tl.minimum(m_v, z) - ref
            e = tl.exp(dlt)  # one exp: the larger of the two is exp(0) = 1
            if ENTROPY:
                # e (z - m) with z - m floored where exp underflows: a -inf logit adds 0, not 0 * -inf
                ed = e * tl.maximum(dlt, -104.0)
                ez_v = tl.where(up, e * ez_v + ed * s_v, ez_v + ed)
            s_v = tl.where(up, s_v * e + 1.0, s_v + e)
            s_v = tl.where(z != z, z, s_v)  # a NaN logit poisons the sum (max/min would skip it)
            m_v = new_m
        m = tl.max(m_v, axis=0)
        ref = tl.where(m == float("-inf"), 0.0, m)
        f_v = tl.exp(m_v - ref)
        s = tl.sum(s_v * f_v, axis=0)
        ez = tl.sum(ez_v, axis=0)  # 0 without ENTROPY
        if ENTROPY:  # each lane's sum moved to the row max like s: e^(m_l - m) (ez_l + (m_l - m) s_l)
            ez = tl.sum(f_v * (ez_v + tl.maximum(m_v - ref, -104.0) * s_v), axis=0)
        am = tl.min(tl.where(m_v == m, am_v, 2147483647), axis=0).to(tl.int64)
        zs = tl.sum(zs_v, axis=0)
        yc = tl.where(inside, yl, 0)
        zt = _capped(z_row, bias_ptr, yc, inside, cap, HAS_BIAS, SOFTCAP)
        if TEMP:
            zt = zt * inv_temp
        zt = tl.where(inside, zt, 0.0)
        am += label_off  # global id
        if MERGE:  # fold in the statistics of the chunks to the left
            zt += tl.load(zt_ptr + row)
            zs += tl.load(zs_ptr + row)
        tl.store(zt_ptr + row, zt)
        tl.store(zs_ptr + row, zs)
        m, s = rows.store_stats(m_ptr, s_ptr, am_ptr, ez_ptr, row, m, s, am, ez, MERGE, ENTROPY)
        lse = m + tl.log(s)  # one device: the row's own statistics are global
    else:
        lse = tl.load(lse_ptr + row)

    if GRAD:
        if LOSS:
            g = tl.load(a_ptr + row).to(tl.float32)
            if HAS_SCALE:
                g = g * tl.load(scale_ptr)
            a = g * a0  # coefficient of softmax
            if HAS_A1:
                a = g * (a0 + a1 * lse)
            t = g * t0  # coefficient of the one-hot target
            u = g * u0  # coefficient of the uniform smoothing target
            cb = 0.0
            dead = g == 0
        else:
            sc = 1.0
            if HAS_SCALE:
                sc = tl.load(scale_ptr)
            a = tl.load(a_ptr + row) * sc
            t = tl.load(t_ptr + row) * sc
            u = 0.0
            if HAS_U:
                u = tl.load(u_ptr + row) * sc
            cb = 0.0  # coefficient of softmax * z (the entropy)
            if HAS_B:
                cb = tl.load(b_ptr + row) * sc
            dead = (a == 0) & (t == 0)  # a NaN is not 0: it poisons the row
            if HAS_U:
                dead = dead & (u == 0)
            if HAS_B:
                dead = dead & (cb == 0)
        dz_row = dz_ptr + row * stride_dz
        if dead:  # ignored token: a zero row, without reading the logits
            for k in range(0, nblk):
                cols = k * BLOCK + offs
                tl.store(dz_row + cols, tl.zeros([BLOCK], dz_ptr.dtype.element_ty), mask=cols < ncols)
        else:
            for k in range(0, nblk):
                cols = k * BLOCK + offs
                msk = cols < ncols
                c = _capped(z_row, bias_ptr, cols, msk, cap, HAS_BIAS, SOFTCAP)
                z = c
                if TEMP:
                    z = c * inv_temp
                if HAS_B:
                    # z floored where p underflows: p = 0 gives 0 also where z = -inf
                    d = tl.exp(z - lse) * (a + cb * tl.maximum(z, lse - 104.0))
                else:
                    d = a * tl.exp(z - lse)
                if HAS_U:
                    d = d - u
                d = tl.where(cols == yl, d - t, d)
                if SOFTCAP:  # d softcap(x) / dx at the capped logit (the temperature is in the coefficients)
                    r = c / cap
                    d = d * (1.0 - r * r)
                if COMPACT:
                    # block k's half-width store lands on logits that other warps loaded in earlier
                    # iterations (or this one): every warp must have loaded them first
                    tl.debug_barrier()
                tl.store(dz_row + cols, d.to(dz_ptr.dtype.element_ty), mask=msk)


def launch(t: Tensors, opts: Options, z, rows: slice, *, stats=None, merge=False, grad=False, dz=None, g=None,
            terms: LossTerms = LossTerms(1.0, 0.0, 1.0, 0.0), coef: Optional[Coefs] = None,
            scale=None, lse=None, v0=0, v1=None):
    """The row kernel over the rows of a logits tile ``z`` (columns ``[v0, v1)`` of this shard). ``stats``: a
    ``Stats`` / ``EntropyStats`` to write (and merge into). Gradients: from the driver's per-row ``coef`` or,
    for the one-pass loss only (``stats`` and ``grad``), from the token weight ``g`` (the loss formula in the
    kernel)."""
    nrows = z.shape[0]
    if nrows == 0:
        return
    v1 = t.weight.shape[0] if v1 is None else v1
    bias = t.bias[v0:v1] if t.bias is not None else None

    def arg(x):  # pointers whose constexpr flag is off are never dereferenced: pass z in their place
        return z if x is None else x

    raw = tuple(stats[:5]) if stats is not None else (z,) * 5
    ez = stats.ez if isinstance(stats, EntropyStats) else None
    loss = grad and coef is None
    if grad and loss and g is None:
        raise RuntimeError("fused_lce triton: the row kernel's gradient needs coefficients")
    a, tc, cb, u = (g, None, None, None) if loss else (coef if grad else (None,) * 4)
    k = terms
    temp = float(opts.temperature)
    _rows_kernel[(nrows,)](
        z, z.stride(0),
        arg(dz), dz.stride(0) if dz is not None else 0,
        arg(bias), t.labels[rows], arg(a), arg(tc), arg(cb), arg(u), arg(scale), arg(lse), *raw, arg(ez),
        v1 - v0, int(opts.vocab_start + v0), k.a0, k.a1, k.t0, k.u0, float(opts.softcap or 1.0), 1.0 / temp,
        STATS=stats is not None, MERGE=bool(merge), GRAD=bool(grad), LOSS=bool(loss),
        HAS_SCALE=scale is not None, HAS_BIAS=bias is not None, SOFTCAP=bool(opts.softcap), TEMP=temp != 1.0,
        SMOOTH=opts.wants_zsum, HAS_A1=bool(k.a1), ENTROPY=ez is not None,
        HAS_B=cb is not None, HAS_U=bool(k.u0) if loss else u is not None,
        COMPACT=bool(grad and dz is not None and dz.element_size() != z.element_size()),
        BLOCK=BLOCK, num_warps=NUM_WARPS,
    )
