"""Random cases for tests/test_fuzz.py, run in batches in subprocesses (a crash takes down one batch, not
pytest).

    python -m tests.fuzz_cases <api|ops|numeric> <backend> <seed> <count>      (from the repository root)

prints one JSON line per case, ``{"i", "case", "ok", "why"}``, after a ``START i`` line (so a crash names its
case). A case is random shapes (zero-size dimensions included), dtypes, layouts (transposed, strided, expanded
inputs), options, and at most one bad value. A case with a bad value must raise ValueError/TypeError whose
message names the argument; every other case must give the float64 reference's answer (loss, lse, gradients,
with the tolerances of tests/conftest.py), or NaN exactly where a label is out of range and
``validate=False``. The ``numeric`` kind: valid inputs at the edges of float32 (ignored tokens with huge
logits, softcaps across their whole range), through the loss and the log-probs, against float64.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
import traceback

import torch

import fused_lce

from .conftest import (GRAD_TOL, LOGIT_TOL, LOSS_TOL, assert_grads_close, assert_loss_close, assert_lse_close,
                       fp64_reference, grad_close)
from .support import options_block

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LABEL_DTYPES = {"int64": torch.int64, "int32": torch.int32}


class Bad(Exception):
    """A case's expectation failed."""


# ------------------------------------------------------------------------------------------------ tensors
def _layout(gen: torch.Generator, shape, layout: str, make):
    """A tensor of ``shape`` built by ``make(shape)`` with the given memory layout (values from ``gen``)."""
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        dims = list(range(len(shape)))[::-1]
        return make(shape[::-1]).permute(*dims)
    if layout == "strided" and len(shape) >= 1:
        return make(shape[:-1] + (2 * shape[-1],))[..., ::2]
    if layout == "expanded" and len(shape) >= 1:
        return make((1,) * (len(shape) - 1) + (shape[-1],) if len(shape) > 1 else (1,)).expand(shape)
    return make(shape)


def _floats(gen, dtype, scale=1.0):
    return lambda shape: (torch.randn(shape, generator=gen) * scale).to(dtype)


def _ints(gen, dtype, high):
    return lambda shape: torch.randint(0, max(high, 1), shape, generator=gen).to(dtype)


# ------------------------------------------------------------------------------------------------ API cases
API_CORRUPTIONS = [  # (name, the argument the error must name)
    ("hidden_float64", "hidden"), ("hidden_int", "hidden"), ("hidden_list", "hidden"),
    ("hidden_0d", "hidden"), ("weight_dim", "weight"), ("weight_1d", "weight"), ("weight_dtype", "weight"),
    ("weight_list", "weight"), ("labels_shape", "labels"), ("labels_float", "labels"),
    ("labels_bool", "labels"), ("labels_uint8", "labels"), ("labels_range", "labels"),
    ("labels_device", "labels"), ("bias_shape", "bias"), ("bias_dtype", "bias"), ("bias_2d", "bias"),
    ("reduction", "reduction"), ("label_smoothing", "label_smoothing"), ("z_loss", "z_loss"),
    ("softcap", "softcap"), ("ignore_index", "ignore_index"), ("num_items", "num_items"),
    ("tile_budget_mb", "tile_budget_mb"), ("env_tile", "FUSED_LCE_TILE_MB"), ("shift_int", "shift"),
    ("shift_1d", "shift"), ("validate", "validate"), ("backend", "backend"),
    ("sequence_parallel", "process_group"), ("process_group", "process_group"),
]
BAD_VALUES = {
    "reduction": ["avg", None, "MEAN"],
    "label_smoothing": [-0.1, 1.5, math.nan, "0.1", True],
    "z_loss": [-1.0, math.inf, math.nan],
    "softcap": [0.0, -1.0, math.inf, math.nan, "2", 1e-50, 1e39],
    "ignore_index": [1.5, True, 2**64, -2**63 - 1, "x"],
    "num_items": [-1, math.nan, math.inf, "8", True, ("tensor", -2.0), ("tensor", math.nan),
                  ("tensor", math.inf), ("ones", 2), ("bool",), 1e-300, 10**400, ("tensor", 1e-300),
                  ("meta", 3.0)],
    "tile_budget_mb": [0, -1, math.nan, math.inf, "1"],
    "env_tile": ["abc", "-1", "0", "nan", "1e999"],
    "shift_int": [2, 1, 0, "yes"],
    "validate": ["yes", 1],
    "backend": ["cudnn", "", None],
    "process_group": ["abc", 3, ("object",)],
}


