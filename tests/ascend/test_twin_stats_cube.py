"""FusedLceStatsCube (csrc/ascend/fused_lce_stats/op_kernel/fused_lce_stats_cube.cpp: the cube computes logit
tiles into a GM ring, the vector cores consume them) compiled and run on the AscendC CPU twin, against
float64: every dtype and option including the log-prob ones (temperature, entropy sum ez), odd V, tails in
every dimension, several cores and segments, shards, both label dtypes, the 910B part and a tiny part that
forces many tiles, cores and segments."""
import pytest
import torch

from fused_lce.core.formulas import reference_logits, reference_stats

from ..support.ascendc_twin import build as twin_build
from ..support.ascendc_twin.ref import make_stats_inputs as make, HW_910B, HW_TINY, assert_stats

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(37, 45, 301), (5, 16, 77), (100, 24, 1000), (130, 33, 257)]
OPTIONS = [dict(), dict(bias=True, with_zsum=True), dict(softcap=5.0, temperature=0.7, with_ez=True),
           dict(bias=True, with_zsum=True, softcap=3.0, temperature=1.3, with_ez=True)]


def ref64(h, w, b, y, vs, softcap, temperature, with_zsum):
    """((max, sum exp, target or 0, zsum or 0, first argmax + vs, z), ez) of z = softcap(h W^T + b) / T."""
    st = reference_stats(h, w, y, b, vocab_start=vs, softcap=softcap, temperature=temperature)
    z = reference_logits(h, w, b, softcap=softcap, temperature=temperature)
    zs = st.zsum if with_zsum else torch.zeros_like(st.zsum)
    return (st.m, st.s, st.target, zs, st.argmax, z), st.ez


def run(ops, h, w, b, y, vs=0, softcap=0.0, temperature=1.0, with_zsum=False, with_ez=False):
    return ops._twin_stats_cube(h, w, b, y, vs, softcap, temperature, with_zsum, with_ez)


def check(got, h, w, b, y, vs, softcap, temperature, with_zsum, with_ez, msg):
    ref, ez = ref64(h, w, b, y, vs, softcap, temperature, with_zsum)
    scale = float(ref[5].abs().max())
    assert_stats(got[:5], ref, scale, vs, msg)
    if with_ez:
        tol = 3e-5 * (ez.abs() + ref[1] * (1.0 + scale))
        assert torch.all((got[5].double() - ez).abs() <= tol), \
            f"ez {msg}: {(got[5].double() - ez).abs().max()}"
    else:
        assert torch.all(got[5] == 0), f"ez not requested {msg}"


