"""TRL's fused LM head, served by fused_lce (used by :mod:`fused_lce.integrations.hf`; imports nothing of it).

TRL >= 1.15 (``trl.trainer.utils.add_fused_lm_head``, used by SFTTrainer, DPO, KTO, GRPO, RLOO and on their
reference models) replaces a model's ``forward`` with one that, called with ``fused_lm_head=True``, runs the
backbone and TRL's own chunked log-prob kernel on ``lm_head.weight`` and returns a ``FusedCausalLMOutput`` of
per-token fields: ``log_probs``, and those it was asked for among ``entropy``, ``mean_logits``, ``is_top1``,
``log_sum_sq_probs``.

On a patched model the hooks of :func:`fused_lce.patch` see such a call before TRL's forward runs. If
fused_lce can serve it exactly (:func:`unsupported` is None) they drop ``fused_lm_head``, TRL's forward falls
through to the stock forward, and the armed output layer computes every field in one
:func:`fused_lce.linear_logprobs` call (:func:`compute`). What TRL asked for (temperature, outputs, fp32 head,
softcap, logit scale) is read, never changed, from the closure of the forward TRL installed.
"""
from __future__ import annotations

import inspect
import sys
import types
from typing import NamedTuple, Optional, Union

import torch

from ..api import linear_logprobs

# TRL's field -> fused_lce.linear_logprobs' extra output (non-differentiable metrics)
_EXTRAS = {"mean_logits": "mean_logit", "is_top1": "is_top1", "log_sum_sq_probs": "log_sum_sq_probs"}
SERVED_OUTPUTS = ("log_probs", "entropy") + tuple(_EXTRAS)
# the closure variables of TRL's fused forward that say what it computes
_SETTINGS = ("temperature", "outputs", "cast_lm_head_to_fp32", "final_logit_softcapping", "logit_scale")


class Head(NamedTuple):
    """What the TRL fused LM head installed on a model was asked for."""

    temperature: float
    outputs: tuple
    cast_fp32: bool
    softcap: Optional[float]
    logit_scale: float


def _fused_forward_code():
    """The code object of the forward that ``add_fused_lm_head`` installs, if TRL's trainer utils are
    loaded."""
    utils = sys.modules.get("trl.trainer.utils")
    add = getattr(utils, "add_fused_lm_head", None) if utils is not None else None
    for const in getattr(getattr(add, "__code__", None), "co_consts", ()):
        if isinstance(const, types.CodeType) and const.co_name == "_fused_forward":
            return const
    return None


def installed_head(model) -> Union[Head, str, None]:
    """The settings of TRL's fused LM head on ``model``; None if it has none; a str (the reason) if one seems
    to be installed but its settings cannot be read (an unknown TRL version)."""
    code = _fused_forward_code()
    forward = model.__dict__.get("forward")
    if code is None or forward is None:
        return None
    f = forward
    for _ in range(8):  # through accelerate's autocast / fp32-output wrappers, which set __wrapped__
        fn = getattr(f, "__func__", f)
        if getattr(fn, "__code__", None) is code:
            return _read(fn)
        f = getattr(fn, "__wrapped__", None)
        if f is None:
            return None
    return None


def _read(fn):
    import trl

    try:
        found = inspect.getclosurevars(fn).nonlocals
    except (TypeError, ValueError):
        found = {}
    missing = [k for k in _SETTINGS if k not in found]
    if missing:
        return f"cannot read the settings of trl {trl.__version__}'s fused LM head (missing {missing})"
    scale = found["logit_scale"]
    return Head(float(found["temperature"]), tuple(found["outputs"]), bool(found["cast_lm_head_to_fp32"]),
                found["final_logit_softcapping"], 1.0 if scale is None else float(scale))


