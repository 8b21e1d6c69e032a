#!/usr/bin/env bash
# make install's part for the Python package: its source goes to
# PREFIX/share/stagehand/python, with stagehand/_paths.py naming PREFIX/lib
# and PREFIX/bin, where make install puts the library and stagehand-top.
# From there, `pip install PREFIX/share/stagehand/python` installs it for a
# Python (a venv, say), or PYTHONPATH=PREFIX/share/stagehand/python uses it
# as it is: no pip, no network, and no guess at which Python is meant.
# Usage: mk/install_python.sh DESTDIR PREFIX
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: mk/install_python.sh DESTDIR PREFIX" >&2; exit 2; }
destdir=$1 prefix=$2
dest=$destdir$prefix/share/stagehand/python
install -d "$dest/stagehand/trace"
install -m 0644 python/pyproject.toml "$dest/"
install -m 0644 python/stagehand/*.py "$dest/stagehand/"
install -m 0644 python/stagehand/trace/*.py "$dest/stagehand/trace/"
python3 - "$dest/stagehand/_paths.py" "$prefix" <<'PY'
import os, sys
path, prefix = sys.argv[1:]
with open(path, "w", encoding="utf-8") as f:
    f.write('"""Where make install put the library and the tools."""\n'
            "LIBDIR = %r\nBINDIR = %r\n" % (os.path.join(prefix, "lib"), os.path.join(prefix, "bin")))
PY
echo "Python package in $prefix/share/stagehand/python: pip install $prefix/share/stagehand/python" \
    "(or PYTHONPATH=$prefix/share/stagehand/python)"
