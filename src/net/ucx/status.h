// Converting UCX status codes into absl::Status where they occur (STYLE: the call and the
// context go into the message, e.g. "ucp_put_nbx: Endpoint timeout (peer rank 5)").
#pragma once

#include <ucs/type/status.h>

#include <string>

#include "absl/status/status.h"

namespace reshard::net::ucx {

// OK for UCS_OK (and UCS_INPROGRESS, which is not an error); otherwise a status whose code
// follows STYLE: unreachable, timed-out or reset peers are Unavailable, out-of-memory is
// ResourceExhausted, unsupported features are FailedPrecondition, everything else Internal.
[[nodiscard]] absl::Status ToStatus(ucs_status_t status, const std::string& call,
                                    const std::string& context = "");

}  // namespace reshard::net::ucx
