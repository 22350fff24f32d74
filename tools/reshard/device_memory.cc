#include "tools/reshard/device_memory.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"

namespace reshard::cli::gpu {
namespace {

// The CUDA runtime calls used here, with the C ABI of cuda_runtime_api.h (cudaError_t and
// cudaMemcpyKind are ints), so the CLI needs no CUDA header and links nothing of CUDA.
constexpr int kSuccess = 0;
constexpr int kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3;

struct Runtime {
  void* handle = nullptr;
  std::string error;  // Why the runtime could not be loaded.
  int (*get_device_count)(int*) = nullptr;
  int (*set_device)(int) = nullptr;
  int (*get_device)(int*) = nullptr;
  int (*device_get_pci_bus_id)(char*, int, int) = nullptr;
  int (*malloc)(void**, size_t) = nullptr;
  int (*free)(void*) = nullptr;
  int (*memcpy)(void*, const void*, size_t, int) = nullptr;
  int (*memset)(void*, int, size_t) = nullptr;
  int (*device_synchronize)() = nullptr;
  const char* (*get_error_string)(int) = nullptr;
  int (*get_last_error)() = nullptr;
};

template <typename F>
bool Bind(void* handle, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  return *out != nullptr;
}

// The process's libcudart: the one libreshard loaded (the same soname resolves to it), else the
// first of the usual names that loads.
const Runtime& Cuda() {
  static const Runtime* runtime = [] {
    auto* r = new Runtime;
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so",
                             "/usr/local/cuda/lib64/libcudart.so"}) {
      r->handle = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (r->handle != nullptr) break;
    }
    if (r->handle == nullptr) {
      const char* why = dlerror();
      r->error = absl::StrCat("the CUDA runtime (libcudart) cannot be loaded: ",
                              why != nullptr ? why : "not found");
      return r;
    }
    void* h = r->handle;
    const bool all = Bind(h, "cudaGetDeviceCount", &r->get_device_count) &&
                     Bind(h, "cudaSetDevice", &r->set_device) &&
                     Bind(h, "cudaGetDevice", &r->get_device) &&
                     Bind(h, "cudaDeviceGetPCIBusId", &r->device_get_pci_bus_id) &&
                     Bind(h, "cudaMalloc", &r->malloc) && Bind(h, "cudaFree", &r->free) &&
                     Bind(h, "cudaMemcpy", &r->memcpy) && Bind(h, "cudaMemset", &r->memset) &&
                     Bind(h, "cudaDeviceSynchronize", &r->device_synchronize) &&
                     Bind(h, "cudaGetErrorString", &r->get_error_string) &&
                     Bind(h, "cudaGetLastError", &r->get_last_error);
    if (!all) {
      r->error = "the loaded libcudart lacks a runtime call reshard run uses";
      r->handle = nullptr;
    }
    return r;
  }();
  return *runtime;
}

absl::Status Error(int err, const char* call) {
  const Runtime& c = Cuda();
  c.get_last_error();  // Keep later calls clean.
  return absl::InternalError(absl::StrCat(call, ": ", c.get_error_string(err)));
}

absl::Status Loaded() {
  const Runtime& c = Cuda();
  return c.handle != nullptr ? absl::OkStatus() : absl::FailedPreconditionError(c.error);
}

}  // namespace

int Devices(std::string* why) {
  const Runtime& c = Cuda();
  if (c.handle == nullptr) {
    *why = c.error;
    return 0;
  }
  int count = 0;
  if (const int err = c.get_device_count(&count); err != kSuccess) {
    *why = absl::StrCat("cudaGetDeviceCount: ", c.get_error_string(err));
    c.get_last_error();
    return 0;
  }
  if (count == 0) *why = "cudaGetDeviceCount reports no devices";
  return count;
}

absl::Status SelectForLocalRank(int local_rank) {
  std::string why;
  const int count = Devices(&why);
  if (count == 0) return absl::FailedPreconditionError(why);
  const int err = Cuda().set_device(local_rank % count);
  return err == kSuccess ? absl::OkStatus() : Error(err, "cudaSetDevice");
}

std::string CurrentBusId() {
  const Runtime& c = Cuda();
  int device = 0;
  char id[32] = {0};
  if (c.handle == nullptr || c.get_device(&device) != kSuccess ||
      c.device_get_pci_bus_id(id, sizeof(id), device) != kSuccess) {
    if (c.handle != nullptr) c.get_last_error();
    return "";
  }
  return id;
}

absl::StatusOr<void*> Alloc(int64_t bytes) {
  if (absl::Status st = Loaded(); !st.ok()) return st;
  void* ptr = nullptr;
  const int err = Cuda().malloc(&ptr, static_cast<size_t>(bytes));
  if (err != kSuccess) return Error(err, "cudaMalloc");
  return ptr;
}

void Free(void* ptr) {
  if (ptr != nullptr && Cuda().handle != nullptr) Cuda().free(ptr);
}

absl::Status ToDevice(void* device, const void* host, int64_t bytes) {
  if (absl::Status st = Loaded(); !st.ok()) return st;
  const int err = Cuda().memcpy(device, host, static_cast<size_t>(bytes), kHostToDevice);
  return err == kSuccess ? absl::OkStatus() : Error(err, "cudaMemcpy host to device");
}

absl::Status ToHost(void* host, const void* device, int64_t bytes) {
  if (absl::Status st = Loaded(); !st.ok()) return st;
  const int err = Cuda().memcpy(host, device, static_cast<size_t>(bytes), kDeviceToHost);
  return err == kSuccess ? absl::OkStatus() : Error(err, "cudaMemcpy device to host");
}

absl::Status Fill(void* device, uint8_t value, int64_t bytes) {
  if (absl::Status st = Loaded(); !st.ok()) return st;
  int err = Cuda().memset(device, value, static_cast<size_t>(bytes));
  if (err == kSuccess) err = Cuda().device_synchronize();
  return err == kSuccess ? absl::OkStatus() : Error(err, "cudaMemset");
}

absl::StatusOr<double> CopyMs(int64_t bytes, int iters) {
  if (absl::Status st = Loaded(); !st.ok()) return st;
  const Runtime& c = Cuda();
  void* a = nullptr;
  void* b = nullptr;
  int err = c.malloc(&a, static_cast<size_t>(bytes));
  if (err == kSuccess) err = c.malloc(&b, static_cast<size_t>(bytes));
  std::vector<double> ms;
  for (int i = 0; err == kSuccess && i <= iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    err = c.memcpy(b, a, static_cast<size_t>(bytes), kDeviceToDevice);
    // A device-to-device cudaMemcpy returns before the copy ends: wait for it.
    if (err == kSuccess) err = c.device_synchronize();
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    if (i > 0) ms.push_back(took.count());
  }
  Free(a);
  Free(b);
  if (err != kSuccess) return Error(err, "cudaMalloc or cudaMemcpy device to device");
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace reshard::cli::gpu
