"""The start-up hook that makes ``FUSED_LINEAR_CE=1`` alone enable fused_lce: ``fused_lce-autopatch.pth``,
which every install puts in site-packages (this environment's editable install too, and a built wheel), arming
``fused_lce_autopatch`` in a fresh process only when the switch is on, without importing torch. The end-to-end
training run under the switch: hf/test_trainer.py::test_env_switch_alone_patches_an_unedited_script."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PTH = "fused_lce-autopatch.pth"
# what a fresh process has imported and armed at start-up, before the script does anything
PROBE = ("import sys; print('torch' in sys.modules, 'fused_lce' in sys.modules, "
         "sum(type(f).__name__ == '_AutopatchAfterTrainerImport' for f in sys.meta_path))")


def fresh(code, **env):
    """Run ``code`` in a new interpreter of this environment (only the site hooks run); PYTHONPATH: ``env``'s,
    then this checkout, so that the hook module imported is the one beside these tests."""
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FUSED_LINEAR_CE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          timeout=120, cwd=os.path.dirname(sys.executable))


def test_pth_is_installed_in_site_packages():
    site = Path(sysconfig.get_paths()["purelib"])
    assert (site / PTH).read_text() == (ROOT / PTH).read_text()


@pytest.mark.parametrize("value,armed", [(None, 0), ("0", 0), ("off", 0), ("1", 1), ("true", 1)])
def test_fresh_process_arms_the_hook_only_when_on(value, armed):
    run = fresh(PROBE, **({} if value is None else {"FUSED_LINEAR_CE": value}))
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False", str(armed)], (value, run.stdout, run.stderr)


def test_hook_autopatches_when_transformers_trainer_is_imported():
    pytest.importorskip("transformers")
    code = ("import transformers.trainer as t; print(getattr(t.Trainer.__init__, "
            "'_fused_lce_autopatch', False))")
    assert fresh(code, FUSED_LINEAR_CE="1").stdout.split() == ["True"]  # off: nothing armed (the test above)
    bad = fresh(code, FUSED_LINEAR_CE="maybe")  # never silently: an unreadable switch fails at the import
    assert bad.returncode != 0 and "FUSED_LINEAR_CE: expected 1/true/yes/on or 0/false/no/off" in bad.stderr


# an import hook of the kind profilers and coverage tools install: it asks the rest of sys.meta_path
CHAINING_FINDER = """
import sys

class Chaining:
    def __init__(self):
        self.asked = 0

    def find_spec(self, name, path=None, target=None):
        if name != "transformers.trainer":
            return None
        self.asked += 1
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    return spec
        return None

chaining = Chaining()
sys.meta_path.insert({position}, chaining)
import transformers.trainer as t
print(chaining.asked > 0, getattr(t.Trainer.__init__, "_fused_lce_autopatch", False))
"""


@pytest.mark.parametrize("position", [0, 1], ids=["ahead-of-ours", "behind-ours"])
def test_hook_coexists_with_a_finder_that_chains_through_meta_path(position):
    """Another finder that asks the rest of ``sys.meta_path`` for ``transformers.trainer``, ahead of ours or
    right behind it (installed before ours): no endless recursion between the two, and the trainer is still
    autopatched."""
    pytest.importorskip("transformers")
    run = fresh(CHAINING_FINDER.format(position=position), FUSED_LINEAR_CE="1")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True", "True"], run.stdout


def test_startup_folder_on_pythonpath_arms_the_same_hook_once(tmp_path):
    """The PYTHONPATH route (a source checkout that was not pip-installed) arms the same hook, once even with
    the .pth also present, and still runs the sitecustomize it shadows."""
    from fused_lce.integrations import startup

    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins; builtins.OTHER_SITECUSTOMIZE = True\n")
    path = os.pathsep.join([startup.DIR, str(other)])
    code = PROBE + "; import builtins; print(getattr(builtins, 'OTHER_SITECUSTOMIZE', False))"
    run = fresh(code, FUSED_LINEAR_CE="1", PYTHONPATH=path)
    assert run.stdout.split() == ["False", "False", "1", "True"], run.stderr


@pytest.mark.slow
def test_wheel_carries_the_hook(tmp_path):
    """A wheel (what ``pip install fused_lce`` installs) has the .pth and its module at its root
    (site-packages), next to the package; built from a copy of the sources, pure Python (no extension: that is
    not what is checked here, and it keeps the build to seconds)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", PTH, "fused_lce_autopatch.py"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "fused_lce", src / "fused_lce",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "_build_status.*"))
    env = {**os.environ, "FUSED_LCE_NO_EXT": "1"}
    env.pop("FUSED_LCE_REQUIRE_EXT", None)
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path / "dist"), str(src)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("fused_lce-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert PTH in names and "fused_lce_autopatch.py" in names and "fused_lce/__init__.py" in names
