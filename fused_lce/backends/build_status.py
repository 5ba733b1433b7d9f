"""What setup.py recorded about building each compiled part, read from ``fused_lce/_build_status.json``
(written by setup.py's ``build_ext``, or at install time when no extension could be built): ``{"cpp" |
"npu_opp" | "npu_adapter": {"ok": bool, "attempted": bool, "error": str | None, "log": str | None, ...}}``
("error": why the part is missing, the first error line for a failed build; "log": the file with the whole
build output, kept for the OPP kernel package; "attempted": False when the install did not try, e.g. no
ASCEND_HOME_PATH).
"""
from __future__ import annotations

import json
import os
from typing import Optional

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_build_status.json")
PARTS = ("cpp", "npu_opp", "npu_adapter")


def read(path: Optional[str] = None) -> dict[str, Optional[dict]]:
    """Every part's record; None for a part without one (a source checkout never built, a file from an older
    version)."""
    try:
        with open(path or PATH) as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    return {k: dict(data[k]) if isinstance(data.get(k), dict) else None for k in PARTS}


def failure(part: Optional[dict]) -> Optional[str]:
    """The recorded reason a part is missing, with its log ("... (full log: PATH)"), or None if it built / has
    no record."""
    if not part or part.get("ok") or not part.get("error"):
        return None
    return part["error"] + (f" (full log: {part['log']})" if part.get("log") else "")
