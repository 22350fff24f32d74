// RefitHandle: the persistent object that refits one spec between this rank's buffers and its
// peers', once per training step.
//
//   reshard::LocalBuffers buffers;
//   buffers.Source("w", w_ptr, w_bytes);                       // this rank's trainer tile
//   buffers.Destination("qkv", qkv_ptr, qkv_bytes, reshard::MemoryKind::kCuda);
//   auto handle = reshard::RefitHandle::Create(comm, spec, std::move(buffers));
//   if (!handle.ok()) return handle.status();
//   for (int step = 0; ...; ++step) {
//     RESHARD_RETURN_IF_ERROR(handle->Execute(absl::Now() + absl::Seconds(60)));
//   }
//
// Create() does all set-up once (collective over every rank of the spec): plans the refit
// (deterministic; each rank plans only its own share, with every schedule decision of the whole
// plan, so its memory scales with what it moves; every share carries the whole plan's
// fingerprint and the fingerprints are compared, so ranks with different specs fail before any
// byte moves), registers the buffers, exchanges worker addresses and remote keys, and pre-builds
// every put. Refits after the first never register memory or touch the store again
// (Stats::registrations_this_refit is 0). A rank whose Create fails before the fingerprints are
// compared (its share does not plan, its buffers do not match) tells the other ranks, whose
// Create then fails at once with that rank's error code and reason ("rank 3 failed before
// agreeing on the plan fingerprint: ...") instead of at HandleOptions::setup_timeout.
//
// Every rank of the spec calls Execute() (or Start() + Wait()) the same number of times; on a
// source rank it returns once its data is remotely complete, on a destination rank once every
// byte it expects has landed. Source buffers must hold the new weights when Execute/Start is
// called and stay unchanged until it returns/Wait returns; destination buffers are overwritten
// during that time and hold the new weights afterwards.
//
// CUDA streams (docs/api.md, "Stream-ordered refits"): StartOnStream(stream) in place of Start()
// orders the refit after the work queued on a caller's stream before the call (the optimizer
// step that wrote the weights, the forward pass still reading them) without a host or device
// synchronise: nothing reads this rank's sources or writes its destinations before that work is
// done. RecordCompletion(stream), between Start and Wait, makes a stream's later work (the next
// forward pass) wait on the device until this rank's part of the refit is done; the host still
// drives the refit in Wait. Streams are cudaStream_t values passed as void*.
//
// Ownership: RefitHandle is move-only; the caller's buffers must outlive it. It keeps the
// Communicator's shared state alive. Destroying a handle mid-refit abandons the refit (peers
// see Unavailable or DeadlineExceeded).
// Thread safety: thread-compatible: one thread at a time per handle (the same thread that calls
// Start must call Wait). Handles of one process share one UCX worker, so drive them from one
// thread.
// Blocking: Create, Execute and Wait block up to their deadline; Start, StartOnStream and
// RecordCompletion never block. Progress (receiving, forwarding to domain peers) happens inside
// Wait, so call Wait soon after Start.
// Errors:
//   InvalidArgument     invalid spec, a buffer missing / of the wrong size / unknown name,
//                       rank outside the communicator's world (on this rank, or on another
//                       rank whose set-up failed first: the message names it);
//   FailedPrecondition  ranks planned different specs (fingerprint mismatch); a refit is
//                       already in flight; Execute/Start after a failed refit without Reset();
//                       a memory kind this build cannot move (CUDA without CUDA support);
//                       StartOnStream/RecordCompletion without CUDA or a usable GPU;
//   Unavailable         a peer died or aborted (or the store is gone during Create);
//   DeadlineExceeded    a deadline passed before the refit (or set-up) finished.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "reshard/communicator.h"
#include "reshard/spec.h"

namespace reshard {

enum class MemoryKind : uint8_t {
  kHost = 0,  // Ordinary (or pinned) host memory.
  kCuda = 1,  // CUDA device memory of this process's current device.
};
const char* MemoryKindName(MemoryKind kind);

// A caller-owned buffer. `data` may be null only when `bytes` is 0.
struct Buffer {
  void* data = nullptr;
  int64_t bytes = 0;
  MemoryKind kind = MemoryKind::kHost;
};

// Host memory that every process of this host can map, for destination (and staging) buffers:
// a same-host sender or a domain peer that forwards a landed piece writes it straight into such
// a buffer with memcpy (one copy; mapped once per handle), while ordinary host memory is written
// through process_vm_writev, at about half the speed. Page-aligned, zero-filled, move-only; the memory lives until the
// HostBuffer is destroyed (peers keep their mapping until their handle is destroyed).
class HostBuffer {
 public:
  // `bytes` > 0. `tag` (letters, digits, '-', '_', '.') becomes part of the shared-memory
  // object's name, for people reading /dev/shm. InvalidArgument for bytes <= 0;
  // ResourceExhausted when /dev/shm is full.
  [[nodiscard]] static absl::StatusOr<HostBuffer> Allocate(int64_t bytes,
                                                           const std::string& tag = "buf");
  HostBuffer(HostBuffer&&) noexcept;
  HostBuffer& operator=(HostBuffer&&) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  void* data() const;
  int64_t bytes() const;
  Buffer view() const { return Buffer{data(), bytes(), MemoryKind::kHost}; }

