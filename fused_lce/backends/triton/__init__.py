"""The "triton" backend: the loss work fused into a Triton logits GEMM, cuBLAS for the two gradient products.

Default mode, bf16 / fp16 inputs on Hopper (the "gemm" path; token chunks, 3 GEMM-equivalents). For each chunk
of ``nc`` tokens:

1. ``h_c @ W.T`` in a Triton GEMM (TMA + wgmma) whose epilogue works on the float32 accumulator: per (token,
   256-column tile) the max ``m_t``, ``sum exp(z - m_t)`` and first argmax into small per-tile arrays, and
   ``e = exp(z - m_t)`` stored in the input dtype (``kernels/gemm.py``). Statistics never see a rounded
   logit, and the buffer costs 2 bytes a logit;
2. the tile statistics become row statistics and the lse (one small kernel); the label's logit is one float32
   dot product per token;
3. ``dz = g (a0 + a1 lse) exp(m_t - lse) e - ...`` in place over ``e`` (the mean's 1/n folded in for bf16);
4. ``dX_c = dz @ W`` (cuBLAS, straight into dX) and ``dW (+)= dz.T @ h_c`` (cuBLAS): written once in the
   weight dtype when one chunk covers every token, else accumulated in float32 and cast at the end.

The chunk size comes from the shapes and the free device memory: the peak stays under dX + dW + 4 V D + SLACK
(one chunk when its buffer fits in the room of the float32 accumulator it makes unnecessary), or the buffer of
``FULL_RATE_ROWS`` tokens in place of that room when it is larger (fewer, longer chunks: at most N / 8192 of
them, rounded up), within three quarters of the free memory.

The "cublas" path (float32 inputs, softcap, a hidden size or pointer TMA cannot take, pre-Hopper GPUs, or
``FUSED_LCE_TRITON_GEMM=0``): ``z`` in float32 by cuBLAS, one Triton row kernel for statistics + ``dz``
(written in place over ``z``, in the input dtype), the same two cuBLAS gradient products.

Compact mode (``FUSED_LCE_COMPACT=1``; vocabulary chunks, 4 GEMM-equivalents): a statistics pass over
vocabulary chunks (the gemm path stores nothing but tile statistics), then per chunk ``dz`` again (the gemm
path's epilogue writes ``dz`` directly), ``dW_c = dz.T @ h`` written once in the weight dtype and ``dX += dz @
W_c`` into a float32 (N, D) accumulator. No (V, D) float32 buffer.

``linear_logprobs`` (``supports_logprobs``) takes either path: the GEMM epilogues divide by the temperature
and write the entropy's tile sums, the DZ epilogue has the entropy's term. Outside the one-pass loss
(``fused``, whose kernels form the loss's coefficients from the driver's four ``LossTerms``) every gradient
kernel takes the driver's per-row coefficients ``Coefs(a, t, b, u)``: ``dz = p (a + b z) - t onehot - u``,
times the softcap derivative.

Live rows (fused-GEMM path): the one-pass loss and the recompute backward gather the tokens that have a
gradient (coefficients not all 0) to the front and run the GEMM, dz, dX and dW over them only; the
statistics-only passes (log-probs, reduction "none") compute the row tiles of the tokens whose label is not
ignored. So an ignored token costs no logit (its outputs are 0) beyond the rest of the last live row tile; the
cuBLAS path and a vocab-parallel loss with gradients (kept tiles) still compute every row. The gradient
products read the count on the host (``_live_order``; cuBLAS takes its sizes there) - the host
synchronisation, with fp16's loss scale read right after it (``_State.product_alpha``); the statistics pass
reads it on the device. Neither gathers while a CUDA graph is captured.

Rows of every logits buffer are padded to 16 bytes, so an odd vocabulary keeps cuBLAS on its fast kernels.
With a vocab-parallel group the statistics of each chunk are combined across ranks between the statistics and
the gradient kernels, and dX is returned in float32. Under CUDA-graph capture nothing here reads a device
value on the host, so forward and backward are capturable.

Files: ``provider.py`` (the provider: schedules and buffers), ``planner.py`` (token / vocabulary chunks from
the shapes and free memory, which rows are live), ``cublas.py`` (the cuBLAS products), ``kernels/gemm.py``
(the logits GEMM with its statistics / exp / dz epilogues), ``kernels/rows.py`` (small per-row kernels:
tile-statistics merge, target logit, dz from exp), ``kernels/tile_rows.py`` (the row kernel of the cuBLAS
path).
"""
from .planner import (BLOCK, MIN_ROWS, SLACK, _pad, gemm_path_reason, plan_token_chunk,  # noqa: F401
                      plan_vocab_chunk)
from .provider import PROVIDER, TritonProvider  # noqa: F401
