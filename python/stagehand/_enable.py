"""Putting libstagehand under PyTorch, the best way the running version offers.

Preload mode (the program started under LD_PRELOAD) needs no installing, but
it is easy to get silently wrong: the allocator backend set in a variable
that this PyTorch does not read leaves the library managing PyTorch's
segments rather than each tensor while it seems to run as asked. So
enable() checks and says what to change. (Expandable segments are managed
too: the library backs the memory PyTorch maps itself.)

Pluggable mode hands PyTorch the library's stagehand_malloc/stagehand_free.
Where torch.cuda.MemPool exists the allocator goes into a pool that every
allocation on the device is routed to: PyTorch's caching allocator then
sits on top, so an allocation the library cannot meet raises
torch.cuda.OutOfMemoryError (change_current_allocator would make a tensor
at address 0 of it) and record_stream and PyTorch's memory statistics keep
working. The price: the library sees PyTorch's segments, not each tensor,
and while the pool takes the device's allocations PyTorch acts as if a CUDA
graph capture were under way, so it does not reuse a block that was used on
a second stream (record_stream) once freed. mempool=False avoids both.
"""

import collections
import os
import sys
import warnings

from . import _conf, _lib
from ._lib import StagehandError

Enabled = collections.namedtuple("Enabled", "mode method lib")
Enabled.__doc__ = """What enable() did.

mode: "preload" or "pluggable". method: "native" or "cudaMallocAsync" (the
backend PyTorch uses over the preloaded library), "mempool" (every thread's
allocations go to the pool), "mempool-thread" (only the calling thread's:
this PyTorch offers no wider routing), or "change_current_allocator".
lib: the library's path."""

_enabled = None
_keep = None  # the allocator and pool: PyTorch holds raw pointers into them


def _disabled(environ):
    v = environ.get("STAGEHAND_DISABLE", "").strip().lower()
    return v not in ("", "0", "false", "no", "off")


def enable(mode="auto", lib=None, device=None, mempool=None):
    """Puts libstagehand under PyTorch; call it before the first CUDA allocation.

    mode: "preload" checks that the program runs under LD_PRELOAD with
    allocator settings the library can work with; "pluggable" installs the
    library as PyTorch's allocator; "auto" (the default) is "preload" when
    LD_PRELOAD names the library, "pluggable" otherwise. lib: the library
    for pluggable mode (default: stagehand.find_library()). device: the CUDA
    device whose allocations go to the library (default: the current one).
    mempool: True or False forces or refuses the MemPool way (default: use
    it where PyTorch has it). Returns an Enabled; raises StagehandError
    saying what is wrong. A second call returns the first call's result.
    """
    global _enabled
    if mode not in ("auto", "preload", "pluggable"):
        raise ValueError("mode must be 'auto', 'preload' or 'pluggable', not %r" % (mode,))
    if _enabled is not None:
        if mode not in ("auto", _enabled.mode):
            raise StagehandError("stagehand is already enabled in %s mode" % _enabled.mode)
        return _enabled
    try:
        import torch
    except ImportError as e:
        raise StagehandError("stagehand.enable() needs PyTorch, which does not import here "
                             "(%s)" % e) from e
    if mode == "auto":
        mode = "preload" if _lib.preloaded() else "pluggable"
    if mode == "preload":
        _enabled = _check_preload(torch)
    else:
        _enabled = _install_pluggable(torch, lib, device, mempool)
    return _enabled


def _check_preload(torch):
    if not _lib.preloaded():
        raise StagehandError(
            "LD_PRELOAD does not name libstagehand.so: start the program with "
            "`python -m stagehand run -- python %s`, or use stagehand.enable('pluggable')"
            % (os.path.basename(sys.argv[0] if sys.argv else "") or "train.py"))
    path = _lib.mapped_library()
    if path is None:
        raise StagehandError(
            "LD_PRELOAD=%s names libstagehand, but it is not loaded in this process: the "
            "loader could not open it (it says why on stderr at start); give its full path"
            % os.environ.get("LD_PRELOAD", ""))
    if _disabled(os.environ):
        warnings.warn("STAGEHAND_DISABLE=%s: libstagehand passes every call through"
                      % os.environ["STAGEHAND_DISABLE"], RuntimeWarning, stacklevel=3)
    version = _conf.parse_version(getattr(torch, "__version__", ""))
    try:
        torch_backend = torch.cuda.get_allocator_backend()
    except Exception:  # noqa: BLE001 - absent, or a CPU-only build: nothing to compare
        torch_backend = None
    wrong = _conf.problems(os.environ, version, torch_backend)
    if wrong:
        raise StagehandError("libstagehand is preloaded, but:\n  " + "\n  ".join(wrong))
    _, setting = _conf.effective(os.environ, version)
    return Enabled("preload", torch_backend or _conf.backend(setting), path)


def _device_index(torch, device):
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def _install_pluggable(torch, lib, device, mempool):
    global _keep
    memory = getattr(torch.cuda, "memory", None)
    if not hasattr(memory, "CUDAPluggableAllocator"):
        raise StagehandError("PyTorch %s has no torch.cuda.memory.CUDAPluggableAllocator "
                             "(2.0 and later have it): run under LD_PRELOAD instead "
                             "(python -m stagehand run -- ...)" % torch.__version__)
    path = _lib.find_library(lib)
    mapped = _lib.mapped_library()
    if mapped and not os.path.samefile(mapped, path):
        raise StagehandError("%s is loaded in this process already; a second library (%s) "
                             "would manage memory beside it" % (mapped, path))
    has_pool = hasattr(torch.cuda, "MemPool")
    if mempool and not has_pool:
        raise StagehandError("PyTorch %s has no torch.cuda.MemPool" % torch.__version__)
    alloc = memory.CUDAPluggableAllocator(path, "stagehand_malloc", "stagehand_free")
    if has_pool and mempool is not False:
        pool = torch.cuda.MemPool(alloc.allocator())
        index = _device_index(torch, device)
        begin = getattr(torch._C, "_cuda_beginAllocateToPool", None)
        if begin is not None:
            begin(index, pool.id)  # every stream, so every thread, of the device
            _keep = (alloc, pool)
            return Enabled("pluggable", "mempool", path)
        ctx = torch.cuda.use_mem_pool(pool, index)
        ctx.__enter__()  # for the life of the process
        _keep = (alloc, pool, ctx)
        warnings.warn("this PyTorch routes only the calling thread's allocations to a "
                      "MemPool: autograd's backward threads allocate outside libstagehand; "
                      "torch.autograd.set_multithreading_enabled(False) keeps backward on "
                      "this thread", RuntimeWarning, stacklevel=3)
        return Enabled("pluggable", "mempool-thread", path)
    try:
        memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise StagehandError("PyTorch's allocator is in use already, so it cannot be "
                             "replaced: call stagehand.enable() before the first CUDA "
                             "allocation (%s)" % e) from e
    _keep = (alloc,)
    return Enabled("pluggable", "change_current_allocator", path)