def api_case(rng: random.Random) -> dict:
    lead = rng.choice([(), (0,), (1,), (5,), (9,), (3, 4), (2, 0), (2, 3), (1, 7), (0, 3)])
    c = dict(
        lead=lead, d=rng.choice([0, 1, 3, 8]), v=rng.choice([0, 1, 2, 5, 17, 33]),
        dtype=rng.choice(["float32", "float32", "bfloat16", "float16"]),
        label_dtype=rng.choice(list(LABEL_DTYPES)),
        layout_h=rng.choice(["contiguous", "transposed", "strided", "expanded"]),
        layout_w=rng.choice(["contiguous", "transposed", "strided", "expanded"]),
        layout_y=rng.choice(["contiguous", "strided", "expanded"]),
        bias=rng.choice([None, None, "contiguous", "strided", "expanded", "masked"]),
        reduction=rng.choice(["mean", "sum", "none"]), label_smoothing=rng.choice([0.0, 0.0, 0.1, 1.0]),
        z_loss=rng.choice([0.0, 0.0, 1e-3]), softcap=rng.choice([None, None, 0.5, 30.0]),
        ignore_index=rng.choice([-100, -100, 0, 3, -1, 2**40]), ignore_frac=rng.choice([0.0, 0.3, 1.0]),
        shift=bool(lead) and rng.random() < 0.3,
        num_items=rng.choice([None, None, 0, 3, 2.5, ("tensor", 4.0)]), return_stats=rng.random() < 0.3,
        tile_budget_mb=rng.choice([None, None, 0.001, 1.0]), validate=rng.random() < 0.8, bad_labels=0,
        corruption=None, bad=None, data_seed=rng.randrange(2**31),
    )
    if c["bias"] == "masked":
        # the mean logit of a masked vocabulary is -inf: an infinite loss by definition
        c["label_smoothing"] = 0.0
    if not c["validate"] and rng.random() < 0.6:
        c["bad_labels"] = rng.choice([1, 3])
    if rng.random() < 0.5:
        name, arg = rng.choice(API_CORRUPTIONS)
        c["corruption"], c["expect"] = name, arg
        if name in BAD_VALUES:
            c["bad"] = rng.choice(BAD_VALUES[name])
        if name == "shift_1d":
            c["lead"], c["layout_y"], c["shift"] = (), "contiguous", False  # build_api asks for the shift
        if name == "labels_range":
            c["validate"], c["bad_labels"] = True, 1
        if name.startswith("bias"):
            c["bias"] = "contiguous"
    return c


def _scored_positions(y: torch.Tensor, shift: bool):
    """Flat indices of the label positions that are scored (with shift, labels[..., 1:])."""
    idx = torch.arange(y.numel()).reshape(y.shape)
    return (idx[..., 1:] if shift else idx).reshape(-1)


