// Pieces the fan-out backends share, so each backend only implements what differs. Internal to
// src/nvlink.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "src/nvlink/board_set.h"
#include "src/nvlink/fanout.h"

namespace reshard::nvlink::internal {

// For a factory's Viable(): OK when every buffer this rank reads or writes through a fan-out
// edge of `ctx` is `kind` memory, else FailedPrecondition naming the buffer and rank. `also`,
// when set, is asked about each such edge and buffer (after its kind matched) and may refuse it
// with its own status; the first refusal is returned.
[[nodiscard]] absl::Status CheckEdgeBufferKinds(
    const FanoutContext& ctx, MemoryKind kind,
    const std::function<absl::Status(const FanoutEdge& edge, uint32_t buffer)>& also = nullptr);

// A backend whose copies do not signal by themselves (host, CUDA IPC): grants, arrivals, peer
// liveness and network-end statistics all go through this rank's signal boards, `boards_`.
// A subclass sets `boards_` up, moves the bytes (Forward), reports asynchronous copies that
// completed (Complete) and counts its own mappings.
class BoardBackend : public FanoutBackend {
 public:
  absl::Status Grant(uint64_t epoch) final {
    boards_.Grant(epoch);
    return absl::OkStatus();
  }
  bool Granted(int32_t peer, uint64_t epoch) final { return boards_.Granted(peer, epoch); }
  // Complete() first, then the arrivals signalled on this rank's board.
  absl::Status Progress(uint64_t epoch, std::vector<uint32_t>* arrived,
                        std::vector<uint32_t>* completed) final;
  absl::Status CheckPeers(const std::vector<int32_t>& peers) final {
    return boards_.CheckPeers(peers);
  }
  void PublishNetworkEnd(uint64_t epoch, int64_t unix_ns) final {
    boards_.PublishNetworkEnd(epoch, unix_ns);
  }
  int64_t PeerNetworkEnd(int32_t peer, uint64_t epoch) final {
    return boards_.PeerNetworkEnd(peer, epoch);
  }
  void PublishFailure(uint64_t epoch, absl::string_view reason) final {
    boards_.PublishFailure(epoch, reason);
  }
  // The boards' mappings plus the subclass's own.
  int64_t mappings_created() const final { return boards_.mappings() + own_mappings(); }
  // Sleeps on this rank's doorbell, which peers ring when a piece arrives here or when they
  // grant an epoch this rank forwards into; subclasses with copies of their own in flight
  // (cuda_ipc) return at once instead.
  void Block(absl::Duration timeout) override {
    if (CopiesInFlight()) return;
    boards_.Block(timeout);
  }

 protected:
  // Appends outgoing edges whose copy completed since the last call, after signalling their
  // receivers through `boards_`. Synchronous backends (Forward() returns true) have none.
  [[nodiscard]] virtual absl::Status Complete(std::vector<uint32_t>* completed) {
    return absl::OkStatus();
  }
  // Whether copies this rank started are still running (nothing rings when they finish).
  virtual bool CopiesInFlight() const { return false; }
  // Mappings the subclass created besides the boards (peer buffers, IPC handles).
  virtual int64_t own_mappings() const = 0;

  BoardSet boards_;
};

}  // namespace reshard::nvlink::internal
