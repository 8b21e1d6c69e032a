#!/usr/bin/env bash
# The real-GPU suite: what `make gpu-test` runs. See tests/gpu/README.md.
#
# Usage: tests/gpu/run.sh [--quick] [--short] [--part c|train|measure|all] [--detect]
#   --quick     the C scenarios and a 5-step PyTorch comparison only
#   --short     everything at smaller sizes, under a deadline (GPU_TEST_DEADLINE_S,
#               570 s): what a 15-minute device allowance holds, machine start
#               included. What the deadline cuts off is reported as skipped.
#               Sizes (each overridable): C_BUDGET_MB 2048, FP_MAX_MB 64,
#               BW_REPS 5, LAUNCH_N 50000, STRESS_OPS 100, TRAIN_BUDGET_MB 6144,
#               TRAIN_STEPS 4, TRAIN_ARGS --layers 12, TRAIN_TIMEOUT 150; the
#               bundled programs are used as they are (no rebuild), and the
#               trace of an oversubscribed run comes right after the C part
#   --detect    only say whether there is a usable GPU (always exits 0)
#   --part P    one part of the full run (each fits a 10-minute slot on an
#               H100): c (scenarios, copy bandwidth, launch cost), train
#               (losses against the reference in the three allocator modes,
#               the profiler run), measure (overhead when the model fits,
#               save_on_cpu, accelerate's cpu_offload, a recorded trace).
#               The results file is rebuilt from every part present.
#
# Environment (defaults in brackets):
#   BUILD [build], CUDA_HOME [/usr/local/cuda], NVCC, PYTHON [python3]
#   STAGEHAND_LIB     a prebuilt libstagehand.so to use instead of building one
#   C_BUDGET_MB       the library's budget in the C scenarios [4096]
#   TRAIN_BUDGET_MB   the budget for the oversubscribed training runs [12288]
#   TRAIN_STEPS       [20; 5 with --quick]     TRAIN_ARGS  extra train_gpt.py flags
#   TRAIN_TIMEOUT     seconds per training run [540]
#   TRAIN_MODES       allocator modes to oversubscribe [default async pluggable expandable]
#   GPU_TEST_RESUME   1: keep what an earlier, interrupted run of the same part
#                     finished (its exit status 0) and run only the rest
#   GPU_TEST_REQUIRE  1: fail, instead of skipping, when no GPU can be used
#   GPU_TEST_DEADLINE_S  seconds after which no new program starts [none; 570 with --short]
#
# Without a GPU it prints "gpu-test: no GPU here; skipped" and exits 0.
# Results: $BUILD/gpu/results/results.md (for docs/BENCHMARKS.md) and the
# logs beside it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

build=${BUILD:-build}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
nvcc=${NVCC:-$cuda_home/bin/nvcc}
py=${PYTHON:-python3}
quick=0
short=0
part=all
detect=0
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --short) short=1 ;;
    --detect) detect=1 ;;
    --part)
        [ $# -ge 2 ] || {
            echo "run.sh: --part needs c, train, measure or all" >&2
            exit 2
        }
        part=$2
        shift
        ;;
    --part=*) part=${1#--part=} ;;
    -h | --help)
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
        exit 0
        ;;
    *)
        echo "run.sh: unknown argument '$1' (see --help)" >&2
        exit 2
        ;;
    esac
    shift
done
case "$part" in
c | train | measure | all) ;;
*)
    echo "run.sh: --part must be c, train, measure or all" >&2
    exit 2
    ;;
esac

if [ "$short" = 1 ]; then
    : "${C_BUDGET_MB:=2048}" "${TRAIN_BUDGET_MB:=6144}" "${TRAIN_STEPS:=4}"
    : "${TRAIN_ARGS:=--layers 12}" "${TRAIN_TIMEOUT:=150}" "${GPU_TEST_DEADLINE_S:=570}"
    export FP_MAX_MB=${FP_MAX_MB:-64} BW_REPS=${BW_REPS:-5} LAUNCH_N=${LAUNCH_N:-50000}
    export STRESS_OPS=${STRESS_OPS:-100}
fi
deadline=${GPU_TEST_DEADLINE_S:-0}
skipped=()

gpu_dir=$build/gpu
res=$gpu_dir/results
here=$PWD
started=$(date +%s)

# ---- is there a GPU? --------------------------------------------------------
listed=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    listed="nvidia-smi"
elif [ -e /dev/nvidia0 ]; then
    listed="/dev/nvidia0"
