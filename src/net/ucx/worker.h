// Owner of a UCP worker: the progress engine of one process.
//
// Thread model: reshard creates ONE worker per process, in UCS_THREAD_MODE_SINGLE. Every call
// on the worker, its endpoints, remote keys and the requests they return (and every callback
// UCX runs from Progress()) happens on the thread that owns the engine; nothing here takes a
// lock. A caller that wants another thread to drive refits hands the whole engine over
// (thread-compatible, not thread-safe).
//
// On transports that emulate RMA with active messages (Debian's UCX 1.13 over tcp and shared
// memory), a put into this process completes only while this worker is progressed, so a
// destination must keep calling Progress() until its refit is done.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/common/idle.h"
#include "src/net/ucx/context.h"

namespace reshard::net::ucx {

// Blocking waits (src/common/idle.h): the context asks for UCP_FEATURE_WAKEUP and Block() arms
// the worker, then polls its wake-up fd; every transport reshard uses (tcp, shared memory, RDMA)
// signals incoming messages and completions through it.
class Worker : public Blocker {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Worker>> Create(const Context& context);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ucp_worker_h get() const { return worker_; }
  // The worker address as an opaque blob, to be sent to peers through the store.
  const std::string& address() const { return address_; }

  // Runs UCX callbacks; returns the number of events processed (0 when idle).
  unsigned Progress() { return ucp_worker_progress(worker_); }

  // Arms the worker and waits on its wake-up fd for at most `timeout`; returns at once when
  // events are pending (ucp_worker_arm: UCS_ERR_BUSY). Call after a Progress() that returned 0.
  // Without a wake-up fd (ucp_worker_get_efd failed: logged once at Create) it yields instead.
  void Block(absl::Duration timeout) override;
  // The wake-up fd, or -1.
  int event_fd() const { return event_fd_; }

  // Registers `cb(arg, ...)` for active messages with `id`. Messages are delivered whole
  // (UCP_AM_FLAG_WHOLE_MSG); callers keep their messages small enough for eager delivery.
  [[nodiscard]] absl::Status SetAmHandler(unsigned id, ucp_am_recv_callback_t cb, void* arg);

 private:
  Worker(ucp_worker_h worker, std::string address, int event_fd)
      : worker_(worker), address_(std::move(address)), event_fd_(event_fd) {}
  ucp_worker_h worker_;
  std::string address_;
  int event_fd_;
};

}  // namespace reshard::net::ucx
