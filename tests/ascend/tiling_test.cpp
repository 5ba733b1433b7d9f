// Unit tests of csrc/ascend/common/fused_lce_tiling.h and of the kernels' UB layouts (fused_lce_cube_tiling.h),
// compiled with g++ by tests/ascend/test_tiling.py.
//   ./tiling_test            run the checks, print "N passed, M failed", exit 1 on any failure
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fused_lce_cube_tiling.h"

using namespace fused_lce::tiling;
namespace fc = fused_lce::cube;

static int g_pass = 0, g_fail = 0;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            ++g_pass;                                                           \
        } else {                                                                \
            ++g_fail;                                                           \
            if (g_fail <= 30) {                                                 \
                std::printf("FAIL %s:%d: %s | ", __FILE__, __LINE__, #cond);   \
                std::printf(__VA_ARGS__);                                       \
                std::printf("\n");                                              \
            }                                                                   \
        }                                                                       \
    } while (0)

static std::string tag(const Plan& p) {
    char b[160];
    std::snprintf(b, sizeof b, "n=%llu d=%llu v=%llu elt=%u flags=%u", (unsigned long long)p.n,
                  (unsigned long long)p.d, (unsigned long long)p.v, p.elt_bytes, p.flags);
    return b;
}

// A flag bit of these tests only: the forward's entropy sum (plan_stats' `ez`), for loops over every flag set.
constexpr uint32_t kEz = 16u;

// ft::plan under the UB layout of the kernel the flags name: the backward's with kBackward, else the forward's
// (with the entropy sum for kEz).
static Plan tile_plan(uint64_t n, uint64_t d, uint64_t v, uint32_t elt, uint32_t flags, const HwSpec& hw = HwSpec()) {
    return plan(n, d, v, elt, flags, hw, [&](uint64_t vr, uint64_t bn) {
        fc::CubePlan f;
        fc::CubeGradPlan g;
        return (flags & kBackward) ? fc::layout_grad(&g, vr, bn, elt, flags)
                                   : fc::layout_stats(&f, vr, bn, elt, flags, (flags & kEz) != 0);
    });
}

