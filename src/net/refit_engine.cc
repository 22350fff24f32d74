// The epoch state machine of the refit engine; its parts live beside it (see
// docs/data-plane.md): send_program (what moves), registered_memory, peer_link (one per peer,
// owning its requests), delivery (puts or active messages), landing (counting, unpacking,
// staging), wireup and runtime (the UCX worker and message routing), wire (the format).
#include "src/net/refit_engine.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/common/delta_codec.h"
#include "src/common/hash.h"
#include "src/common/idle.h"
#include "src/common/log.h"
#include "src/common/status.h"
#include "src/cuda/batch_plan.h"
#include "src/cuda/delta.h"
#include "src/cuda/delta_index.h"
#include "src/cuda/pack_batch.h"
#include "src/cuda/queued_kernels.h"
#include "src/cuda/staging_ring.h"
#include "src/net/delivery.h"
#include "src/net/landing.h"
#include "src/net/landing_rounds.h"
#include "src/net/peer_link.h"
#include "src/net/posting_order.h"
#include "src/net/registered_memory.h"
#include "src/net/ring_plan.h"
#include "src/net/runtime.h"
#include "src/net/send_program.h"
#include "src/net/ucx/memory.h"
#include "src/net/ucx/tls.h"
#include "src/net/wire.h"
#include "src/net/wireup.h"
#include "src/rendezvous/record.h"

namespace reshard::net {
namespace {

// What a torn-down engine could not free because UCX may still touch it: links whose requests a
// stalled or lost peer never completed, the registered memory those requests read, and the
// runtime (worker and context) they live on. Kept reachable until the process exits and never
// destroyed: destroying the UCX worker or context under live requests aborts inside UCX
// (ucp_cleanup's rcache assertion). A process leaks this only after a peer failed it.
struct Graveyard {
  std::mutex mu;
  std::vector<std::unique_ptr<PeerLink>> links;
  std::vector<std::unique_ptr<RegisteredMemory>> memory;
  std::vector<std::shared_ptr<Runtime>> runtimes;
};

Graveyard& Leaked() {
  static Graveyard* graveyard = new Graveyard();  // Never destroyed (see above).
  return *graveyard;
}

// The alignment a kernel batch may assume of base `address`: its largest power-of-two divisor,
// up to the widest unit the kernels move.
int64_t AlignmentOf(uintptr_t address) {
  int64_t align = cuda::kMaxPackWidth;
  while (address % static_cast<uintptr_t>(align) != 0) align /= 2;
  return align;
}

}  // namespace

int64_t RegistrationCount() { return ucx::RegistrationCount(); }

class RefitEngine::Impl final : public MessageSink, public LinkOwner {
 public:
  Impl(std::shared_ptr<const plan::Plan> plan, int32_t rank, std::shared_ptr<Runtime> runtime,
       const RefitEngineOptions& options)
      : plan_holder_(std::move(plan)),
        plan_(*plan_holder_),
        rank_(rank),
        options_(options),
        runtime_(std::move(runtime)) {}
  ~Impl();

  absl::Status Init(rendezvous::Store& store, std::vector<BufferView> buffers);
  absl::Status Start(uint64_t epoch);
  absl::Status Progress(std::vector<uint32_t>* landed, bool* progressed);
  absl::Status Wait(absl::Time deadline);
  void Reset();
  absl::Status Shutdown(absl::Time deadline);

  // MessageSink (inside Worker::Progress).
  void OnGrant(const wire::AmHeader& h, uint64_t version, ucp_ep_h from) override;
  void OnHello(const wire::AmHeader& h, ucp_ep_h from) override;
  void OnDone(const wire::AmHeader& h, const uint32_t* indices, size_t count,
              ucp_ep_h from) override;
  void OnData(const wire::DataHeader& h, const void* data, size_t length, ucp_ep_h from) override;
  void OnProgress(const wire::AmHeader& h, const wire::ProgressRecord* records, size_t count,
                  ucp_ep_h from) override;
  // Whether a put delivery's message (`what` `noun`: "completion" "signal", "progress"
  // "message") is for this epoch from the peer it names; one to a rank that receives by active
  // messages fails the epoch.
  bool PutSignal(const wire::AmHeader& h, ucp_ep_h from, const char* what, const char* noun);
  void OnAbort(const wire::AmHeader& h, absl::string_view reason, ucp_ep_h from) override;
  void OnRound(const wire::AmHeader& h, uint64_t round, bool grant, ucp_ep_h from) override;
  // The link of the peer a message names, when the message arrived on that peer's endpoint;
  // null otherwise (the message is dropped, and the first such message is logged).
  PeerLink* Origin(const wire::AmHeader& h, ucp_ep_h from, const char* what);
  int64_t rejected_messages_ = 0;
  // LinkOwner (inside Worker::Progress).
  void OnSendError(absl::Status status) override {
    if (in_epoch_) Fail(std::move(status));
  }
  void OnPutCompleted(int ring_slot) override {
    outstanding_puts_--;
    if (ring_slot >= 0) ring_in_flight_[ring_slot]--;
  }

  // Messages to `rank` carry its handle id, so several ranks may share one runtime (tests).
  uint64_t HandleOf(int32_t rank) const { return RefitEngine::HandleId(options_.key_prefix, rank); }

  // The world plan or this rank's share (shared with the refit session, not copied).
  const std::shared_ptr<const plan::Plan> plan_holder_;
  const plan::Plan& plan_;
  const int32_t rank_;
  const RefitEngineOptions options_;
  uint64_t handle_ = 0;
  rendezvous::Store* store_ = nullptr;
  // Dependency order: the runtime outlives memory, memory outlives the links (declared last,
  // destroyed first).
  std::shared_ptr<Runtime> runtime_;
  SendProgram program_;
  std::unique_ptr<RegisteredMemory> memory_;
  // Delta refits with CUDA memory (docs/delta.md): encodes pieces from CUDA sources against
  // their device shadow, applies streams to device buffers; the landing uses it.
  std::unique_ptr<cuda::DeviceDeltaCodec> device_delta_;
  std::unique_ptr<Landing> landing_;
  std::unique_ptr<Delivery> delivery_;
  std::vector<std::unique_ptr<PeerLink>> links_;  // By rank; null for ranks that are not peers.
  std::vector<PeerLink*> peers_;                  // The non-null links.
  std::vector<uint32_t> local_initial_;           // Local copies without dependencies.
  // Per tensor: its source is held (HoldSource); sized at Init.
  std::vector<uint8_t> held_;
  bool Held(const SendDesc& d) const {
    const plan::Transfer& t = plan_.transfers()[d.transfer];
    return t.from_side == plan::Side::kSrc && held_[t.tensor] != 0;
  }

  // Epoch state.
  uint64_t epoch_ = 0;
  bool in_epoch_ = false;
  bool failed_ = false;
  absl::Status status_;
  RefitStats stats_;
  absl::Time started_at_;
  int64_t remaining_ = 0;  // Pieces still to land here.
  int outstanding_puts_ = 0;
  // What idle waits of this handle block on (RefitEngine::events()): the UCX worker, except
  // while this rank's own puts or data messages are in flight. UCX may hold those in its
  // pending queue until the peer's receive queue (a shared-memory FIFO of 64 x 8 KiB) has room
  // again, which raises no event: sleeping then costs the whole timeout per refill (0.9 s
  // instead of 60 ms for 256 MiB of emulated puts, measured), so those rounds yield instead.
  class Events final : public Blocker {
   public:
    explicit Events(Impl& impl) : impl_(impl) {}
    void Block(absl::Duration timeout) override {
      if (impl_.outstanding_puts_ > 0 || impl_.targets_emulated_puts_ || impl_.DeltaGpuRunning() ||
          impl_.RingGpuRunning() || !impl_.to_device_.empty()) {
        sched_yield();
      } else {
        impl_.runtime_->worker().Block(timeout);
      }
    }

   private:
    Impl& impl_;
  };
  Events events_{*this};
  // Some peer puts into this rank with UCX's emulated puts (put delivery over shared memory or
  // tcp, without single copy): the acknowledgements this rank's worker sends back can sit in
  // UCX's pending queue until the peer's receive queue has room, which raises no event, so this
  // rank's idle rounds yield instead of sleeping (set by ChooseSingleCopy).
  bool targets_emulated_puts_ = false;
  bool single_copy_enabled_ = false;
  bool map_shared_ = false;  // RefitEngineOptions::map_shared_memory, or RESHARD_MAP_SHARED.
  std::deque<uint32_t> local_ready_;
  std::vector<uint32_t> landed_out_;
  // Delta refits (docs/delta.md). version_: the last epoch this rank completed, 0 before the
  // first and after a failure or Reset; base_: version_ when the epoch started, which this rank
  // grants with and its delta streams build on.
  uint64_t version_ = 0, base_ = 0;
  std::vector<uint8_t> shadow_;              // The host-encoded pieces' shadows.
  std::vector<uint8_t> gather_;              // The largest segment of a host-encoded piece.
  std::vector<int64_t> host_shadow_offset_;  // By descriptor: its shadow in shadow_, or -1.
  int64_t device_shadow_bytes_ = 0;
  // By segment (SendDesc::segment_begin): the epoch its shadow was written in.
  std::vector<uint64_t> shadow_epoch_;
  // Delta pieces whose source is CUDA memory are encoded by the CUDA kernels (device_delta_)
  // against a shadow in device memory: by descriptor, its shadow's offset there (-1: encoded on
  // the host).
  std::vector<int64_t> device_shadow_offset_;
  std::vector<bool> unstaged_sources_;  // By buffer: only GPU-encoded pieces read it.
  // The pipelined GPU encode (docs/delta.md, "The GPU encode pipeline"): the segments of the
  // GPU-encoded pieces in posting order, cut into batches (PlanBatches, entry ids are
  // segment numbers) that are enqueued on the codec's stream from Start on, each into its pinned
  // slot, as slots drain; a segment is posted once its batch's event completed.
  cuda::BatchPlan gpu_plan_;
  std::vector<uint32_t> segment_desc_;  // By segment: its descriptor.
  std::vector<int32_t> gpu_entry_;      // By segment: its entry in gpu_plan_, or -1.
  std::vector<int32_t> gpu_batch_;      // By entry: its batch.
  std::vector<int32_t> gpu_left_;       // By batch: its segments not yet posted this epoch.
  std::vector<uint8_t> gpu_done_;       // By batch: its event completed this epoch.
  std::vector<uint8_t> gpu_based_;      // By entry: encoded against a base (a delta allowed).
  std::vector<uint8_t> gpu_plain_;      // By entry: its plain stream was enqueued.
  int32_t gpu_enqueued_ = 0;            // Batches enqueued this epoch (they start in order).
  // Enqueues the next batches while their slots are free (the batch `slots` before has been
  // posted).
  absl::Status EnqueueDeltaBatches();
  // Without waiting: whether an enqueued batch of this epoch is still running on the GPU (idle
  // rounds then yield instead of sleeping on the UCX worker, which the GPU never wakes).
  bool DeltaGpuRunning();
  // The staging ring (docs/data-plane.md, "The staging ring"): descriptors that read a ring
  // source (RegisteredMemory::ring_source) in posting order, cut into parts of whole runs
  // (PlanRing); batch b is packed by the GPU into slot b % slots once batch b - slots was
  // consumed and every send reading its slot completed; a part is posted (or, for a local copy,
  // copied) once its batch's event completed.
  RingPlan ring_;
  const uint8_t* ring_base_ = nullptr;  // Device address the batches' offsets count from.
  std::vector<int32_t> ring_left_;      // By batch: its parts not yet consumed this epoch.
  std::vector<uint8_t> ring_done_;      // By batch: its event completed this epoch.
  int32_t ring_enqueued_ = 0;           // Batches packed this epoch (they start in order).
  // By slot: puts and data messages reading it, not yet complete (across epochs: a slot is
  // packed again only when this is 0).
  int64_t ring_in_flight_[PeerLink::kMaxRingSlots] = {};
  int64_t local_ring_part_ = -1;  // The next part of the local copy in front, or -1.
  // Staged destinations: landed pieces move to the device on this queue, without waiting; the
  // pieces whose copies are in flight, in the order they were enqueued (their events complete
  // in that order).
  std::unique_ptr<cuda::CopyQueue> copy_queue_;
  struct ToDevice {
    uint32_t slot = 0;
    int32_t event = 0;
    // A landing round's copies instead of a piece's: the index of its sender in rounds_ and
    // the round (-1: a piece's).
    int32_t sender = -1;
    int32_t round = -1;
    // Or bytes [at, at + length) of a tracked piece's region (Landing::QueuedAdvance; -1: not).
    int64_t at = -1;
    int64_t length = 0;
  };
  std::deque<ToDevice> to_device_;
  // Forgets copies of a failed epoch (their events are recycled; the copies still write the
  // device buffer, which a failed epoch leaves undefined anyway).
  void DropToDevice() {
    for (const ToDevice& m : to_device_) copy_queue_->Release(m.event);
    to_device_.clear();
  }
  // Landing rounds (src/net/landing_rounds.h). Receiving side: the round pieces landing here
  // and, by sender (its index in rounds_.senders), this epoch's next round to copy out of the
  // round area, by round place (RoundSender::slots) whether a later round's signal came before
  // that one's, the first piece not yet
  // wholly copied out and the first not yet landed. Sending side: by descriptor, its place in
  // its receiver's round stream (-1: not a round piece; see PeerLink::round_to).
  LandingRounds rounds_;
  std::vector<int32_t> round_next_;
  std::vector<std::vector<uint8_t>> round_early_;
  std::vector<uint32_t> round_drain_piece_, round_land_piece_;
  std::vector<int64_t> round_base_;
  // Kernels on the copy queue (InitQueuedKernels; null: none). Landing rounds: each round is
  // scattered by one pack-kernel launch (PlanRoundScatters; batch round_scatters_first_[i] + r,
  // empty: per-slab copies) from the round area (device memory, or the pinned area through its
  // mapping) into destination buffers addressed from round_scatter_base_. Local copies between two
  // device buffers: one strided-copy launch each (by descriptor, its copy batch, or -1:
  // Landing::CopyLocal, slab by slab).
  std::unique_ptr<cuda::QueuedKernels> kernels_;
  std::vector<int32_t> round_scatters_first_;
  uint8_t* round_scatter_base_ = nullptr;
  std::vector<int32_t> local_copy_batch_;
  absl::Status InitQueuedKernels();
  // The CUDA destinations (by buffer) UCX cannot register that the engine writes itself
  // (RegisteredMemory::direct); the others keep a pinned host copy (logged at Init).
  std::vector<bool> DirectDestinations(const std::vector<BufferView>& buffers, bool am) const;
  // The round area's sender `i` signalled round `r`, the next it expects: its copies to the
  // device are enqueued (an event on to_device_).
  absl::Status DrainRound(int32_t i, int32_t r);
  // Round `r` of sender `i` is on the device: its place is granted again (round r + slots) and the
  // pieces it completed land.
  void RoundDrained(int32_t i, int32_t r);
  // The sender of a landing round message from `rank`, as an index in rounds_.senders, or -1.
  int32_t RoundSenderIndex(int32_t rank) const;
  int32_t ring_batches() const { return ring_.batches(); }
  bool OnRing(uint32_t desc) const { return ring_.on_ring(desc); }
  // The descriptors that read staged `ring_sources` (by buffer, chosen in Init) through the
  // staging ring: all but their local pieces into `direct` destinations, which one strided-copy
  // launch moves device to device (InitQueuedKernels), and GPU-encoded delta pieces.
  absl::StatusOr<std::vector<bool>> StagedRingDescs(const std::vector<bool>& ring_sources,
                                                    const std::vector<bool>& direct) const;
  // Where a kernel reads or writes buffer `id` on the device: the caller's memory for a ring
  // source (which has no engine copy), else the engine's (registered or direct).
  uint8_t* DeviceData(uint32_t id) const {
    return memory_->ring_source(id) ? static_cast<uint8_t*>(memory_->buffer(id).data)
                                    : memory_->data(id);
  }
  // Plans the staging ring of the `selected` descriptors and creates it: pinned for staged
  // sources (before the registered memory, which then neither stages nor registers them),
  // `device_memory` for the round pieces of registered ones (after wire-up).
  absl::Status InitRing(const std::vector<BufferView>& buffers, const std::vector<bool>& selected,
                        bool device_memory, std::unique_ptr<cuda::StagingRing>* ring);
  // Packs the next batches while their slots are free; none while a source is held.
  absl::Status EnqueueRingBatches();
  // Without waiting: whether batch `b` is packed (its event completed).
  absl::StatusOr<bool> RingReady(int32_t b);
  // A part of batch `b` was posted or copied.
  absl::Status ConsumeRingPart(int32_t b);
  // Without waiting: whether a packed batch of this epoch is still running on the GPU.
  bool RingGpuRunning();
  // The tensor a ring part reads, for errors.
  const std::string& RingTensor(const RingPart& part) const {
    return plan_.spec().tensors[plan_.transfers()[program_.descs[part.desc].transfer].tensor].name;
  }
  bool abort_pending_ = false;
  uint64_t reset_floor_ = 0;  // Aborts about epochs <= this predate the last Reset.
  // The last epoch this rank completed (not cleared by failures or Reset). A peer's abort about
  // it concerns only the peer's part: it fails neither this rank's refit in flight nor its next
  // one; between refits it stays on the link, so Barrier() still reports the peer's failure.
  uint64_t completed_ = 0;

