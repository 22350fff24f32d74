#include "src/net/ucx/status.h"

#include "absl/strings/str_cat.h"

namespace reshard::net::ucx {

absl::Status ToStatus(ucs_status_t status, const std::string& call, const std::string& context) {
  if (status == UCS_OK || status == UCS_INPROGRESS) return absl::OkStatus();
  std::string message = absl::StrCat(call, ": ", ucs_status_string(status));
  if (!context.empty()) absl::StrAppend(&message, " (", context, ")");
  switch (status) {
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_CANCELED:
    // Mapping a peer's shared-memory segment fails when the peer exited meanwhile (an endpoint
    // created to a rank that died during set-up).
    case UCS_ERR_SHMEM_SEGMENT:
      return absl::UnavailableError(message);
    case UCS_ERR_TIMED_OUT:
      return absl::DeadlineExceededError(message);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(message);
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NO_DEVICE:
      return absl::FailedPreconditionError(message);
    case UCS_ERR_INVALID_PARAM:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace reshard::net::ucx
