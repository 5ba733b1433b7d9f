// CPU kernel of fused_lce: tiles of tokens x vocabulary, GEMMs through ATen, one fused elementwise pass per tile.
//
// Forward with gradients (the usual training step, 3 GEMM-equivalents): for each block of nb tokens
//   pass 1: for every vocabulary tile, Z = H_blk @ W_tile^T into a kept row block (nb x V float32), then, while the
//           tile is hot, bias + softcap + max/argmax/sum + exp(z - tile_max) stored in place (rows.h);
//   combine the per-tile statistics of each token in tile order (deterministic) into lse, loss, correct;
//   pass 2: for every tile, dZ = softmax-derived gradient in place, then dX_blk += dZ @ W_tile and
//           dW_tile += dZ^T @ H_blk (float32), db_tile += column sums of dZ. (16-bit weights in one token block:
//           each dW tile is rounded into the 16-bit output as it is made, no V x D float32 accumulator.)
// When the row block does not fit the tile budget, and in backward (lse given), pass 2 recomputes Z per tile
// (4 resp. 3 GEMM-equivalents). Vocabulary tiles of a block are split into one contiguous range per thread
// ("slot"); each slot owns its tiles' rows of dW/db and has its own dX partial, summed in slot order afterwards,
// so results are deterministic for a given thread count. GEMMs inside a slot are single-threaded (ATen runs
// nested parallel regions inline); FUSED_LCE_CPP_PARALLEL=gemm instead runs tiles in order with threaded GEMMs.
// Low precision: the logits must come out float32-exact (the loss is compared with float64 at ~1e-5), so 16-bit
// inputs use 16-bit x 16-bit -> fp32 GEMMs where this machine has exact ones (gemm.h: MKL's, with transposes, or
// ATen's brgemm, row-major only: Z^T = W_tile @ H_blk^T then a transpose in cache), with dZ rounded to 16 bits for
// the dX/dW GEMMs (bfloat16: by the row kernel; float16: scaled by a power of two per tile, undone by the GEMM's
// alpha), accumulated in fp32; elsewhere the tiles of W and H are converted to float32 for float32 GEMMs.
#include "lce_cpu.h"

#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "gemm.h"
#include "rows.h"

namespace fused_lce::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

int64_t env_int(const char* name, int64_t fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  char* end = nullptr;
  long long v = std::strtoll(s, &end, 10);
  return (end != s && v > 0) ? (int64_t)v : fallback;
}

bool gemm_parallel_mode() {
  const char* s = std::getenv("FUSED_LCE_CPP_PARALLEL");
  return s != nullptr && std::strcmp(s, "gemm") == 0;
}

// The tile budget comes from Options (tile_budget_mb / FUSED_LCE_TILE_MB are read once, in Python); 0: default.
int64_t budget_bytes(int64_t tile_bytes) { return tile_bytes > 0 ? tile_bytes : (256LL << 20); }

// FUSED_LCE_CPP_PROFILE=1: per-phase wall and thread-CPU seconds summed over slots, and the call's wall and process
// CPU seconds, printed to stderr per call (tuning aid; on a shared machine CPU time shows what the code costs).
enum Phase { kGemmZ, kRows1, kRows2, kGemmDx, kGemmDw, kConvert, kPhases };
const char* const kPhaseNames[kPhases] = {"gemm_z", "rows1", "rows2", "gemm_dx", "gemm_dw", "convert"};

bool profiling() {
  static const bool on = [] {
    const char* s = std::getenv("FUSED_LCE_CPP_PROFILE");
    return s != nullptr && *s != '\0' && std::strcmp(s, "0") != 0;
  }();
  return on;
}

double cpu_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Prof {
  std::vector<std::array<double, kPhases>> t, c;  // per slot: wall, thread CPU
  double wall0 = 0, cpu0 = 0;
  void reset(int64_t slots) {
    t.assign(slots, {});
    c.assign(slots, {});
    wall0 = wall_seconds();
    cpu0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  }
  void report() const {
    std::array<double, kPhases> sum{}, csum{};
    for (size_t s = 0; s < t.size(); ++s)
      for (int i = 0; i < kPhases; ++i) sum[i] += t[s][i], csum[i] += c[s][i];
    std::fprintf(stderr, "fused_lce cpp profile (slot-seconds wall/cpu):");
    for (int i = 0; i < kPhases; ++i) std::fprintf(stderr, " %s=%.3f/%.3f", kPhaseNames[i], sum[i], csum[i]);
    std::fprintf(stderr, " | call wall=%.3f process-cpu=%.3f\n", wall_seconds() - wall0,
                 cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0);
  }
};