def build_api(c: dict, backend: str):
    """The call's arguments (and the bad-label mask of the scored tokens)."""
    gen = torch.Generator().manual_seed(c["data_seed"])
    dtype = DTYPES[c["dtype"]]
    lead, d, v = tuple(c["lead"]), c["d"], c["v"]
    h = _layout(gen, lead + (d,), c["layout_h"], _floats(gen, dtype))
    w = _layout(gen, (v, d), c["layout_w"], _floats(gen, dtype, 2 / max(d, 1) ** 0.5))
    b = None if c["bias"] is None else _layout(gen, (v,), c["bias"].replace("masked", "contiguous"),
                                               _floats(gen, dtype, 0.5))
    ii = c["ignore_index"]
    y = _layout(gen, lead, c["layout_y"], _ints(gen, LABEL_DTYPES[c["label_dtype"]], v))
    y = y.clone() if (c["ignore_frac"] or c["bad_labels"] or v == 0) else y
    if c["label_dtype"] == "int32" and not -2**31 <= ii < 2**31:
        y = y.long()
    if y.numel():
        drop = torch.rand(y.shape, generator=gen) < c["ignore_frac"]
        if v == 0:
            drop[...] = True  # an empty vocabulary has no valid label
        y[drop] = ii
    if c["bias"] == "masked" and v:  # a masked vocabulary: -inf on about half of the columns no label uses
        used = torch.zeros(v, dtype=torch.bool)
        used[y[(y >= 0) & (y < v)].long()] = True
        b = torch.where(~used & (torch.rand(v, generator=gen) < 0.5), torch.full_like(b, -math.inf), b)
    bad_mask = torch.zeros(y.shape, dtype=torch.bool)
    scored = _scored_positions(y, c["shift"])
    if c["bad_labels"] and scored.numel():
        for k in range(c["bad_labels"]):
            pos = scored[int(torch.randint(0, scored.numel(), (), generator=gen))]
            value = [v, -5, v + 1000][k % 3]
            if value == ii:
                value = v + 7
            y.view(-1)[pos] = value
            bad_mask.view(-1)[pos] = True
    kw = dict(ignore_index=ii, reduction=c["reduction"], label_smoothing=c["label_smoothing"],
              z_loss=c["z_loss"], softcap=c["softcap"], shift=c["shift"], num_items=c["num_items"],
              return_stats=c["return_stats"], backend=backend, validate=c["validate"],
              tile_budget_mb=c["tile_budget_mb"])
    if isinstance(kw["num_items"], tuple):
        kw["num_items"] = torch.tensor(kw["num_items"][1])
    args = dict(hidden=h, weight=w, labels=y, bias=b)
    env = None
    name, bad = c["corruption"], c["bad"]
    if name == "hidden_float64":
        args["hidden"], args["weight"] = h.double(), w.double()
        args["bias"] = None if b is None else b.double()
    elif name == "hidden_int":
        args["hidden"] = h.to(torch.int64)
    elif name == "hidden_list":
        args["hidden"] = h.tolist()
    elif name == "hidden_0d":
        args["hidden"], args["labels"] = (torch.randn((), generator=gen).to(dtype),
                                          torch.zeros((), dtype=torch.long))
    elif name == "weight_dim":
        args["weight"] = torch.randn(v, d + 1, generator=gen).to(dtype)
    elif name == "weight_1d":
        args["weight"] = torch.randn(v * max(d, 1), generator=gen).to(dtype)
    elif name == "weight_dtype":
        args["weight"] = w.to(torch.float16 if dtype != torch.float16 else torch.float32)
    elif name == "weight_list":
        args["weight"] = w.tolist()
    elif name == "labels_shape":
        args["labels"] = torch.zeros(lead[:-1] + (lead[-1] + 1,) if lead else (1,), dtype=torch.long)
    elif name == "labels_float":
        args["labels"] = y.float()
    elif name == "labels_bool":
        args["labels"] = y > 0
    elif name == "labels_uint8":
        args["labels"] = y.clamp(0, 255).to(torch.uint8)
    elif name == "labels_device":
        args["labels"] = y.to("meta")
    elif name == "bias_shape":
        args["bias"] = torch.randn(v + 1, generator=gen).to(dtype)
    elif name == "bias_dtype":
        args["bias"] = b.double()
    elif name == "bias_2d":
        args["bias"] = b[None]
    elif name == "num_items":
        if isinstance(bad, tuple):
            bad = {"tensor": lambda: torch.tensor(bad[1], dtype=torch.float64),
                   "ones": lambda: torch.ones(bad[1]), "bool": lambda: torch.tensor(True),
                   "meta": lambda: torch.tensor(bad[1], device="meta")}[bad[0]]()
        kw["num_items"] = bad
    elif name == "process_group":
        kw["process_group"] = object() if isinstance(bad, tuple) else bad
    elif name == "env_tile":
        env, kw["tile_budget_mb"] = bad, None  # the argument would win over the variable
    elif name == "shift_int":
        kw["shift"] = bad
    elif name == "shift_1d":
        kw["shift"] = True
    elif name == "sequence_parallel":
        kw["sequence_parallel"] = True
    elif name in BAD_VALUES:
        kw[name] = bad
    return args, kw, bad_mask, env


def run_api_case(c: dict, backend: str) -> None:
    args, kw, bad_mask, env = build_api(c, backend)
    if c["corruption"] == "labels_range" and not bad_mask.any():
        return  # no scored position to put a bad label in: nothing to check
    old_env = os.environ.pop("FUSED_LCE_TILE_MB", None)
    if env is not None:
        os.environ["FUSED_LCE_TILE_MB"] = env
    try:
        leaves = [t for t in (args["hidden"], args["weight"], args["bias"])
                  if isinstance(t, torch.Tensor) and t.is_floating_point()]
        for t in leaves:
            t.requires_grad_(True)
        inputs = leaves
        if c["corruption"]:
            try:
                fused_lce.linear_cross_entropy(**args, **kw)
            except (ValueError, TypeError) as e:
                if c["expect"] not in str(e):
                    raise Bad(f"{type(e).__name__} does not name {c['expect']!r}: {e}") from None
                return
            raise Bad(f"no error for {c['corruption']}={c['bad']!r}")
        out = fused_lce.linear_cross_entropy(**args, **kw)
        check_api_answer(c, args, kw, out, bad_mask, inputs)
    finally:
        os.environ.pop("FUSED_LCE_TILE_MB", None)
        if old_env is not None:
            os.environ["FUSED_LCE_TILE_MB"] = old_env


