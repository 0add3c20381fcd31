#!/usr/bin/env bash
# Installs the Debian packages distmesh's build and tests need, only when they are missing.
# Usage: scripts/deps.sh [extra-package ...]   (bench/compare pass their own extras)
set -euo pipefail
need=()
have_header() { [ -f "/usr/include/$1" ] || [ -f "/usr/include/x86_64-linux-gnu/$1" ]; }
have_header uv.h       || need+=(libuv1-dev)
have_header cmocka.h   || need+=(libcmocka-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v cc >/dev/null  || need+=(gcc)
command -v c++ >/dev/null || need+=(g++)
# clang: the drop-in checks' second compiler, and with its runtime libFuzzer for `make fuzz`
command -v clang >/dev/null || need+=(clang)
dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
command -v ip >/dev/null  || need+=(iproute2)
command -v cmake >/dev/null || need+=(cmake)
command -v mpirun >/dev/null || need+=(openmpi-bin)
dpkg -s python3-torch >/dev/null 2>&1 || need+=(python3-torch)
# the Python package (python/): its extension, tests, install and bench-python's mpi4py
for p in python3-dev python3-setuptools python3-pip python3-numpy python3-pytest python3-mpi4py; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
command -v srun >/dev/null || need+=(slurm-wlm)     # test_launch's srun in a private Slurm
[ -x /usr/sbin/munged ] || command -v munged >/dev/null || need+=(munge)
for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
[ ${#need[@]} -eq 0 ] && exit 0
echo "deps: installing ${need[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || true
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
