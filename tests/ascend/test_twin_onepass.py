"""The one-pass modes of the cube-driven kernels on the AscendC CPU twin (hazard checker on):
FusedLceStatsCube's zCache output (the cube's raw h W^T tiles) and FusedLceGradCube's zCache input (no logit
GEMM) and keepDz (dz kept between the phases in the workspace, phase W without z / vector work). Against
float64 (every dtype, bias, softcap, temperature, the coefficients u and b, ignored rows, tails, both parts),
against the recompute mode (bitwise with the z cache alone; within float32 rounding with dz kept: whole-K dX /
dW GEMMs from the kept Dz, db partials per token block), grad-mask subsets, bitwise determinism across
scheduler seeds, the cube FLOPs (3 GEMMs of 2 N D V for fwd + bwd instead of 5), the cube's GM writes with dz
kept (each output element once), the workspace formula, and the npu provider's cache route over several driver
blocks."""
import pytest
import torch

from ..support.ascendc_twin import build as twin_build
from .test_twin_grads_cube import coefs, grads64, lse_of, make
from ..support.ascendc_twin.ref import GRAD_RTOL, HW_910B, HW_TINY, rel_l2

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
OPTIONS = [dict(), dict(bias=True, u=True), dict(bias=True, u=True, b=True, softcap=3.0, temperature=1.3)]
MODES = {"zc": (True, False), "dz": (False, True), "zc+dz": (True, True)}  # (z cache, dz kept)


def zcache_of(ops, h, w, bias, y, softcap, temperature):
    """The forward's z cache, and a check that keeping it leaves the statistics bit for bit unchanged."""
    kept = ops._twin_stats_cube(h, w, bias, y, 0, softcap, temperature, True, True, True)
    plain = ops._twin_stats_cube(h, w, bias, y, 0, softcap, temperature, True, True)
    for x, x_ in zip(kept[:6], plain[:6]):
        assert torch.equal(x, x_)
    assert plain[6].numel() == 0
    return kept[6]


def grads(ops, h, w, bias, y, lse, c, sc, temp, mask=(True, True, True), zc=None, keep_dz=False):
    a, t, b, u = c
    return ops._twin_grads_cube(h, w, bias, y, lse, a, t, b, u, 0, sc, temp, list(mask), zc, keep_dz)


def ignore_rows(y, c):
    """Every fourth token ignored as the driver sends it: label -100 (outside the shard), coefficients 0."""
    y = y.clone()
    y[::4] = -100
    return (y,
            tuple(None if x is None else x.clone().index_fill_(0, torch.arange(0, len(y), 4), 0.0)
                  for x in c))


def cube_flops(ops) -> int:
    return sum(r["cube_flops"] for r in twin_build.counters())


def vector_instr(ops) -> int:
    return sum(r["v_instr"] for r in twin_build.counters() if not r["aic"])