def unsupported(head: Union[Head, str]) -> Optional[str]:
    """None if fused_lce serves this head's calls exactly, else the reason (then TRL's own head runs)."""
    if isinstance(head, str):
        return head
    extra = [k for k in head.outputs if k not in SERVED_OUTPUTS]
    if extra:
        return f"TRL asks for {extra}, which fused_lce does not compute"
    if head.cast_fp32:
        return "cast_lm_head_to_fp32=True"
    if head.logit_scale != 1.0:
        return f"the model scales its logits by {head.logit_scale} (config logit_scale or similar)"
    return None


def compute(head: Head, hidden, weight, bias, labels, *, log_entropy: bool, options: dict):
    """The armed output layer's work for a served call: ``(carrier, fields)``. ``carrier`` holds the
    differentiable per-token outputs as one tensor (log-prob, then entropy, on the last dimension) -- the
    layer returns it, so module hooks that replace a layer's output (ZeRO-3) see all of them; ``fields`` holds
    the label mask and the metrics (no gradient)."""
    want_entropy = "entropy" in head.outputs and log_entropy
    extras = tuple(_EXTRAS[k] for k in head.outputs if k in _EXTRAS)
    out = linear_logprobs(hidden, weight, labels, bias, temperature=head.temperature, softcap=head.softcap,
                          return_entropy=want_entropy, extra_outputs=extras, ignore_index=-100, **options)
    if not extras:  # linear_logprobs returns the log-probs, or (log-probs, entropy), then
        logprobs, entropy = out if want_entropy else (out, None)
        metrics = {}
    else:
        logprobs, entropy = out.logprobs, out.entropy
        metrics = {k: getattr(out, v) for k, v in _EXTRAS.items() if k in head.outputs}
    carrier = torch.stack([logprobs, entropy], -1) if want_entropy else logprobs.unsqueeze(-1)
    fields = {"label_mask": labels != -100,
              "entropy_nan": "entropy" in head.outputs and not want_entropy, **metrics}
    return carrier, fields


def _per_token(carrier, fields, shifted):
    """TRL's per-token fields from the carrier (as the stock forward passed it on) and the metrics; without
    ``shift_labels`` TRL scores positions 0..T-2 against labels 1..T-1, so the last position is dropped."""
    # contiguous, as TRL's own fields are: a sum over a strided view may round differently (DPO's rewards
    # compare the policy's and the reference's summed log-probs)
    cut = (lambda t: t.contiguous()) if shifted else (lambda t: t[..., :-1].contiguous())  # noqa: E731
    out = {"log_probs": cut(carrier[..., 0]), "label_mask": cut(fields["label_mask"]),
           "entropy": cut(carrier[..., 1]) if carrier.shape[-1] == 2 else None}
    if fields["entropy_nan"]:  # log_entropy=False: not computed
        out["entropy"] = torch.full((), float("nan"), device=carrier.device)
    out.update({k: cut(fields[k]) for k in _EXTRAS if fields.get(k) is not None})
    return out


def loss(carrier, fields, num_items, shifted):
    """TRL's loss (before the router aux loss): ``-sum(log_probs) / (num_items_in_batch or the label
    count)``."""
    f = _per_token(carrier, fields, shifted)
    denominator = num_items if num_items is not None else f["label_mask"].sum().clamp(min=1)
    return -f["log_probs"].sum() / denominator


def output(model, out, carrier, fields, num_items, shifted):
    """TRL's ``FusedCausalLMOutput`` from the stock forward's output ``out`` and the carrier. With ``labels``
    the stock forward's loss is TRL's (the relay computed it from the carrier; MoE forwards added the router
    aux loss); with ``shift_labels`` alone it returns no loss, and it is made here, the aux loss added as TRL
    does."""
    from trl.trainer.utils import FusedCausalLMOutput

    aux, total = out.get("aux_loss"), out.get("loss")
    if total is None:
        total = loss(carrier, fields, num_items, shifted)
        if aux is not None:
            total = total + getattr(model.config.get_text_config(), "router_aux_loss_coef", 0.0) * aux
    return FusedCausalLMOutput(loss=total, aux_loss=aux, **_per_token(carrier, fields, shifted))
