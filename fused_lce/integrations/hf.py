"""Hugging Face transformers integration: route the causal-LM loss of Qwen models through
:func:`fused_lce.linear_cross_entropy`, so training never materialises the ``[tokens x vocab]`` logits.

Usage::

    model = AutoModelForCausalLM.from_pretrained(...)
    fused_lce.patch(model)                 # or fused_lce.patch_if_enabled(model): only when FUSED_LINEAR_CE=1
    model = get_peft_model(model, lora)    # patching before or after PEFT both work; so does patch(peft_model)
    fused_lce.unpatch(model)               # back to the stock forward

    fused_lce.patch_qwen3()                # class level: every Qwen3ForCausalLM, including ones loaded later

How it works (nothing of transformers' forwards is copied, so it follows their changes between releases):
the model's own forward runs unchanged. For the duration of the call, the output layer's module (``lm_head``, or
the active copy inside PEFT's ``ModulesToSaveWrapper``) is *armed*: when the stock forward calls
``self.lm_head(hidden_states)``, the module's forward computes the fused loss from the hidden states it receives
and its own ``weight``/``bias`` (tied or untied), and returns that loss in place of the logits. Because this
happens inside the module's ``__call__``, FSDP2 / DeepSpeed ZeRO-3 pre/post-forward hooks gather the weight and
register their backward hooks as for the stock call. The stock forward then hands that tensor to
``self.loss_function``, which is swapped for the duration of the call to return it (MoE forwards then add their
router aux loss exactly as they always do). The output is the model's usual output class, with ``logits=None``.

When the fused path runs (default: ``model.training`` and ``labels`` given; override per call with the
``skip_logits=True/False`` forward kwarg or ``patch(model, skip_logits=...)``):
  * ``labels`` are shifted with ``ignore_index`` padding like ``ForCausalLMLoss``; ``shift_labels`` wins over it;
  * ``num_items_in_batch`` divides the summed loss (gradient accumulation), else the mean over valid tokens;
  * ``logits_to_keep`` slices the hidden states first, as in the stock forward (labels must then describe the
    kept positions, as the stock loss requires too).
Eval, generation and calls without labels run the stock forward and return real logits. Two deliberate
differences from stock: a batch whose labels are all ``ignore_index`` gives loss 0 (stock: NaN), and so does
``num_items_in_batch == 0``.

A PEFT adapter *on* the output layer (LoRA on ``lm_head``, trainable tokens) falls back to the stock forward with
a warning, since the fused path reads ``lm_head.weight`` and would leave those adapter weights untrained;
``modules_to_save=["lm_head"]`` is fused (the trained copy is the module that runs).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import os
import types
import warnings
import torch

from .. import registry
from ..api import linear_cross_entropy

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
_ENV = "FUSED_LINEAR_CE"

_CLASS_PATCHES: dict = {}  # class -> {"original": forward function, "options": dict}


# ------------------------------------------------------------------------------------------------ public
def patch(model, **loss_options):
    """Patch an instantiated Qwen model (or a ``PeftModel`` around one) in place; returns ``model``.

    ``loss_options``: ``skip_logits`` (None: fuse when training with labels; True/False: always/never fuse), and
    any of ``ignore_index``, ``label_smoothing``, ``z_loss``, ``softcap``, ``backend``, ``validate``,
    ``tile_budget_mb`` (passed to :func:`fused_lce.linear_cross_entropy`; anything but the defaults makes the
    loss differ from the stock one on purpose). Patching a patched model replaces its options.
    Raises ValueError for a model class not in ``SUPPORTED``."""
    options = _check_options(loss_options)
    target = _resolve(model)
    if "_fused_lce_options" in target.__dict__:
        target.__dict__["_fused_lce_options"] = options
        return model
    previous = target.__dict__.get("forward")  # an instance-level forward someone installed (accelerate, TRL)
    source = type(target).forward
    source = getattr(source, "_fused_lce_original", source)  # class patched too: show the stock signature
    if previous is not None:
        source = getattr(previous, "__func__", None)
    target.__dict__["_fused_lce_previous"] = previous
    target.__dict__["_fused_lce_options"] = options
    # a bound method (not a closure over `model`) so that copy.deepcopy(model) rebinds it to the copy
    target.forward = types.MethodType(_instance_forward(source), target)
    return model


def unpatch(model):
    """Undo :func:`patch` on ``model`` (no-op if it is not patched); returns ``model``. If another wrapper was
    installed over the patched forward since (accelerate's autocast wrapper, TRL's fused head), that wrapper is
    kept and the patch inside it becomes a pass-through to the stock forward."""
    target = _resolve(model, check=False)
    if "_fused_lce_options" not in target.__dict__:
        return model
    current = target.__dict__.get("forward")
    if getattr(getattr(current, "__func__", None), "_fused_lce_patched", False):
        previous = target.__dict__.pop("_fused_lce_previous")
        del target.__dict__["_fused_lce_options"]
        if previous is None:
            del target.__dict__["forward"]
        else:
            target.__dict__["forward"] = previous
    else:
        # someone wrapped our forward afterwards (e.g. accelerate's autocast wrapper): keep their wrapper and turn
        # ours into a pass-through, so that the stock forward runs
        target.__dict__["_fused_lce_options"] = None
    return model


def is_patched(model) -> bool:
    """Whether ``model`` (or the model inside a ``PeftModel``) would take the fused path: instance- or class-level."""
    target = _resolve(model, check=False)
    if "_fused_lce_options" in target.__dict__:
        return target.__dict__["_fused_lce_options"] is not None
    return any(isinstance(target, cls) for cls in _CLASS_PATCHES)


def patch_if_enabled(model, **loss_options):
    """:func:`patch` ``model`` if the environment variable ``FUSED_LINEAR_CE`` is ``1``/``true``/``yes``/``on``;
    leave it alone if unset or ``0``/``false``/``no``/``off`` (the default is off). Returns ``model``."""
    if env_enabled():
        patch(model, **loss_options)
    return model


def env_enabled() -> bool:
    """Value of the ``FUSED_LINEAR_CE`` switch (ValueError for a value that is neither on nor off)."""
    value = os.environ.get(_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"{_ENV}: expected 1/true/yes/on or 0/false/no/off, got {os.environ[_ENV]!r}")


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
    unknown = sorted(set(options) - set(_LOSS_OPTIONS) - {"skip_logits"})
    if unknown:
        raise TypeError(f"loss_options: unexpected option(s) {unknown}; expected any of "
                        f"{sorted(_LOSS_OPTIONS + ('skip_logits',))}")
    skip = options.get("skip_logits")
    if skip is not None and not isinstance(skip, bool):
        raise TypeError(f"skip_logits: expected None, True or False, got {skip!r}")
    # validate the loss options now rather than at the first training step, on a tiny CPU problem; the backend
    # only by name, since it may exist for the model's device and not for the CPU
    backend = options.get("backend", "auto")
    if backend != "auto" and backend not in registry.names():
        raise ValueError(f"backend: expected one of {('auto',) + registry.names()}, got {backend!r}")
    probe = {k: v for k, v in options.items() if k not in ("skip_logits", "backend")}
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
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if check:
        classes = tuple(supported_classes().values())
        if not isinstance(target, classes):
            raise ValueError(f"model: {type(target).__name__} is not supported by fused_lce.patch; supported: "
                             f"{', '.join(SUPPORTED)}")
    return target


def _instance_forward(source):
    def forward(self, *args, **kwargs):
        options = self.__dict__.get("_fused_lce_options")
        previous = self.__dict__.get("_fused_lce_previous")
        stock = previous if previous is not None else types.MethodType(type(self).forward, self)
        return _dispatch(self, stock, options, args, kwargs)

    if callable(source) and hasattr(source, "__name__"):
        functools.update_wrapper(forward, source)  # Trainer/generate read the stock signature through __wrapped__
    forward._fused_lce_patched = True
    return forward


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
        original = cls.__dict__["forward"]
        _CLASS_PATCHES[cls] = {"original": original, "options": options}
        cls.forward = _class_forward(cls, original)
    return classes


def _class_forward(cls, original):
    def forward(self, *args, **kwargs):
        entry = _CLASS_PATCHES.get(cls)  # None once unpatched (a subclass may still hold this function)
        return _dispatch(self, types.MethodType(original, self), entry and entry["options"], args, kwargs)

    functools.update_wrapper(forward, original)
    forward._fused_lce_original = original
    return forward


def _unpatch_family(family):
    module_name, names = _FAMILIES[family]
    restored = []
    for cls in (_load_class(module_name, n) for n in names):
        entry = _CLASS_PATCHES.pop(cls, None) if cls is not None else None
        if entry is not None:
            cls.forward = entry["original"]
            restored.append(cls)
    return restored


# ------------------------------------------------------------------------------------------------ the call
class _State:
    """What one fused call hands from the model's forward to its armed output layer."""

    __slots__ = ("labels", "num_items", "ignore_index", "loss_options", "loss")

    def __init__(self, labels, num_items, ignore_index, loss_options):
        self.labels, self.num_items, self.ignore_index = labels, num_items, ignore_index
        self.loss_options = loss_options
        self.loss = None


