"""A start-up folder for enabling fused_lce where its ``.pth`` hook is not installed (e.g. a source checkout
on ``PYTHONPATH`` rather than ``pip install``); a pip-installed fused_lce needs only ``FUSED_LINEAR_CE=1``.

    export FUSED_LINEAR_CE=1
    export PYTHONPATH="$(python -m fused_lce.integrations.startup)${PYTHONPATH:+:$PYTHONPATH}"
    python train.py ...        # or: swift sft ..., accelerate launch ..., torchrun ...

Python imports the ``sitecustomize`` module of this folder at start-up; with ``FUSED_LINEAR_CE`` on it arms
the same hook as the ``.pth`` file (:mod:`fused_lce_autopatch`).
"""
import os

DIR = os.path.dirname(os.path.abspath(__file__))
