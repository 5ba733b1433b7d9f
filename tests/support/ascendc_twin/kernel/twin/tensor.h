// CPU twin of the AscendC API: tensors, TPipe / TBuf / TQue, synchronisation, atomics, data cache, system variables.
// Semantics follow asc-devkit: impl/basic_api/kernel_tensor_impl.h (LocalTensor::operator[] keeps the remaining
// length, GetSize() = dataLen / sizeof(T), ReinterpretCast keeps the byte length), impl/basic_api/kernel_tbuf_impl.h
// (TBuf::Get / GetWithOffset), docs 同步控制/核内同步 (SetFlag/WaitFlag pairing, event ids 0-7),
// docs 数据结构/GlobalTensor/SetValue.md and 缓存控制/DataCacheCleanAndInvalid.md (scalar GM stores go through a
// per-core data cache written back in 64-byte lines).
#ifndef FUSED_LCE_TWIN_TENSOR_H_
#define FUSED_LCE_TWIN_TENSOR_H_

#include "runtime.h"

namespace AscendC {

class TPipe;

namespace twin_detail {
inline bool is_ub_pos(TPosition p) {
    return p == TPosition::VECIN || p == TPosition::VECOUT || p == TPosition::VECCALC;
}
}  // namespace twin_detail

template <typename T>
class LocalTensor {
public:
    using PrimType = T;
    LocalTensor() = default;

    __aicore__ inline uint32_t GetSize() const { return len_ / static_cast<uint32_t>(sizeof(T)); }
    __aicore__ inline void SetSize(uint32_t size, twin::Loc loc = {}) {
        check_owner("LocalTensor::SetSize", loc);
        const uint64_t off = offset();
        if (off + static_cast<uint64_t>(size) * sizeof(T) > core_->ub_size)
            twin::fail_at(loc, "LocalTensor::SetSize", "size %u runs past the end of the UB", size);
        len_ = size * static_cast<uint32_t>(sizeof(T));
    }
    __aicore__ inline TPosition GetPosition() const { return pos_; }
    __aicore__ inline T* GetPhyAddr() const { return reinterpret_cast<T*>(addr_); }
    __aicore__ inline T* GetPhyAddr(uint32_t offset, twin::Loc loc = {}) const {
        if (static_cast<uint64_t>(offset) * sizeof(T) >= len_)
            twin::fail_at(loc, "LocalTensor::GetPhyAddr", "offset %u is not below the tensor length %u", offset,
                          GetSize());
        return reinterpret_cast<T*>(addr_) + offset;
    }

    // operator[] keeps the remaining length (kernel_tensor_impl.h): the result's GetSize() is GetSize() - offset.
    __aicore__ inline LocalTensor operator[](uint32_t offset) const { return at(offset, twin::Loc()); }
    LocalTensor at(uint32_t offset, const twin::Loc& loc) const {
        if (len_ != 0 && static_cast<uint64_t>(offset) * sizeof(T) >= len_)
            twin::fail_at(loc, "LocalTensor::operator[]", "offset %u is not below the tensor length %u", offset,
                          GetSize());
        LocalTensor r = *this;
        r.addr_ += static_cast<uint64_t>(offset) * sizeof(T);
        r.len_ -= offset * static_cast<uint32_t>(sizeof(T));
        return r;
    }

    template <typename U>
    __aicore__ inline LocalTensor<U> ReinterpretCast() const {
        LocalTensor<U> r;
        r.addr_ = addr_;
        r.len_ = len_;
        r.pos_ = pos_;
        r.core_ = core_;
        return r;
    }

    // Scalar reads and writes of UB run on the scalar pipe (PIPE_S).
    __aicore__ inline T GetValue(uint32_t index, twin::Loc loc = {}) const {
        static const char* api = "LocalTensor::GetValue";
        check_index(index, api, loc);
        twin::Core& c = *core_;
        const uint32_t e = twin::issue(c, twin::kS);
        twin::barrier_pipe(c, twin::kS);
        twin::ub_access(c, offset() + static_cast<uint64_t>(index) * sizeof(T), sizeof(T), twin::kS, false, e,
                        twin::site_id(api, loc), api, loc);
        T v;
        std::memcpy(&v, addr_ + static_cast<uint64_t>(index) * sizeof(T), sizeof(T));
        return v;
    }
    template <typename U>
    __aicore__ inline void SetValue(uint32_t index, U value, twin::Loc loc = {}) const {
        static const char* api = "LocalTensor::SetValue";
        check_index(index, api, loc);
        twin::Core& c = *core_;
        const uint32_t e = twin::issue(c, twin::kS);
        twin::barrier_pipe(c, twin::kS);
        twin::ub_access(c, offset() + static_cast<uint64_t>(index) * sizeof(T), sizeof(T), twin::kS, true, e,
                        twin::site_id(api, loc), api, loc);
        const T v = static_cast<T>(value);
        std::memcpy(addr_ + static_cast<uint64_t>(index) * sizeof(T), &v, sizeof(T));
    }

