#!/usr/bin/env bash
# make demo: an MLP training loop three times the size of a simulated
# 128 MB GPU, run without stagehand (out of memory) and with it (completes,
# with the same loss, to the bit, as a run on a card big enough).
# Usage: tests/demo/run.sh BUILD_DIR
set -uo pipefail
build=${1:-build}
export LD_LIBRARY_PATH="$PWD/$build/sim"
train="$build/demo/train"
vram=128
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== stagehand demo: a 48-layer MLP (~400 MB of weights, gradients and activations)"
echo "   on a simulated ${vram} MB GPU"
echo
echo "-- reference: the same program on a simulated 4 GB GPU, no stagehand"
SIMCUDA_VRAM_MB=4096 STAGEHAND_DISABLE=1 "$train" >"$tmp/ref" 2>&1 || { cat "$tmp/ref"; exit 1; }
grep '^step' "$tmp/ref"

echo
echo "-- run 1: ${vram} MB GPU, no stagehand"
SIMCUDA_VRAM_MB=$vram "$train" >"$tmp/plain" 2>&1
rc=$?
if [ "$rc" -eq 3 ]; then
    echo "   $(grep '^oom' "$tmp/plain")"
    echo "   => out of memory, as expected without stagehand"
else
    echo "   unexpected: exit $rc"; cat "$tmp/plain"; exit 1
fi

echo
echo "-- run 2: ${vram} MB GPU, LD_PRELOAD=libstagehand.so"
SIMCUDA_VRAM_MB=$vram LD_PRELOAD="$PWD/$build/libstagehand.so" "$train" >"$tmp/sh" 2>"$tmp/sh.err"
rc=$?
if [ "$rc" -ne 0 ]; then
    echo "   failed: exit $rc"; cat "$tmp/sh" "$tmp/sh.err"; exit 1
fi
grep '^step' "$tmp/sh"
if diff <(grep '^step' "$tmp/ref" | cut -d' ' -f1-5) <(grep '^step' "$tmp/sh" | cut -d' ' -f1-5) >/dev/null; then
    echo "   => losses identical to the reference, bit for bit"
else
    echo "   => LOSSES DIFFER from the reference"; exit 1
fi
echo
sed -n 's/^summary //p' "$tmp/sh" | tr ' ' '\n' | awk -F= '
    { v[$1] = $2 }
    END {
        printf "   step time            %s s (reference %s s)\n", v["step_s"], ref
        printf "   peak device memory   %s MB of a %s MB budget\n", v["peak_device_mb"], v["budget_mb"]
        printf "   device -> host       %s MB in %s evictions (%s unchanged: not copied)\n", v["d2h_mb"], v["evictions"], v["clean"]
        printf "   host -> device       %s MB in %s restores\n", v["h2d_mb"], v["restores"]
    }' ref="$(sed -n 's/.*step_s=\([^ ]*\).*/\1/p' "$tmp/ref")"
