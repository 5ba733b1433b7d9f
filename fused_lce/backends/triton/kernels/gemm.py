"""The logits GEMM with the cross-entropy work in its epilogue.

``z = (h @ W.T (+ bias)) / temperature`` for a block of tokens, tile by tile (BM tokens x BN vocabulary
columns, the full hidden size reduced in float32 on the tensor cores), then, on the float32 accumulator, one
of three epilogues:

* ``EXP``: per row of the tile its max ``m_t``, ``s_t = sum exp(z - m_t)``, first argmax (and ``sum z`` with
  label smoothing, ``sum exp(z - m_t) (z - m_t)`` for the entropy) into small per-tile arrays, and ``exp(z -
  m_t)`` stored in the input dtype. The gradient ``dz = a exp(z - lse) - ...`` is then ``a exp(m_t - lse) *
  e`` (``rows.dz_from_exp``): every stored value lies in [0, 1] and carries one rounding of relative size 2^-9
  (bf16), where a bf16 logit would carry one of size 2^-9 * |z| into the exponent. The statistics come from
  the unrounded float32 accumulator.
* ``STATS``: the statistics only, nothing stored (the compact schedule's first pass).
* ``DZ``: the lse is known (recompute / compact second pass): ``dz`` itself is stored, from the per-row
  coefficients the driver formed (``dz = p (a + b z) - t onehot - u``; ``b`` is the entropy's term).

Tile order: groups of GROUP_M row tiles sweep the vocabulary, so a group's hidden rows stay in L2 while each
weight tile is read from memory once per group. With ``PERSISTENT`` a fixed grid of programs walks the tiles
(the next tile's loads can start during the epilogue; ``ws`` asks Triton to warp-specialise that loop).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

MODE_EXP, MODE_STATS, MODE_DZ = 0, 1, 2
LOG2E = 1.4426950408889634


@triton.jit
def row_coefs(a_ptr, t_ptr, u_ptr, b_ptr, scale_ptr, rows, rmask, HAS_U: tl.constexpr, HAS_B: tl.constexpr,
              HAS_SCALE: tl.constexpr, BR: tl.constexpr):
    """The driver's per-row gradient coefficients ``(a, t, u, b)`` of ``rows`` (``u`` / ``b`` 0 when absent),
    each times the 0-dim scale when there is one."""
    a = tl.load(a_ptr + rows, mask=rmask, other=0.0)
    t = tl.load(t_ptr + rows, mask=rmask, other=0.0)
    u = tl.zeros([BR], tl.float32)
    if HAS_U:
        u = tl.load(u_ptr + rows, mask=rmask, other=0.0)
    b = tl.zeros([BR], tl.float32)
    if HAS_B:
        b = tl.load(b_ptr + rows, mask=rmask, other=0.0)
    if HAS_SCALE:
        sc = tl.load(scale_ptr)
        a = a * sc
        t = t * sc
        u = u * sc
        b = b * sc
    return a, t, u, b


@dataclass(frozen=True)
class GemmConfig:
    bm: int = 128
    bn: int = 256
    bk: int = 64
    stages: int = 3
    warps: int = 8
    group_m: int = 8
    # the output tile is stored in this many column pieces (less shared memory for the store)
    subtile: int = 2
    persistent: int = 1  # programs per SM of a persistent grid; 0: one program per tile
    # persistent grid: Triton's automatic warp specialisation of the tile loop (loads / MMA / epilogue)
    ws: int = 0

    @staticmethod
    @functools.lru_cache(maxsize=64)  # the launch path parses the environment's text on every call
    def parse(text: str) -> "GemmConfig":
        """``"bm,bn,bk,stages,warps,group_m,subtile,persistent,ws"`` (a prefix is enough)."""
        vals = [int(x) for x in text.split(",") if x.strip()]
        return GemmConfig(*vals)


def default_config(d: int) -> GemmConfig:
    """The tile configuration (measured on the H200, docs/performance.md: of ten configurations the persistent
    128x256x64 grid, one program per SM, 3 stages, 8 warps, was fastest at D = 4096 and 2048 and for an odd
    V); FUSED_LCE_GEMM_CONFIG overrides."""
    env = os.environ.get("FUSED_LCE_GEMM_CONFIG", "").strip()
    if env:
        return GemmConfig.parse(env)
    return GemmConfig()


@triton.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    gsz = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % gsz
    pid_n = (tile % per_group) // gsz
    return pid_m, pid_n


@triton.jit
def _one_tile(
    tile, num_m, h_desc, w_desc, o_desc, M, V, D, bias_ptr, tm_ptr, ts_ptr, ta_ptr, tz_ptr, te_ptr,
    stride_t, y_ptr, label_off, lse_ptr, a_ptr, t_ptr, b_ptr, u_ptr, scale_ptr, inv_temp,
    MODE: tl.constexpr, HAS_BIAS: tl.constexpr, TEMP: tl.constexpr, SMOOTH: tl.constexpr,
    ENTROPY: tl.constexpr, HAS_B: tl.constexpr, HAS_U: tl.constexpr, HAS_SCALE: tl.constexpr,
    OUT_BF16: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    SUBTILE: tl.constexpr, UPCAST: tl.constexpr,
):
    num_n = tl.cdiv(V, BN)
    pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
    off_m = pid_m * BM
    off_n = pid_n * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kk in range(tl.cdiv(D, BK)):
        a = h_desc.load([off_m, kk * BK])
        b = w_desc.load([off_n, kk * BK])
        if UPCAST:  # interpreter only: its tl.dot mishandles bf16 operands (Triton 3.9)
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b.T, acc)

    rows = off_m + tl.arange(0, BM)
    rmask = rows < M
    cols = off_n + tl.arange(0, BN)
    cmask = cols < V
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if TEMP:  # z = logits / temperature (log-probs)
        acc = acc * inv_temp
    z = tl.where(cmask[None, :], acc, float("-inf"))
    # DZ: the gradient of this tile, the row lse known: dz = p (a + b z) - t onehot - u (driver's rows)
    if MODE == 2:
        lse = tl.load(lse_ptr + rows, mask=rmask, other=0.0)
        a, tc, uc, cb = row_coefs(a_ptr, t_ptr, u_ptr, b_ptr, scale_ptr, rows, rmask, HAS_U, HAS_B,
                                  HAS_SCALE, BM)
        yl = tl.load(y_ptr + rows, mask=rmask, other=-1).to(tl.int64) - label_off
        p = tl.exp2((z - lse[:, None]) * 1.4426950408889634)
        if HAS_B:  # the entropy term; z floored where p underflows, so p = 0 gives 0 also where z = -inf
            out = p * (a[:, None] + cb[:, None] * tl.maximum(z, lse[:, None] - 104.0))
        else:
            out = a[:, None] * p
        if HAS_U:
            out = out - uc[:, None]
        out = tl.where(cols[None, :] == yl[:, None], out - tc[:, None], out)
        # ignored rows (a NaN is not 0: it poisons)
        dead = (a == 0.0) & (tc == 0.0) & (uc == 0.0) & (cb == 0.0)
        out = tl.where(dead[:, None], 0.0, out)  # ignored rows: exact zeros whatever the logits
    else:
        m_t = tl.max(z, axis=1)
        ref = tl.where(m_t == float("-inf"), 0.0, m_t)
        out = tl.exp2((z - ref[:, None]) * 1.4426950408889634)
        s_t = tl.sum(out, axis=1)
        # first argmax: the lowest column holding the max (cheaper than tl.argmax's (value, index) reduction)
        am = tl.min(tl.where(z == m_t[:, None], cols[None, :], 2147483647), axis=1)
        t_off = rows.to(tl.int64) * stride_t + pid_n
        tl.store(tm_ptr + t_off, m_t, mask=rmask)
        tl.store(ts_ptr + t_off, s_t, mask=rmask)
        tl.store(ta_ptr + t_off, am, mask=rmask)
        if SMOOTH:
            tl.store(tz_ptr + t_off, tl.sum(tl.where(cmask[None, :], acc, 0.0), axis=1), mask=rmask)
        if ENTROPY:  # sum e^(z - m_t) (z - m_t), z - m_t floored where the exp underflows (-inf adds 0)
            tl.store(te_ptr + t_off, tl.sum(out * tl.maximum(z - ref[:, None], -104.0), axis=1), mask=rmask)
    if MODE != 1:
        out_ty = tl.bfloat16 if OUT_BF16 else tl.float16
        if SUBTILE == 2:
            halves = tl.permute(tl.reshape(out, (BM, 2, BN // 2)), (0, 2, 1))
            o0, o1 = tl.split(halves)
            o_desc.store([off_m, off_n], o0.to(out_ty))
            o_desc.store([off_m, off_n + BN // 2], o1.to(out_ty))
        else:
            o_desc.store([off_m, off_n], out.to(out_ty))


# sizes, strides and label offsets vary per chunk and shard: one compiled kernel for all of them
@triton.jit(do_not_specialize=["M", "V", "D", "stride_t", "label_off", "inv_temp"])
def _lce_gemm_kernel(
    # tensor descriptors: hidden [M, D], weight [V, D], output [M, V] (row stride padded)
    h_desc, w_desc, o_desc,
    M, V, D,
    live_ptr,  # LIVE: the number of leading rows to compute (a device int), the other row tiles are skipped
    bias_ptr,  # bias [V] (HAS_BIAS)
    # per-tile max / sum-exp / argmax (int32) / sum z (SMOOTH) / entropy sum (ENTROPY): [M, tiles]
    tm_ptr, ts_ptr, ta_ptr, tz_ptr, te_ptr, stride_t,
    y_ptr, label_off,  # DZ: labels (global ids) and this weight's first id
    # DZ: row lse, coefficients a, t (, b: HAS_B, u: HAS_U), scale
    lse_ptr, a_ptr, t_ptr, b_ptr, u_ptr, scale_ptr,
    inv_temp,  # 1 / temperature (TEMP)
    MODE: tl.constexpr, HAS_BIAS: tl.constexpr, TEMP: tl.constexpr, SMOOTH: tl.constexpr,
    ENTROPY: tl.constexpr, HAS_B: tl.constexpr, HAS_U: tl.constexpr, HAS_SCALE: tl.constexpr,
    OUT_BF16: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    SUBTILE: tl.constexpr, NUM_PROGS: tl.constexpr, FLATTEN: tl.constexpr, WS: tl.constexpr,
    UPCAST: tl.constexpr, LIVE: tl.constexpr,
):
    m_live = M
    if LIVE:  # read on the device: the host never waits for the count
        m_live = tl.minimum(tl.load(live_ptr).to(tl.int32), M)
    num_m = tl.cdiv(m_live, BM)  # the live rows' tiles come first in tile order (GROUP_M groups of row tiles)
    num_tiles = num_m * tl.cdiv(V, BN)
    if NUM_PROGS == 0:  # one tile per program
        if tl.program_id(0) < num_tiles:
            _one_tile(tl.program_id(0), num_m, h_desc, w_desc, o_desc, M, V, D, bias_ptr, tm_ptr,
                      ts_ptr, ta_ptr, tz_ptr, te_ptr, stride_t, y_ptr, label_off, lse_ptr, a_ptr, t_ptr,
                      b_ptr, u_ptr, scale_ptr, inv_temp, MODE, HAS_BIAS, TEMP, SMOOTH, ENTROPY, HAS_B, HAS_U,
                      HAS_SCALE, OUT_BF16, BM, BN, BK, GROUP_M, SUBTILE, UPCAST)
    else:  # persistent: a fixed grid walks the tiles
        for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGS, flatten=FLATTEN, warp_specialize=WS):
            _one_tile(tile, num_m, h_desc, w_desc, o_desc, M, V, D, bias_ptr, tm_ptr, ts_ptr, ta_ptr,
                      tz_ptr, te_ptr, stride_t, y_ptr, label_off, lse_ptr, a_ptr, t_ptr, b_ptr, u_ptr,
                      scale_ptr, inv_temp, MODE, HAS_BIAS, TEMP, SMOOTH, ENTROPY, HAS_B, HAS_U, HAS_SCALE,
                      OUT_BF16, BM, BN, BK, GROUP_M, SUBTILE, UPCAST)


def num_tiles_n(v: int, cfg: GemmConfig) -> int:
    return triton.cdiv(max(v, 1), cfg.bn)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    """Once per device: asking torch every launch cost ~10 us of host time on the H200's host, where the first
    GEMM's launch is on the critical path of a short step."""
    return torch.cuda.get_device_properties(index).multi_processor_count


