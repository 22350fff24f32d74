#include "tools/reshard/device_memory.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"

#if RESHARD_CLI_CUDA
#include <cuda_runtime_api.h>
#endif

namespace reshard::cli::gpu {

#if RESHARD_CLI_CUDA

namespace {
absl::Status Error(cudaError_t err, const char* call) {
  cudaGetLastError();  // Keep later calls clean.
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorString(err)));
}
}  // namespace

bool Built() { return true; }

int Devices(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *why = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err));
    cudaGetLastError();
    return 0;
  }
  if (count == 0) *why = "cudaGetDeviceCount reports no devices";
  return count;
}

absl::Status SelectForLocalRank(int local_rank) {
  std::string why;
  const int count = Devices(&why);
  if (count == 0) return absl::FailedPreconditionError(why);
  const cudaError_t err = cudaSetDevice(local_rank % count);
  return err == cudaSuccess ? absl::OkStatus() : Error(err, "cudaSetDevice");
}

std::string CurrentBusId() {
  int device = 0;
  char id[32] = {0};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetPCIBusId(id, sizeof(id), device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return id;
}

absl::StatusOr<void*> Alloc(int64_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, static_cast<size_t>(bytes));
  if (err != cudaSuccess) return Error(err, "cudaMalloc");
  return ptr;
}

void Free(void* ptr) {
  if (ptr != nullptr) cudaFree(ptr);
}

absl::Status ToDevice(void* device, const void* host, int64_t bytes) {
  const cudaError_t err =
      cudaMemcpy(device, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice);
  return err == cudaSuccess ? absl::OkStatus() : Error(err, "cudaMemcpy host to device");
}

absl::Status ToHost(void* host, const void* device, int64_t bytes) {
  const cudaError_t err =
      cudaMemcpy(host, device, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost);
  return err == cudaSuccess ? absl::OkStatus() : Error(err, "cudaMemcpy device to host");
}

absl::Status Fill(void* device, uint8_t value, int64_t bytes) {
  cudaError_t err = cudaMemset(device, value, static_cast<size_t>(bytes));
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  return err == cudaSuccess ? absl::OkStatus() : Error(err, "cudaMemset");
}

absl::StatusOr<double> CopyMs(int64_t bytes, int iters) {
  void* a = nullptr;
  void* b = nullptr;
  cudaError_t err = cudaMalloc(&a, static_cast<size_t>(bytes));
  if (err == cudaSuccess) err = cudaMalloc(&b, static_cast<size_t>(bytes));
  std::vector<double> ms;
  for (int i = 0; err == cudaSuccess && i <= iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    err = cudaMemcpy(b, a, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice);
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    if (i > 0) ms.push_back(took.count());
  }
  Free(a);
  Free(b);
  if (err != cudaSuccess) return Error(err, "cudaMalloc or cudaMemcpy device to device");
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

#else  // !RESHARD_CLI_CUDA

namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "--memory cuda needs a build with CUDA, and this one has none (configure where "
      "/usr/local/cuda or CUDAToolkit_ROOT holds the toolkit: docs/building.md)");
}
}  // namespace

bool Built() { return false; }
int Devices(std::string* why) {
  *why = "this build of reshard has no CUDA";
  return 0;
}
absl::Status SelectForLocalRank(int) { return NoCuda(); }
std::string CurrentBusId() { return ""; }
absl::StatusOr<void*> Alloc(int64_t) { return NoCuda(); }
void Free(void*) {}
absl::Status ToDevice(void*, const void*, int64_t) { return NoCuda(); }
absl::Status ToHost(void*, const void*, int64_t) { return NoCuda(); }
absl::Status Fill(void*, uint8_t, int64_t) { return NoCuda(); }
absl::StatusOr<double> CopyMs(int64_t, int) { return NoCuda(); }

#endif

}  // namespace reshard::cli::gpu
