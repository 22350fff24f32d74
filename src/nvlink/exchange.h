// Set-up records the fan-out backends swap through the store: one flat `key=value` record per
// rank and backend, and a barrier. Internal to src/nvlink.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/net/store.h"

namespace reshard::nvlink::internal {

using Record = std::map<std::string, std::string>;

std::string EncodeRecord(const Record& r);
// InvalidArgument when `text` is not a record.
[[nodiscard]] absl::StatusOr<Record> DecodeRecord(const std::string& text);

// Publishes this rank's record under `<prefix>/fanout/<what>/<rank>`.
[[nodiscard]] absl::Status PublishRecord(net::Store& store, const std::string& prefix,
                                         const std::string& what, int32_t rank, const Record& r);
// Waits for `peer`'s record; DeadlineExceeded names the peer.
[[nodiscard]] absl::StatusOr<Record> FetchRecord(net::Store& store, const std::string& prefix,
                                                 const std::string& what, int32_t peer,
                                                 absl::Time deadline);
// Field `key` of `r`; InvalidArgument naming the peer when missing.
[[nodiscard]] absl::StatusOr<std::string> Field(const Record& r, const std::string& key,
                                                int32_t peer);
[[nodiscard]] absl::StatusOr<int64_t> IntField(const Record& r, const std::string& key,
                                               int32_t peer);

// This machine's boot id (/proc/sys/kernel/random/boot_id): ranks with the same one run on one
// kernel. (Whether they share /dev/shm shows when a peer's object is opened.)
std::string HostIdentity();

}  // namespace reshard::nvlink::internal
