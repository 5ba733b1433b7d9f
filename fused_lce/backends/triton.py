"""The "triton" backend: the loss work fused into a Triton logits GEMM, cuBLAS for the two gradient products.

Default mode, bf16 / fp16 inputs on Hopper (the "gemm" path; token chunks, 3 GEMM-equivalents). For each chunk of
``nc`` tokens:

1. ``h_c @ W.T`` in a Triton GEMM (TMA + wgmma) whose epilogue works on the float32 accumulator: per (token,
   256-column tile) the max ``m_t``, ``sum exp(z - m_t)`` and first argmax into small per-tile arrays, and
   ``e = exp(z - m_t)`` stored in the input dtype (``triton_kernels/gemm.py``). Statistics never see a rounded
   logit, and the buffer costs 2 bytes a logit;
2. the tile statistics become row statistics and the lse (one small kernel); the label's logit is one float32
   dot product per token;
3. ``dz = g (a0 + a1 lse) exp(m_t - lse) e - ...`` in place over ``e`` (the mean's 1/n folded in for bf16);
4. ``dX_c = dz @ W`` (cuBLAS, straight into dX) and ``dW (+)= dz.T @ h_c`` (cuBLAS): written once in the weight
   dtype when one chunk covers every token, else accumulated in float32 and cast at the end.

The chunk size comes from the shapes and the free device memory: the peak stays under dX + dW + 4 V D + SLACK
(one chunk when its buffer fits in the room of the float32 accumulator it makes unnecessary).

The "cublas" path (float32 inputs, softcap, a hidden size or pointer TMA cannot take, pre-Hopper GPUs, or
``FUSED_LCE_TRITON_GEMM=0``): ``z`` in float32 by cuBLAS, one Triton row kernel for statistics + ``dz`` (written in
place over ``z``, in the input dtype), the same two cuBLAS gradient products.

Compact mode (``FUSED_LCE_COMPACT=1``; vocabulary chunks, 4 GEMM-equivalents): a statistics pass over vocabulary
chunks (the gemm path stores nothing but tile statistics), then per chunk ``dz`` again (the gemm path's epilogue
writes ``dz`` directly), ``dW_c = dz.T @ h`` written once in the weight dtype and ``dX += dz @ W_c`` into a float32
(N, D) accumulator. No (V, D) float32 buffer.

``linear_logprobs`` (``supports_logprobs``) takes either path: the GEMM epilogues divide by the temperature and
write the entropy's tile sums, the DZ epilogue has the entropy's term. Outside the one-pass loss (``fused``, whose
kernels form the loss's coefficients from the driver's four ``LossTerms``) every gradient kernel takes the driver's
per-row coefficients ``Coefs(a, t, b, u)``: ``dz = p (a + b z) - t onehot - u``, times the softcap derivative.

Live rows: on the fused-GEMM path the one-pass loss and the recompute backward gather the tokens that have a
gradient (coefficients not all 0) to the front and run dz, dX and dW over them only; ignored tokens get only the
statistics their lse needs. The count is read on the host (``_live_order``), the one host synchronisation, skipped
while a CUDA graph is captured.

Rows of every logits buffer are padded to 16 bytes, so an odd vocabulary keeps cuBLAS on its fast kernels.
With a vocab-parallel group the statistics of each chunk are combined across ranks between the statistics and the
gradient kernels, and dX is returned in float32. Under CUDA-graph capture nothing here reads a device value on the
host, so forward and backward are capturable.
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

_KERNELS_ERROR: Optional[str] = None
if triton is not None:
    try:
        from .triton_kernels import gemm as kgemm
        from .triton_kernels import rows as krows
    except Exception as e:  # pragma: no cover - a Triton without tensor descriptors
        kgemm = krows = None
        _KERNELS_ERROR = f"{type(e).__name__}: {e}"
else:  # pragma: no cover
    kgemm = krows = None

from ..core import Coefs, EntropyStats, Grads, LossTerms, Options, Problem, Provider, Stats, Tensors

GiB = 2**30
SLACK = int(0.4 * GiB)  # logits-buffer room beyond what the gradients themselves need (default mode)
MIN_ROWS = 64  # smallest default token chunk: below this the GEMMs stop filling the GPU
BLOCK = 2048  # logits per loop iteration of the row kernel
NUM_WARPS = 8

_ADDMM_FP32 = [None]  # does torch.addmm(fp32, bf16, bf16, out_dtype=fp32, out=fp32) work here? (probed lazily)


def compact_mode() -> bool:
    """True when FUSED_LCE_COMPACT asks for the low-memory (vocabulary-chunked, 4 GEMM-equivalent) schedule."""
    return os.environ.get("FUSED_LCE_COMPACT", "0").strip().lower() not in ("", "0", "false", "no", "off")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def gemm_path_reason(dtype: torch.dtype, d: int, device: torch.device, opts: Options, ptrs=()) -> Optional[str]:
    """None when the fused-GEMM path runs this problem, else why the cuBLAS path does.
    ``FUSED_LCE_TRITON_GEMM``: 0 never, 1 whenever the kernel can (also CPU tensors under the interpreter)."""
    env = os.environ.get("FUSED_LCE_TRITON_GEMM", "auto").strip().lower()
    if env in ("0", "off", "false", "no", "cublas"):
        return "FUSED_LCE_TRITON_GEMM=0"
    if kgemm is None:
        return f"the GEMM kernels do not import ({_KERNELS_ERROR})"
    if dtype not in (torch.bfloat16, torch.float16):
        return "float32 inputs keep cuBLAS float32 products"
    if opts.softcap:
        return "softcap: the exp tiles would not give the softcap derivative"
    if d % 8 or any(p % 16 for p in ptrs):
        return "hidden rows or base pointers are not 16-byte aligned (tensor descriptors need them)"
    if device.type == "cuda":
        if torch.cuda.get_device_capability(device)[0] < 9 and env not in ("1", "on", "true", "yes", "gemm"):
            return "a GPU before Hopper (no TMA): the cuBLAS path is faster there"
        return None
    if _interpreting() and env in ("1", "on", "true", "yes", "gemm"):
        return None
    return f"device {device.type}"


def _pad(v: int, elems: int) -> int:
    """Row length padded to a multiple of ``elems`` elements (16 bytes at least; callers pass 128 bytes)."""
    return max(elems, -(-v // elems) * elems)



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
        m_ptr, s_ptr, zt_ptr, zs_ptr, am_ptr, ez_ptr,  # STATS: raw statistics (read first when MERGE); ez: ENTROPY
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
                z = tl.load(z_row + cols, mask=msk, other=0.0)
                if HAS_BIAS:
                    z += tl.load(bias_ptr + cols, mask=msk, other=0.0).to(tl.float32)
                if SOFTCAP:
                    z = cap * _tanh(z / cap)
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
            zt = tl.load(z_row + yc, mask=inside, other=0.0)
            if HAS_BIAS:
                zt += tl.load(bias_ptr + yc, mask=inside, other=0.0).to(tl.float32)
            if SOFTCAP:
                zt = cap * _tanh(zt / cap)
            if TEMP:
                zt = zt * inv_temp
            zt = tl.where(inside, zt, 0.0)
            am += label_off  # global id
            if MERGE:  # fold in the statistics of the chunks to the left
                m, s, am, ez = krows.merge_stats(m_ptr, s_ptr, am_ptr, ez_ptr, row, m, s, am, ez, ENTROPY)
                zt += tl.load(zt_ptr + row)
                zs += tl.load(zs_ptr + row)
            tl.store(m_ptr + row, m)
            tl.store(s_ptr + row, s)
            tl.store(zt_ptr + row, zt)
            tl.store(zs_ptr + row, zs)
            tl.store(am_ptr + row, am)
            if ENTROPY:
                tl.store(ez_ptr + row, ez)
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
                    c = tl.load(z_row + cols, mask=msk, other=0.0)
                    if HAS_BIAS:
                        c += tl.load(bias_ptr + cols, mask=msk, other=0.0).to(tl.float32)
                    if SOFTCAP:
                        c = cap * _tanh(c / cap)  # the capped logit
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


# An odd vocabulary sends cuBLAS to slow kernels whenever V is an M, N or K of the product (measured on the H200:
# h @ W.T with V = 151931 took 51 ms against 13.8 ms at V = 151936, padded output rows or not). So every product
# that has V as a dimension is split into the first V - V % 64 rows of the vocabulary and a small remainder.
VSPLIT = 64


def _vparts(v: int):
    vm = v - v % VSPLIT
    return ((0, v),) if vm in (0, v) else ((0, vm), (vm, v))


def _logits32(h, w, z):
    """z[:, :V] = h @ w.T in float32 (z: a row-padded [n, V] view)."""
    for a, b in _vparts(w.shape[0]):
        _mm32(h, w[a:b].t(), z[:, a:b])


def _mm_add(out, a, b):
    """out += a @ b in out's dtype (one rounding of the sum when out is not float32)."""
    if out.dtype == torch.float32:
        return _mm_acc(out, a, b)
    if a.device.type == "cuda":
        return out.addmm_(a, b)
    return out.copy_(out.float() + a.float() @ b.float())


