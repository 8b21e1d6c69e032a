#!/usr/bin/env bash
# bench-policy.sh — compares the four policies on generated transformer
# training traces at 1.5x, 2x and 3x oversubscription over 25 GB/s PCIe,
# with the shipped stagehand.ini, and checks the targets at 2x:
#   learned within 1.10x of the lower bound, and 1.5x faster than reactive
# (and prints belady's distance to the bound beside them).
# Usage: tools/stagehand-sim/bench-policy.sh build/stagehand-sim
# docs/POLICY.md explains the model, the bound and the results.
set -euo pipefail

sim=${1:?usage: bench-policy.sh path/to/stagehand-sim}
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
