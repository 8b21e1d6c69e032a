"""GPUs as a roofline: how long a kernel takes on a card, from its FLOPs and bytes.

A recorded launch gets the duration a named card would need for it:

    launch_us + max(flops / (peak[dtype] * compute_eff), bytes / (bandwidth * memory_eff))

The peaks are spec-sheet figures; no kernel reaches them, hence the two
efficiencies (the fraction of the peak a good kernel attains: large GEMMs
reach 70-80% of the tensor-core peak, streaming kernels about 80-90% of the
memory bandwidth). launch_us is what an eager PyTorch op costs however small
it is: the launch itself and the host-side dispatch the GPU waits for.

This module needs no torch, so the CLI can check a --gpu argument before it
imports torch.
"""

import dataclasses

# Dense peaks in TFLOP/s (the datasheets headline tensor-core figures "with
# sparsity": these are half of those), memory bandwidth in GB/s, memory in
# GB, and what one direction of the host link carries in practice (PCIe 4.0
# x16: about 25 GB/s of its 32; PCIe 5.0 x16: about 50 of its 64). FP16 and
# BF16 are the rates with FP32 accumulation, which PyTorch's GEMMs use (the
# GeForce cards run those at half their FP16-accumulate rate). FP32 is the
# CUDA-core rate; TF32 the tensor-core rate PyTorch uses for FP32
# convolutions by default (torch.backends.cudnn.allow_tf32) and for FP32
# matmuls when asked (torch.backends.cuda.matmul.allow_tf32).
# Sources: NVIDIA's datasheets and architecture whitepapers (GA102 for the
# RTX 3090, Ada for the RTX 4090, L4 and L40S; the A10, A100, H100 and H200
# datasheets). The A100 and H100 rows are the SXM parts unless named PCIe.
_CARDS = (
    # name          fp64    fp32  tf32   fp16   bf16   GB/s  mem  pcie  aliases
    ("rtx3090",     0.556,  35.6,  35.6,  71.0,  71.0,   936, 24,  25, ("3090",)),
    ("rtx4090",     1.29,   82.6,  82.6, 165.2, 165.2,  1008, 24,  25, ("4090",)),
    ("a10",         0.977,  31.2,  62.5, 125.0, 125.0,   600, 24,  25, ()),
    ("l4",          0.473,  30.3,  60.0, 121.0, 121.0,   300, 24,  25, ()),
    ("l40s",        1.431,  91.6, 183.0, 362.0, 362.0,   864, 48,  25, ()),
    ("a100-40gb",   9.7,    19.5, 156.0, 312.0, 312.0,  1555, 40,  25, ("a100-40",)),
    ("a100-80gb",   9.7,    19.5, 156.0, 312.0, 312.0,  2039, 80,  25, ("a100", "a100-80")),
    ("h100-pcie",  26.0,    51.2, 378.0, 756.0, 756.0,  2000, 80,  50, ()),
    ("h100",       34.0,    67.0, 494.7, 989.4, 989.4,  3350, 80,  50, ("h100-sxm",)),
    ("h200",       34.0,    67.0, 494.7, 989.4, 989.4,  4800, 141, 50, ("h200-sxm",)),
)

# The fraction of the peaks a kernel attains, and the cost of a launch,
# unless the card's figures say otherwise.
DEFAULT_COMPUTE_EFF = 0.7
DEFAULT_MEMORY_EFF = 0.85
DEFAULT_LAUNCH_US = 5.0

DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16")


class GPUError(ValueError):
    """A --gpu argument that names no card or gives bad figures."""


@dataclasses.dataclass(frozen=True)
class GPU:
    """A card's roofline. Peaks in FLOP/s per dtype, bandwidth in bytes/s."""

    name: str
    flops: dict
    bandwidth: float
    memory_bytes: float = 0.0
    pcie_bytes: float = 25e9
    compute_eff: float = DEFAULT_COMPUTE_EFF
    memory_eff: float = DEFAULT_MEMORY_EFF
    launch_us: float = DEFAULT_LAUNCH_US

    def duration_us(self, flops, nbytes, dtype="fp32"):
        """The roofline time of one launch, in microseconds."""
        peak = self.flops.get(dtype) or self.flops["fp32"]
        compute = flops / (peak * self.compute_eff)
        memory = nbytes / (self.bandwidth * self.memory_eff)
        return self.launch_us + 1e6 * max(compute, memory)

    def describe(self):
        """One line of figures, as --gpu takes them (the trace's `i gpu` record)."""
        parts = ["name=%s" % self.name]
        parts += ["%s=%g" % (d, self.flops[d] / 1e12) for d in DTYPES if d in self.flops]
        parts += ["bw=%g" % (self.bandwidth / 1e9), "mem=%g" % (self.memory_bytes / 1e9),
                  "pcie=%g" % (self.pcie_bytes / 1e9), "compute_eff=%g" % self.compute_eff,
                  "memory_eff=%g" % self.memory_eff, "launch_us=%g" % self.launch_us]
        return ",".join(parts)


