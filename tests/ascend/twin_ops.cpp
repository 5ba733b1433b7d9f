// Torch extension of the test suite: the AscendC kernels of csrc/ascend compiled with g++ against the AscendC CPU
// twin (csrc/ascend/twin/kernel), exposed as CPU ops with exactly the contracts of the NPU adapter's
// fused_lce::_npu_stats / fused_lce::_npu_grads (csrc/npu/fused_lce_npu.cpp):
//   fused_lce::_twin_stats(hidden, weight, bias, labels, vocab_start, softcap, with_zsum, temperature,
//                          with_entropy) -> (max, sum_exp, target, zsum, argmax int64 global, ez; ez empty unless
//                          with_entropy)
//   fused_lce::_twin_grads(coefs (4, N): a, t, b, u, hidden, weight, bias, labels, lse, vocab_start, softcap,
//                          temperature, grad_mask) -> (dx, dw, db float32)
//   fused_lce::_twin_config(hw, seed, switch_prob, hazards): the part (HwSpec and memories) and the scheduler seed
//       used by the next calls; fused_lce::_twin_plan(...) returns the plan fields for the tests.
// The tiling is what op_host computes: fused_lce::tiling::plan (csrc/include/fused_lce_tiling.h) for the part, and
// Matmul tilings with the plan's fixed base tile (fill_gemm below stands in for matmul_tiling::MatmulApiTiling,
// which needs the CANN host libraries; it sets the fields the Matmul API reads).
#include <torch/extension.h>

#include <array>
#include <cmath>
#include <mutex>
#include <vector>

#include "../../csrc/ascend/common/fused_lce_mix_tiling_data.h"
#include "../../csrc/ascend/common/fused_lce_tiling_data.h"
#include "twin_launch.h"

// stats: hidden, weight, bias, labels, 6 outputs, workspace, tiling; grad: coefs, hidden, weight, bias, labels, lse,
// 3 outputs, workspace, tiling
using StatsKernel = void (*)(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR,
                             GM_ADDR, GM_ADDR, GM_ADDR);
using GradKernel = void (*)(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR,
                            GM_ADDR);

#define TWIN_DECLARE_STATS(dt, lt) \
    extern "C" void fused_lce_stats_##dt##_##lt(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, \
                                                GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR);
#define TWIN_DECLARE_GRAD(dt, lt) \
    extern "C" void fused_lce_grad_##dt##_##lt(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, \
                                               GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR);
TWIN_DECLARE_STATS(bf16, i64)
TWIN_DECLARE_STATS(bf16, i32)
TWIN_DECLARE_STATS(f16, i64)
TWIN_DECLARE_STATS(f16, i32)
TWIN_DECLARE_STATS(f32, i64)
TWIN_DECLARE_STATS(f32, i32)
TWIN_DECLARE_GRAD(bf16, i64)
TWIN_DECLARE_GRAD(bf16, i32)
TWIN_DECLARE_GRAD(f16, i64)
TWIN_DECLARE_GRAD(f16, i32)
TWIN_DECLARE_GRAD(f32, i64)
TWIN_DECLARE_GRAD(f32, i32)

using GmKernel12 = void (*)(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR,
                            GM_ADDR, GM_ADDR);
#define TWIN_DECLARE12(kind, dt, lt) \
    extern "C" void fused_lce_##kind##_##dt##_##lt(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, \
                                                   GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR);
// stats_mix: hidden, weight, bias, labels, 6 outputs, zCache (output), workspace, tiling
using GmKernel13 = void (*)(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR,
                            GM_ADDR, GM_ADDR, GM_ADDR);
#define TWIN_DECLARE13(kind, dt, lt)                                                                          \
    extern "C" void fused_lce_##kind##_##dt##_##lt(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, \
                                                   GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR);
TWIN_DECLARE13(stats_mix, bf16, i64)
TWIN_DECLARE13(stats_mix, bf16, i32)
TWIN_DECLARE13(stats_mix, f16, i64)
TWIN_DECLARE13(stats_mix, f16, i32)
TWIN_DECLARE13(stats_mix, f32, i64)
TWIN_DECLARE13(stats_mix, f32, i32)
// grad_mix: a, t, b, u, hidden, weight, bias, labels, lse, zCache (input), dx, dw, db, workspace, tiling
using GmKernel15 = void (*)(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR,
                            GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR);
#define TWIN_DECLARE15(kind, dt, lt)                                                                          \
    extern "C" void fused_lce_##kind##_##dt##_##lt(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, \
                                                   GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, \
                                                   GM_ADDR);
TWIN_DECLARE15(grad_mix, bf16, i64)
TWIN_DECLARE15(grad_mix, bf16, i32)
TWIN_DECLARE15(grad_mix, f16, i64)
TWIN_DECLARE15(grad_mix, f16, i32)
TWIN_DECLARE15(grad_mix, f32, i64)
TWIN_DECLARE15(grad_mix, f32, i32)

