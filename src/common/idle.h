// The one idle policy of every wait in a refit (engine, fan-out, session, wire-up, barriers).
//
// A waiting loop reports each round as busy (something progressed) or idle. After kSpinRounds
// idle rounds in a row the thread gives its core away (sched_yield) every round: on machines
// with more ranks than cores (tests, trainer and inference processes colocated on one host)
// the rank whose progress we are waiting for must get to run, while on a quiet machine a
// refit's latency stays that of a spin. (Blocking on an event - UCX worker wake-up fd, a signal
// board futex - is the next step and lands here, behind the same two calls.)
//
// Thread-compatible: one per waiting loop.
#pragma once

#include <sched.h>

namespace reshard {

class IdlePolicy {
 public:
  static constexpr int kSpinRounds = 4;

  // A round that progressed something: keep spinning.
  void Busy() { idle_rounds_ = 0; }
  // A round that found nothing to do.
  void Idle() {
    if (++idle_rounds_ > kSpinRounds) sched_yield();
  }
  // Busy() or Idle() by `progressed`.
  void Round(bool progressed) { progressed ? Busy() : Idle(); }

 private:
  int idle_rounds_ = 0;
};

}  // namespace reshard