@dataclass
class TileStats:
    """Per (row, vocabulary tile) statistics written by the EXP / STATS epilogues: ``[rows, tiles]``
    arrays."""

    m: torch.Tensor
    s: torch.Tensor
    am: torch.Tensor  # int32 column of this weight (shard-local)
    zs: Optional[torch.Tensor]  # sum z (label smoothing)
    ez: Optional[torch.Tensor] = None  # sum e^(z - m_t) (z - m_t) (entropy)

    @staticmethod
    def new(rows: int, tiles: int, device, smooth: bool, entropy: bool = False) -> "TileStats":
        f = lambda dt=torch.float32: torch.empty(rows, tiles, device=device, dtype=dt)  # noqa: E731
        return TileStats(f(), f(), f(torch.int32), f() if smooth else None, f() if entropy else None)

    def rows(self, r0: int, r1: Optional[int] = None) -> "TileStats":
        """Rows ``[r0, r1)`` (``rows(n)``: the first ``n``)."""
        sl = slice(0, r0) if r1 is None else slice(r0, r1)
        return TileStats(*(None if x is None else x[sl] for x in (self.m, self.s, self.am, self.zs, self.ez)))


def lce_gemm(mode: int, h: torch.Tensor, w: torch.Tensor, out: Optional[torch.Tensor], cfg: GemmConfig, *,
             bias: Optional[torch.Tensor] = None, tiles: Optional[TileStats] = None, smooth: bool = False,
             labels: Optional[torch.Tensor] = None, label_off: int = 0, lse=None, a=None, t=None,
             b=None, u=None, scale=None, inv_temp: float = 1.0, live: Optional[torch.Tensor] = None) -> None:
    """One launch of the logits GEMM over ``h [M, D] @ w[V, D].T`` (divided by the temperature when
    ``inv_temp`` is not 1). ``out``: an ``[M, V]`` view with unit column stride and a 16-byte aligned row
    stride (EXP / DZ), in the input dtype. ``tiles``: ``[M, >= tiles]`` arrays (EXP / STATS; ``tiles.ez``
    given: the entropy sums too). DZ: per-row float32 coefficients ``a``, ``t`` and optionally ``b``, ``u`` of
    ``dz = softmax (a + b z) - t onehot - u`` (times the 0-dim ``scale``). ``live``: a 0-dim integer device
    tensor; only rows ``[0, live)`` are computed (whole row tiles: the rest of the last one too). Nothing is
    written for the other rows: their tile statistics and outputs keep whatever the buffers held (the caller
    overwrites them)."""
    m, d = h.shape
    v = w.shape[0]
    if m == 0 or v == 0:
        return
    bm, bn, bk = cfg.bm, cfg.bn, cfg.bk
    h_desc = TensorDescriptor(h, [m, d], [h.stride(0), 1], [bm, bk])
    w_desc = TensorDescriptor(w, [v, d], [w.stride(0), 1], [bn, bk])
    if mode == MODE_STATS:
        o_desc = h_desc  # never used: the STATS epilogue stores no tile
    else:
        o_desc = TensorDescriptor(out, [m, v], [out.stride(0), 1], [bm, bn // cfg.subtile])
    num_tiles = triton.cdiv(m, bm) * triton.cdiv(v, bn)
    # persistent: a grid fixed per device (one compiled kernel); else one program per tile
    nprog = cfg.persistent * _sm_count(h.device) if cfg.persistent else 0
    dummy = h
    opt = lambda x: dummy if x is None else x  # noqa: E731  (pointers whose flag is off are never read)
    ts = tiles if tiles is not None else TileStats(dummy, dummy, dummy, None)
    _lce_gemm_kernel[(nprog or num_tiles,)](
        h_desc, w_desc, o_desc, m, v, d, opt(live), opt(bias),
        ts.m, ts.s, ts.am, opt(ts.zs), opt(ts.ez), ts.m.stride(0) if tiles is not None else 0,
        opt(labels), int(label_off), opt(lse), opt(a), opt(t), opt(b), opt(u), opt(scale), float(inv_temp),
        MODE=mode, HAS_BIAS=bias is not None, TEMP=inv_temp != 1.0, SMOOTH=bool(smooth) and ts.zs is not None,
        ENTROPY=ts.ez is not None, HAS_B=b is not None, HAS_U=u is not None, HAS_SCALE=scale is not None,
        OUT_BF16=h.dtype == torch.bfloat16,
        BM=bm, BN=bn, BK=bk, GROUP_M=cfg.group_m, SUBTILE=cfg.subtile, NUM_PROGS=nprog,
        FLATTEN=bool(cfg.persistent) and not cfg.ws, WS=bool(cfg.persistent and cfg.ws),
        UPCAST=h.device.type != "cuda" and h.dtype == torch.bfloat16, LIVE=live is not None,
        num_warps=cfg.warps, num_stages=cfg.stages,
    )
