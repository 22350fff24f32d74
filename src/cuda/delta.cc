#include "src/cuda/delta.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "src/common/status.h"

#if RESHARD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "src/cuda/delta_kernels.h"
#include "src/cuda/runtime.h"
#endif

namespace reshard::cuda {

absl::Status DeviceDeltaCodec::CheckPiece(const DeltaPiece& piece, const void* base,
                                          const char* what) const {
  const int es = piece.elem_size;
  if (es != 1 && es != 2 && es != 4 && es != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta piece: element size ", es, " is not 1, 2, 4 or 8"));
  }
  const PackEntry& l = piece.layout;
  if (piece.elems < 0 || piece.first < 0 || l.width != es ||
      l.units < static_cast<uint64_t>(piece.first + piece.elems) ||
      piece.chunks != delta::NumChunks(piece.elems) || l.ndims < 0 || l.ndims > kMaxPackDims ||
      (piece.elems > 0 && l.run_units == 0)) {
    return absl::InvalidArgumentError(
        "delta piece: its layout disagrees with its element count or size (build it with "
        "MakeDeltaPiece)");
  }
  if (piece.elems > max_piece_bytes_ / es) {
    return absl::InvalidArgumentError(absl::StrCat("delta piece: ", piece.elems * es,
                                                   " bytes, more than the codec's maximum of ",
                                                   max_piece_bytes_));
  }
  bool aligned = reinterpret_cast<uintptr_t>(base) % static_cast<uintptr_t>(es) == 0 &&
                 l.strided_offset % es == 0;
  for (int32_t d = 0; d < l.ndims; ++d) aligned = aligned && l.stride[d] % es == 0;
  if (!aligned) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta piece: the ", what, " address, offset ", l.strided_offset,
                     " or a stride is not a multiple of the element size ", es));
  }
  return absl::OkStatus();
}

#if RESHARD_HAVE_CUDA

absl::StatusOr<std::unique_ptr<DeviceDeltaCodec>> DeviceDeltaCodec::Create(
    int64_t shadow_bytes, int64_t max_piece_bytes) {
  if (shadow_bytes < 0 || max_piece_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceDeltaCodec: negative sizes (shadow ",
                                                   shadow_bytes, ", piece ", max_piece_bytes, ")"));
  }
  std::unique_ptr<DeviceDeltaCodec> c(new DeviceDeltaCodec());
  c->shadow_bytes_ = shadow_bytes;
  c->max_piece_bytes_ = max_piece_bytes;
  std::string why;
  if (CudaDeviceCount(&why) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the delta kernels need a CUDA device: ", why));
  }
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Clear the error so later runtime calls start clean.
    return absl::FailedPreconditionError(absl::StrCat(
        "the delta kernels need a CUDA device: cudaGetDevice: ", cudaGetErrorString(err)));
  }
  cudaStream_t stream = nullptr;
  err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamCreateWithFlags(delta)");
  c->cuda_stream_ = stream;
  // Element size 1 has the most chunks and the largest stream per byte of piece.
  const int64_t chunks = delta::NumChunks(max_piece_bytes);
  const int64_t capacity = delta::StreamCapacity(max_piece_bytes, 1);
  auto alloc = [&](auto** ptr, int64_t bytes, const char* what) -> absl::Status {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    if (e != cudaSuccess) return CudaError(e, what);
    *ptr = static_cast<std::remove_reference_t<decltype(*ptr)>>(p);
    return absl::OkStatus();
  };
  for (const absl::Status& st :
       {alloc(&c->shadow_, shadow_bytes, "cudaMalloc(delta shadow)"),
        // Rounded up to whole words: the pipeline copies streams to the host by 8-byte words.
        alloc(&c->stream_, (capacity + 7) / 8 * 8, "cudaMalloc(delta stream)"),
        alloc(&c->apply_stream_, capacity, "cudaMalloc(delta stream to apply)"),
        alloc(&c->masks_, chunks * delta::kWordsPerChunk * 8, "cudaMalloc(delta masks)"),
        alloc(&c->chunk_words_, chunks * 4, "cudaMalloc(delta chunk words)"),
        alloc(&c->changed_, chunks * 4, "cudaMalloc(delta counts)"),
        alloc(&c->offsets_, chunks * 8, "cudaMalloc(delta offsets)"),
        alloc(&c->result_, sizeof(delta::EncodeResult), "cudaMalloc(delta result)")}) {
    if (!st.ok()) return st;  // The destructor frees what was allocated.
  }
  err = cudaMemsetAsync(c->shadow_, 0, static_cast<size_t>(std::max<int64_t>(shadow_bytes, 1)),
                        stream);
  if (err != cudaSuccess) return CudaError(err, "cudaMemsetAsync(delta shadow)");
  err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamSynchronize(delta shadow)");
  absl::StatusOr<void*> pinned = AllocPinned(sizeof(delta::EncodeResult));
  if (!pinned.ok()) return pinned.status();
  c->host_result_ = static_cast<delta::EncodeResult*>(*pinned);
  return c;
}