def _dx_into(dz, w, out, accumulate: bool = False):
    """out (+)= dz @ w over the vocabulary (dz: [n, V] view, w: [V, D]): the small remainder first, then the
    aligned bulk on top of it, so a low-precision out is rounded once more only by the remainder's tiny part."""
    parts = _vparts(w.shape[0])
    for k, (a, b) in enumerate(reversed(parts)):
        if accumulate or k > 0:
            _mm_add(out, dz[:, a:b], w[a:b])
        else:
            _mm_into(dz[:, a:b], w[a:b], out)


def _dw_into(dz, h, out, accumulate: bool):
    """out[V, D] (+)= dz.T @ h, row block by row block of the vocabulary."""
    for a, b in _vparts(out.shape[0]):
        if accumulate:
            _mm_acc(out[a:b], dz[:, a:b].t(), h)
        else:
            _mm_into(dz[:, a:b].t(), h, out[a:b])


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
                     free: Optional[int], row_bytes: Optional[int] = None) -> tuple[int, bool]:
    """(tokens per chunk, use a float32 dW accumulator) for the default schedule.

    ``row_bytes``: buffer bytes per token (default: a float32 logits row, 4 * V). One chunk (no accumulator) when
    its buffer fits in ``SLACK`` plus the room of the float32 accumulator it makes unnecessary. Otherwise the
    buffer gets ``SLACK`` plus the room of the final dW (allocated only after the buffer is freed), so the peak
    stays near dX + dW + 4*V*D + SLACK. Both are capped by three quarters of the free device memory.
    ``tile_bytes`` (the caller's tile budget) overrides the rule.
    """
    n = max(n, 1)
    row = row_bytes or 4 * max(v, 1)
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


