"""TRL (>= 1.15 has the fused LM head; CI installs 1.16) on a patched model: SFTTrainer's fused-LM-head calls are
served by fused_lce (patch before or after building the trainer, with and without PEFT), with losses, token
accuracy and parameters equal to stock SFTTrainer; entropy logging runs on fused_lce.linear_logprobs (without it: TRL's
head runs, with one warning); heads fused_lce cannot serve exactly are left to TRL."""
from __future__ import annotations

import copy
import math
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trl.trainer import utils as trl_utils  # noqa: E402

import fused_lce  # noqa: E402
from fused_lce.integrations import hf  # noqa: E402

if not hasattr(trl_utils, "add_fused_lm_head"):
    pytest.skip(f"trl {trl.__version__} has no fused LM head: SFTTrainer calls model(**inputs), which the patch "
                "serves like any call with labels (test_hf_trainer.py)", allow_module_level=True)

V = 128
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_qwen3(seed):
    """Tied embeddings, so that repeated-token runs are often predicted right (a token accuracy strictly between 0
    and 1 tells a wrong count from a right one)."""
    cfg = transformers.Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=0,
                                   bos_token_id=None, eos_token_id=1)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.Qwen3ForCausalLM(cfg).float()


def rows(seed, n=8):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(6, 14, (1,), generator=g))
        ids = torch.randint(2, V, (length,), generator=g)
        ids[length // 2:] = ids[length // 2]  # a run of one token: next-token = current token
        out.append({"input_ids": ids.tolist() + [1]})
    return out


def tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<pad>", "<|im_end|>"] + [f"w{i}" for i in range(V - 2)]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>")


def sft_args(tmp_path, **kw):
    """SFTConfig's defaults (gradient checkpointing on) except bf16: fp32 unless asked (SFTConfig defaults to
    bf16=True, and CPU autocast rounds TRL's kernel and fused_lce differently)."""
    args = dict(output_dir=str(tmp_path), bf16=False, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                max_steps=2, learning_rate=0.5, optim="sgd", lr_scheduler_type="constant", weight_decay=0.0,
                max_grad_norm=0.0, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1,
                disable_tqdm=True, seed=0, data_seed=0, dataset_num_proc=None)
    args.update(kw)
    return trl.SFTConfig(**args)


def lora(model, seed):
    peft = pytest.importorskip("peft")
    torch.manual_seed(seed)
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=PROJ,
                                                       task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:  # LoRA B starts at 0: make the adapters matter
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


class Counts:
    """Calls of the fused op made by the patch, and of TRL's own chunked kernel."""

    def __init__(self, monkeypatch):
        self.fused, self.trl = [], []
        real, real_trl = hf.linear_cross_entropy, trl_utils._ChunkedLogProbFunction.apply
        monkeypatch.setattr(hf, "linear_cross_entropy",
                            lambda *a, **k: self.fused.append(k.get("reduction", "mean")) or real(*a, **k))
        monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply",
                            staticmethod(lambda *a: self.trl.append(1) or real_trl(*a)))


def run_sft(model, tmp_path, seed, patch=None, bf16=False, **options):
    """Train 2 optimizer steps (4 micro-batches); ``patch``: None, "before" or "after" building the trainer."""
    if patch == "before":
        fused_lce.patch(model, **options)
    trainer = trl.SFTTrainer(model=model, args=sft_args(tmp_path, bf16=bf16), processing_class=tokenizer(),
                             train_dataset=datasets.Dataset.from_list(rows(seed)))
    if patch == "after":
        fused_lce.patch(model, **options)
    status = fused_lce.is_patched(model)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h and "train_loss" not in h]
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return logs, params, status


@pytest.fixture(scope="module")
def stock_runs(tmp_path_factory):
    """Stock SFTTrainer (TRL's own fused head) with a fresh seed per test session: full fine-tuning in fp32, and
    the seed flow (LoRA on all projections, bf16 autocast, gradient checkpointing)."""
    seed = int.from_bytes(os.urandom(4), "little")
    runs = {"seed": seed}
    for kind in ("full", "lora"):
        model = tiny_qwen3(seed)
        if kind == "lora":
            model = lora(model, seed)
        runs[kind] = (copy.deepcopy(model),) + run_sft(model, tmp_path_factory.mktemp(kind), seed,
                                                       bf16=kind == "lora")[:2]
    return runs


