"""fused_lce: LM-head projection and cross-entropy computed together, tile by tile, never materialising the
``[tokens x vocab]`` logits. See ``linear_cross_entropy``."""
from .api import LCEOutput, LinearCrossEntropy, backend_info, linear_cross_entropy

__version__ = "0.1.0"
__all__ = ["linear_cross_entropy", "LinearCrossEntropy", "LCEOutput", "backend_info", "__version__"]