def check_api_answer(c, args, kw, out, bad_mask, inputs):
    dtype = DTYPES[c["dtype"]]
    h, w, y, b = args["hidden"], args["weight"], args["labels"], args["bias"]
    loss = out.loss if kw["return_stats"] else out
    if loss.dtype != torch.float32:
        raise Bad(f"loss dtype {loss.dtype}")
    shift, ii = kw["shift"], kw["ignore_index"]
    scored_bad = (bad_mask[..., 1:] if shift else bad_mask)
    y_ref = torch.where(bad_mask, torch.full_like(y, ii), y)  # the reference scores bad labels as ignored
    num = kw["num_items"]
    num = float(num) if isinstance(num, torch.Tensor) else num
    scored = (y[..., 1:] if shift else y).reshape(-1)
    if num is None and kw["reduction"] == "mean" and bool(scored_bad.any()):
        # our divisor counts the out-of-range labels: so must the reference's
        num = float((scored != ii).sum())
    g = torch.rand(loss.shape) if c["reduction"] == "none" else torch.ones(())
    ref = fp64_reference(h, w, y_ref, b, upstream=g, reduction=kw["reduction"], shift=shift, ignore_index=ii,
                         label_smoothing=kw["label_smoothing"], z_loss=kw["z_loss"], softcap=kw["softcap"],
                         num_items=num)
    any_bad = bool(scored_bad.any())
    if kw["reduction"] == "none":
        if loss.shape != scored_bad.shape or not torch.equal(loss.isnan(), scored_bad):
            raise Bad("NaN exactly at the out-of-range labels expected")
        good = ~scored_bad
        assert_loss_close(torch.where(good, loss.detach(), 0.0), ref._replace(
            loss=torch.where(good, ref.loss, 0.0)), dtype)
    elif any_bad:
        if not loss.isnan():
            raise Bad(f"loss {float(loss)} with out-of-range labels and validate=False (NaN expected)")
    else:
        assert_loss_close(loss, ref, dtype)
    # the reference scores an out-of-range label as ignored (lse 0): compare the others
    if kw["return_stats"]:
        assert_lse_close(torch.where(scored_bad, 0.0, out.lse), ref)
        if int(out.n_valid) != int(ref.n_valid) + int(scored_bad.sum()):
            raise Bad(f"n_valid {int(out.n_valid)}")
    if not inputs or not loss.requires_grad:
        return
    grads = torch.autograd.grad(loss, inputs, g, allow_unused=True)
    got = dict(zip([id(t) for t in inputs], grads))
    ours = tuple(got.get(id(t)) if isinstance(t, torch.Tensor) else None for t in (h, w, b))
    for name, t, gr in zip("hwb", (h, w, b), ours):
        if gr is not None and (gr.shape != t.shape or gr.dtype != t.dtype):
            raise Bad(f"d{name}: shape {tuple(gr.shape)} dtype {gr.dtype}")
    if not any_bad:
        assert_grads_close(ours, ref, dtype)
        return
    # out-of-range labels: their hidden rows are NaN, every other row is right; dW / db are poisoned
    rows = torch.zeros(h.shape[:-1], dtype=torch.bool)
    (rows[..., :-1] if shift else rows).copy_(scored_bad)
    dh = ours[0]
    if dh is not None and h.shape[-1] and w.shape[0]:
        if not dh[rows].isnan().all():
            raise Bad("dX rows of out-of-range labels are not NaN")
        ok, diff, tol = grad_close(dh[~rows], ref.grads[0][~rows], ref.grad_scales[0][~rows],
                                   ref.grad_logit_scales[0][~rows], dtype)
        if not ok:
            raise Bad(f"dX of the other rows: {diff} > {tol}")
    if ours[1] is not None and ours[1].numel() and not ours[1].isnan().any():
        raise Bad("dW not poisoned by an out-of-range label")


# ------------------------------------------------------------------------------------------------ op cases
OP_CORRUPTIONS = [  # (name, the argument the error must name)
    ("labels_short", "labels"), ("labels_long", "labels"), ("labels_float", "labels"),
    ("labels_2d", "labels"), ("bias_short", "bias"), ("bias_dtype", "bias"), ("hidden_3d", "hidden"),
    ("hidden_float64", "hidden"), ("weight_dim", "weight"), ("weight_dtype", "weight"), ("lse_short", "lse"),
    ("lse_int", "lse"), ("grad_loss_short", "grad_loss"), ("grad_loss_2d", "grad_loss"),
    ("grad_mask", "grad_mask"), ("label_smoothing", "label_smoothing"), ("z_loss", "z_loss"),
    ("softcap", "softcap"), ("tile_bytes", "tile_bytes"), ("vocab_start", "vocab_start"),
    ("vocab_total", "vocab_total"), ("shard", "group_name"), ("group_name", "group_name"),
    ("backend", "backend"), ("reduction", "reduction"), ("num_items", "num_items"), ("device", "labels"),
]
OP_BAD = {
    "label_smoothing": [-0.5, 2.0, math.nan], "z_loss": [-1e-3, math.inf, math.nan],
    "softcap": [-1.0, math.inf, math.nan, 1e-50, 1e39], "tile_bytes": [-1, -2**40], "vocab_start": [-3],
    "vocab_total": [1], "backend": ["nope"], "reduction": ["avg"], "group_name": ["no-such-group"],
    "num_items": [("tensor", -1.0), ("tensor", math.nan), ("ones", 3), ("bool",), ("tensor", 1e-300)],
}


