"""python -m stagehand trace: record a model's training steps as a trace.

Imports torch only once the arguments are known to be good, so that a typo
is reported at once and `--list` works without torch.
"""

import argparse
import importlib.util
import os
import sys

from . import alloc, gpus

USAGE = "python -m stagehand trace MODEL [options]"

EPILOG = """\
MODEL is a built-in architecture, NAME[:KEY=VALUE,...] (see --list), or a
Python file that defines model(device) and batch(device), and may define
forward(model, batch), loss(output, batch) and optimizer(parameters)
(stagehand.trace.record() documents them). The model runs on the meta
device: shapes only, no GPU, no data.

examples:
  python -m stagehand trace gpt:layers=24,d=2048,lora=16 -o gpt-lora.trace.gz
  python -m stagehand trace resnet:batch=256 --gpu a100-80gb --mode preload
  python -m stagehand trace my_model.py --gpu fp32=30,bf16=120,bw=300,name=mycard
  stagehand-sim --trace gpt-lora.trace.gz --vram-gb 12 --pcie-gbps 25
"""


def parser():
    p = argparse.ArgumentParser(prog="python -m stagehand trace", usage=USAGE,
                                description="Records training steps of a PyTorch model as "
                                            "libstagehand would see them (docs/TRACE.md), "
                                            "with kernel durations from a GPU's roofline.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="NAME[:KEY=VALUE,...] or a Python file")
    p.add_argument("-o", "--out", help="the trace to write; a .gz name compresses it "
                                       "(default: MODEL.trace.gz here)")
    p.add_argument("--steps", type=int, default=4,
                   help="training steps (default 4: stagehand-sim measures those after two)")
    p.add_argument("--gpu", default="rtx4090",
                   help="a card (see --list) or its figures, e.g. fp32=82.6,bf16=165,bw=1008; "
                        "CARD,KEY=VALUE changes some of a card's (default rtx4090)")
    p.add_argument("--mode", choices=alloc.MODES, default="async",
                   help="the allocator under the library: async (default; cudaMallocAsync, "
                        "a region per tensor), preload (the caching allocator's segments), "
                        "pluggable (stagehand.enable('pluggable', mempool=False))")
    p.add_argument("--ids", choices=alloc.ID_MODES, default="unique",
                   help="unique (default): every region an id of its own; reuse: a freed "
                        "region's id comes back as the library's pool reuses it")
    p.add_argument("--no-marks", action="store_true",
                   help="record as a program that marks no steps or phases would be")
    p.add_argument("--tf32-matmul", action="store_true",
                   help="FP32 matmuls on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32)")
    p.add_argument("--list", action="store_true", help="list the built-in cards and models")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary")
    return p


def _list(out):
    print("cards (--gpu): dense peaks in TFLOP/s, memory bandwidth in GB/s", file=out)
    for n in gpus.names():
        g = gpus.CARDS[n]
        print("  %-10s fp32 %6.1f  tf32 %6.1f  bf16 %6.1f  fp16 %6.1f  bw %5.0f  mem %3.0f GB  "
              "pcie %2.0f GB/s" % (n, g.flops["fp32"] / 1e12, g.flops["tf32"] / 1e12,
                                   g.flops["bf16"] / 1e12, g.flops["fp16"] / 1e12,
                                   g.bandwidth / 1e9, g.memory_bytes / 1e9, g.pcie_bytes / 1e9),
              file=out)
    from . import models  # needs torch
    print("\nmodels (MODEL), with their options' defaults:", file=out)
    for line in models.describe_all().splitlines():
        print("  " + line, file=out)


def load_script(path):
    """The functions record() takes, from a Python file."""
    spec = importlib.util.spec_from_file_location("stagehand_trace_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    missing = [f for f in ("model", "batch") if not callable(getattr(mod, f, None))]
    if missing:
        raise ValueError("%s defines no %s: a model file defines model(device) and "
                         "batch(device)" % (path, " and no ".join(missing)))
    fns = {f: getattr(mod, f) for f in ("forward", "loss", "optimizer") if hasattr(mod, f)}
    return mod.model, mod.batch, fns


def _fail(msg, status=2):
    print("python -m stagehand trace: %s" % msg, file=sys.stderr)
    return status


def main(argv, out=None):
    out = out or sys.stdout
    args = parser().parse_args(argv)
    try:
        gpu = gpus.gpu(args.gpu)
    except gpus.GPUError as e:
        return _fail("--gpu: %s" % e)
    if args.list:
        _list(out)
        return 0
    if not args.model:
        return _fail("no model: give NAME[:KEY=VALUE,...] or a Python file (--list names them)")
    if args.steps < 1:
        return _fail("--steps %d: at least 1" % args.steps)
    if args.mode == "preload" and args.ids == "reuse":
        return _fail("--ids reuse: preload mode's regions are segments, never freed; "
                     "use --mode async or pluggable")
    is_file = args.model.endswith(".py") or os.path.sep in args.model
    stem = os.path.splitext(os.path.basename(args.model))[0] if is_file else \
        args.model.partition(":")[0]
    path = args.out or "%s.trace.gz" % stem
    if is_file and not os.path.isfile(args.model):
        return _fail("%s: no such file" % args.model)
    outdir = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(outdir):
        return _fail("--out %s: no such directory %s" % (path, outdir))

    try:
        import torch  # noqa: F401 - here, so that the checks above need no torch
    except ImportError:
        return _fail("PyTorch is needed to record a model (apt-get install python3-torch, or "
                     "pip install torch)", 1)
    from . import record
    from .recorder import TraceError

    kwargs = dict(steps=args.steps, gpu=gpu, mode=args.mode, ids=args.ids,
                  marks=not args.no_marks, tf32_matmul=args.tf32_matmul)
    if is_file:
        try:
            model, batch, fns = load_script(args.model)
        except (OSError, SyntaxError, ValueError) as e:
            return _fail(str(e))
        kwargs.update(fns)
        what = args.model
    else:
        from . import models
        try:
            spec = models.parse(args.model)
        except models.SpecError as e:
            return _fail(str(e))
        model, batch = spec.model, spec.batch
        kwargs.update(forward=spec.forward, loss=spec.loss, optimizer=spec.optimizer)
        what = spec.describe()
    try:
        stats = record(model, batch, path, **kwargs)
    except (TraceError, TypeError, ValueError) as e:
        return _fail("%s: %s" % (what, e), 1)
    if not args.quiet:
        summary(stats, what, path, gpu, args.mode, out)
    return 0


def summary(stats, what, path, gpu, mode, out):
    steps = stats["step_us"]
    steady = steps[2:] or steps[-1:]
    step_ms = sum(steady) / len(steady) / 1e3 if steady else 0.0
    print("%s: %d steps of %s, %d launches, %d regions (%s mode), peak %.2f GB in regions"
          % (path, stats["steps"], what, stats["launches"], stats["regions"], mode,
             stats["peak_region_bytes"] / 1e9), file=out)
    print("step time on %s with everything on the card: %.1f ms" % (gpu.name, step_ms), file=out)
    if stats["resurrected"]:
        print("warning: %d storages were used after their last known user died; their frees "
              "may be early" % stats["resurrected"], file=out)
    vram = gpu.memory_bytes / 1e9
    print("replay: stagehand-sim --trace %s%s --pcie-gbps %g" % (
        path, " --vram-gb %g" % vram if vram else " --oversub 2", gpu.pcie_bytes / 1e9), file=out)
