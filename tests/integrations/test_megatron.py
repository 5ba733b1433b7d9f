"""fused_lce.integrations.megatron: the fused output layer on megatron-core's ColumnParallelLinear (gloo,
CPU).

What runs here: the native ColumnParallelLinear subclass with TP=2 (and 4), untied and tied (shared embedding)
weights, bias, loss_mask, sequence parallelism for the loss path, the logits path without sequence
parallelism, hooks, and a TE-style base class (forward(x) only, ``_tp_group``, empty bias) standing in for
TEColumnParallelLinear. What cannot run on CPU: the logits path with sequence parallelism (megatron-core's
all-gather buffer is CUDA-only) and the real TransformerEngine class (needs CUDA).
"""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

from fused_lce.core.formulas import reference_loss

from ..conftest import GRAD_TOL, LOSS_TOL, rel_err
from ..support.procs import Pool, run_ok

D, V, S, B = 16, 36, 8, 3  # V divisible by the TP sizes (megatron-core requires it)


@pytest.fixture(scope="module")
def pools():
    made = {}

    def get(world):
        pool = made.get(world)
        if pool is None or not pool.healthy:
            if pool is not None:
                pool.close()
            pool = made[world] = Pool(world)
        return pool

    yield get
    for pool in made.values():
        pool.close()


class FakeTELinear(torch.nn.Module):
    """Megatron's TE wrapper conventions without TE: forward(x) -> (out, None), ``_tp_group``, ``use_bias``
    and an empty ``bias`` tensor when there is no bias, ``sequence_parallel`` attribute."""

    def __init__(self, weight, tp_group=None, sequence_parallel=False):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)
        self.bias = torch.Tensor()
        self.use_bias = False
        self._tp_group = tp_group
        self.sequence_parallel = sequence_parallel

    def forward(self, x):
        return x @ self.weight.t(), None


def _layer(rank, world, spec):
    import torch.distributed as dist
    from megatron.core.model_parallel_config import ModelParallelConfig

    from fused_lce.integrations.megatron import FusedLCEColumnParallelLinear

    cfg = ModelParallelConfig(tensor_model_parallel_size=world, sequence_parallel=spec["sp"],
                              use_cpu_initialization=True, params_dtype=torch.float32)
    layer = FusedLCEColumnParallelLinear(D, V, config=cfg, init_method=torch.nn.init.normal_,
                                         bias=spec["bias"], gather_output=False,
                                         skip_weight_param_allocation=spec["tied"], tp_group=dist.group.WORLD,
                                         fused_lce_options=spec["options"])
    return layer


def _megatron_case(rank, world, spec):
    import torch.distributed as dist

    n = V // world
    w_shard = spec["w"][rank * n:(rank + 1) * n].clone()
    if spec["te"]:
        from fused_lce.integrations.megatron import convert_output_layer

        layer = convert_output_layer(FakeTELinear(w_shard, dist.group.WORLD, spec["sp"]), **spec["options"])
        tied = None
    else:
        layer = _layer(rank, world, spec)
        tied = torch.nn.Parameter(w_shard) if spec["tied"] else None  # the shared embedding weight shard
        with torch.no_grad():
            if not spec["tied"]:
                layer.weight.copy_(w_shard)
            if spec["bias"]:
                layer.bias.copy_(spec["b"][rank * n:(rank + 1) * n])
    weight = tied if tied is not None else layer.weight
    fired = {"pre": 0, "acc": 0}
    layer.register_forward_pre_hook(lambda *_: fired.__setitem__("pre", fired["pre"] + 1))
    weight.register_post_accumulate_grad_hook(lambda *_: fired.__setitem__("acc", fired["acc"] + 1))
    h = spec["h"]  # [s, b, h]
    if spec["sp"]:
        h = h.chunk(world, dim=0)[rank]
    h = h.clone().requires_grad_()
    loss = layer(h, labels=spec["y"], weight=tied, loss_mask=spec["mask"], **spec["call"])
    loss.backward(spec["g"])
    out = {"loss": loss.detach(), "dh": h.grad, "dw": weight.grad, "fired": dict(fired),
           "db": layer.bias.grad if spec["bias"] else None}
    if not spec["sp"]:  # the logits path; with sequence parallelism it needs megatron's CUDA buffer
        logits, bias = layer(h.detach(), weight=tied)
        out["logits"], out["logits_bias"] = logits, bias
    return out


