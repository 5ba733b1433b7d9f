// Probe kernels that keep the AscendC CPU twin honest: each runs a few API calls that either follow the rules
// (and must run clean, with checked results) or break exactly one rule (and must be reported). Exposed as
//   fused_lce::_twin_probe(str name) -> str   ("" when the probe ran clean, else the twin's error message)
//   fused_lce::_twin_cast(Tensor x float32) -> (Tensor bf16, Tensor fp16)   Cast with CAST_RINT on the twin
#include <torch/extension.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fused_lce_cube_tiling_data.h"  // csrc/ascend/common
#include "kernel_operator.h"
#include "lib/matmul_intf.h"
#include "launch.h"

using namespace AscendC;

namespace {

struct Probe {
    int block_dim = 1;
    int ratio = 0;  // AIV-only unless it drives the Matmul API
    std::function<void(std::vector<float>&, std::vector<float>&)> body;  // (gm input, gm output)
    std::function<void(twin::Config&)> part = nullptr;  // memories other than the 910B's, when the rule needs them
};

[[noreturn]] void expect_fail(const std::string& what) { throw twin::Error("probe expectation failed: " + what); }

#define EXPECT(cond)                                  \
    do {                                              \
        if (!(cond)) expect_fail(#cond);              \
    } while (0)

template <HardEvent e>
void order() {
    SetFlag<e>(EVENT_ID0);
    WaitFlag<e>(EVENT_ID0);
}

GM_ADDR g_in = nullptr, g_out = nullptr;  // the probe's GM buffers (set by run_probe)

GlobalTensor<float> gin() {
    GlobalTensor<float> g;
    g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(g_in));
    return g;
}
GlobalTensor<float> gout() {
    GlobalTensor<float> g;
    g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(g_out));
    return g;
}

// (in, out) sizes in floats; the Matmul probes' A (kM x kK) and B (kN x kK) follow `in`
constexpr int kIn = 1024, kOut = 1024;
constexpr int kM = 32, kN = 48, kK = 16;

tiling::TCubeTiling mm_tiling(int m, int n, int k, int bm, int bn, int bk);
void field_probes(std::map<std::string, Probe>& p);

// Cube -> vector hand-off through a two-slot GM ring, the way the fused kernels do it: the AIC computes tile t
// (16 x 16 = A @ B^T, K = 16) into slot t % 2 and sets flag 1 (mode 2, FIX); both AIVs wait, read their 8 rows and
// set flag 2 (mode 2, MTE2) to free the slot; the AIC waits for that before reusing a slot. `bug` breaks one step.
constexpr int kRingTiles = 4, kT = 16;
void xflag_ring(std::vector<float>& in, int bug) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    GlobalTensor<float> ring = gout()[GetBlockIdx() / (ASCEND_IS_AIC ? 1 : 2) * 2 * kT * kT];
    if ASCEND_IS_AIC {
        TPipe pipe;
        using A = MatmulType<TPosition::GM, CubeFormat::ND, float>;
        using B = MatmulType<TPosition::GM, CubeFormat::ND, float, true>;
        using C = MatmulType<TPosition::GM, CubeFormat::ND, float>;
        MatmulImpl<A, B, C> mm;
        tiling::TCubeTiling t = mm_tiling(kT, kT, kT, kT, kT, kT);
        mm.Init(&t, &pipe);
        if (bug == 5) CrossCoreWaitFlag(3);  // nobody sets 3
        for (int k = 0; k < kRingTiles; ++k) {
            if (k >= 2 && bug != 2) CrossCoreWaitFlag(2);
            mm.SetTensorA(gin()[k * kT]);
            mm.SetTensorB(gin()[256 + k * kT], true);
            mm.IterateAll(ring[(k % 2) * kT * kT]);
            mm.End();
            CrossCoreSetFlag<2, PIPE_FIX>(1);
        }
        if (bug == 4) CrossCoreSetFlag<2, PIPE_FIX>(1);  // one count more than the vector cores wait for
        return;
    }
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 4096);
    LocalTensor<float> t = buf.Get<float>(8 * kT);
    const int r0 = static_cast<int>(GetSubBlockIdx()) * 8;
    for (int k = 0; k < kRingTiles; ++k) {
        if (bug != 1) CrossCoreWaitFlag(1);
        order<HardEvent::S_MTE2>();
        order<HardEvent::V_MTE2>();
        DataCopy(t, ring[(k % 2) * kT * kT + r0 * kT], 8 * kT);
        if (k + 2 < kRingTiles) {
            if (bug == 3) {
                CrossCoreSetFlag<2, PIPE_V>(2);  // the slot's reads are on MTE2, not V
            } else {
                CrossCoreSetFlag<2, PIPE_MTE2>(2);
            }
        }
        order<HardEvent::MTE2_S>();
        if (bug != 0) continue;
        // tile k: C[i][j] = sum_x A[i][x] B[j][x], A rows at stride K (= kT) from in[k * kT], B from in[256 + k * kT]
        for (int r = 0; r < 8; r += 3)
            for (int j = 0; j < kT; j += 5) {
                float ref = 0;
                for (int x = 0; x < kT; ++x) ref += in[k * kT + (r0 + r) * kT + x] * in[256 + k * kT + j * kT + x];
                EXPECT(std::fabs(t.GetValue(r * kT + j) - ref) <= 1e-4f * (1 + std::fabs(ref)));
            }
    }
}

// Mode 0 (all vector cores) and mode 1 (the two vector cores of one AI core) barriers.
// SyncAll<false> in a MIX kernel orders GM across cube and vector cores (asc-devkit
// impl/basic_api/dav_c220/kernel_operator_sync_impl.h SyncAllImpl, the isAIVOnly = false path: the AIVs signal, the
// AICs meet, then release the AIVs), as FusedLceGradCube's dz-kept mode uses it between its phases: the vector cores
// of both AI cores write a 16 x 16 tile each (8 rows per AIV), all cores meet, then each cube multiplies the OTHER
// AI core's tile. bug 1: no SyncAll, a cross-core race the checker must report.
void syncall_mix(int bug) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    const int core = static_cast<int>(GetBlockIdx()) / (ASCEND_IS_AIC ? 1 : 2);
    if ASCEND_IS_AIC {
        TPipe pipe;
        using A = MatmulType<TPosition::GM, CubeFormat::ND, float>;
        using B = MatmulType<TPosition::GM, CubeFormat::ND, float, true>;
        MatmulImpl<A, B, A> mm;
        tiling::TCubeTiling t = mm_tiling(kT, kT, kT, kT, kT, kT);
        mm.Init(&t, &pipe);
        if (bug == 0) SyncAll<false>();
        mm.SetTensorA(gout()[((core + 1) % 2) * kT * kT]);
        mm.SetTensorB(gin()[256], true);
        mm.IterateAll(gout()[512 + core * kT * kT]);
        mm.End();
        return;
    }
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 4096);
    LocalTensor<float> t = buf.Get<float>(8 * kT);
    const int r0 = static_cast<int>(GetSubBlockIdx()) * 8;
    DataCopy(t, gin()[(core * kT + r0) * kT], 8 * kT);
    order<HardEvent::MTE2_MTE3>();
    DataCopy(gout()[core * kT * kT + r0 * kT], t, 8 * kT);
    if (bug == 0) SyncAll<false>();
}

