#include "src/nvlink/exchange.h"

#include <fstream>

namespace reshard::nvlink::internal {

std::string HostIdentity() {
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return boot.empty() ? "unknown-boot-id" : boot;
}

}  // namespace reshard::nvlink::internal