def op_case(rng: random.Random) -> dict:
    c = dict(
        n=rng.choice([0, 1, 4, 13]), d=rng.choice([0, 1, 6]), v=rng.choice([0, 1, 3, 19]),
        dtype=rng.choice(["float32", "float32", "bfloat16", "float16"]),
        label_dtype=rng.choice(list(LABEL_DTYPES)),
        layout_h=rng.choice(["contiguous", "transposed", "strided", "expanded"]),
        layout_w=rng.choice(["contiguous", "transposed", "strided", "expanded"]),
        layout_y=rng.choice(["contiguous", "strided", "expanded"]),
        bias=rng.choice([None, "contiguous", "strided"]), reduction=rng.choice(["mean", "sum", "none"]),
        label_smoothing=rng.choice([0.0, 0.2]), z_loss=rng.choice([0.0, 1e-3]),
        softcap=rng.choice([0.0, 0.0, 4.0]), ignore_index=rng.choice([-100, 1]),
        num_items=rng.choice([None, None, 5.0, 0.0]), tile_bytes=rng.choice([0, 0, 64, 4096]),
        grad_mask=[rng.random() < 0.7 for _ in range(3)], bad_labels=rng.choice([0, 0, 0, 1]),
        op=rng.choice(["forward", "backward"]), corruption=None, bad=None, data_seed=rng.randrange(2**31),
    )
    if c["v"] == 0:
        c["bad_labels"] = 0  # every label is ignored below
    if rng.random() < 0.5:
        name, arg = rng.choice(OP_CORRUPTIONS)
        if name.startswith(("lse", "grad_loss")):
            c["op"] = "backward"
        if name in ("reduction", "num_items"):
            c["op"] = "forward"
        if name.startswith("bias"):
            c["bias"] = "contiguous"
        c["corruption"], c["expect"] = name, arg
        if name in OP_BAD:
            c["bad"] = rng.choice(OP_BAD[name])
    return c


