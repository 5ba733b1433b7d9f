"""Fuzz: random shapes (zero-size dimensions included), dtypes, layouts (transposed, strided, expanded
inputs), options and bad values thrown at the public API and at the direct ops. Every case must end in a
ValueError / TypeError naming the bad argument, or in the float64 reference's answer (NaN exactly where a
label is out of range with validate=False) -- never a crash, another exception or a silently wrong number. The
"numeric" kind throws valid inputs at float32's edges instead (ignored tokens with huge logits or a low
temperature, softcaps across their whole range) at the loss and the log-probs, also on the AscendC kernels'
CPU twin. The cases (tests/fuzz_cases.py) run in a few subprocess batches, so a crash fails one batch and
names its case. Deterministic in CI (the seed fixture); a fresh draw locally (FUSED_LCE_TEST_SEED=<seed>
replays one).
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
# the numeric kind also runs the AscendC kernels on the CPU twin, where tests/conftest.py registers it
NUMERIC_BACKENDS = CPU_BACKENDS + [n for n in ("npu_twin",) if n in fused_lce.backend_info()]
CASES = {"api": 150, "ops": 150, "numeric": 100}  # per batch; ~3-10 s a batch on 2 cores


def run_batch(kind: str, backend: str, seed: int, count: int) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "tests.fuzz_cases", kind, backend, str(seed), str(count)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    if proc.returncode != 0:
        started = [ln for ln in lines if ln.startswith("START")]
        pytest.fail(f"the {kind} batch (backend={backend}, seed={seed}) died with rc {proc.returncode} in "
                    f"case {started[-1] if started else '?'}; stderr: {proc.stderr[-3000:]}")
    results = [json.loads(ln) for ln in lines if ln.startswith("{")]
    assert len(results) == count, proc.stdout[-2000:] + proc.stderr[-2000:]
    return results


@pytest.mark.parametrize("kind", ["api", "ops"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_fuzz(kind, backend, seed):
    results = run_batch(kind, backend, seed, CASES[kind])
    assert_all_ok(results, seed)
    # the draw covers both outcomes (a generator that only made errors would test nothing)
    assert sum(r["case"]["corruption"] is None for r in results) > len(results) // 4
    assert sum(r["case"]["corruption"] is not None for r in results) > len(results) // 4


@pytest.mark.parametrize("backend", [pytest.param(n, marks=[pytest.mark.twin] if n == "npu_twin" else [])
                                     for n in NUMERIC_BACKENDS])
def test_fuzz_numeric(backend, seed):
    """Ignored tokens with logits far beyond exp's float32 range (large logits, low temperatures) and softcaps
    across their whole range, through the loss and the log-probs (tests/fuzz_cases.py, kind "numeric")."""
    from .fuzz_cases import NUMERIC_CLASSES

    results = run_batch("numeric", backend, seed, CASES["numeric"])
    assert_all_ok(results, seed)
    for cls in NUMERIC_CLASSES:  # both classes drawn, through both ops
        for op in ("loss", "logprobs"):
            assert any(r["case"]["cls"] == cls and r["case"]["op"] == op for r in results), (cls, op)


def assert_all_ok(results: list[dict], seed: int) -> None:
    failed = [r for r in results if not r["ok"]]
    detail = "\n".join(f"case {r['i']}: {r['why']}\n    {r['case']}" for r in failed[:5])
    assert not failed, f"{len(failed)} of {len(results)} cases failed (seed {seed}):\n{detail}"
