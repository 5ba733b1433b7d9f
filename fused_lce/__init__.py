"""fused_lce: LM-head projection and cross-entropy computed together, tile by tile, never materialising the
``[tokens x vocab]`` logits. See ``linear_cross_entropy`` (the loss) and ``linear_logprobs`` (per-token
log-probs and entropy, for policy-gradient losses)."""
# first, before torch (which imports an installed torch_npu): record what op-plugin reads when torch_npu loads
from .backends.npu import env as _npu_env

_npu_env.arm_snapshot()

from .api import (LCEOutput, LinearCrossEntropy, LogprobsOutput, backend_info, label_errors,  # noqa: E402
                  linear_cross_entropy, linear_logprobs)
from .core.distributed import gather_sequence_parallel  # noqa: E402

__version__ = "0.1.0"
__all__ = ["linear_cross_entropy", "linear_logprobs", "LinearCrossEntropy", "LCEOutput", "LogprobsOutput",
           "backend_info",
           "label_errors", "gather_sequence_parallel", "__version__"]


def __getattr__(name):
    # the HF patchers live outside the core (fused_lce.integrations.hf) and import transformers lazily
    if name.startswith(("patch", "unpatch")) or name == "is_patched":
        from .integrations import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'fused_lce' has no attribute {name!r}")
