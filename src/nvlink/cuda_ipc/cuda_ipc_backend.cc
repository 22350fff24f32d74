#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/process.h"
#include "src/common/status.h"
#include "src/cuda/pack.h"
#include "src/cuda/runtime.h"
#include "src/nvlink/backend.h"
#include "src/nvlink/cuda_ipc/factory.h"
#include "src/nvlink/gpu_schedule.h"
#include "src/nvlink/peer_buffer.h"
#include "src/rendezvous/record.h"

#if RESHARD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace reshard::nvlink {

#if RESHARD_HAVE_CUDA

namespace {

using rendezvous::Record;

absl::Status CudaError(cudaError_t err, const std::string& call) {
  return absl::InternalError(
      absl::StrFormat("%s: %s (error %d)", call, cudaGetErrorString(err), static_cast<int>(err)));
}

#define RESHARD_CUDA_RETURN(call, what)                                              \
  do {                                                                               \
    const cudaError_t reshard_cuda_err_ = (call);                                    \
    if (reshard_cuda_err_ != cudaSuccess) return CudaError(reshard_cuda_err_, what); \
  } while (0)

// Base and size of the allocation holding `ptr`, through the driver's cuMemGetAddressRange
// looked up at run time (no link against libcuda).
absl::StatusOr<uintptr_t> AllocationBase(const void* ptr) {
  using GetRange = int (*)(uintptr_t*, size_t*, uintptr_t);
  static GetRange fn = nullptr;
  if (fn == nullptr) {
    void* sym = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &sym, 12000,
                                                             cudaEnableDefault, &q);
    if (err != cudaSuccess || sym == nullptr || q != cudaDriverEntryPointSuccess) {
      return absl::FailedPreconditionError(
          "cuda_ipc: the driver offers no cuMemGetAddressRange entry point");
    }
    fn = reinterpret_cast<GetRange>(sym);
  }
  uintptr_t base = 0;
  size_t size = 0;
  if (fn(&base, &size, reinterpret_cast<uintptr_t>(ptr)) != 0) {
    return absl::InvalidArgumentError(
        "cuda_ipc: a destination buffer is not CUDA device memory of this process");
  }
  return base;
}

class CudaIpcBackend final : public internal::BoardBackend {
 public:
  static absl::StatusOr<std::unique_ptr<FanoutBackend>> Create(const FanoutContext& ctx) {
    auto b = std::unique_ptr<CudaIpcBackend>(new CudaIpcBackend());
    RESHARD_RETURN_IF_ERROR(b->Init(ctx));
    return std::unique_ptr<FanoutBackend>(std::move(b));
  }

  ~CudaIpcBackend() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (auto& f : in_flight_) cudaEventDestroy(f.event);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    for (void* p : opened_) cudaIpcCloseMemHandle(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda_ipc"; }

  absl::StatusOr<bool> Forward(uint32_t edge, uint64_t epoch) override {
    const FanoutEdge& e = table_->edges[edge];
    const Copy& c = copies_[edge];
    uint8_t* dst = c.to;
    const uint8_t* src = static_cast<const uint8_t*>(buffers_[e.from_buffer].data);
    const internal::GpuCopy& g = c.how;
    const int64_t f = g.region.from_offset, t = g.region.to_offset;
    switch (g.method) {
      case internal::GpuCopyMethod::kNothing:
        break;
      case internal::GpuCopyMethod::kMemcpy:
        RESHARD_CUDA_RETURN(
            cudaMemcpyAsync(dst + t, src + f, g.width, cudaMemcpyDeviceToDevice, stream_),
            Context("cudaMemcpyAsync", e));
        break;
      case internal::GpuCopyMethod::kMemcpy2D:
        RESHARD_CUDA_RETURN(cudaMemcpy2DAsync(dst + t, g.to_pitch, src + f, g.from_pitch, g.width,
                                              g.height, cudaMemcpyDeviceToDevice, stream_),
                            Context("cudaMemcpy2DAsync", e));
        break;
      case internal::GpuCopyMethod::kMemcpy3D: {
        cudaMemcpy3DParms p = {};
        p.srcPtr.ptr = const_cast<uint8_t*>(src + f);
        p.srcPtr.pitch = g.from_pitch;
        p.srcPtr.xsize = g.width;
        p.srcPtr.ysize = g.from_rows;
        p.dstPtr.ptr = dst + t;
        p.dstPtr.pitch = g.to_pitch;
        p.dstPtr.xsize = g.width;
        p.dstPtr.ysize = g.to_rows;
        p.extent.width = g.width;
        p.extent.height = g.height;
        p.extent.depth = g.depth;
        p.kind = cudaMemcpyDeviceToDevice;
        RESHARD_CUDA_RETURN(cudaMemcpy3DAsync(&p, stream_), Context("cudaMemcpy3DAsync", e));
        break;
      }
      case internal::GpuCopyMethod::kKernel:
        if (absl::Status st = kernels_->Copy(c.kernel, src, dst, stream_); !st.ok()) {
          return absl::Status(st.code(),
                              absl::StrCat(Context("copy kernel", e), ": ", st.message()));
        }
        break;
    }
    cudaEvent_t ev = nullptr;
    if (!free_events_.empty()) {
      ev = free_events_.back();
      free_events_.pop_back();
    } else {
      RESHARD_CUDA_RETURN(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming),
                          "cudaEventCreateWithFlags");
    }
    RESHARD_CUDA_RETURN(cudaEventRecord(ev, stream_), "cudaEventRecord");
    in_flight_.push_back({edge, epoch, ev});
    return false;
  }