namespace {

namespace ft = fused_lce::tiling;
namespace fm = fused_lce::mix;
using at::Tensor;

struct TwinState {
    ft::HwSpec hw;
    uint64_t seed = 1;
    double switch_prob = 0.3;
    bool hazards = true;
    int mm_variant = 0;  // legal variation of the Matmul tilings (vary_tiling)
};
TwinState& state() {
    static TwinState s;
    return s;
}
std::mutex& launch_mutex() {
    static std::mutex m;
    return m;
}

// The compiled variant of a kernel for (operand dtype, label dtype), as the OPP build makes one per pair.
template <class K>
K pick_variant(at::ScalarType dt, at::ScalarType lt, K bf16_i64, K bf16_i32, K f16_i64, K f16_i32, K f32_i64,
               K f32_i32) {
    const bool i64 = lt == at::kLong;
    TORCH_CHECK(lt == at::kLong || lt == at::kInt, "fused_lce twin: labels must be int64 or int32");
    if (dt == at::kBFloat16) return i64 ? bf16_i64 : bf16_i32;
    if (dt == at::kHalf) return i64 ? f16_i64 : f16_i32;
    if (dt == at::kFloat) return i64 ? f32_i64 : f32_i32;
    TORCH_CHECK(false, "fused_lce twin: hidden must be bfloat16, float16 or float32");
}
#define TWIN_PICK(kind, dt, lt)                                                                               \
    pick_variant(dt, lt, fused_lce_##kind##_bf16_i64, fused_lce_##kind##_bf16_i32, fused_lce_##kind##_f16_i64, \
                 fused_lce_##kind##_f16_i32, fused_lce_##kind##_f32_i64, fused_lce_##kind##_f32_i32)

StatsKernel pick_stats(at::ScalarType dt, at::ScalarType lt) { return TWIN_PICK(stats, dt, lt); }
GradKernel pick_grad(at::ScalarType dt, at::ScalarType lt) { return TWIN_PICK(grad, dt, lt); }

// One single-core Matmul tiling with a fixed base tile (what op_host's gemm_tiling asks MatmulApiTiling for).
AscendC::tiling::TCubeTiling fill_gemm(uint64_t m, uint64_t n, uint64_t k, uint32_t bm, uint32_t bn, uint32_t bk,
                                       uint32_t elt, const ft::HwSpec& hw) {
    AscendC::tiling::TCubeTiling t{};
    t.usedCoreNum = 1;
    t.M = static_cast<int32_t>(m);
    t.N = static_cast<int32_t>(n);
    t.Ka = t.Kb = static_cast<int32_t>(k);
    t.singleCoreM = t.M;
    t.singleCoreN = t.N;
    t.singleCoreK = t.Ka;
    t.baseM = static_cast<int32_t>(bm);
    t.baseN = static_cast<int32_t>(bn);
    t.baseK = static_cast<int32_t>(bk);
    t.depthA1 = t.depthB1 = 2;
    t.stepM = t.stepN = t.stepKa = t.stepKb = 1;
    t.iterateOrder = 0;
    t.dbL0A = static_cast<uint64_t>(bm) * bk * elt * 2 <= hw.l0a_bytes ? 2 : 1;
    t.dbL0B = static_cast<uint64_t>(bn) * bk * elt * 2 <= hw.l0b_bytes ? 2 : 1;
    t.dbL0C = static_cast<uint64_t>(bm) * bn * 4 * 2 <= hw.l0c_bytes ? 2 : 1;
    t.shareL1Size = static_cast<int32_t>((static_cast<uint64_t>(bm) + bn) * bk * elt * 2);
    t.shareL0CSize = static_cast<int32_t>(static_cast<uint64_t>(bm) * bn * 4);
    t.BatchNum = 1;
    return t;
}

// The Matmul tiling values besides the fixed base M / N (baseK, depths, steps, L0 double buffers, iterate order) are
// GetTiling's choice (asc-devkit impl/adv_api/tiling/matmul/matmul_tiling_algorithm.cpp), not reproduced here: the
// kernels must not depend on them. Variant v > 0 of the current state replaces them with another legal set (within
// L0A / L0B / L0C with its double-buffer flags and L1; a set that does not fit leaves the tiling unchanged), and the
// tests run the kernels under each (test_twin_tiling_grid.py).
void vary_tiling(AscendC::tiling::TCubeTiling& t, uint32_t elt) {
    const int variant = state().mm_variant;
    if (variant == 0 || t.baseK <= 0) return;
    const ft::HwSpec& hw = state().hw;
    AscendC::tiling::TCubeTiling v = t;
    const int c0 = static_cast<int>(32 / elt);
    auto kiter = [&v]() { return (v.singleCoreK + v.baseK - 1) / v.baseK; };
    switch (variant) {
        case 1: v.depthA1 = v.depthB1 = 1, v.dbL0A = v.dbL0B = v.dbL0C = 1; break;  // nothing double-buffered
        case 2: v.iterateOrder = 1, v.stepM = v.stepN = 2, v.depthA1 = v.depthB1 = 4; break;  // ORDER_N, 2 x 2 steps
        case 3:  // half the base K, K steps of 2
            if (v.baseK >= 2 * c0 && (v.baseK / 2) % c0 == 0) v.baseK /= 2;
            v.stepKa = v.stepKb = 2, v.depthA1 = v.depthB1 = 4;
            break;
        case 4: v.depthA1 = kiter() * v.stepM, v.depthB1 = kiter() * v.stepN; break;  // both whole K in L1
        case 5: v.iterateOrder = 0, v.stepN = 3, v.depthA1 = kiter(), v.depthB1 = 2; break;  // A kept over 3 tiles
        default: TORCH_CHECK(false, "fused_lce twin: unknown Matmul tiling variant ", variant);
    }
    const uint64_t l1 = (static_cast<uint64_t>(v.depthA1) * v.baseM + static_cast<uint64_t>(v.depthB1) * v.baseN) *
                        v.baseK * elt;
    const uint64_t ab = (v.dbL0A == 2 && v.dbL0B == 2) ? 2 : 1;
    if (l1 <= hw.l1_bytes && static_cast<uint64_t>(v.baseM) * v.baseK * elt * ab <= hw.l0a_bytes &&
        static_cast<uint64_t>(v.baseN) * v.baseK * elt * ab <= hw.l0b_bytes)
        t = v;
}
AscendC::tiling::TCubeTiling gemm(uint64_t m, uint64_t n, uint64_t k, uint32_t bm, uint32_t bn, uint32_t bk,
                                  uint32_t elt, const ft::HwSpec& hw) {
    AscendC::tiling::TCubeTiling t = fill_gemm(m, n, k, bm, bn, bk, elt, hw);
    vary_tiling(t, elt);
    return t;
}

twin::Config twin_config() {
    const TwinState& s = state();
    twin::Config c;
    c.ub_bytes = s.hw.ub_bytes;
    c.l1_bytes = s.hw.l1_bytes;
    c.l0a_bytes = s.hw.l0a_bytes;
    c.l0b_bytes = s.hw.l0b_bytes;
    c.l0c_bytes = s.hw.l0c_bytes;
    c.seed = s.seed;
    c.switch_prob = s.switch_prob;
    c.hazards = s.hazards;
    return c;
}

constexpr uint64_t kSysWorkspace = 64 * 1024;  // the library's part of the workspace (unused by the twin)

void check_problem(const Tensor& hidden, const Tensor& weight, const c10::optional<Tensor>& bias,
                   const Tensor& labels) {
    TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
                "fused_lce twin: expected hidden (N, D) and weight (V, D), got ", hidden.sizes(), " and ",
                weight.sizes());
    TORCH_CHECK(labels.dim() == 1 && labels.size(0) == hidden.size(0), "fused_lce twin: labels must be (N,)");
    TORCH_CHECK(hidden.scalar_type() == weight.scalar_type(), "fused_lce twin: hidden and weight dtypes differ");
    TORCH_CHECK(hidden.device().is_cpu(), "fused_lce twin: CPU tensors only");
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), "fused_lce twin: bias must be (V,)");
        TORCH_CHECK(bias->scalar_type() == weight.scalar_type(), "fused_lce twin: bias dtype differs from weight");
    }
}

