"""The recorder: runs PyTorch on the meta device and writes what libstagehand
would see of it.

Tensors on the meta device have shapes and dtypes but no data, so a model
of any size runs a training step in seconds on any machine. A
TorchDispatchMode sees every op. From them the recorder follows each
*storage* (the memory a tensor and its views share): it is allocated when
an op first returns it, and freed when the last tensor using it dies. The
allocator model (alloc.py) turns storages into the regions the library
would see; each kernel becomes a launch naming the regions of its tensors,
with the duration the GPU's roofline gives it (gpus.py, ops.py).

Knowing when a storage dies takes some care, because PyTorch makes tensors
that share a storage without going through the dispatcher:

- autograd saves the outputs of an op for backward as new tensors: saved
  tensor hooks hand autograd a view the recorder made instead;
- nn.Parameter(data) and `tensor.data` make aliases with the dispatcher
  turned off: both are wrapped while recording;
- `p.data = x` and set_() change a tensor's storage: every op checks that
  the storages of its arguments are still the ones recorded.

A tensor that still turns up after its storage was counted as freed (an
alias made some other way) is allocated again where it reappears, and
counted in `resurrected`: the trace stays consistent, and the count says
whether its frees can be trusted (it is 0 for every model in the tests).
"""

import contextlib
import gc
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import alloc, gpus, ops
from .writer import TraceWriter

_ATTR = "_stagehand_storage"  # on each tracked tensor: (storage key, finalizer)


class TraceError(RuntimeError):
    """The program cannot be recorded as it is; the message says why."""


