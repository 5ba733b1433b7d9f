"""Vocab-parallel and sequence-parallel linear cross-entropy (and vocab-parallel linear_logprobs) over gloo,
with 2 and 4 CPU processes.

Every case draws fresh inputs in this process, runs the op on every rank of a persistent process pool (each
rank holding its contiguous vocabulary shard, uneven shards included, and under sequence parallelism its token
rows), and compares the loss, statistics and gradients (full dX, each rank's dW/db shard) with the
single-process op and with the float64 reference. The bytes every rank hands to ``torch.distributed`` are
counted in the workers and must equal ``fused_lce.core.distributed.comm_bytes``.
"""
from __future__ import annotations

import math
import os
import sys

import pytest
import torch
import torch.distributed as dist

import fused_lce
from fused_lce.core import Options, Problem, registry
from fused_lce.core import distributed as fdist
from fused_lce.core.formulas import reference_loss

from ..conftest import GRAD_TOL, LOSS_TOL, rel_err
from ..support.procs import pools, run_ok  # noqa: F401  (pools: a fixture)
from fused_lce.core.formulas import reference_logprobs as logprob_reference

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available in this torch build")

TINY = 0.002  # MiB: many token blocks of 8 tokens once every shard has >= 22 vocabulary rows
# the other CPU backends that run vocab-parallel problems here (auto picks them on CPU)
OTHER_CPU = [n for n in registry.NAMES if n != "torch" and registry.why_not(
    n, Problem(8, 8, 8, torch.float32, torch.device("cpu"), False, Options(group_name="g"))) is None]


# ------------------------------------------------------------------------------------- counting collectives
_KINDS = {"all_reduce": ("all_reduce", 0), "all_gather_single": ("all_gather", 1),
          "all_gather_into_tensor": ("all_gather", 1), "all_gather": ("all_gather", 1),
          "reduce_scatter_single": ("reduce_scatter", 1), "reduce_scatter_tensor": ("reduce_scatter", 1),
          "reduce_scatter": ("reduce_scatter", 1), "broadcast": ("other", 0),
          "all_to_all_single": ("other", 1), "all_to_all": ("other", 1), "send": ("other", 0),
          "recv": ("other", 0), "reduce": ("other", 0), "gather": ("other", 0), "scatter": ("other", 0),
          "all_gather_object": ("other", 1), "barrier": ("other", None)}


class CountCollectives:
    """Monkeypatches torch.distributed's collectives to add up the bytes this rank hands to each kind."""

    def __enter__(self):
        self.bytes = {"all_reduce": 0, "all_gather": 0, "reduce_scatter": 0, "other": 0}
        self.calls = dict.fromkeys(self.bytes, 0)
        self.saved = {}
        for name, (kind, arg) in _KINDS.items():
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            self.saved[name] = fn
            setattr(dist, name, self._wrap(fn, kind, arg))
        return self

    def _wrap(self, fn, kind, arg):
        def counted(*args, **kwargs):
            t = args[arg] if arg is not None and len(args) > arg else None
            ts = t if isinstance(t, (list, tuple)) else [t]
            self.bytes[kind] += sum(x.numel() * x.element_size() for x in ts if isinstance(x, torch.Tensor))
            self.calls[kind] += 1
            return fn(*args, **kwargs)

        return counted

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(dist, name, fn)


# ------------------------------------------------------------------------------------------------- worker
def _group_for(rank, spec):
    """(process group, index of this rank's group in spec['groups'])."""
    groups = spec.get("groups")
    if not groups:
        return dist.group.WORLD, 0
    made = [dist.new_group(g) for g in groups]  # every rank creates every group, in the same order
    k = next(i for i, g in enumerate(groups) if rank in g)
    return made[k], k


