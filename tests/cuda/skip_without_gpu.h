// The kernel tests' one skip: they need a usable CUDA device (gpu label; docs/testing.md).
#pragma once

#include <string>

#include "gtest/gtest.h"
#include "src/cuda/runtime.h"

// Inside a TEST body: skips it, saying why, when no CUDA device is usable here.
#define SKIP_WITHOUT_GPU()                                                                     \
  do {                                                                                         \
    std::string why;                                                                           \
    if (::reshard::cuda::CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no usable GPU: " << why; \
  } while (0)