// Adds the wall time of its scope to one phase of one slot when profiling.
class Timed {
 public:
  Timed(Prof& p, int64_t slot, Phase ph) : p_(profiling() ? &p : nullptr), slot_(slot), ph_(ph) {
    if (p_) t0_ = wall_seconds(), c0_ = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
  }
  ~Timed() { stop(); }
  void stop() {
    if (p_) {
      p_->t[slot_][ph_] += wall_seconds() - t0_;
      p_->c[slot_][ph_] += cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - c0_;
    }
    p_ = nullptr;
  }

 private:
  Prof* p_;
  int64_t slot_;
  Phase ph_;
  double t0_ = 0, c0_ = 0;
};

struct Plan {
  int64_t nb = 1;      // tokens per block
  int64_t vb = 1;      // vocabulary rows per tile
  int64_t ntiles = 0;
  int64_t slots = 1;   // contiguous tile ranges processed in parallel (1: tiles in order, threaded GEMMs)
  bool keep = false;   // pass 2 reuses pass 1's row block instead of recomputing it
};

// Token block and vocabulary tile so that the live float32 tiles stay within the budget. With keep_wanted, the
// whole row block (nb x V) is kept when at least min(n, 8) rows fit in 3/4 of the budget.
Plan make_plan(int64_t n, int64_t v, int64_t budget, bool keep_wanted) {
  Plan p;
  const int64_t threads = std::max(1, at::get_num_threads());
  const bool tiles_parallel = !gemm_parallel_mode();
  const int64_t nb_cap = env_int("FUSED_LCE_CPP_NB", tiles_parallel ? 256 : 512);
  const int64_t vb_cap = env_int("FUSED_LCE_CPP_VB", tiles_parallel ? 512 : 4096);
  const int64_t n1 = std::max<int64_t>(n, 1), v1 = std::max<int64_t>(v, 1);
  const int64_t elems = std::max<int64_t>(budget / 4, 1);
  if (keep_wanted) {
    int64_t nb = std::min({n1, nb_cap, elems * 3 / 4 / v1});
    if (nb >= std::min<int64_t>(n1, 8)) {
      p.keep = true;
      p.nb = nb >= 32 ? nb / 16 * 16 : nb;
    }
  }
  int64_t slots = tiles_parallel ? threads : 1;
  if (!p.keep) p.nb = std::min(n1, nb_cap);
  const int64_t rest = p.keep ? std::max<int64_t>(elems - p.nb * v1, 16 * p.nb) : elems;
  const int64_t per_slot = std::max<int64_t>(rest / slots, 1);
  if (!p.keep)
    while (p.nb > 8 && p.nb * 16 > per_slot) p.nb = (p.nb + 1) / 2;
  int64_t vb = std::min({v1, vb_cap, std::max<int64_t>(16, per_slot / p.nb)});
  if (vb < v1 && vb > 16) vb = vb / 16 * 16;
  p.vb = std::max<int64_t>(vb, 1);
  p.ntiles = v > 0 ? (v + p.vb - 1) / p.vb : 0;
  p.slots = std::max<int64_t>(1, std::min(slots, p.ntiles));
  return p;
}

// One flattened problem: inputs, options, plan, per-block scratch, and the passes.
class Runner {
 public:
  Runner(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
         const std::optional<at::Tensor>& bias, const Options& opt, bool keep_wanted)
      : h_(hidden.detach().contiguous()), w_(weight.detach().contiguous()),
        y_(labels.detach().to(at::kLong).contiguous()), opt_(opt),
        rk_(row_kernels()) {
    n_ = h_.size(0);
    d_ = h_.size(1);
    v_ = w_.size(0);
    vs_ = opt.vocab_start;
    low_ = h_.scalar_type() != at::kFloat;
    gemm_ = low_ ? low_gemm_path(h_.scalar_type()) : LowGemm::kConvert;
    g16_ = gemm_ != LowGemm::kConvert && h_.scalar_type() == at::kBFloat16;
    want_zsum_ = opt.with_zsum;
    cap_ = (float)opt.softcap;
    temp_ = (float)opt.temperature;
    want_ez_ = opt.entropy;
    if (bias.has_value() && bias->defined()) {
      bias_f_ = bias->detach().to(at::kFloat).contiguous();
      bias_dtype_ = bias->scalar_type();
    }
    plan_ = make_plan(n_, v_, budget_bytes(opt.tile_bytes), keep_wanted);
    const int64_t nb = plan_.nb, nt = plan_.ntiles;
    tmax_.resize(nb * nt);
    tsum_.resize(nb * nt);
    tzs_.resize(nb * nt);
    if (want_ez_) tez_.resize(nb * nt);
    targ_.resize(nb * nt);
    zt_.resize(nb);
    lse_.resize(nb);
    ca_.resize(nb);
    cb_.resize(nb);
    ct_.resize(nb);
    cu_.resize(nb);
    skip_.resize(nb);
    yb_ = y_.data_ptr<int64_t>();
    auto f32 = h_.options().dtype(at::kFloat);
    if (plan_.keep && nt > 0) keep_ = at::empty({nb * plan_.vb * nt}, f32);
    prof_.reset(plan_.slots);
    for (int64_t s = 0; s < plan_.slots; ++s) {
      if (!plan_.keep) zbuf_.push_back(at::empty({nb * plan_.vb}, f32));
    }
    alloc_gemm_scratch();
  }

