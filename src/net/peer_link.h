// PeerLink: everything one refit handle keeps about one peer rank - the endpoint, the peer's
// remote keys, its grants and aborts, this epoch's ready queue and cursor, and the batches of
// pieces awaiting their flush and completion signal.
//
// Request ownership: the link owns every UCX request it posts. Each request points only at
// memory of the link (its completions, headers, batches, abort messages), and the link counts
// them (in_flight()). Batches and abort messages live until their requests complete; Close()
// closes the endpoint (force-closing it when asked, which cancels what is in flight) and
// progresses the worker until in_flight() is 0 or the deadline, and a link whose requests are
// still in flight after that must not be destroyed (the engine then keeps it alive).
//
// Thread-compatible: the worker's thread; completions run inside Worker::Progress.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "src/common/process.h"
#include "src/common/shared_memory.h"
#include "src/common/single_copy.h"
#include "src/net/landing_rounds.h"
#include "src/net/ucx/endpoint.h"
#include "src/net/ucx/memory.h"
#include "src/net/ucx/ops.h"
#include "src/net/ucx/worker.h"
#include "src/net/wire.h"
#include "src/rendezvous/record.h"

namespace reshard::net {

// The engine, as seen from its links' completions (inside UCX callbacks: record only).
class LinkOwner {
 public:
  virtual void OnSendError(absl::Status status) = 0;
  // A put or data message of any link completed; `ring_slot`: the staging ring slot it read
  // (the tag it was posted with), or -1.
  virtual void OnPutCompleted(int ring_slot) = 0;

 protected:
  ~LinkOwner() = default;
};

class PeerLink {
 public:
  class Done;
  struct Batch;

  // `peer_handle`: the handle id messages to the peer carry.
  PeerLink(int32_t rank, int32_t peer, uint64_t peer_handle, ucx::Worker& worker, LinkOwner& owner);
  ~PeerLink();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  [[nodiscard]] absl::Status Connect(const std::string& address, bool peer_error_handling);
  // Unpacks the `key.<id>` / `base.<id>` / `size.<id>` / `host.<id>` fields of the peer's
  // record for ids [0, ids). DataLoss for a malformed field or a region that wraps the address
  // space.
  [[nodiscard]] absl::Status LoadRemoteKeys(const rendezvous::Record& record, uint32_t ids);
  ucp_rkey_h rkey(uint32_t id) const { return rkeys_[id] ? rkeys_[id]->get() : nullptr; }
  uint64_t remote_base(uint32_t id) const { return remote_base_[id]; }
  // Bytes the peer registered at remote_base(id); writes must stay inside.
  uint64_t remote_bytes(uint32_t id) const { return remote_bytes_[id]; }
  // The peer registered host memory at remote_base(id) (writable with process_vm_writev).
  bool remote_host(uint32_t id) const { return remote_host_[id]; }
  // Where this rank's packed streams start in the peer's landing area (the peer places the
  // blocks of its senders and publishes them; src/net/send_program.h).
  int64_t landing_block() const { return landing_block_; }
  void set_landing_block(int64_t offset) { landing_block_ = offset; }
  // Whether a message that arrived on `from` (UCX's reply endpoint) came over this link's
  // endpoint, i.e. from the peer's process and not from another process using its rank.
  bool SentBy(ucp_ep_h from) const;
  // The endpoint to the peer (null before Connect and after Close): the one its messages
  // arrive on.
  ucp_ep_h endpoint() const { return endpoint_ != nullptr ? endpoint_->get() : nullptr; }
  bool connected() const { return endpoint_ != nullptr; }
  // A hello that arrived before Connect: accepted by Connect if it came over the endpoint that
  // Connect then creates (UCX matches both directions of a connection to one endpoint).
  void HelloBeforeConnect(ucp_ep_h from) { early_hello_from_ = from; }