    // ---- twin internals ----
    uint64_t offset() const { return static_cast<uint64_t>(addr_ - core_->ub); }
    void check_owner(const char* api, const twin::Loc& loc) const {
        if (core_ == nullptr) twin::fail_at(loc, api, "LocalTensor was never bound to a buffer");
        if (core_ != &twin::cur())
            twin::fail_at(loc, api, "LocalTensor of %s used on another core", core_->name.c_str());
    }
    void check_index(uint32_t index, const char* api, const twin::Loc& loc) const {
        check_owner(api, loc);
        if (static_cast<uint64_t>(index) * sizeof(T) >= len_)
            twin::fail_at(loc, api, "index %u is not below the tensor length %u (UB offset %llu)", index, GetSize(),
                          static_cast<unsigned long long>(offset()));
    }
    uint8_t* addr_ = nullptr;
    uint32_t len_ = 0;  // bytes
    TPosition pos_ = TPosition::VECCALC;
    twin::Core* core_ = nullptr;
};

// ---- global memory ---------------------------------------------------------------------------------------------
namespace twin_detail {
// Scalar GM access through the core's data cache (64-byte lines, write-back).
inline twin::CacheLineCopy& dcache_line(twin::Core& c, uintptr_t a, twin::Region& g) {
    const uintptr_t line = a & ~uintptr_t(63);
    auto it = c.dcache.find(line);
    if (it != c.dcache.end()) return it->second;
    twin::CacheLineCopy l;
    l.lo = std::max<uintptr_t>(line, g.start);
    l.hi = std::min<uintptr_t>(line + 64, g.start + g.size);
    std::memcpy(l.data + (l.lo - line), reinterpret_cast<const void*>(l.lo), l.hi - l.lo);
    return c.dcache.emplace(line, l).first->second;
}
// Write back (clean) one line: the whole line goes to GM, so bytes another agent changed since the line was cached
// are overwritten -- that is what the hardware does and what the check reports.
inline void dcache_writeback(twin::Core&, uintptr_t line, twin::CacheLineCopy& l, const char* api,
                             const twin::Loc& loc) {
    if (l.dirty == 0) return;
    for (uintptr_t b = l.lo; b < l.hi; ++b) {
        const int i = static_cast<int>(b - line);
        if (!(l.dirty >> i & 1ull) && *reinterpret_cast<const uint8_t*>(b) != l.data[i])
            twin::fail_at(loc, api,
                          "data-cache write-back of the 64-byte line holding GM %s overwrites a byte another core "
                          "(or DMA) changed after this core cached the line: scalar GM stores of different cores "
                          "must be at least a cache line apart",
                          twin::gm_describe(b).c_str());
    }
    std::memcpy(reinterpret_cast<void*>(l.lo), l.data + (l.lo - line), l.hi - l.lo);
    l.dirty = 0;
}
}  // namespace twin_detail

template <typename T>
class GlobalTensor {
public:
    using PrimType = T;
    GlobalTensor() = default;
    __aicore__ inline void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize) {
        addr_ = buffer;
        size_ = bufferSize;
    }
    __aicore__ inline void SetGlobalBuffer(__gm__ T* buffer) {
        addr_ = buffer;
        size_ = 0;
    }
    __aicore__ inline GlobalTensor operator[](uint64_t offset) const {
        GlobalTensor r;
        r.addr_ = addr_ + offset;
        r.size_ = size_ > offset ? size_ - offset : 0;
        return r;
    }
    __aicore__ inline __gm__ T* GetPhyAddr() const { return addr_; }
    __aicore__ inline __gm__ T* GetPhyAddr(uint64_t offset) const { return addr_ + offset; }
    __aicore__ inline uint64_t GetSize() const { return size_; }

    // Scalar GM read: through the data cache (a line cached earlier can be stale).
    __aicore__ inline T GetValue(uint64_t offset, twin::Loc loc = {}) const {
        static const char* api = "GlobalTensor::GetValue";
        twin::Core& c = twin::cur();
        twin::api_enter(c);
        twin::yield_point();
        const uintptr_t a = reinterpret_cast<uintptr_t>(addr_ + offset);
        check_size(offset, api, loc);
        twin::Region& g = twin::gm_bounds(a, sizeof(T), false, api, loc);
        twin::issue(c, twin::kS);
        twin::barrier_pipe(c, twin::kS);
        twin::gm_race(g, a, sizeof(T), false, false, c, twin::kS, c.clk.epoch[twin::kS], twin::site_id(api, loc), api,
                      loc);
        T v;
        uint8_t* out = reinterpret_cast<uint8_t*>(&v);
        for (uint64_t i = 0; i < sizeof(T); ++i) {
            const uintptr_t b = a + i;
            twin::CacheLineCopy& l = twin_detail::dcache_line(c, b, g);
            const int k = static_cast<int>(b & 63u);
            if (!(l.dirty >> k & 1ull) && rt_hazards() && *reinterpret_cast<const uint8_t*>(b) != l.data[k])
                twin::fail_at(loc, api,
                              "stale data-cache read of GM %s: the line was cached before another core (or DMA) "
                              "changed it; DataCacheCleanAndInvalid is missing",
                              twin::gm_describe(b).c_str());
            out[i] = l.data[k];
        }
        return v;
    }
    // Scalar GM write: only the data cache is changed until DataCacheCleanAndInvalid writes the line back.
    __aicore__ inline void SetValue(uint64_t offset, T value, twin::Loc loc = {}) const {
        static const char* api = "GlobalTensor::SetValue";
        twin::Core& c = twin::cur();
        twin::api_enter(c);
        twin::yield_point();
        const uintptr_t a = reinterpret_cast<uintptr_t>(addr_ + offset);
        check_size(offset, api, loc);
        twin::Region& g = twin::gm_bounds(a, sizeof(T), true, api, loc);
        twin::issue(c, twin::kS);
        twin::barrier_pipe(c, twin::kS);
        twin::gm_race(g, a, sizeof(T), true, false, c, twin::kS, c.clk.epoch[twin::kS], twin::site_id(api, loc), api,
                      loc);
        const uint8_t* in = reinterpret_cast<const uint8_t*>(&value);
        for (uint64_t i = 0; i < sizeof(T); ++i) {
            const uintptr_t b = a + i;
            const uintptr_t line = b & ~uintptr_t(63);
            auto own = twin::rt().scalar_store_owner.emplace(line, twin::core_id(c)).first;
            if (own->second != twin::core_id(c))
                twin::fail_at(loc, api,
                              "scalar GM store to GM %s shares a 64-byte cache line with scalar stores of %s: the "
                              "write-backs overwrite each other (GlobalTensor/SetValue.md: cores must store at least "
                              "a cache line apart; stage the values in UB and use DataCopyPad)",
                              twin::gm_describe(b).c_str(), twin::core_label(own->second).c_str());
            twin::CacheLineCopy& l = twin_detail::dcache_line(c, b, g);
            const int k = static_cast<int>(b & 63u);
            l.data[k] = in[i];
            l.dirty |= 1ull << k;
        }
    }

