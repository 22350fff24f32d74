#include "src/net/registered_memory.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "src/common/log.h"
#include "src/common/shared_memory.h"
#include "src/common/status.h"
#include "src/cuda/runtime.h"

namespace reshard::net {

using common::MemoryKind;

std::string KeyField(uint32_t id) { return absl::StrCat("key.", id); }
std::string BaseField(uint32_t id) { return absl::StrCat("base.", id); }
std::string SizeField(uint32_t id) { return absl::StrCat("size.", id); }
std::string HostMemoryField(uint32_t id) { return absl::StrCat("host.", id); }
std::string SharedMemoryField(uint32_t id) { return absl::StrCat("shm.", id); }

absl::StatusOr<SharedRegion> ParseSharedRegion(const std::string& text, int32_t peer, uint32_t id,
                                               int64_t pid, uint64_t pidns, uint64_t registered) {
  auto malformed = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("the remote key record of rank ", peer,
                                            " places region ", id, " in shared memory \"",
                                            absl::string_view(text).substr(0, 80), "\": ", why));
  };
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  SharedRegion r;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &r.offset) ||
      !absl::SimpleAtoi(parts[2], &r.mapped) || r.offset < 0 || r.mapped < 0) {
    return malformed("expected NAME,OFFSET,MAPPED");
  }
  // Objects the peer's process created (SharedBuffer names), nothing else in /dev/shm.
  const std::string owner = absl::StrCat("/reshard-", pid, ".", pidns, "-");
  if (!absl::StartsWith(parts[0], owner) || parts[0].size() > 255 ||
      parts[0].find('/', 1) != absl::string_view::npos) {
    return malformed(absl::StrCat("not an object of its process (", owner, "...)"));
  }
  if (r.offset > r.mapped || registered > static_cast<uint64_t>(r.mapped - r.offset)) {
    return malformed(
        absl::StrCat("the object does not hold the ", registered, " bytes registered there"));
  }
  r.name = std::string(parts[0]);
  return r;
}