// SetOrgShape with an A that is a sub-matrix of a wider one (FusedLceGradCube's whole-K GEMMs from the kept Dz):
// untransposed, A (M x K) rows at stride orgKa > K; transposed, A stored (K x M) rows at stride orgM > M (asc-devkit
// docs Matmul-Kernel侧接口/SetOrgShape.md, copy_cube_in_params_base.h GetOrgWidth). Both 16 x 16, K = 24, A at
// column 8 of a 40-wide matrix at in[0]; B (K x N) at stride N = 16 from in[kLdA * 32]; C at stride 16 into out[0]
// and out[256] (checked in run_probe).
constexpr int kLdA = 40, kOrgK = 24, kOrgCol = 8;
void mm_orgshape() {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    if ASCEND_IS_AIV return;
    TPipe pipe;
    using A = MatmulType<TPosition::GM, CubeFormat::ND, float>;
    using AT = MatmulType<TPosition::GM, CubeFormat::ND, float, true>;
    MatmulImpl<A, A, A> mm;
    MatmulImpl<AT, A, A> mmT;
    tiling::TCubeTiling t = mm_tiling(kT, kT, kOrgK, kT, kT, 8);
    mm.Init(&t, &pipe);
    mmT.Init(&t, &pipe);
    mm.SetOrgShape(kT, kT, kLdA, kOrgK, kT);
    mm.SetTensorA(gin()[kOrgCol]);
    mm.SetTensorB(gin()[kLdA * 32]);
    mm.SetTail(kT, kT, kOrgK);
    mm.IterateAll(gout());
    mm.End();
    mmT.SetOrgShape(kLdA, kT, kOrgK, kOrgK, kT);
    mmT.SetTensorA(gin()[kOrgCol], true);
    mmT.SetTensorB(gin()[kLdA * 32]);
    mmT.SetTail(kT, kT, kOrgK);
    mmT.IterateAll(gout()[kT * kT]);
    mmT.End();
}

void xflag_modes(int bug) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    if ASCEND_IS_AIC return;
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 1024);
    LocalTensor<float> t = buf.Get<float>(8);
    const int64_t me = GetBlockIdx();
    Duplicate(t, static_cast<float>(me + 1), 8);
    order<HardEvent::V_MTE3>();
    DataCopy(gout()[me * 8], t, 8);
    CrossCoreSetFlag<0, PIPE_MTE3>(4);
    CrossCoreWaitFlag(4);
    DataCopy(t, gout()[((me + 1) % 4) * 8], 8);
    order<HardEvent::MTE2_S>();
    EXPECT(t.GetValue(0) == static_cast<float>((me + 1) % 4 + 1));
    if (bug == 1 && GetSubBlockIdx() == 1) return;  // the pair's second core never sets
    CrossCoreSetFlag<1, PIPE_MTE2>(5);
    CrossCoreWaitFlag(5);
}

void xflag_limits(int which) {
    KERNEL_TASK_TYPE_DEFAULT(which == 4 ? KERNEL_TYPE_AIV_ONLY : KERNEL_TYPE_MIX_AIC_1_2);
    if (which == 5) {  // MatmulImpl driven from a vector core
        if ASCEND_IS_AIC return;
        TPipe pipe;
        using A = MatmulType<TPosition::GM, CubeFormat::ND, float>;
        MatmulImpl<A, A, A> mm;
        tiling::TCubeTiling t = mm_tiling(kT, kT, kT, kT, kT, kT);
        mm.Init(&t, &pipe);
        return;
    }
    if (which != 4 && ASCEND_IS_AIV) return;
    switch (which) {
        case 0:
            for (int i = 0; i < 16; ++i) CrossCoreSetFlag<2, PIPE_FIX>(1);
            break;
        case 1: CrossCoreSetFlag<2, PIPE_FIX>(16); break;
        case 2: CrossCoreSetFlag<4, PIPE_FIX>(1); break;
        case 3:
            CrossCoreSetFlag<0, PIPE_FIX>(12);
            CrossCoreWaitFlag(12);
            SyncAll<false>();
            break;
        case 4: CrossCoreSetFlag<0, PIPE_MTE3>(1); break;
    }
}

