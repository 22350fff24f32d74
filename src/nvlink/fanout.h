// Intra-domain fan-out: after a piece crosses the network once into one rank of a domain (an
// NVLink domain; on a CPU host, the processes of one host), that rank copies it into the
// destination buffers of the domain's other ranks that need it and signals them per piece.
// DESIGN §4 steps 6-7.
//
// Shape of a handle (created once, executed once per refit):
//   Create():  pick a backend by capability, exchange mappings through the store once
//              (shared-memory names, CUDA IPC handles, an NCCL communicator).
//   Start(e):  grant epoch e to the peers that write into this rank (its buffers are free).
//   Landed(t): a transfer landed on this rank; forward every fan-out copy waiting on it now,
//              while later pieces are still on the network (overlap at piece granularity).
//   Poll(e):   fan-out pieces that arrived on this rank, to be counted like network pieces.
//   Check(e):  one non-blocking step of Wait (the refit session's single loop calls it).
//   Wait(e):   every fan-out piece promised to this rank arrived and every copy it sends
//              completed, or an error before the deadline.
//
// Thread model: a Fanout is thread-compatible (one thread drives it, normally the thread that
// progresses the network engine). Nothing blocks except Create() and Wait(), which take
// deadlines. Errors: InvalidArgument (the table or buffers do not match), FailedPrecondition
// (no backend can run here, or domain ranks chose different backends), Unavailable (a peer
// exited), DeadlineExceeded (a deadline passed), Internal (a system or CUDA/NCCL call failed).
#pragma once

#include <sched.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "src/common/idle.h"
#include "src/common/memory.h"
#include "src/plan/dependencies.h"
#include "src/plan/plan.h"
#include "src/rendezvous/store.h"

namespace reshard::nvlink {

using common::BufferView;
using common::MemoryKind;
using common::MemoryKindName;

// One fan-out copy: `region` read from `from_rank`'s buffer `from_buffer` (normally the
// destination buffer the piece landed in; a staging or source buffer when the plan says so) and
// written into `to_rank`'s buffer `to_buffer`, once transfer `after` has landed on `from_rank`.
struct FanoutEdge {
  uint32_t transfer = 0;  // World index (plan.transfer_id()); names the piece in signals.
  int32_t after = -1;     // World index of what must land on from_rank first; -1: none.
  uint32_t tensor = 0;
  uint32_t from_buffer = 0;  // Plan buffer ids.
  uint32_t to_buffer = 0;
  int32_t from_rank = 0;
  int32_t to_rank = 0;
  plan::Region region;  // region.dims_begin indexes FanoutTable::dims.
};

// Every fan-out copy between the ranks of one domain, in plan order. Every rank of the domain
// builds the same table (it is derived from the deterministic plan), which lets a sender know
// where the receiver expects the signal of each piece without exchanging anything per piece.
// What the table needs beyond a rank's own edges: BoardSet gives each edge the slot of its
// position among all edges into its receiver (a sender must know how many edges of other
// senders precede its own), and the NCCL backend spans every rank of the table with one
// communicator and batches the table's edges in the same groups on every rank (ranks that group
// differently can deadlock). A rank's share of the plan (plan::BuildRankPlan) therefore keeps
// every fan-out transfer between two ranks of its domain; grants, forwards, buffer checks and
// peer liveness use only the rank's own edges.
struct FanoutTable {
  std::vector<FanoutEdge> edges;
  std::vector<plan::RegionDim> dims;
  std::vector<std::string> tensor_names;  // For error messages; indexed by FanoutEdge::tensor.

