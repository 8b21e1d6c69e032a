#!/usr/bin/env python3
"""train_gpt.py: GPT-style training on synthetic tokens, with and without
libstagehand.

A decoder-only transformer (default about 1.3 B parameters: 24 layers,
width 2048, 16 heads, sequence 1024, batch 8, vocabulary 50304, tied
embeddings), bf16 weights, AdamW, trained on synthetic tokens drawn from a
fixed seed. Weights are random, built from the config: nothing is
downloaded. Everything that can be made deterministic is (fixed seeds,
CUBLAS_WORKSPACE_CONFIG, torch.use_deterministic_algorithms, the flash
attention backend, whose backward pass has a deterministic mode), so two
runs of the same configuration give the same losses to the bit unless a
kernel without a deterministic variant is involved.

Output: one JSON line per step (the loss as repr and as the hex bits of
the float32, the step time, PyTorch's peak allocation, the library's
figures), then one {"summary": ...} line. Exit status: 0 ok, 2 bad
arguments, 3 CUDA out of memory, 4 an operation without a deterministic
implementation under --deterministic strict, 5 the profiler check failed.

Run it as tests/gpu/run.sh does:

  python3 tests/gpu/train_gpt.py --steps 20                       # reference
  STAGEHAND_BUDGET_VRAM_BUDGET_MB=12288 \\
      LD_PRELOAD=build/libstagehand.so python3 tests/gpu/train_gpt.py
  ... --allocator async          # backend:cudaMallocAsync, in the variable the
                                 # installed PyTorch reads (as stagehand run sets it)
  ... --allocator pluggable      # stagehand.enable("pluggable"): a MemPool where
                                 # PyTorch has one (--mempool no: replace the allocator)
  ... --allocator expandable     # expandable_segments:True: PyTorch maps its own
                                 # memory, which the library must manage
  ... --save-on-cpu | --accelerate-offload | --profiler
  ... --profiler-window 3:5      # torch.profiler over steps 3 and 4 only: the
                                 # library hands CUPTI over in mid-training
  ... --cudnn-benchmark          # a causal convolution in each block, cuDNN's
                                 # autotuner on (its workspace probes cudaMemGetInfo)
  python3 tests/gpu/train_gpt.py --compare ref.jsonl run.jsonl
  python3 tests/gpu/train_gpt.py --dry-run                        # CPU only

Only the standard library and the stagehand package (python/, itself
standard library only) are imported at module level, so --compare and the
report (tests/gpu/report.py) work where torch is not installed. Under
LD_PRELOAD the run starts with stagehand.enable("preload"), which stops it
(exit status 2) when PyTorch's allocator settings would leave the library
nothing to manage.
"""

import argparse
import contextlib
import ctypes
import importlib.util
import json
import math
import os
import re
import statistics
import struct
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
try:
    import stagehand  # installed (pip install ./python), or ...
except ImportError:
    sys.path.insert(0, os.path.join(REPO, "python"))  # ... the repository's copy
    import stagehand
from stagehand import _conf  # noqa: E402  the launcher's reading of the allocator variables

# Figures reported per step as the difference from the step before.
STATS_DELTAS = ("evictions", "restores", "d2h_bytes", "h2d_bytes",
                "launches", "remap_windows", "allocs", "frees", "opaque_work",
                "window_us", "drain_us", "copy_wait_us", "remap_us", "scan_us",
                "scan_wait_us", "scanned_bytes", "stalls", "stall_us",
                "fingerprint_us", "prefilter_us",
                "prefetches", "early_evictions", "steps_found")

EXIT_OOM, EXIT_NONDETERMINISTIC, EXIT_PROFILER = 3, 4, 5


# ---- small helpers (no torch) ---------------------------------------------

def float_hex(x):
    """The bits of x as a float32, as 0x%08x."""
    return "0x%08x" % struct.unpack(">I", struct.pack(">f", x))[0]


def step_window(text):
    """A:B, 0 <= A < B: the steps [A, B)."""
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not A:B (two step numbers)" % text)
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError("%r: need 0 <= A < B" % text)
    return a, b


