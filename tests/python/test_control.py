"""step(), phase() and stats() against the real library on the simulated GPU."""

import re

import pytest

from conftest import CUDA, REPO, run_json, run_py

import stagehand

MB = 1 << 20


def header_fields():
    with open(REPO + "/include/stagehand.h", encoding="utf-8") as f:
        body = re.search(r"typedef struct stagehand_stats \{(.*?)\} stagehand_stats_t;",
                         f.read(), re.S).group(1)
    return tuple((name, kind == "int64_t")
                 for kind, name in re.findall(r"^\s*(u?int64_t)\s+(\w+);", body, re.M))


def test_stats_layout_matches_the_header():
    fields = header_fields()
    assert len(fields) > 30
    assert stagehand.STATS_FIELDS == fields


def test_stats_follow_what_the_program_allocates(lib):
    out = run_json(CUDA + """
import stagehand
seen = [stagehand.stats()]
p = cuda_malloc(64 << 20)
seen.append(stagehand.stats())
cuda_free(p)
seen.append(stagehand.stats())
print(json.dumps(seen))
""")
    before, held, freed = out
    assert set(before) == {name for name, _ in stagehand.STATS_FIELDS}
    assert before["allocs"] == 0 and before["live_bytes"] == 0
    assert held["active"] == 1
    assert held["allocs"] == 1 and held["regions_live"] == 1
    assert held["live_bytes"] >= 64 * MB and held["device_bytes"] >= 64 * MB
    assert held["budget_bytes"] > 0
    assert freed["frees"] == 1 and freed["regions_live"] == 0 and freed["live_bytes"] == 0


def test_stats_of_each_device(lib):
    # Two simulated devices, both managed: each one's figures are its own.
    out = run_json(CUDA + """
import stagehand
p0 = cuda_malloc(64 << 20)
assert _g.cudaSetDevice(1) == 0
p1 = cuda_malloc(32 << 20)
q1 = cuda_malloc(32 << 20)
seen = [stagehand.stats(), stagehand.stats(device=0), stagehand.stats(device=1)]
try:
    stagehand.stats(device=2)
    seen.append("no error")
except stagehand.StagehandError as e:
    seen.append(str(e))
print(json.dumps(seen))
""", extra_env={"SIMCUDA_DEVICES": "2", "STAGEHAND_GENERAL_DEVICES": "all"})
    main, dev0, dev1, missing = out
    assert main == dev0
    assert dev0["regions_live"] == 1 and dev0["live_bytes"] == 64 * MB
    assert dev1["regions_live"] == 2 and dev1["live_bytes"] == 64 * MB and dev1["allocs"] == 2
    assert dev1["active"] == 1 and dev1["budget_bytes"] > 0
    assert "device 2 is not managed" in missing


def test_step_and_phase_marks_reach_the_library(lib):
    out = run_json("""
import json, stagehand
from stagehand import Phase
log = []
def now(what):
    s = stagehand.stats()
    log.append([what, s["step"], s["phase"]])
log.append(["step", stagehand.step()])
with stagehand.phase("forward"):
    now("in forward")
with stagehand.phase("backward"):
    pass
now("after backward")  # leaving the block marks nothing
@stagehand.phase(Phase.OPTIMIZER)
def update():
    now("in update")
stagehand.mark_phase("step-end")
now("step end")
update()
log.append(["step", stagehand.step()])
now("second step")
print(json.dumps(log))
""")
    assert out == [
        ["step", 1],
        ["in forward", 1, 1],
        ["after backward", 1, 2],
        ["step end", 1, 4],
        ["in update", 1, 3],
        ["step", 2],
        ["second step", 2, 0],
    ]


def test_phase_names_are_checked_before_any_use():
    with pytest.raises(ValueError, match="unknown phase 'backwards'.*forward, backward"):
        stagehand.phase("backwards")
    with pytest.raises(ValueError, match="unknown phase 7"):
        stagehand.mark_phase(7)


def test_a_phase_neither_entered_nor_decorating_warns():
    # The name check passes before the library is needed, so this runs unloaded.
    with pytest.warns(RuntimeWarning, match=r"phase\('optimizer'\) was neither entered"):
        stagehand.phase("optimizer")


