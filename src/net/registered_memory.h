// The memory one refit handle moves bytes from and to, registered once at Create: the caller's
// buffers (or, for CUDA memory UCX cannot register: the staging ring for sources, nothing for
// the destinations the engine writes itself, and pinned host copies of the same size for the
// others), the send scratch that packed streams are gathered into, the landing area packed
// streams are put into and the landing rounds' area (put delivery). It publishes the remote
// keys of what peers write into as fields of this rank's wire-up record: `key.<id>` (the packed
// key), `base.<id>` (the address), `size.<id>` (the registered bytes) and, for host memory,
// `host.<id>` = 1 (same-host peers may write it with process_vm_writev,
// src/common/single_copy.h), for each destination or staging buffer id, for landing_id() (=
// number of plan buffers) and for round_id() (one more).
//
// Thread-compatible. Regions are released before the staging memory they map.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/common/memory.h"
#include "src/common/shared_memory.h"
#include "src/cuda/staging_ring.h"
#include "src/net/runtime.h"
#include "src/net/ucx/memory.h"
#include "src/plan/plan.h"
#include "src/rendezvous/record.h"

namespace reshard::net {

class RegisteredMemory {
 public:
  // Registers `buffers` (validated by the caller against the plan), and scratch areas of the
  // given sizes (0: none). FailedPrecondition for CUDA memory without a usable device. A source
  // buffer that no transfer of this rank reads (SourceBuffersRead: the user's source of a
  // quantized tensor, which only the quantizer reads) is neither registered nor staged.
  // `ring_sources` (by buffer id, empty: none) names CUDA source buffers UCX cannot register
  // that the engine reads only through its staging ring (AttachRing, docs/data-plane.md): they
  // are neither registered nor given a pinned host copy (data(id) is null), and count as staged.
  // `direct_destinations` (by buffer id, empty: none) names CUDA destination buffers UCX cannot
  // register that the engine writes itself, with copies from its landing areas: neither
  // registered nor given a pinned host copy (data(id) is the caller's memory, device(id) is
  // true), and counted as staged. `round_bytes`: the landing rounds' area
  // (src/net/landing_rounds.h), registered and published as round_id(): pinned host memory, or
  // device memory when UCX registers CUDA memory.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RegisteredMemory>> Create(
      const plan::Plan& plan, int32_t rank, Runtime& runtime,
      std::vector<common::BufferView> buffers, int64_t send_scratch_bytes, int64_t landing_bytes,
      const std::vector<bool>& ring_sources = {}, const std::vector<bool>& direct_destinations = {},
      int64_t round_bytes = 0);
  ~RegisteredMemory();
  RegisteredMemory(const RegisteredMemory&) = delete;
  RegisteredMemory& operator=(const RegisteredMemory&) = delete;

  size_t size() const { return buffers_.size(); }
  const common::BufferView& buffer(uint32_t id) const { return buffers_[id]; }
  // Where the engine reads and writes buffer `id`: the staging copy or the caller's memory.
  uint8_t* data(uint32_t id) const { return data_[id]; }
  ucp_mem_h memh(uint32_t id) const { return regions_[id] ? regions_[id]->get() : nullptr; }
  // Staged through pinned host memory (CUDA memory, UCX without CUDA support).
  bool staged(uint32_t id) const { return staging_[id] != nullptr; }
  // CUDA buffers the engine uses: registered directly with a CUDA-aware UCX, and staged.
  int64_t cuda_registered() const { return cuda_registered_; }
  int64_t cuda_staged() const { return cuda_staged_; }
  // Pinned host memory of the full-size copies of staged buffers (destinations, and sources
  // outside the staging ring): docs/data-plane.md, "Destinations".
  int64_t staged_copy_bytes() const { return staged_copy_bytes_; }
  // A direct destination (see Create): CUDA memory UCX cannot register, written by the engine.
  bool direct(uint32_t id) const { return id < direct_.size() && direct_[id]; }
  // CUDA memory the engine touches directly (registered by a CUDA-enabled UCX, or direct).
  bool device(uint32_t id) const {
    return buffers_[id].kind == common::MemoryKind::kCuda && !staged(id) && !ring_source(id);
  }
  uint8_t* send_scratch() { return send_scratch_.data(); }
  ucp_mem_h send_scratch_memh() const {
    return send_scratch_region_ ? send_scratch_region_->get() : nullptr;
  }
  uint8_t* landing() { return landing_data_; }
  uint32_t landing_id() const { return static_cast<uint32_t>(buffers_.size()); }
  // The landing rounds' area (null and 0 when none) and the id of its remote key.
  uint8_t* round_area() const { return static_cast<uint8_t*>(round_area_); }
  int64_t round_bytes() const { return round_bytes_; }
  uint32_t round_id() const { return static_cast<uint32_t>(buffers_.size()) + 1; }
  // The round area is device memory (UCX registers CUDA memory) rather than pinned host memory.
  bool round_on_device() const { return round_on_device_; }
  // Where kernels read the round area: itself on the device, or the pinned area's mapping.
  const uint8_t* round_device() const { return static_cast<const uint8_t*>(round_device_); }
  // Ids of remote keys a peer's record may hold: the buffers, the landing area, the round area.
  uint32_t remote_ids() const { return static_cast<uint32_t>(buffers_.size()) + 2; }