def header_fields(path):
    """[(name, signed)] of stagehand_stats_t as the C header declares it."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"typedef struct stagehand_stats \{(.*?)\} stagehand_stats_t;",
                  text, re.S)
    if not m:
        raise ValueError("%s: no stagehand_stats_t" % path)
    return [(name, kind == "int64_t") for kind, name in
            re.findall(r"^\s*(u?int64_t)\s+(\w+);", m.group(1), re.M)]


def check_header():
    """The package's ctypes layout must match the C header, field for field."""
    path = os.path.join(REPO, "include", "stagehand.h")
    if not os.path.exists(path):
        return "no header at %s; layout not checked" % path
    fields = header_fields(path)
    if fields != list(stagehand.STATS_FIELDS):
        raise SystemExit("train_gpt.py: stagehand.STATS_FIELDS differs from %s:\n  %s\n  %s"
                         % (path, fields, list(stagehand.STATS_FIELDS)))
    return "stagehand_stats_t layout matches %s (%d fields)" % (path, len(fields))


def load_records(path):
    """(steps, summary) from a JSON-lines file this script wrote."""
    steps, summary = [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            if "step" in rec and "loss_hex" in rec:
                steps.append(rec)
            elif "summary" in rec:
                summary = rec["summary"]
    return steps, summary


def compare_records(ref, run, tolerance=None, steps=None):
    """Compares two runs' losses step by step.

    Bit for bit first; if they differ and a relative tolerance is given,
    within it. Returns a dict with "ok".
    """
    n = len(ref) if steps is None else steps
    out = {"steps": n, "bit_exact": False, "max_rel_diff": None,
           "first_diff_step": None, "tolerance": tolerance, "ok": False}
    if len(ref) < n or len(run) < n or n == 0:
        out["error"] = "too few steps: reference %d, run %d, wanted %d" % (
            len(ref), len(run), n)
        return out
    worst = 0.0
    for a, b in zip(ref[:n], run[:n]):
        if a["loss_hex"] != b["loss_hex"] and out["first_diff_step"] is None:
            out["first_diff_step"] = a["step"]
        la, lb = float(a["loss"]), float(b["loss"])
        if math.isfinite(la) and math.isfinite(lb):
            worst = max(worst, abs(la - lb) / max(abs(la), 1e-30))
        elif a["loss_hex"] != b["loss_hex"]:
            worst = math.inf
    out["max_rel_diff"] = worst
    out["bit_exact"] = out["first_diff_step"] is None
    out["ok"] = out["bit_exact"] or (tolerance is not None and worst <= tolerance)
    return out


def compare_files(ref_path, run_path, tolerance=None, steps=None):
    ref, _ = load_records(ref_path)
    run, _ = load_records(run_path)
    res = compare_records(ref, run, tolerance, steps)
    res.update(ref=ref_path, run=run_path)
    print(json.dumps({"compare": res}))
    if res.get("error"):
        print("compare: %s" % res["error"])
    elif res["bit_exact"]:
        print("compare: bit-exact over %d steps" % res["steps"])
    elif res["ok"]:
        print("compare: not bit-exact (first difference at step %d), max relative "
              "difference %.3g within the tolerance %.3g"
              % (res["first_diff_step"], res["max_rel_diff"], tolerance))
    else:
        print("compare: MISMATCH: first difference at step %s, max relative "
              "difference %.3g (tolerance %s)"
              % (res["first_diff_step"], res["max_rel_diff"], tolerance))
    return 0 if res["ok"] else 1


class Stagehand:
    """The stagehand package's control API, or nothing when the library is not
    loaded (the reference runs): the training loop is the same either way."""

    @property
    def present(self):
        return stagehand.loaded()

    def stats(self):
        return stagehand.stats() if self.present else {}

    def step(self):
        if self.present:
            stagehand.step()

    def phase(self, p):
        if self.present:
            stagehand.mark_phase(p)


TRACKING = {0: "none", 1: "cupti", 2: "hooks"}


class ProfilerWindow:
    """torch.profiler over steps [A, B) of training. Started after the library
    took CUPTI at its first allocation, the profiler's subscription makes the
    library hand CUPTI over in mid-run; it must then track launches through
    its hooks, and the profiler must still record device events."""

    def __init__(self, torch, window, cuda, sh):
        self.torch, self.cuda, self.sh = torch, cuda, sh
        self.start, self.stop = window
        self.prof = None
        self.facts = {"window": list(window)}

    def _tracking(self):
        return TRACKING.get(self.sh.stats().get("tracking_mode"), "absent")

    def at(self, step, sync):
        if step == self.start:
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            sync()
            self.facts["tracking_before"] = self._tracking()
            self.handovers = self.sh.stats().get("cupti_handovers", 0)
            self.prof = profile(activities=acts)
            self.prof.__enter__()
        elif step == self.stop:
            self.close(sync)

    def close(self, sync):
        if self.prof is None:
            return
        sync()
        self.facts["tracking_during"] = self._tracking()
        self.facts["cupti_handovers"] = \
            self.sh.stats().get("cupti_handovers", 0) - self.handovers
        self.prof.__exit__(None, None, None)
        self.facts["device_events"] = sum(
            1 for e in self.prof.events() if "CUDA" in str(getattr(e, "device_type", "")))
        self.prof = None

    def problems(self):
        """What the window shows went wrong, as messages."""
        f, out = self.facts, []
        if "tracking_during" not in f:
            return ["the training ended before step %d" % self.start]
        if self.cuda and f["device_events"] == 0:
            out.append("the profiler recorded no device events in steps %d-%d"
                       % (self.start, self.stop - 1))
        if self.sh.present and f["tracking_during"] == "cupti":
            out.append("the library kept CUPTI while the profiler ran")
        if self.sh.present and f["tracking_before"] == "cupti" and not f["cupti_handovers"]:
            out.append("the library counted no CUPTI hand-over")
        return out


class DeviceMemorySampler:
    """Peak device memory in use as the driver sees it (cuMemGetInfo, which
    the library does not intercept), and the peak of the library's own
    device_bytes, sampled on a helper thread."""

    def __init__(self, device_index, stagehand, period_s=0.01):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.index = device_index
        self.sh = stagehand
        self.period = period_s
        self.peak_used = 0
        self.peak_sh = 0
        self._stop = threading.Event()
        self._thread = None
        self.baseline = self.used()

    def _make_current(self):
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.cuda.cuDeviceGet(ctypes.byref(dev), self.index)
        self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        self.cuda.cuCtxSetCurrent(ctx)

    def used(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if self.cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) != 0:
            return 0
        return total.value - free.value

    def _sample(self):
        self.peak_used = max(self.peak_used, self.used())
        if self.sh.present:
            self.peak_sh = max(self.peak_sh, self.sh.stats().get("device_bytes", 0))

    def _main(self):
        self._make_current()
        while not self._stop.wait(self.period):
            self._sample()

    def start(self):
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread:
            self._thread.join()
        self._sample()


# ---- arguments ----------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(
        description="GPT-style training on synthetic tokens (see the module docstring).")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--distinct-batches", type=int, default=4,
                   help="synthetic batches cycled through, so the loss falls")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--allocator", choices=("default", "async", "pluggable", "expandable"),
                   default="default")
    p.add_argument("--lib", default=None,
                   help="libstagehand.so for --allocator pluggable (default: the preloaded "
                        "one, $STAGEHAND_LIB, or build/libstagehand.so)")
    p.add_argument("--mempool", choices=("auto", "yes", "no"), default="auto",
                   help="--allocator pluggable: install the allocator in a torch.cuda.MemPool "
                        "(auto: where PyTorch has it) or with change_current_allocator (no)")
    p.add_argument("--deterministic", choices=("strict", "warn", "off"),
                   default="strict",
                   help="strict: torch.use_deterministic_algorithms(True), which also "
                        "selects flash attention's deterministic backward; warn: "
                        "warn_only=True (kernels may then be nondeterministic)")
    p.add_argument("--attention", choices=("flash", "sdpa", "math"), default="flash",
                   help="flash: scaled_dot_product_attention restricted to the flash "
                        "backend; sdpa: any backend; math: explicit softmax(QK^T)V")
    p.add_argument("--save-on-cpu", action="store_true",
                   help="torch.autograd.graph.save_on_cpu(pin_memory=True) for the "
                        "saved activations")
    p.add_argument("--accelerate-offload", action="store_true",
                   help="accelerate.cpu_offload for the weights (forward and backward "
                        "only: cpu_offload keeps no trainable weights on the device)")
    p.add_argument("--profiler", action="store_true",
                   help="run under torch.profiler, started before the first CUDA "
                        "allocation so it holds CUPTI; checks the library's tracking")
    p.add_argument("--profiler-window", type=step_window, default=None, metavar="A:B",
                   help="run torch.profiler from step A to before step B, in the "
                        "middle of training, after the library holds CUPTI; checks "
                        "that it recorded device events and that the library went "
                        "on tracking through its hooks")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="add a causal depthwise convolution to each block (so cuDNN "
                        "runs) and turn torch.backends.cudnn.benchmark on; "
                        "deterministic algorithms are then not required")
    p.add_argument("--expect-tracking", choices=("none", "cupti", "hooks"), default=None,
                   help="fail unless the library tracks launches this way "
                        "(default with --profiler: hooks)")
    p.add_argument("--mark-steps", action="store_true",
                   help="mark steps and phases through the library's control API")
    p.add_argument("--warmup", type=int, default=2,
                   help="steps left out of the step-time median")
    p.add_argument("--sample-period", type=float, default=0.01,
                   help="seconds between device-memory samples")
    p.add_argument("--out", default=None, help="also write the JSON lines here")
    p.add_argument("--label", default=None, help="a name for this run in the summary")
    p.add_argument("--dry-run", action="store_true",
                   help="a tiny configuration on the CPU, end to end, twice")
    p.add_argument("--compare", nargs=2, metavar=("REF", "RUN"),
                   help="compare the losses of two JSON-lines files and exit")
    p.add_argument("--tolerance", type=float, default=None,
                   help="with --compare: relative loss difference accepted when "
                        "the runs are not bit-exact")
    p.add_argument("--compare-steps", type=int, default=None)
    args = p.parse_args(argv)
    if args.profiler and args.profiler_window:
        p.error("--profiler and --profiler-window are separate checks")
    if args.profiler_window and args.profiler_window[1] > args.steps:
        p.error("--profiler-window %d:%d ends after the last step (--steps %d)"
                % (args.profiler_window + (args.steps,)))
    if args.save_on_cpu and args.accelerate_offload:
        p.error("--save-on-cpu and --accelerate-offload are separate comparisons")
    if args.width % args.heads:
        p.error("--width must be a multiple of --heads")
    return args


