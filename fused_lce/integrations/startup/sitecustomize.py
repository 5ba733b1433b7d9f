"""fused_lce's start-up hook for the PYTHONPATH route (see fused_lce/integrations/startup/__init__.py): with
FUSED_LINEAR_CE on, arm :mod:`fused_lce_autopatch`; then run the sitecustomize module this one shadows, if
any."""
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _shadowed_sitecustomize():
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("FUSED_LINEAR_CE", "").strip().lower() not in ("", "0", "false", "no", "off"):
    import fused_lce_autopatch

    fused_lce_autopatch.install()
_shadowed_sitecustomize()