def assert_same_training(stock, fused, seed, entropy="nan", bf16=False):
    (ref_logs, ref_params), (logs, params) = stock, fused
    # bf16: TRL's kernel and fused_lce round the bf16 logits' statistics differently (both accumulate in fp32)
    rel, atol, acc = (2e-3, 5e-4, 0.05) if bf16 else (1e-5, 2e-6, 0.0)
    assert len(logs) == len(ref_logs) == 2
    for ref, out in zip(ref_logs, logs):
        assert out["loss"] == pytest.approx(ref["loss"], rel=rel, abs=1e-6), seed
        assert out["mean_token_accuracy"] == pytest.approx(ref["mean_token_accuracy"], abs=acc), seed
        assert out["num_tokens"] == ref["num_tokens"]
        if entropy == "nan":
            assert math.isnan(out["entropy"])
        else:
            assert out["entropy"] == pytest.approx(ref["entropy"], rel=1e-5), seed
    assert 0 < ref_logs[0]["mean_token_accuracy"] < 1, "the data must tell a right accuracy from a wrong one"
    moved = 0
    for name, p in params.items():
        torch.testing.assert_close(p, ref_params[name], atol=atol, rtol=10 * rel,
                                   msg=lambda m: f"seed={seed} {name}: {m}")
        moved += 1
    assert moved == len(ref_params)


@pytest.mark.parametrize("kind,when", [("full", "before"), ("full", "after"), ("lora", "before")],
                         ids=["patch-before-trainer", "patch-after-trainer", "lora-patch-before-peft"])
def test_sft_trainer_runs_fused_lce(kind, when, stock_runs, tmp_path, monkeypatch):
    """log_entropy=False: fused_lce computes SFTTrainer's loss and token accuracy; entropy is logged as NaN."""
    seed = stock_runs["seed"]
    initial, ref_logs, ref_params = stock_runs[kind]
    counts = Counts(monkeypatch)
    if kind == "lora":  # the seed flow: patch the transformers model, then PEFT, then SFTTrainer
        base = tiny_qwen3(seed)
        fused_lce.patch(base, log_entropy=False)
        model = lora(base, seed)
        model.load_state_dict(initial.state_dict())
        counts.fused.clear()  # patching validates the options with one tiny call
        logs, params, status = run_sft(model, tmp_path, seed, bf16=True)
    else:
        counts.fused.clear()
        logs, params, status = run_sft(copy.deepcopy(initial), tmp_path, seed, patch=when, log_entropy=False)
        counts.fused.remove("mean")  # the option probe of patch()
    assert status and "served by fused_lce" in status.reason, status
    # one fused call per micro-batch (per-token log-probs with the token accuracy), none of TRL's kernel
    assert counts.fused == ["none"] * 4 and counts.trl == [], (counts.fused, counts.trl)
    assert_same_training((ref_logs, ref_params), (logs, params), seed, bf16=kind == "lora")


def test_sft_trainer_entropy_needs_linear_logprobs(stock_runs, tmp_path, monkeypatch):
    """Default options without fused_lce.linear_logprobs (an older fused_lce, simulated): SFTTrainer logs the
    entropy, so TRL's own head runs (stock-identical training), with exactly one warning, and is_patched says why."""
    monkeypatch.delattr(fused_lce, "linear_logprobs")
    assert hf._linear_logprobs() is None
    seed = stock_runs["seed"]
    initial, ref_logs, ref_params = stock_runs["full"]
    counts = Counts(monkeypatch)
    with pytest.warns(UserWarning, match="linear_logprobs") as record:
        logs, params, status = run_sft(copy.deepcopy(initial), tmp_path, seed, patch="before")
    assert sum("linear_logprobs" in str(w.message) for w in record) == 1
    assert not status and "linear_logprobs" in status.reason and "log_entropy=False" in status.reason
    assert counts.fused == ["mean"] and len(counts.trl) == 4  # only patch()'s option probe
    assert_same_training((ref_logs, ref_params), (logs, params), seed, entropy="stock")


