#!/usr/bin/env bash
# The Python package's tests (pytest), from the repository root, ending with
# the lines tests/run.sh counts. They need the built library, stagehand-sim
# and the simulated GPU in BUILD, and no GPU; the recorder's need PyTorch
# (CPU only: Debian's python3-torch).
# Usage: tests/python/run.sh [BUILD]   (PYTHON picks the interpreter)
set -u
build=${1:-${BUILD:-build}}
# Each test's host budget its own, whatever launcher runs this (tests/run.sh).
unset LOCAL_WORLD_SIZE WORLD_SIZE OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALNRANKS SLURM_NTASKS
if [ -n "${SAN:-}" ]; then
    # An instrumented library cannot be preloaded into an uninstrumented python.
    echo "python tests: skipped under SAN=$SAN"
    exit 0
fi
# The first python3 on PATH may be another installation without pytest or
# torch (pyenv, a venv); mk/prereqs.sh gives the system one what it needs:
# pytest, and PyTorch for the recorder's tests (tests/python/test_trace.py).
py=${PYTHON:-}
if [ -z "$py" ]; then
    for want in 'import pytest, torch' 'import pytest'; do
        for c in python3 /usr/bin/python3; do
            if "$c" -c "$want" >/dev/null 2>&1; then
                py=$c
                break 2
            fi
        done
    done
fi
if [ -z "$py" ]; then
    echo "python tests: no python3 with pytest here; run mk/prereqs.sh build (as root) or" \
        "apt-get install python3-pytest"
    exit 1
fi
export STAGEHAND_TEST_BUILD=$build PYTHONDONTWRITEBYTECODE=1
exec "$py" -m pytest -q -p no:cacheprovider tests/python
