"""Vocab- and sequence-parallel support over ``torch.distributed`` (NCCL, HCCL, gloo: whatever the group
uses).

Vocabulary parallelism. Each rank of a group holds a contiguous shard of the vocabulary (rank order =
vocabulary order; shards may be uneven, one may even be empty). Per token, a backend's statistics pass yields
its shard's running max ``m``, ``s = sum exp(z - m)``, the target logit (0 unless the label is in the shard),
``sum z`` and the first argmax (a global id) -- and, for ``linear_logprobs(return_entropy=True)``, ``ez = sum
exp(z - m) (z - m)``. :func:`combine_stats` turns them into the global statistics with ONE all-gather of 20
bytes per token (24 with the entropy statistic); no logits and no weights ever cross ranks. The gradient pass
then gives each rank its own dW shard and a partial dX (``dz_shard @ W_shard``) that :func:`all_reduce_sum_`
sums in float32.

Sequence parallelism (Megatron SP). ``sequence_parallel=True`` gathers inside the op: :func:`sp_gather_rows` /
:func:`reduce_grad_rows` all-gather the token rows and reduce-scatter dX in float32 (only the local rows are
saved for backward; half the all-reduce's traffic). :func:`gather_sequence_parallel` is the standalone
autograd-aware gather for callers who shard along another dimension (e.g. HF-style ``[b, s/tp, h]`` with
``dim=1``) and then call the op on the gathered tensor.

Collective sequence per call of the op, identical on every rank (a collective that one rank skips deadlocks):
``shard_layout`` (api), ``agree_token_blocks`` (driver, once per pass), one ``combine_stats`` per token
block, one dX all-reduce (a reduce-scatter under sequence parallelism). :func:`comm_bytes` is the documented
per-step volume; tests/test_distributed.py counts the bytes handed to ``torch.distributed`` and asserts it.
"""
from __future__ import annotations

from typing import Optional

import torch

# bytes of per-token statistics each rank contributes to combine_stats: m, s, target, sum z (float32) + argmax
# (int32)
STATS_BYTES_PER_TOKEN = 20
# ... plus the entropy statistic ez (float32) for linear_logprobs(return_entropy=True)
ENTROPY_STATS_BYTES_PER_TOKEN = STATS_BYTES_PER_TOKEN + 4


def _dist():
    import torch.distributed as dist

    return dist


def resolve_group(name: str):
    """The ProcessGroup registered under ``group_name`` ("" means none)."""
    if not name:
        return None
    return _dist().distributed_c10d._resolve_process_group(name)


def comm_device(process_group) -> torch.device:
    """Device on which small host-side control tensors must live for this group's backend."""
    backend = str(_dist().get_backend(process_group)).lower()
    if "gloo" in backend or "mpi" in backend:  # includes "cpu:gloo,cuda:nccl"
        return torch.device("cpu")
    if "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    if "hccl" in backend:
        return torch.device("npu", torch.npu.current_device())  # type: ignore[attr-defined]
    return torch.device("cpu")


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    """``out`` (world * rows, ...) <- concatenation of every rank's ``inp`` (rows, ...) along dim 0."""
    dist = _dist()
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    fn(out, inp, group=group)