fi
if [ -z "$listed" ]; then
    echo "gpu-test: no GPU here; skipped"
    [ "$detect" = 0 ] && [ "${GPU_TEST_REQUIRE:-0}" = 1 ] && exit 1
    exit 0
fi
mkdir -p "$gpu_dir"
if ! "${CC:-cc}" -std=c11 -O2 -o "$gpu_dir/probe" tests/gpu/probe.c -ldl 2>"$gpu_dir/probe.err"; then
    echo "gpu-test: cannot build the GPU probe:" >&2
    cat "$gpu_dir/probe.err" >&2
    exit 1
fi
if ! probe=$("$gpu_dir/probe"); then
    echo "gpu-test: a GPU is listed ($listed) but the driver cannot use it: $probe; skipped"
    [ "$detect" = 0 ] && [ "${GPU_TEST_REQUIRE:-0}" = 1 ] && exit 1
    exit 0
fi
if [ "$detect" = 1 ]; then
    echo "gpu-test: $probe; 'make gpu-test' runs the suite"
    exit 0
fi
echo "gpu-test: $probe"

# ---- build ----------------------------------------------------------------------
if [ -n "${STAGEHAND_LIB:-}" ]; then
    lib=$(realpath "$STAGEHAND_LIB")
    lib_from="STAGEHAND_LIB"
elif [ -f "$gpu_dir/lib/BUNDLE" ]; then
    lib=$here/$gpu_dir/lib/libstagehand.so
    lib_from="bundle: $(head -2 "$gpu_dir/lib/BUNDLE" | tr '\n' ' ')"
else
    echo "gpu-test: building the library"
    make --no-print-directory BUILD="$build" CUDA_HOME="$cuda_home" "$build/libstagehand.so"
    lib=$here/$build/libstagehand.so
    lib_from="built here"
fi
[ -f "$lib" ] || {
    echo "gpu-test: $lib not found" >&2
    exit 1
}
lib_dir=$(dirname "$lib")
export LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$lib" | grep -q "not found"; then
    echo "gpu-test: $lib cannot be loaded here:" >&2
    ldd "$lib" | grep "not found" >&2
    echo "gpu-test: build it where its prerequisites are and bring it with" \
        "'make gpu-bundle' (then carry $gpu_dir)" >&2
    exit 1
fi
if [ "$short" = 1 ] && [ -x "$gpu_dir/oversub" ]; then
    echo "gpu-test: using the programs already in $gpu_dir"
elif command -v "$nvcc" >/dev/null 2>&1; then
    echo "gpu-test: building the programs for ${GPU_ARCH:-sm_90}"
    make --no-print-directory BUILD="$build" CUDA_HOME="$cuda_home" NVCC="$nvcc" gpu-build
elif [ -x "$gpu_dir/oversub" ]; then
    echo "gpu-test: no nvcc here; using the programs already in $gpu_dir"
else
    echo "gpu-test: no nvcc ($nvcc) and no programs in $gpu_dir" >&2
    exit 1
fi
echo "gpu-test: library $lib ($lib_from)"

cupti=""
for d in "$cuda_home/lib64" "$cuda_home/extras/CUPTI/lib64" "$cuda_home/targets/x86_64-linux/lib"; do
    if [ -e "$d/libcupti.so.13" ]; then
        cupti=$d/libcupti.so.13
        break
    fi
done

# ---- the record of this machine --------------------------------------------------
mkdir -p "$res"
meta=$res/meta.txt
{
    echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host=$(uname -n)"
    echo "kernel=$(uname -r)"
    echo "probe=$probe"
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "gpu=$(nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader 2>/dev/null | head -1)"
        echo "driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
    fi
    echo "nvcc=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([^,]*\),.*/\1/p')"
    echo "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1) x $(nproc)"
    echo "ram_gb=$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)"
    echo "python=$("$py" --version 2>&1)"
    echo "torch=$("$py" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null || echo none)"
    echo "accelerate=$("$py" -c 'import accelerate; print(accelerate.__version__)' 2>/dev/null || echo none)"
    if commit=$(git rev-parse --short HEAD 2>/dev/null); then
        git diff --quiet HEAD 2>/dev/null || commit="$commit (with local changes)"
    else
        commit=unknown
    fi
    echo "commit=$commit"
    echo "library=$lib_from"
    echo "cupti=${cupti:-default}"
} >"$meta"
echo "quick=$quick" >"$res/mode.txt"

