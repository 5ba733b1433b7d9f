"""The interface between the driver (``fused_lce.core.driver``) and the kernel providers
(``fused_lce.backends``).

The driver owns the algorithm -- token blocks, the vocab-parallel combine, the loss formula, the per-token
weights, the reduction and autograd. A provider owns kernels only:

* ``stats(t, rows, opts, keep)``: per-token statistics of this rank's vocabulary shard for the token rows
  ``rows`` -- running max ``m``, ``s = sum exp(z - m)``, the label's logit (0 when the label is not in the
  shard), ``sum z`` and the first argmax as a global id (and ``ez`` when ``opts.entropy``) -- plus an opaque
  cache (e.g. logits tiles kept for ``grads``);
* ``grads(t, rows, lse, coef, scale, opts, out, cache)``: adds ``scale * dz @ ...`` over those rows into
  ``out`` (float32 accumulators), from the global ``lse``, where per token ``dz = p (a + b z) - t
  onehot(label) - u`` with ``p = softmax(z)`` and the per-token coefficients ``coef`` (``Coefs``) formed by
  the driver, for the loss and for ``linear_logprobs`` alike;
* optionally ``fused(t, g, terms, scale, opts, out)``: both at once on one device, where the row's own
  statistics give ``lse`` inside the kernel and ``terms`` (``LossTerms``) turn the token weight ``g`` into the
  coefficients;
* ``supports(problem)``: None, or why this provider cannot run this problem (shapes, dtype, device, options),
  so every fallback is decided by the registry and reported by ``backend_info()``.

Here ``z = softcap(hidden @ weight.T + bias) / opts.temperature`` and ``g`` is the per-token weight: the
upstream gradient where the label is valid, 0 where it is ignored, NaN where it is out of range (it must
poison, never index). docs/providers.md is the guide to writing one.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .types import LOGPROBS, Coefs, Grads, LossTerms, Options, Problem, Stats, Tensors, TokenWeights


class Provider:
    """Base class of the kernel providers. Subclasses set ``name`` / ``device_types`` and implement ``stats``
    and ``grads`` (and optionally ``fused``)."""

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
            return (f"backend {self.name!r} runs on {'/'.join(self.device_types)} tensors, got device "
                    f"{p.device.type!r}")
        if p.dtype not in self.dtypes:
            names = "/".join(str(d).replace("torch.", "") for d in self.dtypes)
            return f"backend {self.name!r} takes {names} inputs, got {p.dtype}"
        if p.op == LOGPROBS and not self.supports_logprobs:
            return (f"backend {self.name!r} does not implement linear_logprobs yet (per-token log-probs, "
                    "entropy, temperature: the contract is in docs/providers.md)")
        return None

    # -- first use on a device (fused_lce.core.selfcheck) ----------------------------------------------------
    def needs_check(self, device: torch.device) -> Optional[str]:
        """Why this provider must pass the first-use self-check before it serves ``device`` (where the project
        has never verified it), or None (verified there: CPU kernels run in CI, a GPU architecture the CUDA
        suite ran on)."""
        return None

    def check_id(self, device: torch.device) -> str:
        """What a self-check verdict depends on besides the package version -- the compiled kernels, the
        toolkit / driver, the device -- as one string (the verdict's disk-cache key)."""
        return f"torch {torch.__version__}|{device_name(device)}"

    # -- planning --------------------------------------------------------------------------------------------
    def token_block(self, p: Problem, keep: bool) -> int:
        """Tokens per driver block (every rank of a group uses the smallest proposal). ``keep``: the caller
        will ask for gradients right after the statistics of each block. Default: one block (the kernels
        tile)."""
        return max(p.n, 1)

    # -- kernels ---------------------------------------------------------------------------------------------
    def stats(self, t: Tensors, rows: slice, opts: Options, keep: bool) -> tuple[Stats, Any]:
        raise NotImplementedError

    def grads(self, t: Tensors, rows: slice, lse: torch.Tensor, coef: Coefs, scale: Optional[torch.Tensor],
              opts: Options, out: Grads, cache: Any = None) -> None:
        raise NotImplementedError

    #: True when ``stats`` honours ``opts.temperature`` and ``opts.entropy`` (returns ``EntropyStats``) and
    #: ``grads`` any ``Coefs`` (docs/providers.md, "Log-probs and entropy"). Otherwise ``supports`` declines
    #: every ``linear_logprobs`` problem (``auto`` falls back).
    supports_logprobs: bool = False

    #: providers with a single-device one-pass kernel set this and implement ``fused``
    has_fused: bool = False

    def fused(self, t: Tensors, weights: TokenWeights, terms: LossTerms, opts: Options, out: Grads) -> Stats:
        """Statistics of all rows and the gradients of ``scale * sum_i g_i * loss_i`` into ``out``, on one
        device (no vocab-parallel group): per row, ``Coefs`` from ``terms`` at the row's own ``lse``;
        ``(g, scale) = weights.get()``, best called after the first large launch (``weights.live``: g !=
        0)."""
        raise NotImplementedError

    # -- gradient buffers ------------------------------------------------------------------------------------
    def new_grads(self, t: Tensors, mask: tuple[bool, bool, bool], fp32_dh: bool,
                  scaled: bool = False) -> Grads:
        """float32 zero accumulators for the wanted gradients. ``scaled``: a uniform ``scale`` will be
        passed."""
        h, w, b = t.hidden, t.weight, t.bias
        f32 = torch.float32
        return Grads(torch.zeros(h.shape, device=h.device, dtype=f32) if mask[0] else None,
                     torch.zeros(w.shape, device=w.device, dtype=f32) if mask[1] else None,
                     torch.zeros(w.shape[0], device=w.device, dtype=f32)
                     if mask[2] and b is not None else None,
                     fp32_dh)

    def finish(self, t: Tensors, out: Grads, scale: Optional[torch.Tensor]):
        """(dh, dw, db) in their inputs' dtypes (dh float32 when ``out.fp32_dh``); ``scale`` is applied here
        when the provider left it out of ``grads`` (``grads_scaled`` False)."""
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


def device_name(device: torch.device) -> str:
    """The device's model name where its torch module tells it (CUDA, NPU), else the device string."""
    mod = getattr(torch, device.type, None)
    try:
        return f"{device} {mod.get_device_name(device)}" if device.type != "cpu" else "cpu"
    except Exception:  # noqa: BLE001 - a device module without the query, or a driver error
        return str(device)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (timings; an asynchronous kernel fault surfaces here); nothing on
    CPU."""
    mod = getattr(torch, device.type, None)
    if device.type != "cpu" and hasattr(mod, "synchronize"):
        mod.synchronize(device)


def file_digest(paths) -> str:
    """A short digest of the files' bytes (compiled kernels: a rebuilt library is another build); '' for
    none."""
    import hashlib

    h = hashlib.sha256()
    for path in paths:
        try:
            with open(path, "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(f"missing:{path}".encode())
    return h.hexdigest()[:16] if paths else ""


class WholeRowsProvider(Provider):
    """A provider whose kernels tile the tokens themselves and allocate their own outputs: one driver block
    covers every row (the default ``token_block``; every rank of a group holds the same tokens, so every rank
    agrees), ``grads`` stores what the kernel returned (``store``), ``finish`` casts to the inputs' dtypes."""

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
                return torch.zeros(like.shape, device=like.device,
                                   dtype=torch.float32 if keep32 else like.dtype)
            return x if keep32 or x.dtype == like.dtype else x.to(like.dtype)

        m = out.extra
        return (cast(out.dh, t.hidden, m[0], out.fp32_dh), cast(out.dw, t.weight, m[1]),
                cast(out.db, t.bias, m[2]))
