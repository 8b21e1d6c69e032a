"""The recorder (stagehand.trace): small models recorded on the meta device,
checked record by record, and replayed through build/stagehand-sim; the
command line. Needs PyTorch: mk/prereqs.sh installs Debian's python3-torch,
and tests/python/run.sh picks a Python that has it."""

import gzip
import os
import subprocess
import sys

import pytest

from conftest import BUILD, REPO, child_env

try:
    import torch
except ImportError as e:
    raise ImportError("the recorder's tests need PyTorch (mk/prereqs.sh build installs "
                      "python3-torch): %s" % e) from None

import stagehand.trace as st  # noqa: E402 - after torch, which it needs
from stagehand.trace import alloc, gpus, models  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

MIB = 1 << 20
SIM = os.path.join(BUILD, "stagehand-sim")


def read_trace(path):
    """The records of a trace, checked as the C reader checks them."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.read().splitlines()
    assert lines[0] == "stagehand-trace 1"
    live, recs, t, launches = {}, [], 0, []
    for line in lines[1:]:
        f = line.split()
        if f[:2] == ["i", "ro"]:  # regions launch f[2] only reads: among its own
            n = int(f[3])
            assert len(f) == 4 + n and int(f[2]) < len(launches), line
            assert set(f[4:]) <= set(launches[int(f[2])][6:]), line
            recs.append(f)
            continue
        if f[0] in ("i", "k", "#"):
            continue
        now = int(f[1])
        assert now >= t, line
        t = now
        if f[0] == "a":
            rid = int(f[2], 0)
            assert rid not in live, line
            live[rid] = int(f[3])
        elif f[0] == "f":
            assert int(f[2], 0) in live, line
            del live[int(f[2], 0)]
        elif f[0] == "l":
            n = int(f[5])
            assert len(f) == 6 + n and all(int(r, 0) in live for r in f[6:]), line
            launches.append(f)
        recs.append(f)
    return recs


class OpCounter(TorchDispatchMode):
    """Counts, by its own rule, the ops that run a kernel on the meta device:
    those that write their results to memory no argument had, or change an
    argument in place (a view shares its argument's storage and writes nothing)."""

    ALLOC = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}

    def __init__(self):
        super().__init__()
        self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = st.ops.tensors((args, kwargs))
        outs = st.ops.tensors(out)
        if not any(t.device.type == "meta" for t in ins + outs) or \
                func.overloadpacket.__name__ in self.ALLOC:
            return out
        keys = {st.recorder._storage(t)._cdata for t in ins}
        if func._schema.is_mutable or not outs or \
                any(st.recorder._storage(t)._cdata not in keys for t in outs):
            self.kernels += 1
        return out


class TinyCNN(torch.nn.Module):
    def __init__(self, device):
        super().__init__()
        kw = dict(device=device)
        self.c1 = torch.nn.Conv2d(3, 64, 3, padding=1, **kw)
        self.b1 = torch.nn.BatchNorm2d(64, **kw)
        self.c2 = torch.nn.Conv2d(64, 128, 3, stride=2, padding=1, **kw)
        self.fc = torch.nn.Linear(128, 10, **kw)

    def forward(self, x):
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.c2(x))
        return self.fc(x.mean((2, 3)))


TINY_GPT = "gpt:layers=2,d=256,heads=4,seq=128,batch=8,vocab=2048,dtype=fp32"


def record_counting(path, make_model, make_batch, loss, steps=3, **kw):
    """The recorder's loop, with an OpCounter around the timed part only."""
    counter = OpCounter()
    with st.Recorder(path, **kw) as rec:
        with rec.untimed():
            model = make_model("meta")
            opt = torch.optim.AdamW(model.parameters(), foreach=True)
        for _ in range(steps):
            rec.step()
            with rec.untimed():
                b = make_batch("meta")
            with counter:
                rec.phase("forward")
                out = loss(model, b)
                rec.phase("backward")
                out.backward()
                rec.phase("optimizer")
                opt.step()
                opt.zero_grad(set_to_none=True)
            del out, b
    stats = dict(rec.stats, op_counts=dict(rec.op_counts))
    return stats, counter.kernels


def gpt_parts():
    spec = models.parse(TINY_GPT)
    return spec.model, spec.batch, lambda m, b: m(*b)


def cnn_parts():
    return (TinyCNN, lambda d: (torch.empty(8, 3, 64, 64, device=d),
                                torch.randint(0, 10, (8,), device=d)),
            lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]))