DeviceDeltaCodec::~DeviceDeltaCodec() {
  // Pipelined work may still run and write the pinned slots: let it finish before freeing.
  if (cuda_stream_ != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(cuda_stream_));
  FreePipeline();
  for (void* p :
       {static_cast<void*>(shadow_), static_cast<void*>(stream_), static_cast<void*>(apply_stream_),
        static_cast<void*>(masks_), static_cast<void*>(chunk_words_), static_cast<void*>(changed_),
        static_cast<void*>(offsets_), static_cast<void*>(result_)}) {
    if (p != nullptr) cudaFree(p);
  }
  FreePinned(host_result_);
  if (cuda_stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(cuda_stream_));
}

absl::Status DeviceDeltaCodec::LaunchEncode(const DeltaPiece& piece, const void* source,
                                            int64_t shadow_offset, uint64_t base_epoch,
                                            bool delta) {
  internal::DeltaScratch s{masks_, chunk_words_, changed_, offsets_, result_};
  if (int e = internal::LaunchDeltaEncode(piece, static_cast<const uint8_t*>(source),
                                          shadow_ + shadow_offset, base_epoch, delta, s, stream_,
                                          cuda_stream_);
      e != 0) {
    return CudaError(e, "the delta encode kernels' launch");
  }
  return absl::OkStatus();
}

absl::StatusOr<delta::EncodeResult> DeviceDeltaCodec::EncodeOnDevice(const DeltaPiece& piece,
                                                                     const void* source,
                                                                     int64_t shadow_offset,
                                                                     uint64_t base_epoch,
                                                                     bool delta) {
  if (absl::Status st = CheckPiece(piece, source, "source"); !st.ok()) return st;
  const int64_t bytes = piece.elems * piece.elem_size;
  if (shadow_offset < 0 || shadow_offset % piece.elem_size != 0 ||
      shadow_offset > shadow_bytes_ - bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta piece: shadow bytes [", shadow_offset, ", ", shadow_offset + bytes,
                     ") are not element-aligned inside the shadow of ", shadow_bytes_, " bytes"));
  }
  RESHARD_RETURN_IF_ERROR(LaunchEncode(piece, source, shadow_offset, base_epoch, delta));
  auto stream = static_cast<cudaStream_t>(cuda_stream_);
  cudaError_t err = cudaMemcpyAsync(host_result_, result_, sizeof(delta::EncodeResult),
                                    cudaMemcpyDeviceToHost, stream);
  if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync(delta result to the host)");
  err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamSynchronize(delta encode)");
  return *host_result_;
}

absl::StatusOr<delta::EncodeResult> DeviceDeltaCodec::Encode(const DeltaPiece& piece,
                                                             const void* source,
                                                             int64_t shadow_offset,
                                                             uint64_t base_epoch, bool delta,
                                                             uint8_t* out) {
  absl::StatusOr<delta::EncodeResult> r =
      EncodeOnDevice(piece, source, shadow_offset, base_epoch, delta);
  if (!r.ok()) return r;
  auto stream = static_cast<cudaStream_t>(cuda_stream_);
  cudaError_t err =
      cudaMemcpyAsync(out, stream_, static_cast<size_t>(r->bytes), cudaMemcpyDeviceToHost, stream);
  if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync(delta stream to the host)");
  err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamSynchronize(delta stream)");
  return r;
}

void DeviceDeltaCodec::FreePipeline() {
  for (void*& e : events_) {
    if (e != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(e));
    e = nullptr;
  }
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  FreePinned(host_results_);
  pinned_ = pinned_device_ = nullptr;
  host_results_ = nullptr;
  pinned_slots_ = 0;
  pinned_slot_bytes_ = results_ = 0;
}

