"""Kernel providers, one module per ``backend=`` name (torch, cpp, triton, npu, npu_cann), each importing only
``fused_lce.backends.base``. The registry that picks among them is ``fused_lce.registry``; the algorithm they
serve is ``fused_lce.driver``. How to add one: docs/providers.md."""
