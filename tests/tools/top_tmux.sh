#!/usr/bin/env bash
# top_tmux.sh — drives stagehand-top's interactive screen inside tmux, against
# a publisher that uses the real telemetry API (test_telemetry in its
# STAGEHAND_TM_DEMO mode), and checks what a user would see: the process, the
# VRAM bar with its watermarks, the regions table, sorting, help, the picker,
# resizing, a process dying under it, stale segments and q.
#
# Usage: tests/tools/top_tmux.sh [BUILD_DIR]      (from the repository root)
# Prints cmocka-style summary lines, so tests/run.sh counts its checks.
# Segments go to a private directory, never /dev/shm; the tmux server is a
# private one (-L) and everything started here is stopped on exit.
set -u

build=${1:-build}
top="$PWD/$build/stagehand-top"
pub="$PWD/$build/tests/unit/test_telemetry"
work=$(mktemp -d /tmp/sh_top_tmux.XXXXXX)
sock="sh_top_test_$$"
pass=0
fail=0
pids=()

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
    tmux -L "$sock" kill-server 2>/dev/null
    for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

ok() { pass=$((pass + 1)); echo "[       OK ] $1"; }
bad() {
    fail=$((fail + 1))
    echo "[  FAILED  ] $1"
    [ -n "${2:-}" ] && printf '%s\n' "--- screen ---" "$2" "--------------"
}
check() { # description, command...
    local d=$1
    shift
    if "$@"; then ok "$d"; else bad "$d"; fi
}
finish() {
    echo "[==========] $((pass + fail)) test(s) run."
    echo "[  PASSED  ] $pass test(s)."
    [ "$fail" -gt 0 ] && echo "[  FAILED  ] $fail test(s), listed above."
    [ "$fail" -eq 0 ]
    exit $?
}

for f in "$top" "$pub"; do
    if [ ! -x "$f" ]; then
        bad "prerequisite: $f is built"
        finish
    fi
done
if ! command -v tmux >/dev/null; then
    bad "prerequisite: tmux is installed"
    finish
fi

export LANG=${LANG:-C.UTF-8}
tm() { tmux -u -L "$sock" "$@"; }
screen() { tm capture-pane -p -t "$1" 2>/dev/null; }

# wait_for SESSION REGEX [TENTHS]: until the screen matches (or time runs out)
wait_for() {
    local i
    for ((i = 0; i < ${3:-50}; i++)); do
        screen "$1" | grep -Eq -- "$2" && return 0
        sleep 0.1
    done
    return 1
}

# The first data row of the regions table (the line under ADDRESS).
first_row() { screen "$1" | grep -A1 'ADDRESS' | sed -n 2p; }

start_publisher() { # seconds -> sets $ppid_new once its segment exists
    STAGEHAND_TM_DEMO=$1 STAGEHAND_TM_DEMO_DIR="$work" "$pub" >"$work/pub.$RANDOM.log" 2>&1 &
    ppid_new=$!
    pids+=("$ppid_new")
    local i
    for ((i = 0; i < 100; i++)); do
        [ -e "$work/stagehand.$ppid_new" ] && return 0
        sleep 0.05
    done
    return 1
}

# ---- the live screen ------------------------------------------------------------
echo "[==========] stagehand-top in tmux"
start_publisher 90 || bad "demo publisher comes up"
p1=$ppid_new
sleep 0.6 # a few snapshots of history for the sparklines

tm new-session -d -s main -x 120 -y 40 \
    "$top --dir '$work' -d 0.2; echo \$? > '$work/exit.main'"
if wait_for main 'ADDRESS'; then ok "starts and draws within 5 s"; else bad "starts" "$(screen main)"; fi
s=$(screen main)
check "shows the process (pid $p1)" grep -q "pid $p1" <<<"$s"
check "shows the VRAM bar with low and high watermarks" grep -Eq 'VRAM.*\[.*L.*H.*\]' <<<"$s"
check "shows host pool bars" grep -Eq '256M *\[' <<<"$s"
check "shows H2D and D2H sparklines" grep -Eq 'H2D .*/s' <<<"$s"
check "shows the regions table header" grep -Eq 'ADDRESS +SIZE.*STATE.*EVICT' <<<"$s"
check "shows the step and phase" grep -Eq 'Step [0-9]+ +Phase [A-Z_]+' <<<"$s"
check "status line offers the keys" grep -Eq 'Help.*Sort:.*Pick.*Quit' <<<"$s"

# ---- sorting ---------------------------------------------------------------------
by_size=$(first_row main)
check "sorted by size: the largest region (3.0G) is first" grep -q '3.0G' <<<"$by_size"
tm send-keys -t main s
if wait_for main 'Sort:state'; then ok "s switches the sort to state"; else bad "s sorts by state" "$(screen main)"; fi
sleep 0.3
by_state=$(first_row main)
check "sorted by state: a HOST region comes first" grep -q 'HOST' <<<"$by_state"
check "the order changed" test "$by_state" != "$by_size"
tm send-keys -t main F6
if wait_for main 'Sort:evictions'; then ok "F6 switches the sort to evictions"; else bad "F6 sorts" "$(screen main)"; fi
sleep 0.3
ev=$(screen main | grep -A3 'ADDRESS' | sed -n '2,3p' | awk '{print $(NF-2)}')
check "sorted by evictions: descending" test "$(sort -rn <<<"$ev")" = "$ev"
tm send-keys -t main s
wait_for main 'Sort:size' >/dev/null

