"""The "cpp" backend: the compiled CPU kernel in ``fused_lce._C`` (csrc/cpu/).

Importing this module loads ``fused_lce._C``, which registers C++ kernels of ``torch.ops.fused_lce.forward`` /
``backward`` for the CPU dispatch key; from then on every CPU call of the ops runs in C++, which computes natively
for ``backend="cpp"`` / ``"auto"`` and hands other backends back to the Python router (see csrc/ops.cpp). The
router reaches the methods below only for what the C++ op kernel does not run itself: a vocab-parallel group
(statistics pass in C++, combine in Python, gradients in C++).

Environment knobs, read per call (tile-parallel is the default because it measured faster than gemm-parallel on
2 cores; block and tile sizes between 256 and 1024 were within measurement noise of each other):
``FUSED_LCE_TILE_MB`` tile budget in MiB (default 256; the kept row block of a token block uses up to 3/4 of it),
``FUSED_LCE_CPP_PARALLEL`` "tiles" (default: vocabulary tiles split across threads, single-threaded GEMMs) or
"gemm" (tiles in order, threaded GEMMs), ``FUSED_LCE_CPP_NB`` / ``FUSED_LCE_CPP_VB`` caps on the token block /
vocabulary tile, ``FUSED_LCE_CPP_ISA`` "avx512" | "avx2" | "default" (row kernels' instruction set, when the CPU
has it), ``FUSED_LCE_CPP_BF16_GEMM`` "0" (bf16 inputs: convert tiles to float32 instead of bf16 x bf16 -> fp32
GEMMs, which are used when the CPU has native bf16 dot products and the GEMM passes an exactness check),
``FUSED_LCE_CPP_PROFILE`` "1" (per-phase times on stderr; read once). ``describe()`` says what a problem gets.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from .. import distributed
from .base import Backend, Config, ForwardResult, loss_from_stats

_C = None
_IMPORT_ERROR: Optional[str] = None
try:
    from .. import _C  # noqa: F811  (loading it registers the CPU kernels)
except ImportError as e:
    _IMPORT_ERROR = f"{type(e).__name__}: {e}"

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _missing_reason() -> str:
    """Why _C is not importable: the build's own note (fused_lce/_build_status.txt) when setup.py left one."""
    status = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_build_status.txt")
    if os.path.exists(status):
        with open(status) as f:
            return f.read().strip()
    if _IMPORT_ERROR and "No module named" in _IMPORT_ERROR:
        return ("not built: fused_lce._C is missing (install with a C++ compiler: "
                "`pip install --no-build-isolation .`)")
    return f"fused_lce._C failed to load ({_IMPORT_ERROR})"


class CppBackend(Backend):
    name = "cpp"
    device_types = ("cpu",)

    def unavailable_reason(self) -> Optional[str]:
        return None if _C is not None else _missing_reason()

    def unsupported_reason(self, device: torch.device, cfg: Config, dtype: torch.dtype) -> Optional[str]:
        reason = super().unsupported_reason(device, cfg, dtype)
        if reason is None and dtype not in _DTYPES:
            reason = f"backend 'cpp' supports float32, bfloat16 and float16, got {dtype}"
        return reason

    @staticmethod
    def _opts(cfg: Config):
        return cfg.ignore_index, cfg.label_smoothing, cfg.z_loss, cfg.softcap, cfg.vocab_start, cfg.vocab_total

    def forward(self, hidden, weight, labels, bias, cfg: Config, grad_scale, grad_mask) -> ForwardResult:
        mask = (bool(grad_mask[0]), bool(grad_mask[1]), bool(grad_mask[2]) and bias is not None)
        scale = float(grad_scale) if grad_scale is not None and any(mask) else None
        if not cfg.group_name:
            ii, eps, zl, cap, vs, vt = self._opts(cfg)
            r = _C.forward(hidden, weight, labels, bias, ii, eps, zl, cap, vs, vt, cfg.tile_bytes, scale, mask, False)
            return ForwardResult(*r)
        return self._forward_group(hidden, weight, labels, bias, cfg, scale, mask)

    def backward(self, grad_loss, hidden, weight, labels, bias, lse, cfg: Config, grad_mask):
        mask = (bool(grad_mask[0]), bool(grad_mask[1]), bool(grad_mask[2]) and bias is not None)
        ii, eps, zl, cap, vs, vt = self._opts(cfg)
        return tuple(_C.backward(grad_loss.to(torch.float32), hidden, weight, labels, bias, lse, ii, eps, zl, cap,
                                 vs, vt, cfg.tile_bytes, mask, bool(cfg.group_name)))

    def _forward_group(self, hidden, weight, labels, bias, cfg: Config, scale, mask) -> ForwardResult:
        """Vocab-parallel: shard statistics in C++, the combine across ranks, then (when asked) the gradients in C++
        from the global lse -- one GEMM more than the single-device fused pass."""
        ii, eps, zl, cap, vs, vt = self._opts(cfg)
        m, s, zt, zs, amax = _C.stats(hidden, weight, labels, bias, ii, eps, cap, vs, vt, cfg.tile_bytes)
        m, s, zt, zs, amax = distributed.combine_stats(m, s, zt, zs, amax, cfg.group_name)
        per, lse, correct, _, _ = loss_from_stats(m, s, zt, zs, amax, labels, ii, eps, zl, vt or weight.shape[0])
        dh = dw = db = None
        if scale is not None:
            g = torch.full_like(lse, scale)  # the kernel zeroes ignored tokens and poisons bad labels itself
            dh, dw, db = _C.backward(g, hidden, weight, labels, bias, lse, ii, eps, zl, cap, vs, vt, cfg.tile_bytes,
                                     mask, True)
        return ForwardResult(per, lse, correct, dh, dw, db)


def describe(n: int, v: int, d: int, dtype=torch.float32, tile_mb: Optional[float] = None, fused=True) -> str:
    """The instruction set, GEMM path and tiling the kernel picks for an (n, v, d) problem (tests, benchmarks)."""
    if _C is None:
        return f"unavailable: {_missing_reason()}"
    tile_bytes = int(tile_mb * 2**20) if tile_mb else 0
    return _C.describe(n, v, d, dtype != torch.float32, tile_bytes, fused)


BACKEND = CppBackend()
