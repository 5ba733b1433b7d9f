"""Kernel providers, one module per ``backend=`` name (torch, cpp, triton, npu, npu_cann), each importing only
the interface of ``fused_lce.core``. The registry that picks among them is ``fused_lce.core.registry``; the
algorithm they serve is ``fused_lce.core.driver``. How to add one: docs/providers.md."""