def _vocab_case(rank, world, spec):
    group, k = _group_for(rank, spec)
    data = spec["data"][k]
    gr, gw = dist.get_rank(group), dist.get_world_size(group)
    sizes = spec["sizes"]
    assert len(sizes) == gw
    v0 = sum(sizes[:gr])
    w = data["w"][v0:v0 + sizes[gr]].clone().requires_grad_()
    b = data["b"][v0:v0 + sizes[gr]].clone().requires_grad_() if data["b"] is not None else None
    sp = spec.get("sp")  # None, or the token dim that is sharded across the group
    h_full = data["h"]
    if sp is None:
        h = h_full.clone().requires_grad_()
    else:
        h = h_full.chunk(gw, dim=sp)[gr].clone().requires_grad_()
    opts = dict(spec["opts"])
    module = opts.pop("module", False)
    with CountCollectives() as count:
        if module:
            lce = fused_lce.LinearCrossEntropy(process_group=group, sequence_parallel=sp is not None,
                                               return_stats=True, **opts)
            out = lce(h, w, data["y"], b)
        else:
            out = fused_lce.linear_cross_entropy(h, w, data["y"], b, process_group=group,
                                                 sequence_parallel=sp is not None, return_stats=True, **opts)
        leaves = [t for t in (h, w, b) if t is not None]
        grads = torch.autograd.grad(out.loss, leaves, data["g"], allow_unused=True)
    grads = list(grads) + [None] * (3 - len(grads))
    return {"loss": out.loss.detach(), "lse": out.lse, "acc": out.token_accuracy, "n_valid": out.n_valid,
            "dh": grads[0], "dw": grads[1], "db": grads[2] if b is not None else None,
            "bytes": count.bytes, "calls": count.calls}


# ------------------------------------------------------------------------------------------------- driver
def _problem(lead, d, v, dtype, *, bias, ignore_frac, ignore_index=-100, label_range=None):
    h = torch.randn(*lead, d).to(dtype)
    w = (torch.randn(v, d) / d ** 0.5 * 2).to(dtype)
    b = (torch.randn(v) * 0.5).to(dtype) if bias else None
    lo, hi = label_range or (0, v)
    y = torch.randint(lo, hi, tuple(lead))
    if ignore_frac:
        y[torch.rand(tuple(lead)) < ignore_frac] = ignore_index
    return h, w, b, y


def _expected(data, opts, dtype):
    """Single-process op and float64 reference for one problem: (op outputs, reference outputs)."""
    opts = {k: v for k, v in opts.items() if k != "module"}
    h, w, b, y, g = data["h"], data["w"], data["b"], data["y"], data["g"]
    leaves = [t.clone().requires_grad_() for t in (h, w, b) if t is not None]
    out = fused_lce.linear_cross_entropy(*leaves[:2], y, leaves[2] if b is not None else None,
                                         return_stats=True, **opts)
    op_grads = torch.autograd.grad(out.loss, leaves, g)
    ref_opts = {k: v for k, v in opts.items() if k not in ("backend", "tile_budget_mb", "validate")}
    refs = [t.double().requires_grad_() for t in (h, w, b) if t is not None]
    ref, lse, acc, n_valid = reference_loss(refs[0], refs[1], y,
                                            refs[2] if b is not None else None, **ref_opts)
    ref_grads = torch.autograd.grad(ref, refs, g.double())
    return (out, op_grads), (ref.detach(), lse.detach(), acc, n_valid, ref_grads)