def plan_vocab_chunk(n: int, v: int, d: int, elt: int, mask, tile_bytes: int, buf_elt: int = 4) -> int:
    """Vocabulary columns per chunk for the compact schedule (a multiple of 256, at least 256). The (N, cols)
    buffer of ``buf_elt`` bytes an element gets what 1.15 (dX + dW) leaves after dX + dW and the float32 dX
    accumulator (4 N D), at least 32 MiB."""
    v = max(v, 1)
    col = buf_elt * max(n, 1)
    if tile_bytes:
        return max(1, min(v, tile_bytes // col))
    grads = (n * d * elt if mask[0] else 0) + (v * d * elt if mask[1] else 0)
    room = int(0.15 * grads) - (4 * n * d if mask[0] else 0) - 16 * 2**20  # 16 MiB: statistics, tiles
    budget = max(32 * 2**20, room)
    cols = max(256, (budget // col) // 256 * 256)
    return int(min(v, cols))


def skip_dead_rows() -> bool:
    """False when FUSED_LCE_SKIP_IGNORED=0 keeps ignored tokens in the gradient products (for comparisons)."""
    return os.environ.get("FUSED_LCE_SKIP_IGNORED", "1").strip().lower() not in ("0", "false", "no", "off")


def _live_order(live: torch.Tensor) -> Optional[tuple[torch.Tensor, int]]:
    """``(order, count)``: the rows where ``live`` holds first (stable) and how many there are; None when every row
    is live, while a CUDA graph is being captured, or with FUSED_LCE_SKIP_IGNORED=0.

    The gradient products then run over ``count`` rows instead of all: a token without gradient (an ignored
    label) costs no part of dz, dX or dW. cuBLAS takes its sizes on the host, so the count is read there: the one
    host synchronisation of these kernels. It comes before their first large launch, so the device waits only for
    the host's launch latency after it (the caller queues nothing large before it)."""
    n = live.shape[0]
    if n == 0 or not skip_dead_rows() or (live.is_cuda and torch.cuda.is_current_stream_capturing()):
        return None
    order = torch.argsort(live.logical_not().to(torch.uint8), stable=True)
    count = int(live.sum())
    return None if count == n else (order, count)


# ---------------------------------------------------------------------------------------------- launches
def _launch(t: Tensors, opts: Options, z, rows: slice, *, stats=None, merge=False, grad=False, dz=None, g=None,
            terms: LossTerms = LossTerms(1.0, 0.0, 1.0, 0.0), coef: Optional[Coefs] = None, scale=None, lse=None,
            v0=0, v1=None):
    """The row kernel over the rows of a logits tile ``z`` (columns ``[v0, v1)`` of this shard). ``stats``: a
    ``Stats`` / ``EntropyStats`` to write (and merge into). Gradients: from the driver's per-row ``coef`` or, for
    the one-pass loss only (``stats`` and ``grad``), from the token weight ``g`` (the loss formula in the kernel)."""
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
        STATS=stats is not None, MERGE=bool(merge), GRAD=bool(grad), LOSS=bool(loss), HAS_SCALE=scale is not None,
        HAS_BIAS=bias is not None, SOFTCAP=bool(opts.softcap), TEMP=temp != 1.0,
        SMOOTH=opts.wants_zsum, HAS_A1=bool(k.a1), ENTROPY=ez is not None,
        HAS_B=cb is not None, HAS_U=bool(k.u0) if loss else u is not None,
        COMPACT=bool(grad and dz is not None and dz.element_size() != z.element_size()),
        BLOCK=BLOCK, num_warps=NUM_WARPS,
    )


def _dz_view(z, dtype):
    """The gradient tile written in place over the (contiguous) float32 logits tile, in the input dtype: row r of
    dz is the first half of row r of z (row stride 2 * cols)."""
    return z if dtype == torch.float32 else z.view(dtype)[:, : z.shape[1]]



def _new_stats(n, dev, entropy: bool = False):
    """Statistics buffers: a ``Stats``, or an ``EntropyStats`` (the entropy sum ``ez`` too)."""
    f = lambda: torch.empty(n, device=dev, dtype=torch.float32)  # noqa: E731
    st = Stats(f(), f(), f(), f(), torch.empty(n, device=dev, dtype=torch.int64))
    return EntropyStats(*st, f()) if entropy else st


def _cast(x: torch.Tensor, dtype: torch.dtype, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """``(x * scale).to(dtype)`` in one pass (the fused kernel where it runs, else torch)."""
    if scale is None and x.dtype == dtype:
        return x
    if krows is not None and x.is_contiguous() and (x.is_cuda or _interpreting()):
        return krows.scale_cast(x, dtype, None if scale is None else scale.to(torch.float32).reshape(()))
    return (x.mul_(scale) if scale is not None else x).to(dtype)


class _State:
    """Provider-private part of a Grads: fp16 post-scaling and the dW accumulator mode."""

    def __init__(self, post_scale: bool):
        self.post_scale = post_scale  # fp16: dz written unscaled, the float32 results scaled at the end
        self.dw_acc: Optional[bool] = None  # decided by the first token block: float32 accumulator or direct


class _ExpCache(tuple):
    """What ``stats(keep=True)`` of the gemm path leaves for ``grads``: (exp tiles [nc, V], tile maxima)."""


# ---------------------------------------------------------------------------------------------- provider
class TritonProvider(Provider):
    name = "triton"
    device_types = ("cuda",)
    grads_scaled = True
    supports_logprobs = True  # temperature and entropy on the cuBLAS path's row kernel (docs/providers.md)

    def unavailable_reason(self) -> Optional[str]:
        if triton is None:
            return f"triton is not importable ({_TRITON_ERROR})"
        if not torch.cuda.is_available():
            return "no CUDA device is visible to torch"
        return None

    @property
    def has_fused(self) -> bool:  # the compact schedule has no one-pass kernel
        return not compact_mode()

    # -- path / planning / buffers ------------------------------------------------------------------------
    @staticmethod
    def path_reason(t: Tensors, opts: Options) -> Optional[str]:
        """None when the fused-GEMM path runs these tensors, else why the cuBLAS path does."""
        h, w = t.hidden, t.weight
        return gemm_path_reason(h.dtype, h.shape[1], h.device, opts, (h.data_ptr(), w.data_ptr()))

    @staticmethod
    def _cfg(d: int):
        return kgemm.default_config(d)

    @classmethod
    def _row_bytes(cls, v: int, d: int, elt: int, opts: Options, gemm: bool) -> int:
        if not gemm:
            return 4 * _pad(v, 32)
        tiles = kgemm.num_tiles_n(v, cls._cfg(d))
        return elt * _pad(v, 64) + tiles * (12 + 4 * opts.wants_zsum + 4 * bool(opts.entropy))

    def token_block(self, p: Problem, keep: bool) -> int:
        if compact_mode():
            return max(p.n, 1)
        gemm = gemm_path_reason(p.dtype, p.d, p.device, p.opts) is None
        # linear_logprobs' backward (keep False) also gets the final dW's room: its blocks free their buffer
        # before finish allocates dW, as the one-pass loss's chunks do
        want_dw = p.mask[1] and (keep or p.op == "logprobs")
        rows, _ = plan_token_chunk(p.n, p.v, p.d, p.dtype.itemsize, want_dw, False, p.opts.tile_bytes,
                                   _free_bytes(p.device), self._row_bytes(p.v, p.d, p.dtype.itemsize, p.opts, gemm))
        return rows

    def new_grads(self, t: Tensors, mask, fp32_dh: bool, scaled: bool = False) -> Grads:
        h, w = t.hidden, t.weight
        st = _State(scaled and h.dtype == torch.float16)
        f32 = torch.float32
        dh_dtype = f32 if (fp32_dh or st.post_scale or compact_mode()) else h.dtype
        dh = torch.empty(h.shape, device=h.device, dtype=dh_dtype) if mask[0] else None
        if dh is not None and (h.shape[0] == 0 or w.shape[0] == 0):
            dh.zero_()
        db = torch.zeros(w.shape[0], device=w.device, dtype=f32) if mask[2] and t.bias is not None else None
        return Grads(dh, None, db, fp32_dh, extra=(st, bool(mask[1])))

    def finish(self, t: Tensors, out: Grads, scale):
        st, want_dw = out.extra
        h, w = t.hidden, t.weight
        dh, dw, db = out.dh, out.dw, out.db
        if want_dw and dw is None:  # no tokens: nothing was written
            dw = torch.zeros(w.shape, device=w.device, dtype=w.dtype)
        post = scale if st.post_scale and scale is not None else None
        if dh is not None:
            if out.fp32_dh:
                dh = dh.mul_(post) if post is not None else dh
            else:
                dh = _cast(dh, h.dtype, post if dh.dtype == torch.float32 else None)
        if dw is not None:  # one pass: float32 accumulator (times the fp16 scale) -> weight dtype
            dw = _cast(dw, w.dtype, post if dw.dtype == torch.float32 else None)
        if db is not None:
            db = (db.mul_(post) if post is not None else db).to(t.bias.dtype)
        return dh, dw, db

    # -- kernels ----------------------------------------------------------------------------------------------
    def stats(self, t: Tensors, rows: slice, opts: Options, keep: bool):
        h = t.hidden[rows]
        nc = h.shape[0]
        v = t.weight.shape[0]
        raw = _new_stats(nc, h.device, opts.entropy)
        gemm = self.path_reason(t, opts) is None
        if v == 0:
            raw.m.fill_(-math.inf), raw.s.zero_(), raw.target.zero_(), raw.zsum.zero_(), raw.argmax.zero_()
            if opts.entropy:
                raw.ez.zero_()
            return raw, None
        if compact_mode():
            if gemm:
                self._compact_stats_gemm(t, rows, opts, raw)
                return raw, None
            cols = plan_vocab_chunk(t.hidden.shape[0], v, t.hidden.shape[1], t.hidden.element_size(),
                                    (False, False, False), opts.tile_bytes)
            buf = torch.empty(nc * _pad(min(cols, v), 32), device=h.device, dtype=torch.float32)
            for v0 in range(0, v, cols):
                v1 = min(v0 + cols, v)
                z = buf[: nc * _pad(v1 - v0, 32)].view(nc, _pad(v1 - v0, 32))[:, : v1 - v0]
                _logits32(h, t.weight[v0:v1], z)
                _launch(t, opts, z, rows, stats=raw, merge=v0 > 0, v0=v0, v1=v1)
            return raw, None
        if gemm:
            cfg = self._cfg(h.shape[1])
            ntiles = kgemm.num_tiles_n(v, cfg)
            tiles = kgemm.TileStats.new(nc, ntiles, h.device, opts.wants_zsum, opts.entropy)
            keep = keep and not opts.entropy  # the entropy's gradient term needs z itself: recomputed (DZ)
            e = None
            if keep:
                e = torch.empty(nc, _pad(v, 64), device=h.device, dtype=h.dtype)[:, :v]
            inv_t = 1.0 / opts.temperature
            kgemm.lce_gemm(kgemm.MODE_EXP if keep else kgemm.MODE_STATS, h, t.weight, e, cfg, bias=t.bias,
                           tiles=tiles, smooth=opts.wants_zsum, inv_temp=inv_t)
            krows.target_logit(h, t.weight, t.bias, t.labels[rows], opts.vocab_start, raw.target, inv_t)
            krows.combine(tiles, ntiles, raw.m, raw.s, raw.zsum, raw.argmax, col_off=opts.vocab_start,
                          ez=raw.ez if opts.entropy else None)
            return raw, (_ExpCache((e, tiles.m)) if keep else None)
        z = torch.empty(nc, _pad(v, 32), device=h.device, dtype=torch.float32)[:, :v]
        _logits32(h, t.weight, z)
        _launch(t, opts, z, rows, stats=raw)
        return raw, (z if keep else None)

    def grads(self, t: Tensors, rows: slice, lse, coef: Coefs, scale, opts: Options, out: Grads,
              cache=None) -> None:
        st, _ = out.extra
        kscale = None if (scale is None or st.post_scale) else scale.to(torch.float32).reshape(())
        coef = Coefs(*(None if x is None else x.to(torch.float32).contiguous() for x in coef))
        h = t.hidden[rows]
        v = t.weight.shape[0]
        if compact_mode():
            self._compact_grads(t, rows, lse, coef, kscale, scale, opts, out)
            return
        whole = rows.start == 0 and rows.stop == t.hidden.shape[0]
        dh = None if out.dh is None else out.dh[rows]
        if self.path_reason(t, opts) is None:
            cfg = self._cfg(h.shape[1])
            if isinstance(cache, _ExpCache):
                dz, tile_m = cache
                krows.dz_from_exp(dz, tile_m, cfg.bn, lse, (coef.a, coef.t, coef.u), kscale, t.labels[rows],
                                  opts.vocab_start)
                self._token_gemms(t, h, dz, out, whole, dh)
                return
            # recompute: the DZ epilogue over the live rows only (a token whose coefficients are all 0 has no
            # gradient), gathered to the front
            live = (coef.a != 0) | (coef.t != 0)  # a NaN coefficient is not 0: its row stays (it poisons)
            for x in (coef.b, coef.u):
                if x is not None:
                    live |= x != 0
            y = t.labels[rows]
            idx = None
            perm = _live_order(live)
            if perm is not None:
                order, count = perm
                idx = order[:count]
                h, y, lse = h.index_select(0, idx), y.index_select(0, idx), lse.index_select(0, idx)
                coef = Coefs(*(None if x is None else x.index_select(0, idx) for x in coef))
                if dh is not None:
                    dh.zero_()  # the rows of dead tokens
            if h.shape[0]:
                dz = torch.empty(h.shape[0], _pad(v, 64), device=h.device, dtype=h.dtype)[:, :v]
                self._dz_gemm(h, t.weight, t.bias, dz, y, lse, coef, kscale, opts, 0)
                self._token_gemms(t, h, dz, out, whole, dh, idx)
            return
        z = cache
        if z is None:
            z = torch.empty(h.shape[0], _pad(v, 32), device=h.device, dtype=torch.float32)[:, :v]
            _logits32(h, t.weight, z)
        dz = _dz_view(z, h.dtype)
        _launch(t, opts, z, rows, grad=True, dz=dz, coef=coef, scale=kscale, lse=lse)
        self._token_gemms(t, h, dz, out, whole, dh)

    def fused(self, t: Tensors, g, terms: LossTerms, scale, opts: Options, out: Grads) -> Stats:
        st, want_dw = out.extra
        h, w = t.hidden, t.weight
        n, v = h.shape[0], w.shape[0]
        gemm = self.path_reason(t, opts) is None
        kscale = None if st.post_scale else scale.to(torch.float32).reshape(())
        raw = _new_stats(n, h.device)
        if gemm:
            if v == 0:  # an empty vocabulary: every logit is absent (dX was zeroed, dW is empty)
                raw.m.fill_(-math.inf), raw.s.zero_(), raw.target.zero_(), raw.zsum.zero_(), raw.argmax.zero_()
                return raw
            self._fused_gemm(t, g, terms, kscale, opts, out, raw)
            return raw
        nrows, _ = plan_token_chunk(n, v, h.shape[1], h.element_size(), want_dw, st.post_scale, opts.tile_bytes,
                                    _free_bytes(h.device), self._row_bytes(v, h.shape[1], h.element_size(), opts,
                                                                          False))
        vp = _pad(v, 32)
        buf = torch.empty(min(nrows, n) * vp, device=h.device, dtype=torch.float32)
        z = dz = None  # no tokens: no chunk
        for i0 in range(0, n, nrows):
            rows = slice(i0, min(i0 + nrows, n))
            nc = rows.stop - rows.start
            z = buf[: nc * vp].view(nc, vp)[:, :v]
            _logits32(h[rows], w, z)
            dz = _dz_view(z, h.dtype)
            _launch(t, opts, z, rows, stats=Stats(*(x[rows] for x in raw)), grad=True, dz=dz, g=g[rows],
                    terms=terms, scale=kscale)
            self._token_gemms(t, h[rows], dz, out, nc == n, None if out.dh is None else out.dh[rows])
        del buf, z, dz  # free the logits buffer before the final dW is allocated (finish)
        return raw

    def _fused_gemm(self, t: Tensors, g, terms: LossTerms, kscale, opts: Options, out: Grads, raw: Stats) -> None:
        """The one-pass loss on the fused-GEMM path. Tokens with a gradient (weight g != 0) are gathered to the
        front: they go through the EXP epilogue, ``dz`` and the two gradient products in token chunks; the ignored
        ones only through the STATS epilogue (their statistics, for lse and accuracy)."""
        st, want_dw = out.extra
        h, w, y = t.hidden, t.weight, t.labels
        (n, d), v = h.shape, w.shape[0]
        cfg = self._cfg(d)
        smooth = opts.wants_zsum
        ntiles = kgemm.num_tiles_n(v, cfg)
        krows.target_logit(h, w, t.bias, y, opts.vocab_start, raw.target)
        perm = _live_order(g != 0)  # NaN != 0: a bad label's token keeps its (poisoned) gradient
        order, count, sp = None, n, raw
        if perm is not None:
            order, count = perm
            h, y, g = h.index_select(0, order), y.index_select(0, order), g.index_select(0, order)
            sp = _new_stats(n, h.device)  # statistics in the gathered order
            if out.dh is not None:
                out.dh.zero_()  # the rows of ignored tokens
        nrows, _ = plan_token_chunk(count, v, d, h.element_size(), want_dw, st.post_scale, opts.tile_bytes,
                                    _free_bytes(h.device), self._row_bytes(v, d, h.element_size(), opts, True))
        # ignored tokens: statistics only, in chunks whose tile statistics fit the slack
        dead_rows = max(1, min(n - count, max(nrows, SLACK // max(1, 16 * ntiles))))
        vp = _pad(v, 64)
        buf = torch.empty(min(nrows, count) * vp, device=h.device, dtype=h.dtype)
        tiles = kgemm.TileStats.new(max(min(nrows, count), min(dead_rows, n - count)), ntiles, h.device, smooth)
        lse = torch.empty(count, device=h.device, dtype=torch.float32)
        z = None
        for i0 in range(0, count, nrows):
            r = slice(i0, min(i0 + nrows, count))
            nc = r.stop - r.start
            z = buf[: nc * vp].view(nc, vp)[:, :v]
            tl_ = tiles.rows(nc)
            kgemm.lce_gemm(kgemm.MODE_EXP, h[r], w, z, cfg, bias=t.bias, tiles=tl_, smooth=smooth)
            krows.combine(tl_, ntiles, sp.m[r], sp.s[r], sp.zsum[r], sp.argmax[r], col_off=opts.vocab_start,
                          lse=lse[r])
            krows.dz_from_exp(z, tl_.m, cfg.bn, lse[r], g[r], kscale, y[r], opts.vocab_start, terms=terms)
            dh = None if out.dh is None else (out.dh if order is not None else out.dh[r])
            self._token_gemms(t, h[r], z, out, nc == count, dh, None if order is None else order[r])
        del buf, z  # free the logits buffer before the final dW is allocated (finish)
        for i0 in range(count, n, dead_rows):
            r = slice(i0, min(i0 + dead_rows, n))
            tl_ = tiles.rows(r.stop - r.start)
            kgemm.lce_gemm(kgemm.MODE_STATS, h[r], w, None, cfg, bias=t.bias, tiles=tl_, smooth=smooth)
            krows.combine(tl_, ntiles, sp.m[r], sp.s[r], sp.zsum[r], sp.argmax[r], col_off=opts.vocab_start)
        if order is not None:  # back to token order (the label logits were computed in it)
            for dst, src in ((raw.m, sp.m), (raw.s, sp.s), (raw.zsum, sp.zsum), (raw.argmax, sp.argmax)):
                dst.index_copy_(0, order, src)

    # -- GEMMs ------------------------------------------------------------------------------------------------
    def _dz_gemm(self, h, w, bias, dz, labels, lse, coef: Coefs, kscale, opts: Options, v0: int) -> None:
        """dz of columns [v0, v0 + w.shape[0]) straight from the logits GEMM's epilogue (the lse is known)."""
        kgemm.lce_gemm(kgemm.MODE_DZ, h, w, dz, self._cfg(h.shape[1]), bias=bias, labels=labels,
                       label_off=opts.vocab_start + v0, lse=lse, a=coef.a, t=coef.t, b=coef.b, u=coef.u,
                       scale=kscale, inv_temp=1.0 / opts.temperature)

    def _token_gemms(self, t: Tensors, h_c, dz, out: Grads, whole: bool, dh, dh_index=None) -> None:
        """Gradients of one token chunk (hidden rows ``h_c``, logits gradient ``dz``): dX rows into ``dh`` (rows
        ``dh_index`` of it when given, the chunk's rows gathered from there), dW (and db) accumulated. ``whole``:
        this chunk holds every token with a gradient (dW is written once, in the weight dtype)."""
        st, want_dw = out.extra
        if dh is not None:
            if dh_index is None:
                _dx_into(dz, t.weight, dh)
            else:
                tmp = torch.empty(h_c.shape, device=h_c.device, dtype=dh.dtype)
                _dx_into(dz, t.weight, tmp)
                dh.index_copy_(0, dh_index, tmp)
        if want_dw:
            if st.dw_acc is None:  # first chunk: one chunk of every token needs no accumulator
                st.dw_acc = not whole or st.post_scale
                dtype = torch.float32 if st.dw_acc else t.weight.dtype
                out.dw = torch.empty(t.weight.shape, device=t.weight.device, dtype=dtype)
                _dw_into(dz, h_c, out.dw, accumulate=False)
            else:
                _dw_into(dz, h_c, out.dw, accumulate=True)
        if out.db is not None:
            out.db += dz.sum(dim=0, dtype=torch.float32)

    def _compact_cols(self, t: Tensors, n: int, mask, opts: Options, gemm: bool) -> int:
        h, w = t.hidden, t.weight
        cols = plan_vocab_chunk(n, w.shape[0], h.shape[1], h.element_size(), mask, opts.tile_bytes,
                                buf_elt=h.element_size() if gemm else 4)
        if gemm and not opts.tile_bytes:
            cols = max(self._cfg(h.shape[1]).bn, cols)
        return cols

    def _compact_stats_gemm(self, t: Tensors, rows: slice, opts: Options, raw: Stats) -> None:
        """Statistics over vocabulary chunks from the STATS epilogue (no logits stored), merged left to right."""
        h, w = t.hidden[rows], t.weight
        n, v = h.shape[0], w.shape[0]
        cfg = self._cfg(h.shape[1])
        cols = self._compact_cols(t, n, (True, True, False), opts, True)
        ntiles = kgemm.num_tiles_n(min(cols, v), cfg)
        tiles = kgemm.TileStats.new(n, ntiles, h.device, opts.wants_zsum, opts.entropy)
        inv_t = 1.0 / opts.temperature
        for v0 in range(0, v, cols):
            v1 = min(v0 + cols, v)
            kgemm.lce_gemm(kgemm.MODE_STATS, h, w[v0:v1], None, cfg,
                           bias=None if t.bias is None else t.bias[v0:v1], tiles=tiles,
                           smooth=opts.wants_zsum, inv_temp=inv_t)
            krows.combine(tiles, kgemm.num_tiles_n(v1 - v0, cfg), raw.m, raw.s, raw.zsum, raw.argmax,
                          col_off=opts.vocab_start + v0, merge=v0 > 0, ez=raw.ez if opts.entropy else None)
        krows.target_logit(h, w, t.bias, t.labels[rows], opts.vocab_start, raw.target, inv_t)

    def _compact_grads(self, t: Tensors, rows: slice, lse, coef: Coefs, kscale, scale, opts: Options,
                       out: Grads) -> None:
        """Per vocabulary chunk: dz (again), dW_c = dz.T @ h written once (complete), dX += dz @ W_c (float32)."""
        st, want_dw = out.extra
        h, w = t.hidden[rows], t.weight
        n, v = h.shape[0], w.shape[0]
        gemm = self.path_reason(t, opts) is None
        mask = (out.dh is not None, want_dw, out.db is not None)
        cols = self._compact_cols(t, n, mask, opts, gemm)
        if want_dw and out.dw is None:
            out.dw = torch.empty(w.shape, device=w.device, dtype=w.dtype)
        if out.dh is not None:
            out.dh[rows].zero_()
        if gemm:
            buf = torch.empty(n * _pad(min(cols, v), 64), device=h.device, dtype=h.dtype)
        else:
            buf = torch.empty(n * _pad(min(cols, v), 32), device=h.device, dtype=torch.float32)
        post = st.post_scale and scale is not None
        for v0 in range(0, v, cols):
            v1 = min(v0 + cols, v)
            if gemm:
                vp = _pad(v1 - v0, 64)
                dz = buf[: n * vp].view(n, vp)[:, : v1 - v0]
                self._dz_gemm(h, w[v0:v1], None if t.bias is None else t.bias[v0:v1], dz, t.labels[rows], lse,
                              coef, kscale, opts, v0)
            else:
                vp = _pad(v1 - v0, 32)
                z = buf[: n * vp].view(n, vp)[:, : v1 - v0]
                _logits32(h, w[v0:v1], z)
                dz = _dz_view(z, h.dtype)
                _launch(t, opts, z, rows, grad=True, dz=dz, coef=coef, scale=kscale, lse=lse, v0=v0, v1=v1)
            if want_dw:
                if post:
                    tmp = torch.empty(v1 - v0, h.shape[1], device=h.device, dtype=torch.float32)
                    _dw_into(dz, h, tmp, accumulate=False)
                    krows.scale_cast(tmp, w.dtype, scale.to(torch.float32).reshape(()), out=out.dw[v0:v1])
                    del tmp
                else:
                    _dw_into(dz, h, out.dw[v0:v1], accumulate=False)
            if out.dh is not None:
                _dx_into(dz, w[v0:v1], out.dh[rows], accumulate=True)
            if out.db is not None:
                out.db[v0:v1] += dz.sum(dim=0, dtype=torch.float32)


PROVIDER = TritonProvider()