def test_without_the_library_every_call_says_how_to_load_it(lib):
    out = run_json("""
import json, stagehand
res = {"loaded": stagehand.loaded()}
for name, call in [("step", stagehand.step), ("stats", stagehand.stats),
                   ("active", stagehand.active), ("version", stagehand.library_version),
                   ("mark", lambda: stagehand.mark_phase("forward"))]:
    try:
        call()
        res[name] = "no error"
    except stagehand.NotLoadedError as e:
        res[name] = str(e)
try:
    with stagehand.phase("backward"):
        pass
except stagehand.NotLoadedError as e:
    res["with"] = str(e)
print(json.dumps(res))
""", preload=False)
    assert out.pop("loaded") is False
    assert len(out) == 6
    for name, msg in out.items():
        assert msg.startswith("libstagehand is not loaded in this process"), name
        assert "python -m stagehand run" in msg and "enable('pluggable')" in msg


def test_disabled_library_reports_inactive_and_passes_through(lib):
    out = run_json(CUDA + """
import stagehand
p = cuda_malloc(64 << 20)
s = stagehand.stats()
print(json.dumps([stagehand.active(), stagehand.step(), s]))
""", extra_env={"STAGEHAND_DISABLE": "1"})
    active, step, s = out
    assert active is False and step == 1
    assert s["active"] == 0 and s["allocs"] == 0 and s["passthrough"] >= 1


def test_library_version_matches_the_header(lib):
    with open(REPO + "/include/stagehand.h", encoding="utf-8") as f:
        text = f.read()
    want = ".".join(re.search(r"STAGEHAND_VERSION_%s (\d+)" % part, text).group(1)
                    for part in ("MAJOR", "MINOR", "PATCH"))
    out = run_json("import json, stagehand; print(json.dumps(stagehand.library_version()))")
    assert out == want


def test_a_library_opened_locally_is_found_through_the_process_maps(lib):
    # As CUDAPluggableAllocator opens it: RTLD_LOCAL, so a global symbol
    # lookup does not see it; the marks must reach that same instance.
    out = run_json("""
import ctypes, json, os, stagehand
assert not stagehand.loaded()
mine = ctypes.CDLL(os.environ["STAGEHAND_LIB"])
assert not hasattr(ctypes.CDLL(None), "stagehand_step")
stagehand.step(); stagehand.step()
print(json.dumps([stagehand.loaded(), mine.stagehand_step()]))
""", preload=False, extra_env={"STAGEHAND_LIB": lib})
    assert out == [True, 3]


def test_mapped_library_reads_the_maps_format(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /old/libstagehand.so (deleted)\n"
        "7f04-7f05 r-xp 00000000 08:01 3 /opt/sh dir/lib/libstagehand.so\n")
    assert stagehand._lib.mapped_library(str(maps)) == "/opt/sh dir/lib/libstagehand.so"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n7f06-7f07 rw-p 0 0 0\n")
    assert stagehand._lib.mapped_library(str(maps)) is None


def test_find_library_order(tmp_path, monkeypatch):
    monkeypatch.setattr(stagehand._lib, "mapped_library", lambda: None)
    given, beside = tmp_path / "given.so", tmp_path / "beside.so"
    given.write_bytes(b"")
    beside.write_bytes(b"")
    monkeypatch.setattr(stagehand._lib, "_candidates",
                        lambda: [str(tmp_path / "absent.so"), str(beside)])
    assert stagehand.find_library(str(given), {}) == str(given)
    with pytest.raises(stagehand.StagehandError, match="nope.so: no such file"):
        stagehand.find_library(str(tmp_path / "nope.so"), {})
    assert stagehand.find_library(None, {"STAGEHAND_LIB": str(given)}) == str(given)
    with pytest.raises(stagehand.StagehandError, match="STAGEHAND_LIB=/nonexistent: no such"):
        stagehand.find_library(None, {"STAGEHAND_LIB": "/nonexistent"})
    assert stagehand.find_library(None, {}) == str(beside)
    monkeypatch.setattr(stagehand._lib, "mapped_library", lambda: "/mapped/libstagehand.so")
    assert stagehand.find_library(None, {"STAGEHAND_LIB": str(given)}) == \
        "/mapped/libstagehand.so"
    monkeypatch.setattr(stagehand._lib, "mapped_library", lambda: None)
    monkeypatch.setattr(stagehand._lib, "_candidates", lambda: [str(tmp_path / "absent.so")])
    with pytest.raises(stagehand.StagehandError, match="not found: .*STAGEHAND_LIB not set.*"
                                                       "absent.so"):
        stagehand.find_library(None, {})


def test_the_source_tree_build_is_a_candidate():
    assert REPO + "/build/libstagehand.so" in stagehand._lib._candidates()