  // Unavailable for the first peer that aborted or failed: among the peers this epoch still
  // exchanges data with, or all of them.
  absl::Status CheckPeers(bool all);
  static constexpr absl::Duration kProcessCheckInterval = absl::Milliseconds(20);
  absl::Time next_process_check_ = absl::InfinitePast();

  // RefitEngine::Abort.
  void Abort(uint64_t epoch, absl::Status why) {
    if (failed_ || epoch < epoch_ || (epoch == epoch_ && !in_epoch_)) return;
    if (epoch > epoch_) {
      epoch_ = epoch;  // Never started here: enter it failed.
      in_epoch_ = true;
      stats_ = RefitStats{};
      stats_.epoch = epoch;
    }
    Fail(std::move(why));
    BroadcastAbort();
  }

 private:
  // One round of work; true when something progressed (the caller's IdlePolicy decides how
  // to wait otherwise: the engine's Wait here, the refit session's loop above).
  bool Pump();
  bool PumpOnce();
  bool Complete() const;
  void Fail(absl::Status status);
  void BroadcastAbort();
  // The transfer in `slot` (SendProgram::received) landed here: counted, reported and its
  // dependents released (FinishLanded) at once, or, for a staged destination piece moving to
  // the device on copy_queue_ and for work the caller `queued` there (a local copy's kernel),
  // once the queue's event after it completed (PollToDevice, every round).
  void MarkLanded(uint32_t slot, bool queued = false);
  void FinishLanded(uint32_t slot);
  // Relays start with their feed's first data message (active messages) or progress message
  // (puts), before the feed landed; a delta relay then forwards each segment as it is applied,
  // a plain one each run once its bytes are here (Landing::TrackPrefix, docs/data-plane.md,
  // "Relays"). By descriptor, whether it is such a relay
  // (early_relay_) and the epoch in which it was queued (StartRelaysEarly; the feed's landing
  // does not queue it again); by receiving slot, whether one of its relays is, and the epoch
  // they were started in.
  std::vector<uint8_t> early_relay_;
  std::vector<uint64_t> relay_queued_;
  std::vector<uint8_t> feeds_early_relay_;
  std::vector<uint64_t> relays_started_;
  void InitEarlyRelays();
  // Put delivery, by descriptor: a piece that a relay at its receiver forwards, whose sender
  // says how far it landed (Delivery::Progressed) every wire::ProgressStep, or after each
  // segment's stream but the last of a delta piece, so the relay starts early as with active
  // messages; the sender then posts at most one step past its last unsignalled progress. Set
  // once the peers' records are known.
  std::vector<uint8_t> sends_progress_;
  void InitProgress(bool am);
  void StartRelaysEarly(uint32_t slot);
  // After Landing::Data or Progressed: the bytes it queued into device memory for a relay
  // (Landing::QueuedAdvance) advance the piece's prefix once an event recorded now completed
  // (PollToDevice).
  void QueueAdvance(uint32_t slot);
  // Relays that wait for their feed (PeerLink::parked): how far `d`'s feed came (bytes in
  // place, or delta segments applied; INT64_MAX once all of it), setting aside the link's
  // cursor relay, and resuming a parked relay whose feed came further (true: it is the cursor).
  int64_t FeedMark(const SendDesc& d) const;
  void Park(PeerLink& link);
  bool Resume(PeerLink& link);
  void PollToDevice();
  void PostSends();
  // Delta mode's set-up: shadows (host, and device for CUDA sources), the CUDA codec.
  absl::Status InitDelta(const std::vector<BufferView>& buffers);
  // Gathers segment `k` of delta descriptor `desc` (to `link`) and encodes it into its stream,
  // which it records in link.stream_begin and stream_end. A GPU-encoded segment is copied there
  // from its batch's pinned slot once the batch finished: `*ready` false until then (the link
  // posts nothing more this round).
  absl::Status EncodeSegment(PeerLink& link, const SendDesc& d, uint32_t desc, int64_t k,
                             bool* ready);
  void Advance();
  void RunLocalCopies();
  std::string PendingSummary() const;
  absl::Status CheckRemoteKeys() const;
  absl::Status CheckDependencies() const;
  // Put delivery: peers on this host that the kernel lets this process write into get a
  // mapping of their shared-memory regions and/or a SingleCopyWriter
  // (RefitEngineOptions::single_copy), and the links whose peer writes into this rank with
  // UCX's emulated puts.
  absl::Status ChooseSingleCopy();
};

// ---------------------------------------------------------------------------------------------
// Set-up.

absl::Status RefitEngine::Impl::Init(rendezvous::Store& store, std::vector<BufferView> buffers) {
  store_ = &store;
  held_.assign(plan_.spec().tensors.size(), 0);
  const absl::Time deadline = absl::Now() + options_.setup_timeout;
  if (runtime_ == nullptr) return absl::InvalidArgumentError("RefitEngine::Create: no runtime");
  if (rank_ < 0 || rank_ >= plan_.world_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d is outside the plan's world of %d ranks", rank_, plan_.world_size()));
  }
  if (plan_.rank() >= 0 && plan_.rank() != rank_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d was given rank %d's share of the plan (BuildRankPlan); it needs its own share "
        "or the world plan",
        rank_, plan_.rank()));
  }
  if (buffers.size() != plan_.buffers().size()) {
    return absl::InvalidArgumentError(absl::StrFormat("rank %d passed %d buffers, the plan has %d",
                                                      rank_, buffers.size(),
                                                      plan_.buffers().size()));
  }
  const std::vector<int64_t> need = plan_.BufferBytes(rank_);
  for (size_t b = 0; b < buffers.size(); ++b) {
    if (buffers[b].bytes < need[b] || (need[b] > 0 && buffers[b].data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "buffer \"%s\" (%s) on rank %d has %d bytes, the plan needs %d", plan_.buffers()[b].name,
          plan::SideName(plan_.buffers()[b].side), rank_, buffers[b].bytes, need[b]));
    }
  }
  if (options_.stage_ring_bytes < cuda::kStageRingSlots * cuda::kBatchAlign) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d: stage_ring_bytes is %d, below the staging ring's minimum of %d bytes (%d slots "
        "of %d)",
        rank_, options_.stage_ring_bytes, cuda::kStageRingSlots * cuda::kBatchAlign,
        cuda::kStageRingSlots, cuda::kBatchAlign));
  }
  if (options_.stage_landing_bytes < kMinRoundQuota) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d: stage_landing_bytes is %d, below the landing rounds' minimum of %d bytes", rank_,
        options_.stage_landing_bytes, kMinRoundQuota));
  }
  if (options_.stage_round_bytes < kMinRoundQuota) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d: stage_round_bytes is %d, below the landing rounds' minimum of %d bytes", rank_,
        options_.stage_round_bytes, kMinRoundQuota));
  }
  handle_ = HandleOf(rank_);
  const bool am = UseActiveMessages(options_.delivery);
  // CUDA sources UCX cannot register go through the staging ring (InitRing): every source
  // buffer a send reads, unless a transfer with `after` reads it (a descriptor that waits on a
  // landing could hold a ring batch: it keeps a pinned host copy instead; sources never wait in
  // the planner's plans). Their packed streams need no send scratch, and every run must fit a
  // slot: runs are cut at the slot size (receivers accept any cut).
  std::vector<bool> ring_sources(buffers.size(), false);
  bool any_ring_source = false;
  // Devices emulated on the host (tests) pack on the host, and have no delta kernels: their
  // delta refits stage sources whole.
  const bool emulated = cuda::DevicesEmulatedOnHost();
  if (!runtime_->supports_cuda_memory() && (cuda::PackKernelsBuilt() || emulated) &&
      !(emulated && options_.delta)) {
    ring_sources = SourceBuffersRead(plan_, rank_);
    for (size_t b = 0; b < buffers.size(); ++b) {
      ring_sources[b] = ring_sources[b] && buffers[b].kind == MemoryKind::kCuda &&
                        buffers[b].bytes > 0 && plan_.buffers()[b].side == plan::Side::kSrc;
    }
    for (const plan::Transfer& t : plan_.transfers()) {
      if (t.from_rank != rank_ || t.after < 0) continue;
      const uint32_t b = plan_.buffer_of(t.tensor, t.from_side);
      if (b < ring_sources.size()) ring_sources[b] = false;
    }
    for (bool on : ring_sources) any_ring_source = any_ring_source || on;
  }
  // CUDA sources UCX registers: their packed streams and their strided pieces into a receiver's
  // round area (RoundMode::kStrided) are packed into a staging ring in device memory, chosen
  // after wire-up (it depends on the receivers' modes); runs are cut at its slot size in case.
  bool device_ring = false;
  if (runtime_->supports_cuda_memory() && !am && (cuda::PackKernelsBuilt() || emulated)) {
    const std::vector<bool> read = SourceBuffersRead(plan_, rank_);
    for (size_t b = 0; b < buffers.size(); ++b) {
      device_ring =
          device_ring || (read[b] && buffers[b].kind == MemoryKind::kCuda && buffers[b].bytes > 0 &&
                          plan_.buffers()[b].side == plan::Side::kSrc);
    }
  }
  program_ = BuildSendProgram(
      plan_, rank_,
      SendProgramOptions{options_.execute_fanout, options_.pack_below_run_bytes,
                         am ? wire::kAmChunkBytes : 0, options_.delta,
                         any_ring_source || device_ring
                             ? cuda::SlotBytes(options_.stage_ring_bytes, cuda::kStageRingSlots)
                             : 0,
                         any_ring_source ? ring_sources : std::vector<bool>{},
                         /*progress_steps=*/!am});
  RESHARD_RETURN_IF_ERROR(CheckDependencies());
  relay_queued_.assign(program_.descs.size(), 0);
  if (options_.delta) RESHARD_RETURN_IF_ERROR(InitDelta(buffers));
  // CUDA destinations UCX cannot register: written by the engine itself, the pieces other
  // ranks put into them through the landing rounds' bounded area, local pieces from staged
  // sources by one kernel launch each (so those stay off the staging ring).
  const std::vector<bool> direct = DirectDestinations(buffers, am);
  std::unique_ptr<cuda::StagingRing> ring;
  if (any_ring_source) {
    RESHARD_ASSIGN_OR_RETURN(const std::vector<bool> selected,
                             StagedRingDescs(ring_sources, direct));
    RESHARD_RETURN_IF_ERROR(InitRing(buffers, selected, /*device_memory=*/false, &ring));
  }
  absl::Status registered = runtime_->Register(handle_, this);
  if (!registered.ok()) {
    return absl::AlreadyExistsError(absl::StrCat("a refit handle with key prefix \"",
                                                 options_.key_prefix, "\" for rank ", rank_,
                                                 " already exists on this runtime"));
  }
  if (!am) {
    // And with a CUDA-aware UCX, the strided pieces of registered CUDA destinations.
    std::vector<RoundMode> modes(buffers.size(), RoundMode::kNone);
    for (size_t b = 0; b < buffers.size(); ++b) {
      if (direct[b]) {
        modes[b] = RoundMode::kAll;
      } else if (runtime_->supports_cuda_memory() && buffers[b].kind == MemoryKind::kCuda &&
                 buffers[b].bytes > 0 && plan_.buffers()[b].side != plan::Side::kSrc) {
        modes[b] = RoundMode::kStrided;
      }
    }
    absl::StatusOr<LandingRounds> rounds = PlanLandingRounds(
        plan_, program_, modes, options_.stage_landing_bytes, options_.stage_round_bytes);
    if (!rounds.ok()) return rounds.status();
    rounds_ = *std::move(rounds);
    // The landing area holds only the packed streams that do not travel in the rounds.
    CompactLandingArea(rounds_, &program_);
  }
  const size_t round_senders = rounds_.senders.size();
  round_next_.assign(round_senders, 0);
  round_early_.resize(round_senders);
  for (size_t i = 0; i < round_senders; ++i) {
    round_early_[i].assign(static_cast<size_t>(rounds_.senders[i].slots), 0);
  }
  round_drain_piece_.assign(round_senders, 0);
  round_land_piece_.assign(round_senders, 0);
  RESHARD_ASSIGN_OR_RETURN(
      memory_, RegisteredMemory::Create(
                   plan_, rank_, *runtime_, std::move(buffers), program_.send_scratch_bytes,
                   am ? 0 : program_.landing_bytes, ring_sources, direct, rounds_.area_bytes));
  if (absl::Status attached = memory_->AttachRing(std::move(ring), *runtime_); !attached.ok()) {
    return absl::Status(attached.code(), absl::StrCat("rank ", rank_, ": ", attached.message()));
  }
  landing_ = std::make_unique<Landing>(plan_, program_, *memory_, am);
  landing_->set_device_delta(device_delta_.get());
  landing_->set_rounds(&rounds_);
  for (uint32_t b = 0; b < memory_->size(); ++b) {
    if (!(memory_->staged(b) || memory_->device(b)) ||
        plan_.buffers()[b].side == plan::Side::kSrc) {
      continue;
    }
    // A CUDA destination: landed pieces of a staged one move to the device, and packed streams
    // are unpacked into a registered one, without a synchronise.
    absl::StatusOr<std::unique_ptr<cuda::CopyQueue>> queue = cuda::CopyQueue::Create();
    if (!queue.ok()) {
      return absl::Status(
          queue.status().code(),
          absl::StrFormat("rank %d: the copy queue of CUDA destination buffer \"%s\": %s", rank_,
                          plan_.buffers()[b].name, queue.status().message()));
    }
    copy_queue_ = *std::move(queue);
    landing_->set_copy_queue(copy_queue_.get());
    break;
  }
  RESHARD_RETURN_IF_ERROR(landing_->InitBounce());
  InitEarlyRelays();
  RESHARD_RETURN_IF_ERROR(InitQueuedKernels());
  delivery_ = MakeDelivery(am, rank_, program_, *memory_, options_.signal_batch_bytes, stats_);
  single_copy_enabled_ = options_.single_copy && !am;
  if (const char* env = std::getenv("RESHARD_SINGLE_COPY")) {
    single_copy_enabled_ = !am && std::string(env) != "0";
  }
  map_shared_ = options_.map_shared_memory;
  if (const char* env = std::getenv("RESHARD_MAP_SHARED")) map_shared_ = std::string(env) != "0";

  links_.resize(static_cast<size_t>(plan_.world_size()));
  for (int32_t r : program_.peers) {
    auto link = std::make_unique<PeerLink>(rank_, r, HandleOf(r), runtime_->worker(), *this);
    link->sends_to = program_.sends_to(r);
    link->receives_from = program_.receives_from(r);
    link->expected_from = program_.expected_from[r];
    if (!am) {
      auto packed =
          std::lower_bound(program_.packed_to.begin(), program_.packed_to.end(), r,
                           [](const LandingBlock& b, int32_t peer) { return b.rank < peer; });
      if (packed != program_.packed_to.end() && packed->rank == r) {
        link->packed_bytes_to = packed->bytes;
      }
    }
    const uint32_t first = program_.peer_begin[r], last = program_.peer_begin[r + 1];
    if (am && first < last) {
      link->ReserveDataHeaders(program_.descs[first].run_begin, program_.descs[last - 1].run_end);
    }
    peers_.push_back(link.get());
    links_[r] = std::move(link);
  }
  // Sends go round-robin over peers_ from its front: start each rank at another peer, so
  // ranks that send to the same receivers do not all write into the first one together.
  if (!peers_.empty()) {
    std::rotate(peers_.begin(), peers_.begin() + rank_ % static_cast<int32_t>(peers_.size()),
                peers_.end());
  }
  for (uint32_t di : program_.dependencies.initial()) {
    const SendDesc& d = program_.descs[di];
    if (d.peer == rank_) {
      local_initial_.push_back(di);
    } else {
      links_[d.peer]->initial.push_back(di);
    }
  }
  // Every relay to a peer may be set aside at once (PeerLink::parked): no allocation per refit.
  std::vector<size_t> relays_to(links_.size(), 0);
  for (const SendDesc& d : program_.descs) {
    if (d.relay_feed >= 0 && d.peer != rank_) relays_to[static_cast<size_t>(d.peer)]++;
  }
  for (size_t r = 0; r < links_.size(); ++r) {
    if (relays_to[r] > 0) links_[r]->parked.reserve(relays_to[r]);
  }
  RESHARD_RETURN_IF_ERROR(
      Connect(store, options_.key_prefix, rank_, *runtime_, *memory_,
              am ? absl::Span<const LandingBlock>() : absl::MakeConstSpan(program_.landing_blocks),
              rounds_, links_, single_copy_enabled_, deadline));
  if (!am) {
    // This rank's round streams: each receiver published the total it expects.
    round_base_.assign(program_.descs.size(), -1);
    for (PeerLink* link : peers_) {
      if (!link->sends_to) continue;
      const int32_t r = link->peer();
      RESHARD_ASSIGN_OR_RETURN(
          const std::vector<int64_t> bases,
          CheckedRoundStreamBases(plan_, program_, r, link->peer_rounds, link->round_to.total));
      for (uint32_t i = program_.peer_begin[r]; i < program_.peer_begin[r + 1]; ++i) {
        round_base_[i] = bases[i];
      }
      // Its packed streams that travel in the rounds leave the receiver's landing area (which
      // the receiver compacted the same way).
      CompactLandingBlock(r, round_base_, &program_);
      auto packed =
          std::lower_bound(program_.packed_to.begin(), program_.packed_to.end(), r,
                           [](const LandingBlock& b, int32_t peer) { return b.rank < peer; });
      link->packed_bytes_to =
          packed != program_.packed_to.end() && packed->rank == r ? packed->bytes : 0;
    }
  }
  RESHARD_RETURN_IF_ERROR(PlaceLandingBlocks(rank_, *memory_, links_));
  if (device_ring) {
    // Registered CUDA sources: their strided pieces that receivers take in rounds, and their
    // packed streams to other ranks (into a round area or a landing area), are packed by the
    // GPU into the device ring, whose slots leave as a few large puts (PostSends merges a
    // part's runs within a round), instead of runs put one by one or gathered through the host.
    std::vector<bool> selected(program_.descs.size(), false);
    bool any = false;
    for (uint32_t i = 0; i < program_.descs.size(); ++i) {
      const SendDesc& d = program_.descs[i];
      const plan::Region& region = plan_.region(plan_.transfers()[d.transfer].region);
      selected[i] = memory_->device(d.from_buffer) && d.delta_elem_bytes == 0 && d.peer != rank_ &&
                    d.run_end > d.run_begin && plan_.transfers()[d.transfer].after < 0 &&
                    (d.packed || (round_base_[i] >= 0 && region.bytes > region.run_bytes));
      any = any || selected[i];
    }
    if (any) {
      std::vector<BufferView> views;
      for (uint32_t b = 0; b < memory_->size(); ++b) views.push_back(memory_->buffer(b));
      std::unique_ptr<cuda::StagingRing> device;
      RESHARD_RETURN_IF_ERROR(InitRing(views, selected, /*device_memory=*/true, &device));
      if (absl::Status attached = memory_->AttachRing(std::move(device), *runtime_);
          !attached.ok()) {
        return absl::Status(attached.code(),
                            absl::StrCat("rank ", rank_, ": ", attached.message()));
      }
    }
  }
  RESHARD_RETURN_IF_ERROR(CheckRemoteKeys());
  InitProgress(am);
  RESHARD_RETURN_IF_ERROR(Handshake(store, options_.key_prefix, rank_, *runtime_, links_, deadline));
  return ChooseSingleCopy();
}

