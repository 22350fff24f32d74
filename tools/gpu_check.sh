#!/usr/bin/env bash
# The GPU check: one prepared script for a machine with an NVIDIA GPU (under 8 minutes on one
# H200 with 16 cores). It configures a fresh Release build with CUDA, builds every gpu-labelled
# test (the pack kernels' and the FP8 quantization kernels', each against its host twin bit for
# bit), `reshard`, bench/pack_bench and bench/quant_bench, prints `reshard info`, runs
# `ctest -L gpu`, then prints the pack/unpack kernels' GB/s against device-to-device cudaMemcpy
# (runs of 4 B .. 64 KiB) as one table and the quantization kernels' GB/s per scheme (8192 x 8192
# bf16, and an FP8 source requantized: 128 x 128 e4m3 into MX e5m2) as another, and the delta
# kernels' encode/apply GB/s for an 8 MiB bf16 piece at 0-100% changed (bench/delta_gpu_bench;
# their gpu test is cuda_delta_kernel_test) as a third, followed by the engine's GPU encode
# pipeline against one-by-one encodes (64 pieces of 1 MiB, streams to host memory: the overlap). CUDA IPC between processes on one GPU
# runs (the fan-out conformance suite, nvlink_fanout_conformance_test, through the copy engines
# and through the strided copy kernel); NCCL tests that need two GPUs skip. pack_bench's second
# table times that copy kernel against cudaMemcpy2DAsync. The gpu tests include
# api_stream_refit_test: a refit between two processes started on a stream behind a kernel that
# writes the sources, with a kernel reading the destinations queued behind RecordCompletion,
# and net_gpu_staging_test's GpuStaging.StagingRing* (sources packed into a small staging ring).
# Last, the staging ring at size: a 1 GiB bf16 rows -> columns refit of device buffers between
# four processes sharing the GPU (bench/put_bench --cuda: staged sources packed into the ring,
# staged destinations through 256 MiB of landing rounds, each round scattered by one kernel
# launch, in a second case copied slab by slab by the copy engines, in a third case one round
# per sender, scattered only once its stream landed), its GB/s beside a
# device-to-device cudaMemcpy of the same bytes; then two 1 GiB refits of device buffers through the public API,
# `reshard run --memory cuda` (bench/specs/gpu_rows_to_cols_1gib.json: rows -> columns across two
# domains, every byte through the network engine; gpu_tp4_to_tp2x2_1gib.json: TP4 -> TP2 x DP2,
# the second replica filled by the CUDA IPC fan-out), each as a ratio to cudaMemcpy of the bytes
# the refit writes. Where python3 has nanobind, pytest, numpy, PyTorch and Python.h (the device
# image's does), the Python extension is built too and ctest's gpu tests include python_cuda
# (CUDA tensors refitted between two processes on side streams, through the package).
#
# Dependencies: the device image has CUDA, CMake, a compiler and PyTorch but need not have
# Abseil, GoogleTest or UCX, and reaches no network. tools/gpu_deps.sh, run beside the checkout on
# a machine that reaches Debian's registry and PyPI, puts Debian 12's packages of them (and the
# CUDA-aware UCX wheel below) under build-wheels/; this script unpacks them and builds against
# them, whatever the machine has.
#
# CUDA-aware UCX: the build above uses the system's UCX (Debian's 1.13 has no CUDA: device
# buffers are staged) unless UCX_ROOT names another. A second build (BUILD_DIR-ucx) is made
# against the CUDA-aware UCX of a libucx-cu13 / libucx-cu12 wheel (UCX 1.22 with cuda_copy and
# cuda_ipc), taken from UCX_WHEEL_FILE or the newest build-wheels/libucx_cu*.whl of the checkout
# (the one matching the driver's CUDA major version first; the GPU machine reaches no network,
# so tools/gpu_deps.sh downloads it beside the checkout first: docs/testing.md, "The GPU
# check"). It prints
# `reshard info`, runs the gpu tests that move device memory through UCX
# (net_gpu_staging_test, api_stream_refit_test, run_test's RunGpuTest) with
# UCX_TLS=posix,sysv,cma,self,cuda_copy,cuda_ipc (RESHARD_TEST_UCX_TLS), so device buffers are
# registered with UCX instead of staged, and the same put_bench and `reshard run` figures. No
# wheel and no UCX_ROOT: the section says so and the exit status is unchanged.
#
# On the `device` tool (about 15 minutes of device time in all, machine start included): run
# tools/gpu_deps.sh here, then this script as one call with `carry: ["build-wheels"]` and
# timeout_s 600, leaving time for a second try;
# after every step BUILD_DIR/gpu_check/ (every step's output and summary.md) is kept as
# $OUT/gpu_check.tar.gz and $OUT/summary.md when OUT is set (the tool returns at most 8 files).
# Every step after the build runs within GPU_CHECK_BUDGET_S (540 s from the start by default)
# and is stopped at it, so the table is printed before the tool's 600 s limit.
#
# GPU_CHECK_DRY_RUN=1 on a machine without a GPU goes on past the first build: both builds (the
# Python extension too) and their gpu tests, which skip, then the summary, and exit 3; it checks
# the script itself (and, with the system's Abseil, GoogleTest and UCX hidden, that a bare image
# builds from build-wheels/) before a lent device's minutes are spent on it.
#
#   tools/gpu_check.sh [BUILD_DIR]     (default: build-gpu; CUDA found under /usr/local/cuda or
#                                       CUDAToolkit_ROOT; UCX_ROOT=<prefix> builds against that
#                                       UCX instead of the system's, e.g. a CUDA-aware one:
#                                       docs/building.md)
#
# After the build every step runs, whatever failed before it (a lent device's minutes are few):
# failures are listed at the end. Last comes one Markdown table of issue 11's figures beside
# their targets (tools/gpu_check_summary.py, kept in BUILD_DIR/gpu_check/summary.md with every
# step's output): pack/unpack against cudaMemcpy, the put_bench refits, and each reshard run
# refit's median against cudaMemcpy of the bytes it writes, with its registered and staged CUDA
# buffers, for both UCX builds. Paste it into the closing note.
#
# Exit status: 0 when every gpu test passed (or skipped for a stated reason such as a second GPU)
# and every benchmark and refit ran; 1 when the build, a test, a benchmark, a refit or the
# CUDA-aware build failed; 2 when the build found no CUDA toolkit; 3 when there is no usable GPU
# (the build and the skipping tests were checked, nothing was measured).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build-gpu}"
jobs="$(nproc 2>/dev/null || echo 2)"
t0=$(date +%s)
log() { echo "== $* ($(($(date +%s) - t0)) s)"; }

