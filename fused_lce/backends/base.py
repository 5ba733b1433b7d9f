"""The interface between the driver (``fused_lce.driver``) and the kernel providers in this package.

The driver owns the algorithm -- token blocks, the vocab-parallel combine, the loss formula, the per-token
weights, the reduction and autograd. A provider owns kernels only:

* ``stats(t, rows, opts, keep)``: per-token statistics of this rank's vocabulary shard for the token rows
  ``rows`` -- running max ``m``, ``s = sum exp(z - m)``, the label's logit (0 when the label is not in the shard),
  ``sum z`` and the first argmax as a global id -- plus an opaque cache (e.g. logits tiles kept for ``grads``);
* ``grads(t, rows, lse, coef, scale, opts, out, cache)``: adds ``scale * dz @ ...`` over those rows into ``out``
  (float32 accumulators), from the global ``lse``, where per token ``dz = p (a + b z) - t onehot(label) - u`` with
  ``p = softmax(z)`` and the per-token coefficients ``coef`` (``Coefs``) formed by the driver -- for the loss
  (``a = g (1 + 2 z_loss lse)``, ``t = g (1 - eps)``, ``u = g eps / V``) and for ``linear_logprobs`` (log-prob and
  entropy weights) alike. Providers that have not moved to this form (``supports_logprobs = False``) receive the
  loss's per-token weight ``g`` as ``coef`` instead and form the loss coefficients in their kernels;
* optionally ``fused(t, g, scale, opts, out)``: both at once on one device (the gradients need only the row's own
  statistics there), for providers whose kernels do that in one pass;
* ``supports(problem)``: None, or why this provider cannot run this problem (shapes, dtype, device, options),
  so every fallback is decided by the registry and reported by ``backend_info()``.

Here ``z = softcap(hidden @ weight.T + bias) / opts.temperature`` (temperature 1 for the loss) and ``g`` is the
per-token weight: the upstream gradient where the label is valid, 0 where it is ignored, NaN where it is out of
range (it must poison, never index). ``loss_i`` is the per-token loss of SPEC (docs/spec.md) with
``opts.label_smoothing`` and ``opts.z_loss``. What ``linear_logprobs`` needs of a provider: docs/providers.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import torch


_LOSS_ONLY = {"ops": ("loss",)}
_LOGPROBS_ONLY = {"ops": ("logprobs",)}


@dataclass(frozen=True)
class Options:
    """Every option, normalised once by ``fused_lce.api`` and carried unchanged to the providers.

    The field order is the order of the options block in the schemas of the ops (``fused_lce.ops`` builds that
    part of the schema from these fields): the loss ops ``torch.ops.fused_lce.forward`` / ``backward`` take the
    fields of ``OPTION_FIELDS``, the log-prob ops ``fused_lce::logprobs`` / ``logprobs_backward`` those of
    ``LOGPROB_FIELDS`` (a field's ``metadata["ops"]`` says which, default both). Adding an option means: a field
    here, the API argument, the formula in the driver, and the kernels that implement it.
    """

    ignore_index: int = -100
    label_smoothing: float = dataclasses.field(default=0.0, metadata=_LOSS_ONLY)
    z_loss: float = dataclasses.field(default=0.0, metadata=_LOSS_ONLY)
    softcap: float = 0.0  # 0: off
    backend: str = "auto"  # a registry name or "auto"
    group_name: str = ""  # "": one device; else the vocab-parallel process group
    vocab_start: int = 0  # first global vocabulary id of this rank's weight shard
    vocab_total: int = 0  # global vocabulary size; 0: weight.shape[0]
    tile_bytes: int = 0  # bytes of logits tiles a provider may keep live; 0: the provider's default
    # linear_logprobs only (the loss ops always run with the defaults):
    temperature: float = dataclasses.field(default=1.0, metadata=_LOGPROBS_ONLY)  # z = softcap(logits) / T
    entropy: bool = dataclasses.field(default=False, metadata=_LOGPROBS_ONLY)  # stats returns EntropyStats

    def vocab(self, v_local: int) -> int:
        return self.vocab_total or v_local


def op_fields(op: str) -> tuple[str, ...]:
    """Names of the Options fields in the options block of the ``op`` ("loss" or "logprobs") schemas."""
    return tuple(f.name for f in dataclasses.fields(Options) if op in f.metadata.get("ops", ("loss", "logprobs")))


OPTION_FIELDS = op_fields("loss")
LOGPROB_FIELDS = op_fields("logprobs")
_SCHEMA_TYPES = {int: "int", float: "float", str: "str", bool: "bool", "int": "int", "float": "float",
                 "str": "str", "bool": "bool"}


def options_schema(op: str = "loss") -> str:
    """``"int ignore_index, float label_smoothing, ..."``: the options block of the ``op`` schemas."""
    names = op_fields(op)
    return ", ".join(f"{_SCHEMA_TYPES[f.type]} {f.name}" for f in dataclasses.fields(Options) if f.name in names)


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
    op: str = "loss"  # "loss" or "logprobs" (per-token log-probs / entropy: needs ``supports_logprobs``)

    @staticmethod
    def of(t: Tensors, opts: Options, mask=(False, False, False), op: str = "loss") -> "Problem":
        return Problem(t.hidden.shape[0], t.hidden.shape[1], t.weight.shape[0], t.hidden.dtype, t.hidden.device,
                       t.bias is not None, opts, tuple(bool(x) for x in mask), op)


class Stats(NamedTuple):
    """Per-token statistics over a vocabulary shard (float32, argmax int64 global ids), of ``z`` = the logits
    after softcap and temperature."""

    m: torch.Tensor
    s: torch.Tensor
    target: torch.Tensor
    zsum: torch.Tensor
    argmax: torch.Tensor


class EntropyStats(NamedTuple):
    """What ``stats`` returns instead of ``Stats`` when ``opts.entropy``: the same fields and ``ez = sum exp(z - m)
    (z - m)``; then ``E_p[z] = m + ez / s`` and the entropy of ``p = softmax(z)`` is ``log s - ez / s``. (A separate
    type, so that code iterating over a ``Stats`` keeps seeing five fields.)"""

    m: torch.Tensor
    s: torch.Tensor
    target: torch.Tensor
    zsum: torch.Tensor
    argmax: torch.Tensor
    ez: torch.Tensor


class Coefs(NamedTuple):
    """Per-token coefficients of the logits gradient (float32, one value per row of the block): the provider adds
    the gradients of ``dz = p * (a + b * z) - t * onehot(label) - u`` (``p = exp(z - lse)``, ``z`` the logits
    after softcap and temperature; ``b`` / ``u`` None mean 0), chained through ``1 / temperature`` (already folded
    into the coefficients by the driver: the kernels do not divide) and the softcap derivative. A token whose
    coefficients are all 0 contributes nothing; a NaN coefficient poisons that token's gradients."""

    a: torch.Tensor
    t: torch.Tensor
    b: Optional[torch.Tensor] = None
    u: Optional[torch.Tensor] = None


class LossTerms(NamedTuple):
    """The loss's gradient coefficients per unit of token weight ``g``, affine in the token's ``lse``:
    ``a = g (a0 + a1 lse)``, ``t = g t0``, ``u = g u0`` (``u0 == 0``: no uniform term). ``loss_terms`` is the
    only place that knows the loss formula; a one-pass kernel, which learns ``lse`` inside, evaluates exactly this
    form from the four numbers and nothing else."""

    a0: float
    a1: float
    t0: float
    u0: float


def loss_terms(opts: Options, v_local: int) -> LossTerms:
    """``dz = g (1 + 2 z_loss lse) p - g (1 - eps) onehot - g eps / V`` for the SPEC loss with label smoothing
    ``eps`` and ``z_loss``."""
    eps = float(opts.label_smoothing)
    return LossTerms(1.0, 2.0 * float(opts.z_loss), 1.0 - eps, eps / max(opts.vocab(v_local), 1))


@dataclass
class Grads:
    """Gradient buffers of one call. ``dh`` rows are written once per token block (its full sum over this rank's
    vocabulary); ``dw`` and ``db`` accumulate over token blocks. ``None`` where not wanted. Providers may allocate
    other dtypes (``new_grads``) as long as ``finish`` returns the right ones."""

    dh: Optional[torch.Tensor]
    dw: Optional[torch.Tensor]
    db: Optional[torch.Tensor]
    fp32_dh: bool = False  # dh stays float32 (a vocab-parallel group sums it before the cast)
    extra: Any = None  # provider-private state (e.g. "dw written yet")


class Provider:
    """Base class of the kernel providers. Subclasses set ``name`` / ``device_types`` and implement ``stats`` and
    ``grads`` (and optionally ``fused``)."""

    name: str = ""
    #: device types this provider runs on ("cpu", "cuda", "npu", ...); None means any
    device_types: Optional[tuple[str, ...]] = None
    #: dtypes its kernels take
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
    #: what has been verified of it, where that differs from "tested here" (shown by backend_info)
    status: Optional[str] = None

    # -- availability ----------------------------------------------------------------------------------------
    def unavailable_reason(self) -> Optional[str]:
        """None when usable on this host, else a sentence saying why not."""
        return None

    def supports(self, p: Problem) -> Optional[str]:
        """None when this provider can run ``p``, else why not. Subclasses extend it (call super first)."""
        if self.device_types is not None and p.device.type not in self.device_types:
            return f"backend {self.name!r} runs on {'/'.join(self.device_types)} tensors, got device {p.device.type!r}"
        if p.dtype not in self.dtypes:
            names = "/".join(str(d).replace("torch.", "") for d in self.dtypes)
            return f"backend {self.name!r} takes {names} inputs, got {p.dtype}"
        if p.op == "logprobs" and not self.supports_logprobs:
            return (f"backend {self.name!r} does not implement linear_logprobs yet (per-token log-probs, entropy, "
                    f"temperature: the contract is in docs/providers.md)")
        return None

    # -- planning ----------------------------------------------------------------------------------------------
    def token_block(self, p: Problem, keep: bool) -> int:
        """Tokens per driver block (every rank of a group uses the smallest proposal). ``keep``: the caller will
        ask for gradients right after the statistics of each block. Default: one block (the kernels tile)."""
        return max(p.n, 1)

    # -- kernels -------------------------------------------------------------------------------------------------
    def stats(self, t: Tensors, rows: slice, opts: Options, keep: bool) -> tuple[Stats, Any]:
        raise NotImplementedError

    def grads(self, t: Tensors, rows: slice, lse: torch.Tensor, coef, scale: Optional[torch.Tensor],
              opts: Options, out: Grads, cache: Any = None) -> None:
        """``coef``: a ``Coefs`` when ``supports_logprobs``, else (the loss only) the per-token weight ``g``."""
        raise NotImplementedError

    #: True when the provider implements the log-prob contract (docs/providers.md, "Log-probs and entropy"):
    #: ``grads`` takes ``Coefs`` (for the loss too), ``stats`` honours ``opts.temperature`` and ``opts.entropy``
    #: (returns ``EntropyStats``). Otherwise ``supports`` declines every ``linear_logprobs`` problem (``auto`` falls back).
    supports_logprobs: bool = False

    #: providers with a single-device one-pass kernel set this and implement ``fused``
    has_fused: bool = False

    def fused(self, t: Tensors, g: torch.Tensor, scale: torch.Tensor, opts: Options, out: Grads) -> Stats:
        """Statistics of all rows and the gradients of ``scale * sum_i g_i * loss_i`` into ``out``, on one
        device (no vocab-parallel group)."""
        raise NotImplementedError

    # -- gradient buffers ------------------------------------------------------------------------------------------
    def new_grads(self, t: Tensors, mask: tuple[bool, bool, bool], fp32_dh: bool, scaled: bool = False) -> Grads:
        """float32 zero accumulators for the wanted gradients. ``scaled``: a uniform ``scale`` will be passed."""
        h, w, b = t.hidden, t.weight, t.bias
        f32 = torch.float32
        return Grads(torch.zeros(h.shape, device=h.device, dtype=f32) if mask[0] else None,
                     torch.zeros(w.shape, device=w.device, dtype=f32) if mask[1] else None,
                     torch.zeros(w.shape[0], device=w.device, dtype=f32) if mask[2] and b is not None else None,
                     fp32_dh)

    def finish(self, t: Tensors, out: Grads, scale: Optional[torch.Tensor]):
        """(dh, dw, db) in their inputs' dtypes (dh float32 when ``out.fp32_dh``); ``scale`` is applied here when
        the provider left it out of ``grads`` (``grads_scaled`` False)."""
        def cast(x, like, keep32=False):
            if x is None:
                return None
            if scale is not None and not self.grads_scaled:
                x = x.mul_(scale)
            return x if keep32 or x.dtype == like.dtype else x.to(like.dtype)

        return (cast(out.dh, t.hidden, out.fp32_dh), cast(out.dw, t.weight),
                cast(out.db, t.bias) if t.bias is not None else None)

    #: True when ``grads`` / ``fused`` apply ``scale`` themselves (else ``finish`` does, in float32)
    grads_scaled: bool = False


class WholeRowsProvider(Provider):
    """A provider whose kernels tile the tokens themselves and allocate their own outputs: one driver block covers
    every row (the default ``token_block``; every rank of a group holds the same tokens, so every rank agrees),
    ``grads`` stores what the kernel returned (``store``), ``finish`` casts to the inputs' dtypes."""

    grads_scaled = True  # the kernels take the scaled token weights

    def new_grads(self, t: Tensors, mask, fp32_dh: bool, scaled: bool = False) -> Grads:
        return Grads(None, None, None, fp32_dh, extra=tuple(bool(x) for x in mask))

    @staticmethod
    def store(t: Tensors, rows: slice, out: Grads, dh, dw, db) -> None:
        if rows.start != 0 or rows.stop != t.hidden.shape[0]:
            raise RuntimeError("fused_lce: this provider expects one token block covering every row")
        m = out.extra
        out.dh = dh if m[0] else None
        out.dw = dw if m[1] else None
        out.db = db if m[2] and t.bias is not None else None

    def finish(self, t: Tensors, out: Grads, scale):
        def cast(x, like, wanted, keep32=False):
            if like is None or not wanted:
                return None
            if x is None:  # no block ran (no tokens): zero gradients
                return torch.zeros(like.shape, device=like.device, dtype=torch.float32 if keep32 else like.dtype)
            return x if keep32 or x.dtype == like.dtype else x.to(like.dtype)

        m = out.extra
        return (cast(out.dh, t.hidden, m[0], out.fp32_dh), cast(out.dw, t.weight, m[1]),
                cast(out.db, t.bias, m[2]))


__all__ = ["WholeRowsProvider", "Options", "OPTION_FIELDS", "LOGPROB_FIELDS", "op_fields", "options_schema",
           "Tensors", "Problem", "Stats", "EntropyStats", "Coefs", "LossTerms", "loss_terms", "Grads", "Provider"]