def replay(path, oversub="1.25"):
    """stagehand-sim's four policies on the trace; a small model's largest
    launch needs most of its footprint, hence the light oversubscription."""
    r = subprocess.run([SIM, "--trace", path, "--oversub", oversub, "--header"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[1:]] == ["policy=%s" % p for p in
                                                    ("reactive", "lru", "learned", "belady")]
    return lines


@pytest.mark.parametrize("parts", [gpt_parts, cnn_parts], ids=["gpt", "cnn"])
def test_async_mode_records_every_tensor_and_replays(tmp_path, parts):
    path = str(tmp_path / "m.trace.gz")
    stats, kernels = record_counting(path, *parts(), mode="async")
    recs = read_trace(path)
    launches = [r for r in recs if r[0] == "l"]
    # one launch per kernel the counter saw (a tiny model: one per multi-tensor op too)
    assert len(launches) == stats["launches"] == kernels > 50
    assert stats["resurrected"] == 0
    allocs = [r for r in recs if r[0] == "a"]
    assert allocs and all(int(r[3]) > alloc.SUBALLOC_MAX for r in allocs)
    # steps 1 and 2 are the steady state: what a step allocates, it frees
    steps = [i for i, r in enumerate(recs) if r[0] == "s"]
    for a, b in zip(steps[1:], steps[2:] + [len(recs)]):
        body = recs[a:b]
        made = {r[2] for r in body if r[0] == "a"}
        freed = {r[2] for r in body if r[0] == "f"}
        assert made and made == freed
        assert {r[3] for r in body if r[0] == "f"} == {"t"}
    assert [r[2] for r in recs if r[0] == "p"][:4] == ["begin", "forward", "backward",
                                                        "optimizer"]
    replay(path)


def test_preload_mode_sees_segments_only(tmp_path):
    path = str(tmp_path / "m.trace")
    stats, kernels = record_counting(path, *gpt_parts(), mode="preload")
    recs = read_trace(path)
    sizes = [int(r[3]) for r in recs if r[0] == "a"]
    assert sizes and not [r for r in recs if r[0] == "f"]      # segments stay
    for s in sizes:   # 2 MiB, 20 MiB, or a request of 10 MiB or more rounded to 2 MiB
        assert s in (2 * MIB, 20 * MIB) or (s >= 10 * MIB and s % (2 * MIB) == 0), s
    assert len([r for r in recs if r[0] == "l"]) == kernels
    # the segments are reused: once the optimizer's state exists (step 1), the
    # steady state makes none
    steady = [i for i, r in enumerate(recs) if r[0] == "s"][2]
    assert not [r for r in recs[steady:] if r[0] == "a"]
    replay(path)


def test_launches_name_the_regions_of_their_tensors(tmp_path):
    path = str(tmp_path / "m.trace")
    with st.Recorder(path, mode="async", gpu="fp32=10,bw=100,launch_us=0") as rec:
        a = torch.empty(1024, 1024, device="meta")        # 4 MiB: a region
        b = torch.empty(1024, 1024, device="meta")
        small = torch.empty(1024, device="meta")         # sub-allocated: no region
        c = a @ b                                         # a kernel: regions a, b, c
        c.add_(small)                                     # in place
        d = c.t()                                         # a view: no launch
        del a
    recs = read_trace(path)
    ids = [r[2] for r in recs if r[0] == "a"]
    assert len(ids) == 3
    launches = [r for r in recs if r[0] == "l"]
    assert len(launches) == 2 and d.shape == (1024, 1024)
    assert launches[0][6:] == ids and launches[1][6:] == [ids[2]]
    # 2 x 1024^3 FLOPs at 10 TFLOP/s x 0.7 against 12 MiB at 100 GB/s x 0.85
    assert int(launches[0][2]) == round(1e6 * max(2 * 1024 ** 3 / 7e12, 12 * MIB / 85e9))
    end = int(launches[1][1]) + int(launches[1][2])  # `del a`, after both launches
    assert [r[:3] for r in recs if r[0] == "f"] == [["f", str(end), ids[0]]]


def written_regions(recs):
    """Per launch (in order), the regions it writes: those its `i ro`
    record does not name."""
    launches, ro = [], {}
    for r in recs:
        if r[0] == "l":
            launches.append(r[6:])
        elif r[:2] == ["i", "ro"]:
            ro[int(r[2])] = set(r[4:])
    return [set(ids) - ro.get(k, set()) for k, ids in enumerate(launches)]


def test_launches_say_what_they_only_read(tmp_path):
    path = str(tmp_path / "m.trace")
    with st.Recorder(path, mode="async", gpu="fp32=10,bw=100,launch_us=0"):
        a = torch.empty(1024, 1024, device="meta")
        b = torch.empty(1024, 1024, device="meta")
        c = a @ b                          # reads a and b, writes c
        c.add_(a)                          # in place: writes c, reads a
        torch.mul(a, 2, out=b)             # out=: writes b, reads a
        del c
    recs = read_trace(path)
    ids = [r[2] for r in recs if r[0] == "a"]
    assert written_regions(recs) == [{ids[2]}, {ids[2]}, {ids[1]}]
    assert [r for r in recs if r[:2] == ["i", "ro"]] == [
        ["i", "ro", "0", "2", ids[0], ids[1]], ["i", "ro", "1", "1", ids[0]],
        ["i", "ro", "2", "1", ids[0]]]


def test_lora_never_writes_the_frozen_weights(tmp_path):
    """Every base weight is read by the timed steps, written by none; in a
    full fine-tune the optimizer writes them. So stagehand-sim's clean
    regions copy LoRA's weights out only once."""
    written, weights = {}, {}
    for extra in ("", ",lora=8"):
        spec = models.parse(TINY_GPT + extra)
        path = str(tmp_path / "g.trace")
        st.record(spec.model, spec.batch, path, steps=3, forward=spec.forward,
                  loss=spec.loss, optimizer=spec.optimizer)
        recs = read_trace(path)
        first = next(i for i, r in enumerate(recs) if r[0] == "l")
        # regions allocated before the first launch and live at the end: the model
        live = {r[2] for r in recs[:first] if r[0] == "a"} - {r[2] for r in recs if r[0] == "f"}
        touched = set().union(*(set(r[6:]) for r in recs if r[0] == "l"))
        weights[extra] = live & touched
        written[extra] = set().union(*written_regions(recs)) & weights[extra]
    assert weights[",lora=8"] and weights[""]
    assert written[""] == weights[""]  # AdamW writes every parameter
    # with LoRA only the adapters (a few small regions, if any) are written
    assert len(written[",lora=8"]) < len(weights[",lora=8"]) / 2


def test_checkpointing_and_lora_free_what_they_should(tmp_path):
    figures = {}
    for extra in ("", ",ckpt=1", ",lora=8"):
        spec = models.parse(TINY_GPT + extra)
        path = str(tmp_path / "g.trace")
        stats = st.record(spec.model, spec.batch, path, steps=3, forward=spec.forward,
                          loss=spec.loss, optimizer=spec.optimizer)
        assert stats["resurrected"] == 0
        figures[extra] = stats["peak_region_bytes"]
        replay(path)
    # checkpointing keeps less, LoRA no gradients or optimizer state for the weights
    assert figures[",ckpt=1"] < figures[""] and figures[",lora=8"] < figures[""]


def test_record_refuses_bad_input(tmp_path):
    path = str(tmp_path / "x.trace")
    with pytest.raises(ValueError, match="steps=0: at least 1"):
        st.record(TinyCNN, lambda d: torch.empty(1, device=d), path, steps=0)
    with pytest.raises(st.TraceError, match="must be on the meta device"):
        st.record(lambda d: TinyCNN("cpu"), lambda d: torch.empty(1, device=d), path)
    assert not os.path.exists(path)  # an unfinished trace is removed
    with pytest.raises(TypeError, match="not an nn.Module"):
        st.record(lambda d: 3, lambda d: torch.empty(1, device=d), path)
    with pytest.raises(gpus.GPUError):
        st.Recorder(path, gpu="rtx9090")
    with pytest.raises(ValueError, match="unknown allocator mode"):
        st.Recorder(path, mode="cuda")


# ---- the command line ----

def cli(args, cwd):
    return subprocess.run([sys.executable, "-m", "stagehand", "trace"] + args, cwd=cwd,
                          env=child_env(preload=False), capture_output=True, text=True,
                          timeout=300, check=False)


def test_cli_records_a_model_file(tmp_path):
    (tmp_path / "net.py").write_text(
        "import torch\n"
        "def model(device):\n"
        "    return torch.nn.Sequential(torch.nn.Linear(1024, 1024, device=device),\n"
        "                               torch.nn.ReLU(), torch.nn.Linear(1024, 8, device=device))\n"
        "def batch(device):\n"
        "    return torch.empty(512, 1024, device=device)\n")
    r = cli(["net.py", "--gpu", "l4", "--mode", "pluggable", "--steps", "3"], str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "net.trace.gz: 3 steps of net.py" in r.stdout
    assert "replay: stagehand-sim --trace net.trace.gz --vram-gb 24 --pcie-gbps 25" in r.stdout
    recs = read_trace(str(tmp_path / "net.trace.gz"))
    assert len([r for r in recs if r[0] == "s"]) == 3
    with gzip.open(tmp_path / "net.trace.gz", "rt") as f:
        head = f.read(300)
    assert "i gpu name=l4," in head and "i allocator pluggable ids=unique" in head
    replay(str(tmp_path / "net.trace.gz"))


@pytest.mark.parametrize("args,status,message", [
    ([], 2, "no model: give NAME[:KEY=VALUE,...] or a Python file"),
    (["bert"], 2, "unknown model 'bert': one of gpt, resnet, unet, vit"),
    (["gpt:layers=two"], 2, "gpt: layers=two: expected a whole number"),
    (["gpt:depth=3"], 2, "gpt: 'depth=3': expected KEY=VALUE with KEY one of vocab"),
    (["gpt:d=100,heads=3"], 2, "gpt: d=100 is not a multiple of heads=3"),
    (["resnet:depth=34"], 2, "resnet: depth=34: one of 50, 101, 152"),
    (["gpt", "--gpu", "rtx9090"], 2, "--gpu: unknown GPU 'rtx9090'"),
    (["gpt", "--steps", "0"], 2, "--steps 0: at least 1"),
    (["gpt", "--mode", "preload", "--ids", "reuse"], 2, "--ids reuse: preload mode's regions"),
    (["gpt", "--mode", "cuda"], 2, "invalid choice: 'cuda'"),
    (["missing.py"], 2, "missing.py: no such file"),
    (["gpt", "-o", "/nonexistent/x.trace"], 2, "no such directory /nonexistent"),
])
def test_cli_bad_input(tmp_path, args, status, message):
    r = cli(args, str(tmp_path))
    assert r.returncode == status, r.stdout + r.stderr
    assert message in r.stderr
    assert not list(tmp_path.iterdir())


def test_reused_ids_replay(tmp_path):
    """With --ids reuse a freed region's id goes to the next allocation of its
    size, and stagehand-sim replays the trace. This model at 1.5x once
    stopped every policy but belady with "policy refused allocation": an id
    came back while the freed region's eviction was still on the link, and
    the replay kept that region known to the policy until the copy landed."""
    path = str(tmp_path / "r.trace.gz")
    r = cli(["gpt:layers=4,d=512,heads=8,seq=256,batch=8,vocab=8192", "--ids", "reuse",
             "--steps", "3", "-o", path], str(tmp_path))
    assert r.returncode == 0, r.stderr
    made = [rec[2] for rec in read_trace(path) if rec[0] == "a"]
    assert len(set(made)) < len(made) / 2  # most allocations reuse an id
    replay(path, "1.5")


def test_reused_ids_same_schedule(tmp_path):
    """A region's role does not hang on its id: the same model recorded with
    ids never reused and with ids reused as the library's pool reuses
    addresses replays alike under every policy that follows recordings (lru
    and learned ran as reactive with ids reused: a recording took two
    tensors that had one id in turn for one region)."""
    runs = {}
    for ids in ("unique", "reuse"):
        path = str(tmp_path / ("%s.trace.gz" % ids))
        r = cli(["gpt:layers=4,d=512,heads=8,seq=256,batch=8,vocab=8192", "--ids", ids,
                 "--steps", "4", "-o", path], str(tmp_path))
        assert r.returncode == 0, r.stderr
        runs[ids] = {ln.split()[0]: ln.split()[1] for ln in replay(path, "1.5")[1:]}
    for policy in ("lru", "learned", "belady"):
        key = "policy=" + policy
        assert runs["reuse"][key] == runs["unique"][key], (policy, runs)
    steps = {k: float(v.split("=")[1]) for k, v in runs["reuse"].items()}
    assert steps["policy=learned"] < steps["policy=reactive"]


def test_cli_model_file_without_its_functions(tmp_path):
    (tmp_path / "empty.py").write_text("x = 1\n")
    r = cli(["empty.py"], str(tmp_path))
    assert r.returncode == 2 and "empty.py defines no model and no batch" in r.stderr


def test_cli_lists_cards_and_models(tmp_path):
    r = cli(["--list"], str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "rtx4090" in r.stdout and "h100" in r.stdout and "gpt: GPT-2-style" in r.stdout


def test_fixtures_replay():
    """The committed real-model traces parse and replay (bench-policy's input)."""
    traces = os.path.join(REPO, "tools", "stagehand-sim", "traces")
    names = sorted(f for f in os.listdir(traces) if f.endswith(".trace.gz"))
    models = ["gpt-ckpt", "gpt-full", "gpt-lora", "resnet50", "unet", "vit-l16"]
    assert names == sorted(f"{m}{v}.trace.gz" for m in models for v in ("", "-reuse"))
    for n in names:
        assert os.path.getsize(os.path.join(traces, n)) < 512 * 1024
        replay(os.path.join(traces, n), "2")
