"""PyTorch's allocator settings, read as PyTorch reads them.

PyTorch 2.4 to 2.9 take the allocator backend from PYTORCH_CUDA_ALLOC_CONF
only; 2.10 and later read PYTORCH_ALLOC_CONF, and PYTORCH_CUDA_ALLOC_CONF
only when PYTORCH_ALLOC_CONF is unset. A backend set in the variable the
running version does not read is silently ignored, and the library then
sees one segment per 2 MiB or 20 MiB instead of one allocation per tensor;
so the launcher and enable() both work from this one reading.
"""

import os
import re
import subprocess

OLD_VAR = "PYTORCH_CUDA_ALLOC_CONF"
NEW_VAR = "PYTORCH_ALLOC_CONF"
ASYNC = "cudaMallocAsync"


def parse_version(text):
    """(major, minor) from a version string such as "2.10.0+cu128"; None if unreadable."""
    m = re.match(r"\s*(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def installed_torch_version(python=None):
    """The torch version installed for `python` (default: this interpreter),
    read from the package metadata: importing torch would take seconds and
    load its CUDA libraries into the launcher. None when there is no torch."""
    code = ("import importlib.metadata as m\n"
            "try:\n print(m.version('torch'))\n"
            "except m.PackageNotFoundError:\n pass\n")
    if python is None:
        import importlib.metadata as md
        try:
            return md.version("torch")
        except md.PackageNotFoundError:
            return None
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True,
                             timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def parse_conf(text):
    """[(key, value)] of a "key:value,key:value" setting, in order."""
    items = []
    for part in (text or "").split(","):
        part = part.strip()
        if part:
            key, _, value = part.partition(":")
            items.append((key.strip(), value.strip()))
    return items


def format_conf(items):
    return ",".join("%s:%s" % kv for kv in items)


def conf_get(text, key):
    """The value of key in a setting, or None."""
    for k, v in parse_conf(text):
        if k == key:
            return v
    return None


def conf_with(text, key, value):
    """The setting with key set to value (replaced where present, appended otherwise)."""
    items = [(k, v) for k, v in parse_conf(text) if k != key]
    items.append((key, value))
    return format_conf(items)


def read_vars(version):
    """The variables the given torch version reads the backend from, in priority order.

    None (version unknown) gives both, as a version that may be either.
    """
    if version is None:
        return [NEW_VAR, OLD_VAR]
    return [NEW_VAR, OLD_VAR] if version >= (2, 10) else [OLD_VAR]


def effective(environ, version):
    """(variable, setting) that the given torch version obeys; (None, "") if none is set."""
    for var in read_vars(version):
        if var in environ:
            return var, environ[var]
    return None, ""


def backend(setting):
    return conf_get(setting, "backend") or "native"


def _rule(version):
    if version >= (2, 10):
        return ("PyTorch 2.10 and later read %s, and %s only when %s is unset"
                % (NEW_VAR, OLD_VAR, NEW_VAR))
    return "PyTorch up to 2.9 reads the allocator backend from %s only" % OLD_VAR


def problems(environ, version, torch_backend=None):
    """What is wrong with the allocator settings for the library, one line each.

    version: torch's (major, minor), or None when unknown (then the settings
    must suit both rules). torch_backend: what torch.cuda.get_allocator_backend()
    says, when torch is loaded.
    """
    out = []
    for v in [version] if version else [(2, 9), (2, 10)]:
        var, setting = effective(environ, v)
        first = read_vars(v)[0]
        for other in (OLD_VAR, NEW_VAR):
            wanted = conf_get(environ.get(other, ""), "backend")
            if other != var and wanted not in (None, backend(setting)):
                out.append("%s=%s is ignored (%s): set %s=%s (python -m stagehand run "
                           "sets the right variable)"
                           % (other, environ[other], _rule(v), first,
                              conf_with(environ.get(first, ""), "backend", wanted)))
        if torch_backend is not None and torch_backend != backend(setting):
            asks = ("%s asks for %s" % (var, backend(setting)) if var
                    else "no allocator variable is set")
            out.append("PyTorch's allocator backend is %s but %s: the setting changed after "
                       "PyTorch read it (when torch was imported); set it before the "
                       "program starts" % (torch_backend, asks))
    return list(dict.fromkeys(out))


def launch_env(environ, lib, version, allocator="async"):
    """The environment for a program to run under the library.

    LD_PRELOAD gains the library after the entries already there (they keep
    their precedence), unless it names libstagehand already. allocator
    "async" sets backend:cudaMallocAsync in the variable the given torch
    version reads first (both when the version is None), keeping every other
    setting the user made; "native" leaves the allocator variables alone.
    Returns a new dict.
    """
    env = dict(environ)
    entries = [e for e in env.get("LD_PRELOAD", "").replace(":", " ").split() if e]
    if not any(os.path.basename(e).startswith("libstagehand") for e in entries):
        env["LD_PRELOAD"] = " ".join(entries + [lib])
    if allocator == "async":
        # PyTorch reads the first of its variables that is set, wholesale: the
        # new value starts from what that version would have read, so that
        # writing PYTORCH_ALLOC_CONF does not hide settings the user made in
        # PYTORCH_CUDA_ALLOC_CONF.
        for var in read_vars(version) if version is None else read_vars(version)[:1]:
            _, base = effective(environ, (2, 10) if var == NEW_VAR else (2, 9))
            env[var] = conf_with(base, "backend", ASYNC)
    elif allocator != "native":
        raise ValueError("allocator must be 'async' or 'native', not %r" % allocator)
    return env