  ~Runner() {
    if (profiling()) prof_.report();
  }

  const Plan& plan() const { return plan_; }

  // ---------------------------------------------------------------------------------------------- API
  // Statistics of every token and the gradients of scale * sum_i g_i loss_i, one token block at a time: pass 1,
  // the token's lse from its tile statistics, pass 2 (from the kept tiles when they fit).
  std::pair<StatsOut, GradsOut> fused(const at::Tensor& g, const LossTerms& terms, double scale,
                                      std::array<bool, 3> mask) {
    StatsOut st = new_stats();
    alloc_grads(mask, false);
    const at::Tensor gw = g.to(at::kFloat).contiguous();
    const float* gp = gw.data_ptr<float>();
    float* mp = st.m.data_ptr<float>();
    float* sp = st.s.data_ptr<float>();
    for (int64_t i0 = 0; i0 < n_; i0 += plan_.nb) {
      const int64_t nbk = std::min(plan_.nb, n_ - i0);
      set_block(i0, nbk);
      pass1(i0, nbk);
      at::parallel_for(0, nbk, 64, [&](int64_t r0, int64_t r1) {
        for (int64_t k = r0; k < r1; ++k) {
          write_stats(st, i0, k);
          lse_[k] = mp[i0 + k] + std::log(sp[i0 + k]);
        }
      });
      const float a0 = (float)terms.a0, a1 = (float)terms.a1, t0 = (float)terms.t0, u0 = (float)terms.u0;
      for (int64_t k = 0; k < nbk; ++k) {  // the loss's coefficients: LossTerms at the token's lse
        const float g = gp[i0 + k] * (float)scale;
        ca_[k] = g * (a0 + a1 * lse_[k]);
        cb_[k] = 0.0f;
        ct_[k] = g * t0;
        cu_[k] = g * u0;
        skip_[k] = g == 0.0f;  // ignored token: no gradient
      }
      pass2(i0, nbk, plan_.keep ? (cap_ > 0 ? GradFrom::kLogits : GradFrom::kProb) : GradFrom::kRaw);
    }
    return {st, finish_grads()};
  }

  GradsOut grads(const at::Tensor& lse, const GradCoefs& coef, double scale, std::array<bool, 3> mask,
                 bool fp32_dh) {
    alloc_grads(mask, fp32_dh);
    auto f32 = [](const at::Tensor& t) { return t.defined() ? t.to(at::kFloat).contiguous() : at::Tensor(); };
    const at::Tensor ls = f32(lse), a = f32(coef.a), b = f32(coef.b), t = f32(coef.t), u = f32(coef.u);
    const float* lp = ls.data_ptr<float>();
    const float* ap = a.data_ptr<float>();
    const float* tp = t.data_ptr<float>();
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    const float* up = u.defined() ? u.data_ptr<float>() : nullptr;
    const float sc = (float)scale;
    if (want_dh_ || want_dw_ || want_db_) {
      for (int64_t i0 = 0; i0 < n_; i0 += plan_.nb) {
        const int64_t nbk = std::min(plan_.nb, n_ - i0);
        for (int64_t k = 0; k < nbk; ++k) {
          const int64_t i = i0 + k;
          lse_[k] = lp[i];
          ca_[k] = ap[i] * sc;
          cb_[k] = bp ? bp[i] * sc : 0.0f;
          ct_[k] = tp[i] * sc;
          cu_[k] = up ? up[i] * sc : 0.0f;
          skip_[k] = ca_[k] == 0.0f && ct_[k] == 0.0f && cb_[k] == 0.0f && cu_[k] == 0.0f;
        }
        set_block(i0, nbk);
        pass2(i0, nbk, GradFrom::kRaw);
      }
    }
    return finish_grads();
  }

  StatsOut stats() {
    StatsOut st = new_stats();
    for (int64_t i0 = 0; i0 < n_; i0 += plan_.nb) {
      const int64_t nbk = std::min(plan_.nb, n_ - i0);
      set_block(i0, nbk);
      pass1(i0, nbk);
      for (int64_t k = 0; k < nbk; ++k) write_stats(st, i0, k);
    }
    return st;
  }

