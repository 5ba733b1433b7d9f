"""fused_lce.patch under transformers.Trainer: gradient accumulation, evaluation with compute_metrics, LoRA,
bf16, label smoothing (routed into the fused loss by patch(trainer), warned about otherwise), and the
FUSED_LINEAR_CE=1 switch for scripts that are not edited (autopatch through the start-up hook; more in
../test_startup.py). TRL: ../test_trl.py."""
from __future__ import annotations

import copy
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import fused_lce  # noqa: E402
from fused_lce.integrations import hf  # noqa: E402

from ..conftest import record_driver_calls  # noqa: E402

V = 128


def tiny_qwen3(seed, tie=True):
    cfg = transformers.Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=64, tie_word_embeddings=tie, pad_token_id=0,
                                   bos_token_id=None, eos_token_id=1)
    torch.manual_seed(seed)
    return transformers.Qwen3ForCausalLM(cfg).float()


def examples(seed, n=8):
    """Chat-like rows of different lengths: a prompt (label -100) then a response."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        p, r = (int(x) for x in torch.randint(2, 7, (2,), generator=g))
        ids = torch.randint(2, V, (p + r,), generator=g).tolist() + [1]
        rows.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": [-100] * p + ids[p:]})
    return rows


def collate(rows):
    """Right padding like DataCollatorForSeq2Seq (labels padded with -100)."""
    t = max(len(r["input_ids"]) for r in rows)
    out = {k: [] for k in ("input_ids", "attention_mask", "labels")}
    for r in rows:
        pad = t - len(r["input_ids"])
        out["input_ids"].append(r["input_ids"] + [0] * pad)
        out["attention_mask"].append(r["attention_mask"] + [0] * pad)
        out["labels"].append(r["labels"] + [-100] * pad)
    return {k: torch.tensor(v) for k, v in out.items()}


def trainer_args(tmp_path, **kw):
    args = dict(output_dir=str(tmp_path), per_device_train_batch_size=2, per_device_eval_batch_size=4,
                gradient_accumulation_steps=2, max_steps=1, learning_rate=0.5, optim="sgd",
                lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0, use_cpu=True,
                report_to="none", save_strategy="no", logging_steps=1, seed=0, data_seed=0,
                dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True)
    args.update(kw)
    return transformers.TrainingArguments(**args)


def spy(monkeypatch):
    """Record every forward of the fused op from now on (the driver's view: see ../conftest.py)."""
    return record_driver_calls(monkeypatch.setattr)


def run_trainer(model, tmp_path, data, **kw):
    trainer = transformers.Trainer(model=model, args=trainer_args(tmp_path, **kw), train_dataset=data,
                                   data_collator=collate)
    result = trainer.train()
    return trainer, result


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_trainer_grad_accumulation_step_equals_stock(lora, tmp_path, seed, monkeypatch):
    stock = tiny_qwen3(seed)
    fused = copy.deepcopy(stock)
    if lora:
        peft = pytest.importorskip("peft")
        cfg = dict(r=32, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                   "down_proj"])
        torch.manual_seed(seed)
        stock = peft.get_peft_model(stock, peft.LoraConfig(**cfg))
        torch.manual_seed(seed)
        fused = peft.get_peft_model(fused, peft.LoraConfig(**cfg))
        for p in stock.parameters():
            if p.requires_grad:
                torch.nn.init.normal_(p, std=0.05)
        fused.load_state_dict(stock.state_dict())
    fused_lce.patch(fused)
    before = {n: p.detach().clone() for n, p in stock.named_parameters()}
    data = examples(seed)
    _, ref = run_trainer(stock, tmp_path / "stock", data)
    calls = spy(monkeypatch)
    trainer, out = run_trainer(fused, tmp_path / "fused", data)

    # the fused path ran once per micro-batch, with Trainer's token count of the whole accumulated batch
    assert len(calls) == 2, calls
    assert all(c.num_items is not None for c in calls) and int(calls[0].num_items) == int(calls[1].num_items)
    assert trainer.model_accepts_loss_kwargs
    assert abs(out.training_loss - ref.training_loss) < 1e-5 * max(1.0, abs(ref.training_loss)), seed
    moved = 0
    stock_params = dict(stock.named_parameters())
    for n, p in fused.named_parameters():
        torch.testing.assert_close(p, stock_params[n], atol=2e-6, rtol=1e-5,
                                   msg=lambda m: f"seed={seed}: {n}: {m}")
        moved += int(not torch.equal(p, before[n]))
    assert moved > 0


