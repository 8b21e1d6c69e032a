#!/usr/bin/env bash
# The interception table's header check: it passes on the table as shipped,
# and it fails, naming the function, when the table forgets one (here
# cuMemsetD32Async and its variants) or names one the headers lack.
set -euo pipefail
cc=${CC:-cc} inc=${CUDA_HOME:-/usr/local/cuda}/include
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 mk/gen_intercept.py --check "$cc" "$inc" interpose/intercept.def interpose/exports.map
grep -v '^wrap cuMemsetD32Async ' interpose/intercept.def >"$tmp/missing.def"
if python3 mk/gen_intercept.py --check "$cc" "$inc" "$tmp/missing.def" 2>"$tmp/err"; then
    echo "FAIL: a table without cuMemsetD32Async passed the header check" >&2
    exit 1
fi
grep -q 'cuMemsetD32Async_ptsz' "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
{ cat interpose/intercept.def; echo 'wrap cuNoSuchFunction none()'; } >"$tmp/extra.def"
if python3 mk/gen_intercept.py --check "$cc" "$inc" "$tmp/extra.def" 2>"$tmp/err"; then
    echo "FAIL: a table naming cuNoSuchFunction passed the header check" >&2
    exit 1
fi
grep -q 'cuNoSuchFunction' "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
echo "intercept_check: ok"
