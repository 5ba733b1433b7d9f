"""The combine step for a vocab-parallel group: the only place where distributed code touches the math.

Each rank holds a contiguous shard of the vocabulary. Per token it knows its shard's running max ``m``,
``s = sum exp(z - m)``, the target logit (0 unless the label is in its shard), ``sum z`` and the first argmax
(as a global id). ``combine_stats`` turns them into global statistics with three all-reduces of O(N) bytes;
no logits and no weights ever cross ranks.
"""
from __future__ import annotations

from typing import Optional

import torch


def resolve_group(group_name: str):
    """The ProcessGroup registered under ``group_name`` ("" means none)."""
    if not group_name:
        return None
    import torch.distributed as dist

    return dist.distributed_c10d._resolve_process_group(group_name)


def shard_layout(process_group, local_vocab: int) -> tuple[int, int]:
    """(vocab_start, vocab_total) of this rank's contiguous shard; uneven shards allowed (one all_gather)."""
    import torch.distributed as dist

    world = dist.get_world_size(process_group)
    device = "cuda" if dist.get_backend(process_group) == "nccl" else "cpu"
    mine = torch.tensor([local_vocab], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(sizes, mine, group=process_group)
    sizes = [int(t.item()) for t in sizes]
    rank = dist.get_rank(process_group)
    return sum(sizes[:rank]), sum(sizes)


def combine_stats(m: torch.Tensor, s: torch.Tensor, target: torch.Tensor, zsum: torch.Tensor,
                  argmax: torch.Tensor, group_name: str):
    """Global (max, sum-exp relative to it, target logit, sum of logits, first argmax) over the group."""
    group = resolve_group(group_name)
    if group is None:
        return m, s, target, zsum, argmax
    import torch.distributed as dist

    m_all = m.clone()
    dist.all_reduce(m_all, op=dist.ReduceOp.MAX, group=group)
    # rescale this shard's sum-exp to the global max; a shard whose max is -inf contributes nothing
    scale = torch.where(m == m_all, torch.ones_like(m), torch.exp(m - m_all))
    packed = torch.stack([s * scale, target, zsum])
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    # first argmax: among the shards holding the global max, the lowest global id
    sentinel = torch.iinfo(torch.int64).max
    cand = torch.where(m == m_all, argmax, torch.full_like(argmax, sentinel))
    dist.all_reduce(cand, op=dist.ReduceOp.MIN, group=group)
    return m_all, packed[0], packed[1], packed[2], cand


def all_reduce_sum_(t: Optional[torch.Tensor], group_name: str) -> Optional[torch.Tensor]:
    """Sum ``t`` over the group in place (the full dX: every shard contributes dz_shard @ W_shard)."""
    group = resolve_group(group_name)
    if group is not None and t is not None:
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t
