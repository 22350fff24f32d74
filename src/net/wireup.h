// Wire-up of a refit handle's peer links (Create's last steps).
//
// 1. Connect: every rank publishes ONE record `<prefix>/wireup/<rank>` with its worker address
//    (`address`), its host (`host`, the boot id), pid namespace (`pidns`) and process (`process`,
//    pid:start time), and the remote keys of what peers write into (RegisteredMemory's
//    `key.<id>` / `base.<id>` / `size.<id>` / `host.<id>` fields) and, with put delivery, where
//    each sender's packed streams start in its landing area (`landing.<sender>` =
//    "<offset>:<bytes>", src/net/send_program.h), fetches each peer's, creates the endpoints,
//    unpacks the keys of the peers it sends to, keeps where its own packed streams go in each
//    receiver's landing area (placed by PlaceLandingBlocks once the engine knows which of them
//    travel in the receiver's landing rounds instead), and watches the process of every
//    peer on its own host and in its pid namespace (a lost shared-memory peer is noticed
//    although UCX's shared-memory transports cannot report it; the watched pid is also the one
//    single-copy writes go to).
// 2. Handshake. Why: UCX wire-up is not finished when ucp_ep_create returns. An endpoint's first
//    messages (and, on connect-to-endpoint transports such as tcp, the connection itself) need
//    the peer to progress its worker, and UCX 1.13's shared-memory transports map the peer's
//    segments and exchange wire-up messages through its FIFO. A rank that left Create while
//    peers were still creating endpoints to it, then stopped progressing (blocked on a store
//    barrier, or a trainer computing for seconds), left those peers half wired. So:
//    a. one eager hello message to every peer, waiting (progressing) until every peer's hello
//       arrived here and ours completed: both directions of every endpoint carry traffic;
//    b. rendezvous::Barrier among the peers (`<prefix>/wired`), progressing the worker and
//       checking the endpoints while waiting, so no rank returns before its peers did step a.
// Both are bounded by the deadline; a lost peer fails them with Unavailable (endpoints with peer
// error handling) or DeadlineExceeded, naming the peer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "src/net/peer_link.h"
#include "src/net/registered_memory.h"
#include "src/net/runtime.h"
#include "src/net/send_program.h"
#include "src/rendezvous/store.h"

namespace reshard::net {

// Where `rank`'s packed streams start in `peer`'s landing area, from `peer`'s wire-up record
// (`landing.<rank>` = "OFFSET:BYTES"): DataLoss when the field is missing, malformed, or the
// block does not lie inside the `registered` bytes of the landing area; FailedPrecondition when
// the peer reserved other than the `bytes` this rank packs.
[[nodiscard]] absl::StatusOr<int64_t> LandingBlockOf(const rendezvous::Record& theirs,
                                                     int32_t rank, int32_t peer, int64_t bytes,
                                                     uint64_t registered);

// This rank's stream into `peer`'s landing rounds, from `peer`'s wire-up record (`rounds.<rank>`
// = "OFFSET:QUOTA:TOTAL:SLOTS", src/net/landing_rounds.h; slots above the rounds read as the
// rounds); quota 0 when the record has none. DataLoss
// when the field is malformed or its rounds do not lie inside the `registered` bytes of the
// peer's round area.
[[nodiscard]] absl::StatusOr<RoundSender> RoundStreamOf(const rendezvous::Record& theirs,
                                                        int32_t rank, int32_t peer,
                                                        uint64_t registered);

// `links` is indexed by rank (null for ranks that are not peers); each link's `sends_to` says
// whether its remote keys are needed; the peer's `landing.<rank>` field is kept on the link
// (PeerLink::peer_landing_field) for PlaceLandingBlocks. `landing_blocks`: this rank's landing
// area, published;
// `rounds`: its landing rounds, published (`rounds.<sender>`) with its destination buffers' round
// modes (`direct.<id>` = 1, `strided.<id>` = 1); each sending link reads the peer's into
// peer_rounds and round_to.
// `single_copy`: this rank may write same-host peers with process_vm_writev (published as
// `single_copy`, read into PeerLink::peer_single_copy()).
[[nodiscard]] absl::Status Connect(rendezvous::Store& store, const std::string& prefix,
                                   int32_t rank, Runtime& runtime, const RegisteredMemory& memory,
                                   absl::Span<const LandingBlock> landing_blocks,
                                   const LandingRounds& rounds,
                                   std::vector<std::unique_ptr<PeerLink>>& links, bool single_copy,
                                   absl::Time deadline);

// After Connect, once each sending link's packed_bytes_to is final (the streams that travel in
// the peer's landing rounds left out: CompactLandingBlock): where this rank's block starts in
// each peer's landing area (LandingBlockOf on the field the peer published), for every link
// with packed_bytes_to > 0: FailedPrecondition when the peer reserved a block of another size
// (the ranks disagree on what is packed), DataLoss when the field is missing or malformed.
[[nodiscard]] absl::Status PlaceLandingBlocks(int32_t rank, const RegisteredMemory& memory,
                                              std::vector<std::unique_ptr<PeerLink>>& links);

[[nodiscard]] absl::Status Handshake(rendezvous::Store& store, const std::string& prefix,
                                     int32_t rank, Runtime& runtime,
                                     std::vector<std::unique_ptr<PeerLink>>& links,
                                     absl::Time deadline);

// The ranks of `links` that are peers.
std::vector<int32_t> PeerRanks(const std::vector<std::unique_ptr<PeerLink>>& links);

}  // namespace reshard::net