 private:
  // "<call> (fan-out of tensor T piece P, rank A -> rank B)", for errors.
  std::string Context(const char* call, const FanoutEdge& e) const {
    return absl::StrFormat(
        "%s (fan-out of tensor %s piece %d, rank %d -> rank %d)", call,
        e.tensor < table_->tensor_names.size() ? table_->tensor_names[e.tensor] : "?", e.transfer,
        e.from_rank, e.to_rank);
  }
  bool CopiesInFlight() const override { return !in_flight_.empty(); }
  absl::Status Complete(std::vector<uint32_t>* completed) override {
    // One stream: copies complete in order, so stop at the first one still running.
    while (!in_flight_.empty()) {
      InFlight& f = in_flight_.front();
      const cudaError_t q = cudaEventQuery(f.event);
      if (q == cudaErrorNotReady) break;
      if (q != cudaSuccess) return CudaError(q, "cudaEventQuery (fan-out copy)");
      boards_.Signal(f.edge, f.epoch);
      completed->push_back(f.edge);
      free_events_.push_back(f.event);
      in_flight_.pop_front();
    }
    return absl::OkStatus();
  }

  // Opened IPC handles of peers' buffers (the boards count themselves).
  int64_t own_mappings() const override { return static_cast<int64_t>(opened_.size()); }

  struct InFlight {
    uint32_t edge;
    uint64_t epoch;
    cudaEvent_t event;
  };