def check_case(pool, *, lead=(37,), d=24, sizes=(31, 44), dtype=torch.float32, reduction="mean", bias=False,
               ignore_frac=0.0, label_range=None, sp=None, groups=None, tile=None, shift=False, **opts):
    """Run one case on ``pool`` and compare every rank's results; returns the per-rank results."""
    v = sum(sizes)
    n_groups = len(groups) if groups else 1
    ignore_index = opts.get("ignore_index", -100)
    opts = dict(opts, reduction=reduction, shift=shift, tile_budget_mb=tile,
                backend=opts.get("backend", "torch"))
    data = []
    for _ in range(n_groups):
        h, w, b, y = _problem(lead, d, v, dtype, bias=bias, ignore_frac=ignore_frac,
                              ignore_index=ignore_index, label_range=label_range)
        out_shape = lead[:-1] + (lead[-1] - 1,) if shift else lead
        g = torch.rand(out_shape) + 0.5 if reduction == "none" else torch.tensor(1.0)
        data.append({"h": h, "w": w, "b": b, "y": y, "g": g})
    spec = {"data": data, "sizes": list(sizes), "opts": opts, "sp": sp, "groups": groups}
    res = run_ok(pool, _vocab_case, spec)
    gw = len(sizes)
    for k in range(n_groups):
        ranks = groups[k] if groups else list(range(pool.world))
        mine = [res[r] for r in ranks]
        (out, op_grads), (ref, ref_lse, ref_acc, ref_n, ref_grads) = _expected(data[k], opts, dtype)
        for r in mine[1:]:  # every rank returns the same loss and statistics
            assert torch.equal(r["loss"], mine[0]["loss"]) and torch.equal(r["lse"], mine[0]["lse"])
            assert torch.equal(r["acc"], mine[0]["acc"]) and torch.equal(r["n_valid"], mine[0]["n_valid"])
        got = mine[0]
        assert got["loss"].dtype == torch.float32 and got["loss"].shape == ref.shape
        # loss vs single process and vs float64
        torch.testing.assert_close(got["loss"], out.loss.detach(), rtol=2e-6, atol=2e-6)
        mag = float(ref.abs().max()) if ref.numel() else 1.0
        assert float((got["loss"].double() - ref).abs().max() if ref.numel() else 0) \
            <= LOSS_TOL[dtype] * (1 + mag)
        torch.testing.assert_close(got["lse"].double(), ref_lse, rtol=1e-4, atol=1e-4)
        assert int(got["n_valid"]) == int(ref_n)
        if dtype == torch.float32:  # low precision may flip argmax near-ties
            assert abs(float(got["acc"]) - float(ref_acc)) < 1e-6
            assert torch.equal(got["acc"], out.token_accuracy)
        # gradients: dX whole (or this rank's rows under SP), dW/db this rank's shard
        if sp is None:
            dh = got["dh"]
            for r in mine[1:]:
                torch.testing.assert_close(r["dh"], dh, rtol=0, atol=0)
        else:
            dh = torch.cat([r["dh"] for r in mine], dim=sp)
        dw = torch.cat([r["dw"] for r in mine])
        want = [dh, dw] + ([torch.cat([r["db"] for r in mine])] if bias else [])
        single_tol = 1e-5 if dtype == torch.float32 else GRAD_TOL[dtype]
        for name, ours, single, ref_g, leaf in zip("hwb", want, op_grads, ref_grads,
                                                   (data[k]["h"], data[k]["w"], data[k]["b"])):
            assert ours.dtype == leaf.dtype and ours.shape == leaf.shape, name
            assert torch.isfinite(ours).all(), name
            assert rel_err(ours, single) <= single_tol, (name, rel_err(ours, single))
            assert rel_err(ours, ref_g) <= GRAD_TOL[dtype], (name, rel_err(ours, ref_g))
        # communication volume: exactly the documented formula, and nothing else
        n_tok = int(torch.tensor(lead).prod())
        expect = fdist.comm_bytes(n_tok, d, gw, sequence_parallel=sp is not None,
                                  hidden_itemsize=torch.tensor([], dtype=dtype).element_size(),
                                  sp_reduce_scatter=True,
                                  recompute=reduction == "none")
        for r in mine:
            assert r["bytes"]["other"] == 0
            for kind, nbytes in expect.items():
                assert r["bytes"][kind] == nbytes, (kind, r["bytes"], expect)
    return res


