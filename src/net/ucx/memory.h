// Owners of registered memory (ucp_mem_h) and of unpacked remote keys (ucp_rkey_h).
//
// Registration maps memory the caller already owns (ucp_mem_map of an existing address); it
// never allocates. Every successful MemoryRegion::Map increments a process-wide counter
// (RegistrationCount), so tests and reports can prove that refits after the first register
// nothing.
//
// Thread safety: same thread model as Worker. RegistrationCount() may be read from any thread.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "src/net/ucx/context.h"
#include "src/net/ucx/endpoint.h"

namespace reshard::net::ucx {

// Number of memory registrations this process has made so far (all contexts).
int64_t RegistrationCount();

class MemoryRegion {
 public:
  // Registers [address, address + bytes) of `memory_type` (UCS_MEMORY_TYPE_HOST or, with a
  // CUDA-enabled UCX, UCS_MEMORY_TYPE_CUDA). `bytes` must be > 0. The memory must outlive the
  // region. Errors: ResourceExhausted when pinning fails, FailedPrecondition for an unsupported
  // memory type.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MemoryRegion>> Map(
      const Context& context, void* address, size_t bytes, ucs_memory_type_t memory_type);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  ucp_mem_h get() const { return memh_; }
  void* address() const { return address_; }
  size_t bytes() const { return bytes_; }

  // The packed remote key, an opaque blob a peer unpacks with RemoteKey::Unpack.
  [[nodiscard]] absl::StatusOr<std::string> PackRkey() const;

 private:
  MemoryRegion(ucp_context_h context, ucp_mem_h memh, void* address, size_t bytes)
      : context_(context), memh_(memh), address_(address), bytes_(bytes) {}
  ucp_context_h context_;
  ucp_mem_h memh_;
  void* address_;
  size_t bytes_;
};

class RemoteKey {
 public:
  // Unpacks a peer's packed key for use on `endpoint` (which must outlive the key).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RemoteKey>> Unpack(const Endpoint& endpoint,
                                                                         const std::string& packed);
  ~RemoteKey();
  RemoteKey(const RemoteKey&) = delete;
  RemoteKey& operator=(const RemoteKey&) = delete;

  ucp_rkey_h get() const { return rkey_; }

 private:
  explicit RemoteKey(ucp_rkey_h rkey) : rkey_(rkey) {}
  ucp_rkey_h rkey_;
};

}  // namespace reshard::net::ucx
