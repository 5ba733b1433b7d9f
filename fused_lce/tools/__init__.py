"""Command-line tools: ``fused-lce bench`` / ``fused-lce env`` (``cli``) and the benchmark helpers
(``bench``)."""
