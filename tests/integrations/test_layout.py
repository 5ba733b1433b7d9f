"""The integrations sit on top of the library: nothing below ``fused_lce/integrations`` imports them, they use
the public API only (``fused_lce`` / ``fused_lce.api``, never core, ops or backends), and they import each
other one way only (hf -> trl; trl, megatron and axolotl import nothing of hf)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "fused_lce"


def imported(path: Path) -> set:
    """Absolute names of the fused_lce modules ``path`` imports (relative imports resolved)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.update(f"{base}.{a.name}" for a in node.names)
            names.add(base)
    return {n for n in names if n.startswith("fused_lce")}


def test_nothing_below_imports_the_integrations():
    for path in PACKAGE.rglob("*.py"):
        if "integrations" in path.parts or path.parent == PACKAGE and path.name == "__init__.py":
            continue  # fused_lce/__init__.py exports patch() lazily, at attribute access
        bad = sorted(n for n in imported(path) if n.startswith("fused_lce.integrations"))
        assert not bad, (path, bad)


def test_integrations_import_one_way():
    integrations = PACKAGE / "integrations"
    for name in ("trl.py", "megatron.py", "axolotl.py"):
        bad = sorted(n for n in imported(integrations / name) if n.startswith("fused_lce.integrations.hf"))
        assert not bad, (name, bad)
    for path in (integrations / "hf").glob("*.py"):
        assert "fused_lce.integrations.hf.api" not in imported(path) or path.name == "__init__.py", path


def test_integrations_use_the_public_api_only():
    for path in (PACKAGE / "integrations").rglob("*.py"):
        inner = sorted(n for n in imported(path) if n.startswith(("fused_lce.core", "fused_lce.ops",
                                                                   "fused_lce.backends")))
        assert not inner, (path, inner)