failed=()
last_skipped=0
# A failure; not one when the run it names was cut by the deadline (its
# caller sees that run fail, and says so through here).
note_fail() {
    if [ "$last_skipped" = 1 ]; then
        last_skipped=0
        return 0
    fi
    failed+=("$1")
    echo "   => FAILED: $1"
}

deadline_skip() {
    skipped+=("$1")
    last_skipped=1
    echo "   skipped: the deadline"
}

resume=${GPU_TEST_RESUME:-0}

# within LIMIT: LIMIT cut to what the deadline leaves (printed), or nothing
# and status 1 when too little is left to start another program.
within() {
    local limit=$1 left
    if [ "$deadline" -le 0 ]; then
        echo "$limit"
        return 0
    fi
    left=$((deadline - ($(date +%s) - started) - 15))
    [ "$left" -ge 20 ] || return 1
    [ "$left" -lt "$limit" ] && limit=$left
    echo "$limit"
}

# done_before DIR NAME: with GPU_TEST_RESUME=1, NAME already passed
done_before() {
    [ "$resume" = 1 ] && [ "$(cat "$res/$1/$2.rc" 2>/dev/null)" = 0 ]
}

# run_c NAME TIMEOUT COMMAND... : one C scenario; its log is $res/c/NAME.log
run_c() {
    local name=$1 limit=$2 rc
    shift 2
    local log=$res/c/$name.log
    echo "-- $name"
    last_skipped=0
    if done_before c "$name"; then
        echo "   kept from the earlier run"
        return 0
    fi
    if ! limit=$(within "$limit"); then
        deadline_skip "c/$name"
        return 0
    fi
    set +e
    timeout "$limit" "$@" >"$log" 2>&1
    rc=$?
    set -e
    echo "$rc" >"$res/c/$name.rc"
    grep -E '^(PASS|FAIL|  )' "$log" | sed 's/^/   /' || true
    if [ "$rc" -ne 0 ] || ! grep -q '^PASS' "$log"; then
        grep -q '^FAIL' "$log" || tail -n 15 "$log" | sed 's/^/   | /'
        [ "$rc" -eq 124 ] && echo "   timed out after ${limit}s"
        note_fail "$name (exit $rc)"
    fi
}

bin=$gpu_dir
c_budget=${C_BUDGET_MB:-4096}
lib_env=(env LD_PRELOAD="$lib" STAGEHAND_BUDGET_VRAM_BUDGET_MB="$c_budget")
[ -n "$cupti" ] && lib_env+=(STAGEHAND_TRACKING_CUPTI_PATH="$cupti")

# ---- part c: the scenarios, copy bandwidth, launch cost --------------------------
part_c() {
    [ "$resume" = 1 ] || rm -rf "$res/c"
    mkdir -p "$res/c"
    echo "== C scenarios (library budget ${c_budget} MB)"
    run_c host_vmm 120 "$bin/host_vmm"
    run_c fingerprint 120 "$bin/fingerprint"
    run_c oversub-plain 300 env OVERSUB_TOTAL_MB=$((3 * c_budget)) "$bin/oversub"
    run_c oversub 600 "${lib_env[@]}" "$bin/oversub"
    local d1 d2
    d1=$(sed -n 's/^RESULT oversub .*digest=\([0-9a-f]*\).*/\1/p' "$res/c/oversub-plain.log" \
        2>/dev/null || true)
    d2=$(sed -n 's/^RESULT oversub .*digest=\([0-9a-f]*\).*/\1/p' "$res/c/oversub.log" \
        2>/dev/null || true)
    if [ -n "$d1" ] && [ "$d1" = "$d2" ]; then
        echo "   digests agree with and without the library: $d1"
    else
        note_fail "oversub digest: '$d1' without the library, '$d2' with it"
    fi
    run_c pointer_table 300 "${lib_env[@]}" "$bin/pointer_table"
    run_c past_budget 300 "${lib_env[@]}" "$bin/past_budget"
    run_c stress 600 "${lib_env[@]}" "$bin/stress"
    if [ "$quick" = 0 ]; then
        run_c pointer_table-plain 120 "$bin/pointer_table"
        run_c past_budget-plain 120 env PAST_TOTAL_MB=$((3 * c_budget / 2)) "$bin/past_budget"
        run_c stress-plain 300 "$bin/stress"
    fi
    run_c tracking-cupti 300 "${lib_env[@]}" "$bin/tracking" cupti
    run_c tracking-hooks 300 "${lib_env[@]}" STAGEHAND_TRACKING_MODE=hooks "$bin/tracking" hooks
    run_c tracking-subscriber 300 "${lib_env[@]}" "$bin/tracking" subscriber
    if [ "$quick" = 0 ]; then
        echo "== measurements"
        run_c remap 120 "$bin/bandwidth" remap
        run_c bandwidth 300 "$bin/bandwidth" copy
        run_c launch-plain 120 "$bin/bandwidth" launch
        run_c launch-cupti 120 "${lib_env[@]}" "$bin/bandwidth" launch
        run_c launch-hooks 120 "${lib_env[@]}" STAGEHAND_TRACKING_MODE=hooks "$bin/bandwidth" launch
    fi
}

