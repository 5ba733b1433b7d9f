"""Test doubles and shared test helpers (not part of the product): the float64 comparison helpers, the gloo
process pool; the AscendC CPU twin and the fake torch_npu live here too."""