  // The kFanout transfers of `plan` whose two ranks are both in `domain`, named by world index.
  // `plan` is the world plan or the share of a rank of `domain`: both give the same table.
  static FanoutTable FromPlan(const plan::Plan& plan, const std::vector<int32_t>& domain);
  // Appends one edge (tests and the benchmark build tables by hand).
  void Add(uint32_t transfer, int32_t after, uint32_t tensor, uint32_t from_buffer,
           uint32_t to_buffer, int32_t from_rank, int32_t to_rank, const plan::Region& region,
           const plan::RegionDim* region_dims);
  const plan::RegionDim* dims_of(const FanoutEdge& e) const {
    return dims.data() + e.region.dims_begin;
  }
};

struct FanoutOptions {
  // "auto" (by capability: host memory -> host; CUDA memory -> cuda_ipc, then nccl), or the
  // name of one backend ("host", "cuda_ipc", "nccl"); a named backend that cannot run here is
  // FailedPrecondition, never a silent fallback.
  std::string backend = "auto";
  // Store keys of this handle start with this prefix (several handles may share one store).
  std::string key_prefix = "reshard";
  // Deadline for Create()'s exchanges through the store.
  absl::Duration setup_timeout = absl::Seconds(30);
  // NCCL: fan-out edges per grouped send/recv batch.
  int nccl_batch_edges = 16;
  // NCCL: device staging per rank (allocated once at Create()), into which a batch's pieces for
  // each peer are packed for one ncclSend and from which received streams are unpacked. A batch
  // that needs more runs in several rounds. A multiple of 16, at least 256; every rank of a
  // domain must use the same value, and the same nccl_batch_edges (checked at Create()).
  int64_t gpu_staging_bytes = int64_t{64} << 20;
  // CUDA IPC: copy every region with the strided copy kernel, never with the copy engines
  // (cudaMemcpy/2D/3DAsync); for tests and measurements.
  bool cuda_ipc_kernel_only = false;
};

// Per-epoch figures, reset by Start().
struct FanoutStats {
  int64_t forwards = 0;    // Fan-out copies this rank sent.
  int64_t bytes_sent = 0;  // Bytes this rank copied into peers.
  int64_t arrivals = 0;    // Fan-out pieces that arrived on this rank.
  int64_t bytes_received = 0;
  double busy_seconds = 0;     // Time this rank spent with a forward in flight.
  double hidden_seconds = 0;   // Part of busy_seconds inside this rank's network stage.
  double network_seconds = 0;  // Start() to the last network landing reported by Landed().
  // hidden_seconds / busy_seconds (1 when nothing was forwarded): the share of fan-out time
  // that hides under this rank's own network stage (strict: the copy of the last piece to land
  // here never counts).
  double hidden_fraction = 1;
  // The same against the domain's network stage: until the last network landing on this rank
  // or on any domain peer it exchanges pieces with (a peer still receiving counts as "now").
  // Final once NetworkDone() was called and Wait() returned.
  double domain_hidden_seconds = 0;
  double domain_hidden_fraction = 1;
};

// A backend moves bytes and signals; the Fanout drives it. Implementations live in
// src/nvlink/<name>/ and are created through their factory.
class FanoutBackend {
 public:
  virtual ~FanoutBackend() = default;
  virtual const char* name() const = 0;
  // Makes epoch `epoch` writable by peers (this rank's buffers are free for it).
  [[nodiscard]] virtual absl::Status Grant(uint64_t epoch) = 0;
  // True when `peer` granted `epoch` (a forward to it may start).
  virtual bool Granted(int32_t peer, uint64_t epoch) = 0;
  // Starts copying edge `edge` (index in the table) for `epoch`; the peer granted it. Returns
  // true when the copy already completed and the peer was signalled (synchronous backends);
  // false when Progress() will report its completion.
  [[nodiscard]] virtual absl::StatusOr<bool> Forward(uint32_t edge, uint64_t epoch) = 0;
  // Progresses; appends edges (table indices) that arrived on this rank for `epoch` and
  // outgoing edges whose copy completed and was signalled.
  [[nodiscard]] virtual absl::Status Progress(uint64_t epoch, std::vector<uint32_t>* arrived,
                                              std::vector<uint32_t>* completed) = 0;
  // OK while every rank of `peers` lives; Unavailable naming the first one that exited. Only
  // the peers this rank still depends on are asked: a peer that received everything it needed
  // from this rank may finish its refits and exit normally.
  [[nodiscard]] virtual absl::Status CheckPeers(const std::vector<int32_t>& peers) = 0;
  // Mappings created so far (shared-memory maps, opened IPC handles, communicators).
  virtual int64_t mappings_created() const = 0;
  // Statistics only: publish when this rank's network stage of `epoch` ended (Unix ns), and
  // read a peer's (0: not ended yet, -1: this backend cannot tell).
  virtual void PublishNetworkEnd(uint64_t epoch, int64_t unix_ns) {}
  virtual int64_t PeerNetworkEnd(int32_t peer, uint64_t epoch) { return -1; }
  // Tells the domain peers that this rank failed `epoch` (with a one-line reason): CheckPeers
  // on a peer still waiting for this rank then returns Unavailable. Backends without a shared
  // board to publish on (NCCL) do nothing: their peers learn it at their deadline.
  virtual void PublishFailure(uint64_t epoch, absl::string_view reason) {}
  // Called by idle waits (src/common/idle.h) after a Progress() that found nothing: returns
  // when a peer may have signalled an arrival or granted an epoch, or after at most `timeout`.
  // Backends without an event to sleep on (NCCL) yield the core.
  virtual void Block(absl::Duration timeout) { sched_yield(); }
};

// Everything a backend factory sees.
struct FanoutContext {
  const FanoutTable* table = nullptr;
  int32_t rank = 0;
  std::vector<int32_t> domain;  // Sorted ranks of this rank's domain.
  rendezvous::Store* store = nullptr;
  std::vector<BufferView> buffers;
  FanoutOptions options;
};

// tensorpipe-style: a backend that cannot run here says so in Viable().
class FanoutFactory {
 public:
  virtual ~FanoutFactory() = default;
  virtual const char* name() const = 0;
  // OK when this backend can run for `ctx` on this machine (local checks only); otherwise
  // FailedPrecondition with the reason.
  [[nodiscard]] virtual absl::Status Viable(const FanoutContext& ctx) const = 0;
  // Creates the backend: maps peers once. Blocks on the store until options.setup_timeout.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<FanoutBackend>> Create(
      const FanoutContext& ctx) const = 0;
};

