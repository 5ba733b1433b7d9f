"""A whole training step of Hugging Face Qwen models -- forward, loss, backward, optimizer step -- with the
stock loss, ``fused_lce.patch``, Liger-Kernel's patch and cut-cross-entropy's patch side by side: tokens/s and
peak memory at a few sequence lengths, the loss, and the longest sequence that fits on the device.

Models are built from configs written below with random weights (nothing is downloaded): bf16, gradient
checkpointing on, batch 1, sdpa attention, one device. The optimizer is AdamW (fused on CUDA) with its state
in the parameters' dtype: bf16 parameters, gradients and two moments take 8 bytes per parameter (61 GB for
Qwen2.5-7B), where fp32 master weights and moments (16 bytes, 122 GB) would leave a 141 GB card no room for
activations.

Methods (every one starts from the same weights, a fresh optimizer and the same steps on the same tokens):
  stock      transformers' own loss (full logits, upcast to float32)
  fused_lce  fused_lce.patch(model)
  liger      liger_kernel's apply_liger_kernel_to_qwen2/3(model=...) with only the fused linear cross-entropy
             on (rope, rms_norm, swiglu off: only the loss differs from stock); its kernels need CUDA (or
             Triton's CPU interpreter, TRITON_INTERPRET=1)
  cce        cut_cross_entropy.transformers.cce_patch(model) (impl "cce"; "torch_compile" off CUDA)
A method that is not installed or cannot run here is recorded as skipped with the reason. Each patch is undone
after its method (fused_lce.unpatch; Liger's and CCE's instance forward removed) and the modeling module is
checked to be unchanged; a method that changed it stops the model's remaining methods.

Per (model, method): two steps at the first length (the loss before and after one optimizer step), then at
each length one untimed step and --steps timed ones (synchronised; tokens/s from their mean; peak =
torch.cuda.max_memory_allocated over the timed steps, reset before them). Once every method has run its
lengths, each searches the longest length that fits (multiples of --granularity up to --cap): the peaks
measured give a line whose crossing of the free memory is probed first, then the bracket is grown
geometrically and bisected; an out-of-memory step is caught, its memory freed and the peak statistics reset.
"> cap" when the cap fits. With --time-limit, each model's searches get a part of the time left proportional
to its parameters, shared equally by its methods (at most --search-limit seconds each); a step is started
only if its predicted time fits.
--grpo MODEL adds a GRPO-shaped step on that model: a no-grad reference pass and the policy's forward+backward
with per-token log-probs (fused_lce.linear_logprobs against log_softmax + gather of the full logits), a
clipped-ratio loss with a KL term, and the optimizer step.

Writes <stem>.json and <stem>.md into --out (default benchmarks/results, stem e2e) after every model, and
<stem>.png at the end. Partial runs (e.g. one model per invocation) merge into one result: --merge a.json
b.json.

    python benchmarks/e2e.py --models qwen2.5-7b --time-limit 500 --out DIR --stem e2e_7b
    python benchmarks/e2e.py --merge DIR1/e2e_7b.json DIR2/e2e_small.json --out benchmarks/results
    python benchmarks/e2e.py --device cpu --dtype float32 --models tiny-qwen2 --lengths 64,128 --cap 256 \\
        --granularity 64 --out /tmp/e2e        # the harness on CPU (what tests/benchmarks/test_e2e.py runs)
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from fused_lce.tools.bench import environment, is_oom  # noqa: E402 - CUDA's and the CPU's out of memory

GIB = 2**30
# name -> (model_type, config fields). Dimensions of the released models' config.json; rope_theta as released.
MODELS = {
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                   tie_word_embeddings=True, rope_theta=1e6)),
    "qwen2.5-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                   tie_word_embeddings=True, rope_theta=1e6)),
    "qwen3-4b": ("qwen3", dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                               tie_word_embeddings=True, rope_theta=1e6)),
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                 tie_word_embeddings=False, rope_theta=1e6)),
    # Qwen3.5's 248320-token vocabulary on the Qwen3-1.7B body. transformers' qwen3_5 class has Gated DeltaNet
    # layers, which run as a per-chunk Python loop without flash-linear-attention (not on the GPU image): that
    # would time the fallback, not the loss, so the body here is Qwen3's (full attention).
    "qwen3-1.7b-vocab248k": ("qwen3", dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                           num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                           vocab_size=248320, tie_word_embeddings=True, rope_theta=1e6)),
    # for the harness test on CPU (not in the default set)
    "tiny-qwen2": ("qwen2", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                 tie_word_embeddings=True)),
    "tiny-qwen3": ("qwen3", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=1000,
                                 tie_word_embeddings=False)),
}
DEFAULT_MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen3-4b", "qwen2.5-7b", "qwen3-1.7b-vocab248k")
METHODS = ("stock", "fused_lce", "liger", "cce")
DEFAULT_LENGTHS = (4096, 8192, 16384, 32768)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


# ---------------------------------------------------------------------------------------------- models
def build_model(name: str, device, dtype, seed: int, max_len: int):
    """A randomly initialised causal LM of ``MODELS[name]`` on ``device``: training mode, gradient
    checkpointing."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, fields = MODELS[name]
    config = AutoConfig.for_model(model_type, max_position_embeddings=max(max_len, 32768), use_cache=False,
                                  **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()
    return model


def snapshot(model) -> dict:
    """The parameters and buffers on the CPU, to give every method the same starting weights."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def make_optimizer(model, lr: float):
    fused = next(model.parameters()).device.type == "cuda"
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=fused or None)


def tokens(n: int, vocab: int, device, seed: int = 0) -> torch.Tensor:
    """Deterministic random token ids, [1, n], the same for every method at a given length."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + n)
    return torch.randint(0, vocab, (1, n), generator=g).to(device)


# ---------------------------------------------------------------------------------------------- methods
def _version(dist: str):
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001 - not installed
        return None


def method_problem(name: str, model_type: str, device) -> "str | None":
    """Why ``name`` cannot run here (None: it can)."""
    if name in ("stock", "fused_lce"):
        return None
    if name == "liger":
        try:
            from liger_kernel.transformers import apply_liger_kernel_to_qwen2  # noqa: F401
        except Exception as e:  # noqa: BLE001 - any import failure is a reason to record
            return f"liger_kernel not importable: {type(e).__name__}: {e}"[:300]
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            return ("Liger's kernels are Triton kernels: they need a CUDA device (or Triton's CPU "
                    "interpreter, TRITON_INTERPRET=1)")
        if model_type not in ("qwen2", "qwen3"):
            return f"no Liger patch for model type {model_type}"
        return None
    if name == "cce":
        try:
            from cut_cross_entropy.transformers import cce_patch  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return (f"cut_cross_entropy.transformers.cce_patch not importable ({type(e).__name__}: {e}); the "
                    "PyPI releases (<= 25.1.1) have no transformers patch: install a build that has it")[:400]
        return None
    return f"unknown method {name!r}"


def apply_method(name: str, model) -> dict:
    """Patches ``model`` in place for ``name``; returns what was applied."""
    if name == "stock":
        return {}
    if name == "fused_lce":
        import fused_lce

        fused_lce.patch(model)
        return {"call": "fused_lce.patch(model)", "backend": "auto"}
    if name == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2, apply_liger_kernel_to_qwen3

        fn = {"qwen2": apply_liger_kernel_to_qwen2, "qwen3": apply_liger_kernel_to_qwen3}
        fn = fn[model.config.model_type]
        fn(rope=False, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=False, swiglu=False,
           model=model)
        return {"call": f"{fn.__name__}(fused_linear_cross_entropy=True, rope/rms_norm/swiglu=False, "
                        "model=model)"}
    if name == "cce":
        from cut_cross_entropy.transformers import cce_patch

        impl = "cce" if next(model.parameters()).device.type == "cuda" else "torch_compile"
        cce_patch(model, impl=impl)
        return {"call": f"cce_patch(model, impl={impl!r})"}
    raise ValueError(f"unknown method {name!r}")


def undo_method(name: str, model) -> None:
    if name == "fused_lce":
        import fused_lce

        fused_lce.unpatch(model)
    elif name in ("liger", "cce"):
        model.__dict__.pop("forward", None)  # both patch the instance: model.forward = MethodType(...)


def module_state(model) -> dict:
    """Identity of everything at the top of the model's modeling module and of its class' forward."""
    mod = sys.modules[type(model).__module__]
    state = {k: id(v) for k, v in vars(mod).items() if not k.startswith("__")}  # not __warningregistry__
    state["<class forward>"] = id(type(model).__dict__.get("forward"))
    state["<instance forward>"] = id(model.__dict__.get("forward"))
    return state


# ---------------------------------------------------------------------------------------------- steps
def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(model, opt, device):
    model.zero_grad(set_to_none=True)
    if opt is not None:
        opt.zero_grad(set_to_none=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def lm_step(model, opt, ids):
    """One training step: forward with labels (the model's loss), backward, optimizer step."""
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def timed(step, device, n_steps: int):
    """(losses, seconds per step, peak bytes) of ``n_steps`` synchronised calls of ``step``."""
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, times = [], []
    for _ in range(n_steps):
        t0 = time.perf_counter()
        losses.append(step())
        sync(device)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return [float(x) for x in losses], times, peak


def try_timed(step, device, n_steps: int):
    """``timed(...)``, or None if the device ran out of memory. The caller frees memory after this returns:
    inside the ``except`` block the traceback's frames still hold the step's tensors."""
    try:
        return timed(step, device, n_steps)
    except RuntimeError as e:
        if not is_oom(e):
            raise
    return None


def room_bytes(device) -> "int | None":
    """Bytes the caching allocator could hold in all: free device memory plus what it holds now."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device)


# ---------------------------------------------------------------------------------------------- search
def predicted_fit(points, room, granularity):
    """The largest multiple of ``granularity`` whose peak, on the line through the two longest measured
    (length, peak bytes) points, stays within ``room`` (None if it cannot be told)."""
    pts = sorted((n, p) for n, p in points if p is not None)
    if room is None or len(pts) < 2:
        return None
    (n0, p0), (n1, p1) = pts[-2], pts[-1]
    if n1 == n0 or p1 <= p0:
        return None
    slope = (p1 - p0) / (n1 - n0)
    n = int((room - p1) / slope) + n1
    return max(granularity, n // granularity * granularity)


def time_model(points):
    """t(n) = a n + b n^2 fitted to (length, seconds) points (b >= 0: attention is quadratic); None if < 2."""
    pts = sorted(points)
    if len(pts) < 2:
        return (lambda n: pts[0][1] * n / pts[0][0]) if pts else None
    (n0, t0), (n1, t1) = pts[-2], pts[-1]
    b = max(0.0, (t1 / n1 - t0 / n0) / (n1 - n0))
    a = max(0.0, t1 / n1 - b * n1)
    return lambda n: a * n + b * n * n


def longest_fit(fits, lo: int, hi, guess, cap: int, granularity: int, can_probe=None):
    """The longest length (a multiple of ``granularity``, <= ``cap``) for which ``fits(n)`` holds, given that
    ``lo`` fits (0: nothing known) and ``hi`` does not (None: unknown). A ``guess`` (a prediction) is probed
    first, then lengths at 1, 2, 4 ... granules above it while they fit (below it while they do not); without
    a guess the length doubles from ``lo``; once bracketed, the bracket is bisected.
    ``can_probe(n)`` returns why a probe at n must not start (a time limit), or None.
    Returns {"longest", "oom_at", "exact", "above_cap", "probes": [[n, fits], ...], "stopped"}."""
    g = granularity
    cap = cap // g * g
    probes, stopped, n, delta = [], None, guess, granularity
    predicted = guess is not None
    while lo < cap and (hi is None or hi - lo > g):
        if n is None or n <= lo or (hi is not None and n >= hi):
            n = (2 * lo if lo else g) if hi is None else lo + max(1, (hi - lo) // (2 * g)) * g
        n = max(lo + g, min(n, cap) // g * g)
        why = can_probe(n) if can_probe is not None else None
        if why:
            stopped = why
            break
        ok = bool(fits(n))
        probes.append([n, ok])
        if ok:
            lo, n = n, (None if hi is not None else (n + delta if predicted else 2 * n))
        else:
            hi, n = n, (n - delta if predicted and lo else None)
        delta *= 2
    return {"longest": lo, "oom_at": hi, "exact": hi is not None and hi - lo <= g, "above_cap": lo >= cap,
            "probes": probes, "stopped": stopped}


# ---------------------------------------------------------------------------------------------- one method
class Clock:
    """The run's time limit (--time-limit) and a method's search limit (--search-limit), in seconds."""

    def __init__(self, limit=None):
        self.start = time.perf_counter()
        self.limit = limit

    def left(self) -> float:
        return float("inf") if self.limit is None else self.limit - (time.perf_counter() - self.start)


@contextlib.contextmanager
def patched(model, name):
    """``model`` patched for method ``name`` inside the block (yields what was applied), unpatched after."""
    applied = apply_method(name, model)
    try:
        yield applied
    finally:
        undo_method(name, model)


def measure_lengths(model, name, init, args, device, clock):
    """(result, state for the search) of one method at the --lengths: the loss before and after one optimizer
    step, then tokens/s, peak and loss per length, from the initial weights and a fresh optimizer."""
    vocab = model.config.vocab_size
    res = {"status": "ok"}
    model.load_state_dict(init)
    opt = make_optimizer(model, args.lr)
    lengths, points, times = {}, [], []
    lo, hi = 0, None
    data = {}

    def step_at(n):
        if n not in data:
            data.clear()
            data[n] = tokens(n, vocab, device, args.seed)
        ids = data[n]
        return lambda: lm_step(model, opt, ids)

    try:
        with patched(model, name) as applied:
            res["applied"] = applied
            first = args.lengths[0]
            got = try_timed(step_at(first), device, 2)  # the loss before and after one step; a warm-up
            if got is None:
                free_memory(model, opt, device)
            else:
                res["loss_step1"], res["loss_after_step"] = got[0]
            for i, n in enumerate(args.lengths):
                if hi is not None:
                    lengths[n] = {"oom": True, "note": f"not run: {hi} tokens did not fit"}
                    continue
                predict = time_model(times)
                need = (predict(n) * (args.warmup + args.steps) * 1.2) if predict else 0.0
                if need > clock.left():
                    lengths[n] = {"skipped": f"time limit: {clock.left():.0f} s left, ~{need:.0f} s needed"}
                    continue
                warm = [] if (i == 0 and got is not None) else try_timed(step_at(n), device, args.warmup)
                timed_run = None if warm is None else try_timed(step_at(n), device, args.steps)
                if timed_run is None:
                    data.clear()
                    free_memory(model, opt, device)
                    lengths[n] = {"oom": True}
                    hi = n
                    continue
                warm = warm[0] if warm else []
                losses, secs, peak = timed_run
                row = {"tokens_per_s": n * len(secs) / sum(secs), "step_s": secs, "loss": (warm or losses)[0]}
                if peak is not None:
                    row["peak_gib"] = peak / GIB
                lengths[n] = row
                points.append((n, peak))
                times.append((n, sum(secs) / len(secs)))
                lo = max(lo, n)
    finally:
        data.clear()
        del opt
        free_memory(model, None, device)
    res["lengths"] = {str(n): r for n, r in lengths.items()}
    return res, {"points": points, "times": times, "lo": lo, "hi": hi}


def search_longest(model, name, args, device, clock, state, budget) -> dict:
    """The longest length that fits for one method (see ``longest_fit``), within ``budget`` seconds. A step at
    the longest measured length first allocates the optimizer's state, so every probe's peak includes it."""
    vocab = model.config.vocab_size
    opt = make_optimizer(model, args.lr)
    times, lo, hi = list(state["times"]), state["lo"], state["hi"]
    probes_peak, data = {}, {}
    start = time.perf_counter()

    def step_at(n):
        data.clear()
        data[n] = tokens(n, vocab, device, args.seed)
        ids = data[n]
        return lambda: lm_step(model, opt, ids)

    def fits(n):
        got = try_timed(step_at(n), device, 1)
        data.clear()
        free_memory(model, opt, device)
        if got is None:
            return False
        peak, secs = got[2], got[1][0]
        probes_peak[n] = {"peak_gib": None if peak is None else peak / GIB, "step_s": secs}
        times.append((n, secs))
        return True

    def can_probe(n):
        left = min(clock.left(), budget - (time.perf_counter() - start))
        predict = time_model(times)
        need = (predict(n) if predict else 0.0) * 1.3 + 5.0
        return None if need < left else f"time limit: {left:.0f} s left, a probe at {n} needs ~{need:.0f} s"

    try:
        with patched(model, name):
            if lo and try_timed(step_at(lo), device, 1) is None:  # the optimizer's state, allocated
                lo, hi = 0, lo
            data.clear()
            free_memory(model, opt, device)
            room = room_bytes(device)
            guess = predicted_fit(state["points"], None if room is None else room * 0.995, args.granularity)
            search = longest_fit(fits, lo, hi, guess, args.cap, args.granularity, can_probe)
    finally:
        data.clear()
        del opt
        free_memory(model, None, device)
    search.update(guess=guess, granularity=args.granularity, room_gib=None if room is None else room / GIB,
                  fitting_probes={str(n): v for n, v in probes_peak.items()},
                  budget_s=None if budget == float("inf") else budget,
                  seconds=time.perf_counter() - start)
    return search


# ---------------------------------------------------------------------------------------------- GRPO
def grpo_logprobs(kind, h, weight, targets, temperature):
    """Per-token log p(target) of ``h @ weight.T / temperature`` (0 where the target is -100)."""
    if kind == "fused_lce":
        import fused_lce

        return fused_lce.linear_logprobs(h, weight, targets, temperature=temperature)
    logits = F.linear(h, weight).float() / temperature
    lp = torch.log_softmax(logits, dim=-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return lp * (targets != -100)


def grpo_step(model, opt, ids, kind, temperature=1.0, beta=0.04, advantage=1.0, eps=0.2):
    """A GRPO-shaped step on one sequence: the first quarter is the prompt. A no-grad reference pass (the same
    weights, as with a frozen copy), the policy's forward + backward through per-token log-probs, the clipped
    ratio loss (old = current policy, as in GRPO's single-update case) with a k3 KL term, the optimizer step.
    Returns the mean log-prob of the completion tokens (the loss itself is -advantage whatever the
    log-probs)."""
    base, head = model.get_decoder(), model.get_output_embeddings()
    targets = ids[:, 1:].clone()
    targets[:, : ids.shape[1] // 4] = -100
    mask = (targets != -100).float()
    with torch.no_grad():
        h = base(input_ids=ids).last_hidden_state[:, :-1]
        ref = grpo_logprobs(kind, h, head.weight, targets, temperature)
        del h
    h = base(input_ids=ids).last_hidden_state[:, :-1]
    lp = grpo_logprobs(kind, h, head.weight, targets, temperature)
    ratio = torch.exp(lp - lp.detach())
    per_token = -torch.min(ratio * advantage, ratio.clamp(1 - eps, 1 + eps) * advantage)
    kl = torch.exp(ref - lp) - (ref - lp) - 1
    loss = ((per_token + beta * kl) * mask).sum() / mask.sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return (lp.detach() * mask).sum() / mask.sum()  # the loss is -advantage here (ratio 1, KL 0): report this


def measure_grpo(model, init, args, device, clock) -> dict:
    out = {"lengths": args.grpo_lengths, "methods": {}}
    vocab = model.config.vocab_size
    for kind in ("stock", "fused_lce"):
        model.load_state_dict(init)
        opt = make_optimizer(model, args.lr)
        res = {}
        try:
            for i, n in enumerate(args.grpo_lengths):
                if clock.left() < 20:
                    res[str(n)] = {"skipped": "the run's time limit"}
                    continue
                ids = tokens(n, vocab, device, args.seed + 1)
                step = lambda: grpo_step(model, opt, ids, kind)  # noqa: E731
                warm = try_timed(step, device, 2 if i == 0 else args.warmup)
                got = None if warm is None else try_timed(step, device, args.steps)
                if got is None:
                    del ids, step
                    free_memory(model, opt, device)
                    res[str(n)] = {"oom": True}
                    break
                warm = warm[0]
                losses, secs, peak = got
                row = {"tokens_per_s": n * len(secs) / sum(secs), "step_s": secs, "mean_logprob": warm[0]}
                if i == 0:
                    row["mean_logprob_after_step"] = warm[1]
                if peak is not None:
                    row["peak_gib"] = peak / GIB
                res[str(n)] = row
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            res["error"] = f"{type(e).__name__}: {e}"[:500]
        finally:
            del opt
            free_memory(model, None, device)
        out["methods"][kind] = res
    return out


# ---------------------------------------------------------------------------------------------- one model
def n_params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def run_model(name, methods, args, device, dtype, clock, share) -> dict:
    """Every method's lengths, then their searches within ``share`` (this model's part of the run's time)."""
    entry = {"model_type": MODELS[name][0], "config": MODELS[name][1], "methods": {}}
    t0 = time.perf_counter()
    model = build_model(name, device, dtype, args.seed, args.cap)
    init = snapshot(model)
    entry["build_s"] = time.perf_counter() - t0
    entry["params"] = n_params(model)
    if device.type == "cuda":
        entry["static_gib"] = torch.cuda.memory_allocated(device) / GIB
    baseline = module_state(model)
    broken = None
    states = {}

    def undone(method, res):
        nonlocal broken
        changed = sorted(k for k, v in module_state(model).items() if baseline.get(k) != v)
        if changed and not broken:
            broken = f"{method}'s patch could not be undone (changed: {', '.join(changed[:5])})"
            res["undo"] = broken

    for method in methods:  # the lengths of every method first, then the searches share the time left
        why = method_problem(method, entry["model_type"], device)
        if why is None and broken:
            why = f"not run: {broken}"
        if why is None and clock.left() <= 0:
            why = "not run: the run's time limit was reached"
        if why:
            entry["methods"][method] = {"status": "skipped", "reason": why}
            print(f"[e2e] {name} {method}: skipped: {why}", flush=True)
            continue
        t1 = time.perf_counter()
        try:
            res, states[method] = measure_lengths(model, method, init, args, device, clock)
        except Exception as e:  # noqa: BLE001 - recorded, the other methods go on
            res = {"status": "error", "reason": f"{type(e).__name__}: {e}"[:800]}
            free_memory(model, None, device)
        res["seconds"] = time.perf_counter() - t1
        undone(method, res)
        entry["methods"][method] = res
        print(f"[e2e] {name} {method}: {summary_line(res)} ({res['seconds']:.0f} s)", flush=True)
    searched = [] if args.no_search or broken else list(states)
    if broken and not args.no_search:
        entry["search_skipped"] = broken
    for k, method in enumerate(searched):
        res = entry["methods"][method]
        budget = min(clock.left(), share.left()) / (len(searched) - k)
        if args.search_limit is not None:
            budget = min(budget, args.search_limit)
        try:
            res["longest"] = search_longest(model, method, args, device, clock, states[method], budget)
        except Exception as e:  # noqa: BLE001
            res["search_error"] = f"{type(e).__name__}: {e}"[:800]
            free_memory(model, None, device)
        undone(method, res)
        if "longest" in res:
            print(f"[e2e] {name} {method}: longest {longest_text(res['longest'])} "
                  f"({res['longest']['seconds']:.0f} s)", flush=True)
    if args.grpo == name:
        if clock.left() > 0:
            entry["grpo"] = measure_grpo(model, init, args, device, clock)
        else:
            entry["grpo"] = {"skipped": "the run's time limit was reached"}
    del model, init
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def summary_line(res) -> str:
    if res.get("status") != "ok":
        return f"{res.get('status')}: {res.get('reason', '')[:200]}"
    nan = float("nan")
    parts = [f"loss {res.get('loss_step1', nan):.5f} -> {res.get('loss_after_step', nan):.5f}"]
    for n, r in res.get("lengths", {}).items():
        gib = f" {r['peak_gib']:.1f} GiB" if "peak_gib" in r else ""
        parts.append(f"{n}: OOM" if r.get("oom") else f"{n}: {r['skipped']}" if "skipped" in r else
                     f"{n}: {r['tokens_per_s']:.0f} tok/s{gib}")
    return "; ".join(parts)


def longest_text(s) -> str:
    if s.get("above_cap"):
        return f"> cap ({s['longest']} fits)"
    if s.get("exact"):
        return str(s["longest"])
    return f">= {s['longest']}" + (f", < {s['oom_at']}" if s.get("oom_at") else "") + \
        (f" ({s['stopped']})" if s.get("stopped") else "")


# ---------------------------------------------------------------------------------------------- output
def versions() -> dict:
    import fused_lce

    out = {"fused_lce": fused_lce.__version__}
    for dist in ("torch", "transformers", "liger-kernel", "cut-cross-entropy", "triton"):
        out[dist] = _version(dist) or "not installed"
    return out


def write_outputs(data, out_dir, stem, png=True):
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, stem)
    with open(base + ".json", "w") as f:
        json.dump(data, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(data))
    if not png:
        return
    try:
        plot(data, base + ".png")
    except ImportError as e:  # matplotlib missing: the JSON and markdown still stand
        print(f"[e2e] no plot: {e}", file=sys.stderr)


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def _methods(data):
    seen = []
    for m in data["models"].values():
        seen += [k for k in m["methods"] if k not in seen]
    return sorted(seen, key=lambda k: METHODS.index(k) if k in METHODS else len(METHODS))


def markdown(data) -> str:
    runs = data["runs"]
    lines = ["# Whole training step: stock loss vs fused_lce vs Liger vs CCE", "",
             "Hugging Face Qwen models from configs with random weights, batch 1, gradient checkpointing, "
             "sdpa, AdamW (state in the parameters' dtype). One step = forward with labels, backward, "
             "optimizer step. Peak = torch.cuda.max_memory_allocated over the timed steps (weights, "
             "gradients and optimizer state included). Written by benchmarks/e2e.py.", ""]
    for r in runs:
        env, v = r["environment"], r["versions"]
        lines.append(f"- run: {env.get('gpu') or env.get('cpu', '')} ({env['device']}), "
                     f"capacity {_fmt(r.get('capacity_gib'), '.1f')} GiB, {r['dtype']}, "
                     f"commit {env.get('commit')}, "
                     f"{env.get('date')}; models {', '.join(r['models'])}; "
                     + ", ".join(f"{k} {val}" for k, val in v.items())
                     + f"; PYTORCH_CUDA_ALLOC_CONF={r.get('alloc_conf') or 'unset'}")
    methods = _methods(data)
    lines += ["", "## Longest sequence that fits (tokens, step of the search in parentheses)", "",
              "| model | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for name, m in data["models"].items():
        cells = []
        for k in methods:
            r = m["methods"].get(k, {})
            if r.get("status") != "ok":
                cells.append(r.get("status", "-"))
            elif "longest" not in r:
                cells.append("not searched")
            else:
                cells.append(longest_text(r["longest"]) + f" ({r['longest']['granularity']})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, m in data["models"].items():
        head = "tied" if m["config"].get("tie_word_embeddings") else "untied"
        lines += ["", f"## {name} ({m['params'] / 1e9:.2f} B parameters, vocabulary "
                  f"{m['config']['vocab_size']}, {head} head)", ""]
        lengths = sorted({int(n) for r in m["methods"].values() for n in r.get("lengths", {})})
        lines += ["| method | loss, step 1 | after one step (diff vs stock) | "
                  + " | ".join(f"{n // 1024}K tok/s, GiB" if n >= 1024 else f"{n} tok/s, GiB"
                               for n in lengths)
                  + " |", "|---|---|---|" + "---|" * len(lengths)]
        stock = m["methods"].get("stock", {})
        for k in methods:
            r = m["methods"].get(k)
            if r is None:
                continue
            if r.get("status") != "ok":
                lines.append(f"| {k} | {r.get('status')}: {r.get('reason', '')[:160]} |"
                             + " |" * (len(lengths) + 1))
                continue
            diff = (r["loss_after_step"] - stock["loss_after_step"]
                    if "loss_after_step" in r and "loss_after_step" in stock else None)
            cells = []
            for n in lengths:
                x = r.get("lengths", {}).get(str(n))
                cells.append("-" if x is None else "OOM" if x.get("oom") else
                             "time limit" if "skipped" in x else
                             f"{x['tokens_per_s']:.0f}, {_fmt(x.get('peak_gib'), '.1f')}")
            lines.append(f"| {k} | {_fmt(r.get('loss_step1'), '.5f')} | "
                         f"{_fmt(r.get('loss_after_step'), '.5f')} ({_fmt(diff, '+.1e')}) | "
                         + " | ".join(cells) + " |")
        g = m.get("grpo")
        if g and "methods" in g:
            lines += ["", f"GRPO-shaped step on {name} (reference pass without gradients + policy fwd+bwd "
                      "through per-token log-probs + optimizer step; tokens/s, peak GiB, mean completion "
                      "log-prob of the first step at that length):", "",
                      "| log-probs | " + " | ".join(str(n) for n in g["lengths"]) + " |",
                      "|---|" + "---|" * len(g["lengths"])]
            for kind, res in g["methods"].items():
                cells = []
                for n in g["lengths"]:
                    x = res.get(str(n))
                    cells.append("-" if x is None else "OOM" if x.get("oom") else
                                 "time limit" if "skipped" in x else
                                 f"{x['tokens_per_s']:.0f}, {_fmt(x.get('peak_gib'), '.1f')}, "
                                 f"{x['mean_logprob']:.5f}")
                label = "fused_lce.linear_logprobs" if kind == "fused_lce" else "log_softmax + gather"
                error = f" {res['error']}" if "error" in res else ""
                lines.append(f"| {label} | " + " | ".join(cells) + error + " |")
        elif g:
            lines += ["", f"GRPO-shaped step on {name}: {g}"]
    return "\n".join(lines) + "\n"


def plot(data, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    names = list(data["models"])
    cols = min(3, max(1, len(names)))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    caps = [r.get("capacity_gib") for r in data["runs"] if r.get("capacity_gib")]
    for ax, name in zip(axes.flat, names):
        m = data["models"][name]
        for k, r in m["methods"].items():
            measured = {**r.get("lengths", {}), **r.get("longest", {}).get("fitting_probes", {})}
            pts = {int(n): x["peak_gib"] for n, x in measured.items() if x.get("peak_gib") is not None}
            if not pts:
                continue
            xs = sorted(pts)
            line, = ax.plot([x / 1024 for x in xs], [pts[x] for x in xs], marker="o", ms=3, label=k)
            s = r.get("longest")
            if s and s.get("longest") in pts:
                ax.plot([s["longest"] / 1024], [pts[s["longest"]]], marker="*" if s.get("exact") else "^",
                        ms=11, color=line.get_color())
        if caps:
            ax.axhline(caps[0], color="k", ls="--", lw=1, label=f"card: {caps[0]:.0f} GiB")
        ax.set(title=name, xlabel="sequence length (K tokens)", ylabel="peak memory (GiB)")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no peak memory measured\n(CUDA only)", ha="center", va="center",
                    transform=ax.transAxes)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    dev = data["runs"][0]["environment"].get("gpu") or data["runs"][0]["environment"]["device"]
    fig.suptitle(f"Peak memory of a training step vs sequence length, {dev}\nstar: the longest that fits; "
                 "triangle: a lower bound (the cap of the search, or where its time ran out)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge(paths) -> dict:
    """One result from partial ones: runs concatenated, models and their methods united (a later file's
    entry for the same model and method replaces an earlier one)."""
    out = {"runs": [], "models": {}}
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        out["runs"] += d["runs"]
        for name, m in d["models"].items():
            if name in out["models"]:
                mine = out["models"][name]
                mine["methods"].update(m["methods"])
                if "grpo" in m:
                    mine["grpo"] = m["grpo"]
            else:
                out["models"][name] = m
    return out


# ---------------------------------------------------------------------------------------------- arguments
def _list(kind, choices=None):
    def parse(text):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma list of {kind}, got {text!r}")
        if kind == "lengths":
            try:
                items = [int(t) for t in items]
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}") from None
            if min(items) < 2:
                raise argparse.ArgumentTypeError(f"lengths must be >= 2, got {text!r}")
        elif choices is not None:
            bad = [t for t in items if t not in choices]
            if bad:
                raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
        return items
    return parse


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--models", type=_list("models", list(MODELS)), default=list(DEFAULT_MODELS),
                   help=f"comma list (default: {','.join(DEFAULT_MODELS)}; also tiny-qwen2, tiny-qwen3)")
    p.add_argument("--methods", type=_list("methods", METHODS), default=list(METHODS),
                   help=f"comma list (default: {','.join(METHODS)})")
    p.add_argument("--lengths", type=_list("lengths"), default=list(DEFAULT_LENGTHS),
                   help="sequence lengths timed (default: 4096,8192,16384,32768)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per length (default 2)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before them (default 1)")
    p.add_argument("--cap", type=int, default=131072, help="longest length searched (default 131072)")
    p.add_argument("--granularity", type=int, default=1024, help="step of the search (default 1024)")
    p.add_argument("--no-search", action="store_true", help="skip the longest-fit search")
    p.add_argument("--search-limit", type=float, default=None, help="seconds for one method's search")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds for the whole run, model builds included: no step is started that would "
                        "end after it")
    p.add_argument("--grpo", default=None, help="model for the GRPO-shaped step (default: none)")
    p.add_argument("--grpo-lengths", type=_list("lengths"), default=[8192, 16384])
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--stem", default="e2e", help="file names: <stem>.json/.md/.png (default e2e)")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="merge partial results into --out/--stem, run nothing")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.merge:
        write_outputs(merge(args.merge), args.out, args.stem)
        print(f"[e2e] merged {len(args.merge)} files into {os.path.join(args.out, args.stem)}.json/.md/.png")
        return 0
    if args.grpo is not None and args.grpo not in MODELS:
        p.error(f"argument --grpo: unknown model {args.grpo!r}")
    if args.steps < 1 or args.warmup < 1 or args.granularity < 1 or args.cap < args.granularity:
        p.error("--steps, --warmup, --granularity must be >= 1 and --cap >= --granularity")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("argument --device: CUDA is not available here")
    args.lengths = sorted(set(args.lengths))
    clock = Clock(args.time_limit)
    run = {"environment": environment(device), "versions": versions(), "dtype": args.dtype,
           "models": list(args.models), "methods": list(args.methods), "lengths": args.lengths,
           "steps": args.steps, "warmup": args.warmup, "cap": args.cap, "granularity": args.granularity,
           "lr": args.lr, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    if device.type == "cuda":
        run["capacity_gib"] = torch.cuda.get_device_properties(device).total_memory / GIB
    data = {"runs": [run], "models": {}}
    print(f"[e2e] {run['environment'].get('gpu') or device} {run['versions']}", flush=True)
    names = list(args.models) + ([args.grpo] if args.grpo and args.grpo not in args.models else [])
    # each model's searches get a part of the time left proportional to its parameters (a probe's cost grows
    # with the model), what a model leaves unused passes to the next
    weight = {name: n_params(build_model(name, "meta", DTYPES[args.dtype], args.seed, args.cap))
              for name in names}
    for i, name in enumerate(names):
        methods = args.methods if name in args.models else []  # else only the GRPO step
        share = Clock(clock.left() * weight[name] / sum(weight[n] for n in names[i:]))
        if clock.left() < 30:  # not even a model build and a few steps
            data["models"][name] = {"model_type": MODELS[name][0], "config": MODELS[name][1], "params": 0,
                                    "methods": {k: {"status": "skipped", "reason": "the run's time limit"}
                                                for k in methods}}
        else:
            data["models"][name] = run_model(name, methods, args, device, DTYPES[args.dtype], clock, share)
        write_outputs(data, args.out, args.stem, png=False)  # what is done so far survives a kill
    run["seconds"] = time.perf_counter() - clock.start
    write_outputs(data, args.out, args.stem)
    print(f"[e2e] wrote {os.path.join(args.out, args.stem)}.json/.md/.png in {run['seconds']:.0f} s",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
