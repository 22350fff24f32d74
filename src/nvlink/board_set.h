// The signalling half shared by the host and CUDA IPC backends: this rank's SignalBoard, its
// domain peers' boards, and the slot every fan-out edge uses on its receiver. Internal.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "src/nvlink/fanout.h"
#include "src/nvlink/signal_board.h"
#include "src/rendezvous/record.h"

namespace reshard::nvlink::internal {

class BoardSet {
 public:
  // Creates this rank's board (one slot per incoming edge) and adds its name to `record`.
  [[nodiscard]] absl::Status Create(const FanoutContext& ctx, rendezvous::Record& record);
  // Ranks this rank sends to or receives from, sorted.
  const std::vector<int32_t>& peers() const { return peers_; }
  // Opens `peer`'s board from its record.
  [[nodiscard]] absl::Status OpenPeer(int32_t peer, const rendezvous::Record& record);
  // Barrier with every peer (they all opened this rank's board: senders to signal it, receivers
  // to watch its liveness), then unlinks its name so nothing is left in /dev/shm whatever
  // happens later. `what` names the barrier key.
  [[nodiscard]] absl::Status FinishSetup(const FanoutContext& ctx, const std::string& what,
                                         absl::Time deadline);

  void Grant(uint64_t epoch);
  bool Granted(int32_t peer, uint64_t epoch) const;
  // Signals the receiver of table edge `edge` (call once its bytes are visible).
  void Signal(uint32_t edge, uint64_t epoch);
  // Appends incoming edges that arrived for `epoch` (each once per Grant()).
  void Scan(uint64_t epoch, std::vector<uint32_t>* arrived);
  // Sleeps while the doorbell still reads what the last Scan saw (SignalBoard::WaitForRing).
  void Block(absl::Duration timeout) { board_.WaitForRing(seen_doorbell_, timeout); }
  // Unavailable when one of `peers` exited or published that it failed the epoch this rank
  // granted last.
  [[nodiscard]] absl::Status CheckPeers(const std::vector<int32_t>& peers) const;
  // Publishes that this rank failed refit `epoch` and rings every peer, so those waiting on it
  // fail at once instead of at their deadline.
  void PublishFailure(uint64_t epoch, absl::string_view reason);
  void PublishNetworkEnd(uint64_t epoch, int64_t unix_ns) {
    board_.PublishNetworkEnd(epoch, unix_ns);
  }
  int64_t PeerNetworkEnd(int32_t peer, uint64_t epoch) const {
    auto it = boards_.find(peer);
    return it == boards_.end() ? -1 : it->second.NetworkEnd(epoch);
  }
  int64_t mappings() const { return mappings_; }

 private:
  const FanoutTable* table_ = nullptr;
  int32_t rank_ = 0;
  std::vector<int64_t> slot_of_;
  std::vector<uint32_t> incoming_, pending_in_;
  std::vector<int32_t> peers_;
  uint64_t epoch_ = 0;  // Granted last.
  uint64_t last_doorbell_ = ~uint64_t{0};
  uint64_t seen_doorbell_ = 0;     // Read by the last Scan, before it looked at any slot.
  std::vector<int32_t> senders_;  // Peers that forward into this rank (rung by Grant).
  int64_t mappings_ = 0;
  SignalBoard board_;
  std::map<int32_t, PeerBoard> boards_;
};

}  // namespace reshard::nvlink::internal
