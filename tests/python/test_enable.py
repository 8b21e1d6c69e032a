"""enable() against a fake torch: which hook it takes, and what it refuses."""

import sys
import types

import pytest

from conftest import LIB, run_json

import stagehand
from stagehand import _enable, _lib


class FakeTorch:
    """Records what enable() does with torch's allocator hooks.

    mempool: torch.cuda.MemPool and use_mem_pool exist; routing: so does
    torch._C._cuda_beginAllocateToPool; in_use: change_current_allocator
    fails as PyTorch's does once the allocator was used."""

    def __init__(self, version="2.8.0+cu128", mempool=True, routing=True, pluggable=True,
                 backend="native", in_use=False):
        self.calls = []
        calls = self.calls
        torch = types.ModuleType("torch")
        torch.__version__ = version
        torch.device = lambda spec: types.SimpleNamespace(
            index=int(spec.split(":")[1]) if ":" in str(spec) else None)
        cuda = torch.cuda = types.ModuleType("torch.cuda")
        memory = cuda.memory = types.ModuleType("torch.cuda.memory")
        cuda.current_device = lambda: 0
        cuda.get_allocator_backend = lambda: backend
        torch._C = types.ModuleType("torch._C")
        if pluggable:
            class CUDAPluggableAllocator:
                def __init__(self, path, alloc, free):
                    calls.append(("CUDAPluggableAllocator", path, alloc, free))

                def allocator(self):
                    return "raw-allocator"
            memory.CUDAPluggableAllocator = CUDAPluggableAllocator

        def change_current_allocator(alloc):
            calls.append(("change_current_allocator",))
            if in_use:
                raise RuntimeError("Can't swap an already initialized allocator")
        memory.change_current_allocator = change_current_allocator
        if mempool:
            class MemPool:
                id = (0, 1)

                def __init__(self, allocator):
                    calls.append(("MemPool", allocator))
            cuda.MemPool = MemPool

            class Ctx:
                def __enter__(self):
                    calls.append(("use_mem_pool entered",))

                def __exit__(self, *a):
                    calls.append(("use_mem_pool left",))

            def use_mem_pool(pool, device):
                calls.append(("use_mem_pool", pool.id, device))
                return Ctx()
            cuda.use_mem_pool = use_mem_pool
            if routing:
                torch._C._cuda_beginAllocateToPool = \
                    lambda dev, pid: calls.append(("beginAllocateToPool", dev, pid))
        self.module = torch

    def names(self):
        return [c[0] for c in self.calls]


