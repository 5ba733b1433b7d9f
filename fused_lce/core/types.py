"""The values that cross the layers: options, problems, statistics, gradient coefficients and buffers.

Everything here is data; the behaviour lives in ``fused_lce.core.formulas`` (the maths), ``driver`` (the
algorithm) and the providers (kernels). ``Options`` is the single list of options: the op schemas, the op-side
checks (``fused_lce.core.validate.options``) and the providers all read it field by field.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import torch

LOSS, LOGPROBS = "loss", "logprobs"


def _option(default, *, ops=(LOSS, LOGPROBS), ok: Optional[Callable] = None, expect: str = ""):
    """A field of ``Options``: which op families take it in their schema (``ops``), and the range a value must
    be in (``ok``, described by ``expect`` in the error message)."""
    return dataclasses.field(default=default, metadata={"ops": ops, "ok": ok, "expect": expect})


F32_TINY, F32_MAX = 2.0**-126, 3.4028234663852886e38  # the normal float32 range the kernels compute in


def _finite_ge0(x) -> bool:
    return 0.0 <= x < math.inf


def _f32_scale(x) -> bool:
    """A divisor the float32 kernels can use: a normal float32 whose inverse is finite in float32 too."""
    return F32_TINY <= x <= F32_MAX


@dataclass(frozen=True)
class Options:
    """Every option of the ops, in the order of the options block of their schemas (``fused_lce.ops.schema``
    builds that block from these fields). What else a new scalar option touches: docs/architecture.md,
    "Adding a scalar loss option"."""

    ignore_index: int = _option(-100)  # any 64-bit integer (the schema's int)
    label_smoothing: float = _option(0.0, ops=(LOSS,), ok=lambda x: 0.0 <= x <= 1.0,
                                     expect="a value in [0, 1]")
    z_loss: float = _option(0.0, ops=(LOSS,), ok=_finite_ge0, expect="a finite value >= 0")
    softcap: float = _option(0.0, ok=lambda x: x == 0.0 or _f32_scale(x),
                             expect="0 (off) or a value in [2**-126, 3.4e38] (a normal float32)")
    backend: str = _option("auto")  # a registry name or "auto" (checked against the registry)
    group_name: str = _option("")  # "": one device; else the vocab-parallel process group
    vocab_start: int = _option(0, ok=lambda x: x >= 0, expect="a value >= 0")  # first global id of the shard
    # global vocabulary; 0: weight rows
    vocab_total: int = _option(0, ok=lambda x: x >= 0, expect="a value >= 0")
    tile_bytes: int = _option(0, ok=lambda x: x >= 0, expect="a value >= 0")  # 0: the provider's default
    # linear_logprobs only: z = softcap(logits) / temperature
    temperature: float = _option(1.0, ops=(LOGPROBS,), ok=_f32_scale,
                                 expect="a value in [2**-126, 3.4e38] (a normal float32, so 1 / temperature "
                                        "is finite in float32)")
    entropy: bool = _option(False, ops=(LOGPROBS,))  # stats returns EntropyStats
    mean_logit: bool = _option(False, ops=(LOGPROBS,))  # the op also returns sum_j z_j / V (stats need zsum)
    # the op also returns log sum_j p_j^2 (a second pass at T / 2)
    sum_sq: bool = _option(False, ops=(LOGPROBS,))

    def vocab(self, v_local: int) -> int:
        return self.vocab_total or v_local

    @property
    def wants_zsum(self) -> bool:
        """Whether the statistics need the sum of logits (label smoothing's term of the loss, the mean
        logit)."""
        return self.label_smoothing != 0 or self.mean_logit


def op_fields(op: str) -> tuple[str, ...]:
    """Names of the Options fields in the options block of the ``op`` ("loss" or "logprobs") schemas."""
    return tuple(f.name for f in dataclasses.fields(Options) if op in f.metadata["ops"])


class Tensors(NamedTuple):
    """One flattened 2-D problem: ``hidden (N, D)``, ``weight (V_local, D)``, ``labels (N,)`` (global ids),
    ``bias (V_local,)`` or None. Contiguous, validated by the driver."""

    hidden: torch.Tensor
    weight: torch.Tensor
    labels: torch.Tensor
    bias: Optional[torch.Tensor]


@dataclass(frozen=True)
class Problem:
    """What ``supports`` sees: shapes, dtype, device, options and the gradients wanted."""

    n: int
    d: int
    v: int  # vocabulary rows on this rank
    dtype: torch.dtype
    device: torch.device
    has_bias: bool
    opts: Options
    mask: tuple[bool, bool, bool] = (False, False, False)  # gradients of hidden, weight, bias
    op: str = LOSS  # LOSS or LOGPROBS (per-token log-probs / entropy: needs ``supports_logprobs``)

    @staticmethod
    def of(t: Tensors, opts: Options, mask=(False, False, False), op: str = LOSS) -> "Problem":
        return Problem(t.hidden.shape[0], t.hidden.shape[1], t.weight.shape[0], t.hidden.dtype,
                       t.hidden.device, t.bias is not None, opts, tuple(bool(x) for x in mask), op)


class Stats(NamedTuple):
    """Per-token statistics over a vocabulary shard (float32, argmax int64 global ids), of ``z`` = the logits
    after softcap and temperature."""

    m: torch.Tensor
    s: torch.Tensor
    target: torch.Tensor
    zsum: torch.Tensor
    argmax: torch.Tensor


class EntropyStats(NamedTuple):
    """What ``stats`` returns instead of ``Stats`` when ``opts.entropy``: the same fields and ``ez = sum
    exp(z - m) (z - m)``; then ``E_p[z] = m + ez / s`` and the entropy of ``p = softmax(z)`` is ``log s - ez /
    s``. (A separate type, so that code iterating over a ``Stats`` keeps seeing five fields.)"""

    m: torch.Tensor
    s: torch.Tensor
    target: torch.Tensor
    zsum: torch.Tensor
    argmax: torch.Tensor
    ez: torch.Tensor


class Coefs(NamedTuple):
    """Per-token coefficients of the logits gradient (float32, one value per row of the block): the provider
    adds the gradients of ``dz = p * (a + b * z) - t * onehot(label) - u`` (``p = exp(z - lse)``, ``z`` the
    logits after softcap and temperature; ``b`` / ``u`` None mean 0), chained through ``1 / temperature``
    (already folded into the coefficients by the driver: the kernels do not divide) and the softcap
    derivative. A token whose coefficients are all 0 contributes nothing; a NaN coefficient poisons that
    token's gradients."""

    a: torch.Tensor
    t: torch.Tensor
    b: Optional[torch.Tensor] = None
    u: Optional[torch.Tensor] = None