// Every invariant a valid plan must satisfy on hardware `hw`.
static void check_plan(const Plan& p, const HwSpec& hw) {
    const std::string t = tag(p);
    const char* s = t.c_str();
    CHECK(p.status == kOk, "%s status=%d", s, p.status);
    if (p.status != kOk) return;
    const bool bwd = p.flags & kBackward;
    // on-chip budgets
    CHECK(p.ub_used + kUbReserved <= hw.ub_bytes, "%s ub=%llu", s, (unsigned long long)p.ub_used);
    CHECK(p.l1_used <= hw.l1_bytes, "%s l1=%llu", s, (unsigned long long)p.l1_used);
    CHECK(p.l0a_used <= hw.l0a_bytes && p.l0b_used <= hw.l0b_bytes, "%s", s);
    CHECK(p.l0c_used <= hw.l0c_bytes, "%s l0c=%llu", s, (unsigned long long)p.l0c_used);
    CHECK(p.l0a_used == 2ull * p.base_m * p.base_k * p.elt_bytes, "%s", s);
    CHECK((uint64_t)p.base_m * p.base_n * 4 * p.l0c_buffers <= hw.l0c_bytes, "%s", s);
    // tile shapes
    CHECK(p.base_m % kMinBase == 0 && p.base_n % kMinBase == 0 && p.base_k % kMinBase == 0, "%s", s);
    CHECK((uint64_t)p.vec_rows * hw.vec_per_cube == p.base_m && p.vec_rows % 8 == 0, "%s", s);
    CHECK(p.depth_k >= 1, "%s", s);
    if (p.n > 0) CHECK(p.base_m <= align_up(p.n, kMinBase), "%s base_m=%u", s, p.base_m);
    if (bwd) {
        CHECK(p.base_d >= kMinBase && p.base_d % kMinBase == 0, "%s", s);
        uint64_t rows = p.base_m > p.base_n ? p.base_m : p.base_n;
        CHECK(rows * p.base_d * 4 * 2 <= hw.l0c_bytes, "%s", s);
    }
    // tails: blocks tile [0, n) and [0, v) exactly
    CHECK(p.m_blocks == ceil_div(p.n, p.base_m), "%s", s);
    CHECK(p.n_blocks == ceil_div(p.v, p.base_n), "%s", s);
    if (p.n > 0) {
        CHECK(p.tail_m >= 1 && p.tail_m <= p.base_m, "%s tail_m=%llu", s, (unsigned long long)p.tail_m);
        CHECK((p.m_blocks - 1) * p.base_m + p.tail_m == p.n, "%s", s);
        CHECK(block_rows(p, p.m_blocks - 1) == p.tail_m && (p.m_blocks == 1 || block_rows(p, 0) == p.base_m), "%s", s);
    } else {
        CHECK(p.m_blocks == 0 && p.tasks == 0 && p.used_cores == 0, "%s", s);
    }
    CHECK(p.tail_n >= 1 && p.tail_n <= p.base_n && (p.n_blocks - 1) * p.base_n + p.tail_n == p.v, "%s", s);
    CHECK(block_cols(p, p.n_blocks - 1) == p.tail_n, "%s", s);
    // segments: non-empty, contiguous, in order, covering every vocabulary block once
    CHECK(p.segments >= 1 && p.segments <= p.n_blocks, "%s", s);
    uint64_t next = 0;
    bool seg_ok = true;
    for (uint64_t sg = 0; sg < p.segments; ++sg) {
        uint64_t b0, b1;
        segment_blocks(p, sg, &b0, &b1);
        seg_ok = seg_ok && b0 == next && b1 > b0;
        next = b1;
    }
    CHECK(seg_ok && next == p.n_blocks, "%s segments=%llu", s, (unsigned long long)p.segments);
    if (p.segments > 1) CHECK(p.m_blocks * p.segments <= (uint64_t)hw.cube_cores, "%s", s);
    CHECK(p.tasks == p.m_blocks * p.segments, "%s", s);
    CHECK(p.used_cores <= hw.cube_cores && (p.tasks == 0 || p.used_cores >= 1), "%s", s);
    if (p.tasks > 0 && p.tasks <= 4096) {
        std::set<std::pair<uint64_t, uint64_t>> seen;
        for (uint64_t tk = 0; tk < p.tasks; ++tk) {
            uint64_t m, sg;
            task_coords(p, tk, &m, &sg);
            if (m < p.m_blocks && sg < p.segments) seen.insert({m, sg});
        }
        CHECK(seen.size() == p.tasks, "%s task map not a bijection", s);
    }
    // vector rows of a token block split over the vector cores without gap or overlap
    for (uint64_t rows : {static_cast<uint64_t>(p.base_m), p.tail_m}) {
        uint64_t covered = 0;
        bool ok = true;
        for (uint32_t sub = 0; sub < hw.vec_per_cube; ++sub) {
            uint64_t r0, nr;
            vec_rows_of(p, rows, sub, &r0, &nr);
            ok = ok && (nr == 0 || r0 == covered);
            covered += nr;
        }
        CHECK(ok && covered == rows, "%s rows=%llu", s, (unsigned long long)rows);
    }
}

// One UB region of a kernel's layout: its offset in the plan, whether the flags need it, the bytes the kernel views.
struct Region {
    const char* name;
    uint32_t off;
    bool present;
    uint64_t need;
};

