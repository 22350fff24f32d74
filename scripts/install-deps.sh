#!/usr/bin/env bash
# Installs the Debian 12 packages reshard needs to build and test, only those that are missing.
# CUDA and NCCL are never installed here: they are used when present under /usr/local/cuda.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git python3
  # python3 -m venv, for scripts/python-env.sh (numpy and ml_dtypes of the quant_ml_dtypes test).
  python3-venv
  libabsl-dev googletest libgtest-dev libgmock-dev
  libucx-dev ucx-utils
  iproute2 procps
  openmpi-bin libopenmpi-dev
  # The sanitizer trees of scripts/sanitizers.sh (and libFuzzer): clang, its sanitizer runtimes
  # (only recommended by clang, so named) and llvm-symbolizer for readable reports.
  clang libclang-rt-14-dev llvm
  # lld: every tree links with it (cmake/ReshardLinker.cmake), several times faster than ld.bfd.
  lld
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
