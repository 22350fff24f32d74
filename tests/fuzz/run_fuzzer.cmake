# Runs one libFuzzer harness for a bounded time (the `fuzz` ctests of tests/fuzz/CMakeLists.txt).
#
#   cmake -DFUZZER=bin -DWORK_DIR=dir -DCORPUS=dir -DREGRESSIONS=dir -DSECONDS=n [-DDICT=file]
#         [-DARGS=flag|flag] -P run_fuzzer.cmake
#
# WORK_DIR is emptied and receives what libFuzzer writes: new inputs (WORK_DIR/corpus, the first
# corpus directory, the only one libFuzzer writes to) and findings (WORK_DIR/artifacts). The
# checked-in CORPUS and REGRESSIONS are only read. Fails when libFuzzer reports anything: a crash,
# a RESHARD_CHECK, a sanitizer report, a leak, an input slower than 60 s (a hang: inputs at the
# documented limits of a spec take up to tens of seconds in a sanitizer tree) or a process above
# 2 GiB.
foreach(var FUZZER WORK_DIR CORPUS SECONDS)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_fuzzer.cmake: -D${var}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR}/corpus ${WORK_DIR}/artifacts)
set(dirs ${WORK_DIR}/corpus ${CORPUS})
if(REGRESSIONS AND IS_DIRECTORY ${REGRESSIONS})
  list(APPEND dirs ${REGRESSIONS})
endif()
set(flags -max_total_time=${SECONDS} -timeout=60 -rss_limit_mb=2048 -print_final_stats=1
          -artifact_prefix=${WORK_DIR}/artifacts/)
if(DICT)
  list(APPEND flags -dict=${DICT})
endif()
if(ARGS)
  string(REPLACE "|" ";" extra "${ARGS}")
  list(APPEND flags ${extra})
endif()

string(REPLACE ";" " " command "${FUZZER};${flags};${dirs}")
message(STATUS "${command}")
execute_process(COMMAND ${FUZZER} ${flags} ${dirs} RESULT_VARIABLE rc)
file(GLOB findings ${WORK_DIR}/artifacts/*)
if(NOT rc EQUAL 0 OR findings)
  if(findings)
    string(REPLACE ";" "\n  " findings "${findings}")
  else()
    set(findings "(libFuzzer saved none: see its output above)")
  endif()
  message(FATAL_ERROR
    "${FUZZER} found a problem (exit status ${rc}); the input that shows it:\n  ${findings}\n"
    "Reproduce it with `${FUZZER} FILE`, fix the code, and add FILE to ${REGRESSIONS}/ with a "
    "regression test (docs/testing.md, \"Fuzzing\").")
endif()
