#include "src/nvlink/exchange.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace reshard::nvlink::internal {

std::string EncodeRecord(const Record& r) {
  std::string out;
  for (const auto& [k, v] : r) {
    out += k;
    out += '=';
    out += v;
    out += '\n';
  }
  return out;
}

absl::StatusOr<Record> DecodeRecord(const std::string& text) {
  Record r;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrFormat("fan-out record line \"%s\" has no '='", std::string(line)));
    }
    r[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  return r;
}

namespace {
std::string Key(const std::string& prefix, const std::string& what, int32_t rank) {
  return absl::StrFormat("%s/fanout/%s/%d", prefix, what, rank);
}
}  // namespace

absl::Status PublishRecord(net::Store& store, const std::string& prefix, const std::string& what,
                           int32_t rank, const Record& r) {
  return store.Set(Key(prefix, what, rank), EncodeRecord(r));
}

absl::StatusOr<Record> FetchRecord(net::Store& store, const std::string& prefix,
                                   const std::string& what, int32_t peer, absl::Time deadline) {
  absl::StatusOr<std::string> text = store.Get(Key(prefix, what, peer), deadline);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrFormat("fan-out set-up: waiting for rank %d's %s record: %s", peer,
                                        what, std::string(text.status().message())));
  }
  return DecodeRecord(*text);
}

absl::StatusOr<std::string> Field(const Record& r, const std::string& key, int32_t peer) {
  auto it = r.find(key);
  if (it == r.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("fan-out record of rank %d lacks field \"%s\"", peer, key));
  }
  return it->second;
}

absl::StatusOr<int64_t> IntField(const Record& r, const std::string& key, int32_t peer) {
  absl::StatusOr<std::string> s = Field(r, key, peer);
  if (!s.ok()) return s.status();
  int64_t v = 0;
  if (!absl::SimpleAtoi(*s, &v)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fan-out record of rank %d: field \"%s\" = \"%s\" is not an integer", peer, key, *s));
  }
  return v;
}

std::string HostIdentity() {
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return boot.empty() ? "unknown-boot-id" : boot;
}

}  // namespace reshard::nvlink::internal