ft::Plan make_plan(const Tensor& hidden, const Tensor& weight, uint32_t flags) {
    const ft::Plan p = ft::plan(static_cast<uint64_t>(hidden.size(0)), static_cast<uint64_t>(hidden.size(1)),
                                static_cast<uint64_t>(weight.size(0)), static_cast<uint32_t>(hidden.element_size()),
                                flags, state().hw);
    TORCH_CHECK(p.status == ft::kOk, "fused_lce twin: no tiling: ", ft::status_text(p.status));
    return p;
}

// Runs `call(ws, tiling)` (the kernel entry with its GM arguments) on used_cores AI cores.
template <class TilingData, class Call>
void launch_any(const ft::Plan& p, std::vector<twin_test::GmBuffer> bufs, Tensor& workspace, const TilingData& td,
                Call call) {
    std::lock_guard<std::mutex> lock(launch_mutex());
    GM_ADDR ws = reinterpret_cast<GM_ADDR>(workspace.data_ptr());
    bufs.push_back({ws + kSysWorkspace, static_cast<uint64_t>(workspace.numel()) - kSysWorkspace, "workspace",
                    false});
    bufs.push_back({&td, sizeof(td), "tiling", true});
    const int block_dim = static_cast<int>(p.used_cores > 0 ? p.used_cores : 1);
    const int ratio = static_cast<int>(state().hw.vec_per_cube);
    GM_ADDR tiling = reinterpret_cast<GM_ADDR>(const_cast<TilingData*>(&td));
    try {
        twin_test::run_kernel(block_dim, ratio, twin_config(), bufs, ws, kSysWorkspace, [&]() { call(ws, tiling); });
    } catch (const twin::Error& e) {
        TORCH_CHECK(false, e.what());
    }
}

GmKernel13 pick_mix(at::ScalarType dt, at::ScalarType lt) { return TWIN_PICK(stats_mix, dt, lt); }

// An absent (or empty) argument gets the twin's placeholder address, never null: presence must come from the tiling
// (as on the NPU, where nothing promises a null address for an absent optional), and any access to it is reported.
GM_ADDR addr(const Tensor& t) {
    return t.defined() && t.numel() > 0 ? reinterpret_cast<GM_ADDR>(t.data_ptr()) : twin::absent_placeholder();
}
twin_test::GmBuffer buf(const Tensor& t, const char* name, bool ro) {
    return {t.defined() ? t.data_ptr() : nullptr, t.defined() ? static_cast<uint64_t>(t.numel() * t.element_size()) : 0,
            name, ro};
}

