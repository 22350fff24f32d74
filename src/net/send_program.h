// The send program: what one rank moves in every epoch, as a pure function of the plan.
//
// For (plan, rank, options) it lists, per peer, the descriptors of the transfers this rank
// executes as the sender (network, engine-run fan-out and local copies), each with its runs as
// (local offset, remote offset, bytes) relative to plan buffer ids (never raw addresses, so the
// program is built, compared and tested without UCX), and the receiving side: which transfers
// land here, how many from each peer, and where packed streams land.
//
// The plan may be the world plan (BuildPlan) or the rank's share of it (BuildRankPlan): the
// program is the same either way. Descriptors and received transfers index plan.transfers()
// (`transfer`, `received`), and carry the transfer's world index (`id`, `received_ids`, from
// plan.transfer_id()), which names a piece between ranks (completion signals, data messages,
// Progress reports, dependencies: Transfer::after is a world index too). Every table is sized by
// what this rank sends or receives, never by the world's transfers.
//
// Packed transfers (strided regions whose runs are shorter than pack_below_run_bytes) travel as
// one contiguous stream: the sender gathers the runs into its send scratch at send_offset, and
// the stream's runs are (offset in the send scratch, offset in the stream, bytes). For the other
// transfers a run is (offset in buffer from_buffer, offset in the receiver's buffer to_buffer,
// bytes). With chunk_bytes > 0 (active-message delivery) network runs are cut into pieces of
// at most that many bytes.
//
// The landing area of a receiver holds one block per sender of packed streams, in ascending
// sender order, each block that sender's streams in plan order. A sender knows its own streams,
// so it computes each stream's offset inside its block; where its block starts depends on the
// other senders, which only the receiver knows: the receiver publishes it (landing_blocks, in
// its wire-up record), and the sender adds it at set-up (src/net/wireup.h).
//
// Delta mode (docs/delta.md): every network transfer from a source tile into a destination
// tile or a staging slot, and every relay, of more than delta::kShortestStream bytes, travels
// packed, as delta streams, one per segment of the piece (delta::NumSegments), with
// delta::PieceCapacity bytes reserved in the send scratch; segment k's stream starts at
// k * delta::SegmentStride of the piece's area and is one run, never cut (the sender sends only
// each stream's actual length: one put, or one data message). With puts the receiver's landing
// area reserves the same capacity; with active messages (chunk_bytes > 0) it reserves nothing,
// each stream being applied from its message (docs/delta.md, "Receivers, fan-out and relays"). The
// sender keeps a shadow of the piece (shadow_offset into its shadow_bytes) and gathers one segment
// at a time into a scratch of gather_bytes before encoding it. A relay (plan::IsRelay) travels the
// same way but has no shadow: it forwards the streams of the piece it received (relay_feed), or
// gathers a segment to send it plain.
//
// Thread-compatible; immutable once built.
#pragma once

#include <cstdint>
#include <vector>

#include "src/plan/dependencies.h"
#include "src/plan/plan.h"

