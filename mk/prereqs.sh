#!/usr/bin/env bash
# Checks the build prerequisites and installs what is missing.
# As root, missing Debian packages are installed with apt-get; otherwise the
# exact command to run is printed and the build stops.
# Usage: mk/prereqs.sh [build|check|fuzz|valgrind]...
set -euo pipefail

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
missing=()

need_file() { # need_file PATH PACKAGE
    [ -e "$1" ] || missing+=("$2")
}
need_cmd() { # need_cmd COMMAND PACKAGE
    command -v "$1" >/dev/null 2>&1 || missing+=("$2")
}
# The Python package's tests (tests/python/run.sh) need a python3 with
# pytest, and pip and setuptools to check that the package installs. The
# python3 first on PATH may be another installation (pyenv, a venv): then
# the system one gets them.
need_python_test() {
    local py
    for py in python3 /usr/bin/python3; do
        "$py" -c 'import setuptools, pytest' >/dev/null 2>&1 &&
            "$py" -m pip --version >/dev/null 2>&1 && return
    done
    missing+=(python3-pytest python3-pip python3-setuptools)
}
# The recorder's tests (tests/python/test_trace.py) run PyTorch on the meta
# device: Debian's CPU build is enough (about 40 s to install, 200 MB), for
# the system python3, which is the one that has it.
need_torch() {
    local py
    for py in python3 /usr/bin/python3; do
        "$py" -c 'import pytest, torch' >/dev/null 2>&1 && return
    done
    missing+=(python3-torch)
}

for what in "${@:-build}"; do
    case "$what" in
    build)
        need_cmd cc gcc
        need_cmd make make
        need_file /usr/include/ini.h libinih-dev
        need_file /usr/include/cmocka.h libcmocka-dev
        need_file /usr/include/libelf.h libelf-dev
        need_file /usr/include/ncurses.h libncurses-dev
        need_file /usr/include/zlib.h zlib1g-dev
        need_file /usr/include/json-c/json.h libjson-c-dev
        need_cmd tmux tmux
        need_cmd python3 python3
        need_python_test
        need_torch
        ;;
    check)
        need_cmd clang-format clang-format
        need_cmd cppcheck cppcheck
        ;;
    valgrind)
        need_cmd valgrind valgrind
        ;;
    fuzz)
        need_cmd clang clang
        [ -n "$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null)" ] ||
            missing+=(libclang-rt-dev)
        ;;
    *)
        echo "prereqs.sh: unknown group '$what'" >&2
        exit 2
        ;;
    esac
done

if [ ${#missing[@]} -gt 0 ]; then
    mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "prereqs: installing ${pkgs[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq "${pkgs[@]}" >/dev/null
    else
        echo "prereqs: missing packages: ${pkgs[*]}" >&2
        echo "prereqs: run: sudo apt-get update && sudo apt-get install -y ${pkgs[*]}" >&2
        exit 1
    fi
fi

for h in cuda.h cuda_runtime_api.h cupti.h generated_cuda_meta.h; do
    if [ ! -f "$CUDA_HOME/include/$h" ]; then
        echo "prereqs: $CUDA_HOME/include/$h not found." >&2
        echo "prereqs: install the CUDA 13 toolkit there, or set CUDA_HOME to where it is." >&2
        exit 1
    fi
done
