// Landing rounds: how pieces reach CUDA destinations that UCX cannot register, through a pinned
// landing area of bounded size instead of a full-size pinned copy of each destination, and how
// strided pieces reach CUDA destinations that UCX registers, through a device landing area as
// a few large puts instead of one put per run (docs/data-plane.md, "Destinations"). A pure
// function of the send program, tested on the CPU.
//
// A "direct" destination buffer is CUDA memory the engine writes itself (no pinned copy, not
// registered). With put delivery, the pieces other ranks send into it, plain or packed streams
// (not delta streams, not empty, without `after`), are its round pieces; into registered CUDA
// memory, its strided pieces, packed streams included (RoundMode). The landing area then holds
// only the packed streams that do not travel in rounds (CompactLandingArea,
// CompactLandingBlock). Each sender's round pieces to
// a receiver, in plan order (the order the sender posts them), form one stream of `total`
// bytes, cut into rounds of `quota` bytes: stream bytes [r * quota, (r + 1) * quota) are round
// r. The receiver gives the sender a slice of its round area of `slots` places of `quota` bytes
// (the whole stream when every round has its own place), and round r is written into place
// r % slots. The sender posts round r only once granted: the epoch's grant allows rounds 0 to
// slots - 1, and the receiver grants round r + slots when round r has been copied out of its
// place to the device. A sender's rounds depend on nothing but its own earlier rounds and the
// receiver's copy queue, so no sender waits on another and no cycle can form.
//
// Sizes: rounds are at most `round_bytes` (RefitEngineOptions::stage_round_bytes), so that a
// stream is copied to the device round by round while its next rounds land, instead of all at
// once after its last byte. When every sender's stream fits the budget together, each stream
// gets a place for every round (all granted with the epoch); otherwise each sender gets a share
// of the budget in proportion to its stream, holding at least two rounds (smaller than
// round_bytes when the share is below twice that), each at least kMinRoundQuota bytes.
//
// Both sides compute what they need from their own send program: the receiver its senders'
// streams (published as `rounds.<sender>` = "OFFSET:QUOTA:TOTAL" in its wire-up record, with
// `direct.<id>` = 1 or `strided.<id>` = 1 for each destination buffer that takes round pieces:
// RoundMode), the sender each descriptor's place in
// its stream to a receiver (which must add up to the TOTAL the receiver published).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "src/cuda/pack_batch.h"
#include "src/net/send_program.h"
#include "src/plan/plan.h"

namespace reshard::net {

// The least bytes per round a sender is given (a larger budget is needed for more senders).
constexpr int64_t kMinRoundQuota = 4096;

// Which pieces into a destination buffer travel through its receiver's round area.
enum class RoundMode : uint8_t {
  kNone = 0,
  // A direct destination (CUDA memory UCX cannot register; `direct.<id>` = 1 in the wire-up
  // record, no remote key): every piece, plain or packed.
  kAll = 1,
  // CUDA memory UCX registers (`strided.<id>` = 1): the pieces of more than one run, plain and
  // packed streams alike, which then leave as few large puts into device memory and are
  // scattered there by the receiver, instead of one put per run or a stream through a host
  // landing area; contiguous pieces are put straight into the buffer.
  kStrided = 2,
};

// A sender's stream into this rank's round area.
struct RoundSender {
  int32_t rank = 0;
  int64_t total = 0;                        // Bytes of its round pieces.
  int64_t quota = 0;                        // Bytes per round.
  int64_t offset = 0;                       // Its slice in the round area.
  int32_t rounds = 0;                       // ceil(total / quota).
  int32_t slots = 0;  // Places of `quota` bytes in its slice (rounds in flight).
  uint32_t piece_begin = 0, piece_end = 0;  // Its pieces, in LandingRounds::pieces.

  int32_t RoundOf(int64_t x) const { return static_cast<int32_t>(x / quota); }
  // Where stream byte `x` lies in the round area.
  int64_t AreaOffset(int64_t x) const {
    const int64_t r = x / quota;
    return offset + (r % slots) * quota + (x - r * quota);
  }
  // Its slice's bytes: the whole stream when every round has a place.
  int64_t SliceBytes() const { return slots >= rounds ? total : slots * quota; }
  // The stream bytes of round r: [RoundBegin(r), RoundEnd(r)).
  int64_t RoundBegin(int32_t r) const { return r * quota; }
  int64_t RoundEnd(int32_t r) const { return std::min(total, (r + 1) * quota); }
};

// One round piece landing here: its slot (SendProgram::received) and place in its sender's
// stream.
struct RoundPiece {
  uint32_t slot = 0;
  int64_t base = 0;
  int64_t bytes = 0;
};

struct LandingRounds {
  std::vector<RoundSender> senders;  // Ascending rank.
  std::vector<RoundPiece> pieces;    // By sender, plan order within one.
  int64_t area_bytes = 0;
  // By slot: the index in `senders` of a round piece's sender, -1 for other slots.
  std::vector<int32_t> sender_of_slot;
  // By buffer id: the modes the rounds were planned with (published at wire-up).
  std::vector<RoundMode> modes;

