#!/usr/bin/env bash
# Installs what kiln builds with on Debian 12: Debian's Bazel (bazel-bootstrap) and the -dev
# packages kiln links. Idempotent and quiet: installs only what is missing. Checks that the CUDA
# toolkit (nvcc) and NCCL are present under /usr/local/cuda, and says how to fix it if not.
set -euo pipefail

packages=(
  bazel-bootstrap
  libabsl-dev
  libprotobuf-dev
  protobuf-compiler
  libgoogle-glog-dev
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$cuda/bin/nvcc" ]; then
  echo "setup: nvcc not found at $cuda/bin/nvcc;" \
    "install the CUDA 13 toolkit under /usr/local/cuda" >&2
  exit 1
fi
if [ ! -f "$cuda/include/nccl.h" ] || ! ls "$cuda"/lib64/libnccl.so* >/dev/null 2>&1; then
  echo "setup: NCCL not found (need $cuda/include/nccl.h and $cuda/lib64/libnccl.so);" \
    "install NCCL for CUDA 13 there" >&2
  exit 1
fi
exit 0
