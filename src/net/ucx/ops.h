// Endpoint operations: the one place that fills ucp_request_param_t.
//
// Each operation is posted non-blocking. The result says what happened:
//   UCS_OK          done at once; `done` is never called;
//   UCS_INPROGRESS  in flight; `done->Complete(status)` runs exactly once from Worker::Progress
//                   (UCS_ERR_CANCELED when the endpoint is force-closed first), after which the
//                   request has been freed;
//   anything else   failed at once; `done` is never called.
// Whoever passes `done` owns the request until Complete runs: it keeps `done` and every buffer
// the operation reads (data, header) alive until then. Nothing here allocates.
//
// Thread safety: the worker's thread model (single thread, no locks).
#pragma once

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>

namespace reshard::net::ucx {

class Completion {
 public:
  virtual void Complete(ucs_status_t status) = 0;

 protected:
  ~Completion() = default;
};

// ucp_put_nbx of [local, local + bytes) to `remote` under `rkey`; `memh` (may be null) is the
// registration of the local memory.
ucs_status_t Put(ucp_ep_h ep, const void* local, size_t bytes, uint64_t remote, ucp_rkey_h rkey,
                 ucp_mem_h memh, Completion* done);

// An eager active message `id` carrying `header` and `data` (both kept alive until done).
ucs_status_t SendAm(ucp_ep_h ep, unsigned id, const void* header, size_t header_bytes,
                    const void* data, size_t bytes, ucp_mem_h memh, Completion* done);

// Completes once every operation posted on `ep` before it is remotely complete.
ucs_status_t Flush(ucp_ep_h ep, Completion* done);

// Starts closing `ep` (flush close, or a forced close that cancels what is in flight). Returns
// null when closed at once, an error pointer, or a request the caller polls with
// ucp_request_check_status and frees with ucp_request_free.
ucs_status_ptr_t StartClose(ucp_ep_h ep, bool force);

}  // namespace reshard::net::ucx
