"""(d) Dispatch scenarios on the simulated "npu" device, run in a subprocess by test_npu_dispatch.py (renaming
PrivateUse1 is process-global). Prints one JSON object: {scenario: "ok" | traceback}.

The fake torch_npu (tests/support/fake_torch_npu) is first on sys.path; tensors are npu_sim.NpuTensor
("npu:0"). Covered: ``import fused_lce`` without torch_npu, backend_info's first failing step per backend,
auto selection on device "npu" (own kernels -> CANN trio -> torch; torch end to end for the loss and the
log-probs when neither NPU provider is available), FUSED_LCE_BACKEND and explicit backends, the npu_cann
wrapper end to end through fused_lce.linear_cross_entropy (autograd, reductions, num_items, ignore_index,
z_loss, shift, return_stats) against the float64 reference, its routing of options the trio lacks, and the
"npu" backend's glue with the AscendC kernel sources on the CPU twin standing in for the compiled kernels.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import traceback
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path[:0] = [os.path.join(ROOT, "tests", "support", "fake_torch_npu"), ROOT]

import torch  # noqa: E402

import fused_lce  # noqa: E402

ASSERT_NO_TORCH_NPU_AT_IMPORT = "torch_npu" not in sys.modules

import torch_npu  # noqa: E402  (the fake)
from fused_lce.core import registry  # noqa: E402
from fused_lce.backends import build_status  # noqa: E402
from fused_lce.backends.npu import cann as npu_cann, env as npu_env, kernels as npu_kernels  # noqa: E402
from fused_lce.backends.npu import provider as npu_provider  # noqa: E402
from fused_lce.core.formulas import reference_logprobs, reference_loss  # noqa: E402
from tests.support.npu_sim import NpuMode, NpuTensor, cpu  # noqa: E402
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402

from tests.support.ascendc_twin import build as twin_build  # noqa: E402

# not what this checkout's build left
build_status.PATH = os.path.join(tempfile.mkdtemp(), "_build_status.json")


class TwinKernelsOnSimulatedNpu:
    """The AscendC kernel sources on the CPU twin (tests/ascend) as the "npu" provider's kernels, fed the CPU
    data of simulated-npu tensors and returning simulated-npu tensors: what the compiled kernels would be on a
    real card."""

    def __init__(self):
        self.twin = twin_build.TwinKernels()
        self.counted = {"stats": 0, "grads": 0}

    def _run(self, name, *args, **kw):
        self.counted[name] += 1
        dw_out = kw.get("dw_out")
        plain = lambda a: cpu(a) if isinstance(a, torch.Tensor) else a  # noqa: E731
        with _disable_current_modes():  # the twin ops have CPU kernels only
            out = getattr(self.twin, name)(*map(plain, args), **{k: plain(v) for k, v in kw.items()})
        # dW accumulated in place into dw_out's CPU data: hand back dw_out itself, as the adapter does
        same = lambda o: (dw_out is not None and o.numel() > 0  # noqa
                          and o.data_ptr() == cpu(dw_out).data_ptr())
        return tuple(dw_out if same(o) else NpuTensor(o) for o in out)

    def stats(self, *args, **kw):
        return self._run("stats", *args, **kw)

    def grads(self, *args, **kw):
        return self._run("grads", *args, **kw)


def fake_cann_home(symbols) -> str:
    """An $ASCEND_HOME_PATH whose lib64/libopapi.so exports ``symbols`` (CANN's op-api library, as op-plugin
    looks it up): the trio's aclnn kernels are "installed" when their names are exported."""
    home = tempfile.mkdtemp(prefix="fake_cann_")
    os.makedirs(os.path.join(home, "lib64"))
    src = os.path.join(home, "opapi.c")
    with open(src, "w") as f:
        f.write("".join(f"int {s}(void) {{ return 0; }}\n" for s in symbols) or
                "int unused_symbol(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", src, "-o", os.path.join(home, "lib64", "libopapi.so")],
                   check=True)
    return home


