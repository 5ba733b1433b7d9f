"""The real tiling / inference functions of the two operators, run under the host twin's runtime on a grid of
problems (N, D, V, dtypes, label dtype, bias, softcap / temperature / sum of logits / entropy, grad mask,
parts): status handling, workspace size, block dim, batch scheduling for the cross-core sync, tiling data
equal to the planners' plans, attributes read at the right index, inputs read by IR index, bad nodes rejected
without a crash."""
from __future__ import annotations

import os
import random
import re
import struct

import pytest

from ...support.ascendc_twin.host_build import ASCEND, ROOT

pytestmark = pytest.mark.twin  # runs on the host twin (stub CANN headers + runtime)

KERNELS = {"FusedLceStatsCube": os.path.join(ASCEND, "fused_lce_stats", "op_kernel",
                                             "fused_lce_stats_cube.cpp"),
           "FusedLceGradCube": os.path.join(ASCEND, "fused_lce_grad", "op_kernel", "fused_lce_grad_cube.cpp")}
ADAPTER = os.path.join(ROOT, "csrc", "npu", "fused_lce_npu.cpp")
TILING_CAPACITY = 2048  # OpImplRegisterV2::Tiling's default max_tiling_data_size, which OP_ADD uses
BATCH_MODE = 1
PARTS = ["Ascend910B2", "Ascend910B4", "Ascend910_9391", "tiny"]


def _seed() -> int:
    if os.environ.get("CI"):
        return 20261201
    return int(os.environ.get("FUSED_LCE_SEED", random.randrange(1 << 30)))


SEED = _seed()


def case(op="stats_cube", part="Ascend910B2", n=37, d=45, v=301, dtype="bf16", label="i64", bias=0,
         softcap=0.0, temperature=1.0, with_zsum=0, entropy=0, mask=7, vocab_start=0, **extra) -> str:
    words = [f"op={op}", f"part={part}", f"n={n}", f"d={d}", f"v={v}", f"dtype={dtype}", f"label={label}",
             f"bias={int(bias)}", f"softcap={softcap}", f"temperature={temperature}",
             f"with_zsum={int(with_zsum)}", f"entropy={int(entropy)}", f"mask={mask}",
             f"vocab_start={vocab_start}"]
    words += [f"{k.replace('__', '.')}={v}" for k, v in extra.items()]
    return " ".join(words)


def grid(op: str, count: int, rng: random.Random) -> list[str]:
    """Edge shapes in every dimension plus a random sample: tails, tiny and huge N / D / V, N*V > 2^31."""
    ns = [0, 1, 5, 16, 37, 128, 129, 1000, 8192, 65536, 1 << 20]
    ds = [1, 15, 45, 128, 896, 4096, 7168, 65534]
    vs = [1, 17, 301, 4096, 32000, 151936, 256000]
    out = []
    fixed = [(37, 45, 301), (2048, 896, 151936), (8192, 4096, 151936), (1 << 20, 16, 151936), (1, 1, 1),
             (129, 7168, 256000), (5, 65534, 17)]
    for n, d, v in fixed:
        for dtype in ("bf16", "fp16", "fp32"):
            for bias in (0, 1):
                out.append(case(op, "Ascend910B2", n, d, v, dtype, "i64", bias))
    while len(out) < count:
        n, d, v = rng.choice(ns), rng.choice(ds), rng.choice(vs)
        if rng.random() < 0.3:  # odd sizes
            n, d, v = rng.randrange(0, 3000), rng.randrange(1, 9000), rng.randrange(1, 200000)
        out.append(case(op, rng.choice(PARTS), n, d, v, rng.choice(["bf16", "fp16", "fp32"]),
                        rng.choice(["i32", "i64"]), rng.random() < 0.5, rng.choice([0.0, 0.0, 30.0]),
                        rng.choice([1.0, 1.0, 0.7, 1.3]), rng.random() < 0.3, rng.random() < 0.4,
                        rng.randrange(0, 8), rng.choice([0, 0, 1000])))
    return out


def words(line: str) -> dict:
    return dict(w.split("=", 1) for w in line.split())