# ---- PyTorch ------------------------------------------------------------------------
torch_ok() {
    "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1
}

train_steps=${TRAIN_STEPS:-$([ "$quick" = 1 ] && echo 5 || echo 20)}
train_budget=${TRAIN_BUDGET_MB:-12288}
train_timeout=${TRAIN_TIMEOUT:-540}
det=strict
[ -f "$res/determinism.txt" ] && det=$(cat "$res/determinism.txt")

# run_py DIR NAME [env VAR=...] -- ARGS... : one train_gpt.py run
run_py() {
    local dir=$1 name=$2 rc
    shift 2
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
        envs+=("$1")
        shift
    done
    shift
    local out=$res/$dir/$name.jsonl
    echo "-- $dir/$name"
    last_skipped=0
    if done_before "$dir" "$name"; then
        echo "   kept from the earlier run"
        return 0
    fi
    local limit
    if ! limit=$(within "$train_timeout"); then
        deadline_skip "$dir/$name"
        return 3
    fi
    set +e
    # shellcheck disable=SC2086  # TRAIN_ARGS is a list of flags
    timeout "$limit" env PYTHONUNBUFFERED=1 "${envs[@]}" "$py" tests/gpu/train_gpt.py \
        --steps "$train_steps" --deterministic "$det" --label "$name" --out "$out" \
        ${TRAIN_ARGS:-} "$@" >"$res/$dir/$name.log" 2>&1
    rc=$?
    set -e
    echo "$rc" >"$res/$dir/$name.rc"
    grep -E '"(error|skipped)"' "$res/$dir/$name.log" | sed 's/^/   /' || true
    sed -n 's/^{"summary": \(.*\)}$/\1/p' "$out" 2>/dev/null |
        "$py" -c 'import json, sys
for line in sys.stdin:
    s = json.loads(line)
    sh = s.get("sh") or {}
    mb = lambda v: "-" if v is None else "%.1f GB" % (v / 2**30)
    print("   %d steps, median %.3f s, peak allocated %s, device use +%s, evictions %s, restores %s"
          % (s["steps"], s["median_step_s"] or 0, mb(s.get("max_allocated")),
             mb(s.get("device_used_peak_delta")), sh.get("evictions", "-"), sh.get("restores", "-")))' ||
        true
    if [ "$rc" -ne 0 ]; then
        tail -n 5 "$res/$dir/$name.log" | sed 's/^/   | /'
        [ "$rc" -eq 124 ] && echo "   timed out after ${train_timeout}s"
    fi
    return "$rc"
}

# compare REF RUN [TOLERANCE [STEPS]]: losses of two runs (all the reference's
# steps unless STEPS is given)
compare() {
    local args=(--compare "$1" "$2")
    [ -n "${3:-}" ] && args+=(--tolerance "$3")
    [ -n "${4:-}" ] && args+=(--compare-steps "$4")
    "$py" tests/gpu/train_gpt.py "${args[@]}" | sed -n 's/^compare: /   /p'
    return "${PIPESTATUS[0]}"
}

# The CUPTI that PyTorch itself loads (the profiler's): the library must
# use that one, never a second copy.
torch_cupti=$("$py" -c 'import glob, os, sys
for p in sys.path:
    for f in sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib", "libcupti.so.13")) +
                    glob.glob(os.path.join(p, "nvidia", "cuda_cupti", "lib", "libcupti.so.13"))):
        print(os.path.realpath(f)); sys.exit(0)' 2>/dev/null || true)
