// pack_bench: the pack and unpack kernels (src/cuda/pack.h) against device-to-device cudaMemcpy
// of the same bytes, on one GPU, for run lengths from 4 B to 64 KiB.
//
//   pack_bench [--mib N] [--iters N]     (defaults: 256 MiB of payload per case, 20 iterations)
//
// Every case moves the same payload: runs of R bytes, every other run of a buffer twice the
// payload (one strided region, stride 2R), gathered into a contiguous stream (pack) and
// scattered back (unpack). GB/s is payload bytes / median kernel time (cudaEvent), the same
// convention as the memcpy column (which copies the payload once). A second table times the
// strided-to-strided copy of the CUDA IPC fan-out (runs from 64 B, every other run of one buffer
// into every other run of another) by the copy kernel (DeviceCopyBatches) and by
// cudaMemcpy2DAsync, the two calls the backend chooses between (kMinCopyEngineRun).
// Exit status: 0 after printing the tables, 1 on a CUDA or kernel error, 3 when there is no usable
// CUDA device (the message on stderr says why). It prints figures and never fails on speed.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "src/cuda/pack.h"
#include "src/cuda/pack_batch.h"
#include "src/cuda/runtime.h"

namespace {

constexpr int kExitNoDevice = 3;

bool Check(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "pack_bench: %s: %s\n", call, cudaGetErrorString(err));
  return false;
}

bool Check(const absl::Status& status) {
  if (status.ok()) return true;
  std::fprintf(stderr, "pack_bench: %s\n", std::string(status.message()).c_str());
  return false;
}