absl::Status DeviceDeltaCodec::ReservePipeline(int32_t slots, int64_t slot_bytes, int64_t results) {
  if (slots < 1 || slots > kMaxPipelineSlots || slot_bytes < 0 || results < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceDeltaCodec::ReservePipeline: ", slots, " slots of ", slot_bytes, " bytes, ", results,
        " results (1 to ", kMaxPipelineSlots, " slots, no negative sizes)"));
  }
  FreePipeline();
  // Whole words: streams are copied by 8-byte words.
  const int64_t bytes = slots * ((slot_bytes + 7) / 8 * 8);
  void* pinned = nullptr;
  cudaError_t err = cudaHostAlloc(&pinned, static_cast<size_t>(std::max<int64_t>(bytes, 8)),
                                  cudaHostAllocPortable | cudaHostAllocMapped);
  if (err != cudaSuccess) return CudaError(err, "cudaHostAlloc(delta pipeline)");
  pinned_ = static_cast<uint8_t*>(pinned);
  void* device = nullptr;
  err = cudaHostGetDevicePointer(&device, pinned, 0);
  if (err != cudaSuccess) return CudaError(err, "cudaHostGetDevicePointer(delta pipeline)");
  pinned_device_ = static_cast<uint8_t*>(device);
  pinned_slots_ = slots;
  pinned_slot_bytes_ = (slot_bytes + 7) / 8 * 8;
  absl::StatusOr<void*> r =
      AllocPinned(static_cast<size_t>(std::max<int64_t>(results, 1)) * sizeof(delta::EncodeResult));
  if (!r.ok()) return r.status();
  host_results_ = static_cast<delta::EncodeResult*>(*r);
  results_ = results;
  for (int32_t i = 0; i < slots; ++i) {
    cudaEvent_t e = nullptr;
    err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError(err, "cudaEventCreateWithFlags(delta pipeline)");
    events_[i] = e;
  }
  return absl::OkStatus();
}

absl::Status DeviceDeltaCodec::EnqueueEncode(const DeltaPiece& piece, const void* source,
                                             int64_t shadow_offset, uint64_t base_epoch, bool delta,
                                             uint8_t* host_out, int64_t result) {
  if (absl::Status st = CheckPiece(piece, source, "source"); !st.ok()) return st;
  const int64_t bytes = piece.elems * piece.elem_size;
  const int64_t capacity = delta::StreamCapacity(piece.elems, piece.elem_size);
  if (shadow_offset < 0 || shadow_offset % piece.elem_size != 0 ||
      shadow_offset > shadow_bytes_ - bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta piece: shadow bytes [", shadow_offset, ", ", shadow_offset + bytes,
                     ") are not element-aligned inside the shadow of ", shadow_bytes_, " bytes"));
  }
  const int64_t at = host_out - pinned_;
  if (pinned_ == nullptr || host_out < pinned_ || at % 8 != 0 ||
      at > pinned_bytes() - (capacity + 7) / 8 * 8 || result < 0 || result >= results_) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta pipeline: a stream of up to ", capacity, " bytes at offset ", at,
                     " of the pinned slots (", pinned_bytes(), " bytes), result ", result, " of ",
                     results_, ": outside the reservation or not 8-byte aligned"));
  }
  RESHARD_RETURN_IF_ERROR(LaunchEncode(piece, source, shadow_offset, base_epoch, delta));
  auto stream = static_cast<cudaStream_t>(cuda_stream_);
  if (int e =
          internal::LaunchStreamCopy(stream_, result_, capacity, pinned_device_ + at, cuda_stream_);
      e != 0) {
    return CudaError(e, "the delta stream copy kernel's launch");
  }
  const cudaError_t err = cudaMemcpyAsync(
      host_results_ + result, result_, sizeof(delta::EncodeResult), cudaMemcpyDeviceToHost, stream);
  if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync(delta result to the host)");
  return absl::OkStatus();
}

absl::Status DeviceDeltaCodec::EnqueuePlain(int64_t elems, int elem_size, int64_t shadow_offset,
                                            uint8_t* host_out) {
  const int64_t bytes = elems * elem_size;
  const int64_t at = host_out - pinned_;
  if (elems < 0 || elem_size < 1 || shadow_offset < 0 || shadow_offset > shadow_bytes_ - bytes ||
      pinned_ == nullptr || host_out < pinned_ || at % 8 != 0 ||
      at > pinned_bytes() - delta::StreamCapacity(elems, elem_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta pipeline: a plain stream of ", bytes, " bytes from shadow offset ", shadow_offset,
        " to pinned offset ", at, ": outside the shadow or the pinned slots"));
  }
  const delta::EncodeResult r = EncodeResultOf(DeltaTotals{}, elems, elem_size, /*delta=*/false);
  const delta::StreamHeader h = HeaderOf(r, elems, elem_size, 0);
  std::memcpy(host_out, &h, sizeof(h));
  const cudaError_t err =
      cudaMemcpyAsync(host_out + sizeof(h), shadow_ + shadow_offset, static_cast<size_t>(bytes),
                      cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(cuda_stream_));
  if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync(delta plain piece to the host)");
  return absl::OkStatus();
}