std::map<std::string, Probe> probes() {
    std::map<std::string, Probe> p;
    // ---- correct pipelines run clean and compute the right values ----
    p["ok_pipeline"] = {1, 0, [](auto&, auto& out) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 4096);
        LocalTensor<float> a = buf.Get<float>(256), b = buf.GetWithOffset<float>(256, 1024);
        DataCopy(a, gin(), 256);
        order<HardEvent::MTE2_V>();
        Adds(b, a, 1.0f, 256);
        PipeBarrier<PIPE_V>();
        Muls(b, b, 2.0f, 256);
        order<HardEvent::V_S>();
        const float v0 = b.GetValue(0);
        b.SetValue(1, v0 + 100.0f);
        order<HardEvent::S_MTE3>();
        order<HardEvent::V_MTE3>();
        DataCopyPad(gout(), b, {1, 7 * sizeof(float), 0, 0, 0});
        (void)out;
    }};
    p["ok_localtensor_semantics"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> t = buf.Get<float>();
        EXPECT(t.GetSize() == 256);
        EXPECT(t[10].GetSize() == 246);                              // operator[] keeps the remaining length
        EXPECT(t.ReinterpretCast<uint8_t>().GetSize() == 1024);      // ReinterpretCast keeps the bytes
        EXPECT(t[8].ReinterpretCast<half>().GetSize() == 496);
        EXPECT(buf.GetWithOffset<float>(16, 64).GetSize() == 16);
    }};
    p["ok_tque"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> qin;
        TQue<TPosition::VECOUT, 1> qout;
        pipe.InitBuffer(qin, 1, 256 * sizeof(float));
        pipe.InitBuffer(qout, 1, 256 * sizeof(float));
        for (int round = 0; round < 2; ++round) {
            LocalTensor<float> x = qin.AllocTensor<float>();
            DataCopy(x, gin()[round * 256], 256);
            qin.EnQue(x);
            x = qin.DeQue<float>();
            LocalTensor<float> y = qout.AllocTensor<float>();
            Exp(y, x, 256);
            qout.EnQue(y);
            qin.FreeTensor(x);
            y = qout.DeQue<float>();
            DataCopy(gout()[round * 256], y, 256);
            qout.FreeTensor(y);
        }
    }};
    p["ok_syncall"] = {4, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> t = buf.Get<float>(8);
        const int64_t me = GetBlockIdx();
        Duplicate(t, static_cast<float>(me + 1), 8);
        order<HardEvent::V_MTE3>();
        DataCopy(gout()[me * 8], t, 8);
        SyncAll();
        order<HardEvent::MTE3_MTE2>();
        DataCopy(t, gout()[((me + 1) % 4) * 8], 8);
        order<HardEvent::MTE2_S>();
        EXPECT(t.GetValue(0) == static_cast<float>((me + 1) % 4 + 1));
    }};
    p["ok_atomic_add"] = {4, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> t = buf.Get<float>(8);
        Duplicate(t, 1.0f, 8);
        order<HardEvent::V_MTE3>();
        SetAtomicAdd<float>();
        DataCopy(gout(), t, 8);  // every core adds 1: no race, the sum is 4
        SetAtomicNone();
        SyncAll();
        EXPECT(gout().GetValue(0) == 4.0f);
        DataCacheCleanAndInvalid<float, CacheLine::ENTIRE_DATA_CACHE>(gout());
    }};
    p["ok_reduce"] = {1, 0, [](auto& in, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 8192);
        LocalTensor<float> x = buf.Get<float>(320), tmp = buf.GetWithOffset<float>(64, 2048),
                           d = buf.GetWithOffset<float>(8, 4096);
        DataCopy(x, gin(), 320);
        order<HardEvent::MTE2_V>();
        ReduceMax<float>(d, x, tmp, 300, true);
        order<HardEvent::V_S>();
        float best = in[0];
        uint32_t arg = 0;
        for (int i = 1; i < 300; ++i)
            if (in[i] > best) best = in[i], arg = i;
        const float bits = d.GetValue(1);
        EXPECT(d.GetValue(0) == best && *reinterpret_cast<const uint32_t*>(&bits) == arg);
        order<HardEvent::S_V>();
        ReduceSum<float>(d, x, tmp, 300);
        order<HardEvent::V_S>();
        double ref = 0;
        for (int i = 0; i < 300; ++i) ref += in[i];
        EXPECT(std::fabs(d.GetValue(0) - ref) < 1e-3);
    }};
    // ---- each of these breaks one rule ----
    p["raw_mte2_v"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 2048);
        LocalTensor<float> a = buf.Get<float>(64), b = buf.GetWithOffset<float>(64, 1024);
        DataCopy(a, gin(), 64);
        Adds(b, a, 1.0f, 64);  // no MTE2_V
    }};
    p["raw_v_s"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> a = buf.Get<float>(64);
        Duplicate(a, 1.0f, 64);
        (void)a.GetValue(3);  // no V_S
    }};
    p["raw_s_v"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> a = buf.Get<float>(64);
        a.SetValue(0, 2.0f);
        Muls(a, a, 3.0f, 64);  // no S_V
    }};
    p["war_v_mte2"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 2048);
        LocalTensor<float> a = buf.Get<float>(64), b = buf.GetWithOffset<float>(64, 1024);
        DataCopy(a, gin(), 64);
        order<HardEvent::MTE2_V>();
        Adds(b, a, 1.0f, 64);
        PipeBarrier<PIPE_MTE2>();     // orders the two DMAs into `a` with each other, not with the vector unit
        DataCopy(a, gin()[64], 64);  // overwrites what the vector unit may still read: no V_MTE2
    }};
    p["raw_s_mte3"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> a = buf.Get<float>(8);
        a.SetValue(0, 1.0f);
        DataCopyPad(gout(), a, {1, 4, 0, 0, 0});  // no S_MTE3
    }};
    p["raw_v_v"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 2048);
        LocalTensor<float> a = buf.Get<float>(64), b = buf.GetWithOffset<float>(64, 1024);
        Duplicate(a, 1.0f, 64);
        Adds(b, a, 1.0f, 64);  // no PipeBarrier<PIPE_V>
    }};
    p["waitflag_without_setflag"] = {1, 0, [](auto&, auto&) { WaitFlag<HardEvent::V_S>(EVENT_ID2); }};
    p["setflag_twice"] = {1, 0, [](auto&, auto&) {
        SetFlag<HardEvent::V_S>(EVENT_ID1);
        SetFlag<HardEvent::V_S>(EVENT_ID1);
    }};
    p["setflag_never_waited"] = {1, 0, [](auto&, auto&) { SetFlag<HardEvent::MTE2_V>(EVENT_ID3); }};
    p["unaligned_operand"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> a = buf.Get<float>(64);
        Duplicate(a[3], 0.0f, 5);  // starts 12 bytes into a 32-byte block
    }};
    p["count_beyond_tensor"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> a = buf.GetWithOffset<float>(64, 0);
        Duplicate(a, 0.0f, 65);
    }};
    p["datacopy_not_32b"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        DataCopy(buf.Get<float>(), gin(), 7);
    }};
    p["gm_read_past_allocation"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 8192);
        DataCopy(buf.Get<float>(), gin()[kIn + (kM + kN) * kK - 64], 128);
    }};
    p["gm_write_input"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> t = buf.Get<float>(8);
        Duplicate(t, 0.0f, 8);
        order<HardEvent::V_MTE3>();
        DataCopy(gin(), t, 8);
    }};
    p["tpipe_over_capacity"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> a, b;
        pipe.InitBuffer(a, 128 * 1024);
        pipe.InitBuffer(b, 65 * 1024);
    }};
    p["missing_syncall"] = {4, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> t = buf.Get<float>(8);
        const int64_t me = GetBlockIdx();
        Duplicate(t, 1.0f, 8);
        order<HardEvent::V_MTE3>();
        DataCopy(gout()[me * 8], t, 8);
        order<HardEvent::MTE3_MTE2>();
        DataCopy(t, gout()[((me + 1) % 4) * 8], 8);  // another core's output, no SyncAll in between
    }};
    p["scalar_stores_share_cache_line"] = {2, 0, [](auto&, auto&) {
        const int64_t me = GetBlockIdx();
        gout().SetValue(me, 1.0f);  // two cores, one 64-byte line
        DataCacheCleanAndInvalid<float, CacheLine::ENTIRE_DATA_CACHE>(gout());
    }};
    p["scalar_store_not_written_back"] = {1, 0, [](auto&, auto&) { gout().SetValue(0, 1.0f); }};
    p["syncall_deadlock"] = {2, 0, [](auto&, auto&) {
        if (GetBlockIdx() == 0) return;
        SyncAll();
    }};
    p["cast_mode_unsupported"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 2048);
        LocalTensor<float> a = buf.Get<float>(64);
        Duplicate(a, 1.0f, 64);
        PipeBarrier<PIPE_V>();
        Cast(buf.GetWithOffset<bfloat16_t>(64, 1024), a, RoundMode::CAST_NONE, 64);  // A2: float->bf16 needs RINT
    }};
    p["tanh_in_place"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> a = buf.Get<float>(64);
        Duplicate(a, 1.0f, 64);
        PipeBarrier<PIPE_V>();
        Tanh(a, a, 64);
    }};
    p["reduce_tmp_too_small"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 8192);
        LocalTensor<float> x = buf.Get<float>(512), tmp = buf.GetWithOffset<float>(8, 4096),
                           d = buf.GetWithOffset<float>(8, 4096 + 64);
        Duplicate(x, 1.0f, 512);
        PipeBarrier<PIPE_V>();
        ReduceMax<float>(d, x, tmp, 512, true);
    }};
    // ---- level-0 vector forms, row reductions, compare / select / gather ----
    p["ok_row_reductions"] = {1, 0, [](auto& in, auto& out) {
        // a 4 x 256 tile: per-row max (fold 256 -> 64 with level-0 Max, then ReduceRepeat), first argmax per
        // quarter, z - rowmax with a Brcb broadcast, Compares / Select, Gather of one element per row
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 32 * 1024);
        LocalTensor<float> z = buf.Get<float>(1024), w = buf.GetWithOffset<float>(1024, 4096);
        LocalTensor<float> mx = buf.GetWithOffset<float>(64, 8192), bc = buf.GetWithOffset<float>(64, 8192 + 256);
        LocalTensor<uint32_t> idx = buf.GetWithOffset<uint32_t>(64, 8192 + 512);
        LocalTensor<uint8_t> mask = buf.GetWithOffset<uint8_t>(128, 8192 + 768);
        LocalTensor<float> sel = buf.GetWithOffset<float>(1024, 12288);
        LocalTensor<uint32_t> off = buf.GetWithOffset<uint32_t>(64, 16384);
        LocalTensor<float> g = buf.GetWithOffset<float>(64, 16384 + 256);
        DataCopy(z, gin(), 1024);
        order<HardEvent::MTE2_V>();
        const BinaryRepeatParams row(1, 1, 1, 32, 32, 32);
        Max(w, z, z[128], 64, 4, row);
        Max(w[64], z[64], z[192], 64, 4, row);
        PipeBarrier<PIPE_V>();
        Max(w, w, w[64], 64, 4, row);
        PipeBarrier<PIPE_V>();
        ReduceRepeat<ReduceType::MAX, float, float>(mx, w, 64, 4, 1, 1, 32, ReduceOrder::ORDER_ONLY_VALUE);
        ReduceRepeat<ReduceType::MAX, float, float>(idx.ReinterpretCast<float>(), z, 64, 4, 1, 1, 32,
                                                    ReduceOrder::ORDER_ONLY_INDEX);
        PipeBarrier<PIPE_V>();
        Brcb(bc, mx, 1, {1, 8});
        PipeBarrier<PIPE_V>();
        const BinaryRepeatParams bcast(1, 1, 0, 32, 32, 1);
        for (int q = 0; q < 4; ++q) Sub(w[q * 64], z[q * 64], bc, 64, 4, bcast);
        PipeBarrier<PIPE_V>();
        Compares(mask, w, 0.0f, CMPMODE::EQ, 1024);
        PipeBarrier<PIPE_V>();
        Select(sel, mask, z, -1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, 1024);
        order<HardEvent::V_S>();
        for (int r = 0; r < 4; ++r) off.SetValue(r, static_cast<uint32_t>((r * 256 + 7 * r) * 4));
        order<HardEvent::S_V>();
        Gather(g, z, off, 0, 4);
        order<HardEvent::V_S>();
        for (int r = 0; r < 4; ++r) {
            float m = in[r * 256];
            uint32_t first = 0;
            for (int j = 1; j < 64; ++j)
                if (in[r * 256 + j] > in[r * 256 + first]) first = static_cast<uint32_t>(j);
            for (int j = 1; j < 256; ++j) m = std::max(m, in[r * 256 + j]);
            EXPECT(mx.GetValue(r) == m);
            EXPECT(idx.GetValue(r) == first);
            EXPECT(w.GetValue(r * 256 + 3) == in[r * 256 + 3] - m);
            for (int j = 0; j < 256; ++j)
                EXPECT(sel.GetValue(r * 256 + j) == (in[r * 256 + j] == m ? m : -1.0f));
            EXPECT(g.GetValue(r) == in[r * 256 + 7 * r]);
        }
        (void)out;
    }};
    p["level0_beyond_tensor"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 8192);
        LocalTensor<float> z = buf.Get<float>(512), w = buf.GetWithOffset<float>(512, 4096);
        Duplicate(z, 1.0f, 512);
        PipeBarrier<PIPE_V>();
        Add(w, z, z, 64, 4, BinaryRepeatParams(1, 1, 1, 32, 32, 32));  // rows of 256: 4 repeats need 832 elements
    }};
    p["compare_partial_repeat"] = {1, 0, [](auto&, auto&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 8192);
        LocalTensor<float> z = buf.Get<float>(512);
        LocalTensor<uint8_t> m = buf.GetWithOffset<uint8_t>(64, 4096);
        Duplicate(z, 1.0f, 512);
        PipeBarrier<PIPE_V>();
        Compares(m, z, 0.0f, CMPMODE::GT, 60);
    }};
    // ---- cross-core flags (MIX 1:2, 2 AI cores): the cube computes tiles into GM, the vector cores consume them ----
    p["ok_xflag_ring"] = {2, 2, [](auto& in, auto&) { xflag_ring(in, 0); }};
    p["xflag_missing_wait"] = {2, 2, [](auto& in, auto&) { xflag_ring(in, 1); }};
    p["xflag_missing_free"] = {2, 2, [](auto& in, auto&) { xflag_ring(in, 2); }};
    p["xflag_set_on_wrong_pipe"] = {2, 2, [](auto& in, auto&) { xflag_ring(in, 3); }};
    p["xflag_never_waited"] = {2, 2, [](auto& in, auto&) { xflag_ring(in, 4); }};
    p["xflag_deadlock"] = {2, 2, [](auto& in, auto&) { xflag_ring(in, 5); }};
    p["ok_xflag_mode0_mode1"] = {2, 2, [](auto&, auto&) { xflag_modes(0); }};
    p["ok_syncall_mix"] = {2, 2, [](auto&, auto&) { syncall_mix(0); }};
    p["ok_mm_orgshape_leading_dim"] = {1, 2, [](auto&, auto&) { mm_orgshape(); }};
    p["syncall_mix_missing"] = {2, 2, [](auto&, auto&) { syncall_mix(1); }};
    p["xflag_mode1_unmatched"] = {2, 2, [](auto&, auto&) { xflag_modes(1); }};
    p["xflag_counter_overflow"] = {1, 2, [](auto&, auto&) { xflag_limits(0); }};
    p["xflag_id_out_of_range"] = {1, 2, [](auto&, auto&) { xflag_limits(1); }};
    p["xflag_mode4_not_on_a2"] = {1, 2, [](auto&, auto&) { xflag_limits(2); }};
    p["xflag_ids_of_syncall"] = {1, 2, [](auto&, auto&) { xflag_limits(3); }};
    p["xflag_aiv_only_kernel"] = {1, 0, [](auto&, auto&) { xflag_limits(4); }};
    p["matmulimpl_on_vector_core"] = {1, 2, [](auto&, auto&) { xflag_limits(5); }};
    field_probes(p);
    return p;
}