def align(a: int, b: int) -> int:
    return (a + b - 1) // b * b


BAD = [
    ("hidden 1-D", dict(shape__hidden="37")),
    ("weight D mismatch", dict(shape__weight="301,44")),
    ("labels length", dict(shape__labels="36")),
    ("labels 2-D", dict(shape__labels="37,1")),
    ("labels float", dict(dtype__labels="fp32")),
    ("weight dtype differs", dict(dtype__weight="fp16")),
    ("int8 operands", dict(dtype="i8")),
    ("bias length", dict(bias=1, shape__bias="300")),
    ("bias dtype", dict(bias=1, dtype__bias="fp32")),
    ("D = 0", dict(d=0)),
    ("V = 0", dict(v=0)),
    ("D > int32", dict(d=1 << 31)),
    ("negative vocab_start", dict(vocab_start=-1)),
    ("negative softcap", dict(softcap=-1.0)),
    ("temperature 0", dict(temperature=0.0)),
    ("negative temperature", dict(temperature=-0.5)),
    ("infinite temperature", dict(temperature="inf")),
]


def _adapter_calls() -> dict:
    """{aclnn op: [C++ type of each argument]} from the EXEC_NPU_CMD_EXT calls of the host adapter."""
    code = open(ADAPTER).read()
    calls = {}
    for m in re.finditer(r"EXEC_NPU_CMD_EXT\(aclnn(\w+),([^;]*)\);", code):
        body = code[:m.start()][code[:m.start()].rfind("\n}"):]  # the enclosing function, up to the call
        types = {}
        for t, name in re.findall(r"(c10::optional<Tensor>|Tensor|int64_t|double|bool)\s*&?\s+(\w+)\s*[=,)]",
                                  body):
            types[name] = t
        calls[m.group(1)] = [types.get(a.strip(), "?" + a.strip()) for a in m.group(2).split(",")]
    return calls


def test_adapter_passes_inputs_attributes_outputs_as_the_generated_aclnn_api_expects(driver):
    """The generated aclnn*GetWorkspaceSize takes the OpDef's inputs, then its attributes, then its outputs
    (asc-devkit docs 单算子API调用.md); an optional input is a nullable tensor, Float attributes are double, Int
    int64_t, Bool bool."""
    calls = _adapter_calls()
    assert set(calls) == {"FusedLceStatsCube", "FusedLceGradCube"}
    attr_cpp = {"int": "int64_t", "float": "double", "bool": "bool"}
    for op, args in calls.items():
        d = driver.one(f"opdef={op}")
        want = ["c10::optional<Tensor>" if p["param"] == "optional" else "Tensor" for p in d["inputs"]]
        want += [attr_cpp[a["type"]] for a in d["attrs"]]
        want += ["c10::optional<Tensor>" if p["param"] == "optional" else "Tensor" for p in d["outputs"]]
        assert args == want, f"aclnn{op}: adapter passes {args}, the OpDef declares {want}"
        assert d["configs"] == ["ascend910b", "ascend910_93"] and d["has_tiling"]


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def cube_grid(op: str, count: int, rng: random.Random) -> list[str]:
    """The shared grid plus the ops' own options (coef_b / coef_u / z_cache present or not, keep_dz; keep_z
    for the forward)."""
    out = []
    for line in grid(op, count, rng):
        if op == "grad_cube":
            line += (f" coef_b={int(rng.random() < 0.5)} coef_u={int(rng.random() < 0.5)}"
                     f" keep_dz={int(rng.random() < 0.5)} z_cache={int(rng.random() < 0.5)}")
        else:
            line += f" keep_z={int(rng.random() < 0.5)}"
        line += f" variant={rng.choice([0, 0, 1, 2, 3])}"
        out.append(line)
    return out


