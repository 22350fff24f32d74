// Fuzzes what a fan-out peer publishes about the buffers it receives into (src/nvlink/
// peer_buffer.h): the host backend's "shm,..." / "addr,..." descriptors and the cuda_ipc
// backend's "HANDLE,OFFSET,BYTES", which this rank turns into pointers it writes through.
//
// Input: byte 0 chooses the parser, bytes 1-4 the bytes this rank writes (`need`), the rest is
// the descriptor text. Properties checked (a violation aborts, which is a finding):
// - parsing never crashes, and rejects with InvalidArgument in one bounded line naming the peer;
// - an accepted shared descriptor names a reshard object and holds `need` bytes inside the
//   object: 0 <= offset, need <= bytes, offset + bytes <= mapped (no overflow);
// - an accepted address descriptor is non-null, holds `need` bytes and does not wrap;
// - an accepted cuda_ipc descriptor has a handle of exactly the handle size, a non-negative
//   offset and holds `need` bytes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "src/nvlink/peer_buffer.h"

namespace {

constexpr size_t kMaxErrorBytes = 1024;
constexpr size_t kHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t::reserved).

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_fanout_desc: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using reshard::nvlink::PeerBufferDesc;
  if (size < 5) return 0;
  const bool cuda = (data[0] & 1) != 0;
  uint32_t need32 = 0;
  std::memcpy(&need32, data + 1, sizeof(need32));
  const int64_t need = need32 % (int64_t{1} << 20);
  const std::string text(reinterpret_cast<const char*>(data) + 5, size - 5);
  absl::StatusOr<PeerBufferDesc> d =
      cuda ? reshard::nvlink::ParseCudaIpcBufferDesc(text, 3, 9, need, kHandleBytes)
           : reshard::nvlink::ParseHostBufferDesc(text, 3, 9, need);
  if (!d.ok()) {
    const std::string message(d.status().message());
    if (!absl::IsInvalidArgument(d.status())) Fail("a rejection is not InvalidArgument", message);
    if (message.size() > kMaxErrorBytes) Fail("an error is longer than 1 KiB", message);
    if (message.find('\n') != std::string::npos) Fail("an error is not one line", message);
    if (message.find("rank 3 published buffer 9") == std::string::npos) {
      Fail("an error does not name the peer and buffer", message);
    }
    return 0;
  }
  switch (d->kind) {
    case PeerBufferDesc::Kind::kShared:
      if (cuda) Fail("the cuda_ipc parser returned a shared descriptor", text);
      if (!absl::StartsWith(d->name, "/reshard-")) Fail("accepted a foreign object", text);
      if (d->offset < 0 || d->bytes < need || d->bytes > d->mapped ||
          d->offset > d->mapped - d->bytes) {
        Fail("accepted a buffer that does not hold what is written inside its object", text);
      }
      break;
    case PeerBufferDesc::Kind::kAddress:
      if (cuda) Fail("the cuda_ipc parser returned an address descriptor", text);
      if (d->address == 0 || d->bytes < need ||
          d->address + static_cast<uint64_t>(d->bytes) < d->address) {
        Fail("accepted an address range that is null, too small or wraps", text);
      }
      break;
    case PeerBufferDesc::Kind::kCudaIpc:
      if (!cuda) Fail("the host parser returned a cuda_ipc descriptor", text);
      if (d->name.size() != kHandleBytes || d->offset < 0 || d->bytes < need) {
        Fail("accepted a malformed cuda_ipc descriptor", text);
      }
      break;
  }
  return 0;
}