namespace reshard::net {

struct SendProgramOptions {
  bool execute_fanout = true;        // kFanout transfers are executed by the engine.
  int64_t pack_below_run_bytes = 0;  // 0: never pack.
  int64_t chunk_bytes = 0;           // 0: network runs are not cut.
  bool delta = false;                // Delta streams (see above).
  // 0, or the most bytes of any run that is not a delta stream's (network runs, packed streams,
  // local copies): runs are cut there. The engine sets it to its staging ring's slot size when
  // CUDA sources may go through a ring (staged, or strided pieces over a CUDA-aware UCX), so
  // that every run fits one slot
  // (docs/data-plane.md, "The staging ring"). Only the sender's runs change: receivers accept
  // any cut.
  int64_t max_run_bytes = 0;
  // By buffer id (empty: none): sources the engine reads only through its staging ring. Their
  // packed streams (not delta streams) take no room in the send scratch: the ring holds them,
  // so such a descriptor's send_offset is 0 and its runs' local offsets are stream offsets.
  std::vector<bool> ring_sources = {};
  // Put delivery: the runs of plain pieces that a relay forwards (plan::Transfer::feeds_relay),
  // and of relays, are cut every wire::ProgressStep(piece bytes), so that the sender can say
  // how far such a piece landed as it goes (wire::kProgressAm) and the relay forwards it
  // meanwhile, one run after another as the bytes arrive.
  bool progress_steps = false;
};

struct SendRun {
  int64_t local_offset = 0;
  int64_t remote_offset = 0;
  int64_t bytes = 0;
};

struct SendDesc {
  uint32_t transfer = 0;  // Index in plan.transfers().
  uint32_t id = 0;        // World index (plan.transfer_id(transfer)): names the piece on the wire.
  int32_t peer = 0;       // The receiver; this rank for local copies.
  uint32_t from_buffer = 0;
  uint32_t to_buffer = 0;
  int64_t bytes = 0;
  uint32_t run_begin = 0, run_end = 0;  // Into SendProgram::runs.
  bool packed = false;
  int64_t send_offset = 0;     // Packed: the stream's offset in this rank's send scratch.
  // Packed: the stream's offset in this rank's block of the receiver's landing area (-1 for a
  // delta stream to an active-message receiver, or once set-up found that it travels in the
  // receiver's landing rounds: CompactLandingBlock).
  int64_t landing_offset = 0;
  uint32_t slot = 0;  // Local copies: the transfer's slot on the receiving side (received[slot]).
  // Delta streams: the element size compared (1, 2, 4 or 8), the piece's offset in the
  // sender's shadow; 0 and -1 otherwise.
  uint8_t delta_elem_bytes = 0;
  int64_t shadow_offset = -1;
  // Relays (plan::IsRelay): the receiving slot (SendProgram::received) of the piece this relay
  // forwards, which lands here first, in the same region (so its runs follow the same order); a
  // delta relay forwards its streams and has no shadow. -1 for every other transfer.
  int64_t relay_feed = -1;
  // Delta streams: the piece's segments, numbered [segment_begin, segment_begin + segments)
  // among this rank's (SendProgram::segments).
  uint32_t segment_begin = 0;
  uint32_t segments = 0;
};

// Packed streams between one sender and one receiver: `bytes` at `offset` in the receiver's
// landing area.
struct LandingBlock {
  int32_t rank = 0;  // The sender (receiving side) or the receiver (sending side).
  int64_t offset = 0;
  int64_t bytes = 0;
};

struct SendProgram {
  int32_t rank = 0;
  // Grouped by peer (ascending), plan order within a peer.
  std::vector<SendDesc> descs;
  std::vector<SendRun> runs;
  // By rank: descs [peer_begin[r], peer_begin[r + 1]) go to rank r (r == rank: local copies).
  std::vector<uint32_t> peer_begin;
  // Items are indices into descs (the plan's `after`, read once for net and fan-out).
  plan::DependencyIndex dependencies;
  int64_t send_scratch_bytes = 0;
  int64_t shadow_bytes = 0;  // Delta: one copy of every delta piece this rank encodes (no relay).
  int64_t gather_bytes = 0;  // Delta: the largest segment of a delta piece this rank sends.
  uint32_t segments = 0;     // Delta: the segments of every delta piece this rank sends.

  // Sending side: the bytes of packed streams in each receiver's landing area (ascending;
  // offset unused: the receiver places the block).
  std::vector<LandingBlock> packed_to;

  // Receiving side, by slot: the executed transfers landing here, in plan order.
  std::vector<uint32_t> received;            // Index in plan.transfers().
  std::vector<uint32_t> received_ids;        // World index, ascending (plan order).
  // Offset in the landing area, or -1: not packed, a delta stream by active messages, or (after
  // set-up's CompactLandingArea) a packed stream that travels in the landing rounds.
  std::vector<int64_t> landing_offset;
  std::vector<uint8_t> delta_elem_bytes;     // Delta streams: their element size; 0 otherwise.
  std::vector<int64_t> expected_from;        // By rank: pieces per epoch (other ranks only).
  std::vector<LandingBlock> landing_blocks;  // One per sender of packed streams, ascending.
  int64_t landing_bytes = 0;

  // Ranks this rank exchanges network traffic with, ascending.
  std::vector<int32_t> peers;
  bool sends_to(int32_t r) const { return peer_begin[r + 1] > peer_begin[r] && r != rank; }
  bool receives_from(int32_t r) const { return expected_from[r] > 0; }
  // The slot of the transfer with world index `id` among those landing here, or -1. O(log n).
  int64_t Slot(uint32_t id) const;
};

// Whether the engine executes `t` at all.
bool Executes(const plan::Transfer& t, const SendProgramOptions& options);
// Whether `t` travels as a delta stream (options.delta, and plan::DeltaElemBytes: a network
// piece from a source tile, or a relay, into a destination tile or a staging slot, of more than
// delta::kShortestStream bytes); then its element size, else 0.
int DeltaElemBytes(const plan::Plan& plan, const plan::Transfer& t,
                   const SendProgramOptions& options);
// The bytes `t` occupies in the send scratch and the landing area when packed.
int64_t PackedBytes(const plan::Plan& plan, const plan::Transfer& t,
                    const SendProgramOptions& options);
// Whether `t` travels as a packed stream (delta streams always do).
bool IsPacked(const plan::Plan& plan, const plan::Transfer& t, const SendProgramOptions& options);

// `plan` is the world plan or `rank`'s share (plan.rank() == rank).
SendProgram BuildSendProgram(const plan::Plan& plan, int32_t rank,
                             const SendProgramOptions& options);

}  // namespace reshard::net
