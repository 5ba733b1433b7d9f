"""Triton kernels of the "triton" provider (fused_lce/backends/triton.py).

* ``gemm``: the logits GEMM ``h @ W.T`` (TMA tensor descriptors, wgmma on Hopper) with the loss work in its
  epilogue: per (row, 256-column tile) max / sum-exp / first argmax (/ sum for label smoothing) from the float32
  accumulator, and either the tile's ``exp(z - tile max)`` in the input dtype (the gradient pass needs only that
  and the tile max), nothing (statistics only), or the gradient ``dz`` itself when the lse is already known.
* ``rows``: the small kernels around it: tile statistics -> row statistics, ``exp`` tiles -> ``dz`` in place,
  the label's logit as one dot product per row, fused scale + cast, and the in-place upstream scale that returns at
  once when the upstream gradient is 1.

Everything here also runs under ``TRITON_INTERPRET=1`` on CPU tensors (tensor descriptors included), which is how
CI tests the same math; what the interpreter cannot show is speed and the wgmma / TMA code generation.
"""