@pytest.mark.parametrize("hw", [HW_910B, HW_TINY], ids=["910b", "tiny"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: "-".join(sorted(o)) or "plain")
def test_onepass_grads_match_float64_and_recompute(ops, part, seed, hw, dtype, opt):
    part(hw, sched_seed=seed)
    sc, temp = opt.get("softcap", 0.0), opt.get("temperature", 1.0)
    shapes = [(130, 33, 257)] if hw is HW_910B else [(37, 45, 301), (130, 33, 257)]
    for n, d, v in shapes:
        h, w, bias, y = make(n, d, v, dtype, opt)
        lse = lse_of(h, w, bias, sc, temp)
        y, c = ignore_rows(y, coefs(n, opt))
        zc = zcache_of(ops, h, w, bias, y, sc, temp)
        raw = h.double() @ w.double().t()  # the cache holds h W^T before bias / softcap / temperature
        assert zc.dtype == torch.float32 and zc.shape == (n, v)
        assert rel_l2(zc, raw) < 1e-6
        ref = grads64(h, w, bias, y, lse, *c, 0, sc, temp)
        base = grads(ops, h, w, bias, y, lse, c, sc, temp)
        for mode, (use_zc, keep) in MODES.items():
            got = grads(ops, h, w, bias, y, lse, c, sc, temp, zc=zc if use_zc else None, keep_dz=keep)
            msg = f"{mode} seed={seed} shape={(n, d, v)}"
            for name, g, r, b0 in zip(("dx", "dw", "db"), got, ref, base):
                if name == "db" and bias is None:
                    assert g.numel() == 0
                    continue
                assert torch.isfinite(g).all(), f"{name} {msg}"
                assert rel_l2(g, r) < GRAD_RTOL[dtype], f"{name} {msg}: {rel_l2(g, r):.2e}"
                if keep:  # whole-K GEMMs (dX, dW) and db's per-token-block partials: another summation order
                    assert rel_l2(g, b0) < 1e-5, f"{name} {msg} vs recompute"
                else:  # the same GEMMs and vector work in the same order
                    assert torch.equal(g, b0), f"{name} {msg}: differs from the recompute mode"


def test_onepass_grad_mask_subsets(ops, part, seed):
    """Each mask subset in each mode gives the full run's components bit for bit (and nothing else)."""
    part(HW_TINY, sched_seed=seed)
    opt = dict(bias=True, u=True, b=True, softcap=3.0, temperature=1.3)
    h, w, bias, y = make(37, 20, 150, torch.bfloat16, opt)
    lse = lse_of(h, w, bias, 3.0, 1.3)
    c = coefs(37, opt)
    zc = zcache_of(ops, h, w, bias, y, 3.0, 1.3)
    for mode, (use_zc, keep) in MODES.items():
        kw = dict(zc=zc if use_zc else None, keep_dz=keep)
        full = grads(ops, h, w, bias, y, lse, c, 3.0, 1.3, **kw)
        for mask in [(True, False, False), (False, True, False), (False, False, True), (False, True, True),
                     (True, False, True)]:
            got = grads(ops, h, w, bias, y, lse, c, 3.0, 1.3, mask=mask, **kw)
            for i in range(3):
                if mask[i]:
                    assert torch.equal(got[i], full[i]), f"{mode} mask={mask} component {i}"
                else:
                    assert got[i].numel() == 0


def test_onepass_bitwise_deterministic_across_seeds(ops, part, seed):
    """No cross-core atomics in the new modes either: every scheduler interleaving gives the same bits."""
    opt = dict(bias=True, u=True, b=True, softcap=3.0, temperature=1.3)
    h, w, bias, y = make(45, 33, 301, torch.bfloat16, opt)
    lse = lse_of(h, w, bias, 3.0, 1.3)
    c = coefs(45, opt)
    for mode, (use_zc, keep) in [("dz", MODES["dz"]), ("zc+dz", MODES["zc+dz"])]:
        outs = []
        for s in (seed, seed + 1, seed + 2):
            part(HW_TINY, sched_seed=s, switch_prob=0.9)
            zc = zcache_of(ops, h, w, bias, y, 3.0, 1.3) if use_zc else None
            outs.append((zc, grads(ops, h, w, bias, y, lse, c, 3.0, 1.3, zc=zc, keep_dz=keep)))
        for zc, o in outs[1:]:
            if use_zc:
                assert torch.equal(zc, outs[0][0])
            for x, x_ in zip(outs[0][1], o):
                assert torch.equal(x, x_), mode


def test_onepass_cube_flops_three_gemms(ops, part, seed):
    """The twin's cube count: forward 1 GEMM of 2 N D V; backward 4 recomputing, 3 with dz kept, 2 with the z
    cache: fwd + bwd 5 -> 3. With dz kept, the backward's vector work is one pass over the tiles instead of
    two (no bias here: with one, db's per-tile column sums and partials add to the vector side)."""
    part(HW_TINY, sched_seed=seed)
    n, d, v = 70, 24, 200
    h, w, bias, y = make(n, d, v, torch.bfloat16, dict())
    lse = lse_of(h, w, bias, 0.0, 1.0)
    c = coefs(n, dict())
    gemm = 2 * n * d * v
    zc = ops._twin_stats_cube(h, w, bias, y, 0, 0.0, 1.0, False, False, True)[6]
    assert cube_flops(ops) == gemm
    expect = {(False, False): 4, (False, True): 3, (True, False): 2, (True, True): 2}
    vec = {}
    for (use_zc, keep), k in expect.items():
        grads(ops, h, w, bias, y, lse, c, 0.0, 1.0, zc=zc if use_zc else None, keep_dz=keep)
        assert cube_flops(ops) == k * gemm, (use_zc, keep)
        vec[(use_zc, keep)] = vector_instr(ops)
    assert vec[(True, True)] == vec[(False, True)] < 0.6 * vec[(True, False)], vec


def test_onepass_kept_dz_writes_each_output_once(ops, part, seed):
    """With dz kept the cube runs one whole-K GEMM per output block (dX[m] from Dz's rows, K = V; dW[nb] from
    Dz's columns, K = N): the twin's GM write counter of the cube cores (fixpipe only, with the z cache: no
    C1) is N x D + V x D floats, each output element once, instead of once per vocabulary / token block with
    per-tile GEMMs."""
    part(HW_TINY, sched_seed=seed)
    n, d, v = 70, 24, 200
    h, w, bias, y = make(n, d, v, torch.bfloat16, dict())
    lse = lse_of(h, w, bias, 0.0, 1.0)
    c = coefs(n, dict())
    mb, nb = ops._twin_plan_grad_cube(n, d, v, 2, 0)[8:10]
    assert mb > 1 and nb > 1
    zc = ops._twin_stats_cube(h, w, bias, y, 0, 0.0, 1.0, False, False, True)[6]

    def cube_written(keep):
        grads(ops, h, w, bias, y, lse, c, 0.0, 1.0, zc=zc, keep_dz=keep)
        return sum(r["gm_wr"] for r in twin_build.counters() if r["aic"])

    assert cube_written(False) == (nb * n + mb * v) * d * 4
    assert cube_written(True) == (n + v) * d * 4


def test_onepass_workspace_formula(ops, part):
    """plan_grad's ws_total_keep = ws_total + Dz (N x V operand dtype, row-major) + 2 x m_blocks x V fp32 db
    partials (with a bias); ws_total (keepDz = 0) is unchanged."""
    part(HW_910B)
    al = lambda x: -(-x // 512) * 512  # noqa: E731
    for n, d, v, elt in [(8192, 4096, 151936, 2), (1000, 256, 5003, 4), (37, 45, 301, 2)]:
        for flags in (0, 1):
            st, bm, bn, _, cores, ws, _, ws_keep, mb, nb, keep_cols = \
                ops._twin_plan_grad_cube(n, d, v, elt, flags)
            assert st == 0
            assert mb == -(-n // bm) and nb == -(-v // bn)
            assert ws_keep == ws + al(n * v * elt) + (al(2 * mb * v * 4) if flags else 0)
            # Dz kept in column chunks whose row stride fits the GM -> L1 copy's 16-bit srcDValue
            assert keep_cols == min(v, 65534 // bn * bn) and keep_cols % bn == 0 or keep_cols == v


@pytest.fixture
def onepass_provider(ops):
    """The npu provider over the cube-driven kernels on the twin (one-pass modes on), registered for the test
    only; the kernels object counts the calls that passed a z cache."""
    from fused_lce.core import registry
    from fused_lce.backends.npu import AscendCProvider

    class Spy(twin_build.TwinKernels):
        cached = 0
        blocks = 0

        in_place = 0

        def grads(self, *a, zcache=None, keep_dz=False, dw_out=None, **kw):
            Spy.blocks += 1
            Spy.cached += zcache is not None
            r = super().grads(*a, zcache=zcache, keep_dz=keep_dz, dw_out=dw_out, **kw)
            Spy.in_place += dw_out is not None and r[1] is dw_out
            return r

    k = Spy()
    registry.register(AscendCProvider("npu_twin_onepass", kernels=k, device_types=("cpu",)))
    yield Spy
    registry.unregister("npu_twin_onepass")
    twin_build.configure(HW_910B, 1, 0.3, True)


def test_onepass_provider_blocks_and_cache(onepass_provider, seed):
    """linear_cross_entropy through the provider with a tile budget that forces several driver blocks: the
    grads in the forward use the z cache, dW / db accumulate over the blocks, and the result matches the torch
    backend (float64-checked elsewhere) and is bitwise the same under another scheduler seed."""
    import fused_lce

    n, d, v = 300, 24, 173
    h0 = torch.randn(n, d)
    w0 = torch.randn(v, d) / d**0.5 * 3
    b0 = torch.randn(v)
    y = torch.randint(0, v, (n,))
    y[::7] = -100
    budget_mb = 128 * v * 8 / 2**20  # 128 rows of z cache + dz (fp32) per block: 3 blocks
    outs = {}
    for backend, sched in [("torch", 1), ("npu_twin_onepass", seed), ("npu_twin_onepass", seed + 1)]:
        twin_build.configure(HW_TINY, sched, 0.5, True)
        h, w, b = (x.clone().requires_grad_() for x in (h0, w0, b0))
        loss = fused_lce.linear_cross_entropy(h, w, y, b, label_smoothing=0.1, z_loss=1e-3, softcap=4.0,
                                              backend=backend, tile_budget_mb=budget_mb)
        loss.backward()
        outs.setdefault(backend, []).append((loss.detach(), h.grad, w.grad, b.grad))
    assert onepass_provider.blocks == 6 and onepass_provider.cached == 6
    assert onepass_provider.in_place == 4  # blocks 2 and 3 of each run add dW into the first block's
    ref = outs["torch"][0]
    first, second = outs["npu_twin_onepass"]
    for name, x, r in zip(("loss", "dh", "dw", "db"), first, ref):
        assert rel_l2(x, r) < 2e-5, f"{name}: {rel_l2(x, r):.2e}"
    for x, x_ in zip(first, second):
        assert torch.equal(x, x_)


def test_onepass_vocab_shard_matches_recompute(ops, part, seed):
    """A vocabulary shard (vocab_start != 0, labels mostly outside it, the global lse): z cache + dz kept
    equal the recompute mode (within float32 rounding: whole-K GEMMs) and float64."""
    part(HW_TINY, sched_seed=seed)
    n, d, v, vs = 41, 20, 150, 300
    opt = dict(bias=True, b=True, u=True)
    h, w, bias, y = make(n, d, v, torch.float16, opt, vs=vs, vt=1000)
    lse = lse_of(h, w, bias, 0.0, 1.0) + 0.3
    a, t, b, u = coefs(n, opt)
    zc = ops._twin_stats_cube(h, w, bias, y, vs, 0.0, 1.0, False, False, True)[6]
    base = ops._twin_grads_cube(h, w, bias, y, lse, a, t, b, u, vs, 0.0, 1.0, [True] * 3)
    got = ops._twin_grads_cube(h, w, bias, y, lse, a, t, b, u, vs, 0.0, 1.0, [True] * 3, zc, True)
    ref = grads64(h, w, bias, y, lse, a, t, b, u, vs, 0.0, 1.0)
    for g, b0 in zip(got, base):  # whole-K GEMMs and per-token-block db partials: another summation order
        assert rel_l2(g, b0) < 1e-5
    for g, r in zip(got, ref):
        assert rel_l2(g, r) < GRAD_RTOL[torch.float16]


class _Kernels:
    """Kernels that are never launched (token_block is planning only)."""

    supports_cache = True


def test_provider_token_block_bound():
    """token_block: rows x V x (4 + elt) (keep) or rows x V x elt within the tile budget, a multiple of 128
    when >= 128 rows fit, at least 1 row; the default budget when 0."""
    from fused_lce.core import Options, Problem
    from fused_lce.backends.npu.provider import DEFAULT_TILE_BYTES, AscendCProvider

    def prob(n, v, dtype, tile_bytes):
        return Problem(n, 64, v, dtype, torch.device("cpu"), False, Options(tile_bytes=tile_bytes))

    new = AscendCProvider("y", kernels=_Kernels(), device_types=("cpu",))
    p = prob(100000, 151936, torch.bfloat16, 1 << 30)
    keep, plain = new.token_block(p, True), new.token_block(p, False)
    assert keep % 128 == 0 and keep * 151936 * 6 <= 1 << 30 < (keep + 128) * 151936 * 6
    assert plain % 128 == 0 and plain * 151936 * 2 <= 1 << 30 < (plain + 128) * 151936 * 2
    assert new.token_block(prob(100000, 151936, torch.bfloat16, 0), True) == \
        new.token_block(prob(100000, 151936, torch.bfloat16, DEFAULT_TILE_BYTES), True)
    assert new.token_block(prob(50, 1000, torch.float32, 1 << 30), True) == 50
    small = new.token_block(prob(500, 1000, torch.float32, 80 * 1000 * 8), True)
    assert small == 80  # fewer than 128 rows fit: not rounded
    assert new.token_block(prob(500, 1000, torch.float32, 10), True) == 1


def test_onepass_dw_accumulates_in_place(ops, part, seed):
    """dw_acc: the kernel adds dW into the given float32 buffer (it only ever adds to dW): from zeros it is
    the fresh result bit for bit, a second launch gives twice it within float32 rounding; dX / db are
    unaffected."""
    part(HW_TINY, sched_seed=seed)
    opt = dict(bias=True, u=True)
    h, w, bias, y = make(37, 20, 150, torch.bfloat16, opt)
    lse = lse_of(h, w, bias, 0.0, 1.0)
    a, t, b, u = coefs(37, opt)
    zc = ops._twin_stats_cube(h, w, bias, y, 0, 0.0, 1.0, False, False, True)[6]
    args = (h, w, bias, y, lse, a, t, b, u, 0, 0.0, 1.0, [True] * 3, zc, True)
    fresh = ops._twin_grads_cube(*args)
    acc = torch.zeros(150, 20)
    got = ops._twin_grads_cube(*args, acc)
    assert got[1].numel() == 0 and torch.equal(acc, fresh[1])
    assert torch.equal(got[0], fresh[0]) and torch.equal(got[2], fresh[2])
    ops._twin_grads_cube(*args, acc)
    assert rel_l2(acc, 2 * fresh[1]) < 1e-6


def test_onepass_several_token_blocks_per_core(ops, part, seed):
    """More token blocks than cores (tiny part: 8 blocks on 5 cores), so a core's phase X walks several token
    blocks and phase W's dz tiles come from every core: equal to the recompute mode and float64."""
    part(HW_TINY, sched_seed=seed, switch_prob=0.7)
    n, d, v = 230, 16, 77
    opt = dict(bias=True, u=True, b=True, softcap=3.0, temperature=1.3)
    assert ops._twin_plan_grad_cube(n, d, v, 2, 1)[8] > ops._twin_plan_grad_cube(n, d, v, 2, 1)[4]
    h, w, bias, y = make(n, d, v, torch.bfloat16, opt)
    lse = lse_of(h, w, bias, 3.0, 1.3)
    y, c = ignore_rows(y, coefs(n, opt))
    zc = zcache_of(ops, h, w, bias, y, 3.0, 1.3)
    base = grads(ops, h, w, bias, y, lse, c, 3.0, 1.3)
    got = grads(ops, h, w, bias, y, lse, c, 3.0, 1.3, zc=zc, keep_dz=True)
    ref = grads64(h, w, bias, y, lse, *c, 0, 3.0, 1.3)
    assert all(rel_l2(g, b0) < 1e-5 for g, b0 in zip(got, base))
    for g, r in zip(got, ref):
        assert rel_l2(g, r) < GRAD_RTOL[torch.bfloat16]
