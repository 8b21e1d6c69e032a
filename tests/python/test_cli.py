"""python -m stagehand run / top: the environment the launcher builds, and both
commands end to end on the simulated GPU."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import BUILD, CUDA, LIB, child_env

from stagehand import _conf
from stagehand.__main__ import find_top, run

OLD, NEW = "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"


# ---- the environment ---------------------------------------------------------------

def test_ld_preload_keeps_what_is_there():
    env = _conf.launch_env({"LD_PRELOAD": "/a/libx.so:/b/liby.so"}, LIB, (2, 5), "native")
    assert env["LD_PRELOAD"] == "/a/libx.so /b/liby.so " + LIB
    assert _conf.launch_env({}, LIB, (2, 5), "native")["LD_PRELOAD"] == LIB
    # named already (another path or a build of its own): left as it is
    env = _conf.launch_env({"LD_PRELOAD": "/opt/libstagehand.so"}, LIB, (2, 5), "native")
    assert env["LD_PRELOAD"] == "/opt/libstagehand.so"


@pytest.mark.parametrize("version,before,after", [
    # up to 2.9: the old variable only, other settings kept, the backend replaced
    ((2, 4), {OLD: "max_split_size_mb:128,backend:native"},
     {OLD: "max_split_size_mb:128,backend:cudaMallocAsync"}),
    ((2, 9), {NEW: "garbage_collection_threshold:0.6"},
     {NEW: "garbage_collection_threshold:0.6", OLD: "backend:cudaMallocAsync"}),
    # 2.10 and later: the new variable, built from what 2.10 would read
    ((2, 10), {OLD: "expandable_segments:True"},
     {OLD: "expandable_segments:True", NEW: "expandable_segments:True,backend:cudaMallocAsync"}),
    ((2, 11), {OLD: "roundup_power2_divisions:4", NEW: "max_split_size_mb:64"},
     {OLD: "roundup_power2_divisions:4", NEW: "max_split_size_mb:64,backend:cudaMallocAsync"}),
    # unknown: both, each from what its reader would see
    (None, {OLD: "max_split_size_mb:32"},
     {OLD: "max_split_size_mb:32,backend:cudaMallocAsync",
      NEW: "max_split_size_mb:32,backend:cudaMallocAsync"}),
])
def test_the_backend_goes_where_that_pytorch_reads_it(version, before, after):
    env = _conf.launch_env(dict(before, HOME="/h"), LIB, version)
    assert {k: v for k, v in env.items() if k.startswith("PYTORCH_")} == after
    assert env["HOME"] == "/h"
    assert _conf.problems(env, version) == []


def test_native_leaves_the_allocator_variables_alone():
    before = {OLD: "backend:cudaMallocAsync", NEW: "max_split_size_mb:8"}
    env = _conf.launch_env(before, LIB, (2, 10), "native")
    assert {k: env[k] for k in before} == before


def test_versions_are_read_loosely():
    assert _conf.parse_version("2.10.0+cu128") == (2, 10)
    assert _conf.parse_version("2.9.0a0+git1234") == (2, 9)
    assert _conf.parse_version("2.11.0.dev20260101") == (2, 11)
    assert _conf.parse_version("nightly") is None


# ---- the launcher, as a command ------------------------------------------------------

def fake_torch_metadata(tmp_path, version):
    """A site folder holding only torch's package metadata: what the launcher
    reads, without torch itself."""
    site = tmp_path / ("site-" + version)
    info = site / ("torch-%s.dist-info" % version)
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: %s\n" % version)
    return str(site)


def launcher(args, site=None, extra=None, no_site=False):
    """python -m stagehand ARGS in a child; no_site=True leaves out the
    interpreter's site-packages (and the torch that may be installed there).
    STAGEHAND_LIB names the library under test: with BUILD elsewhere than
    build/, the one beside the package may be another build."""
    env = child_env(preload=False, extra=dict({"STAGEHAND_LIB": LIB}, **(extra or {})),
                    pythonpath=[site] if site else [])
    return subprocess.run([sys.executable] + (["-S"] if no_site else []) +
                          ["-m", "stagehand"] + args, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("version,var,other", [("2.7.1", OLD, NEW), ("2.10.0", NEW, OLD)])
def test_run_reads_the_commands_pytorch_version(tmp_path, version, var, other):
    site = fake_torch_metadata(tmp_path, version)
    r = launcher(["run", "--print-env", "--", os.path.basename(sys.executable), "train.py",
                  "--lr", "3e-4"], site, {"LD_PRELOAD": "/x/libfirst.so"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "LD_PRELOAD='/x/libfirst.so %s'" % LIB in lines
    assert "%s=backend:cudaMallocAsync" % var in lines
    assert not [line for line in lines if line.startswith(other)]
    assert lines[-1].endswith("train.py --lr 3e-4")
    assert "for PyTorch %s of " % version in r.stderr


def test_run_asks_the_python_the_command_names(tmp_path):
    # "python3.99" has torch 2.10; the launcher's own Python has none.
    site = fake_torch_metadata(tmp_path, "2.10.0")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "python3.99"
    wrapper.write_text("#!/bin/sh\nPYTHONPATH=%s exec %s \"$@\"\n" % (site, sys.executable))
    wrapper.chmod(0o755)
    r = launcher(["run", "--print-env", "--", "python3.99", "train.py"],
                 extra={"PATH": "%s:%s" % (bindir, os.environ.get("PATH", ""))})
    assert r.returncode == 0, r.stderr
    assert NEW + "=backend:cudaMallocAsync" in r.stdout.splitlines()
    assert OLD not in r.stdout
    assert "for PyTorch 2.10.0 of %s" % wrapper in r.stderr


def test_run_without_pytorch_sets_both(tmp_path):
    r = launcher(["run", "--print-env", "--", "/bin/true"], no_site=True)
    assert r.returncode == 0, r.stderr
    assert {OLD + "=backend:cudaMallocAsync", NEW + "=backend:cudaMallocAsync"} <= \
        set(r.stdout.splitlines())
    assert "no PyTorch found" in r.stderr


def test_run_keeps_expandable_segments_with_the_native_backend():
    # the library manages the memory PyTorch maps itself: nothing to warn of
    r = launcher(["run", "--allocator", "native", "--torch-version", "2.6", "--print-env",
                  "--", "x"], extra={OLD: "expandable_segments:True"})
    assert r.returncode == 0
    assert "expandable" not in r.stderr


@pytest.mark.parametrize("args,status,message", [
    (["run"], 2, "no command to run: python -m stagehand run -- python train.py"),
    (["run", "--"], 2, "no command to run"),
    (["run", "--torch-version", "two", "--", "x"], 2, "--torch-version 'two': expected MAJOR"),
    (["run", "--allocator", "fast", "--", "x"], 2, "invalid choice: 'fast'"),
    (["run", "--lib", "/nonexistent.so", "--", "x"], 2, "/nonexistent.so: no such file"),
    (["run", "-q", "--", "/nonexistent/cmd"], 127, "run: /nonexistent/cmd: command not found"),
    (["launch"], 2, "unknown command 'launch': run, top or trace"),
    ([], 2, "usage: python -m stagehand run"),
])
def test_bad_input_is_named(args, status, message):
    r = launcher(args)
    assert r.returncode == status, r.stderr
    assert message in r.stderr


def test_run_puts_a_program_under_the_library(tmp_path):
    site = fake_torch_metadata(tmp_path, "2.8.0")
    program = CUDA + """
