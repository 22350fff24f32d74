#include "src/net/ucx/worker.h"

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
  return std::unique_ptr<Worker>(new Worker(worker, std::move(blob)));
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
