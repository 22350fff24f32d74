#include "src/net/ucx/tls.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace reshard::net::ucx {
namespace {

// Transports (and aliases) that stay on one host; everything else reaches the network.
constexpr const char* kLocalOnly[] = {"sm",       "shm",       "posix",    "sysv",      "cma",
                                      "knem",     "xpmem",     "self",     "cuda_copy", "cuda_ipc",
                                      "gdr_copy", "rocm_copy", "rocm_ipc", "cuda",      "rocm"};

bool IsRdma(absl::string_view name) {
  return name == "ib" || absl::StartsWith(name, "rc") || absl::StartsWith(name, "ud") ||
         absl::StartsWith(name, "dc");
}

}  // namespace

bool TlsSelection::Names(absl::string_view transport) const {
  for (const std::string& n : names) {
    if (n == transport) return true;
  }
  return false;
}

bool TlsSelection::network() const {
  if (ucx_chooses) return true;
  for (const std::string& n : names) {
    bool local = false;
    for (const char* l : kLocalOnly) local = local || n == l;
    if (!local) return true;
  }
  return false;
}

bool TlsSelection::rdma() const {
  if (ucx_chooses) return true;
  for (const std::string& n : names) {
    if (IsRdma(n)) return true;
  }
  return false;
}

TlsSelection TlsSelection::Parse(absl::string_view tls) {
  TlsSelection s;
  if (tls.empty() || tls[0] == '^') return s;
  for (absl::string_view token : absl::StrSplit(tls, ',', absl::SkipEmpty())) {
    if (token == "all") return TlsSelection{};
    s.names.emplace_back(token);
  }
  s.ucx_chooses = s.names.empty();
  return s;
}

bool SharedMemoryLanes(absl::string_view transports) {
  for (absl::string_view lane : absl::StrSplit(transports, ' ', absl::SkipEmpty())) {
    const absl::string_view tl = lane.substr(0, lane.find('/'));
    if (tl == "posix" || tl == "sysv" || tl == "cma" || tl == "knem" || tl == "xpmem") return true;
  }
  return false;
}

bool EmulatedRmaLanes(absl::string_view transports) {
  for (absl::string_view lane : absl::StrSplit(transports, ' ', absl::SkipEmpty())) {
    if (lane.substr(0, lane.find('/')) == "tcp") return true;
  }
  return SharedMemoryLanes(transports);
}

TlsSelection TlsSelection::FromEnvironment() {
  const char* tls = std::getenv("UCX_TLS");
  return Parse(tls == nullptr ? "" : tls);
}

}  // namespace reshard::net::ucx
