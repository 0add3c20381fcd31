#!/usr/bin/env bash
# Installs the Debian packages distmesh's build and tests need, only when they are missing.
# Usage: scripts/deps.sh [extra-package ...]   (bench/compare pass their own extras)
set -euo pipefail
need=()
have_header() { [ -f "/usr/include/$1" ] || [ -f "/usr/include/x86_64-linux-gnu/$1" ]; }
have_header uv.h       || need+=(libuv1-dev)
have_header cmocka.h   || need+=(libcmocka-dev)
have_header openssl/evp.h || need+=(libssl-dev)    # libcrypto: the TCP backend's encrypted links
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
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ ${#need[@]} -gt 0 ]; then
    echo "deps: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq || true
    $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# NCCL's headers for the CUDA/NCCL stand-in (tests/nccl_standin.mk): where CUDA's headers are
# but no nccl.h, the headers of NCCL's PyPI wheel (nvidia-nccl-cu13, pinned: the version the
# stand-in is checked against), unpacked into DM_NCCL_HEADERS (the Makefile's); nothing of the
# library is kept. Without PyPI it says so and the stand-in tests report a skip.
# DM_NCCL_HEADERS (make passes its own) names another folder for them.
nccl_inc=${DM_NCCL_HEADERS:-/usr/local/share/distmesh/nccl/include}
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ -f "$cuda/include/cuda_runtime.h" ] && [ ! -f "$nccl_inc/nccl.h" ] &&
   [ ! -f "${NCCL_HOME:-$cuda}/include/nccl.h" ] && [ ! -f /usr/include/nccl.h ]; then
    echo "deps: NCCL's headers for the stand-in tests (nvidia-nccl-cu13 2.30.7 from PyPI, headers only)"
    tmp=$(mktemp -d)
    if timeout 600 python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" 'nvidia-nccl-cu13==2.30.7' &&
       $SUDO python3 - "$tmp" "$nccl_inc" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
lead = "nvidia/nccl/include/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(lead) and not name.endswith("/"):
            out = os.path.join(sys.argv[2], name[len(lead):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(z.read(name))
PY
    then echo "deps: NCCL's headers in $nccl_inc"
    else echo "deps: NCCL's headers could not be fetched; the stand-in tests will report a skip"
    fi
    rm -rf "$tmp"
fi