  bool empty() const { return senders.empty(); }
};

// Whether `t` (sent into a buffer of its receiver whose round mode is `to`) travels as a round
// piece; the same rule on both sides.
bool IsRoundPiece(const plan::Plan& plan, const plan::Transfer& t, bool delta, RoundMode to);
// The round mode of buffer `id` in `modes` (kNone past its end).
inline RoundMode ModeOf(const std::vector<RoundMode>& modes, uint32_t id) {
  return id < modes.size() ? modes[id] : RoundMode::kNone;
}

// The default largest round (RefitEngineOptions::stage_round_bytes).
constexpr int64_t kDefaultRoundBytes = int64_t{8} << 20;

// Receiving side of `program` (this rank's): `modes` by buffer id, rounds of at most
// `round_bytes`. InvalidArgument when the budget or round_bytes is below kMinRoundQuota;
// FailedPrecondition naming the rank when it cannot give every sender two rounds of
// kMinRoundQuota.
absl::StatusOr<LandingRounds> PlanLandingRounds(const plan::Plan& plan, const SendProgram& program,
                                                const std::vector<RoundMode>& modes, int64_t budget,
                                                int64_t round_bytes = kDefaultRoundBytes);

// The pack kernel's scatters of a receiver's rounds out of a round area
// (RoundMode::kStrided): batch first[i] + r scatters round r of senders[i], every piece's bytes
// in it, from its place in the round area (the stream offsets count from the area's start) into
// the destination buffers, whose offsets count from one base: `shift` (by buffer id) is the
// bytes from that base to each buffer, `base_align` the base's alignment (a power of two up to
// cuda::kMaxPackWidth). One launch per drained round instead of one copy per slab.
struct RoundScatters {
  std::vector<cuda::PackBatch> batches;
  std::vector<int32_t> first;  // By sender (LandingRounds::senders).
};
// InvalidArgument naming the rank and tensor when a batch cannot be built.
absl::StatusOr<RoundScatters> PlanRoundScatters(const plan::Plan& plan, const SendProgram& program,
                                                const LandingRounds& rounds,
                                                const std::vector<int64_t>& shift,
                                                int64_t base_align);

// The landing area without the packed streams that travel in landing rounds. Receiving side
// (set-up, once `rounds` is planned, before the area is allocated): the area is laid out again
// with only the streams that land in it, in the same order (landing_offset, landing_blocks,
// landing_bytes); a round piece's landing_offset becomes -1.
void CompactLandingArea(const LandingRounds& rounds, SendProgram* program);
// Sending side (after wire-up): the same for this rank's block at `peer`, `round_base` by
// descriptor as RoundStreamBases gives it (-1: not a round piece): round descriptors'
// landing_offset becomes -1, the others close up, and packed_to's bytes for `peer` shrink to
// what the peer's compacted area reserves for this rank (its entry removed at 0).
void CompactLandingBlock(int32_t peer, const std::vector<int64_t>& round_base,
                         SendProgram* program);

// Sending side: by descriptor of `program`, its first byte's place in this rank's round stream
// to its receiver `peer`, or -1 when it is not a round piece; `peer_modes` by buffer id (the
// peer's `direct.<id>` and `strided.<id>` fields). `*total` receives the stream's bytes.
std::vector<int64_t> RoundStreamBases(const plan::Plan& plan, const SendProgram& program,
                                      int32_t peer, const std::vector<RoundMode>& peer_modes,
                                      int64_t* total);
// RoundStreamBases checked against the TOTAL `peer` published for this rank (its wire-up record,
// read with its modes): FailedPrecondition naming both ranks when they differ, which a record
// claiming modes or a total this rank's plan does not explain also gets.
absl::StatusOr<std::vector<int64_t>> CheckedRoundStreamBases(
    const plan::Plan& plan, const SendProgram& program, int32_t peer,
    const std::vector<RoundMode>& peer_modes, int64_t published_total);

}  // namespace reshard::net