// Median milliseconds of `iters` timed runs of `fn` (after two warm-ups); negative on error.
double MedianMs(int iters, cudaStream_t stream, const std::function<bool()>& fn) {
  cudaEvent_t start, stop;
  if (!Check(cudaEventCreate(&start), "cudaEventCreate") ||
      !Check(cudaEventCreate(&stop), "cudaEventCreate")) {
    return -1;
  }
  std::vector<double> times;
  bool ok = true;
  for (int i = 0; i < iters + 2 && ok; ++i) {
    ok = Check(cudaEventRecord(start, stream), "cudaEventRecord") && fn() &&
         Check(cudaEventRecord(stop, stream), "cudaEventRecord") &&
         Check(cudaEventSynchronize(stop), "cudaEventSynchronize (a kernel failed)");
    float ms = 0;
    if (ok) ok = Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (ok && i >= 2) times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!ok) return -1;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 256;
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("usage: pack_bench [--mib N] [--iters N]\n");
      return 0;
    }
    if ((arg == "--mib" || arg == "--iters") && i + 1 < argc) {
      const long v = std::strtol(argv[++i], nullptr, 10);
      if (v <= 0) {
        std::fprintf(stderr, "pack_bench: %s needs a positive number\n", arg.c_str());
        return 2;
      }
      if (arg == "--mib") {
        mib = v;
      } else {
        iters = static_cast<int>(v);
      }
      continue;
    }
    std::fprintf(stderr, "pack_bench: unknown argument %s (see --help)\n", arg.c_str());
    return 2;
  }
  std::string why;
  if (reshard::cuda::CudaDeviceCount(&why) == 0) {
    std::fprintf(stderr, "pack_bench: no CUDA device, nothing measured (%s)\n", why.c_str());
    return kExitNoDevice;
  }
  cudaDeviceProp prop{};
  if (!Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties")) return 1;
  const int64_t payload = mib << 20;
  uint8_t* strided = nullptr;
  uint8_t* packed = nullptr;
  uint8_t* copy = nullptr;
  cudaStream_t stream = nullptr;
  if (!Check(cudaMalloc(reinterpret_cast<void**>(&strided), 2 * payload), "cudaMalloc") ||
      !Check(cudaMalloc(reinterpret_cast<void**>(&packed), payload), "cudaMalloc") ||
      !Check(cudaMalloc(reinterpret_cast<void**>(&copy), payload), "cudaMalloc") ||
      !Check(cudaMemset(strided, 1, 2 * payload), "cudaMemset") ||
      !Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
    return 1;
  }
  const double memcpy_ms = MedianMs(iters, stream, [&] {
    return Check(cudaMemcpyAsync(copy, packed, payload, cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync");
  });
  if (memcpy_ms < 0) return 1;
  const double memcpy_gbs = payload / memcpy_ms / 1e6;
  std::printf("pack_bench: %s (sm_%d%d), %lld MiB of payload per case, median of %d\n", prop.name,
              prop.major, prop.minor, static_cast<long long>(mib), iters);
  std::printf("%10s %12s %12s %12s %10s %10s %6s\n", "run bytes", "pack GB/s", "unpack GB/s",
              "memcpy GB/s", "pack/cpy", "unpack/cpy", "width");
  for (int64_t run = 4; run <= 64 * 1024; run *= (run < 1024 ? 2 : 4)) {
    reshard::cuda::StridedRegion region;
    region.run_bytes = run;
    region.ndims = 1;
    region.count[0] = payload / run;
    region.stride[0] = 2 * run;
    absl::StatusOr<reshard::cuda::PackBatch> batch = reshard::cuda::BuildPackBatch({&region, 1});
    if (!Check(batch.status())) return 1;
    auto device = reshard::cuda::DevicePackBatch::Create(*batch);
    if (!Check(device.status())) return 1;
    const reshard::cuda::DevicePackBatch& d = **device;
    const double pack_ms =
        MedianMs(iters, stream, [&] { return Check(d.Pack(strided, packed, stream)); });
    const double unpack_ms =
        MedianMs(iters, stream, [&] { return Check(d.Unpack(packed, strided, stream)); });
    if (pack_ms < 0 || unpack_ms < 0) return 1;
    const double bytes = static_cast<double>(batch->bytes);  // payload rounded down to runs
    const double pack_gbs = bytes / pack_ms / 1e6, unpack_gbs = bytes / unpack_ms / 1e6;
    std::printf("%10lld %12.1f %12.1f %12.1f %9.0f%% %9.0f%% %6d\n", static_cast<long long>(run),
                pack_gbs, unpack_gbs, memcpy_gbs, 100 * pack_gbs / memcpy_gbs,
                100 * unpack_gbs / memcpy_gbs, batch->entries[0].width);
  }
  // The CUDA IPC fan-out's strided-to-strided copy: kernel against the copy engines.
  uint8_t* strided_to = nullptr;
  if (!Check(cudaMalloc(reinterpret_cast<void**>(&strided_to), 2 * payload), "cudaMalloc")) {
    return 1;
  }
  std::printf("\nstrided copy (CUDA IPC fan-out), runs every other in both buffers\n");
  std::printf("%10s %12s %12s %12s %10s\n", "run bytes", "kernel GB/s", "2D GB/s", "memcpy GB/s",
              "kernel/2D");
  // From 64 B: the copy engines take rows one by one, and millions of 4-byte rows would take
  // seconds per iteration.
  for (int64_t run = 64; run <= 64 * 1024; run *= (run < 1024 ? 2 : 4)) {
    reshard::cuda::CopyRegion region;
    region.run_bytes = run;
    region.ndims = 1;
    region.count[0] = payload / run;
    region.from_stride[0] = region.to_stride[0] = 2 * run;
    absl::StatusOr<reshard::cuda::CopyBatch> batch = reshard::cuda::BuildCopyBatch({&region, 1});
    if (!Check(batch.status())) return 1;
    auto device = reshard::cuda::DeviceCopyBatches::Create({*batch});
    if (!Check(device.status())) return 1;
    const reshard::cuda::DeviceCopyBatches& d = **device;
    const double kernel_ms =
        MedianMs(iters, stream, [&] { return Check(d.Copy(0, strided, strided_to, stream)); });
    const double copy2d_ms = MedianMs(iters, stream, [&] {
      return Check(cudaMemcpy2DAsync(strided_to, 2 * run, strided, 2 * run, run, payload / run,
                                     cudaMemcpyDeviceToDevice, stream),
                   "cudaMemcpy2DAsync");
    });
    if (kernel_ms < 0 || copy2d_ms < 0) return 1;
    const double bytes = static_cast<double>(batch->bytes);
    std::printf("%10lld %12.1f %12.1f %12.1f %9.2fx\n", static_cast<long long>(run),
                bytes / kernel_ms / 1e6, bytes / copy2d_ms / 1e6, memcpy_gbs,
                copy2d_ms / kernel_ms);
  }
  cudaFree(strided_to);
  cudaStreamDestroy(stream);
  cudaFree(strided);
  cudaFree(packed);
  cudaFree(copy);
  return 0;
}
