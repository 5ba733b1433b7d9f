"""How a patched model runs (nothing of transformers' forwards is copied, so it follows their changes).

``patch_model`` registers a forward pre-hook and an (always-called) forward hook on the model and gives its
output layer (``lm_head``) a forward that stays inert unless armed. The pre-hook decides per call whether the
fused path runs (default: ``model.training`` and ``labels`` given) and, if so, pushes a *frame* (labels,
options) onto a context-local stack (a ``contextvars.ContextVar``: concurrent threads and nested calls never
see each other's frames). The model's own forward then runs unchanged; when it calls
``self.lm_head(hidden_states)``, the armed layer computes the fused loss from the hidden states it receives
and its own ``weight``/``bias`` (tied or untied) and returns it in place of the logits. This happens inside
the module's ``__call__``, so FSDP2 / DeepSpeed ZeRO-3 hooks gather the weight around it and see its result.

The stock forward hands what ``lm_head`` returned -- as the module hooks left it: ZeRO-3 replaces it with a
tensor whose backward re-gathers the weight -- to ``self.loss_function``, which the patch sets to a relay that
returns (a copy of) that very tensor, so backward runs through those hooks; MoE forwards then add their router
aux loss as always. The forward hook pops the frame and returns the model's usual output class with
``logits=None`` (``return_dict=False``: the usual tuple, ``None`` where the logits were).

TRL's fused-head calls (``fused_lm_head=True``) are served the same way (:mod:`fused_lce.integrations.trl`):
the armed layer returns the per-token log-probabilities (and entropy) as one tensor, from which the output TRL
expects is built.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import warnings
import weakref

import torch

from ...api import linear_cross_entropy
from .. import trl as trl_support
from . import families
from .options import LOSS_OPTIONS, OBJECTIVE_DEFAULTS, RUN_OPTIONS, check_options, objective_changed

CLASS_PATCHES: dict = {}  # class -> {"options": dict, "saved": {name: (had_own, original)}}
# model -> keys of the warnings it has given
_WARNED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class PatchStatus:
    """What :func:`is_patched` returns: truthy iff the next training step (training mode, labels given)
    computes its loss with fused_lce; ``reason`` says why or why not."""

    __slots__ = ("active", "reason")

    def __init__(self, active: bool, reason: str):
        self.active, self.reason = bool(active), reason

    def __bool__(self) -> bool:
        return self.active

    def __repr__(self) -> str:
        return f"PatchStatus({self.active}, {self.reason!r})"


# --------------------------------------------------------------------------------------------- instance patch
def patch_model(model, options: dict):
    """Patch ``model`` (a supported model or a PEFT wrapper around one) in place with checked ``options``."""
    target = resolve(model)
    state = target.__dict__.get("_fused_lce_patch")
    if state is not None:
        state["options"] = options
        return model
    relay_previous = _install_relay(target)
    for leaf in _candidate_leaves(target):
        _install_leaf(leaf)
    handles = (target.register_forward_pre_hook(_pre_hook, with_kwargs=True),
               target.register_forward_hook(_post_hook, with_kwargs=True, always_call=True))
    # a second entry for calls of model.forward(...) that bypass the module hooks (PEFT <= 0.20's tuners do
    # that)
    # someone's instance forward (TRL's fused head, accelerate's autocast)
    previous = target.__dict__.get("forward")
    entry = functools.partial(_instance_forward, target, previous)
    # Trainer and generate read the forward's signature
    entry.__signature__ = inspect.signature(target.forward)
    if previous is not None:
        entry.__wrapped__ = previous
    target.__dict__["forward"] = entry
    target.__dict__["_fused_lce_patch"] = {"options": options, "handles": handles,
                                           "relay_previous": relay_previous}
    return model


def unpatch_model(model):
    target = resolve(model, check=False)
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
    # else: a wrapper installed after patch (TRL, accelerate) holds our entry; left in place, it passes
    # through
    if isinstance(target.__dict__.get("_loss_function"), _LossRelay):
        if state["relay_previous"] is None:
            del target.__dict__["_loss_function"]
        else:
            target.__dict__["_loss_function"] = state["relay_previous"]
    for leaf in _candidate_leaves(target):
        if _is_leaf_forward(leaf.__dict__.get("forward")):
            del leaf.__dict__["forward"]
        # else: a wrapper (an accelerate hook added after patch) holds ours; left in place, it is inert
    return model


def status(model) -> PatchStatus:
    target = resolve(model, check=False)
    options = options_of(target)
    if options is None:
        return PatchStatus(False, "not patched: call fused_lce.patch(model)")
    if options.get("skip_logits") is False:
        return PatchStatus(False,
                           "patched with skip_logits=False: the stock forward (full logits) always runs")
    why = _why_not(target, {})
    if why:
        return PatchStatus(False, why)
    head = trl_support.installed_head(target)
    if head is not None:
        why = trl_support.unsupported(head)
        if why:
            return PatchStatus(False, f"TRL's fused LM head is installed and computes the loss itself: {why}")
        return PatchStatus(True, "fused_lce computes the loss: TRL's fused-head calls (fused_lm_head=True) "
                                 "are served by fused_lce, as are plain calls with labels")
    return PatchStatus(True, "fused_lce computes the loss on the next training-mode call with labels")


def resolve(model, check=True):
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
        raise TypeError("model: expected a torch.nn.Module or a transformers.Trainer, got "
                        f"{type(model).__name__}")
    if check and not isinstance(target, tuple(families.supported_classes().values())):
        raise ValueError(f"model: {type(target).__name__} is not supported by fused_lce.patch; supported: "
                         f"{', '.join(families.SUPPORTED)}")
    return target


def options_of(model):
    """The patch options in force for ``model`` (instance patch first, then class patch), or None."""
    state = model.__dict__.get("_fused_lce_patch")
    if state is not None:
        return state["options"]
    for cls in type(model).__mro__:
        entry = CLASS_PATCHES.get(cls)
        if entry is not None:
            return entry["options"]
    return None


# ------------------------------------------------------------------------------------------------ class patch
def patch_family(family, options):
    options = check_options(options)
    classes = families.family_classes(family)
    if not classes:
        import transformers

        raise ImportError(f"transformers {transformers.__version__} has none of "
                          f"{families.FAMILIES[family][1]}")
    for cls in classes:
        if cls in CLASS_PATCHES:
            CLASS_PATCHES[cls]["options"] = options
            continue
        # wrap __call__ (which sees TRL's fused-head calls, whatever replaced an instance's forward) and
        # forward (called directly by PEFT <= 0.20's tuners); both looked up through the MRO (a forward may be
        # inherited from a shared base class) and restored, or removed, on unpatch
        entry = {"options": options, "saved": {}}
        for name, wrap in (("__call__", _class_call), ("forward", _class_forward)):
            original = getattr(cls, name)
            entry["saved"][name] = (name in vars(cls), original)
            setattr(cls, name, wrap(cls, original))
        CLASS_PATCHES[cls] = entry
    return classes


def unpatch_family(family):
    restored = []
    for cls in families.family_classes(family):
        entry = CLASS_PATCHES.pop(cls, None)
        if entry is not None:
            for name, (had_own, original) in entry["saved"].items():
                if had_own:
                    setattr(cls, name, original)
                else:
                    delattr(cls, name)
            restored.append(cls)
    return restored


def _class_call(cls, original):
    def __call__(self, *args, **kwargs):
        entry = CLASS_PATCHES.get(cls)  # None once unpatched (a subclass may still hold this function)
        if entry is None or "_fused_lce_patch" in self.__dict__:  # the instance patch's hooks do the work
            return original(self, *args, **kwargs)
        return _framed(self, entry["options"], args, kwargs, "class", functools.partial(original, self))

    functools.update_wrapper(__call__, original)
    return __call__


def _class_forward(cls, original):
    def forward(self, *args, **kwargs):
        entry = CLASS_PATCHES.get(cls)
        top = _top()
        if entry is None or "_fused_lce_patch" in self.__dict__ or (top is not None and top.module is self):
            return original(self, *args, **kwargs)
        return _framed(self, entry["options"], args, kwargs, "forward", functools.partial(original, self))

    functools.update_wrapper(forward, original)
    return forward


def _instance_forward(model, previous, *args, **kwargs):
    """``model.forward`` while patched. Called through ``model(...)``, the hooks have opened this call's frame
    and it passes through; called directly (``model.forward(...)``, as PEFT <= 0.20's tuners do) it opens the
    frame."""
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


# ------------------------------------------------------------------------------------------------ the call
class _Frame:
    """What one patched call hands from the model's hooks to its armed output layer and loss relay."""

    __slots__ = ("module", "via", "mode", "leaves", "target", "num_items", "ignore_index", "loss_options",
                 "want_tuple", "loss", "loss_taken", "trl", "trl_shifted", "trl_fields", "accuracy")

    def __init__(self, module, via):
        self.module, self.via = module, via
        self.mode = None  # None: stock; "fused": loss only; "logits+loss": stock logits, fused loss; "trl"
        self.leaves = ()
        self.target = self.num_items = self.loss_options = self.trl = self.trl_fields = None
        self.ignore_index = -100
        self.want_tuple = self.loss_taken = self.trl_shifted = False
        self.loss = None  # what the armed layer returned (the loss, or TRL's per-token carrier)
        self.accuracy = None  # where to record (correct, valid) token counts, when someone asked for them


# The frames of the patched calls in progress. Eager: a ContextVar (per thread and asyncio task, so concurrent
# calls never see each other's frames). Dynamo cannot trace ContextVar, so a compiled region keeps its frames
# on a plain list, which dynamo traces as a side effect (it is empty again once the call returns).
_FRAMES = contextvars.ContextVar("fused_lce_hf_frames", default=())
_TRACED_FRAMES: list = []


# Token-accuracy records for callers that log it from the logits the fused path does not return (ms-swift):
# None, or a list that the fused calls made inside recording_token_accuracy() append (correct, valid) counts
# to.
_ACCURACY = contextvars.ContextVar("fused_lce_hf_accuracy", default=None)


@contextlib.contextmanager
def recording_token_accuracy():
    """Collect ``(correct, valid)`` token counts (0-dim tensors) of the fused calls made in this block."""
    records = []
    token = _ACCURACY.set(records)
    try:
        yield records
    finally:
        _ACCURACY.reset(token)


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


def warn_once(model, key, message):
    if torch.compiler.is_compiling():
        return  # a warning would break the graph; is_patched(model) still says why
    seen = _WARNED.setdefault(model, set())
    if key not in seen:
        seen.add(key)
        warnings.warn(f"fused_lce: {message}", UserWarning, stacklevel=4)


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
            raise ValueError("skip_logits=True: expected labels (the fused path returns only "
                             "the loss), got None")
        mode = "fused"
    elif labels is not None and objective_changed(options):
        mode = "logits+loss"
    else:
        if labels is None and model.training and skip is None and torch.is_grad_enabled():
            warn_once(model, "no-labels", "a training-mode forward without labels: the loss is computed "
                      "outside the model from the full logits (e.g. Trainer's label_smoothing_factor or "
                      "compute_loss_func), so fused_lce does not run; for Trainer label smoothing use "
                      "fused_lce.patch(trainer)")
        return frame, kwargs
    why = None if torch.compiler.is_compiling() else _why_not(model, kwargs)
    if why:
        warn_once(model, why, f"{why}; running the stock forward (full logits) instead")
        return frame, kwargs

    loss_options = {k: v for k, v in options.items() if k in LOSS_OPTIONS}
    default_ignore = loss_options.pop("ignore_index", -100)
    # a per-call kwarg, as ForCausalLMLoss takes
    frame.ignore_index = kwargs.get("ignore_index", default_ignore)
    _fill(frame, model, mode, labels, kwargs, loss_options)
    if mode == "fused":
        frame.want_tuple = not _return_dict(model, kwargs)
        kwargs["return_dict"] = True
        frame.accuracy = None if torch.compiler.is_compiling() else _ACCURACY.get()
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


def _begin_trl(model, options, frame, labels, kwargs):
    """A call of TRL's fused LM head: serve it with fused_lce (TRL's forward then runs the stock forward,
    whose armed output layer computes TRL's per-token outputs), or leave it to TRL with a warning saying
    why."""
    head = trl_support.installed_head(model)
    if head is None:
        head = "fused_lm_head=True was passed but no TRL fused LM head (add_fused_lm_head) is installed"
    why = trl_support.unsupported(head) or _why_not(model, kwargs)
    if why:
        warn_once(model, "trl:" + why, f"TRL's fused LM head computes this loss, not fused_lce: {why}")
        return frame, kwargs
    if labels is None and kwargs.get("shift_labels") is None:
        return frame, kwargs  # TRL's own error message
    kwargs.pop("fused_lm_head")
    ignored = sorted(k for k in OBJECTIVE_DEFAULTS
                     if options.get(k, OBJECTIVE_DEFAULTS[k]) != OBJECTIVE_DEFAULTS[k])
    if ignored:
        warn_once(model, "trl-options", f"options {ignored} do not apply to TRL's fused-head calls (TRL "
                  "computes its loss from the per-token log-probabilities)")
    loss_options = {k: v for k, v in options.items() if k in RUN_OPTIONS}
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


def _returned(frame, value):
    """What the armed layer returned, as the stock forward passed it on (``value``, possibly replaced by
    module hooks, e.g. ZeRO-3's): that tensor when it has the shape of ours, else ours."""
    if isinstance(value, torch.Tensor) and value.shape == frame.loss.shape:
        return value
    return frame.loss


def _finish(model, frame, out):
    """Turn the stock forward's output into what this call promised."""
    if frame.mode is None or not hasattr(out, "items"):
        return out
    if frame.loss is None:  # the output layer never ran armed: the stock output, stock loss
        if frame.mode == "trl":
            raise RuntimeError("fused_lce: TRL's fused-head call was taken over but the output layer's "
                               "forward never ran armed; call fused_lce.unpatch(model) to leave it to TRL")
        warn_once(model, "not-reached", "the output layer's forward did not run armed during the forward; "
                  "the stock loss (full logits) was computed")
        return out.to_tuple() if frame.want_tuple else out
    if frame.mode == "logits+loss":
        return out
    if frame.mode == "trl":
        carrier = _returned(frame, out.get("logits"))
        return trl_support.output(model, out, carrier, frame.trl_fields, frame.num_items, frame.trl_shifted)
    if frame.want_tuple:  # HF's tuple layout, None where the logits were
        return tuple(None if k == "logits" else v for k, v in out.items())
    return type(out)(**{k: v for k, v in out.items() if k != "logits"})


def _leaf_forward(leaf, hidden, *rest, **kwargs):
    """The output layer's forward while patched: the stock forward unless this call's frame armed this
    layer."""
    frame = _top()
    if (frame is None or frame.mode is None or frame.loss is not None
            or not any(leaf is m for m in frame.leaves)):
        return type(leaf).forward(leaf, hidden, *rest, **kwargs)
    if rest or kwargs or not isinstance(hidden, torch.Tensor):
        raise TypeError("fused_lce: the armed output layer expected a single hidden-states tensor")
    labels = frame.target.to(hidden.device)
    if labels.numel() != hidden[..., 0].numel():
        raise ValueError(f"labels: {labels.numel()} (shifted) labels for the {hidden[..., 0].numel()} "
                         "positions reaching the output layer (hidden states of shape "
                         f"{tuple(hidden.shape)}); with logits_to_keep, pass labels or shift_labels for the "
                         "kept positions only")
    labels = labels.reshape(hidden.shape[:-1])
    if frame.mode == "trl":
        frame.loss, fields = trl_support.compute(frame.trl, hidden, leaf.weight, leaf.bias, labels,
                                                 log_entropy=frame.trl_fields["log_entropy"],
                                                 options=frame.loss_options)
        frame.trl_fields.update(fields)
        return frame.loss
    out = linear_cross_entropy(hidden, leaf.weight, labels, leaf.bias, num_items=frame.num_items,
                               ignore_index=frame.ignore_index, return_stats=frame.accuracy is not None,
                               **frame.loss_options)
    if frame.accuracy is not None:
        frame.accuracy.append((torch.round(out.token_accuracy * out.n_valid), out.n_valid))
        out = out.loss
    frame.loss = out
    if frame.mode == "logits+loss":
        return type(leaf).forward(leaf, hidden)
    return frame.loss


class _LossRelay:
    """``model._loss_function`` while patched: in a call whose output layer ran armed, a copy of the tensor
    that layer returned as the forward passed it here (see the module docstring: backward must run through the
    module hooks' version of it); else the stock loss function (``ForCausalLMLoss``)."""

    def __init__(self, stock):
        self.stock = stock

    def __call__(self, *args, **kwargs):
        frame = _top()
        if frame is None or frame.loss is None or frame.loss_taken:
            return self.stock(*args, **kwargs)
        frame.loss_taken = True
        if frame.mode == "logits+loss":  # the layer returned the logits; the loss is an eval-time extra
            return frame.loss.clone()
        returned = _returned(frame, kwargs.get("logits", args[0] if args else None))
        if frame.mode == "trl":
            return trl_support.loss(returned, frame.trl_fields, frame.num_items, frame.trl_shifted)
        return returned.clone()  # a new tensor: MoE forwards add their router aux loss to it in place


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


def _candidate_leaves(model):
    """Every ``nn.Linear`` that may compute the logits (the head, or the copies in PEFT's
    ModulesToSaveWrapper)."""
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
    """Give ``leaf`` the inert-unless-armed forward, unless someone else's forward already sits on the
    instance."""
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
    name = (getattr(leaf.__dict__.get("forward"), "__module__", None) or
            type(leaf.__dict__.get("forward")).__name__)
    return (f"the output layer's forward was replaced (by {name}) before fused_lce.patch and does not reach "
            "the fused path (e.g. accelerate device-map hooks: patch before dispatching the model)")


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
            return (f"the output layer carries a PEFT adapter ({kind.__name__}) that the fused path would "
                    "leave untrained; use modules_to_save=['lm_head'] or no adapter on lm_head")
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
    """The armed output layer returns the loss where transformers' own forward expects logits, which that
    forward hands to ``loss_function``. Another library's forward set on the supported class itself (Unsloth,
    Liger) computes its loss in its own way: then the fused path must not run. A user subclass's forward is
    fine."""
    for cls in type(model).__mro__:
        if cls.__name__ in families.SUPPORTED and cls.__module__.startswith("transformers."):
            where = getattr(cls.forward, "__module__", None) or ""
            if not where.startswith("transformers."):
                return (f"{cls.__name__}.forward was replaced by {where or 'a foreign function'} (e.g. "
                        "Unsloth or Liger), which computes its own loss; fused_lce only runs under "
                        "transformers' forward")
            return None
    return None