  class Impl;

 private:
  explicit HostBuffer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// This rank's buffers by name: the buffer name of a layout (Layout::InBuffer), which is the
// tensor name for a tensor with a buffer of its own. Every buffer this rank holds on a side must
// be given (RefitSpec::LocalBuffers lists them with exact sizes); unknown names are errors.
class LocalBuffers {
 public:
  LocalBuffers& Source(std::string name, void* data, int64_t bytes,
                       MemoryKind kind = MemoryKind::kHost);
  LocalBuffers& Destination(std::string name, void* data, int64_t bytes,
                            MemoryKind kind = MemoryKind::kHost);
  LocalBuffers& Add(Side side, std::string name, Buffer buffer);

  const std::vector<std::pair<std::string, Buffer>>& sources() const { return sources_; }
  const std::vector<std::pair<std::string, Buffer>>& destinations() const { return destinations_; }

 private:
  std::vector<std::pair<std::string, Buffer>> sources_;
  std::vector<std::pair<std::string, Buffer>> destinations_;
};

// How pieces are routed. kDomainAware is the product; kPointToPoint (every destination rank
// receives its own tile from a source) is the naive baseline `reshard bench` compares with.
enum class Schedule : uint8_t { kDomainAware = 0, kPointToPoint = 1 };

// Who copies a piece to the other ranks of its domain once it crossed the network.
//   kAuto    the intra-domain fan-out layer (host memory: one copy through shared memory or
//            process_vm_writev; CUDA memory: CUDA IPC, else NCCL), forwarding each piece as it
//            lands, overlapped with the network stage; used whenever the plan has fan-out;
//   kEngine  the network engine puts fan-out pieces itself, like network pieces.
// Every rank of a handle must choose the same (ranks that differ never meet at set-up and fail
// with DeadlineExceeded).
enum class Fanout : uint8_t { kAuto = 0, kEngine = 1 };

struct HandleOptions {
  // Names this handle's keys in the store. Empty: "h<N>" for the N-th handle created on this
  // communicator, so every rank must create its handles in the same order (like NCCL
  // communicators). Two live handles on one store must not share a name.
  std::string name;
  Schedule schedule = Schedule::kDomainAware;
  Fanout fanout = Fanout::kAuto;
  // Deadline for Create's collective set-up.
  absl::Duration setup_timeout = absl::Seconds(60);
  // Accept buffers larger than required (otherwise the exact size is demanded, which catches
  // passing a full tensor where a shard belongs).
  bool allow_larger_buffers = false;
  // Delta refits (docs/delta.md): each source keeps a shadow of every network piece it sends
  // (in device memory, encoded by CUDA kernels, for CUDA sources) and sends only an encoding of
  // the elements that changed since, whenever the receiver holds exactly that version; the first
  // refit, a refit after a failure or Reset(), and a receiver that missed an epoch get the plain
  // pieces automatically. Between refits the destination buffers must keep the values the last
  // refit wrote (Reset() every rank before changing them). CUDA destination buffers that UCX
  // registers directly need the CUDA delta kernels (FailedPrecondition in a build without them).
  // Every rank must agree.
  bool delta = false;
  // Pinned host memory per rank for the staging ring of CUDA sources that UCX cannot register
  // (Debian's UCX): the GPU packs the pieces they send into it, batch by batch as they are
  // posted, in eight slots, so no full-size host copy of a source exists (docs/data-plane.md).
  // At least 2048 bytes (InvalidArgument otherwise); the ring is allocated only when such
  // sources exist.
  int64_t stage_ring_bytes = int64_t{256} << 20;
  // Pinned host memory per rank for the landing rounds of CUDA destinations that UCX cannot
  // register: the pieces other ranks put into them land there, in rounds of at most
  // stage_round_bytes, and move to the device from there round by round, so no full-size host
  // copy of a destination exists (docs/data-plane.md, "Destinations"). Only a destination that
  // delta streams land in, or that this rank sends from, keeps one (Stats::stage_copy_bytes).
  // Ranks need not agree: each receiver sizes its own rounds. At least 4096 bytes
  // (InvalidArgument otherwise); FailedPrecondition when it cannot hold two rounds of 4096 bytes
  // for every sender.
  int64_t stage_landing_bytes = int64_t{256} << 20;
  // The largest landing round, for CUDA destinations UCX cannot register and for the strided
  // pieces of those a CUDA-aware UCX registers: each sender's stream is copied to the device
  // round by round while its next rounds land, so only its last round's copy follows its last
  // byte; smaller rounds overlap more and cost a flush, a message and a copy launch each. Only
  // the receiver uses it. At least 4096 bytes (InvalidArgument otherwise).
  int64_t stage_round_bytes = int64_t{8} << 20;
};

// Figures of the last refit on this rank.
struct Stats {
  uint64_t epoch = 0;  // 1 for the first refit.
  // Bytes that moved, by path, as measured.
  int64_t bytes_network_sent = 0;      // Put by this rank (includes fan-out the engine ran).
  int64_t bytes_network_received = 0;  // Landed here from other ranks.
  int64_t bytes_local = 0;             // Copied within this rank.
  // Bytes this rank's plan assigns to each path (same every refit).
  int64_t planned_network_in = 0;
  int64_t planned_network_out = 0;
  int64_t planned_fanout_in = 0;
  int64_t planned_fanout_out = 0;
  int64_t planned_local = 0;
  int64_t pieces_received = 0;  // Pieces landed here (network, fan-out and local copies).
  int64_t pieces_expected = 0;  // Pieces the plan promises this rank.
  int64_t puts = 0;             // One-sided puts posted (ucp_put_nbx).
  int64_t data_messages = 0;    // Data active messages posted (the delivery used over tcp).
  // process_vm_writev calls: pieces to peers on this host in host memory, many runs per call,
  // one copy (docs/data-plane.md, "Single copy on one host").
  int64_t single_copy_writes = 0;
  // Runs memcpy'd into a same-host peer's HostBuffer, mapped here (one copy, no system call).
  int64_t mapped_copies = 0;
  int64_t signals = 0;          // Completion signals sent.
  double start_seconds = 0;     // Time inside Start (grants, first puts, local copies).
  double wait_seconds = 0;      // Time inside Wait.
  double total_seconds = 0;     // Start to the end of Wait.
  // Transports UCX selected towards the peers, e.g. "tcp/lo,sysv/memory".
  std::string transports;
  // Who copies pieces inside a domain: the fan-out backend this rank uses ("host", "cuda_ipc",
  // "nccl"), "engine" (the network engine puts them itself, Fanout::kEngine), or "none" (the
  // plan has no fan-out copy from or to this rank).
  std::string fanout;
  int64_t bytes_fanout_sent = 0;      // Copied by this rank into domain peers.
  int64_t bytes_fanout_received = 0;  // Copied into this rank by domain peers.
  double fanout_busy_seconds = 0;     // Time with a fan-out copy of this rank in flight.
  // Share of fanout_busy_seconds before this rank's last network landing (hidden under the
  // network stage); 1 when this rank copied nothing.
  double fanout_hidden_fraction = 1;
  // The same against the domain's network stage (until the last network landing on this rank or
  // a domain peer it exchanges pieces with).
  double fanout_domain_hidden_fraction = 1;
  int64_t registrations_total = 0;  // Memory registrations this process made so far.
  // Made during this refit: 0 for every refit after the first (memory is registered once).
  int64_t registrations_this_refit = 0;
  // CUDA memory: this rank's CUDA buffers that UCX registered directly (a CUDA-aware UCX: puts
  // read and write them in place) and those staged through pinned host copies (a UCX without
  // CUDA support, Debian's), and this refit's staging copies: staged sources device -> host,
  // pieces landed in staged destinations host -> device. `reshard info` says which applies.
  int64_t cuda_buffers_registered = 0;
  int64_t cuda_buffers_staged = 0;
  int64_t bytes_staged_to_host = 0;
  int64_t bytes_staged_to_device = 0;
  // The staging ring of staged CUDA sources (HandleOptions::stage_ring_bytes): its pinned host
  // bytes (0 without staged CUDA sources), this refit's pack launches (one per batch) and the
  // bytes they packed (part of bytes_staged_to_host).
  int64_t stage_ring_bytes = 0;
  int64_t stage_ring_batches = 0;
  int64_t bytes_ring_packed = 0;
  // Pinned host memory of the full-size copies of staged CUDA buffers: destinations that delta
  // streams land in or that this rank sends from, and staged sources outside the ring (0
  // otherwise; docs/data-plane.md, "Destinations").
  int64_t stage_copy_bytes = 0;
  // The landing rounds of CUDA destinations UCX cannot register (HandleOptions::
  // stage_landing_bytes): their pinned area (0 when no piece lands through it) and the rounds
  // copied out of it to the device in this refit.
  int64_t stage_landing_bytes = 0;
  int64_t stage_landing_rounds = 0;
  // Kernel launches that replace per-slab and per-run copies (docs/data-plane.md): landing
  // rounds (pinned or in device memory) scattered by one launch each, and local pieces copied
  // between two device buffers by one launch each.
  int64_t stage_round_scatters = 0;
  int64_t local_copy_launches = 0;
  // Data messages (active-message delivery, over tcp without RDMA) into CUDA memory this rank
  // writes itself: the pinned bounce area they pass through to the device (0 without one), the
  // messages moved through it in this refit (one queued copy each, never a synchronous one), and
  // how many of them waited for a slot whose copy to the device was still running (the copies
  // fell behind the network; docs/data-plane.md, "Destinations").
  int64_t stage_bounce_bytes = 0;
  int64_t bounced_data_messages = 0;
  int64_t bounce_waits = 0;
  // Host memory this rank holds for streams, sized at Create: the landing area that packed
  // streams, and with puts delta streams, land in (0 with active messages: they are applied from
  // the messages), and the send scratch packed and delta streams leave from (docs/delta.md,
  // "What it costs").
  int64_t landing_area_bytes = 0;
  int64_t send_scratch_bytes = 0;
  // Delta refits with active messages (tcp): segments this rank's relays forwarded before the
  // piece they forward had landed here (a relay starts with its piece's first segment).
  int64_t delta_relay_early_segments = 0;
  // Bytes this rank's plain relays forwarded before the piece they forward had landed here (a
  // relay starts as the first bytes of its piece are here, and forwards each run once its bytes
  // are; docs/data-plane.md, "Relays").
  int64_t relay_early_bytes = 0;
  // Quantized destinations (docs/quantization.md): time this rank spent quantizing its sources
  // (partial amaxes, dequantizing FP8 sources, quantizing; host or GPU, copies to the host
  // included), time from starting the amax exchange to its end (0 without one), and the host
  // memory the refit holds for quantizing: the FP8 bytes and scales the puts read, the exchange's
  // buffers and the room for dequantized FP8 sources (sized at Create, the same every refit).
  double quantize_seconds = 0;
  double amax_exchange_seconds = 0;
  int64_t quantize_buffer_bytes = 0;
  // Delta refits (HandleOptions::delta), as sender: network pieces sent as deltas, and as plain
  // pieces by reason (no base version: first refit, or after a failure or Reset(); the receiver
  // holds another version; the delta was not smaller; a relay counts a plain piece it forwards
  // for the reason its sender gave); the bytes of what was sent (part of
  // bytes_network_sent) against the plain pieces' bytes; the shadow this rank keeps (host and
  // device memory together), its part in device memory (pieces encoded on the GPU), and the
  // pinned host memory of the GPU encode pipeline (docs/delta.md).
  int64_t delta_pieces = 0;
  int64_t delta_full_no_base = 0;
  int64_t delta_full_receiver_version = 0;
  int64_t delta_full_not_smaller = 0;
  int64_t delta_stream_bytes = 0;
  int64_t delta_plain_bytes = 0;
  int64_t delta_shadow_bytes = 0;
  int64_t delta_device_shadow_bytes = 0;
  int64_t delta_pinned_bytes = 0;
  int64_t deltas_applied = 0;  // As receiver: pieces applied as deltas.
};

class RefitHandle {
 public:
  [[nodiscard]] static absl::StatusOr<RefitHandle> Create(const Communicator& comm,
                                                          const RefitSpec& spec,
                                                          LocalBuffers buffers,
                                                          const HandleOptions& options);
  [[nodiscard]] static absl::StatusOr<RefitHandle> Create(const Communicator& comm,
                                                          const RefitSpec& spec,
                                                          LocalBuffers buffers) {
    return Create(comm, spec, std::move(buffers), HandleOptions());
  }
  // In place of Create, on a rank that cannot take part in a handle's set-up: it found before
  // calling Create that its own buffers (or anything else of its own) are unusable, e.g. a
  // binding that checks its framework's tensors first. Takes the handle number Create would
  // have taken (so the next handle's names stay aligned across ranks) and tells the other ranks
  // of the spec: their Create fails at once, with "rank R failed before agreeing on the plan
  // fingerprint: <why>", instead of at their set-up deadline. Returns `why` (an OK `why` is
  // replaced by Unknown, since an abandoned set-up is a failure). Not collective: every other
  // rank calls Create (or Abandon) as usual.
  static absl::Status Abandon(const Communicator& comm, const RefitSpec& spec, absl::Status why,
                              const HandleOptions& options = HandleOptions());

