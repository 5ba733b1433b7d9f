"""The ``fused-lce`` command: ``bench`` (the main job) and ``env`` (what backends exist here and why not)."""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    from . import bench

    p = argparse.ArgumentParser(prog="fused-lce", description="Fused linear cross-entropy: benchmark and environment.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="compare the plain path with fused_lce on this device (time, memory)",
                       description=bench.__doc__)
    bench.add_arguments(b)
    sub.add_parser("env", help="print backend_info(): which backends exist here, and for each missing one why")
    args = p.parse_args(argv)
    if args.cmd == "env":
        import torch

        import fused_lce

        print(json.dumps({"fused_lce": fused_lce.__version__, "torch": torch.__version__,
                          "backends": fused_lce.backend_info()}, indent=2))
        return 0
    bench.check_args(b, args)  # device, backends, optional dependencies: usage errors before anything runs
    return bench.main_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