// A kernel's UB layout: exactly the regions its flags need (kUbNone otherwise), each 32-byte aligned, as large as the
// kernel's view of it, inside ub_end and disjoint from every other (a zero-sized region must not share its offset
// with the next one); ub_end is what ft::plan was told and fits the UB less the reserve.
static void check_regions(const std::string& t, const Region* regions, int nr, uint32_t ub_end, uint32_t slot_stride,
                          const Plan& base, const HwSpec& hw) {
    const char* s = t.c_str();
    CHECK(ub_end == base.ub_used && ub_end % kUbAlign == 0 && ub_end + kUbReserved <= hw.ub_bytes, "%s ub_end=%u", s,
          ub_end);
    CHECK(slot_stride == align_up(base.vec_rows, 64), "%s slot_stride=%u", s, slot_stride);
    for (int i = 0; i < nr; ++i) {
        const Region& r = regions[i];
        CHECK((r.off != kUbNone) == r.present, "%s region %s present=%d off=%u", s, r.name, r.present, r.off);
        if (!r.present || r.off == kUbNone) continue;
        CHECK(r.off % kUbAlign == 0 && r.off + r.need <= ub_end, "%s region %s", s, r.name);
        for (int j = i + 1; j < nr; ++j) {
            const Region& q = regions[j];
            if (!q.present || q.off == kUbNone) continue;
            CHECK(r.off + r.need <= q.off || q.off + q.need <= r.off, "%s regions %s and %s overlap", s, r.name,
                  q.name);
        }
    }
}

// The forward's plan (plan_stats; the entropy sum with kEz): ft::plan's tile under its layout, the layout and the
// GM workspace (the segments' statistics planes, the ring).
static void check_stats(uint64_t n, uint64_t d, uint64_t v, uint32_t elt, uint32_t flags, const HwSpec& hw) {
    const bool ez = (flags & kEz) != 0, bias = (flags & kBias) != 0;
    flags &= kBias | kSmoothing | kSoftcap;
    const fc::CubePlan m = fc::plan_stats(n, d, v, elt, flags, ez, hw);
    const Plan& p = m.base;
    const std::string t = "stats " + tag(p);
    CHECK(m.status == kOk, "%s status=%d", t.c_str(), m.status);
    if (m.status != kOk) return;
    const Plan q = tile_plan(n, d, v, elt, flags | (ez ? kEz : 0u), hw);
    CHECK(p.base_m == q.base_m && p.base_n == q.base_n && p.base_k == q.base_k && p.vec_rows == q.vec_rows, "%s",
          t.c_str());
    const uint64_t st = p.segments > 1 ? fc::kCubeStatPlanes * p.segments * n * 4 : 0;
    const uint64_t ring = (uint64_t)p.used_cores * fc::kRingSlots * p.base_m * p.base_n * 4;
    CHECK(m.ws_stats == align_up(st, kGmAlign) && m.ws_ring == align_up(ring, kGmAlign) &&
          m.ws_total == m.ws_stats + m.ws_ring, "%s", t.c_str());
    const uint64_t vr = p.vec_rows, bn = p.base_n, tile = vr * bn * 4;
    const Region regions[] = {
        {"z", m.ub_z, true, tile},
        {"w", m.ub_w, true, tile},
        {"w2", m.ub_w2, (flags & kSoftcap) != 0 || ez, tile},
        {"bias", m.ub_bias, bias, align_up(bn, kMinBase) * elt},
        {"bias_f32", m.ub_bias_f32, bias && elt == 2, bn * 4},
        {"bc", m.ub_bc, true, align_up(vr, 8) * 8 * 4},
        {"mask", m.ub_mask, true, 4ull * fc::kMaskBytes},
        {"slots", m.ub_slots, true, static_cast<uint64_t>(m.slot_stride) * fc::kCubeSlots * 4},
    };
    check_regions(t, regions, sizeof(regions) / sizeof(regions[0]), m.ub_end, m.slot_stride, p, hw);
}