log "devices"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
else
  echo "nvidia-smi not found (the tests decide from cudaGetDeviceCount)"
fi

log "toolchain"
# shellcheck disable=SC1091
(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown system}") || true
cmake --version | head -1
"${CXX:-c++}" --version 2>&1 | head -1 || true
nvcc_path=$(command -v nvcc || ls "${CUDAToolkit_ROOT:-/usr/local/cuda}/bin/nvcc" 2>/dev/null || true)
echo "nvcc: ${nvcc_path:-not on PATH nor under ${CUDAToolkit_ROOT:-/usr/local/cuda}}" \
  "$([ -n "$nvcc_path" ] && "$nvcc_path" --version | grep -o 'release [0-9.]*')"

mkdir -p "$build"
# Fresh: no cache from an earlier configuration (objects are reused when their flags match).
rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"

# Build dependencies carried from this project's machines (tools/gpu_deps.sh makes
# build-wheels/debs/<group>/*.deb): each group is unpacked into a prefix of its own and named to
# CMake, so the device builds against what CI tests whatever its image holds (the image has
# CUDA, CMake, a compiler and PyTorch, but need not have Abseil, GoogleTest or UCX). Their shared
# libraries load each other by soname, which the binaries' run path does not cover:
# LD_LIBRARY_PATH names the groups' library folders, Debian's UCX only while the first build's
# binaries run (the second build's must load the wheel's UCX).
dep_args=()     # CMake arguments of both builds
dep_libs=""     # LD_LIBRARY_PATH of both builds
ucx_dep_args=() # the first build's UCX
ucx_dep_libs=""
# unpack_deb DEB DIR: dpkg-deb where there is one, else ar and tar (a .deb is an ar archive).
unpack_deb() {
  mkdir -p "$2"
  if command -v dpkg-deb >/dev/null 2>&1; then
    dpkg-deb -x "$1" "$2"
  else
    local tmp
    tmp=$(mktemp -d)
    (cd "$tmp" && ar x "$1" && tar -xf data.tar.* -C "$2")
    rm -rf "$tmp"
  fi
}
debs="$here/build-wheels/debs"
if [ -d "$debs" ]; then
  deps="$build-deps"
  log "dependencies: the Debian packages of build-wheels/debs, unpacked into $deps"
  rm -rf "$deps"
  for dir in "$debs"/*/; do
    for f in "$dir"*.deb; do unpack_deb "$f" "$deps/$(basename "$dir")"; done
  done
  arch=lib/x86_64-linux-gnu
  if [ -d "$deps/absl" ]; then
    dep_args+=(-Dabsl_DIR="$deps/absl/usr/$arch/cmake/absl")
    dep_libs+="$deps/absl/usr/$arch:"
  fi
  if [ -d "$deps/gtest" ]; then dep_args+=(-DGTest_DIR="$deps/gtest/usr/$arch/cmake/GTest"); fi
  if [ -d "$deps/numa" ]; then dep_libs+="$deps/numa/usr/$arch:"; fi
  if [ -d "$deps/ucx" ] && [ -z "${UCX_ROOT:-}" ]; then
    # Debian's UCX package files name /usr as their prefix: point them at where they lie.
    ucx_config="$deps/ucx/usr/$arch/cmake/ucx/ucx-targets.cmake"
    sed -i "s|^set(prefix \"/usr\")|set(prefix \"$deps/ucx/usr\")|" "$ucx_config"
    grep -q "^set(prefix \"$deps/ucx/usr\")" "$ucx_config" || {
      echo "gpu_check: $ucx_config does not set its prefix as Debian 12's UCX does" >&2
      exit 1
    }
    ucx_dep_args=(-Ducx_DIR="$(dirname "$ucx_config")")
    ucx_dep_libs="$deps/ucx/usr/$arch:"
  fi
fi
base_ld_library_path="${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH="$dep_libs$ucx_dep_libs$base_ld_library_path"
# CMake 4 refuses package files that ask for policies older than 3.5 unless told this.
export CMAKE_POLICY_VERSION_MINIMUM=3.5

# The Python package (python/), when python3 has what it builds and tests with (the device
# image's python3 holds PyTorch): python_cuda (label gpu) then refits CUDA tensors between two
# processes through it, imported from the build tree (PYTHONPATH; python/tests/conftest.py
# checks that the package imported is this build's).
# nanobind: the wheel tools/gpu_deps.sh fetched (CI's version) where there is one, else python3's.
py_args=()
nanobind_args=()
nanobind_wheel=$(find "$here/build-wheels/python" -name 'nanobind-*.whl' 2>/dev/null | head -1)
if [ -n "$nanobind_wheel" ]; then
  rm -rf "$build-deps/python"
  python3 -m zipfile -e "$nanobind_wheel" "$build-deps/python"
  nanobind_args=(-Dnanobind_ROOT="$build-deps/python/nanobind/cmake")
fi
if NANOBIND_CARRIED="${nanobind_wheel:+1}" PYTHONPATH="$build-deps/python" \
  python3 - >"$build/gpu_check.python.log" 2>&1 <<'PY'
import os, sysconfig
import nanobind, numpy, pytest, torch
include = sysconfig.get_paths()["include"]
assert os.path.exists(os.path.join(include, "Python.h")), "no Python.h in " + include
print("torch", torch.__version__, "nanobind", nanobind.__version__,
      "(carried)" if os.environ.get("NANOBIND_CARRIED") else "(python3's)",
      "CUDA available" if torch.cuda.is_available() else "no CUDA device")
PY
then
  py_args=(-DRESHARD_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)"
    -DRESHARD_PYTHON="$(command -v python3)" "${nanobind_args[@]}")
  echo "python3: $(tail -1 "$build/gpu_check.python.log"); the Python package is built and tested"
else
  echo "python3 cannot build the Python package here, so python_cuda is not run:" \
    "$(tail -1 "$build/gpu_check.python.log")"
fi

log "configure Release ($build)"
ucx_args=()
if [ -n "${UCX_ROOT:-}" ]; then ucx_args=(-DUCX_ROOT="$UCX_ROOT"); fi
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release "${ucx_args[@]}" "${dep_args[@]}" \
  "${ucx_dep_args[@]}" "${py_args[@]}" >"$build/gpu_check.configure.log" 2>&1 || {
  tail -30 "$build/gpu_check.configure.log"
  if [ ! -d "$debs" ]; then
    echo "gpu_check: the configure failed; where Abseil, GoogleTest or UCX is missing, run" \
      "tools/gpu_deps.sh on a machine that reaches Debian's registry and carry build-wheels/" >&2
  fi
  exit 1
}
grep -E "reshard: (CUDA|UCX)" "$build/gpu_check.configure.log" || true
if ! grep -q "pack kernels ON" "$build/gpu_check.configure.log"; then
  echo "gpu_check: this build found no CUDA toolkit with nvcc; set CUDAToolkit_ROOT" >&2
  exit 2
fi

targets=$(find "$here/tests" -name CMakeLists.txt -print0 | xargs -0 cat | awk '
  BEGIN { RS = "reshard_add_test\\(" }
  NR > 1 { split($0, a, ")"); if (a[1] ~ /LABELS[^)]*gpu|GPU_FILTER/) { split(a[1], w, /[ \t\n]+/); print w[1] } }' \
  | { grep -v '^NAME$' || true; } | sort -u | tr '\n' ' ')
if [ -z "$targets" ]; then
  echo "gpu_check: no gpu-labelled test targets found" >&2
  exit 1
fi
log "build: $targets reshard pack_bench quant_bench delta_gpu_bench put_bench"
# shellcheck disable=SC2086
cmake --build "$build" -j"$jobs" --target $targets reshard pack_bench quant_bench delta_gpu_bench \
  put_bench reshard_rank

log "reshard info"
"$build/bin/reshard" info || true

# From here every step runs whatever failed before it (one lent session should see everything):
# a failure is recorded, the script goes on, and the exit status says it at the end. Outputs are
# kept under $build/gpu_check/ for the summary table.
set +e
out="$build/gpu_check"
rm -rf "$out"
mkdir -p "$out"
failed=()
# The device tool stops a command at its timeout_s (600 s at most) and then returns only the end
# of its output and what lies under $OUT (at most 8 files): every step runs within what is left
# of GPU_CHECK_BUDGET_S (540 s from the script's start by default) and is stopped at it, and after
# each the outputs so far are kept as $OUT/gpu_check.tar.gz with the summary so far as
# $OUT/summary.md, so a run that overruns still ends with its table.
budget="${GPU_CHECK_BUDGET_S:-540}"
left() { echo $((budget - ($(date +%s) - t0))); }
save() {
  python3 "$here/tools/gpu_check_summary.py" "$out" >"$out/summary.md" 2>&1
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    tar -czf "$OUT/gpu_check.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
    cp "$out/summary.md" "$OUT/summary.md"
  fi
}
# bounded CMD...: runs CMD within what is left of the budget (timeout stops its whole process
# group): CMD's status, 124 or 137 when stopped, 253 when nothing was left to run it in.
bounded() {
  local rest
  rest=$(left)
  if [ "$rest" -le 5 ]; then
    echo "gpu_check: not run: the budget of $budget s is spent"
    return 253
  fi
  timeout -k 5 "$rest" "$@"
}
# record NAME STATUS: a failure under NAME unless STATUS is 0.
record() {
  case "$2" in
    0) ;;
    124 | 137) failed+=("$1 (stopped at the budget of $budget s)") ;;
    253) failed+=("$1 (not run: the budget of $budget s was spent)") ;;
    *) failed+=("$1 (exit $2)") ;;
  esac
}
# step NAME CMD...: runs CMD bounded, its output shown and kept in $out/NAME.txt; returns CMD's
# status.
step() {
  local name="$1"
  shift
  bounded "$@" 2>&1 | tee "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  record "$name" "$rc"
  save
  return "$rc"
}
# refits BUILD TAG: the two 1 GiB refits of device buffers through the public API (RefitHandle),
# all ranks sharing GPU 0; each report is kept as $out/TAG-SPEC.json.
refits() {
  local b="$1" tag="$2" spec
  for spec in gpu_rows_to_cols_1gib gpu_tp4_to_tp2x2_1gib; do
    bounded "$b/bin/reshard" run "$here/bench/specs/$spec.json" --memory cuda --iters 5 \
      --timeout-ms 60000 --deadline-s 150 --json >"$out/$tag-$spec.json"
    record "reshard run $spec, $tag UCX" $?
    cat "$out/$tag-$spec.json"
    save
  done
}

# python_package TREE NAME: builds TREE's Python extension (step NAME) and lays the package out
# beside it with this checkout's Python files, for PYTHONPATH to import (python_cuda).
python_package() {
  if [ ${#py_args[@]} -eq 0 ]; then return 0; fi
  step "$2" cmake --build "$1" -j"$jobs" --target _reshard &&
    cp "$here"/python/reshard/*.py "$1/python/reshard/"
  export PYTHONPATH="$1/python"
}

python_package "$build" python-build
log "run (ctest -L gpu)"
step ctest bash -c "cd '$build' && ctest -L gpu --output-on-failure --timeout 120"

log "pack/unpack kernels against cudaMemcpy"
step pack_bench "$build/bin/pack_bench" --mib 256 --iters 20
pack_rc=$?
measure=1
if [ $pack_rc -eq 3 ]; then
  if [ "${GPU_CHECK_DRY_RUN:-0}" = 0 ]; then
    echo "gpu_check: no usable GPU: the gpu tests skipped and nothing was measured" >&2
    exit 3
  fi
  # The dry run: without a device, both builds and their (skipping) tests, nothing measured; it
  # checks the script's own plumbing on a machine without a GPU.
  unset 'failed[${#failed[@]}-1]' # pack_bench's exit 3
  measure=0
  echo "gpu_check: no usable GPU (GPU_CHECK_DRY_RUN): the builds and tests go on, nothing is measured"
fi
if [ $measure = 1 ]; then
  log "FP8 quantization kernels against cudaMemcpy"
  step quant_bench "$build/bin/quant_bench" --rows 8192 --cols 8192 --iters 20
  log "delta encode/apply kernels against cudaMemcpy; pipelined encode against one by one"
  step delta_gpu_bench "$build/bin/delta_gpu_bench" --mib 8 --iters 20 --pieces 64
  log "staging ring: 1 GiB staged rows -> columns refit of device buffers against cudaMemcpy"
  step put_bench-system "$build/bin/put_bench" --cuda --rows 16384 --cols 32768 --iters 5
  log "reshard run --memory cuda: 1 GiB rows -> columns and TP4 -> TP2 x DP2, against cudaMemcpy"
  refits "$build" system
fi

# The CUDA-aware UCX build (see the header).
wheel="${UCX_WHEEL_FILE:-}"
if [ -z "$wheel" ] && [ -d "$here/build-wheels" ]; then
  driver=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9]*' | grep -o '[0-9]*$')
  wheel=$(ls -t "$here"/build-wheels/libucx_cu"${driver:-x}"-*.whl 2>/dev/null | head -1)
  if [ -z "$wheel" ]; then
    wheel=$(ls -t "$here"/build-wheels/libucx_cu*.whl 2>/dev/null | head -1)
  fi
fi
if [ -n "${UCX_ROOT:-}" ]; then
  log "CUDA-aware UCX: the build above already uses UCX_ROOT=$UCX_ROOT"
elif [ -z "$wheel" ]; then
  log "CUDA-aware UCX: skipped, no wheel (set UCX_WHEEL_FILE, or put libucx_cu13-*.whl or libucx_cu12-*.whl under build-wheels/)"
else
  ucx_build="$build-ucx"
  log "CUDA-aware UCX: build against $(basename "$wheel") in $ucx_build"
  mkdir -p "$ucx_build"
  rm -rf "$ucx_build/ucx" "$ucx_build/CMakeCache.txt" "$ucx_build/CMakeFiles"
  python3 -m zipfile -e "$wheel" "$ucx_build/ucx"
  prefix="$ucx_build/ucx/libucx"
  ucx_targets=(net_gpu_staging_test api_stream_refit_test run_test reshard reshard_rank put_bench)
  # Its binaries load the wheel's UCX: LD_LIBRARY_PATH without Debian's.
  export LD_LIBRARY_PATH="$dep_libs$base_ld_library_path"
  if ! cmake -S "$here" -B "$ucx_build" -DCMAKE_BUILD_TYPE=Release -DUCX_ROOT="$prefix" \
    "${dep_args[@]}" "${py_args[@]}" >"$ucx_build/gpu_check.configure.log" 2>&1 ||
    ! grep -q "reshard: UCX .* from $prefix" "$ucx_build/gpu_check.configure.log"; then
    tail -30 "$ucx_build/gpu_check.configure.log"
    failed+=("the configure against the wheel's UCX")
  elif bounded cmake --build "$ucx_build" -j"$jobs" --target "${ucx_targets[@]}"; then
    "$ucx_build/bin/reshard" info
    python_package "$ucx_build" python-build-cuda-aware
    log "CUDA-aware UCX: gpu tests with UCX_TLS=posix,sysv,cma,self,cuda_copy,cuda_ipc"
    step ctest-cuda-aware bash -c "cd '$ucx_build' && \
      RESHARD_TEST_UCX_TLS=posix,sysv,cma,self,cuda_copy,cuda_ipc ctest -L gpu \
      -R '^((GpuStaging|StreamRefitCudaTest|RunGpuTest)\.|python_cuda$)' --output-on-failure \
      --timeout 120"
    if [ $measure = 1 ]; then
      log "CUDA-aware UCX: 1 GiB rows -> columns (put_bench) against cudaMemcpy"
      step put_bench-cuda-aware "$ucx_build/bin/put_bench" --cuda --rows 16384 --cols 32768 \
        --iters 5 --tls posix,sysv,cma,self,cuda_copy,cuda_ipc
      log "CUDA-aware UCX: reshard run --memory cuda"
      refits "$ucx_build" cuda-aware
    fi
  else
    record "the build against the wheel's UCX" $?
  fi
fi

log "summary (also in $out/summary.md)"
save
cat "$out/summary.md"
log "done"
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'gpu_check: failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
if [ $measure = 0 ]; then
  echo "gpu_check: no usable GPU: the gpu tests skipped and nothing was measured" >&2
  exit 3
fi
exit 0