    // ---- twin internals ----
    static bool rt_hazards() { return twin::rt().cfg.hazards; }
    void check_size(uint64_t offset, const char* api, const twin::Loc& loc) const {
        if (size_ != 0 && offset >= size_)
            twin::fail_at(loc, api, "offset %llu is not below the GlobalTensor size %llu",
                          static_cast<unsigned long long>(offset), static_cast<unsigned long long>(size_));
    }
    __gm__ T* addr_ = nullptr;
    uint64_t size_ = 0;
};

template <typename T, CacheLine entire, DcciDst dst = DcciDst::CACHELINE_OUT>
__aicore__ inline void DataCacheCleanAndInvalid(const GlobalTensor<T>& t, twin::Loc loc = {}) {
    static const char* api = "DataCacheCleanAndInvalid";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin::yield_point();
    twin::issue(c, twin::kS);
    if (entire == CacheLine::ENTIRE_DATA_CACHE) {
        for (auto& kv : c.dcache) twin_detail::dcache_writeback(c, kv.first, kv.second, api, loc);
        c.dcache.clear();
    } else {
        const uintptr_t line = reinterpret_cast<uintptr_t>(t.GetPhyAddr()) & ~uintptr_t(63);
        auto it = c.dcache.find(line);
        if (it != c.dcache.end()) {
            twin_detail::dcache_writeback(c, line, it->second, api, loc);
            c.dcache.erase(it);
        }
    }
}

// ---- pipe synchronisation --------------------------------------------------------------------------------------
namespace twin_detail {
inline void set_flag(twin::Core& c, HardEvent ev, int id, const char* api, const twin::Loc& loc) {
    const twin::EventPipes ep = twin::event_pipes(ev);
    if (ep.src < 0) twin::fail_at(loc, api, "unknown HardEvent");
    if (id < 1000 && (id < 0 || id > 7)) twin::fail_at(loc, api, "event id %d outside 0..7 (Atlas A2)", id);
    twin::Flag& f = c.flags[{static_cast<int>(ev), id}];
    if (f.set)
        twin::fail_at(loc, api,
                      "SetFlag<%s>(%d) twice without a WaitFlag in between (undefined behaviour, SetFlag-WaitFlag "
                      "docs); the first SetFlag is %s",
                      twin::event_name(ev).c_str(), id, twin::site_text(f.site).c_str());
    // SetFlag executes on the source pipe after everything issued there before it.
    twin::issue(c, ep.src);
    f.set = true;
    for (int p = 0; p < twin::kNumPipes; ++p) f.snap[p] = c.clk.known[ep.src][p];
    f.snap[ep.src] = c.clk.epoch[ep.src];
    f.site = twin::site_id(api, loc);
}
inline void wait_flag(twin::Core& c, HardEvent ev, int id, const char* api, const twin::Loc& loc) {
    const twin::EventPipes ep = twin::event_pipes(ev);
    if (id < 1000 && (id < 0 || id > 7)) twin::fail_at(loc, api, "event id %d outside 0..7 (Atlas A2)", id);
    auto it = c.flags.find({static_cast<int>(ev), id});
    if (it == c.flags.end() || !it->second.set)
        twin::fail_at(loc, api, "WaitFlag<%s>(%d) with no SetFlag<%s>(%d) before it: pipe %s would wait forever",
                      twin::event_name(ev).c_str(), id, twin::event_name(ev).c_str(), id, twin::pipe_name(ep.dst));
    twin::issue(c, ep.dst);
    for (int p = 0; p < twin::kNumPipes; ++p)
        c.clk.known[ep.dst][p] = std::max(c.clk.known[ep.dst][p], it->second.snap[p]);
    it->second.set = false;
    twin::gm_prune(c);
}
}  // namespace twin_detail

