"""Trainer hooks: ``patch(trainer)`` (its model, its reference model, its label smoothing), ``autopatch``
(every ``transformers.Trainer`` built from now on, for ``FUSED_LINEAR_CE=1`` without editing the script) and
``follow_reference_models`` (a trainer given a patched model patches its reference model too)."""
from __future__ import annotations

import functools
import sys
import warnings
import weakref

import torch

from . import runtime
from .options import ENV, check_options, env_enabled, env_options


def as_trainer(obj):
    """``obj`` if it is a ``transformers.Trainer`` (transformers already imported), else None."""
    transformers = sys.modules.get("transformers")
    trainer_cls = getattr(transformers, "Trainer", None) if transformers is not None else None
    return obj if trainer_cls is not None and isinstance(obj, trainer_cls) else None


def patch_trainer(trainer, loss_options: dict):
    """Patch ``trainer.model`` and, where the trainer has one (TRL's DPO, KTO, GRPO, RLOO), its reference
    model; route a label smoother into the fused loss when the trainer computes its loss the stock way."""
    loss_options = _route_label_smoothing(trainer, loss_options)
    runtime.patch_model(trainer.model, check_options(loss_options))
    _follow_reference_model(trainer)
    _feed_token_accuracy(trainer)
    return trainer


def follow_reference_models():
    """Make every ``transformers.Trainer`` built from now on whose model is already patched (``patch(model)``
    before building the trainer) patch its reference model as well: TRL's DPO, KTO, GRPO and RLOO build
    theirs as a new, unpatched model (or take the user's). Called by ``patch(model)``; idempotent."""
    import transformers

    cls = transformers.Trainer
    if getattr(cls.__init__, "_fused_lce_follows", False):
        return
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if _policy_patched(self):
            _follow_reference_model(self)

    __init__._fused_lce_follows = True
    cls.__init__ = __init__


def _policy_patched(trainer):
    model = getattr(trainer, "model", None)
    if not isinstance(model, torch.nn.Module):
        return False
    return runtime.options_of(runtime.resolve(model, check=False)) is not None


def _follow_reference_model(trainer):
    """Patch the trainer's reference model now if it has one, and again when training starts: TRL's trainers
    set ``ref_model`` after ``Trainer.__init__`` (where the hooks run) and may wrap it later (DeepSpeed)."""
    _patch_reference_model(trainer)
    if "_fused_lce_callback" not in trainer.__dict__:
        trainer.__dict__["_fused_lce_callback"] = _reference_model_callback(trainer)
        trainer.add_callback(trainer.__dict__["_fused_lce_callback"])


def unpatch_trainer(trainer):
    smoother = trainer.__dict__.pop("_fused_lce_label_smoother", None)
    if smoother is not None:
        trainer.label_smoother = smoother
    callback = trainer.__dict__.pop("_fused_lce_callback", None)
    if callback is not None:
        trainer.remove_callback(callback)
    if getattr(trainer.__dict__.get("compute_loss"), "_fused_lce_feeds_accuracy", False):
        del trainer.__dict__["compute_loss"]
    runtime.unpatch_model(trainer.model)
    ref = _reference_model(trainer)
    if ref is not None:
        runtime.unpatch_model(ref)
    return trainer


def _reference_model(trainer):
    """The trainer's separate reference model (unwrapped from a DeepSpeed engine), or None."""
    ref = getattr(trainer, "ref_model", None)
    ref = getattr(ref, "module", ref)  # DeepSpeedEngine / DDP keep the model as .module
    return ref


def _patch_reference_model(trainer):
    """A reference model gets the policy's options; one fused_lce cannot patch is left as it is, with a
    warning."""
    ref = _reference_model(trainer)
    if ref is None or runtime.options_of(ref) is not None:
        return
    try:
        runtime.patch_model(ref, runtime.options_of(runtime.resolve(trainer.model, check=False)))
    except (TypeError, ValueError) as e:
        warnings.warn(f"fused_lce: the reference model was not patched ({e}); its log-probabilities are "
                      "computed without fused_lce", stacklevel=3)
        return
    if getattr(getattr(trainer, "args", None), "precompute_ref_log_probs", False):
        warnings.warn("fused_lce: precompute_ref_log_probs=True: the reference log-probabilities were "
                      "computed when the trainer was built, before fused_lce patched the reference model, "
                      "so TRL's own head computed them; to fuse them, fused_lce.patch(ref_model) before "
                      "building the trainer", stacklevel=3)