class LossTerms(NamedTuple):
    """The loss's gradient coefficients per unit of token weight ``g``, affine in the token's ``lse``:
    ``a = g (a0 + a1 lse)``, ``t = g t0``, ``u = g u0`` (``u0 == 0``: no uniform term). A one-pass kernel,
    which learns ``lse`` inside, evaluates exactly this form from the four numbers
    (``fused_lce.core.formulas.loss_terms`` forms them) and nothing else of the loss formula."""

    a0: float
    a1: float
    t0: float
    u0: float


class TokenWeights:
    """The one-pass loss's per-token weights, formed on first use. ``live`` (bool, (N,)): the tokens with a
    gradient (label not ignored), given at once; ``get()`` -> (``g``: float32 (N,) weights, 0 ignored and NaN
    for a bad label; ``scale``: 0-dim float32, the reduction's 1 / divisor). A kernel provider calls ``get()``
    after its first large launch: the small ops that form them cost host time the device would otherwise wait
    through. ``scale_of_count``: when the scale depends on nothing but the number of live tokens ("mean" over
    them, or "sum"), that number -> the scale as a Python float, equal to the device's float32 value, or None
    where it has none (a count above 2**24: then form the weights and read the scale); else None. A provider
    that needs the scale on the host and counts the live rows anyway need not form the weights early for
    it."""

    def __init__(self, live: torch.Tensor, make: Callable[[], tuple],
                 scale_of_count: Optional[Callable[[int], Optional[float]]] = None):
        self.live = live
        self._make, self._value = make, None
        self.scale_of_count = scale_of_count

    def get(self) -> tuple:
        if self._make is not None:
            self._value, self._make = self._make(), None
        return self._value

    def release(self) -> None:
        """Drop ``g`` (its last reader is done; ``get()`` then gives (None, scale)): one float32 per token
        less at the provider's peak of memory."""
        self._value = (None, self.get()[1])


@dataclass
class Grads:
    """Gradient buffers of one call. ``dh`` rows are written once per token block (its full sum over this
    rank's vocabulary); ``dw`` and ``db`` accumulate over token blocks. ``None`` where not wanted. Providers
    may allocate other dtypes (``new_grads``) as long as ``finish`` returns the right ones."""

    dh: Optional[torch.Tensor]
    dw: Optional[torch.Tensor]
    db: Optional[torch.Tensor]
    fp32_dh: bool = False  # dh stays float32 (a vocab-parallel group sums it before the cast)
    extra: Any = None  # provider-private state (e.g. "dw written yet")
