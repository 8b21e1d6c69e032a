#!/usr/bin/env bash
# Emits a weak stub for every function a CUDA header declares, so that a call
# the simulated GPU does not implement is refused loudly instead of failing to
# link or load. Real definitions elsewhere in the library override the stubs;
# simcuda_stub_NAME stays the stub, so cuGetProcAddress can tell the two apart.
# Attributes (__CUDA_DEPRECATED and the like) are stripped first, so deprecated
# functions get their stub too.
# CPPFLAGS (optional) may ask for more names, as __CUDA_API_VERSION_INTERNAL
# does for every versioned and per-thread variant the driver exports; '|'
# separates sets of flags whose names are all stubbed (the runtime's
# per-thread variants are the default names under another macro).
# Usage: gen_stubs.sh CC CUDA_INCLUDE HEADER NAME_PREFIX RETURN_TYPE REFUSE_FN CODE [CPPFLAGS]
set -euo pipefail
cc=$1 inc=$2 header=$3 prefix=$4 rtype=$5 refuse=$6 code=$7 cppflags=${8:-}

echo "/* Generated from $header by gen_stubs.sh; do not edit. */"
echo "int $refuse(const char *name, int code);"
IFS='|' read -r -a flagsets <<<"$cppflags"
[ ${#flagsets[@]} -gt 0 ] || flagsets=("")
for flags in "${flagsets[@]}"; do
    # shellcheck disable=SC2086 # each set is split into its flags on purpose
    printf '#include <%s>\n' "$header" | "$cc" -E -P -I"$inc" $flags -x c - |
        tr '\n' ' ' | tr ';' '\n' |
        sed -E 's/__attribute__[[:space:]]*\(\(([^()]|\(([^()]|\([^()]*\))*\))*\)\)/ /g' |
        grep -oE "^[[:space:]]*(extern[[:space:]]+)?$rtype[[:space:]]+$prefix[A-Za-z0-9_]*[[:space:]]*\(" |
        grep -oE "$prefix[A-Za-z0-9_]*"
done | sort -u |
    while read -r name; do
        printf 'int simcuda_stub_%s(void) { return %s("%s", %s); }\n' "$name" "$refuse" "$name" "$code"
        printf '__attribute__((weak, alias("simcuda_stub_%s"))) int %s(void);\n' "$name" "$name"
    done
