// Host memory that the processes of one host can map: the reshard-owned allocator for
// destination buffers, so a domain peer copies a landed piece straight into them (one copy).
//
// A SharedBuffer is a POSIX shared-memory object (shm_open under /dev/shm, which separate
// network namespaces still share) mapped read-write into this process. Its name is published to
// peers (by the fan-out, through the store), who map it once per handle. Buffers register
// themselves in a process-wide table, so code that only holds a pointer (the fan-out given the
// rank's buffers) can find the name and offset of the mapping it lies in.
//
// Thread safety: Allocate(), Lookup() and destruction are thread-safe. The memory itself is
// plain memory: callers order their accesses (the fan-out signals with release/acquire).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace reshard {

class SharedBuffer {
 public:
  // Creates and maps `bytes` (> 0, rounded up to pages) of zeroed shared memory. `tag` becomes
  // part of the object's name (letters, digits, '-', '_', '.'; others are replaced), which is
  // unique per process and allocation. Errors: InvalidArgument (bytes <= 0), ResourceExhausted
  // (shm_open/ftruncate/mmap failed, e.g. /dev/shm full).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SharedBuffer>> Allocate(
      const std::string& tag, int64_t bytes);
  // Unmaps and unlinks the object; peers that mapped it keep their mapping.
  ~SharedBuffer();
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;

  uint8_t* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  // The shm_open name ("/reshard-...").
  const std::string& name() const { return name_; }

  struct Location {
    std::string name;    // shm_open name of the containing buffer.
    int64_t offset = 0;  // Offset of the pointer inside it.
    int64_t mapped = 0;  // Size of the whole mapping.
  };
  // The live SharedBuffer of this process containing [ptr, ptr + bytes), if any.
  static std::optional<Location> Lookup(const void* ptr, int64_t bytes);

 private:
  SharedBuffer(std::string name, uint8_t* data, int64_t bytes, int64_t mapped)
      : name_(std::move(name)), data_(data), bytes_(bytes), mapped_(mapped) {}
  std::string name_;
  uint8_t* data_;
  int64_t bytes_;
  int64_t mapped_;
};

// Shared-memory objects (buffers and signal boards) are named
// "/reshard-[board-]<pid>.<pid namespace>-<n>-<tag>": the creating process and the pid namespace
// its pid belongs to. SharedObjectOwner() is the "<pid>.<pid namespace>" of this process.
std::string SharedObjectOwner();

// Unlinks every reshard shared-memory object created by process `pid` of this pid namespace.
// For launchers and tests after a rank was killed (a SIGKILLed process cannot unlink its own
// objects). Returns how many were removed.
int RemoveSharedObjectsOf(int64_t pid);

// Unlinks the reshard objects of this user and pid namespace whose creating process is gone
// (a killed rank whose launcher was killed too). Objects of other users, other pid namespaces
// (containers sharing /dev/shm) and live processes are left alone. Returns how many.
int RemoveSharedObjectsOfDeadProcesses();

// A peer's shared-memory object mapped into this process (read-write). Move-only owner of the
// mapping.
class SharedMapping {
 public:
  // Maps `bytes` of the existing object `name`. NotFound when it does not exist (the peer
  // unlinked it or is on another host), InvalidArgument when it is smaller than `bytes`.
  [[nodiscard]] static absl::StatusOr<SharedMapping> Open(const std::string& name, int64_t bytes);
  SharedMapping() = default;
  SharedMapping(SharedMapping&& o) noexcept;
  SharedMapping& operator=(SharedMapping&& o) noexcept;
  ~SharedMapping();

  uint8_t* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  uint8_t* data_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace reshard