@pytest.fixture
def torch(monkeypatch):
    """Installs a FakeTorch built with the given options; enable() starts afresh."""
    monkeypatch.setattr(_enable, "_enabled", None)
    monkeypatch.setattr(_enable, "_keep", None)
    for var in ("LD_PRELOAD", "STAGEHAND_LIB", "STAGEHAND_DISABLE", "PYTORCH_ALLOC_CONF",
                "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("STAGEHAND_LIB", LIB)

    def make(**kw):
        fake = FakeTorch(**kw)
        monkeypatch.setitem(sys.modules, "torch", fake.module)
        return fake
    return make


def preloaded(monkeypatch, mapped=LIB):
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libother.so " + LIB)
    monkeypatch.setattr(_lib, "mapped_library", lambda: mapped)


# ---- pluggable mode ----------------------------------------------------------

def test_pluggable_routes_every_thread_to_a_mempool(torch):
    fake = torch()
    got = stagehand.enable()
    assert got == stagehand.Enabled("pluggable", "mempool", LIB)
    assert fake.calls == [("CUDAPluggableAllocator", LIB, "stagehand_malloc", "stagehand_free"),
                          ("MemPool", "raw-allocator"), ("beginAllocateToPool", 0, (0, 1))]
    assert stagehand.enable() is got and len(fake.calls) == 3  # once only


def test_pluggable_on_a_given_device(torch):
    fake = torch()
    stagehand.enable("pluggable", device="cuda:1")
    assert fake.calls[-1] == ("beginAllocateToPool", 1, (0, 1))


def test_pluggable_with_thread_routing_only_warns(torch):
    fake = torch(routing=False)
    with pytest.warns(RuntimeWarning, match="only the calling thread's allocations"):
        got = stagehand.enable("pluggable")
    assert got.method == "mempool-thread"
    assert fake.names()[-2:] == ["use_mem_pool", "use_mem_pool entered"]
    assert "use_mem_pool left" not in fake.names()  # stays for the life of the process


def test_pluggable_without_mempool_replaces_the_allocator(torch):
    fake = torch(version="2.4.1", mempool=False)
    assert stagehand.enable().method == "change_current_allocator"
    assert fake.names() == ["CUDAPluggableAllocator", "change_current_allocator"]


def test_mempool_false_replaces_the_allocator_even_where_pools_exist(torch):
    fake = torch()
    assert stagehand.enable(mempool=False).method == "change_current_allocator"
    assert "MemPool" not in fake.names()


def test_mempool_true_where_there_is_none(torch):
    torch(version="2.4.1", mempool=False)
    with pytest.raises(stagehand.StagehandError, match="PyTorch 2.4.1 has no torch.cuda.MemPool"):
        stagehand.enable(mempool=True)


def test_an_allocator_already_in_use_is_reported(torch):
    torch(mempool=False, in_use=True)
    with pytest.raises(stagehand.StagehandError,
                       match="in use already.*before the first CUDA allocation.*"
                             "already initialized"):
        stagehand.enable("pluggable")


def test_a_torch_without_pluggable_allocators(torch):
    torch(version="1.13.1", mempool=False, pluggable=False)
    with pytest.raises(stagehand.StagehandError,
                       match="PyTorch 1.13.1 has no torch.cuda.memory.CUDAPluggableAllocator"):
        stagehand.enable("pluggable")


def test_pluggable_names_a_missing_library(torch, monkeypatch):
    fake = torch()
    monkeypatch.setenv("STAGEHAND_LIB", "/nonexistent/libstagehand.so")
    with pytest.raises(stagehand.StagehandError, match="STAGEHAND_LIB=/nonexistent/"):
        stagehand.enable("pluggable")
    assert fake.calls == []


def test_a_second_library_beside_a_loaded_one_is_refused(torch, monkeypatch, tmp_path):
    other = tmp_path / "libstagehand.so"
    other.write_bytes(b"")
    monkeypatch.setattr(_lib, "mapped_library", lambda: LIB)
    fake = torch()
    with pytest.raises(stagehand.StagehandError, match="loaded in this process already"):
        stagehand.enable("pluggable", lib=str(other))
    assert fake.calls == []


def test_mode_is_checked(torch):
    torch()
    with pytest.raises(ValueError, match="mode must be"):
        stagehand.enable("magic")


def test_enable_without_torch(monkeypatch):
    monkeypatch.setattr(_enable, "_enabled", None)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(stagehand.StagehandError, match="needs PyTorch"):
        stagehand.enable()


def test_pluggable_allocations_reach_the_instance_the_package_reads(lib):
    # The fake allocator opens the library as PyTorch does (ctypes, locally);
    # an allocation through its entry point must show in stagehand.stats().
    out = run_json("""
import ctypes, json, sys, types, stagehand
seen = {}
class CUDAPluggableAllocator:
    def __init__(self, path, alloc, free):
        so = ctypes.CDLL(path)
        seen["malloc"] = ctypes.cast(getattr(so, alloc), ctypes.c_void_p).value
torch = types.ModuleType("torch")
torch.__version__ = "2.3.0"
torch.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(
    CUDAPluggableAllocator=CUDAPluggableAllocator,
    change_current_allocator=lambda a: None))
sys.modules["torch"] = torch
got = stagehand.enable()
malloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                          ctypes.c_void_p)(seen["malloc"])
ptr = malloc(32 << 20, 0, None)
s = stagehand.stats()
print(json.dumps([got, ptr is not None, s["allocs"], s["live_bytes"]]))
""", preload=False, extra_env={"STAGEHAND_LIB": lib})
    assert out == [["pluggable", "change_current_allocator", lib], True, 1, 32 << 20]


# ---- preload mode ---------------------------------------------------------------

def test_auto_is_preload_under_ld_preload(torch, monkeypatch):
    fake = torch()
    preloaded(monkeypatch)
    assert stagehand.enable() == stagehand.Enabled("preload", "native", LIB)
    assert fake.calls == []  # nothing installed


def test_preload_without_ld_preload(torch):
    torch()
    with pytest.raises(stagehand.StagehandError,
                       match="LD_PRELOAD does not name libstagehand.so.*python -m stagehand run"):
        stagehand.enable("preload")


def test_preload_named_but_not_loaded(torch, monkeypatch):
    torch()
    preloaded(monkeypatch, mapped=None)
    with pytest.raises(stagehand.StagehandError, match="not loaded in this process: the loader"):
        stagehand.enable("preload")


@pytest.mark.parametrize("version,env,method", [
    ("2.5.1", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, "cudaMallocAsync"),
    ("2.9.0", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync",
               "PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"}, "cudaMallocAsync"),
    ("2.10.0", {"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"}, "cudaMallocAsync"),
    # 2.10 falls back to the old variable when the new one is unset
    ("2.10.0", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, "cudaMallocAsync"),
    # the async backend ignores expandable segments
    ("2.11.0", {"PYTORCH_ALLOC_CONF": "expandable_segments:True,backend:cudaMallocAsync"},
     "cudaMallocAsync"),
    ("2.6.0", {}, "native"),
    # expandable segments: the library manages the memory PyTorch maps itself
    ("2.7.0", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "native"),
    ("2.10.0", {"PYTORCH_ALLOC_CONF": "expandable_segments:true,max_split_size_mb:64"},
     "native"),
])
def test_preload_accepts_settings_this_pytorch_obeys(torch, monkeypatch, version, env, method):
    torch(version=version, backend=method)
    preloaded(monkeypatch)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert stagehand.enable("preload") == stagehand.Enabled("preload", method, LIB)