def _dispatch(model, stock, options, args, kwargs):
    skip = kwargs.pop("skip_logits", None)
    # re-entry: an instance patch over a class patch, or a wrapper calling back into us
    if options is None or model.__dict__.get("_fused_lce_busy"):
        return stock(*args, **kwargs)
    if skip is None:
        skip = options.get("skip_logits")
    labels = kwargs.get("labels")
    if labels is None and args:
        labels = _positional(stock, args, kwargs, "labels")
    if skip is None:
        skip = model.training and labels is not None
    if not skip:
        return stock(*args, **kwargs)
    if labels is None:
        raise ValueError("skip_logits=True: expected labels (the fused path returns only the loss), got None")

    leaves, why_not = _output_leaves(model, kwargs)
    if why_not:
        warnings.warn(f"fused_lce: {why_not}; running the stock forward (full logits) instead", stacklevel=3)
        return stock(*args, **kwargs)

    loss_options = {k: v for k, v in options.items() if k != "skip_logits"}
    default_ignore = loss_options.pop("ignore_index", -100)
    ignore_index = kwargs.get("ignore_index", default_ignore)  # a per-call kwarg, as ForCausalLMLoss takes it
    target = kwargs.get("shift_labels")
    if target is None:
        # as ForCausalLMLoss: position t is scored against label t+1, the last position against ignore_index
        target = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    state = _State(target, kwargs.get("num_items_in_batch"), ignore_index, loss_options)

    with _busy(model), _armed(leaves, state), _loss_function(model, state):
        out = stock(*args, **kwargs)
    if state.loss is None:  # the output layer never ran armed: the stock loss was computed
        return out
    if isinstance(out, tuple):  # return_dict=False
        return tuple(x for x in out if x is not state.loss)
    return type(out)(**{k: v for k, v in out.items() if k != "logits"})


