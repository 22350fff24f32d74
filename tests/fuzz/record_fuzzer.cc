// Fuzzes the rendezvous record format (src/rendezvous/record.h): what a peer publishes in the
// store is untrusted text to every other rank.
//
// Input: the text of a record. Properties checked (a violation aborts, which is a finding):
// - DecodeRecord never crashes, and rejects with DataLoss in one bounded line;
// - an accepted record re-encodes canonically: EncodeRecord of it decodes to the same record,
//   and encoding that again gives the same text;
// - IntField of every field parses or is InvalidArgument in one bounded line.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/rendezvous/record.h"

namespace {

// An error quotes at most two strings of 64 characters (each escaped to at most 6 bytes, \u0000)
// around a short sentence.
constexpr size_t kMaxErrorBytes = 1024;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_record: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace reshard::rendezvous;  // NOLINT
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Record> record = DecodeRecord(text, "fuzzed record");
  if (!record.ok()) {
    const std::string message(record.status().message());
    if (!absl::IsDataLoss(record.status())) Fail("a rejection is not DataLoss", message);
    if (message.size() > kMaxErrorBytes) Fail("an error is longer than 1 KiB", message);
    if (message.find('\n') != std::string::npos) Fail("an error is not one line", message);
    return 0;
  }
  const std::string encoded = EncodeRecord(*record);
  absl::StatusOr<Record> again = DecodeRecord(encoded, "re-encoded record");
  if (!again.ok()) Fail("EncodeRecord wrote text that does not decode", encoded);
  if (*again != *record) Fail("a record does not round-trip", encoded);
  if (EncodeRecord(*again) != encoded) Fail("EncodeRecord is not canonical", encoded);
  for (const auto& [field, value] : *record) {
    absl::StatusOr<int64_t> n = IntField(*record, field, 7);
    if (n.ok()) continue;
    if (!absl::IsInvalidArgument(n.status())) {
      Fail("IntField failed with a code other than InvalidArgument", n.status().ToString());
    }
    if (n.status().message().size() > kMaxErrorBytes) {
      Fail("an IntField error is longer than 1 KiB", n.status().ToString());
    }
  }
  return 0;
}