absl::Status RefitEngine::Impl::InitQueuedKernels() {
  if (copy_queue_ == nullptr || !(cuda::PackKernelsBuilt() || cuda::DevicesEmulatedOnHost())) {
    return absl::OkStatus();
  }
  RoundScatters scatters;
  if (!rounds_.empty() && options_.scatter_rounds_by_kernel) {
    // Every buffer a round piece lands in, addressed from the lowest of them.
    std::vector<bool> into(memory_->size(), false);
    for (const RoundPiece& piece : rounds_.pieces) {
      const plan::Transfer& t = plan_.transfers()[program_.received[piece.slot]];
      into[plan_.buffer_of(t.tensor, t.to_side)] = true;
    }
    uintptr_t base = UINTPTR_MAX;
    for (uint32_t b = 0; b < memory_->size(); ++b) {
      if (into[b]) base = std::min(base, reinterpret_cast<uintptr_t>(memory_->data(b)));
    }
    std::vector<int64_t> shift(memory_->size(), 0);
    for (uint32_t b = 0; b < memory_->size(); ++b) {
      if (into[b]) {
        shift[b] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(memory_->data(b)) - base);
      }
    }
    RESHARD_ASSIGN_OR_RETURN(scatters,
                             PlanRoundScatters(plan_, program_, rounds_, shift, AlignmentOf(base)));
    round_scatter_base_ = reinterpret_cast<uint8_t*>(base);
  }
  // Local pieces between two device buffers (not through the staging ring).
  std::vector<cuda::CopyBatch> copies;
  local_copy_batch_.assign(program_.descs.size(), -1);
  for (uint32_t i = program_.peer_begin[rank_]; i < program_.peer_begin[rank_ + 1]; ++i) {
    const SendDesc& d = program_.descs[i];
    if (OnRing(i) || d.bytes == 0 ||
        !(memory_->device(d.from_buffer) || memory_->ring_source(d.from_buffer)) ||
        !memory_->device(d.to_buffer)) {
      continue;
    }
    const plan::Transfer& t = plan_.transfers()[d.transfer];
    cuda::CopyBatchOptions options;
    options.from_base_align = AlignmentOf(reinterpret_cast<uintptr_t>(DeviceData(d.from_buffer)));
    options.to_base_align = AlignmentOf(reinterpret_cast<uintptr_t>(memory_->data(d.to_buffer)));
    absl::StatusOr<cuda::CopyBatch> batch =
        cuda::BuildCopyBatch({CopyRegionOf(plan_, plan_.region(t.region))}, options);
    if (!batch.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("rank %d: the local copy of tensor \"%s\": %s", rank_,
                          plan_.spec().tensors[t.tensor].name, batch.status().message()));
    }
    local_copy_batch_[i] = static_cast<int32_t>(copies.size());
    copies.push_back(*std::move(batch));
  }
  if (scatters.batches.empty() && copies.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<cuda::QueuedKernels>> kernels =
      cuda::QueuedKernels::Create(scatters.batches, copies);
  if (!kernels.ok()) {
    return absl::Status(
        kernels.status().code(),
        absl::StrFormat("rank %d: the kernels of its %d landing rounds and %d "
                        "local copies: %s",
                        rank_, scatters.batches.size(), copies.size(), kernels.status().message()));
  }
  kernels_ = *std::move(kernels);
  round_scatters_first_ = std::move(scatters.first);
  return absl::OkStatus();
}