# ------------------------------------------------------------------------------------------- linear_logprobs
def _logprob_case(rank, world, spec):
    group = dist.group.WORLD
    data, sizes = spec["data"], spec["sizes"]
    v0 = sum(sizes[:rank])
    h = data["h"].clone().requires_grad_()
    w = data["w"][v0:v0 + sizes[rank]].clone().requires_grad_()
    b = data["b"][v0:v0 + sizes[rank]].clone().requires_grad_() if data["b"] is not None else None
    entropy = spec["opts"]["return_entropy"]
    with CountCollectives() as count:
        out = fused_lce.linear_logprobs(h, w, data["y"], b, process_group=group, **spec["opts"])
        lp, ent = out if entropy else (out, None)
        objective = (lp * data["g_lp"]).sum() + ((ent * data["g_ent"]).sum() if entropy else 0)
        leaves = [t for t in (h, w, b) if t is not None]
        grads = list(torch.autograd.grad(objective, leaves)) + [None]
    return {"lp": lp.detach(), "ent": None if ent is None else ent.detach(), "dh": grads[0], "dw": grads[1],
            "db": grads[2] if b is not None else None, "bytes": count.bytes}


def check_logprob_case(pool, *, n=37, d=24, sizes=(31, 44), dtype=torch.float32, bias=False, ignore_frac=0.0,
                       tile=None, backend="torch", entropy=True, **opts):
    """linear_logprobs on every rank of ``pool`` (uneven vocabulary shards) against the single-process call
    and the float64 reference: identical outputs on every rank, full dX, each rank's dW/db shard, and the
    bytes."""
    v = sum(sizes)
    h, w, b, y = _problem((n,), d, v, dtype, bias=bias, ignore_frac=ignore_frac)
    data = {"h": h, "w": w, "b": b, "y": y, "g_lp": torch.randn(n), "g_ent": torch.randn(n)}
    call = dict(opts, return_entropy=entropy, backend=backend, tile_budget_mb=tile)
    res = run_ok(pool, _logprob_case, {"data": data, "sizes": list(sizes), "opts": call})
    for r in res[1:]:
        assert torch.equal(r["lp"], res[0]["lp"]) and torch.equal(r["dh"], res[0]["dh"])
        assert not entropy or torch.equal(r["ent"], res[0]["ent"])
    leaves = [t.clone().requires_grad_() for t in (h, w, b) if t is not None]
    single = fused_lce.linear_logprobs(*leaves[:2], y, leaves[2] if b is not None else None, **call)
    refs = [t.double().requires_grad_() for t in (h, w, b) if t is not None]
    rlp, rent = logprob_reference(refs[0], refs[1], y, refs[2] if b is not None else None, **opts)
    s_lp, s_ent = single if entropy else (single, None)
    objective = (s_lp * data["g_lp"]).sum() + ((s_ent * data["g_ent"]).sum() if entropy else 0)
    ref_objective = (rlp * data["g_lp"].double()).sum() + ((rent * data["g_ent"].double()).sum()
                                                           if entropy else 0)
    single_grads = torch.autograd.grad(objective, leaves)
    ref_grads = torch.autograd.grad(ref_objective, refs)
    got = res[0]
    for name, ours, one, ref in (("logprob", got["lp"], s_lp, rlp), ("entropy", got["ent"], s_ent, rent)):
        if name == "entropy" and not entropy:
            continue
        torch.testing.assert_close(ours, one.detach(), rtol=2e-6, atol=2e-6)
        mag = float(ref.detach().abs().max())
        assert float((ours.double() - ref.detach()).abs().max()) <= LOSS_TOL[dtype] * (1 + mag), name
    want = [got["dh"], torch.cat([r["dw"] for r in res])] + ([torch.cat([r["db"] for r in res])]
                                                             if bias else [])
    single_tol = 1e-5 if dtype == torch.float32 else GRAD_TOL[dtype]
    for name, ours, one, ref, leaf in zip("hwb", want, single_grads, ref_grads, leaves):
        assert ours.dtype == leaf.dtype and ours.shape == leaf.shape, name
        assert rel_err(ours, one) <= single_tol, (name, rel_err(ours, one))
        assert rel_err(ours, ref) <= GRAD_TOL[dtype], (name, rel_err(ours, ref))
    expect = fdist.comm_bytes(n, d, len(sizes), entropy=entropy)
    for r in res:
        assert r["bytes"]["other"] == 0
        for kind, nbytes in expect.items():
            assert r["bytes"][kind] == nbytes, (kind, r["bytes"], expect)
    return res


