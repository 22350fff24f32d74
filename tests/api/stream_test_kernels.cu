#include "tests/api/stream_test_kernels.h"

#include <cuda_runtime.h>

namespace reshard::testing {
namespace {

__device__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void Spin(int64_t nanoseconds) {
  const uint64_t until = GlobalTimer() + static_cast<uint64_t>(nanoseconds);
  while (GlobalTimer() < until) {
  }
}

__global__ void FillRows(int32_t* out, int64_t rows, int64_t cols, int64_t row0,
                         int64_t total_cols, int32_t base) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols;
    const int64_t c = i % cols;
    out[i] = base + static_cast<int32_t>((row0 + r) * total_cols + c);
  }
}

__global__ void Copy(const int32_t* from, int32_t* to, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    to[i] = from[i];
  }
}

}  // namespace

void LaunchSpin(void* stream, int64_t nanoseconds) {
  Spin<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(nanoseconds);
}

void LaunchFillRows(void* stream, int32_t* out, int64_t rows, int64_t cols, int64_t row0,
                    int64_t total_cols, int32_t base) {
  FillRows<<<64, 256, 0, static_cast<cudaStream_t>(stream)>>>(out, rows, cols, row0, total_cols,
                                                               base);
}

void LaunchCopy(void* stream, const int32_t* from, int32_t* to, int64_t n) {
  Copy<<<64, 256, 0, static_cast<cudaStream_t>(stream)>>>(from, to, n);
}

}  // namespace reshard::testing