def _storage(t):
    """The tensor's storage object (UntypedStorage; PyTorch 1.13 wraps it)."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()
    s = t.storage()
    return getattr(s, "_storage", s)


class _Storage:
    __slots__ = ("key", "nbytes", "block", "aliases")

    def __init__(self, key, nbytes, block):
        self.key, self.nbytes, self.block, self.aliases = key, nbytes, block, 0


class _Saved:
    """What autograd keeps of a saved tensor while recording: an alias the
    recorder knows, so that the storage lives exactly as long as the graph."""

    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


class _Mode(TorchDispatchMode):
    def __init__(self, rec):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.rec._op(func, args, kwargs or {})


class Recorder:
    """Records what runs on the meta device while it is entered.

        with Recorder("gpt.trace.gz", gpu="rtx4090", mode="async") as rec:
            with rec.untimed():                 # set-up: memory, but no launches
                model = GPT(...).to("meta")     # or built on device="meta"
                opt = torch.optim.AdamW(model.parameters(), foreach=True)
            for _ in range(4):
                rec.step()
                with rec.untimed():
                    x = torch.randint(0, 50304, (8, 1024), device="meta")  # copied in
                rec.phase("forward")
                loss = model(x)
                rec.phase("backward")
                loss.backward()
                rec.phase("optimizer")
                opt.step()
                opt.zero_grad(set_to_none=True)
        print(rec.stats)

    mode: the allocator PyTorch uses under the library (alloc.MODES); ids:
    "unique" or "reuse" (alloc.py). marks=True writes the steps and phases
    as the program's own marks (`api`, as stagehand.step() and
    stagehand.phase() make them); marks=False writes steps as `auto` (only
    to tell stagehand-sim where the steps are) and no phases, as a program
    that marks nothing would be recorded. tf32_matmul: FP32 matmuls run on
    TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32).
    """

    def __init__(self, out, gpu="rtx4090", mode="async", ids="unique", marks=True,
                 tf32_matmul=False, source=None):
        self.out = str(out)
        self.gpu = gpus.gpu(gpu)
        self.mode, self.ids, self.marks, self.tf32_matmul = mode, ids, marks, tf32_matmul
        self.allocator = alloc.make(mode, self, ids)  # checks mode and ids
        self.source = source or "stagehand.trace (PyTorch %s, meta device)" % torch.__version__
        self.clock = 0          # microseconds
        self.step_no = -1       # the step under way; -1 before the first
        self.stats = dict(ops=0, kernels=0, launches=0, views=0, storages=0, frees=0,
                          resurrected=0, regions=0, region_frees=0, untimed_ops=0,
                          peak_region_bytes=0, steps=0)
        self.op_counts = {}     # op name -> kernels seen (launches may be more)
        self._live = {}         # storage key -> _Storage
        self._region_step = {}  # region id -> (bytes, step allocated)
        self._region_bytes = 0
        self._kernels = {}      # op name -> kernel id
        self._untimed = 0
        self._step_starts = []  # the clock at each step mark
        self._writer = None
        self._stack = None
        self.closed = False

    # ---- the context ----

    def __enter__(self):
        self._writer = TraceWriter(self.out, self.source)
        w = self._writer
        w.info("gpu", self.gpu.describe())
        w.info("allocator", "%s ids=%s" % (self.mode, self.ids))
        st = contextlib.ExitStack()
        try:
            st.enter_context(_collector_paused())
            st.enter_context(self._patched())
            st.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack))
            st.enter_context(_Mode(self))
        except BaseException:
            st.close()
            w.abandon()
            raise
        self._stack = st
        return self

    def __exit__(self, et, ev, tb):
        try:
            self._stack.close()
        finally:
            self.closed = True  # storages dying from now on are not the program's
            ends = self._step_starts[1:] + [self.clock]
            self.stats["step_us"] = [b - a for a, b in zip(self._step_starts, ends)]
            if et is None:
                self._writer.close()
            else:
                self._writer.abandon()
        return False

    @contextlib.contextmanager
    def untimed(self):
        """Memory is recorded, launches are not: model set-up, and data the
        program copies to the GPU (a copy is not a kernel)."""
        self._untimed += 1
        try:
            yield
        finally:
            self._untimed -= 1

    def step(self):
        """A training step begins. Tensors kept alive only by reference
        cycles die here (the cyclic collector is paused while recording, so
        that such frees fall at the same place in every recording)."""
        gc.collect()
        self._step_starts.append(self.clock)
        self.step_no += 1
        self.stats["steps"] += 1
        self._writer.step(self.clock, self.step_no, self.marks)
        if self.marks:
            self._writer.phase(self.clock, "begin")

    def phase(self, name):
        """The step enters a phase: forward, backward, optimizer, end."""
        if self.marks:
            self._writer.phase(self.clock, name)

    # ---- the allocator model's sink ----

    def region_alloc(self, rid, nbytes):
        self._writer.alloc(self.clock, rid, nbytes)
        self._region_step[rid] = (nbytes, self.step_no)
        self._region_bytes += nbytes
        self.stats["regions"] += 1
        self.stats["peak_region_bytes"] = max(self.stats["peak_region_bytes"],
                                              self._region_bytes)

    def region_free(self, rid):
        nbytes, born = self._region_step.pop(rid)
        self._region_bytes -= nbytes
        self.stats["region_frees"] += 1
        self._writer.free(self.clock, rid, "t" if born == self.step_no else "p")

    # ---- storages ----

    def _track(self, t):
        """Counts t as a user of its storage, allocating the storage when new.
        Called for every tensor an op takes or returns."""
        if t.device.type != "meta":
            return
        s = _storage(t)
        key, nbytes = s._cdata, s.nbytes()
        old = getattr(t, _ATTR, None)
        if old is not None:
            entry = self._live.get(old[0])
            if old[0] == key and entry is not None:
                if entry.nbytes < nbytes:  # resize_ grew it: new memory, then the old freed
                    block = self._alloc(nbytes)
                    if entry.block is not None:
                        self.allocator.free(entry.block)
                    entry.block, entry.nbytes = block, nbytes
                return
            old[1].detach()
            if entry is not None:    # p.data = x, set_(): t moved to another storage
                self._drop(old[0])
            elif old[0] == key:      # in use after its last known user died
                self.stats["resurrected"] += 1
        entry = self._live.get(key)
        if entry is None:
            entry = self._live[key] = _Storage(key, nbytes, self._alloc(nbytes))
            self.stats["storages"] += 1
        entry.aliases += 1
        setattr(t, _ATTR, (key, weakref.finalize(t, self._drop, key)))

    def _alloc(self, nbytes):
        return self.allocator.alloc(nbytes) if nbytes else None

    def _drop(self, key):
        if self.closed:
            return
        entry = self._live.get(key)
        if entry is None:
            return
        entry.aliases -= 1
        if entry.aliases == 0:
            self._release(entry)

    def _release(self, entry):
        del self._live[entry.key]
        self.stats["frees"] += 1
        if entry.block is not None:
            self.allocator.free(entry.block)

    def _pack(self, t):
        # Under the mode, detach() is an op: its result is tracked as an alias.
        return _Saved(t.detach()) if t.device.type == "meta" else _Saved(t)

    @contextlib.contextmanager
    def _patched(self):
        """nn.Parameter(data) and the .data property alias a storage with the
        dispatcher off; while recording they tell the recorder."""
        rec = self
        param_new = torch.nn.Parameter.__new__
        owner = next(k for k in type.mro(torch.Tensor) if "data" in vars(k))
        data = vars(owner)["data"]

        def new(cls, *args, **kwargs):
            p = param_new(cls, *args, **kwargs)
            rec._track(p)
            return p

        def get(t):
            d = data.__get__(t, type(t))
            rec._track(d)
            return d

        def set_(t, value):
            data.__set__(t, value)
            rec._track(t)

        had = "data" in vars(torch.Tensor)
        torch.nn.Parameter.__new__ = new
        torch.Tensor.data = property(get, set_)
        try:
            yield
        finally:
            torch.nn.Parameter.__new__ = param_new
            if had:
                torch.Tensor.data = data
            else:
                del torch.Tensor.data

    # ---- ops ----

    def _op(self, func, args, kwargs):
        self.stats["ops"] += 1
        args = _numbers_as_tensors(func, args)
        kind = ops.kind(func)
        ins = ops.tensors((args, kwargs))
        for t in ins:
            self._track(t)
        try:
            out = ops.run_meta(func, args, kwargs)
        except ops.MetaUnsupported as e:
            raise TraceError(str(e)) from None
        if isinstance(out, (int, float, complex)) and ins and \
                str(func._schema.returns[0].type) == "Tensor":
            # A Python scalar passed as a tensor (autograd saves `x * 0.5`'s 0.5)
            # comes back from an op as a number; autograd wants a tensor.
            out = torch.tensor(out, dtype=ins[0].dtype)
        outs = ops.tensors(out)
        for t in outs:
            self._track(t)
        if kind == "view":
            self.stats["views"] += 1
        elif kind == "kernel" and any(t.device.type == "meta" for t in ins + outs):
            # (an op on host tensors only, such as AdamW's step counts in
            # PyTorch 1.13, runs on the CPU: no launch)
            if self._untimed:
                self.stats["untimed_ops"] += 1
            else:
                self._kernel(func, args, kwargs, out, ins, outs)
        return out

    def _region_of(self, t):
        if t.device.type != "meta":
            return None
        entry = self._live.get(getattr(t, _ATTR, (None,))[0])
        return entry.block.region if entry is not None and entry.block is not None else None

    def _regions(self, ts):
        seen = []
        for t in ts:
            r = self._region_of(t)
            if r is not None and r not in seen:
                seen.append(r)
        return seen

    def _kernel(self, func, args, kwargs, out, ins, outs):
        n = ops.name(func)
        self.stats["kernels"] += 1
        self.op_counts[n] = self.op_counts.get(n, 0) + 1
        kid = self._kernels.get(str(func))
        if kid is None:
            kid = self._kernels[str(func)] = len(self._kernels) + 1
            self._writer.kernel(kid, str(func))
        flops, rate = ops.flops_and_rate(func, args, out, self.tf32_matmul)
        nbytes = ops.bytes_moved(func, (args, kwargs), out)
        wr = {id(t) for t in ops.written(func, args, kwargs, out)}
        if ops.is_multi_tensor(func):
            lists = [a for a in args if isinstance(a, (list, tuple))]
            if isinstance(out, (list, tuple)):
                lists.append(out)
            for share, idx in ops.multi_tensor_launches(args, out):
                ts = [lst[i] for lst in lists for i in idx
                      if i < len(lst) and isinstance(lst[i], torch.Tensor)]
                self._launch(kid, ts, wr, flops * share, nbytes * share, rate)
            return
        self._launch(kid, ins + outs, wr, flops, nbytes, rate)

    def _launch(self, kid, ts, wr, flops, nbytes, rate):
        """One launch of the tensors ts, writing those whose id is in wr: the
        regions it only reads go to the trace's `i ro` record."""
        regions = self._regions(ts)
        writes = set(self._regions([t for t in ts if id(t) in wr]))
        dur = max(1, int(round(self.gpu.duration_us(flops, nbytes, rate))))
        self._writer.launch(self.clock, dur, kid, regions,
                            read_only=[r for r in regions if r not in writes])
        self.clock += dur
        self.stats["launches"] += 1


@contextlib.contextmanager
def _collector_paused():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _numbers_as_tensors(func, args):
    """A Python number autograd saved in place of a tensor (the 0.5 of
    `x * 0.5`) reaches the mode as a number where the op wants a tensor."""
    schema = func._schema.arguments
    if not any(isinstance(a, (int, float, complex)) and i < len(schema) and
               str(schema[i].type) == "Tensor" for i, a in enumerate(args)):
        return args
    return tuple(torch.tensor(a) if isinstance(a, (int, float, complex)) and i < len(schema)
                 and str(schema[i].type) == "Tensor" else a for i, a in enumerate(args))


def _unpack(saved):
    return saved.t
