"""fused_lce.patch under transformers.Trainer (gradient accumulation, evaluation with compute_metrics, LoRA) and
TRL's SFTTrainer (which path computes the training loss)."""
from __future__ import annotations

import copy
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import fused_lce  # noqa: E402
from fused_lce.integrations import hf  # noqa: E402

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
                lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0, use_cpu=True, report_to="none",
                save_strategy="no", logging_steps=1, seed=0, data_seed=0, dataloader_num_workers=0,
                remove_unused_columns=False, disable_tqdm=True)
    args.update(kw)
    return transformers.TrainingArguments(**args)


def spy(monkeypatch):
    """Record every call of the fused op made by the patch (and the num_items it received)."""
    calls = []
    real = hf.linear_cross_entropy

    def wrapper(*args, **kwargs):
        calls.append(kwargs.get("num_items"))
        return real(*args, **kwargs)

    monkeypatch.setattr(hf, "linear_cross_entropy", wrapper)
    return calls


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
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
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
    assert all(c is not None for c in calls) and int(calls[0]) == int(calls[1])
    assert trainer.model_accepts_loss_kwargs
    assert abs(out.training_loss - ref.training_loss) < 1e-5 * max(1.0, abs(ref.training_loss)), seed
    moved = 0
    stock_params = dict(stock.named_parameters())
    for n, p in fused.named_parameters():
        torch.testing.assert_close(p, stock_params[n], atol=2e-6, rtol=1e-5, msg=lambda m: f"seed={seed}: {n}: {m}")
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
    # accelerate wrapped our forward in its autocast wrapper
    assert not getattr(fused.forward.__func__, "_fused_lce_patched", False)
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


def _chat_tokenizer():
    """A tiny word-level tokenizer with the ChatML special tokens, built offline."""
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<pad>", "<|im_end|>", "<|im_start|>"] + [f"w{i}" for i in range(V - 3)]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>")
    return fast


def test_trl_sft_trainer_which_path_runs(tmp_path, seed, monkeypatch):
    """TRL >= 1.16's SFTTrainer installs its own fused LM head (trl.trainer.utils.add_fused_lm_head) and calls
    ``model(..., fused_lm_head=True)``: the training loss is computed by TRL's chunked log-prob function from
    ``lm_head.weight``, and our patched forward is bypassed. This test proves which path ran."""
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from trl.trainer import utils as trl_utils

    if not hasattr(trl_utils, "add_fused_lm_head"):
        pytest.skip(f"trl {trl.__version__} has no fused LM head: SFTTrainer calls model(**inputs), so the patch runs")
    model = fused_lce.patch(tiny_qwen3(seed))
    rows = [{"input_ids": r["input_ids"]} for r in examples(seed)]
    chunked = []
    real_apply = trl_utils._ChunkedLogProbFunction.apply
    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply",
                        staticmethod(lambda *a: chunked.append(1) or real_apply(*a)))
    ours = spy(monkeypatch)
    args = trl.SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, use_cpu=True,
                         report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
                         dataset_num_proc=None)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                             processing_class=_chat_tokenizer())
    trainer.train()
    assert len(chunked) >= 1 and ours == [], (len(chunked), ours)  # TRL's head ran, ours did not
    # TRL kept our patched forward as the one it falls back to: a plain call with labels in training is fused
    batch = collate(examples(seed, n=2))
    out = trainer.model(**batch)
    assert out.logits is None and len(ours) == 1
