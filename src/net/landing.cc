#include "src/net/landing.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "src/common/delta_codec.h"
#include "src/common/status.h"
#include "src/cuda/runtime.h"

namespace reshard::net {

absl::Status Copy(void* dst, const void* src, int64_t bytes, bool device) {
  if (bytes <= 0) return absl::OkStatus();
  if (device) return cuda::CudaCopy(dst, src, static_cast<size_t>(bytes));
  std::memcpy(dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

namespace {
// One slab of plan::ForEachSlab: `rows` pieces of `width` bytes at the pitches given. Device
// memory on either side: one CUDA call for the slab (a copy engine walks its rows), not one
// synchronous copy per run.
absl::Status CopySlab(uint8_t* dst, int64_t dst_pitch, const uint8_t* src, int64_t src_pitch,
                      int64_t width, int64_t rows, bool device) {
  if (device) return cuda::CudaCopy2D(dst, dst_pitch, src, src_pitch, width, rows);
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(dst + i * dst_pitch, src + i * src_pitch, static_cast<size_t>(width));
  }
  return absl::OkStatus();
}
}  // namespace

Landing::Landing(const plan::Plan& plan, const SendProgram& program, RegisteredMemory& memory,
                 bool data_messages)
    : plan_(plan), program_(program), memory_(memory), data_messages_(data_messages) {
  landed_epoch_.assign(program.received.size(), 0);
  landed_bytes_.assign(program.received.size(), 0);
  stream_bytes_.assign(program.received.size(), 0);
  segment_begin_.assign(program.received.size() + 1, 0);
  for (uint32_t slot = 0; slot < program.received.size(); ++slot) {
    const int es = program.delta_elem_bytes[slot];
    const int64_t bytes = plan.region(plan.transfers()[program.received[slot]].region).bytes;
    segment_begin_[slot + 1] = segment_begin_[slot] + (es != 0 ? delta::NumSegments(bytes / es, es) : 0);
  }
  segments_done_.assign(program.received.size(), 0);
  applied_bytes_.assign(static_cast<size_t>(segment_begin_.back()), 0);
  any_delta_.assign(program.received.size(), 0);
  unpack_queued_.assign(program.received.size(), 0);
  segment_applied_.assign(static_cast<size_t>(segment_begin_.back()), 0);
  tracks_prefix_.assign(program.received.size(), 0);
  prefix_.assign(program.received.size(), 0);
  unpacked_.assign(program.received.size(), 0);
  queued_advances_.assign(program.received.size(), 0);
  in_place_epoch_.assign(program.received.size(), 0);
  if (!data_messages) return;
  for (uint32_t slot = 0; slot < program.received.size(); ++slot) {
    const plan::Transfer& t = plan.transfers()[program.received[slot]];
    const plan::Region& region = plan.region(t.region);
    if (t.from_rank == program.rank || program.landing_offset[slot] >= 0 ||
        program.delta_elem_bytes[slot] != 0 || region.ndims == 0) {
      continue;
    }
    std::vector<RunStart>& starts = run_starts_[slot];
    starts.reserve(static_cast<size_t>(region.num_runs()));
    plan::ForEachRun(region, plan.region_dims(region), [&](int64_t, int64_t to, int64_t) {
      starts.push_back({to, static_cast<int64_t>(starts.size())});
    });
    std::sort(starts.begin(), starts.end(),
              [](const RunStart& a, const RunStart& b) { return a.to < b.to; });
  }
}

Landing::~Landing() {
  // The copy queue, which the engine destroys first, waited for every copy reading it.
  if (bounce_ != nullptr) cuda::FreePinned(bounce_);
}

absl::Status Landing::InitBounce() {
  if (!data_messages_ || bounce_ != nullptr) return absl::OkStatus();
  bool device = false;
  for (uint32_t slot = 0; slot < program_.received.size() && !device; ++slot) {
    const plan::Transfer& t = plan_.transfers()[program_.received[slot]];
    device = t.from_rank != program_.rank && program_.delta_elem_bytes[slot] == 0 &&
             plan_.region(t.region).bytes > 0 &&
             memory_.device(plan_.buffer_of(t.tensor, t.to_side));
  }
  if (!device) return absl::OkStatus();
  if (copy_queue_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", program_.rank,
                     ": data messages land in device memory, but the rank has no copy queue"));
  }
  const auto bytes = static_cast<size_t>(kBounceSlots * wire::kAmChunkBytes);
  absl::StatusOr<void*> area = cuda::AllocPinned(bytes);
  if (!area.ok()) {
    return absl::Status(area.status().code(),
                        absl::StrCat("rank ", program_.rank,
                                     ": the pinned bounce area of data messages into device "
                                     "memory (",
                                     bytes, " bytes): ", area.status().message()));
  }
  bounce_ = static_cast<uint8_t*>(*area);
  bounce_event_.assign(kBounceSlots, -1);
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> Landing::NextBounceSlot() {
  const int k = bounce_next_;
  int32_t& event = bounce_event_[static_cast<size_t>(k)];
  if (event >= 0) {
    const absl::Time until = absl::Now() + kBounceWait;
    for (bool first = true;; first = false) {
      RESHARD_ASSIGN_OR_RETURN(const bool done, copy_queue_->Done(event));
      if (done) break;
      if (first) bounce_waits_++;
      if (absl::Now() >= until) {
        return absl::DeadlineExceededError(
            absl::StrCat("the copies of an earlier data message to the device did not finish "
                         "within ",
                         absl::FormatDuration(kBounceWait)));
      }
    }
    copy_queue_->Release(event);
    event = -1;
  }
  bounce_next_ = (k + 1) % kBounceSlots;
  return bounce_ + static_cast<int64_t>(k) * wire::kAmChunkBytes;
}

absl::Status Landing::BounceToDevice(uint32_t slot, const wire::DataHeader& h, const void* data,
                                     size_t length, uint32_t to_buf, bool packed) {
  const int k = bounce_next_;
  absl::StatusOr<uint8_t*> at = NextBounceSlot();
  absl::Status status = at.status();
  if (status.ok()) {
    // `data` is UCX's until Data returns; the slot stays unchanged until the event after its
    // copies completed.
    std::memcpy(*at, data, length);
    const auto bytes = static_cast<int64_t>(length);
    if (packed) {
      status = Unpack(slot, static_cast<int64_t>(h.to_offset), *at, bytes, /*may_queue=*/true);
    } else {
      status = copy_queue_->Copy2D(memory_.data(to_buf) + h.to_offset, bytes, *at, bytes, bytes, 1);
      unpack_queued_[slot] = 1;
      if (memory_.direct(to_buf)) staged_to_device_ += bytes;
    }
  }
  if (status.ok()) {
    absl::StatusOr<int32_t> event = copy_queue_->Record();
    status = event.status();
    if (event.ok()) bounce_event_[static_cast<size_t>(k)] = *event;
  }
  if (!status.ok()) {
    const plan::Transfer& t = plan_.transfers()[program_.received[slot]];
    return absl::Status(
        status.code(),
        absl::StrCat("rank ", program_.rank, ": moving a data message of transfer ", h.transfer,
                     " (tensor \"", plan_.spec().tensors[t.tensor].name, "\") from rank ",
                     h.base.from_rank, " to the device: ", status.message()));
  }
  bounced_messages_++;
  return absl::OkStatus();
}

void Landing::StartEpoch(uint64_t epoch, uint64_t version) {
  epoch_ = epoch;
  version_ = version;
  deltas_applied_ = 0;
  staged_to_device_ = 0;
  bounced_messages_ = 0;
  bounce_waits_ = 0;
  std::fill(landed_bytes_.begin(), landed_bytes_.end(), 0);
  std::fill(stream_bytes_.begin(), stream_bytes_.end(), 0);
  std::fill(segments_done_.begin(), segments_done_.end(), 0);
  std::fill(any_delta_.begin(), any_delta_.end(), 0);
  std::fill(segment_applied_.begin(), segment_applied_.end(), 0);
  std::fill(unpack_queued_.begin(), unpack_queued_.end(), 0);
  std::fill(prefix_.begin(), prefix_.end(), 0);
  std::fill(unpacked_.begin(), unpacked_.end(), 0);
  std::fill(queued_advances_.begin(), queued_advances_.end(), 0);
  ahead_.clear();
  queued_advance_ = false;
}

bool Landing::TrackPrefix(uint32_t slot) {
  const plan::Transfer& t = plan_.transfers()[program_.received[slot]];
  const uint32_t to_buf = plan_.buffer_of(t.tensor, t.to_side);
  if (t.from_rank == program_.rank || program_.delta_elem_bytes[slot] != 0) return false;
  if (memory_.device(to_buf)) {
    // Device memory the engine does not write by host code. A landing round's bytes are in
    // place once its scatter completed (RoundDrained); a plain piece's puts, once its sender's
    // progress message came (the flush before it completed them); data messages and a packed
    // stream from the landing area reach it on the copy queue, in place once the event after
    // their copies completed (QueuedAdvance), so only with one.
    const bool puts_in_place = !data_messages_ && program_.landing_offset[slot] < 0;
    if (!InRounds(slot) && !puts_in_place && copy_queue_ == nullptr) return false;
  }
  // Host memory, or a staged destination's pinned copy (what a relay reads): written by this
  // rank's host code (data messages, unpacking) or by the sender's puts.
  tracks_prefix_[slot] = 1;
  return true;
}

bool Landing::RoundDrained(uint32_t slot, int64_t bytes) {
  int64_t& prefix = prefix_[slot];
  if (tracks_prefix_[slot] == 0 || in_place(slot) || bytes <= prefix) return false;
  prefix = bytes;
  return true;
}

bool Landing::QueuedAdvance(int64_t* at, int64_t* length) {
  if (!queued_advance_) return false;
  queued_advance_ = false;
  *at = queued_at_;
  *length = queued_length_;
  return true;
}

bool Landing::AdvanceInPlace(uint32_t slot, int64_t at, int64_t length) {
  queued_advances_[slot]--;
  if (tracks_prefix_[slot] == 0 || in_place(slot)) return false;
  const int64_t before = prefix_[slot];
  AdvancePrefix(slot, at, length);
  return prefix_[slot] > before;
}

void Landing::QueueAdvance(uint32_t slot, int64_t at, int64_t length) {
  queued_advances_[slot]++;
  queued_advance_ = true;
  queued_at_ = at;
  queued_length_ = length;
}

absl::Status Landing::ApplyLandedSegments(uint32_t slot, int64_t count) {
  const auto& t = plan_.transfers()[program_.received[slot]];
  const int es = program_.delta_elem_bytes[slot];
  const int64_t elems = plan_.region(t.region).bytes / es;
  const uint8_t* area = memory_.landing() + program_.landing_offset[slot];
  for (int64_t k = 0; k < count; ++k) {
    if (SegmentApplied(slot, k)) continue;
    RESHARD_RETURN_IF_ERROR(
        ApplyDelta(slot, k, area + k * delta::SegmentStride(es),
                   delta::StreamCapacity(delta::SegmentLength(elems, es, k), es)));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Landing::Progressed(int32_t from_rank, uint32_t id, uint64_t bytes,
                                         uint32_t* slot) {
  RESHARD_ASSIGN_OR_RETURN(*slot, CheckSender(from_rank, id, "sent progress for"));
  const plan::Transfer& t = plan_.transfers()[program_.received[*slot]];
  if (const int es = program_.delta_elem_bytes[*slot]; es != 0) {
    // A delta piece: its first `bytes` / SegmentStride segments' streams are in its landing
    // area, applied now (validated as at the signal), so its relays forward them.
    const auto stride = static_cast<uint64_t>(delta::SegmentStride(es));
    const int64_t segments = segment_begin_[*slot + 1] - segment_begin_[*slot];
    if (program_.landing_offset[*slot] < 0 || bytes % stride != 0 ||
        bytes / stride > static_cast<uint64_t>(segments)) {
      return absl::DataLossError(absl::StrCat(
          "rank ", program_.rank, ": rank ", from_rank, " said that ", bytes,
          " bytes of the delta streams of transfer ", id, " (tensor \"",
          plan_.spec().tensors[t.tensor].name, "\") are in place, which is not a whole number of ",
          "its ", segments, " segments' places"));
    }
    if (landed(*slot)) return false;
    const int64_t before = segments_done_[*slot];
    RESHARD_RETURN_IF_ERROR(ApplyLandedSegments(*slot, static_cast<int64_t>(bytes / stride)));
    return segments_done_[*slot] > before;
  }
  if (InRounds(*slot)) {
    // Its bytes reach the destination from the round area (RoundDrained), not with puts.
    return absl::DataLossError(
        absl::StrCat("rank ", program_.rank, ": rank ", from_rank, " sent progress for transfer ",
                     id, " (tensor \"", plan_.spec().tensors[t.tensor].name,
                     "\"), which travels in landing rounds (protocol error)"));
  }
  const auto region_bytes = static_cast<uint64_t>(plan_.region(t.region).bytes);
  if (bytes > region_bytes) {
    return absl::DataLossError(absl::StrCat("rank ", program_.rank, ": rank ", from_rank,
                                            " said that ", bytes, " bytes of transfer ", id,
                                            " (tensor \"", plan_.spec().tensors[t.tensor].name,
                                            "\") are in place, but it has ", region_bytes));
  }
  int64_t& unpacked = unpacked_[*slot];
  if (tracks_prefix_[*slot] == 0 || landed(*slot) || static_cast<int64_t>(bytes) <= unpacked) {
    return false;
  }
  const auto until = static_cast<int64_t>(bytes);
  if (const int64_t offset = program_.landing_offset[*slot]; offset >= 0) {
    // A packed stream: the new part is in the landing area, unpacked into place now; the
    // piece's signal unpacks the rest. Into device memory on the copy queue: in place once the
    // event after it completed (QueuedAdvance).
    const uint32_t to_buf = plan_.buffer_of(t.tensor, t.to_side);
    const bool device = memory_.device(to_buf);
    if (device && static_cast<size_t>(queued_advances_[*slot]) >= kMaxAhead) {
      // Each one queues copies and an event: bounded as data ahead of a gap is.
      return absl::DataLossError(absl::StrCat(
          "rank ", program_.rank, ": rank ", from_rank, " sent more than ", kMaxAhead,
          " progress messages for transfer ", id, " (tensor \"",
          plan_.spec().tensors[t.tensor].name, "\") while the earlier ones were still copied"));
    }
    RESHARD_RETURN_IF_ERROR(Unpack(*slot, unpacked, memory_.landing() + offset + unpacked,
                                   until - unpacked, /*may_queue=*/device));
    if (device) {
      QueueAdvance(*slot, unpacked, until - unpacked);
      unpacked = until;
      return false;
    }
  }
  unpacked = until;
  prefix_[*slot] = until;
  return true;
}

int64_t Landing::LandedPrefix(uint32_t slot) const {
  if (in_place(slot)) {
    return plan_.region(plan_.transfers()[program_.received[slot]].region).bytes;
  }
  return prefix_[slot];
}

void Landing::AdvancePrefix(uint32_t slot, int64_t at, int64_t length) {
  int64_t& prefix = prefix_[slot];
  if (at > prefix) {
    // Beyond a gap: kept until the bytes before it are here (a repeat is ignored).
    ahead_[slot].emplace(at, length);
    return;
  }
  prefix = std::max(prefix, at + length);
  auto it = ahead_.find(slot);
  if (it == ahead_.end()) return;
  std::map<int64_t, int64_t>& ahead = it->second;
  while (!ahead.empty() && ahead.begin()->first <= prefix) {
    prefix = std::max(prefix, ahead.begin()->first + ahead.begin()->second);
    ahead.erase(ahead.begin());
  }
  if (ahead.empty()) ahead_.erase(it);
}

int64_t Landing::wire_bytes(uint32_t slot) const {
  if (program_.delta_elem_bytes[slot] != 0) return stream_bytes_[slot];
  return plan_.region(plan_.transfers()[program_.received[slot]].region).bytes;
}

absl::Status Landing::ApplyDelta(uint32_t slot, int64_t k, const uint8_t* stream,
                                 int64_t length) {
  const plan::Transfer& t = plan_.transfers()[program_.received[slot]];
  const plan::Region& region = plan_.region(t.region);
  const int es = program_.delta_elem_bytes[slot];
  const int64_t first = delta::SegmentFirst(k, es);
  const int64_t elems = delta::SegmentLength(region.bytes / es, es, k);
  delta::Decoder decoder;
  const delta::DecodeError error = decoder.Init(stream, length, elems, es, version_);
  if (error != delta::DecodeError::kOk) {
    return absl::DataLossError(absl::StrCat(
        "rank ", program_.rank, ": the delta stream of transfer ", program_.received_ids[slot],
        " (tensor \"", plan_.spec().tensors[t.tensor].name, "\", segment ", k, ") from rank ",
        t.from_rank, " is refused: ", delta::DecodeErrorName(error), " (this rank holds version ",
        version_, ")"));
  }
  stream_bytes_[slot] += decoder.bytes();
  applied_bytes_[static_cast<size_t>(segment_begin_[slot] + k)] = decoder.bytes();
  segment_applied_[static_cast<size_t>(segment_begin_[slot] + k)] = 1;
  // The relays of this piece (the descriptors waiting on it that forward it) send the stream as
  // validated (docs/delta.md): each gets its own copy in its send scratch, where it may replace
  // it by the plain segment for its receiver.
  for (uint32_t di : program_.dependencies.WaitingOn(program_.received_ids[slot])) {
    const SendDesc& d = program_.descs[di];
    if (d.relay_feed != static_cast<int64_t>(slot)) continue;
    std::memcpy(memory_.send_scratch() + d.send_offset + k * delta::SegmentStride(es), stream,
                static_cast<size_t>(decoder.bytes()));
  }
  any_delta_[slot] |= decoder.mode() == delta::kDelta ? 1 : 0;
  if (++segments_done_[slot] == segment_begin_[slot + 1] - segment_begin_[slot]) {
    deltas_applied_ += any_delta_[slot];
  }
  const uint32_t to_buf = plan_.buffer_of(t.tensor, t.to_side);
  uint8_t* to = memory_.data(to_buf);
  if (memory_.device(to_buf)) {
    // Device memory written directly (not staged): the CUDA kernels apply the validated stream.
    if (device_delta_ == nullptr) {
      return absl::InternalError(absl::StrCat("rank ", program_.rank,
                                              ": no CUDA delta codec for the device buffer of "
                                              "tensor \"",
                                              plan_.spec().tensors[t.tensor].name, "\""));
    }
    absl::StatusOr<delta::Mode> applied = device_delta_->Apply(
        cuda::SegmentOf(DeltaPieceOf(plan_, region, /*source=*/false, es), first, elems), stream,
        length, version_, to);
    if (!applied.ok()) {
      return absl::Status(applied.status().code(),
                          absl::StrCat("rank ", program_.rank, ": the delta stream of transfer ",
                                       program_.received_ids[slot], " (tensor \"",
                                       plan_.spec().tensors[t.tensor].name, "\", segment ", k,
                                       ") on the GPU: ", applied.status().message()));
    }
    return absl::OkStatus();
  }
  plan::ForEachRunIn(region, plan_.region_dims(region), first * es, (first + elems) * es,
                     [&](int64_t, int64_t to_off, int64_t n) { decoder.Apply(to + to_off, n / es); });
  return absl::OkStatus();
}

int64_t Landing::AppliedBytes(uint32_t slot, int64_t k) const {
  RESHARD_CHECK(program_.delta_elem_bytes[slot] != 0 && SegmentApplied(slot, k));
  return applied_bytes_[static_cast<size_t>(segment_begin_[slot] + k)];
}

cuda::DeltaPiece DeltaPieceOf(const plan::Plan& plan, const plan::Region& region, bool source,
                              int elem_size) {
  // Regions of one tensor move whole elements (DeltaElemBytes compares at their size).
  RESHARD_CHECK(region.run_bytes % elem_size == 0);
  const plan::RegionDim* dims = plan.region_dims(region);
  int64_t count[cuda::kMaxPackDims] = {}, stride[cuda::kMaxPackDims] = {};
  static_assert(plan::kMaxTensorDims <= cuda::kMaxPackDims);
  for (int k = 0; k < region.ndims; ++k) {
    count[k] = dims[k].count;
    stride[k] = source ? dims[k].from_stride : dims[k].to_stride;
  }
  return cuda::MakeDeltaPiece(source ? region.from_offset : region.to_offset, region.run_bytes,
                              region.ndims, count, stride, elem_size);
}

cuda::CopyRegion CopyRegionOf(const plan::Plan& plan, const plan::Region& region) {
  const plan::RegionDim* dims = plan.region_dims(region);
  static_assert(plan::kMaxTensorDims <= cuda::kMaxPackDims);
  cuda::CopyRegion c;
  c.from_offset = region.from_offset;
  c.to_offset = region.to_offset;
  c.run_bytes = region.run_bytes;
  c.ndims = region.ndims;
  for (int k = 0; k < region.ndims; ++k) {
    c.count[k] = dims[k].count;
    c.from_stride[k] = dims[k].from_stride;
    c.to_stride[k] = dims[k].to_stride;
  }
  return c;
}

absl::StatusOr<uint32_t> Landing::CheckSender(int32_t from_rank, uint32_t id,
                                              const char* what) const {
  const int64_t slot = program_.Slot(id);
  if (slot < 0 || plan_.transfers()[program_.received[slot]].from_rank != from_rank) {
    return absl::DataLossError(absl::StrCat("rank ", program_.rank, ": rank ", from_rank, " ", what,
                                            " transfer ", id,
                                            " that the plan does not send it here"));
  }
  return static_cast<uint32_t>(slot);
}

absl::StatusOr<bool> Landing::Signalled(int32_t from_rank, uint32_t id, uint32_t* slot) {
  RESHARD_ASSIGN_OR_RETURN(*slot, CheckSender(from_rank, id, "signalled"));
  if (landed(*slot)) return false;
  // A round piece lands with its last round (the engine), not with its signal.
  if (InRounds(*slot)) return false;
  const int64_t offset = program_.landing_offset[*slot];
  if (offset >= 0 && program_.delta_elem_bytes[*slot] != 0) {
    // Every segment's stream is in place (the batch's signal follows the piece's puts); those
    // a progress message announced were applied then.
    RESHARD_RETURN_IF_ERROR(
        ApplyLandedSegments(*slot, segment_begin_[*slot + 1] - segment_begin_[*slot]));
  } else if (offset >= 0) {
    const int64_t bytes = plan_.region(plan_.transfers()[program_.received[*slot]].region).bytes;
    // The landing area holds the stream until the next epoch's grant: device copies may queue.
    // Progress messages unpacked (or queued the unpacking of) its first unpacked_ bytes already.
    const int64_t done = tracks_prefix_[*slot] != 0 ? unpacked_[*slot] : 0;
    RESHARD_RETURN_IF_ERROR(Unpack(*slot, done, memory_.landing() + offset + done, bytes - done,
                                   /*may_queue=*/true));
  }
  return true;
}

absl::StatusOr<bool> Landing::Data(const wire::DataHeader& h, const void* data, size_t length,
                                   uint32_t* slot_out) {
  const int32_t from = h.base.from_rank;
  const uint32_t id = h.transfer;
  RESHARD_ASSIGN_OR_RETURN(const uint32_t slot, CheckSender(from, id, "sent data for"));
  *slot_out = slot;
  const plan::Transfer& t = plan_.transfers()[program_.received[slot]];
  const auto region_bytes = static_cast<uint64_t>(plan_.region(t.region).bytes);
  const uint64_t landed = static_cast<uint64_t>(landed_bytes_[slot]);
  const int es = program_.delta_elem_bytes[slot];
  const bool packed = program_.landing_offset[slot] >= 0 || es != 0;
  if (h.packed != (packed ? 1u : 0u)) {
    return absl::DataLossError(absl::StrCat("rank ", program_.rank, ": rank ", from,
                                            " sent data for transfer ", id, " with packed flag ",
                                            h.packed, ", but the transfer travels ",
                                            (packed ? "packed" : "unpacked")));
  }
  if (es != 0) {
    // A delta stream: one message per segment of the piece (the sender never cuts one), its
    // whole stream, applied before this returns (`data` is UCX's until then); the piece has
    // landed when every segment has. Nothing is reserved for it here (no landing offset).
    const int64_t elems = static_cast<int64_t>(region_bytes) / es;
    const auto stride = static_cast<uint64_t>(delta::SegmentStride(es));
    const int64_t segments = segment_begin_[slot + 1] - segment_begin_[slot];
    // Unsigned: k * stride of a hostile offset would overflow int64.
    const uint64_t k = h.to_offset / stride;
    if (h.to_offset % stride != 0 || k >= static_cast<uint64_t>(segments) ||
        h.stream_bytes != length || length < sizeof(delta::StreamHeader) ||
        length > static_cast<uint64_t>(delta::StreamCapacity(
                     delta::SegmentLength(elems, es, static_cast<int64_t>(k)), es))) {
      return absl::DataLossError(absl::StrCat(
          "rank ", program_.rank, ": rank ", from, " sent ", length,
          " delta stream bytes at offset ", h.to_offset, " of a stream of ", h.stream_bytes,
          " bytes, which is not one whole segment's stream of transfer ", id, " (tensor \"",
          plan_.spec().tensors[t.tensor].name, "\")"));
    }
    // Marked applied by ApplyDelta, once the stream passed validation.
    if (SegmentApplied(slot, static_cast<int64_t>(k))) {
      return absl::DataLossError(absl::StrCat(
          "rank ", program_.rank, ": rank ", from, " sent segment ", k, " of transfer ", id,
          " (tensor \"", plan_.spec().tensors[t.tensor].name, "\") twice in epoch ", epoch_));
    }
    RESHARD_RETURN_IF_ERROR(ApplyDelta(slot, static_cast<int64_t>(k),
                                       static_cast<const uint8_t*>(data),
                                       static_cast<int64_t>(length)));
    return segments_done_[slot] == segments;
  }
  if (h.stream_bytes != 0) {
    return absl::DataLossError(absl::StrCat("rank ", program_.rank, ": rank ", from,
                                            " sent a delta stream for transfer ", id,
                                            ", which this rank receives plain (do both ranks "
                                            "use delta refits?)"));
  }
  const uint32_t to_buf = plan_.buffer_of(t.tensor, t.to_side);
  // Packed: inside the transfer's stream. Unpacked: inside one run of its region (so inside
  // the buffer too), never in bytes that other transfers, peers or nobody write.
  // `start` and `run`: where the run (or the packed stream) holding the data starts, and its
  // index in region order.
  uint64_t start = 0, limit = region_bytes;
  int64_t run = 0;
  if (!packed) {
    const plan::Region& region = plan_.region(t.region);
    start = static_cast<uint64_t>(region.to_offset);
    limit = static_cast<uint64_t>(region.run_bytes);
    auto runs = run_starts_.find(slot);
    if (runs != run_starts_.end()) {
      const std::vector<RunStart>& starts = runs->second;
      auto next = std::upper_bound(
          starts.begin(), starts.end(), h.to_offset,
          [](uint64_t offset, const RunStart& s) { return offset < static_cast<uint64_t>(s.to); });
      start = next == starts.begin() ? UINT64_MAX : static_cast<uint64_t>((next - 1)->to);
      run = next == starts.begin() ? 0 : (next - 1)->index;
    }
  }
  if (h.to_offset < start || !wire::InBounds(h.to_offset - start, length, limit) ||
      !wire::InBounds(landed, length, region_bytes) ||
      (!packed &&
       !wire::InBounds(h.to_offset, length, static_cast<uint64_t>(memory_.buffer(to_buf).bytes)))) {
    return absl::DataLossError(absl::StrCat("rank ", program_.rank, ": rank ", from, " sent ",
                                            length, (packed ? " packed" : ""), " bytes at offset ",
                                            h.to_offset, " outside transfer ", id,
                                            " (tensor \"", plan_.spec().tensors[t.tensor].name,
                                            "\")"));
  }
  // Tracked (TrackPrefix): where the data starts in region order. Data beyond a gap waits in
  // `ahead_`, bounded: a sender's messages arrive nearly in order.
  const int64_t region_at = static_cast<int64_t>(h.to_offset - start) +
                            (packed ? 0 : run * plan_.region(t.region).run_bytes);
  if (tracks_prefix_[slot] != 0 && region_at > prefix_[slot]) {
    // Advances still on the copy queue (device memory) may land ahead too: they count.
    auto ahead = ahead_.find(slot);
    const size_t waiting = (ahead != ahead_.end() ? ahead->second.size() : 0) +
                           static_cast<size_t>(queued_advances_[slot]);
    if (waiting >= kMaxAhead) {
      return absl::DataLossError(
          absl::StrCat("rank ", program_.rank, ": rank ", from, " sent more than ", kMaxAhead,
                       " data messages of transfer ", id, " (tensor \"",
                       plan_.spec().tensors[t.tensor].name, "\") ahead of a gap in its region"));
    }
  }
  if (length > 0 && memory_.device(to_buf)) {
    // Device memory the engine writes: only through the bounce area, never by a synchronous copy.
    if (bounce_ == nullptr) {
      return absl::InternalError(absl::StrCat(
          "rank ", program_.rank, ": a data message of transfer ", id, " (tensor \"",
          plan_.spec().tensors[t.tensor].name, "\") from rank ", from,
          " lands in device memory, but the rank has no bounce area (InitBounce was not called)"));
    }
    // Every data message is at most one chunk (the sender cuts runs there).
    if (length > static_cast<size_t>(wire::kAmChunkBytes)) {
      return absl::DataLossError(absl::StrCat(
          "rank ", program_.rank, ": rank ", from, " sent a data message of ", length,
          " bytes for transfer ", id, " (tensor \"", plan_.spec().tensors[t.tensor].name,
          "\"), more than the ", wire::kAmChunkBytes, " bytes a data message carries"));
    }
    RESHARD_RETURN_IF_ERROR(BounceToDevice(slot, h, data, length, to_buf, packed));
  } else if (packed) {
    // Host memory (or a staged destination's pinned copy). `data` is UCX's until this callback
    // returns: copied before it does.
    RESHARD_RETURN_IF_ERROR(Unpack(slot, static_cast<int64_t>(h.to_offset),
                                   static_cast<const uint8_t*>(data), static_cast<int64_t>(length),
                                   /*may_queue=*/false));
  } else if (length > 0) {
    std::memcpy(memory_.data(to_buf) + h.to_offset, data, length);
  }
  if (tracks_prefix_[slot] != 0 && length > 0) {
    if (memory_.device(to_buf)) {
      // On the copy queue (the bounce area): in place once the event after it completed.
      QueueAdvance(slot, region_at, static_cast<int64_t>(length));
    } else {
      AdvancePrefix(slot, region_at, static_cast<int64_t>(length));  // In place now.
    }
  }
  landed_bytes_[slot] += static_cast<int64_t>(length);
  return static_cast<uint64_t>(landed_bytes_[slot]) == region_bytes;
}

absl::StatusOr<bool> Landing::Land(uint32_t slot) {
  landed_epoch_[slot] = epoch_;
  const plan::Transfer& t = plan_.transfers()[program_.received[slot]];
  const uint32_t to_buf = plan_.buffer_of(t.tensor, t.to_side);
  if (!memory_.staged(to_buf)) {
    // A packed stream whose unpacking copies into device memory are still queued (or data
    // messages' copies through the bounce area): in place once their event completed (InPlace).
    const bool queued = unpack_queued_[slot] != 0;
    unpack_queued_[slot] = 0;
    if (!queued) in_place_epoch_[slot] = epoch_;
    return queued;
  }
  // The pinned copy holds the piece (what a relay reads) while it moves to the device.
  in_place_epoch_[slot] = epoch_;
  // Staged destination: the piece landed in pinned host memory; move it to the device.
  auto* device = static_cast<uint8_t*>(memory_.buffer(to_buf).data);
  const uint8_t* host = memory_.data(to_buf);
  const plan::Region& region = plan_.region(t.region);
  staged_to_device_ += region.bytes;
  absl::Status status;
  plan::ForEachSlab(
      region, plan_.region_dims(region), 0, region.bytes,
      [&](int64_t, int64_t to_off, int64_t width, int64_t rows, int64_t, int64_t to_pitch) {
        if (!status.ok()) return;
        status = copy_queue_ != nullptr ? copy_queue_->Copy2D(device + to_off, to_pitch,
                                                              host + to_off, to_pitch, width, rows)
                                        : cuda::CudaCopy2D(device + to_off, to_pitch, host + to_off,
                                                           to_pitch, width, rows);
      });
  if (!status.ok()) {
    return absl::Status(
        status.code(),
        absl::StrCat("rank ", program_.rank, ": moving transfer ", program_.received_ids[slot],
                     " (tensor \"", plan_.spec().tensors[t.tensor].name, "\") from rank ",
                     t.from_rank, " to the device: ", status.message()));
  }
  return copy_queue_ != nullptr;
}

absl::Status Landing::Unpack(uint32_t slot, int64_t begin, const uint8_t* packed, int64_t length,
                             bool may_queue) {
  const plan::Transfer& t = plan_.transfers()[program_.received[slot]];
  const plan::Region& region = plan_.region(t.region);
  const uint32_t to_buf = plan_.buffer_of(t.tensor, t.to_side);
  uint8_t* to = memory_.data(to_buf);
  const bool device = memory_.device(to_buf);
  const bool queue = device && may_queue && copy_queue_ != nullptr;
  absl::Status status;
  plan::ForEachSlab(
      region, plan_.region_dims(region), begin, begin + length,
      [&](int64_t, int64_t to_off, int64_t width, int64_t rows, int64_t, int64_t to_pitch) {
        if (!status.ok()) {
        } else if (queue) {
          status = copy_queue_->Copy2D(to + to_off, to_pitch, packed, width, width, rows);
        } else {
          status = CopySlab(to + to_off, to_pitch, packed, width, width, rows, device);
        }
        packed += width * rows;
      });
  if (queue) unpack_queued_[slot] = 1;
  if (memory_.direct(to_buf)) staged_to_device_ += length;
  return status;
}

absl::Status Landing::UnpackRound(uint32_t slot, int64_t begin, const uint8_t* from,
                                  int64_t length) {
  RESHARD_RETURN_IF_ERROR(Unpack(slot, begin, from, length, /*may_queue=*/true));
  unpack_queued_[slot] = 0;  // The engine records the round's event itself.
  return absl::OkStatus();
}

absl::Status Landing::Gather(const SendDesc& d) {
  return Gather(d, 0, d.bytes, memory_.send_scratch() + d.send_offset);
}

absl::Status Landing::Gather(const SendDesc& d, int64_t begin, int64_t end, uint8_t* to) {
  const plan::Transfer& t = plan_.transfers()[d.transfer];
  const plan::Region& region = plan_.region(t.region);
  // Ring sources have no host copy: the engine reads them through the staging ring only.
  RESHARD_CHECK(!memory_.ring_source(d.from_buffer));
  const uint8_t* from = memory_.data(d.from_buffer);
  const bool device = memory_.device(d.from_buffer);
  absl::Status status;
  plan::ForEachSlab(region, plan_.region_dims(region), begin, end,
                    [&](int64_t from_off, int64_t, int64_t width, int64_t rows,
                        int64_t from_pitch, int64_t) {
                      if (status.ok()) {
                        status = CopySlab(to, width, from + from_off, from_pitch, width, rows, device);
                      }
                      to += width * rows;
                    });
  if (status.ok()) return status;
  return absl::Status(
      status.code(),
      absl::StrCat("rank ", program_.rank, ": gathering bytes [", begin, ", ", end,
                   ") of transfer ", d.id, " (tensor \"", plan_.spec().tensors[t.tensor].name,
                   "\") from buffer \"", plan_.buffers()[d.from_buffer].name,
                   "\" to send them: ", status.message()));
}

absl::StatusOr<bool> Landing::CopyLocal(const SendDesc& d) {
  if (d.run_begin == d.run_end) return false;          // An empty piece reads nothing.
  RESHARD_CHECK(!memory_.ring_source(d.from_buffer));  // See Gather.
  const bool device = memory_.device(d.from_buffer) || memory_.device(d.to_buffer);
  const bool queued = device && copy_queue_ != nullptr;
  const plan::Transfer& t = plan_.transfers()[d.transfer];
  const plan::Region& region = plan_.region(t.region);
  const uint8_t* from = memory_.data(d.from_buffer);
  uint8_t* to = memory_.data(d.to_buffer);
  absl::Status status;
  plan::ForEachSlab(region, plan_.region_dims(region), 0, region.bytes,
                    [&](int64_t from_off, int64_t to_off, int64_t width, int64_t rows,
                        int64_t from_pitch, int64_t to_pitch) {
                      if (!status.ok()) return;
                      status = queued ? copy_queue_->Copy2D(to + to_off, to_pitch, from + from_off,
                                                            from_pitch, width, rows)
                                      : CopySlab(to + to_off, to_pitch, from + from_off, from_pitch,
                                                 width, rows, device);
                    });
  if (!status.ok()) {
    return absl::Status(
        status.code(), absl::StrCat("rank ", program_.rank, ": the local copy of tensor \"",
                                    plan_.spec().tensors[t.tensor].name, "\": ", status.message()));
  }
  if (memory_.direct(d.to_buffer)) staged_to_device_ += d.bytes;
  return queued;
}

absl::Status Landing::CopyLocal(const SendDesc& d, uint32_t run_begin, uint32_t run_end,
                                const uint8_t* stream) {
  uint8_t* to = memory_.data(d.to_buffer);
  const bool device = memory_.device(d.to_buffer);
  for (uint32_t i = run_begin; i < run_end; ++i) {
    const SendRun& run = program_.runs[i];
    RESHARD_RETURN_IF_ERROR(Copy(to + run.remote_offset, stream, run.bytes, device));
    stream += run.bytes;
    if (memory_.direct(d.to_buffer)) staged_to_device_ += run.bytes;
  }
  return absl::OkStatus();
}

}  // namespace reshard::net
