# `src/plan` links nothing from UCX, CUDA or NCCL (issue 2).
#   cmake -DCLOSURE=<file> -DPLAN_LIB=<libreshard_plan.a> -DPLAN_BIN=<binary linked only with it>
#         -DNM=<nm> -DREADELF=<readelf> -P deps_test.cmake
# Three independent checks: the configured link closure of the target, the undefined symbols of
# the library archive, and the shared libraries a binary linked only with it needs.
cmake_policy(SET CMP0007 NEW)
set(forbidden_libs "ucp|uct|ucs|ucx|cuda|cudart|nccl|nvrtc|cublas")
set(failures "")

file(READ "${CLOSURE}" closure)
string(REPLACE "\n" ";" closure "${closure}")
foreach(item IN LISTS closure)
  string(TOLOWER "${item}" lower)
  if(lower MATCHES "(^|[/:_.-])(${forbidden_libs})")
    list(APPEND failures "reshard_plan links ${item}")
  endif()
endforeach()

execute_process(COMMAND "${NM}" -u "${PLAN_LIB}" OUTPUT_VARIABLE undefined RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  list(APPEND failures "nm failed on ${PLAN_LIB}")
endif()
string(REGEX MATCHALL "[ \t](ucp_|uct_|ucs_|cuda[A-Z_]|cu[A-Z][a-z]|nccl)[A-Za-z0-9_]*" symbols
       "${undefined}")
foreach(s IN LISTS symbols)
  list(APPEND failures "libreshard_plan needs symbol ${s}")
endforeach()

execute_process(COMMAND "${READELF}" -d "${PLAN_BIN}" OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  list(APPEND failures "readelf failed on ${PLAN_BIN}")
endif()
string(REGEX MATCHALL "Shared library: \\[[^]]*\\]" needed "${dynamic}")
if(NOT needed)
  list(APPEND failures "readelf found no shared libraries in ${PLAN_BIN}: the check saw nothing")
endif()
foreach(lib IN LISTS needed)
  string(TOLOWER "${lib}" lower)
  if(lower MATCHES "lib(${forbidden_libs})")
    list(APPEND failures "${PLAN_BIN} needs ${lib}")
  endif()
endforeach()

list(LENGTH closure n)
list(LENGTH needed m)
if(failures)
  string(REPLACE ";" "\n  " text "${failures}")
  message(FATAL_ERROR "src/plan must not link UCX, CUDA or NCCL:\n  ${text}")
endif()
message(STATUS "reshard_plan: ${n} link items, ${m} shared libraries, no UCX/CUDA/NCCL")
