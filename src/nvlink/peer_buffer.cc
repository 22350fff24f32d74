#include "src/nvlink/peer_buffer.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "src/common/json.h"

namespace reshard::nvlink {
namespace {

absl::Status Malformed(int32_t peer, uint32_t buffer, absl::string_view text,
                       absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("fan-out: rank %d published buffer %d as %s: %s", peer, buffer,
                      json::QuoteForMessage(std::string(text)), why));
}

bool Count(absl::string_view s, int64_t* out) { return absl::SimpleAtoi(s, out) && *out >= 0; }

// [offset, offset + bytes) inside [0, size) and `need` <= bytes, without overflow.
bool Holds(int64_t offset, int64_t bytes, int64_t size, int64_t need) {
  return need <= bytes && bytes <= size && offset <= size - bytes;
}

}  // namespace

absl::StatusOr<PeerBufferDesc> ParseHostBufferDesc(absl::string_view text, int32_t peer,
                                                   uint32_t buffer, int64_t need) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  PeerBufferDesc d;
  if (parts.size() == 5 && parts[0] == "shm") {
    d.kind = PeerBufferDesc::Kind::kShared;
    const absl::string_view name = parts[1];
    // One of reshard's objects (src/common/shared_memory.h), nothing else in /dev/shm.
    if (!absl::StartsWith(name, "/reshard-") || name.size() > 255 ||
        name.find('/', 1) != absl::string_view::npos) {
      return Malformed(peer, buffer, text, "not a reshard shared-memory object");
    }
    d.name = std::string(name);
    if (!Count(parts[2], &d.offset) || !Count(parts[3], &d.mapped) || !Count(parts[4], &d.bytes)) {
      return Malformed(peer, buffer, text, "offset and sizes must be non-negative integers");
    }
    if (!Holds(d.offset, d.bytes, d.mapped, need)) {
      return Malformed(peer, buffer, text,
                       absl::StrFormat("it must hold the %d bytes this rank writes inside the "
                                       "object",
                                       need));
    }
    return d;
  }
  if (parts.size() == 3 && parts[0] == "addr") {
    d.kind = PeerBufferDesc::Kind::kAddress;
    if (!absl::SimpleAtoi(parts[1], &d.address) || d.address == 0 || !Count(parts[2], &d.bytes)) {
      return Malformed(peer, buffer, text, "address and size must be positive integers");
    }
    if (need > d.bytes || d.address + static_cast<uint64_t>(d.bytes) < d.address) {
      return Malformed(peer, buffer, text,
                       absl::StrFormat("it must hold the %d bytes this rank writes", need));
    }
    return d;
  }
  return Malformed(peer, buffer, text,
                   "expected shm,NAME,OFFSET,MAPPED,BYTES or addr,ADDRESS,BYTES");
}

absl::StatusOr<PeerBufferDesc> ParseCudaIpcBufferDesc(absl::string_view text, int32_t peer,
                                                      uint32_t buffer, int64_t need,
                                                      size_t handle_bytes) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  PeerBufferDesc d;
  d.kind = PeerBufferDesc::Kind::kCudaIpc;
  if (parts.size() != 3 || parts[0].size() != 2 * handle_bytes ||
      !std::all_of(parts[0].begin(), parts[0].end(), absl::ascii_isxdigit)) {
    return Malformed(
        peer, buffer, text,
        absl::StrFormat("expected HANDLE,OFFSET,BYTES with a %d-byte hex handle", handle_bytes));
  }
  d.name = absl::HexStringToBytes(parts[0]);
  if (!Count(parts[1], &d.offset) || !Count(parts[2], &d.bytes)) {
    return Malformed(peer, buffer, text, "offset and size must be non-negative integers");
  }
  if (need > d.bytes || d.offset > INT64_MAX - d.bytes) {
    return Malformed(peer, buffer, text,
                     absl::StrFormat("it must hold the %d bytes this rank writes", need));
  }
  return d;
}

int64_t WrittenExtent(const FanoutTable& table, int32_t from_rank, int32_t to_rank,
                      uint32_t to_buffer) {
  int64_t extent = 0;
  for (const FanoutEdge& e : table.edges) {
    if (e.from_rank != from_rank || e.to_rank != to_rank || e.to_buffer != to_buffer) continue;
    plan::ForEachRun(e.region, table.dims_of(e), [&](int64_t, int64_t to_off, int64_t n) {
      extent = std::max(extent, to_off + n);
    });
  }
  return extent;
}

}  // namespace reshard::nvlink
