# The linker: lld when the compiler can use it (RESHARD_LINKER=lld, the default), else the
# toolchain's default. Linking is a tenth of a cold build's CPU time with ld.bfd (every test
# binary links the static layers; ASan trees more so) and lld does it three to six times faster
# (docs/testing.md, "Build time"). RESHARD_LINKER=default keeps the toolchain's linker; naming a
# linker the compiler cannot use is a configure error, not a silent fallback.
set(RESHARD_LINKER "lld" CACHE STRING "Linker: lld (when the compiler can use it), default, or any -fuse-ld= name")
include(CheckLinkerFlag)
if(RESHARD_LINKER STREQUAL "default")
  set(reshard_linker_shown "the toolchain's default")
else()
  string(MAKE_C_IDENTIFIER "reshard_fuse_ld_${RESHARD_LINKER}" reshard_linker_check)
  check_linker_flag(CXX "-fuse-ld=${RESHARD_LINKER}" ${reshard_linker_check})
  if(${reshard_linker_check})
    # C and C++ links only: nvcc's device link takes no -fuse-ld.
    add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fuse-ld=${RESHARD_LINKER}>")
    set(reshard_linker_shown "${RESHARD_LINKER}")
  elseif(RESHARD_LINKER STREQUAL "lld")
    # The default asks for lld where it is installed (scripts/install-deps.sh installs it).
    set(reshard_linker_shown "the toolchain's default (no ld.lld: install lld to link faster)")
  else()
    message(FATAL_ERROR "RESHARD_LINKER=${RESHARD_LINKER}: ${CMAKE_CXX_COMPILER} cannot link with "
                        "-fuse-ld=${RESHARD_LINKER}; use RESHARD_LINKER=default")
  endif()
endif()
message(STATUS "reshard: linker ${reshard_linker_shown}")