def a_resident(t: dict, k: int, n_tiles: int, elt: int, l1: int, name: str, a_trans: bool, b_trans: bool):
    """(ok, message): as much of a GEMM's A as fits L1 beside B's double buffer is kept over its n_tiles N
    tiles (ORDER_M, stepM 1, stepN = n_tiles, depthB1 2, depthA1 = the A blocks that fit, at most kIter: the
    Norm template caches the whole K, or the first depthA1 - 2 K blocks when depthA1 > 2), L1 blocks sized as
    the Matmul library does (float32: the K side aligned to 16 for a transposed A and a non-transposed B); the
    tiling is left alone (A not cached) where fewer than three A blocks, or A's whole K, fit."""
    bk = t["baseK"]
    kiter = -(-k // bk)

    def block(rows, k16):
        return rows * (-(-bk // 16) * 16 if elt == 4 and k16 else bk) * elt

    a_blk, b_db = block(t["baseM"], a_trans), 2 * block(t["baseN"], not b_trans)
    depth = min(kiter, max(0, l1 - b_db) // a_blk)
    kept = (t["depthA1"], t["stepN"], t["depthB1"], t["stepM"], t["iterateOrder"])
    if depth == kiter or depth >= 3:
        ok = kept == (depth, n_tiles, 2, 1, 0) and t["shareL1Size"] == depth * a_blk + b_db <= l1
    else:
        ok = t["depthA1"] <= 2 and t["depthA1"] < kiter * t["stepM"]
    return ok, f"{name} L1 residency {kept}, {depth} A blocks fit"


def cube_problems(line: str, r: dict) -> list[str]:
    """Every way the cube-driven tiling's result disagrees with the planner of fused_lce_cube_tiling.h (what
    the twin kernels run with) and what the kernels and the runtime need."""
    c = words(line)
    grad = c["op"] == "grad_cube"
    e = r["expected_plan"]
    bad = []

    def want(cond, msg):
        if not cond:
            bad.append(f"{line}: {msg}")

    want(r["sizeof_td"] <= TILING_CAPACITY == r["tiling_capacity"],
         f"tiling data {r['sizeof_td']} B > buffer")
    if e["status"] != 0:
        want(r["status"] == "failed", f"plan status {e['status']} but the tiling succeeded")
        want(not r["block_dim_set"] and not r["workspace_set"], "a failed tiling set launch values")
        return bad
    want(r["status"] == "ok", "tiling failed on a problem the planner accepts")
    if r["status"] != "ok":
        return bad
    p = r["plan"]
    want(r["plan_bytes_equal"] and p == e, f"tiling data plan != the planner's: {p} vs {e}")
    want(r["tiling_size"] == r["sizeof_td"], "tiling data size not declared")
    want(r["td_deterministic"], "some tiling data bytes depend on the buffer's previous content")
    used = e["base"]["used_cores"]
    want(r["block_dim_set"] and r["block_dim"] == max(1, used),
         f"block dim {r['block_dim']} != used cores {used}")
    want(r["block_dim"] <= r["aic"],
         "block dim exceeds the AI cores (a cube-driven kernel runs one block per AI core)")
    want(r["schedule_mode_set"] and r["schedule_mode"] == BATCH_MODE, "no SetScheduleMode(1)")
    keep = grad and c.get("keep_dz") == "1"  # the one-pass modes' kept dz: the larger workspace
    ws = e["ws_total_keep"] if keep else e["ws_total"]
    want(r["workspace_set"] and r["workspaces"] == [r["lib_ws"] + ws], f"workspaces {r['workspaces']} != "
         f"[{r['lib_ws']} + {ws}]")
    want(r["vocabStart"] == int(c["vocab_start"]), f"vocabStart {r['vocabStart']}")
    want(r["softcap"] == pytest.approx(float(c["softcap"])), f"softcap {r['softcap']}")
    want(f32(r["invTemperature"]) == f32(1.0 / f32(float(c["temperature"]))),
         f"invTemperature {r['invTemperature']}")
    want(r["hasBias"] == int(c["bias"]), "hasBias")
    want(r["variant"] == int(c.get("variant", 0)), f"variant {r['variant']}")
    plain = int(c.get("variant", 0)) & 1  # kPlainTiling: GetTiling's Matmul tilings, no L1-residency override
    b = e["base"]
    bm, bn, d = b["base_m"], b["base_n"], b["d"]
    if grad:
        want(r["gradMask"] == int(c["mask"]) & (7 if int(c["bias"]) else 3), f"gradMask {r['gradMask']}")
        want((r["hasB"], r["hasU"]) == (int(c.get("coef_b", 1)), int(c.get("coef_u", 1))), "hasB / hasU")
        want(r["keepDz"] == int(c.get("keep_dz", 0)), f"keepDz {r['keepDz']}")
        if b["n"] > 0 and not plain:  # the per-tile C2 GEMMs keep their dz tile in L1 across D's column tiles
            dcols = -(-d // b["base_d"])
            want(*a_resident(r["mmDx"], bn, dcols, b["elt_bytes"], r["l1_bytes"], "mmDx", False, False))
            want(*a_resident(r["mmDw"], bm, dcols, b["elt_bytes"], r["l1_bytes"], "mmDw", True, False))
        # presence of the optional z_cache input by tiling, never by its GM address
        want(r["hasZCache"] == int(c.get("z_cache", 0)), f"hasZCache {r['hasZCache']}")
        gemms = {"mmZ": (bm, bn, d, bm, bn), "mmDx": (bm, d, bn, bm, b["base_d"]),
                 "mmDw": (bn, d, bm, bn, b["base_d"])}
        # Dz kept in column chunks of keep_cols (< 65535: the GM -> L1 copy's 16-bit row stride), dX one GEMM
        # per chunk
        want(e["keep_cols"] < 65535 and e["keep_cols"] % bn == 0 or e["keep_cols"] == b["v"],
             f"keep_cols {e}")
        whole = {"mmDxAll": (bm, d, e["keep_cols"], bm, b["base_d"]),
                 "mmDwAll": (bn, d, b["n"], bn, b["base_d"])}
        if keep:  # the whole-K GEMMs from the kept Dz (N x V)
            gemms.update(whole)
        else:
            for name in whole:
                want(all(x == 0 for x in r[name].values()), f"{name} set without keep_dz")
    else:
        want(r["withZsum"] == int(c["with_zsum"]) and r["withEz"] == int(c["entropy"]), "withZsum / withEz")
        want(r["labelBytes"] == (8 if c["label"] == "i64" else 4), f"labelBytes {r['labelBytes']}")
        want(r["hasZCache"] == int(c.get("keep_z", 0)), f"hasZCache {r['hasZCache']} (attribute keep_z)")
        gemms = {"mmLogits": (bm, bn, d, bm, bn)}
        if b["n"] > 0 and not plain:  # the hidden rows kept in L1 over a task's segment
            want(*a_resident(r["mmLogits"], d, b["seg_blocks"], b["elt_bytes"], r["l1_bytes"],
                             "mmLogits", False, True))
        if e["base"]["segments"] > 1:  # six partial planes per token and segment
            want(e["ws_stats"] >= e["base"]["segments"] * e["base"]["n"] * 24, "stats workspace too small")
    for name, (m_, n_, k_, tbm, tbn) in gemms.items():
        t = r[name]
        if b["n"] == 0:
            want(all(v == 0 for v in t.values()), f"{name} set although no tile runs")
            continue
        got = (t["M"], t["N"], t["Ka"], t["singleCoreM"], t["singleCoreN"], t["singleCoreK"],
               t["baseM"], t["baseN"])
        want(got == (m_, n_, k_, m_, n_, k_, tbm, tbn),
             f"{name} {got} != {(m_, n_, k_, m_, n_, k_, tbm, tbn)}")
        want(t["isBias"] == 0 and t["usedCoreNum"] == 1 and t["baseK"] > 0, f"{name} {t}")
    return bad


@pytest.mark.parametrize("op", ["stats_cube", "grad_cube"])
def test_cube_tiling_on_a_grid_of_problems(op, driver):
    """Odd shapes, every dtype and label dtype, bias / softcap / temperature / sum of logits / entropy /
    coef_b / coef_u / grad masks, four parts: the tiling data is the planner's plan (bytewise), launch values
    as required."""
    rng = random.Random(SEED + 1)
    lines = cube_grid(op, 300, rng)
    outs = driver(lines)
    bad = [m for line, r in zip(lines, outs) for m in cube_problems(line, r)]
    assert not bad, f"seed {SEED}: {len(bad)} problems, first ones:\n" + "\n".join(bad[:12])
    ok = [r for r in outs if r["status"] == "ok"]
    assert len(ok) > 0.7 * len(outs)
    assert any(r["plan"]["base"]["n"] == 0 for r in ok) and any(r["plan"]["base"]["used_cores"] > 1
                                                                for r in ok)
    if op == "stats_cube":
        assert any(r["plan"]["base"]["segments"] > 1 for r in ok)
    # the planner's own refusals (V_local >= 2^24, N >= 2^24 for the backward, D >= 65535: the operands' row
    # stride in the GM -> L1 copy's 16-bit srcDValue) fail the tiling cleanly
    refused = [case(op, n=37, d=16, v=1 << 24), case(op, n=37, d=65535, v=301)]
    refused += [case(op, n=1 << 24, d=16, v=301)] if op == "grad_cube" else []
    assert all(r["status"] == "failed" and not r["block_dim_set"] for r in driver(refused))


def test_cube_batch_mode_for_the_kernels_that_sync_all_cores(driver):
    """Both cube-driven kernels call SyncAll (the forward's segment merge, the backward's db merge): batch
    mode always."""
    for op, src in KERNELS.items():
        code = re.sub(r"//[^\n]*", "", open(src).read())
        assert re.search(r"\bSyncAll\s*(<[^>]*>)?\s*\(", code), f"{op} no longer syncs: revisit this test"
        assert "KERNEL_TYPE_MIX_AIC_1_2" in code, f"{op}: the block dim set here assumes a 1:2 MIX kernel"
    lines = [case(op, part, n, 128, 151936, bias=1) for part in PARTS for n in (1, 200)
             for op in ("stats_cube",
                        "grad_cube")]
    for line, r in zip(lines, driver(lines)):
        assert r["status"] == "ok" and r["schedule_mode_set"] and r["schedule_mode"] == BATCH_MODE, line


@pytest.mark.parametrize("absent", ["bias", "coef_b", "coef_u", "coef_b coef_u bias"])
@pytest.mark.parametrize("label", ["i32", "i64"])
def test_cube_grad_inputs_after_the_optional_ones_are_read_by_ir_index(absent, label, driver):
    kw = {"bias": int("bias" not in absent), "coef_b": int("coef_b" not in absent),
          "coef_u": int("coef_u" not in absent)}
    r = driver.one(case("grad_cube", n=300, d=256, v=5000, label=label, **kw))
    assert r["status"] == "ok", r
    assert (r["hasBias"], r["hasB"], r["hasU"]) == (kw["bias"], kw["coef_b"], kw["coef_u"])
    # hidden / weight read at their IR index: the plan is that of (300, 256, 5000)
    assert (r["plan"]["base"]["n"], r["plan"]["base"]["d"], r["plan"]["base"]["v"]) == (300, 256, 5000)


@pytest.mark.parametrize("bias", [0, 1])
@pytest.mark.parametrize("label", ["i32", "i64"])
def test_stats_cube_labels_after_the_optional_bias_are_read_by_ir_index(bias, label, driver):
    """Without a bias the instance indices of the later inputs shift down by one (metadef
    extended_kernel_context.h / compute_node_info.h): labels must be read by IR index."""
    r = driver.one(case("stats_cube", n=300, d=256, v=5000, bias=bias, label=label))
    assert r["status"] == "ok" and r["hasBias"] == bias
    assert r["labelBytes"] == (8 if label == "i64" else 4), \
        f"label dtype {label} read as {r['labelBytes']} bytes"


def test_cube_attributes_are_read_at_their_opdef_index(driver):
    r = driver.one(case("grad_cube", n=64, d=64, v=1000, bias=1, softcap=12.5, temperature=0.625, mask=5,
                        vocab_start=3000))
    assert (r["vocabStart"], r["softcap"], f32(r["invTemperature"]), r["gradMask"]) \
        == (3000, 12.5, f32(1.6), 5)
    for zsum, ent in ((1, 0), (0, 1), (1, 1)):
        r = driver.one(case("stats_cube", n=64, d=64, v=1000, softcap=7.5, temperature=1.25, vocab_start=123,
                            with_zsum=zsum, entropy=ent, label="i32"))
        got = (r["vocabStart"], r["softcap"], f32(r["invTemperature"]), r["withZsum"], r["withEz"],
               r["labelBytes"])
        assert got == (123, 7.5, f32(0.8), zsum, ent, 4)


RESIDENCY = ("depthA1", "depthB1", "stepM", "stepN", "iterateOrder", "shareL1Size")


@pytest.mark.parametrize("op,gemms", [("stats_cube", ["mmLogits"]), ("grad_cube", ["mmDx", "mmDw"])])
def test_plain_tiling_variant_leaves_get_tilings_choice(op, gemms, driver):
    """The attribute variant reaches the tiling data (each bit alone and both); with kPlainTiling (bit 1) the
    Matmul tilings are GetTiling's own: they differ from the default only in the fields keep_a_resident
    overrides, and they do differ there (the override applies to this problem). Any other value fails the
    tiling."""
    line = case(op, n=300, d=1024, v=20000)
    runs = {v: driver.one(f"{line} variant={v}") for v in range(4)}
    assert all(r["status"] == "ok" and r["variant"] == v for v, r in runs.items()), runs
    for name in gemms:
        default, plain = runs[0][name], runs[1][name]
        assert runs[2][name] == default and runs[3][name] == plain
        assert {k: x for k, x in plain.items() if k not in RESIDENCY} == \
            {k: x for k, x in default.items() if k not in RESIDENCY}
        assert any(plain[k] != default[k] for k in RESIDENCY), (name, plain, default)
    for bad in (4, -1):
        r = driver.one(f"{line} variant={bad}")
        assert r["status"] == "failed" and not r["block_dim_set"], r
    assert "variant must be a set of the bits" in driver.stderr


BAD_GRAD_CUBE = [
    ("coef_a length", dict(shape__coef_a="36")),
    ("coef_t 2-D", dict(shape__coef_t="1,37")),
    ("coef_b dtype", dict(dtype__coef_b="bf16")),
    ("coef_u length", dict(shape__coef_u="38")),
    ("lse dtype", dict(dtype__lse="bf16")),
    ("z_cache (N, V + 1)", dict(z_cache=1, shape__z_cache="37,302")),
    ("z_cache dtype", dict(z_cache=1, dtype__z_cache="bf16")),
    ("grad_mask > 7", dict(mask=8)),
]
ALL_BAD_CUBE = [("stats_cube: " + w, k) for w, k in BAD] + [("grad_cube: " + w, k)
                                                            for w, k in BAD + BAD_GRAD_CUBE]


@pytest.mark.parametrize("what,kw", ALL_BAD_CUBE, ids=[w for w, _ in ALL_BAD_CUBE])
def test_cube_bad_nodes_fail_the_tiling_cleanly(what, kw, driver):
    r = driver.one(case(what.split(":")[0], **kw))
    assert r["status"] == "failed", f"{what}: tiling accepted {r}"
    assert r["block_dim_set"] is False and r["workspace_set"] is False


@pytest.mark.parametrize("op", ["stats_cube", "grad_cube"])
@pytest.mark.parametrize("quirk,msg", [
    ("mm_base=16,16", "GetTiling returned a 16 x 16 base tile for {}"),
    ("mm_single_k=128", "GetTiling returned singleCoreK 128 for {}, not its K = 256"),
], ids=["base_tile", "single_core_k"])
def test_cube_tiling_fails_when_get_tiling_moves_what_the_plan_fixed(op, quirk, msg, driver):
    """The kernels size their ring slots and place the tiles they read back by the plan's base tile, the
    fixpipe by the tiling's; the Matmul library lays an operand's L1 buffer out from the tiling's singleCoreK,
    keep_a_resident sizes "A's whole K" from the GEMM's K. A GetTiling that did not keep SetFixSplit's base M
    / N, or returned another singleCoreK, fails the tiling, naming the GEMM (the first checked: mmLogits /
    mmZ, K = D = 256)."""
    line = case(op, n=300, d=256, v=5000, keep_dz=1, keep_z=1)
    assert driver.one(line)["status"] == "ok"
    r = driver.one(line + " " + quirk)
    assert r["status"] == "failed" and not r["block_dim_set"] and not r["workspace_set"], r
    assert msg.format("mmLogits" if op == "stats_cube" else "mmZ") in driver.stderr, driver.stderr


@pytest.mark.parametrize("keep_z,out,msg", [
    (1, "absent", "keep_z is set but no z_cache output"),
    (1, "37,302", "keep_z is set but no z_cache output"),
    (1, "0", "keep_z is set but no z_cache output"),
])
def test_stats_cube_keep_z_needs_the_z_cache_output(keep_z, out, msg, driver):
    """keep_z makes the kernel write N x V floats into z_cache: the tiling fails unless the output is given
    with shape (N, V). Without keep_z the kernel never touches z_cache, so any z_cache is accepted: absent
    (the generated aclnn's null tensor), empty (a hand-written op_api's shape (0)) or (N, V) (a graph
    allocating it from InferShape)."""
    for zc in ("absent", "0", "37,301"):
        assert driver.one(case("stats_cube", keep_z=0, out__z_cache=zc))["status"] == "ok"
    assert driver.one(case("stats_cube", keep_z=1, out__z_cache="37,301"))["status"] == "ok"
    r = driver.one(case("stats_cube", keep_z=keep_z, out__z_cache=out))
    assert r["status"] == "failed" and not r["block_dim_set"] and not r["workspace_set"], r
    assert msg in driver.stderr, driver.stderr


def test_cube_inferred_shapes_and_dtypes(driver):
    r = driver.one("infer " + case("stats_cube", n=37, d=45, v=301))
    assert r["shape_ok"] and r["dtype_ok"] and r["shapes"] == [[37]] * 6 + [[37, 301]]
    assert r["dtypes"] == [0, 0, 0, 0, 3, 0, 0]
    for bias in (0, 1):
        r = driver.one("infer " + case("grad_cube", n=37, d=45, v=301, bias=bias, coef_b=0))
        assert r["shape_ok"] and r["dtype_ok"] and r["shapes"] == [[37, 45], [301, 45], [301]]
        assert r["dtypes"] == [0, 0, 0]
    for op, kw in (("stats_cube", dict(shape__hidden="37")), ("grad_cube", dict(shape__weight="301"))):
        assert not driver.one("infer " + case(op, **kw))["shape_ok"]


def test_cube_opdefs_declare_the_kernels_arguments(driver):
    """The OpDef's inputs then outputs are the kernel entry's GM arguments in order (the generated launch
    passes them so): compare with the extern "C" signature of each cube-driven kernel, the z-cache slots
    included (z_cache, optional: the last output of the forward, right after lse in the backward)."""
    for op, src in KERNELS.items():
        code = open(src).read()
        sig = re.search(r'extern "C" __global__ __aicore__ void \w+\(([^)]*)\)', code).group(1)
        params = [p.split()[-1] for p in sig.split(",")][:-2]  # drop workspace, tiling
        d = driver.one(f"opdef={op}")
        names = [p["name"] for p in d["inputs"]] + [p["name"] for p in d["outputs"]]
        assert len(params) == len(names), f"{op}: kernel takes {params}, OpDef declares {names}"
        assert params.index("zCache") == names.index("z_cache"), (params, names)
        assert d["configs"] == ["ascend910b", "ascend910_93"] and d["has_tiling"]
        opt = {p["name"] for p in d["inputs"] + d["outputs"] if p["param"] == "optional"}
        assert "z_cache" in opt and "bias" in opt
        types = {tuple(p["dtypes"]) for p in d["inputs"] if p["name"] in ("hidden", "weight", "bias")}
        assert types == {(27, 1, 0, 27, 1, 0)}  # bf16, fp16, fp32 x int64 / int32 labels
        assert [p["dtypes"] for p in d["inputs"] if p["name"] == "labels"] == [[9, 9, 9, 3, 3, 3]]
