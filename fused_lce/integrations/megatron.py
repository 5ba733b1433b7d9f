"""A Megatron-core output layer whose forward computes the fused loss (no ``[s, b, V/tp]`` logits).

``FusedLCEColumnParallelLinear`` subclasses megatron-core's ``ColumnParallelLinear``;
``fused_output_layer_class(base)`` builds the same subclass over any column-parallel linear class whose
instances follow Megatron's conventions -- Transformer Engine's ``TEColumnParallelLinear``, or the native
class that MindSpeed rebinds the TE names to -- and ``convert_output_layer(layer)`` turns an existing layer
into it in place (parameters, hooks and checkpoints unchanged). megatron-core is imported only when one of
them is used, so ``import fused_lce`` (and this module) never needs it.

Forward, Megatron layout (hidden ``[s, b, h]``, or ``[s/tp, b, h]`` with sequence parallelism; labels ``[b,
s]``)::

    loss = layer(hidden, labels=labels, weight=shared_embedding_weight_or_None, loss_mask=mask)  # [b, s]
    logits, bias = layer(hidden, weight=...)                                                   # no labels

With labels, the loss is computed inside this module's forward through ``fused_lce.linear_cross_entropy`` with
this layer's tensor-parallel group as ``process_group`` (vocab-parallel: only per-token statistics cross
ranks) and its sequence-parallel setting, on the layer's own ``weight`` (untied embeddings) or the ``weight``
passed in (the shared embedding weight when tied, as GPTModel passes it). Because the parameters are used
inside the module's own forward, module forward-pre hooks (distributed-optimizer parameter all-gather with
overlap) and the parameters' gradient-accumulation hooks (DDP / main_grad) fire as for the plain layer;
gradients arrive in ``param.grad`` (Megatron's DDP hook adds them to ``main_grad``). Without labels it is the
base layer's forward, unchanged (``(logits, bias)`` for both native and TE-backed classes), so the layer is a
drop-in replacement.

The default ``reduction="none"`` returns ``[b, s]`` per-token losses like
``GPTModel.compute_language_model_loss`` (tokens where ``loss_mask == 0`` give 0). That path recomputes the
logits tiles in backward; pass ``reduction="sum"`` (with ``loss_mask``) to get Megatron's ``sum(losses *
loss_mask)`` directly through the fused path whose gradients are computed during forward (about 3 instead of 4
GEMM-equivalents).

Stock ``GPTModel.forward(..., labels=labels)`` calls its output layer without labels and computes the loss
from the logits in ``compute_language_model_loss``. Converting (or building) a fused layer therefore also
routes GPTModel, once per process: in a ``GPTModel.forward`` with labels whose ``output_layer`` is a fused
layer, that layer computes the per-token ``[b, s]`` loss from the labels (``reduction="none"`` whatever its
options say: that is ``compute_language_model_loss``'s contract) and returns it in place of the logits, and
``compute_language_model_loss`` returns it. So ``convert_output_layer(model.output_layer)`` is all a stock
GPTModel needs. Where the route cannot engage, the stock path runs with a warning: multi-token prediction
(``config.mtp_num_layers``, whose extra output-layer calls use rolled labels), or a fused layer called without
labels in a training step outside GPTModel's forward (e.g. a custom model that computes its own loss from the
logits: pass ``labels=`` to the layer there).

Not supported (ValueError): ``defer_embedding_wgrad_compute``; ``shift`` with the ``[s, b]`` layout (Megatron
labels are already shifted). FP8 primary weights of TE are not handled.
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import warnings
from typing import Optional

import torch

DEFAULT_OPTIONS = {"reduction": "none"}
_CLASSES: dict = {}


class _FusedLossMixin:
    """Mixed in before the base column-parallel linear class; see the module docstring."""

    def __init__(self, *args, fused_lce_options: Optional[dict] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fused_lce_options = dict(fused_lce_options or {})

    def forward(self, input_, labels=None, weight=None, runtime_gather_output=None, *,
                loss_mask=None, **options):
        route = _ROUTE.get()
        if labels is None and not options and loss_mask is None and route is not None and route.wants(self):
            # GPTModel's forward with labels (see the module docstring): the per-token loss, where it expects
            # (logits, bias)
            route.loss = self.fused_loss(input_, route.labels, weight=weight, reduction="none",
                                         return_stats=False)
            return route.loss, None
        if labels is None:
            if torch.is_grad_enabled() and self.training and route is None:
                _warn_once(self, "the fused output layer was called without labels in a training step, "
                           "outside GPTModel.forward(labels=...): it returns the logits and the loss is not "
                           "fused; pass labels= to the layer")
            if options or loss_mask is not None:
                raise TypeError("loss options "
                                f"{sorted(options) + (['loss_mask'] if loss_mask is not None else [])} "
                                "given without labels")
            kwargs = {}
            if weight is not None:
                kwargs["weight"] = weight
            if runtime_gather_output is not None:
                kwargs["runtime_gather_output"] = runtime_gather_output
            return super().forward(input_, **kwargs)
        return self.fused_loss(input_, labels, weight=weight, loss_mask=loss_mask, **options)

    # -- the loss ------------------------------------------------------------------------------------------
    def fused_loss(self, hidden, labels, weight=None, loss_mask=None, **options):
        """The loss of ``hidden @ weight.T (+ bias)`` against ``labels``; ``options`` override
        ``self.fused_lce_options`` and the defaults (any keyword of ``fused_lce.linear_cross_entropy`` except
        ``process_group`` / ``sequence_parallel``, which come from the layer)."""
        import fused_lce

        for k in ("process_group", "sequence_parallel"):
            if k in options:
                raise TypeError(f"{k}: set by the layer (its tensor-parallel group and sequence_parallel)")
        opts = {**DEFAULT_OPTIONS, **getattr(self, "fused_lce_options", {}), **options}
        w = weight if weight is not None else getattr(self, "weight", None)
        if w is None:
            raise ValueError("weight: this output layer holds no weight (skip_weight_param_allocation, tied "
                             "embeddings); pass weight= the shared embedding weight")
        config = getattr(self, "config", None)
        if config is not None and getattr(config, "defer_embedding_wgrad_compute", False):
            raise ValueError("config.defer_embedding_wgrad_compute: not supported with the fused loss "
                             "(the weight gradient is computed with the loss)")
        group = self._fused_lce_group()
        sp = group is not None and bool(getattr(self, "sequence_parallel", False))
        megatron_layout = hidden.dim() == 3 and labels.dim() == 2
        if megatron_layout:
            if opts.get("shift"):
                raise ValueError("shift: not supported for Megatron's [s, b, h] layout (labels come shifted)")
            labels = labels.t()  # [b, s] -> [s, b], the token order of hidden
            if loss_mask is not None:
                loss_mask = loss_mask.t()
        if loss_mask is not None:
            if tuple(loss_mask.shape) != tuple(labels.shape):
                raise ValueError(f"loss_mask: expected the shape of labels {tuple(labels.shape)}, "
                                 f"got {tuple(loss_mask.shape)}")
            labels = torch.where(loss_mask.bool(), labels,
                                 torch.full_like(labels, opts.get("ignore_index", -100)))
        out = fused_lce.linear_cross_entropy(hidden, w, labels, self._fused_lce_bias(), process_group=group,
                                             sequence_parallel=sp, **opts)
        if not (megatron_layout and opts["reduction"] == "none"):
            return out
        if isinstance(out, fused_lce.LCEOutput):
            return out._replace(loss=out.loss.t().contiguous(), lse=out.lse.t().contiguous())
        return out.t().contiguous()  # [s, b] -> [b, s], as compute_language_model_loss returns

    def _fused_lce_bias(self):
        bias = getattr(self, "bias", None)
        if not isinstance(bias, torch.Tensor) or bias.numel() == 0 or getattr(self, "use_bias",
                                                                              True) is False:
            return None  # TE keeps an empty tensor when bias=False
        return bias

    def _fused_lce_group(self):
        """This layer's tensor-parallel group, or None when it has a single rank."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = getattr(self, "tp_group", None)  # native (megatron-core >= 0.13) and TE's Linear
        if group is None:
            group = getattr(self, "_tp_group", None)  # megatron's TE wrappers
        if group is None:  # megatron-core before explicit groups
            from megatron.core import parallel_state

            group = parallel_state.get_tensor_model_parallel_group()
        return group if dist.get_world_size(group) > 1 else None


