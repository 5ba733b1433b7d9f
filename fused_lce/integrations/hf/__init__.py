"""Hugging Face transformers integration: route the causal-LM loss of Qwen models through
:func:`fused_lce.linear_cross_entropy`, so training never materialises the ``[tokens x vocab]`` logits.

Usage::

    model = AutoModelForCausalLM.from_pretrained(...)
    fused_lce.patch(model)                 # or fused_lce.patch_if_enabled(model): only when FUSED_LINEAR_CE=1
                                           # (a Trainer built from it patches its reference model too)
    model = get_peft_model(model, lora)    # patching before or after PEFT both work; so does
                                           # patch(peft_model)
    fused_lce.patch(trainer)               # a transformers.Trainer: its model, reference model, label
                                           # smoothing
    fused_lce.is_patched(model)            # truthy iff the next training step runs fused_lce; .reason
                                           # says why
    fused_lce.unpatch(model)               # back to the stock behaviour
    fused_lce.patch_qwen3()                # class level: every Qwen3ForCausalLM, including ones loaded later

    FUSED_LINEAR_CE=1 python train.py      # no edit at all: every Trainer patches its model
                                           # (see trainer.autopatch)

Modules: :mod:`.api` (these functions), :mod:`.families` (the supported classes, as a table), :mod:`.runtime`
(how a patched call runs), :mod:`.trainer` (Trainer hooks and the environment switch), :mod:`.options`.

When the fused path runs (override per call with the ``skip_logits=True/False`` forward kwarg or
``patch(model, skip_logits=...)``): ``labels`` are shifted with ``ignore_index`` padding like
``ForCausalLMLoss`` (``shift_labels`` wins); ``num_items_in_batch`` divides the summed loss, else the mean
over valid tokens; ``logits_to_keep`` slices the hidden states first. Eval, generation and calls without
labels run the stock forward and return real logits. A batch whose labels are all ``ignore_index`` gives loss
0 (stock: NaN).

The patch never silently changes behaviour: where it cannot run the fused path it runs the stock one and warns
once per model, saying why (an adapter on the output layer, a user-set ``loss_function``, an output-layer
forward replaced before ``patch``, a training-mode call without labels); ``is_patched`` gives the same reason.

TRL (>= 1.15) trainers call ``model(..., fused_lm_head=True)``; on a patched model fused_lce serves those
calls (:mod:`fused_lce.integrations.trl`).
"""
from .api import FAMILY_FUNCTIONS, is_patched, patch, patch_if_enabled, unpatch
from .families import SUPPORTED, supported_classes
from .options import env_enabled, env_options
from .runtime import PatchStatus
from .trainer import autopatch

globals().update(FAMILY_FUNCTIONS)

__all__ = ["patch", "unpatch", "is_patched", "patch_if_enabled", "autopatch", "env_enabled", "env_options",
           "PatchStatus", "SUPPORTED", "supported_classes", *FAMILY_FUNCTIONS]
