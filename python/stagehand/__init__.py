"""libstagehand from Python.

    import stagehand
    stagehand.enable()                  # before the first CUDA allocation
    for batch in loader:
        stagehand.step()
        with stagehand.phase("forward"):
            loss = model(batch)
        with stagehand.phase("backward"):
            loss.backward()
        with stagehand.phase("optimizer"):
            opt.step()
    print(stagehand.stats()["evictions"])

The marks tell the library's scheduler where a training step and its
phases begin, so it can learn the step's pattern from its first repetition
instead of guessing it. Nothing here imports torch until enable() runs, so
the package also serves scripts and tools that never touch a GPU.
"""

import ctypes
import enum
import functools
import operator
import warnings

from . import _lib
from ._enable import Enabled, enable
from ._lib import STATS_FIELDS, NotLoadedError, StagehandError, find_library

__version__ = "0.1.0"

__all__ = [
    "Enabled", "NotLoadedError", "Phase", "STATS_FIELDS", "StagehandError",
    "active", "enable", "find_library", "library_version", "loaded", "mark_phase", "phase",
    "stats", "step",
]


class Phase(enum.IntEnum):
    """enum stagehand_phase_id, in the order a step goes through them."""

    STEP_BEGIN = 0
    FORWARD = 1
    BACKWARD = 2
    OPTIMIZER = 3
    STEP_END = 4


def loaded():
    """True when libstagehand is loaded in this process (preloaded or pluggable)."""
    return _lib.loaded_handle() is not None


def active():
    """True when the library manages allocations (False when disabled or
    when CUDA could not start under it)."""
    return bool(_lib.handle().stagehand_active())


def library_version():
    """The loaded library's version, "major.minor.patch"."""
    return _lib.handle().stagehand_version().decode()


def step():
    """Marks a step boundary; returns the number of the step that begins."""
    return _lib.handle().stagehand_step()


def _phase_id(p):
    if isinstance(p, str):
        try:
            return Phase[p.strip().upper().replace("-", "_")]
        except KeyError:
            raise ValueError("unknown phase %r: one of %s" % (
                p, ", ".join(m.name.lower() for m in Phase))) from None
    try:
        return Phase(p)
    except ValueError:
        raise ValueError("unknown phase %r: 0 to %d" % (p, len(Phase) - 1)) from None


class phase:
    """A phase of the step: a `with` block or a decorator.

        with stagehand.phase("backward"):      # marks on entry
            loss.backward()

        @stagehand.phase("optimizer")          # marks at every call
        def update(): ...

    Phases follow one another within a step, so leaving a block marks
    nothing: the next mark ends the phase. (Marking the earlier phase again
    on exit would tell the scheduler of a phase that does not happen.)
    To mark without a block, call mark_phase().
    """

    def __init__(self, name):
        self.id = _phase_id(name)  # a bad name fails here, not at the first use
        self._used = False

    def __enter__(self):
        self._used = True
        mark_phase(self.id)
        return self

    def __exit__(self, *exc):
        return False

    def __call__(self, fn):
        self._used = True

        @functools.wraps(fn)
        def marked(*args, **kwargs):
            mark_phase(self.id)
            return fn(*args, **kwargs)
        return marked

    def __del__(self):
        # `stagehand.phase("backward")` alone would otherwise mark nothing, silently.
        if not getattr(self, "_used", True):
            warnings.warn("stagehand.phase(%r) was neither entered nor used as a decorator, "
                          "so it marked nothing; call stagehand.mark_phase() to mark now"
                          % self.id.name.lower(), RuntimeWarning, stacklevel=2)


def mark_phase(name):
    """Marks the phase the program enters now ("forward", Phase.BACKWARD, 3...)."""
    phase_id = _phase_id(name)
    if _lib.handle().stagehand_phase(int(phase_id)) != 0:
        raise StagehandError("the library refused phase %d" % phase_id)


def stats(device=None):
    """The library's live figures as a dict (stagehand_stats_t, docs/TELEMETRY.md).

    The device figures are the main device's, or those of `device` (a CUDA
    device number) when given: one the library manages, else StagehandError.
    """
    st = _lib.StatsStruct()
    h = _lib.handle()
    if device is None:
        if h.stagehand_get_stats(ctypes.byref(st), ctypes.sizeof(st)) != 0:
            raise StagehandError("stagehand_get_stats failed")
    elif h.stagehand_get_device_stats(operator.index(device), ctypes.byref(st),
                                      ctypes.sizeof(st)) != 0:
        raise StagehandError("device %d is not managed by stagehand ([general] devices = all "
                             "manages every device the program allocates on)" % device)
    return {name: getattr(st, name) for name, _ in STATS_FIELDS}
