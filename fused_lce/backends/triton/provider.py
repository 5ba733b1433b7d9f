"""The "triton" provider (see the package docstring for the schedules)."""
from __future__ import annotations

import glob
import math
import os
from typing import Optional

import torch

from ...core import (Coefs, EntropyStats, Grads, LossTerms, Options, Problem, Provider, Stats, Tensors,
                     TokenWeights, device_name, file_digest)
from . import kernels
from .cublas import _dw_into, _dx_into, _logits32
from .planner import (FULL_RATE_ROWS, _free_bytes, _interpreting, _live_order, _live_order_device, _pad,
                      compact_mode, gemm_path_reason, plan_token_chunk, plan_vocab_chunk, skip_dead_rows)

# GPU architectures (compute capability) the CUDA suite (`pytest -m cuda`) has run the kernels on: an H200
# (sm_90, also the H100's). Elsewhere the provider passes the first-use self-check (fused_lce.core.selfcheck)
# before it is used.
VERIFIED_ARCHS = {(9, 0): "NVIDIA H200"}

kgemm, krows = kernels.gemm, kernels.rows
_launch = kernels.tile_rows.launch if kernels.tile_rows is not None else None


def _dz_view(z, dtype):
    """The gradient tile written in place over the (contiguous) float32 logits tile, in the input dtype: row r
    of dz is the first half of row r of z (row stride 2 * cols)."""
    return z if dtype == torch.float32 else z.view(dtype)[:, : z.shape[1]]


def _live_rows(h, live):
    """(hidden rows for the GEMM, order, count): ``live`` = (order, device count) gathers the rows ``order``;
    None keeps ``h`` (every row computed)."""
    order, count = live if live is not None else (None, None)
    return (h if order is None else h.index_select(0, order)), order, count


def _new_stats(n, dev, entropy: bool = False):
    """Statistics buffers: a ``Stats``, or an ``EntropyStats`` (the entropy sum ``ez`` too)."""
    f = torch.empty(5 if entropy else 4, n, device=dev, dtype=torch.float32).unbind(0)  # one allocation
    st = Stats(f[0], f[1], f[2], f[3], torch.empty(n, device=dev, dtype=torch.int64))
    return EntropyStats(*st, f[4]) if entropy else st


