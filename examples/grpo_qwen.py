#!/usr/bin/env python
"""A GRPO policy-gradient step on a tiny random Qwen3 with fused per-token log-probs, against the logits path.

Part 1 ("compare"): the loss of GRPO / DAPO-style policy optimisation -- per-token ratio against the old
policy's log-probs, clipped surrogate with group-normalised advantages, a k3 KL penalty to a reference
policy's log-probs and an entropy bonus, averaged over the completion tokens -- computed twice on the same
random Qwen3 (no download):
  - fused:  hidden states of the backbone -> fused_lce.linear_logprobs(..., temperature, return_entropy=True);
  - logits: the model's logits / temperature -> log_softmax -> gather, entropy from the logits (what TRL's
            selective_log_softmax / entropy_from_logits do without a fused head).
It prints both losses and the largest relative difference of the gradients of every parameter, and exits 1 if
they do not match (fp32: 1e-5 on the loss, 1e-4 on the gradients).

Part 2 ("memory"): peak resident memory of the log-prob head alone, forward + backward of log-probs and
entropy, for a Qwen2.5-0.5B-shaped head (2048 tokens x 896 hidden x 151,936 vocabulary, float32) on CPU, fused
vs logits, each in its own subprocess (peak RSS minus the RSS once the inputs exist).

    python examples/grpo_qwen.py                         # both parts (the memory part takes about a minute)
    python examples/grpo_qwen.py --part compare --vocab-size 1024
    python examples/grpo_qwen.py --part memory --tokens 1024
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["all", "compare", "memory"], default="all")
    p.add_argument("--seed", type=int, default=0)
    # part 1: the tiny policy and its rollouts
    p.add_argument("--vocab-size", type=int, default=151936, help="model vocabulary (Qwen3: 151936)")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--prompts", type=int, default=2, help="prompts per batch")
    p.add_argument("--group", type=int, default=4, help="completions per prompt (GRPO group size)")
    p.add_argument("--prompt-len", type=int, default=12)
    p.add_argument("--completion-len", type=int, default=20)
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--clip", type=float, default=0.2, help="epsilon of the clipped ratio")
    p.add_argument("--beta", type=float, default=0.04,
                   help="weight of the KL penalty to the reference policy")
    p.add_argument("--entropy-coef", type=float, default=0.01)
    # part 2: the head shape
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--head-hidden", type=int, default=896)
    p.add_argument("--head-vocab", type=int, default=151936)
    p.add_argument("--backend", default="auto", help="fused_lce backend (default: auto)")
    p.add_argument("--one", choices=["fused", "logits"], help=argparse.SUPPRESS)  # a memory subprocess
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ the loss
def grpo_loss(logp, entropy, old_logp, ref_logp, adv, mask, args):
    """GRPO objective per completion token, averaged over the completion tokens of the batch (DAPO's
    token-level mean): -min(r A, clip(r, 1 - eps, 1 + eps) A) + beta * KL_k3(ref || policy) - entropy_coef *
    H."""
    ratio = torch.exp(logp - old_logp)
    surrogate = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - args.clip, 1 + args.clip) * adv)
    d = ref_logp - logp
    kl = torch.exp(d) - d - 1  # k3 estimator, >= 0
    per_token = surrogate + args.beta * kl - args.entropy_coef * entropy
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def logprobs_fused(model, input_ids, labels, args):
    """Per-token log-probs and entropy from the backbone's hidden states: the logits never exist."""
    import fused_lce

    hidden = model.model(input_ids=input_ids).last_hidden_state[:, :-1]  # position t predicts token t + 1
    return fused_lce.linear_logprobs(hidden, model.lm_head.weight, labels, temperature=args.temperature,
                                     return_entropy=True, backend=args.backend)


def logprobs_logits(model, input_ids, labels, args):
    """The same from the full logits, as a trainer without a fused head computes them."""
    logits = model(input_ids=input_ids).logits[:, :-1].float() / args.temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    valid = labels != -100
    logp = logp_all.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return torch.where(valid, logp, 0.0), torch.where(valid, entropy, 0.0)


# ------------------------------------------------------------------------------------------------ part 1
def tiny_qwen3(args):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                      intermediate_size=2 * args.hidden_size, num_hidden_layers=args.layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden_size // 4,
                      max_position_embeddings=512, tie_word_embeddings=False)
    return Qwen3ForCausalLM(cfg).float()


def perturbed(model, scale, gen):
    """A copy with every weight moved by ``scale`` x its own std (the old / reference policy)."""
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * (p.std() if p.numel() > 1 else 1.0))
    return other