absl::Status RefitEngine::Impl::InitDelta(const std::vector<BufferView>& buffers) {
  // Pieces from CUDA source buffers: a device shadow each (16-byte aligned, for every element
  // size), encoded on the GPU straight from the caller's buffer.
  device_shadow_offset_.assign(program_.descs.size(), -1);
  int64_t device_shadow = 0, device_piece = 0;
  std::string device_buffer;  // The first CUDA buffer that needs the kernels, for errors.
  auto name = [&](uint32_t b, uint32_t tensor) {
    return absl::StrFormat("buffer \"%s\" (tensor \"%s\")", plan_.buffers()[b].name,
                           plan_.spec().tensors[tensor].name);
  };
  for (uint32_t i = 0; i < program_.descs.size(); ++i) {
    const SendDesc& d = program_.descs[i];
    // A relay forwards the streams it received: no shadow, nothing to encode.
    if (d.delta_elem_bytes == 0 || d.relay_feed >= 0) continue;
    if (buffers[d.from_buffer].kind != MemoryKind::kCuda) continue;
    if (device_buffer.empty()) {
      device_buffer = name(d.from_buffer, plan_.transfers()[d.transfer].tensor);
    }
    device_shadow_offset_[i] = device_shadow;
    device_shadow += (d.bytes + 15) / 16 * 16;
    device_piece = std::max(device_piece, d.bytes);
  }
  // Streams into device memory: applied by the CUDA kernels where the engine writes the device
  // buffer itself (a CUDA-aware UCX registered it); a staged buffer's pinned host copy holds
  // exactly what its device memory holds, so host code applies them there and the piece moves
  // to the device as any other (Landing::Land).
  bool device_destination = false;
  for (uint32_t slot = 0; slot < program_.received.size(); ++slot) {
    if (program_.delta_elem_bytes[slot] == 0) continue;
    const plan::Transfer& t = plan_.transfers()[program_.received[slot]];
    const uint32_t b = plan_.buffer_of(t.tensor, t.to_side);
    if (buffers[b].kind != MemoryKind::kCuda || !runtime_->supports_cuda_memory()) continue;
    device_piece = std::max(device_piece, plan_.region(t.region).bytes);
    if (!device_destination) device_buffer = name(b, t.tensor);  // Needs the kernels: named.
    device_destination = true;
  }
  if (device_shadow > 0 || device_destination) {
    absl::StatusOr<std::unique_ptr<cuda::DeviceDeltaCodec>> codec =
        cuda::DevicesEmulatedOnHost()
            ? absl::FailedPreconditionError("devices are emulated on the host (a test)")
            : cuda::DeviceDeltaCodec::Create(device_shadow, device_piece);
    if (codec.ok()) {
      device_delta_ = *std::move(codec);
    } else if (device_destination ||
               codec.status().code() != absl::StatusCode::kFailedPrecondition) {
      return absl::Status(codec.status().code(),
                          absl::StrFormat("rank %d: delta refits of CUDA %s need the CUDA delta "
                                          "kernels, which failed: %s",
                                          rank_, device_buffer, codec.status().message()));
    } else {
      // No kernels in this build: CUDA sources are staged and encoded on the host.
      RESHARD_LOG(kInfo, "rank %d: delta pieces from CUDA memory are encoded on the host: %s",
                  rank_, codec.status().message());
      device_shadow_offset_.assign(program_.descs.size(), -1);
    }
  }
  // A staged source buffer that only GPU-encoded pieces read is never copied to the host.
  unstaged_sources_.assign(buffers.size(), false);
  if (device_delta_ != nullptr) {
    for (uint32_t b = 0; b < buffers.size(); ++b) {
      unstaged_sources_[b] =
          buffers[b].kind == MemoryKind::kCuda && plan_.buffers()[b].side == plan::Side::kSrc;
    }
    for (uint32_t i = 0; i < program_.descs.size(); ++i) {
      const SendDesc& d = program_.descs[i];
      if (device_shadow_offset_[i] < 0) unstaged_sources_[d.from_buffer] = false;
    }
  }
  // Host shadows for the host-encoded pieces only (a GPU-encoded piece's shadow is in device
  // memory, a relay has none).
  host_shadow_offset_.assign(program_.descs.size(), -1);
  int64_t host_shadow = 0, host_segment = 0;
  std::vector<bool> on_device(program_.descs.size(), false);
  for (uint32_t i = 0; i < program_.descs.size(); ++i) {
    const SendDesc& d = program_.descs[i];
    if (d.delta_elem_bytes == 0) continue;
    if (device_shadow_offset_[i] >= 0) {
      on_device[i] = true;
      continue;
    }
    if (d.relay_feed >= 0) continue;
    host_shadow_offset_[i] = host_shadow;
    host_shadow += d.bytes;
    host_segment = std::max(host_segment, std::min(d.bytes, delta::kSegmentBytes));
  }
  shadow_.assign(static_cast<size_t>(host_shadow), 0);
  gather_.assign(static_cast<size_t>(host_segment), 0);
  device_shadow_bytes_ = device_delta_ != nullptr ? device_delta_->shadow_bytes() : 0;
  shadow_epoch_.assign(program_.segments, 0);
  // The pipelined GPU encode: the GPU-encoded pieces' segments in the order PostSends posts
  // them (a piece's segments one after another), in batches bounded by the pinned budget.
  segment_desc_.assign(program_.segments, 0);
  for (uint32_t i = 0; i < program_.descs.size(); ++i) {
    const SendDesc& d = program_.descs[i];
    for (uint32_t k = 0; k < d.segments; ++k) segment_desc_[d.segment_begin + k] = i;
  }
  std::vector<cuda::BatchPiece> pieces;
  for (uint32_t i : PostingOrder(program_, on_device)) {
    const SendDesc& d = program_.descs[i];
    const int es = d.delta_elem_bytes;
    for (uint32_t k = 0; k < d.segments; ++k) {
      pieces.push_back({d.segment_begin + k,
                        delta::StreamCapacity(delta::SegmentLength(d.bytes / es, es, k), es)});
    }
  }
  gpu_plan_ = cuda::PlanBatches(pieces, cuda::kDeltaBatchBudget, cuda::kDeltaBatchSlots);
  gpu_entry_.assign(program_.segments, -1);
  gpu_batch_.assign(gpu_plan_.entries.size(), 0);
  for (int32_t b = 0; b < gpu_plan_.batches(); ++b) {
    for (uint32_t e = gpu_plan_.batch_begin[b]; e < gpu_plan_.batch_begin[b + 1]; ++e) {
      gpu_entry_[gpu_plan_.entries[e].id] = static_cast<int32_t>(e);
      gpu_batch_[e] = b;
    }
  }
  gpu_left_.assign(static_cast<size_t>(gpu_plan_.batches()), 0);
  gpu_done_.assign(static_cast<size_t>(gpu_plan_.batches()), 0);
  gpu_based_.assign(gpu_plan_.entries.size(), 0);
  gpu_plain_.assign(gpu_plan_.entries.size(), 0);
  if (gpu_plan_.batches() > 0) {
    absl::Status reserved = device_delta_->ReservePipeline(
        gpu_plan_.slots, gpu_plan_.slot_bytes, static_cast<int64_t>(gpu_plan_.entries.size()));
    if (!reserved.ok()) {
      return absl::Status(reserved.code(),
                          absl::StrFormat("rank %d: the GPU delta encode pipeline of CUDA %s: %s",
                                          rank_, device_buffer, reserved.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status RefitEngine::Impl::EnqueueDeltaBatches() {
  const int32_t slots = gpu_plan_.slots;
  while (gpu_enqueued_ < gpu_plan_.batches() &&
         (gpu_enqueued_ < slots || gpu_left_[gpu_enqueued_ - slots] == 0)) {
    const int32_t b = gpu_enqueued_;
    // A source still being written (HoldSource) is encoded once released: its batch waits.
    for (uint32_t e = gpu_plan_.batch_begin[b]; e < gpu_plan_.batch_begin[b + 1]; ++e) {
      if (Held(program_.descs[segment_desc_[gpu_plan_.entries[e].id]])) return absl::OkStatus();
    }
    uint8_t* pinned = device_delta_->pinned_slot(b % slots);
    for (uint32_t e = gpu_plan_.batch_begin[b]; e < gpu_plan_.batch_begin[b + 1]; ++e) {
      const uint32_t segment = gpu_plan_.entries[e].id;
      const uint32_t desc = segment_desc_[segment];
      const SendDesc& d = program_.descs[desc];
      const plan::Transfer& t = plan_.transfers()[d.transfer];
      const int es = d.delta_elem_bytes;
      const int64_t k = segment - d.segment_begin;
      const int64_t first = delta::SegmentFirst(k, es);
      // The epoch rule (docs/delta.md) without the receiver's version, which only its grant
      // tells: a delta against this rank's version when the segment's shadow holds it;
      // EncodeSegment sends the plain segment instead to a receiver at another version.
      const bool based = base_ != 0 && shadow_epoch_[segment] == base_;
      gpu_based_[e] = based;
      absl::Status enqueued = device_delta_->EnqueueEncode(
          cuda::SegmentOf(DeltaPieceOf(plan_, plan_.region(t.region), /*source=*/true, es), first,
                          delta::SegmentLength(d.bytes / es, es, k)),
          memory_->buffer(d.from_buffer).data, device_shadow_offset_[desc] + first * es, base_,
          based, pinned + gpu_plan_.entries[e].offset, static_cast<int64_t>(e));
      if (!enqueued.ok()) {
        return absl::Status(
            enqueued.code(),
            absl::StrFormat("rank %d: the GPU delta encode of transfer %d (tensor \"%s\", "
                            "segment %d): %s",
                            rank_, d.id, plan_.spec().tensors[t.tensor].name, k,
                            enqueued.message()));
      }
      shadow_epoch_[segment] = epoch_;  // The shadow holds this epoch's values once it ran.
    }
    RESHARD_RETURN_IF_ERROR(device_delta_->RecordSlot(b % slots));
    ++gpu_enqueued_;
  }
  return absl::OkStatus();
}

bool RefitEngine::Impl::DeltaGpuRunning() {
  if (!in_epoch_) return false;
  for (int32_t b = 0; b < gpu_enqueued_; ++b) {
    if (gpu_done_[b] != 0 || gpu_left_[b] == 0) continue;
    absl::StatusOr<bool> done = device_delta_->SlotDone(b % gpu_plan_.slots);
    if (!done.ok()) return false;  // EncodeSegment reports the failure.
    if (!*done) return true;
    gpu_done_[b] = 1;
  }
  return false;
}

absl::StatusOr<std::vector<bool>> RefitEngine::Impl::StagedRingDescs(
    const std::vector<bool>& on_ring, const std::vector<bool>& direct) const {
  // Every descriptor reading a ring source goes through the ring, except the delta pieces the
  // GPU delta encode reads from device memory itself; a host-encoded delta piece cannot read a
  // ring source (it has no host copy), which happens only when the delta kernels could not
  // start (no usable device).
  std::vector<bool> selected(program_.descs.size(), false);
  for (uint32_t i = 0; i < program_.descs.size(); ++i) {
    const SendDesc& d = program_.descs[i];
    if (!on_ring[d.from_buffer]) continue;
    const bool gpu_encoded = i < device_shadow_offset_.size() && device_shadow_offset_[i] >= 0;
    if (d.delta_elem_bytes > 0 && !gpu_encoded) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "rank %d: buffer \"%s\" (tensor \"%s\") is CUDA memory that UCX cannot register, and "
          "its delta pieces need the CUDA delta kernels, which did not start",
          rank_, plan_.buffers()[d.from_buffer].name,
          plan_.spec().tensors[plan_.transfers()[d.transfer].tensor].name));
    }
    // A local piece into a direct destination stays on the device: one strided-copy launch
    // from the caller's source (InitQueuedKernels), not a pack to pinned memory and a copy back.
    if (d.peer == rank_ && d.to_buffer < direct.size() && direct[d.to_buffer]) continue;
    selected[i] = d.delta_elem_bytes == 0 && d.run_end > d.run_begin;
  }
  return selected;
}

// The ring's batches take slots b % slots, at most kStageRingSlots (PlanBatches): the links
// keep one completion per slot, the ring one event each.
static_assert(cuda::kStageRingSlots <= PeerLink::kMaxRingSlots &&
              cuda::kStageRingSlots <= cuda::StagingRing::kMaxSlots);

absl::Status RefitEngine::Impl::InitRing(const std::vector<BufferView>& buffers,
                                         const std::vector<bool>& selected, bool device_memory,
                                         std::unique_ptr<cuda::StagingRing>* ring) {
  std::vector<bool> on_ring(buffers.size(), false);
  for (uint32_t i = 0; i < program_.descs.size(); ++i) {
    if (selected[i]) on_ring[program_.descs[i].from_buffer] = true;
  }
  // One launch per batch reads every ring source: offsets count from the lowest address.
  uintptr_t base = UINTPTR_MAX;
  for (size_t b = 0; b < buffers.size(); ++b) {
    if (on_ring[b]) base = std::min(base, reinterpret_cast<uintptr_t>(buffers[b].data));
  }
  if (base == UINTPTR_MAX) return absl::OkStatus();
  std::vector<int64_t> shift(buffers.size(), 0);
  for (size_t b = 0; b < buffers.size(); ++b) {
    if (on_ring[b]) {
      shift[b] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(buffers[b].data) - base);
    }
  }
  absl::StatusOr<RingPlan> planned =
      PlanRing(plan_, program_, selected, shift, AlignmentOf(base), options_.stage_ring_bytes);
  if (!planned.ok()) {
    return absl::Status(planned.status().code(),
                        absl::StrFormat("rank %d: %s", rank_, planned.status().message()));
  }
  if (planned->batches() == 0) return absl::OkStatus();
  ring_ = *std::move(planned);
  ring_base_ = reinterpret_cast<const uint8_t*>(base);
  absl::StatusOr<std::unique_ptr<cuda::StagingRing>> created =
      cuda::StagingRing::Create(ring_.slots, ring_.slot_bytes, ring_.pack, device_memory);
  if (!created.ok()) {
    return absl::Status(
        created.status().code(),
        absl::StrFormat(
            "rank %d: the staging ring of CUDA source buffer \"%s\" "
            "(%d bytes of %s memory): %s",
            rank_, plan_.buffers()[program_.descs[ring_.parts[0].desc].from_buffer].name,
            ring_.pinned_bytes(), device_memory ? "device" : "pinned", created.status().message()));
  }
  *ring = *std::move(created);
  // The host side no longer needs the pack batches (the ring uploaded them).
  ring_.pack.clear();
  ring_.pack.shrink_to_fit();
  ring_left_.assign(ring_.batch_bytes.size(), 0);
  ring_done_.assign(ring_.batch_bytes.size(), 0);
  return absl::OkStatus();
}

absl::Status RefitEngine::Impl::EnqueueRingBatches() {
  cuda::StagingRing* ring = memory_->ring();
  const int32_t slots = ring->slots();
  while (ring_enqueued_ < ring_batches()) {
    const int32_t b = ring_enqueued_;
    const int32_t slot = b % slots;
    // The slot's previous batch: every part posted, and every send reading it complete.
    if (b >= slots && ring_left_[b - slots] != 0) return absl::OkStatus();
    if (ring_in_flight_[slot] != 0) return absl::OkStatus();
    // A source still being written (HoldSource) is packed once released: its batch waits.
    for (uint32_t k = ring_.batch_begin[b]; k < ring_.batch_begin[b + 1]; ++k) {
      if (Held(program_.descs[ring_.parts[k].desc])) return absl::OkStatus();
    }
    absl::Status packed = ring->Pack(b, slot, ring_base_);
    if (!packed.ok()) {
      return absl::Status(packed.code(),
                          absl::StrFormat("rank %d: packing the staging ring's batch %d (tensor "
                                          "\"%s\", %d bytes): %s",
                                          rank_, b, RingTensor(ring_.parts[ring_.batch_begin[b]]),
                                          ring_.batch_bytes[b], packed.message()));
    }
    stats_.stage_ring_batches++;
    stats_.bytes_ring_packed += ring_.batch_bytes[b];
    if (!ring->on_device()) stats_.bytes_staged_to_host += ring_.batch_bytes[b];
    ++ring_enqueued_;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> RefitEngine::Impl::RingReady(int32_t b) {
  if (b >= ring_enqueued_) {
    RESHARD_RETURN_IF_ERROR(EnqueueRingBatches());
    return false;  // Packed now at the earliest: its event is polled next round.
  }
  if (ring_done_[b] != 0) return true;
  absl::StatusOr<bool> done = memory_->ring()->SlotDone(b % memory_->ring()->slots());
  if (!done.ok()) {
    return absl::Status(done.status().code(),
                        absl::StrFormat("rank %d: the staging ring's batch %d (tensor \"%s\") "
                                        "failed on the GPU: %s",
                                        rank_, b, RingTensor(ring_.parts[ring_.batch_begin[b]]),
                                        done.status().message()));
  }
  ring_done_[b] = *done ? 1 : 0;
  return *done;
}

absl::Status RefitEngine::Impl::ConsumeRingPart(int32_t b) {
  if (--ring_left_[b] == 0) return EnqueueRingBatches();
  return absl::OkStatus();
}

bool RefitEngine::Impl::RingGpuRunning() {
  if (!in_epoch_) return false;
  for (int32_t b = 0; b < ring_enqueued_; ++b) {
    if (ring_done_[b] != 0 || ring_left_[b] == 0) continue;
    absl::StatusOr<bool> done = RingReady(b);
    if (!done.ok()) return false;  // The next round reports the failure.
    if (!*done) return true;
  }
  return false;
}

absl::Status RefitEngine::Impl::ChooseSingleCopy() {
  if (delivery_->counts_bytes()) return absl::OkStatus();
  // By sender: whether plain pieces from it land in registered device memory.
  std::vector<bool> into_device(links_.size(), false);
  for (uint32_t slot = 0; slot < program_.received.size(); ++slot) {
    const plan::Transfer& t = plan_.transfers()[program_.received[slot]];
    if (program_.landing_offset[slot] < 0 &&
        memory_->device(plan_.buffer_of(t.tensor, t.to_side))) {
      into_device[static_cast<size_t>(t.from_rank)] = true;
    }
  }
  for (PeerLink* link : peers_) {
    // A peer that writes into this rank does so with process_vm_writev when it may (its record),
    // it runs here, and UCX reaches it over shared memory (the same test it makes below; a
    // refused probe on its side only costs this rank sleeps that end at their timeout).
    const std::string transports = link->Transports();
    const bool single_copy_in = link->peer_single_copy() &&
                                link->watched() && ucx::SharedMemoryLanes(transports);
    // Landing rounds always come as UCX puts, and so do plain pieces into registered device
    // memory (no peer maps or writes it with process_vm_writev).
    const bool puts_in = !single_copy_in || RoundSenderIndex(link->peer()) >= 0 ||
                         into_device[static_cast<size_t>(link->peer())];
    if (link->receives_from && puts_in && ucx::EmulatedRmaLanes(transports)) {
      targets_emulated_puts_ = true;
    }
  }
  if (!single_copy_enabled_) return absl::OkStatus();
  for (PeerLink* link : peers_) {
    // Same host and pid namespace (watched), and UCX itself reaches the peer through memory.
    if (!link->sends_to || !link->watched() || !ucx::SharedMemoryLanes(link->Transports())) {
      continue;
    }
    // Regions in shared memory (HostBuffers) are mapped and written with memcpy; the others
    // with process_vm_writev where the kernel allows it, else UCX puts.
    int mapped = 0;
    if (map_shared_) {
      RESHARD_ASSIGN_OR_RETURN(mapped, link->MapSharedRegions(PidNamespace()));
    }
    if (link->probe_address() == 0) continue;  // The peer published no probe token.
    absl::Status allowed = SingleCopyWriter::Probe(rank_, link->peer(), link->watched_pid(),
                                                   link->probe_address(), link->probe_token());
    if (!allowed.ok()) {
      RESHARD_LOG(kWarning, "%s; its pieces %stravel as UCX puts instead", allowed.message(),
                  mapped > 0 ? "outside shared memory " : "");
      continue;
    }
    link->EnableSingleCopy();
  }
  return absl::OkStatus();
}

absl::Status RefitEngine::Impl::CheckRemoteKeys() const {
  const bool puts = !delivery_->counts_bytes();
  for (uint32_t di = 0; di < program_.descs.size(); ++di) {
    const SendDesc& d = program_.descs[di];
    if (d.peer == rank_) continue;
    const PeerLink& link = *links_[d.peer];
    const std::string& tensor = plan_.spec().tensors[plan_.transfers()[d.transfer].tensor].name;
    // A direct destination of the peer (CUDA memory it writes itself) has no key: its plain
    // pieces go to the peer's round area (within the bounds RoundStreamOf checked), packed ones
    // to its landing area, data messages to the peer's copies.
    const bool to_direct = ModeOf(link.peer_rounds, d.to_buffer) == RoundMode::kAll;
    if (to_direct && puts && !d.packed && d.bytes > 0 && round_base_[di] < 0) {
      return absl::DataLossError(absl::StrFormat(
          "rank %d writes buffer \"%s\" itself (CUDA memory its UCX cannot register), but rank %d "
          "must put %d bytes of tensor \"%s\" there outside its landing rounds",
          d.peer, plan_.buffers()[d.to_buffer].name, rank_, d.bytes, tensor));
    }
    // Round pieces go to the peer's round area, within the bounds RoundStreamOf checked.
    if (puts && round_base_[di] >= 0) continue;
    if (to_direct && !d.packed) continue;
    if (!to_direct && link.rkey(d.to_buffer) == nullptr) {
      return absl::DataLossError(absl::StrFormat(
          "rank %d published no remote key for buffer \"%s\" that rank %d must write (tensor "
          "\"%s\")",
          d.peer, plan_.buffers()[d.to_buffer].name, rank_, tensor));
    }
    if (!puts) continue;  // Active messages: the receiver checks every offset (Landing::Data).
    const uint32_t to = d.packed ? memory_->landing_id() : d.to_buffer;
    if (d.packed && link.rkey(to) == nullptr) {
      return absl::DataLossError(absl::StrFormat(
          "rank %d published no landing area for packed pieces from rank %d", d.peer, rank_));
    }
    // Every put of the program lands inside what the peer registered: a record that names a
    // smaller region (a forged or mismatched record) fails here, before any byte moves.
    const uint64_t base =
        d.packed ? static_cast<uint64_t>(link.landing_block() + d.landing_offset) : 0;
    for (uint32_t i = d.run_begin; i < d.run_end; ++i) {
      const SendRun& run = program_.runs[i];
      if (!wire::InBounds(base + static_cast<uint64_t>(run.remote_offset),
                          static_cast<uint64_t>(run.bytes), link.remote_bytes(to))) {
        return absl::DataLossError(absl::StrFormat(
            "rank %d registered %d bytes for %s, but rank %d must write %d bytes at offset %d "
            "there (tensor \"%s\")",
            d.peer, link.remote_bytes(to),
            d.packed ? std::string("its landing area")
                     : absl::StrCat("buffer \"", plan_.buffers()[d.to_buffer].name, "\""),
            rank_, run.bytes, base + static_cast<uint64_t>(run.remote_offset), tensor));
      }
    }
  }
  return absl::OkStatus();
}

// A descriptor waiting for a transfer that never lands here would never start: the plan's
// `after` (a world index) must name a transfer this rank receives and the engine runs.
absl::Status RefitEngine::Impl::CheckDependencies() const {
  for (const SendDesc& d : program_.descs) {
    const plan::Transfer& t = plan_.transfers()[d.transfer];
    if (t.after < 0 || program_.Slot(static_cast<uint32_t>(t.after)) >= 0) continue;
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d: transfer %d (tensor \"%s\") waits for transfer %d, which the engine does not "
        "land on rank %d",
        rank_, d.id, plan_.spec().tensors[t.tensor].name, t.after, rank_));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Epochs.

absl::Status RefitEngine::Impl::Start(uint64_t epoch) {
  if (failed_) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank_, ": refit epoch ", epoch_,
                                                      " failed (", std::string(status_.message()),
                                                      "); call Reset() before starting another"));
  }
  if (in_epoch_) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, ": epoch ", epoch_, " is still in flight"));
  }
  if (epoch <= epoch_) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank_, ": epoch ", epoch,
                                                      " does not follow the last epoch ", epoch_));
  }
  epoch_ = epoch;
  in_epoch_ = true;
  status_ = absl::OkStatus();
  stats_ = RefitStats{};
  stats_.epoch = epoch;
  stats_.delta_shadow_bytes = static_cast<int64_t>(shadow_.size()) + device_shadow_bytes_;
  stats_.delta_device_shadow_bytes = device_shadow_bytes_;
  stats_.delta_pinned_bytes = gpu_plan_.batches() > 0 ? device_delta_->pinned_bytes() : 0;
  started_at_ = absl::Now();
  remaining_ = static_cast<int64_t>(program_.received.size());
  base_ = version_;
  landing_->StartEpoch(epoch, base_);
  local_ready_.assign(local_initial_.begin(), local_initial_.end());
  landed_out_.clear();
  for (PeerLink* link : peers_) {
    const int32_t r = link->peer();
    link->started = false;
    link->ready.clear();
    link->parked.clear();
    link->cursor_desc = -1;
    link->cursor_run = 0;
    link->encoded_run = -1;
    link->ring_part = -1;
    link->ring_source = nullptr;
    link->ring_slot = -1;
    // Rounds 0 to slots - 1 come with the epoch's grant.
    link->round_granted = link->round_to.quota > 0 ? link->round_to.slots - 1 : 0;
    link->round_pos = 0;
    link->run_posted = 0;
    link->round_bytes = 0;
    link->round_ahead = 0;
    link->remaining_from = link->expected_from;
    // Each landing round's signal counts as one more: the epoch ends only once it went.
    link->unsignalled = program_.peer_begin[r + 1] - program_.peer_begin[r] +
                        (link->round_to.quota > 0 ? link->round_to.rounds : 0);
  }
  // Every peer is checked before any grant goes out: a grant sent before this rank finds an
  // aborted or failed peer would let that source finish a refit this rank fails (its abort
  // then reaches the source in its next refit, which it ignores: see completed_).
  for (PeerLink* link : peers_) {
    if (link->aborted && link->aborted_epoch <= completed_) {
      link->aborted = false;  // About an epoch this rank completed: the peer resets alone.
      link->abort_reason.clear();
    }
    if (!link->error().ok() || link->aborted) {
      Fail(link->aborted ? absl::UnavailableError(link->abort_reason) : link->error());
      BroadcastAbort();
      return status_;
    }
  }
  for (PeerLink* link : peers_) {
    if (!link->receives_from) continue;
    // Grant: the destination buffers are free for this epoch.
    absl::Status granted = link->SendGrant(epoch, base_);
    if (!granted.ok()) {
      Fail(granted);
      BroadcastAbort();
      return status_;
    }
  }
  if (delivery_->counts_bytes()) {
    // Empty pieces carry no data message: they land as soon as the epoch starts.
    for (uint32_t slot = 0; slot < program_.received.size(); ++slot) {
      const plan::Transfer& tr = plan_.transfers()[program_.received[slot]];
      if (tr.from_rank != rank_ && plan_.region(tr.region).bytes == 0) MarkLanded(slot);
    }
  }
  // Staged source buffers: device -> pinned host before any send reads them.
  stats_.cuda_buffers_registered = memory_->cuda_registered();
  stats_.cuda_buffers_staged = memory_->cuda_staged();
  absl::Status staged =
      memory_->StageSources(plan_, unstaged_sources_, &stats_.bytes_staged_to_host);
  // The GPU encodes start now (the sources are readable: Start runs after the stream gate).
  for (int32_t b = 0; b < gpu_plan_.batches(); ++b) {
    gpu_left_[b] = static_cast<int32_t>(gpu_plan_.batch_begin[b + 1] - gpu_plan_.batch_begin[b]);
  }
  std::fill(gpu_done_.begin(), gpu_done_.end(), 0);
  std::fill(gpu_plain_.begin(), gpu_plain_.end(), 0);
  gpu_enqueued_ = 0;
  if (staged.ok() && gpu_plan_.batches() > 0) staged = EnqueueDeltaBatches();
  // The staging ring packs its first batches now (as soon as their slots' sends of the last
  // epoch completed).
  stats_.stage_ring_bytes = memory_->ring() != nullptr ? memory_->ring()->bytes() : 0;
  stats_.stage_copy_bytes = memory_->staged_copy_bytes();
  stats_.stage_landing_bytes = memory_->round_bytes();
  stats_.stage_bounce_bytes = landing_->bounce_bytes();
  stats_.landing_area_bytes = delivery_->counts_bytes() ? 0 : program_.landing_bytes;
  stats_.send_scratch_bytes = program_.send_scratch_bytes;
  std::fill(round_next_.begin(), round_next_.end(), 0);
  for (std::vector<uint8_t>& early : round_early_) std::fill(early.begin(), early.end(), 0);
  for (size_t i = 0; i < rounds_.senders.size(); ++i) {
    round_drain_piece_[i] = round_land_piece_[i] = rounds_.senders[i].piece_begin;
  }
  for (int32_t b = 0; b < ring_batches(); ++b) {
    ring_left_[b] = static_cast<int32_t>(ring_.batch_begin[b + 1] - ring_.batch_begin[b]);
  }
  std::fill(ring_done_.begin(), ring_done_.end(), 0);
  ring_enqueued_ = 0;
  local_ring_part_ = -1;
  if (copy_queue_ != nullptr) DropToDevice();
  if (staged.ok() && ring_batches() > 0) staged = EnqueueRingBatches();
  if (!staged.ok()) {
    Fail(staged);
    BroadcastAbort();
    return status_;
  }
  Pump();
  return status_;
}