TRIO_SYMBOLS = [n + suffix for n in npu_cann.ACLNN for suffix in ("", "GetWorkspaceSize")]
os.environ["ASCEND_HOME_PATH"] = fake_cann_home(TRIO_SYMBOLS)
# this run's self-check verdicts
os.environ["FUSED_LCE_CACHE_DIR"] = tempfile.mkdtemp(prefix="fused_lce_cache_")

SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def rel(a, b):
    a, b = cpu(a).double(), cpu(b).double()
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def problem(n, d, v, dtype, seed, bias=False, lead=()):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, n, d, generator=g).to(dtype)
    w = (torch.randn(v, d, generator=g) * (3.0 / math.sqrt(d))).to(dtype)
    b = torch.randn(v, generator=g).to(dtype) if bias else None
    y = torch.randint(0, v, (*lead, n), generator=g)
    y.view(-1)[::6] = -100
    return h, w, b, y


def run_both(h, w, b, y, upstream=None, **opts):
    """(loss, grads) through fused_lce on the simulated npu device, and the float64 reference."""
    with NpuMode():
        hn = h.to("npu").requires_grad_()
        wn = w.to("npu").requires_grad_()
        bn = b.to("npu").requires_grad_() if b is not None else None
        yn = y.to("npu")
        out = fused_lce.linear_cross_entropy(hn, wn, yn, bn, **opts)
        loss = out.loss if opts.get("return_stats") else out
        assert loss.device.type == "npu" and loss.dtype == torch.float32
        up = torch.ones_like(loss) if upstream is None else upstream.to("npu")
        loss.backward(up)
        got = (loss, hn.grad, wn.grad, bn.grad if bn is not None else None, out)
    h64 = h.double().requires_grad_()
    w64 = w.double().requires_grad_()
    b64 = b.double().requires_grad_() if b is not None else None
    ref_opts = {k: opts[k] for k in ("ignore_index", "reduction", "label_smoothing", "z_loss",
                                     "softcap", "shift", "num_items") if k in opts}
    r = reference_loss(h64, w64, y, b64, **ref_opts)
    r[0].backward(torch.ones_like(r[0]) if upstream is None else upstream.double())
    return got, (r[0].detach(), h64.grad, w64.grad, b64.grad if b is not None else None, r)


def calls():
    return sum(torch_npu.calls.values())


def check(got, ref, loss_tol, grad_tol):
    assert rel(got[0], ref[0]) < loss_tol, ("loss", rel(got[0], ref[0]))
    for k, name in ((1, "dX"), (2, "dW"), (3, "db")):
        if ref[k] is not None:
            assert got[k] is not None and got[k].device.type == "npu", name
            assert rel(got[k], ref[k]) < grad_tol, (name, rel(got[k], ref[k]))


# ------------------------------------------------------------------------------------------------ scenarios
@scenario
def import_and_backend_info():
    assert ASSERT_NO_TORCH_NPU_AT_IMPORT, "import fused_lce imported torch_npu"
    # fused_lce came first: op-plugin's view was taken when torch_npu was imported
    assert npu_env._snapshot == npu_env.loader_view({}), npu_env._snapshot
    info = fused_lce.backend_info()
    npu = info["npu"]
    assert not npu["available"], npu
    assert "custom OPP kernels not found as op-plugin looks them up: aclnn symbol(s) " in npu["reason"], \
        npu["reason"]
    assert "ASCEND_CUSTOM_OPP_PATH unset" in npu["reason"], npu["reason"]
    assert npu["reason"].endswith(npu_provider.STATUS) and "not run on NPU hardware" in npu["reason"], npu
    assert info["npu_cann"]["available"], info["npu_cann"]
    assert info["auto"]["npu"] == "npu_cann", info["auto"]


