#include "src/rendezvous/record.h"

#include <algorithm>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "src/common/json.h"
#include "src/common/status.h"

namespace reshard::rendezvous {
namespace {

constexpr char kDigits[] = "0123456789abcdef";

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Between two store reads of a waiting barrier: short enough that a lost peer is noticed at
// once, long enough that an idle rank costs nothing measurable.
constexpr absl::Duration kBarrierPoll = absl::Milliseconds(5);
constexpr absl::Duration kMinArrival = absl::Seconds(1);

// What a peer sent, for an error message: escaped, cut, on one line.
std::string Quoted(absl::string_view s) {
  return json::QuoteForMessage(std::string_view(s.data(), s.size()));
}

}  // namespace

std::string EncodeRecord(const Record& record) {
  std::string out;
  for (const auto& [field, value] : record) {
    RESHARD_CHECK_MSG(!field.empty() && field.find_first_of("=\n") == std::string::npos,
                      "record field names are non-empty, without '=' or a newline");
    out += field;
    out += '=';
    for (unsigned char b : value) {
      out += kDigits[b >> 4];
      out += kDigits[b & 15];
    }
    out += '\n';
  }
  return out;
}

absl::StatusOr<Record> DecodeRecord(const std::string& text, const std::string& what) {
  Record record;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const size_t eq = line.find('=');
    const absl::string_view hex = eq == absl::string_view::npos ? "" : line.substr(eq + 1);
    if (eq == absl::string_view::npos || eq == 0 || hex.size() % 2 != 0) {
      return absl::DataLossError(
          absl::StrCat("the ", what, " is malformed (line ", Quoted(line), ")"));
    }
    std::string value(hex.size() / 2, '\0');
    for (size_t i = 0; i < value.size(); ++i) {
      const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
      if (hi < 0 || lo < 0) {
        return absl::DataLossError(absl::StrCat("the ", what, " is malformed (field ",
                                                Quoted(line.substr(0, eq)), " is not hex)"));
      }
      value[i] = static_cast<char>(hi * 16 + lo);
    }
    record[std::string(line.substr(0, eq))] = std::move(value);
  }
  return record;
}

std::string RecordKey(const std::string& prefix, const std::string& what, int32_t rank) {
  return absl::StrFormat("%s/%s/%d", prefix, what, rank);
}

absl::Status PublishRecord(Store& store, const std::string& prefix, const std::string& what,
                           int32_t rank, const Record& record) {
  return store.Set(RecordKey(prefix, what, rank), EncodeRecord(record));
}

absl::StatusOr<Record> FetchRecord(Store& store, const std::string& prefix, const std::string& what,
                                   int32_t peer, absl::Time deadline) {
  absl::StatusOr<std::string> text = store.Get(RecordKey(prefix, what, peer), deadline);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrFormat("waiting for rank %d's %s record: %s", peer, what,
                                        std::string(text.status().message())));
  }
  return DecodeRecord(*text, absl::StrFormat("%s record of rank %d", what, peer));
}

absl::StatusOr<std::string> Field(const Record& record, const std::string& field, int32_t peer) {
  auto it = record.find(field);
  if (it == record.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the set-up record of rank %d lacks field \"%s\"", peer, field));
  }
  return it->second;
}

absl::StatusOr<int64_t> IntField(const Record& record, const std::string& field, int32_t peer) {
  absl::StatusOr<std::string> text = Field(record, field, peer);
  if (!text.ok()) return text.status();
  int64_t v = 0;
  if (!absl::SimpleAtoi(*text, &v)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the set-up record of rank %d: field %s = %s is not an integer", peer,
                        Quoted(field), Quoted(*text)));
  }
  return v;
}

