// The refit engine: a persistent handle that executes the network stage of a plan with UCX
// one-sided puts, once per training step (DESIGN §4).
//
// Set-up (Create, once per handle). The plan is assumed agreed: the refit session compares
// plan fingerprints across ranks (rendezvous::CheckAgreement) before building the engine.
//   1. the send program is built from the plan (send_program.h): per peer, every contiguous run
//      as (local offset, remote offset, bytes) relative to buffer ids;
//   2. each local buffer is registered once (ucp_mem_map of the caller's memory);
//   3. worker addresses and packed remote keys of destination buffers are exchanged once through
//      the store, as one record per rank; endpoints are created to the peers the plan connects
//      this rank with (wireup.h);
//   4. wire-up completion: every rank sends one small active message to each peer and waits for
//      each peer's, then waits (rendezvous::Barrier under `<key_prefix>/wired`) until each peer
//      got that far, progressing its worker throughout. Create therefore never returns while a
//      peer may still need this rank's worker to finish connecting, and the caller may block or
//      compute for as long as it likes between Create and the first Start.
// Refits 2..N register nothing, unpack nothing, and touch the store not at all.
//
// One epoch (Start/Progress/Wait):
//   - a destination enters the epoch and grants it to each of its sources with a small active
//     message (no source writes into a buffer that is still in use);
//   - a source, once granted, puts each region straight into the receiver's buffer (one put per
//     contiguous run), keeping at most `max_outstanding_puts` in flight, and after the data of a
//     batch of pieces is remotely complete (ucp_ep_flush_nbx) sends one completion signal carrying
//     the epoch and the indices of those pieces;
//   - the receiver progresses its worker and counts the pieces of THIS epoch; local transfers
//     are memcpy; transfers with `after` >= 0 (relays, engine-run fan-out) start once that
//     transfer landed here.
// Pieces are named between ranks (signals, data messages, Progress, `after`) by their index in
// the world plan, so the engine runs on one rank's share of the plan (BuildRankPlan) exactly as on
// the world plan, with every table sized by what the rank sends and receives.
// Every wait is bounded by a deadline. A lost peer becomes Unavailable (peer error handling,
// or an abort signal from a rank whose refit failed) or DeadlineExceeded on every rank; the
// handle then records the failed epoch and refuses further epochs (FailedPrecondition) until
// Reset().
//
// Fan-out hook: Progress() reports which transfers landed on this rank, so an intra-domain
// fan-out layer can forward them as they arrive. With `execute_fanout` set the engine executes
// kFanout transfers itself, as network puts from the receiver's destination buffer; the refit
// session (src/api/refit_session.h) clears it whenever the fan-out layer runs them
// (HandleOptions::fanout = kAuto, the default of the public API).
//
// Memory kinds: host memory is registered directly. CUDA memory is registered directly when the
// UCX context reports CUDA memory support; otherwise (Debian's UCX) it is staged (only in builds
// with CUDA; FailedPrecondition otherwise): a source's pieces are packed by the GPU into the
// staging ring (RefitEngineOptions::stage_ring_bytes) as the engine posts them; a destination
// is written by the engine's copies from its landing areas: with put delivery, its plain pieces
// land in bounded landing rounds (RefitEngineOptions::stage_landing_bytes), packed streams in
// the landing area, and with active messages each message is copied in as it arrives. (With
// a CUDA-aware UCX, strided plain pieces between registered CUDA buffers also go through a
// staging ring and landing rounds, both in device memory: docs/data-plane.md, "Registered
// device memory".) Only a
// destination that delta streams land in, or that this rank sends from, keeps a full-size pinned
// host copy (the host applies deltas to it and reads it), which landed pieces are copied from.
//
// Thread safety: thread-compatible. All calls on one handle come from one thread, which drives
// the handle's net::Runtime (its UCX worker, see src/net/ucx/worker.h) and every other handle on
// that runtime. Start and Progress never block or yield; Wait, Execute, Create and Shutdown block
// until done or their deadline, idling by the one IdlePolicy (src/common/idle.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/common/idle.h"
#include "src/common/memory.h"
#include "src/plan/plan.h"
#include "src/rendezvous/store.h"

struct ucp_ep;  // <ucp/api/ucp.h>: ucp_ep_h is ucp_ep*.