@scenario
def auto_uses_trio_bf16_all_reductions():
    seed = 11
    for reduction, num_items, z_loss in (("mean", None, 1e-3), ("sum", None, 0.0), ("mean", 1000, 1e-4),
                                         ("none", None, 0.05)):
        h, w, _, y = problem(61, 40, 300, torch.bfloat16, seed)
        up = torch.rand(61) + 0.5 if reduction == "none" else None
        before = dict(torch_npu.calls)
        got, ref = run_both(h, w, None, y, up, reduction=reduction, num_items=num_items, z_loss=z_loss)
        after = torch_npu.calls
        assert after[npu_cann.TRIO[0]] > before.get(npu_cann.TRIO[0], 0), reduction
        # reduction "none" recomputes its gradients through the trio's backward; the others get them in
        # forward
        assert after[npu_cann.TRIO[2]] > before.get(npu_cann.TRIO[2], 0), reduction
        assert got[1].dtype == torch.bfloat16 and got[2].dtype == torch.bfloat16
        check(got, ref, 2e-3, 1.5e-2)  # the trio rounds logits to bf16


@scenario
def trio_shift_3d_and_stats():
    h, w, _, y = problem(17, 32, 256, torch.float16, 5, lead=(3,))
    got, ref = run_both(h, w, None, y, shift=True, return_stats=True)
    check(got, ref, 1e-4, 2e-3)
    out, r = got[4], ref[4]
    assert out.lse.shape == (3, 16) and int(cpu(out.n_valid)) == int(r[3])
    # fp16-rounded logits may tie
    assert abs(float(cpu(out.token_accuracy)) - float(r[2])) <= 3.0 / float(r[3])


@scenario
def fp32_and_unsupported_options_route_to_torch():
    for dtype, opts in ((torch.float32, {}), (torch.bfloat16, {"label_smoothing": 0.1}),
                        (torch.bfloat16, {"softcap": 5.0})):
        h, w, _, y = problem(33, 24, 200, dtype, 3)
        n0 = calls()
        got, ref = run_both(h, w, None, y, **opts)
        assert calls() == n0, (dtype, opts)  # the trio was not used
        check(got, ref, 1e-5, 1e-5 if dtype == torch.float32 else 1e-2)


@scenario
def trio_shape_limits_route_to_torch():
    """Shapes the trio refuses are declined by npu_cann's supports(): auto takes torch, an explicit request
    says why."""
    for (n, d, v, bias), why in (((20, 16, 300, True), "no bias"),
                                 ((20, 16, 100, False), "128 vocabulary rows")):
        h, w, b, y = problem(n, d, v, torch.bfloat16, 4, bias=bias)
        n0 = calls()
        got, ref = run_both(h, w, b, y)
        assert calls() == n0, why  # the trio was not used
        check(got, ref, 1e-5, 1e-2)
        try:
            run_both(h, w, b, y, backend="npu_cann")
        except ValueError as e:
            assert why in str(e), str(e)
        else:
            raise AssertionError(f"backend='npu_cann' ran a problem it cannot run ({why})")


@scenario
def env_override_and_explicit_backends():
    h, w, _, y = problem(25, 16, 200, torch.bfloat16, 8)
    try:
        os.environ["FUSED_LCE_BACKEND"] = "torch"
        n0 = calls()
        got, ref = run_both(h, w, None, y)
        assert calls() == n0
        check(got, ref, 1e-5, 1e-2)
        os.environ["FUSED_LCE_BACKEND"] = "npu_cann"
        run_both(h, w, None, y)
        assert calls() > n0
    finally:
        del os.environ["FUSED_LCE_BACKEND"]
    for backend, dtype, words in (("npu", torch.bfloat16, ["custom OPP", "not run on NPU hardware"]),
                                  ("npu_cann", torch.float32, ["bfloat16/float16"]),
                                  ("npu_cann", torch.bfloat16, None)):
        h, w, _, y = problem(9, 8, 130, dtype, 2)
        try:
            with NpuMode():
                fused_lce.linear_cross_entropy(h.to("npu"), w.to("npu"), y.to("npu"), backend=backend)
        except ValueError as e:
            assert words is not None and all(x in str(e) for x in words), str(e)
        else:
            assert words is None, backend