absl::StatusOr<std::unique_ptr<RegisteredMemory>> RegisteredMemory::Create(
    const plan::Plan& plan, int32_t rank, Runtime& runtime, std::vector<common::BufferView> buffers,
    int64_t send_scratch_bytes, int64_t landing_bytes, const std::vector<bool>& ring_sources,
    const std::vector<bool>& direct_destinations, int64_t round_bytes) {
  std::unique_ptr<RegisteredMemory> m(new RegisteredMemory());
  const ucx::Context& context = runtime.context();
  m->buffers_ = std::move(buffers);
  const size_t n = m->buffers_.size();
  m->data_.assign(n, nullptr);
  m->staging_.assign(n, nullptr);
  m->writable_.assign(n, false);
  m->regions_.resize(n);
  m->ring_sources_.assign(n, false);
  m->direct_.assign(n, false);
  const std::vector<bool> read = SourceBuffersRead(plan, rank);
  for (size_t b = 0; b < n; ++b) {
    const common::BufferView& buf = m->buffers_[b];
    m->data_[b] = static_cast<uint8_t*>(buf.data);
    if (buf.bytes == 0) continue;
    // Nothing the engine sends reads it: no registration, and no staging copy per refit.
    if (plan.buffers()[b].side == plan::Side::kSrc && !read[b]) continue;
    ucs_memory_type_t type = UCS_MEMORY_TYPE_HOST;
    if (buf.kind == MemoryKind::kCuda) {
      if (runtime.supports_cuda_memory()) {
        type = runtime.cuda_memory_type();
        m->cuda_registered_++;
      } else {
        std::string why;
        if (cuda::CudaDeviceCount(&why) == 0) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "buffer \"%s\" on rank %d is CUDA memory but no CUDA device is usable: %s",
              plan.buffers()[b].name, rank, why));
        }
        m->cuda_staged_++;
        if (b < ring_sources.size() && ring_sources[b]) {
          // Packed into the staging ring by the GPU: no host copy, nothing to register.
          m->ring_sources_[b] = true;
          m->data_[b] = nullptr;
          continue;
        }
        if (b < direct_destinations.size() && direct_destinations[b]) {
          // Written by the engine's copies from the landing areas (landing rounds, packed
          // streams, data messages): no host copy, and peers never write it.
          m->direct_[b] = true;
          continue;
        }
        // UCX without CUDA memory (Debian's): stage through pinned host memory.
        RESHARD_ASSIGN_OR_RETURN(m->staging_[b], cuda::AllocPinned(static_cast<size_t>(buf.bytes)));
        m->data_[b] = static_cast<uint8_t*>(m->staging_[b]);
        m->staged_copy_bytes_ += buf.bytes;
      }
    }
    RESHARD_ASSIGN_OR_RETURN(
        m->regions_[b],
        ucx::MemoryRegion::Map(context, m->data_[b], static_cast<size_t>(buf.bytes), type));
    m->writable_[b] = plan.buffers()[b].side != plan::Side::kSrc;
  }
  if (send_scratch_bytes > 0) {
    m->send_scratch_.assign(static_cast<size_t>(send_scratch_bytes), 0);
    RESHARD_ASSIGN_OR_RETURN(m->send_scratch_region_,
                             ucx::MemoryRegion::Map(context, m->send_scratch_.data(),
                                                    m->send_scratch_.size(), UCS_MEMORY_TYPE_HOST));
  }
  if (landing_bytes > 0) {
    // In shared memory, so that same-host senders map it and copy packed streams in with
    // memcpy (PeerLink::MapSharedRegions); private memory where /dev/shm cannot hold it.
    absl::StatusOr<std::unique_ptr<SharedBuffer>> shared =
        SharedBuffer::Allocate(absl::StrCat("r", rank, "-landing"), landing_bytes);
    if (shared.ok()) {
      m->landing_shared_ = *std::move(shared);
      m->landing_data_ = m->landing_shared_->data();
    } else {
      RESHARD_LOG(kWarning,
                  "rank %d: the landing area of packed pieces (%d bytes) is private memory, so "
                  "same-host peers write it by process_vm_writev or UCX puts: %s",
                  rank, landing_bytes, shared.status().message());
      m->landing_.assign(static_cast<size_t>(landing_bytes), 0);
      m->landing_data_ = m->landing_.data();
    }
    RESHARD_ASSIGN_OR_RETURN(
        m->landing_region_,
        ucx::MemoryRegion::Map(context, m->landing_data_, static_cast<size_t>(landing_bytes),
                               UCS_MEMORY_TYPE_HOST));
  }
  if (round_bytes > 0) {
    // The landing rounds' area (src/net/landing_rounds.h): pinned and mapped, so that its
    // rounds are scattered to the device without a bounce (by a kernel reading it through the
    // mapping, or the copy engines); device memory when UCX registers it (the strided pieces of
    // registered CUDA destinations land there, then move device to device).
    m->round_on_device_ = runtime.supports_cuda_memory();
    const size_t bytes = static_cast<size_t>(round_bytes);
    void* device = nullptr;
    absl::StatusOr<void*> area =
        m->round_on_device_ ? cuda::AllocDevice(bytes) : cuda::AllocMappedPinned(bytes, &device);
    absl::Status failed = area.status();
    if (failed.ok()) {
      m->round_area_ = *area;
      m->round_device_ = m->round_on_device_ ? *area : device;
      absl::StatusOr<std::unique_ptr<ucx::MemoryRegion>> region = ucx::MemoryRegion::Map(
          context, m->round_area_, bytes,
          m->round_on_device_ ? runtime.cuda_memory_type() : UCS_MEMORY_TYPE_HOST);
      if (region.ok()) m->round_region_ = *std::move(region);
      failed = region.status();
    }
    if (!failed.ok()) {
      return absl::Status(
          failed.code(),
          absl::StrFormat("rank %d: the landing rounds' area (stage_landing_bytes: %d bytes of %s "
                          "memory): %s",
                          rank, round_bytes, m->round_on_device_ ? "device" : "pinned",
                          failed.message()));
    }
    m->round_bytes_ = round_bytes;
  }
  return m;
}

