"""The "triton" backend: cuBLAS for the three big products, one fused Triton kernel for everything in between.

Default mode (token chunks, 3 GEMM-equivalents). For each chunk of ``nc`` tokens:

1. ``z = h_c @ W.T`` into a float32 buffer (cuBLAS, ``out_dtype=float32``: logits are never rounded to bf16,
   so the loss and the softmax keep float32 accuracy);
2. one Triton program per token reads its logits row twice -- once (last block first) for the online max /
   sum-exp / target logit / sum / first argmax, once (first block first, so the blocks read last are still in
   L2) to write ``dz`` -- and writes the loss, lse and ``correct``. For bf16/fp16 inputs ``dz`` is written in
   the input dtype *into the same buffer* (row ``r`` of ``dz`` occupies the first half of row ``r`` of ``z``), so
   the gradient tile costs no extra memory;
3. ``dX_c = dz @ W`` (cuBLAS, written straight into dX: the sum over the vocabulary is inside one GEMM);
4. ``dW += dz.T @ h_c`` into a float32 accumulator (cuBLAS ``addmm`` with ``out_dtype=float32``), or written
   straight in the weight dtype when a single chunk covers all tokens (no accumulator at all).

The chunk size comes from the shapes and the free device memory: the buffer may use the room the final dW will
take (it is allocated only after the buffer is freed) plus ``SLACK``; a single chunk is used when its buffer fits
in the room of the float32 accumulator it makes unnecessary.

Compact mode (``FUSED_LCE_COMPACT=1``; vocabulary chunks, 4 GEMM-equivalents): a statistics pass over vocabulary
chunks, then per chunk ``z`` again, ``dz``, ``dW_c = dz.T @ h`` written once in the weight dtype (the sum over
tokens is inside one GEMM) and ``dX += dz @ W_c`` into a float32 (N, D) accumulator. No (V, D) float32 buffer.

With a vocab-parallel group the statistics of each chunk are combined across ranks
(``fused_lce.distributed.combine_stats``) between the statistics kernel and the gradient kernel, and dX is
returned in float32 (the op layer all-reduces, then casts). Nothing here reads a device value on the host, so
forward and backward are CUDA-graph capturable.
"""
from __future__ import annotations

import math
import os
import time
from typing import Optional

import torch

try:  # a missing Triton must not break `import fused_lce`; unavailable_reason() reports it
    import triton
    import triton.language as tl

    _TRITON_ERROR: Optional[str] = None
except Exception as e:  # pragma: no cover - depends on the host
    triton = None
    tl = None
    _TRITON_ERROR = f"{type(e).__name__}: {e}"

from .. import distributed
from .base import Backend, Config, ForwardResult, loss_from_stats

GiB = 2**30
SLACK = int(0.4 * GiB)  # logits-buffer room beyond what the gradients themselves need (default mode)
MIN_ROWS = 64  # smallest default token chunk: below this the GEMMs stop filling the GPU
BLOCK = 2048  # logits per loop iteration of the row kernel
NUM_WARPS = 8

_ADDMM_FP32 = [None]  # does torch.addmm(fp32, bf16, bf16, out_dtype=fp32, out=fp32) work here? (probed lazily)


def compact_mode() -> bool:
    """True when FUSED_LCE_COMPACT asks for the low-memory (vocabulary-chunked, 4 GEMM-equivalent) schedule."""
    return os.environ.get("FUSED_LCE_COMPACT", "0").strip().lower() not in ("", "0", "false", "no", "off")


