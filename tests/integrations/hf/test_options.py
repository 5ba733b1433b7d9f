"""fused_lce.integrations.hf.options: the patch's option groups are named subsets of the public options."""
from __future__ import annotations

import inspect

import fused_lce
from fused_lce.api import OPTION_DEFAULTS
from fused_lce.integrations.hf import options


def test_public_options_come_from_the_signature():
    params = inspect.signature(fused_lce.linear_cross_entropy).parameters
    assert dict(OPTION_DEFAULTS) == {k: p.default for k, p in params.items() if p.kind is p.KEYWORD_ONLY}
    assert {"label_smoothing", "z_loss", "backend", "shift"} <= set(OPTION_DEFAULTS)


def test_every_public_option_is_in_exactly_one_group():
    """A new option of linear_cross_entropy must be placed in one group (RESERVED, OBJECTIVE, LABEL_MASK or
    RUN_OPTIONS): otherwise the patch would pass it on without knowing whether it changes the loss."""
    placed = [k for group in options.GROUPS for k in group]
    assert len(placed) == len(set(placed)), f"an option is in two groups: {placed}"
    unplaced, unknown = set(OPTION_DEFAULTS) - set(placed), set(placed) - set(OPTION_DEFAULTS)
    assert not unplaced and not unknown, f"unplaced: {sorted(unplaced)}; unknown: {sorted(unknown)}"


def test_derived_lists():
    assert set(options.LOSS_OPTIONS) == set(OPTION_DEFAULTS) - set(options.RESERVED)
    known = {"label_smoothing": 0.0, "z_loss": 0.0, "softcap": None}
    assert known.items() <= options.OBJECTIVE_DEFAULTS.items()
    assert not options.objective_changed({"backend": "torch", "ignore_index": -1, "tile_budget_mb": 8})
    assert options.objective_changed({"z_loss": 1e-4})