def _card(row):
    name, fp64, fp32, tf32, fp16, bf16, bw, mem, pcie, _ = row
    flops = dict(zip(DTYPES, (x * 1e12 for x in (fp64, fp32, tf32, fp16, bf16))))
    return GPU(name, flops, bw * 1e9, mem * 1e9, pcie * 1e9)


CARDS = {row[0]: _card(row) for row in _CARDS}
_ALIASES = {a: row[0] for row in _CARDS for a in row[9]}

# Keys of a card given by its figures, and their ranges (a typo such as
# bw=1008e9 would otherwise make every kernel free).
_KEYS = {
    "fp64": (1e-3, 1e5), "fp32": (1e-3, 1e5), "tf32": (1e-3, 1e5), "fp16": (1e-3, 1e5),
    "bf16": (1e-3, 1e5), "bw": (1.0, 1e6), "mem": (0.0, 1e5), "pcie": (0.01, 1e4),
    "compute_eff": (0.01, 1.0), "memory_eff": (0.01, 1.0), "launch_us": (0.0, 1e6),
}
_UNITS = {"fp64": "TFLOP/s", "fp32": "TFLOP/s", "tf32": "TFLOP/s", "fp16": "TFLOP/s",
          "bf16": "TFLOP/s", "bw": "GB/s", "mem": "GB", "pcie": "GB/s",
          "compute_eff": "a fraction", "memory_eff": "a fraction", "launch_us": "us"}


def names():
    """The built-in cards' names."""
    return sorted(CARDS)


def gpu(spec):
    """A GPU from a card's name (`rtx4090`), or from figures, or both.

    `rtx4090` is the table's card. `bf16=165,fp32=82.6,bw=1008` is a card of
    those figures (TFLOP/s, GB/s): fp32 and bw are required, the tensor-core
    dtypes default to fp32's rate, fp64 to a 64th of it. `rtx4090,launch_us=8`
    is the table's card with some figures changed. Raises GPUError saying
    what is wrong.
    """
    if isinstance(spec, GPU):
        return spec
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if not parts:
        raise GPUError("empty GPU: give a card (%s) or its figures, e.g. "
                       "fp32=82.6,bf16=165,bw=1008" % ", ".join(names()))
    base = None
    if "=" not in parts[0]:
        key = parts.pop(0).lower().replace("_", "-")
        key = _ALIASES.get(key, key)
        if key not in CARDS:
            raise GPUError("unknown GPU %r: one of %s, or figures such as "
                           "fp32=82.6,bf16=165,bw=1008" % (spec, ", ".join(names())))
        base = CARDS[key]
    given, name = {}, None
    for p in parts:
        k, sep, v = p.partition("=")
        k = k.strip().lower()
        if not sep:
            raise GPUError("%r: expected KEY=VALUE (keys: name, %s)" % (p, ", ".join(_KEYS)))
        if k == "name":
            name = v.strip()
            continue
        if k not in _KEYS:
            raise GPUError("unknown GPU figure %r: one of name, %s" % (k, ", ".join(_KEYS)))
        try:
            x = float(v)
        except ValueError:
            raise GPUError("%s=%r: not a number" % (k, v)) from None
        lo, hi = _KEYS[k]
        if not lo <= x <= hi:
            raise GPUError("%s=%g: expected %s in [%g, %g]" % (k, x, _UNITS[k], lo, hi))
        given[k] = x
    if base is None:
        missing = [k for k in ("fp32", "bw") if k not in given]
        if missing:
            raise GPUError("a GPU given by its figures needs %s (TFLOP/s and GB/s)"
                           % " and ".join(missing))
        fp32 = given["fp32"]
        flops = {"fp64": given.get("fp64", fp32 / 64), "fp32": fp32}
        for d in ("tf32", "fp16", "bf16"):
            flops[d] = given.get(d, fp32)
        return GPU(name or "custom", {d: x * 1e12 for d, x in flops.items()},
                   given["bw"] * 1e9, given.get("mem", 0) * 1e9, given.get("pcie", 25) * 1e9,
                   given.get("compute_eff", DEFAULT_COMPUTE_EFF),
                   given.get("memory_eff", DEFAULT_MEMORY_EFF),
                   given.get("launch_us", DEFAULT_LAUNCH_US))
    flops = dict(base.flops)
    flops.update({d: given[d] * 1e12 for d in DTYPES if d in given})
    scale = {"bw": "bandwidth", "mem": "memory_bytes", "pcie": "pcie_bytes"}
    changes = {scale[k]: given[k] * 1e9 for k in scale if k in given}
    changes.update({k: given[k] for k in ("compute_eff", "memory_eff", "launch_us")
                    if k in given})
    return dataclasses.replace(base, name=name or base.name, flops=flops, **changes)
