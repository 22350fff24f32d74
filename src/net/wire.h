// The refit engine's wire format: active message ids, headers and limits, and the checks every
// incoming message passes before the engine acts on it.
//
// Every message starts with an AmHeader naming the receiving handle (several handles, and in
// tests several ranks, share one worker through net::Runtime). Headers are sent as raw bytes
// between processes of one build: same layout, same endianness.
#pragma once

#include <cstddef>
#include <cstdint>

namespace reshard::net::wire {

// Active message ids.
// destination -> source: "you may write epoch E"; its 8-byte payload is the destination's
// version (the last epoch it completed, 0 after a failure or Reset: docs/delta.md).
constexpr unsigned kGrantAm = 11;
constexpr unsigned kDoneAm = 12;   // source -> destination: "pieces [..] of epoch E landed".
constexpr unsigned kAbortAm = 13;  // any -> peers: "my epoch E failed: <reason>".
constexpr unsigned kDataAm = 14;   // source -> destination: one run of a piece (AM delivery).
constexpr unsigned kHelloAm = 15;  // peer -> peer, once in Create: "my endpoint to you works".
// Landing rounds (src/net/landing_rounds.h), each with an 8-byte payload, the round:
// source -> destination: "my bytes of round R of epoch E are in your round area" (after a flush);
constexpr unsigned kRoundAm = 16;
// destination -> source: "you may write round R of epoch E" (rounds 0 to slots - 1 come with the
// grant).
constexpr unsigned kRoundGrantAm = 17;
// source -> destination (put delivery): "bytes [0, B) of piece P of epoch E, in its region's
// order, are in place" (after a flush), so that a relay of P may forward them before P landed;
// the payload is up to kMaxProgressPerSignal ProgressRecords.
constexpr unsigned kProgressAm = 18;
constexpr uint32_t kMagic = 0x52534844;  // "RSHD"

// Piece indices per completion message, small enough to stay eager on every transport.
constexpr size_t kMaxIndicesPerSignal = 256;
// Put delivery: a piece that some relay forwards (plan::Transfer::feeds_relay) says how far it
// landed (kProgressAm) every ProgressStep(its bytes): this many bytes, as active messages carry
// it in data messages of kAmChunkBytes, or a kProgressSteps-th of a larger piece, so that a
// piece costs at most that many flushes and messages however large it is, and the relay trails
// its feed by a fixed share of it.
constexpr int64_t kProgressStepBytes = int64_t{256} << 10;
constexpr int64_t kProgressSteps = 16;
constexpr int64_t ProgressStep(int64_t piece_bytes) {
  return piece_bytes / kProgressSteps > kProgressStepBytes ? piece_bytes / kProgressSteps
                                                           : kProgressStepBytes;
}
// Largest active message carrying data (AM delivery): long runs are cut into chunks so the
// receiver copies one while the next is on the wire.
constexpr int64_t kAmChunkBytes = int64_t{256} << 10;
// The longest abort reason a receiver keeps (longer ones are cut).
constexpr size_t kMaxAbortReasonBytes = 1024;

struct AmHeader {
  uint32_t magic = kMagic;
  int32_t from_rank = 0;
  uint64_t handle = 0;
  uint64_t epoch = 0;
};

// One entry of a progress message (kProgressAm).
struct ProgressRecord {
  uint32_t transfer = 0;  // World index of the piece.
  uint32_t reserved = 0;
  uint64_t bytes = 0;  // Its region's first `bytes`, in region order, are in place.
};
constexpr size_t kMaxProgressPerSignal = 128;

struct DataHeader {
  AmHeader base;
  uint32_t transfer = 0;
  uint32_t packed = 0;     // 1: to_offset is an offset in the transfer's packed stream.
  uint64_t to_offset = 0;  // Otherwise bytes from the start of the receiving buffer.
  // Delta streams (docs/delta.md): the length of the stream of the segment to_offset falls in
  // (segment k's stream starts at k * delta::SegmentStride), the same in each of that segment's
  // messages (the receiver applies the segment once that many bytes arrived); 0 for every other
  // transfer.
  uint64_t stream_bytes = 0;
};

// Every message is acted on only when it passes, in this order: the header is ours (magic) and
// names a live handle (Runtime::Dispatch); the sender rank is in the world and a peer of the
// receiving rank, and the message arrived on the endpoint of that peer (UCX's reply endpoint:
// messages are sent with UCP_AM_SEND_FLAG_REPLY), so another process that learnt a rank's
// address cannot speak for a rank; then per message: transfer ids the plan sends from that
// sender to this rank, a message kind of this rank's delivery (completion signals for puts, data
// messages for active messages), offsets and lengths inside the transfer (InBounds: its packed
// stream, with the packed flag the plan gives it, or one run of its region in the registered
// buffer), at most kMaxIndicesPerSignal indices per signal, 1 to kMaxProgressPerSignal records per
// progress message, each for a transfer the plan sends from that sender to this rank and at
// most its region's bytes. A message failing the origin
// check is dropped (and logged once); one from the right peer that fails a later check fails
// the epoch as a protocol error (DataLoss).

// [offset, offset + length) lies inside [0, size), written so that nothing wraps.
constexpr bool InBounds(uint64_t offset, uint64_t length, uint64_t size) {
  return length <= size && offset <= size - length;
}

// A header that is ours (magic) and addressed to a rank of a world of `world_size`.
inline bool WellFormed(const AmHeader& h, int32_t world_size) {
  return h.magic == kMagic && h.from_rank >= 0 && h.from_rank < world_size;
}

}  // namespace reshard::net::wire