# ---------------------------------------------------------------------------------------------- kernel
if triton is not None:

    @triton.jit
    def _tanh(x):
        # from exp(-2|x|) in (0, 1]: exact limits at +-inf, no overflow, no libdevice (runs under the interpreter)
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        return tl.where(x < 0, -t, t)

    @triton.jit
    def _rows_kernel(
        z_ptr, stride_z,  # float32 logits rows (bias and softcap not applied yet)
        dz_ptr, stride_dz,  # gradient rows; may alias z_ptr (COMPACT: half-width elements in the same row)
        b_ptr,  # bias of these columns (HAS_BIAS)
        y_ptr,  # labels of these rows (global ids, int32/int64)
        g_ptr, stride_g,  # upstream weight per row (float32); stride 0 broadcasts one value
        lse_ptr, loss_ptr, correct_ptr,  # STATS == 2: written; STATS == 0 and GRAD: lse is read
        m_ptr, s_ptr, zt_ptr, zs_ptr, am_ptr,  # STATS == 1: raw statistics (read first when MERGE)
        ncols, label_off, vocab_total, ignore_index, eps, zloss, cap,
        STATS: tl.constexpr, MERGE: tl.constexpr, GRAD: tl.constexpr, HAS_BIAS: tl.constexpr,
        SOFTCAP: tl.constexpr, SMOOTH: tl.constexpr, ZLOSS: tl.constexpr, COMPACT: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)  # 64-bit offsets: rows * columns exceeds 2**31 on real shapes
        z_row = z_ptr + row * stride_z
        offs = tl.arange(0, BLOCK)
        nblk = tl.cdiv(ncols, BLOCK)
        y = tl.load(y_ptr + row).to(tl.int64)
        yl = y - label_off  # label as a column of this chunk (may be outside it)
        valid = y != ignore_index
        bad = valid & ((y < 0) | (y >= vocab_total))
        inside = (yl >= 0) & (yl < ncols)

        if STATS > 0:
            # per-lane online softmax: each lane keeps its own max / sum-exp / first argmax / sum, reduced across
            # lanes once at the end (no cross-warp reduction inside the loop: the loop just streams)
            m_v = tl.full([BLOCK], float("-inf"), tl.float32)
            s_v = tl.zeros([BLOCK], tl.float32)
            zs_v = tl.zeros([BLOCK], tl.float32)
            am_v = tl.zeros([BLOCK], tl.int32)
            # last block first: the gradient pass below starts at the first block, which is then still in L2
            for kk in range(0, nblk):
                k = nblk - 1 - kk
                cols = k * BLOCK + offs
                msk = cols < ncols
                z = tl.load(z_row + cols, mask=msk, other=0.0)
                if HAS_BIAS:
                    z += tl.load(b_ptr + cols, mask=msk, other=0.0).to(tl.float32)
                if SOFTCAP:
                    z = cap * _tanh(z / cap)
                if SMOOTH:
                    zs_v += tl.where(msk, z, 0.0)
                z = tl.where(msk, z, float("-inf"))
                up = z > m_v
                # columns arrive right to left, so a tie moves the lane's first argmax left
                am_v = tl.where(msk & (z >= m_v), cols, am_v)
                new_m = tl.maximum(m_v, z)
                ref = tl.where(new_m == float("-inf"), 0.0, new_m)
                e = tl.exp(tl.minimum(m_v, z) - ref)  # one exp: the larger of the two is exp(0) = 1
                s_v = tl.where(up, s_v * e + 1.0, s_v + e)
                s_v = tl.where(z != z, z, s_v)  # a NaN logit poisons the sum (max/min would skip it)
                m_v = new_m
            m = tl.max(m_v, axis=0)
            ref = tl.where(m == float("-inf"), 0.0, m)
            s = tl.sum(s_v * tl.exp(m_v - ref), axis=0)
            am = tl.min(tl.where(m_v == m, am_v, 2147483647), axis=0).to(tl.int64)
            zs = tl.sum(zs_v, axis=0)
            yc = tl.where(inside, yl, 0)
            zt = tl.load(z_row + yc, mask=inside, other=0.0)
            if HAS_BIAS:
                zt += tl.load(b_ptr + yc, mask=inside, other=0.0).to(tl.float32)
            if SOFTCAP:
                zt = cap * _tanh(zt / cap)
            zt = tl.where(inside, zt, 0.0)
            am += label_off  # global id
            if STATS == 1:
                if MERGE:  # fold in the statistics of the chunks to the left (lower ids win argmax ties)
                    m0 = tl.load(m_ptr + row)
                    s0 = tl.load(s_ptr + row)
                    new_m = tl.maximum(m0, m)
                    ref = tl.where(new_m == float("-inf"), 0.0, new_m)
                    s = s0 * tl.exp(m0 - ref) + s * tl.exp(m - ref)
                    am = tl.where(m > m0, am, tl.load(am_ptr + row))
                    m = new_m
                    zt += tl.load(zt_ptr + row)
                    zs += tl.load(zs_ptr + row)
                tl.store(m_ptr + row, m)
                tl.store(s_ptr + row, s)
                tl.store(zt_ptr + row, zt)
                tl.store(zs_ptr + row, zs)
                tl.store(am_ptr + row, am)
            else:
                lse = m + tl.log(s)
                per = (1.0 - eps) * (lse - zt)
                if SMOOTH:
                    per += eps * (lse - zs / vocab_total)
                if ZLOSS:
                    per += zloss * lse * lse
                per = tl.where(valid, per, 0.0)
                per = tl.where(bad, float("nan"), per)
                tl.store(lse_ptr + row, lse)
                tl.store(loss_ptr + row, per)
                tl.store(correct_ptr + row, (valid & (am == y)).to(tl.int8))
        else:
            lse = tl.load(lse_ptr + row)

        if GRAD:
            g = tl.load(g_ptr + row * stride_g).to(tl.float32)
            g = tl.where(valid, g, 0.0)
            g = tl.where(bad, float("nan"), g)  # an out-of-range label poisons its gradients, never indexes
            a = g  # coefficient of softmax
            if ZLOSS:
                a = g * (1.0 + 2.0 * zloss * lse)
            t = g * (1.0 - eps)  # coefficient of the one-hot target
            u = g * eps / vocab_total  # coefficient of the uniform smoothing target
            dz_row = dz_ptr + row * stride_dz
            if g == 0:  # ignored token: a zero row, without reading the logits
                for k in range(0, nblk):
                    cols = k * BLOCK + offs
                    tl.store(dz_row + cols, tl.zeros([BLOCK], dz_ptr.dtype.element_ty), mask=cols < ncols)
            else:
                for k in range(0, nblk):
                    cols = k * BLOCK + offs
                    msk = cols < ncols
                    z = tl.load(z_row + cols, mask=msk, other=0.0)
                    if HAS_BIAS:
                        z += tl.load(b_ptr + cols, mask=msk, other=0.0).to(tl.float32)
                    if SOFTCAP:
                        z = cap * _tanh(z / cap)
                    d = a * tl.exp(z - lse)
                    if SMOOTH:
                        d = d - u
                    d = tl.where(cols == yl, d - t, d)
                    if SOFTCAP:
                        r = z / cap
                        d = d * (1.0 - r * r)
                    if COMPACT:
                        # block k's half-width store lands on logits that other warps loaded in earlier
                        # iterations (or this one): every warp must have loaded them first
                        tl.debug_barrier()
                    tl.store(dz_row + cols, d.to(dz_ptr.dtype.element_ty), mask=msk)


