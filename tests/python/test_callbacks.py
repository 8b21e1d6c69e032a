"""The Hugging Face and Lightning callbacks, against fake trainer packages and
the real library: each hook must leave the library at the right step and phase."""

import pytest

from conftest import run_json, run_py

# What the fakes define: only the base classes the callbacks derive from.
FAKES = {
    "transformers/__init__.py": "class TrainerCallback:\n    pass\n",
    "lightning/__init__.py": "",
    "lightning/pytorch/__init__.py": "class Callback:\n    pass\n",
    "pytorch_lightning/__init__.py": "class Callback:\n    pass\n",
}

# Refuses some top-level packages, as if they were not installed.
BLOCK = """
import sys
class Block:
    def __init__(self, names): self.names = names
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ImportError("No module named %r" % name)
"""


@pytest.fixture
def fakes(tmp_path):
    for rel, text in FAKES.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return [str(tmp_path)]


def test_hf_callback_marks_each_trainer_event(lib, fakes):
    out = run_json("""
import json, stagehand
from stagehand.hf import StagehandCallback
from transformers import TrainerCallback
cb = StagehandCallback()
assert isinstance(cb, TrainerCallback)
log = []
def now(event):
    s = stagehand.stats()
    log.append([event, s["step"], s["phase"]])
for _ in range(2):  # as Trainer._inner_training_loop calls them
    cb.on_step_begin(None, None, None); now("step_begin")
    cb.on_pre_optimizer_step(None, None, None, model=None); now("pre_optimizer")
    cb.on_step_end(None, None, None); now("step_end")
print(json.dumps(log))
""", pythonpath=fakes)
    assert out == [["step_begin", 1, 1], ["pre_optimizer", 1, 3], ["step_end", 1, 4],
                   ["step_begin", 2, 1], ["pre_optimizer", 2, 3], ["step_end", 2, 4]]


@pytest.mark.parametrize("package", ["lightning", "pytorch_lightning"])
def test_lightning_callback_marks_each_hook(lib, fakes, package):
    other = "pytorch_lightning" if package == "lightning" else "lightning"
    out = run_json(BLOCK + """
import json
sys.meta_path.insert(0, Block([%r]))
import stagehand
from stagehand.lightning import StagehandCallback
from %s import Callback
cb = StagehandCallback()
assert isinstance(cb, Callback)
log = []
def now(event):
    s = stagehand.stats()
    log.append([event, s["step"], s["phase"]])
cb.on_train_batch_start(None, None, "batch", 0); now("batch_start")
cb.on_before_backward(None, None, "loss"); now("before_backward")
cb.on_before_optimizer_step(None, None, "opt"); now("before_optimizer")
cb.on_train_batch_end(None, None, {}, "batch", 0); now("batch_end")
cb.on_train_batch_start(None, None, "batch", 1); now("batch_start")
print(json.dumps(log))
""" % (other, package + (".pytorch" if package == "lightning" else "")), pythonpath=fakes)
    assert out == [["batch_start", 1, 1], ["before_backward", 1, 2],
                   ["before_optimizer", 1, 3], ["batch_end", 1, 4], ["batch_start", 2, 1]]


def test_callbacks_without_the_library(lib, fakes):
    out = run_json("""
import json, stagehand
from stagehand.hf import StagehandCallback as HF
from stagehand.lightning import StagehandCallback as PL
res = []
for cls in (HF, PL):
    try:
        cls()
        res.append("made")
    except stagehand.NotLoadedError as e:
        res.append(str(e).split(":")[0])
quiet = PL(required=False)
quiet.on_train_batch_start(None, None, None, 0)
quiet.on_before_backward(None, None, None)
HF(required=False).on_step_begin(None, None, None)
res.append(stagehand.loaded())
print(json.dumps(res))
""", preload=False, pythonpath=fakes)
    assert out == ["libstagehand is not loaded in this process"] * 2 + [False]


@pytest.mark.parametrize("module,needs", [("hf", "transformers"),
                                          ("lightning", "lightning or pytorch_lightning")])
def test_callbacks_name_the_missing_package(module, needs):
    r = run_py(BLOCK + """
sys.meta_path.insert(0, Block(["transformers", "lightning", "pytorch_lightning"]))
import stagehand
try:
    import stagehand.%s
except ImportError as e:
    print(e)
""" % module, preload=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("stagehand.%s needs %s" % (module, needs if module == "lightning"
                                                          else "the " + needs + " package"))
