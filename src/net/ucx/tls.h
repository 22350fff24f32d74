// UCX_TLS, parsed once. Two decisions depend on it: whether endpoints can ask for peer error
// handling (shared-memory-only selections refuse it in UCX 1.13) and whether data travels as
// active messages (tcp without an RDMA transport; see net::Delivery).
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace reshard::net::ucx {

struct TlsSelection {
  // UCX chooses: UCX_TLS unset, empty, containing "all", or an exclusion list ("^...").
  bool ucx_chooses = true;
  std::vector<std::string> names;  // As listed, when !ucx_chooses.

  bool Names(absl::string_view transport) const;
  // Any transport that reaches another host (tcp, ib, rc*, ud*, dc*, ...), or UCX chooses.
  bool network() const;
  // An RDMA transport is named (ib, rc*, ud*, dc*), or UCX chooses.
  bool rdma() const;

  // `tls` empty means unset.
  static TlsSelection Parse(absl::string_view tls);
  static TlsSelection FromEnvironment();
};

// Whether `transports` (as ucx::Endpoint::Transports() lists them, "posix/memory sysv/memory")
// names a shared-memory transport (posix, sysv, cma, knem, xpmem): UCX reaches the peer
// through memory of this host.
bool SharedMemoryLanes(absl::string_view transports);
// Whether UCX 1.13 emulates puts towards a peer reached over `transports` with active messages
// that the target must progress (shared memory and tcp lanes; RDMA lanes put natively).
bool EmulatedRmaLanes(absl::string_view transports);

}  // namespace reshard::net::ucx
