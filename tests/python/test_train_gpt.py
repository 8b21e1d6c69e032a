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
