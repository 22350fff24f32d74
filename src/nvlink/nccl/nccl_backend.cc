#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/idle.h"
#include "src/common/status.h"
#include "src/cuda/pack.h"
#include "src/cuda/runtime.h"
#include "src/nvlink/backend.h"
#include "src/nvlink/gpu_schedule.h"
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
    // Our own stream only (its NCCL calls were aborted above when a peer is gone), so that the
    // staging is not freed under a kernel.
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (auto& b : in_flight_) cudaEventDestroy(b.event);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    kernels_.reset();
    if (staging_ != nullptr) cudaFree(staging_);
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
    while (next_batch_ < program_.batches.size()) {
      const internal::NcclRankBatch& b = program_.batches[next_batch_];
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
      const internal::NcclRankBatch& b = program_.batches[in_flight_.front().batch];
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

  // `st` with the rank, round and peers it concerns.
  absl::Status Annotate(const absl::Status& st, const char* what, const internal::NcclRankRound& rr,
                        const std::vector<internal::NcclStream>& streams) const {
    if (st.ok()) return st;
    std::string peers;
    for (const internal::NcclStream& p : streams) {
      absl::StrAppend(&peers, peers.empty() ? "" : ",", p.peer);
    }
    return absl::Status(st.code(),
                        absl::StrFormat("NCCL fan-out %s of rank %d, round %d (peers %s): %s", what,
                                        rank_, rr.round, peers, st.message()));
  }

  // Runs batch k's rounds on the stream: per round one pack launch into staging, one group of
  // one ncclSend per receiving peer and one ncclRecv per sending peer, one unpack launch.
  absl::Status Issue(size_t k) {
    for (const internal::NcclRankRound& rr : program_.batches[k].rounds) {
      const size_t j = launch_index_[rr.round];
      if (!rr.sends.empty()) {
        RESHARD_RETURN_IF_ERROR(
            Annotate(kernels_->Pack(2 * j, from_base_, staging_, stream_), "pack", rr, rr.sends));
      }
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return NcclError(r, "ncclGroupStart", comm_);
      for (const internal::NcclStream& st : rr.sends) {
        r = ncclSend(staging_ + st.staging_offset, static_cast<size_t>(st.bytes), ncclUint8,
                     comm_rank_.at(st.peer), comm_, stream_);
        if (r != ncclSuccess) {
          ncclGroupEnd();
          return NcclError(r, absl::StrFormat("ncclSend (fan-out to rank %d)", st.peer), comm_);
        }
      }
      for (const internal::NcclStream& st : rr.recvs) {
        r = ncclRecv(staging_ + st.staging_offset, static_cast<size_t>(st.bytes), ncclUint8,
                     comm_rank_.at(st.peer), comm_, stream_);
        if (r != ncclSuccess) {
          ncclGroupEnd();
          return NcclError(r, absl::StrFormat("ncclRecv (fan-out from rank %d)", st.peer), comm_);
        }
      }
      r = ncclGroupEnd();
      if (r == ncclInProgress) {
        RESHARD_RETURN_IF_ERROR(WaitComm(absl::Now() + absl::Seconds(30)));
      } else if (r != ncclSuccess) {
        return NcclError(r, "ncclGroupEnd (fan-out round)", comm_);
      }
      if (!rr.recvs.empty()) {
        RESHARD_RETURN_IF_ERROR(
            Annotate(kernels_->Unpack(2 * j + 1, staging_, to_base_, stream_), "unpack", rr, rr.recvs));
      }
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
    RESHARD_ASSIGN_OR_RETURN(internal::NcclSchedule schedule,
                             internal::BuildNcclSchedule(*table_, ctx.options.nccl_batch_edges,
                                                         ctx.options.gpu_staging_bytes));
    std::vector<int64_t> addresses(buffers_.size(), 0);
    for (size_t b = 0; b < buffers_.size(); ++b) {
      addresses[b] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(buffers_[b].data));
    }
    RESHARD_ASSIGN_OR_RETURN(program_,
                             internal::BuildNcclRankProgram(*table_, schedule, rank_, addresses));
    from_base_ = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(program_.from_base));
    to_base_ = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(program_.to_base));
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) {
      return absl::InternalError("cudaStreamCreateWithFlags failed (NCCL fan-out)");
    }
    // Staging and every round's pack and unpack descriptors, once per handle.
    if (program_.staging_bytes > 0) {
      void* staging = nullptr;
      const cudaError_t err = cudaMalloc(&staging, static_cast<size_t>(program_.staging_bytes));
      if (err != cudaSuccess) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "fan-out: rank %d cannot allocate %d bytes of NCCL staging: cudaMalloc: %s", rank_,
            program_.staging_bytes, cudaGetErrorString(err)));
      }
      staging_ = static_cast<uint8_t*>(staging);
    }
    std::vector<cuda::PackBatch> launches;
    launch_index_.assign(schedule.rounds.size(), 0);
    for (const internal::NcclRankBatch& b : program_.batches) {
      for (const internal::NcclRankRound& rr : b.rounds) {
        launch_index_[rr.round] = launches.size() / 2;
        launches.push_back(rr.pack);
        launches.push_back(rr.unpack);
      }
    }
    if (!launches.empty()) {
      RESHARD_ASSIGN_OR_RETURN(kernels_, cuda::DevicePackBatches::Create(launches));
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
    const std::string batching =
        absl::StrFormat("%d,%d", ctx.options.nccl_batch_edges, ctx.options.gpu_staging_bytes);
    RESHARD_RETURN_IF_ERROR(rendezvous::PublishRecord(*ctx.store, prefix, "nccl-gpu", rank_,
                                                      {{"bus", bus}, {"batching", batching}}));
    for (int32_t p : ranks) {
      if (p == rank_) continue;
      RESHARD_ASSIGN_OR_RETURN(Record pr,
                               rendezvous::FetchRecord(*ctx.store, prefix, "nccl-gpu", p, deadline));
      if (pr["batching"] != batching) {
        // Ranks that cut batches or rounds differently would match the wrong sends and receives.
        return absl::FailedPreconditionError(absl::StrFormat(
            "nccl fan-out: rank %d batches with nccl_batch_edges,gpu_staging_bytes = %s but rank "
            "%d with %s; every rank of a domain must use the same",
            rank_, batching, p, pr["batching"]));
      }
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
  internal::NcclRankProgram program_;
  std::vector<size_t> launch_index_;  // Per schedule round: this rank's pack/unpack pair.
  uint8_t* from_base_ = nullptr;      // Addresses the program's offsets are taken from.
  uint8_t* to_base_ = nullptr;
  std::vector<uint8_t> ready_;
  size_t next_batch_ = 0;
  uint64_t epoch_ = 0;
  bool broken_ = false;
  cudaStream_t stream_ = nullptr;
  uint8_t* staging_ = nullptr;  // Device memory, program_.staging_bytes.
  std::unique_ptr<cuda::DevicePackBatches> kernels_;
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
