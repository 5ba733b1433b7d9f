"""The cuBLAS products of the "triton" provider: float32-result GEMMs for bf16 / fp16 operands, with the
vocabulary split so that an odd V keeps cuBLAS on its fast kernels."""
from __future__ import annotations

import torch

# does torch.addmm(fp32, bf16, bf16, out_dtype=fp32, out=fp32) work here? (probed lazily)
_ADDMM_FP32 = [None]


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


def _addmm32(out, a, b, beta: float, alpha: float) -> bool:
    """out (float32) = beta * out + alpha * (a @ b) in one cuBLAS call on 16-bit operands, when this torch can
    (probed on first use); False: nothing was done, the caller falls back."""
    if a.device.type != "cuda" or a.dtype == torch.float32 or _ADDMM_FP32[0] is False:
        return False
    try:
        torch.addmm(out, a, b, beta=beta, alpha=alpha, out_dtype=torch.float32, out=out)
    except (RuntimeError, TypeError):  # an older torch: addmm wants self in the operand dtype
        _ADDMM_FP32[0] = False
        return False
    _ADDMM_FP32[0] = True
    return True


def _mm_into(a, b, out, alpha: float = 1.0):
    """out = alpha * (a @ b) in out's dtype (fp32 accumulation and alpha inside the GEMM, one rounding)."""
    if out.dtype == torch.float32:
        if alpha != 1.0 and _addmm32(out, a, b, 0, alpha):  # beta = 0: out is not read
            return out
        _mm32(a, b, out)
        return out.mul_(alpha) if alpha != 1.0 else out
    if a.device.type != "cuda":
        out.copy_((a.float() @ b.float()) * alpha)
        return out
    if alpha != 1.0:  # beta = 0: out is not read
        return torch.addmm(out, a, b, beta=0, alpha=alpha, out=out)
    return torch.mm(a, b, out=out)


def _mm_acc(acc, a, b, alpha: float = 1.0):
    """acc (float32) += alpha * (a @ b), accumulating in float32, without a full-size temporary."""
    if _addmm32(acc, a, b, 1, alpha):
        return acc
    if a.dtype == torch.float32 or a.device.type != "cuda":
        if a.device.type == "cuda":
            return acc.addmm_(a, b, alpha=alpha)
        return acc.add_(a.float() @ b.float(), alpha=alpha)
    # fallback: row slices of a float32 product, each at most ~64 MiB
    step = max(1, (64 * 2**20) // max(1, 4 * acc.shape[1]))
    for r0 in range(0, acc.shape[0], step):
        acc[r0:r0 + step].add_(torch.mm(a[r0:r0 + step], b, out_dtype=torch.float32), alpha=alpha)
    return acc


# An odd vocabulary sends cuBLAS to slow kernels whenever V is an M, N or K of the product (measured on the
# H200: h @ W.T with V = 151931 took 51 ms against 13.8 ms at V = 151936, padded output rows or not). So every
# product that has V as a dimension is split into the first V - V % 64 rows of the vocabulary and a small
# remainder.
VSPLIT = 64


def _vparts(v: int):
    vm = v - v % VSPLIT
    return ((0, v),) if vm in (0, v) else ((0, vm), (vm, v))


def _logits32(h, w, z):
    """z[:, :V] = h @ w.T in float32 (z: a row-padded [n, V] view)."""
    for a, b in _vparts(w.shape[0]):
        _mm32(h, w[a:b].t(), z[:, a:b])


def _mm_add(out, a, b, alpha: float = 1.0):
    """out += alpha * (a @ b) in out's dtype (one rounding of the sum when out is not float32)."""
    if out.dtype == torch.float32:
        return _mm_acc(out, a, b, alpha)
    if a.device.type == "cuda":
        return out.addmm_(a, b, alpha=alpha)
    return out.copy_(out.float() + (a.float() @ b.float()) * alpha)


def _dx_into(dz, w, out, accumulate: bool = False, alpha: float = 1.0):
    """out (+)= alpha * (dz @ w) over the vocabulary (dz: [n, V] view, w: [V, D]): the small remainder first,
    then the aligned bulk on top of it, so a low-precision out is rounded once more only by the remainder's
    tiny part."""
    parts = _vparts(w.shape[0])
    for k, (a, b) in enumerate(reversed(parts)):
        if accumulate or k > 0:
            _mm_add(out, dz[:, a:b], w[a:b], alpha)
        else:
            _mm_into(dz[:, a:b], w[a:b], out, alpha)


def _dw_into(dz, h, out, accumulate: bool, alpha: float = 1.0):
    """out[V, D] (+)= alpha * (dz.T @ h), row block by row block of the vocabulary."""
    for a, b in _vparts(out.shape[0]):
        if accumulate:
            _mm_acc(out[a:b], dz[:, a:b].t(), h, alpha)
        else:
            _mm_into(dz[:, a:b].t(), h, out[a:b], alpha)
