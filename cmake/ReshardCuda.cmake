# Detects the CUDA runtime and NCCL without requiring them. Sets RESHARD_HAVE_CUDA and
# RESHARD_HAVE_NCCL and, when found, the imported targets CUDA::cudart and reshard_nccl.
# When the toolkit has nvcc, the CUDA language is enabled for the pack kernels
# (src/cuda/pack_kernels.cu, the project's one .cu file) and RESHARD_HAVE_CUDA_KERNELS is set;
# they are compiled for RESHARD_CUDA_ARCHITECTURES (sm_80, sm_90, sm_100 and compute_100 PTX for
# later GPUs by default) against the shared CUDA runtime, like everything else.
# Never links libcuda (the driver): binaries must start on machines without a GPU driver.
set(RESHARD_HAVE_CUDA OFF)
set(RESHARD_HAVE_NCCL OFF)
set(RESHARD_HAVE_CUDA_KERNELS OFF)
option(RESHARD_WITH_CUDA "Use CUDA and NCCL when found" ON)
set(RESHARD_CUDA_ARCHITECTURES "80-real;90-real;100" CACHE STRING
    "CUDA architectures of the pack kernels (CMAKE_CUDA_ARCHITECTURES syntax)")
if(RESHARD_WITH_CUDA)
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(RESHARD_HAVE_CUDA ON)
    # The toolkit's nvcc, checked in a test project first (check_language): an nvcc that cannot
    # build for this host compiler leaves the kernels out with a warning instead of failing the
    # whole configure. A CMAKE_CUDA_COMPILER given by the user is taken as it is.
    if(NOT DEFINED CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
      set(ENV{CUDACXX} ${CUDAToolkit_NVCC_EXECUTABLE})
      include(CheckLanguage)
      check_language(CUDA)
      if(NOT CMAKE_CUDA_COMPILER)
        message(WARNING "reshard: ${CUDAToolkit_NVCC_EXECUTABLE} cannot build a CUDA test "
                        "program here; the pack kernels are not built")
      endif()
    endif()
    if(CMAKE_CUDA_COMPILER)
      # A CMAKE_CUDA_ARCHITECTURES given on the command line wins (e.g. `native` on a GPU host).
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES ${RESHARD_CUDA_ARCHITECTURES})
      endif()
      # One CUDA runtime per process: the shared one that CUDA::cudart links everywhere else.
      set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
      enable_language(CUDA)
      # CMake 3.25 knows no C++20 dialect flag for nvcc 13; the project is C++20 throughout.
      if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
        set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
        set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      endif()
      # CMake 3.25 detects no implicit include dirs for nvcc 13, so a dependency's -I/usr/include
      # (Abseil's) would become -isystem=/usr/include and break libstdc++'s #include_next.
      list(APPEND CMAKE_CUDA_IMPLICIT_INCLUDE_DIRECTORIES ${CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES})
      set(CMAKE_CUDA_STANDARD 20)
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
      set(RESHARD_HAVE_CUDA_KERNELS ON)
    elseif(NOT CUDAToolkit_NVCC_EXECUTABLE)
      message(STATUS "reshard: the CUDA toolkit has no nvcc; the pack kernels are not built")
    endif()
    find_path(RESHARD_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}/include)
    find_library(RESHARD_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}/lib64)
    if(RESHARD_NCCL_INCLUDE AND RESHARD_NCCL_LIBRARY)
      set(RESHARD_HAVE_NCCL ON)
      add_library(reshard_nccl INTERFACE IMPORTED)
      target_include_directories(reshard_nccl INTERFACE ${RESHARD_NCCL_INCLUDE})
      target_link_libraries(reshard_nccl INTERFACE ${RESHARD_NCCL_LIBRARY})
    endif()
  endif()
endif()
