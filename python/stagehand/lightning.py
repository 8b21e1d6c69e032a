"""A PyTorch Lightning callback that marks steps and phases.

    from stagehand.lightning import StagehandCallback
    trainer = L.Trainer(..., callbacks=[StagehandCallback()])

Works with `lightning` (lightning.pytorch) and the older `pytorch_lightning`.
Each training batch is a step: forward from its start, backward and the
optimizer step from Lightning's hooks before them, step end after it.
"""

try:
    from lightning.pytorch import Callback
except ImportError:
    try:
        from pytorch_lightning import Callback
    except ImportError as e:
        raise ImportError("stagehand.lightning needs lightning or pytorch_lightning (%s)"
                          % e) from e

from . import Phase
from ._marks import Marks


class StagehandCallback(Callback):
    """Marks steps and phases for libstagehand; see the module docstring."""

    def __init__(self, required=True):
        super().__init__()
        self.marks = Marks(required)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
        self.marks.step()

    def on_before_backward(self, trainer, pl_module, loss):
        self.marks.phase(Phase.BACKWARD)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer, *args):
        self.marks.phase(Phase.OPTIMIZER)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        self.marks.phase(Phase.STEP_END)
