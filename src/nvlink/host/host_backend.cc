#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "src/common/process.h"
#include "src/common/single_copy.h"
#include "src/common/status.h"
#include "src/nvlink/backend.h"
#include "src/nvlink/host/factory.h"
#include "src/nvlink/peer_buffer.h"
#include "src/common/shared_memory.h"
#include "src/nvlink/signal_board.h"
#include "src/rendezvous/record.h"

namespace reshard::nvlink {

int YamaPtraceScope() {
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if (in >> scope) return scope;
  return 0;
}

namespace {

using rendezvous::Record;

class HostBackend final : public internal::BoardBackend {
 public:
  static absl::StatusOr<std::unique_ptr<FanoutBackend>> Create(const FanoutContext& ctx) {
    auto b = std::unique_ptr<HostBackend>(new HostBackend());
    RESHARD_RETURN_IF_ERROR(b->Init(ctx));
    return std::unique_ptr<FanoutBackend>(std::move(b));
  }

  const char* name() const override { return "host"; }

  absl::StatusOr<bool> Forward(uint32_t edge, uint64_t epoch) override {
    const FanoutEdge& e = table_->edges[edge];
    Peer& peer = peers_.at(e.to_rank);
    const PeerBuffer& pb = peer.buffers.at(e.to_buffer);
    const uint8_t* src = static_cast<const uint8_t*>(buffers_[e.from_buffer].data);
    if (pb.mapped != nullptr) {
      plan::ForEachRun(e.region, table_->dims_of(e), [&](int64_t f, int64_t t, int64_t n) {
        std::memcpy(pb.mapped + t, src + f, n);
      });
    } else {
      RESHARD_RETURN_IF_ERROR(WriteRemote(e, peer, pb.remote, src));
    }
    boards_.Signal(edge, epoch);
    return true;
  }

 private:
  // Shared-memory objects of peers' buffers (the boards count themselves).
  int64_t own_mappings() const override { return static_cast<int64_t>(mappings_list_.size()); }

  struct PeerBuffer {
    uint8_t* mapped = nullptr;  // Inside one of mappings_list_ when shared.
    uintptr_t remote = 0;       // Address in the peer when private.
  };
  struct Peer {
    pid_t pid = 0;
    std::map<uint32_t, PeerBuffer> buffers;
    std::unique_ptr<SingleCopyWriter> writer;  // Set once probed: a buffer is private.
  };

