"""The package installs: with pip from python/, and as make install lays it out."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import LIB, PYDIR, REPO, child_env


def python(code, pythonpath, cwd, extra=None, args=()):
    """A child Python that sees only the installed copy of the package."""
    env = child_env(preload=False, extra=extra)
    env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable] + (["-c", code] if code else []) + list(args),
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=120,
                          check=False)


def has(*cmd):
    return subprocess.run([sys.executable] + list(cmd), capture_output=True,
                          check=False).returncode == 0


# setuptools builds wheels itself from 70.1; before, it needs the wheel package.
BUILDS_WHEELS = has("-c", "import wheel") or has(
    "-c", "import sys, setuptools; "
          "sys.exit(tuple(map(int, setuptools.__version__.split('.')[:2])) < (70, 1))")


@pytest.mark.skipif(not (has("-m", "pip", "--version") and BUILDS_WHEELS),
                    reason="this Python cannot build a wheel offline: no pip, setuptools or "
                           "wheel (mk/prereqs.sh installs python3-pip, which brings them)")
def test_pip_installs_the_package(tmp_path):
    src, site = tmp_path / "src", tmp_path / "site"
    shutil.copytree(PYDIR, src, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                              "__pycache__"))
    env = dict(os.environ, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_ROOT_USER_ACTION="ignore", PIP_NO_INDEX="1")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                        "--no-deps", "--target", str(site), str(src)],
                       env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / "stagehand" / "__main__.py").is_file()
    assert (site / "stagehand" / "trace" / "recorder.py").is_file()
    assert list(site.glob("stagehand-0.1.0.dist-info"))

    code = "import stagehand; print(stagehand.__file__); print(stagehand.find_library())"
    r = python(code, str(site), str(tmp_path), {"STAGEHAND_LIB": LIB})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [str(site / "stagehand" / "__init__.py"), LIB]
    # installed apart from any library, and not told where one is
    r = python(code, str(site), str(tmp_path))
    assert r.returncode == 1 and "libstagehand.so not found" in r.stderr
    r = python(None, str(site), str(tmp_path), {"STAGEHAND_LIB": LIB},
               ["-m", "stagehand", "run", "-q", "--print-env", "--", "true"])
    assert r.returncode == 0 and "LD_PRELOAD=" + LIB in r.stdout


def install(destdir, prefix):
    return subprocess.run([os.path.join(REPO, "mk", "install_python.sh"), destdir, prefix],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


def test_make_install_layout_finds_its_library_and_top(tmp_path):
    prefix = tmp_path / "prefix"
    r = install("", str(prefix))
    assert r.returncode == 0, r.stderr
    trace = prefix / "share" / "stagehand" / "python" / "stagehand" / "trace"
    assert sorted(p.name for p in trace.iterdir()) == sorted(
        f for f in os.listdir(os.path.join(PYDIR, "stagehand", "trace")) if f.endswith(".py"))
    assert "pip install %s/share/stagehand/python" % prefix in r.stdout
    (prefix / "lib").mkdir()
    (prefix / "bin").mkdir()
    shutil.copy(LIB, prefix / "lib" / "libstagehand.so")
    top = prefix / "bin" / "stagehand-top"
    top.write_text("#!/bin/sh\necho installed top \"$@\"\n")
    top.chmod(0o755)
    share = str(prefix / "share" / "stagehand" / "python")
    r = python("import stagehand; print(stagehand.find_library())", share, str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(prefix / "lib" / "libstagehand.so")
    r = python(None, share, str(tmp_path), {"PATH": "/usr/bin:/bin"},
               ["-m", "stagehand", "top", "--once"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "installed top --once\n"


def test_make_install_under_destdir_names_the_final_prefix(tmp_path):
    r = install(str(tmp_path / "stage"), "/opt/sh")
    assert r.returncode == 0, r.stderr
    paths = tmp_path / "stage" / "opt" / "sh" / "share" / "stagehand" / "python" / \
        "stagehand" / "_paths.py"
    assert paths.read_text().splitlines()[1:] == ["LIBDIR = '/opt/sh/lib'",
                                                  "BINDIR = '/opt/sh/bin'"]
    r = subprocess.run([os.path.join(REPO, "mk", "install_python.sh")], cwd=REPO,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "usage" in r.stderr
