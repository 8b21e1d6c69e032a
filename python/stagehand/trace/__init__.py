"""Record a PyTorch training run as libstagehand would see it, with no GPU.

    import stagehand.trace
    stats = stagehand.trace.record(
        model=lambda device: MyModel().to(device),     # built on the meta device
        batch=lambda device: (torch.randn(32, 3, 224, 224, device=device),),
        steps=4, gpu="rtx4090", mode="async", out="my.trace.gz")

then `stagehand-sim --trace my.trace.gz --vram-gb 12` predicts how the run
goes on a 12 GB card. The model runs on the meta device (shapes, no data),
so a model of billions of parameters records in seconds on a laptop;
kernel durations come from the roofline of the card named (gpus.py). The
layers: gpus.py (cards and the roofline), alloc.py (what the library sees
of PyTorch's allocator in each mode), ops.py (launches and their costs),
writer.py (the file), recorder.py (the dispatch mode tying them together),
models.py (the built-in architectures of `python -m stagehand trace`).

Needs PyTorch (1.13 or later); `import stagehand` does not import this.
"""

from . import alloc, gpus
from .alloc import ID_MODES, MODES
from .gpus import GPU, GPUError, gpu
from .recorder import Recorder, TraceError

__all__ = ["GPU", "GPUError", "ID_MODES", "MODES", "Recorder", "TraceError", "gpu",
           "record", "alloc", "gpus"]


def _default_loss(output, batch):
    """The output if it is the loss already, else its mean: a stand-in that
    makes backward run through the whole model."""
    return output if output.dim() == 0 else output.mean()


def _default_optimizer(params):
    import torch
    return torch.optim.AdamW(params, lr=1e-4, foreach=True)


def _as_tuple(b):
    return tuple(b) if isinstance(b, (tuple, list)) else (b,)


def _default_forward(model, batch):
    return model(*batch)


def _train_step(rec, model, batch, forward, loss, opt):
    """One step; its tensors die when it returns, as a training loop's do
    when the next batch replaces them."""
    rec.step()
    with rec.untimed():  # the batch is copied in: memory, no kernel
        b = _as_tuple(batch("meta"))
    rec.phase("forward")
    out = loss(forward(model, b), b)
    rec.phase("backward")
    out.backward()
    del out
    if opt is not None:
        rec.phase("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
    rec.phase("end")


def record(model, batch, out, steps=4, gpu="rtx4090", mode="async", ids="unique",
           forward=None, loss=None, optimizer=_default_optimizer, marks=True,
           tf32_matmul=False):
    """Records `steps` training steps to `out` (a .gz name compresses it).

    model(device) builds the model (an nn.Module already on the meta device
    is taken as it is); batch(device) makes one batch: a tensor or a tuple.
    forward(model, batch) runs the model (default: model(*batch), every
    item an input); loss(output, batch) makes the loss
    (default: the output if it is a scalar, else its mean);
    optimizer(parameters) makes the optimizer (default AdamW, foreach), or
    None for none. Set-up (the model, the optimizer) allocates memory but
    launches nothing, as loading a checkpoint onto the GPU would. Returns
    the recorder's figures (Recorder.stats, plus "op_counts").
    """
    import torch

    if steps < 1:
        raise ValueError("steps=%r: at least 1" % (steps,))
    with Recorder(out, gpu, mode, ids, marks, tf32_matmul) as rec:
        with rec.untimed():
            m = model if isinstance(model, torch.nn.Module) else model("meta")
            if not isinstance(m, torch.nn.Module):
                raise TypeError("model('meta') returned %s, not an nn.Module"
                                % type(m).__name__)
            if any(p.device.type != "meta" for p in m.parameters()):
                raise TraceError("the model's parameters must be on the meta device "
                                 "(build it with device='meta' or from model(device))")
            params = [p for p in m.parameters() if p.requires_grad]
            opt = optimizer(params) if optimizer is not None and params else None
        for _ in range(steps):
            _train_step(rec, m, batch, forward or _default_forward, loss or _default_loss, opt)
    stats = dict(rec.stats)
    stats["op_counts"] = dict(rec.op_counts)
    return stats
