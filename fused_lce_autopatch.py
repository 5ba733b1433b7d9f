"""fused_lce's start-up hook: makes ``FUSED_LINEAR_CE=1`` alone enable fused_lce in an unedited training
script.

``pip install`` puts ``fused_lce-autopatch.pth`` in site-packages; Python runs it at every start-up, and it
imports this module only when ``FUSED_LINEAR_CE`` is set to something other than off (so a process without the
variable pays one environment lookup). :func:`install` then waits, importing nothing heavy (no torch, no
fused_lce), until ``transformers.trainer`` is imported, and calls :func:`fused_lce.integrations.hf.autopatch`
right after it, so every ``transformers.Trainer`` (TRL's and ms-swift's trainers are subclasses) patches its
model when it is built. Child processes (torchrun workers) inherit the variable and run the same hook. A
top-level module (not part of the ``fused_lce`` package) because importing the package imports torch.
"""
import sys
import threading


class _AutopatchAfterTrainerImport:
    """A meta-path finder that only wraps the loading of ``transformers.trainer``."""

    def __init__(self):
        self._searching = threading.local()

    def find_spec(self, name, path=None, target=None):
        # Re-entered from a finder that itself asks the rest of sys.meta_path (profilers, coverage tools):
        # that finder is already asking the others for us, so step aside; else the two recurse forever.
        if name != "transformers.trainer" or getattr(self._searching, "active", False):
            return None
        self._searching.active = True
        try:
            spec = self._find_elsewhere(name, path, target)
        finally:
            self._searching.active = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_autopatch(module):
            exec_module(module)
            from fused_lce.integrations import hf

            hf.autopatch()

        spec.loader.exec_module = exec_then_autopatch
        return spec

    def _find_elsewhere(self, name, path, target):
        """The spec of the finder that would have loaded ``name`` (the path finder, an editable finder)."""
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    return spec
        return None


def install():
    """Arm the hook (idempotent)."""
    if not any(type(f).__name__ == _AutopatchAfterTrainerImport.__name__ for f in sys.meta_path):
        sys.meta_path.insert(0, _AutopatchAfterTrainerImport())