# every CPU provider that runs vocab-parallel log-prob problems, run-time registered ones included (npu_twin:
# the AscendC kernels on the CPU twin; the spawned ranks register it too, importing tests/conftest.py with
# this module)
LOGPROB_BACKENDS = ["torch"] + [
    pytest.param(n, marks=pytest.mark.twin) if n.startswith("npu_twin") else n for n in registry.names()
    if n != "torch" and
    registry.why_not(n, Problem(8, 8, 8, torch.float32, torch.device("cpu"), False, Options(group_name="g"),
                                op="logprobs")) is None]


@pytest.mark.parametrize("world,sizes", [(2, (31, 44)), (4, (23, 40, 29, 31))], ids=["tp2", "tp4"])
@pytest.mark.parametrize("backend", LOGPROB_BACKENDS)
def test_logprobs(pools, world, sizes, backend, seed):
    """linear_logprobs vocab-parallel: log-probs and entropy (the extra statistic in the combine),
    temperature, softcap, bias, ignored labels, many token blocks, with and without the entropy; an empty
    shard; bf16."""
    pool = pools(world)
    check_logprob_case(pool, sizes=sizes, backend=backend)
    check_logprob_case(pool, sizes=sizes, backend=backend, temperature=0.7, softcap=3.0, bias=True,
                       ignore_frac=0.2, tile=TINY)
    check_logprob_case(pool, sizes=sizes, backend=backend, temperature=1.3, entropy=False, ignore_frac=0.3)
    if world == 4:
        check_logprob_case(pool, sizes=(3, 0, 120, 9), backend=backend, temperature=0.7, tile=TINY)
    else:
        check_logprob_case(pool, sizes=sizes, backend=backend, dtype=torch.bfloat16,
                           temperature=0.7, bias=True)


# ------------------------------------------------------------------------------------------------ the cases
OPTION_SETS = {
    "plain": {},
    "ignore": {"ignore_frac": 0.3},
    "smooth": {"label_smoothing": 0.15, "ignore_frac": 0.2},
    "zloss": {"z_loss": 0.03},
    "softcap": {"softcap": 2.5},
    "bias": {"bias": True},
    "num_items": {"num_items": 29, "ignore_frac": 0.1},
    "everything": {"label_smoothing": 0.25, "z_loss": 0.02, "softcap": 4.0, "bias": True, "ignore_frac": 0.25,
                   "ignore_index": 3},
}