# --------------------------------------------------------------------------------------------- GPTModel route
class _Route:
    """One ``GPTModel.forward`` with labels: its model, output layer and labels, and the loss the layer
    computed."""

    __slots__ = ("model", "layer", "labels", "loss", "taken")

    def __init__(self, model, layer, labels):
        self.model, self.layer, self.labels = model, layer, labels
        self.loss, self.taken = None, False

    def wants(self, layer):
        return layer is self.layer and self.loss is None


_ROUTE = contextvars.ContextVar("fused_lce_megatron_route", default=None)
_WARNED: set = set()


def _warn_once(obj, message):
    key = (id(obj), message)
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(f"fused_lce: {message}", UserWarning, stacklevel=3)


def _route_gpt_model():
    """Wrap ``GPTModel.forward`` and ``compute_language_model_loss`` (class level, once) as the module
    docstring says; a megatron-core without GPTModel is left alone."""
    try:
        from megatron.core.models.gpt.gpt_model import GPTModel
    except ImportError:
        return
    if getattr(GPTModel.forward, "_fused_lce_route", False):
        return
    forward, compute_loss = GPTModel.forward, GPTModel.compute_language_model_loss
    signature = inspect.signature(forward)

    @functools.wraps(forward)
    def routed_forward(self, *args, **kwargs):
        layer = getattr(self, "output_layer", None)
        if not isinstance(layer, _FusedLossMixin) or not getattr(self, "post_process", True):
            return forward(self, *args, **kwargs)
        labels = signature.bind_partial(self, *args, **kwargs).arguments.get("labels")
        if labels is None:
            return forward(self, *args, **kwargs)
        route = _Route(self, layer, labels)
        if getattr(self.config, "mtp_num_layers", None):
            _warn_once(self, "GPTModel with multi-token prediction (config.mtp_num_layers) calls its output "
                       "layer once per depth with rolled labels: the stock loss (full logits) "
                       "runs, not fused_lce")
            route = _Route(self, None, labels)  # declined: the layer's own warning would only repeat this one
        token = _ROUTE.set(route)
        try:
            out = forward(self, *args, **kwargs)
        finally:
            _ROUTE.reset(token)
        if not route.taken and route.layer is not None:
            _warn_once(self, "GPTModel.forward(labels=...) did not pass its fused output layer's loss on (a "
                       "changed forward?): the loss it returned is not fused_lce's")
        return out

    @functools.wraps(compute_loss)
    def routed_compute_loss(self, labels, logits):
        route = _ROUTE.get()
        if route is None or route.model is not self or route.loss is None or route.taken:
            return compute_loss(self, labels, logits)
        route.taken = True
        # what the layer returned, as the forward passed it on (module hooks may replace a layer's output)
        return logits if isinstance(logits, torch.Tensor) and logits.shape == route.loss.shape else route.loss

    routed_forward._fused_lce_route = True
    GPTModel.forward, GPTModel.compute_language_model_loss = routed_forward, routed_compute_loss


