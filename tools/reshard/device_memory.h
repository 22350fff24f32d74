// Device memory for `reshard run --memory cuda` (reshard-rank's buffers and the parent's
// cudaMemcpy reference): allocated, filled and read back with the CUDA runtime directly, as a
// training or inference framework does it. The library only receives the pointers, as
// MemoryKind::kCuda buffers.
//
// The runtime is opened with dlopen (libcudart.so.13, .12, then unversioned; the one libreshard
// loaded when it has one), so the CLI links nothing of CUDA (tests/tools_link_test.cmake) and
// needs no CUDA header. Without a loadable runtime every call is FailedPrecondition saying so,
// and Devices() returns 0 with the reason. Thread-compatible; every call runs on the calling
// thread's current device.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard::cli::gpu {

// Usable devices; 0 with `why` set when there is no CUDA runtime, driver or device.
int Devices(std::string* why);
// Makes device `local_rank % Devices()` current (ranks of one host spread over its GPUs; on one
// GPU they share it). FailedPrecondition without a device.
[[nodiscard]] absl::Status SelectForLocalRank(int local_rank);
// The current device's PCI bus id ("0000:65:00.0"), or "" on error.
std::string CurrentBusId();

// cudaMalloc / cudaFree. `bytes` > 0.
[[nodiscard]] absl::StatusOr<void*> Alloc(int64_t bytes);
void Free(void* ptr);
// Synchronous copies between host memory and the device, and a device-side byte fill.
[[nodiscard]] absl::Status ToDevice(void* device, const void* host, int64_t bytes);
[[nodiscard]] absl::Status ToHost(void* host, const void* device, int64_t bytes);
[[nodiscard]] absl::Status Fill(void* device, uint8_t value, int64_t bytes);

// The reference of the GPU figures: the median milliseconds of `iters` device-to-device
// cudaMemcpy calls of `bytes` between two fresh buffers on the current device, each followed by
// cudaDeviceSynchronize (a device-to-device cudaMemcpy returns before the copy ends), after one
// untimed warm-up copy.
[[nodiscard]] absl::StatusOr<double> CopyMs(int64_t bytes, int iters);

}  // namespace reshard::cli::gpu
