"""Hugging Face transformers integration: route the causal-LM loss of Qwen models through
:func:`fused_lce.linear_cross_entropy`, so training never materialises the ``[tokens x vocab]`` logits.

Usage::

    model = AutoModelForCausalLM.from_pretrained(...)
    fused_lce.patch(model)                 # or fused_lce.patch_if_enabled(model): only when FUSED_LINEAR_CE=1
    model = get_peft_model(model, lora)    # patching before or after PEFT both work; so does patch(peft_model)
    fused_lce.patch(trainer)               # a transformers.Trainer: its model, and its label smoothing
    fused_lce.is_patched(model)            # truthy iff the next training step runs fused_lce; .reason says why
    fused_lce.unpatch(model)               # back to the stock behaviour

    fused_lce.patch_qwen3()                # class level: every Qwen3ForCausalLM, including ones loaded later

How it works (nothing of transformers' forwards is copied, so it follows their changes between releases):
``patch`` registers a forward pre-hook and an (always-called) forward hook on the model and gives its output layer
(``lm_head``) a forward that stays inert unless armed. The pre-hook decides per call whether the fused path runs
(default: ``model.training`` and ``labels`` given), and if so pushes a *frame* (labels, options) onto a
context-local stack (a ``contextvars.ContextVar``, so concurrent threads and nested calls do not see each other's
frames). The model's own forward then runs unchanged; when it calls ``self.lm_head(hidden_states)``, the armed
layer computes the fused loss from the hidden states it receives and its own ``weight``/``bias`` (tied or untied)
and returns that loss in place of the logits. Because this happens inside the module's ``__call__``, FSDP2 /
DeepSpeed ZeRO-3 hooks gather the weight around it, and accelerate hooks added after ``patch`` still run.
The stock forward hands that tensor to ``self.loss_function``, which the patch sets to a relay that returns the
frame's loss (MoE forwards then add their router aux loss exactly as they always do). The forward hook pops the
frame and returns the model's usual output class with ``logits=None`` (``return_dict=False``: the usual tuple, with
``None`` where the logits were).

When the fused path runs (override per call with the ``skip_logits=True/False`` forward kwarg or
``patch(model, skip_logits=...)``):
  * ``labels`` are shifted with ``ignore_index`` padding like ``ForCausalLMLoss``; ``shift_labels`` wins over it;
  * ``num_items_in_batch`` divides the summed loss (gradient accumulation), else the mean over valid tokens;
  * ``logits_to_keep`` slices the hidden states first, as in the stock forward (labels must then describe the
    kept positions, as the stock loss requires too).
Eval, generation and calls without labels run the stock forward and return real logits (with loss options that
change the objective, e.g. ``label_smoothing``, an eval call with labels also returns fused_lce's loss, so train and
eval losses are the same objective). Two deliberate differences from stock: a batch whose labels are all
``ignore_index`` gives loss 0 (stock: NaN), and so does ``num_items_in_batch == 0``.

The patch never silently changes behaviour: where it cannot run the fused path it runs the stock one and warns once
per model, saying why: an adapter on the output layer (LoRA on ``lm_head``; ``modules_to_save=["lm_head"]`` is
fused), a user-set ``model.loss_function`` (respected; only transformers' own ``ForCausalLMLoss`` counts as
equivalent), an output-layer forward replaced by someone else before ``patch`` (e.g. accelerate's device-map hooks),
a training-mode call without labels (the loss is then computed outside the model, e.g. by Trainer's label smoother).

TRL (>= 1.15): ``SFTTrainer`` installs its own fused LM head (``trl.trainer.utils.add_fused_lm_head``) and calls
``model(..., fused_lm_head=True)``. On a patched model those calls are served by fused_lce instead (the hooks see
them whether ``patch`` came before or after the trainer); see :mod:`fused_lce.integrations.trl` for what is served.
"""
from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import os
import sys
import warnings
import weakref

import torch

from ..core import registry
from ..api import linear_cross_entropy
from . import trl as trl_support