@scenario
def first_failing_step_is_reported():
    def reasons():
        npu_provider.PROVIDER.reset()
        info = fused_lce.backend_info()
        return info["npu"]["reason"] or "", info["npu_cann"]["reason"] or ""

    home = os.environ["ASCEND_HOME_PATH"]
    os.environ["ASCEND_HOME_PATH"] = fake_cann_home(TRIO_SYMBOLS[:2])  # a CANN without the backward kernel
    try:
        assert "aclnn kernel(s) aclnnFusedLinearCrossEntropyLossGrad, " in reasons()[1], reasons()[1]
        h, w, _, y = problem(12, 8, 200, torch.bfloat16, 1)
        n0 = calls()
        got, ref = run_both(h, w, None, y)  # auto: trio unavailable -> torch
        assert calls() == n0
        check(got, ref, 1e-5, 1e-2)
    finally:
        os.environ["ASCEND_HOME_PATH"] = home
    os.environ["FAKE_NO_TRIO"] = "1"
    try:
        assert "has no npu_fused_linear_online_max_sum" in reasons()[1]
    finally:
        del os.environ["FAKE_NO_TRIO"]
    os.environ["FAKE_NPU_DEVICES"] = "0"
    try:
        r_npu, r_cann = reasons()
        assert r_npu.startswith("no NPU device visible") and r_cann.startswith("no NPU device visible"), \
            (r_npu, r_cann)
    finally:
        del os.environ["FAKE_NPU_DEVICES"]
    # the custom OPP as op-plugin sees it when torch_npu loads (here: the view it would have taken, had
    # ASCEND_CUSTOM_OPP_PATH been set before): a library that lacks symbols, then one with all of them but no
    # adapter
    syms_all = npu_kernels.ACLNN_SYMBOLS
    status = os.path.join(tempfile.mkdtemp(), "_build_status.json")
    build_status.PATH = status  # nothing recorded: a source checkout
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "stub.c")
        vendors = []
        for k, syms in enumerate((syms_all[:2], syms_all)):
            # a new path: dlopen caches by name
            vendors.append(os.path.join(tmp, str(k), "vendors", "fused_lce"))
            libdir = os.path.join(vendors[-1], "op_api", "lib")
            os.makedirs(libdir)
            with open(src, "w") as f:
                f.write("".join(f"int {s}(void) {{ return 0; }}\n" for s in syms))
            subprocess.run(["gcc", "-shared", "-fPIC", src, "-o", os.path.join(libdir, "libcust_opapi.so")],
                           check=True)
            # the generated headers, this package's interface
            inc = os.path.join(vendors[-1], "op_api", "include")
            os.makedirs(inc)
            for name in npu_env.ACLNN_HEADERS:
                with open(os.path.join(inc, name), "w") as f:
                    f.write("aclnnStatus aclnnX(..., int64_t variant, ...);\n")
        try:
            npu_env._snapshot = npu_env.loader_view({"ASCEND_CUSTOM_OPP_PATH": vendors[0]})
            assert reasons()[0].startswith("custom OPP kernels not found as op-plugin looks them up: aclnn "
                                           "symbol(s) aclnnFusedLceGradCubeGetWorkspaceSize, "
                                           "aclnnFusedLceGradCube "), reasons()
            npu_env._snapshot = npu_env.loader_view({"ASCEND_CUSTOM_OPP_PATH": vendors[1]})
            r = reasons()[0]
            assert r.startswith("host adapter fused_lce._npu_C not built (setup.py builds it when "
                                "ASCEND_HOME_PATH "), r
            # a package built from older sources: the same symbols, a header without the variant argument
            header = os.path.join(vendors[1], "op_api", "include", "aclnn_fused_lce_grad_cube.h")
            with open(header, "w") as f:
                f.write("aclnnStatus aclnnFusedLceGradCubeGetWorkspaceSize(..., bool keepDz, ...);\n")
            r = reasons()[0]
            assert "do not match this package" in r and "declares no 'variant' argument" in r, r
            os.remove(header)
            r = reasons()[0]
            assert "aclnn_fused_lce_grad_cube.h is missing: an incomplete kernel package" in r, r
            with open(header, "w") as f:
                f.write("aclnnStatus aclnnFusedLceGradCube(..., int64_t variant, ...);\n")
            # what setup.py recorded: the adapter's compile error, and a failed kernel build, which comes
            # first
            adapter = {"ok": False, "attempted": True,
                       "error": "not built: compiling fused_lce._npu_C failed (x)", "log": None}
            opp = {"ok": False, "attempted": True, "error": "k.cpp:1:2: error: boom", "log": "/b/build.log"}
            with open(status, "w") as f:
                json.dump({"npu_adapter": adapter}, f)
            r = reasons()[0]
            assert r.startswith("host adapter fused_lce._npu_C not built (not built: compiling "
                                "fused_lce._npu_C "), r
            with open(status, "w") as f:
                json.dump({"npu_adapter": adapter, "npu_opp": opp}, f)
            assert reasons()[0].startswith("the custom OPP kernel package failed to build at install: "
                                           "k.cpp:1:2: error: boom (full log: /b/build.log)"), reasons()[0]
            with open(status, "w") as f:
                json.dump({"npu_opp": {**opp, "attempted": False,
                                       "error": "not built: FUSED_LCE_SKIP_OPP_BUILD"}}, f)
            # not tried
            assert reasons()[0].startswith("host adapter fused_lce._npu_C not built"), reasons()[0]
            # the variable set inside the process after torch_npu was imported: op-plugin never sees it
            npu_env._snapshot = npu_env.loader_view({})
            os.environ["ASCEND_CUSTOM_OPP_PATH"] = vendors[1]
            r = reasons()[0]
            assert r.startswith("custom OPP kernels not found as op-plugin looks them up") and "unset" in r, r
        finally:
            os.environ.pop("ASCEND_CUSTOM_OPP_PATH", None)
            npu_env._snapshot = npu_env.loader_view({})
            build_status.PATH = os.path.join(tempfile.mkdtemp(), "_build_status.json")
    npu_provider.PROVIDER.reset()


