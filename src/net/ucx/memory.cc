#include "src/net/ucx/memory.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "src/net/ucx/status.h"

namespace reshard::net::ucx {
namespace {
std::atomic<int64_t> g_registrations{0};
}  // namespace

int64_t RegistrationCount() { return g_registrations.load(std::memory_order_relaxed); }

absl::StatusOr<std::unique_ptr<MemoryRegion>> MemoryRegion::Map(const Context& context,
                                                                void* address, size_t bytes,
                                                                ucs_memory_type_t memory_type) {
  if (bytes == 0) return absl::InvalidArgumentError("ucp_mem_map: cannot register 0 bytes");
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = address;
  params.length = bytes;
  params.memory_type = memory_type;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context.get(), &params, &memh);
  if (st != UCS_OK) {
    return ToStatus(st, "ucp_mem_map",
                    absl::StrCat(bytes, " bytes of ", ucs_memory_type_names[memory_type]));
  }
  g_registrations.fetch_add(1, std::memory_order_relaxed);
  return std::unique_ptr<MemoryRegion>(new MemoryRegion(context.get(), memh, address, bytes));
}

MemoryRegion::~MemoryRegion() {
  if (memh_ != nullptr) ucp_mem_unmap(context_, memh_);
}

absl::StatusOr<std::string> MemoryRegion::PackRkey() const {
  void* buffer = nullptr;
  size_t size = 0;
  ucs_status_t st = ucp_rkey_pack(context_, memh_, &buffer, &size);
  if (st != UCS_OK) return ToStatus(st, "ucp_rkey_pack");
  std::string packed(static_cast<const char*>(buffer), size);
  ucp_rkey_buffer_release(buffer);
  return packed;
}

absl::StatusOr<std::unique_ptr<RemoteKey>> RemoteKey::Unpack(const Endpoint& endpoint,
                                                             const std::string& packed) {
  ucp_rkey_h rkey = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(endpoint.get(), packed.data(), &rkey);
  if (st != UCS_OK) {
    return ToStatus(st, "ucp_ep_rkey_unpack", absl::StrCat("peer rank ", endpoint.peer_rank()));
  }
  return std::unique_ptr<RemoteKey>(new RemoteKey(rkey));
}

RemoteKey::~RemoteKey() {
  if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
}

}  // namespace reshard::net::ucx
