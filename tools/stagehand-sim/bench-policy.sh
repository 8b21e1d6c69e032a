#!/usr/bin/env bash
# bench-policy.sh — compares the four policies on generated transformer
# training traces at 1.5x, 2x and 3x oversubscription over 25 GB/s PCIe,
# with the shipped stagehand.ini, and checks the targets at 2x:
#   learned within 1.10x of the lower bound, and 1.5x faster than reactive
# (and prints belady's distance to the bound beside them). Then the same for
# the traces recorded from real models (tools/stagehand-sim/traces), with
# issue 19's targets at 2x: learned within 5% of belady, 1.25x faster than
# reactive, at most 2% slower than lru.
# Usage: tools/stagehand-sim/bench-policy.sh build/stagehand-sim
# docs/POLICY.md explains the model, the bound and the results.
set -euo pipefail

sim=${1:?usage: bench-policy.sh path/to/stagehand-sim}
traces=${BENCH_TRACES:-$(dirname "$0")/traces}
config=${BENCH_CONFIG:-stagehand.ini}
common=(--gen --blocks 24 --weight-mb 200 --act-mb 150 --grad-mb 200 --compute-ms 8 --steps 6
    --pcie-gbps 25 --duplex full --config "$config" --header)

shapes=("full fine-tune|"
    "full fine-tune, checkpointing|--checkpointing"
    "LoRA|--lora"
    "LoRA, checkpointing|--lora --checkpointing")

# target_line NAME OUTPUT: the 2x targets of one shape, and how far the
# belady oracle itself is from the bound.
target_line() {
    local learned reactive belady
    learned=$(printf '%s\n' "$2" | sed -n 's/^policy=learned step_s=\([0-9.]*\) .* ratio=\([0-9.]*\) .*/\1 \2/p')
    reactive=$(printf '%s\n' "$2" | sed -n 's/^policy=reactive step_s=\([0-9.]*\) .*/\1/p')
    belady=$(printf '%s\n' "$2" | sed -n 's/^policy=belady .* ratio=\([0-9.]*\) .*/\1/p')
    awk -v n="$1" -v l="$learned" -v r="$reactive" -v b="$belady" 'BEGIN {
        split(l, a, " ");
        speed = r / a[1];
        bound = "misses"; if (a[2] + 0 <= 1.10) bound = "meets";
        fast = "misses"; if (speed >= 1.5) fast = "meets";
        printf "target at 2x, %s: learned/lower_bound=%.3f (%s 1.10) speedup_vs_reactive=%.2f (%s 1.5) belady/lower_bound=%.3f\n",
            n, a[2], bound, speed, fast, b }'
}

summary=()
for shape in "${shapes[@]}"; do
    name=${shape%%|*}
    read -r -a extra <<<"${shape#*|}"
    for oversub in 1.5 2.0 3.0; do
        echo "## $name, oversubscription ${oversub}x"
        out=$("$sim" "${common[@]}" "${extra[@]+"${extra[@]}"}" --oversub "$oversub")
        printf '%s\n' "$out"
        [ "$oversub" = 2.0 ] || continue
        summary+=("$(target_line "$name" "$out")")
    done
done
echo "## targets"
printf '%s\n' "${summary[@]}"

# real_line NAME OUTPUT: a recorded model's 2x figures against the targets.
real_line() {
    local step
    step() { printf '%s\n' "$2" | sed -n "s/^policy=$1 step_s=\([0-9.]*\) .*/\1/p"; }
    awk -v n="$1" -v l="$(step learned "$2")" -v r="$(step reactive "$2")" \
        -v u="$(step lru "$2")" -v b="$(step belady "$2")" \
        -v lb="$(printf '%s\n' "$2" | sed -n 's/^policy=learned .* lower_bound_s=\([0-9.]*\) .*/\1/p')" 'BEGIN {
        vb = l / b; vr = r / l; vu = l / u;
        printf "real model at 2x, %s: learned/belady=%.3f (%s 1.05) speedup_vs_reactive=%.2f (%s 1.25) learned/lru=%.3f (%s 1.02) learned/lower_bound=%.3f belady/lower_bound=%.3f\n",
            n, vb, (vb <= 1.05 ? "meets" : "misses"), vr, (vr >= 1.25 ? "meets" : "misses"),
            vu, (vu <= 1.02 ? "meets" : "misses"), l / lb, b / lb }'
}

# Traces recorded from real models (shapes only, on the meta device, with an
# RTX 4090's roofline: tools/stagehand-sim/traces/README.md).
real=()
for trace in "$traces"/*.trace.gz; do
    [ -e "$trace" ] || continue
    name=$(basename "$trace" .trace.gz)
    for oversub in 1.5 2.0 3.0; do
        echo "## recorded $name, oversubscription ${oversub}x"
        out=$("$sim" --trace "$trace" --pcie-gbps 25 --duplex full --config "$config" --header \
            --oversub "$oversub")
        printf '%s\n' "$out"
        [ "$oversub" = 2.0 ] || continue
        real+=("$(real_line "$name" "$out")")
    done
done
if [ ${#real[@]} -gt 0 ]; then
    echo "## targets on recorded models"
    printf '%s\n' "${real[@]}"
fi

# The same at 2x with drain_mode = tracked, whose remap windows wait only
# for the streams that used the regions moved, not for copies in flight.
tracked=$(mktemp)
trap 'rm -f "$tracked"' EXIT
sed 's/^drain_mode *=.*/drain_mode = tracked/' "$config" >"$tracked"
grep -q '^drain_mode = tracked' "$tracked" || printf '[transfer]\ndrain_mode = tracked\n' >>"$tracked"
common=("${common[@]/#$config/$tracked}")
echo "## targets with drain_mode = tracked"
for shape in "${shapes[@]}"; do
    name=${shape%%|*}
    read -r -a extra <<<"${shape#*|}"
    target_line "$name" "$("$sim" "${common[@]}" "${extra[@]+"${extra[@]}"}" --oversub 2.0)"
done