// The backward's plan (plan_grad): the same, with its regions and workspace (z and dz rings, db partials).
static void check_grad(uint64_t n, uint64_t d, uint64_t v, uint32_t elt, uint32_t flags, const HwSpec& hw) {
    flags = (flags & (kBias | kSoftcap)) | kBackward;
    const bool bias = (flags & kBias) != 0;
    const fc::CubeGradPlan m = fc::plan_grad(n, d, v, elt, flags, hw);
    const Plan& p = m.base;
    const std::string t = "grad " + tag(p);
    if (n >= fc::kMaxLocalVocab) {  // row offsets travel as exact floats
        CHECK(m.status == kTooLarge, "%s status=%d", t.c_str(), m.status);
        return;
    }
    CHECK(m.status == kOk, "%s status=%d", t.c_str(), m.status);
    if (m.status != kOk) return;
    const Plan q = tile_plan(n, d, v, elt, flags, hw);
    CHECK(p.base_m == q.base_m && p.base_n == q.base_n && p.base_d == q.base_d && p.vec_rows == q.vec_rows, "%s",
          t.c_str());
    const uint64_t tiles = (uint64_t)p.used_cores * fc::kRingSlots * p.base_m * p.base_n;
    CHECK(m.ws_ring == align_up(tiles * 4, kGmAlign) && m.ws_dz == align_up(tiles * elt, kGmAlign) &&
          m.ws_db == (bias ? align_up(2 * v * 4, kGmAlign) : 0) && m.ws_total == m.ws_ring + m.ws_dz + m.ws_db,
          "%s", t.c_str());
    const uint64_t vr = p.vec_rows, bn = p.base_n, tile = vr * bn * 4;
    const Region regions[] = {
        {"z", m.ub_z, true, tile},
        {"w", m.ub_w, true, tile},
        {"w2", m.ub_w2, true, tile},
        {"cast", m.ub_cast, elt == 2, vr * bn * elt},
        {"bias", m.ub_bias, bias, align_up(bn, kMinBase) * elt},
        {"bias_f32", m.ub_bias_f32, bias && elt == 2, bn * 4},
        {"bc", m.ub_bc, true, align_up(vr, 8) * 8 * 4},
        {"bc2", m.ub_bc2, true, align_up(vr, 8) * 8 * 4},
        {"colsum", m.ub_colsum, bias, bn * 4},
        {"slots", m.ub_slots, true, static_cast<uint64_t>(m.slot_stride) * fc::kCubeSlots * 4},
    };
    check_regions(t, regions, sizeof(regions) / sizeof(regions[0]), m.ub_end, m.slot_stride, p, hw);
}

// ft::plan's invariants and those of the kernel plan built on it
static void check_all(uint64_t n, uint64_t d, uint64_t v, uint32_t elt, uint32_t flags, const HwSpec& hw) {
    check_plan(tile_plan(n, d, v, elt, flags, hw), hw);
    if (flags & kBackward) {
        check_grad(n, d, v, elt, flags, hw);
    } else {
        check_stats(n, d, v, elt, flags, hw);
    }
}

static void test_grid() {
    const HwSpec hw;
    const uint64_t ns[] = {0, 1, 5, 16, 17, 100, 127, 128, 129, 1000, 3000, 4096, 8191, 65536, 1u << 20};
    const uint64_t ds[] = {1, 7, 64, 100, 896, 2048, 3584, 4096, 8192, 65534};
    const uint64_t vs[] = {1, 100, 128, 255, 1000, 32000, 151936, 152064, 256000};
    for (uint64_t n : ns)
        for (uint64_t d : ds)
            for (uint64_t v : vs)
                for (uint32_t elt : {2u, 4u})
                    for (uint32_t flags = 0; flags < 32; flags += (n % 2 ? 3 : 5))  // a spread of flag sets
                        check_all(n, d, v, elt, flags, hw);
    // every flag combination on the Qwen head shapes
    for (uint32_t flags = 0; flags < 32; ++flags)
        for (uint32_t elt : {2u, 4u}) {
            check_all(8192, 4096, 151936, elt, flags, hw);
            check_all(2048, 896, 151936, elt, flags, hw);
            check_all(3, 896, 151936, elt, flags, hw);
        }
}

