"""The public patch API: ``patch``, ``unpatch``, ``is_patched``, ``patch_if_enabled`` and the class-level
``patch_<family>`` / ``unpatch_<family>`` functions, one pair per row of :data:`families.FAMILIES`."""
from __future__ import annotations

from . import families, runtime, trainer as trainer_hooks
from .options import check_options, env_enabled, env_options
from .runtime import PatchStatus


def patch(model, **loss_options):
    """Patch an instantiated Qwen model (or a ``PeftModel`` around one, or a ``transformers.Trainer``) in
    place; returns its argument.

    ``loss_options``: ``skip_logits`` (None: fuse when training with labels; True/False: always/never fuse),
    ``log_entropy`` (TRL's fused-head calls: True (default) computes the per-token entropy TRL logs; False
    skips it, and the entropy reads NaN), and any of ``ignore_index``, ``label_smoothing``, ``z_loss``,
    ``softcap``, ``backend``, ``validate``, ``tile_budget_mb`` (passed to
    :func:`fused_lce.linear_cross_entropy`; anything but the defaults makes the loss differ from the stock one
    on purpose). Patching a patched model replaces its options. A ``Trainer`` built from a patched model
    afterwards patches its reference model too, with the same options, when training starts (TRL builds that
    model anew, unpatched); patching the model after building such a trainer leaves the reference model alone:
    use ``patch(trainer)`` then.

    A ``Trainer``: patches ``trainer.model`` and its reference model if it has one (TRL's DPO, KTO, GRPO,
    RLOO; also when it is created or wrapped later, at the start of training); if the trainer has a label
    smoother (``label_smoothing_factor``) and computes its loss the stock way, the smoothing moves into the
    fused loss (same value, no logits) and the trainer's smoother is switched off; otherwise it warns that the
    smoother computes the loss from full logits. Raises ValueError for a model class not in ``SUPPORTED``."""
    trainer = trainer_hooks.as_trainer(model)
    if trainer is not None:
        return trainer_hooks.patch_trainer(trainer, loss_options)
    runtime.patch_model(model, check_options(loss_options))
    trainer_hooks.follow_reference_models()  # a TRL trainer built from it later builds an unpatched reference
    return model


def unpatch(model):
    """Undo :func:`patch` on ``model`` (or a Trainer); no-op if it is not patched; returns its argument."""
    trainer = trainer_hooks.as_trainer(model)
    if trainer is not None:
        return trainer_hooks.unpatch_trainer(trainer)
    return runtime.unpatch_model(model)


def is_patched(model) -> PatchStatus:
    """Whether the next training step of ``model`` (training mode, labels given) computes its loss with
    fused_lce, as a :class:`PatchStatus` (truthy/falsy) whose ``.reason`` says why or why not. Covers: not
    patched, options (``skip_logits=False``), the output layer (missing, not an ``nn.Linear``, quantized, a
    PEFT adapter on it, its forward replaced before ``patch``), a user-set ``loss_function``, and TRL's fused
    LM head (served or not). ``model`` may also be a ``PeftModel`` or a ``transformers.Trainer`` (its
    model)."""
    trainer = trainer_hooks.as_trainer(model)
    return runtime.status(trainer.model if trainer is not None else model)


def patch_if_enabled(model, **loss_options):
    """:func:`patch` ``model`` (or a Trainer) if the environment variable ``FUSED_LINEAR_CE`` is
    ``1``/``true``/``yes``/``on``; leave it alone if unset or ``0``/``false``/``no``/``off`` (the default is
    off). Returns its argument."""
    if env_enabled():
        patch(model, **{**env_options(), **loss_options})
    return model


def _family_functions(family):
    names = " and ".join(f"``{n}``" for n in families.FAMILIES[family][1])

    def patch_family(**loss_options):
        return runtime.patch_family(family, loss_options)

    def unpatch_family():
        return runtime.unpatch_family(family)

    patch_family.__name__ = patch_family.__qualname__ = f"patch_{family}"
    patch_family.__doc__ = (f"Class-level patch of {names}: affects every instance, existing or loaded later "
                            "(``loss_options`` as for :func:`patch`). Returns the patched classes.")
    unpatch_family.__name__ = unpatch_family.__qualname__ = f"unpatch_{family}"
    unpatch_family.__doc__ = f"Undo :func:`patch_{family}`; returns the restored classes."
    return patch_family, unpatch_family


FAMILY_FUNCTIONS = {}
for _family in families.FAMILIES:
    FAMILY_FUNCTIONS[f"patch_{_family}"], FAMILY_FUNCTIONS[f"unpatch_{_family}"] = _family_functions(_family)
globals().update(FAMILY_FUNCTIONS)
