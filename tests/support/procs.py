"""A pool of spawned gloo ranks that run ``fn(rank, world, payload)`` on request, reused across a test module:
the distributed tests of the core and of the integrations share it."""
from __future__ import annotations

import datetime
import io
import multiprocessing
import os
import queue
import shutil
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist


def _dumps(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(blob: bytes):
    return torch.load(io.BytesIO(blob), weights_only=False)


def _serve(rank, world, init_file, tasks, results):
    torch.set_num_threads(1)  # 4 ranks share 2 cores
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    while True:
        item = tasks.get()
        if item is None:
            break
        fn, blob = item
        try:
            results.put((rank, True, _dumps(fn(rank, world, _loads(blob)))))
        except BaseException:  # reported to the test, which fails with this rank's traceback
            results.put((rank, False, traceback.format_exc()))


class Pool:
    """``world`` spawned gloo ranks that run ``fn(rank, world, payload)`` on request; reused across tests."""

    def __init__(self, world):
        ctx = multiprocessing.get_context("spawn")
        self.world = world
        self.dir = tempfile.mkdtemp(prefix="fused_lce_gloo_")
        self.tasks = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        init_file = os.path.join(self.dir, "init")
        self.procs = [ctx.Process(target=_serve, args=(r, world, init_file, self.tasks[r], self.results),
                                  daemon=True) for r in range(world)]
        for p in self.procs:
            p.start()
        self.healthy = True

    def run(self, fn, payload, timeout=120):
        blob = _dumps(payload)
        for q in self.tasks:
            q.put((fn, blob))
        out, errors = [None] * self.world, []
        for _ in range(self.world):
            try:
                rank, ok, data = self.results.get(timeout=timeout)
            except queue.Empty:
                self.healthy = False
                raise AssertionError(f"no answer within {timeout}s: collective "
                                     "mismatch or deadlock") from None
            if ok:
                out[rank] = _loads(data)
            else:
                errors.append(f"rank {rank}:\n{data}")
        if errors:
            return errors
        return out

    def close(self):
        for p in self.procs:  # nothing to save: no graceful gloo teardown (it can take seconds per rank)
            p.kill()
        for p in self.procs:
            p.join()
        shutil.rmtree(self.dir, ignore_errors=True)


_POOLS: dict[int, Pool] = {}


@pytest.fixture(scope="module")
def pools():
    def get(world):
        pool = _POOLS.get(world)
        if pool is None or not pool.healthy:
            if pool is not None:
                pool.close()
            pool = _POOLS[world] = Pool(world)
        return pool

    yield get
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


def run_ok(pool, fn, payload):
    out = pool.run(fn, payload)
    if out and isinstance(out[0], str):  # errors
        pool.healthy = False  # a rank that raised may have left the others inside a collective
        raise AssertionError("\n".join(out))
    return out