 private:
  // ---------------------------------------------------------------------------------------------- helpers
  // The token block's rows of H as the GEMMs want them: as stored (float32, or 16-bit for the MKL path),
  // converted to float32 (convert path), or 16-bit plus its transpose (D x nbk) for the brgemm logits GEMM.
  void set_block(int64_t i0, int64_t nbk) {
    hb_ = h_.narrow(0, i0, nbk);
    if (gemm_ == LowGemm::kBrgemm)
      ht_ = hb_.t().contiguous();
    else if (low_ && gemm_ == LowGemm::kConvert)
      hb_ = hb_.to(at::kFloat);
  }

  // Per-slot scratch of the GEMM path (one tile each): the row kernel's bf16 dZ (16-bit paths; float16: the
  // scaled copy made here), transposes for brgemm, a float32 W tile for the convert path.
  void alloc_gemm_scratch() {
    auto f32 = h_.options().dtype(at::kFloat), b16 = h_.options().dtype(h_.scalar_type());
    const int64_t tile = plan_.nb * plan_.vb;
    for (int64_t s = 0; s < plan_.slots; ++s) {
      if (gemm_ != LowGemm::kConvert) dz16_.push_back(at::empty({tile}, b16));
      if (gemm_ == LowGemm::kBrgemm) {
        ztb_.push_back(at::empty({tile}, f32));
        dzt16_.push_back(at::empty({tile}, b16));
      }
      if (low_ && gemm_ == LowGemm::kConvert) wbuf_.push_back(at::empty({plan_.vb, d_}, f32));
    }
    dz_alpha_.assign(plan_.slots, 1.0f);
  }

  const uint16_t* w16(int64_t v0) const { return static_cast<const uint16_t*>(w_.const_data_ptr()) + v0 * d_; }
  static uint16_t* bits(const at::Tensor& t) { return static_cast<uint16_t*>(t.data_ptr()); }

  // The 16-bit dZ of this slot's tile for the dX/dW GEMMs, and the alpha that undoes its scaling: bfloat16 was
  // written by the row kernel (unscaled); float16 is made here from the float32 dZ (gemm.h: to_half_scaled).
  float dz_16(int64_t slot, int64_t n, int64_t nbk, const at::Tensor& z, bool make) {
    if (g16_) return 1.0f;
    if (make) {
      Timed tm(prof_, slot, kConvert);
      dz_alpha_[slot] = to_half_scaled(z.data_ptr<float>(), nbk, n, n, bits(dz16_[slot]), n);
    }
    return dz_alpha_[slot];
  }

  // z (nbk x n, float32) = H_blk @ W[v0:v0+n]^T. MKL path: straight from the 16-bit operands; brgemm path:
  // Z^T = W_tile @ H_blk^T (both operands row-major as stored), then a transpose in cache. Returns the float32 W
  // tile when one was made (reused by the dX GEMM).
  at::Tensor gemm_logits(int64_t slot, int64_t v0, int64_t n, int64_t nbk, at::Tensor& z) {
    const at::ScalarType dt = h_.scalar_type();
    if (gemm_ == LowGemm::kMkl) {
      Timed tm(prof_, slot, kGemmZ);
      low_gemm(gemm_, dt, false, true, nbk, n, d_, bits(hb_), d_, w16(v0), d_, 1.0f, 0.0f, z.data_ptr<float>(), n);
      return at::Tensor();
    }
    if (gemm_ == LowGemm::kBrgemm) {
      Timed tm(prof_, slot, kGemmZ);
      float* zt = ztb_[slot].data_ptr<float>();
      low_gemm(gemm_, dt, false, false, n, nbk, d_, w16(v0), d_, bits(ht_), nbk, 1.0f, 0.0f, zt, nbk);
      transpose(zt, n, nbk, nbk, z.data_ptr<float>(), n);
      return at::Tensor();
    }
    at::Tensor wt = w_tile(slot, v0, n);
    Timed tm(prof_, slot, kGemmZ);
    at::mm_out(z, hb_, wt.t());
    return wt;
  }

  // dX partial of this slot += dZ @ W_tile
  void gemm_dx(int64_t slot, int64_t v0, int64_t n, int64_t nbk, const at::Tensor& z, at::Tensor wt) {
    if (gemm_ != LowGemm::kConvert) {
      const float alpha = dz_16(slot, n, nbk, z, true);
      Timed tm(prof_, slot, kGemmDx);
      low_gemm(gemm_, h_.scalar_type(), false, false, nbk, d_, n, bits(dz16_[slot]), n, w16(v0), d_, alpha, 1.0f,
               dxp_[slot].data_ptr<float>(), d_);
      return;
    }
    if (!wt.defined()) wt = w_tile(slot, v0, n);
    Timed tm(prof_, slot, kGemmDx);
    dxp_[slot].narrow(0, 0, nbk).addmm_(z, wt);
  }