// Every backend this build knows, in auto-selection order (host, cuda_ipc, nccl); backends not
// compiled in are listed and say so through Viable().
std::vector<const FanoutFactory*> AllFactories();

// A Blocker (src/common/idle.h): idle waits sleep on the backend's event.
class Fanout : public Blocker {
 public:
  // Builds this rank's fan-out for `table` (a domain's edges). Collective over the ranks of
  // `domain` that appear in the table; ranks of the domain with no edge may skip it.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Fanout>> Create(
      FanoutTable table, int32_t rank, std::vector<int32_t> domain, rendezvous::Store& store,
      std::vector<BufferView> buffers, const FanoutOptions& options = {});
  ~Fanout();
  Fanout(const Fanout&) = delete;
  Fanout& operator=(const Fanout&) = delete;

  const char* backend_name() const;
  const FanoutTable& table() const { return *table_; }
  int64_t incoming() const { return static_cast<int64_t>(incoming_.size()); }
  int64_t outgoing() const { return static_cast<int64_t>(outgoing_.size()); }
  // True when `transfer` is a fan-out edge this rank sends or receives.
  bool Handles(uint32_t transfer) const;
  int64_t mappings_created() const;

  // Enters `epoch` (strictly increasing): grants it to the peers and resets the stats.
  [[nodiscard]] absl::Status Start(uint64_t epoch);
  // `transfer` (any kind, by world index) landed on this rank: forwards every edge waiting on it.
  [[nodiscard]] absl::Status Landed(uint32_t transfer, uint64_t epoch);
  // Forwards one outgoing edge, given by its world transfer index, now or as soon as the peer
  // granted the epoch. InvalidArgument when this rank does not send it.
  [[nodiscard]] absl::Status Forward(uint32_t transfer, uint64_t epoch);
  // Progresses and appends to `arrived` (when not null) the world transfer indices of fan-out
  // pieces that arrived on this rank since the last call (each exactly once per epoch). Does not
  // block or allocate once `arrived` has grown to the epoch's size.
  [[nodiscard]] absl::Status Poll(uint64_t epoch, std::vector<uint32_t>* arrived);
  // One non-blocking step of Wait(): progresses, checks (every few ms) that the peers this rank
  // still waits for live, and once `deadline` passed returns DeadlineExceeded naming the first
  // missing piece. OK while the epoch is pending or done (Done() tells which). The refit
  // session calls this from its single progress loop.
  [[nodiscard]] absl::Status Check(uint64_t epoch, absl::Time deadline);
  // Blocks until every incoming piece of `epoch` arrived and every outgoing copy completed.
  // Unavailable when a peer exited, DeadlineExceeded naming the first missing piece.
  [[nodiscard]] absl::Status Wait(uint64_t epoch, absl::Time deadline);
  // True when Wait() would return OK now.
  bool Done() const;
  // Whether this rank waits for something only domain peers or its own copies bring: an
  // incoming piece, a grant, a copy in flight (outgoing edges whose piece has not landed here
  // wait on the network instead).
  bool WaitsOnDomainPeers() const;
  // Sleeps until a peer may have signalled or granted something (FanoutBackend::Block).
  void Block(absl::Duration timeout) override { backend_->Block(timeout); }
  // Statistics only: every network piece of `epoch` landed on this rank (call when the network
  // engine finished receiving). Publishes the time to the domain peers.
  void NetworkDone(uint64_t epoch);
  // This rank's refit `epoch` failed (`why`, from any layer): domain peers still waiting on its
  // copies or grants fail at once with Unavailable naming this rank (FanoutBackend::
  // PublishFailure), also for an epoch this rank failed before starting the fan-out layer. Once
  // per epoch; ignored for epochs before the current one.
  void Abort(uint64_t epoch, const absl::Status& why);

  // Figures of the current (or last) epoch; hidden_* final once Wait() returned OK.
  const FanoutStats& stats() const { return stats_; }

 private:
  Fanout(std::unique_ptr<FanoutTable> table, int32_t rank, std::unique_ptr<FanoutBackend> backend);
  absl::Status Pump(uint64_t epoch);
  void FinishStats();

  std::unique_ptr<FanoutTable> table_;  // Backends point into it: never moves.
  int32_t rank_;
  std::unique_ptr<FanoutBackend> backend_;
  std::vector<uint32_t> incoming_, outgoing_;  // Table indices.
  // Table indices of this rank's outgoing edges per `after` transfer.
  plan::DependencyIndex after_;  // Outgoing edges by the transfer they wait for.
  std::vector<std::pair<uint32_t, uint32_t>> by_transfer_;  // (transfer, edge), sorted.
  uint64_t epoch_ = 0;
  std::vector<uint32_t> waiting_grant_;   // Edges to forward once their peer granted.
  std::vector<uint32_t> ready_arrivals_;  // Plan transfer indices not yet returned by Poll().
  std::vector<uint8_t> arrived_, forwarded_, completed_;  // Per table edge, this epoch.
  int64_t arrived_count_ = 0, completed_count_ = 0;
  absl::Time epoch_start_, network_end_;
  std::vector<std::pair<absl::Time, absl::Time>> busy_;  // Forward in flight intervals.
  absl::Time busy_since_ = absl::InfinitePast();
  bool network_done_ = false;
  uint64_t aborted_epoch_ = 0;  // The last epoch Abort() published.
  bool stats_final_ = false;    // FinishStats() ran since Done() became true.
  std::vector<int32_t> peers_;  // Ranks this rank exchanges fan-out pieces with.
  int64_t in_flight_ = 0;
  static constexpr absl::Duration kPeerCheckInterval = absl::Milliseconds(5);
  absl::Time next_peer_check_ = absl::InfinitePast();
  // Reused every Pump()/Check() so the per-refit path does not allocate.
  std::vector<uint32_t> scratch_arrived_, scratch_completed_;
  std::vector<int32_t> scratch_peers_;
  FanoutStats stats_;
};

}  // namespace reshard::nvlink
