// Landing: what happens to bytes that arrive on a rank, and the copies the engine makes itself.
//
//  - counts each executed transfer landing here once per epoch (and, with active-message
//    delivery, the bytes of each transfer as they arrive), by its slot in the send program's
//    receiving side; the wire names a transfer by its world index, mapped to the slot here;
//  - checks every wire field of an incoming signal or data message against the plan before any
//    byte moves (a transfer the plan does not send here, a packed flag the transfer does not
//    have, bytes outside the transfer's packed stream or outside one run of its region,
//    compared without wrapping): DataLoss naming the peer. A peer can only write the bytes the
//    plan has it write;
//  - unpacks packed streams into place (into device memory the engine writes directly: with a
//    copy queue, from the landing area without waiting, the piece landing once the queue's event
//    completed) and moves staged destination pieces host -> device; data messages into such
//    memory pass through a pinned bounce area onto the copy queue (InitBounce);
//  - applies delta streams (docs/delta.md) in place, one per segment of the piece, after
//    validating all of it against its segment and this rank's version (DataLoss otherwise, the
//    segment's destination elements untouched; the refit then fails and the next one is full):
//    with puts, from the landing area at the piece's signal (or earlier, those its sender's
//    progress message announced); with active messages, one message
//    per segment, each whole, straight from the message (nothing reserved for them). The piece
//    lands with its last segment. Each relay of the piece gets a copy of the validated stream in
//    its send scratch (SendDesc::relay_feed).
//    Host code applies them to host memory and to the pinned staging copy of a staged device
//    buffer (which Land then moves to the device, as any piece); the CUDA kernels
//    (set_device_delta) apply them to device memory the engine writes directly;
//  - keeps, for a plain piece that a relay forwards, how much of its region (in region order)
//    is in place, from its data messages or its sender's progress messages (TrackPrefix), so
//    the relay forwards each run before the piece has landed (docs/data-plane.md, "Relays");
//  - on the sending side, gathers packed streams and runs local copies.
// Device memory is copied through src/cuda/runtime.h, host memory with memcpy.
//
// Thread-compatible (called from the engine's thread, inside UCX callbacks included).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/cuda/delta.h"
#include "src/cuda/pack_batch.h"
#include "src/cuda/runtime.h"
#include "src/net/landing_rounds.h"
#include "src/net/registered_memory.h"
#include "src/net/send_program.h"
#include "src/net/wire.h"
#include "src/plan/plan.h"

namespace reshard::net {

class Landing {
 public:
  // All three must outlive the Landing. `data_messages`: active-message delivery (Data is
  // called), for which the receiving runs of unpacked transfers are indexed.
  Landing(const plan::Plan& plan, const SendProgram& program, RegisteredMemory& memory,
          bool data_messages);
  ~Landing();
  Landing(const Landing&) = delete;
  Landing& operator=(const Landing&) = delete;

  // `version`: the epoch the destination buffers hold (the last one this rank completed, 0
  // after a failure or Reset): delta streams of this epoch must be built on it.
  void StartEpoch(uint64_t epoch, uint64_t version);
  // Whether the transfer in `slot` (SendProgram::received) landed in this epoch.
  bool landed(uint32_t slot) const { return landed_epoch_[slot] == epoch_; }
  // Whether all its bytes are where a relay reads them: at Land, except into device memory with
  // copies still queued (then at InPlace, once their event completed).
  bool in_place(uint32_t slot) const { return in_place_epoch_[slot] == epoch_; }
  void InPlace(uint32_t slot) { in_place_epoch_[slot] = epoch_; }

