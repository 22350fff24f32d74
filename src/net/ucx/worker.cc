#include "src/net/ucx/worker.h"

#include <poll.h>
#include <sched.h>

#include <cerrno>

#include "src/common/log.h"
#include "src/net/ucx/status.h"

namespace reshard::net::ucx {

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const Context& context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  ucs_status_t st = ucp_worker_create(context.get(), &params, &worker);
  if (st != UCS_OK) return ToStatus(st, "ucp_worker_create");
  ucp_address_t* address = nullptr;
  size_t length = 0;
  st = ucp_worker_get_address(worker, &address, &length);
  if (st != UCS_OK) {
    ucp_worker_destroy(worker);
    return ToStatus(st, "ucp_worker_get_address");
  }
  std::string blob(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker, address);
  int event_fd = -1;
  st = ucp_worker_get_efd(worker, &event_fd);
  if (st != UCS_OK) {
    RESHARD_LOG(kWarning,
                "ucp_worker_get_efd: %s; waits of this process yield the core instead of "
                "blocking",
                ucs_status_string(st));
    event_fd = -1;
  }
  return std::unique_ptr<Worker>(new Worker(worker, std::move(blob), event_fd));
}

void Worker::Block(absl::Duration timeout) {
  if (event_fd_ < 0) {
    sched_yield();
    return;
  }
  if (ucp_worker_arm(worker_) != UCS_OK) return;  // UCS_ERR_BUSY: events are pending.
  pollfd fd{event_fd_, POLLIN, 0};
  const timespec ts = absl::ToTimespec(timeout);
  ppoll(&fd, 1, &ts, nullptr);  // EINTR or a timeout: the caller's next round checks.
}

Worker::~Worker() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
}

absl::Status Worker::SetAmHandler(unsigned id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t param{};
  param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                     UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  param.id = id;
  param.flags = UCP_AM_FLAG_WHOLE_MSG;
  param.cb = cb;
  param.arg = arg;
  return ToStatus(ucp_worker_set_am_recv_handler(worker_, &param),
                  "ucp_worker_set_am_recv_handler");
}

}  // namespace reshard::net::ucx
