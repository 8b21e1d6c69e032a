"""Shared pieces of the Python package's tests.

The package is tested against the real built library on the simulated GPU
(build/sim). Anything that loads the library runs in a child Python, so
that this process stays without it and the "not loaded" cases stay true;
torch, transformers and Lightning are fakes, injected as modules.
"""

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYDIR = os.path.join(REPO, "python")
BUILD = os.path.join(REPO, os.environ.get("STAGEHAND_TEST_BUILD", "build"))
LIB = os.path.join(BUILD, "libstagehand.so")
SIM = os.path.join(BUILD, "sim")

sys.path.insert(0, PYDIR)


@pytest.fixture(scope="session")
def lib():
    """The built library; the tests need it (make builds it first)."""
    if not os.path.isfile(LIB):
        pytest.fail("%s not built: run make first" % LIB)
    return LIB


def child_env(preload=True, extra=None, pythonpath=()):
    """The environment of a child Python: the package importable, the
    simulated GPU first on the library path, the library preloaded or not."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STAGEHAND_", "PYTORCH_", "SIMCUDA_")) and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.pathsep.join(list(pythonpath) + [PYDIR])
    env["LD_LIBRARY_PATH"] = SIM
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if preload:
        env["LD_PRELOAD"] = LIB
    env.update(extra or {})
    return env


def run_py(code, preload=True, extra_env=None, pythonpath=(), args=(), cwd=None):
    """Runs code in a child Python; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)] + list(args),
                          env=child_env(preload, extra_env, pythonpath), cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=120, check=False)


def run_json(code, **kw):
    """run_py, which must succeed; the last line of its output as JSON."""
    r = run_py(code, **kw)
    assert r.returncode == 0, "child failed (%d):\n%s\n%s" % (r.returncode, r.stdout, r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


# Allocation through the preloaded library, as a program linked with the
# CUDA runtime makes it: the global lookup finds the library's cudaMalloc.
CUDA = """
import ctypes, json
ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
_g = ctypes.CDLL(None)
def cuda_malloc(size):
    p = ctypes.c_void_p()
    assert _g.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(size)) == 0
    return p
def cuda_free(p):
    assert _g.cudaFree(p) == 0
"""


def fake_module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


def pytest_terminal_summary(terminalreporter):
    """The closing lines tests/run.sh counts (it reads cmocka's format)."""
    passed = len(terminalreporter.stats.get("passed", []))
    failed = len(terminalreporter.stats.get("failed", [])) + \
        len(terminalreporter.stats.get("error", []))
    terminalreporter.write_line("[  PASSED  ] %d test(s)." % passed)
    if failed:
        terminalreporter.write_line("[  FAILED  ] %d test(s), listed above." % failed)