absl::Status Barrier(Store& store, const std::string& key, int32_t rank,
                     absl::Span<const int32_t> peers, absl::Time deadline,
                     const WhileWaiting& while_waiting) {
  // Arriving is tried for at least kMinArrival even when the deadline already passed (a rank
  // that only arrives on its way out), and never longer than the deadline otherwise: an
  // unreachable store must not hold a rank past its bound.
  absl::Status arrived = store.SetBefore(absl::StrCat(key, "/", rank), "1",
                                         std::max(deadline, absl::Now() + kMinArrival));
  if (!arrived.ok()) {
    return absl::Status(arrived.code(), absl::StrFormat("rank %d: barrier \"%s\": %s", rank, key,
                                                        std::string(arrived.message())));
  }
  for (int32_t peer : peers) {
    if (peer == rank) continue;
    while (true) {
      const absl::Time until =
          while_waiting ? std::min(deadline, absl::Now() + kBarrierPoll) : deadline;
      absl::Status got = store.Get(absl::StrCat(key, "/", peer), until).status();
      if (got.ok()) break;
      const bool timed_out = absl::IsDeadlineExceeded(got);
      if (!timed_out || absl::Now() >= deadline) {
        return absl::Status(
            got.code(), timed_out ? absl::StrFormat("rank %d: barrier \"%s\": rank %d did not "
                                                    "arrive before the deadline",
                                                    rank, key, peer)
                                  : absl::StrFormat("rank %d: barrier \"%s\" waiting for rank "
                                                    "%d: %s",
                                                    rank, key, peer, std::string(got.message())));
      }
      if (while_waiting) {
        absl::Status st = while_waiting();
        if (!st.ok()) return st;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RepeatedBarrier(Store& store, const std::string& prefix, uint64_t generation,
                             int32_t rank, absl::Span<const int32_t> peers, absl::Time deadline,
                             const WhileWaiting& while_waiting) {
  RESHARD_RETURN_IF_ERROR(
      Barrier(store, absl::StrCat(prefix, "/", generation), rank, peers, deadline, while_waiting));
  if (generation > 1) {
    RESHARD_RETURN_IF_ERROR(store.Delete(absl::StrCat(prefix, "/", generation - 1, "/", rank)));
  }
  return absl::OkStatus();
}

namespace {

// A failure in place of an agreement value: "!failed <code> <message>".
constexpr absl::string_view kFailureMark = "!failed ";
constexpr size_t kMaxFailureMessage = 1024;

}  // namespace

absl::Status PostFailure(Store& store, const std::string& key, int32_t rank,
                         const absl::Status& status) {
  RESHARD_CHECK(!status.ok());
  const absl::string_view message = status.message().substr(0, kMaxFailureMessage);
  return store.Set(absl::StrCat(key, "/", rank),
                   absl::StrCat(kFailureMark, static_cast<int>(status.code()), " ", message));
}

absl::Status CheckAgreement(Store& store, const std::string& key, int32_t rank,
                            absl::Span<const int32_t> ranks, const std::string& value,
                            const std::string& what, const std::string& hint, absl::Time deadline) {
  RESHARD_CHECK(!absl::StartsWith(value, "!"));
  RESHARD_RETURN_IF_ERROR(store.Set(absl::StrCat(key, "/", rank), value));
  for (int32_t peer : ranks) {
    if (peer == rank) continue;
    absl::StatusOr<std::string> theirs = store.Get(absl::StrCat(key, "/", peer), deadline);
    if (!theirs.ok()) {
      return absl::Status(theirs.status().code(),
                          absl::StrFormat("rank %d: waiting for the %s of rank %d: %s", rank, what,
                                          peer, std::string(theirs.status().message())));
    }
    if (absl::StartsWith(*theirs, kFailureMark)) {
      const absl::string_view failure = absl::string_view(*theirs).substr(kFailureMark.size());
      const size_t space = failure.find(' ');
      int code = 0;
      if (space == absl::string_view::npos || !absl::SimpleAtoi(failure.substr(0, space), &code) ||
          code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
        return absl::DataLossError(absl::StrFormat(
            "rank %d: rank %d posted a malformed failure in place of its %s", rank, peer, what));
      }
      return absl::Status(static_cast<absl::StatusCode>(code),
                          absl::StrFormat("rank %d failed before agreeing on the %s: %s", peer,
                                          what, std::string(failure.substr(space + 1))));
    }
    if (*theirs != value) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s mismatch: rank %d has %s but rank %d has %s; %s", what, rank, value,
                          peer, *theirs, hint));
    }
  }
  return absl::OkStatus();
}

}  // namespace reshard::rendezvous