# family -> (transformers.models submodule, causal-LM classes). Qwen2.5 text models are Qwen2ForCausalLM.
_FAMILIES = {
    "qwen2": ("qwen2", ("Qwen2ForCausalLM",)),
    "qwen2_moe": ("qwen2_moe", ("Qwen2MoeForCausalLM",)),
    "qwen3": ("qwen3", ("Qwen3ForCausalLM",)),
    "qwen3_moe": ("qwen3_moe", ("Qwen3MoeForCausalLM",)),
    "qwen3_next": ("qwen3_next", ("Qwen3NextForCausalLM",)),
    "qwen3_5": ("qwen3_5", ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")),
    "qwen3_5_moe": ("qwen3_5_moe", ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")),
    "qwen2_vl": ("qwen2_vl", ("Qwen2VLForConditionalGeneration",)),
    "qwen2_5_vl": ("qwen2_5_vl", ("Qwen2_5_VLForConditionalGeneration",)),
    "qwen3_vl": ("qwen3_vl", ("Qwen3VLForConditionalGeneration",)),
    "qwen3_vl_moe": ("qwen3_vl_moe", ("Qwen3VLMoeForConditionalGeneration",)),
}
SUPPORTED = tuple(name for _, names in _FAMILIES.values() for name in names)

# fixed by the HF loss contract (mean over num_items_in_batch or valid tokens, causal shift) or set per call
_RESERVED = ("reduction", "shift", "num_items", "return_stats", "process_group", "sequence_parallel")
_LOSS_OPTIONS = ("ignore_index", "label_smoothing", "z_loss", "softcap", "backend", "validate", "tile_budget_mb")
_PATCH_OPTIONS = ("skip_logits", "log_entropy")
_OBJECTIVE_DEFAULTS = {"label_smoothing": 0.0, "z_loss": 0.0, "softcap": None}  # options that change the loss
_ENV = "FUSED_LINEAR_CE"
_ENV_OPTIONS = "FUSED_LINEAR_CE_OPTIONS"  # options for autopatch/patch_if_enabled: "log_entropy=false,z_loss=1e-4"

_CLASS_PATCHES: dict = {}  # class -> {"had_own": bool, "original": __call__, "options": dict}
_WARNED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> keys of the warnings it has given


class PatchStatus:
    """What :func:`is_patched` returns: truthy iff the next training step (training mode, labels given) computes
    its loss with fused_lce; ``reason`` says why or why not."""

    __slots__ = ("active", "reason")

    def __init__(self, active: bool, reason: str):
        self.active, self.reason = bool(active), reason

    def __bool__(self) -> bool:
        return self.active

    def __repr__(self) -> str:
        return f"PatchStatus({self.active}, {self.reason!r})"


# ------------------------------------------------------------------------------------------------ public
def patch(model, **loss_options):
    """Patch an instantiated Qwen model (or a ``PeftModel`` around one, or a ``transformers.Trainer``) in place;
    returns its argument.

    ``loss_options``: ``skip_logits`` (None: fuse when training with labels; True/False: always/never fuse),
    ``log_entropy`` (TRL's fused-head calls: True (default) computes the per-token entropy TRL logs, which needs
    ``fused_lce.linear_logprobs``, else TRL's own head runs; False serves them without it, entropy reads NaN), and
    any of ``ignore_index``, ``label_smoothing``, ``z_loss``, ``softcap``, ``backend``, ``validate``,
    ``tile_budget_mb`` (passed to :func:`fused_lce.linear_cross_entropy`; anything but the defaults makes the
    loss differ from the stock one on purpose). Patching a patched model replaces its options.

    A ``Trainer``: patches ``trainer.model``; if the trainer has a label smoother (``label_smoothing_factor``) and
    computes its loss the stock way, the smoothing moves into the fused loss (same value, no logits) and the
    trainer's smoother is switched off; otherwise it warns that the smoother computes the loss from full logits.
    Raises ValueError for a model class not in ``SUPPORTED``."""
    trainer = _as_trainer(model)
    if trainer is not None:
        return _patch_trainer(trainer, loss_options)
    options = _check_options(loss_options)
    target = _resolve(model)
    state = target.__dict__.get("_fused_lce_patch")
    if state is not None:
        state["options"] = options
        return model
    relay_previous = _install_relay(target)
    for leaf in _candidate_leaves(target):
        _install_leaf(leaf)
    handles = (target.register_forward_pre_hook(_pre_hook, with_kwargs=True),
               target.register_forward_hook(_post_hook, with_kwargs=True, always_call=True))
    # a second entry for calls of model.forward(...) that bypass the module hooks (PEFT <= 0.20's tuners do that)
    previous = target.__dict__.get("forward")  # someone's instance forward (TRL's fused head, accelerate's autocast)
    entry = functools.partial(_instance_forward, target, previous)
    entry.__signature__ = inspect.signature(target.forward)  # Trainer and generate read the forward's signature
    if previous is not None:
        entry.__wrapped__ = previous
    target.__dict__["forward"] = entry
    target.__dict__["_fused_lce_patch"] = {"options": options, "handles": handles, "relay_previous": relay_previous}
    return model


def unpatch(model):
    """Undo :func:`patch` on ``model`` (or a Trainer); no-op if it is not patched; returns its argument."""
    trainer = _as_trainer(model)
    if trainer is not None:
        smoother = trainer.__dict__.pop("_fused_lce_label_smoother", None)
        if smoother is not None:
            trainer.label_smoother = smoother
        unpatch(trainer.model)
        return model
    target = _resolve(model, check=False)
    state = target.__dict__.pop("_fused_lce_patch", None)
    if state is None:
        return model
    for handle in state["handles"]:
        handle.remove()
    entry = target.__dict__.get("forward")
    if isinstance(entry, functools.partial) and entry.func is _instance_forward:
        if entry.args[1] is None:
            del target.__dict__["forward"]
        else:
            target.__dict__["forward"] = entry.args[1]
    # else: a wrapper installed after patch (TRL, accelerate) holds our entry; left in place, it passes through
    if isinstance(target.__dict__.get("_loss_function"), _LossRelay):
        if state["relay_previous"] is None:
            del target.__dict__["_loss_function"]
        else:
            target.__dict__["_loss_function"] = state["relay_previous"]
    for leaf in _candidate_leaves(target):
        forward = leaf.__dict__.get("forward")
        if _is_leaf_forward(forward):
            del leaf.__dict__["forward"]
        # else: a wrapper (an accelerate hook added after patch) holds ours; left in place, it is inert
    return model


def is_patched(model) -> PatchStatus:
    """Whether the next training step of ``model`` (training mode, labels given) computes its loss with fused_lce,
    as a :class:`PatchStatus` (truthy/falsy) whose ``.reason`` says why or why not. Covers: not patched, options
    (``skip_logits=False``), the output layer (missing, not an ``nn.Linear``, quantized, a PEFT adapter on it, its
    forward replaced before ``patch``), a user-set ``loss_function``, and TRL's fused LM head (served or not).
    ``model`` may also be a ``PeftModel`` or a ``transformers.Trainer`` (its model)."""
    trainer = _as_trainer(model)
    target = _resolve(trainer.model if trainer is not None else model, check=False)
    options = _options_of(target)
    if options is None:
        return PatchStatus(False, "not patched: call fused_lce.patch(model)")
    if options.get("skip_logits") is False:
        return PatchStatus(False, "patched with skip_logits=False: the stock forward (full logits) always runs")
    why = _why_not(target, {})
    if why:
        return PatchStatus(False, why)
    head = trl_support.installed_head(target)
    if head is not None:
        why = _trl_why_not(head, options)
        if why:
            return PatchStatus(False, f"TRL's fused LM head is installed and computes the loss itself: {why}")
        return PatchStatus(True, "fused_lce computes the loss: TRL's fused-head calls (fused_lm_head=True) are "
                                 "served by fused_lce, as are plain calls with labels")
    return PatchStatus(True, "fused_lce computes the loss on the next training-mode call with labels")


def patch_if_enabled(model, **loss_options):
    """:func:`patch` ``model`` (or a Trainer) if the environment variable ``FUSED_LINEAR_CE`` is
    ``1``/``true``/``yes``/``on``; leave it alone if unset or ``0``/``false``/``no``/``off`` (the default is off).
    Returns its argument."""
    if env_enabled():
        patch(model, **{**env_options(), **loss_options})
    return model


def env_enabled() -> bool:
    """Value of the ``FUSED_LINEAR_CE`` switch (ValueError for a value that is neither on nor off)."""
    value = os.environ.get(_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"{_ENV}: expected 1/true/yes/on or 0/false/no/off, got {os.environ[_ENV]!r}")


def env_options() -> dict:
    """Patch options from the environment variable ``FUSED_LINEAR_CE_OPTIONS``: comma-separated ``key=value`` items
    (``true``/``false``, ``none``, ints and floats are converted), e.g. ``log_entropy=false,backend=npu``. Used by
    :func:`autopatch` and :func:`patch_if_enabled` (explicit keyword arguments win). Validated by ``patch``."""
    options = {}
    for item in (x.strip() for x in os.environ.get(_ENV_OPTIONS, "").split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{_ENV_OPTIONS}: expected comma-separated key=value items, got {item!r}")
        options[key.strip()] = _env_value(value.strip())
    return options


def _env_value(text):
    lower = text.lower()
    if lower in ("true", "yes", "on"):
        return True
    if lower in ("false", "no", "off"):
        return False
    if lower in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def autopatch() -> bool:
    """If ``FUSED_LINEAR_CE`` is on: make every ``transformers.Trainer`` (and subclass: TRL's SFTTrainer, ms-swift's
    trainers) created from now on call ``fused_lce.patch(trainer, **env_options())`` at the end of its
    ``__init__``; a model that cannot be patched trains unpatched, with a warning. Idempotent. Returns whether it
    is active.

    To enable it without editing a training script, put ``fused_lce/integrations/startup`` on ``PYTHONPATH``
    (its ``sitecustomize`` calls this when transformers' trainer module is imported; see docs/hf.md)."""
    if not env_enabled():
        return False
    _check_options(env_options())  # a malformed FUSED_LINEAR_CE_OPTIONS fails here, loudly
    import transformers

    cls = transformers.Trainer
    if getattr(cls.__init__, "_fused_lce_autopatch", False):
        return True
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            patch(self, **env_options())
        except (TypeError, ValueError) as e:
            warnings.warn(f"fused_lce: {_ENV}=1 but the model was not patched ({e}); training runs without "
                          "fused_lce", stacklevel=2)

    __init__._fused_lce_autopatch = True
    cls.__init__ = __init__
    return True


def patch_qwen2(**loss_options):
    """Class-level patch of ``Qwen2ForCausalLM`` (Qwen2, Qwen2.5): affects every instance, existing or loaded
    later. Returns the patched classes."""
    return _patch_family("qwen2", loss_options)


def patch_qwen2_moe(**loss_options):
    """Class-level patch of ``Qwen2MoeForCausalLM``."""
    return _patch_family("qwen2_moe", loss_options)


def patch_qwen3(**loss_options):
    """Class-level patch of ``Qwen3ForCausalLM``."""
    return _patch_family("qwen3", loss_options)


def patch_qwen3_moe(**loss_options):
    """Class-level patch of ``Qwen3MoeForCausalLM``."""
    return _patch_family("qwen3_moe", loss_options)


def patch_qwen3_next(**loss_options):
    """Class-level patch of ``Qwen3NextForCausalLM``."""
    return _patch_family("qwen3_next", loss_options)


def patch_qwen3_5(**loss_options):
    """Class-level patch of ``Qwen3_5ForCausalLM`` and ``Qwen3_5ForConditionalGeneration``."""
    return _patch_family("qwen3_5", loss_options)


def patch_qwen3_5_moe(**loss_options):
    """Class-level patch of ``Qwen3_5MoeForCausalLM`` and ``Qwen3_5MoeForConditionalGeneration``."""
    return _patch_family("qwen3_5_moe", loss_options)


def patch_qwen2_vl(**loss_options):
    """Class-level patch of ``Qwen2VLForConditionalGeneration`` (the text loss; image inputs pass through)."""
    return _patch_family("qwen2_vl", loss_options)


def patch_qwen2_5_vl(**loss_options):
    """Class-level patch of ``Qwen2_5_VLForConditionalGeneration``."""
    return _patch_family("qwen2_5_vl", loss_options)


def patch_qwen3_vl(**loss_options):
    """Class-level patch of ``Qwen3VLForConditionalGeneration``."""
    return _patch_family("qwen3_vl", loss_options)


def patch_qwen3_vl_moe(**loss_options):
    """Class-level patch of ``Qwen3VLMoeForConditionalGeneration``."""
    return _patch_family("qwen3_vl_moe", loss_options)


def unpatch_qwen2():
    """Undo :func:`patch_qwen2`; returns the restored classes."""
    return _unpatch_family("qwen2")


def unpatch_qwen2_moe():
    """Undo :func:`patch_qwen2_moe`; returns the restored classes."""
    return _unpatch_family("qwen2_moe")


def unpatch_qwen3():
    """Undo :func:`patch_qwen3`; returns the restored classes."""
    return _unpatch_family("qwen3")


def unpatch_qwen3_moe():
    """Undo :func:`patch_qwen3_moe`; returns the restored classes."""
    return _unpatch_family("qwen3_moe")


def unpatch_qwen3_next():
    """Undo :func:`patch_qwen3_next`; returns the restored classes."""
    return _unpatch_family("qwen3_next")


def unpatch_qwen3_5():
    """Undo :func:`patch_qwen3_5`; returns the restored classes."""
    return _unpatch_family("qwen3_5")


def unpatch_qwen3_5_moe():
    """Undo :func:`patch_qwen3_5_moe`; returns the restored classes."""
    return _unpatch_family("qwen3_5_moe")


def unpatch_qwen2_vl():
    """Undo :func:`patch_qwen2_vl`; returns the restored classes."""
    return _unpatch_family("qwen2_vl")


def unpatch_qwen2_5_vl():
    """Undo :func:`patch_qwen2_5_vl`; returns the restored classes."""
    return _unpatch_family("qwen2_5_vl")


def unpatch_qwen3_vl():
    """Undo :func:`patch_qwen3_vl`; returns the restored classes."""
    return _unpatch_family("qwen3_vl")


def unpatch_qwen3_vl_moe():
    """Undo :func:`patch_qwen3_vl_moe`; returns the restored classes."""
    return _unpatch_family("qwen3_vl_moe")


def supported_classes() -> dict:
    """``{class name: class}`` of the supported classes that the installed transformers has."""
    found = {}
    for module_name, names in _FAMILIES.values():
        for name in names:
            cls = _load_class(module_name, name)
            if cls is not None:
                found[name] = cls
    return found


# ------------------------------------------------------------------------------------------------ patching
def _load_class(module_name, name):
    try:
        module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    except ImportError:
        return None
    return getattr(module, name, None)


def _check_options(options):
    options = dict(options)
    reserved = sorted(set(options) & set(_RESERVED))
    if reserved:
        raise TypeError(f"loss_options: {reserved} cannot be set: the HF loss contract fixes them (mean over "
                        "num_items_in_batch or the valid tokens, causal shift)")
    unknown = sorted(set(options) - set(_LOSS_OPTIONS) - set(_PATCH_OPTIONS))
    if unknown:
        raise TypeError(f"loss_options: unexpected option(s) {unknown}; expected any of "
                        f"{sorted(_LOSS_OPTIONS + _PATCH_OPTIONS)}")
    skip = options.get("skip_logits")
    if skip is not None and not isinstance(skip, bool):
        raise TypeError(f"skip_logits: expected None, True or False, got {skip!r}")
    if not isinstance(options.get("log_entropy", True), bool):
        raise TypeError(f"log_entropy: expected True or False, got {options['log_entropy']!r}")
    # validate the loss options now rather than at the first training step, on a tiny CPU problem; the backend
    # only by name, since it may exist for the model's device and not for the CPU
    backend = options.get("backend", "auto")
    if backend != "auto" and backend not in registry.names():
        raise ValueError(f"backend: expected one of {('auto',) + registry.names()}, got {backend!r}")
    probe = {k: v for k, v in options.items() if k in _LOSS_OPTIONS and k != "backend"}
    linear_cross_entropy(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, dtype=torch.long), **probe)
    return options


def _resolve(model, check=True):
    """The transformers model to patch: ``model`` itself or the model inside a PEFT wrapper."""
    target = model
    for _ in range(3):  # PeftModel -> LoraModel -> transformers model
        if hasattr(target, "get_base_model") and type(target).__module__.startswith("peft"):
            target = target.get_base_model()
        elif type(target).__module__.startswith("peft.tuners") and hasattr(target, "model"):
            target = target.model
        else:
            break
    if not isinstance(target, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module or a transformers.Trainer, got {type(model).__name__}")
    if check:
        classes = tuple(supported_classes().values())
        if not isinstance(target, classes):
            raise ValueError(f"model: {type(target).__name__} is not supported by fused_lce.patch; supported: "
                             f"{', '.join(SUPPORTED)}")
    return target


def _options_of(model):
    """The patch options in force for ``model`` (instance patch first, then class patch), or None."""
    state = model.__dict__.get("_fused_lce_patch")
    if state is not None:
        return state["options"]
    for cls in type(model).__mro__:
        entry = _CLASS_PATCHES.get(cls)
        if entry is not None:
            return entry["options"]
    return None


def _as_trainer(obj):
    transformers = sys.modules.get("transformers")
    trainer_cls = getattr(transformers, "Trainer", None) if transformers is not None else None
    return obj if trainer_cls is not None and isinstance(obj, trainer_cls) else None


def _patch_trainer(trainer, loss_options):
    import transformers

    smoother = getattr(trainer, "label_smoother", None)
    if smoother is not None:
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
        if why is None:
            loss_options = {**loss_options, "label_smoothing": smoother.epsilon,
                            "ignore_index": smoother.ignore_index}
            patch(trainer.model, **loss_options)
            trainer.__dict__["_fused_lce_label_smoother"] = smoother
            trainer.label_smoother = None  # Trainer now passes the labels to the model: the fused loss smooths
            return trainer
        warnings.warn(f"fused_lce: label_smoothing_factor={smoother.epsilon}: Trainer's LabelSmoother computes the "
                      f"training loss from the full logits ({why}), so fused_lce does not run for it",
                      stacklevel=3)
    patch(trainer.model, **loss_options)
    return trainer


def _candidate_leaves(model):
    """Every ``nn.Linear`` that may compute the logits (the head, or the copies in PEFT's ModulesToSaveWrapper)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return []
    leaves = [head]
    if type(head).__module__.startswith("peft"):
        leaves = [m for m in head.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    return [m for m in leaves if isinstance(m, torch.nn.Linear)]


def _is_leaf_forward(f):
    return isinstance(f, functools.partial) and f.func is _leaf_forward


def _install_leaf(leaf):
    """Give ``leaf`` the inert-unless-armed forward, unless someone else's forward already sits on the instance."""
    if "forward" not in leaf.__dict__:
        # a partial (not a bound method) so that copy.deepcopy / PEFT's copies rebind it to the copy
        leaf.forward = functools.partial(_leaf_forward, leaf)


def _leaf_reachable(leaf):
    """None if calling ``leaf`` reaches our forward (directly or through wrappers that set ``__wrapped__``, as
    accelerate's hooks do), else the reason."""
    _install_leaf(leaf)
    f = leaf.__dict__.get("forward")
    for _ in range(8):
        if _is_leaf_forward(f):
            return None
        f = getattr(f, "__wrapped__", None)
        if f is None:
            break
    name = getattr(leaf.__dict__.get("forward"), "__module__", None) or type(leaf.__dict__.get("forward")).__name__
    return (f"the output layer's forward was replaced (by {name}) before fused_lce.patch and does not reach the "
            "fused path (e.g. accelerate device-map hooks: patch before dispatching the model)")


class _LossRelay:
    """``model._loss_function`` while patched: returns the loss computed by the armed output layer in this call,
    else the stock loss function (``ForCausalLMLoss``)."""

    def __init__(self, stock):
        self.stock = stock

    def __call__(self, *args, **kwargs):
        frame = _top()
        if frame is not None and frame.loss is not None and not frame.loss_taken:
            frame.loss_taken = True
            # a new tensor: MoE forwards add their router aux loss to the returned loss in place
            return frame.loss.clone()
        return self.stock(*args, **kwargs)


def _stock_loss_function():
    from transformers.loss.loss_utils import LOSS_MAPPING

    return LOSS_MAPPING["ForCausalLM"]


def _install_relay(model):
    """Install the relay as ``model._loss_function`` unless a user-set loss function that is not provably the
    stock one is there (then it is respected: the fused path does not run). Returns what it replaced."""
    current = model.__dict__.get("_loss_function")
    if isinstance(current, _LossRelay):
        return None
    if current is None or current is _stock_loss_function():
        stock = _stock_loss_function() if current is None else current
        model.__dict__["_loss_function"] = _LossRelay(stock)
        return current
    return None


def _why_not(model, kwargs):
    """None if the fused path can run for ``model`` now, else the reason (for the warning / is_patched)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return f"{type(model).__name__} has no output embeddings (lm_head)"
    kind = type(head)
    if kind.__module__.startswith("peft"):
        from peft.tuners.tuners_utils import BaseTunerLayer
        from peft.utils.other import ModulesToSaveWrapper

        if isinstance(head, ModulesToSaveWrapper):
            if kwargs.get("adapter_names") is not None:
                return "mixed-batch adapter_names with modules_to_save=['lm_head']"
        elif isinstance(head, BaseTunerLayer) or hasattr(head, "base_layer"):
            return (f"the output layer carries a PEFT adapter ({kind.__name__}) that the fused path would leave "
                    "untrained; use modules_to_save=['lm_head'] or no adapter on lm_head")
        else:
            return f"the output layer is wrapped by PEFT ({kind.__name__})"
    elif not isinstance(head, torch.nn.Linear):
        return f"the output layer is a {kind.__name__}, not a torch.nn.Linear"
    replaced = _forward_replaced(model)
    if replaced:
        return replaced
    leaves = _candidate_leaves(model)
    if not leaves:
        return f"the output layer ({kind.__name__}) holds no torch.nn.Linear"
    for leaf in leaves:
        if not leaf.weight.is_floating_point():
            return f"the output layer weight has dtype {leaf.weight.dtype} (quantized?)"
        why = _leaf_reachable(leaf)
        if why:
            return why
    _install_relay(model)  # a class-patched instance gets its relay at its first call
    if not isinstance(model.__dict__.get("_loss_function"), _LossRelay):
        fn = model.__dict__.get("_loss_function")
        return (f"model.loss_function is user-set ({getattr(fn, '__qualname__', type(fn).__name__)}); it is "
                "respected, so the stock forward computes it from full logits")
    return None


def _forward_replaced(model):
    """The armed output layer returns the loss where transformers' own forward expects logits, which that forward
    hands to ``loss_function``. Another library's forward set on the supported class itself (Unsloth, Liger)
    computes its loss in its own way: then the fused path must not run. A user subclass's forward is fine."""
    for cls in type(model).__mro__:
        if cls.__name__ in SUPPORTED and cls.__module__.startswith("transformers."):
            where = getattr(cls.forward, "__module__", None) or ""
            if not where.startswith("transformers."):
                return (f"{cls.__name__}.forward was replaced by {where or 'a foreign function'} (e.g. Unsloth or "
                        "Liger), which computes its own loss; fused_lce only runs under transformers' forward")
            return None
    return None


def _patch_family(family, options):
    options = _check_options(options)
    module_name, names = _FAMILIES[family]
    classes = [c for c in (_load_class(module_name, n) for n in names) if c is not None]
    if not classes:
        import transformers

        raise ImportError(f"transformers {transformers.__version__} has none of {names}")
    for cls in classes:
        if cls in _CLASS_PATCHES:
            _CLASS_PATCHES[cls]["options"] = options
            continue
        # wrap __call__ (which sees TRL's fused-head calls, whatever replaced an instance's forward) and forward
        # (called directly by PEFT <= 0.20's tuners); both looked up through the MRO (a forward may be inherited
        # from a shared base class) and restored, or removed, on unpatch
        entry = {"options": options, "saved": {}}
        for name, wrap in (("__call__", _class_call), ("forward", _class_forward)):
            original = getattr(cls, name)
            entry["saved"][name] = (name in vars(cls), original)
            setattr(cls, name, wrap(cls, original))
        _CLASS_PATCHES[cls] = entry
    return classes


def _class_call(cls, original):
    def __call__(self, *args, **kwargs):
        entry = _CLASS_PATCHES.get(cls)  # None once unpatched (a subclass may still hold this function)
        if entry is None or "_fused_lce_patch" in self.__dict__:  # the instance patch's hooks do the work
            return original(self, *args, **kwargs)
        return _framed(self, entry["options"], args, kwargs, "class", functools.partial(original, self))

    functools.update_wrapper(__call__, original)
    return __call__


def _class_forward(cls, original):
    def forward(self, *args, **kwargs):
        entry = _CLASS_PATCHES.get(cls)
        top = _top()
        if entry is None or "_fused_lce_patch" in self.__dict__ or (top is not None and top.module is self):
            return original(self, *args, **kwargs)
        return _framed(self, entry["options"], args, kwargs, "forward", functools.partial(original, self))

    functools.update_wrapper(forward, original)
    return forward


def _instance_forward(model, previous, *args, **kwargs):
    """``model.forward`` while patched. Called through ``model(...)``, the hooks have opened this call's frame and it
    passes through; called directly (``model.forward(...)``, as PEFT <= 0.20's tuners do) it opens the frame."""
    run = previous if previous is not None else functools.partial(type(model).forward, model)
    state = model.__dict__.get("_fused_lce_patch")
    top = _top()
    if state is None or (top is not None and top.module is model):
        return run(*args, **kwargs)
    return _framed(model, state["options"], args, kwargs, "forward", run)


def _framed(model, options, args, kwargs, via, run):
    """``run(*args, **kwargs)`` inside a frame of its own (the entries other than the module hooks)."""
    frame, kwargs = _begin(model, options, args, kwargs, via)
    _push(frame)
    try:
        out = run(*args, **kwargs)
    finally:
        _pop(frame)
    return _finish(model, frame, out)


def _unpatch_family(family):
    module_name, names = _FAMILIES[family]
    restored = []
    for cls in (_load_class(module_name, n) for n in names):
        entry = _CLASS_PATCHES.pop(cls, None) if cls is not None else None
        if entry is not None:
            for name, (had_own, original) in entry["saved"].items():
                if had_own:
                    setattr(cls, name, original)
                else:
                    delattr(cls, name)
            restored.append(cls)
    return restored


# ------------------------------------------------------------------------------------------------ the call
class _Frame:
    """What one patched call hands from the model's hooks to its armed output layer and loss relay."""

    __slots__ = ("module", "via", "mode", "leaves", "target", "num_items", "ignore_index", "loss_options",
                 "want_tuple", "loss", "loss_taken", "trl", "trl_shifted", "trl_fields")

    def __init__(self, module, via):
        self.module, self.via = module, via
        self.mode = None  # None: stock; "fused": loss only; "logits+loss": stock logits, fused loss; "trl"
        self.leaves = ()
        self.target = self.num_items = self.loss_options = self.trl = self.trl_fields = None
        self.ignore_index = -100
        self.want_tuple = self.loss_taken = self.trl_shifted = False
        self.loss = None


# The frames of the patched calls in progress. Eager: a ContextVar (per thread and asyncio task, so concurrent
# calls never see each other's frames). Dynamo cannot trace ContextVar, so a compiled region keeps its frames on a
# plain list, which dynamo traces as a side effect (it is empty again once the call returns).
_FRAMES = contextvars.ContextVar("fused_lce_hf_frames", default=())
_TRACED_FRAMES: list = []


def _top():
    if _TRACED_FRAMES:
        return _TRACED_FRAMES[-1]
    if torch.compiler.is_compiling():
        return None
    frames = _FRAMES.get()
    return frames[-1] if frames else None


def _push(frame):
    if torch.compiler.is_compiling():
        _TRACED_FRAMES.append(frame)
    else:
        _FRAMES.set(_FRAMES.get() + (frame,))


def _pop(frame):
    if _TRACED_FRAMES and _TRACED_FRAMES[-1] is frame:
        _TRACED_FRAMES.pop()
    elif not torch.compiler.is_compiling():
        frames = _FRAMES.get()
        if frames and frames[-1] is frame:
            _FRAMES.set(frames[:-1])


def _pre_hook(module, args, kwargs):
    state = module.__dict__.get("_fused_lce_patch")
    frame, kwargs = _begin(module, state["options"] if state is not None else None, args, kwargs, "hook")
    _push(frame)
    return args, kwargs


def _post_hook(module, args, kwargs, output):
    frame = _top()
    if frame is None or frame.module is not module or frame.via != "hook":
        return None  # our pre-hook raised before pushing
    _pop(frame)
    if output is None:  # the forward raised (always_call hook): nothing to convert
        return None
    return _finish(module, frame, output)


def _warn_once(model, key, message):
    if torch.compiler.is_compiling():
        return  # a warning would break the graph; is_patched(model) still says why
    seen = _WARNED.setdefault(model, set())
    if key not in seen:
        seen.add(key)
        warnings.warn(f"fused_lce: {message}", UserWarning, stacklevel=4)


def _objective_changed(options):
    return any(options.get(k, v) != v for k, v in _OBJECTIVE_DEFAULTS.items())


def _begin(model, options, args, kwargs, via):
    """Decide how this call runs and build its frame; returns (frame, the kwargs for the forward)."""
    frame = _Frame(model, via)
    if options is None:
        return frame, kwargs
    kwargs = dict(kwargs)
    skip = kwargs.pop("skip_logits", None)
    if skip is not None and not isinstance(skip, bool):
        raise TypeError(f"skip_logits: expected None, True or False, got {skip!r}")
    labels = kwargs.get("labels")
    if labels is None and args:
        labels = _positional(model, args, kwargs, "labels")
    if kwargs.get("fused_lm_head"):
        return _begin_trl(model, options, frame, labels, kwargs)
    if skip is None:
        skip = options.get("skip_logits")
    fused = skip if skip is not None else (model.training and labels is not None)
    if fused:
        if labels is None:
            raise ValueError("skip_logits=True: expected labels (the fused path returns only the loss), got None")
        mode = "fused"
    elif labels is not None and _objective_changed(options):
        mode = "logits+loss"
    else:
        if labels is None and model.training and skip is None and torch.is_grad_enabled():
            _warn_once(model, "no-labels", "a training-mode forward without labels: the loss is computed outside "
                       "the model from the full logits (e.g. Trainer's label_smoothing_factor or "
                       "compute_loss_func), so fused_lce does not run; for Trainer label smoothing use "
                       "fused_lce.patch(trainer)")
        return frame, kwargs
    why = None if torch.compiler.is_compiling() else _why_not(model, kwargs)
    if why:
        _warn_once(model, why, f"{why}; running the stock forward (full logits) instead")
        return frame, kwargs

    loss_options = {k: v for k, v in options.items() if k in _LOSS_OPTIONS}
    default_ignore = loss_options.pop("ignore_index", -100)
    frame.ignore_index = kwargs.get("ignore_index", default_ignore)  # a per-call kwarg, as ForCausalLMLoss takes
    _fill(frame, model, mode, labels, kwargs, loss_options)
    if mode == "fused":
        frame.want_tuple = not _return_dict(model, kwargs)
        kwargs["return_dict"] = True
    return frame, kwargs


def _return_dict(model, kwargs):
    """What the forward would return, as transformers' ``can_return_tuple`` decides it."""
    value = kwargs.get("return_dict")
    return getattr(model.config, "return_dict", True) if value is None else value


def _fill(frame, model, mode, labels, kwargs, loss_options):
    target = kwargs.get("shift_labels")
    frame.trl_shifted = target is not None
    if target is None:
        # as ForCausalLMLoss: position t is scored against label t+1, the last position against ignore_index
        target = torch.nn.functional.pad(labels, (0, 1), value=frame.ignore_index)[..., 1:]
    frame.mode, frame.target = mode, target
    frame.num_items = kwargs.get("num_items_in_batch")
    frame.loss_options = loss_options
    frame.leaves = tuple(_candidate_leaves(model))


def _trl_why_not(head, options):
    if isinstance(head, str):
        return head
    return trl_support.unsupported(head, options.get("log_entropy", True), _linear_logprobs() is not None)


def _begin_trl(model, options, frame, labels, kwargs):
    """A call of TRL's fused LM head: serve it with fused_lce (TRL's forward then runs the stock forward, whose
    armed output layer computes TRL's per-token outputs), or leave it to TRL with a warning saying why."""
    head = trl_support.installed_head(model)
    if head is None:
        head = "fused_lm_head=True was passed but no TRL fused LM head (add_fused_lm_head) is installed"
    why = _trl_why_not(head, options) or _why_not(model, kwargs)
    if why:
        _warn_once(model, "trl:" + why, f"TRL's fused LM head computes this loss, not fused_lce: {why}")
        return frame, kwargs
    if labels is None and kwargs.get("shift_labels") is None:
        return frame, kwargs  # TRL's own error message
    kwargs.pop("fused_lm_head")
    ignored = sorted(k for k in _OBJECTIVE_DEFAULTS if options.get(k, _OBJECTIVE_DEFAULTS[k])
                     != _OBJECTIVE_DEFAULTS[k])
    if ignored:
        _warn_once(model, "trl-options", f"options {ignored} do not apply to TRL's fused-head calls (TRL computes "
                   "its loss from the per-token log-probabilities)")
    loss_options = {k: v for k, v in options.items() if k in ("backend", "validate", "tile_budget_mb")}
    frame.ignore_index = -100  # TRL's label mask
    frame.trl = head
    frame.trl_fields = {"log_entropy": options.get("log_entropy", True)}
    _fill(frame, model, "trl", labels, kwargs, loss_options)
    kwargs["return_dict"] = True
    return frame, kwargs


def _positional(model, args, kwargs, name):
    try:
        return inspect.signature(model.forward).bind_partial(*args, **kwargs).arguments.get(name)
    except (TypeError, ValueError):
        return None


def _finish(model, frame, out):
    """Turn the stock forward's output into what this call promised."""
    if frame.mode is None or not hasattr(out, "items"):
        return out
    if frame.loss is None:  # the output layer never ran armed: the stock output, stock loss
        if frame.mode == "trl":
            raise RuntimeError("fused_lce: TRL's fused-head call was taken over but the output layer's forward "
                               "never ran armed; call fused_lce.unpatch(model) to leave it to TRL")
        _warn_once(model, "not-reached", "the output layer's forward did not run armed during the forward; the "
                   "stock loss (full logits) was computed")
        return out.to_tuple() if frame.want_tuple else out
    if frame.mode == "logits+loss":
        return out
    if frame.mode == "trl":
        return trl_support.output(model, out, frame.loss, frame.trl_fields)
    if frame.want_tuple:  # HF's tuple layout, None where the logits were
        return tuple(None if k == "logits" else v for k, v in out.items())
    return type(out)(**{k: v for k, v in out.items() if k != "logits"})


def _linear_logprobs():
    """``fused_lce.linear_logprobs`` (per-token log-probabilities and entropy without logits) if this fused_lce
    has it, else None."""
    import fused_lce

    fn = getattr(fused_lce, "linear_logprobs", None)
    return fn if callable(fn) else None


def _leaf_forward(leaf, hidden, *rest, **kwargs):
    """The output layer's forward while patched: the stock forward unless this call's frame armed this layer."""
    frame = _top()
    if (frame is None or frame.mode is None or frame.loss is not None
            or not any(leaf is m for m in frame.leaves)):
        return type(leaf).forward(leaf, hidden, *rest, **kwargs)
    if rest or kwargs or not isinstance(hidden, torch.Tensor):
        raise TypeError("fused_lce: the armed output layer expected a single hidden-states tensor")
    labels = frame.target.to(hidden.device)
    if labels.numel() != hidden[..., 0].numel():
        raise ValueError(f"labels: {labels.numel()} (shifted) labels for the {hidden[..., 0].numel()} positions "
                         f"reaching the output layer (hidden states of shape {tuple(hidden.shape)}); with "
                         "logits_to_keep, pass labels or shift_labels for the kept positions only")
    labels = labels.reshape(hidden.shape[:-1])
    if frame.mode == "trl":
        frame.loss = trl_support.compute(leaf, frame, hidden, labels)
        return frame.loss
    frame.loss = linear_cross_entropy(hidden, leaf.weight, labels, leaf.bias, num_items=frame.num_items,
                                      ignore_index=frame.ignore_index, **frame.loss_options)
    if frame.mode == "logits+loss":
        return type(leaf).forward(leaf, hidden)
    return frame.loss
