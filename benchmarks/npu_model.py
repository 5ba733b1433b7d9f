"""Performance model of the AscendC kernels on an Atlas A2 (910B), from work counted on the CPU twin.

Nothing here ran on an NPU. The twin (tests/support/ascendc_twin) counts, per core and launch, vector
instructions and the UB bytes they write (repeats = bytes / 256), scalar-pipe operations, GM bytes, cube FLOPs
and the cube's GM -> L1 operand bytes (fused_lce::_twin_counters; which operand tiles stay in L1 as the Matmul
library's buffers allow, docs/npu-twin-rules.md). Counting the Qwen heads on the twin is infeasible (hours of
emulation), so the per-tile work is counted on small shapes with the same tile and D as the 910B plan of the
big shape (one AI core, one token block, two and four vocabulary blocks: the difference is one tile's work,
the rest the task's fixed cost) and scaled by the big shape's tile count; cube FLOPs and ring / workspace
bytes per tile are analytic (the twin's FLOPs at the small shape are checked against the same formula). The
cube's operand bytes go through L2 and each core's MTE2, and bound every pass below with the other L2 traffic.
Time per kernel:
  * cube (FusedLceStatsCube / FusedLceGradCube): cube and vector overlap through the two-slot rings, per tile
    max(cube, vector); the backward runs phase X (token blocks over cores) then phase W (vocabulary blocks
    over cores), two GEMMs per tile in each, the fp32 accumulation of dX / dW by the owning core read and
    written in L2;
  * trio (CANN's npu_fused_linear_online_max_sum + ..._backward, hicann/ops-nn
    matmul/fused_linear_online_max_sum and matmul/fused_linear_cross_entropy_loss_grad mem_friendly): the same
    overlap, logits staged as bf16, its backward writes per-core fp32 dX / dW partials and sums them on the
    vector cores (V2), read and written in L2 (the blocks being accumulated by the 24 cores fit its 192 MB);
    its vector work per tile is taken equal to the cube pair's (not counted: its source is not compiled here);
  * dz_kept / onepass (FusedLceGradCube's 3-GEMM modes; see three_gemm): per launch of at most the tile
    budget's rows, phase X forms dz of every tile (from a z GEMM overlapped with the vector work, or, onepass,
    from the z the forward kept) and keeps it in GM, then dX = dz W and dW += dz^T h run as two GEMMs from GM
    that accumulate their whole K in L0C (one write per output tile; dW read back after the first launch).
Every kernel is also bounded below by HBM bytes / bandwidth and by ring / staging / accumulation bytes / L2
bandwidth. Tasks (token block, vocabulary segment) are dealt to the 24 cores in waves, so ceil(tasks / 24)
waves are paid (e.g. 32 token blocks in one segment cost two full waves; the cube-driven forward's planner
splits the vocabulary to balance them; the trio deals (m, n) tiles round-robin, CVProcess). The floor is 6 N D
V / cube peak (forward + backward GEMMs once each); every schedule that recomputes the logits in the backward
does 8 N D V, i.e. >= 1.33x the floor; only onepass does 6 N D V.

Published figures used (cite): GM (HBM) bandwidth about 1.6 TB/s, L2 about 7 TB/s and 192 MB (asc-devkit
docs/zh/guide/算子实践参考/SIMD算子性能优化/内存访问/L2-Cache切分.md); 24 AI cores with 2 vector cores each (Atlas A2
MIX 1:2, asc-devkit docs; fused_lce_tiling.h HwSpec); per cube core and cycle 16 x 16 x 16 MACs for b16 (bf16
/ fp16) and 16 x 16 x 4 for b32 (fp32) at 1800 MHz on dav-2201 (Atlas A2 / A3), from asc-devkit
tests/perf/mmad_perf/generate_roofline.py (SCENARIO_CONFIG, "2201 主频 1800 MHz"; mirror commit 82b89a1), which
gives 24 x 4096 x 2 x 1.8e9 = 354 TFLOPS bf16 on the 24-core parts (910B1 / B2; the 20-core 910B3 / B4 give
295, the host twin's part presets). (Third-party pages quote 256-376 TFLOPS for "910B"; the Atlas 800T A2's
2.5 PFLOPS for 8 NPUs gives 313, i.e. a lower sustained clock or fewer cores on that SKU: the clock is one of
the figures only a 910B can confirm, and every ratio below is to a floor at the same peak.) Assumptions (only
a 910B can confirm them): one 256-byte vector repeat per cycle per vector core, VEC_ISSUE cycles of issue /
barrier overhead per vector instruction, SCALAR_CYCLES per scalar operation, fp32 cube at 1/4 of the bf16
rate, no other stalls. Two more are parameters, and the model is run at three settings of them
(``Assumptions``):
  * cube efficiency: the MMAD rate a tile sustains as a fraction of peak (MTE1 loads into L0, fixpipe
    write-back, pipeline bubbles and scalar issue included). asc-devkit's Matmul tuning case on an Atlas A2
    (docs/zh/guide/算子实践参考/优秀实践/Matmul性能调优案例/Matmul算子优化Tiling策略.md: 4096 x 5120 x 4096 fp16, 128 x 256 base
    tiles, MDL copies) reaches "cube utilisation 80%+"; the model takes 85% and 70% as its range;
  * per-core MTE2 bandwidth: the GM -> L1 copy rate of one cube core. The same case measures 2491 GB/s with
    one base block per copy and 3406 GB/s with MDL's multi-block copies over 20 cube cores, i.e. 125 and 170
    GB/s per core; each tile's operand copies (counted on the twin for the tile loops, analytic elsewhere)
    overlap its MMADs, and a pass is also bounded by its operand bytes over 24 x this rate.
The "peak" setting (100%, no per-core MTE2 limit) is the lower bound the model used to report alone; the floor
stays at 100% of peak in every setting, so the ratios include the efficiency lost.

Run: python benchmarks/npu_model.py [--cube-eff HIGH LOW] [--mte2-gbps HIGH LOW]
(writes benchmarks/results/npu_model.json and .md)
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import NamedTuple

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # the twin is a test double: tests/support
from tests.support.ascendc_twin import build as twin_build  # noqa: E402

from fused_lce.backends.npu import provider as npu_provider  # noqa: E402
from fused_lce.tools.bench import environment  # noqa: E402

# ---- 910B figures (see the module docstring for sources) ---------------------------------------------------
CUBE_CORES = 24
VEC_PER_CUBE = 2
CLOCK_HZ = 1.8e9  # dav-2201 (asc-devkit tests/perf/mmad_perf/generate_roofline.py)
CUBE_PEAK = {"bfloat16": CUBE_CORES * 16 * 16 * 16 * 2 * CLOCK_HZ,
             "float16": CUBE_CORES * 16 * 16 * 16 * 2 * CLOCK_HZ,
             "float32": CUBE_CORES * 16 * 16 * 4 * 2 * CLOCK_HZ}  # MACs per cycle: b16 16x16x16, b32 16x16x4
HBM_BPS = 1.6e12
L2_BPS = 7e12
VEC_BYTES_PER_CYCLE = 256
VEC_ISSUE = 8       # cycles per vector instruction beyond its repeats (assumption)
SCALAR_CYCLES = 2   # cycles per scalar-pipe operation (assumption)



class Assumptions(NamedTuple):
    """One setting of the two efficiency parameters (module docstring)."""

    name: str
    cube_eff: float        # sustained MMAD rate / peak
    mte2_core_bps: float   # GM -> L1 bytes per second of one cube core (inf: no per-core limit)


PEAK = Assumptions("peak", 1.0, math.inf)
HIGH = Assumptions("high", 0.85, 170e9)
LOW = Assumptions("low", 0.70, 125e9)

SHAPES = [(8192, 4096, 151936), (32768, 4096, 151936), (16384, 2048, 151936), (8192, 2304, 256000),
          (4096, 3584, 152064)]
DTYPES = {"bfloat16": torch.bfloat16}
# The counting runs use the big shape's D: the vector work per tile does not depend on it, but the cube's GM
# -> L1 operand bytes do (whether a token block's hidden rows stay in L1 across its tiles).


def _hw_one_core() -> dict:
    hw = dict(twin_build.HW_910B)
    hw["cube_cores"] = 1
    return hw


def _vec_cycles(row) -> float:
    """Cycles of one vector core for counted work (v_instr, v_bytes, s_ops)."""
    v_instr, v_bytes, s_ops = row
    return v_bytes / VEC_BYTES_PER_CYCLE + VEC_ISSUE * v_instr + SCALAR_CYCLES * s_ops


def _counters():
    """(v_instr, v_bytes, s_ops) of the busiest vector core, cube FLOPs and cube GM -> L1 operand bytes of
    every core, from the twin's counters of the last launch."""
    rows = twin_build.counters()
    worst = max((r for r in rows if not r["aic"]),
                key=lambda r: _vec_cycles((r["v_instr"], r["v_bytes"], r["s_ops"])))
    return ((worst["v_instr"], worst["v_bytes"], worst["s_ops"]), sum(r["cube_flops"] for r in rows),
            sum(r["l1_in"] for r in rows))