template <HardEvent event>
__aicore__ inline void SetFlag(int32_t eventID, twin::Loc loc = {}) {
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin_detail::set_flag(c, event, eventID, "SetFlag", loc);
}
template <HardEvent event>
__aicore__ inline void WaitFlag(int32_t eventID, twin::Loc loc = {}) {
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin_detail::wait_flag(c, event, eventID, "WaitFlag", loc);
}
template <pipe_t pipe>
__aicore__ inline void PipeBarrier(twin::Loc loc = {}) {
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    if (pipe == PIPE_ALL) {
        twin::barrier_all(c);
        twin::gm_prune(c);
        return;
    }
    const int p = twin::pipe_of(pipe);
    if (p < 0) twin::fail_at(loc, "PipeBarrier", "unknown pipe");
    twin::issue(c, p);
    twin::barrier_pipe(c, p);
}
template <pipe_t src, pipe_t dst>
class TQueSync {
public:
    __aicore__ inline void SetFlag(TEventID id, twin::Loc loc = {}) {
        twin_detail::set_flag(twin::cur(), event(), static_cast<int>(id), "TQueSync::SetFlag", loc);
    }
    __aicore__ inline void WaitFlag(TEventID id, twin::Loc loc = {}) {
        twin_detail::wait_flag(twin::cur(), event(), static_cast<int>(id), "TQueSync::WaitFlag", loc);
    }

private:
    static HardEvent event() {
        for (int e = 0; e < static_cast<int>(HardEvent::MAX); ++e) {
            twin::EventPipes p = twin::event_pipes(static_cast<HardEvent>(e));
            if (p.src == twin::pipe_of(src) && p.dst == twin::pipe_of(dst)) return static_cast<HardEvent>(e);
        }
        throw twin::Error("twin: TQueSync with an unsupported pipe pair");
    }
};

// ---- cross-core ordering ----------------------------------------------------------------------------------------
namespace twin_detail {
// What core c has completed and knows at this point, for another core: its vector clock plus its own pipes' epochs
// as known to `pipe` (-1: every pipe, after a PipeBarrier<PIPE_ALL>).
inline std::vector<uint32_t> clock_snapshot(twin::Core& c, int pipe) {
    std::vector<uint32_t> s = c.vc;
    uint32_t* me = &s[static_cast<size_t>(c.agent) * twin::kNumPipes];
    for (int q = 0; q < twin::kNumPipes; ++q)
        me[q] = std::max(me[q], pipe < 0 ? c.clk.epoch[q] : c.clk.known[pipe][q]);
    if (pipe >= 0) me[pipe] = c.clk.epoch[pipe];
    return s;
}
inline void clock_join(std::vector<uint32_t>& into, const std::vector<uint32_t>& s) {
    if (into.size() < s.size()) into.resize(s.size(), 0);
    for (size_t i = 0; i < s.size(); ++i) into[i] = std::max(into[i], s[i]);
}
}  // namespace twin_detail

// SyncAll<isAIVOnly>: a PipeBarrier<PIPE_ALL> and a barrier of all vector cores of the launch (and of the cube cores
// too with isAIVOnly = false; impl/basic_api/dav_c220/kernel_operator_sync_impl.h SyncAllImpl). Every access before
// it on any participant is ordered before every access after it. The data cache is not written back. Its hardware
// implementation takes the cross-core flag ids 11..14 (CrossCoreSetFlag docs, 约束说明).
template <bool isAIVOnly = true>
__aicore__ inline void SyncAll(twin::Loc loc = {}) {
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin::Runtime& r = twin::rt();
    if (isAIVOnly && c.kind == twin::Core::AIC)
        twin::fail_at(loc, "SyncAll", "SyncAll<true> (vector cores only) called on a cube core");
    if (!r.xflag_11_14_site.empty())
        twin::fail_at(loc, "SyncAll",
                      "SyncAll uses the cross-core flag ids 11..14, which the kernel also uses (%s)",
                      r.xflag_11_14_site.c_str());
    if (r.syncall_site.empty()) r.syncall_site = twin::format("SyncAll at %s:%d", twin::base_name(loc.file), loc.line);
    twin::barrier_all(c);
    twin::gm_prune(c);
    twin_detail::clock_join(r.barrier_join, twin_detail::clock_snapshot(c, -1));
    const int participants = static_cast<int>(r.aiv.size() + (isAIVOnly ? 0 : r.aic.size()));
    const uint32_t my = r.gen;
    if (++r.barrier_count == participants) {
        r.barrier_count = 0;
        ++r.gen;
        for (twin::Core* o : r.agents) {
            if (isAIVOnly && o->kind == twin::Core::AIC) continue;
            twin_detail::clock_join(o->vc, r.barrier_join);
            if (o->state == twin::Core::Blocked && o->barrier_gen_wait == my) o->state = twin::Core::Ready;
        }
        r.barrier_join.clear();
    } else {
        c.barrier_gen_wait = my;
        twin::block(twin::format("SyncAll at %s:%d", twin::base_name(loc.file), loc.line));
    }
    twin::yield_point();
}

