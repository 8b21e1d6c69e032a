#!/usr/bin/env bash
# make bench: each figure measured side by side in one run, through the
# library and directly on the simulated driver, printed with their ratio.
# Usage: tests/bench/run.sh BUILD_DIR
set -euo pipefail
build=${1:-build}
export LD_LIBRARY_PATH="$PWD/$build/sim"
direct=$("$build/tests/bench/bench_alloc")
lib=$(LD_PRELOAD="$PWD/$build/libstagehand.so" "$build/tests/bench/bench_alloc")
echo "alloc+free per call (ns)            direct   stagehand   ratio"
join <(sort <<<"$direct") <(sort <<<"$lib") | while read -r name d l; do
    awk -v n="$name" -v d="$d" -v l="$l" 'BEGIN { printf "%-34s %8.1f %10.1f %7.2fx\n", n, d, l, l / d }'
done
echo
echo "pool structures (ns per op; the malloc line is the baseline)"
"$build/tests/bench/bench_pool"