void check_temperature(double temperature) {
    TORCH_CHECK(std::isfinite(temperature) && temperature > 0.0, "fused_lce twin: temperature must be finite and > 0, "
                "got ", temperature);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> twin_stats(const Tensor& hidden, const Tensor& weight,
                                                                        const c10::optional<Tensor>& bias,
                                                                        const Tensor& labels, int64_t vocab_start,
                                                                        double softcap, bool with_zsum,
                                                                        double temperature, bool with_entropy) {
    check_problem(hidden, weight, bias, labels);
    check_temperature(temperature);
    const int64_t n = hidden.size(0);
    auto f32 = hidden.options().dtype(at::kFloat);
    Tensor m = at::empty({n}, f32), s = at::empty({n}, f32), zt = at::empty({n}, f32), zs = at::empty({n}, f32);
    Tensor am = at::empty({n}, hidden.options().dtype(at::kInt));
    Tensor ez = at::empty({with_entropy ? n : 0}, f32);
    if (n > 0) {
        Tensor h = hidden.contiguous(), w = weight.contiguous(), y = labels.contiguous();
        const bool has_bias = bias.has_value() && bias->defined();
        Tensor b = has_bias ? bias->contiguous() : Tensor();
        const uint32_t flags = (has_bias ? ft::kBias : 0u) | (with_zsum ? ft::kSmoothing : 0u) |
                               (softcap > 0 ? ft::kSoftcap : 0u) | (with_entropy ? ft::kEntropy : 0u);
        const ft::Plan p = make_plan(h, w, flags);
        FusedLceTilingData td{};
        td.plan = p;
        td.vocabStart = vocab_start;
        td.softcap = static_cast<float>(softcap);
        td.temperature = static_cast<float>(temperature);
        td.withZsum = with_zsum ? 1u : 0u;
        td.withEntropy = with_entropy ? 1u : 0u;
        td.labelBytes = static_cast<uint32_t>(y.element_size());
        td.hasBias = has_bias ? 1u : 0u;
        td.mmLogits = gemm(p.vec_rows, p.base_n, p.d, static_cast<uint32_t>(ft::align_up(p.vec_rows, 16)),
                                p.base_n, p.base_k, p.elt_bytes, state().hw);
        Tensor ws = at::zeros({static_cast<int64_t>(kSysWorkspace + p.ws_total)}, hidden.options().dtype(at::kByte));
        const StatsKernel k = pick_stats(h.scalar_type(), y.scalar_type());
        launch_any(p,
               {buf(h, "hidden", true), buf(w, "weight", true), buf(b, "bias", true), buf(y, "labels", true),
                buf(m, "max", false), buf(s, "sum_exp", false), buf(zt, "target", false), buf(zs, "zsum", false),
                buf(am, "argmax", false), buf(ez, "ez", false)},
               ws, td, [&](GM_ADDR wsp, GM_ADDR tiling) {
                   k(addr(h), addr(w), addr(b), addr(y), addr(m), addr(s), addr(zt), addr(zs), addr(am), addr(ez), wsp,
                     tiling);
               });
    }
    Tensor amax = am.to(at::kLong).add_(vocab_start);
    return {m, s, zt, zs, amax, ez};
}

// The cube-driven MIX forward (fused_lce_stats_mix.cpp): the contract of _twin_stats plus temperature and the
// entropy sum ez; returns (max, sum_exp, target, zsum, argmax int64 global, ez, zcache). keep_z: zcache is the
// kernel's zCache output (fp32 [N, V_local], the raw h W^T tiles; tiling hasZCache), else an empty tensor.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> twin_stats_mix(
    const Tensor& hidden, const Tensor& weight, const c10::optional<Tensor>& bias, const Tensor& labels,
    int64_t vocab_start, double softcap, double temperature, bool with_zsum, bool with_ez, bool keep_z) {
    check_problem(hidden, weight, bias, labels);
    TORCH_CHECK(temperature > 0, "fused_lce twin: temperature must be > 0");
    const int64_t n = hidden.size(0);
    auto f32 = hidden.options().dtype(at::kFloat);
    Tensor m = at::empty({n}, f32), s = at::empty({n}, f32), zt = at::empty({n}, f32), zs = at::empty({n}, f32);
    Tensor ez = at::empty({n}, f32);
    Tensor am = at::empty({n}, hidden.options().dtype(at::kInt));
    Tensor zc = keep_z ? at::empty({n, weight.size(0)}, f32) : at::empty({0}, f32);
    if (n > 0) {
        Tensor h = hidden.contiguous(), w = weight.contiguous(), y = labels.contiguous();
        const bool has_bias = bias.has_value() && bias->defined();
        Tensor b = has_bias ? bias->contiguous() : Tensor();
        const uint32_t flags = (has_bias ? ft::kBias : 0u) | (with_zsum ? ft::kSmoothing : 0u) |
                               (softcap > 0 ? ft::kSoftcap : 0u);
        const fm::MixPlan mp = fm::plan_stats(static_cast<uint64_t>(n), static_cast<uint64_t>(h.size(1)),
                                              static_cast<uint64_t>(w.size(0)),
                                              static_cast<uint32_t>(h.element_size()), flags, with_ez, state().hw);
        TORCH_CHECK(mp.status == ft::kOk, "fused_lce twin: no tiling: ", ft::status_text(mp.status));
        const ft::Plan& p = mp.base;
        FusedLceMixTilingData td{};
        td.plan = mp;
        td.vocabStart = vocab_start;
        td.softcap = static_cast<float>(softcap);
        td.invTemperature = static_cast<float>(1.0 / temperature);
        td.withZsum = with_zsum ? 1u : 0u;
        td.withEz = with_ez ? 1u : 0u;
        td.hasBias = has_bias ? 1u : 0u;
        td.labelBytes = static_cast<uint32_t>(y.element_size());
        td.hasZCache = keep_z ? 1u : 0u;
        td.mmLogits = fill_gemm(p.base_m, p.base_n, p.d, p.base_m, p.base_n, p.base_k, p.elt_bytes, state().hw);
        fm::keep_a_resident(&td.mmLogits, p.d, p.seg_blocks, p.elt_bytes, state().hw.l1_bytes);  // as op_host
        vary_tiling(td.mmLogits, p.elt_bytes);
        Tensor ws = at::zeros({static_cast<int64_t>(kSysWorkspace + mp.ws_total)}, hidden.options().dtype(at::kByte));
        const GmKernel13 k = pick_mix(h.scalar_type(), y.scalar_type());
        launch_any(p,
                   {buf(h, "hidden", true), buf(w, "weight", true), buf(b, "bias", true), buf(y, "labels", true),
                    buf(m, "max", false), buf(s, "sum_exp", false), buf(zt, "target", false), buf(zs, "zsum", false),
                    buf(am, "argmax", false), buf(ez, "ez", false), buf(zc, "zcache", false)},
                   ws, td, [&](GM_ADDR wsp, GM_ADDR tiling) {
                       k(addr(h), addr(w), addr(b), addr(y), addr(m), addr(s), addr(zt), addr(zs), addr(am), addr(ez),
                         addr(zc), wsp, tiling);
                   });
    }
    Tensor amax = am.to(at::kLong).add_(vocab_start);
    return {m, s, zt, zs, amax, ez, zc};
}

