"""fused_lce.patch (fused_lce.integrations.hf.api / runtime) on every supported Qwen class (tiny random
configs, no downloads): loss and every parameter gradient equal to the stock forward, and the HF semantics
(label shift, shift_labels, num_items_in_batch, logits_to_keep, eval/no-labels logits, skip_logits, no_grad,
return_dict=False, gradient checkpointing, PEFT)."""
from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import fused_lce  # noqa: E402
from fused_lce.integrations import hf  # noqa: E402

V = 256
TEXT = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=128, bos_token_id=None,
            eos_token_id=None, pad_token_id=0)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, router_aux_loss_coef=0.05)
LINEAR_ATTN = dict(linear_conv_kernel_dim=2, linear_key_head_dim=8, linear_value_head_dim=8,
                   linear_num_key_heads=2, linear_num_value_heads=4,
                   layer_types=["linear_attention", "full_attention"])
MROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
IMAGE_TOKENS = dict(image_token_id=250, video_token_id=251, vision_start_token_id=252,
                    vision_end_token_id=253)
VISION2 = dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, patch_size=2, spatial_merge_size=2,
               temporal_patch_size=2)
VISION25 = dict(depth=1, hidden_size=16, intermediate_size=32, out_hidden_size=32, num_heads=2, patch_size=2,
                spatial_merge_size=2, temporal_patch_size=2, window_size=8, fullatt_block_indexes=[0])
VISION3 = dict(depth=1, hidden_size=16, intermediate_size=32, out_hidden_size=32, num_heads=2, patch_size=2,
               spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
               deepstack_visual_indexes=[0])


def _text(**extra):
    return {**TEXT, **extra}


# class name -> (config class name, kwargs builder); built lazily so a missing class only skips its own test
CONFIGS = {
    "Qwen2ForCausalLM": ("Qwen2Config", lambda tie: _text(tie_word_embeddings=tie)),
    "Qwen2MoeForCausalLM": ("Qwen2MoeConfig", lambda tie: _text(
        tie_word_embeddings=tie, shared_expert_intermediate_size=16, output_router_logits=True, **MOE)),
    "Qwen3ForCausalLM": ("Qwen3Config", lambda tie: _text(tie_word_embeddings=tie)),
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", lambda tie: _text(
        tie_word_embeddings=tie, output_router_logits=True, **MOE)),
    "Qwen3NextForCausalLM": ("Qwen3NextConfig", lambda tie: _text(
        tie_word_embeddings=tie, shared_expert_intermediate_size=16, output_router_logits=True, **MOE,
        **LINEAR_ATTN)),
    "Qwen3_5ForCausalLM": ("Qwen3_5TextConfig", lambda tie: _text(tie_word_embeddings=tie, **LINEAR_ATTN)),
    "Qwen3_5ForConditionalGeneration": ("Qwen3_5Config", lambda tie: dict(
        text_config=_text(rope_parameters={**MROPE, "partial_rotary_factor": 1.0}, **LINEAR_ATTN),
        vision_config=VISION3, tie_word_embeddings=tie, **IMAGE_TOKENS)),
    "Qwen3_5MoeForCausalLM": ("Qwen3_5MoeTextConfig", lambda tie: _text(
        tie_word_embeddings=tie, output_router_logits=True, **MOE, **LINEAR_ATTN)),
    "Qwen3_5MoeForConditionalGeneration": ("Qwen3_5MoeConfig", lambda tie: dict(
        text_config=_text(rope_parameters={**MROPE, "partial_rotary_factor": 1.0}, **MOE, **LINEAR_ATTN),
        vision_config=VISION3, tie_word_embeddings=tie, **IMAGE_TOKENS)),
    "Qwen2VLForConditionalGeneration": ("Qwen2VLConfig", lambda tie: dict(
        text_config=_text(rope_parameters=MROPE), vision_config=VISION2, tie_word_embeddings=tie,
        **IMAGE_TOKENS)),
    "Qwen2_5_VLForConditionalGeneration": ("Qwen2_5_VLConfig", lambda tie: dict(
        text_config=_text(rope_parameters=MROPE), vision_config=VISION25, tie_word_embeddings=tie,
        **IMAGE_TOKENS)),
    "Qwen3VLForConditionalGeneration": ("Qwen3VLConfig", lambda tie: dict(
        text_config=_text(rope_parameters=MROPE), vision_config=VISION3, tie_word_embeddings=tie,
        **IMAGE_TOKENS)),
    "Qwen3VLMoeForConditionalGeneration": ("Qwen3VLMoeConfig", lambda tie: dict(
        text_config=_text(rope_parameters=MROPE, **MOE), vision_config=VISION3, tie_word_embeddings=tie,
        **IMAGE_TOKENS)),
}
VL = {n for n in CONFIGS if n.endswith("ConditionalGeneration")}
MOE_CLASSES = {n for n in CONFIGS if "Moe" in n or "Next" in n}