def test_trainer_bf16_autocast_keeps_the_patch(tmp_path, seed, monkeypatch):
    """bf16=True makes accelerate re-wrap model.forward (autocast); the fused path must still run."""
    stock = tiny_qwen3(seed)
    fused = fused_lce.patch(copy.deepcopy(stock))
    data = examples(seed)
    _, ref = run_trainer(stock, tmp_path / "stock", data, bf16=True)
    calls = spy(monkeypatch)
    trainer, out = run_trainer(fused, tmp_path / "fused", data, bf16=True)
    assert len(calls) == 2
    # accelerate wrapped the patched forward in its autocast wrapper
    assert getattr(fused.forward, "func", None) is not hf.runtime._instance_forward
    # same bf16 logits; the stock loss rounds them to bf16 before its fp32 softmax, the fused one does not
    assert abs(out.training_loss - ref.training_loss) < 2e-2 * abs(ref.training_loss)
    fused_lce.unpatch(fused)  # under accelerate's wrapper: our layer becomes a pass-through
    assert not hf.is_patched(fused)
    assert fused(**collate(data[:2])).logits is not None


def test_trainer_evaluate_returns_logits_for_compute_metrics(tmp_path, seed):
    stock = tiny_qwen3(seed)
    fused = fused_lce.patch(copy.deepcopy(stock))
    seen = []

    def compute_metrics(pred):
        seen.append(pred.predictions.shape)
        labels = pred.label_ids[:, 1:]
        hit = (pred.predictions.argmax(-1)[:, :-1] == labels)[labels != -100]
        return {"acc": float(hit.mean())}

    metrics = []
    for model in (stock, fused):
        trainer = transformers.Trainer(model=model, args=trainer_args(tmp_path), eval_dataset=examples(seed),
                                       data_collator=collate, compute_metrics=compute_metrics)
        metrics.append(trainer.evaluate())
    assert len(seen) == 2 and seen[0] == seen[1] and seen[0][-1] == V
    assert metrics[0]["eval_acc"] == metrics[1]["eval_acc"]
    assert abs(metrics[0]["eval_loss"] - metrics[1]["eval_loss"]) < 1e-5


def _smoothing_pair(seed):
    stock = tiny_qwen3(seed, tie=False)
    return stock, copy.deepcopy(stock)


def test_trainer_label_smoothing_routed_by_patch_trainer(tmp_path, seed, monkeypatch):
    """patch(trainer) moves label_smoothing_factor into the fused loss: the same parameters after a step with
    gradient accumulation, the same training and eval loss as Trainer's LabelSmoother on full logits."""
    stock, fused = _smoothing_pair(seed)
    data = examples(seed)
    kw = dict(label_smoothing_factor=0.1)
    ref_trainer, ref = run_trainer(stock, tmp_path / "stock", data, **kw)
    trainer = transformers.Trainer(model=fused, args=trainer_args(tmp_path / "fused", **kw),
                                   train_dataset=data, eval_dataset=data, data_collator=collate)
    fused_lce.patch(trainer)
    assert trainer.label_smoother is None and fused_lce.is_patched(fused) and fused_lce.is_patched(trainer)
    calls = spy(monkeypatch)
    out = trainer.train()
    assert len(calls) == 2, calls  # one fused call per micro-batch
    assert abs(out.training_loss - ref.training_loss) < 1e-5 * abs(ref.training_loss), seed
    stock_params = dict(stock.named_parameters())
    for n, p in fused.named_parameters():
        torch.testing.assert_close(p, stock_params[n], atol=2e-6, rtol=1e-5,
                                   msg=lambda m: f"seed={seed} {n}: {m}")
    # eval: real logits for compute_metrics, and the smoothed loss as the stock LabelSmoother computes it
    ref_eval = transformers.Trainer(model=stock, args=trainer_args(tmp_path / "stock", **kw),
                                    eval_dataset=data, data_collator=collate).evaluate()
    calls.clear()
    got = trainer.evaluate()
    assert calls and abs(got["eval_loss"] - ref_eval["eval_loss"]) < 1e-5 * ref_eval["eval_loss"], seed
    unsmoothed = transformers.Trainer(model=stock, args=trainer_args(tmp_path / "stock"), eval_dataset=data,
                                      data_collator=collate).evaluate()
    assert abs(unsmoothed["eval_loss"] - got["eval_loss"]) > 1e-3  # the smoothing is in the eval loss
    fused_lce.unpatch(trainer)
    assert trainer.label_smoother is not None and not fused_lce.is_patched(fused)


