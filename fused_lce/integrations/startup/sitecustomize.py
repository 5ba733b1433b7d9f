"""fused_lce's start-up hook (see fused_lce/integrations/startup/__init__.py): with this folder on PYTHONPATH and
FUSED_LINEAR_CE=1, run fused_lce.integrations.hf.autopatch() as soon as transformers' trainer module has been
imported. Imports nothing heavy at start-up; runs the sitecustomize module it shadows, if there is one."""
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _AutopatchAfterTrainerImport:
    """A meta-path finder that only wraps the loading of ``transformers.trainer``."""

    def find_spec(self, name, path=None, target=None):
        if name != "transformers.trainer":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_autopatch(module):
            exec_module(module)
            from fused_lce.integrations import hf

            hf.autopatch()

        spec.loader.exec_module = exec_then_autopatch
        return spec


def _shadowed_sitecustomize():
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("FUSED_LINEAR_CE", "").strip().lower() in ("1", "true", "yes", "on"):
    sys.meta_path.insert(0, _AutopatchAfterTrainerImport())
_shadowed_sitecustomize()