def compare(args) -> dict:
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    policy = tiny_qwen3(args)
    old, ref = perturbed(policy, 0.6, gen), perturbed(policy, 0.1, gen)
    b, t = args.prompts * args.group, args.prompt_len + args.completion_len
    input_ids = torch.randint(0, args.vocab_size, (b, t), generator=gen)
    labels = input_ids[:, 1:].clone()
    labels[:, : args.prompt_len - 1] = -100  # score the completion tokens only
    lengths = torch.randint(args.completion_len // 2, args.completion_len + 1, (b,), generator=gen)
    pad = torch.arange(t - 1) >= (args.prompt_len - 1 + lengths)[:, None]  # completions of varying length
    labels[pad] = -100
    mask = (labels != -100).float()
    rewards = torch.rand(args.prompts, args.group, generator=gen)
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).reshape(b, 1)
    # rollout-time log-probs of the old and the reference policy (constants of the loss)
    with torch.no_grad():
        old_logp, _ = logprobs_fused(old, input_ids, labels, args)
        ref_logp, _ = logprobs_fused(ref, input_ids, labels, args)

    out = {}
    for name, fn in (("fused", logprobs_fused), ("logits", logprobs_logits)):
        policy.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        logp, ent = fn(policy, input_ids, labels, args)
        loss = grpo_loss(logp, ent, old_logp, ref_logp, adv, mask, args)
        loss.backward()
        out[name] = {"loss": float(loss.detach()), "seconds": time.perf_counter() - t0,
                     "grads": {n: p.grad.detach().clone() for n, p in policy.named_parameters()
                               if p.grad is not None}}
    f, l = out["fused"], out["logits"]
    assert f["grads"].keys() == l["grads"].keys()
    worst = max(((f["grads"][n] - l["grads"][n]).norm() / l["grads"][n].norm().clamp(min=1e-30)).item()
                for n in l["grads"])
    loss_diff = abs(f["loss"] - l["loss"])
    ok = loss_diff <= 1e-5 * max(1.0, abs(l["loss"])) and worst <= 1e-4
    with torch.no_grad():  # how much of the batch the clip acts on (the ratio's gradient is 0 there)
        r = torch.exp(logprobs_fused(policy, input_ids, labels, args)[0] - old_logp)
        clipped = float((((r < 1 - args.clip) | (r > 1 + args.clip)).float() * mask).sum() / mask.sum())
    print(f"GRPO step, tiny Qwen3 (V={args.vocab_size}, D={args.hidden_size}, {args.layers} layers), {b} "
          f"completions x {t} tokens, {int(mask.sum())} completion tokens, temperature {args.temperature}, "
          f"{100 * clipped:.0f}% of them outside the clip range")
    print(f"  loss fused  {f['loss']:.8f}   ({f['seconds']:.2f} s fwd+bwd)")
    print(f"  loss logits {l['loss']:.8f}   ({l['seconds']:.2f} s fwd+bwd)")
    print(f"  |loss diff| {loss_diff:.2e}, largest gradient rel. diff over {len(l['grads'])} parameters "
          f"{worst:.2e} -> {'MATCH' if ok else 'MISMATCH'}")
    return {"loss_fused": f["loss"], "loss_logits": l["loss"], "loss_diff": loss_diff, "grad_rel_diff": worst,
            "clipped_fraction": clipped, "ok": ok}


# ------------------------------------------------------------------------------------------------ part 2
def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm() -> int:
    """Peak RSS of this process image (VmHWM). Not ru_maxrss: a child started by subprocess inherits the
    parent's maximum RSS at the fork in ru_maxrss, which would count the parent's memory."""
    with open("/proc/self/status") as fh:
        return next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("VmHWM:"))


def _reset_hwm() -> None:
    """Start VmHWM afresh from the current RSS (Linux >= 4.0), so input generation does not count."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def memory_one(args) -> dict:
    """One path's head, forward + backward of log-probs and entropy, in this (fresh) process."""
    from fused_lce.tools.bench import make_inputs

    h, w, y = make_inputs(args.tokens, args.head_hidden, args.head_vocab, torch.float32, "cpu",
                          seed=args.seed)
    h.requires_grad_()
    w.requires_grad_()
    g_lp, g_ent = torch.randn(args.tokens), torch.randn(args.tokens)
    base = _rss()
    _reset_hwm()
    t0 = time.perf_counter()
    if args.one == "fused":
        import fused_lce

        logp, ent = fused_lce.linear_logprobs(h, w, y, temperature=args.temperature, return_entropy=True,
                                              backend=args.backend)
    else:
        logp_all = torch.log_softmax((h @ w.t()) / args.temperature, dim=-1)
        logp = torch.where(y != -100, logp_all.gather(-1, y.clamp(min=0)[:, None]).squeeze(-1), 0.0)
        ent = torch.where(y != -100, -(logp_all.exp() * logp_all).sum(-1), 0.0)
    ((logp * g_lp).sum() + (ent * g_ent).sum()).backward()
    sec = time.perf_counter() - t0
    peak = _hwm()
    return {"path": args.one, "seconds": sec, "peak_extra_mib": (peak - base) / 2**20,
            "logp_sum": float(logp.sum()), "entropy_sum": float(ent.sum())}


def memory(args) -> dict:
    rows = {}
    for path in ("fused", "logits"):
        cmd = [sys.executable, os.path.abspath(__file__), "--part", "memory", "--one", path, "--tokens",
               str(args.tokens), "--head-hidden", str(args.head_hidden), "--head-vocab", str(args.head_vocab),
               "--temperature", str(args.temperature), "--backend", args.backend, "--seed", str(args.seed)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows[path] = json.loads(res.stdout.strip().splitlines()[-1])
    n, d, v = args.tokens, args.head_hidden, args.head_vocab
    print(f"Log-prob head {n} x {d} x {v} (Qwen2.5-0.5B-shaped), float32, CPU, forward + backward of "
          f"log-probs and entropy (one float32 logits tensor: {n * v * 4 / 2**20:.0f} MiB)")
    for path, r in rows.items():
        print(f"  {path:6s}: peak extra RSS {r['peak_extra_mib']:8.0f} MiB, {r['seconds']:6.2f} s, "
              f"sum logp {r['logp_sum']:.3f}, sum entropy {r['entropy_sum']:.3f}")
    f, l = rows["fused"], rows["logits"]
    print(f"  fused uses {l['peak_extra_mib'] / max(f['peak_extra_mib'], 1e-9):.1f}x less memory; "
          f"|sum logp diff| {abs(f['logp_sum'] - l['logp_sum']):.2e}")
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.one:  # a memory subprocess: print one JSON line
        print(json.dumps(memory_one(args)))
        return 0
    ok = True
    if args.part in ("all", "compare"):
        ok = compare(args)["ok"]
    if args.part in ("all", "memory"):
        memory(args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