@scenario
def auto_falls_back_to_torch_without_npu_providers():
    """No custom OPP package and a torch_npu without the CANN trio: backend_info says why neither NPU provider
    is available, and backend="auto" on npu tensors runs the torch provider for the loss and the log-probs
    (every dtype, both label dtypes, the options), forward and backward against the float64 reference."""
    provider = registry.load("torch")
    ran = Counter()

    def spy(name):
        fn = getattr(provider, name)

        def counted(*args, **kwargs):
            ran[name] += 1
            return fn(*args, **kwargs)
        return counted

    os.environ["FAKE_NO_TRIO"] = "1"
    provider.stats, provider.grads = spy("stats"), spy("grads")
    try:
        npu_provider.PROVIDER.reset()
        info = fused_lce.backend_info()
        assert not info["npu"]["available"] and "custom OPP kernels not found" in info["npu"]["reason"], \
            info["npu"]
        cann = info["npu_cann"]
        assert not cann["available"] and "has no npu_fused_linear_online_max_sum" in cann["reason"], cann
        assert info["auto"]["npu"] == "torch", info["auto"]
        for dtype, ldt, opts, bias, tol in (
                (torch.bfloat16, torch.int64, dict(z_loss=1e-3), False, 1e-2),
                (torch.bfloat16, torch.int32, dict(label_smoothing=0.1, softcap=8.0, ignore_index=-1), True,
                 1e-2),
                (torch.float16, torch.int32, dict(reduction="none", shift=True, return_stats=True), False,
                 4e-3),
                (torch.float32, torch.int64, dict(reduction="sum", num_items=40, tile_budget_mb=0.004), True,
                 1e-5)):
            h, w, b, y = problem(31, 24, 270, dtype, 31, bias=bias, lead=(2,) if opts.get("shift") else ())
            if opts.get("ignore_index") is not None:
                y[y == -100] = opts["ignore_index"]
            n0, c0 = dict(ran), calls()
            up = torch.rand(2, 30) + 0.5 if opts.get("reduction") == "none" else None
            got, ref = run_both(h, w, b, y.to(ldt), up, **opts)
            assert ran["stats"] > n0.get("stats", 0) and ran["grads"] > n0.get("grads", 0), (dtype, opts)
            assert calls() == c0, (dtype, opts)
            check(got, ref, 1e-5, tol)
        for dtype, opts, tol in ((torch.bfloat16, dict(temperature=0.7), 1e-2),
                                 (torch.float32, dict(softcap=5.0, tile_budget_mb=0.004), 1e-5)):
            h, w, b, y = problem(29, 24, 270, dtype, 32, bias=True)
            n0 = dict(ran)
            got, ref = logprobs_both(h, w, b, y.to(torch.int32), **opts)
            assert ran["stats"] > n0.get("stats", 0) and ran["grads"] > n0.get("grads", 0), (dtype, opts)
            for k, name in enumerate(("logprob", "entropy", "dX", "dW", "db")):
                assert got[k].device.type == "npu", name
                err = rel(got[k], ref[k])
                assert err < (1e-5 if k < 2 else tol), (dtype, opts, name, err)
    finally:
        del provider.stats, provider.grads
        del os.environ["FAKE_NO_TRIO"]


