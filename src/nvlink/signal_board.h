// Per-rank arrival signals in shared memory, used by the fan-out backends whose copies do not
// signal by themselves (host, CUDA IPC).
//
// Every rank owns one board: a small shared-memory object with the epoch it granted, a doorbell
// counter and one slot per fan-out piece it receives (the slot index is the piece's position in
// the receiver's incoming edges, known to every rank from the plan). A sender that finished
// copying piece p for epoch e stores e into the receiver's slot for p with release order and
// bumps the doorbell; the receiver reads the doorbell and slots with acquire order, so the data
// copy is visible before the signal is. The owner holds an open-file-description lock on the
// object for its whole life; peers test that lock to learn, without any timeout, that the owner
// exited (the kernel drops it when the process dies, whatever killed it).
//
// Thread safety: boards are thread-compatible; the slots themselves are atomics.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace reshard::nvlink {

struct BoardHeader;
inline constexpr int kFailureReasonBytes = 256;

// This rank's own board.
class SignalBoard {
 public:
  // Creates the board with `slots` arrival slots, named after `tag`. ResourceExhausted or
  // Internal when the shared-memory object cannot be created or locked.
  [[nodiscard]] static absl::StatusOr<SignalBoard> Create(const std::string& tag, int64_t slots);
  SignalBoard() = default;
  SignalBoard(SignalBoard&& o) noexcept;
  SignalBoard& operator=(SignalBoard&& o) noexcept;
  ~SignalBoard();

  const std::string& name() const { return name_; }
  // Removes the name once every peer opened it (the object lives while mapped).
  void Unlink();
  // Publishes that peers may write epoch `epoch`.
  void Grant(uint64_t epoch);
  // Doorbell count: changes whenever some slot was signalled.
  uint64_t doorbell() const;
  // Blocks (futex on the doorbell, shared between processes) while the doorbell still reads
  // `seen`, for at most `timeout`: peers ring it when they signal a slot or grant an epoch
  // this rank waits for.
  void WaitForRing(uint64_t seen, absl::Duration timeout);
  // True when slot `slot` was signalled for `epoch`.
  bool Arrived(int64_t slot, uint64_t epoch) const;
  // Publishes when this rank's network stage of `epoch` ended (Unix ns), for peers' statistics.
  void PublishNetworkEnd(uint64_t epoch, int64_t unix_ns);
  // Publishes that this rank failed refit `epoch`, with a one-line reason (cut at
  // kFailureReasonBytes - 1 bytes), for the domain peers waiting on its copies or grants
  // (PeerBoard::FailedEpoch). The caller rings them.
  void PublishFailure(uint64_t epoch, absl::string_view reason);

 private:
  void Release();
  std::string name_;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  int64_t bytes_ = 0;
  int64_t slots_ = 0;
  bool unlinked_ = false;
};

// A peer's board, mapped to signal it.
class PeerBoard {
 public:
  // Opens the board `name` that must hold at least `slots` slots. NotFound when it does not
  // exist (e.g. the peer is on another host).
  [[nodiscard]] static absl::StatusOr<PeerBoard> Open(const std::string& name, int64_t slots);
  PeerBoard() = default;
  PeerBoard(PeerBoard&& o) noexcept;
  PeerBoard& operator=(PeerBoard&& o) noexcept;
  ~PeerBoard();

  uint64_t granted() const;
  // Release-stores `epoch` into `slot` and rings the doorbell; call after the copy is visible.
  void Signal(int64_t slot, uint64_t epoch);
  // Rings the doorbell only (wakes the owner if it waits; e.g. for a grant it waits on).
  void Ring();
  // False once the owner exited.
  bool Alive() const;
  // When the owner's network stage of `epoch` ended (Unix ns), or 0 while it has not.
  int64_t NetworkEnd(uint64_t epoch) const;
  // The last epoch the owner published as failed (0: none) and, when `reason` is given, the
  // reason it published with it.
  uint64_t FailedEpoch(std::string* reason = nullptr) const;

 private:
  void Release();
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  int64_t bytes_ = 0;
  int64_t slots_ = 0;
};

}  // namespace reshard::nvlink