def run_op_case(c: dict, backend: str) -> None:
    gen = torch.Generator().manual_seed(c["data_seed"])
    dtype = DTYPES[c["dtype"]]
    n, d, v = c["n"], c["d"], c["v"]
    h = _layout(gen, (n, d), c["layout_h"], _floats(gen, dtype))
    w = _layout(gen, (v, d), c["layout_w"], _floats(gen, dtype, 2 / max(d, 1) ** 0.5))
    b = None if c["bias"] is None else _layout(gen, (v,), c["bias"].replace("masked", "contiguous"),
                                               _floats(gen, dtype, 0.5))
    y = _layout(gen, (n,), c["layout_y"], _ints(gen, LABEL_DTYPES[c["label_dtype"]], v)).clone()
    ii = c["ignore_index"]
    if n:
        y[torch.rand(n, generator=gen) < 0.25] = ii
        if v == 0:
            y[:] = ii
    bad = torch.zeros(n, dtype=torch.bool)
    if c["bad_labels"] and n:
        k = int(torch.randint(0, n, (), generator=gen))
        y[k], bad[k] = v + 3, True
    opts = dict(ignore_index=ii, label_smoothing=c["label_smoothing"], z_loss=c["z_loss"],
                softcap=c["softcap"], backend=backend, group_name="", vocab_start=0, vocab_total=0,
                tile_bytes=c["tile_bytes"])
    num = None if c["num_items"] is None else torch.tensor(c["num_items"])
    red, mask = c["reduction"], list(c["grad_mask"])
    g_tok = torch.rand(n, generator=gen)
    lse = torch.randn(n, generator=gen)
    name, badv = c["corruption"], c["bad"]
    if name:
        if name == "labels_short":
            y = y[: max(n - 1, 0)] if n else torch.zeros(1, dtype=y.dtype)
        elif name == "labels_long":
            y = torch.zeros(n + 1, dtype=y.dtype)
        elif name == "labels_float":
            y = y.float()
        elif name == "labels_2d":
            y = y[None]
        elif name == "bias_short":
            b = b[: max(v - 1, 0)] if v else torch.zeros(1, dtype=dtype)
        elif name == "bias_dtype":
            b = b.double()
        elif name == "hidden_3d":
            h = h[None]
        elif name == "hidden_float64":
            h, w = h.double(), w.double()
            b = None if b is None else b.double()
        elif name == "weight_dim":
            w = torch.zeros(v, d + 1, dtype=dtype)
        elif name == "weight_dtype":
            w = w.to(torch.float16 if dtype != torch.float16 else torch.float32)
        elif name == "lse_short":
            lse = torch.zeros(n + 1) if n == 0 else lse[:-1]
        elif name == "lse_int":
            lse = lse.long()
        elif name == "grad_loss_short":
            g_tok = torch.zeros(n + 2)
        elif name == "grad_loss_2d":
            g_tok = g_tok[None]
        elif name == "grad_mask":
            mask = mask[:2]
        elif name == "device":
            y = y.to("meta")
        elif name == "shard":
            opts.update(vocab_start=1, vocab_total=v + 5)
        elif name == "vocab_total":
            if v <= 1:
                return  # vocab_total=1 is no error for V <= 1
            opts["vocab_total"] = badv
        elif name == "reduction":
            red = badv
        elif name == "num_items":
            num = {"tensor": lambda: torch.tensor(badv[1], dtype=torch.float64),
                   "ones": lambda: torch.ones(badv[1]), "bool": lambda: torch.tensor(True)}[badv[0]]()
        else:
            opts[name] = badv
    block = options_block(**opts)
    call = (lambda: torch.ops.fused_lce.forward(h, w, y, b, num, red, *block, mask)) \
        if c["op"] == "forward" else \
        (lambda: torch.ops.fused_lce.backward(g_tok, h, w, y, b, lse, None, "none", *block, mask))
    if name:
        try:
            call()
        except (ValueError, TypeError) as e:
            if c["expect"] not in str(e):
                raise Bad(f"{type(e).__name__} does not name {c['expect']!r}: {e}") from None
            return
        raise Bad(f"no error for {name}={badv!r}")
    ref_kw = dict(ignore_index=ii, label_smoothing=c["label_smoothing"], z_loss=c["z_loss"],
                  softcap=c["softcap"] or None)
    y_ref = torch.where(bad, torch.full_like(y, ii), y)
    if c["op"] == "forward":
        loss, lse_o, correct, dh, dw, db = call()
        ref = fp64_reference(h, w, y_ref, b, reduction=red, num_items=c["num_items"], **ref_kw)
        if red == "none":
            if not torch.equal(loss.isnan(), bad):
                raise Bad("NaN exactly at the out-of-range label expected")
            assert_loss_close(torch.where(bad, 0.0, loss), ref._replace(loss=torch.where(bad, 0.0, ref.loss)),
                              dtype)
        elif bad.any():
            if not loss.isnan():
                raise Bad("loss not NaN with an out-of-range label")
        else:
            assert_loss_close(loss, ref, dtype)
        assert_lse_close(torch.where(bad, 0.0, lse_o), ref)  # the reference's lse is 0 at out-of-range labels
        fused = red != "none" and any(mask[:2] + [mask[2] and b is not None])
        for k, (t, like) in enumerate(zip((dh, dw, db), (h, w, b))):
            want = fused and mask[k] and like is not None
            if not want and t.numel():
                raise Bad(f"forward returned gradient {k} that was not asked for")
            if want and (t.shape != like.shape or t.dtype != like.dtype):
                raise Bad(f"forward gradient {k}: {tuple(t.shape)} {t.dtype}")
        if fused and not bad.any():
            assert_grads_close(tuple(t if mask[k] and like is not None else None
                                     for k, (t, like) in enumerate(zip((dh, dw, db), (h, w, b)))), ref, dtype)
        return
    dh, dw, db = call()
    ref = fp64_reference(h, w, y_ref, b, reduction="none", upstream=g_tok, **ref_kw)
    # the recompute path takes the saved lse: give it the true one (a random lse is a valid input, not a
    # check)
    got = torch.ops.fused_lce.backward(g_tok, h, w, y, b, ref.lse.float(), None, "none", *block, mask)
    for k, (t, like) in enumerate(zip(got, (h, w, b))):
        want = mask[k] and like is not None
        if want and (t.shape != like.shape or t.dtype != like.dtype):
            raise Bad(f"backward gradient {k}: {tuple(t.shape)} {t.dtype}")
        if not want and t.numel():
            raise Bad(f"backward returned gradient {k} that was not asked for")
    if not bad.any():
        assert_grads_close(tuple(t if (mask[k] and like is not None) else None
                                 for k, (t, like) in enumerate(zip(got, (h, w, b)))), ref, dtype)
    elif mask[0] and d and v and not got[0][bad].isnan().all():
        raise Bad("dX row of the out-of-range label is not NaN")