  // Keep, for the plain transfer in `slot`, how much of its region has landed in this epoch as
  // a prefix in the region's order (plan::ForEachRun's, which every region of the same box
  // follows), so that a relay reading it (SendDesc::relay_feed) can forward each run as soon as
  // its bytes are here: with active messages from the data messages, with puts from the
  // sender's progress messages (Progressed; a packed stream is unpacked from the landing area
  // as far as they say), in landing rounds as each round's scatter completes (RoundDrained).
  // Host destinations and staged ones' pinned copies (what a relay reads there); device memory:
  // landing rounds, plain pieces by puts, and, with a copy queue, what reaches it there (data
  // messages through the bounce area, packed streams unpacked from the landing area: each such
  // call leaves a QueuedAdvance). False, and nothing kept, for delta streams (their segments
  // say it).
  bool TrackPrefix(uint32_t slot);
  // After Data or Progressed: true when the bytes it brought into device memory were queued on
  // the copy queue instead of advancing the prefix; [*at, *at + *length) of the region (region
  // order) are in place once an event recorded now completed (then AdvanceInPlace).
  bool QueuedAdvance(int64_t* at, int64_t* length);
  // Bytes [at, at + length) of tracked `slot`'s region are in place: once for every
  // QueuedAdvance of the slot (an epoch's last ones may be dropped: StartEpoch forgets them).
  // True when its prefix grew.
  bool AdvanceInPlace(uint32_t slot, int64_t at, int64_t length);
  // Round piece `slot`'s first `bytes` (region order: a round holds a piece's bytes in run
  // order) are in place: the rounds up to them were scattered and their event completed. True
  // when its prefix is kept (TrackPrefix) and grew.
  bool RoundDrained(uint32_t slot, int64_t bytes);
  // Put delivery: `from_rank` says that the first `bytes` of transfer `id`'s region (region
  // order) are in place (wire::kProgressAm), or, for a delta piece, the streams of its first
  // bytes / delta::SegmentStride segments (then applied here, as at the signal). DataLoss for a
  // transfer it does not send here, more bytes than the region's, or a delta piece's bytes that
  // are not whole segments' places. True when the prefix of its `*slot` is kept (TrackPrefix)
  // and grew (a packed stream into device memory grows it later: QueuedAdvance), or segments
  // were applied; a sender may say it of any piece a relay forwards (the
  // receiver decides).
  absl::StatusOr<bool> Progressed(int32_t from_rank, uint32_t id, uint64_t bytes, uint32_t* slot);
  // The bytes of `slot`'s region, from its start in region order, that are in place in this
  // epoch: all of them once in_place, else (TrackPrefix) as data messages, progress messages
  // and landing rounds brought them.
  int64_t LandedPrefix(uint32_t slot) const;

  // Put delivery: `from_rank` signalled that the bytes of the transfer with world index `id`
  // are in place. Unpacks its packed stream from the landing area. True when the transfer is new
  // in this epoch (then Land its `*slot`).
  [[nodiscard]] absl::StatusOr<bool> Signalled(int32_t from_rank, uint32_t id, uint32_t* slot);
  // Active-message delivery: one run or chunk, or one segment's whole delta stream. True when
  // the transfer (`*slot`) is now complete.
  [[nodiscard]] absl::StatusOr<bool> Data(const wire::DataHeader& h, const void* data,
                                          size_t length, uint32_t* slot);
  // Marks the transfer in `slot` (not yet landed) landed in this epoch and moves a staged
  // destination piece to the device: with a copy queue (set_copy_queue), enqueued there without
  // waiting (true: the caller records an event and finishes the landing once it completed),
  // otherwise synchronously (false). Also true for a packed stream that Signalled unpacked into
  // device memory through the queue.
  [[nodiscard]] absl::StatusOr<bool> Land(uint32_t slot);
  // The queue staged destination pieces move to the device on, and packed streams are unpacked
  // into device memory with (it must outlive the Landing).
  void set_copy_queue(cuda::CopyQueue* queue) { copy_queue_ = queue; }
  // Active-message delivery into device memory the engine writes (direct destinations, or
  // registered ones with a CUDA-aware UCX): a data message's bytes are UCX's only until Data
  // returns, so Data copies each into the next of kBounceSlots slots of a pinned bounce area and
  // moves it to the device on the copy queue (one copy per message, one per slab of a packed
  // stream), never by a synchronous copy; the piece lands when the event after its last copy
  // completed (Land reports it queued). A slot is reused once the event after its copies
  // completed, waited for (at most kBounceWait) only when every slot is busy. Allocates the area
  // (kBounceSlots * wire::kAmChunkBytes pinned bytes) when data messages land in such memory
  // here; call after set_copy_queue. FailedPrecondition without a copy queue then.
  [[nodiscard]] absl::Status InitBounce();
  static constexpr int kBounceSlots = 8;
  static constexpr absl::Duration kBounceWait = absl::Seconds(10);
  // The bounce area's pinned bytes (0 without one).
  int64_t bounce_bytes() const {
    return bounce_ != nullptr ? kBounceSlots * wire::kAmChunkBytes : 0;
  }
  // This epoch: data messages moved to the device through the bounce area, and how many of them
  // waited for a slot whose copies were still running.
  int64_t bounced_messages() const { return bounced_messages_; }
  int64_t bounce_waits() const { return bounce_waits_; }

