#!/usr/bin/env bash
# Builds and runs the gpu-labelled tests on a machine with at least one NVIDIA GPU, in a few
# minutes: CUDA IPC between processes on one GPU runs; NCCL tests that need two GPUs skip.
#
#   tools/gpu_check.sh [BUILD_DIR]     (default: build-gpu; CUDA found under /usr/local/cuda or
#                                       CUDAToolkit_ROOT)
# Exit status: 0 when every gpu test passed or skipped, 1 otherwise, 2 when the build has no CUDA.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build-gpu}"
jobs="$(nproc 2>/dev/null || echo 2)"

echo "== devices"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
else
  echo "nvidia-smi not found (the tests decide from cudaGetDeviceCount)"
fi

mkdir -p "$build"
echo "== configure ($build)"
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/gpu_check.configure.log" 2>&1 || {
  tail -30 "$build/gpu_check.configure.log"; exit 1; }
grep -E "reshard: CUDA" "$build/gpu_check.configure.log" || true
if ! grep -q "reshard: CUDA ON" "$build/gpu_check.configure.log"; then
  echo "this build found no CUDA toolkit; set CUDAToolkit_ROOT" >&2
  exit 2
fi

echo "== build gpu tests"
targets=$(find "$here/tests" -name CMakeLists.txt -print0 | xargs -0 cat | awk '
  BEGIN { RS = "reshard_add_test\\(" }
  NR > 1 { split($0, a, ")"); if (a[1] ~ /LABELS[^)]*gpu|GPU_FILTER/) { split(a[1], w, /[ \t\n]+/); print w[1] } }' \
  | { grep -v '^NAME$' || true; } | sort -u | tr '\n' ' ')
if [ -z "$targets" ]; then
  echo "no gpu-labelled test targets found" >&2
  exit 1
fi
echo "targets: $targets"
# shellcheck disable=SC2086
cmake --build "$build" -j"$jobs" --target $targets

echo "== run (ctest -L gpu)"
cd "$build"
ctest -L gpu --output-on-failure --timeout 300
