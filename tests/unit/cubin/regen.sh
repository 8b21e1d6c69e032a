#!/usr/bin/env bash
# Rebuilds the fixtures of tests/unit/test_cubin.c from kparams.cu:
#   kparams_sm90.cubin    a raw ELF cubin for sm_90
#   kparams.fatbin        a fatbin: sm_90 ELF (uncompressed) + compute_90 PTX (compressed)
#   kparams_z.fatbin      a fatbin whose sm_80 and sm_90 ELF entries are compressed
#   kclash.fatbin         another module's k_ptrs, with another layout (test_e2e_cubin)
# The offsets and sizes the test expects come from the C ABI of kparams.cu's
# parameter lists; after a rebuild, check them against the EIATTR_KPARAM_INFO
# records of each .nv.info.<kernel> section (`cuobjdump -elf`, or
# `readelf -x .nv.info.<kernel> kparams_sm90.cubin` and cubin.c's notes).
set -euo pipefail
cd "$(dirname "$0")"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
"$NVCC" -arch=sm_90 -cubin -o kparams_sm90.cubin kparams.cu
"$NVCC" -fatbin \
    -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
    -o kparams.fatbin kparams.cu
"$NVCC" -fatbin -Xfatbin -compress-all \
    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -o kparams_z.fatbin kparams.cu
"$NVCC" -fatbin -gencode arch=compute_90,code=sm_90 -o kclash.fatbin kclash.cu
ls -l kparams_sm90.cubin kparams.fatbin kparams_z.fatbin kclash.fatbin