def _reference_model_callback(trainer):
    """A ``TrainerCallback`` that patches ``trainer``'s reference model when training starts."""
    from transformers import TrainerCallback

    owner = weakref.ref(trainer)

    class PatchReferenceModel(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            trainer = owner()
            if trainer is not None and _policy_patched(trainer):
                _patch_reference_model(trainer)

    return PatchReferenceModel()


def _feed_token_accuracy(trainer):
    """ms-swift's trainers (``SwiftMixin``) log ``token_acc`` from ``outputs.logits`` (``_compute_acc``),
    which the fused path does not return: their ``compute_loss`` is wrapped so that the metric gets the fused
    calls' token counts instead (the same value: the fraction of valid tokens whose first argmax is the
    label)."""
    if not callable(getattr(trainer, "_compute_acc", None)) or "compute_loss" in trainer.__dict__:
        return
    original = trainer.compute_loss

    @functools.wraps(original)
    def compute_loss(*args, **kwargs):
        with runtime.recording_token_accuracy() as records:
            result = original(*args, **kwargs)
        if records:
            _log_token_accuracy(trainer, records)
        return result

    compute_loss._fused_lce_feeds_accuracy = True
    trainer.compute_loss = compute_loss


def _log_token_accuracy(trainer, records):
    strategy = getattr(trainer.args, "acc_strategy", "token")
    if strategy != "token":
        runtime.warn_once(trainer, "acc_strategy", f"acc_strategy={strategy!r}: its per-sequence accuracy "
                          "needs the logits, which the fused path does not compute; it is not logged")
        return
    correct = int(sum(c for c, _ in records))
    valid = int(sum(n for _, n in records))
    mode = "train" if trainer.model.training else "eval"
    # MeanMetric.update averages over the elements it is given: one per valid token, `correct` of them true
    trainer.custom_metrics[mode]["token_acc"].update(torch.arange(valid) < correct)


def _route_label_smoothing(trainer, loss_options):
    """Trainer's ``LabelSmoother`` computes the loss from full logits; when the trainer computes its loss the
    stock way, the smoothing moves into the fused loss (same value) and the smoother is switched off. Returns
    the options to patch with."""
    import transformers

    smoother = getattr(trainer, "label_smoother", None)
    if smoother is None:
        return loss_options
    text = trainer.model.config.get_text_config() if hasattr(trainer.model, "config") else None
    why = None
    if trainer.compute_loss_func is not None:
        why = "compute_loss_func is set"
    elif type(trainer).compute_loss is not transformers.Trainer.compute_loss:
        why = f"{type(trainer).__name__} overrides compute_loss"
    elif getattr(text, "output_router_logits", False):
        why = "the model adds a router aux loss only when it gets the labels, which the smoother does not"
    elif loss_options.get("label_smoothing", smoother.epsilon) != smoother.epsilon:
        raise ValueError(f"label_smoothing: {loss_options['label_smoothing']} conflicts with the trainer's "
                         f"label_smoothing_factor {smoother.epsilon}")
    if why is not None:
        warnings.warn(f"fused_lce: label_smoothing_factor={smoother.epsilon}: Trainer's LabelSmoother "
                      f"computes the training loss from the full logits ({why}), so fused_lce "
                      "does not run for it", stacklevel=4)
        return loss_options
    trainer.__dict__["_fused_lce_label_smoother"] = smoother
    trainer.label_smoother = None  # Trainer now passes the labels to the model: the fused loss smooths
    return {**loss_options, "label_smoothing": smoother.epsilon, "ignore_index": smoother.ignore_index}


def autopatch() -> bool:
    """If ``FUSED_LINEAR_CE`` is on: make every ``transformers.Trainer`` (and subclass: TRL's trainers,
    ms-swift's) created from now on call ``fused_lce.patch(trainer, **env_options())`` at the end of its
    ``__init__``; a model that cannot be patched trains unpatched, with a warning. Idempotent. Returns whether
    it is active.

    ``pip install`` puts a start-up hook in site-packages (``fused_lce-autopatch.pth``) that calls this as
    soon as ``transformers.trainer`` is imported in a process where ``FUSED_LINEAR_CE`` is on, so the variable
    alone enables fused_lce (see docs/hf.md)."""
    if not env_enabled():
        return False
    check_options(env_options())  # a malformed FUSED_LINEAR_CE_OPTIONS fails here, loudly
    import transformers

    cls = transformers.Trainer
    if getattr(cls.__init__, "_fused_lce_autopatch", False):
        return True
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            patch_trainer(self, env_options())
        except (TypeError, ValueError) as e:
            warnings.warn(f"fused_lce: {ENV}=1 but the model was not patched ({e}); training runs without "
                          "fused_lce", stacklevel=2)

    __init__._fused_lce_autopatch = True
    cls.__init__ = __init__
    return True