  absl::Status Init(const FanoutContext& ctx) {
    table_ = ctx.table;
    rank_ = ctx.rank;
    buffers_ = ctx.buffers;
    std::map<int32_t, std::vector<uint32_t>> buffers_to;  // peer -> buffer ids written there
    bool private_incoming = false;
    for (const FanoutEdge& e : table_->edges) {
      if (e.to_rank == rank_ &&
          !SharedBuffer::Lookup(buffers_[e.to_buffer].data, buffers_[e.to_buffer].bytes)) {
        private_incoming = true;
      }
      if (e.from_rank == rank_) buffers_to[e.to_rank].push_back(e.to_buffer);
    }
    Record rec;
    RESHARD_RETURN_IF_ERROR(boards_.Create(ctx, rec));
    if (private_incoming && YamaPtraceScope() == 1) {
      // Yama restricts attach to descendants; let the domain peers (siblings) write into us.
      prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    }
    rec["host"] = HostIdentity();
    rec["pid"] = absl::StrFormat("%d", getpid());
    rec["probe"] = absl::StrFormat("%d", reinterpret_cast<uintptr_t>(SingleCopyWriter::OwnToken()));
    rec["token"] = absl::StrFormat("%d", *SingleCopyWriter::OwnToken());
    for (uint32_t b = 0; b < buffers_.size(); ++b) {
      if (buffers_[b].data == nullptr || buffers_[b].bytes == 0) continue;
      auto loc = SharedBuffer::Lookup(buffers_[b].data, buffers_[b].bytes);
      rec[absl::StrFormat("buf%d", b)] =
          loc ? absl::StrFormat("shm,%s,%d,%d,%d", loc->name, loc->offset, loc->mapped,
                                buffers_[b].bytes)
              : absl::StrFormat("addr,%d,%d", reinterpret_cast<uintptr_t>(buffers_[b].data),
                                buffers_[b].bytes);
    }
    const std::string& prefix = ctx.options.key_prefix;
    RESHARD_RETURN_IF_ERROR(rendezvous::PublishRecord(*ctx.store, prefix, "host", rank_, rec));
    const absl::Time deadline = absl::Now() + ctx.options.setup_timeout;

    struct MappedObject {
      uint8_t* data;
      int64_t bytes;
    };
    std::map<std::string, MappedObject> mapped_objects;
    for (int32_t p : boards_.peers()) {
      RESHARD_ASSIGN_OR_RETURN(Record pr,
                               rendezvous::FetchRecord(*ctx.store, prefix, "host", p, deadline));
      RESHARD_ASSIGN_OR_RETURN(std::string host, rendezvous::Field(pr, "host", p));
      if (host != rec["host"]) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "host fan-out: ranks %d and %d share a domain but run on different hosts; give "
            "the topology one domain per host or use a GPU backend",
            rank_, p));
      }
      RESHARD_RETURN_IF_ERROR(boards_.OpenPeer(p, pr));
      Peer peer;
      RESHARD_ASSIGN_OR_RETURN(int64_t pid, rendezvous::IntField(pr, "pid", p));
      peer.pid = static_cast<pid_t>(pid);
      auto it = buffers_to.find(p);
      if (it != buffers_to.end()) {
        std::vector<uint32_t> ids = it->second;
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        bool probed = false;
        for (uint32_t b : ids) {
          RESHARD_ASSIGN_OR_RETURN(std::string text,
                                   rendezvous::Field(pr, absl::StrFormat("buf%d", b), p));
          RESHARD_ASSIGN_OR_RETURN(
              PeerBufferDesc desc,
              ParseHostBufferDesc(text, p, b, WrittenExtent(*table_, rank_, p, b)));
          PeerBuffer pb;
          if (desc.kind == PeerBufferDesc::Kind::kShared) {
            auto m = mapped_objects.find(desc.name);
            if (m == mapped_objects.end()) {
              RESHARD_ASSIGN_OR_RETURN(SharedMapping mapping,
                                       SharedMapping::Open(desc.name, desc.mapped));
              m = mapped_objects.emplace(desc.name, MappedObject{mapping.data(), desc.mapped})
                      .first;
              mappings_list_.push_back(std::move(mapping));
            }
            // Another buffer in an object mapped before: it must lie inside that mapping too.
            if (desc.offset + desc.bytes > m->second.bytes) {
              return absl::InvalidArgumentError(absl::StrFormat(
                  "host fan-out: rank %d published buffer %d beyond the %d bytes of %s", p, b,
                  m->second.bytes, desc.name));
            }
            pb.mapped = m->second.data + desc.offset;
          } else {
            if (!probed) {
              RESHARD_RETURN_IF_ERROR(Probe(pr, p, peer.pid));
              peer.writer = std::make_unique<SingleCopyWriter>(rank_, p, peer.pid);
              probed = true;
            }
            pb.remote = desc.address;
          }
          peer.buffers[b] = pb;
        }
      }
      peers_.emplace(p, std::move(peer));
    }
    return boards_.FinishSetup(ctx, "host-mapped", deadline);
  }

  // Proves that process_vm_writev into `pid` is allowed and reaches the rank that published
  // the record (not a process of another pid namespace): read its token back.
  absl::Status Probe(const Record& pr, int32_t p, pid_t pid) {
    RESHARD_ASSIGN_OR_RETURN(int64_t probe, rendezvous::IntField(pr, "probe", p));
    RESHARD_ASSIGN_OR_RETURN(std::string token_text, rendezvous::Field(pr, "token", p));
    uint64_t token = 0;
    if (!absl::SimpleAtoi(token_text, &token)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "host fan-out: rank %d published a malformed probe token for rank %d", p, rank_));
    }
    absl::Status probed = SingleCopyWriter::Probe(rank_, p, pid, static_cast<uint64_t>(probe),
                                                  token);
    if (!probed.ok()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "host fan-out: %s (yama ptrace_scope=%d); allocate destination buffers with "
          "SharedBuffer so peers map them instead",
          probed.message(), YamaPtraceScope()));
    }
    return absl::OkStatus();
  }

  // One call per 1024 runs into the peer's private memory (SingleCopyWriter).
  absl::Status WriteRemote(const FanoutEdge& e, Peer& peer, uintptr_t remote,
                           const uint8_t* src) {
    absl::Status status;
    plan::ForEachRun(e.region, table_->dims_of(e), [&](int64_t f, int64_t t, int64_t n) {
      if (status.ok()) status = peer.writer->Add(src + f, remote + t, static_cast<size_t>(n));
    });
    if (status.ok()) status = peer.writer->Write();
    if (status.ok()) return status;
    peer.writer->Discard();
    return absl::Status(status.code(),
                        absl::StrFormat("fan-out, tensor \"%s\": %s",
                                        table_->tensor_names.size() > e.tensor
                                            ? table_->tensor_names[e.tensor]
                                            : "?",
                                        status.message()));
  }

  const FanoutTable* table_ = nullptr;
  int32_t rank_ = 0;
  std::vector<BufferView> buffers_;
  std::vector<SharedMapping> mappings_list_;
  std::map<int32_t, Peer> peers_;
};

class HostFactoryImpl final : public FanoutFactory {
 public:
  const char* name() const override { return "host"; }
  absl::Status Viable(const FanoutContext& ctx) const override {
    return internal::CheckEdgeBufferKinds(
        ctx, MemoryKind::kHost, [&](const FanoutEdge& e, uint32_t b) -> absl::Status {
          if (e.to_rank == ctx.rank && YamaPtraceScope() >= 3 &&
              !SharedBuffer::Lookup(ctx.buffers[b].data, ctx.buffers[b].bytes)) {
            return absl::FailedPreconditionError(absl::StrFormat(
                "buffer %d of rank %d is private memory and yama ptrace_scope=3 forbids "
                "process_vm_writev; allocate it with SharedBuffer",
                b, ctx.rank));
          }
          return absl::OkStatus();
        });
  }
  absl::StatusOr<std::unique_ptr<FanoutBackend>> Create(const FanoutContext& ctx) const override {
    return HostBackend::Create(ctx);
  }
};

}  // namespace

const FanoutFactory& HostFactory() {
  static const HostFactoryImpl factory;
  return factory;
}

}  // namespace reshard::nvlink