def logprobs_both(h, w, b, y, **opts):
    """(logprob, entropy, dX, dW, db) of linear_logprobs (return_entropy=True, random upstream gradients of
    both) on the simulated npu device, and of the float64 reference."""
    g = torch.Generator().manual_seed(7)
    g_lp, g_ent = torch.rand(y.shape, generator=g), torch.rand(y.shape, generator=g)
    ref_opts = {k: opts[k] for k in ("temperature", "softcap") if k in opts}
    with NpuMode():
        hn, wn, bn = (x.to("npu").requires_grad_() for x in (h, w, b))
        lp, ent = fused_lce.linear_logprobs(hn, wn, y.to("npu"), bn, return_entropy=True, **opts)
        assert lp.device.type == "npu" and lp.dtype == torch.float32
        torch.autograd.backward((lp, ent), (g_lp.to("npu"), g_ent.to("npu")))
        got = (lp, ent, hn.grad, wn.grad, bn.grad)
    h64, w64, b64 = (x.double().requires_grad_() for x in (h, w, b))
    r_lp, r_ent = reference_logprobs(h64, w64, y, b64, **ref_opts)
    torch.autograd.backward((r_lp, r_ent), (g_lp.double(), g_ent.double()))
    return got, (r_lp.detach(), r_ent.detach(), h64.grad, w64.grad, b64.grad)