namespace reshard::net {

using common::BufferView;
using common::MemoryKind;

class Runtime;  // src/net/runtime.h

struct RefitEngineOptions {
  // Namespace of this handle's store keys; every rank of one handle must use the same prefix
  // and two live handles must not.
  std::string key_prefix = "reshard/refit";
  // Deadline for Create (store exchange, endpoint creation, wire-up).
  absl::Duration setup_timeout = absl::Seconds(30);
  // Puts in flight per engine before posting waits for completions.
  int max_outstanding_puts = 1024;
  // Pieces to one receiver are flushed and signalled in batches of at least this many bytes
  // (0: one signal per piece). A piece is never split across batches.
  int64_t signal_batch_bytes = int64_t{4} << 20;
  // Strided regions whose contiguous runs are shorter than this are packed: the source copies
  // the runs into one registered buffer, moves them with one put (or a few active messages),
  // and the receiver unpacks them, instead of one put per short run. 0: never pack. Must be
  // the same on every rank. (Per-put cost dominates below a few KiB: 32768 runs of 512 B take
  // tens of ms as separate puts on shared memory.)
  int64_t pack_below_run_bytes = 8192;
  // Execute kFanout transfers as network puts. The refit session clears it when the fan-out
  // layer (src/nvlink) runs them; every rank of a handle must agree (it is part of the agreed
  // value the session compares first).
  bool execute_fanout = true;
  // How bytes travel. kPut: ucp_put_nbx into the registered remote buffer, ep flush, then a
  // completion signal. kActiveMessage: each run travels as an eager active message that the
  // receiver copies into place and counts (no flush, no signal). kAuto picks kActiveMessage
  // when UCX_TLS names tcp and no RDMA transport, kPut otherwise (override: RESHARD_DELIVERY=
  // put|am). Why: UCX 1.13 emulates RMA over tcp with active messages, and its target-side
  // acknowledgement aborts the whole process (ucs_fatal in ucp_put_handler) when the origin dies
  // mid-put, so a lost peer would kill its receivers instead of failing their refit; the
  // active-message path moves the same bytes with the same single copy at the target.
  enum class Delivery : uint8_t { kAuto, kPut, kActiveMessage };
  Delivery delivery = Delivery::kAuto;
  // Put delivery to a peer that UCX reaches over shared memory (same host, same pid namespace)
  // writes host-memory runs with process_vm_writev, up to 1024 runs per system call, instead of
  // UCX puts: one copy, where UCX 1.13's shared-memory puts copy twice (src/common/single_copy.h).
  // A peer the kernel does not let this process write into (ptrace rules, seccomp) gets UCX
  // puts, with a warning naming the reason. Override: RESHARD_SINGLE_COPY=0|1.
  bool single_copy = true;
  // With single_copy: a peer's registered regions that lie in shared memory (HostBuffer
  // destinations, landing areas) are mapped into this process and written with memcpy: one
  // copy at memory speed, no system call, no ptrace access needed. Off: process_vm_writev for
  // those too. Override: RESHARD_MAP_SHARED=0|1.
  bool map_shared_memory = true;
  // Delta refits (docs/delta.md): network pieces from source tiles travel as encodings of the
  // elements that changed since this rank last sent them, against a shadow of each piece (in
  // device memory, encoded by the CUDA kernels, for CUDA sources), whenever the receiver holds
  // exactly that version (otherwise, and when the encoding is not smaller, the plain piece);
  // relays forward the streams they received (to a receiver at another version, the plain
  // piece). Streams into device memory are applied by the CUDA kernels, or into a staged buffer's
  // host copy. Destination elements must keep the last refit's values between refits. Every rank of
  // a handle must agree (the landing areas differ).
  bool delta = false;
  // Pinned host memory per rank for the staging ring of CUDA sources UCX cannot register
  // (docs/data-plane.md, "The staging ring"): the GPU packs the pieces such a source sends into
  // the ring's eight slots (cuda::kStageRingSlots), batch by batch in posting order, and puts
  // read the slots; no full-size host copy of the source exists. Every run is cut at the slot
  // size (an eighth of this). At least 2048 (eight slots of 256 bytes): InvalidArgument
  // otherwise.
  int64_t stage_ring_bytes = int64_t{256} << 20;
  // Pinned host memory per rank for the landing rounds of CUDA destinations UCX cannot register
  // (docs/data-plane.md, "Destinations"; src/net/landing_rounds.h): with put delivery, the
  // pieces other ranks put into such a destination land in a round area of at most this many
  // bytes, in rounds of at most stage_round_bytes, and move to the device from there round by
  // round; no full-size host copy of the destination exists. Only the receiver uses it (ranks
  // need not agree). At least kMinRoundQuota (4096): InvalidArgument otherwise;
  // FailedPrecondition when too small for two rounds of 4096 bytes per sender.
  int64_t stage_landing_bytes = int64_t{256} << 20;
  // The largest landing round (src/net/landing_rounds.h), for staged and registered
  // destinations alike: a sender's stream is copied out of the round area round by round while
  // its next rounds land, so only its last round's copy follows its last byte. Smaller rounds
  // overlap more and cost a signal, a flush and a scatter launch each. Only the receiver uses
  // it; at least kMinRoundQuota (InvalidArgument otherwise).
  int64_t stage_round_bytes = int64_t{8} << 20;  // landing_rounds.h's kDefaultRoundBytes
  // How a landing round moves from the round area into the destinations: one launch of the
  // scatter kernel per round (the default wherever the kernels are built), or, false, the copy
  // engines with one 2-D copy per slab. For measurements (put_bench --cuda times both): the
  // kernel reads a pinned area over PCIe through its mapping, which short runs need and long
  // runs may not.
  bool scatter_rounds_by_kernel = true;
};

// Figures of the last epoch on this rank.
struct RefitStats {
  uint64_t epoch = 0;
  int64_t bytes_network_sent = 0;      // Put by this rank (network and engine-run fan-out).
  int64_t bytes_network_received = 0;  // Landed here from other ranks.
  int64_t bytes_local = 0;             // Copied within this rank.
  int64_t pieces_received = 0;         // Transfers landed here, local ones included.
  int64_t puts = 0;                    // ucp_put_nbx calls.
  int64_t single_copy_writes = 0;      // process_vm_writev calls (same-host peers).
  int64_t mapped_copies = 0;           // Runs copied into a mapped same-host HostBuffer.
  int64_t data_messages = 0;           // Data active messages posted (delivery kActiveMessage).
  int64_t data_messages_received = 0;  // Data active messages that landed here.
  int64_t signals = 0;                 // Completion signals sent.
  double seconds = 0;                  // Start to the end of Wait.
  // Delta refits (RefitEngineOptions::delta), sending side: pieces sent as deltas and as plain
  // pieces, the latter by reason (no base: first refit, or after a failure or Reset; the
  // receiver holds another version; the delta was not smaller; a relay forwarding a plain
  // stream counts its sender's reason), the bytes of their streams
  // (in bytes_network_sent) against the pieces' own bytes, and the shadow this rank keeps (host
  // and device memory together; the device part, and the pinned host memory of the GPU encode
  // pipeline, separately: docs/delta.md).
  int64_t delta_pieces = 0;
  int64_t delta_full_no_base = 0;
  int64_t delta_full_receiver_version = 0;
  int64_t delta_full_not_smaller = 0;
  int64_t delta_stream_bytes = 0;
  int64_t delta_plain_bytes = 0;
  int64_t delta_shadow_bytes = 0;
  int64_t delta_device_shadow_bytes = 0;  // Part of delta_shadow_bytes.
  int64_t delta_pinned_bytes = 0;
  // Receiving side: delta streams applied as deltas.
  int64_t deltas_applied = 0;
  // CUDA memory: this rank's CUDA buffers registered with UCX directly and staged through pinned
  // host copies (set-up), and this epoch's staging copies (sources device -> host, landed
  // pieces host -> device).
  int64_t cuda_buffers_registered = 0;
  int64_t cuda_buffers_staged = 0;
  int64_t bytes_staged_to_host = 0;
  int64_t bytes_staged_to_device = 0;
  // The staging ring (RefitEngineOptions::stage_ring_bytes): its bytes, pinned or (CUDA-aware
  // UCX) device memory, at most what its batches need (0 without a ring), the pack launches of
  // this epoch (one per batch) and the bytes they packed (part of bytes_staged_to_host for a
  // pinned ring).
  int64_t stage_ring_bytes = 0;
  int64_t stage_ring_batches = 0;
  // Pinned host copies of staged CUDA buffers (destinations that delta streams or relays need
  // on the host; sources outside the ring), full size.
  int64_t stage_copy_bytes = 0;
  // The landing rounds' area, pinned or (CUDA-aware UCX) device memory
  // (RefitEngineOptions::stage_landing_bytes; 0 without round pieces), and the rounds drained
  // from it this epoch.
  int64_t stage_landing_bytes = 0;
  int64_t stage_landing_rounds = 0;
  int64_t bytes_ring_packed = 0;
  // Landing rounds (a pinned area read through its mapping, or a device round area with a
  // CUDA-aware UCX) scattered by one pack-kernel launch each (without the kernels: one copy
  // per slab); and local pieces copied between device buffers by one
  // strided-copy launch each (the others: one copy per run).
  int64_t stage_round_scatters = 0;
  int64_t local_copy_launches = 0;
  // Local pieces with device memory on one side (or both, without the kernels) copied slab by
  // slab on the copy queue.
  int64_t local_slab_copies = 0;
  // Active-message delivery into device memory the engine writes (direct or registered
  // destinations): the pinned bounce area's bytes (0 without one), the data messages moved
  // through it to the device on the copy queue this epoch, and how many of them waited for a
  // slot whose copies were still running (data_messages_received counts all of them).
  int64_t stage_bounce_bytes = 0;
  int64_t bounced_data_messages = 0;
  int64_t bounce_waits = 0;
  // Host memory the handle holds for streams, sized at set-up: the landing area that packed
  // streams, and with puts delta streams, land in (0 with active messages), and the send
  // scratch packed and delta streams leave from (docs/delta.md, "What it costs").
  int64_t landing_area_bytes = 0;
  int64_t send_scratch_bytes = 0;
  // Active messages: segments this rank's delta relays forwarded before their feed had landed
  // (a relay starts with its feed's first segment; docs/delta.md).
  int64_t delta_relay_early_segments = 0;
  // Bytes this rank's plain relays forwarded before their feed had landed (a relay starts with
  // its feed's first data message, or with puts its first progress message, and forwards each
  // run once its bytes are here; docs/data-plane.md, "Relays").
  int64_t relay_early_bytes = 0;
};

class RefitEngine {
 public:
  // Builds the handle for `rank` on `runtime` (see the set-up steps above). `plan` is `rank`'s
  // share of the plan (plan::BuildRankPlan, what the refit session passes) or the world plan
  // (plan::BuildPlan): the engine keeps only what `rank` sends and receives, sized by that, and
  // names pieces between ranks by their world index (plan.transfer_id()), so ranks holding
  // shares and ranks holding the world plan interoperate. The engine keeps `plan` alive (the
  // reference overload copies it). `buffers` has one entry per plan buffer id, each at least
  // plan.BufferBytes(rank)[id] bytes. Errors: InvalidArgument for bad buffers, rank, another
  // rank's share, a null plan or runtime, AlreadyExists when a handle with the same key prefix
  // and rank lives on `runtime`, FailedPrecondition for an unsupported memory kind or peers
  // that pack differently, DeadlineExceeded/Unavailable when peers or the store do not answer
  // before setup_timeout.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RefitEngine>> Create(
      std::shared_ptr<const plan::Plan> plan, int32_t rank, rendezvous::Store& store,
      std::shared_ptr<Runtime> runtime, std::vector<BufferView> buffers,
      const RefitEngineOptions& options = {});
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RefitEngine>> Create(
      const plan::Plan& plan, int32_t rank, rendezvous::Store& store,
      std::shared_ptr<Runtime> runtime, std::vector<BufferView> buffers,
      const RefitEngineOptions& options = {});

