"""fused_lce's start-up hook: makes ``FUSED_LINEAR_CE=1`` alone enable fused_lce in an unedited training script.

``pip install`` puts ``fused_lce-autopatch.pth`` in site-packages; Python runs it at every start-up, and it imports
this module only when ``FUSED_LINEAR_CE`` is set to something other than off (so a process without the variable
pays one environment lookup). :func:`install` then waits, importing nothing heavy (no torch, no fused_lce), until
``transformers.trainer`` is imported, and calls :func:`fused_lce.integrations.hf.autopatch` right after it, so every
``transformers.Trainer`` (TRL's and ms-swift's trainers are subclasses) patches its model when it is built. Child
processes (torchrun workers) inherit the variable and run the same hook. A top-level module (not part of the
``fused_lce`` package) because importing the package imports torch.
"""
import sys


class _AutopatchAfterTrainerImport:
    """A meta-path finder that only wraps the loading of ``transformers.trainer``."""

    def find_spec(self, name, path=None, target=None):
        if name != "transformers.trainer":
            return None
        spec = None
        for finder in sys.meta_path:  # the finder that would have loaded it (the path finder, an editable finder)
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_autopatch(module):
            exec_module(module)
            from fused_lce.integrations import hf

            hf.autopatch()

        spec.loader.exec_module = exec_then_autopatch
        return spec


def install():
    """Arm the hook (idempotent)."""
    if not any(type(f).__name__ == _AutopatchAfterTrainerImport.__name__ for f in sys.meta_path):
        sys.meta_path.insert(0, _AutopatchAfterTrainerImport())
