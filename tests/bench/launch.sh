#!/usr/bin/env bash
# make bench, part: instructions one launch costs, counted by callgrind
# (deterministic, unlike time on a shared machine). bench_launch's loop runs
# directly on the simulated driver and under the library; the library's cost
# is the difference, per launch. Three cases at each number of regions:
#   fits            the budget holds every region;
#   oversubscribed  the budget holds the loop's working set at half of it,
#                   everything else is on the host (the state a training
#                   step is in between its moves);
#   moving          the working set is twice the budget: every launch moves.
# The simulated copies' own instructions (copy_run) are left out: they stand
# for the copy engine, not for the CPU; so are the fingerprint kernel's and
# the pointer prefilter's (sh_clean_kernel_host, sh_clean_ptrs_host: the
# simulated card runs them on the CPU, a card on its SMs at memory speed),
# and the simulated driver's VMM calls' (its map is a sorted array, linear
# in the mappings: a stand-in for the real driver's cost, not the
# library's). Neither is the simulated CUPTI's dispatch of its callbacks
# (sim_api_enter and sim_api_exit: the callback record, with the current
# context looked up, then a mutex and a table per callback, four per launch)
# less the library's own callback: it stands for the real CUPTI's, which only
# a GPU can measure; shown on its own. The direct run's dispatch (nobody
# subscribed: a test and a return) is left out the same way. The scan of
# evicted bytes for pointers is CPU work per byte moved, on the pool's
# scanner thread (or on whoever needs its answer first): counted, and also
# shown on its own.
# Usage: tests/bench/launch.sh BUILD_DIR
set -euo pipefail
build=${1:-build}
launches=${LAUNCHES:-2000}
command -v valgrind >/dev/null || { echo "bench: valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
export LD_LIBRARY_PATH="$PWD/$build/sim" SIMCUDA_GRANULARITY_KB=64 SIMCUDA_VRAM_MB=2048 \
    SIMCUDA_HOST_MB=16384 STAGEHAND_BUDGET_HOST_RAM_BUDGET_MB=12288 \
    STAGEHAND_CONFIG=/dev/null STAGEHAND_REGIONS_MIN_REGION_KB=64 STAGEHAND_TELEMETRY_SHM_ENABLED=false
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The simulated CUPTI's dispatch, less the library's callback: callgrind
# stops counting inside sim_api_enter/sim_api_exit and counts again inside
# on_callback (the state is per thread). Names, not inclusive sums, because
# callgrind_annotate splits a function's inclusive cost over the spellings
# of its file name.
dispatch=(--toggle-collect='sim_api_e*' --toggle-collect=on_callback)
# The telemetry publisher's thread (pub_main) is left out too: it samples on
# a timer, so under callgrind, tens of times slower, it runs tens of times
# more often per launch than beside a card, and as often as the run's
# timing allows: counted, it moved the figures by about 70 from one run to
# the next. Left out, two runs count the same. The step and phase changes
# the launch thread tells it are counted.
quiet_threads=(--toggle-collect=pub_main)

# Ir of the instrumented loop less the simulated copies' own, and the scan's.
count() {
    local out="$tmp/cg.$1"
    shift
    valgrind --tool=callgrind --instr-atstart=no "${dispatch[@]}" "${quiet_threads[@]}" \
        --collect-atstart=yes \
        --callgrind-out-file="$out" "$@" \
        >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; echo "bench: $* failed" >&2; exit 1; }
    callgrind_annotate --inclusive=yes "$out" 2>/dev/null | awk '
        /PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
        / tests\/sim\/drv_(exec|copy).c:copy_run / { gsub(",", "", $1); copy += $1 }
        / clean\/hash.c:sh_clean_(kernel|ptrs)_host / { gsub(",", "", $1); copy += $1 }
        / tests\/sim\/drv_(mem|vmm).c:cuMem(Map|Unmap|SetAccess|Create|Release)(_v2)? / {
            gsub(",", "", $1); copy += $1 }
        / pool\/ptrscan.c:(sh_pool_scan_landed|scanner_main|sh_pool_scan_settle) / {
            gsub(",", "", $1); scan += $1 }
        END { print total - copy, scan + 0 }'
}

# Ir of the dispatch alone: the same toggles, counting off at the start.
count_dispatch() {
    local out="$tmp/cg.dispatch"
    valgrind --tool=callgrind --instr-atstart=no "${dispatch[@]}" --collect-atstart=no \
        --callgrind-out-file="$out" "$@" >"$tmp/log" 2>&1 ||
        { cat "$tmp/log" >&2; echo "bench: $* failed" >&2; exit 1; }
    callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}

bin="$build/tests/bench/bench_launch"
printf '%-8s %-15s %10s %10s %10s %12s\n' regions case direct lib added "(ptr scan)"
row() {
    awk -v n="$1" -v c="$2" -v d="$3" -v x="$4" -v s="$5" -v l="$launches" 'BEGIN {
        printf "%-8d %-15s %10.0f %10.0f %10.0f %12.0f\n", n, c, d / l, x / l, (x - d) / l, s / l }'
}
lib="$PWD/$build/libstagehand.so"
# 64 KB buffers, 32 in the working set: 2 MB.
for n in 100 1000 10000; do
    read -r d _ < <(count "d$n" "$bin" "$n" "$launches" 65536)
    read -r f fs < <(LD_PRELOAD="$lib" count "f$n" "$bin" "$n" "$launches" 65536)
    read -r k ks < <(STAGEHAND_TRACKING_MODE=hooks LD_PRELOAD="$lib" \
        count "k$n" "$bin" "$n" "$launches" 65536)
    read -r o os < <(STAGEHAND_BUDGET_VRAM_BUDGET_MB=4 \
        LD_PRELOAD="$lib" count "o$n" "$bin" "$n" "$launches" 65536)
    read -r m ms < <(STAGEHAND_BUDGET_VRAM_BUDGET_MB=1 \
        LD_PRELOAD="$lib" count "m$n" "$bin" "$n" "$launches" 65536)
    row "$n" fits "$d" "$f" "$fs"
    row "$n" "fits, hooks" "$d" "$k" "$ks"
    row "$n" oversubscribed "$d" "$o" "$os"
    row "$n" moving "$d" "$m" "$ms"
done
h=$(LD_PRELOAD="$lib" count_dispatch "$bin" 100 "$launches" 65536)
awk -v h="$h" -v l="$launches" 'BEGIN {
    printf "simulated CUPTI dispatch with the library subscribed, not counted above: %.0f per launch\n", h / l }'
