"""The test suite. Importing it (every conftest, test module and test subprocess that imports ``tests``) first
makes one single-threaded call into MKL's vector math, which torch's CPU exp / log / tanh on float tensors
use.

When a process's first such call runs on two threads at once (a tensor above ATen's parallel grain of 2048
elements), one thread's part can come back at a coarse accuracy: measured, ``torch.exp`` of a (37, 75) float32
tensor off by 1.5e-4 relative on the worker thread's half in 1 of 7 to 40 fresh processes, exact on every
later call, and never after one single-threaded call. A float64 comparison then fails at random; the call
below runs before any test computes."""
import torch

for _dtype in (torch.float32, torch.float64):
    torch.exp(torch.full((64,), 0.5, dtype=_dtype))  # below the parallel grain: runs on this thread alone