  ~RefitEngine();
  RefitEngine(const RefitEngine&) = delete;
  RefitEngine& operator=(const RefitEngine&) = delete;

  // Enters `epoch` (> every earlier epoch) without blocking: grants the epoch to this rank's
  // sources, posts the puts already granted and runs the local copies. Source buffers must hold
  // this epoch's data and destination buffers must be free to overwrite. Errors:
  // FailedPrecondition when an epoch is in flight, a previous epoch failed (until Reset), or
  // `epoch` does not increase.
  [[nodiscard]] absl::Status Start(uint64_t epoch);

  // Advances the epoch without blocking and appends to `landed` the world indices
  // (plan.transfer_id(), what Transfer::after names) of the transfers that landed on this rank
  // since the previous call: network transfers, engine-run fan-outs and local copies. Returns the
  // epoch's error if it failed.
  // `progressed` (when given) tells whether the round did anything; Progress never waits or
  // yields, so a caller driving its own loop (the refit session) applies its IdlePolicy.
  [[nodiscard]] absl::Status Progress(std::vector<uint32_t>* landed, bool* progressed = nullptr);

  // Blocks until this rank's part of the epoch is done (everything it receives landed, every
  // put it sends is remotely complete and signalled) or `deadline` passes (DeadlineExceeded).
  // Unavailable when a peer this epoch still depends on is lost or aborted.
  [[nodiscard]] absl::Status Wait(absl::Time deadline);

