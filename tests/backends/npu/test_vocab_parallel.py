"""Vocab-parallel path of both NPU backends on CPU: two gloo ranks each hold half of the vocabulary; the
CANN-trio wrapper (fake torch_npu) and the "npu" provider (its AscendC kernel sources on the CPU twin) must
give every rank the unsharded loss, lse and (all-reduced) dX, and each rank its own rows of dW, against the
float64 reference."""
import dataclasses
import math
import os
import socket
import sys

import pytest
import torch

from ...conftest import spawn_pair

HERE = os.path.dirname(os.path.abspath(__file__))


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def _worker(rank, world, port, seed):
    root = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
    sys.path[:0] = [os.path.join(root, "tests", "support", "fake_torch_npu"), root]
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import torch_npu  # noqa: F401  (the fake)
        from tests.support.ascendc_twin import build as twin_build

        from tests.conftest import run_provider, run_provider_backward

        from fused_lce.backends.npu import cann as npu_cann
        from fused_lce.core import Options, Problem
        from fused_lce.backends.npu import AscendCProvider
        from fused_lce.core.formulas import reference_loss

        n, d, v = 40, 24, 300
        g = torch.Generator().manual_seed(seed)
        h = torch.randn(n, d, generator=g).to(torch.bfloat16)
        w = (torch.randn(v, d, generator=g) * (3.0 / math.sqrt(d))).to(torch.bfloat16)
        y = torch.randint(0, v, (n,), generator=g)
        y[::5] = -100
        start, stop = (0, 170) if rank == 0 else (170, v)  # uneven shards
        h64, w64 = h.double().requires_grad_(), w.double().requires_grad_()
        per, lse, _, nv = reference_loss(h64, w64, y, reduction="none", z_loss=1e-3)
        scale = 1.0 / float(nv)
        (per.sum() * scale).backward()
        # the AscendC kernel sources on the CPU twin behind the npu provider, on CPU tensors
        emulated = AscendCProvider("npu_twin", kernels=twin_build.TwinKernels(), device_types=("cpu",))
        cfg = Options(ignore_index=-100, z_loss=1e-3, group_name=dist.group.WORLD.group_name,
                      vocab_start=start, vocab_total=v)
        # the trio rounds logits to bf16 (loss / lse ~1e-3); the own kernels keep fp32 logits
        # and with a tile budget that gives the two shards different token blocks (16 and 20 rows): the ranks
        # agree on 16, so 3 driver blocks with a collective each
        small = dataclasses.replace(cfg, tile_bytes=16 * 6 * 170)
        for name, be, ltol, tol, opts in (("npu_cann", npu_cann.PROVIDER, 2e-3, 1.5e-2, cfg),
                                          ("npu", emulated, 1e-5, 1e-2, cfg),
                                          ("npu_blocks", emulated, 1e-5, 1e-2, small)):
            assert name != "npu_blocks" or \
                emulated.token_block(Problem(n, d, stop - start, h.dtype, h.device, False,
                                             small), True) == (16 if rank == 0 else 20)
            loss, lse_o, _, (dh, dw, _) = run_provider(be, h, w[start:stop], y, None, opts,
                                                       torch.tensor(scale), (True, True, False))
            dh = dh.float()
            dist.all_reduce(dh)  # what the driver does for a group
            ctx = (name, rank, seed)
            assert _rel(loss, per) < ltol and _rel(lse_o, lse) < ltol, (ctx, _rel(loss, per),
                                                                        _rel(lse_o, lse))
            assert _rel(dh, h64.grad) < tol, (ctx, _rel(dh, h64.grad))
            assert _rel(dw, w64.grad[start:stop]) < tol, (ctx, _rel(dw, w64.grad[start:stop]))
            dh2, dw2, _ = run_provider_backward(be, torch.full((n,), scale), h, w[start:stop], y, None,
                                                lse_o, opts, (True, True, False))
            dist.all_reduce(dh2)
            assert _rel(dh2, h64.grad) < tol and _rel(dw2, w64.grad[start:stop]) < tol, ctx
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_vocab_parallel_npu_backends_match_unsharded_reference(seed):
    def args(_attempt):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return 2, s.getsockname()[1], seed

    spawn_pair(_worker, args)
