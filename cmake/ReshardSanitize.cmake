# Sanitizer builds: -DRESHARD_SANITIZE=address,undefined (ASan + UBSan) or thread (TSan).
# Compiles and links every target of the tree with the sanitizer; UBSan findings abort (a finding
# fails its test instead of scrolling by). CUDA/NCCL and the benchmarks are off in these trees:
# the CUDA runtime is not instrumented and the benchmarks are not tests. Prefer clang (the tree
# scripts/test.sh configures uses it, so libFuzzer harnesses can share the ASan tree); GCC works
# for ASan/UBSan/TSan too. RESHARD_SANITIZE_OPT is the optimisation and debug level appended
# after the build type's flags, to keep sanitizer builds quick while stacks keep their lines.
set(RESHARD_SANITIZE "" CACHE STRING "Sanitizers: empty, address,undefined, or thread")
set_property(CACHE RESHARD_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")

if(RESHARD_SANITIZE)
  set(reshard_sanitize_known address,undefined undefined,address address undefined thread)
  if(NOT RESHARD_SANITIZE IN_LIST reshard_sanitize_known)
    message(FATAL_ERROR "RESHARD_SANITIZE='${RESHARD_SANITIZE}': use address,undefined or thread")
  endif()
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    set(reshard_sanitize_debug -gline-tables-only)
  else()
    set(reshard_sanitize_debug -g1)
  endif()
  set(RESHARD_SANITIZE_OPT "-O1;${reshard_sanitize_debug}" CACHE STRING
      "Optimisation and debug flags of sanitizer builds (a list, after the build type's flags)")
  set(reshard_sanitize_flags -fsanitize=${RESHARD_SANITIZE} -fno-omit-frame-pointer)
  if(RESHARD_SANITIZE MATCHES "undefined")
    list(APPEND reshard_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options(${reshard_sanitize_flags} ${RESHARD_SANITIZE_OPT})
  add_link_options(${reshard_sanitize_flags})
  # Normal variables shadow the cache options (CMP0077): a sanitizer tree never builds these.
  set(RESHARD_WITH_CUDA OFF)
  set(RESHARD_BUILD_BENCHMARKS OFF)
  string(JOIN " " reshard_sanitize_shown ${reshard_sanitize_flags} ${RESHARD_SANITIZE_OPT})
  message(STATUS "reshard: sanitizers ${RESHARD_SANITIZE} (${reshard_sanitize_shown}); "
                 "CUDA and benchmarks off")
endif()
