"""Tensor-parallel (vocab-parallel) LM-head loss: time and memory per rank, fused vs the logits-materialising
ways.

One launch measures every TP size that divides the world size: with 8 GPUs, TP=1, 2, 4 and 8 run one after the
other (TP groups of consecutive ranks; with TP < world the other groups run the same problem, like
data-parallel replicas). For each anchor shape (``gpu.ANCHORS``; N x D x V, bf16, 15% of labels = -100) and TP
size it times one forward + backward of the mean loss and records the peak extra memory per rank, for

- ``fused``: ``fused_lce.linear_cross_entropy(h, W_shard, y, process_group=tp)``: per-token statistics cross
  ranks, no logits kept;
- ``gathered``: ``F.linear`` on the shard, logits all-gathered to ``[N, V]``, ``F.cross_entropy`` in float32
  (Megatron's ``gather_output=True`` way);
- ``vocab_parallel``: the classic vocab-parallel cross-entropy: the ``[N, V/tp]`` float32 logits shard is
  materialised, max / sum-exp / target logit are all-reduced (what Megatron's ``vocab_parallel_cross_entropy``
  does, written here from the math).

Peak extra = ``max_memory_allocated`` during fwd+bwd minus the memory allocated before it (inputs excluded,
gradients included); CUDA only (``n/a`` on CPU). Time = median over ``--iters`` (after ``--warmup``), max over
the ranks of a group.

    torchrun --nproc-per-node 8 benchmarks/tp.py                                    # GPUs
    torchrun --nproc-per-node 1 benchmarks/tp.py                                    # one GPU: TP=1 only
    torchrun --nproc-per-node 2 benchmarks/tp.py --device cpu --dist-backend gloo --shapes 64x32x1000 \
        --iters 2 --out /tmp/tp

Writes ``tp.json`` and ``tp.md`` into ``--out`` (rank 0; default benchmarks/results, where the next run
overwrites them).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
import fused_lce  # noqa: E402
from gpu import ANCHORS  # noqa: E402  (this script's directory is on the path)

METHODS = ("fused", "gathered", "vocab_parallel")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# ------------------------------------------------------------------------------------------------ baselines
class _GatherVocab(torch.autograd.Function):
    """[N, V/tp] -> [N, V] along the vocabulary; backward keeps this rank's columns."""

    @staticmethod
    def forward(ctx, z, group, sizes, rank):
        parts = [z.new_empty(z.shape[0], s) for s in sizes]
        if len(set(sizes)) == 1:
            dist.all_gather(parts, z.contiguous(), group=group)
        else:  # uneven shards: pad to the largest (all_gather needs equal sizes)
            big = max(sizes)
            pad = [z.new_empty(z.shape[0], big) for _ in sizes]
            dist.all_gather(pad, F.pad(z, (0, big - z.shape[1])).contiguous(), group=group)
            parts = [p[:, :s] for p, s in zip(pad, sizes)]
        ctx.cols = (sum(sizes[:rank]), sum(sizes[:rank + 1]))
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, g):
        return g[:, ctx.cols[0]:ctx.cols[1]], None, None, None


def loss_gathered(h, w, y, group, sizes, rank):
    z = F.linear(h, w)
    if group is not None:
        z = _GatherVocab.apply(z, group, sizes, rank)
    return F.cross_entropy(z.float(), y, ignore_index=-100)


class _VocabParallelCE(torch.autograd.Function):
    """Classic vocab-parallel CE on a materialised float32 logits shard (3 all-reduces of N floats)."""

    @staticmethod
    def forward(ctx, z, y, group, v0):
        z = z.float()
        m = z.max(dim=1).values
        if group is not None:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        z.sub_(m[:, None])
        local = y - v0
        hit = (local >= 0) & (local < z.shape[1])
        idx = local.clamp(0, z.shape[1] - 1)
        target = torch.where(hit, z.gather(1, idx[:, None]).squeeze(1), torch.zeros_like(m))
        z.exp_()  # z now holds exp(logits - max)
        s = z.sum(dim=1)
        packed = torch.stack([s, target])
        if group is not None:
            dist.all_reduce(packed, group=group)
        s, target = packed[0], packed[1]
        valid = y != -100
        n_valid = valid.sum().clamp(min=1)
        loss = torch.where(valid, torch.log(s) - target, torch.zeros_like(s)).sum() / n_valid
        z.div_(s[:, None])  # softmax
        ctx.save_for_backward(z, idx, hit & valid, valid, n_valid)
        return loss

    @staticmethod
    def backward(ctx, g):
        p, idx, hit, valid, n_valid = ctx.saved_tensors
        rows = torch.arange(p.shape[0], device=p.device)
        p[rows, idx] -= hit.to(p.dtype)
        p.mul_((valid.to(p.dtype) * (g / n_valid))[:, None])
        return p, None, None, None


