"""Planning for the "triton" provider: which path a problem takes, token / vocabulary chunks from the shapes
and the free device memory, and which rows have a gradient (live rows)."""
from __future__ import annotations

import functools
import os
import time
from typing import Optional

import torch

from ...core import Options
from . import kernels

GiB = 2**30
SLACK = int(0.4 * GiB)  # logits-buffer room beyond what the gradients themselves need (default mode)
MIN_ROWS = 64  # smallest default token chunk: below this the GEMMs stop filling the GPU
# Fused-GEMM path: token chunks of at least this many rows, memory permitting. The gradient products of a
# chunk have its rows as M (dX) and K (dW); shorter ones lose rate (wave quantisation, each dW tile's prologue
# and epilogue over fewer K steps), and every chunk after the first costs one more read and write of the
# float32 dW accumulator. On the H200 at 16384 x 2048 x 151936 five chunks of 2785 rows took 4 ms more than
# one (fp16).
FULL_RATE_ROWS = 8192
BLOCK = kernels.tile_rows.BLOCK if kernels.tile_rows is not None else 2048


def compact_mode() -> bool:
    """True when FUSED_LCE_COMPACT asks for the low-memory (vocabulary-chunked, 4 GEMM-equivalent)
    schedule."""
    return os.environ.get("FUSED_LCE_COMPACT", "0").strip().lower() not in ("", "0", "false", "no", "off")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def gemm_path_reason(dtype: torch.dtype, d: int, device: torch.device, opts: Options,
                     ptrs=()) -> Optional[str]:
    """None when the fused-GEMM path runs this problem, else why the cuBLAS path does.
    ``FUSED_LCE_TRITON_GEMM``: 0 never, 1 whenever the kernel can (also CPU tensors under the interpreter)."""
    env = os.environ.get("FUSED_LCE_TRITON_GEMM", "auto").strip().lower()
    if env in ("0", "off", "false", "no", "cublas"):
        return "FUSED_LCE_TRITON_GEMM=0"
    if kernels.gemm is None:
        return f"the GEMM kernels do not import ({kernels.ERROR})"
    if dtype not in (torch.bfloat16, torch.float16):
        return "float32 inputs keep cuBLAS float32 products"
    if opts.softcap:
        return "softcap: the exp tiles would not give the softcap derivative"
    if d % 8 or any(p % 16 for p in ptrs):
        return "hidden rows or base pointers are not 16-byte aligned (tensor descriptors need them)"
    if device.type == "cuda":
        if _major(device) < 9 and env not in ("1", "on", "true", "yes", "gemm"):
            return "a GPU before Hopper (no TMA): the cuBLAS path is faster there"
        return None
    if _interpreting() and env in ("1", "on", "true", "yes", "gemm"):
        return None
    return f"device {device.type}"