# ---- help and picker -------------------------------------------------------------
tm send-keys -t main h
if wait_for main 'sort regions'; then ok "h opens the help"; else bad "h opens help" "$(screen main)"; fi
tm send-keys -t main x
sleep 0.4
check "any key closes the help" bash -c "! grep -q 'sort regions' <<<\"\$1\"" _ "$(screen main)"
tm send-keys -t main p
if wait_for main 'pick a process'; then ok "p opens the picker"; else bad "p opens the picker" "$(screen main)"; fi
check "the picker lists the process as live" grep -Eq "$p1 +live" <<<"$(screen main)"
tm send-keys -t main Enter
if wait_for main 'ADDRESS'; then ok "Enter attaches from the picker"; else bad "Enter attaches" "$(screen main)"; fi

# ---- resizing --------------------------------------------------------------------
tm resize-window -t main -x 70 -y 22
if wait_for main 'VRAM' && wait_for main 'ADDRESS'; then ok "redraws at 70x22"; else bad "redraws at 70x22" "$(screen main)"; fi
check "nothing wider than 70 columns" bash -c "[ \$(printf '%s\n' \"\$1\" | wc -L) -le 70 ]" _ "$(screen main)"
tm resize-window -t main -x 40 -y 10
if wait_for main 'too small'; then ok "says when the terminal is too small"; else bad "too small" "$(screen main)"; fi
tm resize-window -t main -x 200 -y 50
if wait_for main 'RECENT EVENTS'; then ok "200x50 adds the events panel"; else bad "events panel" "$(screen main)"; fi

# ---- q ---------------------------------------------------------------------------
tm send-keys -t main q
for ((i = 0; i < 30; i++)); do [ -e "$work/exit.main" ] && break; sleep 0.1; done
check "q exits with status 0" test "$(cat "$work/exit.main" 2>/dev/null)" = 0

# ---- a process that dies under the screen ----------------------------------------
start_publisher 90 || bad "second publisher comes up"
p2=$ppid_new
tm new-session -d -s dying -x 120 -y 30 "$top --dir '$work' -p $p2 -d 0.2; sleep 5"
wait_for dying 'ADDRESS' >/dev/null
{
    kill -9 "$p2"
    wait "$p2"
} 2>/dev/null # no "Killed" job report
if wait_for dying 'STALE' 30; then ok "a killed process is shown as STALE"; else bad "killed process shown stale" "$(screen dying)"; fi
check "the segment of the killed process is left behind" test -e "$work/stagehand.$p2"

# ---- stale segments from the command line -----------------------------------------
out=$("$top" --dir "$work" -p "$p2" --once 2>&1)
rc=$?
check "--once on a stale segment exits 3" test "$rc" = 3
check "--once on a stale segment says stale" grep -q 'stale' <<<"$out"
check "--once on a stale segment shows no live data" bash -c "! grep -q ADDRESS <<<\"\$1\"" _ "$out"
"$top" --dir "$work" -p "$p2" --json >/dev/null 2>&1
check "--json on a stale segment exits 3" test $? = 3
json=$("$top" --dir "$work" --json 2>/dev/null)
check "--json picks the one live process" grep -q "\"pid\":$p1," <<<"$json"
if command -v python3 >/dev/null; then
    check "--json is valid JSON with the documented keys" python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert all(k in d for k in ("pid", "device", "vram", "host_pool", "counters", "regions"))
assert all(k in d["vram"] for k in ("used", "budget", "high", "low"))' "$json"
fi
check "--prometheus prints samples" grep -q "^stagehand_vram_used_bytes{pid=\"$p1\"}" <<<"$("$top" --dir "$work" --prometheus)"
check "--once prints the VRAM bar" grep -q 'VRAM' <<<"$("$top" --dir "$work" -p "$p1" --once)"
kill "$p1"
wait "$p1" 2>/dev/null
check "a publisher ended by SIGTERM removes its segment" test ! -e "$work/stagehand.$p1"
out=$("$top" --dir "$work" --once 2>&1)
rc=$?
check "no live process: exits 1" test "$rc" = 1
check "no live process: names the stale segment" grep -q "stagehand.$p2 is stale" <<<"$out"
check "--clean removes the stale segment" bash -c "\"\$1\" --dir \"\$2\" --clean | grep -q removed && [ ! -e \"\$2/stagehand.$p2\" ]" _ "$top" "$work"

# ---- usage -----------------------------------------------------------------------
"$top" --bogus >/dev/null 2>&1
check "an unknown option exits 2" test $? = 2
"$top" -d 0 >/dev/null 2>&1
check "a bad delay exits 2" test $? = 2
"$top" --once --json >/dev/null 2>&1
check "two output modes exit 2" test $? = 2
check "--help exits 0 and documents -p" bash -c "\"\$1\" --help | grep -q -- '-p, --pid'" _ "$top"

finish