bool RefitEngine::Impl::Pump() {
  const bool busy = PumpOnce();
  BroadcastAbort();
  return busy;
}

bool RefitEngine::Impl::PumpOnce() {
  if (!in_epoch_) return runtime_->worker().Progress() > 0;
  bool busy = false;
  for (int i = 0; i < 16 && runtime_->worker().Progress() > 0; ++i) busy = true;
  if (!status_.ok()) return true;
  absl::Status peers = CheckPeers(/*all=*/false);
  if (!peers.ok()) {
    Fail(peers);
    return true;
  }
  for (PeerLink* link : peers_) {
    if (!link->sends_to || link->started || link->granted < epoch_) continue;
    link->started = true;
    link->ready.insert(link->ready.end(), link->initial.begin(), link->initial.end());
    busy = true;
  }
  if (ring_enqueued_ < ring_batches()) {
    // A slot frees when the last send reading it completes (inside the worker's progress).
    absl::Status packed = EnqueueRingBatches();
    if (!packed.ok()) {
      Fail(packed);
      return true;
    }
  }
  if (!to_device_.empty()) {
    const size_t moving = to_device_.size();
    PollToDevice();
    busy = busy || to_device_.size() != moving;
  }
  const int before = outstanding_puts_;
  PostSends();
  Advance();
  if (!local_ready_.empty()) busy = true;
  RunLocalCopies();
  busy = busy || outstanding_puts_ != before;
  if (status_.ok() && Complete()) {
    in_epoch_ = false;
    version_ = epoch_;
    completed_ = epoch_;
    stats_.deltas_applied = landing_->deltas_applied();
    stats_.bytes_staged_to_device = landing_->staged_to_device();
    stats_.bounced_data_messages = landing_->bounced_messages();
    stats_.bounce_waits = landing_->bounce_waits();
    stats_.seconds = absl::ToDoubleSeconds(absl::Now() - started_at_);
    return true;
  }
  return busy;
}

void RefitEngine::Impl::PostSends() {
  bool any = true;
  while (any && status_.ok()) {
    any = false;
    for (PeerLink* link : peers_) {
      if (!link->started) continue;
      // Post one descriptor's worth of runs (bounded), round-robin over peers.
      if (link->cursor_desc < 0 && !Resume(*link)) {
        if (link->ready.empty()) {
          absl::Status drained = delivery_->Drained(*link);
          if (!drained.ok()) return Fail(drained);
          continue;
        }
        if (Held(program_.descs[link->ready.front()])) continue;  // Not yet written.
        link->cursor_desc = link->ready.front();
        link->ready.pop_front();
        link->cursor_run = program_.descs[link->cursor_desc].run_begin;
        link->region_pos = 0;
        link->progress_next = wire::ProgressStep(program_.descs[link->cursor_desc].bytes);
        link->gathered = false;
        link->ring_part = OnRing(static_cast<uint32_t>(link->cursor_desc))
                              ? ring_.first_part[link->cursor_desc]
                              : -1;
      }
      const SendDesc& d = program_.descs[link->cursor_desc];
      const bool delta = d.delta_elem_bytes > 0;
      if (d.packed && !delta && !link->gathered && link->ring_part < 0 &&
          relay_queued_[link->cursor_desc] != epoch_) {
        // Gather the short runs (the source holds this epoch's data since Start; a relay
        // started early gathers each run's part as its feed's bytes arrive, below).
        absl::Status gathered = landing_->Gather(d);
        if (!gathered.ok()) return Fail(gathered);
        link->gathered = true;
      }
      bool waiting = false;  // A GPU-encoded segment's batch still runs.
      while (link->cursor_run < d.run_end) {
        if (outstanding_puts_ >= options_.max_outstanding_puts) return;
        if (link->ring_part >= 0 && link->ring_source == nullptr) {
          // The first run of a staging ring part: posted once its batch is packed.
          const RingPart& part = ring_.parts[link->ring_part];
          absl::StatusOr<bool> packed = RingReady(part.batch);
          if (!packed.ok()) return Fail(packed.status());
          if (!*packed) {
            waiting = true;  // The other links go on.
            break;
          }
          const int slot = part.batch % memory_->ring()->slots();
          link->ring_source = memory_->ring()->slot(slot) + part.offset;
          link->ring_slot = slot;
        }
        // A piece that tells its progress: its last progress but one is not signalled yet, and
        // posting on would put the signal behind this piece's later puts.
        const bool behind =
            sends_progress_[link->cursor_desc] != 0 && link->progress_unsignalled() > 1;
        if (delta) {
          // Delta pieces leave segment by segment: each is encoded when its first run is due,
          // while the segments before it are on the wire, and only its stream's length goes.
          const int64_t at = program_.runs[link->cursor_run].remote_offset;
          const int64_t stride = delta::SegmentStride(d.delta_elem_bytes);
          if (at % stride == 0 && link->encoded_run != link->cursor_run) {
            if (behind) {
              waiting = true;  // The other links go on.
              break;
            }
            bool ready = true;
            absl::Status encoded = EncodeSegment(*link, d, static_cast<uint32_t>(link->cursor_desc),
                                                 at / stride, &ready);
            if (!encoded.ok()) return Fail(encoded);
            if (!ready) {
              // A relay's segment still on its way: set aside, as a plain relay's run.
              if (d.relay_feed >= 0) {
                Park(*link);
                any = true;
              }
              waiting = true;  // The other links go on.
              break;
            }
            link->encoded_run = link->cursor_run;
          }
          if (at >= link->stream_end) {  // The segment's stream ended before this run.
            link->cursor_run++;
            continue;
          }
        } else if (behind) {
          waiting = true;  // The other links go on.
          break;
        } else if (relay_queued_[link->cursor_desc] == epoch_) {
          // A plain relay started before its feed landed: each run once its bytes are here.
          const auto feed = static_cast<uint32_t>(d.relay_feed);
          const int64_t end = link->region_pos + program_.runs[link->cursor_run].bytes;
          if (!landing_->in_place(feed)) {
            if (end > landing_->LandedPrefix(feed)) {
              Park(*link);  // This link goes on with its other pieces, the other links too.
              any = true;
              waiting = true;
              break;
            }
            stats_.relay_early_bytes += program_.runs[link->cursor_run].bytes;
          }
          if (d.packed && link->run_posted == 0) {
            // Its stream's runs follow the region's order: gather this one's part.
            absl::Status gathered =
                landing_->Gather(d, link->region_pos, end,
                                 memory_->send_scratch() + d.send_offset + link->region_pos);
            if (!gathered.ok()) return Fail(gathered);
          }
        }
        const int64_t round_base = round_base_.empty() ? -1 : round_base_[link->cursor_desc];
        int32_t round = -1;
        if (round_base >= 0) {
          // A round piece (src/net/landing_rounds.h): its runs go in chunks cut at round ends,
          // each once the receiver granted its round. The link posts its round pieces in plan
          // order, the order of the receiver's table.
          const RoundSender& to = link->round_to;
          if (link->cursor_run == d.run_begin && link->run_posted == 0 &&
              link->round_pos != round_base) {
            return Fail(absl::InternalError(absl::StrFormat(
                "rank %d: transfer %d to rank %d starts at byte %d of its landing rounds, but "
                "the rounds are at byte %d",
                rank_, d.id, d.peer, round_base, link->round_pos)));
          }
          round = to.RoundOf(link->round_pos);
          if (round > link->round_granted) {
            waiting = true;  // The other links go on.
            break;
          }
          link->round_skip = link->run_posted;
          link->round_bytes = std::min(program_.runs[link->cursor_run].bytes - link->run_posted,
                                       to.RoundEnd(round) - link->round_pos);
          link->round_remote = static_cast<uint64_t>(to.AreaOffset(link->round_pos));
        }
        if (round >= 0 && link->round_ahead > 0) {
          // Posted already, with the chunk of an earlier run of this ring part.
          link->round_ahead -= link->round_bytes;
        } else {
          // A round chunk read from a ring part runs on over the part's next runs, which follow
          // it in the slot as in the round area: one put up to the part's or the round's end.
          const int64_t chunk = link->round_bytes;
          if (round >= 0 && link->ring_source != nullptr) {
            const uint32_t part_end = ring_.parts[link->ring_part].run_end;
            const int64_t room = link->round_to.RoundEnd(round) - link->round_pos;
            // The chunk's last run: its bytes in the chunk, and its bytes not yet posted.
            int64_t fill = chunk;
            int64_t need = program_.runs[link->cursor_run].bytes - link->run_posted;
            for (uint32_t k = link->cursor_run + 1;
                 k < part_end && fill == need && link->round_bytes < room; ++k) {
              need = program_.runs[k].bytes;
              fill = std::min(need, room - link->round_bytes);
              link->round_bytes += fill;
            }
          }
          bool in_flight = false;
          absl::Status posted = delivery_->PostRun(*link, d, link->cursor_run, epoch_, &in_flight);
          if (!posted.ok()) {
            return Fail(absl::Status(
                posted.code(),
                absl::StrCat(posted.message(), ", tensor \"",
                             plan_.spec().tensors[plan_.transfers()[d.transfer].tensor].name,
                             "\"")));
          }
          if (in_flight) {
            outstanding_puts_++;
            if (link->ring_slot >= 0) ring_in_flight_[link->ring_slot]++;
          }
          link->round_ahead = link->round_bytes - chunk;
          link->round_bytes = chunk;
        }
        if (round >= 0) {
          link->round_pos += link->round_bytes;
          link->run_posted += link->round_bytes;
          link->round_bytes = 0;
          if (link->round_pos == link->round_to.RoundEnd(round)) {
            // The round's last chunk is posted: after a flush, the receiver hears of it.
            absl::Status closed = link->CloseRound(round);
            if (!closed.ok()) return Fail(closed);
          }
          // The rest of the run belongs to the next round.
          if (link->run_posted < program_.runs[link->cursor_run].bytes) continue;
          link->run_posted = 0;
        }
        if (link->ring_source != nullptr) {
          link->ring_source += program_.runs[link->cursor_run].bytes;
          const RingPart& part = ring_.parts[link->ring_part];
          if (link->cursor_run + 1 == part.run_end) {
            // The part's sends are posted; they hold its slot until they complete.
            absl::Status done = delivery_->RingPartPosted(*link);
            if (done.ok()) done = ConsumeRingPart(part.batch);
            if (!done.ok()) return Fail(done);
            link->ring_source = nullptr;
            link->ring_slot = -1;
            const int64_t next = link->ring_part + 1;
            link->ring_part = next < static_cast<int64_t>(ring_.parts.size()) &&
                                      ring_.parts[next].desc == part.desc
                                  ? next
                                  : -1;
          }
        }
        link->region_pos += program_.runs[link->cursor_run].bytes;
        link->cursor_run++;
        if (sends_progress_[link->cursor_desc] != 0) {
          // A relay at the receiver forwards what is in place: say how far the piece got (a
          // delta piece: after each segment's stream but the last, the places of those
          // streams).
          int64_t told = -1;
          if (delta) {
            const int64_t stride = delta::SegmentStride(d.delta_elem_bytes);
            const int64_t next = program_.runs[link->cursor_run - 1].remote_offset / stride + 1;
            if (next < d.segments) told = next * stride;
          } else if (link->region_pos >= link->progress_next && link->region_pos < d.bytes) {
            told = link->region_pos;
            link->progress_next = link->region_pos + wire::ProgressStep(d.bytes);
          }
          if (told >= 0) {
            absl::Status sent = delivery_->Progressed(*link, d, told);
            if (!sent.ok()) return Fail(sent);
          }
        }
      }
      if (waiting) continue;
      if (!delta) stats_.bytes_network_sent += d.bytes;  // Delta: as each segment is encoded.
      link->cursor_desc = -1;
      absl::Status done = delivery_->DescPosted(*link, d);
      if (!done.ok()) return Fail(done);
      any = true;
    }
  }
}

