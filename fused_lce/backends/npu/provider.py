"""The "npu" provider (``AscendCProvider``): the AscendC kernels behind the driver's ``stats`` / ``grads``,
with the token blocks and gradient sums of the one-pass modes. The package docstring
(``fused_lce/backends/npu``) says what the kernels are and what has been verified of them."""
from __future__ import annotations

import copy
import importlib.util
import math
from typing import Optional

import torch

from ...core import (Coefs, EntropyStats, Grads, Options, Problem, Stats, Tensors, WholeRowsProvider,
                     file_digest)
from ..build_status import failure
from .env import (NEVER_ON_HARDWARE, OPP_VENDOR, build_status, find_kernels, interface_mismatch, kernel_files,
                  platform_id, usable_torch_npu)
from .kernels import ACLNN_SYMBOLS, AdapterKernels

STATUS = "AscendC kernels: compiled and run on CPU against an AscendC API twin; not run on NPU hardware"
ADAPTER_MODULE = "fused_lce._npu_C"
# z cache + kept dz per driver block (one-pass modes) when opts.tile_bytes is 0: 2 GiB keeps about 2300 rows
# of a 151936-row bf16 head per launch, enough for the fp32 dW read-back between launches to hide under the
# cube's work in benchmarks/npu_model.py (1 GiB costs the 256000-row head 1.27x the floor there instead of
# 1.14x)
DEFAULT_TILE_BYTES = 2 << 30
MAX_IDS = 1 << 24  # the kernels' planner carries vocabulary ids and row offsets as exact floats
# every kernel: h and W are read by the cube at row stride D, which the GM -> L1 copy holds in 16 bits
# (Nd2NzParams::srcDValue; fused_lce_tiling.h kMaxOperandStride)
MAX_HIDDEN = 65534


