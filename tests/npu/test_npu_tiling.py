"""(a) The tiling header csrc/include/fused_lce_tiling.h: C++ unit tests (UB / L1 / L0 budgets, tails, V not a
multiple of the block, N beyond 32 bits) and the Python mirror used by the emulator."""
import json
import random
import re
import subprocess

from . import npu_emulator as E


def test_header_unit_tests(tiling_binary):
    r = subprocess.run([tiling_binary], capture_output=True, text=True, timeout=120)
    m = re.search(r"(\d+) passed, (\d+) failed", r.stdout)
    assert m, r.stdout + r.stderr
    assert r.returncode == 0 and int(m.group(2)) == 0, r.stdout
    assert int(m.group(1)) > 100_000  # the shape grid ran


def _shapes(seed):
    rng = random.Random(seed)
    shapes = [(8192, 4096, 151936, 2, 0), (5, 896, 151936, 2, 8), (0, 64, 100, 4, 15), (1, 1, 1, 2, 15),
              (2**40 + 7, 4096, 152064, 2, 8), (2**62, 4096, 151936, 2, 8), (10, 64, 100, 3, 0), (10, 0, 5, 2, 0)]
    for _ in range(400):
        shapes.append((rng.choice([0, 1, rng.randrange(1, 300), rng.randrange(1, 70000)]),
                       rng.choice([1, rng.randrange(1, 9000), 65534]),
                       rng.choice([1, rng.randrange(1, 2000), rng.randrange(1, 300000)]),
                       rng.choice([2, 4]), rng.randrange(16)))
    return shapes


def test_python_mirror_matches_header(tiling_binary, seed):
    shapes = _shapes(seed)
    text = "".join(f"{n} {d} {v} {e} {f}\n" for n, d, v, e, f in shapes)
    r = subprocess.run([tiling_binary, "--dump"], input=text, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(shapes)
    for shape, line in zip(shapes, lines):
        want = json.loads(line)
        got = E.plan(*shape)
        if want["status"] != E.OK:
            assert got.status == want["status"], shape
            continue
        for key, value in want.items():
            assert getattr(got, key) == value, (shape, key, getattr(got, key), value)


def test_plan_index_helpers_cover_every_tile():
    p = E.plan(300, 40, 1000, 2, 0)
    seen = set()
    for t in range(p.tasks):
        m_idx, s_idx = p.task_coords(t)
        for nb in p.segment_blocks(s_idx):
            r0, r1 = p.block_rows(m_idx)
            c0, c1 = p.block_cols(nb)
            seen.add((r0, r1, c0, c1))
    rows = sum((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in seen)
    assert rows == 300 * 1000 and len(seen) == p.m_blocks * p.n_blocks
