"""Patch options: which exist, their check, and the ``FUSED_LINEAR_CE`` / ``FUSED_LINEAR_CE_OPTIONS``
switches."""
from __future__ import annotations

import os

import torch

from ...api import OPTION_DEFAULTS, backend_info, linear_cross_entropy

# Each option of linear_cross_entropy (api.OPTION_DEFAULTS) is in exactly one of these four groups (a test
# checks it, so a new option must be placed).
# Fixed by the HF loss contract (mean over num_items_in_batch or valid tokens, causal shift) or set per call
RESERVED = ("reduction", "shift", "num_items", "return_stats", "process_group", "sequence_parallel")
OBJECTIVE = ("label_smoothing", "z_loss", "softcap")  # change the loss: a stock loss from logits would differ
LABEL_MASK = ("ignore_index",)  # which tokens count; HF's per-call ignore_index argument wins over it
RUN_OPTIONS = ("backend", "validate", "tile_budget_mb")  # how the loss is computed, never its value
GROUPS = (RESERVED, OBJECTIVE, LABEL_MASK, RUN_OPTIONS)

LOSS_OPTIONS = tuple(k for k in OPTION_DEFAULTS if k not in RESERVED)  # what a patch may set
OBJECTIVE_DEFAULTS = {k: OPTION_DEFAULTS[k] for k in OBJECTIVE}
PATCH_OPTIONS = ("skip_logits", "log_entropy")
ENV = "FUSED_LINEAR_CE"
ENV_OPTIONS = "FUSED_LINEAR_CE_OPTIONS"  # e.g. "log_entropy=false,z_loss=1e-4"
_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def check_options(options) -> dict:
    """``options`` as a dict, checked now rather than at the first training step (TypeError / ValueError
    naming the option)."""
    options = dict(options)
    reserved = sorted(set(options) & set(RESERVED))
    if reserved:
        raise TypeError(f"loss_options: {reserved} cannot be set: the HF loss contract fixes them (mean over "
                        "num_items_in_batch or the valid tokens, causal shift)")
    unknown = sorted(set(options) - set(LOSS_OPTIONS) - set(PATCH_OPTIONS))
    if unknown:
        raise TypeError(f"loss_options: unexpected option(s) {unknown}; expected any of "
                        f"{sorted(LOSS_OPTIONS + PATCH_OPTIONS)}")
    skip = options.get("skip_logits")
    if skip is not None and not isinstance(skip, bool):
        raise TypeError(f"skip_logits: expected None, True or False, got {skip!r}")
    if not isinstance(options.get("log_entropy", True), bool):
        raise TypeError(f"log_entropy: expected True or False, got {options['log_entropy']!r}")
    # the loss options on a tiny CPU problem; the backend only by name, since it may exist for the model's
    # device and not for the CPU
    backend = options.get("backend", "auto")
    names = tuple(backend_info())  # "auto" and every registered backend, available here or not
    if backend not in names:
        raise ValueError(f"backend: expected one of {names}, got {backend!r}")
    probe = {k: v for k, v in options.items() if k in LOSS_OPTIONS and k != "backend"}
    linear_cross_entropy(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, dtype=torch.long), **probe)
    return options


def objective_changed(options) -> bool:
    return any(options.get(k, v) != v for k, v in OBJECTIVE_DEFAULTS.items())


def env_enabled() -> bool:
    """Value of the ``FUSED_LINEAR_CE`` switch (ValueError for a value that is neither on nor off)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{ENV}: expected 1/true/yes/on or 0/false/no/off, got {os.environ[ENV]!r}")


def env_options() -> dict:
    """Patch options from the environment variable ``FUSED_LINEAR_CE_OPTIONS``: comma-separated ``key=value``
    items (``true``/``false``, ``none``, ints and floats are converted), e.g.
    ``log_entropy=false,backend=npu``. Used by :func:`autopatch` and :func:`patch_if_enabled` (explicit
    keyword arguments win). Validated by ``patch``."""
    options = {}
    for item in (x.strip() for x in os.environ.get(ENV_OPTIONS, "").split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{ENV_OPTIONS}: expected comma-separated key=value items, got {item!r}")
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