  // Landing rounds (src/net/landing_rounds.h; it must outlive the Landing): their pieces are
  // signalled like any other, but land when the engine has copied their last round out of the
  // round area (UnpackRound, then LandRound), not when signalled.
  void set_rounds(const LandingRounds* rounds) { rounds_ = rounds; }
  // Copies bytes [begin, begin + length) of round piece `slot`, held at `from` in the round
  // area, to its direct destination on the copy queue (or synchronously without one).
  [[nodiscard]] absl::Status UnpackRound(uint32_t slot, int64_t begin, const uint8_t* from,
                                         int64_t length);
  // Whether the transfer in `slot` travels in landing rounds (put delivery only).
  bool InRounds(uint32_t slot) const {
    return rounds_ != nullptr && slot < rounds_->sender_of_slot.size() &&
           rounds_->sender_of_slot[slot] >= 0;
  }
  // Round piece `slot` landed (every byte's copy completed).
  void LandRound(uint32_t slot) { landed_epoch_[slot] = in_place_epoch_[slot] = epoch_; }

  // Bytes the transfer in `slot` took on the wire in this epoch: its delta stream, or the piece.
  int64_t wire_bytes(uint32_t slot) const;
  // Bytes this rank moved from host memory to CUDA destinations UCX cannot register in this
  // epoch: landed pieces from staged destinations' host copies, and what was copied into direct
  // ones (from the landing areas, data messages and local copies).
  int64_t staged_to_device() const { return staged_to_device_; }
  // `bytes` more moved into direct destinations by the engine itself (a landing round's scatter).
  void CountStagedToDevice(int64_t bytes) { staged_to_device_ += bytes; }
  // Delta pieces applied with at least one segment as a delta (not all plain) in this epoch.
  int64_t deltas_applied() const { return deltas_applied_; }
  // The length of the delta stream that segment `k` of the delta piece in `slot` brought in
  // this epoch, as validated and applied. For a relay (SendDesc::relay_feed), once the segment
  // was applied: the stream itself is then in the relay's send scratch, at the segment's place.
  int64_t AppliedBytes(uint32_t slot, int64_t k) const;
  // Whether segment `k` of the delta piece in `slot` was applied in this epoch, and how many of
  // its segments were (active messages apply them as they arrive, so a relay can forward each
  // before the piece has landed).
  bool SegmentApplied(uint32_t slot, int64_t k) const {
    return segment_applied_[static_cast<size_t>(segment_begin_[slot] + k)] != 0;
  }
  int64_t SegmentsApplied(uint32_t slot) const { return segments_done_[slot]; }
  // The codec that applies delta streams to device buffers the engine writes directly (not
  // staged); it must outlive the Landing. Without one, such streams are refused (Internal):
  // the engine checks at set-up that it has one when any delta piece lands in device memory.
  void set_device_delta(cuda::DeviceDeltaCodec* codec) { device_delta_ = codec; }

  // Sender side: gathers the runs of packed `desc` into the send scratch, or bytes
  // [begin, end) of its packed stream into `to`. A failed device copy's error names the rank,
  // transfer, tensor and buffer.
  [[nodiscard]] absl::Status Gather(const SendDesc& desc);
  [[nodiscard]] absl::Status Gather(const SendDesc& desc, int64_t begin, int64_t end, uint8_t* to);
  // A local copy (desc.peer == this rank), one 2-D copy per slab (plan::ForEachSlab), not one
  // per run. True when device memory is on either side and a copy queue exists: the copies are
  // queued there, and the piece has landed once an event recorded after them completed; false
  // when they are done.
  [[nodiscard]] absl::StatusOr<bool> CopyLocal(const SendDesc& desc);
  // Runs [run_begin, run_end) of local copy `desc`, read one after another from `stream` (host
  // memory: the part of the piece the staging ring packed) instead of its source buffer.
  [[nodiscard]] absl::Status CopyLocal(const SendDesc& desc, uint32_t run_begin, uint32_t run_end,
                                       const uint8_t* stream);

 private:
  // The slot of world transfer `id`, which must land here from `from_rank`; DataLoss otherwise.
  absl::StatusOr<uint32_t> CheckSender(int32_t from_rank, uint32_t id, const char* what) const;
  // Copies [begin, begin + length) of the packed stream in `slot` from `packed` into place.
  // `may_queue`: `packed` stays unchanged until the piece has landed, so copies into device
  // memory may go on the copy queue (then Land reports them); otherwise they are synchronous.
  absl::Status Unpack(uint32_t slot, int64_t begin, const uint8_t* packed, int64_t length,
                      bool may_queue);
  // Data into device memory through the bounce area (see InitBounce).
  absl::Status BounceToDevice(uint32_t slot, const wire::DataHeader& h, const void* data,
                              size_t length, uint32_t to_buf, bool packed);
  // The next bounce slot, once the copies that read it last completed.
  absl::StatusOr<uint8_t*> NextBounceSlot();
  // Applies the delta stream of segment `k` of `slot` (`length` bytes at `stream`) to its
  // destination elements.
  absl::Status ApplyDelta(uint32_t slot, int64_t k, const uint8_t* stream, int64_t length);
  // Put delivery: applies segments [0, count) of delta piece `slot` from its landing area,
  // those not applied yet.
  absl::Status ApplyLandedSegments(uint32_t slot, int64_t count);