import os, stagehand
p = cuda_malloc(16 << 20)
print(json.dumps([os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), stagehand.stats()["allocs"]]))
"""
    r = launcher(["run", "--", os.path.basename(sys.executable), "-c", program], site)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == ["backend:cudaMallocAsync", 1]


def test_run_calls_exec_with_the_built_environment():
    got = []
    status = run(
        ["-q", "--torch-version", "2.10", "--", "prog", "a b"],
        environ={"LD_PRELOAD": "", "PATH": "/bin", "STAGEHAND_LIB": LIB},
        execvpe=lambda f, a, e: got.append((f, a, e)))
    assert status == 0
    (f, a, e), = got
    assert (f, a) == ("prog", ["prog", "a b"])
    assert e == {"LD_PRELOAD": LIB, "PATH": "/bin", "STAGEHAND_LIB": LIB,
                 NEW: "backend:cudaMallocAsync"}


# ---- top -------------------------------------------------------------------------------

def test_top_runs_the_monitor_on_a_live_program():
    # The program allocates, marks two steps, waits for its live segment to
    # appear, says so, and waits for stdin to close.
    program = CUDA + """
import os, sys, stagehand
p = cuda_malloc(16 << 20)
stagehand.step(); stagehand.step()
while not os.path.exists("/dev/shm/stagehand.%d" % os.getpid()):
    os.sched_yield()
print(os.getpid(), flush=True)
sys.stdin.read()
"""
    child = subprocess.Popen([sys.executable, "-c", program], env=child_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(child.stdout.readline())
        # The segment is rewritten every 250 ms: ask until it shows the marks.
        deadline = time.monotonic() + 30
        while True:
            r = launcher(["top", "--json", "-p", str(pid)])
            assert r.returncode == 0, r.stderr
            snap = json.loads(r.stdout)
            if snap["step"] == 2 or time.monotonic() > deadline:
                break
        assert snap["pid"] == pid and snap["step"] == 2
        assert snap["vram"]["used"] >= 16 << 20
    finally:
        child.stdin.close()
        child.wait(timeout=60)


def test_top_passes_its_arguments_on():
    r = launcher(["top", "--help"])
    assert r.returncode == 0
    assert r.stdout.startswith("usage: stagehand-top")


def test_top_found_nowhere(tmp_path):
    alone = tmp_path / "libstagehand.so"
    alone.write_bytes(b"")
    r = launcher(["top", "--once"], extra={"STAGEHAND_LIB": str(alone), "PATH": str(tmp_path)})
    assert r.returncode == 2
    assert "stagehand-top not found beside libstagehand.so or on PATH" in r.stderr


def test_top_is_found_in_the_prefix_of_the_library(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib" / "libstagehand.so").write_bytes(b"")
    top = tmp_path / "bin" / "stagehand-top"
    top.write_text("#!/bin/sh\necho prefix top \"$@\"\n")
    top.chmod(0o755)
    r = launcher(["top", "-p", "1"], extra={"STAGEHAND_LIB": str(tmp_path / "lib" /
                                                                 "libstagehand.so")})
    assert (r.returncode, r.stdout) == (0, "prefix top -p 1\n"), r.stderr


def test_top_is_found_beside_the_library():
    assert find_top({"STAGEHAND_LIB": LIB, "PATH": ""}) == os.path.join(BUILD, "stagehand-top")
