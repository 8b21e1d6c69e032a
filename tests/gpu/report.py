#!/usr/bin/env python3
"""report.py: results.md from what tests/gpu/run.sh left in its results folder.

  report.py --results build/gpu/results --out build/gpu/results/results.md
  report.py --tolerance REF.jsonl REF2.jsonl FLOOR     (prints a tolerance)
  report.py --self-test                                (no GPU, no torch)

The file it writes follows docs/BENCHMARKS.md's sections, so its tables
paste in as they are. It exits 1 when one of its own checks fails: a
training run's losses differ from the reference, the library held more
device memory than its budget, an oversubscribed run did not evict, or the
profiler run did not fall back to the hooks. Performance targets are
reported as met or missed, never failed on: a slow run is a finding, not a
broken build.

Standard library only.
"""

import argparse
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import train_gpt  # noqa: E402  (imports no torch at module level)

GB = 2 ** 30
MB = 2 ** 20
# Device memory the driver counts that no allocation asked for: the
# context, lazily loaded kernel modules, cuBLAS and CUPTI state.
DEFAULT_SLACK_MB = 2048
COPY_TARGET = 0.85
# The C programs in the order run.sh runs them.
C_ORDER = ("host_vmm", "fingerprint", "oversub-plain", "oversub", "pointer_table", "pointer_table-plain",
           "past_budget", "past_budget-plain", "stress", "stress-plain", "tracking-cupti", "tracking-hooks", "tracking-subscriber",
           "bandwidth", "remap", "launch-plain", "launch-cupti", "launch-hooks")
OVERHEAD_TARGET = 0.01


# ---- reading ---------------------------------------------------------------

def read_meta(path):
    meta = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.rstrip("\n").partition("=")
                if sep:
                    meta[key] = value
    return meta


def read_text(path, default=None):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return default


def parse_c_log(path):
    """{"status", "line", "results": {tag: {key: value}}} of one C program."""
    out = {"status": "not run", "line": "", "results": {}}
    if not os.path.exists(path):
        return out
    out["status"] = "no verdict"
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("PASS ") or line.startswith("FAIL "):
                out["status"] = line[:4]
                out["line"] = line.split(": ", 1)[1] if ": " in line else line
            elif line.startswith("RESULT "):
                tokens = line.split()[2:]
                kv = dict(t.split("=", 1) for t in tokens if "=" in t)
                tag = " ".join(t for t in tokens if "=" not in t) or "main"
                if "size_mb" in kv:
                    tag = "size %s" % kv["size_mb"]
                out["results"][tag] = kv
    rc = read_text(path[:-4] + ".rc")
    if rc not in (None, "0") and out["status"] == "PASS":
        out["status"] = "FAIL"
        out["line"] = "exit %s after PASS" % rc
    return out


def load_run(path):
    """(steps, summary, errors) of a train_gpt.py run, or None when absent."""
    if not os.path.exists(path):
        return None
    steps, summary = train_gpt.load_records(path)
    errors = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith('{"error"') or line.startswith('{"skipped"'):
                errors.append(json.loads(line))
    rc = read_text(path[:-6] + ".rc")
    return {"steps": steps, "summary": summary or {}, "errors": errors, "rc": rc,
            "name": os.path.basename(path)[:-6]}


def fnum(x, fmt="%.3f", none="–"):
    return none if x is None else fmt % x


def gb(x):
    return "–" if x is None else "%.1f GB" % (x / GB)


def median_after(steps, key, warmup=2):
    vals = [s[key] for s in steps[warmup:] if s.get(key) is not None]
    if not vals:
        vals = [s[key] for s in steps if s.get(key) is not None]
    return statistics.median(vals) if vals else None


def sh_per_step(steps, key, warmup=2):
    vals = [s["sh"][key] for s in steps[warmup:] if s.get("sh") and key in s["sh"]]
    return statistics.median(vals) if vals else None


# ---- the report ------------------------------------------------------------