static void test_expected_tiles() {
    // bf16 on a 910B: 128 x 128 cube tiles, K chunks of 128, two L0C buffers
    Plan p = tile_plan(8192, 4096, 151936, 2, 0);
    CHECK(p.base_m == 128 && p.base_n == 128 && p.base_k == 128 && p.l0c_buffers == 2, "got %u %u %u %u",
          p.base_m, p.base_n, p.base_k, p.l0c_buffers);
    CHECK(p.vec_rows == 64, "vec_rows=%u", p.vec_rows);
    CHECK(p.a_resident == 0, "128 x 4096 bf16 rows are 1 MiB: cannot stay in a 512 KiB L1");
    CHECK(p.segments == 1 && p.used_cores == 24 && p.tasks == 64, "segments=%llu", (unsigned long long)p.segments);
    // Qwen2.5-0.5B head: 128 x 896 bf16 = 224 KiB stays resident in L1
    Plan q = tile_plan(2048, 896, 151936, 2, 0);
    CHECK(q.a_resident == 1 && q.l1_used <= 512 * 1024, "a_resident=%u", q.a_resident);
    // fp32 operands halve the K chunk
    Plan f = tile_plan(8192, 4096, 151936, 4, 0);
    CHECK(f.base_k == 64, "fp32 base_k=%u", f.base_k);
    // V not a multiple of the block
    Plan t = tile_plan(1000, 64, 151937, 2, kBias);
    CHECK(t.n_blocks == 1188 && t.tail_n == 151937 - 1187 * 128, "tail_n=%llu", (unsigned long long)t.tail_n);
    CHECK(t.tail_m == 1000 - 7 * 128, "tail_m=%llu", (unsigned long long)t.tail_m);
    // few tokens: small token tile, vocabulary split into segments so that all cores work
    Plan s = tile_plan(5, 896, 151936, 2, 0);
    CHECK(s.base_m == 16 && s.m_blocks == 1, "base_m=%u", s.base_m);
    CHECK(s.segments == 24 && s.used_cores == 24, "segments=%llu", (unsigned long long)s.segments);
    // with the entropy sum: the same tile, and the forward's layout gains the w2 tile for the exponentials
    Plan se = tile_plan(5, 896, 151936, 2, kEz);
    CHECK(se.base_n == s.base_n && se.ub_used == s.ub_used + (uint64_t)s.vec_rows * s.base_n * 4, "ub_used=%llu",
          (unsigned long long)se.ub_used);
    // more token blocks than cores: one segment
    Plan big = tile_plan(1 << 16, 4096, 151936, 2, 0);
    CHECK(big.segments == 1, "segments=%llu", (unsigned long long)big.segments);
    // the fp32 backward has no cast region, and nothing aliases the row slots or the bias
    check_all(8192, 4096, 151936, 4, kBackward | kBias, HwSpec());
    const fc::CubeGradPlan f3 = fc::plan_grad(8192, 4096, 151936, 4, kBias);
    CHECK(f3.ub_cast == kUbNone && f3.ub_bias_f32 == kUbNone && f3.ub_bias != f3.ub_slots, "cast=%u bias=%u slots=%u",
          f3.ub_cast, f3.ub_bias, f3.ub_slots);
    // backward: 128-column dX / dW chunks, a two-slot dz ring per core
    const fc::CubeGradPlan b = fc::plan_grad(8192, 4096, 151936, 2, kBias);
    CHECK(b.base.base_d == 128, "base_d=%u", b.base.base_d);
    CHECK(b.ws_dz == 24ull * 2 * 128 * 128 * 2, "ws_dz=%llu", (unsigned long long)b.ws_dz);
}

