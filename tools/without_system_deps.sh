#!/usr/bin/env bash
# Runs a command as on a machine whose system has no Abseil, GoogleTest or UCX to build against
# (the GPU machine's image): in a mount namespace of its own, empty folders and files are bound
# over Debian's headers, CMake package files and pkg-config files of the three, so CMake finds
# only what the command names. Their shared libraries stay (the programs built run as they would
# with LD_LIBRARY_PATH naming the unpacked ones first). Needs root (unshare -m); the rest of the
# machine sees nothing of it. Used to check tools/gpu_check.sh with build-wheels/ from
# tools/gpu_deps.sh before a lent device's minutes are spent on it (docs/testing.md, "The GPU
# check"):
#   GPU_CHECK_DRY_RUN=1 tools/without_system_deps.sh tools/gpu_check.sh /tmp/gpu-dry
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: tools/without_system_deps.sh COMMAND [ARGS...]" >&2
  exit 2
fi
if [ "${RESHARD_DEPS_HIDDEN:-}" != 1 ]; then
  RESHARD_DEPS_HIDDEN=1 exec unshare -m "$0" "$@"
fi
empty_dir=$(mktemp -d)
empty_file=$(mktemp)
arch=/usr/lib/x86_64-linux-gnu
for d in /usr/include/absl /usr/include/gtest /usr/include/gmock /usr/include/ucp \
  /usr/include/uct /usr/include/ucs /usr/include/ucm "$arch/cmake/absl" "$arch/cmake/GTest" \
  "$arch/cmake/ucx"; do
  if [ -d "$d" ]; then mount --bind "$empty_dir" "$d"; fi
done
for f in "$arch"/pkgconfig/ucx*.pc "$arch"/pkgconfig/absl_*.pc "$arch"/pkgconfig/gtest*.pc \
  "$arch"/pkgconfig/gmock*.pc; do
  if [ -f "$f" ]; then mount --bind "$empty_file" "$f"; fi
done
exec "$@"
