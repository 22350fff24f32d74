#include <algorithm>
#include <deque>
#include <set>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "src/common/idle.h"
#include "src/common/status.h"
#include "src/nvlink/backend.h"
#include "src/cuda/runtime.h"
#include "src/rendezvous/record.h"
#include "src/nvlink/nccl/factory.h"

#if RESHARD_HAVE_NCCL && RESHARD_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace reshard::nvlink {

#if RESHARD_HAVE_NCCL && RESHARD_HAVE_CUDA

namespace {

using rendezvous::Record;

absl::Status NcclError(ncclResult_t r, const std::string& call, ncclComm_t comm = nullptr) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  return absl::InternalError(absl::StrFormat("%s: %s%s%s", call, ncclGetErrorString(r),
                                             last && *last ? " - " : "", last ? last : ""));
}

class NcclBackend final : public FanoutBackend {
 public:
  static absl::StatusOr<std::unique_ptr<FanoutBackend>> Create(const FanoutContext& ctx) {
    auto b = std::unique_ptr<NcclBackend>(new NcclBackend());
    RESHARD_RETURN_IF_ERROR(b->Init(ctx));
    return std::unique_ptr<FanoutBackend>(std::move(b));
  }

  ~NcclBackend() override {
    if (comm_ != nullptr) {
      // A batch still in flight may wait for a peer that is gone: abort rather than destroy.
      if (!in_flight_.empty() || broken_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommFinalize(comm_);
        WaitComm(absl::Now() + absl::Seconds(5)).IgnoreError();
        ncclCommDestroy(comm_);
      }
    }
    for (auto& b : in_flight_) cudaEventDestroy(b.event);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "nccl"; }

  absl::Status Grant(uint64_t epoch) override {
    // A receive is only posted by its receiver inside the epoch: NCCL needs no separate grant.
    next_batch_ = 0;
    epoch_ = epoch;
    std::fill(ready_.begin(), ready_.end(), 0);
    return absl::OkStatus();
  }
  bool Granted(int32_t, uint64_t) override { return true; }

  absl::StatusOr<bool> Forward(uint32_t edge, uint64_t epoch) override {
    ready_[edge] = 1;
    return false;
  }

  absl::Status Progress(uint64_t epoch, std::vector<uint32_t>* arrived,
                        std::vector<uint32_t>* completed) override {
    // Issue every batch whose sends (from this rank) all landed, in order.
    while (next_batch_ < batches_.size()) {
      const Batch& b = batches_[next_batch_];
      bool ready = true;
      for (uint32_t i : b.sends) ready = ready && ready_[i];
      if (!ready) break;
      if (!b.sends.empty() || !b.recvs.empty()) RESHARD_RETURN_IF_ERROR(Issue(next_batch_));
      ++next_batch_;
    }
    while (!in_flight_.empty()) {
      const cudaError_t q = cudaEventQuery(in_flight_.front().event);
      if (q == cudaErrorNotReady) break;
      if (q != cudaSuccess) {
        broken_ = true;
        return absl::InternalError(
            absl::StrFormat("cudaEventQuery (NCCL fan-out batch): %s", cudaGetErrorString(q)));
      }
      const Batch& b = batches_[in_flight_.front().batch];
      completed->insert(completed->end(), b.sends.begin(), b.sends.end());
      arrived->insert(arrived->end(), b.recvs.begin(), b.recvs.end());
      free_events_.push_back(in_flight_.front().event);
      in_flight_.pop_front();
    }
    return absl::OkStatus();
  }

  absl::Status CheckPeers(const std::vector<int32_t>&) override {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
    if (r != ncclSuccess) return NcclError(r, "ncclCommGetAsyncError", comm_);
    if (async != ncclSuccess && async != ncclInProgress) {
      broken_ = true;
      return absl::UnavailableError(absl::StrFormat(
          "fan-out: the NCCL communicator of rank %d's domain failed (%s): a peer exited or "
          "its GPU failed",
          rank_, ncclGetErrorString(async)));
    }
    return absl::OkStatus();
  }

  int64_t mappings_created() const override { return comm_ != nullptr ? 1 : 0; }

