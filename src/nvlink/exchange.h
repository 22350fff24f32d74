// What the fan-out backends need besides the rendezvous records (src/rendezvous/record.h).
// Internal to src/nvlink.
#pragma once

#include <string>

namespace reshard::nvlink::internal {

// This machine's boot id (/proc/sys/kernel/random/boot_id): ranks with the same one run on one
// kernel. (Whether they share /dev/shm shows when a peer's object is opened.)
std::string HostIdentity();

}  // namespace reshard::nvlink::internal
