// The one vocabulary for memory below the public API: what kind of memory a buffer is, and a
// non-owning view of one buffer. The public API (reshard/refit.h) has its own MemoryKind with
// the same values, converted once at the API boundary (ToMemoryKind in src/api).
#pragma once

#include <cstdint>

namespace reshard::common {

enum class MemoryKind : uint8_t {
  kHost = 0,  // Host memory (pageable, pinned, or shared between local processes).
  kCuda = 1,  // CUDA device memory of this process's current device.
};

inline const char* MemoryKindName(MemoryKind kind) {
  return kind == MemoryKind::kCuda ? "cuda" : "host";
}

// One of a rank's buffers, indexed by plan buffer id where a list of them is passed. `data` may
// be null when `bytes` is 0 (the rank holds no tile of that buffer). Non-owning: the memory must
// outlive whatever holds the view.
struct BufferView {
  void* data = nullptr;
  int64_t bytes = 0;
  MemoryKind kind = MemoryKind::kHost;

  uint8_t* bytes_ptr() const { return static_cast<uint8_t*>(data); }
  bool on_device() const { return kind == MemoryKind::kCuda; }
};

}  // namespace reshard::common
