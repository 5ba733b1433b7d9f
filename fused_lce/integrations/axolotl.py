"""An axolotl plugin that patches the trainer axolotl builds with :func:`fused_lce.patch`.

In the axolotl config (YAML)::

    plugins:
      - fused_lce.integrations.axolotl.FusedLCEPlugin
    fused_lce_options:          # optional: patch options, as for fused_lce.patch
      log_entropy: false

After axolotl creates its trainer (a ``transformers.Trainer`` subclass; TRL's for DPO/KTO/GRPO) the plugin
calls ``fused_lce.patch(trainer, **fused_lce_options)``: the model (with or without its LoRA adapters), a
reference model, the label smoothing. Axolotl's own fused losses (``cut_cross_entropy``, Liger's
``liger_fused_linear_cross_entropy``) replace the model class's forward; with either on, fused_lce stays out
(the patch warns) -- the plugin says so before the model is loaded. ``FUSED_LINEAR_CE=1`` works under axolotl
too, without the plugin.

Tested against a stand-in of axolotl's ``BasePlugin`` interface (tests/integrations/test_axolotl.py), not
against axolotl itself: axolotl's releases for Python 3.11 pin other torch / transformers versions than this
project's test environment.
"""
from __future__ import annotations

import logging
from typing import Optional

from axolotl.integrations.base import BasePlugin
from pydantic import BaseModel

LOG = logging.getLogger(__name__)
_OWN_FUSED_LOSSES = ("cut_cross_entropy", "liger_fused_linear_cross_entropy")


class FusedLCEArgs(BaseModel):
    """The plugin's entries in the axolotl config."""

    fused_lce_options: Optional[dict] = None


class FusedLCEPlugin(BasePlugin):
    """``plugins: [fused_lce.integrations.axolotl.FusedLCEPlugin]``; see the module docstring."""

    def get_input_args(self):
        return f"{__name__}.FusedLCEArgs"

    def pre_model_load(self, cfg):
        on = [k for k in _OWN_FUSED_LOSSES if _get(cfg, k)]
        if on:
            LOG.warning("fused_lce: %s replace the model's forward with their own fused loss; fused_lce "
                        "stays out (turn them off to use fused_lce)", " and ".join(on))

    def post_trainer_create(self, cfg, trainer):
        import fused_lce

        fused_lce.patch(trainer, **(_get(cfg, "fused_lce_options") or {}))
        LOG.info("fused_lce: %s", fused_lce.is_patched(trainer).reason)


def _get(cfg, key):
    """``cfg[key]`` for axolotl's ``DictDefault`` (missing keys read None) or a plain dict."""
    return cfg.get(key) if hasattr(cfg, "get") else getattr(cfg, key, None)