def build(name, tie=False, seed=0):
    """A tiny random model of class ``name`` in float32 (skips if the installed transformers lacks it)."""
    cls = getattr(transformers, name, None)
    cfg_cls = getattr(transformers, CONFIGS[name][0], None)
    if cls is None or cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls(cfg_cls(**CONFIGS[name][1](tie)))
    return model.float().train()


def pair(name, tie=False, seed=0, **options):
    stock = build(name, tie, seed)
    fused = copy.deepcopy(stock)
    fused_lce.patch(fused, **options)
    return stock, fused


def batch(seed, b=3, t=11, pad=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 240, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    labels = ids.clone()
    labels[:, :3] = -100  # prompt
    if pad:  # right padding, as DataCollatorForSeq2Seq
        n = int(torch.randint(1, t // 2, (1,), generator=g))
        ids[-1, -n:] = 0
        mask[-1, -n:] = 0
        labels[-1, -n:] = -100
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def image_batch(seed):
    """Text with one 4x4-patch image (4 image tokens after 2x2 merging) in the first row."""
    g = torch.Generator().manual_seed(seed)
    inputs = batch(seed, b=2, t=12, pad=False)
    ids = inputs["input_ids"]
    ids[0, 2], ids[0, 3:7], ids[0, 7] = 252, 250, 253
    inputs["labels"] = torch.where((ids >= 250) | (inputs["labels"] < 0), -100, ids)
    inputs["pixel_values"] = torch.randn(16, 3 * 2 * 2 * 2, generator=g)
    inputs["image_grid_thw"] = torch.tensor([[1, 4, 4]])
    inputs["mm_token_type_ids"] = (ids == 250).int()
    return inputs


def grads(model):
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def assert_same(stock, fused, inputs, seed, fused_expected=True, atol=1e-5, rtol=1e-4):
    """Run both models on ``inputs``; same loss and same gradient for every parameter."""
    for m in (stock, fused):
        m.zero_grad(set_to_none=True)
    ref = stock(**inputs)
    out = fused(**inputs)
    assert (out.logits is None) == fused_expected, f"seed={seed}: fused path ran: {out.logits is None}"
    torch.testing.assert_close(out.loss, ref.loss, atol=atol, rtol=rtol,
                               msg=lambda m: f"seed={seed}: loss: {m}")
    ref.loss.backward()
    out.loss.backward()
    g_ref, g_out = grads(stock), grads(fused)
    assert g_ref.keys() == g_out.keys()
    n_checked = 0
    for name, g in g_ref.items():
        if g is None:
            assert g_out[name] is None, f"seed={seed}: {name}: gradient only in the fused model"
            continue
        assert g_out[name] is not None, f"seed={seed}: {name}: no gradient in the fused model"
        torch.testing.assert_close(g_out[name], g, atol=atol, rtol=rtol,
                                   msg=lambda m: f"seed={seed}: {name}: {m}")
        n_checked += 1
    assert n_checked > 0
    return ref, out


# ------------------------------------------------------------------------------------------------ every class
# every class with an untied head; tied heads (lm_head.weight is embed_tokens.weight) on three representatives
CLASS_CASES = [pytest.param(n, False, id=n) for n in CONFIGS] + [
    pytest.param(n, True, id=f"{n}-tied")
    for n in ("Qwen3ForCausalLM", "Qwen3_5ForCausalLM", "Qwen2VLForConditionalGeneration")]


@pytest.mark.parametrize("name,tie", CLASS_CASES)
def test_every_class_matches_stock(name, tie, seed):
    stock, fused = pair(name, tie=tie, seed=seed)
    if tie:
        assert fused.get_output_embeddings().weight is fused.get_input_embeddings().weight
    inputs = batch(seed)
    ref, out = assert_same(stock, fused, inputs, seed)
    assert type(out) is type(ref)
    if name in MOE_CLASSES:
        cfg = stock.config.get_text_config()
        kw = {} if getattr(cfg, "output_router_logits", False) else {"output_router_logits": True}
        if kw:  # VL MoE wrappers only take it as a forward kwarg
            ref, out = assert_same(stock, fused, {**inputs, **kw}, seed)
        assert out.aux_loss is not None and out.aux_loss.item() > 0
        torch.testing.assert_close(out.aux_loss, ref.aux_loss)
        # the router aux loss is in the loss, as in the stock forward
        logits = stock(**{k: v for k, v in inputs.items() if k != "labels"}).logits
        ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), inputs["labels"][:, 1:].flatten())
        coef = cfg.router_aux_loss_coef
        torch.testing.assert_close(out.loss, ce + coef * out.aux_loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(VL))
def test_vl_image_inputs_pass_through(name, seed):
    stock, fused = pair(name, seed=seed)
    inputs = image_batch(seed)
    assert_same(stock, fused, inputs, seed)
    # the image changed the loss: the vision tower ran and its gradients were compared above
    no_image = {k: v for k, v in inputs.items()
                if k not in ("pixel_values", "image_grid_thw", "mm_token_type_ids")}
    no_image["input_ids"] = torch.where(no_image["input_ids"] >= 250, 1, no_image["input_ids"])
    with torch.no_grad():
        assert not torch.allclose(fused(**inputs).loss, fused(**no_image).loss)
    assert any(n.startswith(("model.visual", "visual")) and g is not None for n, g in grads(fused).items())


def test_unsupported_model_raises_listing_supported():
    cfg = transformers.LlamaConfig(**{k: v for k, v in TEXT.items() if k != "head_dim"})
    model = transformers.LlamaForCausalLM(cfg)
    with pytest.raises(ValueError, match="LlamaForCausalLM is not supported.*Qwen3ForCausalLM.*Qwen3VL"):
        fused_lce.patch(model)
    with pytest.raises(TypeError, match="model"):
        fused_lce.patch(torch.zeros(3))


def test_bad_options():
    model = build("Qwen3ForCausalLM")
    with pytest.raises(TypeError, match="reduction"):
        fused_lce.patch(model, reduction="sum")
    with pytest.raises(TypeError, match="unexpected option.*bogus"):
        fused_lce.patch(model, bogus=1)
    with pytest.raises(ValueError, match="label_smoothing"):
        fused_lce.patch(model, label_smoothing=2.0)
    with pytest.raises(TypeError, match="skip_logits"):
        fused_lce.patch(model, skip_logits="yes")
    with pytest.raises(ValueError, match="backend"):
        fused_lce.patch(model, backend="bogus")
    assert not hf.is_patched(model)


# ------------------------------------------------------------------------------------------------ semantics
def test_shift_labels_win_over_labels(seed):
    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    inputs = batch(seed)
    shift = torch.roll(inputs["labels"], -1, dims=1)
    shift[:, -1] = -100
    shift[0, 5] = -100
    # labels are garbage: shift_labels must be used, unshifted
    inputs = {**inputs, "labels": torch.randint(0, V, shift.shape), "shift_labels": shift}
    assert_same(stock, fused, inputs, seed)


def test_num_items_in_batch_sum_normalisation(seed):
    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    inputs = batch(seed)
    n = int((inputs["labels"][:, 1:] != -100).sum())
    for num_items in (torch.tensor(n + 7), n + 7):
        ref, out = assert_same(stock, fused, {**inputs, "num_items_in_batch": num_items}, seed)
    mean = fused(**inputs).loss
    torch.testing.assert_close(out.loss, mean * n / (n + 7))


def test_logits_to_keep(seed):
    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    inputs = batch(seed, pad=False)
    k = 4
    # with labels: they describe the kept positions, as the stock loss requires
    kept = {**inputs, "labels": inputs["labels"][:, -k:], "logits_to_keep": k}
    assert_same(stock, fused, kept, seed)
    with pytest.raises(ValueError, match="logits_to_keep"):
        fused(**inputs, logits_to_keep=k)  # full-length labels for 4 kept positions
    # no labels: real logits of the kept positions
    no_labels = {k_: v for k_, v in inputs.items() if k_ != "labels"}
    out = fused(**no_labels, logits_to_keep=k)
    torch.testing.assert_close(out.logits, stock(**no_labels, logits_to_keep=k).logits)
    assert out.logits.shape == (3, k, V)


def test_eval_and_no_labels_return_logits(seed):
    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    inputs = batch(seed)
    no_labels = {k: v for k, v in inputs.items() if k != "labels"}
    out = fused(**no_labels)  # training mode, no labels
    assert out.loss is None
    torch.testing.assert_close(out.logits, stock(**no_labels).logits)
    stock.eval()
    fused.eval()
    # eval with labels: stock path, loss and logits (compute_metrics)
    out, ref = fused(**inputs), stock(**inputs)
    assert out.logits is not None
    torch.testing.assert_close(out.logits, ref.logits)
    torch.testing.assert_close(out.loss, ref.loss)
    gen = fused.generate(inputs["input_ids"][:, :4], max_new_tokens=3, do_sample=False)
    torch.testing.assert_close(gen, stock.generate(inputs["input_ids"][:, :4], max_new_tokens=3,
                                                   do_sample=False))


def test_skip_logits_override(seed):
    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    inputs = batch(seed)
    assert fused(**inputs, skip_logits=False).logits is not None  # training, forced stock
    stock.eval()
    fused.eval()
    assert_same(stock, fused, {**inputs}, seed, fused_expected=False)
    out = fused(**inputs, skip_logits=True)  # eval, forced fused
    assert out.logits is None
    torch.testing.assert_close(out.loss, stock(**inputs).loss)
    with pytest.raises(ValueError, match="skip_logits=True: expected labels"):
        fused(input_ids=inputs["input_ids"], skip_logits=True)
    fused_lce.patch(fused, skip_logits=True)  # as a patch option
    assert fused(**inputs).logits is None
    fused_lce.patch(fused, skip_logits=False)
    fused.train()
    assert fused(**inputs).logits is not None


def test_all_labels_ignored_gives_zero(seed):
    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    inputs = batch(seed)
    inputs["labels"] = torch.full_like(inputs["labels"], -100)
    out = fused(**inputs)
    assert out.loss.item() == 0.0  # stock: NaN (0/0); documented difference
    out.loss.backward()
    assert all(g is None or torch.all(g == 0) for g in grads(fused).values())


def test_no_grad(seed):
    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    inputs = batch(seed)
    with torch.no_grad():
        out, ref = fused(**inputs), stock(**inputs)
    assert out.logits is None and out.loss.grad_fn is None
    torch.testing.assert_close(out.loss, ref.loss)


def test_return_dict_false(seed):
    """HF's tuple layout is kept, with None where the logits were: ``loss, logits = out[:2]`` style unpacking
    never silently gets another field."""
    stock, fused = pair("Qwen3MoeForCausalLM", seed=seed)
    inputs = batch(seed)
    out, ref = fused(**inputs, return_dict=False), stock(**inputs, return_dict=False)
    assert isinstance(out, tuple) and len(out) == len(ref)
    torch.testing.assert_close(out[0], ref[0])
    torch.testing.assert_close(out[1], ref[1])  # aux_loss
    assert ref[2].shape == (3, 11, V) and out[2] is None  # the logits' slot
    assert type(out[3]) is type(ref[3])  # the cache
    fused.eval()  # the stock path keeps the stock tuple
    out = fused(**inputs)
    assert out[2].shape == (3, 11, V)


def _checkpointing(model, reentrant):
    kw = {"use_reentrant": reentrant}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_gradient_checkpointing(reentrant, seed):
    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    for m in (stock, fused):
        _checkpointing(m, reentrant)
    assert fused.model.gradient_checkpointing
    assert_same(stock, fused, batch(seed), seed)


def test_gradient_checkpointing_with_lora(seed):
    stock, fused = _peft_pair(seed)
    for m in (stock, fused):
        _checkpointing(m.get_base_model(), False)
    assert_same(stock, fused, batch(seed), seed)


def test_label_smoothing_and_ignore_index_options(seed):
    stock, fused = pair("Qwen3ForCausalLM", seed=seed, label_smoothing=0.1, ignore_index=-1)
    inputs = batch(seed)
    labels = torch.where(inputs["labels"] == -100, -1, inputs["labels"])
    out = fused(**{**inputs, "labels": labels})
    logits = stock(**{k: v for k, v in inputs.items() if k != "labels"}).logits
    want = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-1,
                           label_smoothing=0.1)
    torch.testing.assert_close(out.loss, want, atol=1e-5, rtol=1e-5)