// CrossCoreSetFlag<modeId, pipe>(flagId) / CrossCoreWaitFlag(flagId), Atlas A2 (docs 同步控制/核间同步: CrossCoreSetFlag,
// CrossCoreWaitFlag, 关键特性说明): every core has 16 flag ids, each a counter of 0..15; a set counts on the waiting
// side once every participant of its mode has set: mode 0 all vector cores (or all cube cores) of the launch, mode 1
// the vector cores of one AI core, mode 2 an AI core's cube core and its vector cores (the cube's set counts on each
// vector core; the vector cores' sets count on the cube once all of them have set). CrossCoreWaitFlag blocks the
// core until its counter is non-zero, then decrements it; on A2 its template arguments have no effect. The set runs
// on `pipe` after the work issued there before it (not PIPE_S / PIPE_ALL), so what the waiter may rely on is what
// that pipe had completed. Errors: modes other than 0 / 1 / 2, ids outside 0..15, a counter above 15, one id used by
// two modes at once on a core, the ids Matmul client objects (0 .. 2N-1) or SyncAll (11..14) take, kernels that are
// not MIX, a deadlock, and sets left unmatched or never waited when the kernel ends.
namespace twin_detail {
inline std::vector<twin::Core*> xflag_group(twin::Core& c, int mode) {
    twin::Runtime& r = twin::rt();
    std::vector<twin::Core*> g;
    if (mode == 0) {
        for (auto& o : (c.kind == twin::Core::AIV ? r.aiv : r.aic)) g.push_back(o.get());
    } else {  // the vector cores of c's AI core
        for (auto& o : r.aiv)
            if (o->aic == c.aic) g.push_back(o.get());
    }
    return g;
}
inline void xflag_count(twin::Core& target, int id, int mode, const std::vector<uint32_t>& snap, uint16_t site,
                        const char* api, const twin::Loc& loc) {
    twin::Core::XFlag& f = target.xflag[id];
    if (!f.pending.empty() && f.mode != mode)
        twin::fail_at(loc, api,
                      "flag id %d of %s is used by mode %d while a mode-%d sync on it is still in flight (a flag id "
                      "may change modes only after every set and wait of the previous mode has run)",
                      id, target.name.c_str(), mode, f.mode);
    if (f.pending.size() >= 15)
        twin::fail_at(loc, api, "the counter of flag id %d on %s would exceed 15 (too many sets not yet waited)", id,
                      target.name.c_str());
    f.mode = mode;
    f.site = site;
    f.pending.push_back(snap);
    if (target.state == twin::Core::Blocked && target.waiting_xflag == id) target.state = twin::Core::Ready;
}
}  // namespace twin_detail

template <uint8_t modeId, pipe_t pipe>
__aicore__ inline void CrossCoreSetFlag(uint16_t flagId, twin::Loc loc = {}) {
    static const char* api = "CrossCoreSetFlag";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin::yield_point();
    twin::Runtime& r = twin::rt();
    if (modeId != 0 && modeId != 1 && modeId != 2)
        twin::fail_at(loc, api, "mode %d is not supported on Atlas A2 (modes 0, 1, 2)", modeId);
    if (pipe == PIPE_S || pipe == PIPE_ALL)
        twin::fail_at(loc, api, "pipe PIPE_S / PIPE_ALL is not allowed (PIPE_V, M, MTE1, MTE2, MTE3, FIX)");
    if (flagId > 15)
        twin::fail_at(loc, api, "flag id %u outside 0..15 (the hardware would keep its low 4 bits)", flagId);
    if (c.declared_type != KERNEL_TYPE_MIX_AIC_1_2 && c.declared_type != KERNEL_TYPE_MIX_AIC_1_1 &&
        c.declared_type != KERNEL_TYPE_MIX_AIV_1_0 && c.declared_type != KERNEL_TYPE_MIX_AIC_1_0)
        twin::fail_at(loc, api, "cross-core sync needs a MIX kernel type (the scheduler is off for AIV_ONLY / AIC_ONLY)");
    if ((modeId == 1 || modeId == 2) && r.ratio == 0)
        twin::fail_at(loc, api, "mode %d needs a MIX 1:1 / 1:2 kernel", modeId);
    if (modeId == 1 && c.kind == twin::Core::AIC) twin::fail_at(loc, api, "mode 1 syncs vector cores only");
    if (static_cast<int>(flagId) < 2 * c.matmul_client_objects)
        twin::fail_at(loc, api,
                      "flag id %u is taken by the Matmul client (%d objects use ids 0..%d; CrossCoreSetFlag docs)",
                      flagId, c.matmul_client_objects, 2 * c.matmul_client_objects - 1);
    if (flagId >= 11 && flagId <= 14) {
        if (!r.syncall_site.empty())
            twin::fail_at(loc, api, "flag id %u is taken by SyncAll (ids 11..14), which the kernel uses (%s)", flagId,
                          r.syncall_site.c_str());
        if (r.xflag_11_14_site.empty())
            r.xflag_11_14_site = twin::format("CrossCoreSetFlag at %s:%d", twin::base_name(loc.file), loc.line);
    }
    const int p = twin::pipe_of(pipe);
    twin::issue(c, p);
    const std::vector<uint32_t> snap = twin_detail::clock_snapshot(c, p);
    const uint16_t site = twin::site_id(api, loc);
    const int id = flagId;
    if (modeId == 2 && c.kind == twin::Core::AIC) {
        for (twin::Core* v : twin_detail::xflag_group(c, 2)) twin_detail::xflag_count(*v, id, 2, snap, site, api, loc);
        return;
    }
    // the participants' sets are collected until each has one; then one count goes to every waiting core
    twin::Core::XSet& mine = c.xset[modeId][id];
    mine.snaps.push_back(snap);
    mine.site = site;
    const std::vector<twin::Core*> group = twin_detail::xflag_group(c, modeId);
    for (twin::Core* o : group)
        if (o->xset[modeId][id].snaps.empty()) return;
    std::vector<uint32_t> joined;
    for (twin::Core* o : group) {
        twin_detail::clock_join(joined, o->xset[modeId][id].snaps.front());
        o->xset[modeId][id].snaps.erase(o->xset[modeId][id].snaps.begin());
    }
    if (modeId == 2) {
        twin_detail::xflag_count(*r.aic[c.aic], id, 2, joined, site, api, loc);
    } else {
        for (twin::Core* o : group) twin_detail::xflag_count(*o, id, modeId, joined, site, api, loc);
    }
}