  // Start(last epoch + 1) then Wait(deadline).
  [[nodiscard]] absl::Status Execute(absl::Time deadline);

  // Forgets a failed epoch so the handle may try again with a larger epoch (every rank must
  // Reset, then start the same epoch). Progresses the worker for up to 100 ms first to take in
  // what peers already sent about the failed epoch; aborts about epochs up to the current one
  // that arrive later are ignored. Puts of the failed epoch still in flight are abandoned.
  void Reset();

  // This rank's refit `epoch` failed outside the engine (the fan-out layer, quantization, the
  // amax exchange): fails it here with `why` and tells the peers at once, as a deadline or a
  // failed peer does. When the engine never started `epoch` (a failure before its Start) it
  // enters it failed, so peers waiting in `epoch` on this rank fail now rather than at their
  // deadline; Reset() then as after any failure. Nothing when `epoch` already ended here (done
  // or failed) or is older than the last epoch started.
  void Abort(uint64_t epoch, absl::Status why);

  // Source data written while the network runs (the refit session quantizes tensor by tensor):
  // puts and local copies that read `tensor`'s source buffer wait, in their plan order, until
  // ReleaseSource(tensor). Holds outlive epochs: hold before Start, release within the epoch
  // (a hold never released is a refit that misses its deadline). Allocation-free.
  void HoldSource(uint32_t tensor);
  void ReleaseSource(uint32_t tensor);

