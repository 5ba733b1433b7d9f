"""FusedLceStatsVector (csrc/ascend/fused_lce_stats) compiled and run on the AscendC CPU twin, against float64 per-token
statistics: every dtype and option, odd V, tails in every dimension, several cores and vocabulary segments (the
finishing phase behind SyncAll), vocabulary shards (vocab_start != 0), the 910B part and a tiny part."""
import pytest
import torch

from ..support.ascendc_twin.ref import make_stats_inputs as make, HW_910B, HW_TINY, assert_stats, ez64, stats64

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (N, D, V): tails in N, D and V; few tokens (segments), many vocabulary blocks on the tiny part
SHAPES = [(37, 45, 301), (5, 16, 77), (100, 24, 1000), (130, 33, 257)]
OPTIONS = [dict(), dict(bias=True), dict(with_zsum=True), dict(softcap=5.0), dict(bias=True, with_zsum=True,
                                                                                 softcap=3.0)]


def run(ops, h, w, b, y, vs, softcap, with_zsum):
    """The loss statistics (temperature 1, no entropy: the sixth output is empty)."""
    out = ops._twin_stats_vector(h, w, b, y, vs, softcap, 1.0, with_zsum, False)
    assert out[5].numel() == 0
    return out[:5]


@pytest.mark.parametrize("hw", [HW_910B, HW_TINY], ids=["910b", "tiny"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: "-".join(sorted(o)) or "plain")
def test_stats_match_float64(ops, part, seed, hw, dtype, opt):
    part(hw, sched_seed=seed)
    for n, d, v in SHAPES:
        h, w, b = make(n, d, v, dtype, opt.get("bias", False))
        y = torch.randint(0, v, (n,))
        softcap, zsum = opt.get("softcap", 0.0), opt.get("with_zsum", False)
        got = run(ops, h, w, b, y, 0, softcap, zsum)
        ref = stats64(h, w, b, y, 0, softcap, zsum)
        assert_stats(got, ref, float(ref[5].abs().max()), 0, f"seed={seed} shape={(n, d, v)}")


@pytest.mark.parametrize("label_dtype", [torch.int64, torch.int32])
def test_vocab_shard_and_label_dtypes(ops, part, seed, label_dtype):
    """A shard [vocab_start, vocab_start + V) of a larger vocabulary: labels outside it give target 0, argmax ids are
    global; both label dtypes the OpDef lists."""
    part(HW_TINY, sched_seed=seed)
    n, d, v, vs, vt = 41, 20, 150, 300, 1000
    h, w, b = make(n, d, v, torch.bfloat16, True)
    y = torch.randint(0, vt, (n,)).to(label_dtype)
    y[:10] = torch.randint(vs, vs + v, (10,)).to(label_dtype)  # some labels inside the shard
    got = run(ops, h, w, b, y, vs, 0.0, True)
    ref = stats64(h, w, b, y, vs, 0.0, True)
    assert_stats(got, ref, float(ref[5].abs().max()), vs, f"seed={seed}")
    assert bool((got[4] >= vs).all() and (got[4] < vs + v).all())


def test_segments_merge_like_one_block(ops, part, seed):
    """Few tokens on many cores: the vocabulary is split into segments whose statistics the finishing phase merges;
    the result matches a plan with one segment (more tokens than cores)."""
    part(HW_TINY, sched_seed=seed)
    plan = ops._twin_plan_vector(5, 16, 300, 4, 0)
    assert plan[7] > 1, plan  # segments
    h, w, _ = make(5, 16, 300, torch.float32, False)
    y = torch.randint(0, 300, (5,))
    got = run(ops, h, w, None, y, 0, 0.0, True)
    ref = stats64(h, w, None, y, 0, 0.0, True)
    assert_stats(got, ref, float(ref[5].abs().max()), 0, f"seed={seed}")


def test_first_argmax_on_ties_across_blocks_and_segments(ops, part, seed):
    """Equal maxima in different vocabulary blocks and segments: the lowest id wins (strict > in the online update,
    ReduceMax's smallest index inside a block, segment order in the finishing phase)."""
    part(HW_TINY, sched_seed=seed)
    n, d, v = 6, 16, 200
    h = torch.zeros(n, d)
    h[:, 0] = 1.0
    w = torch.randn(v, d) * 0.1
    w[:, 0] = 0.0
    for cols in ([3, 150], [17, 18, 190], [0, 199], [64, 65, 128]):
        w[cols, 0] = 9.0
    got = run(ops, h, w, None, torch.zeros(n, dtype=torch.long), 0, 0.0, False)
    ref = stats64(h, w, None, torch.zeros(n, dtype=torch.long), 0, 0.0, False)
    assert torch.equal(got[4], ref[4])


def test_non_finite_logits_propagate(ops, part, seed):
    """A -inf logit row keeps sum 0 until a finite logit arrives; NaN inputs give NaN statistics (not hidden)."""
    part(HW_TINY, sched_seed=seed)
    n, d, v = 4, 16, 100
    h, w, _ = make(n, d, v, torch.float32, False)
    b = torch.zeros(v)
    b[:60] = -float("inf")  # the first vocabulary blocks are all -inf for every row
    got = run(ops, h, w, b, torch.full((n,), 70), 0, 0.0, False)
    ref = stats64(h, w, b, torch.full((n,), 70), 0, 0.0, False)
    assert torch.allclose(got[0].double(), ref[0], rtol=1e-5) and torch.allclose(got[1].double(), ref[1], rtol=1e-5)
    h2 = h.clone()
    h2[1, 3] = float("nan")
    got = run(ops, h2, w, None, torch.zeros(n, dtype=torch.long), 0, 0.0, True)
    assert torch.isnan(got[1][1]) and torch.isnan(got[3][1]) and not torch.isnan(got[1][0])


def test_empty_batch_and_single_token(ops, part):
    part(HW_910B)
    h, w, b = make(0, 8, 10, torch.bfloat16, True)
    out = run(ops, h, w, b, torch.zeros(0, dtype=torch.long), 0, 0.0, True)
    assert all(t.shape == (0,) for t in out)
    h, w, b = make(1, 1, 1, torch.float32, True)
    got = run(ops, h, w, b, torch.zeros(1, dtype=torch.long), 0, 0.0, True)
    ref = stats64(h, w, b, torch.zeros(1, dtype=torch.long), 0, 0.0, True)
    assert_stats(got, ref, 1.0 + float(ref[5].abs().max()), 0, "1x1x1")


def test_scheduler_seeds_agree(ops, part, seed):
    """Different interleavings of the cores give the same statistics (the forward has no atomics)."""
    h, w, b = make(37, 45, 301, torch.bfloat16, True)
    y = torch.randint(0, 301, (37,))
    outs = []
    for s in (seed, seed + 1, seed + 2):
        part(HW_TINY, sched_seed=s, switch_prob=0.9)
        outs.append(run(ops, h, w, b, y, 0, 2.0, True))
    for o in outs[1:]:
        for a, b_ in zip(outs[0], o):
            assert torch.equal(a, b_)


# ------------------------------------------------------------------ linear_logprobs: temperature and entropy (ez)
def assert_ez(ez, ref, scale, msg):
    """ez = sum exp(z - m) (z - m) against float64: E_p[z] - m = ez / s to float32 rounding of the logits."""
    rm, rs, z = ref[0], ref[1], ref[5]
    rez = ez64(z, rm)
    assert ez.dtype == torch.float32 and ez.shape == rm.shape, msg
    err = (ez.double() - rez).abs()
    tol = 2e-5 * scale * rs + 1e-5 * rez.abs()
    assert bool((err <= tol).all()), f"ez {msg}: worst {float((err - tol).max())}"


TEMP_OPTIONS = [dict(temperature=0.7), dict(temperature=1.3, bias=True), dict(temperature=0.7, softcap=4.0),
                dict(temperature=1.0), dict(temperature=1.3, softcap=3.0, bias=True, with_zsum=True)]


@pytest.mark.parametrize("hw", [HW_910B, HW_TINY], ids=["910b", "tiny"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opt", TEMP_OPTIONS, ids=lambda o: "-".join(f"{k}{v}" for k, v in sorted(o.items())))
def test_temperature_and_entropy_match_float64(ops, part, seed, hw, dtype, opt):
    """z = softcap(h W^T + b) / T (softcap first): every statistic of the tempered logits, and ez, on shapes with
    tails, many cores and (tiny part) vocabulary segments merged by the finishing phase."""
    part(hw, sched_seed=seed)
    temp, cap, zsum = opt["temperature"], opt.get("softcap", 0.0), opt.get("with_zsum", False)
    for n, d, v in SHAPES:
        h, w, b = make(n, d, v, dtype, opt.get("bias", False))
        y = torch.randint(0, v, (n,))
        got = ops._twin_stats_vector(h, w, b, y, 0, cap, temp, zsum, True)
        ref = stats64(h, w, b, y, 0, cap, zsum, temp)
        scale = float(ref[5].abs().max())
        msg = f"seed={seed} shape={(n, d, v)}"
        assert_stats(got, ref, scale, 0, msg)
        assert_ez(got[5], ref, scale, msg)
        plain = ops._twin_stats_vector(h, w, b, y, 0, cap, temp, zsum, False)  # the same statistics without ez
        assert plain[5].numel() == 0 and all(torch.equal(a, c) for a, c in zip(plain[:5], got[:5])), msg


def test_entropy_segments_with_minus_inf_logits(ops, part, seed):
    """-inf logits add 0 to ez (not 0 * -inf): whole vocabulary blocks and segments that are -inf for every row
    (partials with m = -inf merge as 0), scattered -inf columns, and a row whose logits are all -inf (m = -inf,
    s = ez = 0)."""
    part(HW_TINY, sched_seed=seed)
    n, d, v = 5, 16, 300
    assert ops._twin_plan_vector(n, d, v, 4, 1 | 16)[7] > 1  # segments (kBias | kEntropy)
    h, w, _ = make(n, d, v, torch.float32, False)
    b = torch.zeros(v)
    b[:130] = -float("inf")  # the first segments: -inf for every row
    b[torch.randperm(v)[:40]] = -float("inf")
    y = torch.randint(150, v, (n,))
    got = ops._twin_stats_vector(h, w, b, y, 0, 0.0, 0.8, False, True)
    ref = stats64(h, w, b, y, 0, 0.0, False, 0.8)
    assert torch.isfinite(got[5]).all()
    assert_stats(got, ref, float(ref[5][torch.isfinite(ref[5])].abs().max()), 0, f"seed={seed}")
    assert_ez(got[5], ref, float(ref[5][torch.isfinite(ref[5])].abs().max()), f"seed={seed}")
    dead = ops._twin_stats_vector(h, w, torch.full((v,), -float("inf")), y, 0, 0.0, 1.0, False, True)
    assert torch.equal(dead[1], torch.zeros(n)) and torch.equal(dead[5], torch.zeros(n))
    assert bool((dead[0] == -float("inf")).all())


def test_entropy_nan_propagates_and_seeds_agree(ops, part, seed):
    """A NaN hidden row gives a NaN ez for that token only; interleavings give the same ez bit for bit."""
    n, d, v = 37, 45, 301
    h, w, b = make(n, d, v, torch.bfloat16, True)
    y = torch.randint(0, v, (n,))
    outs = []
    for s in (seed, seed + 1):
        part(HW_TINY, sched_seed=s, switch_prob=0.9)
        outs.append(ops._twin_stats_vector(h, w, b, y, 0, 2.0, 0.7, False, True))
    assert all(torch.equal(a, c) for a, c in zip(*outs))
    h2 = h.clone()
    h2[3, 1] = float("nan")
    got = ops._twin_stats_vector(h2, w, b, y, 0, 0.0, 1.3, False, True)
    assert torch.isnan(got[5][3]) and torch.isfinite(got[5][torch.arange(n) != 3]).all()
