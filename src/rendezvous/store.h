// The rendezvous key-value store that ranks use to swap set-up data once per handle (worker
// addresses, packed remote keys, plan fingerprints, shared-memory names, NCCL unique ids).
//
// An interface so frameworks can plug in their own store (their launcher's KV, a PMIx store).
// Implementations: TcpStore (tcp_store.h, served by rank 0 or a separate process, protected by
// a shared token) and FileStore (file_store.h, a directory on a filesystem all ranks share).
//
// Thread safety: implementations are thread-safe. Every blocking call takes a deadline and
// returns DeadlineExceeded when it passes; a store that cannot be reached is Unavailable.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace reshard::rendezvous {

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any previous value.
  [[nodiscard]] virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Set, giving up at `deadline` (DeadlineExceeded or Unavailable) when the store does not
  // answer by then. Backends whose Set cannot block (files, callbacks) need not override it.
  [[nodiscard]] virtual absl::Status SetBefore(const std::string& key, const std::string& value,
                                               absl::Time deadline) {
    return Set(key, value);
  }

  // Returns the value of `key`, waiting until some rank sets it or `deadline` passes.
  [[nodiscard]] virtual absl::StatusOr<std::string> Get(const std::string& key,
                                                        absl::Time deadline) = 0;

  // Removes `key` (OK when it was absent). Used to keep long-lived stores bounded: the keys of
  // a finished barrier generation are deleted by their owners.
  [[nodiscard]] virtual absl::Status Delete(const std::string& key) = 0;
  // Every key (with its value) that starts with `prefix`, sorted by key. Does not wait.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& prefix) = 0;
};

}  // namespace reshard::rendezvous