def _run(pool, *, sp=False, tied=False, bias=False, te=False, options=None, call=None, mask_frac=0.2):
    world = pool.world
    options, call = dict(options or {}), dict(call or {})
    h, w = torch.randn(S, B, D), torch.randn(V, D) / D ** 0.5 * 2
    b = torch.randn(V) * 0.5 if bias else None
    y = torch.randint(0, V, (B, S))
    mask = (torch.rand(B, S) > mask_frac).float()
    reduction = {**options, **call}.get("reduction", "none")
    g = torch.rand(B, S) + 0.5 if reduction == "none" else torch.tensor(1.0)
    spec = {"h": h, "w": w, "b": b, "y": y, "mask": mask, "g": g, "sp": sp, "tied": tied,
            "bias": bias, "te": te, "options": options, "call": call}
    res = run_ok(pool, _megatron_case, spec)
    # reference in the batch-first layout Megatron's labels use
    opts = {k: v for k, v in {**options, **call}.items() if k not in ("backend", "tile_budget_mb")}
    opts["reduction"] = reduction
    hr, wr = h.double().requires_grad_(), w.double().requires_grad_()
    br = b.double().requires_grad_() if bias else None
    ii = opts.get("ignore_index", -100)
    ref = reference_loss(hr.transpose(0, 1), wr, torch.where(mask.bool(), y, torch.full_like(y, ii)), br,
                         **opts)[0]
    leaves = [hr, wr] + ([br] if bias else [])
    ref_grads = torch.autograd.grad(ref, leaves, g.double())
    ref = ref.detach()
    for r in res:
        assert r["loss"].shape == ref.shape
        assert float((r["loss"].double() - ref).abs().max()) \
            <= LOSS_TOL[torch.float32] * (1 + float(ref.abs().max()))
        assert r["fired"] == {"pre": 1, "acc": 1}, r["fired"]
    dh = torch.cat([r["dh"] for r in res]) if sp else res[0]["dh"]
    got = [dh, torch.cat([r["dw"] for r in res])] + ([torch.cat([r["db"] for r in res])] if bias else [])
    for name, ours, want in zip("hwb", got, ref_grads):
        assert rel_err(ours, want) <= GRAD_TOL[torch.float32], (name, rel_err(ours, want))
    if not sp:
        n = V // world
        for rank, r in enumerate(res):
            want = h @ w[rank * n:(rank + 1) * n].t() + (b[rank * n:(rank + 1) * n] if bias else 0)
            torch.testing.assert_close(r["logits"], want, rtol=1e-5, atol=1e-5)
            assert r["logits_bias"] is None
    return res