// ---- Matmul probes (MIX 1:2): C = A (M x K) @ B^T with B stored (N x K) ----
tiling::TCubeTiling mm_tiling(int m, int n, int k, int bm, int bn, int bk) {
    tiling::TCubeTiling t{};
    t.M = m, t.N = n, t.Ka = t.Kb = k, t.singleCoreM = m, t.singleCoreN = n, t.singleCoreK = k;
    t.baseM = bm, t.baseN = bn, t.baseK = bk, t.depthA1 = t.depthB1 = 1, t.dbL0A = t.dbL0B = t.dbL0C = 1;
    t.stepM = t.stepN = t.stepKa = t.stepKb = 1;
    return t;
}
using MmA = MatmulType<TPosition::GM, CubeFormat::ND, float>;
using MmB = MatmulType<TPosition::GM, CubeFormat::ND, float, true>;
using MmC = MatmulType<TPosition::VECIN, CubeFormat::ND, float>;

// ---- field widths and the Matmul model's rules (docs/npu-twin-rules.md) ------------------------------------------
// Declares the MIX kernel type and says whether this is the cube core (the cube probes run there only).
bool on_cube() {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    return ASCEND_IS_AIC;
}

// A GM buffer of its own for the probes that need a wide operand: kWideLd floats per row of A.
constexpr int kWideLd = 70000, kWideFloats = 80000;
GM_ADDR g_wide = nullptr;
GlobalTensor<float> gwide() {
    GlobalTensor<float> g;
    g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(g_wide));
    return g;
}

// A (2 x 16) at row stride `ld` from wide[0], B^T (16 x 16) from wide[kWideB], C (2 x 16) into out[0]: the
// cube copies A with the row stride in Nd2NzParams::srcDValue unless the config sets intrinsicsCheck. Checked values.
constexpr MatmulConfig kProbeLoopedCfg = GetNormalConfig(true);
constexpr int kWideB = kWideLd + 2 * kT;
template <const MatmulConfig& CFG>
void mm_wide_stride(int ld) {
    if (!on_cube()) return;
    TPipe pipe;
    MatmulImpl<MmA, MmB, MmA, MmA, CFG> mm;
    tiling::TCubeTiling t = mm_tiling(kT, kT, kT, kT, kT, 8);
    mm.Init(&t, &pipe);
    mm.SetOrgShape(2, kT, ld, kT, kT);
    mm.SetTensorA(gwide());
    mm.SetTensorB(gwide()[kWideB], true);
    mm.SetTail(2, kT, kT);
    mm.IterateAll(gout());
    mm.End();
    order<HardEvent::FIX_S>();
    for (int r = 0; r < 2; ++r)
        for (int j = 0; j < kT; ++j) {
            float ref = 0;
            for (int k = 0; k < kT; ++k) ref += gwide().GetValue(r * ld + k) * gwide().GetValue(kWideB + j * kT + k);
            EXPECT(std::fabs(gout().GetValue(r * kT + j) - ref) <= 1e-4f * (1 + std::fabs(ref)));
        }
}

// The MatmulImpl objects of a cube core overlay L1 / L0C. `bug` 0: three objects of 256 KiB of L1 each (768 KiB in
// sum, more than L1; the largest fits) used one after the other with End() between: clean. bug 1: the second object
// is used while the first has not called End().
void mm_overlay(int bug) {
    if (!on_cube()) return;
    TPipe pipe;
    MatmulImpl<MmA, MmB, MmA> mm[3];
    tiling::TCubeTiling t = mm_tiling(kT, kT, kT, kT, kT, 8);
    t.depthA1 = t.depthB1 = 256;  // (256 * 16 * 8 + 256 * 16 * 8) * 4 bytes = 256 KiB
    for (auto& m : mm) m.Init(&t, &pipe);
    for (int i = 0; i < 3; ++i) {
        mm[i].SetTensorA(gin());
        mm[i].SetTensorB(gin()[kT * kT], true);
        mm[i].IterateAll(gout()[i * kT * kT]);
        if (!(bug == 1 && i == 0)) mm[i].End();
    }
}

// GM -> L1 bytes of one Iterate sequence of the cube over `tiles` N tiles of 16 under tiling t (fp32, K = k: A 16 x k
// from wide[0], B^T from wide[kWideLd], both at row stride k).
uint64_t mm_l1_copied(TPipe& pipe, tiling::TCubeTiling t, int tiles, int k) {
    MatmulImpl<MmA, MmB, MmA> mm;
    mm.Init(&t, &pipe);
    const uint64_t before = twin::cur().cnt.l1_in;
    mm.SetOrgShape(kT, tiles * kT, k);
    mm.SetTensorA(gwide());
    mm.SetTensorB(gwide()[kWideLd], true);
    mm.SetTail(kT, tiles * kT, k);
    for (int i = 0; i < tiles; ++i) {
        EXPECT(mm.template Iterate<true>());
        mm.GetTensorC(gout()[i * kT * kT], 0, true);
    }
    mm.End();
    return twin::cur().cnt.l1_in - before;
}

