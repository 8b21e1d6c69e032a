#!/usr/bin/env bash
# Makes clean/ptx.c, the library's kernels (the fingerprint and the pointer
# prefilter) as PTX in a C string, from
# clean/fp.cu with the toolkit's nvcc (make ptx). The result is committed:
# building the library needs no nvcc, and the library needs none at run time.
# The PTX asks for ISA 8.0 (CUDA 12.0) and sm_75, so that every driver the
# library supports can JIT it; the kernel uses nothing newer.
# Usage: mk/gen_ptx.sh NVCC clean/fp.cu clean/ptx.c
set -euo pipefail
nvcc=$1 src=$2 out=$3
tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp.c"' EXIT
"$nvcc" -ptx -arch=compute_75 -O3 -o "$tmp" "$src"
sed -i -e 's/^\.version .*/.version 8.0/' -e '/^\/\/ Compiler Build ID/d' "$tmp"
for entry in stagehand_fp_v1 stagehand_ptrs_v1; do
    grep -q "^\.visible \.entry $entry(" "$tmp" || { echo "$0: no $entry entry" >&2; exit 1; }
done
{
    echo "/* ptx.c — the library's kernels as PTX. Generated from clean/fp.cu by"
    echo " * mk/gen_ptx.sh (make ptx); do not edit. No state. */"
    echo "#include \"clean/clean.h\""
    echo ""
    echo "// clang-format off"
    echo "const char sh_clean_ptx[] ="
    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' -e 's/^/    "/' -e 's/$/\\n"/' "$tmp"
    echo "    ;"
    echo "// clang-format on"
} >"$tmp.c"
mv "$tmp.c" "$out"