def _positional(stock, args, kwargs, name):
    import inspect

    try:
        return inspect.signature(stock).bind_partial(*args, **kwargs).arguments.get(name)
    except (TypeError, ValueError):
        return None


def _output_leaves(model, kwargs):
    """The ``nn.Linear`` modules one of which computes the logits, or the reason the fused path cannot run."""
    head = model.get_output_embeddings()
    if head is None:
        return None, f"{type(model).__name__} has no output embeddings (lm_head)"
    candidates = [head]
    kind = type(head)
    if kind.__module__.startswith("peft"):
        from peft.tuners.tuners_utils import BaseTunerLayer
        from peft.utils.other import ModulesToSaveWrapper

        if isinstance(head, ModulesToSaveWrapper):
            if kwargs.get("adapter_names") is not None:
                return None, "mixed-batch adapter_names with modules_to_save=['lm_head']"
            candidates = [head.original_module, *head.modules_to_save.values()]
        elif isinstance(head, BaseTunerLayer) or hasattr(head, "base_layer"):
            return None, (f"the output layer carries a PEFT adapter ({kind.__name__}) that the fused path would "
                          "leave untrained; use modules_to_save=['lm_head'] or no adapter on lm_head")
        else:
            return None, f"the output layer is wrapped by PEFT ({kind.__name__})"
    for leaf in candidates:
        if not isinstance(leaf, torch.nn.Linear):
            return None, f"the output layer is a {type(leaf).__name__}, not a torch.nn.Linear"
        if not leaf.weight.is_floating_point():
            return None, f"the output layer weight has dtype {leaf.weight.dtype} (quantized?)"
    return candidates, None


