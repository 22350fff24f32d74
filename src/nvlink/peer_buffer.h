// What a fan-out peer publishes about a buffer it receives into, and the checks every such
// descriptor passes before this rank maps it or writes through it. A descriptor is untrusted
// text from the store: a malformed, mismatched or hostile one must be refused with one clear
// sentence, never become a pointer outside what the peer registered.
//
//   host, shared:   "shm,<object name>,<offset>,<mapped bytes>,<buffer bytes>"
//   host, private:  "addr,<address>,<buffer bytes>"   (written with process_vm_writev)
//   cuda_ipc:       "<cudaIpcMemHandle_t as hex>,<offset>,<buffer bytes>"
//
// Pure functions: tested on the CPU and fuzzed (tests/fuzz/fanout_record_fuzzer.cc).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/nvlink/fanout.h"

namespace reshard::nvlink {

struct PeerBufferDesc {
  enum class Kind { kShared, kAddress, kCudaIpc };
  Kind kind = Kind::kShared;
  std::string name;      // kShared: the shm_open name ("/reshard-..."); kCudaIpc: handle bytes.
  int64_t offset = 0;    // kShared, kCudaIpc: of the buffer inside the mapping / allocation.
  int64_t mapped = 0;    // kShared: bytes of the whole object.
  int64_t bytes = 0;     // The buffer's size.
  uint64_t address = 0;  // kAddress: in the peer's address space.
};

// Parses a host-backend descriptor of `peer`'s buffer `buffer`, into which this rank writes
// `need` bytes (the extent of its fan-out copies there). InvalidArgument naming the peer and
// the buffer for anything malformed: a name that is not one of reshard's objects, offsets or
// sizes that are negative or do not hold `need` bytes inside the object.
[[nodiscard]] absl::StatusOr<PeerBufferDesc> ParseHostBufferDesc(absl::string_view text,
                                                                 int32_t peer, uint32_t buffer,
                                                                 int64_t need);

// The same for a cuda_ipc descriptor; `handle_bytes` is sizeof(cudaIpcMemHandle_t).
[[nodiscard]] absl::StatusOr<PeerBufferDesc> ParseCudaIpcBufferDesc(absl::string_view text,
                                                                    int32_t peer, uint32_t buffer,
                                                                    int64_t need,
                                                                    size_t handle_bytes);

// The bytes of `to_rank`'s buffer `to_buffer` that the edges of `table` from `from_rank` write:
// one past the highest destination offset of their runs (0 when none).
int64_t WrittenExtent(const FanoutTable& table, int32_t from_rank, int32_t to_rank,
                      uint32_t to_buffer);

}  // namespace reshard::nvlink