// PeerLink::piece_streams: what a delta piece's segments were so far, kSegmentDelta or, for
// plain ones, PlainSegment(why).
constexpr uint8_t kSegmentDelta = 1;
constexpr uint8_t PlainSegment(delta::WhyFull why) { return static_cast<uint8_t>(2u << why); }

absl::Status RefitEngine::Impl::EncodeSegment(PeerLink& link, const SendDesc& d, uint32_t desc,
                                              int64_t k, bool* ready) {
  // The epoch rule (docs/delta.md): a delta only on top of the version the receiver holds,
  // which must be this rank's own version and its segment's shadow's.
  const int es = d.delta_elem_bytes;
  const int64_t first = delta::SegmentFirst(k, es);
  const int64_t elems = delta::SegmentLength(d.bytes / es, es, k);
  const size_t segment = d.segment_begin + static_cast<size_t>(k);
  const bool receiver_at_base = link.granted_version == base_;
  // Why the segment goes plain, if it does (StreamHeader::why_full), for an encoder that had a
  // base (the segment's last values were sent to this receiver's version) or not.
  auto why_plain = [&](bool based) {
    return !based              ? delta::kNoBase
           : !receiver_at_base ? delta::kReceiverVersion
                               : delta::kNotSmaller;
  };
  delta::WhyFull why = delta::kNotSmaller;
  const int64_t stream_begin = k * delta::SegmentStride(es);
  uint8_t* out = memory_->send_scratch() + d.send_offset + stream_begin;
  delta::EncodeResult r;
  if (const int32_t e = gpu_entry_[segment]; e >= 0) {
    // Encoded on the GPU by its batch (EnqueueDeltaBatches), straight from the caller's device
    // buffer; its stream waits in the batch's pinned slot.
    const int32_t b = gpu_batch_[e];
    const int32_t slot = b % gpu_plan_.slots;
    *ready = false;
    // Its slot is not free yet, or a source of its batch is held.
    if (b >= gpu_enqueued_) return EnqueueDeltaBatches();
    if (gpu_done_[b] == 0) {
      RESHARD_ASSIGN_OR_RETURN(const bool done, device_delta_->SlotDone(slot));
      if (!done) return absl::OkStatus();
      gpu_done_[b] = 1;
    }
    uint8_t* stream = device_delta_->pinned_slot(slot) + gpu_plan_.entries[e].offset;
    why = why_plain(gpu_based_[e] != 0);
    r = device_delta_->pinned_result(e);
    if (r.mode == delta::kDelta && !receiver_at_base) {
      // The receiver holds another version: the plain segment, from the device shadow (which
      // the encode set to this epoch's values), into the same place; the slot's event is
      // recorded again after it and the batch counts as running until then.
      if (gpu_plain_[e] == 0) {
        RESHARD_RETURN_IF_ERROR(device_delta_->EnqueuePlain(
            elems, es, device_shadow_offset_[desc] + first * es, stream));
        RESHARD_RETURN_IF_ERROR(device_delta_->RecordSlot(slot));
        gpu_plain_[e] = 1;
        gpu_done_[b] = 0;
        return absl::OkStatus();
      }
      r = cuda::EncodeResultOf(cuda::DeltaTotals{}, elems, es, /*delta=*/false);
    }
    std::memcpy(out, stream, static_cast<size_t>(r.bytes));
    *ready = true;
    if (--gpu_left_[b] == 0) RESHARD_RETURN_IF_ERROR(EnqueueDeltaBatches());
  } else if (d.relay_feed >= 0) {
    // A relay forwards the stream its feed brought, as this rank validated and applied it (the
    // landing copied it to `out`): a kDelta stream builds on this rank's version (base_), which
    // the receiver must hold too; otherwise the segment goes plain, read from where the feed was
    // applied. A plain stream goes on with its sender's reason (why_full), unless this rank had
    // no base itself; a "not smaller" one as "receiver version" when this receiver could not
    // have taken a delta either.
    const auto feed = static_cast<uint32_t>(d.relay_feed);
    if (!landing_->SegmentApplied(feed, k)) {
      *ready = false;  // Started before its feed landed: this segment is still on its way.
      return absl::OkStatus();
    }
    if (!landing_->landed(feed)) stats_.delta_relay_early_segments++;
    const int64_t bytes = landing_->AppliedBytes(feed, k);
    delta::StreamHeader h;
    std::memcpy(&h, out, sizeof(h));
    if (h.mode == delta::kFull || receiver_at_base) {
      r.bytes = bytes;
      r.mode = static_cast<delta::Mode>(h.mode);
      const bool based = base_ != 0 && h.why_full != delta::kNoBase;
      why = based && h.why_full == delta::kReceiverVersion ? delta::kReceiverVersion
                                                           : why_plain(based);
    } else {
      // A kDelta stream this rank applied: it had a base; the receiver holds another version.
      RESHARD_RETURN_IF_ERROR(
          landing_->Gather(d, first * es, (first + elems) * es, out + sizeof(delta::StreamHeader)));
      r = delta::FullHeader(elems, es, out);
      why = delta::kReceiverVersion;
    }
  } else {
    const bool base = base_ != 0 && shadow_epoch_[segment] == base_;
    RESHARD_RETURN_IF_ERROR(landing_->Gather(d, first * es, (first + elems) * es, gather_.data()));
    r = delta::EncodePiece(gather_.data(), shadow_.data() + host_shadow_offset_[desc] + first * es,
                           elems, es, base_, base && receiver_at_base, out);
    shadow_epoch_[segment] = epoch_;
    why = why_plain(base);
  }
  link.stream_begin = stream_begin;
  link.stream_end = stream_begin + r.bytes;
  stats_.delta_stream_bytes += r.bytes;
  stats_.bytes_network_sent += r.bytes;
  // A plain segment says why, in its header for a relay that forwards it.
  uint8_t seen = kSegmentDelta;
  if (r.mode == delta::kFull) {
    out[offsetof(delta::StreamHeader, why_full)] = why;
    seen = PlainSegment(why);
  }
  // A piece counts once: as a delta when any of its segments went as one, else by why not.
  if (k == 0) link.piece_streams = 0;
  link.piece_streams |= seen;
  if (k + 1 < d.segments) return absl::OkStatus();
  stats_.delta_plain_bytes += d.bytes;
  if (link.piece_streams & kSegmentDelta) {
    stats_.delta_pieces++;
  } else if (link.piece_streams & PlainSegment(delta::kNoBase)) {
    stats_.delta_full_no_base++;
  } else if (link.piece_streams & PlainSegment(delta::kReceiverVersion)) {
    stats_.delta_full_receiver_version++;
  } else {
    stats_.delta_full_not_smaller++;
  }
  return absl::OkStatus();
}

void RefitEngine::Impl::Advance() {
  for (PeerLink* link : peers_) {
    if (!status_.ok()) return;
    absl::Status advanced = delivery_->Advance(*link, epoch_);
    if (!advanced.ok()) Fail(advanced);
  }
}

void RefitEngine::Impl::RunLocalCopies() {
  while (!local_ready_.empty() && status_.ok()) {
    const uint32_t desc = local_ready_.front();
    const SendDesc& d = program_.descs[desc];
    if (Held(d)) return;  // Not yet written.
    if (OnRing(desc)) {
      // Part by part from the staging ring, each once its batch is packed.
      if (local_ring_part_ < 0) local_ring_part_ = ring_.first_part[desc];
      while (local_ring_part_ >= 0) {
        const RingPart& part = ring_.parts[local_ring_part_];
        absl::StatusOr<bool> packed = RingReady(part.batch);
        if (!packed.ok()) return Fail(packed.status());
        if (!*packed) return;
        const uint8_t* stream =
            memory_->ring()->slot(part.batch % memory_->ring()->slots()) + part.offset;
        absl::Status copied = landing_->CopyLocal(d, part.run_begin, part.run_end, stream);
        if (copied.ok()) copied = ConsumeRingPart(part.batch);
        if (!copied.ok()) return Fail(copied);
        const int64_t next = local_ring_part_ + 1;
        local_ring_part_ =
            next < static_cast<int64_t>(ring_.parts.size()) && ring_.parts[next].desc == desc ? next
                                                                                              : -1;
      }
      local_ready_.pop_front();
    } else if (local_copy_batch_.empty() || local_copy_batch_[desc] < 0) {
      local_ready_.pop_front();
      absl::StatusOr<bool> queued = landing_->CopyLocal(d);
      if (!queued.ok()) return Fail(queued.status());
      if (*queued) {
        // Device memory on one side: slab by slab on the copy queue; the piece lands when the
        // event after the copies completed.
        stats_.local_slab_copies++;
        stats_.bytes_local += d.bytes;
        MarkLanded(d.slot, /*queued=*/true);
        continue;
      }
    } else {
      // Between two device buffers: one launch on the copy queue; the piece lands when the
      // event after it completed.
      local_ready_.pop_front();
      absl::Status launched =
          kernels_->Copy(*copy_queue_, static_cast<size_t>(local_copy_batch_[desc]),
                         DeviceData(d.from_buffer), memory_->data(d.to_buffer));
      if (!launched.ok()) {
        return Fail(absl::Status(
            launched.code(),
            absl::StrFormat("rank %d: the local copy of tensor \"%s\": %s", rank_,
                            plan_.spec().tensors[plan_.transfers()[d.transfer].tensor].name,
                            launched.message())));
      }
      stats_.local_copy_launches++;
      stats_.bytes_local += d.bytes;
      if (memory_->direct(d.to_buffer)) landing_->CountStagedToDevice(d.bytes);
      MarkLanded(d.slot, /*queued=*/true);
      continue;
    }
    stats_.bytes_local += d.bytes;
    MarkLanded(d.slot);
  }
}

void RefitEngine::Impl::MarkLanded(uint32_t slot, bool queued) {
  if (landing_->landed(slot)) return;
  absl::StatusOr<bool> moving = landing_->Land(slot);
  if (moving.ok() && (*moving || queued)) {
    // A staged destination piece on its way to the device, or a packed stream being unpacked
    // into device memory: it lands when the copies' event completed (PollToDevice).
    absl::StatusOr<int32_t> event = copy_queue_->Record();
    if (event.ok()) {
      to_device_.push_back({slot, *event});
      return;
    }
    moving = event.status();
  }
  if (!moving.ok()) Fail(moving.status());
  FinishLanded(slot);
}

void RefitEngine::Impl::PollToDevice() {
  while (!to_device_.empty() && status_.ok()) {
    const ToDevice front = to_device_.front();
    absl::StatusOr<bool> done = copy_queue_->Done(front.event);
    if (!done.ok() && front.round >= 0) {
      return Fail(absl::Status(done.status().code(),
                               absl::StrCat("rank ", rank_, ": moving landing round ", front.round,
                                            " from rank ", rounds_.senders[front.sender].rank,
                                            " to the device failed: ", done.status().message())));
    }
    if (!done.ok()) {
      const plan::Transfer& t = plan_.transfers()[program_.received[front.slot]];
      return Fail(absl::Status(
          done.status().code(),
          absl::StrCat("rank ", rank_, ": moving transfer ", program_.received_ids[front.slot],
                       " (tensor \"", plan_.spec().tensors[t.tensor].name, "\") from rank ",
                       t.from_rank, " to the device failed: ", done.status().message())));
    }
    if (!*done) return;  // Copies complete in order on the queue's stream.
    copy_queue_->Release(front.event);
    to_device_.pop_front();
    if (front.round >= 0) {
      RoundDrained(front.sender, front.round);
    } else if (front.at >= 0) {
      // Bytes of a piece a relay forwards, now in device memory.
      if (landing_->AdvanceInPlace(front.slot, front.at, front.length) &&
          feeds_early_relay_[front.slot] != 0 && relays_started_[front.slot] != epoch_) {
        StartRelaysEarly(front.slot);
      }
    } else {
      FinishLanded(front.slot);
    }
  }
}