  RefitHandle(RefitHandle&&) noexcept;
  RefitHandle& operator=(RefitHandle&&) noexcept;
  RefitHandle(const RefitHandle&) = delete;
  RefitHandle& operator=(const RefitHandle&) = delete;
  ~RefitHandle();

  // One refit: Start() then Wait(deadline).
  [[nodiscard]] absl::Status Execute(absl::Time deadline);
  [[nodiscard]] absl::Status Execute(absl::Duration timeout) {
    return Execute(absl::Now() + timeout);
  }
  // Begins the next refit without blocking. FailedPrecondition when one is in flight or the last
  // one failed and Reset() was not called.
  [[nodiscard]] absl::Status Start();
  // Start() after the work queued on `stream` (a cudaStream_t of this process's current device;
  // nullptr is CUDA's legacy default stream, torch's default stream) before this call: the refit
  // records an event on the stream here and Wait starts the refit only once the event completed
  // (never a device-wide or blocking synchronise; Wait's deadline covers the stream's work).
  // Until then nothing reads this rank's sources or writes its destinations. When the stream's
  // work fails (cudaEventQuery's error) or outlasts Wait's deadline, the refit fails without
  // having touched anything (Internal or DeadlineExceeded from Wait; peers fail Unavailable).
  // FailedPrecondition without CUDA in the build or a usable GPU, InvalidArgument for a stream
  // the CUDA runtime refuses: the refit did not start then, and the handle is as before.
  // Host-memory refits work the same with or without a stream.
  [[nodiscard]] absl::Status StartOnStream(void* stream);
  // Makes `stream` (a cudaStream_t, nullptr the legacy default stream) wait on the device until
  // this rank's part of the refit in flight is over: work queued on it after this call (reading
  // the destinations) runs once Wait has seen every piece land, with no host wait for the
  // stream. Any number of streams, any number of calls, between Start()/StartOnStream() and the
  // end of Wait(). The wait is cuStreamWaitValue32 on a flag in mapped pinned host memory that
  // the host writes when the refit ends on this rank, and also when it fails, is Reset() or the
  // handle is destroyed: a stream never waits for a refit that is over, but after a failure it
  // runs on destinations that may be half-written; Wait's error says so, and the caller must not
  // use them. FailedPrecondition when no refit is in flight or without CUDA / a usable GPU / the
  // driver's stream memory operations; InvalidArgument for a stream the driver refuses. The
  // refit in flight is unaffected by these errors.
  [[nodiscard]] absl::Status RecordCompletion(void* stream);
  // Completes the refit begun by Start(). Blocks until done or `deadline`. FailedPrecondition
  // when no refit is in flight.
  [[nodiscard]] absl::Status Wait(absl::Time deadline);
  // Forgets a failed refit so the handle may refit again (every peer must Reset too). Releases
  // streams still waiting on the refit (RecordCompletion).
  void Reset();

  // Blocks until every rank of the spec called Barrier() as often as this rank (the n-th call
  // meets the n-th call), progressing this handle meanwhile so a peer lost or failed between
  // refits fails it at once. Never needed for correctness (refits order themselves); for
  // measurements and for frameworks lining ranks up between steps. FailedPrecondition while a
  // refit is in flight; Unavailable when a peer is lost or reported a failed refit;
  // DeadlineExceeded naming the first rank that did not arrive. A failed barrier fails the
  // handle like a failed refit (Reset() on every rank before refitting again).
  [[nodiscard]] absl::Status Barrier(absl::Time deadline);

  // Whether the last refit failed (and Reset() was not called since).
  bool failed() const;
  // Refits executed (successful or not).
  uint64_t epoch() const;
  // Figures of the last refit (valid after the first Wait).
  const Stats& stats() const;
  int rank() const;
  // Fingerprint of the whole plan (what plan::BuildPlan of the same spec and options gives),
  // equal on every rank, ranks the spec does not name included.
  uint64_t plan_fingerprint() const;

  class Impl;

 private:
  explicit RefitHandle(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace reshard