  int32_t peer() const { return peer_; }
  // OK while the peer is healthy (see ucx::Endpoint::error()).
  const absl::Status& error() const { return endpoint_->error(); }
  // OK, or Unavailable when the peer aborted an epoch, its endpoint failed or its watched
  // process exited (messages name `rank`, `epoch` and the peer). Allocates only on error.
  [[nodiscard]] absl::Status Health(int32_t rank, uint64_t epoch) const;
  // Same-host peers: watch the peer's process, so its death is noticed even on transports
  // without peer error handling (shared memory). CheckProcess() reads /proc once; the engine
  // calls it at most every few milliseconds.
  void WatchProcess(const ProcessId& process) {
    process_ = process;
    watched_ = true;
  }
  void CheckProcess() { process_gone_ = process_gone_ || (watched_ && !ProcessAlive(process_)); }
  // Whether the last CheckProcess found the watched process gone, and its pid.
  bool process_gone() const { return process_gone_; }
  int64_t watched_pid() const { return process_.pid; }
  bool watched() const { return watched_; }
  // Same-host peers in host memory: put delivery writes with process_vm_writev through this
  // writer instead of UCX puts (src/common/single_copy.h); null when not enabled.
  void EnableSingleCopy() {
    single_copy_ = std::make_unique<SingleCopyWriter>(rank_, peer_, process_.pid);
  }
  SingleCopyWriter* single_copy() const { return single_copy_.get(); }
  // Same-host peers whose registered host regions lie in shared memory (a HostBuffer; the
  // record's shm.<id>): maps each into this process, so put delivery copies runs into it with
  // memcpy, one copy and no system call (src/common/shared_memory.h). Needs no ptrace access,
  // unlike the writer above. `pidns` is this process's pid namespace, shared with the watched
  // peer. Returns how many regions were mapped. DataLoss for a descriptor that is malformed,
  // names an object the peer's process did not create, or does not hold the registered region;
  // an object that cannot be opened (another /dev/shm) is logged and left to the other paths.
  [[nodiscard]] absl::StatusOr<int> MapSharedRegions(uint64_t pidns);
  // The peer's registered region `id` in this process (null when not mapped).
  uint8_t* mapped(uint32_t id) const { return id < mapped_.size() ? mapped_[id] : nullptr; }
  bool has_mapped() const { return !mappings_.empty(); }
  // Where the peer's probe token lives and its value (its wire-up record; same-host peers).
  void set_probe(uint64_t address, uint64_t token) {
    probe_address_ = address;
    probe_token_ = token;
  }
  uint64_t probe_address() const { return probe_address_; }
  uint64_t probe_token() const { return probe_token_; }
  // The peer may write into this rank with process_vm_writev (its wire-up record says so).
  void set_peer_single_copy(bool on) { peer_single_copy_ = on; }
  bool peer_single_copy() const { return peer_single_copy_; }
  // The current epoch still exchanges something with the peer.
  bool involved() const { return remaining_from > 0 || unsignalled > 0 || grants_in_flight_ > 0; }
  // What the current epoch still waits for from or towards the peer, for deadline messages
  // ("3 piece(s) from rank 2, 1 piece(s) to rank 2 (no grant for epoch 7 yet)"); "" when none.
  std::string Pending(uint64_t epoch) const;
  std::string Transports() const;

  // Control messages. Errors are those of posting; completions are tracked here.
  [[nodiscard]] absl::Status SendHello();
  bool hello_pending() const { return hello_pending_; }
  const absl::Status& hello_status() const { return hello_status_; }
  // `version`: this rank's version, the payload delta senders check (docs/delta.md).
  [[nodiscard]] absl::Status SendGrant(uint64_t epoch, uint64_t version);
  int grants_in_flight() const { return grants_in_flight_; }
  // Landing rounds (src/net/landing_rounds.h): "you may write round `round` of `epoch`".
  [[nodiscard]] absl::Status SendRoundGrant(uint64_t epoch, int64_t round);
  // Best effort; the message lives until its send completes.
  void SendAbort(uint64_t epoch, const std::string& reason);

  // Data. `run` indexes the send program's runs (data messages keep one header per run).
  // `ring_slot` (-1, or below kMaxRingSlots): the staging ring slot the send reads, handed back
  // to LinkOwner::OnPutCompleted when it completes.
  static constexpr int kMaxRingSlots = 8;
  [[nodiscard]] absl::Status Put(const void* local, size_t bytes, uint64_t remote, ucp_rkey_h rkey,
                                 ucp_mem_h memh, bool* in_flight, int ring_slot = -1);
  void ReserveDataHeaders(uint32_t run_begin, uint32_t run_end);
  [[nodiscard]] absl::Status SendData(uint32_t run, const wire::DataHeader& header,
                                      const void* data, size_t bytes, ucp_mem_h memh,
                                      bool* in_flight, int ring_slot = -1);

