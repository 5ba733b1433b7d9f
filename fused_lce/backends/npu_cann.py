"""The "npu_cann" provider: CANN's fused trio in torch_npu (fused_lce/backends/npu/cann.py). The registry
imports ``fused_lce.backends.<backend name>``; this module gives that name its provider."""
from .npu.cann import PROVIDER  # noqa: F401