cupti_py=()
[ -n "$torch_cupti" ] && cupti_py=(STAGEHAND_TRACKING_CUPTI_PATH="$torch_cupti")
with_lib_py=(LD_PRELOAD="$lib" STAGEHAND_BUDGET_VRAM_BUDGET_MB="$train_budget" "${cupti_py[@]}")

part_train() {
    if [ "$resume" != 1 ]; then
        rm -rf "$res/train" "$res/determinism.txt" "$res/tolerance.txt"
        det=strict
    fi
    mkdir -p "$res/train"
    echo "== PyTorch: losses under a ${train_budget} MB budget against the reference ($train_steps steps)"
    local rc=0 tol=""
    run_py train ref -- || rc=$?
    if [ "$rc" -eq 4 ]; then
        echo "   an operation has no deterministic implementation: falling back to" \
            "--deterministic warn, and comparing within a tolerance"
        det=warn
        rc=0
        run_py train ref -- || rc=$?
        if [ "$rc" -eq 0 ]; then
            run_py train ref2 -- || true
        fi
    fi
    echo "$det" >"$res/determinism.txt"
    if [ "$rc" -ne 0 ]; then
        note_fail "train/ref (exit $rc): the reference did not run"
        return
    fi
    if [ "$det" = warn ] && [ -f "$res/tolerance.txt" ]; then
        tol=$(cat "$res/tolerance.txt")
    elif [ "$det" = warn ]; then
        # Four times what two references without the library already differ
        # by, and at least TRAIN_TOLERANCE.
        tol=$("$py" tests/gpu/report.py --tolerance "$res/train/ref.jsonl" \
            "$res/train/ref2.jsonl" "${TRAIN_TOLERANCE:-0.005}")
        echo "$tol" >"$res/tolerance.txt"
        echo "   tolerance: relative loss difference up to $tol"
    fi
    local modes
    read -r -a modes <<<"${TRAIN_MODES:-default async pluggable expandable}"
    [ "$quick" = 1 ] && modes=(default)
    local mode envs
    for mode in "${modes[@]}"; do
        # async: train_gpt.py sets the backend in the variable the installed
        # PyTorch reads (the stagehand package's rule), so none is set here.
        envs=("${with_lib_py[@]}")
        if run_py train "oversub-$mode" "${envs[@]}" -- --allocator "$mode"; then
            compare "$res/train/ref.jsonl" "$res/train/oversub-$mode.jsonl" "$tol" ||
                note_fail "train/oversub-$mode: losses differ from the reference"
        else
            note_fail "train/oversub-$mode (exit $(cat "$res/train/oversub-$mode.rc" 2>/dev/null))"
        fi
    done
    if [ "$quick" = 0 ]; then
        echo "== PyTorch under torch.profiler: the library must fall back to its hooks"
        if run_py train profiler "${with_lib_py[@]}" -- --profiler --steps 3; then
            compare "$res/train/ref.jsonl" "$res/train/profiler.jsonl" "$tol" 3 ||
                note_fail "train/profiler: losses differ from the reference"
        else
            note_fail "train/profiler (exit $(cat "$res/train/profiler.rc" 2>/dev/null))"
        fi
        echo "== torch.profiler over steps 2-3 only: CUPTI handed over in mid-training"
        if run_py train profiler-window "${with_lib_py[@]}" -- --profiler-window 2:4 \
            --steps 6; then
            compare "$res/train/ref.jsonl" "$res/train/profiler-window.jsonl" "$tol" 6 ||
                note_fail "train/profiler-window: losses differ from the reference"
        else
            note_fail "train/profiler-window (exit $(cat "$res/train/profiler-window.rc" 2>/dev/null))"
        fi
        # cuDNN's autotuner times its algorithms and may pick others from run
        # to run, so these two compare within a tolerance whatever det is.
        echo "== cuDNN benchmark mode, async backend (cudaMemGetInfo's invariants)"
        local cudnn_tol=${tol:-${TRAIN_TOLERANCE:-0.005}}
        if run_py train ref-cudnn -- --cudnn-benchmark --steps 6 &&
            run_py train oversub-cudnn "${with_lib_py[@]}" -- --cudnn-benchmark \
                --allocator async --steps 6; then
            compare "$res/train/ref-cudnn.jsonl" "$res/train/oversub-cudnn.jsonl" \
                "$cudnn_tol" ||
                note_fail "train/oversub-cudnn: losses differ from ref-cudnn"
        else
            note_fail "train/ref-cudnn or oversub-cudnn failed (see their logs)"
        fi
    fi
}