  // dW[v0:v0+n] (=, on the first block, else +=) dZ^T @ H_blk; with dw_direct_ into this slot's float32 tile,
  // then rounded into the 16-bit output rows
  void gemm_dw(int64_t slot, int64_t v0, int64_t n, int64_t nbk, const at::Tensor& z, bool first) {
    if (dw_direct_) {
      gemm_dw_into(slot, v0, n, nbk, z, true, dwtile_[slot].data_ptr<float>(), dwtile_[slot].narrow(0, 0, n));
      Timed tm(prof_, slot, kConvert);
      dw_.narrow(0, v0, n).copy_(dwtile_[slot].narrow(0, 0, n));
      return;
    }
    gemm_dw_into(slot, v0, n, nbk, z, first, dw_.data_ptr<float>() + v0 * d_, dw_.narrow(0, v0, n));
  }

  // dw / dwt (the same n x D float32 rows, as a pointer and as a tensor) (=, when first, else +=) dZ^T @ H_blk
  void gemm_dw_into(int64_t slot, int64_t v0, int64_t n, int64_t nbk, const at::Tensor& z, bool first, float* dw,
                    at::Tensor dwt) {
    const at::ScalarType dt = h_.scalar_type();
    if (gemm_ == LowGemm::kMkl) {
      const float alpha = dz_16(slot, n, nbk, z, !want_dh_);  // made by gemm_dx when dX is wanted
      Timed tm(prof_, slot, kGemmDw);
      low_gemm(gemm_, dt, true, false, n, d_, nbk, bits(dz16_[slot]), n, bits(hb_), d_, alpha, first ? 0.0f : 1.0f,
               dw, d_);
      return;
    }
    Timed tm(prof_, slot, kGemmDw);
    if (gemm_ == LowGemm::kBrgemm) {
      uint16_t* dzt = bits(dzt16_[slot]);
      transpose(bits(dz16_[slot]), nbk, n, n, dzt, nbk);
      low_gemm(gemm_, dt, false, false, n, d_, nbk, dzt, nbk, bits(hb_), d_, 1.0f, first ? 0.0f : 1.0f, dw, d_);
      return;
    }
    if (first)
      at::mm_out(dwt, z.t(), hb_);
    else
      dwt.addmm_(z.t(), hb_);
  }

  // float32 rows [v0, v0+n) of W: a view, or converted into this slot's buffer
  at::Tensor w_tile(int64_t slot, int64_t v0, int64_t n) {
    at::Tensor wt = w_.narrow(0, v0, n);
    if (!low_) return wt;
    Timed tm(prof_, slot, kConvert);
    at::Tensor buf = wbuf_[slot].narrow(0, 0, n);
    buf.copy_(wt);
    return buf;
  }

  at::Tensor z_tile(int64_t slot, int64_t k, int64_t nbk, int64_t n) const {
    if (plan_.keep) return keep_.narrow(0, k * plan_.nb * plan_.vb, nbk * n).view({nbk, n});
    return zbuf_[slot].narrow(0, 0, nbk * n).view({nbk, n});
  }

  // label as an index into tile [v0, v0+n) of this shard, or -1 (ignored and bad labels carry a token weight of
  // 0 / NaN from the driver, so their target logit is never used)
  int64_t local_label(int64_t y, int64_t v0, int64_t n) const {
    const int64_t l = y - vs_ - v0;
    return (l >= 0 && l < n) ? l : -1;
  }

  // Runs fn(slot, k) for every tile k: slots in parallel, tiles of a slot in order.
  template <class F>
  void for_tiles(const F& fn) const {
    const int64_t slots = plan_.slots, nt = plan_.ntiles;
    auto run_slot = [&](int64_t s) {
      const int64_t k0 = nt * s / slots, k1 = nt * (s + 1) / slots;
      for (int64_t k = k0; k < k1; ++k) fn(s, k);
    };
    if (slots == 1) {
      run_slot(0);
      return;
    }
    at::parallel_for(0, slots, 1, [&](int64_t s0, int64_t s1) {
      // worker threads start with default dispatch state: skip autograd (inputs are detached anyway)
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      for (int64_t s = s0; s < s1; ++s) run_slot(s);
    });
  }

