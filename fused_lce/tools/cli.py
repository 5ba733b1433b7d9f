"""The ``fused-lce`` command: ``bench`` (the main job), ``env`` (what backends exist here and why not) and
``doctor`` (the report to attach to a bug: versions, backends, build, first-use self-checks, variants,
timing)."""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    from . import bench, doctor

    p = argparse.ArgumentParser(prog="fused-lce",
                                description="Fused linear cross-entropy: benchmark, "
                                            "environment and diagnosis.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="compare the plain path with fused_lce on this device (time, memory)",
                       description=bench.__doc__)
    bench.add_arguments(b)
    sub.add_parser("env",
                   help="print backend_info(): which backends exist here, and for each missing one why")
    dr = sub.add_parser("doctor", help="the report to attach to a bug: versions, backends, build, "
                        "self-checks, NPU kernel variants, timing", description=doctor.__doc__)
    doctor.add_arguments(dr)
    args = p.parse_args(argv)
    if args.cmd == "doctor":
        doctor.check_args(dr, args)
        return doctor.main_from_args(dr, args)
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