 private:
  struct Batch {
    std::vector<uint32_t> sends, recvs;  // Table edges of this rank, in table order.
    std::vector<uint32_t> all;           // Every edge of this rank in the batch, table order.
  };
  struct InFlight {
    size_t batch;
    cudaEvent_t event;
  };

  absl::Status WaitComm(absl::Time deadline) {
    IdlePolicy idle;
    while (true) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) return NcclError(r, "ncclCommGetAsyncError", comm_);
      if (async == ncclSuccess) return absl::OkStatus();
      if (async != ncclInProgress) {
        broken_ = true;
        return NcclError(async, "NCCL fan-out communicator", comm_);
      }
      if (absl::Now() > deadline) {
        broken_ = true;
        return absl::DeadlineExceededError(absl::StrFormat(
            "fan-out: rank %d's NCCL communicator did not become ready before the deadline "
            "(a domain peer did not join)",
            rank_));
      }
      idle.Idle();
    }
  }

  absl::Status Issue(size_t k) {
    const Batch& b = batches_[k];
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return NcclError(r, "ncclGroupStart", comm_);
    for (uint32_t i : b.all) {
      const FanoutEdge& e = table_->edges[i];
      const bool send = e.from_rank == rank_;
      uint8_t* base = static_cast<uint8_t*>(buffers_[send ? e.from_buffer : e.to_buffer].data);
      const int peer = comm_rank_.at(send ? e.to_rank : e.from_rank);
      plan::ForEachRun(e.region, table_->dims_of(e), [&](int64_t f, int64_t t, int64_t n) {
        if (r != ncclSuccess) return;
        r = send ? ncclSend(base + f, static_cast<size_t>(n), ncclUint8, peer, comm_, stream_)
                 : ncclRecv(base + t, static_cast<size_t>(n), ncclUint8, peer, comm_, stream_);
      });
      if (r != ncclSuccess) {
        ncclGroupEnd();
        return NcclError(r, send ? "ncclSend (fan-out)" : "ncclRecv (fan-out)", comm_);
      }
    }
    r = ncclGroupEnd();
    if (r == ncclInProgress) {
      RESHARD_RETURN_IF_ERROR(WaitComm(absl::Now() + absl::Seconds(30)));
    } else if (r != ncclSuccess) {
      return NcclError(r, "ncclGroupEnd (fan-out batch)", comm_);
    }
    cudaEvent_t ev = nullptr;
    if (!free_events_.empty()) {
      ev = free_events_.back();
      free_events_.pop_back();
    } else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
      return absl::InternalError("cudaEventCreateWithFlags failed (NCCL fan-out)");
    }
    if (cudaEventRecord(ev, stream_) != cudaSuccess) {
      return absl::InternalError("cudaEventRecord failed (NCCL fan-out)");
    }
    in_flight_.push_back({k, ev});
    return absl::OkStatus();
  }

  absl::Status Init(const FanoutContext& ctx) {
    table_ = ctx.table;
    rank_ = ctx.rank;
    buffers_ = ctx.buffers;
    ready_.assign(table_->edges.size(), 0);
    // Participants: every rank of the table, sorted; the communicator spans exactly them.
    std::set<int32_t> members;
    for (const FanoutEdge& e : table_->edges) {
      members.insert(e.from_rank);
      members.insert(e.to_rank);
    }
    std::vector<int32_t> ranks(members.begin(), members.end());
    for (size_t i = 0; i < ranks.size(); ++i) comm_rank_[ranks[i]] = static_cast<int>(i);
    const int per = std::max(1, ctx.options.nccl_batch_edges);
    for (size_t i = 0; i < table_->edges.size(); ++i) {
      if (i % per == 0) batches_.emplace_back();
      const FanoutEdge& e = table_->edges[i];
      if (e.from_rank == rank_) batches_.back().sends.push_back(static_cast<uint32_t>(i));
      if (e.to_rank == rank_) batches_.back().recvs.push_back(static_cast<uint32_t>(i));
      if (e.from_rank == rank_ || e.to_rank == rank_) {
        batches_.back().all.push_back(static_cast<uint32_t>(i));
      }
    }
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) {
      return absl::InternalError("cudaStreamCreateWithFlags failed (NCCL fan-out)");
    }

    // One GPU per rank: NCCL refuses duplicate devices in a communicator.
    const std::string& prefix = ctx.options.key_prefix;
    const absl::Time deadline = absl::Now() + ctx.options.setup_timeout;
    int dev = 0;
    char bus[64] = {};
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetPCIBusId(bus, sizeof(bus), dev) != cudaSuccess) {
      return absl::InternalError("cudaGetDevice/cudaDeviceGetPCIBusId failed (NCCL fan-out)");
    }
    RESHARD_RETURN_IF_ERROR(
        rendezvous::PublishRecord(*ctx.store, prefix, "nccl-gpu", rank_, {{"bus", bus}}));
    for (int32_t p : ranks) {
      if (p == rank_) continue;
      RESHARD_ASSIGN_OR_RETURN(Record pr,
                               rendezvous::FetchRecord(*ctx.store, prefix, "nccl-gpu", p, deadline));
      if (pr["bus"] == bus) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "nccl fan-out: ranks %d and %d drive the same GPU %s; NCCL needs one GPU per rank "
            "(use the cuda_ipc backend)",
            rank_, p, bus));
      }
    }

    ncclUniqueId id;
    if (ranks.front() == rank_) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) return NcclError(r, "ncclGetUniqueId");
      RESHARD_RETURN_IF_ERROR(rendezvous::PublishRecord(
          *ctx.store, prefix, "nccl-id", rank_,
          {{"id", absl::BytesToHexString(absl::string_view(id.internal, sizeof(id.internal)))}}));
    } else {
      RESHARD_ASSIGN_OR_RETURN(
          Record r, rendezvous::FetchRecord(*ctx.store, prefix, "nccl-id", ranks.front(), deadline));
      const std::string bytes = absl::HexStringToBytes(r["id"]);
      if (bytes.size() != sizeof(id.internal)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "nccl fan-out: rank %d published a malformed unique id", ranks.front()));
      }
      std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // So that a peer that never joins becomes a deadline, not a hang.
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, static_cast<int>(ranks.size()), id,
                                                  comm_rank_.at(rank_), &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      return NcclError(r, "ncclCommInitRankConfig (fan-out)", comm_);
    }
    return WaitComm(deadline);
  }

  const FanoutTable* table_ = nullptr;
  int32_t rank_ = 0;
  std::vector<BufferView> buffers_;
  std::map<int32_t, int> comm_rank_;
  std::vector<Batch> batches_;
  std::vector<uint8_t> ready_;
  size_t next_batch_ = 0;
  uint64_t epoch_ = 0;
  bool broken_ = false;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::deque<InFlight> in_flight_;
  std::vector<cudaEvent_t> free_events_;
};