# ---------------------------------------------------------------------------------------------- GEMMs
def _mm32(a, b, out=None):
    """a @ b with a float32 result (fp32 accumulation). CPU (interpreter tests only): upcast."""
    if a.dtype == torch.float32:
        return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)
    if a.device.type != "cuda":
        r = a.float() @ b.float()
        if out is None:
            return r
        out.copy_(r)
        return out
    if out is None:
        return torch.mm(a, b, out_dtype=torch.float32)
    try:
        return torch.mm(a, b, out_dtype=torch.float32, out=out)
    except (RuntimeError, TypeError):  # an older torch without the out= form of out_dtype
        out.copy_(torch.mm(a, b, out_dtype=torch.float32))
        return out


def _mm_into(a, b, out):
    """out = a @ b in out's dtype (fp32 accumulation inside the GEMM)."""
    if out.dtype == torch.float32:
        return _mm32(a, b, out)
    if a.device.type != "cuda":
        out.copy_(a.float() @ b.float())
        return out
    return torch.mm(a, b, out=out)


def _mm_acc(acc, a, b):
    """acc (float32) += a @ b, accumulating in float32, without a full-size temporary."""
    if a.device.type == "cuda" and a.dtype != torch.float32 and _ADDMM_FP32[0] is not False:
        try:
            torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
            _ADDMM_FP32[0] = True
            return acc
        except (RuntimeError, TypeError):  # this torch's addmm wants self in the operand dtype
            _ADDMM_FP32[0] = False
    if a.dtype == torch.float32 or a.device.type != "cuda":
        if a.device.type == "cuda":
            return acc.addmm_(a, b)
        return acc.add_(a.float() @ b.float())
    # fallback: row slices of a float32 product, each at most ~64 MiB
    step = max(1, (64 * 2**20) // max(1, 4 * acc.shape[1]))
    for r0 in range(0, acc.shape[0], step):
        acc[r0:r0 + step] += torch.mm(a[r0:r0 + step], b, out_dtype=torch.float32)
    return acc


# ---------------------------------------------------------------------------------------------- planning
_POOL = {}  # device index -> (monotonic time, driver-free + allocator-reserved bytes at that time)


def _free_bytes(device: torch.device) -> Optional[int]:
    """Free device memory plus what the caching allocator holds unused; None while a CUDA graph is being
    captured or on CPU. The driver is asked at most once a second (the allocator's own counters in between)."""
    if device.type != "cuda":
        return None
    try:
        if torch.cuda.is_current_stream_capturing():
            return None
        idx = device.index if device.index is not None else torch.cuda.current_device()
        now = time.monotonic()
        hit = _POOL.get(idx)
        if hit is None or now - hit[0] > 1.0:
            free, _ = torch.cuda.mem_get_info(idx)
            hit = _POOL[idx] = (now, int(free + torch.cuda.memory_reserved(idx)))
        return max(0, hit[1] - int(torch.cuda.memory_allocated(idx)))
    except Exception:  # pragma: no cover
        return None


def plan_token_chunk(n: int, v: int, d: int, elt: int, want_dw: bool, acc_always: bool, tile_bytes: int,
                     free: Optional[int]) -> tuple[int, bool]:
    """(tokens per chunk, use a float32 dW accumulator) for the default schedule.

    One chunk (no accumulator) when its float32 logits buffer (4 * V bytes a token) fits in ``SLACK`` plus the
    room of the float32 accumulator it makes unnecessary. Otherwise the buffer gets ``SLACK`` plus the room of
    the final dW (allocated only after the buffer is freed), so the peak stays near dX + dW + 4*V*D + SLACK.
    Both are capped by three quarters of the free device memory. ``tile_bytes`` (the caller's tile budget)
    overrides the rule.
    """
    n = max(n, 1)
    row = 4 * max(v, 1)
    acc = 4 * v * d if want_dw else 0
    if tile_bytes:
        rows = max(1, tile_bytes // row)
    else:
        cap = None if free is None else int(0.75 * free)
        single = n * row <= SLACK + (0 if acc_always else acc)
        if single and (cap is None or n * row + v * d * elt <= cap):
            return n, want_dw and acc_always
        budget = SLACK + (v * d * elt if want_dw else 0)
        if cap is not None:
            budget = min(budget, cap - acc)
        rows = max(min(n, MIN_ROWS), budget // row)
    if rows >= n:
        return n, want_dw and acc_always
    chunks = -(-n // rows)
    rows = -(-n // chunks)  # balanced chunks
    if not tile_bytes:
        rows = min(n, -(-rows // 8) * 8)
    return rows, want_dw


def plan_vocab_chunk(n: int, v: int, d: int, elt: int, mask, tile_bytes: int) -> int:
    """Vocabulary columns per chunk for the compact schedule: the float32 (N, cols) buffer gets a tenth of
    dX + dW (at least 32 MiB and 256 columns)."""
    v = max(v, 1)
    col = 4 * max(n, 1)
    if tile_bytes:
        return max(1, min(v, tile_bytes // col))
    grads = (n * d * elt if mask[0] else 0) + (v * d * elt if mask[1] else 0)
    budget = max(32 * 2**20, grads // 10)
    cols = max(256, budget // col)
    return int(min(v, -(-cols // 128) * 128))


# ---------------------------------------------------------------------------------------------- problem
class _Problem:
    def __init__(self, hidden, weight, labels, bias, cfg: Config, mask):
        self.h = hidden
        self.w = weight
        self.b = bias.contiguous() if bias is not None else None
        self.y = labels.contiguous()
        self.cfg = cfg
        self.n, self.d = hidden.shape
        self.v = weight.shape[0]
        self.vt = cfg.vocab_total or self.v
        self.dtype = hidden.dtype
        self.elt = hidden.element_size()
        self.mask = (bool(mask[0]), bool(mask[1]), bool(mask[2]) and bias is not None)
        self.dev = hidden.device
        # fp16 with a uniform scale (1/n for "mean"): dz is written unscaled (scaled, most of it would underflow
        # fp16) and the float32 results are scaled at the end. Set by the schedule.
        self.post_scale = False

    # kernel launch over the rows of one logits buffer
    def launch(self, z, rows, y, *, stats, grad, merge=False, dz=None, b=None, label_off=0, g=None,
               lse=None, loss=None, correct=None, raw=None):
        if rows == 0:
            return
        cfg = self.cfg
        ncols = z.shape[1]

        def arg(t):  # pointers whose constexpr flag is off are never dereferenced: pass z in their place
            return z if t is None else t

        raw = raw if raw is not None else (z,) * 5
        g_t = arg(g)
        _rows_kernel[(rows,)](
            z, z.stride(0),
            arg(dz), dz.stride(0) if dz is not None else 0,
            arg(b),
            y,
            g_t, (1 if g_t.dim() == 1 and g_t.numel() > 1 else 0),
            arg(lse), arg(loss), arg(correct),
            *raw,
            ncols, int(label_off), int(self.vt), int(cfg.ignore_index),
            float(cfg.label_smoothing), float(cfg.z_loss), float(cfg.softcap or 1.0),
            STATS=stats, MERGE=bool(merge), GRAD=bool(grad), HAS_BIAS=b is not None,
            SOFTCAP=bool(cfg.softcap), SMOOTH=bool(cfg.label_smoothing), ZLOSS=bool(cfg.z_loss),
            COMPACT=bool(grad and dz is not None and dz.element_size() != z.element_size()),
            BLOCK=BLOCK, num_warps=NUM_WARPS,
        )

    def dz_view(self, z):
        """The gradient tile written in place over the (contiguous) float32 logits tile, in the input dtype:
        row r of dz is the first half of row r of z (row stride 2 * cols)."""
        if self.dtype == torch.float32:
            return z
        return z.view(self.dtype)[:, : z.shape[1]]

    def tile(self, flat, rows, cols):
        """A contiguous (rows, cols) float32 view of the start of the flat buffer."""
        return flat[: rows * cols].view(rows, cols)

    def loss_from_raw(self, y, raw):
        """Per-token loss, lse, correct from (combined) raw statistics; the formula of torch_ref."""
        cfg = self.cfg
        per, lse, correct, _, _ = loss_from_stats(*raw, y, cfg.ignore_index, cfg.label_smoothing, cfg.z_loss,
                                                  self.vt)
        return per, lse, correct

    def new_raw(self, n):
        f = lambda: torch.empty(n, device=self.dev, dtype=torch.float32)  # noqa: E731
        return (f(), f(), f(), f(), torch.empty(n, device=self.dev, dtype=torch.int64))


class _Grads:
    """Gradient outputs and accumulators of one call."""

    def __init__(self, p: _Problem, fp32_dx: bool, dw_acc: bool):
        dev, n, d, v = p.dev, p.n, p.d, p.v
        self.p = p
        self.dx32 = fp32_dx or p.post_scale
        dx_dtype = torch.float32 if self.dx32 else p.dtype
        self.dx = torch.empty(n, d, device=dev, dtype=dx_dtype) if p.mask[0] else None
        self.dw_acc = dw_acc and p.mask[1]
        self.dw = None
        if p.mask[1]:
            self.dw = torch.empty(v, d, device=dev, dtype=torch.float32 if self.dw_acc else p.dtype)
        self.db = torch.zeros(v, device=dev, dtype=torch.float32) if p.mask[2] else None
        self.dw_started = False

    def token_chunk(self, i0, i1, dz, h_c):
        """Gradients of one token chunk: dX rows complete, dW (and db) accumulated."""
        if self.dx is not None:
            _mm_into(dz, self.p.w, self.dx[i0:i1])
        if self.dw is not None:
            if not self.dw_acc:
                _mm_into(dz.t(), h_c, self.dw)
            elif not self.dw_started:
                _mm32(dz.t(), h_c, self.dw)
            else:
                _mm_acc(self.dw, dz.t(), h_c)
            self.dw_started = True
        if self.db is not None:
            self.db += dz.sum(dim=0, dtype=torch.float32)

    def finish(self, scale, keep_fp32_dx):
        p = self.p
        dx, dw, db = self.dx, self.dw, self.db
        if dw is not None and not self.dw_started:  # no tokens: nothing was written
            dw.zero_()
        if dx is not None:
            if p.post_scale:
                dx = dx.mul_(scale)
            if not keep_fp32_dx and dx.dtype != p.dtype:
                dx = dx.to(p.dtype)
        if dw is not None and dw.dtype != p.dtype:
            if p.post_scale:
                dw = dw.mul_(scale)
            dw = dw.to(p.dtype)
        elif dw is not None and p.post_scale:
            dw = dw.mul_(scale)
        if db is not None:
            if p.post_scale:
                db = db.mul_(scale)
            db = db.to(p.b.dtype)
        return dx, dw, db


# ---------------------------------------------------------------------------------------------- schedules
def _token_schedule(p: _Problem, g, lse_in, want_stats: bool):
    """Default schedule. ``g``: upstream weight (0-dim scale or (N,) per token) or None for no gradients;
    ``lse_in``: saved lse (backward) or None (compute the statistics)."""
    cfg = p.cfg
    grad = g is not None and any(p.mask)
    split = bool(cfg.group_name) or FORCE_SPLIT  # combine statistics across ranks before the gradients
    fp32_dx = bool(cfg.group_name)
    p.post_scale = grad and p.dtype == torch.float16 and g.dim() == 0
    acc_always = p.post_scale  # fp16 scales at the end, through the fp32 accumulator
    rows, dw_acc = plan_token_chunk(p.n, p.v, p.d, p.elt, grad and p.mask[1], acc_always, cfg.tile_bytes,
                                    _free_bytes(p.dev))
    if want_stats and split:  # one combine_stats per chunk: the same chunks on every rank (V_local, free memory)
        rows = distributed.agree_token_blocks(rows, p.n, cfg.group_name)
    grads = _Grads(p, fp32_dx, dw_acc) if grad else None
    dev = p.dev
    if want_stats:
        loss = torch.empty(p.n, device=dev, dtype=torch.float32)
        lse = torch.empty(p.n, device=dev, dtype=torch.float32)
        correct = torch.empty(p.n, device=dev, dtype=torch.int8)
    else:
        loss = correct = None
        lse = lse_in
    g_kernel = torch.ones((), device=dev, dtype=torch.float32) if p.post_scale else g
    buf = torch.empty(min(rows, p.n) * p.v, device=dev, dtype=torch.float32)
    for i0 in range(0, p.n, rows):
        i1 = min(i0 + rows, p.n)
        nc = i1 - i0
        h_c = p.h[i0:i1]
        y_c = p.y[i0:i1]
        z = p.tile(buf, nc, p.v)
        _mm32(h_c, p.w.t(), z)
        dz = p.dz_view(z) if grad else None
        g_c = None
        if g_kernel is not None:
            g_c = g_kernel if g_kernel.dim() == 0 else g_kernel[i0:i1]
        if want_stats and not split:
            p.launch(z, nc, y_c, stats=2, grad=grad, dz=dz, b=p.b, label_off=cfg.vocab_start, g=g_c,
                     lse=lse[i0:i1], loss=loss[i0:i1], correct=correct[i0:i1])
        elif want_stats:
            raw = p.new_raw(nc)
            p.launch(z, nc, y_c, stats=1, grad=False, b=p.b, label_off=cfg.vocab_start, raw=raw)
            raw = distributed.combine_stats(*raw, cfg.group_name)
            per, lse_c, corr = p.loss_from_raw(y_c.long(), raw)
            loss[i0:i1] = per
            lse[i0:i1] = lse_c
            correct[i0:i1] = corr.to(torch.int8)
            if grad:
                p.launch(z, nc, y_c, stats=0, grad=True, dz=dz, b=p.b, label_off=cfg.vocab_start, g=g_c,
                         lse=lse[i0:i1])
        else:
            p.launch(z, nc, y_c, stats=0, grad=True, dz=dz, b=p.b, label_off=cfg.vocab_start, g=g_c,
                     lse=lse[i0:i1])
        if grad:
            grads.token_chunk(i0, i1, dz, h_c)
    z = dz = None
    del buf  # free the logits buffer before the final dW is allocated
    out = grads.finish(g, fp32_dx) if grad else (None, None, None)
    return loss, lse, correct, out


def _vocab_schedule(p: _Problem, g, lse_in, want_stats: bool):
    """Compact schedule: statistics over vocabulary chunks, then per chunk dz, dW_c (complete) and dX += ."""
    cfg = p.cfg
    grad = g is not None and any(p.mask)
    fp32_dx = bool(cfg.group_name)
    dev = p.dev
    cols = plan_vocab_chunk(p.n, p.v, p.d, p.elt, p.mask if grad else (False, False, False), cfg.tile_bytes)
    buf = torch.empty(p.n * min(cols, p.v), device=dev, dtype=torch.float32)
    p.post_scale = grad and p.dtype == torch.float16 and g.dim() == 0
    loss = correct = None
    lse = lse_in
    if want_stats:
        raw = p.new_raw(p.n)
        for v0 in range(0, p.v, cols):
            v1 = min(v0 + cols, p.v)
            z = p.tile(buf, p.n, v1 - v0)
            _mm32(p.h, p.w[v0:v1].t(), z)
            p.launch(z, p.n, p.y, stats=1, grad=False, merge=v0 > 0,
                     b=p.b[v0:v1] if p.b is not None else None, label_off=cfg.vocab_start + v0, raw=raw)
        if p.v == 0:
            raw = (torch.full((p.n,), -math.inf, device=dev), torch.zeros(p.n, device=dev),
                   torch.zeros(p.n, device=dev), torch.zeros(p.n, device=dev),
                   torch.zeros(p.n, device=dev, dtype=torch.int64))
        raw = distributed.combine_stats(*raw, cfg.group_name)
        loss, lse, correct = p.loss_from_raw(p.y.long(), raw)
        correct = correct.to(torch.int8)
    out = (None, None, None)
    if grad:
        g_kernel = torch.ones((), device=dev, dtype=torch.float32) if p.post_scale else g
        dx = torch.empty(p.n, p.d, device=dev, dtype=torch.float32) if p.mask[0] else None
        dw = torch.empty(p.v, p.d, device=dev, dtype=p.dtype) if p.mask[1] else None
        db = torch.empty(p.v, device=dev, dtype=torch.float32) if p.mask[2] else None
        for v0 in range(0, p.v, cols):
            v1 = min(v0 + cols, p.v)
            z = p.tile(buf, p.n, v1 - v0)
            _mm32(p.h, p.w[v0:v1].t(), z)
            dz = p.dz_view(z)
            p.launch(z, p.n, p.y, stats=0, grad=True, dz=dz, b=p.b[v0:v1] if p.b is not None else None,
                     label_off=cfg.vocab_start + v0, g=g_kernel, lse=lse)
            if dw is not None:
                if p.post_scale:
                    dw[v0:v1] = (_mm32(dz.t(), p.h) * g).to(p.dtype)
                else:
                    _mm_into(dz.t(), p.h, dw[v0:v1])
            if dx is not None:
                if v0 == 0:
                    _mm32(dz, p.w[v0:v1], dx)
                else:
                    _mm_acc(dx, dz, p.w[v0:v1])
            if db is not None:
                db[v0:v1] = dz.sum(dim=0, dtype=torch.float32)
        z = dz = None
        del buf
        if dx is not None and p.v == 0:
            dx.zero_()
        if dx is not None:
            if p.post_scale:
                dx.mul_(g)
            if not fp32_dx:
                dx = dx.to(p.dtype)
        if db is not None:
            if p.post_scale:
                db.mul_(g)
            db = db.to(p.b.dtype)
        out = (dx, dw, db)
    return loss, lse, correct, out


FORCE_SPLIT = False  # tests: run the distributed (split statistics / gradient) path on one device


# ---------------------------------------------------------------------------------------------- backend
class TritonBackend(Backend):
    name = "triton"
    device_types = ("cuda",)

    def unavailable_reason(self) -> Optional[str]:
        if triton is None:
            return f"triton is not importable ({_TRITON_ERROR})"
        if not torch.cuda.is_available():
            return "no CUDA device is visible to torch"
        return None

    def unsupported_reason(self, device, cfg, dtype):
        reason = super().unsupported_reason(device, cfg, dtype)
        if reason is None and dtype not in (torch.float32, torch.bfloat16, torch.float16):
            reason = f"backend 'triton' supports float32/bfloat16/float16, got {dtype}"
        return reason

    def _run(self, hidden, weight, labels, bias, cfg, g, lse, mask, want_stats):
        p = _Problem(hidden, weight, labels, bias, cfg, mask)
        if compact_mode():
            return _vocab_schedule(p, g, lse, want_stats)
        return _token_schedule(p, g, lse, want_stats)

    def forward(self, hidden, weight, labels, bias, cfg, grad_scale, grad_mask):
        fused = grad_scale is not None and any(grad_mask)
        mask = tuple(bool(x) for x in grad_mask) if fused else (False, False, False)
        g = grad_scale.to(device=hidden.device, dtype=torch.float32).reshape(()) if fused else None
        loss, lse, correct, (dh, dw, db) = self._run(hidden, weight, labels, bias, cfg, g, None, mask, True)
        return ForwardResult(loss, lse, correct.view(torch.bool), dh, dw, db)

    def backward(self, grad_loss, hidden, weight, labels, bias, lse, cfg, grad_mask):
        mask = (bool(grad_mask[0]), bool(grad_mask[1]), bool(grad_mask[2]) and bias is not None)
        if not any(mask):
            return None, None, None
        g = grad_loss.to(device=hidden.device, dtype=torch.float32).contiguous()
        _, _, _, out = self._run(hidden, weight, labels, bias, cfg, g, lse.contiguous(), mask, False)
        return out


BACKEND = TritonBackend()