def count_per_tile(ops, kernel: str, dtype, bm: int, bn: int, d: int):
    """Counted on the twin for one AI core, one token block and 2 / 4 vocabulary blocks of the big shape's
    tile and hidden size d: (per-tile (v_instr, v_bytes, s_ops) of the busiest vector core, their per-task
    fixed part, per-tile cube operand bytes copied GM -> L1, their per-task fixed part)."""
    out, l1 = [], []
    twin_build.configure(_hw_one_core(), seed=1, switch_prob=0.0, hazards=False)
    for k in (2, 4):
        n, v = bm, k * bn
        g = torch.Generator().manual_seed(k)
        h = torch.randn(n, d, generator=g).to(dtype)
        w = (torch.randn(v, d, generator=g) / d**0.5).to(dtype)
        y = torch.randint(0, v, (n,), generator=g)
        lse = torch.logsumexp(h.float() @ w.float().t(), dim=1)
        if kernel == "cube_fwd":
            ops._twin_stats_cube(h, w, None, y, 0, 0.0, 1.0, False, False)
        elif kernel in ("cube_bwd", "dz_kept_bwd", "onepass_bwd"):
            zc = ops._twin_stats_cube(h, w, None, y, 0, 0.0, 1.0, False, False, True)[6] \
                if kernel == "onepass_bwd" else None
            ops._twin_grads_cube(h, w, None, y, lse, torch.ones(n), torch.ones(n), None, None, 0, 0.0, 1.0,
                                 [True, True, False], zc, kernel != "cube_bwd", None)
        vec, flops, copied = _counters()
        gemms = {"cube_fwd": 1, "cube_bwd": 4, "dz_kept_bwd": 3, "onepass_bwd": 2}[kernel]
        assert flops == gemms * 2 * n * v * d, (kernel, flops)  # the twin's cube count is the analytic one
        out.append(vec)
        l1.append(copied)
    twin_build.configure(twin_build.HW_910B)  # the plans that follow are the 910B's
    # the cube-driven backward visits every tile twice (phases X and W)
    tiles = 2 if kernel == "cube_bwd" else 1
    per_tile = [(b - a) / (2 * tiles) for a, b in zip(out[0], out[1])]
    fixed = [a - 2 * tiles * t for a, t in zip(out[0], per_tile)]
    l1_tile = (l1[1] - l1[0]) / 2  # per (token block, vocabulary block) of the problem
    return per_tile, fixed, l1_tile, l1[0] - 2 * l1_tile


