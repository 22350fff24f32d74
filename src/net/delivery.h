// Delivery: how the bytes of a descriptor travel to its receiver, chosen once per handle.
//
//  - puts (kPut): each run is a ucp_put_nbx into the receiver's registered buffer (packed
//    streams into its landing area); pieces join a batch, a closed batch is flushed
//    (ucp_ep_flush_nbx) and then signalled with one completion message naming its pieces. The
//    receiver counts signalled pieces.
//  - active messages (kActiveMessage): each run (cut to kAmChunkBytes) is one eager data
//    message that the receiver copies into place and counts byte by byte; nothing is flushed or
//    signalled.
// Both move the same bytes with one copy at the target on Debian's UCX; see
// RefitEngineOptions::delivery for why tcp uses active messages.
//
// Thread-compatible; the hot path (PostRun) neither allocates nor locks.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "src/net/peer_link.h"
#include "src/net/refit_engine.h"
#include "src/net/registered_memory.h"
#include "src/net/send_program.h"

namespace reshard::net {

class Delivery {
 public:
  virtual ~Delivery() = default;
  // "put" or "am".
  virtual const char* name() const = 0;
  // The receiver counts bytes (and lands empty pieces when the epoch starts); senders need no
  // landing area at the receiver and cut runs into chunks.
  virtual bool counts_bytes() const = 0;

  // Posts run `run` of `desc` to `link`, read from link.ring_source when set (the engine's
  // staging ring, tagged with link.ring_slot), else from the descriptor's buffer or the send
  // scratch. `*in_flight`: a request now counts against max_outstanding_puts. Delta pieces
  // (desc.delta_elem_bytes > 0): the run belongs to the segment whose stream is [link.stream_begin,
  // link.stream_end) of the piece's area, and is cut at its end (the caller posts no run past it).
  [[nodiscard]] virtual absl::Status PostRun(PeerLink& link, const SendDesc& desc, uint32_t run,
                                             uint64_t epoch, bool* in_flight) = 0;
  // The runs of a staging ring part (link.ring_source set) are posted: after this no send of
  // `link` reads the part's slot except UCX requests posted with its tag (PeerLink::Put,
  // SendData), whose completions the engine counts (single-copy writes queued are written).
  [[nodiscard]] virtual absl::Status RingPartPosted(PeerLink& link) = 0;
  // Every run of `desc` is posted.
  [[nodiscard]] virtual absl::Status DescPosted(PeerLink& link, const SendDesc& desc) = 0;
  // The runs of `desc` covering the first `bytes` of its region (in region order) are posted,
  // and a relay at the receiver forwards them (plan::Transfer::feeds_relay): put delivery tells
  // the receiver once they are in place (wire::kProgressAm after a flush); active messages say
  // it with every data message already.
  [[nodiscard]] virtual absl::Status Progressed(PeerLink& link, const SendDesc& desc,
                                                int64_t bytes) = 0;
  // `link` has nothing ready to post.
  [[nodiscard]] virtual absl::Status Drained(PeerLink& link) = 0;
  // Sends what became due (completion signals) and retires finished sends from
  // link.unsignalled.
  [[nodiscard]] virtual absl::Status Advance(PeerLink& link, uint64_t epoch) = 0;
};

// RESHARD_DELIVERY=put|am, else `delivery`, else (kAuto) active messages when UCX_TLS names tcp
// and no RDMA transport.
bool UseActiveMessages(RefitEngineOptions::Delivery delivery);

// The program, memory and stats must outlive the delivery.
std::unique_ptr<Delivery> MakeDelivery(bool active_messages, int32_t rank,
                                       const SendProgram& program, RegisteredMemory& memory,
                                       int64_t signal_batch_bytes, RefitStats& stats);

}  // namespace reshard::net
