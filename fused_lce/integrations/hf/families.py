"""The model classes :func:`fused_lce.patch` supports, as one table: family name -> (module under
``transformers.models``, causal-LM classes). A family here gets its class-level ``patch_<family>`` /
``unpatch_<family>`` functions (:mod:`fused_lce.integrations.hf.api`) and is accepted by ``patch(model)``."""
from __future__ import annotations

import importlib

FAMILIES = {  # Qwen2.5 text models are Qwen2ForCausalLM
    "qwen2": ("qwen2", ("Qwen2ForCausalLM",)),
    "qwen2_moe": ("qwen2_moe", ("Qwen2MoeForCausalLM",)),
    "qwen3": ("qwen3", ("Qwen3ForCausalLM",)),
    "qwen3_moe": ("qwen3_moe", ("Qwen3MoeForCausalLM",)),
    "qwen3_next": ("qwen3_next", ("Qwen3NextForCausalLM",)),
    "qwen3_5": ("qwen3_5", ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")),
    "qwen3_5_moe": ("qwen3_5_moe", ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")),
    "qwen2_vl": ("qwen2_vl", ("Qwen2VLForConditionalGeneration",)),
    "qwen2_5_vl": ("qwen2_5_vl", ("Qwen2_5_VLForConditionalGeneration",)),
    "qwen3_vl": ("qwen3_vl", ("Qwen3VLForConditionalGeneration",)),
    "qwen3_vl_moe": ("qwen3_vl_moe", ("Qwen3VLMoeForConditionalGeneration",)),
}
SUPPORTED = tuple(name for _, names in FAMILIES.values() for name in names)


def load_class(module_name: str, name: str):
    """``transformers.models.<module_name>.modeling_<module_name>.<name>``, or None if this transformers lacks
    it."""
    try:
        module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    except ImportError:
        return None
    return getattr(module, name, None)


def family_classes(family: str) -> list:
    """The classes of ``family`` that the installed transformers has."""
    module_name, names = FAMILIES[family]
    return [c for c in (load_class(module_name, n) for n in names) if c is not None]


def supported_classes() -> dict:
    """``{class name: class}`` of the supported classes that the installed transformers has."""
    return {cls.__name__: cls for family in FAMILIES for cls in family_classes(family)}