def test_autocast_bf16(seed):
    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    inputs = batch(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref = fused(**inputs), stock(**inputs)
    assert out.logits is None and out.loss.dtype == torch.float32
    # both score the same bf16 logits; the stock path rounds them to bf16 before its fp32 softmax
    torch.testing.assert_close(out.loss, ref.loss, atol=2e-2, rtol=1e-2)


def test_unpatch_and_deepcopy(seed):
    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    inputs = batch(seed)
    clone = copy.deepcopy(fused)  # the patch travels with the copy, bound to the copy
    assert hf.is_patched(clone)
    assert_same(stock, clone, inputs, seed)
    fused_lce.unpatch(fused)
    assert "forward" not in fused.__dict__ and not hf.is_patched(fused)
    assert fused(**inputs).logits is not None
    fused_lce.unpatch(fused)  # no-op


def test_patch_if_enabled(monkeypatch):
    model = build("Qwen3ForCausalLM")
    monkeypatch.delenv("FUSED_LINEAR_CE", raising=False)
    assert fused_lce.patch_if_enabled(model) is model and not hf.is_patched(model)
    monkeypatch.setenv("FUSED_LINEAR_CE", "0")
    assert not hf.is_patched(fused_lce.patch_if_enabled(model))
    monkeypatch.setenv("FUSED_LINEAR_CE", "maybe")
    with pytest.raises(ValueError, match="FUSED_LINEAR_CE"):
        fused_lce.patch_if_enabled(model)
    monkeypatch.setenv("FUSED_LINEAR_CE", "1")
    assert hf.is_patched(fused_lce.patch_if_enabled(model))


@pytest.mark.parametrize("family,name", [("qwen3", "Qwen3ForCausalLM"),
                                         ("qwen2_vl", "Qwen2VLForConditionalGeneration")])
def test_class_level_patch(family, name, seed, driver_calls):
    inputs = batch(seed)
    stock = build(name, seed=seed)
    ref = stock(**inputs)
    ref.loss.backward()
    cls = type(stock)
    original = cls.forward
    assert "__call__" not in vars(cls) and "forward" in vars(cls)
    calls = driver_calls
    try:
        patched = getattr(fused_lce, f"patch_{family}")()
        # the class's __call__ and forward are wrapped (looked up through the MRO, restored on unpatch)
        assert cls in patched and "__call__" in vars(cls) and cls.forward is not original
        calls.clear()  # patching validates the options with one tiny call
        fused = build(name, seed=seed)  # created after the class patch
        assert hf.is_patched(fused) and "forward" not in fused.__dict__
        out = fused(**inputs)
        assert out.logits is None and len(calls) == 1
        torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-4)
        out.loss.backward()
        for n, g in grads(stock).items():
            torch.testing.assert_close(grads(fused)[n], g, atol=1e-5, rtol=1e-4)
        # an instance patch on top of the class patch: the loss is still computed once
        fused_lce.patch(fused)
        calls.clear()
        assert fused(**inputs).logits is None and len(calls) == 1
        fused_lce.unpatch(fused)
        # a subclass (e.g. a library's own class on top) inherits the class patch
        sub = type("MyQwen", (cls,), {})
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            child = sub(fused.config)
        assert hf.is_patched(child)
        calls.clear()
        assert child.train()(**inputs).logits is None and len(calls) == 1
    finally:
        getattr(fused_lce, f"unpatch_{family}")()
    assert "__call__" not in vars(cls) and cls.forward is original and not hf.is_patched(fused)
    assert fused(**inputs).logits is not None and len(calls) == 1