std::vector<bool> RefitEngine::Impl::DirectDestinations(const std::vector<BufferView>& buffers,
                                                        bool am) const {
  std::vector<bool> direct(buffers.size(), false);
  if (runtime_->supports_cuda_memory()) return direct;
  const std::vector<bool> sends_from = SourceBuffersRead(plan_, rank_);
  std::vector<const char*> why(buffers.size(), nullptr);
  for (size_t b = 0; b < buffers.size(); ++b) {
    direct[b] = buffers[b].kind == MemoryKind::kCuda && buffers[b].bytes > 0 &&
                plan_.buffers()[b].side != plan::Side::kSrc;
    if (direct[b] && sends_from[b]) why[b] = "this rank sends from it";
  }
  for (uint32_t slot = 0; slot < program_.received.size(); ++slot) {
    const plan::Transfer& t = plan_.transfers()[program_.received[slot]];
    const uint32_t b = plan_.buffer_of(t.tensor, t.to_side);
    if (b >= direct.size() || !direct[b] || why[b] != nullptr) continue;
    if (program_.delta_elem_bytes[slot] != 0) {
      why[b] = "delta streams land in it, applied on the host";
    } else if (!am && t.from_rank != rank_ && t.after >= 0 && program_.landing_offset[slot] < 0 &&
               plan_.region(t.region).bytes > 0) {
      why[b] = "relayed pieces land in it, posted in no fixed order";
    }
  }
  for (size_t b = 0; b < buffers.size(); ++b) {
    if (why[b] == nullptr) continue;
    direct[b] = false;
    RESHARD_LOG(kInfo,
                "rank %d: CUDA destination buffer \"%s\" keeps a full-size pinned host copy (%d "
                "bytes): %s",
                rank_, plan_.buffers()[b].name, buffers[b].bytes, why[b]);
  }
  return direct;
}

int32_t RefitEngine::Impl::RoundSenderIndex(int32_t rank) const {
  auto it = std::lower_bound(rounds_.senders.begin(), rounds_.senders.end(), rank,
                             [](const RoundSender& s, int32_t r) { return s.rank < r; });
  return it != rounds_.senders.end() && it->rank == rank
             ? static_cast<int32_t>(it - rounds_.senders.begin())
             : -1;
}

absl::Status RefitEngine::Impl::DrainRound(int32_t i, int32_t r) {
  const RoundSender& s = rounds_.senders[i];
  const int64_t begin = s.RoundBegin(r), end = s.RoundEnd(r);
  if (!round_scatters_first_.empty()) {
    // One launch scatters every piece's bytes in the round.
    absl::Status launched =
        kernels_->Unpack(*copy_queue_, static_cast<size_t>(round_scatters_first_[i] + r),
                         memory_->round_device(), round_scatter_base_);
    if (!launched.ok()) {
      return absl::Status(launched.code(),
                          absl::StrFormat("rank %d: scattering landing round %d from rank %d: %s",
                                          rank_, r, s.rank, launched.message()));
    }
    stats_.stage_round_scatters++;
    // A pinned area's rounds are bytes of direct destinations moved to the device.
    if (!memory_->round_on_device()) landing_->CountStagedToDevice(end - begin);
  } else {
    // Each piece's bytes in the round, copied to the device from where they landed.
    for (uint32_t p = round_drain_piece_[i]; p < s.piece_end; ++p) {
      const RoundPiece& piece = rounds_.pieces[p];
      if (piece.base >= end) break;
      const int64_t from = std::max(begin, piece.base);
      const int64_t to = std::min(end, piece.base + piece.bytes);
      RESHARD_RETURN_IF_ERROR(landing_->UnpackRound(
          piece.slot, from - piece.base, memory_->round_area() + s.AreaOffset(from), to - from));
      if (piece.base + piece.bytes <= end) round_drain_piece_[i] = p + 1;
    }
  }
  stats_.stage_landing_rounds++;
  RESHARD_ASSIGN_OR_RETURN(const int32_t event, copy_queue_->Record());
  to_device_.push_back({0, event, i, r});
  return absl::OkStatus();
}

void RefitEngine::Impl::RoundDrained(int32_t i, int32_t r) {
  const RoundSender& s = rounds_.senders[i];
  // Its place is free again: the sender may write round r + slots into it.
  if (r + s.slots < s.rounds) {
    absl::Status granted = links_[s.rank]->SendRoundGrant(epoch_, r + s.slots);
    if (!granted.ok()) return Fail(granted);
  }
  const int64_t end = s.RoundEnd(r);
  uint32_t& p = round_land_piece_[i];
  for (; p < s.piece_end && rounds_.pieces[p].base + rounds_.pieces[p].bytes <= end; ++p) {
    landing_->LandRound(rounds_.pieces[p].slot);
    FinishLanded(rounds_.pieces[p].slot);
  }
  // The piece the round ends in is in place up to the round's end: its relays forward that.
  if (p < s.piece_end && rounds_.pieces[p].base < end) {
    const uint32_t slot = rounds_.pieces[p].slot;
    if (landing_->RoundDrained(slot, end - rounds_.pieces[p].base) &&
        feeds_early_relay_[slot] != 0 && relays_started_[slot] != epoch_) {
      StartRelaysEarly(slot);
    }
  }
}

void RefitEngine::Impl::InitEarlyRelays() {
  early_relay_.assign(program_.descs.size(), 0);
  feeds_early_relay_.assign(program_.received.size(), 0);
  relays_started_.assign(program_.received.size(), 0);
  for (uint32_t di = 0; di < program_.descs.size(); ++di) {
    const SendDesc& d = program_.descs[di];
    if (d.relay_feed < 0) continue;
    const auto feed = static_cast<uint32_t>(d.relay_feed);
    // A delta relay forwards the streams as they are applied (each data message, or with puts
    // each progress message); a plain one reads the feed's bytes in place, run by run (a packed
    // one gathers each run's part of its stream then): not through the staging ring, and only
    // where the landing knows which bytes are in place.
    const bool early = d.delta_elem_bytes != 0 || (!OnRing(di) && landing_->TrackPrefix(feed));
    early_relay_[di] = early ? 1 : 0;
    feeds_early_relay_[feed] |= early_relay_[di];
  }
}

void RefitEngine::Impl::InitProgress(bool am) {
  sends_progress_.assign(program_.descs.size(), 0);
  if (am) return;  // Every data message says where its bytes landed.
  for (uint32_t di = 0; di < program_.descs.size(); ++di) {
    const SendDesc& d = program_.descs[di];
    // Round pieces say it with their rounds. Pieces read through a staging ring (CUDA sources)
    // say it as any other: their runs are cut at the same steps.
    if (d.peer == rank_ || round_base_[di] >= 0 || !plan_.transfers()[d.transfer].feeds_relay) {
      continue;
    }
    if (d.delta_elem_bytes != 0) {
      // After each segment's stream (always in the receiver's landing area).
      sends_progress_[di] = d.segments > 1 ? 1 : 0;
      continue;
    }
    // Wherever it lands, the receiver keeps what is in place (Landing::TrackPrefix).
    sends_progress_[di] = d.bytes > wire::kProgressStepBytes ? 1 : 0;
  }
}

int64_t RefitEngine::Impl::FeedMark(const SendDesc& d) const {
  const auto feed = static_cast<uint32_t>(d.relay_feed);
  if (d.delta_elem_bytes != 0) {
    return landing_->landed(feed) ? INT64_MAX : landing_->SegmentsApplied(feed);
  }
  return landing_->in_place(feed) ? INT64_MAX : landing_->LandedPrefix(feed);
}

void RefitEngine::Impl::Park(PeerLink& link) {
  const auto desc = static_cast<uint32_t>(link.cursor_desc);
  // A relay is neither on a staging ring nor in landing rounds, and waits between runs.
  RESHARD_CHECK(link.ring_part < 0 && link.run_posted == 0 && link.round_ahead == 0);
  link.parked.push_back({desc, link.cursor_run, link.region_pos, link.progress_next,
                         link.encoded_run, link.stream_begin, link.stream_end, link.piece_streams,
                         FeedMark(program_.descs[desc])});
  link.cursor_desc = -1;
}

bool RefitEngine::Impl::Resume(PeerLink& link) {
  for (size_t i = 0; i < link.parked.size(); ++i) {
    const PeerLink::Parked p = link.parked[i];
    if (FeedMark(program_.descs[p.desc]) <= p.mark) continue;
    link.parked[i] = link.parked.back();
    link.parked.pop_back();
    link.cursor_desc = p.desc;
    link.cursor_run = p.cursor_run;
    link.region_pos = p.region_pos;
    link.progress_next = p.progress_next;
    link.encoded_run = p.encoded_run;
    link.stream_begin = p.stream_begin;
    link.stream_end = p.stream_end;
    link.piece_streams = p.piece_streams;
    link.gathered = false;
    link.ring_part = -1;
    return true;
  }
  return false;
}

void RefitEngine::Impl::QueueAdvance(uint32_t slot) {
  int64_t at = 0, length = 0;
  if (!landing_->QueuedAdvance(&at, &length)) return;
  absl::StatusOr<int32_t> event = copy_queue_->Record();
  if (!event.ok()) return Fail(event.status());
  to_device_.push_back({slot, *event, -1, -1, at, length});
}

void RefitEngine::Impl::StartRelaysEarly(uint32_t slot) {
  relays_started_[slot] = epoch_;
  for (uint32_t di : program_.dependencies.WaitingOn(program_.received_ids[slot])) {
    const SendDesc& d = program_.descs[di];
    if (d.relay_feed != static_cast<int64_t>(slot) || early_relay_[di] == 0 ||
        relay_queued_[di] == epoch_) {
      continue;
    }
    relay_queued_[di] = epoch_;
    links_[d.peer]->ready.push_back(di);
  }
}

void RefitEngine::Impl::FinishLanded(uint32_t slot) {
  const plan::Transfer& t = plan_.transfers()[program_.received[slot]];
  const uint32_t id = program_.received_ids[slot];
  remaining_--;
  stats_.pieces_received++;
  if (t.from_rank != rank_) {
    stats_.bytes_network_received += landing_->wire_bytes(slot);
    links_[t.from_rank]->remaining_from--;
  }
  landed_out_.push_back(id);
  landing_->InPlace(slot);
  for (uint32_t di : program_.dependencies.WaitingOn(id)) {
    if (relay_queued_[di] == epoch_) continue;  // Queued at its feed's first data.
    const SendDesc& d = program_.descs[di];
    if (d.peer == rank_) {
      local_ready_.push_back(di);
    } else {
      links_[d.peer]->ready.push_back(di);
    }
  }
}

absl::Status RefitEngine::Impl::CheckPeers(bool all) {
  // Same-host peers' processes are read from /proc at most every kProcessCheckInterval.
  const absl::Time now = absl::Now();
  if (now >= next_process_check_) {
    for (PeerLink* link : peers_) {
      if (all || link->involved()) link->CheckProcess();
    }
    next_process_check_ = now + kProcessCheckInterval;
  }
  for (const PeerLink* link : peers_) {
    if (all || link->involved()) RESHARD_RETURN_IF_ERROR(link->Health(rank_, epoch_));
  }
  return absl::OkStatus();
}

bool RefitEngine::Impl::Complete() const {
  if (remaining_ != 0 || !local_ready_.empty() || outstanding_puts_ != 0) return false;
  for (const PeerLink* link : peers_) {
    if (link->unsignalled != 0 || link->grants_in_flight() > 0) return false;
  }
  return true;
}

std::string RefitEngine::Impl::PendingSummary() const {
  std::vector<std::string> parts;
  for (const PeerLink* link : peers_) {
    std::string pending = link->Pending(epoch_);
    if (!pending.empty()) parts.push_back(std::move(pending));
  }
  if (parts.empty()) {
    // Everything was signalled, but puts or messages are still in flight: name their peers.
    for (const PeerLink* link : peers_) {
      if (link->in_flight() > 0) {
        parts.push_back(
            absl::StrCat(link->in_flight(), " request(s) in flight to rank ", link->peer()));
      }
    }
  }
  // Pieces and landing rounds (a relay's prefix advances are neither).
  const auto moving = std::count_if(to_device_.begin(), to_device_.end(),
                                    [](const ToDevice& m) { return m.at < 0; });
  if (moving > 0) {
    parts.push_back(absl::StrCat(moving, " landed piece(s) still moving to the device"));
  }
  if (ring_enqueued_ < ring_batches()) {
    const int32_t slot = ring_enqueued_ % memory_->ring()->slots();
    parts.push_back(absl::StrCat("staging ring batch ", ring_enqueued_, " of ", ring_batches(),
                                 " not yet packed (", ring_in_flight_[slot],
                                 " send(s) still read its slot)"));
  }
  return parts.empty() ? "local work" : absl::StrJoin(parts, ", ");
}

// Safe inside UCX callbacks: only records the failure. BroadcastAbort() tells the peers.
void RefitEngine::Impl::Fail(absl::Status status) {
  if (!status_.ok()) return;
  status_ = std::move(status);
  failed_ = true;
  in_epoch_ = false;
  version_ = 0;  // What the destinations hold is unknown now: the next refit is full.
  abort_pending_ = true;
}

// Tells every peer (best effort, not awaited) that this rank's epoch failed: peers blocked on
// this rank fail now instead of at their deadline, and peers that depend on them in turn. Must
// not run inside a UCX callback (it progresses the worker).
void RefitEngine::Impl::BroadcastAbort() {
  if (!abort_pending_) return;
  abort_pending_ = false;
  const std::string reason = absl::StrCat("rank ", rank_, " failed refit epoch ", epoch_, ": ",
                                          std::string(status_.message()));
  for (PeerLink* link : peers_) link->SendAbort(epoch_, reason);
  // Push the aborts out for a moment; each link keeps its messages until they are sent.
  const absl::Time until = absl::Now() + absl::Milliseconds(50);
  IdlePolicy idle(&runtime_->worker());
  while (absl::Now() < until) idle.Round(runtime_->worker().Progress() > 0);
}

absl::Status RefitEngine::Impl::Progress(std::vector<uint32_t>* landed, bool* progressed) {
  if (failed_) {
    // A handler may have failed the epoch outside this handle's Pump (another handle on the
    // runtime progressed the worker): tell the peers now.
    BroadcastAbort();
    return status_;
  }
  const bool busy = Pump();
  if (progressed != nullptr) *progressed = busy;
  if (landed != nullptr) landed->insert(landed->end(), landed_out_.begin(), landed_out_.end());
  landed_out_.clear();
  return status_;
}

absl::Status RefitEngine::Impl::Wait(absl::Time deadline) {
  if (failed_) {
    BroadcastAbort();  // See Progress.
    return status_;
  }
  if (!in_epoch_ && epoch_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank_, ": no epoch was started"));
  }
  // Many processes may share few cores: when a round does nothing, sleep on this handle's
  // events so the ranks doing the work get the cores.
  IdlePolicy idle(&events_);
  while (status_.ok() && in_epoch_) {
    idle.Round(Pump());
    if (!status_.ok() || !in_epoch_) break;
    if (absl::Now() >= deadline) {
      Fail(absl::DeadlineExceededError(absl::StrCat("rank ", rank_, ": refit epoch ", epoch_,
                                                    " missed its deadline after ",
                                                    absl::FormatDuration(absl::Now() - started_at_),
                                                    " still waiting for ", PendingSummary())));
    }
  }
  BroadcastAbort();
  return status_;
}