class Report:
    def __init__(self, res):
        self.res = res
        self.lines = []
        self.failures = []
        self.meta = read_meta(os.path.join(res, "meta.txt"))
        self.quick = read_text(os.path.join(res, "mode.txt"), "quick=0") == "quick=1"
        self.det = read_text(os.path.join(res, "determinism.txt"), "strict")
        tol = read_text(os.path.join(res, "tolerance.txt"))
        self.tolerance = float(tol) if tol else None
        logs = {os.path.basename(p)[:-4]: p for p in glob.glob(os.path.join(res, "c", "*.log"))}
        order = [n for n in C_ORDER if n in logs] + sorted(n for n in logs if n not in C_ORDER)
        self.c = {n: parse_c_log(logs[n]) for n in order}
        self.runs = {}
        for d in ("train", "measure"):
            for p in sorted(glob.glob(os.path.join(res, d, "*.jsonl"))):
                self.runs["%s/%s" % (d, os.path.basename(p)[:-6])] = load_run(p)
            # A run that stopped before writing anything left only its exit status.
            for p in sorted(glob.glob(os.path.join(res, d, "*.rc"))):
                key = "%s/%s" % (d, os.path.basename(p)[:-3])
                if key not in self.runs:
                    self.runs[key] = {"steps": [], "summary": {}, "errors": [],
                                      "rc": read_text(p), "name": key.split("/")[1]}
        self.budget_mb = self._budget()

    def _budget(self):
        for r in self.runs.values():
            b = r["summary"].get("budget_env")
            if b:
                m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*(g|gb|gib)?\s*$", b, re.I)
                if m:
                    return float(m.group(1)) * (1024 if m.group(2) else 1)
        return None

    def out(self, line=""):
        self.lines.append(line)

    def fail(self, what):
        self.failures.append(what)

    def table(self, head, rows):
        self.out("| " + " | ".join(head) + " |")
        self.out("|" + "---|" * len(head))
        for r in rows:
            self.out("| " + " | ".join(str(c) for c in r) + " |")
        self.out()

    # ---- sections ----

    def machine(self):
        m = self.meta
        self.out("### Machine")
        self.out()
        self.table(("", ""), [
            ("date (UTC)", m.get("date", "?")),
            ("GPU (name, memory, PCIe generation, width)", m.get("gpu") or m.get("probe", "?")),
            ("driver", m.get("driver", "?")),
            ("CUDA toolkit (nvcc)", m.get("nvcc", "?")),
            ("CPU, RAM", "%s, %s GB" % (m.get("cpu", "?"), m.get("ram_gb", "?"))),
            ("kernel", m.get("kernel", "?")),
            ("Python, PyTorch (CUDA)", "%s, %s" % (m.get("python", "?"), m.get("torch", "?"))),
            ("accelerate", m.get("accelerate", "?")),
            ("libstagehand", "commit %s (%s)" % (m.get("commit", "?"), m.get("library", "?"))),
            ("run", "tests/gpu/run.sh%s" % (" --quick" if self.quick else "")),
        ])

    def scenarios(self):
        self.out("### 1. Real-hardware scenarios")
        self.out()
        if not self.c:
            self.out("Not run.")
            self.out()
            return
        rows = []
        for name, c in self.c.items():
            rows.append((name, c["status"], c["line"].replace("|", "/")))
            if c["status"] != "PASS":
                self.fail("%s: %s %s" % (name, c["status"], c["line"]))
        self.table(("program", "result", "what it showed"), rows)
        o = self.c.get("oversub", {}).get("results", {}).get("main")
        p = self.c.get("oversub-plain", {}).get("results", {}).get("main")
        if o and p:
            same = o.get("digest") == p.get("digest")
            self.out("oversub: the digest of every word is %s with the library and %s without "
                     "(%s); eviction traffic during the bump passes ran at %s GB/s." %
                     (o.get("digest"), p.get("digest"), "equal" if same else "DIFFERENT",
                      o.get("bump_moved_gbps")))
            self.out()

    def training(self):
        self.out("### 2. PyTorch training")
        self.out()
        ref = self.runs.get("train/ref")
        if not ref or not ref["steps"]:
            self.out("Not run." if not ref else "The reference run failed (exit %s)." % ref["rc"])
            self.out()
            if ref:
                self.fail("train/ref: the reference did not complete")
            return
        s = ref["summary"]
        footprint = s.get("max_allocated")
        self.out("Model: %s parameters (%s layers, width %s, %s heads), sequence %s, batch %s, "
                 "vocabulary %s, %s, AdamW, synthetic tokens; %s steps. Reference: no library, "
                 "the whole card. Peak allocated by PyTorch in the reference: %s. Budget for "
                 "the runs below: %s MB." %
                 ("%.2f B" % (s["params"] / 1e9), s.get("layers"), s.get("width"),
                  s.get("heads"), s.get("seq"), s.get("batch"), s.get("vocab"), s.get("dtype"),
                  s.get("steps"), gb(footprint), fnum(self.budget_mb, "%.0f")))
        self.out()
        if self.det == "warn":
            self.out("Determinism: an operation had no deterministic implementation, so the runs "
                     "used `--deterministic warn`; two references without the library differ, "
                     "and the runs below are held to a relative tolerance of %s (four times "
                     "the reference-to-reference difference, at least 0.005)." %
                     fnum(self.tolerance, "%.3g"))
        else:
            self.out("Determinism: `torch.use_deterministic_algorithms(True)`, "
                     "`CUBLAS_WORKSPACE_CONFIG=:4096:8`, flash attention (deterministic "
                     "backward), fixed seeds: the losses must match the reference bit for bit.")
        self.out()
        if footprint and self.budget_mb and footprint < 1.5 * self.budget_mb * MB:
            self.out("Note: the footprint is less than 1.5x the budget; the runs are not "
                     "oversubscribed as much as intended.")
            self.out()
        rows = []
        ref_step = median_after(ref["steps"], "step_s")
        cudnn_ref = self.runs.get("train/ref-cudnn")
        for key in ("train/ref", "train/ref2", "train/oversub-default", "train/oversub-async",
                    "train/oversub-pluggable", "train/oversub-expandable", "train/profiler",
                    "train/profiler-window", "train/ref-cudnn", "train/oversub-cudnn"):
            r = self.runs.get(key)
            if r is None:
                continue
            if key == "train/oversub-cudnn" and cudnn_ref:
                # cuDNN's autotuner may pick other algorithms run to run.
                rows.append(self.training_row(key, r, cudnn_ref, self.tolerance or
                                              float(os.environ.get("TRAIN_TOLERANCE",
                                                                   "0.005"))))
            else:
                rows.append(self.training_row(key, r, ref))
        self.table(("run", "allocator", "losses vs reference", "median step",
                    "vs reference", "peak allocated", "device use (driver)",
                    "library's device peak", "evictions", "restores", "moved per step",
                    "tracking"),
                   [row[:2] + row[2:4] + (self.ratio(row[4], ref_step),) + row[5:]
                    for row in rows])
        self.time_split()
        prof = self.runs.get("train/profiler")
        if prof and prof["summary"]:
            ps = prof["summary"]
            self.out("Under torch.profiler the library tracked launches by **%s** (expected "
                     "hooks) and the profiler recorded %s device events alongside it." %
                     (ps.get("tracking", "?"), ps.get("profiler_device_events", "?")))
            self.out()
        win = self.runs.get("train/profiler-window")
        pw = ((win or {}).get("summary") or {}).get("profiler_window")
        if pw:
            self.out("With torch.profiler started at step %d, after the library held CUPTI, the "
                     "library tracked launches by **%s** before and **%s** during the window "
                     "(%s hand-over), and the profiler recorded %s device events." %
                     (pw["window"][0], pw.get("tracking_before", "?"),
                      pw.get("tracking_during", "?"), pw.get("cupti_handovers", "?"),
                      pw.get("device_events", "?")))
            self.out()

    def time_split(self):
        """Where an oversubscribed step's time went, by the library's own
        clocks (medians per step after the first two)."""
        rows = []
        for mode in ("default", "async", "pluggable", "expandable", "cudnn"):
            r = self.runs.get("train/oversub-" + mode)
            if not r or not r["steps"]:
                continue
            per = {k: sh_per_step(r["steps"], k) for k in
                   ("window_us", "drain_us", "copy_wait_us", "remap_us", "stalls", "stall_us",
                    "scan_us", "scan_wait_us", "scanned_bytes", "fingerprint_us",
                    "prefilter_us", "launches", "opaque_work", "prefetches", "early_evictions")}
            if per["window_us"] is None:
                continue  # a library older than these figures
            ms = lambda k: fnum(None if per[k] is None else per[k] / 1e3, "%.0f ms")  # noqa: E731
            opaque = ("%.0f%%" % (100.0 * per["opaque_work"] / per["launches"])
                      if per["launches"] and per["opaque_work"] is not None else "–")
            found = (r["summary"].get("sh") or {}).get("steps_found", "–")
            rows.append((mode, fnum(median_after(r["steps"], "step_s"), "%.3f s"),
                         ms("window_us"), ms("drain_us"), ms("copy_wait_us"), ms("remap_us"),
                         "%s (%s)" % (fnum(per["stalls"], "%.0f"), ms("stall_us")),
                         "%s, %s (%s waited)" % (gb(per["scanned_bytes"]), ms("scan_us"),
                                                 ms("scan_wait_us")),
                         "%s, %s" % (ms("fingerprint_us"), ms("prefilter_us")),
                         opaque, fnum(per["prefetches"], "%.0f"),
                         fnum(per["early_evictions"], "%.0f"), found))
        if not rows:
            return
        self.out("Where an oversubscribed step's time goes (the library's clocks; medians per "
                 "step): remap windows open (no work issued), of which waiting for the work "
                 "in flight, for the copies and for the driver's remaps; launches held for "
                 "residency; evicted bytes read on the CPU for pointers (and the program's "
                 "wait for that); the device's fingerprints and pointer prefilter, waited "
                 "for; opaque launches; moves ahead of need; steps the scheduler "
                 "found.")
        self.out()
        self.table(("allocator", "step", "windows", "drain", "copies", "remap",
                    "stalls (time)", "pointer scan", "fingerprints, prefilter", "opaque",
                    "prefetches", "early evictions", "steps found"), rows)

    @staticmethod
    def ratio(x, ref):
        return "–" if x is None or not ref else "%.2fx" % (x / ref)

    def training_row(self, key, r, ref, tol=None):
        s, name = r["summary"], key.split("/")[1]
        sh = s.get("sh") or {}
        if r["rc"] not in (None, "0"):
            self.fail("%s: exit %s %s" % (key, r["rc"], r["errors"][:1]))
        if r["steps"] and key == "train/ref-cudnn":
            verdict = "reference for oversub-cudnn"
        elif r["steps"] and key != "train/ref":
            if tol is None:
                tol = self.tolerance if self.det == "warn" else None
            n = min(len(r["steps"]), len(ref["steps"]))
            res = train_gpt.compare_records(ref["steps"], r["steps"], tol, n)
            if res["bit_exact"]:
                verdict = "bit-exact (%d steps)" % n
            elif res["ok"]:
                verdict = "within %.3g (max %.2g)" % (tol, res["max_rel_diff"])
            else:
                verdict = "**DIFFER** from step %s (max %.2g)" % (
                    res["first_diff_step"], res["max_rel_diff"] or 0)
                if key != "train/ref2":
                    self.fail("%s: losses differ from the reference" % key)
        elif key == "train/ref":
            verdict = "reference"
        else:
            verdict = "failed (exit %s)" % r["rc"]
        if r["steps"] and r["rc"] not in (None, "0"):
            verdict += ", then exit %s" % r["rc"]
        for e in r["errors"]:
            if e.get("error") in ("tracking", "profiler"):
                self.fail("%s: %s" % (key, e.get("message")))
        if s and (s.get("preloaded") or key.startswith("train/oversub")):
            self.budget_checks(key, s)
        moved = None
        d2h, h2d = sh_per_step(r["steps"], "d2h_bytes"), sh_per_step(r["steps"], "h2d_bytes")
        if d2h is not None and h2d is not None:
            moved = "%.1f GB" % ((d2h + h2d) / GB)
        return (name, s.get("allocator", "?"), verdict,
                fnum(median_after(r["steps"], "step_s"), "%.3f s"),
                median_after(r["steps"], "step_s"), gb(s.get("max_allocated")),
                gb(s.get("device_used_peak_delta")), gb(s.get("sh_device_bytes_peak")),
                sh.get("evictions", "–"), sh.get("restores", "–"), moved or "–",
                {1: "cupti", 2: "hooks"}.get(sh.get("tracking_mode"), "–"))

    def budget_checks(self, key, s):
        sh = s.get("sh") or {}
        budget = sh.get("budget_bytes") or (self.budget_mb or 0) * MB
        if not sh:
            self.fail("%s: the library was not loaded" % key)
            return
        if not budget:
            return
        if s.get("sh_device_bytes_peak", 0) > budget:
            self.fail("%s: the library held %s on the device, above its %s budget" %
                      (key, gb(s["sh_device_bytes_peak"]), gb(budget)))
        slack = float(os.environ.get("TRAIN_SLACK_MB", DEFAULT_SLACK_MB)) * MB
        if s.get("device_used_peak_delta", 0) > budget + slack:
            self.fail("%s: device use rose %s above the baseline, over the %s budget + %s "
                      "for the context" % (key, gb(s["device_used_peak_delta"]), gb(budget),
                                           gb(slack)))
        if key.startswith("train/oversub") and not sh.get("evictions"):
            self.fail("%s: no eviction under a %s budget" % (key, gb(budget)))

    def measurements(self):
        self.out("### 3. Measurements")
        self.out()
        self.overhead()
        self.bound()
        self.copy_bandwidth()
        self.alternatives()
        self.launch_cost()

    def fit_footprint(self, lib):
        """What the library moved and pinned in the runs that fit: nothing, by design."""
        ends = [r["summary"].get("sh") for r in lib if r["summary"].get("sh")]
        if not ends:
            return
        moved = max(e.get("d2h_bytes", 0) + e.get("h2d_bytes", 0) for e in ends)
        pinned = max(e.get("pinned_bytes", 0) for e in ends)
        self.out("Footprint with the library (the most of %d run(s)): %s moved, %.0f MB of host "
                 "memory pinned (a program far below its limit should move and pin nothing)."
                 % (len(ends), "nothing" if moved == 0 else "%.0f MB" % (moved / 2**20),
                    pinned / 2**20))
        self.out()

    def overhead(self):
        self.out("#### 3a. Step-time overhead when the model fits (target ≤ 1%)")
        self.out()
        plain = [self.runs.get("measure/fit-plain-%d" % i) for i in (1, 2)]
        lib = [self.runs.get("measure/fit-lib-%d" % i) for i in (1, 2)]
        plain = [r for r in plain if r and r["steps"]]
        lib = [r for r in lib if r and r["steps"]]
        if not plain or not lib:
            self.out("Not measured.")
            self.out()
            return
        rows, pooled = [], {"plain": [], "lib": []}
        for tag, runs in (("plain", plain), ("lib", lib)):
            for r in runs:
                times = [s["step_s"] for s in r["steps"][2:]]
                pooled[tag] += times
                rows.append((r["name"], len(times), "%.4f s" % statistics.median(times),
                             "%.4f s" % min(times)))
        self.table(("run", "steps timed", "median step", "fastest step"), rows)
        mp, ml = statistics.median(pooled["plain"]), statistics.median(pooled["lib"])
        over = ml / mp - 1
        self.out("Overhead: median %.4f s with the library against %.4f s without: **%+.2f%%** "
                 "(%s the 1%% target). Runs alternated plain, library, plain, library; "
                 "steps 0 and 1 left out." % (ml, mp, over * 100,
                                              "meets" if over <= OVERHEAD_TARGET else "misses"))
        self.out()
        self.fit_footprint(lib)
        pa, la = self.runs.get("measure/fit-plain-async"), self.runs.get("measure/fit-lib-async")
        if pa and la and pa["steps"] and la["steps"]:
            mpa = median_after(pa["steps"], "step_s")
            mla = median_after(la["steps"], "step_s")
            self.out("With PyTorch's cudaMallocAsync backend (one pair): median %.4f s with the "
                     "library against %.4f s without: **%+.2f%%**." % (mla, mpa,
                                                                       (mla / mpa - 1) * 100))
            self.out()

    def pinned_bandwidth(self):
        bw = self.c.get("bandwidth", {}).get("results", {})
        best = None
        for tag, kv in bw.items():
            if tag.startswith("size ") and (best is None or
                                            int(kv["size_mb"]) > int(best["size_mb"])):
                best = kv
        return best

    def bound(self):
        self.out("#### 3b. Oversubscribed step time against the lower bound")
        self.out()
        ref = self.runs.get("train/ref")
        bw = self.pinned_bandwidth()
        if not ref or not ref["steps"] or not bw:
            self.out("Not measured (needs the training runs and the bandwidth measurement).")
            self.out()
            return
        compute = median_after(ref["steps"], "step_s")
        h2d_bw = float(bw["pinned_h2d_gbps"]) * 1e9
        d2h_bw = float(bw["pinned_d2h_gbps"]) * 1e9
        rows = []
        for mode in ("default", "async", "pluggable"):
            r = self.runs.get("train/oversub-" + mode)
            if not r or not r["steps"]:
                continue
            step = median_after(r["steps"], "step_s")
            d2h = sh_per_step(r["steps"], "d2h_bytes") or 0
            h2d = sh_per_step(r["steps"], "h2d_bytes") or 0
            copy = d2h / d2h_bw + h2d / h2d_bw
            bound = max(compute, copy)
            rows.append((mode, "%.3f s" % step, "%.3f s" % compute,
                         "%.1f / %.1f GB" % (d2h / GB, h2d / GB), "%.3f s" % copy,
                         "%.3f s" % bound, "%.2fx" % (step / bound)))
        self.table(("allocator", "step (median)", "compute (reference step)",
                    "moved per step D2H / H2D", "copy time at pinned bandwidth",
                    "bound = max(compute, copy)", "step / bound"), rows)
        self.out("Pinned bandwidth from `bandwidth copy` at %s MB: %.1f GB/s host to device, "
                 "%.1f GB/s device to host. The copy time counts the two directions one after "
                 "the other; with both directions at once (%s GB/s measured together) the bound "
                 "could be lower still." % (bw["size_mb"], h2d_bw / 1e9, d2h_bw / 1e9,
                                            bw.get("pinned_duplex_gbps", "?")))
        self.out()

    def copy_bandwidth(self):
        self.out("#### 3c. Copy bandwidth against plain pinned cudaMemcpyAsync (target ≥ 85%)")
        self.out()
        bw = self.c.get("bandwidth", {}).get("results", {})
        rows = []
        for tag, kv in sorted(bw.items(), key=lambda t: int(t[1].get("size_mb", 0))):
            if not tag.startswith("size "):
                continue
            rh, rd = float(kv["ratio_h2d"]), float(kv["ratio_d2h"])
            rows.append((kv["size_mb"] + " MB", kv["pinned_h2d_gbps"], kv["pinned_d2h_gbps"],
                         "%s / %s" % (kv["vmm_restore_gbps"], kv["vmm_restore_chunked_gbps"]),
                         "%s / %s" % (kv["vmm_evict_gbps"], kv["vmm_evict_chunked_gbps"]),
                         "%.0f%% / %.0f%%" % (rh * 100, rd * 100),
                         "meets" if min(rh, rd) >= COPY_TARGET else "misses"))
        if not rows:
            self.out("Not measured.")
            self.out()
            return
        self.table(("size", "pinned H2D GB/s", "pinned D2H GB/s",
                    "VMM restore GB/s (whole / 64 MB chunks)",
                    "VMM evict GB/s (whole / 64 MB chunks)", "ratio H2D / D2H (slower form)",
                    "target"), rows)
        remap = self.c.get("remap", {}).get("results", {})
        rrows = [(kv["size_mb"] + " MB", kv["evict_remap_us"], kv["restore_remap_us"],
                  "%s / %s" % (kv.get("evict_remap_2mb_pieces_us", "–"),
                               kv.get("restore_remap_2mb_pieces_us", "–")),
                  kv["cpu_read_slab_gbps"], kv["cpu_read_plain_gbps"])
                 for _, kv in sorted(remap.items(), key=lambda t: int(t[1].get("size_mb", 0)))
                 if "evict_remap_us" in kv]
        if rrows:
            self.out("What a move costs besides its copy (`bandwidth remap`): the driver's remap "
                     "of one chunk (unmap, map, access), and the CPU reading a host slab through "
                     "its mapping, as the pointer scan of evicted bytes does, against malloc "
                     "memory.")
            self.out()
            self.table(("chunk", "evict remap µs", "restore remap µs",
                        "the same in 2 MB chunks µs (evict / restore)",
                        "CPU read of a slab GB/s", "CPU read of malloc memory GB/s"), rrows)
        o = self.c.get("oversub", {}).get("results", {}).get("main")
        if o:
            self.out("Achieved by the library end to end (oversub, bump passes, remap windows "
                     "included): %s GB/s of eviction and restore traffic." %
                     o.get("bump_moved_gbps"))
            self.out()

    def alternatives(self):
        self.out("#### 3d. The same model with save_on_cpu and accelerate's cpu_offload")
        self.out()
        ref = self.runs.get("train/ref") or self.runs.get("measure/fit-plain-1")
        rows = []
        for key, what in (("measure/fit-plain-1", "no offload, whole card"),
                          ("train/oversub-default", "libstagehand, default allocator, budget"),
                          ("train/oversub-async", "libstagehand, cudaMallocAsync, budget"),
                          ("train/oversub-pluggable", "libstagehand, pluggable, budget"),
                          ("measure/save-on-cpu", "torch.autograd.graph.save_on_cpu"),
                          ("measure/accelerate", "accelerate cpu_offload (no optimizer step)")):
            r = self.runs.get(key)
            if r is None:
                continue
            if not r["steps"]:
                skipped = [e.get("skipped") for e in r["errors"] if e.get("skipped")]
                rows.append((what, "skipped: %s" % skipped[0] if skipped
                             else "failed (exit %s)" % r["rc"], "", "", "", ""))
                continue
            s = r["summary"]
            losses = "–"
            if ref and ref["steps"] and key != "measure/fit-plain-1":
                n = 1 if key == "measure/accelerate" else min(len(r["steps"]), len(ref["steps"]))
                res = train_gpt.compare_records(ref["steps"], r["steps"], None, n)
                losses = ("bit-exact" if res["bit_exact"] else "differ") + \
                    (" (step 0)" if n == 1 else "")
            rows.append((what, fnum(median_after(r["steps"], "step_s"), "%.3f s"),
                         gb(s.get("max_allocated")), gb(s.get("device_used_peak_delta")),
                         {True: "yes", False: "no"}.get(s.get("optimizer_step"), "–"), losses))
        if not rows:
            self.out("Not measured.")
            self.out()
            return
        self.table(("setup", "median step", "peak allocated", "device use (driver)",
                    "optimizer step", "losses vs reference"), rows)
        self.out("save_on_cpu moves the saved activations to pinned host memory and keeps "
                 "weights, gradients and optimizer state on the device. accelerate's "
                 "cpu_offload streams each module's weights in for its forward pass; it is an "
                 "inference tool, so the gradients land on temporary copies and there is no "
                 "optimizer step: only forward and backward are timed, and only the first "
                 "loss can match.")
        self.out()

    def launch_cost(self):
        self.out("#### 3e. CPU cost per intercepted launch")
        self.out()
        rows = {}
        for mode in ("plain", "cupti", "hooks"):
            kv = self.c.get("launch-" + mode, {}).get("results", {}).get("main")
            if kv:
                rows[mode] = kv
        if "plain" not in rows:
            self.out("Not measured.")
            self.out()
            return
        base0 = float(rows["plain"]["ns_per_launch_noargs"])
        base4 = float(rows["plain"]["ns_per_launch_4ptrs"])
        table = []
        for mode, kv in rows.items():
            n0, n4 = float(kv["ns_per_launch_noargs"]), float(kv["ns_per_launch_4ptrs"])
            table.append(("no library" if mode == "plain" else "library, " + mode,
                          "%.0f ns" % n0, "%.0f ns" % n4,
                          "–" if mode == "plain" else "%+.0f ns" % (n0 - base0),
                          "–" if mode == "plain" else "%+.0f ns" % (n4 - base4)))
        self.table(("", "empty kernel", "4 region pointers", "added (empty)",
                    "added (4 pointers)"), table)
        n = rows["plain"].get("launches", "?")
        self.out("%s launches of each kernel, issued in batches of 256 and timed around the "
                 "issuing loop only; 64 live 2 MB allocations." % n)
        self.out()

    def trace(self):
        self.out("### 4. Trace of the oversubscribed run")
        self.out()
        tdir = os.path.join(self.res, "trace")
        path = os.path.join(tdir, "stagehand.trace")
        if not os.path.exists(path):
            self.out("No trace was recorded%s." % (
                "" if os.path.isdir(tdir) else " (the measure part did not run)"))
            self.out()
            return
        size = os.path.getsize(path)
        counts, lines, header = {}, 0, []
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                lines += 1
                if line.startswith("#") or not line.strip():
                    if len(header) < 3:
                        header.append(line.strip())
                    continue
                word = line.split()[0]
                counts[word] = counts.get(word, 0) + 1
        with open(path, "rb") as f:
            gz = len(gzip.compress(f.read()))
        self.out("`%s`: %d bytes, %d lines, %d bytes gzipped; %s. By first field: %s." % (
            os.path.relpath(path, self.res), size, lines, gz,
            "small enough to keep as a fixture" if gz <= 512 * 1024
            else "too large for a fixture: summarised here",
            ", ".join("%s %d" % kv for kv in sorted(counts.items(), key=lambda t: -t[1])[:8])))
        if header:
            self.out()
            self.out("Header: `%s`" % " / ".join(header))
        tel = os.path.join(tdir, "telemetry.jsonl")
        if os.path.exists(tel):
            with open(tel, encoding="utf-8", errors="replace") as f:
                recs = [ln for ln in f if ln.strip()]
            self.out()
            self.out("Telemetry: %d per-step records in `%s`." % (
                len(recs), os.path.relpath(tel, self.res)))
        self.out()

    def build(self):
        gpu = (self.meta.get("gpu") or self.meta.get("probe", "?")).split(",")[0]
        self.out("## Results: %s, %s" % (gpu, self.meta.get("date", "?")))
        self.out()
        self.machine()
        self.scenarios()
        self.training()
        if not self.quick:
            self.measurements()
            self.trace()
        self.out("### Checks")
        self.out()
        if self.failures:
            for f in self.failures:
                self.out("- FAILED: %s" % f)
        else:
            self.out("Every check passed.")
        skipped = read_text(os.path.join(self.res, "skipped.txt"))
        if skipped:
            self.out()
            self.out("Not run, cut by the deadline (`run.sh --short`): %s." %
                     ", ".join(skipped.split()))
        self.out()
        return "\n".join(self.lines)