def set_async_backend(environ):
    """backend:cudaMallocAsync in the variable the installed PyTorch reads
    (PYTORCH_CUDA_ALLOC_CONF up to 2.9, PYTORCH_ALLOC_CONF from 2.10, both
    when the version cannot be read), as `python -m stagehand run` sets it,
    keeping the other settings. Before torch is imported: PyTorch picks its
    backend when it loads."""
    version = _conf.parse_version(_conf.installed_torch_version())
    env = _conf.launch_env(environ, "", version, "async")
    for var in (_conf.OLD_VAR, _conf.NEW_VAR):
        if var in env:
            environ[var] = env[var]


def set_expandable(environ):
    """expandable_segments:True, native backend, in both allocator variables
    (every PyTorch version reads one of them), keeping the other settings."""
    for var in (_conf.OLD_VAR, _conf.NEW_VAR):
        environ[var] = _conf.conf_with(environ.get(var, ""), "expandable_segments", "True")


# ---- the model (built once torch is imported) ----------------------------

def make_model_classes(torch):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self, cfg, factory):
            super().__init__()
            d = cfg["width"]
            self.heads = cfg["heads"]
            self.attention = cfg["attention"]
            self.ln1 = nn.LayerNorm(d, **factory)
            self.qkv = nn.Linear(d, 3 * d, **factory)
            self.proj = nn.Linear(d, d, **factory)
            self.ln2 = nn.LayerNorm(d, **factory)
            self.fc = nn.Linear(d, 4 * d, **factory)
            self.fc2 = nn.Linear(4 * d, d, **factory)
            # Causal depthwise convolution: a cuDNN call in every block.
            self.conv = nn.Conv1d(d, d, kernel_size=4, groups=d, padding=3, **factory) \
                if cfg.get("conv") else None

        def attend(self, q, k, v):
            sdpa = getattr(F, "scaled_dot_product_attention", None)
            if self.attention != "math" and sdpa is not None:
                return sdpa(q, k, v, is_causal=True)
            t = q.size(-2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            att = att.masked_fill(~mask, float("-inf"))
            att = torch.softmax(att.float(), dim=-1).to(q.dtype)
            return att @ v

        def forward(self, x):
            b, t, c = x.shape
            if self.conv is not None:
                x = x + self.conv(x.transpose(1, 2))[..., :t].transpose(1, 2)
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                       for z in (q, k, v))
            y = self.attend(q, k, v).transpose(1, 2).contiguous().view(b, t, c)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self, cfg, factory):
            super().__init__()
            d = cfg["width"]
            self.wte = nn.Embedding(cfg["vocab"], d, **factory)
            self.wpe = nn.Embedding(cfg["seq"], d, **factory)
            self.blocks = nn.ModuleList(Block(cfg, factory) for _ in range(cfg["layers"]))
            self.ln_f = nn.LayerNorm(d, **factory)
            self.lm_head = nn.Linear(d, cfg["vocab"], bias=False, **factory)
            self.lm_head.weight = self.wte.weight  # tied

        def forward(self, idx):
            t = idx.size(1)
            pos = torch.arange(t, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.blocks:
                x = blk(x)
            return self.lm_head(self.ln_f(x))

    def init_weights(model, layers):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2:
                    std = 0.02
                    if name.endswith("proj.weight") or name.endswith("fc2.weight"):
                        std = 0.02 / math.sqrt(2 * layers)
                    p.normal_(0.0, std)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.fill_(1.0)

    return GPT, init_weights


def loss_fn(torch, logits, targets):
    """Mean next-token cross entropy, in float32, written with gather (whose
    backward has a deterministic implementation) rather than nll_loss."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).mean()


# ---- training ------------------------------------------------------------

def emit(rec, out):
    line = json.dumps(rec)
    print(line, flush=True)
    if out is not None:
        out.write(line + "\n")
        out.flush()


def setup_determinism(torch, mode, cudnn_benchmark=False):
    """Deterministic everything; with cudnn_benchmark, cuDNN's autotuner picks
    among its deterministic algorithms by timing, so two runs may differ in
    the last bits and are compared within a tolerance."""
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = cudnn_benchmark
    if hasattr(torch.backends, "cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if mode != "off":
        torch.use_deterministic_algorithms(True, warn_only=(mode == "warn"))


def attention_context(torch, args, device):
    """Restricts scaled_dot_product_attention to flash attention on CUDA."""
    if device.type != "cuda" or args.attention != "flash":
        return contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION])
    except ImportError:
        return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                              enable_mem_efficient=False)


def train(torch, args, device, out, sh, tag):
    """Builds the model and trains it; returns (step records, summary)."""
    GPT, init_weights = make_model_classes(torch)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    cfg = {"layers": args.layers, "width": args.width, "heads": args.heads,
           "seq": args.seq, "vocab": args.vocab, "attention": args.attention,
           "conv": args.cudnn_benchmark}
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    torch.manual_seed(args.seed)
    sampler = None
    if cuda:
        torch.empty(1, device=device)  # the context, and the library, start here
        sync()
        sampler = DeviceMemorySampler(device.index or 0, sh, args.sample_period)
        sampler.start()
        try:
            torch.cuda.reset_peak_memory_stats(device)
        except RuntimeError:
            pass  # the pluggable allocator keeps no statistics
    t_build = time.perf_counter()
    model = GPT(cfg, {"device": device, "dtype": dtype})
    init_weights(model, args.layers)
    nparams = sum(p.numel() for p in model.parameters())
    opt = None
    if args.accelerate_offload:
        from accelerate import cpu_offload
        model = cpu_offload(model, execution_device=device)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                eps=1e-8, weight_decay=0.1)
    sync()
    t_build = time.perf_counter() - t_build

    gen = torch.Generator().manual_seed(args.seed + 1)
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen)
               for _ in range(max(1, args.distinct_batches))]
    saving = (lambda: torch.autograd.graph.save_on_cpu(pin_memory=cuda)) \
        if args.save_on_cpu else contextlib.nullcontext

    records = []
    prev = sh.stats()
    window = ProfilerWindow(torch, args.profiler_window, cuda, sh) \
        if args.profiler_window else None
    with attention_context(torch, args, device):
        for step in range(args.steps):
            if window:
                window.at(step, sync)
            tokens = batches[step % len(batches)].to(device)
            x, y = tokens[:, :-1], tokens[:, 1:]
            sync()
            t0 = time.perf_counter()
            if args.mark_steps:
                sh.step()
                sh.phase(1)
            if opt is not None:
                opt.zero_grad(set_to_none=True)
            with saving():
                loss = loss_fn(torch, model(x), y)
            if args.mark_steps:
                sh.phase(2)
            loss.backward()
            if opt is not None:
                if args.mark_steps:
                    sh.phase(3)
                opt.step()
            if args.mark_steps:
                sh.phase(4)
            sync()
            dt = time.perf_counter() - t0
            value = loss.item()
            rec = {"step": step, "loss": repr(value), "loss_hex": float_hex(value),
                   "step_s": round(dt, 6)}
            if cuda:
                for key, fn in (("max_allocated", torch.cuda.max_memory_allocated),
                                ("max_reserved", torch.cuda.max_memory_reserved)):
                    try:
                        rec[key] = fn(device)
                    except RuntimeError:
                        rec[key] = None
            now = sh.stats()
            if now:
                rec["sh"] = {k: now[k] - prev.get(k, 0) for k in STATS_DELTAS}
                rec["sh"]["device_bytes"] = now["device_bytes"]
                rec["sh"]["host_bytes"] = now["host_bytes"]
                prev = now
            emit(rec, out)
            records.append(rec)
            del loss, tokens, x, y

    if sampler:
        sampler.stop()
    if window:
        window.close(sync)
    times = [r["step_s"] for r in records[args.warmup:]] or [r["step_s"] for r in records]
    median = statistics.median(times) if times else None
    tokens_per_step = args.batch * args.seq
    flops = (6 * nparams + 12 * args.layers * args.width * args.seq) * tokens_per_step
    summary = {
        "label": args.label or tag, "allocator": args.allocator, "steps": len(records),
        "layers": args.layers, "width": args.width, "heads": args.heads, "seq": args.seq,
        "batch": args.batch, "vocab": args.vocab, "dtype": args.dtype,
        "params": nparams, "tokens_per_step": tokens_per_step,
        "deterministic": args.deterministic, "attention": args.attention,
        "save_on_cpu": args.save_on_cpu, "accelerate_offload": args.accelerate_offload,
        "optimizer_step": opt is not None, "build_s": round(t_build, 3),
        "median_step_s": median, "mean_step_s": statistics.mean(times) if times else None,
        "min_step_s": min(times) if times else None,
        "model_tflops": round(flops / median / 1e12, 1) if median else None,
        "torch": torch.__version__, "device": str(device),
        "preloaded": "libstagehand" in os.environ.get("LD_PRELOAD", ""),
        "budget_env": os.environ.get("STAGEHAND_BUDGET_VRAM_BUDGET_MB"),
    }
    if cuda:
        summary["gpu"] = torch.cuda.get_device_name(device)
        summary["cuda"] = torch.version.cuda
        try:
            summary["allocator_backend"] = torch.cuda.get_allocator_backend()
        except (AttributeError, RuntimeError):
            summary["allocator_backend"] = None
        summary["max_allocated"] = records[-1].get("max_allocated") if records else None
        summary["max_reserved"] = records[-1].get("max_reserved") if records else None
        summary["device_used_baseline"] = sampler.baseline
        summary["device_used_peak"] = sampler.peak_used
        summary["device_used_peak_delta"] = max(0, sampler.peak_used - sampler.baseline)
        summary["sh_device_bytes_peak"] = sampler.peak_sh
    if sh.present:
        summary["sh"] = sh.stats()
    if window:
        summary["profiler_window"] = dict(window.facts, problems=window.problems())
    return records, summary


# ---- the dry run ------------------------------------------------------------

def dry_run(args):
    print(check_header())
    try:
        import torch
    except ImportError:
        print("skipped: torch not installed")
        return 0
    args.layers, args.width, args.heads, args.seq = 2, 64, 4, 32
    args.batch, args.vocab, args.steps, args.lr = 4, 256, 3, 1e-2
    args.distinct_batches, args.warmup = 1, 0
    device = torch.device("cpu")
    setup_determinism(torch, args.deterministic)
    sh = Stagehand()
    runs, summaries = {}, {}
    variants = (("first", {}), ("again", {}), ("save-on-cpu", {"save_on_cpu": True}),
                ("profiler-window", {"profiler_window": (1, 2)}),
                ("conv", {"cudnn_benchmark": True}))
    for tag, changes in variants:
        run_args = argparse.Namespace(**dict(vars(args), **changes))
        records, summary = train(torch, run_args, device, None, sh, "dry-" + tag)
        emit({"summary": summary}, None)
        runs[tag], summaries[tag] = records, summary
    problems = []
    for tag in ("first", "conv"):
        losses = [float(r["loss"]) for r in runs[tag]]
        if not all(math.isfinite(x) for x in losses):
            problems.append("%s: a loss is not finite: %s" % (tag, losses))
        if not losses[-1] < losses[0]:
            problems.append("%s: the loss did not fall over %d steps: %s"
                            % (tag, len(losses), losses))
    for tag in ("again", "save-on-cpu", "profiler-window"):
        res = compare_records(runs["first"], runs[tag])
        if not res["bit_exact"]:
            problems.append("%s run differs from the first: %s" % (tag, res))
    problems += summaries["profiler-window"]["profiler_window"]["problems"]
    if compare_records(runs["first"], runs["conv"])["bit_exact"]:
        problems.append("the convolution changed nothing: it is not in the model")
    losses = [float(r["loss"]) for r in runs["first"]]
    if problems:
        for p in problems:
            print("dry-run: FAIL: %s" % p)
        return 1
    shown = ", ".join("%.6f" % x for x in losses)
    print("dry-run: ok: torch %s, %d steps on the CPU, losses %s; a second run, a "
          "save_on_cpu run and a profiler-window run match to the bit; the "
          "convolution model trains" % (torch.__version__, len(losses), shown))
    return 0


# ---- main -------------------------------------------------------------------

def main(argv):
    args = parse_args(argv)
    if args.compare:
        return compare_files(args.compare[0], args.compare[1], args.tolerance,
                             args.compare_steps)
    if args.dry_run:
        return dry_run(args)

    # Read by PyTorch when it loads and when cuBLAS starts: set them first.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if args.allocator == "async":
        set_async_backend(os.environ)
    elif args.allocator == "expandable":
        set_expandable(os.environ)
    if args.accelerate_offload:
        if importlib.util.find_spec("accelerate") is None:
            print(json.dumps({"skipped": "accelerate not installed"}))
            print("skipped: accelerate not installed")
            return 0
    try:
        import torch
    except ImportError:
        print("skipped: torch not installed")
        return 0

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("train_gpt.py: CUDA is not available", file=sys.stderr)
        return 2
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    # The package installs the pluggable allocator, and under LD_PRELOAD
    # checks that PyTorch's allocator settings leave the library work to do.
    enabled = None
    try:
        if args.allocator == "pluggable":
            enabled = stagehand.enable("pluggable", lib=args.lib, mempool={
                "auto": None, "yes": True, "no": False}[args.mempool])
        elif "libstagehand" in os.environ.get("LD_PRELOAD", ""):
            enabled = stagehand.enable("preload")
    except stagehand.StagehandError as e:
        print("train_gpt.py: %s" % e, file=sys.stderr)
        return 2
    prof = None
    if args.profiler:
        # Before the first CUDA allocation, so that the profiler, not the
        # library, subscribes to CUPTI first.
        from torch.profiler import ProfilerActivity, profile
        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        prof.__enter__()
    setup_determinism(torch, args.deterministic, args.cudnn_benchmark)
    sh = Stagehand()

    out = open(args.out, "w", encoding="utf-8") if args.out else None
    tag = args.allocator + ("-save-on-cpu" if args.save_on_cpu else "") + \
        ("-accelerate" if args.accelerate_offload else "") + \
        ("-profiler" if args.profiler else "") + \
        ("-profiler-window" if args.profiler_window else "") + \
        ("-cudnn-benchmark" if args.cudnn_benchmark else "")
    try:
        records, summary = train(torch, args, device, out, sh, tag)
        summary["enabled"] = enabled._asdict() if enabled else None
    except RuntimeError as e:
        msg = str(e)
        if isinstance(e, getattr(torch.cuda, "OutOfMemoryError", ())) or \
                "out of memory" in msg:
            emit({"error": "oom", "message": msg.splitlines()[0]}, out)
            return EXIT_OOM
        if "deterministic" in msg:
            emit({"error": "nondeterministic", "message": msg.splitlines()[0]}, out)
            return EXIT_NONDETERMINISTIC
        raise
    status = 0
    if args.allocator == "async" and summary.get("allocator_backend") != "cudaMallocAsync":
        emit({"error": "allocator", "message": "backend is %r, not cudaMallocAsync"
              % summary.get("allocator_backend")}, out)
        status = 2
    # Expandable segments never reach cudaMalloc: whatever the library holds
    # under LD_PRELOAD is memory PyTorch mapped itself.
    if args.allocator == "expandable" and summary.get("sh", {}).get("active") and \
            not summary["sh"].get("regions_live"):
        emit({"error": "expandable", "message": "the library manages none of PyTorch's "
              "expandable segments"}, out)
        status = 2
    for problem in summary.get("profiler_window", {}).get("problems", []):
        emit({"error": "profiler", "message": problem}, out)
        status = EXIT_PROFILER
    expect = args.expect_tracking or ("hooks" if args.profiler else None)
    if prof is not None:
        prof.__exit__(None, None, None)
        kernels = 0
        for evt in prof.events():
            if "CUDA" in str(getattr(evt, "device_type", "")):
                kernels += 1
        summary["profiler_device_events"] = kernels
        if kernels == 0:
            emit({"error": "profiler", "message": "the profiler recorded no device "
                  "events: it did not trace the GPU alongside the library"}, out)
            status = EXIT_PROFILER
    if expect:
        got = TRACKING.get(summary.get("sh", {}).get("tracking_mode"), "absent")
        summary["tracking_expected"] = expect
        summary["tracking"] = got
        if got == "absent":
            emit({"error": "tracking", "message": "the library is not loaded"}, out)
            status = EXIT_PROFILER
        elif got != expect:
            emit({"error": "tracking", "message": "the library tracks launches by %s, "
                  "expected %s%s" % (got, expect, " (the profiler did not hold CUPTI "
                                     "before the library started)" if args.profiler
                                     else "")}, out)
            status = EXIT_PROFILER
    emit({"summary": summary}, out)
    if out:
        out.close()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