// Cube operand bytes copied GM -> L1 (the performance model's count): 4 N tiles of 16 x 16 x K = 64 (fp32), A and B
// 4 KiB per tile. One Iterate sequence with stepN = 4 and A's whole K in L1 (depthA1 = kIter) copies A once; a
// SetTensorA per tile, or a depthA1 below kIter, copies it for every tile (copy_cube_in_norm.h SetInput resets the
// A buffer; cube_in_buffer_normal.h "k full load").
void mm_l1_reuse() {
    if (!on_cube()) return;
    TPipe pipe;
    constexpr int kK64 = 64, kTiles = 4, kTileBytes = kT * kK64 * 4;
    tiling::TCubeTiling t = mm_tiling(kT, kT, kK64, kT, kT, 8);
    t.depthA1 = kK64 / 8, t.depthB1 = 2, t.stepN = kTiles;
    EXPECT(mm_l1_copied(pipe, t, kTiles, kK64) == static_cast<uint64_t>(kTiles + 1) * kTileBytes);  // A once
    MatmulImpl<MmA, MmB, MmA> mm;
    mm.Init(&t, &pipe);
    uint64_t& l1 = twin::cur().cnt.l1_in;
    const uint64_t mid = l1;
    for (int k = 0; k < kTiles; ++k) {  // the per-tile pattern
        mm.SetTensorA(gwide());
        mm.SetTensorB(gwide()[kWideLd + k * kT * kK64], true);
        mm.SetTail(kT, kT, kK64);
        mm.IterateAll(gout()[k * kT * kT]);
        mm.End();
    }
    EXPECT(l1 - mid == static_cast<uint64_t>(2 * kTiles) * kTileBytes);
}

// Partial residency (cube_in_buffer_normal.h Init, Hit): with depthA1 > 2 but below A's whole K, the first
// depthA1 - 2 K blocks of A stay in L1 over an N group and the others are copied for every tile; Init lays the buffer
// out from the tiling's singleCoreK, not from SetTail's K. fp32 A blocks of 16 x 8 (512 bytes), 4 N tiles of 16,
// K = 64 (kIter 8), B (depthB1 2) copied for every tile (4 x 8 blocks):
//   depthA1 5, singleCoreK 64: 3 blocks cached, A = 8 + 3 x 5 = 23 blocks (kept only with its whole K: 32);
//   depthA1 8, singleCoreK 128 (kIter 16 at Init): 6 blocks cached though 8 would hold K = 64: 8 + 3 x 2 = 14 (a
//   layout taken from SetTail's K: 8).
void mm_l1_partial() {
    if (!on_cube()) return;
    TPipe pipe;
    constexpr int kK64 = 64, kTiles = 4, kBlock = kT * 8 * 4;
    const int depth[2] = {5, 8}, org_k[2] = {kK64, 2 * kK64}, want_a[2] = {23, 14};
    for (int c = 0; c < 2; ++c) {
        tiling::TCubeTiling t = mm_tiling(kT, kTiles * kT, org_k[c], kT, kT, 8);
        t.depthA1 = depth[c], t.depthB1 = 2, t.stepN = kTiles;
        EXPECT(mm_l1_copied(pipe, t, kTiles, kK64) == static_cast<uint64_t>(want_a[c] + kTiles * 8) * kBlock);
    }
}

// The stale-operand probes' A: 16 x 32 fp32 at out[512..1023] (their C tiles go to out[0] and out[256]).
constexpr int kK32 = 32;
GlobalTensor<float> stale_a() { return gout()[2 * kT * kT]; }

// Their vector side: each AIV writes its 8 rows of A with 1, sets flag 3, waits for flag 4 (the cube read A),
// overwrites them with 2 and sets flag 3 again.
void write_a_twice(const GlobalTensor<float>& a) {
    constexpr int k = kK32;
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 8 * k * 4);
    LocalTensor<float> t = buf.Get<float>(8 * k);
    const int r0 = static_cast<int>(GetSubBlockIdx()) * 8;
    for (int i = 0; i < 2; ++i) {
        if (i == 1) {
            CrossCoreWaitFlag(4);
            order<HardEvent::MTE3_V>();
        }
        Duplicate(t, i == 0 ? 1.0f : 2.0f, 8 * k);
        order<HardEvent::V_MTE3>();
        DataCopy(a[r0 * k], t, 8 * k);
        CrossCoreSetFlag<2, PIPE_MTE3>(3);
    }
}

// The cube reads a cached operand block from L1 as it was copied in, not from GM: a write to GM under a resident block
// is not seen (cube_in_buffer_normal.h Hit / GetBuffer). The vector cores write A (16 x 32 fp32, all 1) into GM; the
// cube computes N tile 0 of A B^T with depthA1 3 (kIter 4: K block 0 of A cached, blocks 1..3 rotating); the vector
// cores overwrite A with 2; the cube computes N tile 1: block 0 (K 0..7) from L1 (1), blocks 1..3 copied again (2).
// Re-reading GM for every tile, or keeping all or none of K, gives another value.
void mm_l1_stale() {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    GlobalTensor<float> a = stale_a();
    if ASCEND_IS_AIC {
        TPipe pipe;
        MatmulImpl<MmA, MmB, MmA> mm;
        tiling::TCubeTiling t = mm_tiling(kT, 2 * kT, kK32, kT, kT, 8);
        t.depthA1 = 3, t.depthB1 = 2, t.stepN = 2;
        mm.Init(&t, &pipe);
        mm.SetTensorA(a);
        mm.SetTensorB(gwide(), true);
        for (int k = 0; k < 2; ++k) {
            CrossCoreWaitFlag(3);  // the vector cores wrote A
            EXPECT(mm.template Iterate<true>());
            mm.GetTensorC(gout()[k * kT * kT], 0, true);
            if (k == 0) CrossCoreSetFlag<2, PIPE_FIX>(4);  // tile 0 read A: the vector cores may overwrite it
        }
        mm.End();
        order<HardEvent::FIX_S>();
        for (int j = 0; j < kT; j += 5) {  // row 0 of tile 1: B^T rows 16.. of gwide
            float ref = 0;
            for (int x = 0; x < kK32; ++x) ref += (x < 8 ? 1.0f : 2.0f) * gwide().GetValue((kT + j) * kK32 + x);
            EXPECT(std::fabs(gout().GetValue(kT * kT + j) - ref) <= 1e-4f * (1 + std::fabs(ref)));
        }
        return;
    }
    write_a_twice(a);
}

// SetTensorB resets B's L1 buffer and restarts the scheduler, and nothing more: A's cached blocks survive into the
// next sequence (copy_cube_in_norm.h SetInput resets only its own operand's CubeInBuffer; scheduler_norm_base.h
// MoveOnFirstIterate resets none). A (16 x 32 fp32, whole K cached: depthA1 4 = kIter) is written 1 by the vector
// cores; the cube computes one tile against B0 and stops (no End, no Iterate past the tile); the vector cores
// overwrite A with 2; SetTensorB(B1) alone: the tile is computed from A's cached 1s and only B is copied in (2 KiB).
// A twin resetting A at the start of every sequence reads 2 and copies 4 KiB.
void client_shared_l1(int bug);  // below, beside mm_probe

void mm_l1_a_kept_over_set_tensor_b() {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    GlobalTensor<float> a = stale_a();
    if ASCEND_IS_AIC {
        TPipe pipe;
        MatmulImpl<MmA, MmB, MmA> mm;
        tiling::TCubeTiling t = mm_tiling(kT, kT, kK32, kT, kT, 8);
        t.depthA1 = 4, t.depthB1 = 2;
        mm.Init(&t, &pipe);
        auto row0 = [](int tile, float av, int b_row0) {  // row 0 of C tile `tile` against B^T rows b_row0..
            for (int j = 0; j < kT; j += 5) {
                float ref = 0;
                for (int x = 0; x < kK32; ++x) ref += av * gwide().GetValue((b_row0 + j) * kK32 + x);
                EXPECT(std::fabs(gout().GetValue(tile * kT * kT + j) - ref) <= 1e-4f * (1 + std::fabs(ref)));
            }
        };
        CrossCoreWaitFlag(3);  // A holds 1
        mm.SetTensorA(a);
        mm.SetTensorB(gwide(), true);
        EXPECT(mm.template Iterate<true>());
        mm.GetTensorC(gout(), 0, true);
        CrossCoreSetFlag<2, PIPE_FIX>(4);  // A was read: the vector cores may overwrite it
        CrossCoreWaitFlag(3);              // A holds 2
        uint64_t& l1 = twin::cur().cnt.l1_in;
        const uint64_t before = l1;
        mm.SetTensorB(gwide()[kT * kK32], true);
        EXPECT(mm.template Iterate<true>());
        mm.GetTensorC(gout()[kT * kT], 0, true);
        EXPECT(l1 - before == static_cast<uint64_t>(kT) * kK32 * 4);  // B only
        mm.End();
        order<HardEvent::FIX_S>();
        row0(0, 1.0f, 0);
        row0(1, 1.0f, kT);  // A's cached blocks, not GM's 2
        return;
    }
    write_a_twice(a);
}

