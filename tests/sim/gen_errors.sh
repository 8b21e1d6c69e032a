#!/usr/bin/env bash
# Emits the name/value table of an error enum of a CUDA header, with a
# description derived from each name (the simulator overrides it where it
# knows the real text): CUDA_ERROR_LAUNCH_TIMEOUT -> "launch timeout",
# cudaErrorLaunchTimeout -> "launch timeout". The values come from the header
# itself: the table names the enumerators and the compiler fills them in.
# Usage: gen_errors.sh CC CUDA_INCLUDE HEADER ENUM_TAG TABLE_NAME
set -euo pipefail
cc=$1 inc=$2 header=$3 tag=$4 table=$5

names=$(printf '#include <%s>\n' "$header" | "$cc" -E -P -I"$inc" -x c - | tr '\n' ' ' |
    grep -oE "enum[[:space:]]+$tag[[:space:]]*\{[^}]*\}" | sed -n 1p |
    sed -E 's/^[^{]*\{//; s/\}$//' | tr ',' '\n' |
    sed -nE 's/^[[:space:]]*([A-Za-z_][A-Za-z0-9_]*).*/\1/p' || true)
if [ -z "$names" ]; then
    echo "gen_errors.sh: no enum $tag in $header" >&2
    exit 1
fi

echo "/* Generated from $header by gen_errors.sh; do not edit. */"
echo '#include "sim.h"'
echo
printf '#include <%s>\n\n' "$header"
echo "const struct sim_error_name $table[] = {"
for name in $names; do
    text=$(printf '%s\n' "$name" |
        sed -E 's/^CUDA_ERROR_//; s/^CUDA_//; s/^cudaError//; s/^cuda//' |
        sed -E 's/([a-z0-9])([A-Z])/\1 \2/g; s/([A-Z])([A-Z][a-z])/\1 \2/g; s/_/ /g' |
        tr '[:upper:]' '[:lower:]')
    printf '    {%s, "%s", "%s"},\n' "$name" "$name" "$text"
done
echo "};"
echo "const size_t ${table}_count = sizeof $table / sizeof *$table;"