GmKernel15 pick_grad_mix(at::ScalarType dt, at::ScalarType lt) { return TWIN_PICK(grad_mix, dt, lt); }

// The deterministic MIX backward (fused_lce_grad_mix.cpp) with the driver's Coefs(a, t, b, u) contract:
// returns (dx, dw, db float32) of dz_j = p_j (a + b max(z_j, lse - 104)) - t [j == label] - u (softcap derivative).
// zcache: _twin_stats_mix's keep_z output for these rows (the kernel's zCache input; None: recompute the logits);
// keep_dz: the tiling's keepDz (dz kept between the phases, workspace plan.ws_total_keep). dw_acc: a float32 (V, D)
// tensor the kernel accumulates dW into in place (the kernel only ever adds to dW; dw is then returned empty), for
// callers that sum dW over several launches without a second V x D buffer.
std::tuple<Tensor, Tensor, Tensor> twin_grads_mix(const Tensor& hidden, const Tensor& weight,
                                                  const c10::optional<Tensor>& bias, const Tensor& labels,
                                                  const Tensor& lse, const Tensor& a, const Tensor& t,
                                                  const c10::optional<Tensor>& b, const c10::optional<Tensor>& u,
                                                  int64_t vocab_start, double softcap, double temperature,
                                                  std::array<bool, 3> grad_mask, const c10::optional<Tensor>& zcache,
                                                  bool keep_dz, const c10::optional<Tensor>& dw_acc) {
    check_problem(hidden, weight, bias, labels);
    const bool has_zc = zcache.has_value() && zcache->defined();
    if (has_zc)
        TORCH_CHECK(zcache->scalar_type() == at::kFloat && zcache->dim() == 2 &&
                        zcache->size(0) == hidden.size(0) && zcache->size(1) == weight.size(0),
                    "fused_lce twin: zcache must be float32 (N, V_local) = (", hidden.size(0), ", ", weight.size(0),
                    "), got ", zcache->scalar_type(), " ", zcache->sizes());
    TORCH_CHECK(temperature > 0, "fused_lce twin: temperature must be > 0");
    const bool has_bias = bias.has_value() && bias->defined();
    const bool has_b = b.has_value() && b->defined(), has_u = u.has_value() && u->defined();
    const int64_t mask = (grad_mask[0] ? 1 : 0) | (grad_mask[1] ? 2 : 0) | (grad_mask[2] && has_bias ? 4 : 0);
    auto f32 = hidden.options().dtype(at::kFloat);
    Tensor dx = (mask & 1) ? at::zeros({hidden.size(0), hidden.size(1)}, f32) : at::empty({0}, f32);
    const bool has_acc = dw_acc.has_value() && dw_acc->defined() && (mask & 2);
    if (has_acc)
        TORCH_CHECK(dw_acc->scalar_type() == at::kFloat && dw_acc->is_contiguous() && dw_acc->dim() == 2 &&
                        dw_acc->size(0) == weight.size(0) && dw_acc->size(1) == weight.size(1),
                    "fused_lce twin: dw_acc must be a contiguous float32 (V, D) tensor");
    Tensor dw = has_acc ? *dw_acc
                        : (mask & 2) ? at::zeros({weight.size(0), weight.size(1)}, f32) : at::empty({0}, f32);
    Tensor db = (mask & 4) ? at::zeros({weight.size(0)}, f32) : at::empty({0}, f32);
    if (mask != 0 && hidden.size(0) > 0) {
        auto vec = [](const Tensor& x) { return x.to(at::kFloat).contiguous(); };
        Tensor ta = vec(a), tt = vec(t), tb = has_b ? vec(*b) : Tensor(), tu = has_u ? vec(*u) : Tensor();
        Tensor l = vec(lse);
        Tensor h = hidden.contiguous(), w = weight.contiguous(), y = labels.contiguous();
        Tensor bb = has_bias ? bias->contiguous() : Tensor();
        const uint32_t flags = (has_bias ? ft::kBias : 0u) | (softcap > 0 ? ft::kSoftcap : 0u);
        const fm::MixGradPlan mp = fm::plan_grad(static_cast<uint64_t>(h.size(0)), static_cast<uint64_t>(h.size(1)),
                                                 static_cast<uint64_t>(w.size(0)),
                                                 static_cast<uint32_t>(h.element_size()), flags, state().hw);
        TORCH_CHECK(mp.status == ft::kOk, "fused_lce twin: no tiling: ", ft::status_text(mp.status));
        const ft::Plan& p = mp.base;
        FusedLceGradMixTilingData td{};
        td.plan = mp;
        td.vocabStart = vocab_start;
        td.softcap = static_cast<float>(softcap);
        td.invTemperature = static_cast<float>(1.0 / temperature);
        td.gradMask = static_cast<uint32_t>(mask);
        td.hasBias = has_bias ? 1u : 0u;
        td.hasB = has_b ? 1u : 0u;
        td.hasU = has_u ? 1u : 0u;
        td.keepDz = keep_dz ? 1u : 0u;
        td.hasZCache = has_zc ? 1u : 0u;
        Tensor zc = has_zc ? zcache->contiguous() : Tensor();
        const ft::HwSpec& hw = state().hw;
        const uint32_t bm = p.base_m, bn = p.base_n;
        td.mmZ = gemm(bm, bn, p.d, bm, bn, p.base_k, p.elt_bytes, hw);
        td.mmDx = fill_gemm(bm, p.d, bn, bm, p.base_d, bn, p.elt_bytes, hw);
        td.mmDw = fill_gemm(bn, p.d, bm, bn, p.base_d, bm, p.elt_bytes, hw);
        fm::keep_a_resident(&td.mmDx, bn, ft::ceil_div(p.d, p.base_d), p.elt_bytes, hw.l1_bytes);  // as op_host
        fm::keep_a_resident(&td.mmDw, bm, ft::ceil_div(p.d, p.base_d), p.elt_bytes, hw.l1_bytes);
        vary_tiling(td.mmDx, p.elt_bytes);
        vary_tiling(td.mmDw, p.elt_bytes);
        if (keep_dz) {  // the whole-K GEMMs from the kept Dz (N x V_local)
            td.mmDxAll = gemm(bm, p.d, mp.keep_cols, bm, p.base_d, bn, p.elt_bytes, hw);
            td.mmDwAll = gemm(bn, p.d, p.n, bn, p.base_d, bm, p.elt_bytes, hw);
        }
        const uint64_t ws_bytes = keep_dz ? mp.ws_total_keep : mp.ws_total;
        Tensor ws = at::zeros({static_cast<int64_t>(kSysWorkspace + ws_bytes)}, hidden.options().dtype(at::kByte));
        // the kept-dz region starts as NaN bytes (the device's workspace is not cleared): a tile or db partial the
        // kernel reads before writing shows up in the results
        if (keep_dz) ws.narrow(0, static_cast<int64_t>(kSysWorkspace + mp.ws_total),
                               static_cast<int64_t>(mp.ws_total_keep - mp.ws_total)).fill_(0xff);
        const GmKernel15 k = pick_grad_mix(h.scalar_type(), y.scalar_type());
        launch_any(p,
                   {buf(ta, "a", true), buf(tt, "t", true), buf(tb, "b", true), buf(tu, "u", true),
                    buf(h, "hidden", true), buf(w, "weight", true), buf(bb, "bias", true), buf(y, "labels", true),
                    buf(l, "lse", true), buf(zc, "zcache", true), buf(dx, "dx", false), buf(dw, "dw", false),
                    buf(db, "db", false)},
                   ws, td, [&](GM_ADDR wsp, GM_ADDR tiling) {
                       k(addr(ta), addr(tt), addr(tb), addr(tu), addr(h), addr(w), addr(bb), addr(y), addr(l),
                         addr(zc), addr(dx), addr(dw), addr(db), wsp, tiling);
                   });
    }
    return {dx, has_acc ? at::empty({0}, f32) : dw, db};
}

