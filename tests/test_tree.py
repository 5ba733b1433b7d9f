"""Rules of the source tree itself: every Python file keeps to the project's 110-column line limit."""
from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = 110
NOT_SOURCE = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".eggs", "node_modules"}


def python_files() -> list[str]:
    """The tracked .py files (git ls-files); outside a git checkout (an sdist, a copy), every .py file under
    the root except build output and environments."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", "*.py"], cwd=ROOT, capture_output=True,
                             check=True, timeout=60).stdout.decode()
        files = [f for f in out.split("\0") if f and os.path.isfile(os.path.join(ROOT, f))]
        if files:
            return files
    except (OSError, subprocess.SubprocessError):
        pass
    files = []
    for top, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in NOT_SOURCE and not d.endswith(".egg-info")]
        files += [os.path.relpath(os.path.join(top, n), ROOT).replace(os.sep, "/") for n in names
                  if n.endswith(".py")]
    return files


def test_python_lines_fit_the_column_limit():
    files = python_files()
    assert "tests/test_tree.py" in files and "fused_lce/api.py" in files, files[:5]
    long = []
    for rel in files:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            long += [f"{rel}:{i}: {len(line)} characters" for i, line in enumerate(f.read().split("\n"), 1)
                     if len(line) > LIMIT]
    assert not long, f"{len(long)} lines longer than {LIMIT} characters:\n" + "\n".join(long)
