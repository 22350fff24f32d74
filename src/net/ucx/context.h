// Owner of the process's UCP context (ucp_context_h), created once per process.
//
// Thread safety: thread-compatible. A Context is created and destroyed by one thread; the const
// queries may be called from any thread. It must outlive every Worker and MemoryRegion made
// from it (members of the engine are declared in that order).
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace reshard::net::ucx {

class Context {
 public:
  // Reads the UCX configuration from the environment (UCX_TLS, UCX_NET_DEVICES, ...) and
  // initialises UCP with RMA and active messages. Errors: FailedPrecondition when UCX finds no
  // usable transport, Internal otherwise.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Context>> Create();

  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ucp_context_h get() const { return context_; }

  // True when UCP can register and put CUDA device memory directly (a CUDA-enabled UCX).
  // Debian's UCX 1.13 reports host memory only.
  bool supports_cuda_memory() const;
  // Bitmask of ucs_memory_type_t the context supports (UCS_BIT(type)).
  uint64_t memory_types() const { return memory_types_; }

  // Whether endpoints should request UCP_ERR_HANDLING_MODE_PEER. Shared-memory transports
  // (posix, sysv, cma, knem, xpmem) refuse that mode in UCX 1.13: when UCX_TLS names only
  // shared-memory / self / accelerator-copy transports, this is false and endpoints are created
  // without peer error handling (a lost peer then surfaces only through the caller's deadline).
  // With UCX_TLS unset, "all", an exclusion list ("^..."), or any network transport (tcp, rc,
  // ud, dc, ib) it is true; UCX then restricts the endpoint to transports that detect peer
  // failure.
  bool peer_error_handling() const { return peer_error_handling_; }

  // The UCX library version, e.g. "1.13.1".
  static std::string Version();

 private:
  Context(ucp_context_h context, uint64_t memory_types, bool peer_error_handling)
      : context_(context), memory_types_(memory_types), peer_error_handling_(peer_error_handling) {}

  ucp_context_h context_;
  uint64_t memory_types_;
  bool peer_error_handling_;
};

// The decision behind Context::peer_error_handling() for a given UCX_TLS value (exposed for
// tests). `tls` empty means unset.
bool TlsSupportsPeerErrorHandling(const std::string& tls);

}  // namespace reshard::net::ucx