  const plan::Plan& plan_;
  const SendProgram& program_;
  RegisteredMemory& memory_;
  uint64_t epoch_ = 0;
  std::vector<uint64_t> landed_epoch_;  // By slot.
  std::vector<int64_t> landed_bytes_;   // By slot (active-message delivery).
  // Active-message delivery: for each unpacked transfer landing here in several runs (by slot),
  // its runs (each the region's run_bytes long) sorted by their offset in the receiving buffer,
  // with their index in region order.
  struct RunStart {
    int64_t to = 0;
    int64_t index = 0;
  };
  absl::flat_hash_map<uint32_t, std::vector<RunStart>> run_starts_;
  // TrackPrefix: by slot, whether it is kept, and the landed prefix; data that landed beyond a
  // gap (messages overtaking each other) waits in `ahead_` as (region position, bytes).
  std::vector<uint8_t> tracks_prefix_;
  std::vector<int64_t> prefix_;
  // By slot: bytes of a tracked packed stream unpacked (or queued to be) by progress messages.
  std::vector<int64_t> unpacked_;
  std::vector<uint64_t> in_place_epoch_;  // By slot (in_place).
  // The advance the last Data or Progressed queued (QueuedAdvance), and by slot those not yet
  // advanced (AdvanceInPlace): they count towards kMaxAhead.
  bool queued_advance_ = false;
  int64_t queued_at_ = 0, queued_length_ = 0;
  std::vector<int64_t> queued_advances_;
  void QueueAdvance(uint32_t slot, int64_t at, int64_t length);
  absl::flat_hash_map<uint32_t, std::map<int64_t, int64_t>> ahead_;
  static constexpr size_t kMaxAhead = 65536;  // Per slot: DataLoss past this.
  // Data of `length` bytes landed at region position `at` of tracked `slot`.
  void AdvancePrefix(uint32_t slot, int64_t at, int64_t length);
  uint64_t version_ = 0;
  int64_t deltas_applied_ = 0;
  int64_t staged_to_device_ = 0;
  std::vector<int64_t> stream_bytes_;  // By slot: this epoch's delta streams' bytes so far.
  // Delta pieces by slot: their segments are [segment_begin_[slot], segment_begin_[slot + 1])
  // (numbered over this rank's received delta pieces), how many were applied in this epoch and
  // whether any of them as a delta.
  std::vector<int64_t> segment_begin_;
  std::vector<int64_t> segments_done_;
  std::vector<int64_t> applied_bytes_;  // By segment: the length of the stream applied.
  std::vector<uint8_t> segment_applied_;  // By segment: its stream came in this epoch.
  std::vector<uint8_t> any_delta_;
  cuda::DeviceDeltaCodec* device_delta_ = nullptr;
  cuda::CopyQueue* copy_queue_ = nullptr;
  const LandingRounds* rounds_ = nullptr;
  std::vector<uint8_t> unpack_queued_;  // By slot: Unpack queued device copies (Land reports).
  const bool data_messages_;
  // The bounce area (pinned; null without one), by slot the event after the copies that read it
  // (-1: none), the next slot to use, and this epoch's counts.
  uint8_t* bounce_ = nullptr;
  std::vector<int32_t> bounce_event_;
  int bounce_next_ = 0;
  int64_t bounced_messages_ = 0;
  int64_t bounce_waits_ = 0;
};

// One side (`source`: the sending buffer's, else the receiving buffer's) of `region` as the
// delta kernels address its elements of `elem_size` bytes.
cuda::DeltaPiece DeltaPieceOf(const plan::Plan& plan, const plan::Region& region, bool source,
                              int elem_size);

// `region` as the strided-copy kernel addresses it (from its sending buffer to its receiving
// one, each side's offsets from that buffer's start).
cuda::CopyRegion CopyRegionOf(const plan::Plan& plan, const plan::Region& region);

// One copy between any two addresses (CUDA when either side is device memory).
[[nodiscard]] absl::Status Copy(void* dst, const void* src, int64_t bytes, bool device);

}  // namespace reshard::net