template <uint8_t modeId = 0, pipe_t pipe = PIPE_S>
__aicore__ inline void CrossCoreWaitFlag(uint16_t flagId, twin::Loc loc = {}) {
    static const char* api = "CrossCoreWaitFlag";
    twin::Core& c = twin::cur();
    twin::api_enter(c);
    twin::yield_point();
    if (flagId > 15)
        twin::fail_at(loc, api, "flag id %u outside 0..15 (the hardware would keep its low 4 bits)", flagId);
    twin::Core::XFlag& f = c.xflag[flagId];
    while (f.pending.empty()) {
        c.waiting_xflag = flagId;
        twin::block(twin::format("CrossCoreWaitFlag(%u) at %s:%d", flagId, twin::base_name(loc.file), loc.line));
    }
    c.waiting_xflag = -1;
    const std::vector<uint32_t>& snap = f.pending.front();
    twin_detail::clock_join(c.vc, snap);
    // this core's own work covered by the sets (its own set, in modes 0 / 1) is complete for all of its pipes now
    const uint32_t* mine = &snap[static_cast<size_t>(c.agent) * twin::kNumPipes];
    for (int q = 0; q < twin::kNumPipes; ++q)
        for (int x = 0; x < twin::kNumPipes; ++x) c.clk.known[q][x] = std::max(c.clk.known[q][x], mine[x]);
    f.pending.erase(f.pending.begin());
}

// ---- atomics of DMA writes to GM (SetAtomicAdd.md: PIPE_S, ordered with the other pipes by hardware) -----------
template <typename T>
__aicore__ inline void SetAtomicAdd() {
    twin::Core& c = twin::cur();
    c.atomic = 1;
    c.atomic_elt = sizeof(T);
    c.atomic_kind = IsSameType<T, float>::value        ? 1
                    : IsSameType<T, half>::value       ? 2
                    : IsSameType<T, int32_t>::value    ? 3
                    : IsSameType<T, int16_t>::value    ? 4
                    : IsSameType<T, bfloat16_t>::value ? 5
                                                       : 0;
}
__aicore__ inline void SetAtomicNone() {
    twin::Core& c = twin::cur();
    c.atomic = 0;
}

// ---- system variables (工具接口/系统资源与变量) --------------------------------------------------------------------
__aicore__ inline int64_t GetBlockIdx() { return twin::cur().block_idx; }
__aicore__ inline int64_t GetBlockNum() { return twin::rt().block_dim; }
__aicore__ inline int64_t GetSubBlockIdx() { return twin::cur().sub_idx; }
__aicore__ inline int64_t GetTaskRatio() { return twin::rt().ratio == 0 ? 1 : twin::rt().ratio; }
__aicore__ inline int64_t GetTaskRation() { return GetTaskRatio(); }  // alias kept by asc-devkit (sys_var_intf_impl)
__aicore__ inline int64_t GetSubBlockNum() { return twin::rt().ratio == 0 ? 1 : twin::rt().ratio; }
__aicore__ inline constexpr int16_t GetDataBlockSizeInBytes() { return ONE_BLK_SIZE; }

// ---- TPipe / TBuf / TQue ---------------------------------------------------------------------------------------
template <TPosition pos>
class TBuf {
public:
    TBuf() = default;
    template <typename T>
    __aicore__ inline LocalTensor<T> Get(uint32_t len, twin::Loc loc = {}) {
        check_init("TBuf::Get", loc);
        const uint64_t bytes = static_cast<uint64_t>(len) * sizeof(T);
        if (len == 0) twin::fail_at(loc, "TBuf::Get", "length 0");
        if (bytes % ONE_BLK_SIZE != 0)
            twin::fail_at(loc, "TBuf::Get", "%llu bytes is not a multiple of 32 bytes",
                          static_cast<unsigned long long>(bytes));
        if (bytes > len_)
            twin::fail_at(loc, "TBuf::Get", "%llu bytes exceed the buffer's %u bytes",
                          static_cast<unsigned long long>(bytes), len_);
        return make<T>(off_, static_cast<uint32_t>(bytes));
    }
    template <typename T>
    __aicore__ inline LocalTensor<T> Get(twin::Loc loc = {}) {
        check_init("TBuf::Get", loc);
        return make<T>(off_, len_);
    }
    // size in elements, bufOffset in bytes (kernel_tbuf_impl.h); the twin also checks the range stays inside the
    // buffer and starts on a 32-byte block, which the real API does not verify.
    template <typename T>
    __aicore__ inline LocalTensor<T> GetWithOffset(uint32_t size, uint32_t bufOffset, twin::Loc loc = {}) {
        check_init("TBuf::GetWithOffset", loc);
        const uint64_t bytes = static_cast<uint64_t>(size) * sizeof(T);
        if (bufOffset % ONE_BLK_SIZE != 0)
            twin::fail_at(loc, "TBuf::GetWithOffset", "offset %u bytes is not 32-byte aligned", bufOffset);
        if (bufOffset + bytes > len_)
            twin::fail_at(loc, "TBuf::GetWithOffset", "[%u, %llu) bytes run past the buffer's %u bytes", bufOffset,
                          static_cast<unsigned long long>(bufOffset + bytes), len_);
        return make<T>(off_ + bufOffset, static_cast<uint32_t>(bytes));
    }
    // twin internals
    void check_init(const char* api, const twin::Loc& loc) const {
        if (core_ == nullptr) twin::fail_at(loc, api, "TBuf used before TPipe::InitBuffer");
        if (core_ != &twin::cur()) twin::fail_at(loc, api, "TBuf of another core");
    }
    template <typename T>
    LocalTensor<T> make(uint64_t off, uint32_t bytes) const {
        LocalTensor<T> t;
        t.addr_ = core_->ub + off;
        t.len_ = bytes;
        t.pos_ = pos;
        t.core_ = core_;
        return t;
    }
    twin::Core* core_ = nullptr;
    uint64_t off_ = 0;
    uint32_t len_ = 0;
};

