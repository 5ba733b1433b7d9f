// CPU twin of the AscendC API: the machine model.
//
//   * cores: every AIV (vector core) and, in MIX kernels, every AIC (cube core) of a launch runs the kernel entry in
//     its own fiber (ASCEND_IS_AIC / ASCEND_IS_AIV select the code); the AIC runs MatmulImpl itself, or, for kernels
//     that drive the Matmul client from the AIV, only serves it (REGIST_MATMUL_OBJ returns on the AIC);
//   * cross-core flags (CrossCoreSetFlag / CrossCoreWaitFlag, modes 0 / 1 / 2 of Atlas A2) with their 4-bit
//     counters, and SyncAll, order GM accesses across cores through vector clocks (happens-before);
//   * a deterministic seeded cooperative scheduler switches fibers only at API calls that touch global memory or
//     synchronise cores, so cross-core orders vary with the seed but every run of a seed is identical;
//   * memories: UB per AIV with its capacity, GM as registered allocations (bounds, read-only inputs), a 64-byte
//     line data cache per core for scalar GM accesses (stale reads, lost or clobbering write-backs);
//   * checkers, all errors (an exception that aborts the launch with a message naming the call site):
//       - pipe hazards: every UB access is attributed to a pipe (S, V, MTE2, MTE3); vector clocks per pipe are
//         advanced by SetFlag/WaitFlag, PipeBarrier and the internal syncs of the APIs; a UB access that conflicts
//         (RAW, WAR, WAW) with an earlier access of another pipe not ordered before it is an error;
//       - GM: out-of-allocation accesses, writes to inputs, same-core ordering between pipes, cross-core races (an
//         access conflicting with another core's access that no SyncAll / cross-core flag orders before it, float
//         atomic adds commute), deadlocks and cross-core flags left unmatched at the end;
//       - API contracts: 32-byte alignment, lengths against LocalTensor::GetSize(), capacities, round modes;
//       - field widths: every parameter struct field keeps the full value assigned (twin::Field) and the call
//         checks it against CANN's type and documented range (field_value; docs/npu-twin-rules.md).
#ifndef FUSED_LCE_TWIN_RUNTIME_H_
#define FUSED_LCE_TWIN_RUNTIME_H_

#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "types.h"