def cube_tile(flops: float, operand_bytes: float, peak_core: float, a: Assumptions) -> float:
    """One tile's cube time on one core: its MMADs at the cube efficiency, overlapped with its GM -> L1
    operand copies at the core's MTE2 bandwidth."""
    return max(flops / (peak_core * a.cube_eff), operand_bytes / a.mte2_core_bps)


def _time(tiles_core, t_cube, t_vec, overlap, hbm_bytes, l2_bytes, cube_in_bytes, a: Assumptions):
    """Modelled seconds and the bound: the cube / vector pipeline of the busiest core, HBM and L2 traffic, the
    cube operand copies over every core's MTE2."""
    if overlap:
        pipe = tiles_core * max(t_cube, t_vec) + min(t_cube, t_vec)  # + filling the two-slot ring once
    else:
        pipe = tiles_core * (t_cube + t_vec)
    parts = {"cube" if t_cube >= t_vec or not overlap else "vector": pipe, "hbm": hbm_bytes / HBM_BPS,
             "l2": l2_bytes / L2_BPS, "mte2": cube_in_bytes / (CUBE_CORES * a.mte2_core_bps)}
    bound = max(parts, key=parts.get)
    return parts[bound], bound


NAMES = ("cube", "trio", "dz_kept", "onepass")
# bytes of z / dz kept per launch: the npu provider's default
NPU_TILE_BUDGET = npu_provider.DEFAULT_TILE_BYTES


