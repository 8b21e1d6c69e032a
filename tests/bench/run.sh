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
echo "CPU instructions per launch (callgrind; added = what the library costs)"
tests/bench/launch.sh "$build"
echo
echo "pool structures (ns per op; the malloc line is the baseline)"
"$build/tests/bench/bench_pool"
echo
echo "training steps on the simulated GPU (s per steady step; reactive is the baseline)"
out=$(STAGEHAND_TEST_BUILD="$build" LD_PRELOAD="$PWD/$build/libstagehand.so" \
    "$build/tests/e2e/test_e2e_learned" 2>/dev/null | sed -n 's/^learned_step_s=.*/&/p' || true)
[ -n "$out" ] || { echo "bench: test_e2e_learned printed no figures" >&2; exit 1; }
awk -v line="$out" 'BEGIN {
    n = split(line, kv, " ");
    for (i = 1; i <= n; i++) { split(kv[i], p, "="); v[p[1]] = p[2] }
    printf "reactive %.4f  lru %.4f  learned %.4f  learned/reactive %.3f\n",
        v["reactive_step_s"], v["lru_step_s"], v["learned_step_s"], v["ratio"];
    printf "stagehand-sim predicts reactive %.4f (%s off)  lru %.4f (%s off)  learned %.4f (%s off)\n",
        v["sim_reactive_step_s"], v["sim_reactive_error"], v["sim_lru_step_s"], v["sim_lru_error"],
        v["sim_learned_step_s"], v["sim_error"];
    printf "and, with a GPU'"'"'s memory reads and remaps, reactive %.4f  learned %.4f  learned/reactive %.3f\n",
        v["gpu_reactive_step_s"], v["gpu_learned_step_s"], v["gpu_ratio"];
    printf "learned with the shipped stagehand.ini %.4f, stagehand-sim predicts %.4f (%s off)\n",
        v["shipped_learned_step_s"], v["sim_shipped_step_s"], v["sim_shipped_error"] }'
echo
# A program that fits must run as if the library were not there: the demo's
# training program on a card it fills to about 93%, with and without it.
vram=416
fit_env=(env SIMCUDA_VRAM_MB=$vram STAGEHAND_CONFIG=/dev/null TRAIN_STEPS=3)
plain=$("${fit_env[@]}" STAGEHAND_DISABLE=1 "$build/demo/train" | sed -n 's/^summary //p')
with=$("${fit_env[@]}" LD_PRELOAD="$PWD/$build/libstagehand.so" "$build/demo/train" |
    sed -n 's/^summary //p')
[ -n "$plain" ] && [ -n "$with" ] || { echo "bench: the demo program did not finish" >&2; exit 1; }
echo "a program that fits (demo training, ${vram} MB card)   without   stagehand"
awk -v a="$plain" -v b="$with" -v vram="$vram" 'BEGIN {
    n = split(a, kv, " "); for (i = 1; i <= n; i++) { split(kv[i], p, "="); x[p[1]] = p[2] }
    n = split(b, kv, " "); for (i = 1; i <= n; i++) { split(kv[i], p, "="); y[p[1]] = p[2] }
    printf "peak device memory (%% of the card)            %6.1f   %9.1f\n",
        100 * x["peak_device_mb"] / vram, 100 * y["peak_device_mb"] / vram;
    printf "bytes moved d2h + h2d (MB)                     %6d   %9d\n", 0, y["d2h_mb"] + y["h2d_mb"];
    printf "step time (s)                                  %6.2f   %9.2f   ratio %.2fx\n",
        x["step_s"], y["step_s"], y["step_s"] / x["step_s"];
    if (y["d2h_mb"] + y["h2d_mb"] + y["evictions"] + y["restores"] > 0) {
        print "bench: stagehand moved memory for a program that fits" > "/dev/stderr"; exit 1 } }'