absl::Status RegisteredMemory::AttachRing(std::unique_ptr<cuda::StagingRing> ring,
                                          Runtime& runtime) {
  ring_region_.reset();
  ring_ = std::move(ring);
  if (ring_ == nullptr || ring_->bytes() == 0) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<ucx::MemoryRegion>> region = ucx::MemoryRegion::Map(
      runtime.context(), ring_->data(), static_cast<size_t>(ring_->bytes()),
      ring_->on_device() ? runtime.cuda_memory_type() : UCS_MEMORY_TYPE_HOST);
  if (!region.ok()) {
    return absl::Status(region.status().code(),
                        absl::StrFormat("registering the staging ring (stage_ring_bytes: %d bytes "
                                        "of %s memory): %s",
                                        ring_->bytes(), ring_->on_device() ? "device" : "pinned",
                                        region.status().message()));
  }
  ring_region_ = *std::move(region);
  return absl::OkStatus();
}

RegisteredMemory::~RegisteredMemory() {
  ring_region_.reset();
  regions_.clear();
  send_scratch_region_.reset();
  landing_region_.reset();
  round_region_.reset();
  for (void* p : staging_) cuda::FreePinned(p);
  if (round_on_device_) {
    cuda::FreeDevice(round_area_);
  } else {
    cuda::FreePinned(round_area_);
  }
}

absl::Status RegisteredMemory::AddRemoteKeys(rendezvous::Record* record) const {
  auto add = [&](uint32_t id, const ucx::MemoryRegion& region, bool host) -> absl::Status {
    RESHARD_ASSIGN_OR_RETURN((*record)[KeyField(id)], region.PackRkey());
    (*record)[BaseField(id)] = absl::StrCat(reinterpret_cast<uintptr_t>(region.address()));
    (*record)[SizeField(id)] = absl::StrCat(region.bytes());
    if (host) {
      // assign, not = "1": gcc 12 warns there (-Wrestrict, a false positive in an inlined copy).
      (*record)[HostMemoryField(id)].assign(1, '1');
      if (const auto at = SharedBuffer::Lookup(region.address(), region.bytes())) {
        (*record)[SharedMemoryField(id)] = absl::StrCat(at->name, ",", at->offset, ",", at->mapped);
      }
    }
    return absl::OkStatus();
  };
  for (uint32_t b = 0; b < buffers_.size(); ++b) {
    if (writable_[b] && regions_[b] != nullptr) {
      RESHARD_RETURN_IF_ERROR(add(b, *regions_[b], !device(b)));
    }
  }
  if (landing_region_ != nullptr) {
    RESHARD_RETURN_IF_ERROR(add(landing_id(), *landing_region_, true));
  }
  if (round_region_ != nullptr) {
    // Written with UCX puts only (pinned or device memory, not a shared-memory object).
    RESHARD_RETURN_IF_ERROR(add(round_id(), *round_region_, false));
  }
  return absl::OkStatus();
}

std::vector<bool> SourceBuffersRead(const plan::Plan& plan, int32_t rank) {
  std::vector<bool> read(plan.buffers().size(), false);
  for (const plan::Transfer& t : plan.transfers()) {
    if (t.from_rank != rank) continue;
    const uint32_t b = plan.buffer_of(t.tensor, t.from_side);
    if (b < read.size()) read[b] = true;
  }
  return read;
}

absl::Status RegisteredMemory::StageSources(const plan::Plan& plan,
                                            const std::vector<bool>& unread,
                                            int64_t* bytes) const {
  for (uint32_t b = 0; b < buffers_.size(); ++b) {
    if (b < unread.size() && unread[b]) continue;
    if (staged(b) && plan.buffers()[b].side == plan::Side::kSrc) {
      RESHARD_RETURN_IF_ERROR(
          cuda::CudaCopy(staging_[b], buffers_[b].data, static_cast<size_t>(buffers_[b].bytes)));
      if (bytes != nullptr) *bytes += buffers_[b].bytes;
    }
  }
  return absl::OkStatus();
}

}  // namespace reshard::net