namespace twin_detail {
inline int next_queue_event_id() {
    static int id = 1000;
    return ++id;
}
}  // namespace twin_detail

// TQue: buffers handed out by AllocTensor, passed from producer to consumer by EnQue/DeQue, returned by FreeTensor;
// the framework inserts the producer->consumer and consumer->producer flags (docs TPipe-TQue 自动同步 table 1).
template <TPosition pos, int32_t depth = 1, auto mask = 0>
class TQue {
public:
    TQue() = default;
    template <typename T>
    __aicore__ inline LocalTensor<T> AllocTensor(twin::Loc loc = {}) {
        check_init("TQue::AllocTensor", loc);
        for (auto& b : bufs_) {
            if (b.state == Buf::Free) {
                if (b.war_pending) {
                    twin_detail::wait_flag(twin::cur(), war_event(), b.war_id, "TQue::AllocTensor", loc);
                    b.war_pending = false;
                }
                b.state = Buf::Owned;
                LocalTensor<T> t;
                t.addr_ = core_->ub + b.off;
                t.len_ = len_;
                t.pos_ = pos;
                t.core_ = core_;
                return t;
            }
        }
        twin::fail_at(loc, "TQue::AllocTensor", "no free buffer in the queue (all %zu allocated)", bufs_.size());
    }
    template <typename T>
    __aicore__ inline bool EnQue(const LocalTensor<T>& t, twin::Loc loc = {}) {
        Buf& b = find(t, "TQue::EnQue", loc);
        if (b.state != Buf::Owned) twin::fail_at(loc, "TQue::EnQue", "tensor is not allocated from this queue");
        b.state = Buf::Queued;
        if (has_raw()) twin_detail::set_flag(twin::cur(), raw_event(), b.raw_id, "TQue::EnQue", loc);
        fifo_.push_back(&b);
        return true;
    }
    template <typename T>
    __aicore__ inline LocalTensor<T> DeQue(twin::Loc loc = {}) {
        check_init("TQue::DeQue", loc);
        if (fifo_.empty()) twin::fail_at(loc, "TQue::DeQue", "queue is empty");
        Buf* b = fifo_.front();
        fifo_.erase(fifo_.begin());
        if (has_raw()) twin_detail::wait_flag(twin::cur(), raw_event(), b->raw_id, "TQue::DeQue", loc);
        b->state = Buf::Owned;
        LocalTensor<T> t;
        t.addr_ = core_->ub + b->off;
        t.len_ = len_;
        t.pos_ = pos;
        t.core_ = core_;
        return t;
    }
    template <typename T>
    __aicore__ inline void FreeTensor(LocalTensor<T>& t, twin::Loc loc = {}) {
        Buf& b = find(t, "TQue::FreeTensor", loc);
        if (b.state != Buf::Owned) twin::fail_at(loc, "TQue::FreeTensor", "tensor is not allocated");
        b.state = Buf::Free;
        if (has_raw()) {
            twin_detail::set_flag(twin::cur(), war_event(), b.war_id, "TQue::FreeTensor", loc);
            b.war_pending = true;
        }
    }
    // twin internals
    struct Buf {
        uint64_t off;
        enum State { Free, Owned, Queued } state;
        int raw_id, war_id;
        bool war_pending;
    };
    static bool has_raw() { return pos == TPosition::VECIN || pos == TPosition::VECOUT; }
    static HardEvent raw_event() { return pos == TPosition::VECIN ? HardEvent::MTE2_V : HardEvent::V_MTE3; }
    static HardEvent war_event() { return pos == TPosition::VECIN ? HardEvent::V_MTE2 : HardEvent::MTE3_V; }
    void check_init(const char* api, const twin::Loc& loc) const {
        if (core_ == nullptr) twin::fail_at(loc, api, "TQue used before TPipe::InitBuffer");
    }
    template <typename T>
    Buf& find(const LocalTensor<T>& t, const char* api, const twin::Loc& loc) {
        check_init(api, loc);
        for (auto& b : bufs_)
            if (core_->ub + b.off == t.addr_) return b;
        twin::fail_at(loc, api, "tensor does not belong to this queue");
    }
    twin::Core* core_ = nullptr;
    std::vector<Buf> bufs_;
    std::vector<Buf*> fifo_;
    uint32_t len_ = 0;
};

class TPipe {
public:
    TPipe() {
        twin::Core& c = twin::cur();
        if (c.pipe_alive) throw twin::Error("twin ERROR: a second TPipe on " + c.name);
        c.pipe_alive = true;
        c.pipe_end = 0;
        c.pipe_obj = this;
        core_ = &c;
    }
    ~TPipe() {
        core_->pipe_alive = false;
        core_->pipe_obj = nullptr;
    }
    TPipe(const TPipe&) = delete;
    TPipe& operator=(const TPipe&) = delete;

