#include "src/net/ucx/endpoint.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/common/idle.h"
#include "src/common/log.h"
#include "src/net/ucx/ops.h"
#include "src/net/ucx/status.h"

namespace reshard::net::ucx {

absl::StatusOr<std::unique_ptr<Endpoint>> Endpoint::Create(Worker& worker,
                                                           const std::string& remote_address,
                                                           int32_t peer_rank,
                                                           bool peer_error_handling) {
  std::unique_ptr<Endpoint> endpoint(new Endpoint(worker, peer_rank));
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(remote_address.data());
  ucs_status_t st = UCS_ERR_UNSUPPORTED;
  if (peer_error_handling) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Endpoint::OnError;
    params.err_handler.arg = endpoint.get();
    st = ucp_ep_create(worker.get(), &params, &endpoint->ep_);
    if (st == UCS_OK) {
      endpoint->peer_error_handling_ = true;
    } else {
      endpoint->ep_ = nullptr;  // Never use what a failed ucp_ep_create left behind.
      RESHARD_LOG(kWarning,
                  "UCX refused peer error handling towards rank %d (%s); continuing without it, "
                  "a lost peer is then caught by the deadline only",
                  peer_rank, ucs_status_string(st));
    }
  }
  if (st != UCS_OK) {
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(worker.get(), &params, &endpoint->ep_);
    if (st != UCS_OK) {
      endpoint->ep_ = nullptr;
      return ToStatus(st, "ucp_ep_create", absl::StrCat("peer rank ", peer_rank));
    }
  }
  return endpoint;
}

void Endpoint::OnError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* self = static_cast<Endpoint*>(arg);
  if (self->error_.ok()) {
    self->error_ = absl::UnavailableError(
        absl::StrCat("lost peer rank ", self->peer_rank_, ": ", ucs_status_string(status)));
  }
}

void Endpoint::Close(absl::Time deadline, bool force) {
  if (ep_ == nullptr) return;
  // A failed endpoint must be force-closed (UCX forbids a flush close after a peer error).
  ucs_status_ptr_t request = StartClose(ep_, force || !error_.ok());
  ep_ = nullptr;
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
  // Closing may wait for sends UCX holds until the peer's receive queue has room (no wake-up
  // event for that): yield rather than block.
  IdlePolicy idle;
  while (ucp_request_check_status(request) == UCS_INPROGRESS && absl::Now() < deadline) {
    idle.Round(worker_->Progress() > 0);
  }
  ucp_request_free(request);
}

Endpoint::~Endpoint() { Close(absl::Now() + absl::Seconds(2)); }

std::string Endpoint::Transports() const {
  if (ep_ == nullptr) return "";
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return "";
  ucp_ep_print_info(ep_, stream);
  std::fclose(stream);
  std::string info(text, size);
  std::free(text);
  // Lane lines look like "#   lane[0]:  1:posix/memory.0 md[1]  ...": keep "posix/memory".
  std::vector<std::string> names;
  for (absl::string_view line : absl::StrSplit(info, '\n')) {
    const size_t lane = line.find("lane[");
    if (lane == absl::string_view::npos) continue;
    absl::string_view rest = line.substr(lane);
    const size_t colon = rest.find(':');
    if (colon == absl::string_view::npos) continue;
    rest = rest.substr(colon + 1);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    const size_t colon2 = rest.find(':');
    if (colon2 != absl::string_view::npos) rest = rest.substr(colon2 + 1);
    const size_t end = rest.find_first_of(" \t");
    std::string name(rest.substr(0, end));
    const size_t dot = name.rfind('.');
    if (dot != std::string::npos && dot > name.find('/')) name.resize(dot);
    if (name.empty()) continue;
    bool seen = false;
    for (const std::string& n : names) seen = seen || n == name;
    if (!seen) names.push_back(std::move(name));
  }
  return absl::StrJoin(names, " ");
}

}  // namespace reshard::net::ucx
