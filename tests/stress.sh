#!/usr/bin/env bash
# Runs the end-to-end data-loss programs RUNS times over (each under the
# library and with it disabled, as tests/run.sh does), to catch what fails
# once in many runs: races between the program's work and the library's
# moves. A failing run's whole output is kept in BUILD/stress/run-N.log.
# Usage: tests/stress.sh RUNS BUILD PROGRAM...
set -u
runs=$1 build=$2
shift 2
case $runs in '' | *[!0-9]*) echo "stress: RUNS must be a whole number, not '$runs'" >&2; exit 2 ;; esac
mkdir -p "$build/stress"
failed=0
for ((i = 1; i <= runs; i++)); do
    log="$build/stress/run-$i.log"
    BUILD=$build E2E="$*" tests/run.sh >"$log" 2>&1
    rc=$?
    echo "run $i/$runs: $(tail -n 1 "$log")"
    if [ "$rc" -ne 0 ]; then
        failed=$((failed + 1))
        grep -E '^failed: |\[  FAILED  \] [a-z]|timed out' "$log"
    else
        rm -f "$log"
    fi
done
echo "stress: $runs runs, $failed failed"
[ "$failed" -eq 0 ]
