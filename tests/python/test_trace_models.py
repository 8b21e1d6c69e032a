"""The recorder's layers that need no PyTorch: the GPU roofline and the
allocator models (stagehand.trace.gpus, stagehand.trace.alloc)."""

import importlib.util
import os

import pytest

from conftest import PYDIR

MIB = 1 << 20


def _load(name):
    """A module of stagehand/trace/ on its own: the package imports torch."""
    path = os.path.join(PYDIR, "stagehand", "trace", name + ".py")
    spec = importlib.util.spec_from_file_location("stagehand_trace_" + name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gpus, alloc = _load("gpus"), _load("alloc")


class Sink:
    """Collects what an allocator model tells the library."""

    def __init__(self):
        self.events = []

    def region_alloc(self, rid, nbytes):
        self.events.append(("a", rid, nbytes))

    def region_free(self, rid):
        self.events.append(("f", rid))


# ---- the roofline ----

def test_cards_and_figures():
    g = gpus.gpu("rtx4090")
    assert g.flops["bf16"] == pytest.approx(165.2e12) and g.bandwidth == 1008e9
    assert gpus.gpu("4090") == g and gpus.gpu("A100") == gpus.gpu("a100-80gb")
    # compute bound: 1e12 FLOPs at 165.2 TFLOP/s x 0.7, plus the launch
    assert g.duration_us(1e12, 0, "bf16") == pytest.approx(5 + 1e6 * 1e12 / (165.2e12 * 0.7))
    # memory bound: 1 GB at 1008 GB/s x 0.85
    assert g.duration_us(1, 1e9, "bf16") == pytest.approx(5 + 1e6 * 1e9 / (1008e9 * 0.85))
    c = gpus.gpu("fp32=10,bw=100,name=mine,launch_us=0")
    assert (c.name, c.flops["bf16"], c.flops["fp64"], c.bandwidth) == ("mine", 10e12, 10e12 / 64,
                                                                       100e9)
    assert c.duration_us(10e12 * 0.7, 0) == pytest.approx(1e6)
    d = gpus.gpu("h100,bw=2000,launch_us=8")
    assert (d.name, d.bandwidth, d.launch_us, d.flops["bf16"]) == ("h100", 2000e9, 8, 989.4e12)
    assert gpus.gpu(d.describe()).bandwidth == d.bandwidth  # describe() reads back


@pytest.mark.parametrize("spec,message", [
    ("rtx9090", "unknown GPU 'rtx9090': one of a10, a100-40gb"),
    ("", "empty GPU"),
    ("bf16=100", "needs fp32 and bw"),
    ("fp32=10,bw=fast", "bw='fast': not a number"),
    ("fp32=10,bw=1008e9", "bw=1.008e+12: expected GB/s in [1, 1e+06]"),
    ("rtx4090,clock=3", "unknown GPU figure 'clock'"),
    ("rtx4090,compute_eff=2", "compute_eff=2: expected a fraction"),
    ("rtx4090,80", "'80': expected KEY=VALUE"),
])
def test_bad_cards(spec, message):
    with pytest.raises(gpus.GPUError) as e:
        gpus.gpu(spec)
    assert message in str(e.value)


# ---- the allocator models ----

def test_caching_allocator_segments_split_and_merge():
    sink = Sink()
    a = alloc.CachingAllocator(sink)
    small = a.alloc(100)                       # 512 bytes of a 2 MiB segment
    assert sink.events == [("a", small.region, 2 * MIB)] and small.size == 512
    big = a.alloc(11 * MIB + 1)                # its own segment, rounded up to 2 MiB
    mid = a.alloc(3 * MIB)                     # a 20 MiB segment, split
    assert [e[2] for e in sink.events] == [2 * MIB, 12 * MIB, 20 * MIB]
    assert big.size == 12 * MIB and big.region != mid.region  # 1 MiB left: not split off
    mid2 = a.alloc(5 * MIB)                    # best fit: the rest of the 20 MiB segment
    assert mid2.region == mid.region and mid2.ptr == mid.ptr + 3 * MIB
    assert len(sink.events) == 3
    a.free(mid)
    again = a.alloc(2 * MIB)                   # the 3 MiB hole, whole: 1 MiB is not worth a split
    assert again.ptr == mid.ptr and again.size == 3 * MIB
    tiny = [a.alloc(600) for _ in range(3)]    # 1024-byte blocks, one after another
    assert [t.ptr - tiny[0].ptr for t in tiny] == [0, 1024, 2048]
    a.free(tiny[1])
    hole = a.alloc(1000)
    assert hole.ptr == tiny[1].ptr             # the hole in the middle is reused
    for b in (again, mid2, big, small, tiny[0], tiny[2], hole):
        a.free(b)
    # everything free: each segment is one block again, and the library saw no free
    assert sorted(s for s, _, _ in a.pools[False]) == [12 * MIB, 20 * MIB]
    assert [s for s, _, _ in a.pools[True]] == [2 * MIB]
    assert all(e[0] == "a" for e in sink.events) and len(sink.events) == 3


def test_per_tensor_regions_and_id_reuse():
    sink = Sink()
    a = alloc.PerTensorAllocator(sink, "async")
    assert a.alloc(MIB).region is None         # the sub-allocator's: not a region
    x = a.alloc(MIB + 1)
    assert sink.events == [("a", x.region, MIB + 1)]
    a.free(x)
    y = a.alloc(MIB + 1)
    assert sink.events[1] == ("f", x.region) and y.region != x.region   # unique ids
    r = alloc.PerTensorAllocator(Sink(), "pluggable", ids="reuse", device_cache=8 * MIB)
    p, q = r.alloc(3 * MIB), r.alloc(4 * MIB)  # both map 4 MiB
    r.free(p)
    r.free(q)
    assert r.alloc(3 * MIB + 5).region == q.region   # most recently freed first
    assert r.alloc(5 * MIB).region not in (p.region, q.region)  # another size: a new one
    big = [r.alloc(4 * MIB) for _ in range(3)]
    for b in big:
        r.free(b)                              # 16 MiB freed: the oldest fall out of the cache
    assert r.freed_bytes <= 8 * MIB
    assert r.alloc(4 * MIB).region == big[-1].region
    with pytest.raises(ValueError, match="never freed in preload mode"):
        alloc.make("preload", Sink(), ids="reuse")
    with pytest.raises(ValueError, match="unknown allocator mode 'cuda'"):
        alloc.make("cuda", Sink())