  // ---------------------------------------------------------------------------------------------- pass 1
  void pass1(int64_t i0, int64_t nbk) {
    std::fill(zt_.begin(), zt_.begin() + nbk, 0.0f);
    const bool store_prob = plan_.keep && cap_ == 0.0f && !want_ez_ && temp_ == 1.0f;
    const float* bias = bias_f_.defined() ? bias_f_.data_ptr<float>() : nullptr;
    for_tiles([&](int64_t slot, int64_t k) {
      const int64_t v0 = k * plan_.vb, n = std::min(plan_.vb, v_ - v0);
      at::Tensor z = z_tile(slot, k, nbk, n);
      gemm_logits(slot, v0, n, nbk, z);
      Timed tm(prof_, slot, kRows1);
      float* zp = z.data_ptr<float>();
      at::parallel_for(0, nbk, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          RowStat st{};
          const int64_t lab = local_label(yb_[i0 + r], v0, n);
          rk_.stats(zp + r * n, bias ? bias + v0 : nullptr, n, cap_, 1.0f / temp_, lab, want_zsum_, want_ez_,
                    store_prob, &st);
          const int64_t at = k * plan_.nb + r;
          tmax_[at] = st.max;
          tsum_[at] = st.sumexp;
          tzs_[at] = st.zsum;
          if (want_ez_) tez_[at] = st.ez;
          targ_[at] = v0 + vs_ + st.argmax;
          if (lab >= 0) zt_[r] = st.target;  // exactly one tile holds the label
        }
      });
    });
  }

  // Online-softmax merge of a token's tile statistics, in tile order. EZ (sum e^(z-M) (z-M), with want_ez_):
  // moving a partial sum from max m to M > m gives e^(m-M) (EZ + (m-M) S).
  void reduce_tiles(int64_t r, float& M, float& S, float& ZS, int64_t& arg, float& EZ) const {
    M = -kInf;
    S = 0.0f;
    ZS = 0.0f;
    EZ = 0.0f;
    arg = 0;
    for (int64_t k = 0; k < plan_.ntiles; ++k) {
      const int64_t at = k * plan_.nb + r;
      const float mk = tmax_[at], sk = tsum_[at];
      if (mk > M) {  // strict: the first argmax wins ties
        if (want_ez_) EZ = (M == -kInf ? 0.0f : std::exp(M - mk) * (EZ + (M - mk) * S)) + tez_[at];
        S = S * std::exp(M - mk) + sk;
        M = mk;
        arg = targ_[at];
      } else if (mk != -kInf) {  // an all -inf tile adds nothing (and exp(-inf - -inf) would be NaN)
        if (want_ez_) EZ += std::exp(mk - M) * (tez_[at] + (mk - M) * sk);
        S += sk * std::exp(mk - M);
      }
      ZS += tzs_[at];
    }
  }

  StatsOut new_stats() const {
    auto f32 = h_.options().dtype(at::kFloat);
    return {at::empty({n_}, f32), at::empty({n_}, f32), at::empty({n_}, f32), at::empty({n_}, f32),
            at::empty({n_}, h_.options().dtype(at::kLong)), want_ez_ ? at::empty({n_}, f32) : at::Tensor()};
  }

  // The token's statistics over every tile of this shard into the outputs.
  void write_stats(StatsOut& st, int64_t i0, int64_t r) const {
    float M, S, ZS, EZ;
    int64_t arg;
    reduce_tiles(r, M, S, ZS, arg, EZ);
    st.m.data_ptr<float>()[i0 + r] = M;
    st.s.data_ptr<float>()[i0 + r] = S;
    st.target.data_ptr<float>()[i0 + r] = zt_[r];
    st.zsum.data_ptr<float>()[i0 + r] = ZS;
    st.argmax.data_ptr<int64_t>()[i0 + r] = arg;
    if (want_ez_) st.ez.data_ptr<float>()[i0 + r] = EZ;
  }

  // ---------------------------------------------------------------------------------------------- pass 2
  void alloc_grads(std::array<bool, 3> mask, bool fp32_dh) {
    want_dh_ = mask[0];
    want_dw_ = mask[1];
    want_db_ = mask[2] && bias_f_.defined();
    auto f32 = h_.options().dtype(at::kFloat);
    if (want_dh_) {
      dh_ = at::empty({n_, d_}, fp32_dh ? f32 : h_.options());
      for (int64_t s = 0; s < plan_.slots; ++s) dxp_.push_back(at::empty({plan_.nb, d_}, f32));
    }
    // dW: float32 accumulator (the output itself for float32 weights); written by the first block, so no zeroing.
    // 16-bit weights with one token block: each tile's dW is final after one GEMM, so it goes through a per-slot
    // float32 tile and straight into the 16-bit output (no V x D float32 buffer: peak memory is the gradients).
    dw_direct_ = want_dw_ && low_ && n_ > 0 && n_ <= plan_.nb;
    if (dw_direct_) {
      dw_ = at::empty({v_, d_}, w_.options());
      for (int64_t s = 0; s < plan_.slots; ++s) dwtile_.push_back(at::empty({plan_.vb, d_}, f32));
    } else if (want_dw_) {
      dw_ = n_ > 0 ? at::empty({v_, d_}, f32) : at::zeros({v_, d_}, f32);
    }
    if (want_db_) db_ = at::zeros({v_}, f32);
  }

  void pass2(int64_t i0, int64_t nbk, GradFrom from) {
    const bool first = i0 == 0;
    const float* bias = (from == GradFrom::kRaw && bias_f_.defined()) ? bias_f_.data_ptr<float>() : nullptr;
    // rows of a tile run on one thread when slots run in parallel: db is accumulated in the row kernel then;
    // otherwise rows run in parallel and db is a column sum afterwards
    const bool serial_rows = plan_.slots > 1 || at::get_num_threads() == 1;
    float* db = want_db_ ? db_.data_ptr<float>() : nullptr;
    for_tiles([&](int64_t slot, int64_t k) {
      const int64_t v0 = k * plan_.vb, n = std::min(plan_.vb, v_ - v0);
      at::Tensor z = z_tile(slot, k, nbk, n);
      at::Tensor wt;
      if (from == GradFrom::kRaw) wt = gemm_logits(slot, v0, n, nbk, z);
      uint16_t* z16 = g16_ ? bits(dz16_[slot]) : nullptr;
      if (want_dh_ && k == nt_first(slot)) dxp_[slot].narrow(0, 0, nbk).zero_();
      float* zp = z.data_ptr<float>();
      Timed tm2(prof_, slot, kRows2);
      at::parallel_for(0, nbk, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          float* row = zp + r * n;
          if (skip_[r]) {  // no gradient from this token (ignored)
            std::memset(row, 0, sizeof(float) * n);
            if (z16) std::memset(z16 + r * n, 0, sizeof(uint16_t) * n);
            continue;
          }
          const float lse = lse_[r], a = ca_[r];
          float scale = 0.0f;
          if (from == GradFrom::kProb) scale = a * std::exp(tmax_[k * plan_.nb + r] - lse);
          const int64_t lab = local_label(yb_[i0 + r], v0, n);
          rk_.grad(row, bias ? bias + v0 : nullptr, n, cap_, temp_, lab, from, lse, a, cb_[r], cu_[r], ct_[r],
                   scale, (db && serial_rows) ? db + v0 : nullptr, z16 ? z16 + r * n : nullptr);
        }
      });
      if (db && !serial_rows) db_.narrow(0, v0, n).add_(z.sum(0));
      tm2.stop();
      if (want_dh_) gemm_dx(slot, v0, n, nbk, z, wt);
      if (want_dw_) gemm_dw(slot, v0, n, nbk, z, first);
    });
    if (want_dh_) {
      at::Tensor acc = dxp_[0].narrow(0, 0, nbk);
      for (int64_t s = 1; s < plan_.slots; ++s) acc.add_(dxp_[s].narrow(0, 0, nbk));
      dh_.narrow(0, i0, nbk).copy_(acc);
    }
  }

  int64_t nt_first(int64_t slot) const { return plan_.ntiles * slot / plan_.slots; }

  GradsOut finish_grads() {
    GradsOut g;
    if (want_dh_) {
      if (plan_.ntiles == 0) dh_.zero_();
      g.grad_hidden = dh_;
    }
    if (want_dw_) g.grad_weight = dw_.scalar_type() == w_.scalar_type() ? dw_ : dw_.to(w_.scalar_type());
    if (want_db_) g.grad_bias = db_.scalar_type() == bias_dtype_ ? db_ : db_.to(bias_dtype_);
    return g;
  }

  at::Tensor h_, w_, y_, bias_f_;
  Options opt_;
  const RowKernels& rk_;
  int64_t n_ = 0, d_ = 0, v_ = 0, vs_ = 0;
  bool low_ = false;  // bf16/fp16 inputs
  LowGemm gemm_ = LowGemm::kConvert;  // how 16-bit inputs are multiplied (gemm.h); kConvert: float32 tiles
  bool g16_ = false;  // bf16 inputs on a 16-bit GEMM path: the row kernel writes dZ as bf16 too
  at::Tensor hb_, ht_;  // current token block (see set_block)
  at::ScalarType bias_dtype_ = at::kFloat;
  bool want_zsum_ = false;
  float cap_ = 0, temp_ = 1;
  bool want_ez_ = false;  // the entropy statistic (linear_logprobs)
  Plan plan_;
  const int64_t* yb_ = nullptr;
  std::vector<float> tmax_, tsum_, tzs_, tez_, zt_, lse_;
  std::vector<float> ca_, cb_, ct_, cu_;  // the token block's gradient coefficients (GradCoefs, times scale)
  std::vector<char> skip_;                // ... all 0: the token contributes no gradient
  std::vector<int64_t> targ_;
  at::Tensor keep_;
  Prof prof_;
  std::vector<at::Tensor> zbuf_, wbuf_, dxp_, ztb_, dz16_, dzt16_;
  std::vector<float> dz_alpha_;  // per slot: 1 / scale of its float16 dZ copy
  bool want_dh_ = false, want_dw_ = false, want_db_ = false;
  bool dw_direct_ = false;          // 16-bit dW written tile by tile (one token block)
  std::vector<at::Tensor> dwtile_;  // ... through these per-slot float32 tiles
  at::Tensor dh_, dw_, db_;
};

}  // namespace