@scenario
def own_kernels_first_when_available():
    """With the kernels present (the AscendC sources on the CPU twin), auto on device npu picks "npu" for
    every option and dtype, end to end through fused_lce.linear_cross_entropy and autograd."""
    kernels = TwinKernelsOnSimulatedNpu()
    counted = kernels.counted
    registry.register(npu_provider.AscendCProvider("npu", kernels=kernels))
    try:
        assert fused_lce.backend_info()["auto"]["npu"] == "npu"
        for dtype, opts, tol in ((torch.bfloat16, dict(label_smoothing=0.1, z_loss=1e-3, softcap=8.0), 1e-2),
                                 (torch.float32, dict(reduction="sum"), 1e-5),
                                 (torch.float16, dict(reduction="none"), 4e-3)):
            h, w, b, y = problem(29, 24, 270, dtype, 21, bias=True)
            n0, c0 = dict(counted), calls()
            up = torch.rand(29) if opts.get("reduction") == "none" else None
            got, ref = run_both(h, w, b, y, up, **opts)
            assert counted["stats"] > n0["stats"] and counted["grads"] > n0["grads"] and calls() == c0
            check(got, ref, 1e-6, tol)
        os.environ["FUSED_LCE_BACKEND"] = "npu_cann"
        try:
            h, w, _, y = problem(29, 24, 270, torch.bfloat16, 22)
            c0 = calls()
            run_both(h, w, None, y)
            assert calls() > c0
        finally:
            del os.environ["FUSED_LCE_BACKEND"]
    finally:
        registry.unregister("npu")


class WrongKernelsOnSimulatedNpu(TwinKernelsOnSimulatedNpu):
    """The twin's kernels with dW off by 1%: what a first hardware run could show."""

    def grads(self, *args, **kw):
        dx, dw, db = super().grads(*args, **kw)
        return dx, dw * 1.01, db


@scenario
def selfcheck_guards_the_npu_providers():
    """The first use of each NPU provider on the device runs the self-check battery against the torch provider
    on the same device. A wrong "npu" kernel fails it (a warning naming the check and `fused-lce doctor`;
    backend_info says why) and auto takes npu_cann (the fake trio, which passes); fp32, which the trio
    declines, and a trio that fails its check too (its functions raise), take the torch route. Every answer
    matches the float64 reference."""
    import warnings

    from fused_lce.core import selfcheck

    selfcheck.forget()
    kernels = WrongKernelsOnSimulatedNpu()
    registry.register(npu_provider.AscendCProvider("npu", kernels=kernels))
    # the right kernels of an earlier scenario have the same cache key as these: check, do not read the cache
    os.environ["FUSED_LCE_SELFCHECK"] = "1"
    try:
        h, w, _, y = problem(29, 24, 270, torch.bfloat16, 31)
        c0 = calls()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got, ref = run_both(h, w, None, y)
        msgs = [str(x.message) for x in caught if issubclass(x.category, RuntimeWarning)]
        assert any("backend 'npu' failed its first-use self-check on npu:0" in m and "fused-lce doctor" in m
                   for m in msgs), msgs
        assert calls() > c0  # the trio ran (its battery, then the user's call)
        check(got, ref, 2e-3, 1.5e-2)
        info = fused_lce.backend_info()
        assert not info["npu"]["available"] and "dW differs" in info["npu"]["reason"], info["npu"]
        assert info["npu_cann"]["selfcheck"] == {"npu:0": "passed"}, info["npu_cann"]
        hf, wf, _, yf = problem(29, 24, 270, torch.float32, 32)  # fp32: the trio declines it, the torch route
        got, ref = run_both(hf, wf, None, yf)
        check(got, ref, 1e-6, 1e-5)
        selfcheck.forget()
        os.environ["FAKE_TRIO_FAIL"] = "1"
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got, ref = run_both(h, w, None, y)
            msgs = [str(x.message) for x in caught if issubclass(x.category, RuntimeWarning)]
            assert any("backend 'npu_cann' failed its first-use self-check" in m for m in msgs), msgs
            check(got, ref, 1e-6, 1e-2)  # the torch route
            trio = fused_lce.backend_info()["npu_cann"]
            assert not trio["available"] and "RuntimeError" in trio["reason"], trio
        finally:
            del os.environ["FAKE_TRIO_FAIL"]
    finally:
        del os.environ["FUSED_LCE_SELFCHECK"]
        registry.unregister("npu")
        selfcheck.forget()


def main():
    results = {}
    for name, fn in SCENARIOS.items():
        try:
            fn()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()
