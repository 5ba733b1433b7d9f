"""Fuzz: random shapes (zero-size dimensions included), dtypes, layouts (transposed, strided, expanded inputs),
options and bad values thrown at the public API and at the direct ops. Every case must end in a ValueError /
TypeError naming the bad argument, or in the float64 reference's answer (NaN exactly where a label is out of range
with validate=False) -- never a crash, another exception or a silently wrong number. The cases
(tests/fuzz_cases.py) run in a few subprocess batches, so a crash fails one batch and names its case.
Deterministic in CI (the seed fixture); a fresh draw locally (FUSED_LCE_TEST_SEED=<seed> replays one).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import fused_lce

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_BACKENDS = [n for n in ("torch", "cpp") if fused_lce.backend_info()[n]["available"]]
CASES = {"api": 150, "ops": 150}  # per batch; ~3-5 s a batch on 2 cores


def run_batch(kind: str, backend: str, seed: int, count: int) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "tests.fuzz_cases", kind, backend, str(seed), str(count)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    if proc.returncode != 0:
        started = [ln for ln in lines if ln.startswith("START")]
        pytest.fail(f"the {kind} batch (backend={backend}, seed={seed}) died with rc {proc.returncode} in case "
                    f"{started[-1] if started else '?'}; stderr: {proc.stderr[-3000:]}")
    results = [json.loads(ln) for ln in lines if ln.startswith("{")]
    assert len(results) == count, proc.stdout[-2000:] + proc.stderr[-2000:]
    return results


@pytest.mark.parametrize("kind", list(CASES))
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_fuzz(kind, backend, seed):
    results = run_batch(kind, backend, seed, CASES[kind])
    failed = [r for r in results if not r["ok"]]
    detail = "\n".join(f"case {r['i']}: {r['why']}\n    {r['case']}" for r in failed[:5])
    assert not failed, f"{len(failed)} of {len(results)} cases failed (seed {seed}):\n{detail}"
    # the draw covers both outcomes (a generator that only made errors would test nothing)
    assert sum(r["case"]["corruption"] is None for r in results) > len(results) // 4
    assert sum(r["case"]["corruption"] is not None for r in results) > len(results) // 4