def test_import_does_not_need_megatron():
    code = ("import sys, fused_lce, fused_lce.integrations.megatron as m; "
            "assert not any(k.startswith('megatron') for k in sys.modules), 'megatron imported'; "
            "assert callable(m.fused_output_layer_class)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_te_style_base_single_process():
    """A TE-style base (forward(x) only, empty bias): the logits path is the base's, the loss path fused."""
    from fused_lce.integrations.megatron import convert_output_layer, fused_output_layer_class

    h, w, y = torch.randn(S, B, D, requires_grad=True), torch.randn(V, D), torch.randint(0, V, (B, S))
    layer = convert_output_layer(FakeTELinear(w.clone()), reduction="sum", label_smoothing=0.1)
    assert type(layer) is fused_output_layer_class(FakeTELinear) and isinstance(layer, FakeTELinear)
    logits, bias = layer(h)
    torch.testing.assert_close(logits, h @ w.t())
    loss = layer(h, labels=y)
    ref = reference_loss(h.detach().double().transpose(0, 1), w.double(), y, reduction="sum",
                         label_smoothing=0.1)[0]
    assert abs(float(loss.detach()) - float(ref)) <= 1e-5 * (1 + abs(float(ref)))
    per_token = layer(h, labels=y, reduction="none")
    assert per_token.shape == (B, S)
    with pytest.raises(TypeError, match="process_group"):
        layer(h, labels=y, process_group=None)
    with pytest.raises(TypeError, match="without labels"):
        layer(h, reduction="sum")
    with pytest.raises(ValueError, match="shift"):
        layer(h, labels=y, shift=True)
    with pytest.raises(ValueError, match="loss_mask"):
        layer(h, labels=y, loss_mask=torch.ones(S, B + 1))


def test_te_style_base_tp2(pools):
    pool = pools(2)
    _run(pool, te=True, options={"reduction": "none", "z_loss": 0.01})
    _run(pool, te=True, sp=True, options={"reduction": "sum"})


@pytest.mark.parametrize("world", [2, 4])
def test_native_column_parallel(pools, world):
    pytest.importorskip("megatron.core")
    pool = pools(world)
    _run(pool)  # untied, per-token [b, s] losses like compute_language_model_loss
    _run(pool, bias=True, call={"reduction": "sum", "label_smoothing": 0.1})
    _run(pool, tied=True, options={"reduction": "mean", "softcap": 3.0})
    _run(pool, sp=True, options={"reduction": "none", "z_loss": 0.02})
    _run(pool, sp=True, tied=True, bias=True, call={"reduction": "sum"}, mask_frac=1.0)  # every token masked


def test_native_errors(pools):
    pytest.importorskip("megatron.core")
    res = run_ok(pools(2), _errors_case, {})
    for r in res:
        assert "weight" in r["tied"] and "defer_embedding_wgrad_compute" in r["defer"]


def _errors_case(rank, world, spec):
    out = {}
    layer = _layer(rank, world, {"sp": False, "bias": False, "tied": True, "options": {}})
    h, y = torch.randn(S, B, D), torch.randint(0, V, (B, S))
    try:
        layer(h, labels=y)
    except ValueError as e:
        out["tied"] = str(e)
    layer = _layer(rank, world, {"sp": False, "bias": False, "tied": False, "options": {}})
    layer.config.defer_embedding_wgrad_compute = True
    try:
        layer(h, labels=y)
    except ValueError as e:
        out["defer"] = str(e)
    return out


# ------------------------------------------------------------------------------------------------ GPTModel
def _cpu_stand_ins():
    """megatron-core's attention takes a scratch buffer on the current CUDA device and forks the CUDA RNG (for
    dropout, 0 here): CPU stand-ins for both, in the worker processes only."""
    import contextlib

    from megatron.core import tensor_parallel, utils

    class NoFork:
        @contextlib.contextmanager
        def fork(self, *args, **kwargs):
            yield

    tensor_parallel.get_cuda_rng_tracker = lambda *args, **kwargs: NoFork()
    utils.GlobalMemoryBuffer.get_tensor = \
        lambda self, shape, dtype, name, *args, **kwargs: torch.empty(shape, dtype=dtype)


def _gpt_case(rank, world, spec):
    import warnings

    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from fused_lce.core import driver
    from fused_lce.integrations.megatron import convert_output_layer

    from .conftest import record_driver_calls

    _cpu_stand_ins()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    cfg = TransformerConfig(num_layers=2, hidden_size=D, num_attention_heads=4, use_cpu_initialization=True,
                            tensor_model_parallel_size=world, hidden_dropout=0.0,
                            attention_dropout=0.0, params_dtype=torch.float32)
    models = []
    for _ in range(2):
        torch.manual_seed(spec["seed"])
        models.append(GPTModel(cfg, get_gpt_layer_local_spec(), vocab_size=V, max_sequence_length=S,
                               share_embeddings_and_output_weights=spec["tied"]))
    stock, fused = models
    convert_output_layer(fused.output_layer, label_smoothing=0.0)
    ids, labels = spec["ids"], spec["labels"]
    pos = torch.arange(S).expand(B, S)
    mask = torch.ones(S, S, dtype=torch.bool).triu(1)[None, None]
    out = {}
    real = driver.forward, driver.logprobs_forward
    calls = record_driver_calls(setattr)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            losses = [m(ids, pos, mask, labels=labels) for m in (stock, fused)]
            (losses[0] * spec["g"]).sum().backward()
            (losses[1] * spec["g"]).sum().backward()
        out["calls"] = [(c.op, c.reduction, c.weight_shape) for c in calls]
        out["warnings"] = [str(w.message) for w in seen if "fused_lce" in str(w.message)]
        out["loss"], out["ref"] = losses[1].detach(), losses[0].detach()
        out["grads"] = {n: (p.grad, q.grad) for (n, p), q in zip(fused.named_parameters(),
                                                                 stock.parameters())}
        # without labels: the logits, unchanged
        with torch.no_grad():
            out["logits"] = (fused(ids, pos, mask), stock(ids, pos, mask))
        # multi-token prediction: not routed, says so
        fused.config.mtp_num_layers = 1
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                fused(ids, pos, mask, labels=labels)
            except Exception:  # noqa: BLE001 (this model has no MTP block: the stock path cannot run it)
                pass
        out["mtp"] = [str(w.message) for w in seen if "fused_lce" in str(w.message)]
    finally:
        driver.forward, driver.logprobs_forward = real
    return out


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_gpt_model_forward_is_routed_tp2(pools, tied):
    """convert_output_layer(model.output_layer) and the stock GPTModel.forward(labels=...): one fused call per
    forward (no logits), per-token [b, s] losses and every parameter's gradient equal to the unconverted
    model's; without labels the logits are unchanged; multi-token prediction is not routed and warns.
    (Sequence parallelism: megatron-core's norms need Apex or TE for it, absent on CPU; the fused layer's own
    sequence- parallel loss is tested above.)"""
    pytest.importorskip("megatron.core.models.gpt")
    seed = int(torch.randint(0, 2**31, ()))
    ids = torch.randint(0, V, (B, S))
    spec = {"seed": seed, "tied": tied, "ids": ids, "labels": torch.roll(ids, -1, 1),
            "g": torch.rand(B, S) + 0.5}
    for r in run_ok(pools(2), _gpt_case, spec):
        assert r["calls"] == [("loss", "none", (V // 2, D))], r["calls"]
        assert r["warnings"] == []
        assert r["loss"].shape == (B, S)
        torch.testing.assert_close(r["loss"], r["ref"], atol=1e-5, rtol=1e-5)
        for name, (ours, want) in r["grads"].items():
            torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-4,
                                       msg=lambda m: f"seed={seed} {name}: {m}")
        torch.testing.assert_close(*r["logits"])
        assert len(r["mtp"]) == 1 and "multi-token prediction" in r["mtp"][0], r["mtp"]


def test_layer_without_labels_in_training_warns():
    """A fused layer called without labels in a training step outside GPTModel returns the logits: the loss is
    not fused, and it says so once."""
    from fused_lce.integrations.megatron import convert_output_layer

    layer = convert_output_layer(FakeTELinear(torch.randn(V, D)))
    h = torch.randn(S, B, D, requires_grad=True)
    with pytest.warns(UserWarning, match="without labels in a training step"):
        logits, _ = layer(h)
    assert logits.shape == (S, B, V)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer(h)  # once per layer
        layer.eval()(h)  # eval / generation: no warning
