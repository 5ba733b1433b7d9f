"""The npu provider's default route at real vocabulary sizes on the twin: V_local >= 65536 (70 000) and Qwen's
151 936, tiny N and D, against float64, forward and backward. At these sizes a cube operand
read at a row stride of V_local would exceed the 16 bits of the GM -> L1 copy's Nd2NzParams::srcDValue, which
the twin's Matmul model reports (docs/npu-twin-rules.md): the cube-driven backward keeps dz in column chunks
narrower than 65535 (plan.keep_cols), and these tests fail if it goes back to one N x V_local matrix."""
import pytest
import torch

from ..support.ascendc_twin import build as twin_build
from fused_lce.core.formulas import reference_loss
from ..support.ascendc_twin.ref import HW_910B, rel_l2

SIZES = [(20, 8, 70000), (8, 8, 151936)]  # (N, D, V_local)
# float32 operands: the kernels' fp32 accumulation against float64 (bf16 / fp16 rounding is covered at small
# V)
RTOL = 5e-5


@pytest.fixture
def provider(ops):
    """The npu provider over the kernels on the twin, registered for the test only, recording the route it
    takes."""
    from fused_lce.core import registry
    from fused_lce.backends.npu import AscendCProvider

    class Spy(twin_build.TwinKernels):
        calls = []

        def stats(self, *a, keep_z=False, **kw):
            Spy.calls.append(("stats", keep_z))
            return super().stats(*a, keep_z=keep_z, **kw)

        def grads(self, *a, zcache=None, keep_dz=False, **kw):
            Spy.calls.append(("grads", zcache is not None, keep_dz))
            return super().grads(*a, zcache=zcache, keep_dz=keep_dz, **kw)

    name = "npu_twin_real"
    registry.register(AscendCProvider(name, kernels=Spy(HW_910B), device_types=("cpu",)))
    yield name, Spy.calls
    registry.unregister(name)
    twin_build.configure(HW_910B)


@pytest.mark.parametrize("n,d,v", SIZES, ids=[f"V{v}" for _, _, v in SIZES])
def test_default_route_at_real_vocabularies(provider, part, seed, n, d, v):
    import fused_lce

    name, calls = provider
    part(HW_910B, sched_seed=seed)
    g = torch.Generator().manual_seed(seed)
    h0 = torch.randn(n, d, generator=g)
    w0 = torch.randn(v, d, generator=g) * 2
    b0 = torch.randn(v, generator=g) * 0.1
    y = torch.randint(0, v, (n,), generator=g)
    # the last vocabulary row, a column past the 16-bit stride, ignored
    y[0], y[1], y[2] = v - 1, 65536 % v, -100
    hd, wd, bd = (x.double().requires_grad_() for x in (h0, w0, b0))
    ref, _, _, _ = reference_loss(hd, wd, y, bd, label_smoothing=0.1, z_loss=1e-3)
    ref.backward()
    h, w, b = (x.clone().requires_grad_() for x in (h0, w0, b0))
    loss = fused_lce.linear_cross_entropy(h, w, y, b, label_smoothing=0.1, z_loss=1e-3, backend=name)
    loss.backward()
    # the route the provider takes by default: one block, z kept by the forward and dz by the backward
    assert calls == [("stats", True), ("grads", True, True)], calls
    loss, ref = float(loss.detach()), float(ref.detach())
    assert abs(loss - ref) <= RTOL * abs(ref), (loss, ref)
    for what, got, want in (("dh", h.grad, hd.grad), ("dw", w.grad, wd.grad), ("db", b.grad, bd.grad)):
        assert rel_l2(got, want) < RTOL, f"{what}: {rel_l2(got, want):.2e}"


@pytest.mark.parametrize("keep_dz", [True, False], ids=["dz-kept", "recompute"])
def test_cube_backward_modes_at_a_wide_vocabulary(ops, part, seed, keep_dz):
    """The cube-driven backward's other modes at V_local = 70 000 (no z cache): dz kept (whole-K GEMMs from
    the N x V Dz) and the per-tile ring, against float64."""
    part(HW_910B, sched_seed=seed)
    n, d, v = 20, 8, 70000
    g = torch.Generator().manual_seed(seed)
    h, w = torch.randn(n, d, generator=g), torch.randn(v, d, generator=g)
    y = torch.randint(0, v, (n,), generator=g)
    z = h.double() @ w.double().t()
    lse = torch.logsumexp(z, 1)
    a, t = torch.rand(n, generator=g), torch.rand(n, generator=g)
    dz = torch.softmax(z, 1) * a.double()[:, None]
    dz[torch.arange(n), y] -= t.double()
    dx, dw, _ = ops._twin_grads_cube(h, w, None, y, lse.float(), a, t, None, None, 0, 0.0, 1.0,
                                     [True, True, False], None, keep_dz, None)
    assert rel_l2(dx, dz @ w.double()) < RTOL and rel_l2(dw, dz.t() @ h.double()) < RTOL