// Every size the kernel reads is checked: a short labels / bias / lse / g would be read past its end.
static void check_inputs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                  const std::optional<at::Tensor>& bias) {
  auto dt = hidden.scalar_type();
  TORCH_CHECK(hidden.device().is_cpu() && weight.device().is_cpu() && labels.device().is_cpu(),
              "fused_lce cpp kernel: expected CPU tensors");
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
              "fused_lce cpp kernel: hidden must be float32, bfloat16 or float16, got ", c10::toString(dt));
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && weight.size(1) == hidden.size(1),
              "fused_lce cpp kernel: expected hidden (N, D) and weight (V, D), got ", hidden.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(weight.scalar_type() == dt, "fused_lce cpp kernel: weight must have hidden's dtype");
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == hidden.size(0), "fused_lce cpp kernel: labels must be (N,) = (",
              hidden.size(0), "), got ", labels.sizes());
  TORCH_CHECK(labels.scalar_type() == at::kLong || labels.scalar_type() == at::kInt,
              "fused_lce cpp kernel: labels must be int64 or int32");
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), "fused_lce cpp kernel: bias must be (V,) = (",
                weight.size(0), "), got ", bias->sizes());
    TORCH_CHECK(bias->scalar_type() == dt && bias->device().is_cpu(),
                "fused_lce cpp kernel: bias must be a CPU tensor of hidden's dtype");
  }
}