    template <TPosition pos>
    __aicore__ inline bool InitBuffer(TBuf<pos>& buf, uint32_t bytes, twin::Loc loc = {}) {
        buf.off_ = take(bytes, "TPipe::InitBuffer(TBuf)", loc);
        buf.len_ = bytes;
        buf.core_ = &twin::cur();
        return true;
    }
    template <TPosition pos, int32_t depth, auto mask>
    __aicore__ inline bool InitBuffer(TQue<pos, depth, mask>& que, uint8_t num, uint32_t len, twin::Loc loc = {}) {
        que.core_ = &twin::cur();
        que.len_ = (len + ONE_BLK_SIZE - 1) / ONE_BLK_SIZE * ONE_BLK_SIZE;
        que.bufs_.clear();
        for (uint8_t i = 0; i < num; ++i) {
            typename TQue<pos, depth, mask>::Buf b;
            b.off = take(len, "TPipe::InitBuffer(TQue)", loc);
            b.state = TQue<pos, depth, mask>::Buf::Free;
            b.raw_id = twin_detail::next_queue_event_id();
            b.war_id = twin_detail::next_queue_event_id();
            b.war_pending = false;
            que.bufs_.push_back(b);
        }
        return true;
    }
    __aicore__ inline void Reset() { twin::cur().pipe_end = 0; }
    __aicore__ inline void Destroy() {}
    template <HardEvent ev>
    __aicore__ inline TEventID AllocEventID() {
        return static_cast<TEventID>(next_event_++ % 8);
    }
    template <HardEvent ev>
    __aicore__ inline void ReleaseEventID(TEventID) {}
    // FetchEventID: an id of `ev` that is not set right now (the caller pairs SetFlag / WaitFlag on it at once).
    __aicore__ inline TEventID FetchEventID(HardEvent ev, twin::Loc loc = {}) {
        for (int id = 0; id < 8; ++id) {
            auto it = core_->flags.find({static_cast<int>(ev), id});
            if (it == core_->flags.end() || !it->second.set) return static_cast<TEventID>(id);
        }
        twin::fail_at(loc, "TPipe::FetchEventID", "every event id of %s is set", twin::event_name(ev).c_str());
    }
    template <HardEvent ev>
    __aicore__ inline TEventID FetchEventID(twin::Loc loc = {}) {
        return FetchEventID(ev, loc);
    }

private:
    uint64_t take(uint32_t bytes, const char* api, const twin::Loc& loc) {
        twin::Core& c = twin::cur();
        const uint64_t aligned = (static_cast<uint64_t>(bytes) + ONE_BLK_SIZE - 1) / ONE_BLK_SIZE * ONE_BLK_SIZE;
        if (c.pipe_end + aligned > c.ub_size)
            twin::fail_at(loc, api, "%u bytes at UB offset %llu exceed the unified buffer (%llu bytes per AIV)", bytes,
                          static_cast<unsigned long long>(c.pipe_end), static_cast<unsigned long long>(c.ub_size));
        const uint64_t at = c.pipe_end;
        c.pipe_end += aligned;
        return at;
    }
    twin::Core* core_ = nullptr;
    uint32_t next_event_ = 0;
};

__aicore__ inline TPipe* GetTPipePtr() { return static_cast<TPipe*>(twin::cur().pipe_obj); }

}  // namespace AscendC

namespace twin {
// End of the launch: every cross-core set matched and waited.
inline void check_xflags_at_end(Runtime& r) {
    for (Core* c : r.agents) {
        for (int id = 0; id < 16; ++id) {
            if (!c->xflag[id].pending.empty())
                throw Error(format("twin ERROR [%s]: %zu CrossCoreSetFlag count(s) of flag id %d (last: %s) never "
                                   "waited by CrossCoreWaitFlag before the kernel returned",
                                   c->name.c_str(), c->xflag[id].pending.size(), id,
                                   site_text(c->xflag[id].site).c_str()));
            for (int m = 0; m < 3; ++m)
                if (!c->xset[m][id].snaps.empty())
                    throw Error(format("twin ERROR [%s]: CrossCoreSetFlag<%d>(%d) (%s) was never matched by the other "
                                       "participants of mode %d before the kernel returned",
                                       c->name.c_str(), m, id, site_text(c->xset[m][id].site).c_str(), m));
        }
    }
}
// End of a core's kernel: nothing may be left in flight.
inline void finish_core(Core& c) {
    for (auto& kv : c.flags) {
        if (kv.second.set && kv.first.second < 1000)
            throw Error(format("twin ERROR [%s]: SetFlag<%s>(%d) at %s never waited before the kernel returned",
                               c.name.c_str(), event_name(static_cast<AscendC::HardEvent>(kv.first.first)).c_str(),
                               kv.first.second, site_text(kv.second.site).c_str()));
    }
    for (auto& kv : c.dcache)
        if (kv.second.dirty)
            throw Error(format("twin ERROR [%s]: scalar GM stores to %s are still in the data cache when the kernel "
                               "returns (DataCacheCleanAndInvalid missing)",
                               c.name.c_str(), gm_describe(kv.first).c_str()));
    c.dcache.clear();
}
}  // namespace twin

#endif  // FUSED_LCE_TWIN_TENSOR_H_
