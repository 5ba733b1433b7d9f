"""A start-up folder for enabling fused_lce without editing a training script.

    export FUSED_LINEAR_CE=1
    export PYTHONPATH="$(python -m fused_lce.integrations.startup)${PYTHONPATH:+:$PYTHONPATH}"
    python train.py ...        # or: swift sft ..., accelerate launch ..., torchrun ...

Python imports the ``sitecustomize`` module of this folder at start-up. With ``FUSED_LINEAR_CE`` on, it waits
until ``transformers.trainer`` is imported and then calls :func:`fused_lce.integrations.hf.autopatch`, so every
``transformers.Trainer`` (TRL's and ms-swift's trainers are subclasses) patches its model when it is built. Child
processes (torchrun workers) inherit both variables. Off (unset or 0), it does nothing.
"""
import os

DIR = os.path.dirname(os.path.abspath(__file__))
