"""The "cpp" provider: the compiled CPU kernels of ``fused_lce._C`` (csrc/cpu/), registered as the private ops
``torch.ops.fused_lce._cpu_stats`` / ``_cpu_grads`` / ``_cpu_fused``.

The kernels tile tokens and vocabulary themselves (one driver block covers all rows): on one device
``_cpu_fused`` computes the statistics and the gradients of each token block in one pass (logits kept between
the two passes when the row block fits the tile budget: 3 GEMM-equivalents); with a vocab-parallel group the
driver runs ``_cpu_stats``, the combine, then ``_cpu_grads`` (one GEMM more), as do ``reduction="none"``'s
backward and ``linear_logprobs`` (statistics with temperature and the entropy statistic; gradients from the
driver's per-token coefficients, ``Coefs``).

Environment knobs of the kernel, read per call (tile-parallel is the default because it measured faster than
gemm-parallel on 2 cores): ``FUSED_LCE_CPP_PARALLEL`` "tiles" (vocabulary tiles split across threads,
single-threaded GEMMs) or "gemm" (tiles in order, threaded GEMMs), ``FUSED_LCE_CPP_NB`` / ``FUSED_LCE_CPP_VB``
caps on the token block / vocabulary tile, ``FUSED_LCE_CPP_ISA`` "avx512" | "avx2" | "default" (row kernels'
instruction set, when the CPU has it), ``FUSED_LCE_CPP_LOW_GEMM`` "auto" | "mkl" | "brgemm" | "convert" (how
bf16 / fp16 tiles are multiplied, float32 results either way: MKL's 16-bit x 16-bit -> fp32 GEMM, ATen's
brgemm (bf16 only), or tiles converted to float32 for float32 GEMMs; auto: MKL for bf16, MKL for fp16 only on
CPUs with AVX512_FP16 / AMX_FP16, else convert; a path this machine lacks, or whose one-time exactness check
fails, falls back to convert; csrc/cpu/gemm.h), ``FUSED_LCE_CPP_BF16_GEMM`` "0" (older knob: convert for
bf16), ``FUSED_LCE_CPP_PROFILE`` "1" (per-phase wall and CPU seconds on stderr). The tile budget is
``Options.tile_bytes`` (``tile_budget_mb`` / ``FUSED_LCE_TILE_MB``; default 256 MiB; the kept row block uses
up to 3/4 of it). ``describe()`` says what a problem gets (GEMM path per 16-bit dtype, tiling, the CPU
features the defaults use).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import build_status
from ..core import (Coefs, EntropyStats, Grads, LossTerms, Options, Stats, Tensors, TokenWeights,
                    WholeRowsProvider)

_C = None
_IMPORT_ERROR: Optional[str] = None
try:
    from .. import _C  # noqa: F811  (loading it registers the kernels)
except ImportError as e:
    _IMPORT_ERROR = f"{type(e).__name__}: {e}"


def _missing_reason() -> str:
    """Why _C is not importable: the build's own record (fused_lce/_build_status.json) when setup.py left
    one."""
    recorded = build_status.failure(build_status.read()["cpp"])
    if recorded:
        return recorded
    if _IMPORT_ERROR and "No module named" in _IMPORT_ERROR:
        return ("not built: fused_lce._C is missing (install with a C++ compiler: "
                "`pip install --no-build-isolation .`)")
    return f"fused_lce._C failed to load ({_IMPORT_ERROR})"


class CppProvider(WholeRowsProvider):
    name = "cpp"
    device_types = ("cpu",)
    has_fused = True

    def unavailable_reason(self) -> Optional[str]:
        return None if _C is not None else _missing_reason()

    supports_logprobs = True

    def stats(self, t: Tensors, rows: slice, opts: Options, keep: bool):
        *r, ez = torch.ops.fused_lce._cpu_stats(t.hidden[rows], t.weight, t.bias, t.labels[rows],
                                                opts.vocab_start, opts.softcap, opts.temperature,
                                                opts.wants_zsum, opts.entropy, opts.tile_bytes)
        return (EntropyStats(*r, ez) if opts.entropy else Stats(*r)), None

    def grads(self, t: Tensors, rows: slice, lse, coef: Coefs, scale, opts: Options, out: Grads,
              cache=None) -> None:
        dh, dw, db = torch.ops.fused_lce._cpu_grads(
            t.hidden[rows], t.weight, t.bias, t.labels[rows], lse, coef.a, coef.t, coef.b, coef.u,
            opts.vocab_start, opts.softcap, opts.temperature, list(out.extra),
            1.0 if scale is None else float(scale), opts.tile_bytes, out.fp32_dh)
        self.store(t, rows, out, dh, dw, db)

    def fused(self, t: Tensors, weights: TokenWeights, terms: LossTerms, opts: Options, out: Grads) -> Stats:
        g, scale = weights.get()
        r = torch.ops.fused_lce._cpu_fused(t.hidden, t.weight, t.bias, t.labels, g, *terms, opts.softcap,
                                           opts.wants_zsum, list(out.extra), float(scale),
                                           opts.tile_bytes)
        self.store(t, slice(0, t.hidden.shape[0]), out, *r[5:])
        return Stats(*r[:5])


def describe(n: int, v: int, d: int, dtype=torch.float32, tile_mb: Optional[float] = None, fused=True) -> str:
    """The row-kernel instruction set, GEMM path (``gemm=fp32``, or ``gemm=bf16:<path>,fp16:<path>`` for
    16-bit dtypes), tiling and CPU features (``cpu=``) the kernel picks for an (n, v, d) problem (tests,
    benchmarks)."""
    if _C is None:
        return f"unavailable: {_missing_reason()}"
    tile_bytes = int(tile_mb * 2**20) if tile_mb else 0
    return _C.describe(n, v, d, dtype != torch.float32, tile_bytes, fused)


PROVIDER = CppProvider()
