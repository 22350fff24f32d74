#!/usr/bin/env bash
# Fetches, on a machine that reaches Debian's and PyPI's registries (this project's Debian 12
# machines), what tools/gpu_check.sh needs on a GPU machine that reaches nothing: the device
# machine's image has CUDA, CMake, a compiler and PyTorch, but not necessarily the C++ libraries
# reshard builds against. Everything lands in build-wheels/ (ignored by git: the `device` tool's
# `carry` must name it), which gpu_check.sh reads:
#   build-wheels/libucx_cu13-*.whl      the CUDA-aware UCX (UCX 1.22, cuda_copy and cuda_ipc) of
#                                       the second build
#   build-wheels/debs/<group>/*.deb     Debian 12's Abseil, GoogleTest and UCX 1.13 (no CUDA: the
#                                       first build, whose device buffers are staged), and
#                                       libnuma, which UCX loads; gpu_check.sh unpacks each group
#                                       into a prefix of its own and builds against those
#                                       instead of whatever the machine has, so the device builds
#                                       what CI tests.
#   build-wheels/python/nanobind-*.whl  nanobind, for the Python extension (python3 there has
#                                       PyTorch)
# About 47 MB in all, under the 64 MiB the device tool carries with the working tree (checked).
#
#   tools/gpu_deps.sh [CUDA_MAJOR]     (default 13: the device image's driver and toolkit;
#                                       12 fetches libucx-cu12 instead)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
major="${1:-13}"
out="$here/build-wheels"

# group:package... ; a group is unpacked into a prefix of its own on the device, so that the
# second build's binaries never load this UCX (LD_LIBRARY_PATH names only the groups it uses).
groups=(
  "absl:libabsl-dev libabsl20220623"
  "gtest:libgtest-dev libgmock-dev"
  "ucx:libucx-dev libucx0"
  "numa:libnuma1"
)

rm -rf "$out/debs"
mkdir -p "$out/debs"
if ! apt-cache show libabsl-dev >/dev/null 2>&1; then
  echo "gpu_deps: apt knows no libabsl-dev; run apt-get update first" >&2
  exit 1
fi
for entry in "${groups[@]}"; do
  group="${entry%%:*}"
  mkdir -p "$out/debs/$group"
  # shellcheck disable=SC2086
  (cd "$out/debs/$group" && apt-get -o APT::Sandbox::User=root download -qq ${entry#*:}) ||
    echo "gpu_deps: apt-get download failed for the group $group" >&2
  for p in ${entry#*:}; do
    if ! ls "$out/debs/$group/${p}"_*.deb >/dev/null 2>&1; then
      echo "gpu_deps: could not download $p" >&2
      exit 1
    fi
  done
done

rm -f "$out"/libucx_cu*.whl
python3 -m pip download -q --no-deps --only-binary=:all: "libucx-cu$major" -d "$out"
ls "$out"/libucx_cu"$major"-*.whl >/dev/null
# nanobind (pure Python and C++ sources), the version CI's venv gets, so the Python extension
# builds on the device against the nanobind it is tested with, whatever the image holds.
rm -rf "$out/python"
python3 -m pip download -q --no-deps --only-binary=:all: nanobind -d "$out/python"

# The device tool carries the working tree (tracked and untracked files git does not ignore)
# and the carried paths, 64 MiB together.
tree=$(cd "$here" && git ls-files -z --cached --others --exclude-standard |
  xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
carried=$(du -sb "$out" | cut -f1)
total=$((tree + carried))
limit=$((64 * 1024 * 1024))
echo "gpu_deps: build-wheels/ $((carried / 1024)) KiB ($(find "$out" -name '*.deb' | wc -l) packages," \
  "$(basename "$(ls "$out"/libucx_cu"$major"-*.whl)"), $(basename "$(ls "$out"/python/*.whl)"));" \
  "with the working tree" \
  "$((total / 1024)) KiB of the $((limit / 1024)) KiB the device tool carries"
if [ "$total" -gt "$limit" ]; then
  echo "gpu_deps: too large to carry; remove what else lies in build-wheels/" >&2
  exit 1
fi
