"""tests/gpu/train_gpt.py's use of the package, which the GPU suite relies on."""

import os

from conftest import REPO, run_json

GPU = os.path.join(REPO, "tests", "gpu")


def test_marks_and_figures_reach_the_library(lib):
    out = run_json("""
import json, train_gpt
sh = train_gpt.Stagehand()
sh.step(); sh.phase(2)
s = sh.stats()
print(json.dumps([sh.present, s["step"], s["phase"]]))
""", pythonpath=[GPU])
    assert out == [True, 1, 2]


def test_without_the_library_the_marks_do_nothing():
    out = run_json("""
import json, train_gpt
sh = train_gpt.Stagehand()
sh.step(); sh.phase(2)
print(json.dumps([sh.present, sh.stats()]))
""", preload=False, pythonpath=[GPU])
    assert out == [False, {}]


def test_async_backend_goes_in_the_variable_the_installed_pytorch_reads(tmp_path):
    for version, var in (("2.6.0", "PYTORCH_CUDA_ALLOC_CONF"), ("2.10.0", "PYTORCH_ALLOC_CONF")):
        site = tmp_path / version
        info = site / ("torch-%s.dist-info" % version)
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: %s\n"
                                       % version)
        out = run_json("""
import json, train_gpt
env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}
train_gpt.set_async_backend(env)
print(json.dumps(env))
""", preload=False, pythonpath=[GPU, str(site)])
        assert out[var] == "max_split_size_mb:64,backend:cudaMallocAsync", version
        assert len(out) == (1 if var == "PYTORCH_CUDA_ALLOC_CONF" else 2)


def test_profiler_window_arguments():
    out = run_json("""
import json, train_gpt
res = []
for argv in (["--profiler-window", "3:5"], ["--profiler-window", "5:3"],
             ["--profiler-window", "x"], ["--profiler-window", "18:21"],
             ["--profiler", "--profiler-window", "1:2"]):
    try:
        res.append(list(train_gpt.parse_args(argv).profiler_window))
    except SystemExit as e:
        res.append(e.code)
print(json.dumps(res))
""", preload=False, pythonpath=[GPU])
    assert out == [[3, 5], 2, 2, 2, 2]


def test_profiler_window_problems():
    # What the window reports for each thing that can go wrong, from its facts.
    out = run_json("""
import json, train_gpt
class Sh:
    present = True
def problems(cuda, **facts):
    w = train_gpt.ProfilerWindow(None, (1, 2), cuda, Sh())
    w.facts.update(facts)
    return w.problems()
good = dict(tracking_before="cupti", tracking_during="hooks", cupti_handovers=1,
            device_events=40)
print(json.dumps([
    problems(True, **good),
    problems(True, **dict(good, device_events=0)),
    problems(True, **dict(good, tracking_during="cupti")),
    problems(True, **dict(good, cupti_handovers=0)),
    problems(True, **dict(good, tracking_before="hooks", cupti_handovers=0)),
    problems(True),
]))
""", preload=False, pythonpath=[GPU])
    assert out[0] == [] and out[4] == []
    assert "no device events" in out[1][0]
    assert "kept CUPTI" in out[2][0]
    assert "no CUPTI hand-over" in out[3][0]
    assert "ended before step 1" in out[5][0]
