"""The axolotl plugin (fused_lce.integrations.axolotl.FusedLCEPlugin) against a stand-in of axolotl's plugin
interface: ``axolotl.integrations.base.BasePlugin`` with the hooks axolotl calls, and its loader (a dotted
``module.Class`` path from ``plugins:``, imported and instantiated). axolotl itself is not installed here: its
releases for Python 3.11 pin other torch / transformers versions than this environment. What runs: the plugin
loaded by its dotted path, its config schema, and a transformers.Trainer patched by ``post_trainer_create``,
trained one step (gradient accumulation 2) with the same loss and parameters as stock, fused at the driver."""
from __future__ import annotations

import copy
import importlib
import logging
import sys
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("pydantic")

import fused_lce  # noqa: E402

from .hf.test_trainer import collate, examples, run_trainer, tiny_qwen3, trainer_args  # noqa: E402

PLUGIN = "fused_lce.integrations.axolotl.FusedLCEPlugin"


class DictDefault(dict):
    """axolotl's config object: a dict whose missing attributes read None."""

    def __getattr__(self, key):
        return self.get(key)


def load_plugin(name):
    """axolotl's loader: ``module.Class`` -> an instance."""
    module_name, class_name = name.rsplit(".", 1)
    return getattr(importlib.import_module(module_name), class_name)()


@pytest.fixture
def axolotl_stub(monkeypatch):
    base = types.ModuleType("axolotl.integrations.base")

    class BasePlugin:  # the hooks of axolotl's BasePlugin that a plugin may override (all no-ops there)
        def register(self, cfg): ...
        def get_input_args(self): ...
        def pre_model_load(self, cfg): ...
        def post_model_build(self, cfg, model): ...
        def pre_lora_load(self, cfg, model): ...
        def post_lora_load(self, cfg, model): ...
        def post_model_load(self, cfg, model): ...
        def get_trainer_cls(self, cfg): ...
        def post_trainer_create(self, cfg, trainer): ...
        def post_train(self, cfg, model): ...

    base.BasePlugin = BasePlugin
    for name in ("axolotl", "axolotl.integrations"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "axolotl.integrations.base", base)
    monkeypatch.delitem(sys.modules, "fused_lce.integrations.axolotl", raising=False)
    yield BasePlugin
    sys.modules.pop("fused_lce.integrations.axolotl", None)


def test_plugin_patches_the_trainer(axolotl_stub, tmp_path, seed, driver_calls, caplog):
    plugin = load_plugin(PLUGIN)
    assert isinstance(plugin, axolotl_stub)
    module, name = plugin.get_input_args().rsplit(".", 1)  # the pydantic model axolotl merges into its config
    schema = getattr(importlib.import_module(module), name)
    assert schema(fused_lce_options={"z_loss": 0.0}).fused_lce_options == {"z_loss": 0.0}

    cfg = DictDefault(fused_lce_options={"tile_budget_mb": 64})
    with caplog.at_level(logging.WARNING, logger="fused_lce.integrations.axolotl"):
        plugin.pre_model_load(cfg)
    assert not caplog.records
    stock = tiny_qwen3(seed)
    fused = copy.deepcopy(stock)
    data = examples(seed)
    _, ref = run_trainer(stock, tmp_path / "stock", data)
    trainer = transformers.Trainer(model=fused, args=trainer_args(tmp_path / "fused"), train_dataset=data,
                                   data_collator=collate)
    plugin.post_trainer_create(cfg, trainer)
    assert fused_lce.is_patched(trainer)
    driver_calls.clear()
    out = trainer.train()
    assert [c.op for c in driver_calls] == ["loss", "loss"]  # one per micro-batch
    assert abs(out.training_loss - ref.training_loss) < 1e-5 * max(1.0, abs(ref.training_loss)), seed
    for (name, p), q in zip(fused.named_parameters(), stock.parameters()):
        torch.testing.assert_close(p, q, atol=2e-6, rtol=1e-5, msg=lambda m: f"seed={seed} {name}: {m}")


def test_plugin_warns_about_axolotls_own_fused_losses(axolotl_stub, caplog):
    plugin = load_plugin(PLUGIN)
    with caplog.at_level(logging.WARNING, logger="fused_lce.integrations.axolotl"):
        plugin.pre_model_load(DictDefault(cut_cross_entropy=True))
    assert "cut_cross_entropy" in caplog.text and "stays out" in caplog.text