class AscendCProvider(WholeRowsProvider):
    """The AscendC kernels behind the ``stats`` / ``grads`` interface of ``AdapterKernels``. ``kernels`` and
    ``device_types`` can be given to run the same provider over other implementations of those two kernels
    (tests: the kernel sources compiled against the CPU twin of the AscendC API, on CPU tensors)."""

    status = STATUS
    supports_logprobs = True  # stats honour temperature / entropy, grads take Coefs (docs/providers.md)

    def __init__(self, name: str = "npu", kernels=None, device_types=("npu",),
                 status: Optional[str] = STATUS):
        self.name = name
        self.device_types = device_types
        self.status = status
        self.kernels = kernels  # set once every availability step passed
        self._fixed = kernels is not None
        self._reason: Optional[str] = None
        self._checked = False
        self._files: list = []  # the OPP library and the adapter found by the availability check

    def reset(self) -> None:
        """Forget the cached availability result (the checks run again on next use)."""
        self._checked = False
        self._reason = None
        if not self._fixed:
            self.kernels = None

    def unavailable_reason(self) -> Optional[str]:
        if not self._checked:
            self._reason = None if self._fixed else self._first_failing_step()
            self._checked = True
        return None if self._reason is None else f"{self._reason}; {STATUS}"

    def _first_failing_step(self) -> Optional[str]:
        _, reason = usable_torch_npu()
        if reason:
            return reason
        built = build_status()
        if built["npu_opp"] and built["npu_opp"].get("attempted") and not built["npu_opp"].get("ok"):
            # whatever op-plugin would find now is not what the installed sources build
            return f"the custom OPP kernel package failed to build at install: {failure(built['npu_opp'])}"
        lib, reason = find_kernels(ACLNN_SYMBOLS)
        if lib is None:
            return (f"custom OPP kernels not found as op-plugin looks them up: {reason} (install with "
                    f"ASCEND_HOME_PATH set, then source <install>/vendors/{OPP_VENDOR}/bin/set_env.bash "
                    "before Python starts)")
        mismatch = interface_mismatch(lib)
        if mismatch:
            return f"the custom OPP kernels op-plugin would load do not match this package: {mismatch}"
        spec = importlib.util.find_spec(ADAPTER_MODULE)
        if spec is None or not spec.origin:
            why = failure(built["npu_adapter"]) or "setup.py builds it when ASCEND_HOME_PATH is set"
            return f"host adapter {ADAPTER_MODULE} not built ({why})"
        try:
            torch.ops.load_library(spec.origin)
        except Exception as e:
            return f"cannot load the host adapter {spec.origin} ({type(e).__name__}: {e})"
        self.kernels = AdapterKernels()
        self._files = kernel_files(lib) + [spec.origin]
        return None

    def with_variant(self, name: str, variant: int) -> "AscendCProvider":
        """The same kernels in a conservative variant (``kernels.VARIANT_ENV``), as provider ``name`` (for
        ``fused-lce doctor``'s bitwise comparison on a card)."""
        kernels = copy.copy(self.kernels)
        kernels._variant = variant
        out = copy.copy(self)
        out.name, out.kernels = name, kernels
        return out

    def needs_check(self, device: torch.device) -> Optional[str]:
        return f"its AscendC kernels were {NEVER_ON_HARDWARE}" if device.type == "npu" else None

    def check_id(self, device: torch.device) -> str:
        variant = getattr(self.kernels, "variant", 0)
        return f"kernels {file_digest(self._files)} variant {variant}|{platform_id(device)}"

    def token_block(self, p: Problem, keep: bool) -> int:
        """Rows such that the z cache (``keep``, float32) and the kept dz (operand dtype) of one block fit
        ``opts.tile_bytes``, fewer than 2^24 (row offsets travel as exact floats); a multiple of 128 rows (the
        kernels' token tile) when that leaves at least 128."""
        if p.v == 0:
            return max(p.n, 1)
        elt = torch.tensor([], dtype=p.dtype).element_size()
        budget = p.opts.tile_bytes or DEFAULT_TILE_BYTES
        rows = min(max(budget // (p.v * (elt + (4 if keep else 0))), 1), MAX_IDS - 1)
        if rows >= 128:
            rows -= rows % 128
        return max(min(p.n, rows), 1)

    def store(self, t: Tensors, rows: slice, out: Grads, dh, dw, db) -> None:
        """One block's float32 gradients: dX rows into their place, dW / db added to the earlier blocks'
        (block order); a single block covering every row is taken as is."""
        if rows.start == 0 and rows.stop == t.hidden.shape[0] and out.dh is None and out.dw is None \
                and out.db is None:
            return WholeRowsProvider.store(t, rows, out, dh, dw, db)
        m = out.extra
        if m[0]:
            if out.dh is None:
                out.dh = torch.zeros(t.hidden.shape, device=dh.device, dtype=torch.float32)
            out.dh[rows] = dh
        if m[1]:
            out.dw = dw if out.dw is None or dw is out.dw else out.dw.add_(dw)
        if m[2] and t.bias is not None:
            out.db = db if out.db is None else out.db.add_(db)

    def supports(self, p: Problem) -> Optional[str]:
        reason = super().supports(p)
        if reason is None and p.d == 0:
            return "the AscendC tiling needs a hidden size D > 0 (the cube has nothing to multiply)"
        if reason is None and p.d > MAX_HIDDEN:
            return (f"the AscendC kernels need a hidden size D < 65535, got {p.d}: the cube reads h and W at "
                    "row stride D, which the GM -> L1 copy's Nd2NzParams::srcDValue holds in 16 "
                    "bits on Atlas A2")
        if reason is None and p.v >= MAX_IDS:
            return (f"the AscendC kernels need fewer than 2^24 vocabulary rows per rank (ids travel as exact "
                    f"floats), got {p.v}")
        return reason

    # -- kernels: the kernels tile a driver block's tokens across cores --------------------------------------
    def stats(self, t: Tensors, rows: slice, opts: Options, keep: bool):
        if t.weight.shape[0] == 0:  # an empty vocabulary shard (vocab parallel): no kernel launch, no logits
            n, dev = t.hidden[rows].shape[0], t.hidden.device
            zeros = torch.zeros(n, device=dev)
            st = (torch.full((n,), -math.inf, device=dev), zeros, zeros.clone(), zeros.clone(),
                  torch.zeros(n, device=dev, dtype=torch.int64))
            return (EntropyStats(*st, zeros.clone()) if opts.entropy else Stats(*st)), None
        args = (t.hidden[rows], t.weight, t.bias, t.labels[rows], opts.vocab_start, opts.softcap,
                opts.temperature, opts.wants_zsum, opts.entropy)
        cache = None
        if keep:
            r = self.kernels.stats(*args, keep_z=True)
            r, cache = r[:6], r[6]
        else:
            r = self.kernels.stats(*args)
        return (EntropyStats(*r[:6]) if opts.entropy else Stats(*r[:5])), cache

    def grads(self, t: Tensors, rows: slice, lse, coef: Coefs, scale, opts: Options, out: Grads,
              cache=None) -> None:
        if t.weight.shape[0] == 0:  # an empty vocabulary shard: it contributes nothing
            h, w = t.hidden[rows], t.weight
            f32 = torch.float32
            self.store(t, rows, out, torch.zeros(h.shape, device=h.device, dtype=f32),
                       torch.zeros(w.shape, device=w.device, dtype=f32),
                       torch.zeros(0, device=w.device, dtype=f32))
            return
        # the kernel's (4, N) float32 coefficient planes a, t, b, u (None = 0), times the driver's scale
        zero = torch.zeros_like(coef.a, dtype=torch.float32)
        planes = torch.stack([x.float() if x is not None else zero for x in (coef.a, coef.t, coef.b, coef.u)])
        if scale is not None:
            planes = planes * scale
        args = (t.hidden[rows], t.weight, t.bias, t.labels[rows], lse, planes.contiguous(), opts.vocab_start,
                opts.softcap, opts.temperature, list(out.extra))
        # the forward's z cache when the driver kept it; dz kept: dX / dW as whole-K GEMMs; dW of the earlier
        # blocks: the kernel adds this block's into it (no second V x D buffer)
        dh, dw, db = self.kernels.grads(*args, zcache=cache, keep_dz=True, dw_out=out.dw,
                                        present=(coef.b is not None, coef.u is not None))
        self.store(t, rows, out, dh, dw, db)  # float32; finish() casts


PROVIDER = AscendCProvider()