void RefitEngine::Impl::Reset() {
  // An abort not yet sent is about the failed epoch: send it now, with that epoch and reason
  // (sent after Reset it would name the next epoch and fail it on every peer).
  BroadcastAbort();
  // Take in what peers already sent about the failed epoch (aborts, late signals) before
  // forgetting it; later aborts about epochs up to this one are ignored.
  const absl::Time until = absl::Now() + absl::Milliseconds(100);
  IdlePolicy idle(&runtime_->worker());
  for (int idle_rounds = 0; idle_rounds < 16 && absl::Now() < until;) {
    const bool progressed = runtime_->worker().Progress() > 0;
    idle_rounds = progressed ? 0 : idle_rounds + 1;
    idle.Round(progressed);
  }
  reset_floor_ = std::max(reset_floor_, epoch_);
  version_ = 0;  // The next refit is full (docs/delta.md).
  failed_ = false;
  in_epoch_ = false;
  status_ = absl::OkStatus();
  for (PeerLink* link : peers_) {
    link->aborted = false;
    link->aborted_epoch = 0;
    link->abort_reason.clear();
    link->unsignalled = 0;
    link->remaining_from = 0;
    link->AbandonBatches();
  }
  remaining_ = 0;
  local_ready_.clear();
  if (copy_queue_ != nullptr) DropToDevice();
}

// ---------------------------------------------------------------------------------------------
// Messages.

PeerLink* RefitEngine::Impl::Origin(const wire::AmHeader& h, ucp_ep_h from, const char* what) {
  if (!wire::WellFormed(h, plan_.world_size())) return nullptr;
  PeerLink* link = links_[h.from_rank].get();
  if (link != nullptr && link->SentBy(from)) return link;
  if (rejected_messages_++ == 0) {
    RESHARD_LOG(kWarning,
                "rank %d: dropped a %s message naming rank %d that did not arrive on rank %d's "
                "endpoint (a process other than that rank, or a rank that is not a peer)",
                rank_, what, h.from_rank, h.from_rank);
  }
  return nullptr;
}

void RefitEngine::Impl::OnGrant(const wire::AmHeader& h, uint64_t version, ucp_ep_h from) {
  PeerLink* link = Origin(h, from, "grant");
  if (link == nullptr) return;
  if (h.epoch > link->granted) {
    link->granted = h.epoch;
    link->granted_version = version;
  }
}

void RefitEngine::Impl::OnHello(const wire::AmHeader& h, ucp_ep_h from) {
  // A hello may arrive before this rank created its endpoint to the peer (it progresses its
  // worker for other handles meanwhile): the link checks its origin once connected.
  if (wire::WellFormed(h, plan_.world_size()) && links_[h.from_rank] != nullptr &&
      !links_[h.from_rank]->connected()) {
    return links_[h.from_rank]->HelloBeforeConnect(from);
  }
  PeerLink* link = Origin(h, from, "wire-up");
  if (link != nullptr) link->hello_received = true;
}

bool RefitEngine::Impl::PutSignal(const wire::AmHeader& h, ucp_ep_h from, const char* what,
                                  const char* noun) {
  if (Origin(h, from, what) == nullptr) return false;
  if (!in_epoch_ || h.epoch != epoch_) return false;  // A failed or abandoned epoch's message.
  if (delivery_->counts_bytes()) {
    // Active messages land byte by byte and have no landing area to unpack from.
    Fail(absl::DataLossError(
        absl::StrCat("rank ", rank_, ": rank ", h.from_rank, " sent a ", what, " ", noun,
                     ", but this rank receives by active messages (protocol error: do both ranks "
                     "use the same delivery?)")));
    return false;
  }
  return true;
}

void RefitEngine::Impl::OnDone(const wire::AmHeader& h, const uint32_t* indices, size_t count,
                               ucp_ep_h from) {
  if (!PutSignal(h, from, "completion", "signal")) return;
  for (size_t i = 0; i < count; ++i) {
    uint32_t slot = 0;
    absl::StatusOr<bool> fresh = landing_->Signalled(h.from_rank, indices[i], &slot);
    if (!fresh.ok()) return Fail(fresh.status());
    if (*fresh) MarkLanded(slot);
    if (!status_.ok()) return;
  }
}

void RefitEngine::Impl::OnProgress(const wire::AmHeader& h, const wire::ProgressRecord* records,
                                   size_t count, ucp_ep_h from) {
  if (!PutSignal(h, from, "progress", "message")) return;
  for (size_t i = 0; i < count; ++i) {
    uint32_t slot = 0;
    absl::StatusOr<bool> grew =
        landing_->Progressed(h.from_rank, records[i].transfer, records[i].bytes, &slot);
    if (!grew.ok()) return Fail(grew.status());
    QueueAdvance(slot);
    // Its relays start forwarding what is in place.
    if (*grew && feeds_early_relay_[slot] != 0 && relays_started_[slot] != epoch_) {
      StartRelaysEarly(slot);
    }
  }
}

void RefitEngine::Impl::OnData(const wire::DataHeader& h, const void* data, size_t length,
                               ucp_ep_h from) {
  if (Origin(h.base, from, "data") == nullptr) return;
  if (!in_epoch_ || h.base.epoch != epoch_) return;  // A failed or abandoned epoch's data.
  if (!delivery_->counts_bytes()) {
    return Fail(absl::DataLossError(
        absl::StrCat("rank ", rank_, ": rank ", h.base.from_rank,
                     " sent a data message, but this rank receives by puts (protocol error: do "
                     "both ranks use the same delivery?)")));
  }
  if (length > 0 && data == nullptr) {
    return Fail(absl::DataLossError(absl::StrCat("rank ", rank_, ": rank ", h.base.from_rank,
                                                 " sent a data message without its data")));
  }
  uint32_t slot = 0;
  absl::StatusOr<bool> complete = landing_->Data(h, data, length, &slot);
  if (!complete.ok()) return Fail(complete.status());
  QueueAdvance(slot);
  if (!status_.ok()) return;
  stats_.data_messages_received++;
  if (*complete) return MarkLanded(slot);
  // A piece's first data: its relays start forwarding, segment by segment or run by run.
  if (feeds_early_relay_[slot] != 0 && relays_started_[slot] != epoch_) StartRelaysEarly(slot);
}

void RefitEngine::Impl::OnRound(const wire::AmHeader& h, uint64_t round, bool grant,
                                ucp_ep_h from) {
  PeerLink* link = Origin(h, from, grant ? "landing round grant" : "landing round");
  if (link == nullptr) return;
  if (!in_epoch_ || h.epoch != epoch_) return;  // A failed or abandoned epoch's message.
  auto refuse = [&](const char* what) {
    Fail(absl::DataLossError(absl::StrFormat(
        "rank %d: rank %d %s landing round %d of epoch %d, %s (protocol error)", rank_, h.from_rank,
        grant ? "granted" : "signalled", round, h.epoch, what)));
  };
  if (grant) {
    if (link->round_to.quota == 0 || round >= static_cast<uint64_t>(link->round_to.rounds)) {
      return refuse("which this rank does not send it");
    }
    link->round_granted = std::max(link->round_granted, static_cast<int64_t>(round));
    return;
  }
  const int32_t i = RoundSenderIndex(h.from_rank);
  if (i < 0 || round >= static_cast<uint64_t>(rounds_.senders[i].rounds)) {
    return refuse("which it does not send here");
  }
  // Rounds are drained in order; the signal of a later round in flight (at most slots - 1
  // after this one) may overtake this one's.
  const RoundSender& s = rounds_.senders[i];
  const auto r = static_cast<int32_t>(round);
  if (r < round_next_[i] || r - round_next_[i] >= s.slots) return refuse("out of order");
  if (r != round_next_[i]) {
    uint8_t& early = round_early_[i][static_cast<size_t>(r % s.slots)];
    if (early != 0) return refuse("twice");
    early = 1;
    return;
  }
  for (int32_t next = r; next >= 0;) {
    absl::Status drained = DrainRound(i, next);
    if (!drained.ok()) {
      return Fail(absl::Status(
          drained.code(), absl::StrFormat("rank %d: copying landing round %d from rank %d to the "
                                          "device: %s",
                                          rank_, next, h.from_rank, drained.message())));
    }
    round_next_[i] = next + 1;
    next = -1;
    if (round_next_[i] < s.rounds) {
      uint8_t& early = round_early_[i][static_cast<size_t>(round_next_[i] % s.slots)];
      if (early != 0) next = round_next_[i];
      early = 0;
    }
  }
}

void RefitEngine::Impl::OnAbort(const wire::AmHeader& h, absl::string_view reason, ucp_ep_h from) {
  PeerLink* link = Origin(h, from, "abort");
  if (link == nullptr) return;
  if (h.epoch <= reset_floor_) return;
  if (in_epoch_ && h.epoch <= completed_) return;  // See completed_.
  link->aborted = true;
  link->aborted_epoch = std::max(link->aborted_epoch, h.epoch);
  // The reason is the peer's own error message; keep it on one printable line.
  std::string printable(reason);
  for (char& c : printable) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  // During set-up (epoch_ 0) the abort is about the first refit, which it will fail.
  link->abort_reason = absl::StrCat("rank ", rank_, ", refit epoch ", std::max(epoch_, h.epoch),
                                    ": peer ", printable);
}

// ---------------------------------------------------------------------------------------------
// Teardown.

absl::Status RefitEngine::Impl::Shutdown(absl::Time deadline) {
  // Barrier among peers, progressing the worker while waiting (peers may still be finishing
  // sends into this rank). A failed rank only arrives and does not wait: its peers are failing
  // too, and one of them may be dead.
  const std::vector<int32_t> peers = failed_ ? std::vector<int32_t>{} : PeerRanks(links_);
  absl::Status result = rendezvous::Barrier(*store_, absl::StrCat(options_.key_prefix, "/bye"),
                                            rank_, peers, deadline, [this]() {
                                              for (int i = 0; i < 64; ++i)
                                                runtime_->worker().Progress();
                                              return absl::OkStatus();
                                            });
  for (PeerLink* link : peers_) link->Close(deadline, /*force=*/false);
  return result;
}

RefitEngine::Impl::~Impl() {
  if (runtime_ == nullptr) return;
  // Every in-flight UCX request points into this engine, its links or its registered memory, so
  // none may outlive them. Endpoints are flush-closed (force-closed after a peer error) and each
  // link progresses until its requests completed, for up to 500 ms. (A forced close of a healthy
  // tcp endpoint with sends pending crashed UCX 1.13 later, in its tcp progress, so it is not
  // used to cancel them.) A link whose requests are still in flight then - the peer stalls - is
  // detached from this engine and kept until the process exits, together with the registered
  // memory its requests read and the runtime they live on (Graveyard above), so nothing UCX may
  // still touch is freed.
  const absl::Time deadline = absl::Now() + absl::Milliseconds(500);
  for (PeerLink* link : peers_) link->Close(deadline, /*force=*/false);
  runtime_->Unregister(handle_, this);
  std::vector<std::unique_ptr<PeerLink>> stalled;
  for (std::unique_ptr<PeerLink>& link : links_) {
    if (link != nullptr && link->in_flight() > 0) {
      RESHARD_LOG(kWarning,
                  "rank %d: %d request(s) to rank %d did not complete at teardown (the peer does "
                  "not progress); keeping their memory, registrations and UCX worker until exit",
                  rank_, link->in_flight(), link->peer());
      link->Orphan();
      stalled.push_back(std::move(link));
    }
  }
  links_.clear();
  if (stalled.empty()) return;
  Graveyard& graveyard = Leaked();
  std::lock_guard<std::mutex> lock(graveyard.mu);
  for (std::unique_ptr<PeerLink>& link : stalled) graveyard.links.push_back(std::move(link));
  graveyard.memory.push_back(std::move(memory_));
  graveyard.runtimes.push_back(runtime_);
}

// ---------------------------------------------------------------------------------------------
// Public wrapper.

RefitEngine::RefitEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RefitEngine::~RefitEngine() = default;

absl::StatusOr<std::unique_ptr<RefitEngine>> RefitEngine::Create(
    const plan::Plan& plan, int32_t rank, rendezvous::Store& store,
    std::shared_ptr<Runtime> runtime, std::vector<BufferView> buffers,
    const RefitEngineOptions& options) {
  return Create(std::make_shared<const plan::Plan>(plan), rank, store, std::move(runtime),
                std::move(buffers), options);
}

absl::StatusOr<std::unique_ptr<RefitEngine>> RefitEngine::Create(
    std::shared_ptr<const plan::Plan> plan, int32_t rank, rendezvous::Store& store,
    std::shared_ptr<Runtime> runtime, std::vector<BufferView> buffers,
    const RefitEngineOptions& options) {
  if (plan == nullptr) return absl::InvalidArgumentError("RefitEngine::Create: no plan");
  auto impl = std::make_unique<Impl>(std::move(plan), rank, std::move(runtime), options);
  RESHARD_RETURN_IF_ERROR(impl->Init(store, std::move(buffers)));
  return std::unique_ptr<RefitEngine>(new RefitEngine(std::move(impl)));
}

absl::Status RefitEngine::Start(uint64_t epoch) { return impl_->Start(epoch); }
absl::Status RefitEngine::Progress(std::vector<uint32_t>* landed, bool* progressed) {
  return impl_->Progress(landed, progressed);
}
absl::Status RefitEngine::Wait(absl::Time deadline) { return impl_->Wait(deadline); }
absl::Status RefitEngine::Execute(absl::Time deadline) {
  RESHARD_RETURN_IF_ERROR(impl_->Start(impl_->epoch_ + 1));
  return impl_->Wait(deadline);
}
void RefitEngine::Reset() { impl_->Reset(); }
void RefitEngine::Abort(uint64_t epoch, absl::Status why) { impl_->Abort(epoch, std::move(why)); }
void RefitEngine::HoldSource(uint32_t tensor) { impl_->held_[tensor] = 1; }
void RefitEngine::ReleaseSource(uint32_t tensor) { impl_->held_[tensor] = 0; }
bool RefitEngine::in_epoch() const { return impl_->in_epoch_; }
absl::Status RefitEngine::CheckAllPeers() const { return impl_->CheckPeers(/*all=*/true); }
const absl::Status& RefitEngine::last_status() const { return impl_->status_; }
const RefitStats& RefitEngine::last_stats() const { return impl_->stats_; }
int64_t RefitEngine::rejected_messages() const { return impl_->rejected_messages_; }
uint64_t RefitEngine::HandleId(const std::string& key_prefix, int32_t rank) {
  return Mix64(HashString(key_prefix) ^ static_cast<uint64_t>(rank));
}
uint64_t RefitEngine::last_epoch() const { return impl_->epoch_; }
ucp_ep* RefitEngine::EndpointTo(int32_t peer) const {
  if (peer < 0 || static_cast<size_t>(peer) >= impl_->links_.size()) return nullptr;
  const PeerLink* link = impl_->links_[static_cast<size_t>(peer)].get();
  return link != nullptr ? link->endpoint() : nullptr;
}
std::string RefitEngine::Transports() const {
  std::string transports = TransportsOf(impl_->peers_);
  int mapped = 0, single_copy = 0;
  for (const PeerLink* link : impl_->peers_) {
    mapped += link->has_mapped();
    single_copy += link->single_copy() != nullptr;
  }
  if (mapped > 0) {
    absl::StrAppend(&transports, transports.empty() ? "" : " ", "+ mapped copies to ", mapped,
                    " peer(s)");
  }
  if (single_copy > 0) {
    absl::StrAppend(&transports, transports.empty() ? "" : " ", "+ single-copy writes to ",
                    single_copy, " peer(s)");
  }
  return transports;
}
const char* RefitEngine::delivery() const { return impl_->delivery_->name(); }
Blocker& RefitEngine::events() { return impl_->events_; }
bool RefitEngine::peer_error_handling() const { return impl_->runtime_->peer_error_handling(); }
absl::Status RefitEngine::Shutdown(absl::Time deadline) { return impl_->Shutdown(deadline); }

}  // namespace reshard::net
