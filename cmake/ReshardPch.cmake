# One precompiled header of the third-party headers the library, the tools, the benchmarks and
# the examples parse (the standard library and Abseil): parsing them was over half of a typical
# source file's compile time (docs/testing.md, "Build time"). reshard_precompile_targets(DIR...)
# gives it to every C++ target of those folders: two targets precompile it (one for libraries,
# one for executables), the others reuse it, so all must keep the project's compile flags (definitions of their own are fine: gcc and clang
# accept definitions the header does not use). The tests have their own (tests/CMakeLists.txt,
# RESHARD_TEST_PCH). RESHARD_PCH=OFF turns it off: a file that forgot to include a standard or
# Abseil header it uses compiles with the precompiled header and fails without it, so a build
# with RESHARD_PCH=OFF is the check of includes.
option(RESHARD_PCH "Precompile the library's and tools' third-party headers" ON)
set(reshard_pch_headers
    <algorithm> <atomic> <chrono> <cstdint> <cstdio> <cstdlib> <cstring> <fstream> <functional>
    <map> <memory> <mutex> <optional> <set> <string> <string_view> <utility> <vector>
    <absl/container/flat_hash_map.h> <absl/status/status.h> <absl/status/statusor.h>
    <absl/strings/match.h> <absl/strings/numbers.h> <absl/strings/str_cat.h>
    <absl/strings/str_format.h> <absl/strings/str_join.h> <absl/strings/str_split.h>
    <absl/strings/string_view.h> <absl/time/time.h> <absl/types/span.h>)

# reshard_precompile_targets(DIR...): every C++ target defined in the folders (and their
# subfolders) that has no precompiled header of its own takes this one.
function(reshard_precompile_targets)
  if(NOT RESHARD_PCH)
    return()
  endif()
  set(headers "")
  foreach(header IN LISTS reshard_pch_headers)
    list(APPEND headers "$<$<COMPILE_LANGUAGE:CXX>:${header}>")
  endforeach()
  # Two owners precompile the header, one for libraries (-fPIC) and one for executables
  # (-fPIE: gcc refuses a header precompiled with the other), targets of their own that depend on
  # nothing, so every other can reuse one (a library owning it would make each target that links
  # that library depend on it and it on them).
  set(source ${PROJECT_BINARY_DIR}/generated/reshard_pch.cc)
  file(WRITE ${source} "// An owner of the precompiled header (cmake/ReshardPch.cmake).\n"
                       "int main() { return 0; }\n")
  add_library(reshard_pch OBJECT ${source})
  add_executable(reshard_pch_exe ${source})
  foreach(owner reshard_pch reshard_pch_exe)
    target_precompile_headers(${owner} PRIVATE ${headers})
    # Abseil's include folder (and definitions), which is not the compiler's own where Abseil
    # does not lie under /usr (tools/gpu_check.sh builds against an unpacked one).
    target_link_libraries(${owner} PRIVATE absl::flat_hash_map absl::status absl::statusor
                          absl::strings absl::str_format absl::time absl::span)
  endforeach()
  set(dirs ${ARGN})
  while(dirs)
    list(POP_FRONT dirs dir)
    get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    list(APPEND dirs ${subdirs})
    get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
      get_target_property(type ${target} TYPE)
      if(NOT type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$")
        continue()
      endif()
      get_target_property(own ${target} PRECOMPILE_HEADERS)
      get_target_property(reused ${target} PRECOMPILE_HEADERS_REUSE_FROM)
      if(own OR reused)  # the owners, and the test binaries (reshard_add_test)
        continue()
      endif()
      get_target_property(sources ${target} SOURCES)
      list(FILTER sources INCLUDE REGEX "\\.(cc|cpp|cxx)$")
      if(NOT sources)
        continue()
      endif()
      if(type STREQUAL "EXECUTABLE")
        target_precompile_headers(${target} REUSE_FROM reshard_pch_exe)
      else()
        target_precompile_headers(${target} REUSE_FROM reshard_pch)
      endif()
    endforeach()
  endwhile()
endfunction()
