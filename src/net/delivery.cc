#include "src/net/delivery.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "src/common/delta_codec.h"
#include "src/common/fault.h"
#include "src/common/status.h"
#include "src/net/ucx/tls.h"

namespace reshard::net {

bool UseActiveMessages(RefitEngineOptions::Delivery delivery) {
  if (const char* env = std::getenv("RESHARD_DELIVERY")) {
    if (std::string(env) == "am") return true;
    if (std::string(env) == "put") return false;
  }
  if (delivery != RefitEngineOptions::Delivery::kAuto) {
    return delivery == RefitEngineOptions::Delivery::kActiveMessage;
  }
  const ucx::TlsSelection tls = ucx::TlsSelection::FromEnvironment();
  return !tls.ucx_chooses && tls.Names("tcp") && !tls.rdma();
}

namespace {

class DeliveryBase : public Delivery {
 protected:
  DeliveryBase(int32_t rank, const SendProgram& program, RegisteredMemory& memory,
               RefitStats& stats)
      : rank_(rank), program_(program), memory_(memory), stats_(stats) {}

  // Where run `run` of `desc` is read from, and its registration: the staging ring when the
  // engine set link.ring_source (the run's bytes there), else the send scratch or the buffer.
  const uint8_t* Source(const PeerLink& link, const SendDesc& d, const SendRun& run) const {
    if (link.ring_source != nullptr) return link.ring_source;
    return (d.packed ? memory_.send_scratch() : memory_.data(d.from_buffer)) + run.local_offset;
  }
  // A delta stream's run ends at its segment's stream's end.
  static SendRun Cut(const PeerLink& link, const SendDesc& d, SendRun run) {
    if (d.delta_elem_bytes > 0) {
      run.bytes = std::min(run.bytes, link.stream_end - run.remote_offset);
    }
    return run;
  }
  // Whether runs of `d` are read from device memory (which process_vm_writev cannot read).
  bool SourceOnDevice(const PeerLink& link, const SendDesc& d) const {
    if (link.ring_source != nullptr) return memory_.ring()->on_device();
    return !d.packed && memory_.device(d.from_buffer);
  }
  ucp_mem_h SourceMemh(const PeerLink& link, const SendDesc& d) const {
    if (link.ring_source != nullptr) return memory_.ring_memh();
    return d.packed ? memory_.send_scratch_memh() : memory_.memh(d.from_buffer);
  }

  const int32_t rank_;
  const SendProgram& program_;
  RegisteredMemory& memory_;
  RefitStats& stats_;
};

class PutDelivery final : public DeliveryBase {
 public:
  PutDelivery(int32_t rank, const SendProgram& program, RegisteredMemory& memory,
              int64_t signal_batch_bytes, RefitStats& stats)
      : DeliveryBase(rank, program, memory, stats), signal_batch_bytes_(signal_batch_bytes) {}

  const char* name() const override { return "put"; }
  bool counts_bytes() const override { return false; }

  absl::Status PostRun(PeerLink& link, const SendDesc& d, uint32_t run_index, uint64_t epoch,
                       bool* in_flight) override {
    const SendRun run = Cut(link, d, program_.runs[run_index]);
    if (link.round_bytes > 0) {
      // A chunk of a landing round (src/net/landing_rounds.h): into the receiver's round area,
      // with a UCX put (the area is pinned memory, neither mapped nor written by the kernel).
      const uint32_t area = memory_.round_id();
      stats_.puts++;
      absl::Status posted =
          link.Put(Source(link, d, run) + link.round_skip, static_cast<size_t>(link.round_bytes),
                   link.remote_base(area) + link.round_remote, link.rkey(area), SourceMemh(link, d),
                   in_flight, link.ring_slot);
      common::FaultPoint(common::FaultStage::kPuts, rank_, epoch);
      return posted;
    }
    // Packed streams land in this rank's block of the receiver's landing area (id one past the
    // plan's buffers).
    const uint32_t to = d.packed ? memory_.landing_id() : d.to_buffer;
    const uint64_t remote =
        link.remote_base(to) +
        static_cast<uint64_t>(d.packed ? link.landing_block() + d.landing_offset : 0) +
        static_cast<uint64_t>(run.remote_offset);
    absl::Status posted;
    if (uint8_t* mapped = link.mapped(to); mapped != nullptr && !SourceOnDevice(link, d)) {
      // The peer's HostBuffer, mapped here: the run's one copy, done when memcpy returns
      // (CheckRemoteKeys bounded every run by the registered region, which the mapping holds).
      std::memcpy(mapped + (remote - link.remote_base(to)), Source(link, d, run),
                  static_cast<size_t>(run.bytes));
      stats_.mapped_copies++;
    } else if (SingleCopyWriter* writer = link.single_copy();
               writer != nullptr && link.remote_host(to) && !SourceOnDevice(link, d)) {
      // Queued; written (many runs per call) at the latest when the piece is posted.
      const int64_t calls = writer->calls();
      posted = writer->Add(Source(link, d, run), remote, static_cast<size_t>(run.bytes));
      stats_.single_copy_writes += writer->calls() - calls;
    } else {
      stats_.puts++;
      posted = link.Put(Source(link, d, run), static_cast<size_t>(run.bytes), remote, link.rkey(to),
                        SourceMemh(link, d), in_flight, link.ring_slot);
    }
    common::FaultPoint(common::FaultStage::kPuts, rank_, epoch);
    return posted;
  }