@pytest.mark.parametrize("version,env,expect", [
    # <= 2.9 reads only the old variable
    ("2.5.1", {"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"},
     r"PYTORCH_ALLOC_CONF=backend:cudaMallocAsync is ignored \(PyTorch up to 2.9 reads the "
     r"allocator backend from PYTORCH_CUDA_ALLOC_CONF only\): set "
     r"PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"),
    ("2.9.1", {"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync,max_split_size_mb:64",
               "PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:4"},
     r"is ignored \(PyTorch up to 2.9 .*\): set PYTORCH_CUDA_ALLOC_CONF="
     r"roundup_power2_divisions:4,backend:cudaMallocAsync"),
    # >= 2.10: a PYTORCH_ALLOC_CONF without the backend hides the old variable
    ("2.10.1", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync",
                "PYTORCH_ALLOC_CONF": "max_split_size_mb:128"},
     r"PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync is ignored \(PyTorch 2.10 and later "
     r"read PYTORCH_ALLOC_CONF.*\): set "
     r"PYTORCH_ALLOC_CONF=max_split_size_mb:128,backend:cudaMallocAsync"),
])
def test_preload_says_what_to_change(torch, monkeypatch, version, env, expect):
    torch(version=version)
    preloaded(monkeypatch)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(stagehand.StagehandError, match="libstagehand is preloaded, but:\n  .*"
                       + expect):
        stagehand.enable("preload")


def test_preload_sees_a_backend_set_after_torch_read_it(torch, monkeypatch):
    torch(version="2.6.0", backend="native")
    preloaded(monkeypatch)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
    with pytest.raises(stagehand.StagehandError,
                       match="backend is native but PYTORCH_CUDA_ALLOC_CONF asks for "
                             "cudaMallocAsync: .*set it before the program starts"):
        stagehand.enable()


def test_preload_warns_when_the_library_is_disabled(torch, monkeypatch):
    torch()
    preloaded(monkeypatch)
    monkeypatch.setenv("STAGEHAND_DISABLE", "1")
    with pytest.warns(RuntimeWarning, match="STAGEHAND_DISABLE=1: libstagehand passes every"):
        stagehand.enable()


def test_a_second_mode_is_refused(torch, monkeypatch):
    torch()
    preloaded(monkeypatch)
    stagehand.enable()
    with pytest.raises(stagehand.StagehandError, match="already enabled in preload mode"):
        stagehand.enable("pluggable")


def test_the_package_imports_without_torch(lib):
    out = run_json("""
import json, sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "lightning", "pytorch_lightning"):
            raise ImportError("%s imported" % name)
import importlib.abc
sys.meta_path.insert(0, NoTorch())
import stagehand, stagehand.__main__, stagehand._conf
stagehand.step()
print(json.dumps(sorted(m for m in sys.modules if m.startswith("torch"))))
""")
    assert out == []