std::tuple<Tensor, Tensor, Tensor> twin_grads(const Tensor& coefs, const Tensor& hidden, const Tensor& weight,
                                              const c10::optional<Tensor>& bias, const Tensor& labels,
                                              const Tensor& lse, int64_t vocab_start, double softcap,
                                              double temperature, std::array<bool, 3> grad_mask) {
    check_problem(hidden, weight, bias, labels);
    check_temperature(temperature);
    TORCH_CHECK(coefs.dim() == 2 && coefs.size(0) == 4 && coefs.size(1) == hidden.size(0),
                "fused_lce twin: coefs must be (4, N) = (a, t, b, u), got ", coefs.sizes());
    const bool has_bias = bias.has_value() && bias->defined();
    const int64_t mask = (grad_mask[0] ? 1 : 0) | (grad_mask[1] ? 2 : 0) | (grad_mask[2] && has_bias ? 4 : 0);
    auto f32 = hidden.options().dtype(at::kFloat);
    Tensor dx = (mask & 1) ? at::zeros({hidden.size(0), hidden.size(1)}, f32) : at::empty({0}, f32);
    Tensor dw = (mask & 2) ? at::zeros({weight.size(0), weight.size(1)}, f32) : at::empty({0}, f32);
    Tensor db = (mask & 4) ? at::zeros({weight.size(0)}, f32) : at::empty({0}, f32);
    if (mask != 0 && hidden.size(0) > 0) {
        Tensor c = coefs.to(at::kFloat).contiguous(), l = lse.to(at::kFloat).contiguous();
        Tensor h = hidden.contiguous(), w = weight.contiguous(), y = labels.contiguous();
        Tensor b = has_bias ? bias->contiguous() : Tensor();
        const uint32_t flags = ft::kBackward | (has_bias ? ft::kBias : 0u) | (softcap > 0 ? ft::kSoftcap : 0u);
        const ft::Plan p = make_plan(h, w, flags);
        FusedLceTilingData td{};
        td.plan = p;
        td.vocabStart = vocab_start;
        td.softcap = static_cast<float>(softcap);
        td.temperature = static_cast<float>(temperature);
        td.gradMask = static_cast<uint32_t>(mask);
        td.labelBytes = static_cast<uint32_t>(y.element_size());
        td.hasBias = has_bias ? 1u : 0u;
        const uint32_t bm = static_cast<uint32_t>(ft::align_up(p.vec_rows, 16));
        const ft::HwSpec& hw = state().hw;
        td.mmLogits = gemm(p.vec_rows, p.base_n, p.d, bm, p.base_n, p.base_k, p.elt_bytes, hw);
        td.mmDx = gemm(p.vec_rows, p.d, p.base_n, bm, p.base_d, p.base_n, p.elt_bytes, hw);
        td.mmDw = gemm(p.base_n, p.d, p.vec_rows, p.base_n, p.base_d, bm, p.elt_bytes, hw);
        Tensor ws = at::zeros({static_cast<int64_t>(kSysWorkspace + p.ws_total)}, hidden.options().dtype(at::kByte));
        const GradKernel k = pick_grad(h.scalar_type(), y.scalar_type());
        launch_any(p,
               {buf(c, "coefs", true), buf(h, "hidden", true), buf(w, "weight", true), buf(b, "bias", true),
                buf(y, "labels", true), buf(l, "lse", true), buf(dx, "dx", false), buf(dw, "dw", false),
                buf(db, "db", false)},
               ws, td, [&](GM_ADDR wsp, GM_ADDR tiling) {
                   k(addr(c), addr(h), addr(w), addr(b), addr(y), addr(l), addr(dx), addr(dw), addr(db), wsp, tiling);
               });
    }
    return {dx, dw, db};
}

