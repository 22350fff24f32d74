// The few CUDA runtime calls the layers above need (device count, pinned host memory, copies),
// written once for net (staging device memory through pinned host buffers when UCX cannot
// register it: Debian's UCX 1.13 has no CUDA support), nvlink (backend viability) and the CLI.
//
// Compiled against the CUDA runtime (CUDA::cudart, never libcuda) when the build found CUDA
// (RESHARD_HAVE_CUDA); otherwise every call returns FailedPrecondition. Callers check
// CudaDeviceCount() at run time: no driver or no device reads as 0 devices, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard::cuda {

// Whether this build links the CUDA runtime.
bool BuiltWithCuda();

// A failed CUDA runtime call as a Status: Internal "<call>: <cudaGetErrorString(err)>". `err` is
// a cudaError_t (an int here, so this header needs no CUDA header). Defined in builds with CUDA
// only, for the code that calls the runtime itself (pack.cc, quantize.cc).
absl::Status CudaError(int err, const char* call);

// Number of usable CUDA devices; 0 when the build has no CUDA, there is no driver, or the
// runtime reports an error (`why`, when given, receives the reason).
int CudaDeviceCount(std::string* why = nullptr);

// Page-locked host memory (cudaHostAlloc); FailedPrecondition without CUDA.
[[nodiscard]] absl::StatusOr<void*> AllocPinned(size_t bytes);
void FreePinned(void* ptr);

// A synchronous copy between any two addresses the CUDA runtime understands (host, pinned or
// device; cudaMemcpyAsync on a private stream, then synchronise).
[[nodiscard]] absl::Status CudaCopy(void* dst, const void* src, size_t bytes);
// The same for `rows` pieces of `width` bytes, the i-th from src + i * src_pitch to
// dst + i * dst_pitch: one cudaMemcpy2DAsync (a copy engine walks the rows) when both pitches
// hold a row, else one cudaMemcpyAsync per row; one synchronise either way.
[[nodiscard]] absl::Status CudaCopy2D(void* dst, int64_t dst_pitch, const void* src,
                                      int64_t src_pitch, int64_t width, int64_t rows);

}  // namespace reshard::cuda