def _cast(x: torch.Tensor, dtype: torch.dtype, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """``(x * scale).to(dtype)`` in one pass (the fused kernel where it runs, else torch)."""
    if scale is None and x.dtype == dtype:
        return x
    if krows is not None and x.is_contiguous() and (x.is_cuda or _interpreting()):
        return krows.scale_cast(x, dtype, None if scale is None else scale.to(torch.float32).reshape(()))
    return (x.mul_(scale) if scale is not None else x).to(dtype)


class _State:
    """Provider-private part of a Grads: fp16 post-scaling and the dW accumulator mode."""

    def __init__(self, post_scale: bool, host_alpha: bool):
        # fp16: dz written unscaled (its range), the scale applied to the products
        self.post_scale = post_scale
        # ... as cuBLAS's alpha (read on the host; float32, before the fp16 rounding), else (CUDA-graph
        # capture, compact mode, float32 dX) on float32 results at the end
        self.host_alpha = post_scale and host_alpha
        self.alpha: Optional[float] = None
        # a scale of 0 / inf / NaN: multiplied in at the end (0 * NaN stays NaN, as elsewhere)
        self.late = False
        self.dw_acc: Optional[bool] = None  # decided by the first token block: float32 accumulator or direct
        self._scale = None  # the loss scale (a device tensor) until product_alpha reads it

    @property
    def fp32_results(self) -> bool:
        return self.post_scale and not self.host_alpha

    def defer_scale(self, scale) -> None:
        if self.host_alpha and self.alpha is None and not self.late:
            self._scale = scale

    def take_scale(self, a: Optional[float]) -> None:
        """The scale as a host number (``TokenWeights.scale_of_count``): ``product_alpha`` then reads
        nothing."""
        if self.host_alpha and a is not None:
            self.alpha, self.late = (a, False) if a != 0.0 and math.isfinite(a) else (None, True)

    def product_alpha(self) -> float:
        """The alpha of the gradient products, the scale read on the host once. The one-pass loss reads it
        right after the live-row count's synchronisation, before its first GEMM is queued: the read waits for
        nothing."""
        if self._scale is not None:
            a, self._scale = float(self._scale), None
            self.alpha, self.late = (a, False) if a != 0.0 and math.isfinite(a) else (None, True)
        return 1.0 if self.alpha is None else self.alpha


class _ExpCache(tuple):
    """What ``stats(keep=True)`` of the gemm path leaves for ``grads``: (exp tiles [nc, V], tile maxima)."""


# ---------------------------------------------------------------------------------------------- provider
class TritonProvider(Provider):
    name = "triton"
    device_types = ("cuda",)
    grads_scaled = True
    supports_logprobs = True  # temperature and entropy on the cuBLAS path's row kernel (docs/providers.md)

    def needs_check(self, device: torch.device) -> Optional[str]:
        if device.type != "cuda":  # the interpreter on CPU tensors (tests)
            return None
        cap = torch.cuda.get_device_capability(device)
        if cap in VERIFIED_ARCHS:
            return None
        return f"the CUDA suite has not run on sm_{cap[0]}{cap[1]} ({device_name(device)})"

    def check_id(self, device: torch.device) -> str:
        import triton

        here = os.path.dirname(os.path.abspath(__file__))
        sources = sorted(glob.glob(os.path.join(here, "*.py"))
                         + glob.glob(os.path.join(here, "kernels", "*.py")))
        cap = torch.cuda.get_device_capability(device)
        return (f"kernels {file_digest(sources)}|triton {triton.__version__}|torch {torch.__version__} cuda "
                f"{torch.version.cuda}|sm_{cap[0]}{cap[1]}|{device_name(device)}")

    def unavailable_reason(self) -> Optional[str]:
        if kernels.ERROR is not None:
            return f"the Triton kernels are not importable ({kernels.ERROR})"
        if not torch.cuda.is_available():
            return "no CUDA device is visible to torch"
        return None

    @property
    def has_fused(self) -> bool:  # the compact schedule has no one-pass kernel
        return not compact_mode()

    # -- path / planning / buffers ------------------------------------------------------------------------
    @staticmethod
    def path_reason(t: Tensors, opts: Options) -> Optional[str]:
        """None when the fused-GEMM path runs these tensors, else why the cuBLAS path does."""
        h, w = t.hidden, t.weight
        return gemm_path_reason(h.dtype, h.shape[1], h.device, opts, (h.data_ptr(), w.data_ptr()))

    @staticmethod
    def _cfg(d: int):
        return kgemm.default_config(d)

    @classmethod
    def _row_bytes(cls, v: int, d: int, elt: int, opts: Options, gemm: bool) -> int:
        if not gemm:
            return 4 * _pad(v, 32)
        tiles = kgemm.num_tiles_n(v, cls._cfg(d))
        return elt * _pad(v, 64) + tiles * (12 + 4 * opts.wants_zsum + 4 * bool(opts.entropy))

    def token_block(self, p: Problem, keep: bool) -> int:
        if compact_mode():
            return max(p.n, 1)
        gemm = gemm_path_reason(p.dtype, p.d, p.device, p.opts) is None
        # linear_logprobs' backward (keep False) also gets the final dW's room: its blocks free their buffer
        # before finish allocates dW, as the one-pass loss's chunks do
        want_dw = p.mask[1] and (keep or p.op == "logprobs")
        row = self._row_bytes(p.v, p.d, p.dtype.itemsize, p.opts, gemm)
        if gemm and not keep and not any(p.mask):  # statistics only: the STATS epilogue stores no logit; the
            # rows are gathered (a copy of the hidden row)
            row += p.dtype.itemsize * (p.d - _pad(p.v, 64))
        # full-rate chunks only where the plan counts the float32 dW accumulator that several chunks need
        full = FULL_RATE_ROWS if gemm and (want_dw or not p.mask[1]) else 0
        rows, _ = plan_token_chunk(p.n, p.v, p.d, p.dtype.itemsize, want_dw, False, p.opts.tile_bytes,
                                   _free_bytes(p.device), row, full)
        return rows

    def new_grads(self, t: Tensors, mask, fp32_dh: bool, scaled: bool = False) -> Grads:
        h, w = t.hidden, t.weight
        capturing = h.is_cuda and torch.cuda.is_current_stream_capturing()
        st = _State(scaled and h.dtype == torch.float16, not (capturing or fp32_dh or compact_mode()))
        f32 = torch.float32
        dh_dtype = f32 if (fp32_dh or st.fp32_results or compact_mode()) else h.dtype
        dh = torch.empty(h.shape, device=h.device, dtype=dh_dtype) if mask[0] else None
        if dh is not None and (h.shape[0] == 0 or w.shape[0] == 0):
            dh.zero_()
        db = torch.zeros(w.shape[0], device=w.device, dtype=f32) if mask[2] and t.bias is not None else None
        return Grads(dh, None, db, fp32_dh, extra=(st, bool(mask[1])))

    def finish(self, t: Tensors, out: Grads, scale):
        st, want_dw = out.extra
        h, w = t.hidden, t.weight
        dh, dw, db = out.dh, out.dw, out.db
        if want_dw and dw is None:  # no tokens: nothing was written
            dw = torch.zeros(w.shape, device=w.device, dtype=w.dtype)
        post = scale if (st.fp32_results or st.late) and scale is not None else None
        late = post if st.late else None  # results in the input dtype, their scale not yet applied
        if dh is not None:
            if out.fp32_dh:
                dh = dh.mul_(post) if post is not None else dh
            else:
                dh = (_cast(dh, h.dtype, post) if dh.dtype == torch.float32
                      else (dh if late is None else dh.mul_(late)))
        if dw is not None:  # one pass: float32 accumulator (times the fp16 scale) -> weight dtype
            dw = (_cast(dw, w.dtype, post) if dw.dtype == torch.float32
                  else (dw if late is None else dw.mul_(late)))
        if db is not None:
            db = (db.mul_(post) if post is not None else db).to(t.bias.dtype)
        return dh, dw, db

    # -- kernels ---------------------------------------------------------------------------------------------
    def stats(self, t: Tensors, rows: slice, opts: Options, keep: bool):
        h = t.hidden[rows]
        nc = h.shape[0]
        v = t.weight.shape[0]
        gemm = self.path_reason(t, opts) is None
        perm = None
        if v and nc and not keep and gemm:
            perm = _live_order_device(t.labels[rows] != opts.ignore_index)
        if perm is None:
            return self._stats(t, rows, opts, keep, gemm)
        # the driver reads no statistic of an ignored token: the others are gathered to the front and the GEMM
        # computes their row tiles only, counting them on the device (no host synchronisation)
        return self._stats(t, rows, opts, False, gemm, live=perm)

    def _stats(self, t: Tensors, rows: slice, opts: Options, keep: bool, gemm: bool, live=None):
        """``gemm``: the fused-GEMM path runs (``path_reason`` is None). ``live``: (order, count) of that
        path's live rows, or None for all rows. The GEMMs then take the rows ``order`` (``count`` of them
        computed, a device integer); the combine kernel writes token order and neutral statistics for the
        others, and the label's logit is taken in token order."""
        h = t.hidden[rows]
        nc = h.shape[0]
        v = t.weight.shape[0]
        raw = _new_stats(nc, h.device, opts.entropy)
        if v == 0:
            raw.m.fill_(-math.inf), raw.s.zero_(), raw.target.zero_(), raw.zsum.zero_(), raw.argmax.zero_()
            if opts.entropy:
                raw.ez.zero_()
            return raw, None
        if compact_mode():
            if gemm:
                self._compact_stats_gemm(t, rows, opts, raw, live)
                return raw, None
            cols = plan_vocab_chunk(t.hidden.shape[0], v, t.hidden.shape[1], t.hidden.element_size(),
                                    (False, False, False), opts.tile_bytes)
            buf = torch.empty(nc * _pad(min(cols, v), 32), device=h.device, dtype=torch.float32)
            for v0 in range(0, v, cols):
                v1 = min(v0 + cols, v)
                z = buf[: nc * _pad(v1 - v0, 32)].view(nc, _pad(v1 - v0, 32))[:, : v1 - v0]
                _logits32(h, t.weight[v0:v1], z)
                _launch(t, opts, z, rows, stats=raw, merge=v0 > 0, v0=v0, v1=v1)
            return raw, None
        if gemm:
            hg, order, count = _live_rows(h, live)
            cfg = self._cfg(h.shape[1])
            ntiles = kgemm.num_tiles_n(v, cfg)
            tiles = kgemm.TileStats.new(nc, ntiles, h.device, opts.wants_zsum, opts.entropy)
            keep = keep and not opts.entropy  # the entropy's gradient term needs z itself: recomputed (DZ)
            e = None
            if keep:
                e = torch.empty(nc, _pad(v, 64), device=h.device, dtype=h.dtype)[:, :v]
            inv_t = 1.0 / opts.temperature
            kgemm.lce_gemm(kgemm.MODE_EXP if keep else kgemm.MODE_STATS, hg, t.weight, e, cfg, bias=t.bias,
                           tiles=tiles, smooth=opts.wants_zsum, inv_temp=inv_t, live=count)
            krows.target_logit(h, t.weight, t.bias, t.labels[rows], opts.vocab_start, raw.target, inv_t)
            krows.combine(tiles, ntiles, raw.m, raw.s, raw.zsum, raw.argmax, col_off=opts.vocab_start,
                          ez=raw.ez if opts.entropy else None, rows_out=order, count=count)
            return raw, (_ExpCache((e, tiles.m)) if keep else None)
        z = torch.empty(nc, _pad(v, 32), device=h.device, dtype=torch.float32)[:, :v]
        _logits32(h, t.weight, z)
        _launch(t, opts, z, rows, stats=raw)
        return raw, (z if keep else None)

    def grads(self, t: Tensors, rows: slice, lse, coef: Coefs, scale, opts: Options, out: Grads,
              cache=None) -> None:
        st, _ = out.extra
        kscale = None if (scale is None or st.post_scale) else scale.to(torch.float32).reshape(())
        st.defer_scale(scale)
        coef = Coefs(*(None if x is None else x.to(torch.float32).contiguous() for x in coef))
        h = t.hidden[rows]
        v = t.weight.shape[0]
        if compact_mode():
            self._compact_grads(t, rows, lse, coef, kscale, scale, opts, out)
            return
        whole = rows.start == 0 and rows.stop == t.hidden.shape[0]
        dh = None if out.dh is None else out.dh[rows]
        if self.path_reason(t, opts) is None:
            cfg = self._cfg(h.shape[1])
            if isinstance(cache, _ExpCache):
                dz, tile_m = cache
                krows.dz_from_exp(dz, tile_m, cfg.bn, lse, (coef.a, coef.t, coef.u), kscale, t.labels[rows],
                                  opts.vocab_start)
                self._token_gemms(t, h, dz, out, whole, dh)
                return
            # recompute: the DZ epilogue over the live rows only (a token whose coefficients are all 0 has no
            # gradient), gathered to the front. The lse and the coefficients travel as one block: one gather
            # for all (the device waits through every small op before this GEMM) a and t without entropy are
            # views of the same numbers: they share one row
            key = lambda x: (x.data_ptr(), x.stride(), x.shape)  # noqa: E731
            fields = {key(x): x for x in coef if x is not None}
            blk = torch.stack([lse.to(torch.float32), *fields.values()])
            live = blk[1:].ne(0).any(0)  # a NaN coefficient is not 0: its row stays (it poisons)
            y = t.labels[rows]
            idx = None
            perm = _live_order(live)
            if perm is not None:
                idx, _ = perm
                h, y, blk = h.index_select(0, idx), y.index_select(0, idx), blk.index_select(1, idx)
                if dh is not None:
                    dh.zero_()  # the rows of dead tokens
            lse, rows_of = blk[0], dict(zip(fields, blk[1:]))
            coef = Coefs(*(None if x is None else rows_of[key(x)] for x in coef))
            if h.shape[0]:
                dz = torch.empty(h.shape[0], _pad(v, 64), device=h.device, dtype=h.dtype)[:, :v]
                self._dz_gemm(h, t.weight, t.bias, dz, y, lse, coef, kscale, opts, 0)
                self._token_gemms(t, h, dz, out, whole, dh, idx)
            return
        z = cache
        if z is None:
            z = torch.empty(h.shape[0], _pad(v, 32), device=h.device, dtype=torch.float32)[:, :v]
            _logits32(h, t.weight, z)
        dz = _dz_view(z, h.dtype)
        _launch(t, opts, z, rows, grad=True, dz=dz, coef=coef, scale=kscale, lse=lse)
        self._token_gemms(t, h, dz, out, whole, dh)

    def fused(self, t: Tensors, weights: TokenWeights, terms: LossTerms, opts: Options, out: Grads) -> Stats:
        st, want_dw = out.extra
        h, w = t.hidden, t.weight
        n, v = h.shape[0], w.shape[0]
        raw = _new_stats(n, h.device)
        if self.path_reason(t, opts) is None:
            if v == 0:  # an empty vocabulary: every logit is absent (dX was zeroed, dW is empty)
                raw.m.fill_(-math.inf), raw.s.zero_(), raw.target.zero_(), raw.zsum.zero_(), \
                    raw.argmax.zero_()
                return raw
            self._fused_gemm(t, weights, terms, opts, out, raw)
            return raw
        g, kscale = self._weights(weights, st)
        # read now, before anything is queued (this path has no live-row count to wait for)
        st.product_alpha()
        nrows, _ = plan_token_chunk(n, v, h.shape[1], h.element_size(), want_dw, st.fp32_results,
                                    opts.tile_bytes, _free_bytes(h.device),
                                    self._row_bytes(v, h.shape[1], h.element_size(), opts, False))
        vp = _pad(v, 32)
        buf = torch.empty(min(nrows, n) * vp, device=h.device, dtype=torch.float32)
        z = dz = None  # no tokens: no chunk
        for i0 in range(0, n, nrows):
            rows = slice(i0, min(i0 + nrows, n))
            nc = rows.stop - rows.start
            z = buf[: nc * vp].view(nc, vp)[:, :v]
            _logits32(h[rows], w, z)
            dz = _dz_view(z, h.dtype)
            _launch(t, opts, z, rows, stats=Stats(*(x[rows] for x in raw)), grad=True, dz=dz, g=g[rows],
                    terms=terms, scale=kscale)
            self._token_gemms(t, h[rows], dz, out, nc == n, None if out.dh is None else out.dh[rows])
        del buf, z, dz  # free the logits buffer before the final dW is allocated (finish)
        return raw

    @staticmethod
    def _weights(weights: TokenWeights, st: _State):
        """(g, the kernels' scale): the token weights formed now; fp16 takes the scale in the products
        instead."""
        g, scale = weights.get()
        st.defer_scale(scale)
        return g, None if st.post_scale else scale.to(torch.float32).reshape(())

    def _fused_gemm(self, t: Tensors, weights: TokenWeights, terms: LossTerms, opts: Options, out: Grads,
                    raw: Stats) -> None:
        """The one-pass loss on the fused-GEMM path. Tokens with a gradient (``weights.live``) are gathered to
        the front: they go through the EXP epilogue, ``dz`` and the two gradient products in token chunks. An
        ignored token costs no logit: its statistics are not read. The token weights are formed after the
        first GEMM's launch (up to there the device waits for the host), except in fp16 when the products'
        scale does not come from the live count (``TokenWeights.scale_of_count``): then before the count's
        synchronisation."""
        st, want_dw = out.extra
        h, w, y = t.hidden, t.weight, t.labels
        (n, d), v = h.shape, w.shape[0]
        cfg = self._cfg(d)
        smooth = opts.wants_zsum
        ntiles = kgemm.num_tiles_n(v, cfg)
        # launched after the first GEMM (the device waits for nothing else when it starts a step)
        late = [lambda: krows.target_logit(t.hidden, w, t.bias, t.labels, opts.vocab_start, raw.target)]
        # the live rows (a bad label's token is live: its weight NaN poisons its gradient); the others'
        # statistics are left unset (the driver masks them out of every output) what the plan needs besides
        # the count is read before the count's synchronisation: from there on the device waits for the host,
        # so only the first GEMM's inputs come before its launch
        row_bytes, free = self._row_bytes(v, d, h.element_size(), opts, True), _free_bytes(h.device)
        g = kscale = None
        # fp16: the scale is cuBLAS's alpha, a host number. From the live count when it depends on nothing
        # else; else formed first and read on the host right after the count's synchronisation (nothing else
        # queued)
        by_count = weights.scale_of_count if skip_dead_rows() else None
        if st.host_alpha and by_count is None:
            g, kscale = self._weights(weights, st)
        perm = _live_order(weights.live)
        if st.host_alpha and by_count is not None:
            st.take_scale(by_count(n if perm is None else perm[1]))
            if st.alpha is None and not st.late:  # no host value (a count above 2**24)
                g, kscale = self._weights(weights, st)
        st.product_alpha()
        idx, count = perm if perm is not None else (None, n)
        if idx is not None:
            h = h.index_select(0, idx)
            free = None if free is None else free - h.numel() * h.element_size()  # read before this copy
        nrows, _ = plan_token_chunk(count, v, d, h.element_size(), want_dw, st.fp32_results, opts.tile_bytes,
                                    free, row_bytes, FULL_RATE_ROWS)
        # one chunk of gathered rows: dX is written over the gathered hidden rows once dW has read them and
        # scattered into a dX allocated after the logits buffer is freed (the peak: that buffer, dW, those
        # rows)
        lazy = idx is not None and nrows >= count and out.dh is not None and out.dh.dtype == h.dtype
        dh_dtype = None
        if lazy:
            dh_dtype, out.dh = out.dh.dtype, None
        elif idx is not None and out.dh is not None:
            late.append(out.dh.zero_)  # the rows of ignored tokens (before the first dX is scattered)
        vp = _pad(v, 64)
        rows = min(nrows, count)
        buf = torch.empty(rows * vp, device=h.device, dtype=h.dtype)
        tiles = kgemm.TileStats.new(rows, ntiles, h.device, smooth)
        z = lse = None
        for i0 in range(0, count, nrows):
            r = slice(i0, min(i0 + nrows, count))
            nc = r.stop - r.start
            z = buf[: nc * vp].view(nc, vp)[:, :v]
            tl_ = tiles.rows(nc)
            kgemm.lce_gemm(kgemm.MODE_EXP, h[r], w, z, cfg, bias=t.bias, tiles=tl_, smooth=smooth)
            if i0 == 0:
                if g is None:
                    g, kscale = self._weights(weights, st)
                lse = torch.empty(count, device=h.device, dtype=torch.float32)
                if idx is not None:
                    y, g = y.index_select(0, idx), g.index_select(0, idx)
            while late:
                late.pop(0)()
            # statistics straight into token order (rows idx[r]), the lse in the gathered order for dz
            sr = (lambda x: x) if idx is not None else (lambda x: x[r])  # noqa: E731
            krows.combine(tl_, ntiles, sr(raw.m), sr(raw.s), sr(raw.zsum), sr(raw.argmax),
                          col_off=opts.vocab_start, lse=lse[r], rows_out=None if idx is None else idx[r])
            krows.dz_from_exp(z, tl_.m, cfg.bn, lse[r], g[r], kscale, y[r], opts.vocab_start, terms=terms)
            # the tile statistics, labels, weights and lse are read (stream order keeps them until then);
            # with one chunk, not alive at the products' peak
            if r.stop == count:
                tiles = tl_ = y = g = lse = None
                weights.release()
            if lazy:
                self._token_gemms(t, h, z, out, True, None)  # dW (and db): the last read of h
                _dx_into(z, w, h, alpha=st.product_alpha())
                continue
            dh = None if out.dh is None else (out.dh if idx is not None else out.dh[r])
            self._token_gemms(t, h[r], z, out, nc == count, dh, None if idx is None else idx[r])
        del buf, z  # free the logits buffer before the final dW is allocated (finish)
        if count == 0 and g is None:  # no live token: no GEMM ran
            self._weights(weights, st)
        while late:
            late.pop(0)()
        if lazy:
            out.dh = torch.zeros((n, d), device=h.device, dtype=dh_dtype).index_copy_(0, idx, h)

    # -- GEMMs -----------------------------------------------------------------------------------------------
    def _dz_gemm(self, h, w, bias, dz, labels, lse, coef: Coefs, kscale, opts: Options, v0: int) -> None:
        """dz of columns [v0, v0 + w.shape[0]) straight from the logits GEMM's epilogue (the lse is known)."""
        kgemm.lce_gemm(kgemm.MODE_DZ, h, w, dz, self._cfg(h.shape[1]), bias=bias, labels=labels,
                       label_off=opts.vocab_start + v0, lse=lse, a=coef.a, t=coef.t, b=coef.b, u=coef.u,
                       scale=kscale, inv_temp=1.0 / opts.temperature)

    def _token_gemms(self, t: Tensors, h_c, dz, out: Grads, whole: bool, dh, dh_index=None) -> None:
        """Gradients of one token chunk (hidden rows ``h_c``, logits gradient ``dz``): dX rows into ``dh``
        (rows ``dh_index`` of it when given, the chunk's rows gathered from there), dW (and db) accumulated.
        ``whole``: this chunk holds every token with a gradient (dW is written once, in the weight dtype)."""
        st, want_dw = out.extra
        alpha = st.product_alpha()  # the fp16 loss scale, inside the products (else 1)
        if dh is not None:
            if dh_index is None:
                _dx_into(dz, t.weight, dh, alpha=alpha)
            else:
                tmp = torch.empty(h_c.shape, device=h_c.device, dtype=dh.dtype)
                _dx_into(dz, t.weight, tmp, alpha=alpha)
                dh.index_copy_(0, dh_index, tmp)
                del tmp  # before dW is allocated
        if want_dw:
            if st.dw_acc is None:  # first chunk: one chunk of every token needs no accumulator
                st.dw_acc = not whole or st.fp32_results
                dtype = torch.float32 if st.dw_acc else t.weight.dtype
                out.dw = torch.empty(t.weight.shape, device=t.weight.device, dtype=dtype)
                _dw_into(dz, h_c, out.dw, accumulate=False, alpha=alpha)
            else:
                _dw_into(dz, h_c, out.dw, accumulate=True, alpha=alpha)
        if out.db is not None:
            out.db.add_(dz.sum(dim=0, dtype=torch.float32), alpha=alpha)

    def _compact_cols(self, t: Tensors, n: int, mask, opts: Options, gemm: bool) -> int:
        h, w = t.hidden, t.weight
        cols = plan_vocab_chunk(n, w.shape[0], h.shape[1], h.element_size(), mask, opts.tile_bytes,
                                buf_elt=h.element_size() if gemm else 4)
        if gemm and not opts.tile_bytes:
            cols = max(self._cfg(h.shape[1]).bn, cols)
        return cols

    def _compact_stats_gemm(self, t: Tensors, rows: slice, opts: Options, raw: Stats, live=None) -> None:
        """Statistics over vocabulary chunks from the STATS epilogue (no logits stored), merged left to right
        (``live``: (order, count) as in ``_stats``)."""
        h, w = t.hidden[rows], t.weight
        n, v = h.shape[0], w.shape[0]
        hg, order, count = _live_rows(h, live)
        cfg = self._cfg(h.shape[1])
        cols = self._compact_cols(t, n, (True, True, False), opts, True)
        ntiles = kgemm.num_tiles_n(min(cols, v), cfg)
        tiles = kgemm.TileStats.new(n, ntiles, h.device, opts.wants_zsum, opts.entropy)
        inv_t = 1.0 / opts.temperature
        for v0 in range(0, v, cols):
            v1 = min(v0 + cols, v)
            kgemm.lce_gemm(kgemm.MODE_STATS, hg, w[v0:v1], None, cfg,
                           bias=None if t.bias is None else t.bias[v0:v1], tiles=tiles,
                           smooth=opts.wants_zsum, inv_temp=inv_t, live=count)
            krows.combine(tiles, kgemm.num_tiles_n(v1 - v0, cfg), raw.m, raw.s, raw.zsum, raw.argmax,
                          col_off=opts.vocab_start + v0, merge=v0 > 0, ez=raw.ez if opts.entropy else None,
                          rows_out=order, count=count)
        krows.target_logit(h, w, t.bias, t.labels[rows], opts.vocab_start, raw.target, inv_t)

    def _compact_grads(self, t: Tensors, rows: slice, lse, coef: Coefs, kscale, scale, opts: Options,
                       out: Grads) -> None:
        """Per vocabulary chunk: dz (again), dW_c = dz.T @ h written once (complete), dX += dz @ W_c
        (float32)."""
        st, want_dw = out.extra
        h, w = t.hidden[rows], t.weight
        n, v = h.shape[0], w.shape[0]
        gemm = self.path_reason(t, opts) is None
        mask = (out.dh is not None, want_dw, out.db is not None)
        cols = self._compact_cols(t, n, mask, opts, gemm)
        if want_dw and out.dw is None:
            out.dw = torch.empty(w.shape, device=w.device, dtype=w.dtype)
        if out.dh is not None:
            out.dh[rows].zero_()
        if gemm:
            buf = torch.empty(n * _pad(min(cols, v), 64), device=h.device, dtype=h.dtype)
        else:
            buf = torch.empty(n * _pad(min(cols, v), 32), device=h.device, dtype=torch.float32)
        post = st.post_scale and scale is not None
        for v0 in range(0, v, cols):
            v1 = min(v0 + cols, v)
            if gemm:
                vp = _pad(v1 - v0, 64)
                dz = buf[: n * vp].view(n, vp)[:, : v1 - v0]
                self._dz_gemm(h, w[v0:v1], None if t.bias is None else t.bias[v0:v1], dz, t.labels[rows], lse,
                              coef, kscale, opts, v0)
            else:
                vp = _pad(v1 - v0, 32)
                z = buf[: n * vp].view(n, vp)[:, : v1 - v0]
                _logits32(h, w[v0:v1], z)
                dz = _dz_view(z, h.dtype)
                _launch(t, opts, z, rows, grad=True, dz=dz, coef=coef, scale=kscale, lse=lse, v0=v0, v1=v1)
            if want_dw:
                if post:
                    tmp = torch.empty(v1 - v0, h.shape[1], device=h.device, dtype=torch.float32)
                    _dw_into(dz, h, tmp, accumulate=False)
                    krows.scale_cast(tmp, w.dtype, scale.to(torch.float32).reshape(()), out=out.dw[v0:v1])
                    del tmp
                else:
                    _dw_into(dz, h, out.dw[v0:v1], accumulate=False)
            if out.dh is not None:
                _dx_into(dz, w[v0:v1], out.dh[rows], accumulate=True)
            if out.db is not None:
                out.db[v0:v1] += dz.sum(dim=0, dtype=torch.float32)


PROVIDER = TritonProvider()

if krows is not None:

    @torch.library.impl("fused_lce::_scale_grads_", "CUDA")
    def _scale_grads_cuda(grads, scale):
        """The CUDA kernel of the op that scales the gradients computed in forward by the upstream gradient:
        reads the scale on the device and touches no byte when it is 1 (the usual case). No host
        synchronisation."""
        if all(g.is_contiguous() for g in grads):
            krows.scale_unless_one_(grads, scale.to(torch.float32))
        else:
            torch._foreach_mul_(grads, scale)
