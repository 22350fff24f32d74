// For launchers (`reshard run`, a framework's own launcher): the rendezvous store server the
// ranks connect to, and clean-up after a rank that was killed.
//
// Thread safety: StoreServer is thread-safe; it serves from its own thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace reshard {

// The reshard TCP store server (the one Communicator::Connect and RESHARD_STORE reach),
// protected by a shared token. Serves until destroyed.
class StoreServer {
 public:
  // Listens on `host`:`port` (port 0: any free port). InvalidArgument for an empty token or a
  // bad host; Unavailable when the address cannot be bound.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& host,
                                                                         int port,
                                                                         const std::string& token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  // Clients turned away (wrong token, bad handshake), for reports.
  int64_t refused() const;

  class Impl;

 private:
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Removes the shared-memory objects (HostBuffers, fan-out signal boards) that process `pid`
// created. A process killed by a signal cannot remove its own; its launcher calls this after
// reaping it. Returns how many objects were removed.
int RemoveSharedMemoryOf(int64_t pid);

// Removes the shared-memory objects of this user whose creating process is gone, e.g. those of
// ranks killed together with their launcher. Launchers call it when they start; the library
// also does once per process before it creates its first shared buffer. Returns how many.
int RemoveSharedMemoryOfDeadProcesses();

}  // namespace reshard
