// Owner of a UCP endpoint to one peer worker.
//
// Thread safety: same thread model as Worker (single thread, no locks).
// Error handling: when `peer_error_handling` is requested (Context::peer_error_handling()),
// the endpoint is created with UCP_ERR_HANDLING_MODE_PEER and a lost peer is recorded in
// error() (Unavailable naming the peer rank) during Worker::Progress(); otherwise (shared-memory
// transports, which refuse that mode) the endpoint never reports peer loss and the caller's
// deadline is the only guard. If UCX refuses PEER mode at creation, the endpoint falls back to
// no error handling and says so in peer_error_handling().
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/net/ucx/worker.h"

namespace reshard::net::ucx {

class Endpoint {
 public:
  // Connects to the worker whose address blob is `remote_address`. `peer_rank` names the peer
  // in error messages. Errors: Unavailable when the address is unreachable.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Endpoint>> Create(
      Worker& worker, const std::string& remote_address, int32_t peer_rank,
      bool peer_error_handling);

  // Closes the endpoint: a flush close while the peer is healthy, bounded by a short deadline,
  // otherwise a forced close.
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  ucp_ep_h get() const { return ep_; }
  int32_t peer_rank() const { return peer_rank_; }
  bool peer_error_handling() const { return peer_error_handling_; }

  // OK while the peer is healthy; Unavailable once UCX reported the peer lost.
  const absl::Status& error() const { return error_; }

  // Flush-closes the endpoint (force-closes it when the peer is lost or `force`: operations in
  // flight then complete with UCS_ERR_CANCELED), progressing the worker until `deadline`.
  // Idempotent.
  void Close(absl::Time deadline, bool force = false);

  // The transports UCX selected for this endpoint's lanes, e.g. "tcp/lo" or
  // "posix/memory sysv/memory cma/memory"; deduplicated, in lane order. Empty before wireup
  // has chosen any lane.
  std::string Transports() const;

 private:
  Endpoint(Worker& worker, int32_t peer_rank) : worker_(&worker), peer_rank_(peer_rank) {}
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);

  Worker* worker_;
  int32_t peer_rank_;
  ucp_ep_h ep_ = nullptr;
  bool peer_error_handling_ = false;
  absl::Status error_;
};

}  // namespace reshard::net::ucx
