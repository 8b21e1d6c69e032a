"""Writes docs/TRACE.md's format (version 1). Needs no torch.

A path ending in .gz is written gzip-compressed, with no file name or time
in the gzip header, so the same recording makes the same bytes (the
committed fixtures depend on that); stagehand-sim reads either.
"""

import gzip
import io
import os

PHASES = ("begin", "forward", "backward", "optimizer", "end")


class TraceWriter:
    """One trace file. Times are microseconds and must not decrease; ids,
    streams and kernels are unsigned 64-bit numbers."""

    def __init__(self, path, source):
        self.path = path
        raw = open(path, "wb")
        if path.endswith(".gz"):
            self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0)
            self._f = io.TextIOWrapper(self._gz, encoding="utf-8", newline="\n")
        else:
            self._gz = None
            self._f = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
        self._raw = raw
        self._last_t = 0
        self.launches = 0
        self._line("stagehand-trace 1")
        self.info("source", source)

    def _line(self, s):
        self._f.write(s)
        self._f.write("\n")

    def _time(self, t):
        t = int(t)
        if t < self._last_t:
            raise ValueError("trace time went back: %d after %d" % (t, self._last_t))
        self._last_t = t
        return t

    def info(self, key, value):
        self._line("i %s %s" % (key, " ".join(str(value).split())))

    def comment(self, text):
        for line in str(text).splitlines() or [""]:
            self._line("# " + line)

    def kernel(self, kid, kname):
        self._line("k %d %s" % (kid, " ".join(kname.split())))

    def alloc(self, t, rid, nbytes, stream=0):
        self._line("a %d 0x%x %d %d u" % (self._time(t), rid, nbytes, stream))

    def free(self, t, rid, cls="u"):
        self._line("f %d 0x%x %s" % (self._time(t), rid, cls))

    def launch(self, t, dur, kid, rids, stream=0, read_only=()):
        """A launch touching rids; those in read_only it only reads (an
        `i ro` record), the others it writes."""
        ids = "".join(" 0x%x" % r for r in rids)
        self._line("l %d %d %d %d %d%s" % (self._time(t), dur, stream, kid, len(rids), ids))
        if read_only:
            ro = "".join(" 0x%x" % r for r in read_only)
            self._line("i ro %d %d%s" % (self.launches, len(read_only), ro))
        self.launches += 1

    def step(self, t, n, marked=True):
        self._line("s %d %d %s" % (self._time(t), n, "api" if marked else "auto"))

    def phase(self, t, p, marked=True):
        if p not in PHASES:
            raise ValueError("unknown phase %r: one of %s" % (p, ", ".join(PHASES)))
        self._line("p %d %s %s" % (self._time(t), p, "api" if marked else "auto"))

    def close(self):
        self._f.close()  # and the gzip stream; GzipFile leaves the file it was given open
        self._raw.close()

    def abandon(self):
        """Closes and removes a trace that was not finished."""
        try:
            self.close()
        finally:
            if os.path.exists(self.path):
                os.remove(self.path)