def fused_output_layer_class(base=None):
    """The subclass of ``base`` (default: megatron-core's native ``ColumnParallelLinear``) whose forward
    computes the fused loss when given labels. Its constructor takes the base's arguments plus
    ``fused_lce_options``. Also routes ``GPTModel.forward(labels=...)`` through such a layer (see the module
    docstring)."""
    _route_gpt_model()
    if base is None:
        from megatron.core.tensor_parallel import ColumnParallelLinear as base
    if issubclass(base, _FusedLossMixin):
        return base
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type(f"FusedLCE{base.__name__}", (_FusedLossMixin, base),
                   {"__module__": __name__, "__doc__": f"{base.__name__} whose forward(hidden, labels=...) "
                                                       "returns the fused linear cross-entropy (fused_lce)."})
        _CLASSES[base] = cls
    return cls


def convert_output_layer(layer: torch.nn.Module, **fused_lce_options) -> torch.nn.Module:
    """Turn an existing column-parallel output layer (native or TE-backed) into its fused subclass, in place:
    same object, parameters, hooks and state dict. Returns ``layer``."""
    layer.__class__ = fused_output_layer_class(type(layer))
    layer.fused_lce_options = dict(fused_lce_options)
    return layer


def __getattr__(name):
    if name == "FusedLCEColumnParallelLinear":
        return fused_output_layer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FusedLCEColumnParallelLinear", "fused_output_layer_class", "convert_output_layer",
           "DEFAULT_OPTIONS"]