static void test_huge_and_errors() {
    const HwSpec hw;
    // N beyond 32 bits: the grid's counts stay exact in 64 bits
    const uint64_t n = 3000000000000ull;  // 3e12 tokens
    Plan p = tile_plan(n, 4096, 151936, 2, kBackward);
    check_plan(p, hw);
    CHECK(p.m_blocks == ceil_div(n, 128), "m_blocks=%llu", (unsigned long long)p.m_blocks);
    Plan q = tile_plan((1ull << 32) + 3, 8192, 256000, 4, kSmoothing | kSoftcap);
    check_plan(q, hw);
    CHECK(q.tail_m == ((1ull << 32) + 3) % 128, "tail_m=%llu", (unsigned long long)q.tail_m);
    Plan f = tile_plan(1ull << 62, 4096, 151936, 2, 0);
    CHECK(f.status == kOk, "status=%d", f.status);
    // ids (and the backward's row offsets) travel as exact floats: the cube planners stop at 2^24
    CHECK(fc::plan_stats(100, 64, 1ull << 24, 2, 0, false).status == kTooLarge, "%s", "");
    CHECK(fc::plan_grad(1ull << 24, 64, 100, 2, 0).status == kTooLarge, "%s", "");
    CHECK(fc::plan_grad(100, 64, (1ull << 24) - 1, 2, 0).status == kOk, "%s", "");
    CHECK(tile_plan(10, 64, 100, 3, 0).status == kBadDtype, "%s", "");
    CHECK(tile_plan(10, 0, 100, 2, 0).status == kEmptyDim && tile_plan(10, 64, 0, 2, 0).status == kEmptyDim, "%s", "");
    CHECK(tile_plan(10, 1ull << 31, 100, 2, 0).status == kTooLarge, "%s", "");
    CHECK(tile_plan(10, 64, 1ull << 31, 2, 0).status == kTooLarge, "%s", "");
    // h and W are read at row stride D by the GM -> L1 copy, whose srcDValue field is 16 bits
    CHECK(tile_plan(10, 65535, 100, 2, 0).status == kStrideLimit, "%s", "");
    CHECK(tile_plan(10, 65534, 100, 4, kBackward).status != kStrideLimit, "%s", "");
    CHECK(std::strstr(status_text(kStrideLimit), "srcDValue") != nullptr, "%s", "");
    CHECK(std::strlen(status_text(kNoFit)) > 0 && std::strcmp(status_text(kOk), "ok") == 0, "%s", "");
}

static void test_other_parts() {
    // a part with a small UB and fewer cores still gets a valid, smaller plan
    HwSpec small;
    small.ub_bytes = 64 * 1024;
    small.cube_cores = 20;
    for (uint32_t flags = 0; flags < 32; ++flags) {
        check_all(4096, 4096, 151936, 2, flags, small);
        Plan p = tile_plan(4096, 4096, 151936, 2, flags, small);
        CHECK(p.base_n < 128 || p.base_m < 128, "flags=%u base %u x %u", flags, p.base_m, p.base_n);
    }
    // the CPU twin's small part (tests/support/ascendc_twin/build.py HW_TINY): 16 KiB of UB left for the layouts
    HwSpec twin;
    twin.cube_cores = 5;
    twin.ub_bytes = 32 * 1024;
    twin.l1_bytes = 64 * 1024;
    twin.l0a_bytes = twin.l0b_bytes = 4 * 1024;
    twin.l0c_bytes = 8 * 1024;
    for (uint64_t n : {1ull, 37ull, 512ull, 8192ull})
        for (uint32_t elt : {2u, 4u})
            for (uint32_t flags = 0; flags < 32; ++flags) check_all(n, 896, 151936, elt, flags, twin);
    // the first tile whose kernel layout fits is taken: 32 x 32 for the bf16 backward with a bias (15680 bytes)
    const fc::CubeGradPlan tg = fc::plan_grad(512, 896, 151936, 2, kBias, twin);
    CHECK(tg.base.base_m == 32 && tg.base.base_n == 32 && tg.ub_end == 15680, "base %u x %u ub_end=%u", tg.base.base_m,
          tg.base.base_n, tg.ub_end);
    // one vector core per cube
    HwSpec one;
    one.vec_per_cube = 1;
    check_all(300, 512, 5000, 2, kBackward | kSoftcap, one);
    check_all(300, 512, 5000, 2, kSoftcap | kEz, one);
    // nothing fits in a UB smaller than the reserve
    HwSpec tiny;
    tiny.ub_bytes = 8 * 1024;
    CHECK(tile_plan(128, 128, 128, 2, 0, tiny).status == kNoFit, "%s", "");
}

int main() {
    static_assert(sizeof(Plan) % 8 == 0, "Plan is copied verbatim into the tiling buffer");
    test_grid();
    test_expected_tiles();
    test_huge_and_errors();
    test_other_parts();
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail == 0 ? 0 : 1;
}