// The planner sizes L1 blocks as the library does (fused_lce_cube_tiling.h l1_block_bytes): keep_a_resident
// on a float32 GEMM with baseK 24 (16 x 24 blocks of A, a non-transposed B of 24 x 128 taking 32 x 128 in L1) takes
// depthA1 = (512 KiB - 2 x 16 KiB) / 1.5 KiB = 320 A blocks, which Init accepts; with the raw 24 x 128 B block it
// would take 325, 7.5 KiB more than L1.
void mm_keep_a_fp32_align() {
    if (!on_cube()) return;
    TPipe pipe;
    MatmulImpl<MmA, MmA, MmA> mm;
    tiling::TCubeTiling t = mm_tiling(kT, 4 * 128, 24 * 400, kT, 128, 24);
    fused_lce::cube::keep_a_resident(&t, 24 * 400, 4, 4, twin::rt().cfg.l1_bytes, false, false);
    EXPECT(t.depthA1 == 320 && t.stepN == 4 && t.depthB1 == 2);
    mm.Init(&t, &pipe);
}

// One L1 base block as CopyCubeInParams::GetBaseSize sizes it (copy_cube_in_params_base.h), the function the twin's
// L1 check and the planner share: float32 A aligns baseM to 16 and baseK to 8 (16 when transposed); float32 B aligns
// baseN to c0 = 8 and baseK to 16 (not at all when transposed); 16-bit operands as they are. A 24 x 24 base tile, and a
// transposed B of baseN 20, baseK 12 (24 x 12 elements; aligning N to 16 or K to 8 gives another size).
void mm_l1_block_sizes() {
    namespace fc = fused_lce::cube;
    EXPECT(fc::l1_block_bytes(true, false, 24, 24, 4) == 32 * 24 * 4);
    EXPECT(fc::l1_block_bytes(true, true, 24, 24, 4) == 32 * 32 * 4);
    EXPECT(fc::l1_block_bytes(false, true, 24, 24, 4) == 24 * 24 * 4);
    EXPECT(fc::l1_block_bytes(false, false, 24, 24, 4) == 24 * 32 * 4);
    EXPECT(fc::l1_block_bytes(false, true, 20, 12, 4) == 24 * 12 * 4);
    EXPECT(fc::l1_block_bytes(true, true, 24, 24, 2) == 24 * 24 * 2);
}

// A kernel that took an optional argument's presence from a non-null address, given the twin's placeholder for an
// absent one (as CANN may pass any address): the access is reported.
void absent_by_address(GM_ADDR optional) {
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 1024);
    if (optional != nullptr) {  // the convention the kernels no longer use
        GlobalTensor<float> g;
        g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(optional));
        DataCopy(buf.Get<float>(8), g, 8);
    }
}

// Iterate order: ORDER_M walks M first (the N tiles in groups of stepN, every M tile of a group, then the group's N
// tiles; scheduler_norm_base.h MoveOnIterateOrderM). 2 x 2 tiles of 16 x 16, stepN 1: (0,0) (1,0) (0,1) (1,1); each
// tile goes to its own GM slot with sequential write and carries its (m, n) in a marker column of A / B.
void mm_iterate_order() {
    if (!on_cube()) return;
    TPipe pipe;
    MatmulImpl<MmA, MmB, MmA> mm;
    tiling::TCubeTiling t = mm_tiling(2 * kT, 2 * kT, 8, kT, kT, 8);
    mm.Init(&t, &pipe);
    mm.SetTensorA(gwide());  // 32 x 8 at stride 8
    mm.SetTensorB(gwide()[kWideB], true);
    for (int k = 0; k < 4; ++k) {
        EXPECT(mm.template Iterate<true>());
        mm.GetTensorC(gout()[k * kT * kT], 0, true);
    }
    EXPECT(!mm.template Iterate<true>());
    mm.End();
    order<HardEvent::FIX_S>();
    const int want_m[4] = {0, 1, 0, 1}, want_n[4] = {0, 0, 1, 1};
    for (int k = 0; k < 4; ++k) {  // element (0, 0) of slot k is row 16 m, column 16 n of A B^T
        float ref = 0;
        for (int x = 0; x < 8; ++x)
            ref += gwide().GetValue(want_m[k] * kT * 8 + x) * gwide().GetValue(kWideB + want_n[k] * kT * 8 + x);
        EXPECT(std::fabs(gout().GetValue(k * kT * kT) - ref) <= 1e-4f * (1 + std::fabs(ref)));
    }
}

