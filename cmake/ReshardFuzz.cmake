# Coverage-guided fuzzing with libFuzzer (docs/testing.md, "Fuzzing").
#
# RESHARD_FUZZ=ON (clang only) compiles every C and C++ file of the project with
# -fsanitize=fuzzer-no-link, so libFuzzer sees the coverage of the libraries a harness calls, and
# links every binary with it too (its coverage callbacks must resolve in every executable, also
# those that only load libreshard.so). The harnesses themselves (tests/fuzz, reshard_add_fuzzer)
# are then also linked with -fsanitize=fuzzer and registered as ctests labelled `fuzz`.
# It combines with RESHARD_SANITIZE=address,undefined (or sanitizer flags in CMAKE_CXX_FLAGS):
# the harnesses then fail on any ASan, LSan or UBSan report as well.
#
# With RESHARD_FUZZ=OFF (any compiler) every harness still builds against a small replay main
# and runs over its checked-in corpus and regressions as a `unit` test.
option(RESHARD_FUZZ "Build the libFuzzer harnesses and instrument the libraries (clang only)" OFF)
set(RESHARD_FUZZ_SECONDS 15 CACHE STRING
    "Seconds each `fuzz` ctest fuzzes (libFuzzer -max_total_time)")
# How the project's code is instrumented for libFuzzer: "full" (-fsanitize=fuzzer-no-link:
# 8-bit edge counters plus comparison and indirect-call tracing, the best guidance, for a tree
# that only fuzzes) or "counters" (-fsanitize-coverage=inline-8bit-counters,pc-table: edge
# coverage alone, much cheaper to build and to run, for a tree whose other tests also run:
# scripts/sanitizers.sh's ASan tree doubles as its fuzzing tree that way).
set(RESHARD_FUZZ_INSTRUMENTATION full CACHE STRING "libFuzzer instrumentation: full or counters")
set_property(CACHE RESHARD_FUZZ_INSTRUMENTATION PROPERTY STRINGS full counters)

if(RESHARD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang" OR NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR
      "RESHARD_FUZZ=ON needs clang for C and C++ (libFuzzer), but the compilers are "
      "${CMAKE_C_COMPILER_ID} and ${CMAKE_CXX_COMPILER_ID}: configure a separate build directory "
      "with -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
  endif()
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS -fsanitize=fuzzer)
  set(CMAKE_REQUIRED_LINK_OPTIONS -fsanitize=fuzzer)
  check_cxx_source_compiles([[
    #include <cstddef>
    #include <cstdint>
    extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }
  ]] RESHARD_HAVE_LIBFUZZER)
  unset(CMAKE_REQUIRED_FLAGS)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  if(NOT RESHARD_HAVE_LIBFUZZER)
    message(FATAL_ERROR
      "RESHARD_FUZZ=ON: ${CMAKE_CXX_COMPILER} cannot link -fsanitize=fuzzer (libFuzzer); install "
      "the compiler-rt runtime of this clang (Debian: libclang-rt-<version>-dev or "
      "libclang-common-<version>-dev)")
  endif()
  if(NOT RESHARD_FUZZ_SECONDS MATCHES "^[1-9][0-9]*$")
    message(FATAL_ERROR "RESHARD_FUZZ_SECONDS must be a positive integer, not \"${RESHARD_FUZZ_SECONDS}\"")
  endif()
  if(RESHARD_FUZZ_INSTRUMENTATION STREQUAL "full")
    set(reshard_fuzz_flags -fsanitize=fuzzer-no-link)
  elseif(RESHARD_FUZZ_INSTRUMENTATION STREQUAL "counters")
    set(reshard_fuzz_flags -fsanitize-coverage=inline-8bit-counters,pc-table)
  else()
    message(FATAL_ERROR "RESHARD_FUZZ_INSTRUMENTATION must be full or counters, not "
                        "\"${RESHARD_FUZZ_INSTRUMENTATION}\"")
  endif()
  add_compile_options(${reshard_fuzz_flags})
  add_link_options(${reshard_fuzz_flags})
  message(STATUS "reshard: fuzzing ON (libFuzzer, ${RESHARD_FUZZ_INSTRUMENTATION} "
                 "instrumentation, ${RESHARD_FUZZ_SECONDS} s per `fuzz` test)")
endif()
