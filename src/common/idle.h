// The one idle policy of every wait in a refit (engine, fan-out, session, wire-up, barriers).
//
// A waiting loop reports each round as busy (something progressed) or idle. After kSpinRounds
// idle rounds in a row the loop blocks on the event source it was given (a Blocker: the UCX
// worker's wake-up fd, a fan-out signal board's doorbell futex, or the refit session's choice
// between them), for at most kMaxBlock at a time, so the loop still re-checks its deadline and
// same-host peers' processes. On machines with more ranks than cores (tests, trainer and
// inference processes colocated on one host) a waiting rank then gives its core to the ranks
// doing the work instead of competing for it, while a refit's latency stays that of a spin
// whenever events keep coming. A loop without an event source yields the core each idle round
// instead (sched_yield): NCCL stream queries, and waits for sends of this process that UCX may
// hold in its pending queue until a peer's receive queue has room (no event says so).
//
// Thread-compatible: one per waiting loop.
#pragma once

#include <sched.h>

#include "absl/time/time.h"

namespace reshard {

// Something a waiting loop can block on.
class Blocker {
 public:
  virtual ~Blocker() = default;
  // Returns when an event may have arrived since the caller's last round, or after at most
  // `timeout`; at once when events are already pending (the next round must take them in).
  virtual void Block(absl::Duration timeout) = 0;
};

class IdlePolicy {
 public:
  static constexpr int kSpinRounds = 16;
  // Longest single block: deadlines and same-host peers' processes are re-checked this often.
  static constexpr absl::Duration kMaxBlock = absl::Milliseconds(5);

  // `blocker`: the loop's event source (must outlive the policy); null to yield instead.
  explicit IdlePolicy(Blocker* blocker = nullptr) : blocker_(blocker) {}

  // A round that progressed something: keep spinning.
  void Busy() { idle_rounds_ = 0; }
  // A round that found nothing to do.
  void Idle() {
    if (++idle_rounds_ <= kSpinRounds) return;
    if (blocker_ != nullptr) {
      blocker_->Block(kMaxBlock);
    } else {
      sched_yield();
    }
  }
  // Busy() or Idle() by `progressed`.
  void Round(bool progressed) { progressed ? Busy() : Idle(); }

 private:
  Blocker* blocker_;
  int idle_rounds_ = 0;
};

}  // namespace reshard