static void check_per_token(const char* name, const at::Tensor& t, int64_t n) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 1 && t.size(0) == n && t.is_floating_point(),
              "fused_lce cpp kernel: ", name, " must be a floating-point CPU tensor of shape (", n, "), got ",
              t.sizes());
}

static void check_temperature(const Options& opt) {
  TORCH_CHECK(opt.temperature > 0.0 && std::isfinite(opt.temperature) && std::isfinite((float)(1.0 / opt.temperature)),
              "fused_lce cpp kernel: temperature must be a finite value > 0, got ", opt.temperature);
}

StatsOut stats(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
               const std::optional<at::Tensor>& bias, const Options& opt) {
  check_inputs(hidden, weight, labels, bias);
  check_temperature(opt);
  Runner run(hidden, weight, labels, bias, opt, false);
  return run.stats();
}

GradsOut grads(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
               const std::optional<at::Tensor>& bias, const at::Tensor& lse, const GradCoefs& coef, double scale,
               const Options& opt, std::array<bool, 3> mask, bool fp32_grad_hidden) {
  check_inputs(hidden, weight, labels, bias);
  const int64_t n = hidden.size(0);
  check_per_token("lse", lse, n);
  check_per_token("a", coef.a, n);
  check_per_token("t", coef.t, n);
  if (coef.b.defined()) check_per_token("b", coef.b, n);
  if (coef.u.defined()) check_per_token("u", coef.u, n);
  check_temperature(opt);
  Runner run(hidden, weight, labels, bias, opt, false);
  return run.grads(lse, coef, scale, mask, fp32_grad_hidden);
}

std::pair<StatsOut, GradsOut> fused(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                    const std::optional<at::Tensor>& bias, const at::Tensor& g,
                                    const LossTerms& terms, double scale, const Options& opt,
                                    std::array<bool, 3> mask) {
  check_inputs(hidden, weight, labels, bias);
  check_per_token("g", g, hidden.size(0));
  TORCH_CHECK(opt.temperature == 1.0 && !opt.entropy, "fused_lce cpp kernel: the fused pass is the loss's only");
  Runner run(hidden, weight, labels, bias, opt, mask[0] || mask[1] || mask[2]);
  return run.fused(g, terms, scale, mask);
}

std::string describe(int64_t n, int64_t v, int64_t d, bool low_precision, int64_t tile_bytes, bool fused) {
  (void)d;
  const Plan p = make_plan(n, v, budget_bytes(tile_bytes), fused);
  const std::string gemm = !low_precision ? std::string("fp32")
                                          : std::string("bf16:") + low_gemm_name(low_gemm_path(at::kBFloat16)) +
                                                ",fp16:" + low_gemm_name(low_gemm_path(at::kHalf));
  return std::string("isa=") + row_kernels().isa + " parallel=" + (gemm_parallel_mode() ? "gemm" : "tiles") +
         " threads=" + std::to_string(at::get_num_threads()) + " gemm=" + gemm + " nb=" + std::to_string(p.nb) +
         " vb=" + std::to_string(p.vb) + " tiles=" + std::to_string(p.ntiles) + " slots=" + std::to_string(p.slots) +
         " keep=" + (p.keep ? "1" : "0") + " cpu=" + cpu_features_string();
}

}  // namespace fused_lce::cpu