class _CopyToGroup(torch.autograd.Function):
    """Identity forward, all-reduce of the gradient (the input of a column-parallel linear)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g, None


def loss_vocab_parallel(h, w, y, group, v0):
    if group is not None:
        h = _CopyToGroup.apply(h, group)
    return _VocabParallelCE.apply(F.linear(h, w), y, group, v0)


class _GatherRows(torch.autograd.Function):
    """Sequence parallel for the baselines: all-gather token rows, backward reduce-scatters (partial dX)."""

    @staticmethod
    def forward(ctx, x, group):
        world = dist.get_world_size(group)
        out = x.new_empty((world * x.shape[0],) + tuple(x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        ctx.group, ctx.rows = group, x.shape[0]
        return out

    @staticmethod
    def backward(ctx, g):
        out = g.new_empty((ctx.rows,) + tuple(g.shape[1:]))
        dist.reduce_scatter_tensor(out, g.contiguous(), group=ctx.group)
        return out, None


# -------------------------------------------------------------------------------------------------- timing
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _mem(device):
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device):
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def run_one(method, h, w, y, group, sizes, rank, args, device):
    """(median ms, peak extra bytes, loss) of fwd+bwd of one method on this rank."""
    sp = args.sequence_parallel and group is not None
    v0 = sum(sizes[:rank])

    def step():
        hh = h.detach().requires_grad_()
        ww = w.detach().requires_grad_()
        if method == "fused":
            loss = fused_lce.linear_cross_entropy(hh, ww, y, process_group=group, sequence_parallel=sp,
                                                  backend=args.backend)
        else:
            x = _GatherRows.apply(hh, group) if sp else hh
            if method == "gathered":
                loss = loss_gathered(x, ww, y, group, sizes, rank)
            else:
                if sp:  # the reduce-scatter of _GatherRows already sums the partial dX
                    loss = _VocabParallelCE.apply(F.linear(x, ww), y, group, v0)
                else:
                    loss = loss_vocab_parallel(x, ww, y, group, v0)
        loss.backward()
        return loss.detach()

    times, loss = [], None
    for i in range(args.warmup + args.iters):
        _sync(device)
        base = _mem(device)
        _reset_peak(device)
        t0 = time.perf_counter()
        loss = step()
        _sync(device)
        dt = time.perf_counter() - t0
        peak = _peak(device) - base
        if i >= args.warmup:
            times.append(dt * 1e3)
    return statistics.median(times), peak, float(loss)


def _reduce_max(values, group, device):
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if group is not None:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def parse_shape(s):
    n, d, v = (int(x) for x in s.lower().split("x"))
    return n, d, v


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(f"{n}x{d}x{v}" for n, d, v in ANCHORS),
                    help="comma-separated NxDxV (default: the anchor shapes, gpu.ANCHORS)")
    ap.add_argument("--tp", default="1,2,4,8", help="TP sizes to run (those dividing the world size)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--backend", default="auto", help="fused_lce backend")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dist-backend", default=None, help="nccl (cuda) / gloo (cpu) by default")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ignore-frac", type=float, default=0.15)
    ap.add_argument("--sequence-parallel", action="store_true",
                    help="hidden sharded along tokens (N/tp rows)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"),
                    help="directory for tp.json and tp.md (default: benchmarks/results)")
    args = ap.parse_args(argv)

    if "RANK" not in os.environ:  # plain `python benchmarks/tp.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29555"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    backend = args.dist_backend or ("nccl" if args.device == "cuda" else "gloo")
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10),
                            **({"device_id": device} if device.type == "cuda" else {}))
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = DTYPES[args.dtype]
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            raise SystemExit(f"--methods: unknown {m!r}, expected some of {METHODS}")

    rows = []
    for tp in (int(t) for t in args.tp.split(",")):
        if world % tp:
            continue
        # groups of consecutive ranks; every rank must create every group
        groups = ([dist.new_group(list(range(g * tp, (g + 1) * tp))) for g in range(world // tp)] if tp > 1
                  else [])
        group = groups[rank // tp] if tp > 1 else None
        grank = rank % tp
        for shape in args.shapes.split(","):
            n, d, v = parse_shape(shape)
            if args.sequence_parallel and n % tp:
                continue
            sizes = [v // tp + (r < v % tp) for r in range(tp)]
            v0 = sum(sizes[:grank])
            gen = torch.Generator(device="cpu").manual_seed(1234)  # same problem on every rank and TP size
            h = torch.randn(n, d, generator=gen).to(device=device, dtype=dtype)
            y = torch.randint(0, v, (n,), generator=gen)
            y[torch.rand(n, generator=gen) < args.ignore_frac] = -100
            y = y.to(device)
            # this rank's shard of the same (V, D) weight whatever the TP size: fixed blocks of rows, each
            # from its own seed, so the full matrix is never built on one rank
            w = torch.empty(sizes[grank], d, dtype=dtype, device=device)
            blk = 16384
            for b0 in range(v0 // blk * blk, v0 + sizes[grank], blk):
                g2 = torch.Generator(device="cpu").manual_seed(99 + b0 // blk)
                rows_b = torch.randn(min(blk, v - b0), d, generator=g2) * d ** -0.5
                lo, hi = max(b0, v0), min(b0 + blk, v0 + sizes[grank])
                w[lo - v0:hi - v0] = rows_b[lo - b0:hi - b0].to(device=device, dtype=dtype)
            if args.sequence_parallel and group is not None:
                h = h.chunk(tp)[grank].contiguous()
            for method in methods:
                try:
                    ms, peak, loss = run_one(method, h, w, y, group, sizes, grank, args, device)
                    err = ""
                except torch.OutOfMemoryError:
                    ms, peak, loss, err = float("nan"), float("nan"), float("nan"), "OOM"
                    torch.cuda.empty_cache()
                ms_max, peak_max = _reduce_max([ms, peak], group, device)
                rows.append({"shape": shape, "N": n, "D": d, "V": v, "tp": tp, "method": method,
                             "ms": ms_max, "peak_gib": peak_max / 2**30, "loss": loss, "error": err})
                if rank == 0:
                    print(f"tp={tp} {shape} {method:15s} {ms_max:9.2f} ms  {peak_max / 2**30:7.3f} GiB  "
                          f"loss {loss:.5f} {err}", flush=True)
            del h, w, y
        dist.barrier()

    if rank == 0:
        meta = {"world_size": world, "device": _device_name(device), "torch": torch.__version__,
                "fused_lce": fused_lce.__version__, "dtype": args.dtype, "backend": args.backend,
                "dist_backend": backend, "sequence_parallel": args.sequence_parallel, "iters": args.iters,
                "memory_measured": device.type == "cuda",
                "warmup": args.warmup, "python": platform.python_version(),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        report = {"meta": meta, "results": rows}
        md = to_markdown(report)
        print(md)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "tp.json"), "w") as f:
                json.dump(report, f, indent=1)
            with open(os.path.join(args.out, "tp.md"), "w") as f:
                f.write(md)
    dist.destroy_process_group()


def _device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def to_markdown(report):
    meta, rows = report["meta"], report["results"]
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    lines = [f"# Vocab-parallel LM-head loss, {meta['device']} x{meta['world_size']}, {meta['dtype']}, "
             f"torch {meta['torch']}, {meta['dist_backend']}"
             + (", sequence parallel" if meta["sequence_parallel"] else ""), "",
             "Cells: ms per fwd+bwd (max over ranks) / peak extra GiB per rank; loss "
             "difference vs `gathered`.", "",
             "| N×D×V | TP | " + " | ".join(methods) + " | |Δloss| fused |",
             "|---|---|" + "---|" * (len(methods) + 1)]
    keys = sorted({(r["shape"], r["tp"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for shape, tp in keys:
        cell, losses = [], {}
        for m in methods:
            r = next((r for r in rows if r["shape"] == shape and r["tp"] == tp and r["method"] == m), None)
            if r is None:
                cell.append("-")
                continue
            losses[m] = r["loss"]
            mem = f"{r['peak_gib']:.2f}" if meta["memory_measured"] else "n/a"
            cell.append(r["error"] or f"{r['ms']:.1f} / {mem}")
        dl = (abs(losses["fused"] - losses["gathered"]) if {"fused", "gathered"} <= set(losses)
              else float("nan"))
        lines.append(f"| {shape} | {tp} | " + " | ".join(cell) + f" | {dl:.2e} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