def launch_rows(name: str, n: int, v: int, elt: int, budget: int = NPU_TILE_BUDGET) -> int:
    """Rows per launch (driver token block) so the kept z (fp32, onepass) and dz (operand dtype) fit the
    budget."""
    per_row = v * (elt + (4 if name == "onepass" else 0))
    return max(128, min(n, budget // per_row // 128 * 128))


def _gemm_time(out_rows: int, out_cols: int, k: int, elt: int, peak_core: float, a: Assumptions) -> float:
    """One big GEMM from GM (dX = dz W or dW = dz^T h): 128 x 256 output tiles dealt to the cores in waves,
    each accumulating its whole K in L0C (one fixpipe write per tile), its operands copied once per tile."""
    tiles = math.ceil(out_rows / 128) * math.ceil(out_cols / 256)
    return math.ceil(tiles / CUBE_CORES) * cube_tile(2 * 128 * 256 * k, (128 + 256) * k * elt, peak_core, a)


def counted_for(ops, counted, kernel, dtype, bm, bn, d):
    """The twin's counts for (kernel, tile, D), counted once."""
    key = (kernel, bm, bn, d)
    if key not in counted:
        counted[key] = count_per_tile(ops, kernel, dtype, bm, bn, d)
    return counted[key]


def cube_in(c, tiles, tasks):
    """Cube operand bytes copied GM -> L1 (through L2) for `tiles` problem tiles in `tasks` tasks, from counts
    c."""
    return tiles * c[2] + tasks * c[3]


def three_gemm(ops, name, n, d, v, elt, peak_core, counted, dtype, a: Assumptions):
    """The 3-GEMM schedules of FusedLceGradCube (modelled per launch of ``launch_rows`` rows, summed over
    launches):
      * dz_kept: the cube-driven forward; backward phase X computes z tiles (cube) and dz (vector,
        overlapped), keeps dz in GM, then dX = dz W (K = V, one GEMM per column chunk of the kept dz) and dW
        += dz^T h (K = rows) as GEMMs from GM: 4 GEMMs with the forward;
      * onepass: the gradients in the forward pass (the driver's keep / cache route, reduced losses): the
        cube-driven forward keeps z (fp32) in GM, phase X forms dz from it with no GEMM, then the same GEMMs:
        3 GEMMs in all.
    dW is accumulated in the fp32 output across launches (read + written by the fixpipe after the first
    launch); dX is read back and written once more per column chunk of dz after the first (plan keep_cols).
    The cube's operand bytes (counted on the twin) bound each pass below through L2 and the cores' MTE2; the
    GEMM tiles of phase X and of the GEMMs from GM copy both operand tiles per tile (no L1 reuse: a 128-row
    block of h at D = 4096 alone is twice L1)."""
    r_max = launch_rows(name, n, v, elt)
    fwd = bwd = 0.0
    bounds = set()
    tc = tv = 0.0
    l2_in = [0.0, 0.0]  # cube operand bytes of the forward and the backward
    for r0 in range(0, n, r_max):
        r = min(r_max, n - r0)
        pm = ops._twin_plan_stats_cube(r, d, v, elt, 0, False)
        bm, bn = pm[1], pm[2]
        cf = counted_for(ops, counted, "cube_fwd", dtype, bm, bn, d)
        mb, nbk = math.ceil(r / bm), math.ceil(v / bn)
        t_cube = cube_tile(2 * bm * bn * d, cf[2], peak_core, a)
        t_fwd_vec = _vec_cycles(cf[0]) / CLOCK_HZ
        waves = math.ceil(pm[8] / CUBE_CORES)
        tiles_core = waves * math.ceil(nbk / pm[7])
        keep = r * v * 4 if name == "onepass" else 0
        fin = cube_in(cf, mb * nbk, pm[8])
        f = _time(tiles_core, t_cube, t_fwd_vec, True, v * d * elt * waves + r * d * elt + keep,
                  mb * nbk * bm * bn * 4 * 2 + fin, fin, a)
        # phase X: dz of every tile; the vector work per tile counted on the twin in this mode
        pg = ops._twin_plan_grad_cube(r, d, v, elt, 0)
        gbm, gbn = pg[1], pg[2]
        cg = counted_for(ops, counted, f"{name}_bwd", dtype, gbm, gbn, d)
        t_dz = _vec_cycles(cg[0]) / CLOCK_HZ
        tiles_x = math.ceil(math.ceil(r / gbm) / CUBE_CORES) * math.ceil(v / gbn)
        dz_bytes = r * v * elt
        if name == "onepass":  # no GEMM: read the kept z, write dz
            x = (tiles_x * t_dz, "vector")
            x = max(x, (keep / HBM_BPS + dz_bytes / HBM_BPS, "hbm"))
        else:
            x = _time(tiles_x, cube_tile(2 * gbm * gbn * d, (gbm + gbn) * d * elt, peak_core, a), t_dz, True,
                      v * d * elt * math.ceil(math.ceil(r / gbm) / CUBE_CORES) + r * d * elt + dz_bytes,
                      # operand bytes: below
                      math.ceil(r / gbm) * math.ceil(v / gbn) * gbm * gbn * 4 * 2, 0, a)
        # the GEMMs from GM: dz read by each (through L2 per wave: taken once from HBM each), W / h read once,
        # dX written once per column chunk of dz (read back after the first), dW read (after the first launch)
        # and written; the cube's operand bytes (all of the backward's, phase X's logit GEMM included) through
        # L2 and the cores' MTE2
        chunks = math.ceil(v / pg[10])  # dz kept in column chunks of plan keep_cols
        g_cube = _gemm_time(r, d, v, elt, peak_core, a) + _gemm_time(v, d, r, elt, peak_core, a)
        g_hbm = (2 * dz_bytes + (v + r) * d * elt + r * d * 4 + v * d * 4 * (2 if r0 else 1)) / HBM_BPS
        bin_ = cube_in(cg, math.ceil(r / gbm) * math.ceil(v / gbn), 0) + (chunks - 1) * r * d * 4 * 2
        g = max((g_cube, "cube"), (g_hbm, "hbm"))
        copies = max((bin_ / L2_BPS, "l2"), (bin_ / (CUBE_CORES * a.mte2_core_bps), "mte2"))
        if copies[0] > x[0] + g[0]:
            x, g = (0.0, x[1]), copies
        fwd += f[0]
        bwd += x[0] + g[0]
        l2_in[0] += fin
        l2_in[1] += bin_
        bounds.add(f[1] + "/" + x[1] + "+" + g[1])
        tc, tv = t_cube, t_dz
    ws = r_max * v * (elt + (4 if name == "onepass" else 0))
    return ((fwd, "|".join(sorted(bounds)).split("/")[0], tc, t_fwd_vec, l2_in[0]),
            (bwd, "|".join(sorted(b.split("/", 1)[1] for b in bounds)), tc, tv, l2_in[1]),
            {"rows_per_launch": r_max, "workspace_bytes": ws})


def model_rows(ops, a: Assumptions, counted: dict):
    """One row per (shape, route) at the assumptions ``a``; ``counted`` caches the twin's counts across
    settings."""
    rows = []
    info = {}
    for dname, dtype in DTYPES.items():
        elt = torch.tensor([], dtype=dtype).element_size()
        peak_core = CUBE_PEAK[dname] / CUBE_CORES
        for n, d, v in SHAPES:
            twin_build.configure(twin_build.HW_910B)
            plans = {"cube_fwd": ops._twin_plan_stats_cube(n, d, v, elt, 0, False)}
            pg = ops._twin_plan_grad_cube(n, d, v, elt, 0)
            plans["cube_bwd"] = [pg[0], pg[1], pg[2]]
            assert all(p[0] == 0 for p in plans.values()), plans
            cnt = {key: counted_for(ops, counted, key, dtype, p[1], p[2], d) for key, p in plans.items()}

            def tile_costs(key, gemms, operand_bytes):
                """Tile shape and counts, and one tile's cube time (its operand bytes copied GM -> L1) and
                vector time (counted on the twin, per visit of the tile)."""
                bm, bn = plans[key][1], plans[key][2]
                mb, nbk = math.ceil(n / bm), math.ceil(v / bn)
                return (bm, bn, mb, nbk, cube_tile(gemms * 2 * bm * bn * d, operand_bytes, peak_core, a),
                        _vec_cycles(cnt[key][0]) / CLOCK_HZ)

            inputs = lambda waves_w, waves_h: v * d * elt * waves_w + n * d * elt * waves_h  # noqa: E731
            res = {}
            # forward: one GEMM per tile; logits staged through GM (L2) once written, once read; the cube's
            # operand bytes through L2 and MTE2 (counted on the twin; the trio sets A for every tile: h and W
            # tiles each time)
            for name, stage in (("cube", 4), ("trio", 2)):
                p, c = plans["cube_fwd"], cnt["cube_fwd"]
                bm, bn = p[1], p[2]
                per_tile = c[2] if name == "cube" else (bm + bn) * d * elt
                bm, bn, mb, nbk, tc, tv = tile_costs("cube_fwd", 1, per_tile)
                waves = math.ceil(p[8] / CUBE_CORES)  # tasks = token blocks x segments
                tiles_core = waves * math.ceil(nbk / p[7])  # each task seg_blocks = ceil(n_blocks / segments)
                cin = cube_in(c, mb * nbk, p[8])
                if name == "trio":  # its own tiling: tiles dealt round-robin over the cores
                    waves, tiles_core = math.ceil(mb / CUBE_CORES), math.ceil(mb * nbk / CUBE_CORES)
                    cin = mb * nbk * per_tile
                res[(name, "fwd")] = _time(tiles_core, tc, tv, True, inputs(waves, 1),
                                           mb * nbk * bm * bn * stage * 2 + cin, cin, a) + (tc, tv, cin)
            # trio: C1/V1/C2/V2 on the cube pair's backward tile, the three GEMMs overlap the vector work
            # (taken as the cube pair's counted dz work), per-core fp32 partials of dX and dW written and read
            # back by V2 (in L2); its operand bytes per tile (A set for every tile, as its kernel does): z (h
            # and W tiles), dX (dz and W), dW (dz and h)
            bm, bn = plans["cube_bwd"][1], plans["cube_bwd"][2]
            per_tile = ((bm + bn) * d * 2 + 2 * bm * bn) * elt
            bm, bn, mb, nbk, tc, tv = tile_costs("cube_bwd", 3, per_tile)
            hbm = 2 * inputs(math.ceil(mb / CUBE_CORES), 1) + (n + v) * d * 4
            res[("trio", "bwd")] = _time(math.ceil(mb / CUBE_CORES) * nbk, tc, tv, True, hbm,
                                         mb * nbk
                                         * (bm * bn * (2 + elt) * 2 + (bm + bn) * d * 4 * 2 + per_tile),
                                         mb * nbk * per_tile, a) + (tc, tv, mb * nbk * per_tile)
            # cube: phase X (token blocks over cores) and phase W (vocabulary blocks over cores), each tile
            # two GEMMs overlapping the vector dz; one owner per output block, fixpipe accumulation read +
            # write in L2
            bm, bn, mb, nbk, tc, tv = tile_costs("cube_bwd", 2, cnt["cube_bwd"][2] / 2)
            cin = cube_in(cnt["cube_bwd"], mb * nbk, 0)
            tx = _time(math.ceil(mb / CUBE_CORES) * nbk, tc, tv, True, inputs(math.ceil(mb / CUBE_CORES), 1),
                       mb * nbk * (bm * bn * (4 + elt) * 2 + bm * d * 8) + cin / 2, cin / 2, a)
            tw = _time(math.ceil(nbk / CUBE_CORES) * mb, tc, tv, True, inputs(1, math.ceil(nbk / CUBE_CORES)),
                       mb * nbk * (bm * bn * (4 + elt) * 2 + bn * d * 8) + cin / 2, cin / 2, a)
            res[("cube", "bwd")] = (tx[0] + tw[0], tx[1] + "/" + tw[1], tc, tv, cin)
            floor = 6 * n * d * v / CUBE_PEAK[dname]
            for name in ("dz_kept", "onepass"):
                res[(name, "fwd")], res[(name, "bwd")], info[name] = three_gemm(
                    ops, name, n, d, v, elt, peak_core, counted, dtype, a)
            for name in NAMES:
                f, b = res[(name, "fwd")], res[(name, "bwd")]
                total = f[0] + b[0]
                rows.append({"N": n, "D": d, "V": v, "dtype": dname, "kernels": name, "assumptions": a.name,
                             "fwd_ms": round(f[0] * 1e3, 3), "bwd_ms": round(b[0] * 1e3, 3),
                             "modeled_ms": round(total * 1e3, 3), "floor_ms": round(floor * 1e3, 3),
                             "ratio": round(total / floor, 3), "fwd_bound": f[1], "bwd_bound": b[1],
                             "fwd_tile_us": {"cube": round(f[2] * 1e6, 2), "vector": round(f[3] * 1e6, 2)},
                             "bwd_tile_us": {"cube": round(b[2] * 1e6, 2), "vector": round(b[3] * 1e6, 2)},
                             # the bandwidth the cube's operand copies need over each pass (L2 and 24 x MTE2
                             # give)
                             "cube_in_tbps": [round(f[4] / f[0] / 1e12, 2), round(b[4] / b[0] / 1e12, 2)]})
                rows[-1].update(info.get(name, {"rows_per_launch": n, "workspace_bytes": None}))
    return rows


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="Writes benchmarks/results/npu_model.json and .md "
                                        "(modelled, not measured).")
    ap.add_argument("--cube-eff", nargs=2, type=float, metavar=("HIGH", "LOW"),
                    default=[HIGH.cube_eff, LOW.cube_eff], help="cube efficiency of the range's two ends, as "
                    "fractions of peak (default %(default)s)")
    ap.add_argument("--mte2-gbps", nargs=2, type=float, metavar=("HIGH", "LOW"),
                    default=[HIGH.mte2_core_bps / 1e9, LOW.mte2_core_bps / 1e9],
                    help="GM -> L1 bandwidth of one cube core at the range's two ends, GB/s "
                         "(default %(default)s)")
    args = ap.parse_args(argv)
    for x in args.cube_eff:
        if not 0 < x <= 1:
            ap.error(f"--cube-eff: expected fractions in (0, 1], got {x}")
    for x in args.mte2_gbps:
        if not x > 0:
            ap.error(f"--mte2-gbps: expected positive GB/s, got {x}")
    settings = [PEAK, Assumptions("high", args.cube_eff[0], args.mte2_gbps[0] * 1e9),
                Assumptions("low", args.cube_eff[1], args.mte2_gbps[1] * 1e9)]
    ops = twin_build.load_twin()
    counted = {}
    rows = [r for a in settings for r in model_rows(ops, a, counted)]
    twin_build.configure(twin_build.HW_910B)
    by = {(r["N"], r["D"], r["V"], r["dtype"], r["kernels"], r["assumptions"]): r for r in rows}
    summary = [{"N": r["N"], "D": r["D"], "V": r["V"], "dtype": r["dtype"], "kernels": r["kernels"],
                **{f"ratio_{a.name}": by[key[:5] + (a.name,)]["ratio"] for a in settings},
                **{f"ms_{a.name}": by[key[:5] + (a.name,)]["modeled_ms"] for a in settings}}
               for key, r in by.items() if key[5] == "peak"]
    out = os.path.join(HERE, "results")
    os.makedirs(out, exist_ok=True)
    meta = {"status": "modelled from twin counts; not run on NPU hardware",
            "assumptions": [{"name": a.name, "cube_eff": a.cube_eff,
                             "mte2_core_bps": None if math.isinf(a.mte2_core_bps) else a.mte2_core_bps}
                            for a in settings],
            "figures": {"tile_budget_bytes": NPU_TILE_BUDGET, "cube_peak": CUBE_PEAK, "clock_hz": CLOCK_HZ,
                        "hbm_bps": HBM_BPS, "l2_bps": L2_BPS, "cube_cores": CUBE_CORES,
                        "vec_per_cube": VEC_PER_CUBE, "vec_issue_cycles": VEC_ISSUE,
                        "scalar_cycles": SCALAR_CYCLES},
            "counted_per_tile": {f"{k[0]} {k[1]}x{k[2]} D={k[3]}": {"per_tile": v[0], "per_task": v[1],
                                                                  "cube_in_per_tile": v[2],
                                                                  "cube_in_per_task": v[3]}
                                 for k, v in counted.items()},
            "environment": environment("cpu")}
    with open(os.path.join(out, "npu_model.json"), "w") as f:
        json.dump({"meta": meta, "summary": summary, "rows": rows}, f, indent=1)
    hi, lo = settings[1], settings[2]

    def setting(a):
        return (f"{a.name}: cube at {a.cube_eff:.0%} of peak, "
                + ("no per-core MTE2 limit" if math.isinf(a.mte2_core_bps) else
                   f"{a.mte2_core_bps / 1e9:g} GB/s GM -> L1 per cube core"))

    lines = ["# Modelled 910B time (not measured; benchmarks/npu_model.py, docs/npu-status.md)", "",
             "bf16, fwd + bwd, ratio to the floor 6 N D V / peak (354 TFLOPS). Settings: "
             + "; ".join(setting(a) for a in settings) + ". The peak setting is a lower bound; the range is "
             "high .. low.", "",
             "| N x D x V | kernels | ratio at peak | ratio range | ms range |", "|---|---|---|---|---|"]
    for r in summary:
        lines.append(f"| {r['N']} x {r['D']} x {r['V']} | {r['kernels']} | {r['ratio_peak']} | "
                     f"{r['ratio_high']} .. {r['ratio_low']} | {r['ms_high']} .. {r['ms_low']} |")
    lines += ["", "kernels: cube = FusedLceStatsCube / FusedLceGradCube recomputing z in both backward "
              "phases; trio = CANN's schedule; dz_kept = the cube-driven forward + the 3-GEMM backward (dz "
              "kept in GM between phase X and the dX / dW GEMMs); onepass = gradients in the forward pass (z "
              "kept from the forward, 3 GEMMs in all; the driver's route for reduced losses).", "",
              "## Every setting", "",
              "| N | D | V | dtype | kernels | setting | fwd ms | bwd ms | modeled ms | floor ms | ratio | "
              "bound (fwd/bwd; cube bwd: X/W; 3-GEMM bwd: X+GEMMs) | cube operand TB/s (fwd/bwd) | "
              "rows per launch | kept GiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kept = "-" if r["workspace_bytes"] is None else round(r["workspace_bytes"] / 2**30, 2)
        lines.append(f"| {r['N']} | {r['D']} | {r['V']} | {r['dtype']} | {r['kernels']} | {r['assumptions']} "
                     f"| {r['fwd_ms']} | {r['bwd_ms']} | {r['modeled_ms']} | {r['floor_ms']} | {r['ratio']} "
                     f"| {r['fwd_bound']}/{r['bwd_bound']} | {r['cube_in_tbps'][0]}/{r['cube_in_tbps'][1]} | "
                     f"{r['rows_per_launch']} | {kept} |")
    lines += ["", f"kept GiB: the z / dz bytes kept per launch (the tile budget, {NPU_TILE_BUDGET / 2**30:g} "
              "GiB); '-': rings only, independent of N. Bounds: cube (the cube / vector pipeline, the cube's "
              "tile time being the larger of its MMADs and its operand copies), vector, hbm, l2 (L2 at about "
              f"{L2_BPS / 1e12:g} TB/s), mte2 (the cube's operand bytes over 24 cores' MTE2: "
              f"{CUBE_CORES * hi.mte2_core_bps / 1e12:.2f} TB/s high, "
              f"{CUBE_CORES * lo.mte2_core_bps / 1e12:.2f} low).", "",
              "cube operand TB/s: the cube's GM -> L1 operand bytes (counted on the twin, L1 reuse as the "
              "Matmul library's buffers allow) over the pass time.", "",
              "Per-tile work counted on the twin (busiest vector core: instructions, UB bytes written, "
              "scalar ops; cube operand bytes GM -> L1 of all cores, per problem tile and per task):", ""]
    for k, v in counted.items():
        lines.append(f"* {k[0]} tile {k[1]}x{k[2]}, D={k[3]}: per tile {[round(x) for x in v[0]]}, per task "
                     f"{[round(x) for x in v[1]]}; cube operand bytes per tile {round(v[2])}, per "
                     f"task {round(v[3])}")
    with open(os.path.join(out, "npu_model.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