def test_trainer_label_smoothing_on_a_patched_model_warns(tmp_path, seed, monkeypatch):
    """patch(model) alone cannot see Trainer's label smoother, which takes the labels away from the model: the
    model warns (once) that a training-mode call came without labels; the loss is the stock one."""
    stock, fused = _smoothing_pair(seed)
    fused_lce.patch(fused)
    data = examples(seed)
    _, ref = run_trainer(stock, tmp_path / "stock", data, label_smoothing_factor=0.1)
    calls = spy(monkeypatch)
    with pytest.warns(UserWarning, match="training-mode forward without labels") as record:
        _, out = run_trainer(fused, tmp_path / "fused", data, label_smoothing_factor=0.1)
    assert sum("without labels" in str(w.message) for w in record) == 1
    assert calls == [] and out.training_loss == ref.training_loss


USER_SCRIPT = '''
"""An unedited training script: it never mentions fused_lce (the lines marked PROBE only observe)."""
import json, sys, warnings
import torch, transformers
sys.path.insert(0, sys.argv[2])
from tests.integrations.hf.test_trainer import tiny_qwen3, examples, collate, trainer_args
from tests.integrations.conftest import record_driver_calls  # PROBE: count the fused op's calls

calls = record_driver_calls(setattr)  # PROBE
seed = int(sys.argv[1])
model = tiny_qwen3(seed)
trainer = transformers.Trainer(model=model, args=trainer_args(sys.argv[3]), train_dataset=examples(seed),
                               data_collator=collate)
result = trainer.train()
from fused_lce.integrations import hf  # PROBE
# patch() validates its options with one call (num_items None); training calls carry Trainer's token count
print(json.dumps({"loss": result.training_loss, "calls": sum(c.num_items is not None for c in calls),
                  "patched": bool(hf.is_patched(model)), "options": hf.runtime.options_of(model),
                  "params": [float(p.double().sum()) for p in model.parameters()]}))
'''


def test_env_switch_alone_patches_an_unedited_script(tmp_path, seed):
    """FUSED_LINEAR_CE=1 and nothing else (the start-up hook pip installed in site-packages arms autopatch): a
    Trainer script that never mentions fused_lce trains with it (one fused call per micro-batch) and matches
    stock training."""
    import json
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"FUSED_LINEAR_CE": "1", "FUSED_LINEAR_CE_OPTIONS": "tile_budget_mb=64, log_entropy=false",
                "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    run = subprocess.run([sys.executable, str(script), str(seed), root, str(tmp_path / "out")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["patched"] and got["calls"] == 2, got
    assert got["options"] == {"tile_budget_mb": 64, "log_entropy": False}

    stock = tiny_qwen3(seed)
    _, ref = run_trainer(stock, tmp_path / "stock", examples(seed))
    assert abs(got["loss"] - ref.training_loss) < 1e-5 * max(1.0, abs(ref.training_loss)), seed
    want = [float(p.double().sum()) for p in stock.parameters()]
    assert got["params"] == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_autopatch_off_by_default_and_env_options(monkeypatch):
    monkeypatch.delenv("FUSED_LINEAR_CE", raising=False)
    assert hf.autopatch() is False
    monkeypatch.setenv("FUSED_LINEAR_CE", "0")
    assert hf.autopatch() is False
    monkeypatch.setenv("FUSED_LINEAR_CE_OPTIONS",
                       "z_loss=1e-4,ignore_index=-1,backend=torch,log_entropy=off,")
    assert hf.env_options() == {"z_loss": 1e-4, "ignore_index": -1, "backend": "torch", "log_entropy": False}
    monkeypatch.setenv("FUSED_LINEAR_CE_OPTIONS", "z_loss")
    with pytest.raises(ValueError, match="FUSED_LINEAR_CE_OPTIONS"):
        hf.env_options()
    monkeypatch.setenv("FUSED_LINEAR_CE", "1")
    monkeypatch.setenv("FUSED_LINEAR_CE_OPTIONS", "bogus=1")
    with pytest.raises(TypeError, match="bogus"):
        hf.autopatch()  # before anything is wrapped
    assert not getattr(transformers.Trainer.__init__, "_fused_lce_autopatch", False)