void twin_config_op(std::vector<int64_t> hw, int64_t seed, double switch_prob, bool hazards, int64_t mm_variant) {
    TORCH_CHECK(hw.size() == 7, "fused_lce twin: hw = [cube_cores, vec_per_cube, ub, l1, l0a, l0b, l0c]");
    TwinState& s = state();
    s.hw.cube_cores = static_cast<uint32_t>(hw[0]);
    s.hw.vec_per_cube = static_cast<uint32_t>(hw[1]);
    s.hw.ub_bytes = static_cast<uint64_t>(hw[2]);
    s.hw.l1_bytes = static_cast<uint64_t>(hw[3]);
    s.hw.l0a_bytes = static_cast<uint64_t>(hw[4]);
    s.hw.l0b_bytes = static_cast<uint64_t>(hw[5]);
    s.hw.l0c_bytes = static_cast<uint64_t>(hw[6]);
    s.seed = static_cast<uint64_t>(seed);
    s.switch_prob = switch_prob;
    s.hazards = hazards;
    TORCH_CHECK(mm_variant >= 0 && mm_variant <= 5, "fused_lce twin: mm_variant must be in 0..5");
    s.mm_variant = static_cast<int>(mm_variant);
}

// The plan the ops use for a problem (for tests that need to know tiles, segments and cores).
std::vector<int64_t> twin_plan(int64_t n, int64_t d, int64_t v, int64_t elt, int64_t flags) {
    const ft::Plan p = ft::plan(static_cast<uint64_t>(n), static_cast<uint64_t>(d), static_cast<uint64_t>(v),
                                static_cast<uint32_t>(elt), static_cast<uint32_t>(flags), state().hw);
    return {p.status, p.base_m, p.base_n, p.base_k, p.vec_rows, static_cast<int64_t>(p.m_blocks),
            static_cast<int64_t>(p.n_blocks), static_cast<int64_t>(p.segments), static_cast<int64_t>(p.tasks),
            p.used_cores, static_cast<int64_t>(p.tail_n), static_cast<int64_t>(p.ub_used)};
}