def test_accelerate_hook_on_head(seed):
    hooks = pytest.importorskip("accelerate.hooks")
    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    calls = []

    class Count(hooks.ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            calls.append(1)
            return args, kwargs

    hooks.add_hook_to_module(fused.lm_head, Count())
    assert_same(stock, fused, batch(seed), seed)
    assert calls == [1]  # accelerate's hook ran around the fused head


# ------------------------------------------------------------------------------------------------ PEFT
ALL_PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peft_pair(seed, patch_before=False, **lora):
    peft = pytest.importorskip("peft")
    stock = build("Qwen3ForCausalLM", seed=seed)
    base = copy.deepcopy(stock)
    if patch_before:
        fused_lce.patch(base)
    cfg = dict(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=ALL_PROJ, task_type="CAUSAL_LM")
    cfg.update(lora)
    torch.manual_seed(seed)
    stock_p = peft.get_peft_model(stock, peft.LoraConfig(**cfg))
    torch.manual_seed(seed)
    fused_p = peft.get_peft_model(base, peft.LoraConfig(**cfg))
    for p in list(stock_p.parameters()):
        if p.requires_grad:  # LoRA B starts at 0: make the adapters matter
            torch.nn.init.normal_(p, std=0.05)
    fused_p.load_state_dict(stock_p.state_dict())
    if not patch_before:
        fused_lce.patch(fused_p)
    return stock_p, fused_p


@pytest.mark.parametrize("patch_before", [False, True], ids=["patch-peft-model", "patch-then-get_peft_model"])
def test_peft_lora_all_projections(patch_before, seed):
    stock, fused = _peft_pair(seed, patch_before=patch_before)
    assert hf.is_patched(fused)
    assert_same(stock, fused, batch(seed), seed)
    fused_lce.unpatch(fused)
    assert fused(**batch(seed)).logits is not None


def test_peft_lora_on_lm_head_falls_back_with_warning(seed):
    stock, fused = _peft_pair(seed, target_modules=ALL_PROJ + ["lm_head"])
    with pytest.warns(UserWarning, match="adapter.*untrained"):
        ref, out = assert_same(stock, fused, batch(seed), seed, fused_expected=False)
    assert any("lm_head.lora" in n and g is not None and g.abs().sum() > 0 for n, g in grads(fused).items())


def test_peft_modules_to_save_lm_head(seed):
    stock, fused = _peft_pair(seed, modules_to_save=["lm_head"])
    assert_same(stock, fused, batch(seed), seed)
    trained = [n for n, g in grads(fused).items() if "lm_head.modules_to_save" in n and g is not None]
    assert trained, "the modules_to_save copy of lm_head got no gradient"
    with fused.disable_adapter(), stock.disable_adapter(), torch.no_grad():  # the original head, still fused
        out, ref = fused(**batch(seed)), stock(**batch(seed))
    assert out.logits is None
    torch.testing.assert_close(out.loss, ref.loss)


# ----------------------------------------------------------------------------------------------- never silent
@pytest.mark.parametrize("when", ["before", "after"], ids=["set-before-patch", "set-after-patch"])
def test_user_loss_function_is_respected(when, seed):
    """A user-set model.loss_function (here: twice the stock loss) is what the model computes, patched or not;
    the patch falls back to the stock forward and warns once."""
    stock, fused = pair("Qwen3ForCausalLM", seed=seed) if when == "after" \
        else (build("Qwen3ForCausalLM", seed=seed), None)
    stock_fn = stock.loss_function

    def doubled(*args, **kwargs):
        return 2 * stock_fn(*args, **kwargs)

    if when == "before":
        fused = copy.deepcopy(stock)
        fused.loss_function = doubled
        fused_lce.patch(fused)
    else:
        fused.loss_function = doubled
    inputs = batch(seed)
    with pytest.warns(UserWarning, match="loss_function is user-set"):
        out = fused(**inputs)
    assert out.logits is not None
    torch.testing.assert_close(out.loss, 2 * stock(**inputs).loss)
    status = fused_lce.is_patched(fused)
    assert not status and "user-set" in status.reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model
        fused(**inputs)
    fused_lce.unpatch(fused)
    assert fused.loss_function is doubled


def test_stock_loss_function_set_explicitly_is_fused(seed):
    """transformers' own ForCausalLMLoss set as model.loss_function is the stock loss: the fused path runs."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    stock = build("Qwen3ForCausalLM", seed=seed)
    fused = copy.deepcopy(stock)
    fused.loss_function = ForCausalLMLoss
    fused_lce.patch(fused)
    assert fused_lce.is_patched(fused)
    assert_same(stock, fused, batch(seed), seed)
    fused_lce.unpatch(fused)
    assert fused.loss_function is ForCausalLMLoss


def test_torch_compile_fullgraph(seed):
    """torch.compile(model, fullgraph=True) of a patched model: no graph break, the fused op is in the graph,
    and loss and gradients equal the compiled stock model's."""
    torch._dynamo.reset()
    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    ops = []

    def backend(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(gm, example_inputs)

    inputs = batch(seed)
    with torch.no_grad():  # transformers installs its output-capturing hooks at the first call, not traceable
        stock(**inputs), fused(**inputs)
    ref = torch.compile(stock, fullgraph=True, backend="aot_eager")(**inputs)
    out = torch.compile(fused, fullgraph=True, backend=backend)(**inputs)
    assert out.logits is None and any("fused_lce.forward" in op for op in ops), ops
    torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-4)
    ref.loss.backward()
    out.loss.backward()
    for n, g in grads(stock).items():
        torch.testing.assert_close(grads(fused)[n], g, atol=1e-5, rtol=1e-4,
                                   msg=lambda m: f"seed={seed} {n}: {m}")
    assert hf.runtime._TRACED_FRAMES == [] and hf.runtime._FRAMES.get() == ()


def test_concurrent_threads_see_their_own_call(seed):
    """Two threads on one patched model: fused training calls and forced-stock calls interleave; each gets its
    own result (the per-call state is context-local, not a flag on the model)."""
    import threading

    stock, fused = pair("Qwen3ForCausalLM", seed=seed)
    inputs = batch(seed)
    with torch.no_grad():
        ref = stock(**inputs)
    errors = []

    def work(skip):
        try:
            for _ in range(30):
                with torch.no_grad():
                    out = fused(**inputs, skip_logits=skip)
                assert (out.logits is None) == (skip is None), skip
                torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-4)
                if skip is False:
                    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-4)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in (None, False, None, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_output_layer_wrapped_before_patch_falls_back(seed):
    """An accelerate hook put on lm_head before patch (device-map dispatch) replaces its forward with one that
    does not reach the fused path: stock forward, one warning, is_patched says why. (A hook added after patch
    wraps the armed forward and works: test_accelerate_hook_on_head.)"""
    hooks = pytest.importorskip("accelerate.hooks")
    stock = build("Qwen3ForCausalLM", seed=seed)
    fused = copy.deepcopy(stock)
    hooks.add_hook_to_module(fused.lm_head, hooks.ModelHook())
    fused_lce.patch(fused)
    status = fused_lce.is_patched(fused)
    assert not status and "forward was replaced" in status.reason
    with pytest.warns(UserWarning, match="forward was replaced"):
        assert_same(stock, fused, batch(seed), seed, fused_expected=False)


def test_is_patched_reasons(seed):
    model = build("Qwen3ForCausalLM", seed=seed)
    status = fused_lce.is_patched(model)
    assert not status and "not patched" in status.reason and repr(status).startswith("PatchStatus(False")
    fused_lce.patch(model)
    status = fused_lce.is_patched(model)
    assert status and status.active and "fused_lce computes the loss" in status.reason
    fused_lce.patch(model, skip_logits=False)
    assert not fused_lce.is_patched(model) and "skip_logits=False" in fused_lce.is_patched(model).reason
    fused_lce.unpatch(model)
    assert not fused_lce.is_patched(model)
    assert fused_lce.is_patched is hf.is_patched  # exported lazily, like patch


@pytest.mark.parametrize("calls_head", [False, True], ids=["own-fused-loss", "own-loss-from-lm_head"])
def test_foreign_class_forward_is_left_alone(calls_head, seed, monkeypatch):
    """A library that replaces the supported class's forward (Unsloth, Liger) computes its own loss, from
    lm_head.weight or from lm_head's output: the patch must not arm the head under it (the head's loss would
    land where that forward expects logits). Stock behaviour of that forward, one warning, is_patched says
    why."""
    cls = transformers.Qwen3ForCausalLM

    def foreign_forward(self, input_ids=None, labels=None, **kwargs):  # what Unsloth's fast forward does
        hidden = self.model(input_ids=input_ids, **kwargs).last_hidden_state
        logits = self.lm_head(hidden) if calls_head else hidden @ self.lm_head.weight.T
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return transformers.modeling_outputs.CausalLMOutputWithPast(loss=loss, logits=logits)

    monkeypatch.setattr(cls, "forward", foreign_forward)
    model = build("Qwen3ForCausalLM", seed=seed)
    ref = model(**batch(seed)).loss
    fused_lce.patch(model)
    status = fused_lce.is_patched(model)
    assert not status and "Qwen3ForCausalLM.forward was replaced" in status.reason
    with pytest.warns(UserWarning, match="forward was replaced"):
        out = model(**batch(seed))
    assert out.logits is not None and torch.equal(out.loss, ref)
    # a user's own subclass whose forward calls transformers' forward is fused as usual
    monkeypatch.undo()
    sub = type("Mine", (cls,), {"forward": lambda self, *a, **k: cls.forward(self, *a, **k)})
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine = fused_lce.patch(sub(model.config).train())
    assert fused_lce.is_patched(mine) and mine(**batch(seed)).logits is None


def test_class_patch_of_an_inherited_forward(seed, monkeypatch):
    """transformers 5.24 moved some heads' forward to shared bases (GenericFor*): a class whose forward is
    inherited is patched (no cls.__dict__['forward'] lookup) and left inheriting it after unpatch."""
    cls = transformers.Qwen3ForCausalLM
    base = cls.__mro__[1]
    monkeypatch.setattr(base, "forward", cls.__dict__["forward"], raising=False)
    monkeypatch.delattr(cls, "forward")
    assert "forward" not in vars(cls)
    stock = build("Qwen3ForCausalLM", seed=seed)
    try:
        fused_lce.patch_qwen3()
        fused = build("Qwen3ForCausalLM", seed=seed)
        assert_same(stock, fused, batch(seed), seed)
    finally:
        fused_lce.unpatch_qwen3()
    assert "forward" not in vars(cls) and "__call__" not in vars(cls) and cls.forward is base.forward


@pytest.mark.parametrize("when", ["patch-then-peft", "patch-peft-model"])
def test_direct_forward_call_as_old_peft_does(when, seed, monkeypatch):
    """PEFT <= 0.20's tuners call ``self.model.forward(...)``, which bypasses module hooks: the patch's
    forward entry opens the frame itself."""
    tuners = pytest.importorskip("peft.tuners.tuners_utils")
    monkeypatch.setattr(tuners.BaseTuner, "forward", lambda self, *a, **k: self.model.forward(*a, **k))
    stock, fused = _peft_pair(seed, patch_before=when == "patch-then-peft")
    assert_same(stock, fused, batch(seed), seed)
    base = fused.get_base_model()
    inputs = batch(seed)
    out = base.forward(**inputs)  # a direct call on the transformers model too
    assert out.logits is None
    torch.testing.assert_close(out.loss, stock(**inputs).loss, atol=1e-5, rtol=1e-4)
