"""A Hugging Face Trainer callback that marks steps and phases.

    from stagehand.hf import StagehandCallback
    trainer = Trainer(..., callbacks=[StagehandCallback()])

The Trainer calls back at a step's start (before the forward pass of its
first micro-batch), before and after the optimizer step (transformers 4.41
and later), and at the step's end; it has no event between the forward and
the backward pass, so backward is left unmarked. With gradient accumulation
a step is one optimizer step, all its micro-batches included.
"""

try:
    from transformers import TrainerCallback
except ImportError as e:
    raise ImportError("stagehand.hf needs the transformers package (%s)" % e) from e

from . import Phase
from ._marks import Marks


class StagehandCallback(TrainerCallback):
    """Marks steps and phases for libstagehand; see the module docstring."""

    def __init__(self, required=True):
        self.marks = Marks(required)

    def on_step_begin(self, args, state, control, **kwargs):
        self.marks.step()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.marks.phase(Phase.OPTIMIZER)

    def on_step_end(self, args, state, control, **kwargs):
        self.marks.phase(Phase.STEP_END)