  // Read only through the staging ring (see Create).
  bool ring_source(uint32_t id) const { return id < ring_sources_.size() && ring_sources_[id]; }
  // Takes the staging ring and registers its memory (pinned, or device memory as CUDA memory)
  // with UCX (once, at set-up: refits
  // register nothing). The ring lives as long as this object, so UCX requests that read it
  // never outlive it (the engine keeps both alive after a stalled teardown).
  [[nodiscard]] absl::Status AttachRing(std::unique_ptr<cuda::StagingRing> ring, Runtime& runtime);
  cuda::StagingRing* ring() const { return ring_.get(); }
  ucp_mem_h ring_memh() const { return ring_region_ ? ring_region_->get() : nullptr; }

  // Adds the `key.<id>` / `base.<id>` fields of this rank's writable memory to `record`.
  [[nodiscard]] absl::Status AddRemoteKeys(rendezvous::Record* record) const;
  // Copies staged source buffers device -> host (before an epoch's first send): only those a
  // transfer reads, since no other source buffer is staged, not the ring sources, and not
  // those `unread` names (by
  // buffer id, when as long as the buffers: what the engine reads from device memory itself).
  // `*bytes` (when given) grows by the bytes copied.
  [[nodiscard]] absl::Status StageSources(const plan::Plan& plan,
                                          const std::vector<bool>& unread = {},
                                          int64_t* bytes = nullptr) const;

 private:
  RegisteredMemory() = default;

  std::vector<common::BufferView> buffers_;
  std::vector<uint8_t*> data_;
  std::vector<void*> staging_;  // Pinned, freed in the destructor after the regions.
  std::vector<bool> writable_;  // Peers write into it (destination and staging buffers).
  std::vector<bool> ring_sources_;
  std::vector<bool> direct_;
  std::vector<std::unique_ptr<ucx::MemoryRegion>> regions_;
  std::vector<uint8_t> send_scratch_;
  std::unique_ptr<ucx::MemoryRegion> send_scratch_region_;
  std::vector<uint8_t> landing_;                   // Private, when /dev/shm cannot hold it.
  std::unique_ptr<SharedBuffer> landing_shared_;    // Else shared (same-host peers map it).
  uint8_t* landing_data_ = nullptr;
  int64_t cuda_registered_ = 0, cuda_staged_ = 0, staged_copy_bytes_ = 0;
  std::unique_ptr<ucx::MemoryRegion> landing_region_;
  void* round_area_ = nullptr;  // Pinned or device, freed in the destructor after its region.
  bool round_on_device_ = false;
  void* round_device_ = nullptr;
  int64_t round_bytes_ = 0;
  std::unique_ptr<ucx::MemoryRegion> round_region_;
  // Declared in dependency order: the region is released before the ring's memory.
  std::unique_ptr<cuda::StagingRing> ring_;
  std::unique_ptr<ucx::MemoryRegion> ring_region_;
};

// By buffer id: whether a put, message or local copy of the plan that `rank` sends reads the
// buffer (the buffer of each of its transfers' tensor and from_side). A source buffer not read
// is one the refit never touches through the engine: a quantized tensor's user source (the
// quantizer reads it and writes the internal buffers the transfers read) or a requantized FP8
// source's scales.
std::vector<bool> SourceBuffersRead(const plan::Plan& plan, int32_t rank);

// The field names of RegisteredMemory's remote keys.
std::string KeyField(uint32_t id);
std::string BaseField(uint32_t id);
std::string SizeField(uint32_t id);
std::string HostMemoryField(uint32_t id);
// "NAME,OFFSET,MAPPED": the registered host region lies OFFSET bytes into the shared-memory
// object NAME of MAPPED bytes (a HostBuffer, src/common/shared_memory.h), so a same-host peer
// may map it and copy into it directly.
std::string SharedMemoryField(uint32_t id);

// A peer's shm.<id> value, checked before anything is mapped: NAME must be an object that the
// peer's process (pid `pid` in pid namespace `pidns`) created ("/reshard-<pid>.<pidns>-..."),
// and the object must hold the `registered` bytes at OFFSET. DataLoss naming the peer and the
// region otherwise.
struct SharedRegion {
  std::string name;
  int64_t offset = 0;
  int64_t mapped = 0;
};
[[nodiscard]] absl::StatusOr<SharedRegion> ParseSharedRegion(const std::string& text,
                                                             int32_t peer, uint32_t id,
                                                             int64_t pid, uint64_t pidns,
                                                             uint64_t registered);

}  // namespace reshard::net
