#!/usr/bin/env bash
# Runs cmocka test programs from the repository root against the simulated
# GPU and prints one closing line: "tests: N passed, N failed".
# Usage: tests/run.sh PROGRAM...   (BUILD, TEST_TIMEOUT, TEST_JOBS, SAN, E2E,
# E2E_DRIVERS and WRAP from the environment)
set -u
build=${BUILD:-build}
timeout_s=${TEST_TIMEOUT:-300}
export LD_LIBRARY_PATH="$PWD/$build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STAGEHAND_TEST_BUILD="$build"
# A launcher's rank count would make every program's host budget one the
# user's processes share ([budget] host_ram_scope = auto), and so the
# programs running side by side here: each keeps its own.
unset LOCAL_WORLD_SIZE WORLD_SIZE OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALNRANKS SLURM_NTASKS
# Sanitizer runs: fail on the first report, and let the simulated GPU own SIGSEGV.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:allow_user_segv_handler=1:handle_segv=0:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp}

# End-to-end programs run twice: under the library, and with it disabled;
# WRAP (valgrind, say) goes in front of each. They come first, being the
# longest, so that the short programs fill in beside them.
runs=()
for e in ${E2E:-}; do
    runs+=("env LD_PRELOAD=$PWD/$build/libstagehand.so ${WRAP:+$WRAP }$e"
        "env STAGEHAND_DISABLE=1 LD_PRELOAD=$PWD/$build/libstagehand.so ${WRAP:+$WRAP }$e")
done
# E2E_DRIVERS: VERSION:PROGRAM pairs, run once more under the library with
# the simulated driver claiming that CUDA version.
for d in ${E2E_DRIVERS:-}; do
    runs+=("env SIMCUDA_DRIVER_VERSION=${d%%:*} LD_PRELOAD=$PWD/$build/libstagehand.so ${WRAP:+$WRAP }${d#*:}")
done
runs+=("$@")
export ASAN_OPTIONS="$ASAN_OPTIONS:verify_asan_link_order=0"

# Programs run TEST_JOBS at a time (default: one per core): each checks
# bytes, not time, and names its own files and segments by process id.
# Each one's output is printed whole when it ends.
jobs=${TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
case $jobs in '' | *[!0-9]* | 0)
    echo "tests/run.sh: TEST_JOBS=$jobs is not a positive count" >&2
    exit 2
    ;;
esac
outdir=$(mktemp -d "${TMPDIR:-/tmp}/stagehand-tests.XXXXXX") || exit 2
trap 'rm -rf "$outdir"' EXIT

# One program: its output, exit status and seconds go to $outdir/N.*.
run_one() {
    local n=$1 t=$2 start=$SECONDS rc
    # shellcheck disable=SC2086  # an entry may carry its environment
    timeout "$timeout_s" $t >"$outdir/$n.out" 2>&1
    rc=$?
    echo "$((SECONDS - start))" >"$outdir/$n.s"
    # Renamed into place last: a collect running meanwhile sees it whole or not at all.
    echo "$rc" >"$outdir/$n.rc.tmp" && mv "$outdir/$n.rc.tmp" "$outdir/$n.rc"
}

passed=0 failed=0 broken=() took=() shown=()
# Tallies and prints every program that has ended and is not yet shown.
collect() {
    local n t rc p f
    for n in "${!runs[@]}"; do
        if [ ! -e "$outdir/$n.rc" ] || [ -n "${shown[n]:-}" ]; then
            continue
        fi
        shown[n]=1
        t=${runs[n]}
        rc=$(cat "$outdir/$n.rc")
        took+=("$(cat "$outdir/$n.s") s  $t")
        cat "$outdir/$n.out"
        p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$outdir/$n.out" | awk '{s+=$1} END {print s+0}')
        f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$outdir/$n.out" | awk '{s+=$1} END {print s+0}')
        passed=$((passed + p))
        failed=$((failed + f))
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
            # Crashed, hung or a sanitizer report: count it as a failure.
            [ "$rc" -eq 124 ] && echo "$t: timed out after ${timeout_s}s"
            failed=$((failed + 1))
            broken+=("$t (exit $rc)")
        elif [ "$rc" -ne 0 ]; then
            broken+=("$t")
        fi
    done
}

running=0
for n in "${!runs[@]}"; do
    while [ "$running" -ge "$jobs" ]; do
        wait -n
        running=$((running - 1))
        collect
    done
    run_one "$n" "${runs[n]}" &
    running=$((running + 1))
done
wait
collect

for b in "${broken[@]+"${broken[@]}"}"; do
    echo "failed: $b"
done
# The slowest programs, for whoever keeps CI's time in check.
printf '%s\n' "${took[@]+"${took[@]}"}" | sort -rn | head -5 | sed 's/^/slowest: /'

echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
