// quant_bench: the FP8 quantization kernels (src/cuda/quant_kernels.cu: amax pass, scales,
// quantize pass) on one GPU, for a bf16 tile of every scheme, against device-to-device
// cudaMemcpy of the source's bytes.
//
//   quant_bench [--rows N] [--cols N] [--iters N]   (defaults: 8192 x 8192 bf16, 20 iterations)
//
// GB/s is the bf16 source's bytes / median time of the three kernels (cudaEvent), the same
// convention as the memcpy column; the "to host" column also counts DeviceQuantizer::Quantize's
// copy of the FP8 bytes and scales to pageable host memory (what a refit pays today). The last
// row requantizes an FP8 source (e4m3 with 128 x 128 fp32 source scales, dequantized as the
// kernels read it) into MX e5m2; its GB/s counts the FP8 source's bytes (one per element). One
// table on stdout. Exit status: 0 after printing the table, 1 on a CUDA or kernel error, 3 when
// there is no usable CUDA device. It prints figures and never fails on speed.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/cuda/quant_index.h"
#include "src/cuda/quant_kernels.h"
#include "src/cuda/quantize.h"
#include "src/cuda/runtime.h"

namespace {

constexpr int kExitNoDevice = 3;

bool Check(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "quant_bench: %s: %s\n", call, cudaGetErrorString(err));
  return false;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 8192, cols = 8192;
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") {
      std::printf("usage: quant_bench [--rows N] [--cols N] [--iters N]\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "quant_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    const long long v = std::atoll(argv[++i]);
    if (v < 1) {
      std::fprintf(stderr, "quant_bench: %s must be at least 1\n", a.c_str());
      return 2;
    }
    if (a == "--rows") rows = v;
    else if (a == "--cols") cols = v;
    else if (a == "--iters") iters = static_cast<int>(v);
    else {
      std::fprintf(stderr, "quant_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::string why;
  if (reshard::cuda::CudaDeviceCount(&why) == 0) {
    std::fprintf(stderr, "quant_bench: no usable CUDA device: %s\n", why.c_str());
    return kExitNoDevice;
  }
  const int64_t elements = rows * cols;
  const size_t src_bytes = static_cast<size_t>(elements) * 2;
  std::vector<uint16_t> host(static_cast<size_t>(elements));
  std::mt19937_64 rng(1);
  for (auto& h : host) h = static_cast<uint16_t>(0x3800 + rng() % 0x1000);  // ~2^-15 .. 2^1
  void *src = nullptr, *copy = nullptr;
  if (!Check(cudaMalloc(&src, src_bytes), "cudaMalloc") ||
      !Check(cudaMalloc(&copy, src_bytes), "cudaMalloc") ||
      !Check(cudaMemcpy(src, host.data(), src_bytes, cudaMemcpyHostToDevice), "cudaMemcpy")) {
    return 1;
  }
  cudaStream_t stream;
  cudaEvent_t start, stop;
  if (!Check(cudaStreamCreate(&stream), "cudaStreamCreate") ||
      !Check(cudaEventCreate(&start), "cudaEventCreate") ||
      !Check(cudaEventCreate(&stop), "cudaEventCreate")) {
    return 1;
  }
  auto timed = [&](auto&& fn) -> double {
    std::vector<double> ms;
    for (int i = 0; i < iters + 2; ++i) {
      if (!Check(cudaEventRecord(start, stream), "cudaEventRecord") || !fn() ||
          !Check(cudaEventRecord(stop, stream), "cudaEventRecord") ||
          !Check(cudaEventSynchronize(stop), "cudaEventSynchronize (a kernel failed)")) {
        return -1;
      }
      float t = 0;
      if (!Check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime")) return -1;
      if (i >= 2) ms.push_back(t);
    }
    return Median(ms);
  };
  const double memcpy_ms = timed([&] {
    return Check(cudaMemcpyAsync(copy, src, src_bytes, cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync");
  });
  if (memcpy_ms < 0) return 1;
  int sms = 1;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  std::printf("FP8 quantization kernels, %lld x %lld bf16 (%.0f MiB), median of %d\n",
              static_cast<long long>(rows), static_cast<long long>(cols),
              static_cast<double>(src_bytes) / (1 << 20), iters);
  std::printf("%-22s %10s %10s %12s %10s\n", "scheme", "kernels", "GB/s", "to host GB/s",
              "vs memcpy");
  std::printf("%-22s %8.3f ms %10.1f %12s %9.2fx\n", "cudaMemcpy d2d", memcpy_ms,
              src_bytes / memcpy_ms / 1e6, "-", 1.0);
  struct Scheme {
    const char* name;
    int64_t block_rows, block_cols;
    bool mx;
    bool fp8_source;  // e4m3 with 128 x 128 fp32 scales (all 1), into e5m2.
  };
  const Scheme schemes[] = {{"block 128x128 e4m3", 128, 128, false, false},
                            {"mx 1x32 e4m3", 1, 32, true, false},
                            {"channel e4m3", 1, cols, false, false},
                            {"tensor e4m3", rows, cols, false, false},
                            {"fp8 128x128 -> mx e5m2", 1, 32, true, true}};
  // The FP8 source's scales: the first `elements` bytes of `src` are its elements.
  const int64_t fp8_block_cols = (cols + 127) / 128;
  const std::vector<float> ones(static_cast<size_t>((rows + 127) / 128 * fp8_block_cols), 1.0f);
  void* fp8_scales = nullptr;
  if (!Check(cudaMalloc(&fp8_scales, ones.size() * 4), "cudaMalloc") ||
      !Check(cudaMemcpy(fp8_scales, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice),
             "cudaMemcpy")) {
    return 1;
  }
  for (const Scheme& sc : schemes) {
    reshard::cuda::QuantShape s;
    s.source = sc.fp8_source ? reshard::cuda::QuantSource::kFp8E4M3
                             : reshard::cuda::QuantSource::kBf16;
    s.e5m2 = sc.fp8_source;
    s.fp8_block[0] = s.fp8_block[1] = 128;
    s.fp8_scale_stride[0] = fp8_block_cols;
    s.fp8_scale_stride[1] = 1;
    const auto* src_scales = sc.fp8_source ? static_cast<const uint8_t*>(fp8_scales) : nullptr;
    const size_t read_bytes = sc.fp8_source ? static_cast<size_t>(elements) : src_bytes;
    s.ndim = 2;
    s.mx = sc.mx;
    s.extent[0] = rows;
    s.extent[1] = cols;
    s.src_stride[0] = cols;
    s.src_stride[1] = 1;
    s.block[0] = sc.block_rows;
    s.block[1] = sc.block_cols;
    reshard::cuda::FinishQuantShape(s);
    void *out = nullptr, *scales = nullptr, *amax = nullptr, *factors = nullptr;
    if (!Check(cudaMalloc(&out, static_cast<size_t>(elements)), "cudaMalloc") ||
        !Check(cudaMalloc(&scales, static_cast<size_t>(s.num_blocks) * 4), "cudaMalloc") ||
        !Check(cudaMalloc(&amax, static_cast<size_t>(s.num_blocks) * 4), "cudaMalloc") ||
        !Check(cudaMalloc(&factors, static_cast<size_t>(s.num_blocks) * 4), "cudaMalloc")) {
      return 1;
    }
    const int max_blocks = sms * 8;
    const double ms = timed([&] {
      namespace in = reshard::cuda::internal;
      return Check(cudaMemsetAsync(amax, 0, static_cast<size_t>(s.num_blocks) * 4, stream),
                   "cudaMemsetAsync") &&
             in::LaunchQuantAmax(s, static_cast<const uint8_t*>(src), src_scales,
                                 static_cast<uint32_t*>(amax), max_blocks, stream) == 0 &&
             in::LaunchQuantScales(s, static_cast<const uint32_t*>(amax),
                                   static_cast<uint8_t*>(scales), static_cast<float*>(factors),
                                   stream) == 0 &&
             in::LaunchQuantize(s, static_cast<const uint8_t*>(src), src_scales,
                                static_cast<const float*>(factors), static_cast<uint8_t*>(out),
                                max_blocks, stream) == 0;
    });
    if (ms < 0) return 1;
    // End to end to pageable host memory, as a refit's quantization runs.
    auto q = reshard::cuda::DeviceQuantizer::Create(s);
    if (!q.ok()) {
      std::fprintf(stderr, "quant_bench: %s\n", std::string(q.status().message()).c_str());
      return 1;
    }
    std::vector<uint8_t> host_out(static_cast<size_t>(elements)),
        host_scales(static_cast<size_t>(s.num_blocks) * 4);
    std::vector<double> host_ms;
    for (int i = 0; i < iters + 2; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      if (!(*q)->Quantize(src, host_out.data(), host_scales.data(), nullptr, src_scales).ok()) {
        return 1;
      }
      const auto t1 = std::chrono::steady_clock::now();
      if (i >= 2) host_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::printf("%-22s %8.3f ms %10.1f %12.1f %9.2fx\n", sc.name, ms, read_bytes / ms / 1e6,
                read_bytes / Median(host_ms) / 1e6, memcpy_ms / ms);
    cudaFree(out);
    cudaFree(scales);
    cudaFree(amax);
    cudaFree(factors);
  }
  cudaFree(src);
  cudaFree(copy);
  cudaFree(fp8_scales);
  return 0;
}
