#include "src/net/ucx/context.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "src/net/ucx/status.h"
#include "src/net/ucx/tls.h"

namespace reshard::net::ucx {

bool TlsSupportsPeerErrorHandling(const std::string& tls) {
  return TlsSelection::Parse(tls).network();
}

absl::StatusOr<std::unique_ptr<Context>> Context::Create() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return ToStatus(st, "ucp_config_read");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  ucp_context_h context = nullptr;
  st = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (st != UCS_OK) {
    const char* tls = std::getenv("UCX_TLS");
    return ToStatus(st, "ucp_init", absl::StrCat("UCX_TLS=", tls ? tls : "(unset)"));
  }
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  uint64_t memory_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
  if (ucp_context_query(context, &attr) == UCS_OK) memory_types = attr.memory_types;
  const char* tls = std::getenv("UCX_TLS");
  return std::unique_ptr<Context>(
      new Context(context, memory_types, TlsSupportsPeerErrorHandling(tls ? tls : "")));
}

Context::~Context() {
  if (context_ != nullptr) ucp_cleanup(context_);
}

bool Context::supports_cuda_memory() const {
  return (memory_types_ & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

std::string Context::Version() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  return absl::StrCat(major, ".", minor, ".", release);
}

}  // namespace reshard::net::ucx