def suggest_tolerance(a, b, floor):
    ra, _ = train_gpt.load_records(a)
    rb, _ = train_gpt.load_records(b)
    res = train_gpt.compare_records(ra, rb)
    print("%.3g" % max(floor, 4 * (res["max_rel_diff"] or 0)))
    return 0


def self_test():
    """Builds a report from made-up logs: the parsing and the checks."""
    with tempfile.TemporaryDirectory() as d:
        for sub in ("c", "train", "measure", "trace"):
            os.makedirs(os.path.join(d, sub))

        def write(name, text):
            with open(os.path.join(d, name), "w", encoding="utf-8") as f:
                f.write(text)

        write("meta.txt", "date=2026-01-01T00:00:00Z\ngpu=Test GPU, 81559 MiB\ndriver=580\n")
        write("mode.txt", "quick=0")
        write("c/oversub.log", "RESULT oversub mode=preloaded digest=ab bump_moved_gbps=20.0\n"
                               "RESULT oversub after active=1 evictions=3\nPASS oversub: ok\n")
        write("c/oversub.rc", "0")
        write("c/oversub-plain.log", "RESULT oversub mode=plain digest=ab\nPASS oversub: ok\n")
        write("c/bandwidth.log",
              "RESULT bandwidth size_mb=1024 pinned_h2d_gbps=50.00 pinned_d2h_gbps=50.00 "
              "pinned_duplex_gbps=90.00 vmm_restore_gbps=48.00 vmm_evict_gbps=47.00 "
              "vmm_restore_chunked_gbps=46.00 vmm_evict_chunked_gbps=45.00 ratio_h2d=0.920 "
              "ratio_d2h=0.900 host_kind=HOST_NUMA\nPASS bandwidth: ok\n")
        write("c/remap.log", "RESULT remap size_mb=64 evict_remap_us=812.5 "
                             "restore_remap_us=640.0 evict_remap_2mb_pieces_us=9000.0 "
                             "restore_remap_2mb_pieces_us=8000.0 cpu_read_slab_gbps=3.10 "
                             "cpu_read_plain_gbps=11.50 sink=0\nPASS remap: measured\n")
        write("c/launch-plain.log", "RESULT launch mode=plain launches=10 "
                                    "ns_per_launch_noargs=2000 ns_per_launch_4ptrs=2100\nPASS x\n")
        write("c/launch-cupti.log", "RESULT launch mode=cupti launches=10 "
                                    "ns_per_launch_noargs=2600 ns_per_launch_4ptrs=2900\nPASS x\n")

        def run(name, losses, step_s, sh=None, **summary):
            recs = []
            for i, x in enumerate(losses):
                rec = {"step": i, "loss": repr(x), "loss_hex": train_gpt.float_hex(x),
                       "step_s": step_s}
                if sh is not None:
                    rec["sh"] = {"d2h_bytes": 4 * GB, "h2d_bytes": 4 * GB,
                                 "window_us": 600000, "drain_us": 100000,
                                 "copy_wait_us": 400000, "remap_us": 50000, "stalls": 12,
                                 "stall_us": 550000, "launches": 1000, "opaque_work": 400,
                                 "scan_us": 300000, "scan_wait_us": 200000,
                                 "scanned_bytes": 3 * GB, "fingerprint_us": 20000,
                                 "prefilter_us": 7000,
                                 "prefetches": 3, "early_evictions": 0}
                recs.append(json.dumps(rec))
            s = {"steps": len(losses), "params": 1.3e9, "max_allocated": 30 * GB,
                 "median_step_s": step_s, "budget_env": "12288", "optimizer_step": True}
            s.update(summary)
            if sh is not None:
                s["sh"] = sh
            recs.append(json.dumps({"summary": s}))
            write(name + ".jsonl", "\n".join(recs) + "\n")
            write(name + ".rc", "0")

        good = {"budget_bytes": 12 * GB, "evictions": 10, "restores": 9, "tracking_mode": 1}
        run("train/ref", [10.5, 10.25, 10.0], 0.3)
        run("train/oversub-default", [10.5, 10.25, 10.0], 0.9, good, preloaded=True,
            sh_device_bytes_peak=11 * GB, device_used_peak_delta=12 * GB)
        run("train/oversub-async", [10.5, 10.25, 10.125], 0.9, good, preloaded=True,
            sh_device_bytes_peak=13 * GB, device_used_peak_delta=12 * GB)
        run("train/profiler-window", [10.5, 10.25, 10.0], 0.9, good, preloaded=True,
            profiler_window={"window": [1, 2], "tracking_before": "cupti",
                             "tracking_during": "hooks", "cupti_handovers": 1,
                             "device_events": 77, "problems": []})
        # cuDNN's pair: within the floor tolerance of each other, far from ref.
        run("train/ref-cudnn", [11.5, 11.25, 11.0], 0.3)
        run("train/oversub-cudnn", [11.5, 11.25, 11.0001], 0.9, good, preloaded=True)
        run("measure/fit-plain-1", [10.5, 10.25, 10.0, 9.75], 0.300)
        run("measure/fit-lib-1", [10.5, 10.25, 10.0, 9.75], 0.302, {"budget_bytes": 80 * GB})
        run("measure/fit-plain-2", [10.5, 10.25, 10.0, 9.75], 0.300)
        run("measure/fit-lib-2", [10.5, 10.25, 10.0, 9.75], 0.302, {"budget_bytes": 80 * GB})
        run("measure/fit-plain-async", [10.5, 10.25, 10.0, 9.75], 0.300)
        run("measure/fit-lib-async", [10.5, 10.25, 10.0, 9.75], 0.306, {"budget_bytes": 80 * GB})
        write("measure/accelerate.jsonl", '{"skipped": "accelerate not installed"}\n')
        write("trace/stagehand.trace", "# stagehand trace 1\nA 1 2\nL 3 4\nL 5 6\n")
        write("skipped.txt", "train/profiler-window\nmeasure/save-on-cpu\n")
        rep = Report(d)
        text = rep.build()
        expect = ["bit-exact (3 steps)", "**DIFFER** from step 2", "+0.67%", "meets",
                  "3.00x", "skipped: accelerate not installed", "+600 ns", "L 2, A 1",
                  "equal", "above its 12.0 GB budget", "nothing moved, 0 MB of host memory pinned", "against 0.3000 s without: **+2.00%**", "| 64 MB | 812.5 | 640.0 | 9000.0 / 8000.0 | 3.10 | 11.50 |", "**cupti** before and **hooks** during",
                  "77 device events", "reference for oversub-cudnn", "within 0.005",
                  "cut by the deadline (`run.sh --short`): train/profiler-window, measure/save-on-cpu",
                  "| default | 0.900 s | 600 ms | 100 ms | 400 ms | 50 ms | 12 (550 ms) | 3.0 GB, 300 ms (200 ms waited) | 20 ms, 7 ms | 40% | 3 | 0 |"]
        missing = [e for e in expect if e not in text]
        want_failures = 2  # the async run's losses and its device peak
        if missing or len(rep.failures) != want_failures:
            print(text)
            print("self-test: FAIL: missing %s; failures %s" % (missing, rep.failures))
            return 1
        assert train_gpt.compare_records([], [])["ok"] is False
    print("self-test: ok")
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default="build/gpu/results")
    p.add_argument("--out", default=None)
    p.add_argument("--tolerance", nargs=3, metavar=("REF", "REF2", "FLOOR"))
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args(argv)
    if args.self_test:
        return self_test()
    if args.tolerance:
        return suggest_tolerance(args.tolerance[0], args.tolerance[1],
                                 float(args.tolerance[2]))
    rep = Report(args.results)
    text = rep.build()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)
    for f in rep.failures:
        print("report: FAILED: %s" % f)
    return 1 if rep.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