absl::Status DeviceDeltaCodec::RecordSlot(int32_t slot) {
  if (slot < 0 || slot >= pinned_slots_) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta pipeline: slot ", slot, " of ", pinned_slots_));
  }
  const cudaError_t err = cudaEventRecord(static_cast<cudaEvent_t>(events_[slot]),
                                          static_cast<cudaStream_t>(cuda_stream_));
  if (err != cudaSuccess) return CudaError(err, "cudaEventRecord(delta pipeline)");
  return absl::OkStatus();
}

absl::StatusOr<bool> DeviceDeltaCodec::SlotDone(int32_t slot) {
  if (slot < 0 || slot >= pinned_slots_) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta pipeline: slot ", slot, " of ", pinned_slots_));
  }
  return QueryEvent(events_[slot], "cudaEventQuery(delta pipeline)");
}

absl::StatusOr<delta::Mode> DeviceDeltaCodec::Apply(const DeltaPiece& piece, const uint8_t* stream,
                                                    int64_t length, uint64_t held_epoch,
                                                    void* destination, const void* device_stream) {
  if (absl::Status st = CheckPiece(piece, destination, "destination"); !st.ok()) return st;
  if (reinterpret_cast<uintptr_t>(device_stream) % 8 != 0) {
    return absl::InvalidArgumentError(
        "delta stream: a device copy must be 8-byte aligned (the plain piece is read aligned)");
  }
  delta::Decoder decoder;
  const delta::DecodeError error =
      decoder.Init(stream, length, piece.elems, piece.elem_size, held_epoch);
  if (error != delta::DecodeError::kOk) {
    return absl::DataLossError(
        absl::StrCat("delta stream refused: ", delta::DecodeErrorName(error)));
  }
  auto cuda_stream = static_cast<cudaStream_t>(cuda_stream_);
  const uint8_t* in = static_cast<const uint8_t*>(device_stream);
  if (in == nullptr) {
    const cudaError_t err =
        cudaMemcpyAsync(apply_stream_, stream, static_cast<size_t>(decoder.bytes()),
                        cudaMemcpyHostToDevice, cuda_stream);
    if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync(delta stream to the device)");
    in = apply_stream_;
  }
  internal::DeltaScratch s{masks_, chunk_words_, changed_, offsets_, result_};
  if (int e = internal::LaunchDeltaApply(piece, in, decoder.mode(), s,
                                         static_cast<uint8_t*>(destination), cuda_stream_);
      e != 0) {
    return CudaError(e, "the delta apply kernels' launch");
  }
  const cudaError_t err = cudaStreamSynchronize(cuda_stream);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamSynchronize(delta apply)");
  return decoder.mode();
}

#else  // Without CUDA kernels.

absl::StatusOr<std::unique_ptr<DeviceDeltaCodec>> DeviceDeltaCodec::Create(int64_t, int64_t) {
  return absl::FailedPreconditionError(
      "this build has no CUDA delta kernels (no CUDA toolkit with nvcc was found)");
}
DeviceDeltaCodec::~DeviceDeltaCodec() = default;
absl::StatusOr<delta::EncodeResult> DeviceDeltaCodec::EncodeOnDevice(const DeltaPiece&, const void*,
                                                                     int64_t, uint64_t, bool) {
  return absl::FailedPreconditionError("this build has no CUDA delta kernels");
}
absl::StatusOr<delta::EncodeResult> DeviceDeltaCodec::Encode(const DeltaPiece&, const void*,
                                                             int64_t, uint64_t, bool, uint8_t*) {
  return absl::FailedPreconditionError("this build has no CUDA delta kernels");
}
absl::StatusOr<delta::Mode> DeviceDeltaCodec::Apply(const DeltaPiece&, const uint8_t*, int64_t,
                                                    uint64_t, void*, const void*) {
  return absl::FailedPreconditionError("this build has no CUDA delta kernels");
}
void DeviceDeltaCodec::FreePipeline() {}
absl::Status DeviceDeltaCodec::ReservePipeline(int32_t, int64_t, int64_t) {
  return absl::FailedPreconditionError("this build has no CUDA delta kernels");
}
absl::Status DeviceDeltaCodec::EnqueueEncode(const DeltaPiece&, const void*, int64_t, uint64_t,
                                             bool, uint8_t*, int64_t) {
  return absl::FailedPreconditionError("this build has no CUDA delta kernels");
}
absl::Status DeviceDeltaCodec::EnqueuePlain(int64_t, int, int64_t, uint8_t*) {
  return absl::FailedPreconditionError("this build has no CUDA delta kernels");
}
absl::Status DeviceDeltaCodec::RecordSlot(int32_t) {
  return absl::FailedPreconditionError("this build has no CUDA delta kernels");
}
absl::StatusOr<bool> DeviceDeltaCodec::SlotDone(int32_t) {
  return absl::FailedPreconditionError("this build has no CUDA delta kernels");
}

#endif

}  // namespace reshard::cuda
