"""Finding libstagehand.so and calling its control API (include/stagehand.h).

Two questions are kept apart on purpose. *Which library is in this
process* decides where step(), phase() and stats() go: loading a second,
idle copy just to ask it would answer with zeros that look real. *Where
is a library to use* is what enable() (pluggable mode) and the launcher
need, and may load one.
"""

import ctypes
import os
import threading

LIB_NAME = "libstagehand.so"

# stagehand_stats_t, field for field (int64_t fields are signed). The C
# header only ever appends fields, and the library copies no more than the
# size it is given, so a newer library works with this list and an older
# one leaves the fields it lacks at 0. tests/python checks it against the
# header.
STATS_FIELDS = (
    ("active", False), ("step", True), ("phase", True),
    ("budget_bytes", False), ("high_watermark", False), ("low_watermark", False),
    ("device_bytes", False), ("live_bytes", False),
    ("regions_live", False), ("regions_freed", False),
    ("allocs", False), ("frees", False), ("reuses", False),
    ("small_allocs", False), ("small_frees", False), ("passthrough", False),
    ("vmm_maps", False), ("vmm_unmaps", False), ("oom", False),
    ("evictions", False), ("restores", False),
    ("d2h_bytes", False), ("h2d_bytes", False), ("host_bytes", False),
    ("pinned_bytes", False), ("launches", False), ("tracking_mode", False),
    ("checksum_mismatches", False), ("remap_windows", False),
    ("device_drains", False), ("lost_writes", False), ("opaque_work", False),
    ("regions_pinned", False), ("launches_recorded", False),
    ("node_budget_bytes", False), ("node_used_bytes", False), ("node_ranks", False),
    ("launches_unscanned", False),
    ("cupti_handovers", False), ("cupti_returns", False), ("cached_bytes", False),
    ("clean_evictions", False), ("dirty_evictions", False), ("clean_bytes", False),
    ("fingerprints", False), ("kept_bytes", False), ("unseen_writes", False),
    ("window_us", False), ("drain_us", False), ("copy_wait_us", False), ("remap_us", False),
    ("scan_us", False), ("scan_wait_us", False), ("scanned_bytes", False),
    ("prefilters", False), ("scans_skipped", False),
    ("stalls", False), ("stall_us", False),
    ("prefetches", False), ("prefetch_commits", False),
    ("early_evictions", False), ("early_commits", False),
    ("steps_found", True), ("steps_followed", False), ("steps_departed", False),
    ("fingerprint_us", False), ("prefilter_us", False),
    ("host_launches", False), ("fingerprint_start_us", False),
)


class StatsStruct(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64 if signed else ctypes.c_uint64)
                for name, signed in STATS_FIELDS]


class StagehandError(RuntimeError):
    """Something about libstagehand's setup is wrong; the message says what."""


class NotLoadedError(StagehandError):
    """libstagehand is not loaded in this process."""


def _is_stagehand(path):
    base = os.path.basename(path)
    return base.startswith("libstagehand") and ".so" in base


def mapped_library(maps="/proc/self/maps"):
    """Path of the libstagehand this process has mapped, or None.

    /proc/self/maps sees the library however it came: preloaded, or opened
    RTLD_LOCAL by PyTorch's CUDAPluggableAllocator, whose symbols a global
    lookup (ctypes.CDLL(None)) would not find.
    """
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(None, 5)
                path = parts[5].strip() if len(parts) == 6 else ""
                # "(deleted)": rebuilt since it was mapped; opening the path
                # again would load the new file as a second copy.
                if _is_stagehand(path) and not path.endswith("(deleted)"):
                    return path
    except OSError:
        pass
    return None


def preload_entries(environ=None):
    """The entries of LD_PRELOAD (the loader splits on spaces and colons)."""
    value = (os.environ if environ is None else environ).get("LD_PRELOAD", "")
    return [e for e in value.replace(":", " ").split() if e]


def preloaded(environ=None):
    """True when LD_PRELOAD names libstagehand."""
    return any(_is_stagehand(e) for e in preload_entries(environ))


def _candidates():
    """Where a library may lie relative to this package, most specific first.

    The package's own folder (a bundle); PREFIX/lib for a package under
    PREFIX/lib/pythonX.Y/site-packages or PREFIX/share/stagehand/python
    (make install); build/ of the source tree for python/stagehand.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, LIB_NAME)]
    try:
        from . import _paths  # written by make install
        out.append(os.path.join(_paths.LIBDIR, LIB_NAME))
    except ImportError:
        pass
    up = here
    for _ in range(4):
        up = os.path.dirname(up)
        out += [os.path.join(up, "lib", LIB_NAME), os.path.join(up, "build", LIB_NAME)]
    return out


def find_library(lib=None, environ=None):
    """The libstagehand.so to use, as an absolute path.

    In order: `lib` if given, the one this process has loaded, $STAGEHAND_LIB,
    then next to the package. Raises StagehandError naming every place
    looked at when there is none.
    """
    environ = os.environ if environ is None else environ
    if lib:
        if not os.path.isfile(lib):
            raise StagehandError("%s: no such file (the library was given explicitly)" % lib)
        return os.path.abspath(lib)
    mapped = mapped_library()
    if mapped:
        return mapped
    env = environ.get("STAGEHAND_LIB")
    if env:
        if not os.path.isfile(env):
            raise StagehandError("STAGEHAND_LIB=%s: no such file" % env)
        return os.path.abspath(env)
    tried = _candidates()
    for path in tried:
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise StagehandError(
        "libstagehand.so not found: not loaded in this process, STAGEHAND_LIB not set, "
        "and none at %s; build it (make) and set STAGEHAND_LIB to its path"
        % ", ".join(os.path.normpath(p) for p in tried))


_lock = threading.Lock()
_handle = None


def _bind(lib):
    lib.stagehand_get_stats.argtypes = [ctypes.POINTER(StatsStruct), ctypes.c_size_t]
    lib.stagehand_get_stats.restype = ctypes.c_int
    lib.stagehand_get_device_stats.argtypes = [ctypes.c_int, ctypes.POINTER(StatsStruct),
                                               ctypes.c_size_t]
    lib.stagehand_get_device_stats.restype = ctypes.c_int
    lib.stagehand_step.argtypes = []
    lib.stagehand_step.restype = ctypes.c_int64
    lib.stagehand_phase.argtypes = [ctypes.c_int]
    lib.stagehand_phase.restype = ctypes.c_int
    lib.stagehand_active.argtypes = []
    lib.stagehand_active.restype = ctypes.c_int
    lib.stagehand_version.argtypes = []
    lib.stagehand_version.restype = ctypes.c_char_p
    return lib


def loaded_handle():
    """The ctypes handle of the library in this process, or None."""
    global _handle
    if _handle is not None:
        return _handle
    with _lock:
        if _handle is None:
            path = mapped_library()
            if path:
                # Already mapped: dlopen returns that same instance.
                _handle = _bind(ctypes.CDLL(path))
            else:
                glob = ctypes.CDLL(None)
                if hasattr(glob, "stagehand_get_stats"):
                    _handle = _bind(glob)
    return _handle


def handle():
    """loaded_handle(), or NotLoadedError saying how to load it."""
    h = loaded_handle()
    if h is None:
        raise NotLoadedError(
            "libstagehand is not loaded in this process: start the program with "
            "`python -m stagehand run -- python train.py` (or LD_PRELOAD=/path/to/"
            "libstagehand.so), or call stagehand.enable('pluggable') before the first "
            "CUDA allocation")
    return h
