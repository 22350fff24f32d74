#!/usr/bin/env bash
# The sanitizer stages of scripts/test.sh (docs/testing.md), runnable alone:
#   scripts/sanitizers.sh [asan] [tsan] [fuzz]     (all three when none is named)
# asan: every target but the benchmarks under ASan + UBSan (build-asan/), ctest on the unit,
#       multiproc and netns suites. With clang the tree is also the fuzzing tree: every file
#       carries libFuzzer's edge counters (RESHARD_FUZZ_INSTRUMENTATION=counters, cheap to build
#       and run), so the fuzz stage builds only its harnesses instead of a third tree. tsan: the net, api, rendezvous and launcher suites and what
#       they need under TSan (build-tsan/), ctest on those suites.
# A stage fails when a test fails, when no test ran, or when any process wrote a sanitizer
# report (also one whose failure its test expected); the script then exits 1 after the others.
# Environment: RESHARD_ASAN_DIR, RESHARD_TSAN_DIR, RESHARD_FUZZ_DIR (build trees; the fuzz stage
# uses the ASan tree unless RESHARD_FUZZ_DIR names another), RESHARD_SANITIZER_CC and
# RESHARD_SANITIZER_CXX (default clang, clang++), RESHARD_JOBS, RESHARD_TEST_JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
jobs="${RESHARD_JOBS:-$(nproc)}"
test_jobs="${RESHARD_TEST_JOBS:-2}"
cc="${RESHARD_SANITIZER_CC:-clang}"
cxx="${RESHARD_SANITIZER_CXX:-clang++}"
stages=("$@")
if [ ${#stages[@]} -eq 0 ]; then stages=(asan tsan fuzz); fi

# Tests that cannot run under a sanitizer, each with its reason (docs/testing.md lists them).
# Names are ctest regular expressions, joined into one -E.
asan_excluded=(
  # Installs the library and builds examples/ against it with a plain compiler: a packaging
  # check (the normal stage runs it) that an instrumented libreshard.so cannot pass.
  '^api_install_and_build_examples$'
  # Loads libreshard.so into the uninstrumented Python interpreter through ctypes: the ASan
  # runtime would have to be preloaded; the C API it drives runs instrumented in api_test.
  '^api_python_ctypes$'
  # Needs operator new to throw bad_alloc for a 2^56-byte request; ASan's allocator reports
  # allocation-size-too-big and aborts instead (sanitizer allocators never throw). The same
  # suite's other limit tests run.
  '^SpecLimitsTest\.VerifyBeyondWhatTheHostCanAllocateIsResourceExhausted$'
  # Compares the quantizer's numbers with ml_dtypes through a Python driver that starts quant_tool
  # some thirty times: a numerical check, 20 s in the normal stage and 47 s instrumented. The
  # same QuantizeTile code runs under ASan in plan_quantize_test and the quantized refit tests.
  '^quant_ml_dtypes$'
)
# The same two families run once each under ASan: all of them over both transports in the
# normal stage, the example specs over shared memory (puts) and the random specs over tcp
# (active messages) here, so both delivery paths meet varied plans instrumented. Each took
# 19-27 s under ASan, a sixth of the stage.
asan_only_excluded=(
  '^MultiprocRefit\.ExamplesOverTcp$'
  '^MultiprocRefit\.FiftyRandomSpecsOverSharedMemory$'
)
tsan_excluded=(
  "${asan_excluded[@]}"
  # Data-plane variety, not threads: every example spec, fifty random specs, relays of relays
  # and quantized deltas between rank processes whose threads (rank 0's store server, UCX's
  # async thread) are those of the shorter multi-process tests that do run here. The normal and
  # ASan stages run them; under TSan they took 23-37 s each, half of the stage.
  '^MultiprocRefit\.ExamplesOver(SharedMemory|Tcp)$'
  '^MultiprocRefit\.FiftyRandomSpecsOver(SharedMemory|Tcp)$'
  '^RunNetnsTest\.(RelaysForwardRunsBeforeTheirPieceLanded|DeltaRelaysForwardSegmentsBeforeTheirPieceLanded)$'
  '^RunTest\.DeltaRefitsOfQuantizedDestinationsVerifyTheChangedFp8$'
  # Measures the engine's set-up heap; TSan's allocator count leaves out large (mmapped)
  # allocations, which are exactly what it looks for, so under TSan it would measure nothing.
  # It runs in the normal build (glibc's count) and under ASan (ASan's count).
  '^RefitEngine\.SetUpMemoryDoesNotScaleWithWorldTransfers$'
)
# The folders of the TSan tree whose tests run: the suites with threads of their own (the store
# server thread every rank 0 runs, clients shared across threads, the launcher's Kill() while
# Wait() runs, UCX's async thread). Built: those and the programs their tests launch
# (tools/reshard: reshard-rank, `reshard run`, `reshard bench`).
tsan_dirs=(tests/net tests/api tests/rendezvous tests/launcher)

# UCX patches malloc/mmap to track memory (its "memory hooks"): that fights the sanitizers'
# own interceptors, so both run with the hooks off (registration caching is then off too,
# which the engine does not rely on: it registers each buffer once).
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no
supp="$root/tools/sanitizers"
symbolizer="$(command -v llvm-symbolizer || true)"
if [ -n "$symbolizer" ]; then
  export ASAN_SYMBOLIZER_PATH="$symbolizer" TSAN_SYMBOLIZER_PATH="$symbolizer"
fi

now() { date +%s; }
# configure DIR SANITIZERS [CMAKE ARGS...]: creates or updates a sanitizer tree.
configure() {
  local dir="$1" sanitize="$2" launcher=() python=()
  shift 2
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  # The interpreter with numpy and ml_dtypes (scripts/python-env.sh), as scripts/build.sh passes
  # it: a tree configured before the venv existed would otherwise keep the system python3.
  local venv="${RESHARD_PYENV:-$root/.venv}"
  if [ -x "$venv/bin/python3" ]; then python=(-DRESHARD_PYTHON="$venv/bin/python3"); fi
  mkdir -p "$dir"
  # Line tables (-g1) are all a sanitizer report needs to name files and lines (scripts/build.sh).
  local g=-g1
  if [ "${RESHARD_DEBUG_INFO:-lines}" = full ]; then g=-g; fi
  # Unity builds (8 files per translation unit) cut the sanitizer trees' compile time by about a
  # quarter; the normal tree compiles file by file, so it still catches a missing include.
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 $g -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 $g -DNDEBUG" \
    -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" "${python[@]}" -DRESHARD_SANITIZE="$sanitize" "$@" \
    >"$dir/reshard-configure.log" 2>&1 || {
    cat "$dir/reshard-configure.log" >&2
    exit 1
  }
}
# build_dirs DIR SUBDIR...: builds the targets of the given folders of the tree (and what they
# depend on) with either generator.
build_dirs() {
  local dir="$1"
  shift
  if grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' "$dir/CMakeCache.txt"; then
    local targets=()
    for sub in "$@"; do targets+=("$sub/all"); done
    cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
  else
    for sub in "$@"; do cmake --build "$dir/$sub" -j "$jobs"; done
  fi
}
join_regex() {
  local IFS='|'
  echo "$*"
}
# Every sanitizer report goes to a file under DIR/sanitizer-reports (log_path), so that a report
# from a process whose failure a test expects (a rank it kills, a peer it watches fail) is still
# a failure of the stage. reports_dir DIR: empties it and prints its path.
reports_dir() {
  rm -rf "$1/sanitizer-reports"
  mkdir -p "$1/sanitizer-reports"
  echo "$(cd "$1" && pwd)/sanitizer-reports"
}
# check_reports DIR STAGE: prints every report and fails when there is one.
check_reports() {
  local files
  files=$(find "$1" -type f -size +0 | sort)
  if [ -n "$files" ]; then
    for f in $files; do
      echo "==== $f"
      cat "$f"
    done
    echo "sanitizers: $2: $(echo "$files" | wc -l) sanitizer report(s) above" >&2
    return 1
  fi
}

# The ASan tree doubles as the fuzzing tree when the compiler is clang (libFuzzer is clang's).
asan_dir="${RESHARD_ASAN_DIR:-build-asan}"
fuzz_args=(-DRESHARD_FUZZ=ON -DRESHARD_FUZZ_SECONDS="${RESHARD_FUZZ_SECONDS:-10}"
  -DRESHARD_FUZZ_INSTRUMENTATION=counters)
asan_args=()
if "$cxx" --version 2>/dev/null | grep -qi clang; then asan_args=("${fuzz_args[@]}"); fi

failed=0
for stage in "${stages[@]}"; do
  case "$stage" in
    asan)
      dir="$asan_dir"
      t0=$(now)
      configure "$dir" "address,undefined" "${asan_args[@]}"
      cmake --build "$dir" -j "$jobs"
      t1=$(now)
      echo "sanitizers: ASan+UBSan build $((t1 - t0)) s"
      reports=$(reports_dir "$dir")
      status=0
      # One log_path for both: UBSan runs inside the ASan runtime and shares its common flags.
      # Leak checking is on by default; detect_leaks is left unset so that reshard-bench-mpi's
      # own default (off: Open MPI leaks by design, see tools/reshard/bench_mpi.cc) applies.
      ubsan="print_stacktrace=1:halt_on_error=1:log_path=$reports/report"
      ASAN_OPTIONS="halt_on_error=1:log_path=$reports/report" \
      LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0" \
      UBSAN_OPTIONS="$ubsan:suppressions=$supp/ubsan.supp" \
        ctest --test-dir "$dir" --output-on-failure --no-tests=error -j "$test_jobs" \
        --timeout 600 -L 'unit|multiproc|netns' \
        -E "$(join_regex "${asan_excluded[@]}" "${asan_only_excluded[@]}")" ||
        status=$?
      check_reports "$reports" "ASan+UBSan" || status=1
      echo "sanitizers: ASan+UBSan tests $(($(now) - t1)) s"
      ;;
    tsan)
      dir="${RESHARD_TSAN_DIR:-build-tsan}"
      t0=$(now)
      configure "$dir" "thread"
      build_dirs "$dir" "${tsan_dirs[@]}" tools/reshard
      t1=$(now)
      echo "sanitizers: TSan build $((t1 - t0)) s"
      reports=$(reports_dir "$dir")
      status=0
      tsan="halt_on_error=1:second_deadlock_stack=1:log_path=$reports/report"
      for sub in "${tsan_dirs[@]}"; do
        TSAN_OPTIONS="$tsan:suppressions=$supp/tsan.supp" \
          ctest --test-dir "$dir/$sub" --output-on-failure --no-tests=error -j "$test_jobs" \
          --timeout 600 -L 'unit|multiproc|netns' -E "$(join_regex "${tsan_excluded[@]}")" ||
          status=$?
      done
      check_reports "$reports" "TSan" || status=1
      echo "sanitizers: TSan tests $(($(now) - t1)) s"
      ;;
    fuzz)
      # libFuzzer under ASan+UBSan: every harness of tests/fuzz fuzzes for RESHARD_FUZZ_SECONDS
      # (default 10) from its checked-in corpus, in the ASan tree (built by that stage; alone,
      # only the harnesses and their libraries build there) or RESHARD_FUZZ_DIR.
      dir="${RESHARD_FUZZ_DIR:-$asan_dir}"
      t0=$(now)
      configure "$dir" "address,undefined" "${fuzz_args[@]}"
      build_dirs "$dir" tests/fuzz
      t1=$(now)
      echo "sanitizers: fuzz build $((t1 - t0)) s"
      status=0
      LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0" \
      UBSAN_OPTIONS="print_stacktrace=1:suppressions=$supp/ubsan.supp" \
        ctest --test-dir "$dir/tests/fuzz" --output-on-failure --no-tests=error -j "$test_jobs" \
        -L fuzz || status=$?
      echo "sanitizers: fuzz runs $(($(now) - t1)) s"
      ;;
    *)
      echo "sanitizers: unknown stage '$stage' (asan, tsan, fuzz)" >&2
      exit 2
      ;;
  esac
  if [ "$status" -ne 0 ]; then
    echo "sanitizers: the $stage stage failed" >&2
    failed=1
  fi
done
exit "$failed"
