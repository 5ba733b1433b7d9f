"""``FUSED_LINEAR_CE=1 swift sft ...`` (ms-swift, unedited) with fused_lce pip-installed and nothing else: the
start-up hook patches ms-swift's trainer, fused_lce computes the loss (one fused call per micro-batch, counted
at the driver in the training process) and ms-swift's ``token_acc`` is logged from fused_lce's token accuracy;
loss, grad norm and token accuracy equal the stock run's.

ms-swift pins transformers < 5.20 and trl < 0.30, so it runs in an environment of its own, given by
``FUSED_LCE_SWIFT_PYTHON`` (its python, with ms-swift and a non-editable fused_lce installed); skipped without
it. ``.ci/run`` builds one (ms-swift 4.6 on top of this environment's packages) and runs this test;
``FUSED_LCE_CI_SWIFT=0`` leaves it out."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

SWIFT_PYTHON = os.environ.get("FUSED_LCE_SWIFT_PYTHON")
if not SWIFT_PYTHON:
    pytest.skip("FUSED_LCE_SWIFT_PYTHON is not set (an environment with ms-swift: see this "
                "module's docstring)",
                allow_module_level=True)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# builds a tiny tied-embedding Qwen3 (tokenizer trained on the data) and a chat dataset whose answers repeat
# one word, so that the random model's token accuracy is neither 0 nor 1
MAKE = """
import json, sys, pathlib, torch, transformers
sys.path.insert(0, sys.argv[2])
import sft_qwen as ex
out = pathlib.Path(sys.argv[1])
conv = ex.load_conversations(ex.HERE / "data" / "chat.jsonl")[:16]
conv = [c[:-1] + [{"role": "assistant", "content": " ".join([c[-1]["content"].split()[0]] * 12)}]
        for c in conv]
texts = ["".join(f"<|im_start|>{m['role']}\\n{m['content']}<|im_end|>\\n" for m in c) for c in conv]
fast = transformers.PreTrainedTokenizerFast(tokenizer_object=ex._local_tokenizer(texts),
                                            eos_token="<|im_end|>", pad_token="<|endoftext|>")
fast.chat_template = ex.CHATML
fast.save_pretrained(out / "model")
cfg = transformers.Qwen3Config(vocab_size=len(fast), hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                               max_position_embeddings=512, tie_word_embeddings=True,
                               eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                               bos_token_id=None)
torch.manual_seed(0)
transformers.Qwen3ForCausalLM(cfg).save_pretrained(out / "model")
with open(out / "data.jsonl", "w") as f:
    f.writelines(json.dumps({"messages": c}) + "\\n" for c in conv)
"""

# observes (never enables): counts the driver's forwards in every process of the run, written at exit
PROBE = """
import atexit, json, os, sys
calls = []
class _Count:
    def find_spec(self, name, path=None, target=None):
        if name != "fused_lce.core.driver":
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else finder.find_spec(name, path, target)
            if spec is not None:
                break
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            for fn in ("forward", "logprobs_forward"):
                real = getattr(module, fn)
                setattr(module, fn, lambda *a, _real=real, _fn=fn, **k: calls.append([_fn, list(a[0].shape)])
                        or _real(*a, **k))
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, _Count())
atexit.register(lambda: calls and open(os.environ["PROBE_OUT"], "a").write(json.dumps(calls) + "\\n"))
"""


def swift_sft(tmp_path, name, fused):
    out = tmp_path / name
    probe = tmp_path / "probe"
    probe.mkdir(exist_ok=True)
    (probe / "sitecustomize.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FUSED_LINEAR_CE", "PYTHONPATH"))}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(probe),
               PROBE_OUT=str(tmp_path / f"{name}.calls"))
    if fused:
        env["FUSED_LINEAR_CE"] = "1"
    swift = str(Path(SWIFT_PYTHON).parent / "swift")
    cmd = [swift, "sft", "--model", str(tmp_path / "model"), "--model_type", "qwen3", "--template",
           "qwen3_nothinking", "--use_hf", "true", "--dataset", str(tmp_path / "data.jsonl"),
           "--tuner_type", "lora", "--lora_rank", "8", "--target_modules", "all-linear", "--max_steps", "2",
           "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
           "--learning_rate", "1e-2", "--logging_steps", "1", "--save_strategy", "no", "--output_dir",
           str(out), "--torch_dtype", "float32", "--report_to", "none", "--dataloader_num_workers", "0",
           "--dataset_num_proc", "1", "--seed", "0"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (log,) = out.glob("*/logging.jsonl")
    steps = [d for d in map(json.loads, log.read_text().splitlines()) if "loss" in d]
    counts = tmp_path / f"{name}.calls"
    calls = ([c for line in counts.read_text().splitlines() for c in json.loads(line)] if counts.exists()
             else [])
    return steps, calls, run.stderr


def test_swift_sft_with_the_switch_alone(tmp_path):
    make = subprocess.run([SWIFT_PYTHON, "-c", MAKE, str(tmp_path), str(EXAMPLES)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert make.returncode == 0, make.stderr[-3000:]
    stock, stock_calls, _ = swift_sft(tmp_path, "stock", fused=False)
    fused, fused_calls, stderr = swift_sft(tmp_path, "fused", fused=True)
    assert stock_calls == []
    # one fused loss per micro-batch (2 steps x 2 accumulated micro-batches), besides the option checks'
    # probes (a 1 x 1 problem)
    assert [fn for fn, shape in fused_calls if shape != [1, 1]] == ["forward"] * 4, \
        (fused_calls, stderr[-2000:])
    assert len(fused) == len(stock) == 2
    for ref, out in zip(stock, fused):
        assert 0 < ref["token_acc"] < 1, ref  # the data tells a right accuracy from a wrong one
        for key in ("loss", "grad_norm", "token_acc"):
            assert out[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), (key, out, ref)
