#!/usr/bin/env bash
# Manual check (not run by CI: it downloads a 43 MB wheel and builds the data plane a second time):
# builds reshard against the CUDA-aware UCX of the `libucx-cu13` wheel from PyPI (UCX 1.22 with
# cuda_copy / cuda_ipc, no verbs) instead of Debian's UCX 1.13, then shows that the library runs
# against it: `reshard info` (version, library, transports, memory types) and two verified refits
# between local processes over shared memory. docs/building.md explains the steps it automates.
#
#   scripts/ucx_wheel_check.sh [BUILD_DIR]      (default: build-ucx-wheel)
#   UCX_WHEEL=libucx-cu12                       another wheel (default libucx-cu13)
#   UCX_WHEEL_FILE=/path/to/libucx_cu13-*.whl   use a downloaded wheel (offline machines)
#
# Exit status: 0 when the build used the wheel's UCX and `reshard run` verified its refits;
# 1 otherwise. On a machine without the NVIDIA driver the wheel's CUDA transports cannot load
# (libcuda.so.1 is missing), so `reshard info` shows host memory only; with a driver it adds cuda.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build-ucx-wheel}"
wheel="${UCX_WHEEL:-libucx-cu13}"
jobs="${RESHARD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
t0=$(date +%s)
log() { echo "== $* ($(($(date +%s) - t0)) s)"; }

mkdir -p "$build/wheel"
file="${UCX_WHEEL_FILE:-}"
if [ -z "$file" ]; then
  log "pip download $wheel"
  python3 -m pip download --quiet --no-deps --only-binary=:all: "$wheel" -d "$build/wheel"
  file=$(ls -t "$build/wheel"/*.whl | head -1)
fi
log "extract $(basename "$file")"
rm -rf "$build/ucx"
python3 -m zipfile -e "$file" "$build/ucx"
prefix="$build/ucx/libucx"
for need in include/ucp/api/ucp.h lib/libucp.so lib/cmake/ucx/ucx-config.cmake; do
  if [ ! -e "$prefix/$need" ]; then
    echo "ucx_wheel_check: the wheel has no $need; it cannot be built against" >&2
    exit 1
  fi
done
echo "UCX prefix: $prefix ($(cat "$prefix/UCX_WHEEL_VERSION.txt" 2>/dev/null || echo '?'))"

log "configure against it (-DUCX_ROOT=$prefix)"
cmake -S "$here" -B "$build" -DUCX_ROOT="$prefix" -DRESHARD_BUILD_TESTS=OFF \
  -DRESHARD_BUILD_BENCHMARKS=OFF >"$build/configure.log" 2>&1 || {
  tail -30 "$build/configure.log"
  exit 1
}
grep "reshard: UCX" "$build/configure.log"
if ! grep -q "reshard: UCX .* from $prefix" "$build/configure.log"; then
  echo "ucx_wheel_check: CMake did not pick the wheel's UCX" >&2
  exit 1
fi

log "build reshard, reshard-rank"
cmake --build "$build" -j"$jobs" --target reshard reshard_rank

log "reshard info"
"$build/bin/reshard" info
info=$("$build/bin/reshard" info --json)
case "$info" in
  *"\"library\":\"$prefix/lib/libucp.so"*) ;;
  *) echo "ucx_wheel_check: reshard did not load the wheel's libucp" >&2
     exit 1 ;;
esac

log "reshard run (2 verified refits over shared memory)"
"$build/bin/reshard" run "$here/examples/specs/fig3-tp4-to-tp2dp2.json" --iters 2 --transport sm
log "done"