void field_probes(std::map<std::string, Probe>& p) {
    p["ok_mm_iterate_order"] = {1, 2, [](auto&, auto&) { mm_iterate_order(); }};
    p["ok_mm_wide_stride_intrinsics_check"] = {1, 2, [](auto&, auto&) { mm_wide_stride<kProbeLoopedCfg>(kWideLd); }};
    p["cube_wide_stride_default_config"] = {1, 2, [](auto&, auto&) { mm_wide_stride<CFG_NORM>(kWideLd); }};
    p["cube_stride_65535_default_config"] = {1, 2, [](auto&, auto&) { mm_wide_stride<CFG_NORM>(65535); }};
    p["ok_mm_overlay_with_end"] = {1, 2, [](auto&, auto&) { mm_overlay(0); }};
    p["cube_overlay_missing_end"] = {1, 2, [](auto&, auto&) { mm_overlay(1); }};
    p["ok_mm_l1_reuse"] = {1, 2, [](auto&, auto&) { mm_l1_reuse(); }};
    p["ok_mm_l1_partial_residency"] = {1, 2, [](auto&, auto&) { mm_l1_partial(); }};
    p["ok_mm_l1_stale_operand"] = {1, 2, [](auto&, auto&) { mm_l1_stale(); }};
    p["ok_mm_keep_a_resident_fp32_align"] = {1, 2, [](auto&, auto&) { mm_keep_a_fp32_align(); }};
    p["ok_mm_l1_block_sizes"] = {1, 0, [](auto&, auto&) { mm_l1_block_sizes(); }};
    p["ok_client_shared_l1"] = {1, 2, [](auto&, auto&) { client_shared_l1(0); }};
    p["client_shared_l1_reuse"] = {1, 2, [](auto&, auto&) { client_shared_l1(1); }};
    p["ok_mm_l1_a_kept_over_set_tensor_b"] = {1, 2, [](auto&, auto&) { mm_l1_a_kept_over_set_tensor_b(); }};
    p["cube_iterate_after_end_without_restart"] = {1, 2, [](auto&, auto&) {  // End does not restart the scheduler
        if (!on_cube()) return;
        TPipe pipe;
        MatmulImpl<MmA, MmB, MmA> mm;
        tiling::TCubeTiling t = mm_tiling(kT, kT, kT, kT, kT, 8);
        mm.Init(&t, &pipe);
        mm.SetTensorA(gwide());
        mm.SetTensorB(gwide()[kWideB], true);
        mm.IterateAll(gout());
        mm.End();
        mm.IterateAll(gout());
    }};
    p["cube_l1_tail_k_beyond_tiling"] = {1, 2, [](auto&, auto&) {  // a whole-K buffer for singleCoreK 16, K 32
        if (!on_cube()) return;
        TPipe pipe;
        MatmulImpl<MmA, MmB, MmA> mm;
        tiling::TCubeTiling t = mm_tiling(kT, kT, kT, kT, kT, 8);
        t.depthA1 = 2;  // kIter 2 at Init: A's whole K
        mm.Init(&t, &pipe);
        mm.SetOrgShape(kT, kT, 2 * kT);
        mm.SetTensorA(gwide());
        mm.SetTensorB(gwide()[kWideB], true);
        mm.SetTail(kT, kT, 2 * kT);
        mm.IterateAll(gout());
    }};
    p["cube_l1_fp32_k_align"] = {1, 2, [](auto&, auto&) {  // float32 B (not transposed): 8 x 16 blocks take 16 x 16
        if (!on_cube()) return;
        TPipe pipe;
        MatmulImpl<MmA, MmA, MmA> mm;
        tiling::TCubeTiling t = mm_tiling(kT, kT, 8, kT, kT, 8);
        t.depthA1 = 2, t.depthB1 = 1000;  // 1 KiB + 500 KiB of raw blocks, 1 KiB + 1000 KiB aligned
        mm.Init(&t, &pipe);
    }};
    p["absent_optional_by_address"] = {1, 0, [](auto&, auto&) { absent_by_address(twin::absent_placeholder()); }};
    p["field_copyext_blockcount"] = {1, 0, [](auto&, auto&) {  // 65536 + 4 rows: uint16_t keeps 4
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        const uint32_t rows = 65540;
        DataCopyPad(buf.Get<float>(), gin(), DataCopyExtParams(rows, 32, 0, 0, 0), DataCopyPadExtParams<float>());
    }};
    p["field_copyext_blocklen_range"] = {1, 0, [](auto&, auto&) {  // blockLen in [0, 2097151] bytes
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        DataCopyPad(gout(), buf.Get<float>(), DataCopyExtParams(1, 2097152, 0, 0, 0));
    }};
    p["field_copy_params_blockcount"] = {1, 0, [](auto&, auto&) {  // DataCopyParams::blockCount in [1, 4095]
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        DataCopy(buf.Get<float>(), gin(), DataCopyParams(4096, 1, 0, 0));
    }};
    p["field_binary_repeat_stride"] = {1, 0, [](auto&, auto&) {  // a repeat stride of 256 blocks in a uint8_t
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 64 * 1024);
        LocalTensor<float> t = buf.Get<float>();
        const uint32_t rs = 2048 / 8;
        Add(t, t, t, 64, 2, BinaryRepeatParams(1, 1, 1, rs, rs, rs));
    }};
    p["field_repeat_time"] = {1, 0, [](auto&, auto&) {  // repeatTime in [0, 255] (a uint8_t)
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 96 * 1024);
        LocalTensor<float> t = buf.Get<float>();
        const uint32_t rows = 2048;
        Brcb(t, t[64 * 1024 / 4], rows / 8, BrcbRepeatParams(1, 8));
    }};
    p["field_reduce_repeat_stride"] = {1, 0, [](auto&, auto&) {  // ReduceRepeat strides in [0, 65535]
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> t = buf.Get<float>();
        ReduceRepeat<ReduceType::SUM, float, float>(t, t, 64, 1, 1, 1, 70000);
    }};
    p["cube_shape_arg_int32"] = {1, 2, [](auto&, auto&) {  // SetTail takes int: 2^31 does not fit
        if (!on_cube()) return;
        TPipe pipe;
        MatmulImpl<MmA, MmA, MmA> mm;
        tiling::TCubeTiling t = mm_tiling(kT, kT, kT, kT, kT, 8);
        mm.Init(&t, &pipe);
        const uint64_t k = 1ull << 31;
        mm.SetTail(kT, kT, k);
    }};
    p["cube_tiling_depth_zero"] = {1, 2, [](auto&, auto&) {  // matmul_shape_tiling.h NumericalValidCheck
        if (!on_cube()) return;
        TPipe pipe;
        MatmulImpl<MmA, MmA, MmA> mm;
        tiling::TCubeTiling t = mm_tiling(kT, kT, kT, kT, kT, 8);
        t.depthA1 = 0;
        mm.Init(&t, &pipe);
    }};
    p["cube_tiling_l0_double_buffer"] = {1, 2, [](auto&, auto&) {  // ShapeValidCheck: dbL0A = dbL0B = 2 doubles L0A
        if (!on_cube()) return;
        TPipe pipe;
        MatmulImpl<MmA, MmA, MmA> mm;
        tiling::TCubeTiling t = mm_tiling(128, 128, 128, 128, 128, 128);  // 64 KiB of L0A once, 128 KiB twice
        t.dbL0A = t.dbL0B = 2;
        mm.Init(&t, &pipe);
    }};
    // the fixpipe's nSize (the C tile's width) is 12 bits: a 4112-wide tile, only possible on a part with 4x the
    // 910B's L0B / L0C (the 910B's L0C bounds baseM x baseN first)
    p["cube_fixpipe_nsize"] = {1, 2, [](auto&, auto&) {
        if (!on_cube()) return;
        TPipe pipe;
        MatmulImpl<MmA, MmB, MmA> mm;
        tiling::TCubeTiling t = mm_tiling(kT, 4112, 8, kT, 4112, 8);
        mm.Init(&t, &pipe);
        mm.SetTensorA(gwide());
        mm.SetTensorB(gwide()[kT * 8], true);
        mm.IterateAll(gout());
    }, [](twin::Config& c) { c.l0b_bytes = c.l0c_bytes = 512 * 1024; }};
    p["field_copy_count"] = {1, 0, [](auto&, auto&) {  // the count form's blockLen = count * 4 / 32 > 65535
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        DataCopy(buf.Get<float>(), gin(), 600000);
    }};
    p["field_pad_left"] = {1, 0, [](auto&, auto&) {  // leftPadding is a uint8_t
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        const uint32_t left = 300;
        DataCopyPad(buf.Get<float>(), gin(), DataCopyExtParams(1, 32, 0, 0, 0),
                    DataCopyPadExtParams<float>(true, left, 0, 0.0f));
    }};
    p["cube_looped_copy_offset"] = {1, 2, [](auto&, auto&) {  // intrinsicsCheck's loop: int32 offset gCol * row
        if (!on_cube()) return;
        TPipe pipe;
        MatmulImpl<MmA, MmB, MmA, MmA, kProbeLoopedCfg> mm;
        tiling::TCubeTiling t = mm_tiling(kT, kT, kT, kT, kT, 8);
        mm.Init(&t, &pipe);
        mm.SetOrgShape(kT, kT, 1 << 28, kT, kT);  // 15 rows of 2^28 elements: offsets past 2^31
        mm.SetTensorA(gwide());
        mm.SetTensorB(gwide()[kWideB], true);
        mm.IterateAll(gout());
    }};
    p["cube_mdl_depth_not_a_step_multiple"] = {1, 2, [](auto&, auto&) {  // DepthCheck (MDL)
        if (!on_cube()) return;
        TPipe pipe;
        MatmulImpl<MmA, MmA, MmA, MmA, CFG_MDL> mm;
        tiling::TCubeTiling t = mm_tiling(kT, kT, kT, kT, kT, 8);
        t.stepKa = 2, t.depthA1 = 3;
        mm.Init(&t, &pipe);
    }};
}

// Two client objects of one AIC: the second's copies may overwrite the first's cached A (one shared L1 region), so
// the first must set A again before its next sequence (bug: it reuses the cached A after SetTensorB alone).
void client_shared_l1(int bug) {
    if (GetSubBlockIdx() != 0) return;
    TPipe pipe;
    Matmul<MmA, MmB, MmC> m1, m2;
    tiling::TCubeTiling t1 = mm_tiling(kM, kN, kK, kM, kN, kK), t2 = t1;  // kIter 1, depth 1: A cached whole
    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), m1, &t1, m2, &t2);
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 3 * kM * kN * sizeof(float));
    GlobalTensor<float> a = gin(), b = gin()[kM * kK];
    int n = 0;
    auto tile = [&](Matmul<MmA, MmB, MmC>& m, bool set_a) {  // each C tile into its own UB slot
        if (set_a) m.SetTensorA(a);
        m.SetTensorB(b, true);
        m.template Iterate<true>();
        m.template GetTensorC<true>(buf.GetWithOffset<float>(kM * kN, (n++) * kM * kN * sizeof(float)), 0, false);
    };
    tile(m1, true);
    tile(m2, true);
    tile(m1, !bug);
    m1.End();
    m2.End();
}