@pytest.mark.parametrize("world,sizes", [(2, (31, 44)), (4, (23, 40, 29, 31))], ids=["tp2", "tp4"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_options(pools, world, sizes, reduction, seed):
    """Every option and reduction, uneven shards, one token block and many (tiny tile budget)."""
    pool = pools(world)
    for name, opts in OPTION_SETS.items():
        for tile in (None, TINY):
            try:
                check_case(pool, sizes=sizes, reduction=reduction, tile=tile, **dict(opts))
            except AssertionError as e:
                raise AssertionError(f"options {name}, tile {tile}: {e}") from e


@pytest.mark.parametrize("world", [2, 4])
def test_sequence_parallel(pools, world, seed):
    """hidden sharded along its first dimension: (N/tp, D) rows with every option, Megatron's [s/tp, b, h]
    with many token blocks, and a sharded leading dimension combined with shift (which acts on the last token
    dim)."""
    pool = pools(world)
    sizes = (50, 45) if world == 2 else (23, 40, 29, 31)
    for reduction in ("mean", "none"):
        check_case(pool, lead=(8 * world,), sizes=sizes, sp=0, reduction=reduction,
                   **OPTION_SETS["everything"])
        check_case(pool, lead=(4 * world, 3), sizes=sizes, sp=0, reduction=reduction, tile=TINY,
                   ignore_frac=0.2)
        check_case(pool, lead=(2 * world, 5), sizes=sizes, sp=0, reduction=reduction, shift=True, z_loss=0.01)


def test_bf16_and_fp16(pools, seed):
    pool = pools(2)
    for dtype in (torch.bfloat16, torch.float16):
        for reduction in ("mean", "none"):
            check_case(pool, dtype=dtype, reduction=reduction, **OPTION_SETS["everything"])
            check_case(pool, dtype=dtype, reduction=reduction, sp=0, lead=(18,), tile=TINY, ignore_frac=0.1)


@pytest.mark.parametrize("world,sizes", [(2, (31, 44)), (4, (23, 40, 29, 31))], ids=["tp2", "tp4"])
def test_labels_in_one_shard_and_all_ignored(pools, world, sizes, seed):
    pool = pools(world)
    for reduction in ("mean", "sum", "none"):
        # every label in the last shard: the other shards contribute a zero target logit
        check_case(pool, sizes=sizes, reduction=reduction, label_range=(sum(sizes[:-1]), sum(sizes)),
                   label_smoothing=0.1)
        # every label in the first shard, some ignored
        check_case(pool, sizes=sizes, reduction=reduction, label_range=(0, sizes[0]), ignore_frac=0.5)
        # every label ignored: 0 loss (mean/sum), zero gradients, no NaN
        res = check_case(pool, sizes=sizes, reduction=reduction, ignore_frac=1.0, tile=TINY)
        assert all(float(r["loss"].abs().sum()) == 0.0 and float(r["dw"].abs().sum()) == 0.0 for r in res)


def test_empty_and_tiny_shards_need_agreement(pools, seed):
    """Shards so uneven that the planned token blocks differ between ranks (one shard is even empty): without
    an agreed block size the ranks would run different numbers of combine_stats collectives."""
    pool = pools(4)
    for reduction in ("mean", "none"):
        check_case(pool, sizes=(3, 0, 120, 9), reduction=reduction, tile=TINY, **OPTION_SETS["everything"])
        check_case(pool, sizes=(3, 0, 120, 9), reduction=reduction, tile=0.05, sp=0, lead=(40,))


@pytest.mark.parametrize("backend", OTHER_CPU)
def test_other_cpu_backends(pools, backend, seed):
    """The same checks through the other backends that take vocab-parallel problems on CPU (the C++
    kernel)."""
    for world, sizes in ((2, (31, 44)), (4, (23, 40, 29, 31))):
        pool = pools(world)
        for reduction in ("mean", "none"):
            for name in ("plain", "everything"):
                check_case(pool, sizes=sizes, reduction=reduction, backend=backend, tile=TINY,
                           **OPTION_SETS[name])
            check_case(pool, sizes=sizes, reduction=reduction, backend=backend, sp=0, lead=(4 * world, 3),
                       dtype=torch.bfloat16, ignore_frac=0.2)


def test_subgroups_and_module(pools, seed):
    """Two tensor-parallel groups of 2 inside 4 ranks (each with its own data), and the nn.Module form."""
    pool = pools(4)
    check_case(pool, sizes=(30, 41), groups=[[0, 1], [2, 3]], reduction="mean", bias=True, ignore_frac=0.2)
    check_case(pool, sizes=(30, 41), groups=[[0, 2], [1, 3]], reduction="none", sp=0, lead=(12,), z_loss=0.1)
    check_case(pool, sizes=(25, 26, 27, 28), reduction="sum", module=True, label_smoothing=0.2)


# ----------------------------------------------------------------------------------- building blocks directly
def _helpers_case(rank, world, spec):
    """agree_token_blocks, combine_stats tie-breaking, gather_sequence_parallel along dim 1 with both backward
    modes, sp_gather_rows / reduce_grad_rows, and the error paths."""
    name = dist.group.WORLD  # the building blocks take the resolved group object
    out = {}
    out["agree"] = fdist.agree_token_blocks(10 + 7 * rank, 100, name)
    try:
        fdist.agree_token_blocks(8, 100 + (rank == world - 1), name)
        out["mismatch"] = None
    except ValueError as e:
        out["mismatch"] = str(e)
    # ties: every shard has the same max logit -> the lowest global id wins; -inf shards contribute nothing
    n = 4
    m = torch.tensor([1.0, -float("inf"), 2.0 + rank, 0.5])
    s = torch.tensor([2.0, 0.0, 1.0, 1.0])
    amax = torch.full((n,), 100 * (world - rank), dtype=torch.int64)
    out["combine"] = fdist.combine_stats(m, s, torch.full((n,), float(rank)), torch.ones(n), amax, name)
    # the entropy statistic sum e^(z-m)(z-m) of each shard, moved to the global max (an all -inf shard adds 0)
    out["combine_ez"] = fdist.combine_stats(m, s, torch.zeros(n), torch.zeros(n), amax, name,
                                            ez=torch.tensor([-0.5, 0.0, -0.25, 0.1]) * (rank + 1))
    # gather along dim 1 ([b, s/tp, h] shards), backward: slice (already summed) and reduce-scatter (partial)
    x = spec["x"].chunk(world, dim=1)[rank].clone().requires_grad_()
    full = fdist.gather_sequence_parallel(x, dist.group.WORLD, dim=1)
    (full * spec["g"]).sum().backward()
    out["gathered"], out["dx_slice"] = full.detach(), x.grad
    x2 = x.detach().clone().requires_grad_()
    full2 = fdist.gather_sequence_parallel(x2, dist.group.WORLD, dim=-2, grad_is_partial=True)
    (full2 * spec["g"] * (rank + 1)).sum().backward()  # rank r's partial gradient: (r + 1) * g
    out["dx_partial"] = x2.grad
    rows = spec["rows"].chunk(world)[rank]
    got = fdist.sp_gather_rows(rows, name, spec["rows"].shape[0])
    out["rows"] = got
    out["rows_same"] = fdist.sp_gather_rows(spec["rows"], name, spec["rows"].shape[0]) is spec["rows"]
    out["rs"] = fdist.reduce_grad_rows(spec["rows"] * (rank + 1), name, rows.shape[0])
    out["ar"] = fdist.reduce_grad_rows(rows * (rank + 1), name, rows.shape[0])
    try:
        fdist.sp_gather_rows(rows[:1], name, spec["rows"].shape[0] + 1)
        out["rows_err"] = None
    except ValueError as e:
        out["rows_err"] = str(e)
    out["layout"] = fdist.shard_layout(dist.group.WORLD, 5 + rank)
    out["single"] = fdist.gather_sequence_parallel(x, None) is x
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_building_blocks(pools, world, seed):
    x, g, rows = torch.randn(3, 2 * world, 5), torch.randn(3, 2 * world, 5), torch.randn(4 * world, 3)
    res = run_ok(pools(world), _helpers_case, {"x": x, "g": g, "rows": rows})
    tot = world * (world + 1) / 2
    for rank, r in enumerate(res):
        assert r["agree"] == 10
        assert r["mismatch"] is not None and "hidden/labels" in r["mismatch"]
        m, s, t, zs, am = r["combine"]
        assert m.tolist() == [1.0, -float("inf"), 1.0 + world, 0.5]
        assert s[0] == 2.0 * world and s[1] == 0.0 and s[3] == world
        assert float(s[2]) == pytest.approx(sum(torch.exp(torch.tensor(i - world + 1.0)).item()
                                                for i in range(world)))
        assert t.tolist() == [sum(range(world))] * 4 and zs.tolist() == [world] * 4
        assert am.tolist() == [100, 100, 100, 100]  # the lowest global id among the max-holding shards
        *same, ez = r["combine_ez"]
        torch.testing.assert_close(same[1], s)
        ez_q = [-0.5 * (q + 1) for q in range(world)]  # token 0: equal maxima, ez adds up
        assert float(ez[0]) == pytest.approx(sum(ez_q)) and float(ez[1]) == 0.0
        # token 2: shard q has max 2 + q, s = 1, ez = -0.25 (q + 1); moved to the global max 1 + world
        want = sum(math.exp(q + 1 - world) * (-0.25 * (q + 1) + (q + 1 - world)) for q in range(world))
        assert float(ez[2]) == pytest.approx(want, rel=1e-6)
        torch.testing.assert_close(r["gathered"], x)
        torch.testing.assert_close(r["dx_slice"], g.chunk(world, dim=1)[rank])
        torch.testing.assert_close(r["dx_partial"], g.chunk(world, dim=1)[rank] * tot)
        torch.testing.assert_close(r["rows"], rows)
        assert r["rows_same"]
        torch.testing.assert_close(r["rs"], rows.chunk(world)[rank] * tot)
        torch.testing.assert_close(r["ar"], sum(rows.chunk(world)[q] * (q + 1) for q in range(world)))
        assert r["rows_err"] is not None and "hidden" in r["rows_err"]
        assert r["layout"] == (sum(5 + q for q in range(rank)), sum(5 + q for q in range(world)))
        assert r["single"]


def test_sequence_parallel_needs_group():
    h = torch.randn(4, 3)
    with pytest.raises(ValueError, match="process_group"):
        fused_lce.linear_cross_entropy(h, torch.randn(5, 3), torch.zeros(4, dtype=torch.long),
                                       sequence_parallel=True)


def test_comm_bytes_formula():
    assert fdist.comm_bytes(100, 8, 1) == {"all_gather": 0, "all_reduce": 0, "reduce_scatter": 0}
    assert fdist.comm_bytes(100, 8, 4) == {"all_gather": 8 + 2000, "all_reduce": 24 + 3200,
                                           "reduce_scatter": 0}
    assert fdist.comm_bytes(100, 8, 4, entropy=True) == {"all_gather": 8 + 2400, "all_reduce": 24 + 3200,
                                                        "reduce_scatter": 0}
    assert fdist.STATS_BYTES_PER_TOKEN == 20 and fdist.ENTROPY_STATS_BYTES_PER_TOKEN == 24
    assert fdist.comm_bytes(100, 8, 4, sequence_parallel=True, hidden_itemsize=2, sp_reduce_scatter=True,
                            grad_hidden=True) == {"all_gather": 8 + 2000 + 25 * 8 * 2, "all_reduce": 24,
                                                  "reduce_scatter": 3200}


def test_tp_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/tp.py under torchrun with 2 gloo ranks on a tiny fp32 shape: every method and TP size gives
    the same loss (the baselines are correct), and it writes its JSON and markdown."""
    import json
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(root, "benchmarks", "tp.py"), "--device", "cpu", "--dist-backend", "gloo",
           "--dtype", "fp32", "--shapes", "24x16x101,16x8x64", "--tp", "1,2", "--iters", "1", "--warmup", "0",
           "--out", str(tmp_path)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, timeout=240, env=env, stdout=subprocess.DEVNULL)
    report = json.loads((tmp_path / "tp.json").read_text())
    rows = report["results"]
    assert {(r["shape"], r["tp"], r["method"]) for r in rows} == {
        (s, t, m) for s in ("24x16x101", "16x8x64") for t in (1, 2)
        for m in ("fused", "gathered", "vocab_parallel")}
    for shape in ("24x16x101", "16x8x64"):
        losses = [r["loss"] for r in rows if r["shape"] == shape]
        assert max(losses) - min(losses) < 1e-5 * max(1.0, abs(losses[0])), losses
    assert "| 24x16x101 | 2 |" in (tmp_path / "tp.md").read_text()