def _reduce_scatter_flat(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    """``out`` (rows, ...) <- this rank's block of rows of the sum over ranks of ``inp`` (world * rows,
    ...)."""
    dist = _dist()
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in torch 2.13
    fn(out, inp, op=dist.ReduceOp.SUM, group=group)


# ------------------------------------------------------------------------------------------- vocab parallel
def shard_layout(process_group, local_vocab: int) -> tuple[int, int]:
    """(vocab_start, vocab_total) of this rank's contiguous shard; uneven shards allowed (one all-gather of 8
    bytes per rank, and a host sync)."""
    dist = _dist()
    world = dist.get_world_size(process_group)
    mine = torch.tensor([int(local_vocab)], dtype=torch.int64, device=comm_device(process_group))
    sizes = torch.empty(world, dtype=torch.int64, device=mine.device)
    _all_gather_flat(sizes, mine, process_group)
    sizes = sizes.tolist()
    rank = dist.get_rank(process_group)
    return sum(sizes[:rank]), sum(sizes)


def agree_token_blocks(block: int, n_tokens: int, group) -> int:
    """The token-block size every rank of the group must use: the smallest one proposed.

    A backend that calls :func:`combine_stats` once per token block must run the same number of blocks (of the
    same sizes) on every rank, but a plan derived from the local shard size differs between uneven shards (and
    a collective-size mismatch aborts gloo / hangs NCCL). Taking the minimum keeps every rank within its own
    tile budget (a smaller block needs less memory). Also checks that every rank has the same number of
    tokens. One all-reduce of 24 bytes and a host sync; returns ``block`` unchanged without a group.
    """
    if group is None:
        return block
    dist = _dist()
    t = torch.tensor([int(block), int(n_tokens), -int(n_tokens)], dtype=torch.int64,
                     device=comm_device(group))
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    lo, hi = int(t[1]), -int(t[2])
    if lo != hi:  # every rank sees the same reduced values, so every rank raises
        raise ValueError(f"hidden/labels: every rank of a vocab-parallel group must hold the same tokens, "
                         f"got between {lo} and {hi} tokens across ranks (this rank: {n_tokens})")
    return max(1, int(t[0]))


def combine_stats(m: torch.Tensor, s: torch.Tensor, target: torch.Tensor, zsum: torch.Tensor,
                  argmax: torch.Tensor, group, ez: Optional[torch.Tensor] = None):
    """Global (max, sum-exp relative to it, target logit, sum of logits, first argmax) over the group, and
    with ``ez`` (the entropy statistic ``sum exp(z - m) (z - m)`` of each shard) a sixth output: its global
    value.

    One all-gather of the packed (5, n) -- (6, n) with ``ez`` -- float32 statistics (argmax as int32 bits;
    global ids < 2**31), then the same reduction, in rank order, on every rank, so every rank gets
    bit-identical results.
    """
    if group is None:
        return (m, s, target, zsum, argmax) + (() if ez is None else (ez,))
    world = _dist().get_world_size(group)
    f32 = torch.float32
    rows = [m.to(f32), s.to(f32), target.to(f32), zsum.to(f32),
            argmax.to(torch.int32).view(f32)]  # bit copy: the gather moves bytes, no arithmetic
    packed = torch.stack(rows + ([] if ez is None else [ez.to(f32)]))
    allst = packed.new_empty((world * packed.shape[0], packed.shape[1]))  # gloo wants a dim-0 concatenation
    _all_gather_flat(allst, packed, group)
    allst = allst.view(world, *packed.shape)
    ids = allst[:, 4].contiguous().view(torch.int32).to(torch.int64)
    out = merge_stats(allst[:, 0], allst[:, 1], allst[:, 2], allst[:, 3], ids,
                      None if ez is None else allst[:, 5])
    return tuple(x.to(like.dtype) for x, like in zip(out, (m, s, target, zsum, argmax, ez)))


def merge_stats(ms: torch.Tensor, ss: torch.Tensor, targets: torch.Tensor, zsums: torch.Tensor,
                argmaxes: torch.Tensor, ezs: Optional[torch.Tensor] = None) -> tuple:
    """The global statistics from those of every shard, stacked ``(world, n)`` in vocabulary order: what
    :func:`combine_stats` computes once it has gathered them (the same arithmetic, in the same order)."""
    m_all = ms.amax(dim=0)
    # rescale each shard's sum-exp to the global max; a shard whose max is -inf (or equals the global) scales
    # by 1
    top = ms == m_all
    scale = torch.where(top, torch.ones_like(ms), torch.exp(ms - m_all))
    s_all = (ss * scale).sum(dim=0)
    # first argmax: among the shards holding the global max, the lowest global id
    cand = torch.where(top, argmaxes, torch.full_like(argmaxes, torch.iinfo(torch.int64).max))
    out = (m_all, s_all, targets.sum(dim=0), zsums.sum(dim=0), cand.amin(dim=0))
    if ezs is None:
        return out
    # sum exp(z - M)(z - M) = sum_k exp(m_k - M) (ez_k + (m_k - M) s_k); an all -inf shard (s_k = 0) adds 0
    delta = torch.where(top | (ms == -torch.inf), torch.zeros_like(ms), ms - m_all)
    return out + (((ezs + delta * ss) * scale).sum(dim=0),)


def all_reduce_sum_(t: Optional[torch.Tensor], group) -> Optional[torch.Tensor]:
    """Sum ``t`` over the group in place (the full dX: every shard contributes dz_shard @ W_shard)."""
    if group is not None and t is not None:
        dist = _dist()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


# ---------------------------------------------------------------------------------------- sequence parallel
class _GatherTokens(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, group, dim, grad_is_partial):
        dist = _dist()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        x = hidden.movedim(dim, 0).contiguous()  # no copy for dim 0 of a contiguous tensor
        out = x.new_empty((world * x.shape[0],) + tuple(x.shape[1:]))
        _all_gather_flat(out, x, group)
        ctx.group, ctx.dim, ctx.rank, ctx.rows, ctx.partial = group, dim, rank, x.shape[0], grad_is_partial
        return out.movedim(0, dim)

    @staticmethod
    def backward(ctx, grad):
        g = grad.movedim(ctx.dim, 0)
        if ctx.partial:  # each rank holds its own contribution to every row: sum them, keep this rank's rows
            out = g.new_empty((ctx.rows,) + tuple(g.shape[1:]))
            _reduce_scatter_flat(out, g.contiguous(), ctx.group)
        else:  # the gradient is already summed over the group (the op all-reduces dX): keep this rank's rows
            out = g[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows]
        return out.movedim(0, ctx.dim), None, None, None


def gather_sequence_parallel(hidden: torch.Tensor, process_group, dim: int = 0, *,
                             grad_is_partial: bool = False) -> torch.Tensor:
    """All-gather the token shards of ``hidden`` along ``dim`` (in rank order), differentiably.

    ``dim = 0`` is the layout of Megatron sequence parallelism, ``[s/tp, b, h] -> [s, b, h]``, and of
    flattened ``(N/tp, D) -> (N, D)`` tokens; ``linear_cross_entropy(sequence_parallel=True)`` uses it, so its
    ``labels`` must be the full ``[s, b]`` (or ``(N,)``) of the gathered rows. For an HF-style ``[b, s/tp,
    h]`` shard use ``dim=1`` (or pass ``hidden.transpose(0, 1)`` with ``labels.t()`` to the API). Every rank
    must hold the same number of rows (as in Megatron: ``s`` divisible by the group size).

    Backward: with ``grad_is_partial=False`` the incoming gradient is assumed to be already summed over the
    group (``fused_lce``'s op all-reduces dX), so this rank's rows are sliced out (no communication); with
    True it is a per-rank partial sum and a reduce-scatter sums it and keeps this rank's rows (half an
    all-reduce's traffic).
    """
    if process_group is None or _dist().get_world_size(process_group) == 1:
        return hidden
    if hidden.dim() < 2:
        raise ValueError(f"hidden: sequence_parallel needs shape (..., D) with a token dimension, "
                         f"got {tuple(hidden.shape)}")
    nd = hidden.dim() - 1  # the last dimension is D, never gathered
    if not -nd <= dim < nd:
        raise ValueError(f"dim: expected a token dimension of hidden in [{-nd}, {nd}), got {dim}")
    return _GatherTokens.apply(hidden, process_group, dim % hidden.dim(), bool(grad_is_partial))


def sp_gather_rows(hidden: torch.Tensor, group, n_tokens: int) -> torch.Tensor:
    """For an op that receives this rank's (N/world, D) token rows and the full (N,) labels: the (N, D) rows
    of the whole group (one all-gather); ``hidden`` itself when there is no group or it already has
    ``n_tokens`` rows. Not differentiable (meant for inside a custom op; pair it with
    :func:`reduce_grad_rows`)."""
    if group is None or hidden.shape[0] == n_tokens:
        return hidden
    world = _dist().get_world_size(group)
    if hidden.shape[0] * world != n_tokens:
        raise ValueError(f"hidden: expected {n_tokens} // {world} token rows per rank (sequence parallel), "
                         f"got {hidden.shape[0]}")
    out = hidden.new_empty((n_tokens,) + tuple(hidden.shape[1:]))
    _all_gather_flat(out, hidden.contiguous(), group)
    return out


def reduce_grad_rows(grad: torch.Tensor, group, local_rows: int) -> torch.Tensor:
    """Sum a per-rank partial dX over the group: an in-place all-reduce when every rank keeps all rows, a
    reduce-scatter to this rank's ``local_rows`` rows under sequence parallelism (half the traffic)."""
    if group is None:
        return grad
    if grad.shape[0] == local_rows:
        return all_reduce_sum_(grad, group)
    out = grad.new_empty((local_rows,) + tuple(grad.shape[1:]))
    _reduce_scatter_flat(out, grad.contiguous(), group)
    return out


# -------------------------------------------------------------------------------------------------- volume
def comm_bytes(n_tokens: int, d: int, world: int, *, grad_hidden: bool = True,
               sequence_parallel: bool = False, hidden_itemsize: int = 4, sp_reduce_scatter: bool = False,
               recompute: bool = False, entropy: bool = False) -> dict[str, int]:
    """Bytes this rank hands to each kind of collective in one forward + backward of the loss, or of
    ``linear_logprobs`` (same collectives; ``entropy``: with ``return_entropy=True``, 24 bytes of statistics
    per token instead of 20) (payload: the input tensor's size; the wire traffic of ring algorithms is
    ``(world-1) x`` that for an all-gather, ``2 (world-1)/world x`` for an all-reduce and ``(world-1)/world
    x`` for a reduce-scatter).

    ``n_tokens`` = N, the tokens of the whole problem (after the sequence-parallel gather); the volume does
    not depend on how many token blocks the driver ran (only the tiny per-collective latency does):

    - all_gather: ``8`` (shard sizes) + ``20 N`` (statistics; ``24 N`` with ``entropy``) [+ ``N/world * D *
      itemsize`` under SP: hidden]
    - all_reduce: ``24`` (the driver's token-block agreement) + ``4 N D`` when dX is wanted (float32 partial
      dX), except with ``sp_reduce_scatter`` where dX goes to
    - reduce_scatter: ``4 N D`` (float32 partial dX in, this rank's ``N/world`` rows out). In that scheme the
      op gathers hidden itself and keeps only its own rows, so a backward that recomputes (``recompute``:
      reduction "none") gathers them again: another ``N/world * D * itemsize`` all-gathered.

    The logits-gathering alternative hands ``N * V/world * 4`` bytes to an all-gather (float32 logits) and the
    same for their gradient; the statistics cost ``20 / (4 V / world)`` of that, e.g. 1/30000 at V=152k, TP=8.
    """
    if world <= 1:
        return {"all_gather": 0, "all_reduce": 0, "reduce_scatter": 0}
    gather = 8 + (ENTROPY_STATS_BYTES_PER_TOKEN if entropy else STATS_BYTES_PER_TOKEN) * n_tokens
    if sequence_parallel:
        gather += (n_tokens // world) * d * hidden_itemsize
    dx = 4 * n_tokens * d if grad_hidden else 0
    agree = 24
    if sp_reduce_scatter and sequence_parallel:
        if recompute:
            gather += (n_tokens // world) * d * hidden_itemsize
        return {"all_gather": gather, "all_reduce": agree, "reduce_scatter": dx}
    return {"all_gather": gather, "all_reduce": agree + dx, "reduce_scatter": 0}