  absl::Status RingPartPosted(PeerLink& link) override { return WriteQueued(link); }

  absl::Status DescPosted(PeerLink& link, const SendDesc& d) override {
    // The piece's single-copy writes complete before it joins a batch (whose signal says
    // that it landed).
    RESHARD_RETURN_IF_ERROR(WriteQueued(link));
    // Mapped copies are plain stores: ordered before the batch's signal (a UCX message or
    // put the receiver reads before it reads the piece).
    if (link.has_mapped()) std::atomic_thread_fence(std::memory_order_release);
    link.AddToBatch(d.id, d.bytes);
    if (link.open_batch_bytes() >= signal_batch_bytes_) return link.CloseBatch();
    return absl::OkStatus();
  }

  absl::Status Progressed(PeerLink& link, const SendDesc& d, int64_t bytes) override {
    // As for a whole piece (DescPosted): written, ordered, then flushed before the message.
    RESHARD_RETURN_IF_ERROR(WriteQueued(link));
    if (link.has_mapped()) std::atomic_thread_fence(std::memory_order_release);
    link.AddProgressToBatch(d.id, bytes);
    return link.CloseBatch();
  }

  absl::Status Drained(PeerLink& link) override { return link.CloseBatch(); }

  absl::Status Advance(PeerLink& link, uint64_t epoch) override {
    int64_t retired = 0;
    absl::Status status = link.SignalBatches(epoch, &stats_.signals, &retired);
    link.unsignalled -= retired;
    return status;
  }

 private:
  // Writes the single-copy writes queued on `link` (complete when this returns).
  absl::Status WriteQueued(PeerLink& link) {
    SingleCopyWriter* writer = link.single_copy();
    if (writer == nullptr) return absl::OkStatus();
    const int64_t calls = writer->calls();
    absl::Status written = writer->Write();
    stats_.single_copy_writes += writer->calls() - calls;
    return written;
  }

  const int64_t signal_batch_bytes_;
};

class AmDelivery final : public DeliveryBase {
 public:
  AmDelivery(int32_t rank, const SendProgram& program, RegisteredMemory& memory, RefitStats& stats)
      : DeliveryBase(rank, program, memory, stats) {}

  const char* name() const override { return "am"; }
  bool counts_bytes() const override { return true; }

  absl::Status PostRun(PeerLink& link, const SendDesc& d, uint32_t run_index, uint64_t epoch,
                       bool* in_flight) override {
    const SendRun run = Cut(link, d, program_.runs[run_index]);
    const bool delta = d.delta_elem_bytes > 0;
    // The receiver's offset: in the packed stream, or in the receiving buffer. A delta run is
    // its segment's whole stream (never cut: SendProgramOptions), and names the stream's
    // length.
    const wire::DataHeader h{
        wire::AmHeader{wire::kMagic, rank_, 0, epoch}, d.id, d.packed ? 1u : 0u,
        static_cast<uint64_t>(run.remote_offset),
        delta ? static_cast<uint64_t>(link.stream_end - link.stream_begin) : 0};
    stats_.data_messages++;
    absl::Status posted =
        link.SendData(run_index, h, Source(link, d, run), static_cast<size_t>(run.bytes),
                      SourceMemh(link, d), in_flight, link.ring_slot);
    common::FaultPoint(common::FaultStage::kPuts, rank_, epoch);
    // No completion signals here: the last data message to the peer stands for them.
    const bool last =
        run_index + 1 == d.run_end ||
        (delta && link.stream_begin == (d.segments - 1) * delta::SegmentStride(d.delta_elem_bytes));
    if (link.unsignalled == 1 && last) {
      common::FaultPoint(common::FaultStage::kSignals, rank_, epoch);
    }
    return posted;
  }

  // Data messages read the ring until their requests complete (tagged with the slot).
  absl::Status RingPartPosted(PeerLink&) override { return absl::OkStatus(); }
  // Landing is counted by the receiver byte by byte; nothing to flush or signal.
  absl::Status DescPosted(PeerLink& link, const SendDesc&) override {
    link.unsignalled--;
    return absl::OkStatus();
  }
  // Every data message says where its bytes landed.
  absl::Status Progressed(PeerLink&, const SendDesc&, int64_t) override { return absl::OkStatus(); }
  absl::Status Drained(PeerLink&) override { return absl::OkStatus(); }
  absl::Status Advance(PeerLink&, uint64_t) override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<Delivery> MakeDelivery(bool active_messages, int32_t rank,
                                       const SendProgram& program, RegisteredMemory& memory,
                                       int64_t signal_batch_bytes, RefitStats& stats) {
  if (active_messages) return std::make_unique<AmDelivery>(rank, program, memory, stats);
  return std::make_unique<PutDelivery>(rank, program, memory, signal_batch_bytes, stats);
}

}  // namespace reshard::net