  // Put delivery: pieces whose puts are posted join the open batch; a closed batch is flushed
  // (unless only single-copy writes, complete already, went out since the last flush), then
  // (SignalBatches) signalled in messages of at most kMaxIndicesPerSignal indices.
  // Returns the pieces whose signals completed, and the landing rounds (CloseRound), to be
  // subtracted from `unsignalled`.
  // Pieces are named by world transfer index (src/net/send_program.h).
  void AddToBatch(uint32_t id, int64_t bytes);
  // The open batch's signal also says that the first `bytes` of piece `id` (in its region's
  // order) are in place (wire::kProgressAm, after the same flush).
  void AddProgressToBatch(uint32_t id, int64_t bytes);
  // Progress added to batches whose signals are not posted yet (a signal posted after its
  // flush leaves behind every put posted before it, so the engine posts a progress piece at most
  // one step past its last unsignalled progress: docs/data-plane.md, "Relays").
  int64_t progress_unsignalled() const { return progress_added_ - progress_signalled_; }
  bool batch_open() const { return open_ != nullptr; }
  int64_t open_batch_bytes() const;
  [[nodiscard]] absl::Status CloseBatch();
  // Landing rounds: closes the open batch (an empty one when none is open) and flushes the
  // endpoint whatever was posted since the last flush (a run of the round may be in a batch
  // whose flush is still in flight), then says, after the batch's signal, that round `round`
  // of the epoch is in the peer's round area (wire::kRoundAm).
  [[nodiscard]] absl::Status CloseRound(int64_t round);
  [[nodiscard]] absl::Status SignalBatches(uint64_t epoch, int64_t* signals, int64_t* retired);
  // Reset: batches of the failed epoch are never signalled nor counted.
  void AbandonBatches();

  int in_flight() const { return in_flight_; }
  // For a link that must outlive its engine because UCX still holds requests of it (a peer that
  // never answers even a forced close): later completions reach a no-op owner instead of the
  // freed engine. The link's own memory (headers, batches) stays valid because it is leaked.
  void Orphan();
  // Releases the remote keys, closes the endpoint and waits (progressing) for every request of
  // this link until `deadline`. Idempotent.
  void Close(absl::Time deadline, bool force);

  // Role in the plan (set once by the engine).
  bool sends_to = false;          // This rank sends into the peer.
  bool receives_from = false;     // The peer sends into this rank (this rank grants it).
  int64_t expected_from = 0;      // Pieces per epoch from the peer.
  // Put delivery: bytes of this rank's packed streams in the peer's landing area, and the
  // `landing.<rank>` field of the peer's wire-up record (PlaceLandingBlocks reads it).
  int64_t packed_bytes_to = 0;
  std::string peer_landing_field;
  bool has_peer_landing_field = false;
  std::vector<uint32_t> initial;  // Descs without dependencies, in plan order.
  // Grants and aborts received.
  uint64_t granted = 0;  // Latest epoch the peer granted this rank.
  uint64_t granted_version = 0;  // The peer's version in that grant (docs/delta.md).
  bool aborted = false;
  uint64_t aborted_epoch = 0;  // The latest epoch the peer aborted (with `aborted`).
  std::string abort_reason;
  bool hello_received = false;
  // This epoch.
  bool started = false;        // Granted, initial sends queued.
  std::deque<uint32_t> ready;  // Descs whose dependencies landed.
  int64_t cursor_desc = -1;    // Desc being posted, and its next run.
  uint32_t cursor_run = 0;
  // A packed desc's stream is in the send scratch (gathered once, however many passes its
  // posting takes while it waits for round grants).
  bool gathered = false;
  // Where the next run starts in the region's order (the runs of an unpacked piece follow it):
  // a relay started before its feed landed posts a run once the feed's bytes up to its end are
  // here (Landing::LandedPrefix).
  int64_t region_pos = 0;
  // Put delivery (RefitEngine's sends_progress_): where the piece next says how far it got.
  int64_t progress_next = 0;
  // Delta pieces (docs/delta.md): the run whose segment was encoded last (-1: none in this
  // epoch), that segment's stream as [stream_begin, stream_end) of the piece's area, and what
  // the piece's segments were so far (RefitEngine's flags).
  int64_t encoded_run = -1;
  int64_t stream_begin = 0, stream_end = 0;
  uint8_t piece_streams = 0;
  // Descriptors read from the staging ring (docs/data-plane.md): the part being posted (an index
  // of the engine's, -1: none), and, once its batch is packed, where the next run's bytes are in
  // the ring and its slot (null and -1 otherwise).
  int64_t ring_part = -1;
  const uint8_t* ring_source = nullptr;
  int ring_slot = -1;
  // Landing rounds towards the peer (src/net/landing_rounds.h), from its wire-up record: its
  // destination buffers' round modes (by id; a direct one, kAll, has no key) and this rank's stream
  // into its round area (quota 0: none). This epoch: the highest round the peer granted, the
  // next stream byte to post and the bytes of the current run posted (runs are cut at round
  // ends); and the chunk the engine has PostRun put next: `round_bytes` bytes from `round_skip`
  // into the run, at `round_remote` in the peer's round area (round_bytes 0: a whole run, not a
  // round chunk).
  std::vector<RoundMode> peer_rounds;
  RoundSender round_to;
  int64_t round_granted = 1;
  int64_t round_pos = 0;
  int64_t run_posted = 0;
  int64_t round_skip = 0, round_bytes = 0;
  // Bytes of the next runs already posted with this run's chunk (a ring part's runs are
  // consecutive in its slot, so one put carries them up to the part's or the round's end).
  int64_t round_ahead = 0;
  uint64_t round_remote = 0;
  // Relays set aside while their feed's next bytes are not in place (docs/data-plane.md,
  // "Relays"), with where they stood: the link goes on with its other pieces meanwhile, so no
  // link waits behind a relay whose feed comes over links that wait behind it (relay chains
  // through the same ranks in both directions would otherwise deadlock). `mark`: how far the
  // feed had come (RefitEngine's FeedMark); one resumes once it came further.
  struct Parked {
    uint32_t desc = 0;
    uint32_t cursor_run = 0;
    int64_t region_pos = 0;
    int64_t progress_next = 0;
    int64_t encoded_run = -1;
    int64_t stream_begin = 0, stream_end = 0;
    uint8_t piece_streams = 0;
    int64_t mark = 0;
  };
  std::vector<Parked> parked;  // Reserved at set-up for every relay to the peer.
  int64_t unsignalled = 0;     // Sends of this epoch not yet remotely complete and signalled.
  int64_t remaining_from = 0;  // Pieces of this epoch not yet landed from the peer.

