"""The registered custom ops of the ``fused_lce`` library (importing this package registers them): the loss
ops ``forward`` / ``backward`` (``loss.py``) and the log-prob ops ``logprobs`` / ``logprobs_backward``
(``logprobs.py``), with schemas generated from ``fused_lce.core.Options`` (``schema.py``)."""
from . import logprobs, loss  # noqa: F401  (registration)
