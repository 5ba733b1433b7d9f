"""fused_lce.patch under FSDP2 (torch.distributed.fsdp.fully_shard), 2 processes, gloo on CPU: the LM head in
its own FSDP group (untied) or in the root group (tied to the embeddings). The fused loss runs inside the
head's module call, so FSDP's hooks unshard its weight; gradients equal the unsharded stock model's, averaged
over ranks."""
from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist

transformers = pytest.importorskip("transformers")
fsdp = pytest.importorskip("torch.distributed.fsdp")
if not hasattr(fsdp, "fully_shard") or not dist.is_available():
    pytest.skip(f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard",
                allow_module_level=True)

from ...conftest import spawn_pair  # noqa: E402
from ..conftest import tiny_qwen3  # noqa: E402

pytestmark = pytest.mark.distributed
WORLD = 2
V = 96


def _batch(seed, rank):
    g = torch.Generator().manual_seed(seed * 7 + rank)
    ids = torch.randint(1, V, (2, 9 + rank), generator=g)  # ranks see different sequence lengths
    labels = ids.clone()
    labels[:, :2] = -100
    labels[1, -3:] = -100
    return {"input_ids": ids, "labels": labels}


def _worker(rank, init_file, seed):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        for tie in (False, True):
            _check(rank, seed, tie)
    finally:
        dist.destroy_process_group()


def _check(rank, seed, tie):
    import fused_lce
    from fused_lce.core import driver

    from ..conftest import record_driver_calls

    model = tiny_qwen3(seed, tie, V)
    ref = copy.deepcopy(model)
    for layer in model.model.layers:
        fsdp.fully_shard(layer)
    if not tie:  # a tied head shares its weight with the embeddings: it stays in the root group
        fsdp.fully_shard(model.lm_head)
    fsdp.fully_shard(model)
    fused_lce.patch(model)

    real = driver.forward, driver.logprobs_forward
    seen = record_driver_calls(setattr)
    try:
        out = model(**_batch(seed, rank))
        out.loss.backward()
    finally:
        driver.forward, driver.logprobs_forward = real
    assert out.logits is None
    # the op got the unsharded (V, D) weight: FSDP's pre-forward hook ran around it
    assert [(c.op, c.weight_shape) for c in seen] == [("loss", (V, 32))], seen

    # reference: the unsharded stock model; FSDP averages the gradients of the ranks' losses
    losses = [ref(**_batch(seed, r)).loss for r in range(WORLD)]
    (sum(losses) / WORLD).backward()
    torch.testing.assert_close(out.loss.detach(), losses[rank].detach(), atol=1e-5, rtol=1e-5)
    ref_params = dict(ref.named_parameters())
    checked = 0
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        full = p.grad.full_tensor()  # only to compare; the forward used the module call
        torch.testing.assert_close(full, ref_params[name].grad, atol=1e-5, rtol=1e-4,
                                   msg=lambda m, n=name: f"rank {rank} seed={seed} {n}: {m}")
        checked += 1
    assert checked == len(ref_params)


def test_fsdp2_gloo_two_processes(tmp_path, seed):
    """Both layouts in one pair of processes (spawning and importing transformers dominates the runtime)."""
    spawn_pair(_worker, lambda k: (str(tmp_path / f"pg_init{k}"), seed), WORLD)