# ---------------------------------------------------------------------------------------------- numeric cases
# Valid inputs at the edges of float32, no bad value: every case must give the float64 answer, and exact zeros
# for ignored tokens. Two classes:
#   ignored_large: ignored tokens whose (tempered) logits are far beyond exp's float32 range (~88): logits of
#       1e2..1e4, or log-probs at a low temperature (RL sampling); their saved lse is 0 by contract
#   softcap: softcaps across the range Options accepts, log-uniform over [1e-3, 3.4e38] plus 2**-126, 1e4,
#       1e30 and the largest float32 (a large softcap must leave the logits as they are)
F32_MAX = 3.4028234663852886e38
NUMERIC_CLASSES = ("ignored_large", "softcap")


def numeric_case(rng: random.Random) -> dict:
    c = dict(
        cls=rng.choice(NUMERIC_CLASSES), op=rng.choice(["loss", "logprobs"]), n=rng.choice([1, 4, 13, 29]),
        d=rng.choice([1, 3, 8]), v=rng.choice([1, 2, 17, 97]), bias=rng.random() < 0.5,
        dtype=rng.choice(["float32", "float32", "bfloat16"]), ignore_frac=rng.choice([0.0, 0.3, 0.7]),
        reduction=rng.choice(["mean", "sum", "none"]), label_smoothing=0.0, z_loss=0.0, softcap=None,
        temperature=1.0, entropy=rng.random() < 0.5, scale=1.0, tile_budget_mb=rng.choice([None, 0.001]),
        data_seed=rng.randrange(2**31), corruption=None,
    )
    if c["cls"] == "ignored_large":
        c["ignore_frac"] = max(c["ignore_frac"], 0.3)
        if c["op"] == "logprobs" and rng.random() < 0.5:
            c["temperature"], c["scale"] = math.exp(rng.uniform(math.log(0.005), math.log(0.1))), 3.0
        else:
            c["scale"] = rng.choice([100.0, 300.0, 1000.0])
        c["softcap"] = rng.choice([None, None, 1e4, 1e30])
    else:
        spread = math.exp(rng.uniform(math.log(1e-3), math.log(F32_MAX)))
        c["softcap"] = rng.choice([spread] * 4 + [2.0**-126, 1e4, 1e30, F32_MAX])
        c["scale"] = rng.choice([1.0, 10.0])
        c["temperature"] = rng.choice([1.0, 0.7, 1.5]) if c["op"] == "logprobs" else 1.0
    if c["op"] == "loss":
        c["label_smoothing"], c["z_loss"] = rng.choice([0.0, 0.0, 0.1]), rng.choice([0.0, 0.0, 1e-3])
    return c


def run_numeric_case(c: dict, backend: str) -> None:
    from fused_lce.core.formulas import reference_logprobs

    gen = torch.Generator().manual_seed(c["data_seed"])
    dtype = DTYPES[c["dtype"]]
    n, d, v = c["n"], c["d"], c["v"]
    h = (torch.randn(n, d, generator=gen) * c["scale"]).to(dtype).requires_grad_()
    w = (torch.randn(v, d, generator=gen) * 2 / d ** 0.5).to(dtype).requires_grad_()
    b = (torch.randn(v, generator=gen) * 0.5).to(dtype).requires_grad_() if c["bias"] else None
    y = torch.randint(0, v, (n,), generator=gen)
    y[torch.rand(n, generator=gen) < c["ignore_frac"]] = -100
    if c["cls"] == "ignored_large":
        y[0] = -100
    leaves = [t for t in (h, w, b) if t is not None]
    if c["op"] == "loss":
        opts = dict(label_smoothing=c["label_smoothing"], z_loss=c["z_loss"], softcap=c["softcap"])
        out = fused_lce.linear_cross_entropy(h, w, y, b, reduction=c["reduction"], backend=backend,
                                             tile_budget_mb=c["tile_budget_mb"], return_stats=True, **opts)
        g = torch.rand(n, generator=gen) if c["reduction"] == "none" else torch.ones(())
        grads = torch.autograd.grad(out.loss, leaves, g)
        ref = fp64_reference(h, w, y, b, upstream=g, reduction=c["reduction"], **opts)
        assert_loss_close(out.loss, ref, dtype)
        assert_lse_close(out.lse, ref)
        assert_grads_close(tuple(grads) + (None,) * (3 - len(grads)), ref, dtype)
    else:
        kw = dict(temperature=c["temperature"], softcap=c["softcap"])
        lp, ent = fused_lce.linear_logprobs(h, w, y, b, return_entropy=True, backend=backend,
                                            tile_budget_mb=c["tile_budget_mb"], **kw)
        g_lp, g_ent = torch.randn(n, generator=gen), torch.randn(n, generator=gen) * c["entropy"]
        grads = torch.autograd.grad((lp * g_lp + ent * g_ent).sum(), leaves)
        xs = [t.detach().double().requires_grad_() for t in leaves]
        rlp, rent = reference_logprobs(xs[0], xs[1], y, xs[2] if b is not None else None, **kw)
        want = torch.autograd.grad((rlp * g_lp.double() + rent * g_ent.double()).sum(), xs)
        zmag, floors = logprob_magnitudes(h, w, b, y, g_lp, g_ent, **kw)
        for name, ours, ref_v in (("logprob", lp, rlp.detach()), ("entropy", ent, rent.detach())):
            err = float((ours.detach().double() - ref_v).abs().max()) if n else 0.0
            if not err <= LOSS_TOL[dtype] * (1 + max(float(ref_v.abs().max()) if n else 0.0, zmag)):
                raise Bad(f"{name}: error {err:.3g} (logits up to {zmag:.3g})")
        for name, ours, ref_g, floor in zip("hwb", grads, want, floors):
            diff = float((ours.double() - ref_g).norm())
            tol = GRAD_TOL[dtype] * float(ref_g.norm()) + floor
            if not (torch.isfinite(ours).all() and diff <= tol):
                raise Bad(f"d{name}: error {diff:.3g} > {tol:.3g} (|d{name}| {float(ref_g.norm()):.3g})")
        if not ((lp[y == -100] == 0).all() and (ent[y == -100] == 0).all()):
            raise Bad("log-prob / entropy of an ignored token not 0")
    if not (grads[0][y == -100] == 0).all():
        raise Bad("dX row of an ignored token not exactly 0")