  // True while an epoch is started and not yet finished.
  bool in_epoch() const;
  // Between epochs (every peer is needed for the next one): OK while every peer this rank
  // exchanges data with is reachable and none reported a failed epoch; otherwise Unavailable
  // naming the first such peer (same-host peers: their process is read from /proc). Does not
  // progress.
  [[nodiscard]] absl::Status CheckAllPeers() const;
  // The status of the last finished or failed epoch.
  const absl::Status& last_status() const;
  const RefitStats& last_stats() const;
  // Messages dropped since Create because they did not arrive on the endpoint of the rank they
  // name (src/net/wire.h): another process speaking for a rank.
  int64_t rejected_messages() const;
  // The id that messages to `rank`'s handle under `key_prefix` carry (src/net/wire.h AmHeader).
  static uint64_t HandleId(const std::string& key_prefix, int32_t rank);
  // This rank's endpoint to `peer` (null when `peer` is not a peer of this rank): messages from
  // `peer` arrive on it (UCX's reply endpoint), and only those are acted on. For the fuzz harness
  // (tests/fuzz/engine_fuzzer.cc), which passes it to Runtime::Dispatch as a message's origin.
  ucp_ep* EndpointTo(int32_t peer) const;
  uint64_t last_epoch() const;

  // Transports UCX selected towards this rank's peers, e.g. "tcp/lo" (after the first epoch),
  // followed by "+ single-copy writes to N peer(s)" when some peers are written with
  // process_vm_writev (RefitEngineOptions::single_copy).
  std::string Transports() const;
  // Whether endpoints detect lost peers (see Runtime::peer_error_handling()).
  bool peer_error_handling() const;
  // The delivery in use: "put" or "am" (see RefitEngineOptions::delivery).
  const char* delivery() const;
  // What an idle wait on this handle blocks on: its runtime's UCX worker (wake-up fd), shared
  // with every handle on the runtime, except while its own sends are in flight (then idle
  // rounds yield: UCX may be holding them until a peer's receive queue has room, which raises
  // no event). src/common/idle.h.
  Blocker& events();

  // Optional orderly shutdown: waits (through the store, until `deadline`) until every peer
  // of this rank has finished its epochs too, then flush-closes the endpoints. Without it the
  // destructor force-closes them.
  [[nodiscard]] absl::Status Shutdown(absl::Time deadline);

  class Impl;

 private:
  explicit RefitEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Number of memory registrations this process has made (all handles); refits after the first
// must not change it.
int64_t RegistrationCount();

}  // namespace reshard::net