part_measure() {
    [ "$resume" = 1 ] || [ "$traced" = 1 ] || rm -rf "$res/measure" "$res/trace"
    mkdir -p "$res/measure" "$res/trace"
    echo "== PyTorch measurements ($train_steps steps each)"
    local i
    for i in 1 2; do # alternated, so drift hits both sides alike
        run_py measure "fit-plain-$i" -- || note_fail "measure/fit-plain-$i"
        run_py measure "fit-lib-$i" LD_PRELOAD="$lib" "${cupti_py[@]}" -- ||
            note_fail "measure/fit-lib-$i"
    done
    # The same pair with PyTorch's cudaMallocAsync backend, which the launcher
    # sets: every tensor is an allocation the library sees.
    run_py measure fit-plain-async -- --allocator async || note_fail "measure/fit-plain-async"
    run_py measure fit-lib-async LD_PRELOAD="$lib" "${cupti_py[@]}" -- --allocator async ||
        note_fail "measure/fit-lib-async"
    if [ -f "$res/measure/fit-lib-1.jsonl" ]; then
        compare "$res/measure/fit-plain-1.jsonl" "$res/measure/fit-lib-1.jsonl" \
            "$(cat "$res/tolerance.txt" 2>/dev/null)" ||
            note_fail "measure/fit-lib-1: losses differ"
    fi
    run_py measure save-on-cpu -- --save-on-cpu || note_fail "measure/save-on-cpu"
    run_py measure accelerate -- --accelerate-offload || note_fail "measure/accelerate"
    [ "$traced" = 1 ] || trace_run
}

# The library's access trace and telemetry of a 3-step oversubscribed run:
# what a real program does, kept for stagehand-sim and the recorder's tests.
traced=0
trace_run() {
    mkdir -p "$res/measure" "$res/trace"
    echo "-- a trace of the oversubscribed run (3 steps)"
    run_py measure trace-run "${with_lib_py[@]}" \
        STAGEHAND_DEBUG_TRACE_FILE="$here/$res/trace/stagehand.trace" \
        STAGEHAND_TELEMETRY_TELEMETRY_FILE="$here/$res/trace/telemetry.jsonl" \
        -- --steps 3 || note_fail "measure/trace-run"
    find "$res/trace" -type f -printf '   %s bytes  %p\n'
    traced=1
}

if [ "$part" = all ] || [ "$part" = c ]; then
    part_c
fi
if [ "$part" = all ] || [ "$part" = train ] || [ "$part" = measure ]; then
    if torch_ok; then
        if [ "$short" = 1 ] && [ "$part" = all ]; then
            # --short: the trace first, before the deadline can cut it
            [ "$resume" = 1 ] || rm -rf "$res/measure" "$res/trace"
            trace_run
        fi
        [ "$part" = measure ] || part_train
        if [ "$quick" = 0 ] && [ "$part" != train ]; then
            part_measure
        fi
    else
        echo "== PyTorch: torch with CUDA is not importable by $py; training runs skipped"
        [ "${GPU_TEST_REQUIRE:-0}" = 1 ] && note_fail "PyTorch not available"
    fi
fi

echo "== results"
if [ ${#skipped[@]} -gt 0 ]; then
    printf '%s\n' "${skipped[@]}" >"$res/skipped.txt"
else
    rm -f "$res/skipped.txt"
fi
set +e
"$py" tests/gpu/report.py --results "$res" --out "$res/results.md"
report_rc=$?
set -e
[ "$report_rc" -ne 0 ] && note_fail "report: a check in results.md failed"
echo "   $res/results.md"
echo "   ($(($(date +%s) - started)) s)"

for f in "${skipped[@]+"${skipped[@]}"}"; do
    echo "skipped (deadline): $f"
done
for f in "${failed[@]+"${failed[@]}"}"; do
    echo "failed: $f"
done
if [ ${#failed[@]} -eq 0 ] && [ ${#skipped[@]} -gt 0 ]; then
    echo "gpu-test: what ran passed; ${#skipped[@]} cut by the deadline (not the whole suite)"
elif [ ${#failed[@]} -eq 0 ]; then
    echo "gpu-test: passed"
else
    echo "gpu-test: ${#failed[@]} failed"
    exit 1
fi