void mm_probe(bool sequential, int tail_n, int c_elems, int tail_k) {
    if (GetSubBlockIdx() != 0) return;
    TPipe pipe;
    Matmul<MmA, MmB, MmC> mm;
    tiling::TCubeTiling t = mm_tiling(kM, kN, kK, kM, kN, kK);
    t.depthA1 = t.depthB1 = 2;  // kIter 1: two rotating buffers each (cube_in_buffer_normal.h), so K may grow
    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t);
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 64 * 1024);
    LocalTensor<float> c = buf.GetWithOffset<float>(c_elems, 0);
    GlobalTensor<float> a = gin(), b = gin()[kM * kK];
    mm.SetTensorA(a);
    mm.SetTensorB(b, true);
    mm.SetTail(kM, tail_n, tail_k);
    mm.template Iterate<true>();
    mm.template GetTensorC<true>(c, 0, sequential);
    // c[r * stride + j] = sum_k a[r, k] * b[j, k]; stride = tail_n (sequential) or N (orgN)
    const int stride = sequential ? tail_n : kN;
    order<HardEvent::V_S>();
    for (int r = 0; r < kM; r += 7)
        for (int j = 0; j < tail_n; j += 5) {
            float ref = 0;
            for (int k = 0; k < kK; ++k) ref += a.GetValue(r * kK + k) * b.GetValue(j * kK + k);
            EXPECT(std::fabs(c.GetValue(r * stride + j) - ref) <= 1e-4f * (1 + std::fabs(ref)));
        }
    mm.End();
}

std::string run_probe(const std::string& name) {
    std::vector<float> in(kIn + kM * kK + kN * kK), out(kOut, 0.0f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = std::sin(0.37 * static_cast<double>(i)) * 3;
    std::function<void()> body;
    std::function<void(twin::Config&)> set_part;
    int block_dim = 1, ratio = 0;
    if (name.rfind("mm_", 0) == 0) {
        block_dim = 1, ratio = 2;
        if (name == "mm_ok_partial_tile_orgN_stride") body = [] { mm_probe(false, 29, kM * kN, kK); };
        else if (name == "mm_ok_partial_tile_sequential_stride") body = [] { mm_probe(true, 29, kM * kN, kK); };
        else if (name == "mm_getc_short_tensor") body = [] { mm_probe(false, kN, kM * kN - 64, kK); };
        else if (name == "mm_tail_k_reads_past_b") body = [] { mm_probe(false, kN, kM * kN, kK + 2000); };
        else return "unknown probe " + name;
    } else {
        auto all = probes();
        auto it = all.find(name);
        if (it == all.end()) return "unknown probe " + name;
        block_dim = it->second.block_dim;
        ratio = it->second.ratio;
        set_part = it->second.part;
        auto fn = it->second.body;
        body = [fn, &in, &out] { fn(in, out); };
    }
    std::vector<float> wide(kWideFloats);
    for (size_t i = 0; i < wide.size(); ++i) wide[i] = std::cos(0.11 * static_cast<double>(i));
    g_in = reinterpret_cast<GM_ADDR>(in.data());
    g_out = reinterpret_cast<GM_ADDR>(out.data());
    g_wide = reinterpret_cast<GM_ADDR>(wide.data());
    twin::Config cfg;
    cfg.seed = 7;
    if (set_part) set_part(cfg);
    try {
        twin_test::run_kernel(block_dim, ratio, cfg,
                              {{in.data(), kIn * sizeof(float) + (kM + kN) * kK * sizeof(float), "in", true},
                               {out.data(), out.size() * sizeof(float), "out", false},
                               {wide.data(), wide.size() * sizeof(float), "wide", true}},
                              nullptr, 0, body);
    } catch (const twin::Error& e) {
        return e.what();
    }
    if (name == "ok_pipeline") {
        const float want0 = (in[0] + 1) * 2;
        if (out[0] != want0 || out[1] != want0 + 100 || out[6] != (in[6] + 1) * 2 || out[7] != 0.0f)
            return "ok_pipeline: wrong values";
    }
    if (name == "ok_mm_orgshape_leading_dim") {
        for (int i = 0; i < kT; ++i)
            for (int j = 0; j < kT; ++j) {
                double ref = 0, ref_t = 0;  // A[i][k] = in[i * kLdA + 8 + k]; transposed: in[k * kLdA + 8 + i]
                for (int k = 0; k < kOrgK; ++k) {
                    const double b = in[kLdA * 32 + k * kT + j];
                    ref += in[i * kLdA + kOrgCol + k] * b;
                    ref_t += in[k * kLdA + kOrgCol + i] * b;
                }
                if (std::fabs(out[i * kT + j] - ref) > 1e-4 * (1 + std::fabs(ref)) ||
                    std::fabs(out[kT * kT + i * kT + j] - ref_t) > 1e-4 * (1 + std::fabs(ref_t)))
                    return "ok_mm_orgshape_leading_dim: wrong values";
            }
    }
    if (name == "ok_tque") {
        for (int i = 0; i < 512; ++i)
            if (std::fabs(out[i] - std::exp(in[i])) > 1e-5f * std::exp(in[i])) return "ok_tque: wrong values";
    }
    return "";
}

std::vector<std::string> probe_names() {
    std::vector<std::string> n;
    for (auto& kv : probes()) n.push_back(kv.first);
    for (const char* m : {"mm_ok_partial_tile_orgN_stride", "mm_ok_partial_tile_sequential_stride",
                          "mm_getc_short_tensor", "mm_tail_k_reads_past_b"})
        n.push_back(m);
    return n;
}

// Cast float -> bf16 / fp16 with CAST_RINT on the twin (compared with torch's round-to-nearest-even in Python).
std::tuple<at::Tensor, at::Tensor> twin_cast(const at::Tensor& x_in) {
    at::Tensor x = x_in.to(at::kFloat).contiguous();
    const int64_t n = x.numel();
    TORCH_CHECK(n % 16 == 0 && n <= 8192, "twin_cast: 16 * k <= 8192 elements");
    at::Tensor b = at::empty({n}, x.options().dtype(at::kBFloat16)), h = at::empty({n}, x.options().dtype(at::kHalf));
    twin::Config cfg;
    try {
        twin_test::run_kernel(
            1, 0, cfg,
            {{x.data_ptr(), static_cast<uint64_t>(n) * 4, "x", true},
             {b.data_ptr(), static_cast<uint64_t>(n) * 2, "bf16", false},
             {h.data_ptr(), static_cast<uint64_t>(n) * 2, "fp16", false}},
            nullptr, 0, [&] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> buf;
                pipe.InitBuffer(buf, static_cast<uint32_t>(n * 8));
                LocalTensor<float> xf = buf.Get<float>(static_cast<uint32_t>(n));
                LocalTensor<bfloat16_t> xb = buf.GetWithOffset<bfloat16_t>(static_cast<uint32_t>(n), n * 4);
                LocalTensor<half> xh = buf.GetWithOffset<half>(static_cast<uint32_t>(n), n * 6);
                GlobalTensor<float> gx;
                GlobalTensor<bfloat16_t> gb;
                GlobalTensor<half> gh;
                gx.SetGlobalBuffer(reinterpret_cast<float*>(x.data_ptr()));
                gb.SetGlobalBuffer(reinterpret_cast<bfloat16_t*>(b.data_ptr()));
                gh.SetGlobalBuffer(reinterpret_cast<half*>(h.data_ptr()));
                DataCopy(xf, gx, static_cast<uint32_t>(n));
                order<HardEvent::MTE2_V>();
                Cast(xb, xf, RoundMode::CAST_RINT, static_cast<uint32_t>(n));
                Cast(xh, xf, RoundMode::CAST_RINT, static_cast<uint32_t>(n));
                order<HardEvent::V_MTE3>();
                DataCopy(gb, xb, static_cast<uint32_t>(n));
                DataCopy(gh, xh, static_cast<uint32_t>(n));
            });
    } catch (const twin::Error& e) {
        TORCH_CHECK(false, e.what());
    }
    return {b, h};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fused_lce, m) {
    m.def("_twin_probe(str name) -> str", [](std::string name) { return run_probe(name); });
    m.def("_twin_probe_names() -> str[]", []() { return probe_names(); });
    m.def("_twin_cast(Tensor x) -> (Tensor, Tensor)", &twin_cast);
}