def _major(device: torch.device) -> int:
    return _cuda_major(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_major(index: int) -> int:
    """The compute capability's major version, asked once per device (host time before the first launch)."""
    return torch.cuda.get_device_capability(index)[0]


def _pad(v: int, elems: int) -> int:
    """Row length padded to a multiple of ``elems`` elements (16 bytes at least; callers pass 128 bytes)."""
    return max(elems, -(-v // elems) * elems)


_POOL = {}  # device index -> (monotonic time, driver-free + allocator-reserved bytes at that time)


def _free_bytes(device: torch.device) -> Optional[int]:
    """Free device memory plus what the caching allocator holds unused; None while a CUDA graph is being
    captured or on CPU. The driver is asked at most once a second (the allocator's own counters in
    between)."""
    if device.type != "cuda":
        return None
    try:
        if torch.cuda.is_current_stream_capturing():
            return None
        idx = device.index if device.index is not None else torch.cuda.current_device()
        now = time.monotonic()
        hit = _POOL.get(idx)
        allocated, reserved = _allocator_bytes(idx)
        if hit is None or now - hit[0] > 1.0:
            free, _ = torch.cuda.mem_get_info(idx)
            hit = _POOL[idx] = (now, int(free + reserved))
        return max(0, hit[1] - int(allocated))
    except Exception:  # pragma: no cover
        return None


def _allocator_bytes(idx: int) -> tuple[int, int]:
    """(allocated, reserved) bytes of the caching allocator. From the nested statistics: ``memory_allocated``
    flattens and sorts the whole statistics dict first (a few hundred microseconds of host time per step on
    the H200's host)."""
    try:
        st = torch.cuda.memory_stats_as_nested_dict(idx)
        return int(st["allocated_bytes"]["all"]["current"]), int(st["reserved_bytes"]["all"]["current"])
    except (KeyError, TypeError):
        return int(torch.cuda.memory_allocated(idx)), int(torch.cuda.memory_reserved(idx))


def plan_token_chunk(n: int, v: int, d: int, elt: int, want_dw: bool, acc_always: bool, tile_bytes: int,
                     free: Optional[int], row_bytes: Optional[int] = None,
                     full_rate: int = 0) -> tuple[int, bool]:
    """(tokens per chunk, use a float32 dW accumulator) for the default schedule.

    ``row_bytes``: buffer bytes per token (default: a float32 logits row, 4 * V). One chunk (no accumulator)
    when its buffer fits in ``SLACK`` plus the room of the float32 accumulator it makes unnecessary. Otherwise
    the buffer gets ``SLACK`` plus the room of the final dW (allocated only after the buffer is freed), so the
    peak stays near dX + dW + 4*V*D + SLACK, but with ``full_rate`` (the fused-GEMM path passes
    ``FULL_RATE_ROWS``) never more chunks than ``N / full_rate`` rounded up: shorter chunks cost more time
    than their memory is worth. Both are capped by three quarters of the free device memory. ``tile_bytes``
    (the caller's tile budget) overrides the rule.
    """
    n = max(n, 1)
    row = row_bytes or 4 * max(v, 1)
    acc = 4 * v * d if want_dw else 0
    if tile_bytes:
        rows = max(1, tile_bytes // row)
    else:
        cap = None if free is None else int(0.75 * free)
        one_fits = cap is None or n * row + max(v * d * elt, acc if acc_always else 0) <= cap
        if one_fits and n * row <= SLACK + (0 if acc_always else acc):
            return n, want_dw and acc_always
        rows = (SLACK + (v * d * elt if want_dw else 0)) // row
        if full_rate:
            rows = max(rows, -(-n // -(-n // full_rate)))
        if rows >= n and one_fits:
            return n, want_dw and acc_always
        if cap is not None:
            rows = min(rows, (cap - acc) // row)
        rows = max(min(n, MIN_ROWS), rows)
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


def _may_gather(live: torch.Tensor) -> bool:
    return (live.shape[0] > 0 and skip_dead_rows() and
            not (live.is_cuda and torch.cuda.is_current_stream_capturing()))


def _live_order_device(live: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """``(order, count)``: a permutation with the rows where ``live`` holds first (stable) and their number as
    a 0-dim device tensor (no host synchronisation: for kernels that read it on the device); None as
    ``_live_order`` does, and when no row is dead is not known here."""
    if not _may_gather(live):
        return None
    try:  # one sort of the mask itself (descending: True first)
        return torch.sort(live, stable=True, descending=True)[1], live.sum()
    except (RuntimeError, NotImplementedError):  # a build whose sort takes no bool keys
        return torch.argsort(live.logical_not().to(torch.uint8), stable=True), live.sum()


def _live_order(live: torch.Tensor) -> Optional[tuple[torch.Tensor, int]]:
    """``(rows, count)``: the indices where ``live`` holds, ascending, and how many there are; None when every
    row is live, while a CUDA graph is being captured, or with FUSED_LCE_SKIP_IGNORED=0.

    The gradient products then run over ``count`` rows instead of all: a token without gradient (an ignored
    label) costs no part of dz, dX or dW. cuBLAS takes its sizes on the host, so the count is read there (by
    ``nonzero``): the host synchronisation of these kernels (fp16's loss scale is read right after it, when
    the device has drained). It comes before their first large launch, so the device waits only for the host's
    launch latency after it (the caller queues nothing large before it)."""
    if not _may_gather(live):
        return None
    rows = torch.nonzero(live).squeeze(1)
    count = rows.shape[0]
    return None if count == live.shape[0] else (rows, count)