def logprob_magnitudes(h, w, b, y, g_lp, g_ent, *, temperature=1.0, softcap=None):
    """(max |z| of the capped, tempered logits; the rounding floor of each gradient's error) in float64: as
    tests/support/reference.py models the loss's, LOGIT_TOL times the magnitudes of dz's terms, ``p (|g_lp|
    + |g_ent| (|z| + |E_p z|))`` and ``|g_lp|`` at the label, over the temperature, times the softcap
    derivative's terms 1 + tanh^2, times the logits' magnitudes (the softmax inherits their error), spread by
    the GEMMs."""
    from fused_lce.core.formulas import reference_logits

    hd, wd = h.detach().double(), w.detach().double()
    bd = None if b is None else b.detach().double()
    z = reference_logits(hd, wd, bd, softcap=softcap, temperature=temperature)
    zmag = hd.abs() @ wd.abs().t() + (0.0 if bd is None else bd.abs())
    dcap = torch.ones_like(z)
    if softcap:
        t = reference_logits(hd, wd, bd, softcap=softcap) / softcap  # tanh(raw / softcap)
        dcap, zmag = 1 + t * t, zmag + zmag.clamp(max=softcap)
    zmag = zmag / temperature
    if not z.numel():
        return 0.0, (0.0, 0.0, 0.0)
    p = torch.softmax(z, -1)
    valid = (y != -100)[:, None]
    onehot = torch.zeros_like(z).scatter_(1, y.clamp(min=0)[:, None], 1.0)
    zmean = (p * z).sum(-1, keepdim=True)
    terms = (g_lp.double().abs()[:, None] * (p + onehot) +
             g_ent.double().abs()[:, None] * p * (z.abs() + zmean.abs())) / temperature * dcap
    terms = torch.where(valid, terms * (1 + zmag + zmag.amax(-1, keepdim=True)), 0.0)
    floors = (LOGIT_TOL * float((terms @ wd.abs()).norm()), LOGIT_TOL * float((terms.t() @ hd.abs()).norm()),
              LOGIT_TOL * float(terms.sum(0).norm()))
    return float(z.abs().max()), floors


# ------------------------------------------------------------------------------------------------ main
KINDS = {"api": (api_case, run_api_case), "ops": (op_case, run_op_case),
         "numeric": (numeric_case, run_numeric_case)}


def main(argv) -> int:
    kind, backend, seed, count = argv[0], argv[1], int(argv[2]), int(argv[3])
    rng = random.Random(seed)
    make, run = KINDS[kind]
    torch.manual_seed(seed)
    for i in range(count):
        c = make(rng)
        print(f"START {i}", flush=True)
        try:
            run(c, backend)
            ok, why = True, ""
        except Bad as e:
            ok, why = False, str(e)
        except AssertionError as e:
            ok, why = False, f"AssertionError {e}"
        except Exception as e:  # an error that is not a clear ValueError/TypeError naming the argument
            ok, why = False, f"{type(e).__name__}: {e} | {traceback.format_exc(limit=-3)}"
        print(json.dumps({"i": i, "ok": ok, "why": why[:1500], "case": c}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
