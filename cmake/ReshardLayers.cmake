# The layering of DESIGN §3, checked on every build (and as the ctest test `layering_test`):
# each folder of src/ may include only the layers below it, net and nvlink never include each
# other, the programs that move data (reshard-rank, reshard-bench-rank, the launcher, the
# examples) include only the public headers ("reshard/...") and their own, and the rest of the
# CLI adds only the pure-host planner (src/plan, src/common) for its offline commands.
#
#   cmake -DSOURCE_DIR=<repo> [-DSTAMP=<file>] -P cmake/ReshardLayers.cmake
#
# Fails (FATAL_ERROR, which fails the build) naming every offending file, line and include.
cmake_policy(SET CMP0007 NEW)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "ReshardLayers.cmake: pass -DSOURCE_DIR=<repository root>")
endif()

# layer -> the src/ folders it may include (itself included).
set(allowed_common "common")
set(allowed_plan "common|plan")
set(allowed_cuda "common|cuda")
set(allowed_rendezvous "common|rendezvous")
set(allowed_net "common|plan|cuda|rendezvous|net")
set(allowed_nvlink "common|plan|cuda|rendezvous|nvlink")
set(allowed_api "common|plan|cuda|rendezvous|net|nvlink|api")
set(layers common plan cuda rendezvous net nvlink api)

set(failures "")
set(checked 0)
foreach(layer IN LISTS layers)
  file(GLOB_RECURSE files "${SOURCE_DIR}/src/${layer}/*.h" "${SOURCE_DIR}/src/${layer}/*.cc"
       "${SOURCE_DIR}/src/${layer}/*.cu" "${SOURCE_DIR}/src/${layer}/*.cuh")
  foreach(f IN LISTS files)
    math(EXPR checked "${checked} + 1")
    file(STRINGS "${f}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"src/")
    foreach(inc IN LISTS includes)
      string(REGEX REPLACE ".*\"src/([a-z_]+)/.*" "\\1" target "${inc}")
      if(NOT target MATCHES "^(${allowed_${layer}})$")
        file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
        string(STRIP "${inc}" inc)
        list(APPEND failures "${rel}: src/${layer} must not include src/${target} (${inc})")
      endif()
    endforeach()
  endforeach()
endforeach()

# Programs that move data: the public library only ("reshard/..."), their own folder's headers,
# and two header-only files of src/common (status macros, JSON escaping): nothing to link.
file(GLOB public_programs
     "${SOURCE_DIR}/tools/launcher/*.h" "${SOURCE_DIR}/tools/launcher/*.cc"
     "${SOURCE_DIR}/tools/reshard/rank*.h" "${SOURCE_DIR}/tools/reshard/rank*.cc"
     "${SOURCE_DIR}/tools/reshard/bench_rank.cc" "${SOURCE_DIR}/tools/reshard/bench_mpi.cc"
     "${SOURCE_DIR}/tools/reshard/tile_fill.*"
     "${SOURCE_DIR}/examples/*.h" "${SOURCE_DIR}/examples/*.cc")
foreach(f IN LISTS public_programs)
  math(EXPR checked "${checked} + 1")
  file(STRINGS "${f}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"src/")
  foreach(inc IN LISTS includes)
    if(NOT inc MATCHES "\"src/common/(status|escape).h\"")
      file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
      string(STRIP "${inc}" inc)
      list(APPEND failures "${rel}: a program that moves data uses the public API only (${inc})")
    endif()
  endforeach()
endforeach()

# The CLI's own commands: the public library, plus the pure-host planner (src/plan, src/common)
# for the offline commands (plan, sim, spec generation); nothing of the data plane.
file(GLOB cli_files "${SOURCE_DIR}/tools/reshard/*.h" "${SOURCE_DIR}/tools/reshard/*.cc")
foreach(f IN LISTS cli_files)
  math(EXPR checked "${checked} + 1")
  file(STRINGS "${f}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](src/|ucp/|ucs/|uct/|cuda|nccl)")
  foreach(inc IN LISTS includes)
    if(NOT inc MATCHES "\"src/(plan|common)/")
      file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
      string(STRIP "${inc}" inc)
      list(APPEND failures "${rel}: the CLI uses the public API and the planner only (${inc})")
    endif()
  endforeach()
endforeach()

if(checked EQUAL 0)
  message(FATAL_ERROR "ReshardLayers.cmake: no source file found under ${SOURCE_DIR}: the check saw nothing")
endif()
if(failures)
  string(REPLACE ";" "\n  " text "${failures}")
  message(FATAL_ERROR "layering violated (DESIGN §3):\n  ${text}")
endif()
if(STAMP)
  file(WRITE "${STAMP}" "${checked} files checked\n")
endif()
message(STATUS "layering: ${checked} files follow DESIGN §3")
