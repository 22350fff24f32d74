// A rendezvous store over a directory that every rank can see (a local tmpfs for single-host
// tests, or a shared filesystem). Each key is one file; Set writes a temporary file and renames
// it into place, so readers never see a partial value.
//
// Thread-safe and multi-process-safe. Get polls the directory (1 ms growing to 20 ms) until the
// key appears or the deadline passes (DeadlineExceeded). I/O errors are Unavailable.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "src/rendezvous/store.h"

namespace reshard::rendezvous {

class FileStore final : public Store {
 public:
  // Uses `directory`, creating it (one level, mode 0700) when missing. InvalidArgument for an
  // empty path, Unavailable when it cannot be created or is not a directory (a symbolic link is
  // refused), PermissionDenied when it belongs to another user or group/others may access it:
  // a store that others can read or write lets them learn or forge every rank's records.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<FileStore>> Open(
      const std::string& directory);

  [[nodiscard]] absl::Status Set(const std::string& key, const std::string& value) override;
  [[nodiscard]] absl::StatusOr<std::string> Get(const std::string& key,
                                                absl::Time deadline) override;
  [[nodiscard]] absl::Status Delete(const std::string& key) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& prefix) override;

  const std::string& directory() const { return directory_; }

 private:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {}

  std::string directory_;
};

}  // namespace reshard::rendezvous