@contextlib.contextmanager
def _busy(model):
    model.__dict__["_fused_lce_busy"] = True
    try:
        yield
    finally:
        model.__dict__.pop("_fused_lce_busy", None)


_MISSING = object()


@contextlib.contextmanager
def _armed(leaves, state):
    """Make each leaf's forward compute the fused loss for this call only. accelerate's hooks (device_map,
    offloading) keep the real forward in ``_old_forward`` and call it between their pre/post hooks: replace that
    one so their hooks still run."""
    saved = []
    try:
        for leaf in leaves:
            attr = "_old_forward" if "_old_forward" in leaf.__dict__ else "forward"
            saved.append((leaf, attr, leaf.__dict__.get(attr, _MISSING)))
            leaf.__dict__[attr] = functools.partial(_head_loss, leaf, state)
        yield
    finally:
        for leaf, attr, previous in reversed(saved):
            if previous is _MISSING:
                leaf.__dict__.pop(attr, None)
            else:
                leaf.__dict__[attr] = previous


def _head_loss(leaf, state, hidden, *rest, **kwargs):
    """The armed output layer's forward: the fused loss instead of the logits."""
    if rest or kwargs or not isinstance(hidden, torch.Tensor):
        raise TypeError("fused_lce: the armed output layer expected a single hidden-states tensor")
    labels = state.labels.to(hidden.device)
    if labels.numel() != hidden[..., 0].numel():
        raise ValueError(f"labels: {labels.numel()} (shifted) labels for the {hidden[..., 0].numel()} positions "
                         f"reaching the output layer (hidden states of shape {tuple(hidden.shape)}); with "
                         "logits_to_keep, pass labels or shift_labels for the kept positions only")
    loss = linear_cross_entropy(hidden, leaf.weight, labels.reshape(hidden.shape[:-1]), leaf.bias,
                                num_items=state.num_items, ignore_index=state.ignore_index, **state.loss_options)
    state.loss = loss
    return loss


@contextlib.contextmanager
def _loss_function(model, state):
    """Swap ``model.loss_function`` for this call: return the loss the armed layer computed."""
    had = "_loss_function" in model.__dict__
    previous = model.__dict__.get("_loss_function")
    stock = model.loss_function

    def loss_function(*args, **kwargs):
        logits = kwargs["logits"] if "logits" in kwargs else (args[0] if args else None)
        if state.loss is not None and logits is state.loss:
            # a new tensor: MoE forwards add their router aux loss to the returned loss in place
            return state.loss.clone()
        return stock(*args, **kwargs)

    model.__dict__["_loss_function"] = loss_function
    try:
        yield
    finally:
        if had:
            model.__dict__["_loss_function"] = previous
        else:
            model.__dict__.pop("_loss_function", None)