 private:
  friend class Done;
  void Completed(int kind, Batch* batch, ucs_status_t status, int ring_slot = -1);
  absl::Status Posted(ucs_status_t status, const char* call, bool* in_flight);

  const int32_t rank_;
  const int32_t peer_;
  ProcessId process_;
  bool watched_ = false;
  bool process_gone_ = false;
  const uint64_t peer_handle_;
  ucx::Worker& worker_;
  LinkOwner* owner_;  // Never null; a no-op owner once orphaned.
  // Declared before the keys: keys are released first.
  std::unique_ptr<ucx::Endpoint> endpoint_;
  std::vector<std::unique_ptr<ucx::RemoteKey>> rkeys_;  // By buffer id; null when unused.
  std::vector<uint64_t> remote_base_;
  std::vector<uint64_t> remote_bytes_;
  std::vector<bool> remote_host_;
  int64_t landing_block_ = 0;
  std::unique_ptr<SingleCopyWriter> single_copy_;
  std::vector<std::string> remote_shm_;  // By id: the record's shm.<id>, or "".
  std::vector<SharedMapping> mappings_;
  std::vector<uint8_t*> mapped_;         // By id: the region in mappings_, or null.
  bool peer_single_copy_ = false;
  uint64_t probe_address_ = 0, probe_token_ = 0;
  int64_t puts_since_flush_ = 0;  // UCX puts posted since the last CloseBatch flushed.
  int64_t progress_added_ = 0, progress_signalled_ = 0;  // Progress records.
  int in_flight_ = 0;
  ucp_ep_h early_hello_from_ = nullptr;

  std::unique_ptr<Done> put_done_, data_done_, grant_done_, hello_done_, abort_done_;
  // By staging ring slot: the completions of puts and data messages reading it.
  std::unique_ptr<Done> ring_put_done_[kMaxRingSlots], ring_data_done_[kMaxRingSlots];
  wire::AmHeader hello_header_, grant_header_;
  uint64_t grant_version_ = 0;  // The grant's payload.
  bool hello_pending_ = false;
  absl::Status hello_status_;
  int grants_in_flight_ = 0;
  struct AbortMessage {
    wire::AmHeader header;
    std::string reason;
  };
  // Sends are not awaited: kept until none is in flight (the next SendAbort then drops them).
  std::deque<AbortMessage> aborts_;
  struct RoundGrant {
    wire::AmHeader header;
    uint64_t round;
  };
  // Round grants in flight (counted in grants_in_flight_), dropped once none is.
  std::deque<RoundGrant> round_grants_;
  int aborts_in_flight_ = 0;
  uint32_t run_base_ = 0;
  std::vector<wire::DataHeader> data_headers_;  // By run - run_base_.
  std::list<std::unique_ptr<Batch>> batches_;
  Batch* open_ = nullptr;
};

// The transports UCX selected towards `links`, each named once, space-separated ("tcp/lo").
std::string TransportsOf(const std::vector<PeerLink*>& links);

}  // namespace reshard::net