  absl::Status Init(const FanoutContext& ctx) {
    table_ = ctx.table;
    rank_ = ctx.rank;
    buffers_ = ctx.buffers;
    RESHARD_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                        "cudaStreamCreateWithFlags");
    Record rec;
    RESHARD_RETURN_IF_ERROR(boards_.Create(ctx, rec));
    rec["host"] = HostIdentity();
    for (uint32_t b = 0; b < buffers_.size(); ++b) {
      if (buffers_[b].data == nullptr || buffers_[b].kind != MemoryKind::kCuda) continue;
      cudaIpcMemHandle_t h;
      RESHARD_CUDA_RETURN(cudaIpcGetMemHandle(&h, buffers_[b].data),
                          absl::StrFormat("cudaIpcGetMemHandle (rank %d buffer %d)", rank_, b));
      RESHARD_ASSIGN_OR_RETURN(uintptr_t base, AllocationBase(buffers_[b].data));
      rec[absl::StrFormat("buf%d", b)] = absl::StrFormat(
          "%s,%d,%d", absl::BytesToHexString(absl::string_view(h.reserved, sizeof(h.reserved))),
          reinterpret_cast<uintptr_t>(buffers_[b].data) - base, buffers_[b].bytes);
    }
    const std::string& prefix = ctx.options.key_prefix;
    RESHARD_RETURN_IF_ERROR(rendezvous::PublishRecord(*ctx.store, prefix, "cuda_ipc", rank_, rec));
    const absl::Time deadline = absl::Now() + ctx.options.setup_timeout;
    std::map<std::string, uint8_t*> opened_handles;
    for (int32_t p : boards_.peers()) {
      RESHARD_ASSIGN_OR_RETURN(
          Record pr, rendezvous::FetchRecord(*ctx.store, prefix, "cuda_ipc", p, deadline));
      RESHARD_ASSIGN_OR_RETURN(std::string host, rendezvous::Field(pr, "host", p));
      if (host != rec["host"]) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "cuda_ipc fan-out: ranks %d and %d share a domain but run on different hosts", rank_,
            p));
      }
      RESHARD_RETURN_IF_ERROR(boards_.OpenPeer(p, pr));
      for (const FanoutEdge& e : table_->edges) {
        if (e.from_rank != rank_ || e.to_rank != p) continue;
        if (peer_ptr_.count({p, e.to_buffer})) continue;
        RESHARD_ASSIGN_OR_RETURN(std::string text,
                                 rendezvous::Field(pr, absl::StrFormat("buf%d", e.to_buffer), p));
        cudaIpcMemHandle_t h;
        RESHARD_ASSIGN_OR_RETURN(
            PeerBufferDesc desc,
            ParseCudaIpcBufferDesc(text, p, e.to_buffer,
                                   WrittenExtent(*table_, rank_, p, e.to_buffer),
                                   sizeof(h.reserved)));
        const int64_t offset = desc.offset;
        const std::string& handle = desc.name;
        auto it = opened_handles.find(handle);
        if (it == opened_handles.end()) {
          std::memcpy(h.reserved, handle.data(), sizeof(h.reserved));
          void* base = nullptr;
          RESHARD_CUDA_RETURN(
              cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess),
              absl::StrFormat("cudaIpcOpenMemHandle (rank %d opening rank %d's buffer %d)", rank_,
                              p, e.to_buffer));
          opened_.push_back(base);
          it = opened_handles.emplace(handle, static_cast<uint8_t*>(base)).first;
        }
        peer_ptr_[{p, e.to_buffer}] = it->second + offset;
      }
    }
    // Every outgoing edge's copy, and the kernel's descriptors in one upload.
    copies_.resize(table_->edges.size());
    std::vector<cuda::CopyBatch> kernel_batches;
    for (uint32_t i = 0; i < table_->edges.size(); ++i) {
      const FanoutEdge& e = table_->edges[i];
      if (e.from_rank != rank_) continue;
      Copy& c = copies_[i];
      c.to = peer_ptr_.at({e.to_rank, e.to_buffer});
      c.how = internal::ChooseGpuCopy(internal::CopyRegionOf(*table_, e),
                                      ctx.options.cuda_ipc_kernel_only);
      if (c.how.method != internal::GpuCopyMethod::kKernel) continue;
      cuda::CopyBatchOptions o;
      o.from_base_align = internal::AddressAlignment(
          static_cast<int64_t>(reinterpret_cast<uintptr_t>(buffers_[e.from_buffer].data)));
      o.to_base_align =
          internal::AddressAlignment(static_cast<int64_t>(reinterpret_cast<uintptr_t>(c.to)));
      RESHARD_ASSIGN_OR_RETURN(cuda::CopyBatch batch, cuda::BuildCopyBatch({&c.how.region, 1}, o));
      c.kernel = kernel_batches.size();
      kernel_batches.push_back(std::move(batch));
    }
    if (!kernel_batches.empty()) {
      RESHARD_ASSIGN_OR_RETURN(kernels_, cuda::DeviceCopyBatches::Create(kernel_batches));
    }
    return boards_.FinishSetup(ctx, "cuda_ipc-mapped", deadline);
  }

  // How this rank copies one outgoing edge, decided once per handle.
  struct Copy {
    uint8_t* to = nullptr;  // The receiver's buffer, opened through IPC.
    internal::GpuCopy how;
    size_t kernel = 0;  // kKernel: the batch in kernels_.
  };

  const FanoutTable* table_ = nullptr;
  int32_t rank_ = 0;
  std::vector<BufferView> buffers_;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> opened_;
  std::map<std::pair<int32_t, uint32_t>, uint8_t*> peer_ptr_;
  std::vector<Copy> copies_;  // Per table edge (outgoing ones set).
  std::unique_ptr<cuda::DeviceCopyBatches> kernels_;
  std::deque<InFlight> in_flight_;
  std::vector<cudaEvent_t> free_events_;
};

class CudaIpcFactoryImpl final : public FanoutFactory {
 public:
  const char* name() const override { return "cuda_ipc"; }
  absl::Status Viable(const FanoutContext& ctx) const override {
    std::string why;
    if (cuda::CudaDeviceCount(&why) == 0) return absl::FailedPreconditionError(why);
    return internal::CheckEdgeBufferKinds(ctx, MemoryKind::kCuda);
  }
  absl::StatusOr<std::unique_ptr<FanoutBackend>> Create(const FanoutContext& ctx) const override {
    return CudaIpcBackend::Create(ctx);
  }
};

}  // namespace

#else  // !RESHARD_HAVE_CUDA

namespace {
class CudaIpcFactoryImpl final : public FanoutFactory {
 public:
  const char* name() const override { return "cuda_ipc"; }
  absl::Status Viable(const FanoutContext&) const override {
    return absl::FailedPreconditionError(
        "this build of reshard has no CUDA support (CUDA was not found at configure time)");
  }
  absl::StatusOr<std::unique_ptr<FanoutBackend>> Create(const FanoutContext& ctx) const override {
    return Viable(ctx);
  }
};
}  // namespace

#endif  // RESHARD_HAVE_CUDA

const FanoutFactory& CudaIpcFactory() {
  static const CudaIpcFactoryImpl factory;
  return factory;
}

}  // namespace reshard::nvlink
