"""fused_lce.patch under DeepSpeed ZeRO-3 (CPU accelerator, gloo, 2 processes), tied and untied embeddings:
ZeRO-3 releases each parameter after its module's forward and gathers it again for backward from a hook on the
module's output. The fused loss is computed inside ``lm_head``'s call and the loss relay returns the tensor
that hook wrapped, so backward re-gathers the head's weight. Losses (the first also equal to the unsharded
model's) and updated parameters equal the stock model's under the same ZeRO-3 training, also for a step
through TRL's fused LM head (whose per-token outputs the head returns as one tensor, for the same reason)."""
from __future__ import annotations

import copy
import importlib.util
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
if importlib.util.find_spec("deepspeed") is None:  # imported in the workers only, after DS_ACCELERATOR is set
    pytest.skip("deepspeed is not installed", allow_module_level=True)
pytest.importorskip("trl")

from ...conftest import spawn_pair  # noqa: E402
from ..conftest import tiny_qwen3  # noqa: E402

pytestmark = pytest.mark.distributed
WORLD, V, STEPS, LR = 2, 96, 3, 0.5


def _batch(seed, step, rank):
    g = torch.Generator().manual_seed(seed * 31 + step * 7 + rank)
    ids = torch.randint(1, V, (2, 9), generator=g)
    labels = ids.clone()
    labels[:, :2] = -100
    return {"input_ids": ids, "labels": labels}


def _worker(rank, init_file, seed, out):
    os.environ.update(DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1", RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    import torch.distributed as dist

    import sys

    import deepspeed
    import deepspeed.comm.torch  # noqa: F401 (deepspeed.comm.torch the attribute is the torch package)

    # its shared-memory all-reduce is JIT-compiled at start-up (a minute); gloo's is all this test needs
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    deepspeed.init_distributed(dist_backend="gloo")
    try:
        for tie in (False, True):
            out[(rank, tie)] = _check(rank, seed, tie)
    finally:
        dist.destroy_process_group()


def _train(model, seed, rank, calls=None):
    """STEPS ZeRO-3 steps of ``model`` on this rank's batches, then a step on TRL's fused-head objective:
    (losses, engine). ``calls`` given: the model is patched."""
    import deepspeed

    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10 ** 9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
                                      config=config)
    head = engine.module.lm_head.weight
    assert head.ds_status.name == "NOT_AVAILABLE" and head.numel() == 0  # sharded: ZeRO-3 gathers it per use
    losses = []
    for step in range(STEPS):
        out = engine(**_batch(seed, step, rank))
        engine.backward(out.loss)
        engine.step()
        losses.append(out.loss.detach())
        if calls is not None:
            assert out.logits is None
    # TRL's objective from its per-token log-probs and entropy (as DPO / GRPO use them). Patched: through
    # TRL's fused LM head, served by fused_lce. Stock: from the full logits -- TRL's own head is not the
    # reference here, its backward fails under ZeRO-3 on this setup (ChunkedLogProbFunction gets the released,
    # empty weight)
    batch = _batch(seed, STEPS, rank)
    if calls is not None:
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(engine.module, outputs=("log_probs", "entropy"))
        out = engine(**batch, fused_lm_head=True)
        logprobs, entropy = out.log_probs, out.entropy
    else:
        logits = engine(input_ids=batch["input_ids"]).logits[:, :-1].float()
        labels = batch["labels"][:, 1:]
        mask = labels != -100
        logp = logits.log_softmax(-1)
        logprobs = logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0] * mask
        entropy = -(logp.exp() * logp).sum(-1) * mask
    loss = -logprobs.sum() / (batch["labels"][:, 1:] != -100).sum() + 0.1 * entropy.mean()
    engine.backward(loss)
    engine.step()
    losses.append(loss.detach())
    return losses, engine


def _check(rank, seed, tie):
    import deepspeed

    import fused_lce
    from fused_lce.core import driver

    from ..conftest import record_driver_calls

    model = tiny_qwen3(seed, tie, V)
    first = model(**_batch(seed, 0, rank)).loss.detach()  # the unsharded model, before any step
    stock = copy.deepcopy(model)
    fused_lce.patch(model)
    real = driver.forward, driver.logprobs_forward
    calls = record_driver_calls(setattr)
    try:
        losses, engine = _train(model, seed, rank, calls)
    finally:
        driver.forward, driver.logprobs_forward = real
    # the gathered head, in each plain step and in the TRL step
    assert [(c.op, c.weight_shape) for c in calls] == [("loss", (V, 32))] * STEPS + [("logprobs", (V, 32))], \
        calls
    ref_losses, ref_engine = _train(stock, seed, rank)
    torch.testing.assert_close(losses[0], first, atol=1e-5, rtol=1e-5)
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m: f"rank {rank} step {step}: {m}")
    checked = 0
    for (name, p), q in zip(engine.module.named_parameters(), ref_engine.module.parameters()):
        with deepspeed.zero.GatheredParameters([p, q]):
            torch.testing.assert_close(p.detach(), q.detach(), atol=1e-5, rtol=1e-4,
                                       msg=lambda m, n=name: f"rank {rank} seed={seed} tie={tie} {n}: {m}")
        checked += 1
    return checked


def test_zero3_tied_and_untied_gloo_two_processes(tmp_path, seed):
    """Both layouts in one pair of processes (spawning and importing DeepSpeed dominates the runtime)."""
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        out = manager.dict()
        spawn_pair(_worker, lambda k: (str(tmp_path / f"pg_init{k}"), seed, out), WORLD)
        results = dict(out)
    assert sorted(results) == [(r, t) for r in range(WORLD) for t in (False, True)]
    assert all(n > 10 for n in results.values()), results