std::vector<int64_t> twin_plan_mix(int64_t n, int64_t d, int64_t v, int64_t elt, int64_t flags, bool ez) {
    const fm::MixPlan m = fm::plan_stats(static_cast<uint64_t>(n), static_cast<uint64_t>(d), static_cast<uint64_t>(v),
                                         static_cast<uint32_t>(elt), static_cast<uint32_t>(flags), ez, state().hw);
    const ft::Plan& p = m.base;
    return {m.status, p.base_m, p.base_n, p.base_k, p.vec_rows, static_cast<int64_t>(p.m_blocks),
            static_cast<int64_t>(p.n_blocks), static_cast<int64_t>(p.segments), static_cast<int64_t>(p.tasks),
            p.used_cores, static_cast<int64_t>(p.tail_n), m.ub_end, static_cast<int64_t>(m.ws_total)};
}

// Work counters of the last launch, one row per core: [is_aic, vector instructions, vector UB bytes written,
// scalar ops, GM bytes read, GM bytes written, cube FLOPs, cube operand bytes copied GM -> L1] (benchmarks/npu_model.py;
// twin_build.counters names them).
std::vector<int64_t> twin_counters() {
    std::vector<int64_t> out;
    for (const twin::CoreCounters& k : twin::last_counters()) {
        const auto& c = k.c;
        out.insert(out.end(), {k.aic ? 1 : 0, static_cast<int64_t>(c.v_instr), static_cast<int64_t>(c.v_bytes),
                               static_cast<int64_t>(c.s_ops), static_cast<int64_t>(c.gm_rd),
                               static_cast<int64_t>(c.gm_wr), static_cast<int64_t>(c.cube_flops),
                               static_cast<int64_t>(c.l1_in)});
    }
    return out;
}

std::vector<int64_t> twin_plan_grad(int64_t n, int64_t d, int64_t v, int64_t elt, int64_t flags) {
    const fm::MixGradPlan m = fm::plan_grad(static_cast<uint64_t>(n), static_cast<uint64_t>(d),
                                            static_cast<uint64_t>(v), static_cast<uint32_t>(elt),
                                            static_cast<uint32_t>(flags), state().hw);
    return {m.status, m.base.base_m, m.base.base_n, m.base.base_d, m.base.used_cores,
            static_cast<int64_t>(m.ws_total), static_cast<int64_t>(m.dw_workspace_bytes),
            static_cast<int64_t>(m.ws_total_keep), static_cast<int64_t>(m.base.m_blocks),
            static_cast<int64_t>(m.base.n_blocks), static_cast<int64_t>(m.keep_cols)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fused_lce, m) {
    m.def("_twin_stats(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, int vocab_start, float softcap, "
          "bool with_zsum, float temperature, bool with_entropy) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
    m.def("_twin_grads(Tensor coefs, Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, Tensor lse, "
          "int vocab_start, float softcap, float temperature, bool[3] grad_mask) -> (Tensor, Tensor, Tensor)");
    m.def("_twin_stats_mix(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, int vocab_start, float softcap, "
          "float temperature, bool with_zsum, bool with_ez, bool keep_z=False) "
          "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
    m.def("_twin_grads_mix(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, Tensor lse, Tensor a, Tensor t, "
          "Tensor? b, Tensor? u, int vocab_start, float softcap, float temperature, bool[3] grad_mask, "
          "Tensor? zcache=None, bool keep_dz=False, Tensor(a!)? dw_acc=None) -> (Tensor, Tensor, Tensor)");
    m.def("_twin_plan_grad(int n, int d, int v, int elt, int flags) -> int[]", &twin_plan_grad);
    m.def("_twin_counters() -> int[]", &twin_counters);
    m.def("_twin_plan_mix(int n, int d, int v, int elt, int flags, bool ez) -> int[]", &twin_plan_mix);
    m.def("_twin_config(int[] hw, int seed, float switch_prob, bool hazards, int mm_variant=0) -> ()",
          &twin_config_op);
    m.def("_twin_plan(int n, int d, int v, int elt, int flags) -> int[]", &twin_plan);
}

TORCH_LIBRARY_IMPL(fused_lce, CPU, m) {
    m.impl("_twin_stats", &twin_stats);
    m.impl("_twin_grads", &twin_grads);
    m.impl("_twin_stats_mix", &twin_stats_mix);
    m.impl("_twin_grads_mix", &twin_grads_mix);
}
