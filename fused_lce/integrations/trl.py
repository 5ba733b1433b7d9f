"""TRL support for :mod:`fused_lce.integrations.hf`: serve the calls of TRL's fused LM head with fused_lce.

TRL >= 1.15 (``trl.trainer.utils.add_fused_lm_head``, used by SFTTrainer, DPO, KTO, GRPO, RLOO) replaces a model's
``forward`` with one that, called with ``fused_lm_head=True``, runs the backbone and TRL's own chunked log-prob
kernel (``trl.kernels.ChunkedLogProbFunction``: pure PyTorch off CUDA) on ``lm_head.weight``, and returns a
``FusedCausalLMOutput`` of per-token fields. SFTTrainer computes its loss from ``log_probs`` and logs
``mean_token_accuracy`` from ``is_top1`` and ``entropy`` from ``entropy``.

On a patched model the hooks of :func:`fused_lce.patch` see such a call before TRL's forward runs (whichever was
installed first). If what TRL asked for can be served exactly, the hooks drop ``fused_lm_head``, so TRL's forward
falls through to the stock forward, whose armed output layer computes the fields with fused_lce; otherwise TRL's
head runs and the hooks warn once, saying why. What TRL asked for (temperature, outputs, fp32 head, softcap, logit
scale) is read, never changed, from the closure of the forward TRL installed.

Served: ``log_probs`` (exact, with gradients, via ``reduction="none"``), ``label_mask``, ``is_top1`` as a 0-dim
count of top-1 hits (fused_lce's public API gives the token accuracy, not per-token flags; SFTTrainer only sums it),
``entropy`` per token via ``fused_lce.linear_logprobs`` when this fused_lce has it (with ``log_entropy=False``: a
0-dim NaN), and ``loss``/``aux_loss`` as TRL defines them. Not served (TRL's head runs): ``log_sum_sq_probs``,
``mean_logits`` (DPO, KTO), ``cast_lm_head_to_fp32=True``, a softcap together with a temperature or logit scale.
"""
from __future__ import annotations

import inspect
import sys
import types
from typing import NamedTuple, Optional, Union

import torch

SERVED_OUTPUTS = ("log_probs", "entropy", "is_top1")
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
    """The code object of the forward that ``add_fused_lm_head`` installs, if TRL's trainer utils are loaded."""
    utils = sys.modules.get("trl.trainer.utils")
    add = getattr(utils, "add_fused_lm_head", None) if utils is not None else None
    for const in getattr(getattr(add, "__code__", None), "co_consts", ()):
        if isinstance(const, types.CodeType) and const.co_name == "_fused_forward":
            return const
    return None


def installed_head(model) -> Union[Head, str, None]:
    """The settings of TRL's fused LM head on ``model``; None if it has none; a str (the reason) if one seems to be
    installed but its settings cannot be read (an unknown TRL version)."""
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


def unsupported(head: Head, log_entropy: bool, have_logprobs: bool) -> Optional[str]:
    """None if fused_lce serves this head's calls exactly, else the reason."""
    extra = [k for k in head.outputs if k not in SERVED_OUTPUTS]
    if extra:
        return f"TRL asks for {extra}, which fused_lce does not compute"
    if head.cast_fp32:
        return "cast_lm_head_to_fp32=True"
    if head.softcap is not None and (head.temperature != 1.0 or head.logit_scale != 1.0):
        return "a logit softcap combined with a temperature or logit scale"
    if "entropy" in head.outputs and log_entropy and not have_logprobs:
        return ("TRL logs the per-token entropy, which needs fused_lce.linear_logprobs (not in this fused_lce); "
                "fused_lce.patch(model, log_entropy=False) serves these calls with fused_lce and logs the "
                "entropy as NaN")
    return None


def output(model, out, loss, fields):
    """TRL's ``FusedCausalLMOutput`` from the stock forward's output, the loss the armed head computed and the
    fields it filled in. The stock forward adds the router aux loss only when it gets ``labels``; with
    ``shift_labels`` alone it returns no loss, and the aux loss is added here, as TRL does."""
    from trl.trainer.utils import FusedCausalLMOutput

    aux = out.get("aux_loss")
    if out.get("loss") is not None:
        loss = out["loss"]
    elif aux is not None:
        loss = loss + getattr(model.config.get_text_config(), "router_aux_loss_coef", 0.0) * aux
    return FusedCausalLMOutput(loss=loss, log_probs=fields["log_probs"], entropy=fields["entropy"],
                               is_top1=fields["is_top1"], label_mask=fields["label_mask"], aux_loss=aux)


def compute(leaf, frame, hidden, labels):
    """The armed output layer's work for a served TRL call: TRL's per-token fields into ``frame.trl_fields``;
    returns the loss of TRL's ``FusedCausalLMOutput`` before the router aux loss. Calls the op through
    :mod:`fused_lce.integrations.hf` (one place to count its calls)."""
    from . import hf

    linear_cross_entropy = hf.linear_cross_entropy
    spec, fields, opts = frame.trl, frame.trl_fields, frame.loss_options
    weight, bias = leaf.weight, leaf.bias
    softcap = spec.softcap
    # TRL: z -> softcap(z * logit_scale) / temperature; without a softcap both scales fold into the hidden states
    scale = spec.logit_scale if softcap is not None else spec.logit_scale / spec.temperature
    if scale != 1.0:
        hidden = hidden * scale
        bias = bias * scale if bias is not None else None
    valid = labels != -100
    want_entropy = "entropy" in spec.outputs and fields["log_entropy"]
    entropy = top1 = None
    if want_entropy:
        logprobs, entropy = hf._linear_logprobs()(hidden, weight, labels, bias, temperature=1.0, softcap=softcap,
                                                  return_entropy=True, ignore_index=-100,
                                                  backend=opts.get("backend", "auto"),
                                                  validate=opts.get("validate", True))
        nll = torch.where(valid, -logprobs, 0.0)
        entropy = torch.where(valid, entropy, 0.0)
        if "is_top1" in spec.outputs:
            with torch.no_grad():
                stats = linear_cross_entropy(hidden, weight, labels, bias, softcap=softcap, reduction="sum",
                                             return_stats=True, **opts)
            top1 = torch.round(stats.token_accuracy * stats.n_valid).to(torch.long)
    else:
        out = linear_cross_entropy(hidden, weight, labels, bias, softcap=softcap, reduction="none",
                                   return_stats="is_top1" in spec.outputs, **opts)
        nll = out.loss if "is_top1" in spec.outputs else out
        if "is_top1" in spec.outputs:
            top1 = torch.round(out.token_accuracy * out.n_valid).to(torch.long)
        if "entropy" in spec.outputs:
            entropy = torch.full((), float("nan"), device=hidden.device)  # log_entropy=False: not computed
    if not frame.trl_shifted:  # TRL scores positions 0..T-2 against labels 1..T-1
        nll, valid = nll[..., :-1], valid[..., :-1]
        if entropy is not None and entropy.dim() > 0:
            entropy = entropy[..., :-1]
    denominator = frame.num_items if frame.num_items is not None else valid.sum().clamp(min=1)
    fields.update(log_probs=-nll, entropy=entropy, is_top1=top1, label_mask=valid)
    return nll.sum() / denominator
