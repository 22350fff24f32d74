#include "src/cuda/quantize.h"

#include <algorithm>
#include <type_traits>

#include "absl/strings/str_cat.h"

#if RESHARD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "src/cuda/quant_kernels.h"
#include "src/cuda/runtime.h"
#endif

namespace reshard::cuda {

#if RESHARD_HAVE_CUDA

absl::StatusOr<std::unique_ptr<DeviceQuantizer>> DeviceQuantizer::Create(
    const QuantShape& shape) {
  std::unique_ptr<DeviceQuantizer> q(new DeviceQuantizer());
  q->shape_ = shape;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Clear the error so later runtime calls start clean.
    return absl::FailedPreconditionError(absl::StrCat(
        "the quantization kernels need a CUDA device: cudaGetDevice: ", cudaGetErrorString(err)));
  }
  int sms = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return CudaError(err, "cudaDeviceGetAttribute(multiprocessor count)");
  q->max_blocks_ = std::max(1, sms) * 8;  // 8 resident blocks of 256 threads per SM.
  cudaStream_t stream = nullptr;
  err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamCreateWithFlags(quantization)");
  q->stream_ = stream;
  const int64_t scale_bytes = shape.num_blocks * (shape.mx ? 1 : 4);
  auto alloc = [&](auto** ptr, int64_t bytes, const char* what) -> absl::Status {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    if (e != cudaSuccess) return CudaError(e, what);
    *ptr = static_cast<std::remove_reference_t<decltype(*ptr)>>(p);
    return absl::OkStatus();
  };
  if (absl::Status st = alloc(&q->out_, shape.elements, "cudaMalloc(FP8 elements)"); !st.ok()) {
    return st;
  }
  if (absl::Status st = alloc(&q->scales_, scale_bytes, "cudaMalloc(scales)"); !st.ok()) return st;
  if (absl::Status st = alloc(&q->amax_bits_, shape.num_blocks * 4, "cudaMalloc(amaxes)");
      !st.ok()) {
    return st;
  }
  if (absl::Status st = alloc(&q->factors_, shape.num_blocks * 4, "cudaMalloc(factors)");
      !st.ok()) {
    return st;
  }
  return q;
}

DeviceQuantizer::~DeviceQuantizer() {
  cudaFree(out_);
  cudaFree(scales_);
  cudaFree(amax_bits_);
  cudaFree(factors_);
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::Status DeviceQuantizer::Amax(const void* src, float* amax, const void* src_scales) {
  if (shape_.elements == 0) {
    std::fill(amax, amax + shape_.num_blocks, 0.0f);
    return absl::OkStatus();
  }
  auto stream = static_cast<cudaStream_t>(stream_);
  const size_t bytes = static_cast<size_t>(shape_.num_blocks) * 4;
  cudaError_t err = cudaMemsetAsync(amax_bits_, 0, bytes, stream);
  if (err != cudaSuccess) return CudaError(err, "cudaMemsetAsync(amaxes)");
  if (int e = internal::LaunchQuantAmax(shape_, static_cast<const uint8_t*>(src),
                                        static_cast<const uint8_t*>(src_scales), amax_bits_,
                                        max_blocks_, stream_);
      e != 0) {
    return CudaError(e, "the amax kernel's launch");
  }
  // Non-negative floats: the bits are the values.
  err = cudaMemcpyAsync(amax, amax_bits_, bytes, cudaMemcpyDeviceToHost, stream);
  if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync(amaxes to the host)");
  err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamSynchronize(amax pass)");
  return absl::OkStatus();
}

absl::Status DeviceQuantizer::Quantize(const void* src, uint8_t* out, uint8_t* scales,
                                       const float* amax, const void* src_scales) {
  if (shape_.elements == 0) return absl::OkStatus();
  auto stream = static_cast<cudaStream_t>(stream_);
  const auto* source = static_cast<const uint8_t*>(src);
  const auto* source_scales = static_cast<const uint8_t*>(src_scales);
  const size_t amax_bytes = static_cast<size_t>(shape_.num_blocks) * 4;
  cudaError_t err;
  if (amax != nullptr) {
    err = cudaMemcpyAsync(amax_bits_, amax, amax_bytes, cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync(amaxes to the device)");
  } else {
    err = cudaMemsetAsync(amax_bits_, 0, amax_bytes, stream);
    if (err != cudaSuccess) return CudaError(err, "cudaMemsetAsync(amaxes)");
    if (int e = internal::LaunchQuantAmax(shape_, source, source_scales, amax_bits_,
                                          max_blocks_, stream_);
        e != 0) {
      return CudaError(e, "the amax kernel's launch");
    }
  }
  if (int e = internal::LaunchQuantScales(shape_, amax_bits_, scales_, factors_, stream_);
      e != 0) {
    return CudaError(e, "the scales kernel's launch");
  }
  if (int e = internal::LaunchQuantize(shape_, source, source_scales, factors_, out_,
                                      max_blocks_, stream_);
      e != 0) {
    return CudaError(e, "the quantize kernel's launch");
  }
  err = cudaMemcpyAsync(out, out_, static_cast<size_t>(shape_.elements), cudaMemcpyDeviceToHost,
                        stream);
  if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync(FP8 elements to the host)");
  err = cudaMemcpyAsync(scales, scales_,
                        static_cast<size_t>(shape_.num_blocks * (shape_.mx ? 1 : 4)),
                        cudaMemcpyDeviceToHost, stream);
  if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync(scales to the host)");
  err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamSynchronize(quantization)");
  return absl::OkStatus();
}

#else  // Without CUDA kernels.

absl::StatusOr<std::unique_ptr<DeviceQuantizer>> DeviceQuantizer::Create(const QuantShape&) {
  return absl::FailedPreconditionError(
      "this build has no CUDA quantization kernels (no CUDA toolkit with nvcc was found)");
}
DeviceQuantizer::~DeviceQuantizer() = default;
absl::Status DeviceQuantizer::Amax(const void*, float*, const void*) {
  return absl::FailedPreconditionError("this build has no CUDA quantization kernels");
}
absl::Status DeviceQuantizer::Quantize(const void*, uint8_t*, uint8_t*, const float*,
                                       const void*) {
  return absl::FailedPreconditionError("this build has no CUDA quantization kernels");
}

#endif

}  // namespace reshard::cuda