namespace twin {

// ---- call sites and errors ----------------------------------------------------------------------------------------
// Every public API takes a defaulted trailing Loc so that errors name the kernel line that made the call.
struct Loc {
    const char* file;
    int line;
    Loc(const char* f = __builtin_FILE(), int l = __builtin_LINE()) : file(f), line(l) {}  // NOLINT
};

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct Abort {};  // unwinds a fiber when the launch is aborted by an error elsewhere

inline std::string vformat(const char* fmt, va_list ap) {
    char buf[2048];
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    return buf;
}
inline std::string format(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vformat(fmt, ap);
    va_end(ap);
    return s;
}
inline const char* base_name(const char* path) {
    const char* b = path;
    for (const char* p = path; *p; ++p)
        if (*p == '/') b = p + 1;
    return b;
}
inline std::string core_name();
[[noreturn]] inline void fail_at(const Loc& loc, const char* api, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string msg = vformat(fmt, ap);
    va_end(ap);
    throw Error(format("twin ERROR in %s at %s:%d [%s]: %s", api, base_name(loc.file), loc.line,
                       core_name().c_str(), msg.c_str()));
}

// The value of a parameter field at a call. CANN's struct holds it in T; the hardware reads T's bits, so a value that
// does not fit T, or lies outside the range the field's documentation gives, is an error here (never truncated).
template <typename T>
inline int64_t field_value(const Loc& loc, const char* api, const char* name, const Field<T>& f, int64_t lo,
                           int64_t hi, const char* doc) {
    const int64_t v = f.value();
    const int64_t tmin = static_cast<int64_t>(std::numeric_limits<T>::min());
    const int64_t tmax = std::numeric_limits<T>::max() > static_cast<uint64_t>(INT64_MAX)
                             ? INT64_MAX
                             : static_cast<int64_t>(std::numeric_limits<T>::max());
    if (v < tmin || v > tmax)
        fail_at(loc, api, "%s = %lld does not fit its field (%zu-bit %s; %s): the hardware would read %lld", name,
                static_cast<long long>(v), sizeof(T) * 8, std::is_signed<T>::value ? "signed" : "unsigned", doc,
                static_cast<long long>(static_cast<T>(f)));
    if (v < lo || v > hi)
        fail_at(loc, api, "%s = %lld is outside its documented range [%lld, %lld] (%s)", name,
                static_cast<long long>(v), static_cast<long long>(lo), static_cast<long long>(hi), doc);
    return v;
}
template <typename T>
inline int64_t field_value(const Loc& loc, const char* api, const char* name, const Field<T>& f, const char* doc) {
    return field_value(loc, api, name, f, static_cast<int64_t>(std::numeric_limits<T>::min()), INT64_MAX, doc);
}

// The GM address the twin's launchers pass for an absent optional argument: never null (CANN does not promise null
// for an absent optional; ops-nn switches optional outputs by attribute / tiling) and never registered, so a kernel
// that took a non-null address for presence and accessed it is reported. It starts a reserved, inaccessible span of
// address space, so that an access at any offset from it is recognised as such.
constexpr uint64_t kAbsentSpan = 1ull << 36;
inline uint8_t* absent_placeholder() {
    static uint8_t* base = [] {
        void* p = mmap(nullptr, kAbsentSpan, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        alignas(64) static uint8_t fallback[64];
        return p == MAP_FAILED ? fallback : static_cast<uint8_t*>(p);
    }();
    return base;
}

// ---- pipes and call-site table ---------------------------------------------------------------------------------
enum P : uint8_t { kS = 0, kV, kMTE2, kMTE3, kM, kMTE1, kFIX, kNumPipes };
inline const char* pipe_name(int p) {
    static const char* n[] = {"S", "V", "MTE2", "MTE3", "M", "MTE1", "FIX"};
    return p >= 0 && p < kNumPipes ? n[p] : "?";
}
inline int pipe_of(AscendC::pipe_t p) {
    switch (p) {
        case AscendC::PIPE_S: return kS;
        case AscendC::PIPE_V: return kV;
        case AscendC::PIPE_M: return kM;
        case AscendC::PIPE_MTE1: return kMTE1;
        case AscendC::PIPE_MTE2: return kMTE2;
        case AscendC::PIPE_MTE3: return kMTE3;
        case AscendC::PIPE_FIX: return kFIX;
        default: return -1;
    }
}
struct EventPipes {
    int src, dst;
};
inline EventPipes event_pipes(AscendC::HardEvent e) {
    using H = AscendC::HardEvent;
    switch (e) {
        case H::MTE2_MTE1: return {kMTE2, kMTE1};
        case H::MTE1_MTE2: return {kMTE1, kMTE2};
        case H::MTE1_M: return {kMTE1, kM};
        case H::M_MTE1: return {kM, kMTE1};
        case H::MTE2_V: return {kMTE2, kV};
        case H::V_MTE2: return {kV, kMTE2};
        case H::MTE3_V: return {kMTE3, kV};
        case H::V_MTE3: return {kV, kMTE3};
        case H::M_V: return {kM, kV};
        case H::V_M: return {kV, kM};
        case H::V_V: return {kV, kV};
        case H::MTE3_MTE1: return {kMTE3, kMTE1};
        case H::MTE1_MTE3: return {kMTE1, kMTE3};
        case H::MTE1_V: return {kMTE1, kV};
        case H::MTE2_M: return {kMTE2, kM};
        case H::M_MTE2: return {kM, kMTE2};
        case H::V_MTE1: return {kV, kMTE1};
        case H::M_FIX: return {kM, kFIX};
        case H::FIX_M: return {kFIX, kM};
        case H::MTE3_MTE2: return {kMTE3, kMTE2};
        case H::MTE2_MTE3: return {kMTE2, kMTE3};
        case H::S_V: return {kS, kV};
        case H::V_S: return {kV, kS};
        case H::S_MTE2: return {kS, kMTE2};
        case H::MTE2_S: return {kMTE2, kS};
        case H::S_MTE3: return {kS, kMTE3};
        case H::MTE3_S: return {kMTE3, kS};
        case H::MTE2_FIX: return {kMTE2, kFIX};
        case H::FIX_MTE2: return {kFIX, kMTE2};
        case H::FIX_S: return {kFIX, kS};
        case H::M_S: return {kM, kS};
        case H::FIX_MTE3: return {kFIX, kMTE3};
        case H::MTE1_FIX: return {kMTE1, kFIX};
        case H::FIX_MTE1: return {kFIX, kMTE1};
        case H::FIX_FIX: return {kFIX, kFIX};
        default: return {-1, -1};
    }
}
inline std::string event_name(AscendC::HardEvent e) {
    EventPipes p = event_pipes(e);
    return format("%s_%s", pipe_name(p.src), pipe_name(p.dst));
}

// (api, file, line) triples interned into 16-bit ids so that shadow memory can remember who touched a byte.
struct Site {
    const char* api;
    const char* file;
    int line;
};
inline std::vector<Site>& sites() {
    static std::vector<Site> s{{"(none)", "", 0}};
    return s;
}
inline uint16_t site_id(const char* api, const Loc& loc);
inline bool hazards_on();
inline uint16_t site_id(const char* api, const Loc& loc) {
    if (!hazards_on()) return 0;  // only the hazard checkers remember call sites
    struct Key {
        const char* api;
        const char* file;
        int line;
    };
    static const size_t kSlots = 4096;
    static Key cache[kSlots];
    static uint16_t ids[kSlots];
    size_t h = (reinterpret_cast<uintptr_t>(loc.file) * 31u + static_cast<size_t>(loc.line) * 131u +
                reinterpret_cast<uintptr_t>(api)) % kSlots;
    for (size_t probe = 0; probe < kSlots; ++probe, h = (h + 1) % kSlots) {
        if (cache[h].api == api && cache[h].file == loc.file && cache[h].line == loc.line) return ids[h];
        if (cache[h].api == nullptr) {
            auto& s = sites();
            if (s.size() >= 65535) return 0;
            cache[h] = {api, loc.file, loc.line};
            ids[h] = static_cast<uint16_t>(s.size());
            s.push_back({api, loc.file, loc.line});
            return ids[h];
        }
    }
    return 0;
}
inline std::string site_text(uint16_t id) {
    const Site& s = sites()[id < sites().size() ? id : 0];
    return format("%s at %s:%d", s.api, base_name(s.file), s.line);
}

// ---- configuration of a launch ---------------------------------------------------------------------------------
struct Config {
    uint64_t ub_bytes = 192 * 1024;  // per AIV (Atlas A2 / 910B)
    uint64_t l1_bytes = 512 * 1024;  // per AIC
    uint64_t l0a_bytes = 64 * 1024;
    uint64_t l0b_bytes = 64 * 1024;
    uint64_t l0c_bytes = 128 * 1024;
    uint64_t seed = 1;
    double switch_prob = 0.3;  // probability of switching cores at each scheduling point
    bool hazards = true;       // UB pipe-hazard and GM race checkers (bounds/alignment checks are always on)
    bool strict_v = true;      // also require PipeBarrier<PIPE_V> between dependent vector instructions (what
                               // bisheng's --cce-auto-sync would otherwise insert on NPU arch 2201)
};

// ---- GM allocations --------------------------------------------------------------------------------------------
// One GM access as the race checker remembers it: agent (core), pipe and the pipe's epoch at the access.
struct Access {
    uint8_t agent = 0xff;  // 0xff: none
    uint8_t pipe = 0;
    uint16_t site = 0;
    uint32_t epoch = 0;
};
struct GmShadow {  // cross-core access record of one 4-byte granule
    Access w;          // last write
    uint8_t atomic = 0;  // the last write was a float atomic add
    Access r[2];       // the last readers (two agents; a third replaces the older)
};
struct Region {
    uintptr_t start = 0;
    uint64_t size = 0;
    std::string name;
    bool read_only = false;
    std::vector<GmShadow> shadow;  // writable regions only
};

// ---- per-core pipe clocks --------------------------------------------------------------------------------------
struct Clock {
    uint32_t epoch[kNumPipes] = {};
    uint32_t known[kNumPipes][kNumPipes] = {};  // known[q][p]: epochs of pipe p that pipe q has seen complete
};
struct Flag {
    bool set = false;
    uint32_t snap[kNumPipes] = {};
    uint16_t site = 0;
};

struct UbShadow {  // per 2-byte granule of UB
    uint32_t w = 0;       // epoch of the last write on pipe wpipe (0: never written)
    uint32_t r[4] = {};   // epoch of the last read per pipe S, V, MTE2, MTE3
    uint16_t wsite = 0;
    uint8_t wpipe = 0;
    uint16_t rsite[4] = {};
};

struct CacheLineCopy {
    uintptr_t lo = 0, hi = 0;  // valid bytes [lo, hi) of the 64-byte line (clipped to the allocation)
    uint8_t data[64] = {};
    uint64_t dirty = 0;        // bit i: byte (line + i) stored by the scalar unit and not yet written back
};

// Cube-side resources of one AIC used by the Matmul model (lib/matmul_intf.h). The Matmul objects of a core overlay
// L1 / L0C: each Init starts its buffers at the same share address (asc-devkit impl/basic_api/kernel_tpipe_base.h
// AuxShareBufStart, called from the scheduler's Init through InitShareBufStart), so the core needs the largest
// object's buffers, not their sum, and only one object may hold data there at a time: an object is live from its
// first SetTensorA / SetTensorB / Iterate until its End().
struct MatmulResources {
    uint64_t l1_max_bytes = 0;   // the largest L1 need of the objects initialised on this AIC
    const void* live = nullptr;  // the object holding L1 / L0C now (nullptr: none)
    Loc live_loc{nullptr, 0};    // where it became live
    // Client objects (driven from the AIVs) are served by this AIC's Matmul server from one L1 region: with
    // shareMode 0 every server object's buffers start at the share start (kernel_tpipe_base.h AuxShareBufStart,
    // called from scheduler_base.h Init; one server object per AIV, kernel_kfc.h). Each copy into L1 by a client
    // object bumps the generation and names the object.
    uint64_t client_l1_gen = 0;
    Loc client_l1_loc{nullptr, 0};  // where the last client copy into L1 was asked for (formatted on error)
};

struct Core {
    enum Kind { AIV, AIC } kind = AIV;
    int index = 0;       // index among the launch's AIVs (or AICs)
    int block_idx = 0;   // GetBlockIdx()
    int sub_idx = 0;     // GetSubBlockIdx()
    int aic = 0;         // the AIC this AIV belongs to
    std::string name;
    // UB
    uint8_t* ub = nullptr;
    uint64_t ub_size = 0;
    std::vector<UbShadow> ush;
    uint64_t pipe_end = 0;     // bytes handed out by the TPipe (the rest is the APIs' stack buffer)
    bool pipe_alive = false;
    void* pipe_obj = nullptr;  // the core's AscendC::TPipe
    // pipes
    Clock clk;
    std::map<std::pair<int, int>, Flag> flags;  // (HardEvent, id) -> flag; internal flags use ids >= 1000
    int atomic = 0;         // 0 none, 1 add (float), 2 add (other types)
    int atomic_elt = 0;     // element size of SetAtomicAdd<T>
    int atomic_kind = 0;    // 1 float, 2 half, 3 int32, 4 int16, 5 bf16
    struct PendingGm {
        uintptr_t lo, hi;
        uint32_t epoch;
        uint16_t site;
    };
    std::vector<PendingGm> pending_mte3;  // unused (same-core GM order is checked by gm_race)
    std::unordered_map<uintptr_t, CacheLineCopy> dcache;
    int declared_type = -1;
    uint64_t api_calls = 0;
    // work counters of the performance model (benchmarks/npu_model.py): vector instructions and the UB bytes they
    // write (repeats = bytes / 256), scalar-pipe operations, GM bytes moved by this core (DMA, cube operand reads,
    // fixpipe writes, scalar GM access) and cube FLOPs (2 m n k of every Matmul tile)
    struct Counters {
        uint64_t v_instr = 0, v_bytes = 0, s_ops = 0, gm_rd = 0, gm_wr = 0, cube_flops = 0;
        uint64_t l1_in = 0;  // cube operand bytes copied GM -> L1 (the Matmul model's ND2NZ copies)
    } cnt;
    // cross-core ordering: vc[a * kNumPipes + p] = epochs of agent a's pipe p known complete to this core
    int agent = 0;
    std::vector<uint32_t> vc;
    struct XFlag {             // CrossCoreWaitFlag counter of one flag id (0..15) of this core
        std::vector<std::vector<uint32_t>> pending;  // one clock snapshot per count (FIFO)
        int mode = -1;         // mode of the syncs in flight on this id (one mode at a time per core and id)
        uint16_t site = 0;     // the last CrossCoreSetFlag that counted here
    };
    XFlag xflag[16];
    struct XSet {              // this core's CrossCoreSetFlag calls not yet matched by all participants
        std::vector<std::vector<uint32_t>> snaps;
        uint16_t site = 0;
    };
    XSet xset[3][16];          // per mode and id
    int waiting_xflag = -1;    // flag id this core is blocked on (-1: none)
    int matmul_client_objects = 0;  // Matmul client objects registered on this core (their flag ids are taken)
    // fiber
    ucontext_t ctx;
    std::unique_ptr<char[]> stack;
    enum State { Ready, Blocked, Done } state = Ready;
    std::string blocked_on;
    uint32_t barrier_gen_wait = 0;
    std::function<void()> fn;
    ~Core() { std::free(ub); }
};

struct Runtime {
    Config cfg;
    std::vector<std::unique_ptr<Core>> aiv, aic;
    int block_dim = 0;
    int ratio = 2;  // AIVs per AIC: 0 AIV only, 1, 2
    Core* cur = nullptr;
    ucontext_t main_ctx;
    std::map<uintptr_t, Region> gm;
    uint32_t gen = 1;  // SyncAll generation
    int barrier_count = 0;
    std::vector<uint32_t> barrier_join;  // clock join of the cores arrived in the current SyncAll
    std::vector<Core*> agents;          // every core of the launch by agent id (AIVs first, then AICs)
    std::string syncall_site, xflag_11_14_site;  // SyncAll and CrossCore flag ids 11..14 must not meet
    std::unordered_map<uintptr_t, int> scalar_store_owner;  // 64-byte GM line -> core that stored to it
    uint64_t rng_state = 1;
    bool aborting = false;
    std::string error;
    GM_ADDR sys_ws = nullptr;
    uint64_t sys_ws_bytes = 0;
    std::vector<std::unique_ptr<MatmulResources>> mm_res;  // per AIC
    std::vector<std::vector<uint8_t>> kfc_ring;            // per AIV: GM staging of GetTensorC (WORKSPACE_UB)

    uint64_t next_rand() {
        uint64_t x = rng_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        rng_state = x;
        return x;
    }
    double rand01() { return static_cast<double>(next_rand() >> 11) * (1.0 / 9007199254740992.0); }
};

inline Runtime*& rt_ptr() {
    static Runtime* r = nullptr;
    return r;
}
inline bool hazards_on() { return rt_ptr() != nullptr && rt_ptr()->cfg.hazards; }
inline Runtime& rt() {
    Runtime* r = rt_ptr();
    if (r == nullptr) throw Error("twin ERROR: AscendC API called outside a twin launch");
    return *r;
}
inline Core& cur() {
    Runtime& r = rt();
    if (r.cur == nullptr) throw Error("twin ERROR: AscendC API called outside a kernel core");
    return *r.cur;
}
inline std::string core_name() {
    Runtime* r = rt_ptr();
    return r && r->cur ? r->cur->name : std::string("host");
}

// ---- scheduling ------------------------------------------------------------------------------------------------
inline void check_abort() {
    if (rt().aborting) throw Abort{};
}
inline void switch_to_main() {
    Runtime& r = rt();
    Core* c = r.cur;
    swapcontext(&c->ctx, &r.main_ctx);
    r.cur = c;
    check_abort();
}
// A scheduling point: the scheduler may run another core here (only at GM-visible or cross-core operations).
inline void yield_point() {
    Runtime& r = rt();
    check_abort();
    if (r.cur != nullptr && r.agents.size() > 1 && r.rand01() < r.cfg.switch_prob) switch_to_main();
}
inline void block(const std::string& why) {
    Core& c = cur();
    c.state = Core::Blocked;
    c.blocked_on = why;
    while (c.state == Core::Blocked) switch_to_main();
}

// ---- pipe clocks -----------------------------------------------------------------------------------------------
inline uint32_t issue(Core& c, int p) {
    if (p == kV) ++c.cnt.v_instr;
    if (p == kS) ++c.cnt.s_ops;
    return ++c.clk.epoch[p];
}
inline void barrier_all(Core& c) {
    for (int q = 0; q < kNumPipes; ++q)
        for (int p = 0; p < kNumPipes; ++p) c.clk.known[q][p] = c.clk.epoch[p];
}
inline void barrier_pipe(Core& c, int p) { c.clk.known[p][p] = c.clk.epoch[p]; }

// ---- UB hazard checker -----------------------------------------------------------------------------------------
inline int ub_reader_slot(int p) { return p == kS ? 0 : p == kV ? 1 : p == kMTE2 ? 2 : p == kMTE3 ? 3 : -1; }
inline int ub_slot_pipe(int s) { return s == 0 ? kS : s == 1 ? kV : s == 2 ? kMTE2 : kMTE3; }

[[noreturn]] inline void hazard(Core&, const char* kind, uint64_t off, int prev_pipe, uint16_t prev_site, int pipe,
                                const char* api, const Loc& loc, const char* hint) {
    fail_at(loc, api,
            "pipe hazard (%s) on UB byte offset %llu (0x%llx): %s on pipe %s after %s on pipe %s with no ordering "
            "between them (%s)",
            kind, static_cast<unsigned long long>(off), static_cast<unsigned long long>(off), api, pipe_name(pipe),
            site_text(prev_site).c_str(), pipe_name(prev_pipe), hint);
}

inline std::string sync_hint(int from, int to) {
    if (from == to) return format("PipeBarrier<PIPE_%s>() needed", pipe_name(to));
    return format("SetFlag/WaitFlag<HardEvent::%s_%s> or PipeBarrier<PIPE_ALL> needed", pipe_name(from),
                  pipe_name(to));
}

// Record an access of UB bytes [off, off + len) of core c by pipe p at the op's epoch.
inline void ub_access(Core& c, uint64_t off, uint64_t len, int p, bool write, uint32_t epoch, uint16_t site,
                      const char* api, const Loc& loc) {
    Runtime& r = rt();
    if (write && p == kV) c.cnt.v_bytes += len;
    if (!r.cfg.hazards || len == 0) return;
    const int slot = ub_reader_slot(p);
    const uint64_t g0 = off / 2, g1 = (off + len + 1) / 2;
    for (uint64_t g = g0; g < g1; ++g) {
        UbShadow& e = c.ush[g];
        if (write) {  // write after read on another pipe first: the usual missing WAR order names the reader
            for (int s = 0; s < 4; ++s) {
                const int q = ub_slot_pipe(s);
                if (q != p && e.r[s] != 0 && c.clk.known[p][q] < e.r[s]) {
                    std::string h = sync_hint(q, p);
                    hazard(c, "write after read", g * 2, q, e.rsite[s], p, api, loc, h.c_str());
                }
            }
        }
        if (e.w != 0) {
            if (e.wpipe != p) {
                if (c.clk.known[p][e.wpipe] < e.w) {
                    std::string h = sync_hint(e.wpipe, p);
                    hazard(c, write ? "write after write" : "read after write", g * 2, e.wpipe, e.wsite, p, api, loc,
                           h.c_str());
                }
            } else if (r.cfg.strict_v && (p == kV || (p == kMTE2 && write)) && e.w != epoch &&
                       c.clk.known[p][p] < e.w) {
                std::string h = sync_hint(p, p);
                hazard(c, write ? "write after write" : "read after write", g * 2, e.wpipe, e.wsite, p, api, loc,
                       h.c_str());
            }
        }
        if (write) {
            e.w = epoch;
            e.wpipe = static_cast<uint8_t>(p);
            e.wsite = site;
            for (int s = 0; s < 4; ++s) e.r[s] = 0;
        } else if (slot >= 0) {
            e.r[slot] = epoch;
            e.rsite[slot] = site;
        }
    }
}

// ---- GM checker ------------------------------------------------------------------------------------------------
inline Region* find_region(uintptr_t a) {
    Runtime& r = rt();
    auto it = r.gm.upper_bound(a);
    if (it == r.gm.begin()) return nullptr;
    --it;
    Region& g = it->second;
    return a >= g.start && a < g.start + g.size ? &g : nullptr;
}
inline std::string gm_describe(uintptr_t a) {
    const uintptr_t ph = reinterpret_cast<uintptr_t>(absent_placeholder());
    if (a >= ph && a < ph + kAbsentSpan)
        return format("the placeholder address of an absent optional argument + %llu (presence must come from the "
                      "tiling, not from a null address)",
                      static_cast<unsigned long long>(a - ph));
    Region* g = find_region(a);
    if (g) return format("%s+%llu", g->name.c_str(), static_cast<unsigned long long>(a - g->start));
    // nearest region below, to explain overruns
    Runtime& r = rt();
    auto it = r.gm.upper_bound(a);
    if (it != r.gm.begin()) {
        --it;
        return format("%llu bytes past the end of %s (%llu bytes)",
                      static_cast<unsigned long long>(a - (it->second.start + it->second.size)),
                      it->second.name.c_str(), static_cast<unsigned long long>(it->second.size));
    }
    return format("unregistered address %p", reinterpret_cast<void*>(a));
}

// Bounds of a GM range: it must lie inside one allocation.
inline Region& gm_bounds(uintptr_t a, uint64_t bytes, bool write, const char* api, const Loc& loc) {
    Region* g = find_region(a);
    if (g == nullptr)
        fail_at(loc, api, "GM access of %llu bytes at %s: outside every allocation",
                static_cast<unsigned long long>(bytes), gm_describe(a).c_str());
    if (a + bytes > g->start + g->size)
        fail_at(loc, api, "GM access of %llu bytes at %s runs %llu bytes past the end of %s (%llu bytes)",
                static_cast<unsigned long long>(bytes), gm_describe(a).c_str(),
                static_cast<unsigned long long>(a + bytes - (g->start + g->size)), g->name.c_str(),
                static_cast<unsigned long long>(g->size));
    if (write && g->read_only)
        fail_at(loc, api, "write of %llu bytes to the input %s", static_cast<unsigned long long>(bytes),
                gm_describe(a).c_str());
    return *g;
}

inline int core_id(const Core& c) { return c.kind == Core::AIV ? c.index : 64 + c.index; }
inline std::string core_label(int id) {
    Runtime& r = rt();
    if (id == -2) return "several cores (atomic)";
    if (id >= 64) return id - 64 < static_cast<int>(r.aic.size()) ? r.aic[id - 64]->name : "AIC?";
    return id >= 0 && id < static_cast<int>(r.aiv.size()) ? r.aiv[id]->name : "?";
}

inline std::string agent_label(int a) {
    Runtime& r = rt();
    return a >= 0 && a < static_cast<int>(r.agents.size()) ? r.agents[a]->name : std::string("?");
}
// Is the earlier access `e` ordered before an access of core x on pipe `pipe`? Same core: the pipe clocks (the
// same pipe runs in order; another pipe must know it complete through SetFlag/WaitFlag or a barrier). Another
// core: x's vector clock, advanced by CrossCoreWaitFlag and SyncAll.
inline bool gm_ordered(const Core& x, int pipe, const Access& e) {
    if (e.agent == 0xff) return true;
    if (e.agent == x.agent) return e.pipe == pipe || x.clk.known[pipe][e.pipe] >= e.epoch;
    return x.vc[static_cast<size_t>(e.agent) * kNumPipes + e.pipe] >= e.epoch;
}

// Race check of GM bytes [a, a + bytes) accessed by core c on `pipe` at `epoch` (the Matmul client's cube accesses
// are made on behalf of the AIV that asked, on its scalar pipe). Conflicting accesses (a write and another access)
// must be ordered: on one core by its pipe order, across cores by a cross-core flag or SyncAll. Float atomic adds
// commute with each other.
inline void gm_race(Region& g, uintptr_t a, uint64_t bytes, bool write, bool atomic, Core& c, int pipe,
                    uint32_t epoch, uint16_t site, const char* api, const Loc& loc) {
    Runtime& r = rt();
    if (!r.cfg.hazards || g.shadow.empty() || bytes == 0) return;
    const uint64_t b0 = (a - g.start) / 4, b1 = (a - g.start + bytes + 3) / 4;
    const Access me{static_cast<uint8_t>(c.agent), static_cast<uint8_t>(pipe), site, epoch};
    auto report = [&](const char* kind, const Access& prev, uint64_t i) {
        if (prev.agent == c.agent)
            fail_at(loc, api,
                    "GM hazard on %s: %s on pipe %s after %s on pipe %s of the same core with no ordering between "
                    "them (%s; %s)",
                    gm_describe(g.start + i * 4).c_str(), api, pipe_name(pipe), site_text(prev.site).c_str(),
                    pipe_name(prev.pipe), kind,
                    format("SetFlag/WaitFlag<HardEvent::%s_%s> needed", pipe_name(prev.pipe), pipe_name(pipe)).c_str());
        fail_at(loc, api,
                "cross-core race on GM %s: %s (pipe %s) %s bytes that %s %s (%s on pipe %s) with no SyncAll or "
                "CrossCoreSetFlag/CrossCoreWaitFlag ordering them (%s)",
                gm_describe(g.start + i * 4).c_str(), c.name.c_str(), pipe_name(pipe), write ? "writes" : "reads",
                agent_label(prev.agent).c_str(), kind[0] == 'w' && kind[6] == 'a' ? "read" : "wrote",
                site_text(prev.site).c_str(), pipe_name(prev.pipe), kind);
    };
    for (uint64_t i = b0; i < b1 && i < g.shadow.size(); ++i) {
        GmShadow& e = g.shadow[i];
        if (write) {
            if (!(atomic && e.atomic) && !gm_ordered(c, pipe, e.w)) report("write after write", e.w, i);
            for (const Access& rd : e.r)
                if (rd.agent != 0xff && !gm_ordered(c, pipe, rd)) report("write after read", rd, i);
            e.w = me;
            e.atomic = atomic ? 1 : 0;
            e.r[0] = Access{};
            e.r[1] = Access{};
        } else {
            if (!gm_ordered(c, pipe, e.w)) report("read after write", e.w, i);
            if (e.r[0].agent == c.agent) {
                e.r[0] = me;
            } else if (e.r[1].agent == c.agent || e.r[1].agent == 0xff) {
                e.r[1] = me;
            } else {
                e.r[0] = e.r[1];
                e.r[1] = me;
            }
        }
    }
}

// Same-core ordering of GM is checked by gm_race (every writable region keeps its last accesses).
inline void gm_pending_check(Core&, uintptr_t, uint64_t, int, const char*, const Loc&) {}
inline void gm_prune(Core& c) {
    auto& v = c.pending_mte3;
    v.erase(std::remove_if(v.begin(), v.end(),
                           [&](const Core::PendingGm& w) {
                               for (int q = 0; q < kNumPipes; ++q)
                                   if (c.clk.known[q][kMTE3] < w.epoch) return false;
                               return true;
                           }),
            v.end());
}

// DMA reads must not see bytes that this core's scalar unit stored and still holds in its data cache.
inline void dcache_dma_check(Core& c, uintptr_t a, uint64_t bytes, const char* api, const Loc& loc) {
    if (c.dcache.empty()) return;
    for (uintptr_t line = a & ~uintptr_t(63); line < a + bytes; line += 64) {
        auto it = c.dcache.find(line);
        if (it == c.dcache.end() || it->second.dirty == 0) continue;
        for (int i = 0; i < 64; ++i) {
            const uintptr_t b = line + i;
            if (b >= a && b < a + bytes && (it->second.dirty >> i & 1ull))
                fail_at(loc, api,
                        "DMA access of GM %s whose scalar store (GlobalTensor::SetValue) is still in the data "
                        "cache: DataCacheCleanAndInvalid is missing",
                        gm_describe(b).c_str());
        }
    }
}

// ---- launch ----------------------------------------------------------------------------------------------------
inline void register_gm(const void* p, uint64_t bytes, const std::string& name, bool read_only) {
    if (bytes == 0 || p == nullptr) return;
    Runtime& r = rt();
    Region g;
    g.start = reinterpret_cast<uintptr_t>(p);
    g.size = bytes;
    g.name = name;
    g.read_only = read_only;
    if (!read_only) g.shadow.resize((bytes + 3) / 4);
    auto it = r.gm.upper_bound(g.start);
    if (it != r.gm.end() && it->second.start < g.start + bytes)
        throw Error(format("twin: GM allocations %s and %s overlap", name.c_str(), it->second.name.c_str()));
    if (it != r.gm.begin()) {
        auto prev = std::prev(it);
        if (prev->second.start + prev->second.size > g.start)
            throw Error(format("twin: GM allocations %s and %s overlap", name.c_str(), prev->second.name.c_str()));
    }
    r.gm[g.start] = std::move(g);
}

inline void finish_core(Core& c);

inline void fiber_entry() {
    Runtime& r = rt();
    Core* c = r.cur;
    try {
        c->fn();
        finish_core(*c);
    } catch (const Abort&) {
    } catch (const Error& e) {
        if (r.error.empty()) r.error = e.what();
        r.aborting = true;
    } catch (const std::exception& e) {
        if (r.error.empty()) r.error = format("twin ERROR [%s]: exception %s", c->name.c_str(), e.what());
        r.aborting = true;
    }
    c->state = Core::Done;
    swapcontext(&c->ctx, &r.main_ctx);
}

inline void init_matmul_resources(Runtime& r) {
    r.mm_res.clear();
    for (size_t i = 0; i < r.aic.size(); ++i) r.mm_res.emplace_back(new MatmulResources());
}

struct LaunchSpec {
    int block_dim = 1;
    int ratio = 2;  // vector cores per cube core: 2 (MIX 1:2), 1 (MIX 1:1) or 0 (vector-only kernel)
    Config cfg;
    uint64_t sys_workspace_bytes = 0;
    GM_ADDR sys_workspace = nullptr;
};

inline void check_xflags_at_end(Runtime& r);

// Per-core counters of the last launch (AIVs first, then AICs), kept after the launch for the tests / model.
struct CoreCounters {
    bool aic;
    Core::Counters c;
};
inline std::vector<CoreCounters>& last_counters() {
    static std::vector<CoreCounters> v;
    return v;
}

inline std::unique_ptr<Core> make_fiber(Core::Kind kind, const std::function<void()>& kernel) {
    auto c = std::make_unique<Core>();
    c->kind = kind;
    c->fn = kernel;
    const size_t stack_bytes = 1u << 20;
    c->stack.reset(new char[stack_bytes]);
    getcontext(&c->ctx);
    c->ctx.uc_stack.ss_sp = c->stack.get();
    c->ctx.uc_stack.ss_size = stack_bytes;
    c->ctx.uc_link = &rt().main_ctx;
    makecontext(&c->ctx, fiber_entry, 0);
    return c;
}

// Runs `kernel` on every core of the launch, interleaved: the vector cores and, for MIX kernels, the cube cores
// (each its own fiber). Throws twin::Error with the first error.
inline void launch(const LaunchSpec& spec, const std::function<void()>& kernel,
                   const std::function<void(Runtime&)>& register_memory) {
    if (rt_ptr() != nullptr) throw Error("twin: nested launch");
    std::unique_ptr<Runtime> holder(new Runtime());
    Runtime& r = *holder;
    rt_ptr() = &r;
    struct Reset {
        ~Reset() { rt_ptr() = nullptr; }
    } reset;
    r.cfg = spec.cfg;
    r.block_dim = spec.block_dim;
    r.ratio = spec.ratio;
    r.rng_state = spec.cfg.seed * 0x9e3779b97f4a7c15ull + 0x12345ull;
    if (r.rng_state == 0) r.rng_state = 1;
    r.sys_ws = spec.sys_workspace;
    r.sys_ws_bytes = spec.sys_workspace_bytes;
    const int n_aiv = spec.ratio == 0 ? spec.block_dim : spec.block_dim * spec.ratio;
    if (spec.block_dim <= 0) throw Error("twin: block_dim must be > 0");
    if (n_aiv > 64) throw Error("twin: at most 64 vector cores per launch");
    if (spec.ratio != 0 && spec.block_dim > 32) throw Error("twin: at most 32 cube cores per launch");
    register_memory(r);
    if (r.sys_ws) register_gm(r.sys_ws, r.sys_ws_bytes, "system workspace", false);
    const int n_aic = spec.ratio == 0 ? 0 : spec.block_dim;
    r.kfc_ring.resize(n_aiv);
    for (int i = 0; i < n_aiv; ++i) {
        auto c = make_fiber(Core::AIV, kernel);
        c->index = i;
        c->block_idx = i;
        c->sub_idx = spec.ratio == 2 ? i % 2 : 0;
        c->aic = spec.ratio == 0 ? -1 : (spec.ratio == 2 ? i / 2 : i);
        c->name = spec.ratio == 0 ? format("AIV%d", i) : format("AIV%d (AIC%d.%d)", i, c->aic, c->sub_idx);
        c->ub_size = spec.cfg.ub_bytes;
        c->ub = static_cast<uint8_t*>(std::aligned_alloc(64, (c->ub_size + 63) / 64 * 64));
        std::memset(c->ub, 0xff, c->ub_size);  // uninitialised UB reads as NaN / -1
        if (spec.cfg.hazards) c->ush.assign((c->ub_size + 1) / 2, UbShadow{});
        r.aiv.push_back(std::move(c));
        r.kfc_ring[i].assign(spec.cfg.ub_bytes, 0);  // the client's GM staging ring is as large as the UB
        register_gm(r.kfc_ring[i].data(), r.kfc_ring[i].size(), format("GetTensorC staging of AIV%d", i), false);
    }
    for (int i = 0; i < n_aic; ++i) {
        auto c = make_fiber(Core::AIC, kernel);  // the cube core runs the kernel entry too (ASCEND_IS_AIC)
        c->index = i;
        c->block_idx = i;
        c->aic = i;
        c->name = format("AIC%d", i);
        r.aic.push_back(std::move(c));
    }
    for (auto& c : r.aiv) r.agents.push_back(c.get());
    for (auto& c : r.aic) r.agents.push_back(c.get());
    for (size_t i = 0; i < r.agents.size(); ++i) {
        r.agents[i]->agent = static_cast<int>(i);
        r.agents[i]->vc.assign(r.agents.size() * kNumPipes, 0);
    }
    init_matmul_resources(r);
    // scheduler: run a random ready core until it reaches a scheduling point
    std::vector<Core*> ready;
    while (true) {
        ready.clear();
        bool any_left = false;
        for (Core* c : r.agents) {
            if (c->state == Core::Ready) ready.push_back(c);
            if (c->state != Core::Done) any_left = true;
        }
        if (!any_left) break;
        if (ready.empty()) {
            std::string who;
            for (Core* c : r.agents)
                if (c->state == Core::Blocked)
                    who += format("\n  %s waits in %s", c->name.c_str(), c->blocked_on.c_str());
            for (Core* c : r.agents)
                if (c->state == Core::Done) who += format("\n  %s has returned", c->name.c_str());
            if (r.error.empty()) r.error = "twin ERROR: deadlock, every core is blocked:" + who;
            r.aborting = true;
            for (Core* c : r.agents)
                if (c->state == Core::Blocked) c->state = Core::Ready;
            continue;
        }
        Core* c = ready[r.next_rand() % ready.size()];
        r.cur = c;
        swapcontext(&r.main_ctx, &c->ctx);
        r.cur = nullptr;
        if (r.aborting) {
            for (Core* o : r.agents)
                if (o->state == Core::Blocked) o->state = Core::Ready;
        }
    }
    last_counters().clear();
    for (Core* c : r.agents) last_counters().push_back({c->kind == Core::AIC, c->cnt});
    if (r.error.empty()) {
        try {
            check_xflags_at_end(r);
        } catch (const Error& e) {
            r.error = e.what();
        }
    }
    if (!r.error.empty()) throw Error(r.error);
}

// ---- system variables ------------------------------------------------------------------------------------------
inline void api_enter(Core& c) { ++c.api_calls; }

}  // namespace twin

#endif  // FUSED_LCE_TWIN_RUNTIME_H_
