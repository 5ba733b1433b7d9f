"""The Triton kernels of the "triton" provider, one file each. Importing this package never fails: without a
usable Triton, ``gemm`` / ``rows`` / ``tile_rows`` are None and ``ERROR`` says why
(``unavailable_reason``)."""
from __future__ import annotations

from typing import Optional

ERROR: Optional[str] = None
# a missing Triton must not break `import fused_lce` (and no placeholder names before the import: `from .
# import x` returns an existing attribute x instead of importing the module)
try:
    import triton  # noqa: F401

    from . import gemm, rows, tile_rows  # noqa: F811  (tile_rows and rows use gemm's statistics layout)
# depends on the host (no Triton, or one without tensor descriptors)
except Exception as e:  # pragma: no cover
    gemm = rows = tile_rows = None
    ERROR = f"{type(e).__name__}: {e}"