class NcclFactoryImpl final : public FanoutFactory {
 public:
  const char* name() const override { return "nccl"; }
  absl::Status Viable(const FanoutContext& ctx) const override {
    std::string why;
    if (cuda::CudaDeviceCount(&why) == 0) return absl::FailedPreconditionError(why);
    return internal::CheckEdgeBufferKinds(ctx, MemoryKind::kCuda);
  }
  absl::StatusOr<std::unique_ptr<FanoutBackend>> Create(const FanoutContext& ctx) const override {
    return NcclBackend::Create(ctx);
  }
};

}  // namespace

#else  // !(RESHARD_HAVE_NCCL && RESHARD_HAVE_CUDA)

namespace {
class NcclFactoryImpl final : public FanoutFactory {
 public:
  const char* name() const override { return "nccl"; }
  absl::Status Viable(const FanoutContext&) const override {
    return absl::FailedPreconditionError(
        "this build of reshard has no NCCL support (NCCL was not found at configure time)");
  }
  absl::StatusOr<std::unique_ptr<FanoutBackend>> Create(const FanoutContext& ctx) const override {
    return Viable(ctx);
  }
};
}  // namespace

#endif

const FanoutFactory& NcclFactory() {
  static const NcclFactoryImpl factory;
  return factory;
}

}  // namespace reshard::nvlink
