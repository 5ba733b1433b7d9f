"""Shared fixtures: which (backend, device) pairs exist here, and the fp64 comparison helpers."""
from __future__ import annotations

import os
import sys
import tempfile
import zlib

import pytest
import torch
from hypothesis import settings

from fused_lce.core import Options, Problem, registry

from .support.reference import (GRAD_TOL, LOGIT_TOL, LOSS_ATOL, LOSS_TOL, LSE_TOL, SUMMAND_TOL,  # noqa: F401
                                Reference, assert_grads_close, assert_loss_close, assert_lse_close,
                                fp64_reference, grad_close, rel_err)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# first-use self-check verdicts (fused_lce.core.selfcheck) of this run, not the user's cache
os.environ.setdefault("FUSED_LCE_CACHE_DIR", tempfile.mkdtemp(prefix="fused_lce_test_cache_"))

# Property tests: a fresh random search locally; in CI (env CI set) the same derandomized examples every run,
# so a landing is never blocked at random (failing examples are printed with their reproduction blob).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available():
        devs.append("cuda")
    return devs


TWIN_STATUS = ("AscendC kernel sources compiled with g++ against the CPU twin of the AscendC "
               "API (tests/support)")


def _register_twin():
    """The AscendC kernels of csrc/ascend, compiled unchanged against the CPU twin of the AscendC API, behind
    the "npu" provider's Python side, as provider "npu_twin" on CPU tensors: every suite parametrised over the
    providers runs it like any other (marked `twin`). The extension is built once (cached in build/twin-ext).
    In CI a build failure is an error; elsewhere (no g++ / ninja) the twin is left out with a warning."""
    if os.environ.get("FUSED_LCE_TEST_TWIN", "1") == "0":
        return
    import warnings

    try:
        from .support.ascendc_twin import build as twin_build

        kernels = twin_build.TwinKernels()
    except Exception as e:  # noqa: BLE001
        if os.environ.get("CI"):
            raise
        warnings.warn(f"the AscendC CPU twin could not be built, npu_twin is not tested here: {e}")
        return
    from fused_lce.backends.npu import AscendCProvider

    registry.register(AscendCProvider("npu_twin", kernels=kernels, device_types=("cpu",), status=TWIN_STATUS))


_register_twin()


def backend_device_params():
    """Every available backend on every device it supports here; CUDA cases carry the `cuda` mark.
    Unavailable backends are not parametrised at all (a skip must never look like a pass);
    tests/test_backends_present.py says which ones are expected in CI."""
    params = []
    for dev in _devices():
        for name in registry.names():
            if registry.why_not(name, Problem(8, 8, 8, torch.float32, torch.device(dev), False, Options())):
                continue
            marks = [pytest.mark.cuda] if dev == "cuda" else []
            if name.startswith("npu_twin"):
                marks.append(pytest.mark.twin)
            params.append(pytest.param((name, dev), id=f"{name}-{dev}", marks=marks))
    return params


BACKEND_DEVICE = backend_device_params()


@pytest.fixture
def seed(request):
    """The seed of a test's random inputs (shown on failure as the fixture value). Locally a fresh one per
    run, so every run draws new inputs; in CI (env CI set) one derived from the test's id, so CI is
    reproducible and a landing is never blocked at random. FUSED_LCE_TEST_SEED=<int> replays a local
    failure."""
    if os.environ.get("FUSED_LCE_TEST_SEED"):
        s = int(os.environ["FUSED_LCE_TEST_SEED"])
    elif os.environ.get("CI"):
        s = zlib.crc32(request.node.nodeid.encode())
    else:
        s = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(s)
    return s


def run_provider(provider, h, w, y, b, opts, scale, mask=(True, True, True)):
    """A provider through the driver's forward on a flattened problem (no public API): per-token (loss, lse,
    correct) and the gradients of ``scale * sum(loss)`` (dX float32 when ``opts.group_name`` is set)."""
    from fused_lce.core import Tensors, distributed, driver, formulas

    g = formulas.token_weights(*formulas.label_classes(y, opts, w.shape[0]))
    st, grads = driver.run_forward(provider, Tensors(h, w, y, b), opts, g, scale, mask,
                                   distributed.resolve_group(opts.group_name))
    return formulas.loss_from_stats(st, y, opts, w.shape[0]) + (grads,)


def run_provider_backward(provider, upstream, h, w, y, b, lse, opts, mask=(True, True, True)):
    """The driver's recompute path: gradients of ``sum(upstream * loss)`` from the saved lse."""
    from fused_lce.core import Tensors, driver, formulas

    g = formulas.token_weights(*formulas.label_classes(y, opts, w.shape[0]), upstream)
    return driver.run_backward(provider, Tensors(h, w, y, b), lse,
                               formulas.loss_coefs(lse, g, opts, w.shape[0]), opts, mask,
                               fp32_dh=bool(opts.group_name))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the H200 with the device tool)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:  # the marker, not any keyword (a path part)
            item.add_marker(skip)


def _marked(rank, fn, marker_dir, args):
    fn(rank, *args)
    open(os.path.join(marker_dir, f"done{rank}"), "w").close()  # every check of this rank passed
    # leave without the interpreter's teardown, where gloo's threads have aborted a rank under load
    # ("terminate called without an active exception") after every check had passed
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_pair(fn, make_args, nprocs: int = 2) -> None:
    """``mp.spawn(fn, make_args(attempt), nprocs)``, run once more only when a process died of a signal after
    every rank had returned from ``fn`` (all its checks passed): gloo's teardown under load has aborted a rank
    that way ("terminate called without an active exception"). A failed check, or a signal before every rank
    finished, is never retried."""
    import tempfile

    import torch.multiprocessing as mp

    for attempt in range(2):
        with tempfile.TemporaryDirectory() as marks:
            try:
                mp.spawn(_marked, args=(fn, marks, make_args(attempt)), nprocs=nprocs, join=True)
                return
            except mp.ProcessExitedException as e:
                finished = all(os.path.exists(os.path.join(marks, f"done{r}")) for r in range(nprocs))
                if attempt or not e.signal_name or not finished:
                    raise