@pytest.mark.parametrize("when", ["before", "after"])
def test_sft_trainer_entropy_from_linear_logprobs(stock_runs, tmp_path, monkeypatch, when):
    """Default options (entropy logged): SFTTrainer's calls are served by fused_lce.linear_logprobs (per-token
    log-probs and entropy, no logits), patched before or after building the trainer; losses, logged entropy and
    parameters equal stock SFTTrainer's."""
    assert hf._linear_logprobs() is fused_lce.linear_logprobs
    seed = stock_runs["seed"]
    initial, ref_logs, ref_params = stock_runs["full"]
    counts = Counts(monkeypatch)
    served, real = [], fused_lce.linear_logprobs
    monkeypatch.setattr(fused_lce, "linear_logprobs", lambda *a, **k: served.append(k) or real(*a, **k))
    logs, params, status = run_sft(copy.deepcopy(initial), tmp_path, seed, patch=when)
    assert status, status
    assert len(served) == 4 and all(k["return_entropy"] and k["ignore_index"] == -100 for k in served)
    # the token-accuracy count still comes from the fused op (a no-grad pass; see docs/hf.md)
    assert counts.fused == ["mean"] + ["sum"] * 4 and counts.trl == []
    assert_same_training((ref_logs, ref_params), (logs, params), seed, entropy="stock")


def _labels(seed, b=2, t=10):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, V, (b, t), generator=g)
    labels = ids.clone()
    labels[:, :3] = -100
    labels[-1, -2:] = -100
    return ids, labels


@pytest.mark.parametrize("shift", [False, True], ids=["labels", "shift_labels"])
def test_grpo_style_head_with_temperature_is_served(shift, seed, monkeypatch):
    """A head with a temperature and only log-probs (what GRPO asks for, minus the entropy): fused_lce's per-token
    log-probs, loss and gradients equal TRL's own kernel's."""
    stock, fused = tiny_qwen3(seed).train(), tiny_qwen3(seed).train()
    for m in (stock, fused):
        trl_utils.add_fused_lm_head(m, temperature=0.7, outputs=("log_probs",))
    fused_lce.patch(fused)
    counts = Counts(monkeypatch)
    ids, labels = _labels(seed)
    kw = {"labels": labels}
    if shift:
        kw = {"shift_labels": torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)}
    ref = stock(input_ids=ids, fused_lm_head=True, **kw)
    out = fused(input_ids=ids, fused_lm_head=True, **kw)
    assert counts.fused == ["none"] and len(counts.trl) == 1
    assert type(out) is type(ref) and out.log_probs.shape == ref.log_probs.shape
    torch.testing.assert_close(out.log_probs, ref.log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-5)
    assert torch.equal(out.label_mask, ref.label_mask)
    ref.log_probs.sum().backward()
    out.log_probs.sum().backward()
    for (name, p), q in zip(stock.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"seed={seed} {name}: {m}")


def test_unservable_head_is_left_to_trl_with_a_warning(seed, monkeypatch):
    """DPO/KTO-style outputs (mean_logits) are not computed by fused_lce: TRL's head runs, once-warned."""
    model = tiny_qwen3(seed).train()
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "mean_logits"))
    fused_lce.patch(model)
    counts = Counts(monkeypatch)
    ids, labels = _labels(seed)
    with pytest.warns(UserWarning, match="mean_logits"):
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    assert out.mean_logits is not None and counts.fused == [] and len(counts.trl) == 1
    status = fused_lce.is_patched(model)
    assert not status and "mean_logits" in status.reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model
        model(input_ids=ids, labels=labels, fused_lm_head=True)
    out = model(input_ids=ids, labels=labels)  # a plain call is still fused
    assert out.logits is None and counts.fused == ["mean"]


def test_sft_trainer_label_smoothing_warns(tmp_path, seed):
    """SFTTrainer computes a label-smoothed loss from full logits itself: patch(trainer) says so."""
    model = tiny_qwen3(seed)
    trainer = trl.SFTTrainer(model=model, args=sft_args(tmp_path, label_smoothing_factor=0.1),
                             processing_class=tokenizer(), train_dataset=datasets.Dataset.from_list(rows(seed)))
    with pytest.warns(UserWarning, match="label_smoothing_factor=0.1.*SFTTrainer overrides compute_loss"):
        fused_lce.patch(trainer, log_entropy=False)
    assert trainer.label_smoother is not None and fused_lce.is_patched(model)