@pytest.mark.parametrize("hw", [HW_910B, HW_TINY], ids=["910b", "tiny"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: "-".join(sorted(o)) or "plain")
def test_cube_stats_match_float64(ops, part, seed, hw, dtype, opt):
    part(hw, sched_seed=seed)
    for n, d, v in SHAPES:
        h, w, b = make(n, d, v, dtype, opt.get("bias", False))
        y = torch.randint(0, v, (n,))
        args = (0, opt.get("softcap", 0.0), opt.get("temperature", 1.0), opt.get("with_zsum", False),
                opt.get("with_ez", False))
        check(run(ops, h, w, b, y, *args), h, w, b, y, *args, f"seed={seed} shape={(n, d, v)}")


def test_cube_plan_forces_many_tiles_cores_and_segments(ops, part):
    """The tiny part's plan has several vocabulary blocks per task, tails, several AI cores and segments, so
    the ring wraps many times and the finishing phase runs."""
    part(HW_TINY)
    plan = ops._twin_plan_stats_cube(37, 45, 301, 2, 0, True)
    assert plan[0] == 0 and plan[6] > 4 and plan[9] > 1 and plan[10] != plan[2], plan
    plan = ops._twin_plan_stats_cube(5, 16, 300, 4, 0, True)
    assert plan[7] > 1, plan  # segments
    # ids travel as exact floats: V < 2^24
    assert ops._twin_plan_stats_cube(5, 16, 1 << 24, 4, 0, False)[0] == 3


@pytest.mark.parametrize("label_dtype", [torch.int64, torch.int32])
def test_cube_vocab_shard_and_label_dtypes(ops, part, seed, label_dtype):
    part(HW_TINY, sched_seed=seed)
    n, d, v, vs, vt = 41, 20, 150, 300, 1000
    h, w, b = make(n, d, v, torch.bfloat16, True)
    y = torch.randint(0, vt, (n,)).to(label_dtype)
    y[:10] = torch.randint(vs, vs + v, (10,)).to(label_dtype)
    got = run(ops, h, w, b, y, vs, 0.0, 1.0, True, True)
    check(got, h, w, b, y, vs, 0.0, 1.0, True, True, f"seed={seed}")
    assert bool((got[4] >= vs).all() and (got[4] < vs + v).all())


def test_cube_segments_merge(ops, part, seed):
    part(HW_TINY, sched_seed=seed)
    h, w, _ = make(5, 16, 300, torch.float32, False)
    y = torch.randint(0, 300, (5,))
    check(run(ops, h, w, None, y, 0, 2.0, 0.5, True, True), h, w, None, y, 0, 2.0, 0.5, True, True,
          f"seed={seed}")


def test_cube_first_argmax_on_ties(ops, part, seed):
    """Equal maxima in different chunks, blocks and segments: the lowest id wins."""
    part(HW_TINY, sched_seed=seed)
    n, d, v = 6, 16, 200
    h = torch.zeros(n, d)
    h[:, 0] = 1.0
    w = torch.randn(v, d) * 0.1
    w[:, 0] = 0.0
    for cols in ([3, 150], [17, 18, 190], [0, 199], [64, 65, 128]):
        w[cols, 0] = 9.0
    y = torch.zeros(n, dtype=torch.long)
    got = run(ops, h, w, None, y)
    ref, _ = ref64(h, w, None, y, 0, 0.0, 1.0, False)
    assert torch.equal(got[4], ref[4])
    part(HW_910B, sched_seed=seed)  # one tile of 256 columns: ties across the 64-column chunks of a row
    h, w2 = torch.zeros(3, 16), torch.randn(256, 16) * 0.1
    h[:, 0], w2[:, 0] = 1.0, 0.0
    w2[[70, 130, 200], 0] = 9.0
    assert torch.equal(run(ops, h, w2, None, torch.zeros(3, dtype=torch.long))[4], torch.full((3,), 70))


def test_cube_non_finite_logits(ops, part, seed):
    """-inf logits (a masked vocabulary) add 0 to the sums and ez (not NaN); NaN inputs give NaN
    statistics."""
    part(HW_TINY, sched_seed=seed)
    n, d, v = 4, 16, 100
    h, w, _ = make(n, d, v, torch.float32, False)
    b = torch.zeros(v)
    b[:60] = -float("inf")
    y = torch.full((n,), 70)
    got = run(ops, h, w, b, y, 0, 0.0, 1.0, False, True)
    ref, ez = ref64(h, w, b, y, 0, 0.0, 1.0, False)
    assert torch.allclose(got[0].double(), ref[0], rtol=1e-5) and \
        torch.allclose(got[1].double(), ref[1], rtol=1e-5)
    assert torch.allclose(got[5].double(), ez, rtol=1e-4, atol=1e-5)
    h2 = h.clone()
    h2[1, 3] = float("nan")
    got = run(ops, h2, w, None, torch.zeros(n, dtype=torch.long), 0, 0.0, 1.0, True, True)
    assert torch.isnan(got[1][1]) and torch.isnan(got[3][1]) and torch.isnan(got[5][1]) and \
        not torch.isnan(got[1][0])


def test_cube_empty_batch_and_single_token(ops, part):
    part(HW_910B)
    h, w, b = make(0, 8, 10, torch.bfloat16, True)
    assert all(t.shape == (0,) for t in run(ops, h, w, b, torch.zeros(0, dtype=torch.long), with_ez=True))
    h, w, b = make(1, 1, 1, torch.float32, True)
    y = torch.zeros(1, dtype=torch.long)
    check(run(ops, h, w, b, y, 0, 0.0, 1.0, True, True), h, w, b, y, 0, 0.0, 1.0, True, True, "1x1x1")


def test_cube_scheduler_seeds_agree(ops, part, seed):
    """Different interleavings of cube and vector cores give bitwise the same statistics."""
    h, w, b = make(37, 45, 301, torch.bfloat16, True)
    y = torch.randint(0, 301, (37,))
    outs = []
    for s in (seed, seed + 1, seed + 2):
        part(HW_TINY, sched_seed=s, switch_prob=0.9)
        outs.append(run(ops, h, w, b, y, 0, 2.0, 0.8, True, True))
    for o in outs[1:]:
        for a, b_ in zip(outs[0], o):
            assert torch.equal(a, b_)


def test_cube_work_counters(ops, part, seed):
    """The twin's work counters (benchmarks/npu_model.py): the cube cores do every FLOP of the GEMM (2 N V D)
    and no vector work, the vector cores the opposite."""
    part(HW_TINY, sched_seed=seed)
    n, d, v = 37, 45, 301
    h, w, b = make(n, d, v, torch.bfloat16, False)
    y = torch.randint(0, v, (n,))
    run(ops, h, w, b, y)
    rows = twin_build.counters()
    aic, aiv = [r for r in rows if r["aic"]], [r for r in rows if not r["aic"]]
    assert len(aiv) == 2 * len(aic) > 0
    assert sum(r["cube_flops"] for r in aic) == 2 * n * v * d and all(r["cube_flops"] == 0 for r in aiv)
    assert all(r["v_instr"] == 0 for r in aic) and all(r["v_instr"] > 0 for r in aiv if r["gm_rd"] > 0)
    assert sum(r["gm_rd"] for r in aiv) >= n * v * 4  # every logit read from the ring once


def test_cube_balances_the_last_wave_with_segments(ops, part, seed):
    """Token blocks not a multiple of the cores: the planner splits the vocabulary so that the busiest core
    gets fewer tiles (910B: 32 blocks on 24 cores -> 3 segments; 18 blocks, 6 cores idle -> 4 segments, 72
    tasks), and the merged statistics stay exact."""
    part(HW_910B)
    plan = ops._twin_plan_stats_cube(4096, 3584, 152064, 2, 0, False)
    assert plan[5] == 32 and plan[7] == 3 and plan[8] == 96, plan
    plan = ops._twin_plan_stats_cube(2304, 4096, 151936, 2, 0, False)
    assert plan[5] == 18 and plan[7] == 4 and plan[8] == 72 and plan[9] == 24, plan
    assert ops._twin_plan_stats_cube(3072, 64, 1000, 2, 0, False)[7] == 1  # 24 blocks: already balanced
    part(HW_TINY, sched_seed=seed)
    mb = ops._twin_plan_stats_cube(4096, 16, 301, 2, 0, True)[1]  # the full tile height
    n = 6 * mb  # 6 token blocks on 5 cores
    plan = ops._twin_plan_stats_cube(n, 16, 301, 2, 0, True)
    assert plan[5] == 6 and plan[7] > 1, plan
    h, w, b = make(n, 16, 301, torch.bfloat16, True)
    y = torch.randint(0, 301, (n,))
    check(run(ops, h, w, b, y, 0, 0.0, 0.9, True, True), h, w, b, y, 0, 0.0, 0.9, True, True, f"seed={seed}")
