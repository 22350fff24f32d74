#include "src/net/refit_engine.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/common/hash.h"
#include "src/common/status.h"
#include "src/cuda/runtime.h"
#include "src/net/ucx/context.h"
#include "src/net/ucx/endpoint.h"
#include "src/net/ucx/memory.h"
#include "src/net/ucx/status.h"
#include "src/net/ucx/tls.h"
#include "src/net/ucx/worker.h"

namespace reshard::net {

int64_t RegistrationCount() { return ucx::RegistrationCount(); }

namespace {

using plan::Side;
using plan::Transfer;
using plan::TransferKind;

// Active message ids. Every message starts with an AmHeader naming the handle, so several
// handles can share the process's worker.
constexpr unsigned kGrantAm = 11;  // destination -> source: "you may write epoch E".
constexpr unsigned kDoneAm = 12;   // source -> destination: "pieces [..] of epoch E landed".
constexpr unsigned kAbortAm = 13;  // any -> peers: "my epoch E failed: <reason>".
constexpr unsigned kDataAm = 14;   // source -> destination: one run of a piece (delivery kAm).
constexpr unsigned kHelloAm = 15;  // peer -> peer, once in Create: "my endpoint to you works".
constexpr uint32_t kMagic = 0x52534844;  // "RSHD"
// Piece indices per completion message, small enough to stay eager on every transport.
constexpr size_t kMaxIndicesPerSignal = 256;
// Largest active message carrying data (delivery kActiveMessage).
constexpr int64_t kAmChunkBytes = int64_t{256} << 10;

struct AmHeader {
  uint32_t magic = kMagic;
  int32_t from_rank = 0;
  uint64_t handle = 0;
  uint64_t epoch = 0;
};
struct DataHeader {
  AmHeader base;
  uint32_t transfer = 0;
  uint32_t packed = 0;     // 1: to_offset is an offset in the transfer's packed stream.
  uint64_t to_offset = 0;  // Bytes from the start of the receiving buffer.
};

// kAuto: active messages when UCX_TLS names tcp and no RDMA transport (see the header).
bool UseActiveMessages(RefitEngineOptions::Delivery delivery) {
  if (const char* env = std::getenv("RESHARD_DELIVERY")) {
    if (std::string(env) == "am") return true;
    if (std::string(env) == "put") return false;
  }
  if (delivery != RefitEngineOptions::Delivery::kAuto) {
    return delivery == RefitEngineOptions::Delivery::kActiveMessage;
  }
  const ucx::TlsSelection tls = ucx::TlsSelection::FromEnvironment();
  return !tls.ucx_chooses && tls.Names("tcp") && !tls.rdma();
}

std::string Hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(bytes.size() * 2, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    out[2 * i] = kDigits[b >> 4];
    out[2 * i + 1] = kDigits[b & 15];
  }
  return out;
}

absl::StatusOr<std::string> Unhex(const std::string& text, const std::string& what) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (text.size() % 2 != 0) return absl::DataLossError(absl::StrCat("malformed ", what));
  std::string out(text.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(text[2 * i]), lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return absl::DataLossError(absl::StrCat("malformed ", what));
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

void AppendU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
bool ReadU64(const std::string& in, size_t& pos, uint64_t& v) {
  if (pos + 8 > in.size()) return false;
  std::memcpy(&v, in.data() + pos, 8);
  pos += 8;
  return true;
}

class Runtime;

bool Executes(const Transfer& t, bool execute_fanout) {
  return t.kind != TransferKind::kFanout || execute_fanout;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The engine.

class RefitEngine::Impl {
 public:
  struct Run {
    const uint8_t* local;
    uint64_t remote;  // Remote address, or a local destination address for local copies.
    size_t bytes;
  };
  // One transfer this rank executes (as the sender or a local copy).
  struct SendDesc {
    uint32_t transfer;
    int32_t peer;  // == rank_ for local copies.
    uint32_t run_begin, run_end;
    int64_t bytes;
    ucp_rkey_h rkey = nullptr;
    ucp_mem_h memh = nullptr;
    bool staged_dst = false;  // Local copy into a staged destination buffer.
    // Packed (short runs): runs_ describe the packed stream, gathered from `pack_from`.
    bool packed = false;
    uint8_t* pack_to = nullptr;
  };
  struct Batch {
    Impl* engine;
    int32_t peer;
    std::vector<uint32_t> transfers;
    int64_t bytes = 0;
    AmHeader header;
    bool flushed = false;
    bool signalled = false;
    bool abandoned = false;  // Of an epoch that was Reset: never signalled, not counted.
    int pending_ams = 0;
  };
  struct Peer {
    bool active = false;
    // Declared before `rkeys` so keys are destroyed first.
    std::unique_ptr<ucx::Endpoint> endpoint;
    std::vector<std::unique_ptr<ucx::RemoteKey>> rkeys;  // By buffer id; null when unused.
    std::vector<uint64_t> remote_base;                   // By buffer id.
    std::vector<uint32_t> initial;  // Descs without dependencies, in plan order.
    bool sends_to = false;          // This rank puts into the peer.
    bool receives_from = false;     // The peer puts into this rank (this rank grants it).
    int64_t expected_from = 0;      // Pieces per epoch from this peer.
    uint64_t granted = 0;           // Latest epoch the peer granted this rank.
    bool aborted = false;
    std::string abort_reason;
    // Per epoch.
    bool started = false;        // Granted and initial sends queued.
    std::deque<uint32_t> ready;  // Descs whose dependencies landed.
    int64_t cursor_desc = -1;    // Desc being posted, and its next run.
    uint32_t cursor_run = 0;
    Batch* open = nullptr;
    int64_t unsignalled = 0;     // Sends of this epoch not yet signalled.
    int64_t remaining_from = 0;  // Pieces of this epoch not yet landed from this peer.
    int grants_in_flight = 0;
    AmHeader grant_header;
    AmHeader hello_header;  // Stable header memory for the wire-up message (Create).
  };

  Impl(const plan::Plan& plan, int32_t rank, const RefitEngineOptions& options)
      : plan_(plan), rank_(rank), options_(options) {}
  ~Impl();

  absl::Status Init(rendezvous::Store& store, std::vector<BufferView> buffers);
  absl::Status Start(uint64_t epoch);
  absl::Status Progress(std::vector<uint32_t>* landed);
  absl::Status Wait(absl::Time deadline);
  void Reset();
  absl::Status Shutdown(absl::Time deadline);
  std::string Transports() const;

  // AM handlers (called from Worker::Progress through the runtime).
  void OnGrant(const AmHeader& h);
  void OnHello(const AmHeader& h);
  void OnDone(const AmHeader& h, const uint32_t* indices, size_t count);
  void OnData(const DataHeader& h, const void* data, size_t length);
  void OnAbort(const AmHeader& h, const std::string& reason);

  uint64_t handle() const { return handle_; }
  // Messages to `rank` carry its handle id, so several ranks may share one process (tests).
  uint64_t HandleOf(int32_t rank) const {
    return Mix64(HashString(options_.key_prefix) ^ static_cast<uint64_t>(rank));
  }

  const plan::Plan plan_;
  const int32_t rank_;
  const RefitEngineOptions options_;
  uint64_t handle_ = 0;
  rendezvous::Store* store_ = nullptr;

  // Dependency order: the runtime (context + worker) outlives regions and peers.
  std::shared_ptr<Runtime> runtime_;
  std::vector<BufferView> buffers_;
  std::vector<uint8_t*> reg_addr_;  // Address the engine moves data from/to (staging or data).
  std::vector<void*> staging_;      // Pinned staging per buffer, or null.
  std::vector<std::unique_ptr<ucx::MemoryRegion>> regions_;
  std::vector<Peer> peers_;
  std::vector<bool> hello_from_;  // By rank: its wire-up message arrived (Create).

  std::vector<Run> runs_;
  std::vector<DataHeader> data_headers_;  // One per run (delivery kActiveMessage): stable
                                          // header memory for sends in flight.
  std::vector<SendDesc> descs_;
  std::vector<uint32_t> local_initial_;  // Local descs without dependencies.
  absl::flat_hash_map<uint32_t, std::vector<uint32_t>> dependents_;  // transfer -> descs.
  std::vector<uint32_t> received_;      // Transfers landing here that the engine executes.
  std::vector<uint64_t> landed_epoch_;  // By transfer index.
  std::vector<int64_t> landed_bytes_;   // By transfer index (delivery kActiveMessage).
  bool am_data_ = false;                // Delivery kActiveMessage.
  // Packing of short-run regions (see RefitEngineOptions::pack_below_run_bytes).
  std::vector<uint8_t> send_scratch_;  // Packed streams this rank sends, back to back.
  std::unique_ptr<ucx::MemoryRegion> send_scratch_region_;
  std::vector<uint8_t> recv_scratch_;  // Packed streams landing here (delivery kPut).
  std::unique_ptr<ucx::MemoryRegion> recv_scratch_region_;
  absl::flat_hash_map<uint32_t, int64_t> recv_offset_;  // Transfer -> offset in recv_scratch_.
  bool IsPacked(const Transfer& t) const {
    if (t.from_rank == t.to_rank || !Executes(t, options_.execute_fanout)) return false;
    const plan::Region& r = plan_.region(t.region);
    return r.ndims > 0 && r.run_bytes < options_.pack_below_run_bytes;
  }
  // Copies [begin, begin + length) of transfer t's packed stream from `packed` into place.
  void Unpack(const Transfer& t, int64_t begin, const uint8_t* packed, int64_t length);

  // Epoch state.
  uint64_t epoch_ = 0;
  bool in_epoch_ = false;
  bool failed_ = false;
  absl::Status status_;
  RefitStats stats_;
  absl::Time started_at_;
  int64_t remaining_ = 0;  // Pieces still to land here.
  int64_t unsignalled_total_ = 0;
  int outstanding_puts_ = 0;
  std::deque<uint32_t> local_ready_;
  std::list<std::unique_ptr<Batch>> batches_;
  std::vector<uint32_t> landed_out_;
  struct AbortMessage {
    AmHeader header;
    std::string reason;
  };
  std::deque<AbortMessage> aborts_;  // Kept until destruction: sends are not awaited.
  size_t idle_spins_ = 0;
  bool abort_pending_ = false;
  uint64_t reset_floor_ = 0;  // Aborts about epochs <= this predate the last Reset.

 private:
  absl::Status ExchangeFingerprints(rendezvous::Store& store, absl::Time deadline);
  absl::Status RegisterBuffers(rendezvous::Store& store, std::vector<BufferView> buffers);
  absl::Status ConnectPeers(rendezvous::Store& store, absl::Time deadline);
  absl::Status BuildDescriptors();
  absl::Status WireUp(rendezvous::Store& store, absl::Time deadline);

  void Pump();
  void PumpOnce();
  bool Complete() const;
  void Fail(absl::Status status);
  void BroadcastAbort();
  void MarkLanded(uint32_t transfer);
  void PostPuts();
  void CloseBatch(Peer& peer);
  void SignalBatches();
  void RunLocalCopies();
  absl::Status CheckPeers();
  std::string PendingSummary() const;

  static void OnPutDone(void* request, ucs_status_t status, void* user_data);
  static void OnFlushDone(void* request, ucs_status_t status, void* user_data);
  static void OnSignalSent(void* request, ucs_status_t status, void* user_data);
  static void OnGrantSent(void* request, ucs_status_t status, void* user_data);
};

namespace {

// The process-wide UCX context and worker (one worker per process, see worker.h), shared by
// every live engine; AM handlers dispatch on the handle id in the message header.
class Runtime {
 public:
  static absl::StatusOr<std::shared_ptr<Runtime>> Get() {
    static std::mutex mu;
    static std::weak_ptr<Runtime> current;
    std::lock_guard<std::mutex> lock(mu);
    if (auto existing = current.lock()) return existing;
    auto runtime = std::shared_ptr<Runtime>(new Runtime());
    RESHARD_ASSIGN_OR_RETURN(runtime->context, ucx::Context::Create());
    RESHARD_ASSIGN_OR_RETURN(runtime->worker, ucx::Worker::Create(*runtime->context));
    RESHARD_RETURN_IF_ERROR(
        runtime->worker->SetAmHandler(kGrantAm, &OnAm<kGrantAm>, runtime.get()));
    RESHARD_RETURN_IF_ERROR(runtime->worker->SetAmHandler(kDoneAm, &OnAm<kDoneAm>, runtime.get()));
    RESHARD_RETURN_IF_ERROR(
        runtime->worker->SetAmHandler(kAbortAm, &OnAm<kAbortAm>, runtime.get()));
    RESHARD_RETURN_IF_ERROR(runtime->worker->SetAmHandler(kDataAm, &OnDataAm, runtime.get()));
    RESHARD_RETURN_IF_ERROR(
        runtime->worker->SetAmHandler(kHelloAm, &OnAm<kHelloAm>, runtime.get()));
    current = runtime;
    return runtime;
  }

  std::unique_ptr<ucx::Context> context;  // Declared first: destroyed last.
  std::unique_ptr<ucx::Worker> worker;
  absl::flat_hash_map<uint64_t, RefitEngine::Impl*> engines;

 private:
  Runtime() = default;

  static ucs_status_t OnDataAm(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Runtime*>(arg);
    if (header_length != sizeof(DataHeader)) return UCS_OK;
    DataHeader h;
    std::memcpy(&h, header, sizeof(h));
    if (h.base.magic != kMagic) return UCS_OK;
    auto it = self->engines.find(h.base.handle);
    if (it == self->engines.end()) return UCS_OK;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      it->second->OnAbort(h.base, "received a rendezvous data message (protocol error)");
      return UCS_OK;
    }
    it->second->OnData(h, data, length);
    return UCS_OK;
  }

  template <unsigned kId>
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Runtime*>(arg);
    if (header_length != sizeof(AmHeader)) return UCS_OK;
    AmHeader h;
    std::memcpy(&h, header, sizeof(h));
    if (h.magic != kMagic) return UCS_OK;
    auto it = self->engines.find(h.handle);
    if (it == self->engines.end()) return UCS_OK;  // A handle that is gone: stale message.
    RefitEngine::Impl* engine = it->second;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      // Messages are sent eager; a rendezvous one is a protocol error.
      engine->OnAbort(h, "received a rendezvous control message (protocol error)");
      return UCS_OK;
    }
    if constexpr (kId == kGrantAm) {
      engine->OnGrant(h);
    } else if constexpr (kId == kHelloAm) {
      engine->OnHello(h);
    } else if constexpr (kId == kDoneAm) {
      std::vector<uint32_t> indices(length / sizeof(uint32_t));
      if (!indices.empty()) std::memcpy(indices.data(), data, indices.size() * sizeof(uint32_t));
      engine->OnDone(h, indices.data(), indices.size());
    } else {
      engine->OnAbort(h, std::string(static_cast<const char*>(data), length));
    }
    return UCS_OK;
  }
};

ucs_memory_type_t UcsMemoryType(MemoryKind kind) {
  return kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Set-up.

absl::Status RefitEngine::Impl::Init(rendezvous::Store& store, std::vector<BufferView> buffers) {
  store_ = &store;
  const absl::Time deadline = absl::Now() + options_.setup_timeout;
  if (rank_ < 0 || rank_ >= plan_.world_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d is outside the plan's world of %d ranks", rank_, plan_.world_size()));
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
  handle_ = HandleOf(rank_);
  am_data_ = UseActiveMessages(options_.delivery);

  // 1. Fingerprints first: a mismatched rank must fail before anything is registered or written.
  RESHARD_RETURN_IF_ERROR(ExchangeFingerprints(store, deadline));

  RESHARD_ASSIGN_OR_RETURN(runtime_, Runtime::Get());
  if (runtime_->engines.contains(handle_)) {
    return absl::AlreadyExistsError(absl::StrCat("a refit handle with key prefix \"",
                                                 options_.key_prefix, "\" for rank ", rank_,
                                                 " already exists in this process"));
  }
  hello_from_.assign(static_cast<size_t>(plan_.world_size()), false);
  runtime_->engines[handle_] = this;

  RESHARD_RETURN_IF_ERROR(RegisterBuffers(store, std::move(buffers)));
  RESHARD_RETURN_IF_ERROR(ConnectPeers(store, deadline));
  RESHARD_RETURN_IF_ERROR(BuildDescriptors());
  // 5. Wire-up completion: no rank leaves Create while a peer may still need it to progress.
  RESHARD_RETURN_IF_ERROR(WireUp(store, deadline));
  return absl::OkStatus();
}

absl::Status RefitEngine::Impl::ExchangeFingerprints(rendezvous::Store& store, absl::Time deadline) {
  const std::string mine = absl::StrFormat("%016x/%d", plan_.fingerprint(), plan_.world_size());
  RESHARD_RETURN_IF_ERROR(store.Set(absl::StrCat(options_.key_prefix, "/fp/", rank_), mine));
  for (int32_t r = 0; r < plan_.world_size(); ++r) {
    if (r == rank_) continue;
    absl::StatusOr<std::string> theirs =
        store.Get(absl::StrCat(options_.key_prefix, "/fp/", r), deadline);
    if (!theirs.ok()) {
      return absl::Status(
          theirs.status().code(),
          absl::StrCat("rank ", rank_, ": waiting for the plan fingerprint of rank ", r, ": ",
                       std::string(theirs.status().message())));
    }
    if (*theirs != mine) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "plan fingerprint mismatch: rank %d planned %s (fingerprint/world) but rank %d planned "
          "%s; every rank must be given the same spec, nothing was written",
          rank_, mine, r, *theirs));
    }
  }
  return absl::OkStatus();
}

absl::Status RefitEngine::Impl::RegisterBuffers(rendezvous::Store& store, std::vector<BufferView> buffers) {
  const ucx::Context& context = *runtime_->context;
  buffers_ = std::move(buffers);
  const size_t n = buffers_.size();
  reg_addr_.assign(n, nullptr);
  staging_.assign(n, nullptr);
  regions_.resize(n);
  std::string rkeys;  // Serialized: per destination buffer id, address, bytes, packed key.
  for (size_t b = 0; b < n; ++b) {
    BufferView& buf = buffers_[b];
    reg_addr_[b] = static_cast<uint8_t*>(buf.data);
    if (buf.bytes == 0) continue;
    ucs_memory_type_t type = UCS_MEMORY_TYPE_HOST;
    if (buf.kind == MemoryKind::kCuda) {
      if (context.supports_cuda_memory()) {
        type = UcsMemoryType(buf.kind);
      } else {
        std::string why;
        if (cuda::CudaDeviceCount(&why) == 0) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "buffer \"%s\" on rank %d is CUDA memory but no CUDA device is usable: %s",
              plan_.buffers()[b].name, rank_, why));
        }
        // Debian-style UCX without CUDA memory: stage through pinned host memory.
        RESHARD_ASSIGN_OR_RETURN(staging_[b], cuda::AllocPinned(static_cast<size_t>(buf.bytes)));
        reg_addr_[b] = static_cast<uint8_t*>(staging_[b]);
      }
    }
    RESHARD_ASSIGN_OR_RETURN(
        regions_[b],
        ucx::MemoryRegion::Map(context, reg_addr_[b], static_cast<size_t>(buf.bytes), type));
    if (plan_.buffers()[b].side != Side::kSrc) {  // Destination and staging buffers.
      RESHARD_ASSIGN_OR_RETURN(std::string packed, regions_[b]->PackRkey());
      AppendU64(rkeys, b);
      AppendU64(rkeys, reinterpret_cast<uint64_t>(reg_addr_[b]));
      AppendU64(rkeys, packed.size());
      rkeys += packed;
    }
  }
  // Landing area for packed streams (puts only): one slot per packed transfer into this rank,
  // in plan order; every sender computes the same offsets from the plan.
  int64_t recv_bytes = 0;
  for (auto [it, end] = plan_.receives(rank_); it != end; ++it) {
    const Transfer& t = plan_.transfers()[*it];
    if (!IsPacked(t)) continue;
    recv_offset_[*it] = recv_bytes;
    recv_bytes += plan_.region(t.region).bytes;
  }
  if (recv_bytes > 0 && !am_data_) {
    recv_scratch_.assign(static_cast<size_t>(recv_bytes), 0);
    RESHARD_ASSIGN_OR_RETURN(recv_scratch_region_,
                             ucx::MemoryRegion::Map(context, recv_scratch_.data(),
                                                    recv_scratch_.size(), UCS_MEMORY_TYPE_HOST));
    RESHARD_ASSIGN_OR_RETURN(std::string packed, recv_scratch_region_->PackRkey());
    AppendU64(rkeys, n);  // Id one past the plan's buffers: the packed landing area.
    AppendU64(rkeys, reinterpret_cast<uint64_t>(recv_scratch_.data()));
    AppendU64(rkeys, packed.size());
    rkeys += packed;
  }
  RESHARD_RETURN_IF_ERROR(store.Set(absl::StrCat(options_.key_prefix, "/addr/", rank_),
                                    Hex(runtime_->worker->address())));
  RESHARD_RETURN_IF_ERROR(
      store.Set(absl::StrCat(options_.key_prefix, "/rkeys/", rank_), Hex(rkeys)));
  return absl::OkStatus();
}

absl::Status RefitEngine::Impl::ConnectPeers(rendezvous::Store& store, absl::Time deadline) {
  peers_.resize(plan_.world_size());
  const auto& transfers = plan_.transfers();
  for (auto [it, end] = plan_.sends(rank_); it != end; ++it) {
    const Transfer& t = transfers[*it];
    if (t.to_rank == rank_ || !Executes(t, options_.execute_fanout)) continue;
    peers_[t.to_rank].active = true;
    peers_[t.to_rank].sends_to = true;
  }
  for (auto [it, end] = plan_.receives(rank_); it != end; ++it) {
    const Transfer& t = transfers[*it];
    if (!Executes(t, options_.execute_fanout)) continue;
    received_.push_back(*it);
    if (t.from_rank == rank_) continue;
    peers_[t.from_rank].active = true;
    peers_[t.from_rank].receives_from = true;
    peers_[t.from_rank].expected_from++;
  }
  const bool peer_errors = runtime_->context->peer_error_handling();
  for (int32_t r = 0; r < plan_.world_size(); ++r) {
    Peer& peer = peers_[r];
    if (!peer.active) continue;
    auto fetch = [&](const std::string& what) -> absl::StatusOr<std::string> {
      absl::StatusOr<std::string> hex =
          store.Get(absl::StrCat(options_.key_prefix, "/", what, "/", r), deadline);
      if (!hex.ok()) {
        return absl::Status(hex.status().code(),
                            absl::StrCat("rank ", rank_, ": waiting for the ", what, " of rank ", r,
                                         ": ", std::string(hex.status().message())));
      }
      return Unhex(*hex, absl::StrCat(what, " of rank ", r));
    };
    RESHARD_ASSIGN_OR_RETURN(std::string address, fetch("addr"));
    RESHARD_ASSIGN_OR_RETURN(peer.endpoint,
                             ucx::Endpoint::Create(*runtime_->worker, address, r, peer_errors));
    peer.rkeys.resize(plan_.buffers().size() + 1);  // + the packed landing area.
    peer.remote_base.assign(plan_.buffers().size() + 1, 0);
    if (!peer.sends_to) continue;
    RESHARD_ASSIGN_OR_RETURN(std::string rkeys, fetch("rkeys"));
    size_t pos = 0;
    while (pos < rkeys.size()) {
      uint64_t id = 0, base = 0, size = 0;
      if (!ReadU64(rkeys, pos, id) || !ReadU64(rkeys, pos, base) || !ReadU64(rkeys, pos, size) ||
          pos + size > rkeys.size() || id > plan_.buffers().size()) {
        return absl::DataLossError(absl::StrCat("malformed remote keys of rank ", r));
      }
      RESHARD_ASSIGN_OR_RETURN(peer.rkeys[id],
                               ucx::RemoteKey::Unpack(*peer.endpoint, rkeys.substr(pos, size)));
      peer.remote_base[id] = base;
      pos += size;
    }
  }
  return absl::OkStatus();
}

// Why: UCX wire-up is not finished when ucp_ep_create returns. An endpoint's first messages
// (and, on connect-to-endpoint transports such as tcp, the connection itself) need the peer to
// progress its worker, and UCX 1.13's shared-memory transports map the peer's segments and
// exchange wire-up messages through its FIFO. A rank that left Create while peers were still
// creating endpoints to it, then stopped progressing (blocked on a store barrier, or a trainer
// computing for seconds), left those peers half wired; the failures surfaced as ucp_ep_create
// "Shared memory error" and crashes inside UCX on the slower ranks. So Create ends with:
//   a. one eager active message to every peer over the new endpoint, and waiting (progressing)
//      until every peer's message arrived here and ours completed: both directions of every
//      endpoint pair carry traffic, so their wire-up is done;
//   b. a store barrier among the peers under `<key_prefix>/wired/<rank>`, progressing while
//      waiting, so no rank returns before each of its peers finished step a.
// Both are bounded by Create's deadline; a lost peer fails them with Unavailable (endpoints with
// peer error handling) or DeadlineExceeded, naming the peer.
absl::Status RefitEngine::Impl::WireUp(rendezvous::Store& store, absl::Time deadline) {
  struct Pending {
    int32_t peer;
    void* request;
  };
  std::vector<Pending> pending;
  // Requests still in flight when this returns are released (UCX frees them on completion);
  // nothing they reference is freed before the endpoints are closed.
  auto release = [&pending]() {
    for (const Pending& p : pending) ucp_request_free(p.request);
    pending.clear();
  };
  for (int32_t r = 0; r < plan_.world_size(); ++r) {
    Peer& peer = peers_[r];
    if (!peer.active) continue;
    peer.hello_header = AmHeader{kMagic, rank_, HandleOf(r), 0};
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t req = ucp_am_send_nbx(peer.endpoint->get(), kHelloAm, &peer.hello_header,
                                           sizeof(AmHeader), nullptr, 0, &param);
    if (UCS_PTR_IS_ERR(req)) {
      release();
      return ucx::ToStatus(UCS_PTR_STATUS(req), "ucp_am_send_nbx (wire-up)",
                           absl::StrCat("rank ", rank_, " to peer rank ", r));
    }
    if (req != nullptr) pending.push_back({r, req});
  }
  int idle = 0;
  while (true) {
    const unsigned events = runtime_->worker->Progress();
    for (size_t i = 0; i < pending.size();) {
      const ucs_status_t st = ucp_request_check_status(pending[i].request);
      if (st == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      const int32_t r = pending[i].peer;
      ucp_request_free(pending[i].request);
      pending[i] = pending.back();
      pending.pop_back();
      if (st != UCS_OK) {
        release();
        return ucx::ToStatus(st, "ucp_am_send_nbx (wire-up)",
                             absl::StrCat("rank ", rank_, " to peer rank ", r));
      }
    }
    int32_t missing = -1;
    for (int32_t r = 0; r < plan_.world_size(); ++r) {
      const Peer& peer = peers_[r];
      if (!peer.active) continue;
      if (!peer.endpoint->error().ok()) {
        release();
        return absl::UnavailableError(absl::StrCat("rank ", rank_, ": wiring up with rank ", r,
                                                   ": ",
                                                   std::string(peer.endpoint->error().message())));
      }
      if (peer.aborted) {
        release();
        return absl::UnavailableError(peer.abort_reason);
      }
      if (!hello_from_[r] && missing < 0) missing = r;
    }
    if (missing < 0 && pending.empty()) break;
    if (absl::Now() >= deadline) {
      const int32_t r = missing >= 0 ? missing : pending.front().peer;
      release();
      return absl::DeadlineExceededError(absl::StrCat("rank ", rank_, ": wiring up with rank ", r,
                                                      " did not finish within the set-up timeout (",
                                                      absl::FormatDuration(options_.setup_timeout),
                                                      ")"));
    }
    // Many ranks may share few cores: give the core away while nothing happens.
    idle = events == 0 ? idle + 1 : 0;
    if (idle >= 4) sched_yield();
  }
  // Barrier among peers, progressing this worker while waiting.
  RESHARD_RETURN_IF_ERROR(store.Set(absl::StrCat(options_.key_prefix, "/wired/", rank_), "1"));
  for (int32_t r = 0; r < plan_.world_size(); ++r) {
    if (!peers_[r].active) continue;
    while (true) {
      absl::StatusOr<std::string> v =
          store.Get(absl::StrCat(options_.key_prefix, "/wired/", r),
                    std::min(deadline, absl::Now() + absl::Milliseconds(5)));
      if (v.ok()) break;
      if (v.status().code() != absl::StatusCode::kDeadlineExceeded || absl::Now() >= deadline) {
        return absl::Status(v.status().code(), absl::StrCat("rank ", rank_, ": waiting for rank ",
                                                            r, " to finish wiring up: ",
                                                            std::string(v.status().message())));
      }
      for (int i = 0; i < 64; ++i) runtime_->worker->Progress();
      if (!peers_[r].endpoint->error().ok()) {
        return absl::UnavailableError(absl::StrCat(
            "rank ", rank_, ": waiting for rank ", r,
            " to finish wiring up: ", std::string(peers_[r].endpoint->error().message())));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RefitEngine::Impl::BuildDescriptors() {
  const auto& transfers = plan_.transfers();
  landed_epoch_.assign(transfers.size(), 0);
  landed_bytes_.assign(transfers.size(), 0);
  // Packed streams this rank sends, and where each lands in its receiver's landing area.
  int64_t send_bytes = 0;
  absl::flat_hash_map<uint32_t, int64_t> send_offset;
  absl::flat_hash_map<int32_t, absl::flat_hash_map<uint32_t, int64_t>> remote_offset;
  for (auto [it, end] = plan_.sends(rank_); it != end; ++it) {
    const Transfer& t = transfers[*it];
    if (!IsPacked(t)) continue;
    send_offset[*it] = send_bytes;
    send_bytes += plan_.region(t.region).bytes;
    if (!remote_offset.contains(t.to_rank)) {
      auto& offsets = remote_offset[t.to_rank];
      int64_t off = 0;
      for (auto [rit, rend] = plan_.receives(t.to_rank); rit != rend; ++rit) {
        const Transfer& rt = transfers[*rit];
        if (!IsPacked(rt)) continue;
        offsets[*rit] = off;
        off += plan_.region(rt.region).bytes;
      }
    }
  }
  if (send_bytes > 0) {
    send_scratch_.assign(static_cast<size_t>(send_bytes), 0);
    RESHARD_ASSIGN_OR_RETURN(send_scratch_region_,
                             ucx::MemoryRegion::Map(*runtime_->context, send_scratch_.data(),
                                                    send_scratch_.size(), UCS_MEMORY_TYPE_HOST));
  }
  for (auto [it, end] = plan_.sends(rank_); it != end; ++it) {
    const uint32_t ti = *it;
    const Transfer& t = transfers[ti];
    if (!Executes(t, options_.execute_fanout)) continue;
    const uint32_t from_buf = plan_.buffer_of(t.tensor, t.from_side);
    const uint32_t to_buf = plan_.buffer_of(t.tensor, t.to_side);
    SendDesc d;
    d.transfer = ti;
    d.peer = t.to_rank;
    d.run_begin = static_cast<uint32_t>(runs_.size());
    const plan::Region& region = plan_.region(t.region);
    d.bytes = region.bytes;
    const uint8_t* local_base = reg_addr_[from_buf];
    uint64_t remote_base = 0;
    if (t.to_rank == rank_) {
      remote_base = reinterpret_cast<uint64_t>(reg_addr_[to_buf]);
      d.staged_dst = staging_[to_buf] != nullptr;
    } else {
      Peer& peer = peers_[t.to_rank];
      if (peer.rkeys[to_buf] == nullptr) {
        return absl::DataLossError(absl::StrFormat(
            "rank %d published no remote key for buffer \"%s\" that rank %d must write (tensor "
            "\"%s\")",
            t.to_rank, plan_.buffers()[to_buf].name, rank_, plan_.spec().tensors[t.tensor].name));
      }
      d.rkey = peer.rkeys[to_buf]->get();
      // Puts address the peer's memory; active messages carry the offset in its buffer.
      remote_base = am_data_ ? 0 : peer.remote_base[to_buf];
      if (regions_[from_buf] != nullptr) d.memh = regions_[from_buf]->get();
    }
    // Active messages are eager and reassembled whole at the target: cut long runs into
    // chunks so the receiver copies one while the next is on the wire.
    const int64_t chunk = am_data_ && t.to_rank != rank_ ? kAmChunkBytes : INT64_MAX;
    if (IsPacked(t)) {
      // One contiguous stream: gathered into send_scratch_ when posted, put into the receiver's
      // landing area (or sent in chunks as active messages, offsets within the stream).
      d.packed = true;
      d.pack_to = send_scratch_.data() + send_offset[ti];
      d.memh = send_scratch_region_->get();
      uint64_t base = 0;
      if (!am_data_) {
        Peer& peer = peers_[t.to_rank];
        const size_t scratch_id = plan_.buffers().size();
        if (peer.rkeys[scratch_id] == nullptr) {
          return absl::DataLossError(
              absl::StrFormat("rank %d published no landing area for packed pieces from rank %d",
                              t.to_rank, rank_));
        }
        d.rkey = peer.rkeys[scratch_id]->get();
        base = peer.remote_base[scratch_id] + static_cast<uint64_t>(remote_offset[t.to_rank][ti]);
      }
      for (int64_t done = 0; done < region.bytes; done += chunk) {
        runs_.push_back(Run{d.pack_to + done, base + static_cast<uint64_t>(done),
                            static_cast<size_t>(std::min(chunk, region.bytes - done))});
      }
    } else
      plan::ForEachRun(region, plan_.region_dims(region),
                       [&](int64_t from_off, int64_t to_off, int64_t bytes) {
                         for (int64_t done = 0; done < bytes; done += chunk) {
                           runs_.push_back(Run{local_base + from_off + done,
                                               remote_base + static_cast<uint64_t>(to_off + done),
                                               static_cast<size_t>(std::min(chunk, bytes - done))});
                         }
                       });
    d.run_end = static_cast<uint32_t>(runs_.size());
    const uint32_t di = static_cast<uint32_t>(descs_.size());
    descs_.push_back(d);
    if (t.after >= 0) {
      dependents_[static_cast<uint32_t>(t.after)].push_back(di);
    } else if (t.to_rank == rank_) {
      local_initial_.push_back(di);
    } else {
      peers_[t.to_rank].initial.push_back(di);
    }
  }
  data_headers_.resize(am_data_ ? runs_.size() : 0);
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
  started_at_ = absl::Now();
  remaining_ = static_cast<int64_t>(received_.size());
  for (uint32_t t : received_) landed_bytes_[t] = 0;
  unsignalled_total_ = 0;
  local_ready_.assign(local_initial_.begin(), local_initial_.end());
  landed_out_.clear();
  for (Peer& peer : peers_) {
    if (!peer.active) continue;
    peer.started = false;
    peer.ready.clear();
    peer.cursor_desc = -1;
    peer.cursor_run = 0;
    peer.open = nullptr;
    peer.remaining_from = peer.expected_from;
  }
  for (const SendDesc& d : descs_) {
    if (d.peer != rank_) {
      peers_[d.peer].unsignalled++;
      unsignalled_total_++;
    }
  }
  for (uint32_t r = 0; r < peers_.size(); ++r) {
    Peer& peer = peers_[r];
    if (!peer.active) continue;
    if (!peer.endpoint->error().ok() || peer.aborted) {
      Fail(peer.aborted ? absl::UnavailableError(peer.abort_reason) : peer.endpoint->error());
      BroadcastAbort();
      return status_;
    }
    if (!peer.receives_from) continue;
    // Grant: the destination buffers are free for this epoch.
    peer.grant_header = AmHeader{kMagic, rank_, HandleOf(static_cast<int32_t>(r)), epoch};
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.cb.send = &Impl::OnGrantSent;
    param.user_data = &peer;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t req = ucp_am_send_nbx(peer.endpoint->get(), kGrantAm, &peer.grant_header,
                                           sizeof(AmHeader), nullptr, 0, &param);
    if (UCS_PTR_IS_ERR(req)) {
      Fail(ucx::ToStatus(UCS_PTR_STATUS(req), "ucp_am_send_nbx (grant)",
                         absl::StrCat("peer rank ", r)));
      BroadcastAbort();
      return status_;
    }
    if (req != nullptr) peer.grants_in_flight++;
  }
  if (am_data_) {
    // Empty pieces carry no data message: they land as soon as the epoch starts.
    for (uint32_t t : received_) {
      const Transfer& tr = plan_.transfers()[t];
      if (tr.from_rank != rank_ && plan_.region(tr.region).bytes == 0) MarkLanded(t);
    }
  }
  // Staged source buffers: device -> pinned host before any put reads them.
  for (size_t b = 0; b < buffers_.size(); ++b) {
    if (staging_[b] != nullptr && plan_.buffers()[b].side == Side::kSrc) {
      absl::Status st = cuda::CudaCopy(staging_[b], buffers_[b].data, buffers_[b].bytes);
      if (!st.ok()) {
        Fail(st);
        BroadcastAbort();
        return status_;
      }
    }
  }
  Pump();
  return status_;
}

void RefitEngine::Impl::Pump() {
  PumpOnce();
  BroadcastAbort();
}

void RefitEngine::Impl::PumpOnce() {
  if (!in_epoch_) {
    runtime_->worker->Progress();
    return;
  }
  bool busy = false;
  for (int i = 0; i < 16 && runtime_->worker->Progress() > 0; ++i) busy = true;
  if (!status_.ok()) return;
  absl::Status peers = CheckPeers();
  if (!peers.ok()) {
    Fail(peers);
    return;
  }
  for (Peer& peer : peers_) {
    if (!peer.active || !peer.sends_to || peer.started || peer.granted < epoch_) continue;
    peer.started = true;
    for (uint32_t d : peer.initial) peer.ready.push_back(d);
    busy = true;
  }
  const int before = outstanding_puts_;
  PostPuts();
  SignalBatches();
  if (!local_ready_.empty()) busy = true;
  RunLocalCopies();
  busy = busy || outstanding_puts_ != before;
  if (status_.ok() && Complete()) {
    in_epoch_ = false;
    stats_.seconds = absl::ToDoubleSeconds(absl::Now() - started_at_);
    return;
  }
  if (busy) {
    idle_spins_ = 0;
  } else if (++idle_spins_ > 4) {
    // Many processes may share few cores while puts are emulated with active messages: let the
    // peer that has to progress them run.
    sched_yield();
  }
}

void RefitEngine::Impl::PostPuts() {
  bool any = true;
  while (any && status_.ok()) {
    any = false;
    for (uint32_t r = 0; r < peers_.size(); ++r) {
      Peer& peer = peers_[r];
      if (!peer.active || !peer.started) continue;
      // Post one descriptor's worth of runs (bounded), round-robin over peers.
      if (peer.cursor_desc < 0) {
        if (peer.ready.empty()) {
          if (peer.open != nullptr) CloseBatch(peer);
          continue;
        }
        peer.cursor_desc = peer.ready.front();
        peer.ready.pop_front();
        peer.cursor_run = descs_[peer.cursor_desc].run_begin;
      }
      SendDesc& d = descs_[peer.cursor_desc];
      if (d.packed && peer.cursor_run == d.run_begin) {
        // Gather the short runs (the source holds this epoch's data since Start).
        const Transfer& t = plan_.transfers()[d.transfer];
        const plan::Region& region = plan_.region(t.region);
        const uint32_t from_buf = plan_.buffer_of(t.tensor, t.from_side);
        const uint8_t* from = reg_addr_[from_buf];
        const bool device =
            buffers_[from_buf].kind == MemoryKind::kCuda && staging_[from_buf] == nullptr;
        int64_t pos = 0;
        plan::ForEachRun(region, plan_.region_dims(region),
                         [&](int64_t from_off, int64_t, int64_t n) {
                           if (device) {
                             absl::Status st =
                                 cuda::CudaCopy(d.pack_to + pos, from + from_off, static_cast<size_t>(n));
                             if (!st.ok()) Fail(st);
                           } else {
                             std::memcpy(d.pack_to + pos, from + from_off, static_cast<size_t>(n));
                           }
                           pos += n;
                         });
        if (!status_.ok()) return;
      }
      while (peer.cursor_run < d.run_end) {
        if (outstanding_puts_ >= options_.max_outstanding_puts) return;
        const Run& run = runs_[peer.cursor_run];
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        param.cb.send = &Impl::OnPutDone;
        param.user_data = this;
        if (d.memh != nullptr) {
          param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
          param.memh = d.memh;
        }
        ucs_status_ptr_t req;
        if (am_data_) {
          DataHeader& h = data_headers_[peer.cursor_run];
          h = DataHeader{AmHeader{kMagic, rank_, HandleOf(static_cast<int32_t>(r)), epoch_},
                         d.transfer, d.packed ? 1u : 0u, run.remote};
          param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
          param.flags = UCP_AM_SEND_FLAG_EAGER;
          req = ucp_am_send_nbx(peer.endpoint->get(), kDataAm, &h, sizeof(h), run.local, run.bytes,
                                &param);
        } else {
          req = ucp_put_nbx(peer.endpoint->get(), run.local, run.bytes, run.remote, d.rkey, &param);
        }
        stats_.puts++;
        if (UCS_PTR_IS_ERR(req)) {
          Fail(ucx::ToStatus(
              UCS_PTR_STATUS(req), "ucp_put_nbx",
              absl::StrCat("peer rank ", r, ", tensor \"",
                           plan_.spec().tensors[plan_.transfers()[d.transfer].tensor].name, "\"")));
          return;
        }
        if (req != nullptr) outstanding_puts_++;
        peer.cursor_run++;
      }
      stats_.bytes_network_sent += d.bytes;
      if (am_data_) {
        // Landing is counted by the receiver byte by byte; nothing to flush or signal.
        peer.unsignalled--;
        unsignalled_total_--;
        peer.cursor_desc = -1;
        any = true;
        continue;
      }
      if (peer.open == nullptr) {
        auto batch = std::make_unique<Batch>();
        batch->engine = this;
        batch->peer = static_cast<int32_t>(r);
        peer.open = batch.get();
        batches_.push_back(std::move(batch));
      }
      peer.open->transfers.push_back(d.transfer);
      peer.open->bytes += d.bytes;
      peer.cursor_desc = -1;
      if (peer.open->bytes >= options_.signal_batch_bytes) CloseBatch(peer);
      any = true;
    }
  }
}

// Completion signals follow ucp_ep_flush_nbx, not ucp_worker_fence: a fence only orders RMA
// against later RMA, while the signal is an active message that may travel on another lane (and
// puts themselves are active messages on these transports). A flush completes when every earlier
// put on the endpoint is remotely complete, so the receiver never counts a piece before its bytes
// are in place. Its cost (one round trip) is paid per batch of pieces, not per piece.
void RefitEngine::Impl::CloseBatch(Peer& peer) {
  Batch* batch = peer.open;
  peer.open = nullptr;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &Impl::OnFlushDone;
  param.user_data = batch;
  ucs_status_ptr_t req = ucp_ep_flush_nbx(peer.endpoint->get(), &param);
  if (UCS_PTR_IS_ERR(req)) {
    Fail(ucx::ToStatus(UCS_PTR_STATUS(req), "ucp_ep_flush_nbx",
                       absl::StrCat("peer rank ", batch->peer)));
    return;
  }
  if (req == nullptr) batch->flushed = true;
}

void RefitEngine::Impl::SignalBatches() {
  for (auto it = batches_.begin(); it != batches_.end() && status_.ok();) {
    Batch& batch = **it;
    if (batch.flushed && !batch.signalled) {
      batch.signalled = true;
      batch.header = AmHeader{kMagic, rank_, HandleOf(batch.peer), epoch_};
      Peer& peer = peers_[batch.peer];
      for (size_t i = 0; i < batch.transfers.size(); i += kMaxIndicesPerSignal) {
        const size_t n = std::min(kMaxIndicesPerSignal, batch.transfers.size() - i);
        ucp_request_param_t param{};
        param.op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
        param.cb.send = &Impl::OnSignalSent;
        param.user_data = &batch;
        param.flags = UCP_AM_SEND_FLAG_EAGER;
        ucs_status_ptr_t req =
            ucp_am_send_nbx(peer.endpoint->get(), kDoneAm, &batch.header, sizeof(AmHeader),
                            batch.transfers.data() + i, n * sizeof(uint32_t), &param);
        stats_.signals++;
        if (UCS_PTR_IS_ERR(req)) {
          Fail(ucx::ToStatus(UCS_PTR_STATUS(req), "ucp_am_send_nbx (completion signal)",
                             absl::StrCat("peer rank ", batch.peer)));
          return;
        }
        if (req != nullptr) batch.pending_ams++;
      }
    }
    if (batch.flushed && batch.signalled && batch.pending_ams == 0) {
      if (!batch.abandoned) {
        Peer& peer = peers_[batch.peer];
        const auto n = static_cast<int64_t>(batch.transfers.size());
        peer.unsignalled -= n;
        unsignalled_total_ -= n;
      }
      it = batches_.erase(it);
    } else {
      ++it;
    }
  }
}

void RefitEngine::Impl::RunLocalCopies() {
  while (!local_ready_.empty() && status_.ok()) {
    const SendDesc& d = descs_[local_ready_.front()];
    local_ready_.pop_front();
    const Transfer& t = plan_.transfers()[d.transfer];
    const uint32_t from_buf = plan_.buffer_of(t.tensor, t.from_side);
    const uint32_t to_buf = plan_.buffer_of(t.tensor, t.to_side);
    // Device memory registered directly (CUDA-enabled UCX): copy with the CUDA runtime.
    const bool device =
        (buffers_[from_buf].kind == MemoryKind::kCuda && staging_[from_buf] == nullptr) ||
        (buffers_[to_buf].kind == MemoryKind::kCuda && staging_[to_buf] == nullptr);
    for (uint32_t i = d.run_begin; i < d.run_end; ++i) {
      const Run& run = runs_[i];
      void* dst = reinterpret_cast<void*>(run.remote);
      if (device) {
        absl::Status st = cuda::CudaCopy(dst, run.local, run.bytes);
        if (!st.ok()) {
          Fail(st);
          return;
        }
      } else {
        std::memcpy(dst, run.local, run.bytes);
      }
    }
    stats_.bytes_local += d.bytes;
    MarkLanded(d.transfer);
  }
}

void RefitEngine::Impl::MarkLanded(uint32_t ti) {
  const Transfer& t = plan_.transfers()[ti];
  if (landed_epoch_[ti] == epoch_) return;
  landed_epoch_[ti] = epoch_;
  remaining_--;
  stats_.pieces_received++;
  const plan::Region& region = plan_.region(t.region);
  if (t.from_rank != rank_) {
    stats_.bytes_network_received += region.bytes;
    peers_[t.from_rank].remaining_from--;
  }
  const uint32_t to_buf = plan_.buffer_of(t.tensor, t.to_side);
  if (staging_[to_buf] != nullptr) {
    // Staged destination: the piece landed in pinned host memory; move it to the device.
    auto* device = static_cast<uint8_t*>(buffers_[to_buf].data);
    const uint8_t* host = static_cast<const uint8_t*>(staging_[to_buf]);
    plan::ForEachRun(region, plan_.region_dims(region), [&](int64_t, int64_t to_off, int64_t n) {
      if (!status_.ok()) return;
      absl::Status st = cuda::CudaCopy(device + to_off, host + to_off, static_cast<size_t>(n));
      if (!st.ok()) Fail(st);
    });
  }
  landed_out_.push_back(ti);
  auto it = dependents_.find(ti);
  if (it == dependents_.end()) return;
  for (uint32_t di : it->second) {
    const SendDesc& d = descs_[di];
    if (d.peer == rank_) {
      local_ready_.push_back(di);
    } else {
      peers_[d.peer].ready.push_back(di);
    }
  }
}

absl::Status RefitEngine::Impl::CheckPeers() {
  for (const Peer& peer : peers_) {
    if (!peer.active) continue;
    const bool involved =
        peer.remaining_from > 0 || peer.unsignalled > 0 || peer.grants_in_flight > 0;
    if (!involved) continue;
    if (peer.aborted) return absl::UnavailableError(peer.abort_reason);
    if (!peer.endpoint->error().ok()) {
      return absl::UnavailableError(absl::StrCat("rank ", rank_, ", refit epoch ", epoch_, ": ",
                                                 std::string(peer.endpoint->error().message())));
    }
  }
  return absl::OkStatus();
}

bool RefitEngine::Impl::Complete() const {
  if (remaining_ != 0 || unsignalled_total_ != 0 || !local_ready_.empty() ||
      outstanding_puts_ != 0) {
    return false;
  }
  for (const Peer& peer : peers_) {
    if (peer.grants_in_flight > 0) return false;
  }
  return true;
}

std::string RefitEngine::Impl::PendingSummary() const {
  std::vector<std::string> parts;
  for (uint32_t r = 0; r < peers_.size(); ++r) {
    const Peer& peer = peers_[r];
    if (!peer.active) continue;
    if (peer.remaining_from > 0) {
      parts.push_back(absl::StrCat(peer.remaining_from, " piece(s) from rank ", r));
    }
    if (peer.unsignalled > 0) {
      parts.push_back(
          absl::StrCat(peer.unsignalled, " piece(s) to rank ", r,
                       peer.started ? "" : absl::StrCat(" (no grant for epoch ", epoch_, " yet)")));
    }
  }
  return parts.empty() ? "local work" : absl::StrJoin(parts, ", ");
}

// Safe inside UCX callbacks: only records the failure. BroadcastAbort() tells the peers.
void RefitEngine::Impl::Fail(absl::Status status) {
  if (!status_.ok()) return;
  status_ = std::move(status);
  failed_ = true;
  in_epoch_ = false;
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
  for (uint32_t r = 0; r < peers_.size(); ++r) {
    Peer& peer = peers_[r];
    if (!peer.active || !peer.endpoint->error().ok()) continue;
    AbortMessage& msg = aborts_.emplace_back(
        AbortMessage{AmHeader{kMagic, rank_, HandleOf(static_cast<int32_t>(r)), epoch_}, reason});
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t req =
        ucp_am_send_nbx(peer.endpoint->get(), kAbortAm, &msg.header, sizeof(AmHeader),
                        msg.reason.data(), msg.reason.size(), &param);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) ucp_request_free(req);
  }
  // Push the aborts out for a moment; their buffers live until the engine is destroyed.
  const absl::Time until = absl::Now() + absl::Milliseconds(50);
  while (absl::Now() < until) {
    if (runtime_->worker->Progress() == 0) sched_yield();
  }
}

absl::Status RefitEngine::Impl::Progress(std::vector<uint32_t>* landed) {
  if (failed_) return status_;
  Pump();
  if (landed != nullptr) landed->insert(landed->end(), landed_out_.begin(), landed_out_.end());
  landed_out_.clear();
  return status_;
}

absl::Status RefitEngine::Impl::Wait(absl::Time deadline) {
  if (failed_) return status_;
  if (!in_epoch_ && epoch_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank_, ": no epoch was started"));
  }
  while (status_.ok() && in_epoch_) {
    Pump();
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
  // Take in what peers already sent about the failed epoch (aborts, late signals) before
  // forgetting it; later aborts about epochs up to this one are ignored.
  const absl::Time until = absl::Now() + absl::Milliseconds(100);
  for (int idle = 0; idle < 16 && absl::Now() < until;) {
    idle = runtime_->worker->Progress() > 0 ? 0 : idle + 1;
  }
  reset_floor_ = std::max(reset_floor_, epoch_);
  failed_ = false;
  in_epoch_ = false;
  status_ = absl::OkStatus();
  for (Peer& peer : peers_) {
    peer.aborted = false;
    peer.abort_reason.clear();
    peer.unsignalled = 0;
    peer.remaining_from = 0;
  }
  unsignalled_total_ = 0;
  remaining_ = 0;
  local_ready_.clear();
  // Batches whose flush or signal is still in flight keep their memory until they finish.
  for (auto it = batches_.begin(); it != batches_.end();) {
    Batch& b = **it;
    if (b.flushed && b.pending_ams == 0) {
      it = batches_.erase(it);
    } else {
      b.signalled = true;  // Never signal a failed epoch's batch.
      b.abandoned = true;
      ++it;
    }
  }
}

void RefitEngine::Impl::OnGrant(const AmHeader& h) {
  if (h.from_rank < 0 || h.from_rank >= static_cast<int32_t>(peers_.size())) return;
  Peer& peer = peers_[h.from_rank];
  if (h.epoch > peer.granted) peer.granted = h.epoch;
}

void RefitEngine::Impl::OnHello(const AmHeader& h) {
  if (h.from_rank < 0 || static_cast<size_t>(h.from_rank) >= hello_from_.size()) return;
  hello_from_[h.from_rank] = true;
}

void RefitEngine::Impl::OnDone(const AmHeader& h, const uint32_t* indices, size_t count) {
  if (!in_epoch_ || h.epoch != epoch_) return;  // A failed or abandoned epoch's signal.
  const auto& transfers = plan_.transfers();
  for (size_t i = 0; i < count; ++i) {
    const uint32_t ti = indices[i];
    if (ti >= transfers.size() || transfers[ti].to_rank != rank_ ||
        transfers[ti].from_rank != h.from_rank) {
      Fail(absl::DataLossError(absl::StrCat("rank ", rank_, ": rank ", h.from_rank,
                                            " signalled transfer ", ti,
                                            " that the plan does not send it here")));
      return;
    }
    if (landed_epoch_[ti] == epoch_) continue;
    auto packed = recv_offset_.find(ti);
    if (packed != recv_offset_.end()) {
      const int64_t bytes = plan_.region(transfers[ti].region).bytes;
      Unpack(transfers[ti], 0, recv_scratch_.data() + packed->second, bytes);
      if (!status_.ok()) return;
    }
    MarkLanded(ti);
  }
}

void RefitEngine::Impl::Unpack(const Transfer& t, int64_t begin, const uint8_t* packed,
                               int64_t length) {
  const plan::Region& region = plan_.region(t.region);
  const uint32_t to_buf = plan_.buffer_of(t.tensor, t.to_side);
  uint8_t* to = reg_addr_[to_buf];
  const bool device = buffers_[to_buf].kind == MemoryKind::kCuda && staging_[to_buf] == nullptr;
  const int64_t end = begin + length;
  int64_t pos = 0;  // Offset of the current run in the packed stream.
  plan::ForEachRun(region, plan_.region_dims(region), [&](int64_t, int64_t to_off, int64_t n) {
    const int64_t lo = std::max(pos, begin), hi = std::min(pos + n, end);
    if (lo < hi && status_.ok()) {
      uint8_t* dst = to + to_off + (lo - pos);
      const uint8_t* src = packed + (lo - begin);
      if (device) {
        absl::Status st = cuda::CudaCopy(dst, src, static_cast<size_t>(hi - lo));
        if (!st.ok()) Fail(st);
      } else {
        std::memcpy(dst, src, static_cast<size_t>(hi - lo));
      }
    }
    pos += n;
  });
}

void RefitEngine::Impl::OnData(const DataHeader& h, const void* data, size_t length) {
  if (!in_epoch_ || h.base.epoch != epoch_) return;  // A failed or abandoned epoch's data.
  const auto& transfers = plan_.transfers();
  const uint32_t ti = h.transfer;
  if (ti >= transfers.size() || transfers[ti].to_rank != rank_ ||
      transfers[ti].from_rank != h.base.from_rank) {
    Fail(absl::DataLossError(absl::StrCat("rank ", rank_, ": rank ", h.base.from_rank,
                                          " sent data for transfer ", ti,
                                          " that the plan does not send it here")));
    return;
  }
  const Transfer& t = transfers[ti];
  const uint32_t to_buf = plan_.buffer_of(t.tensor, t.to_side);
  const int64_t region_bytes = plan_.region(t.region).bytes;
  if (h.packed != 0) {
    if (h.to_offset + length > static_cast<uint64_t>(region_bytes) ||
        landed_bytes_[ti] + static_cast<int64_t>(length) > region_bytes) {
      Fail(absl::DataLossError(absl::StrCat("rank ", rank_, ": rank ", h.base.from_rank,
                                            " sent packed bytes outside transfer ", ti)));
      return;
    }
    Unpack(t, static_cast<int64_t>(h.to_offset), static_cast<const uint8_t*>(data),
           static_cast<int64_t>(length));
    landed_bytes_[ti] += static_cast<int64_t>(length);
    if (status_.ok() && landed_bytes_[ti] == region_bytes) MarkLanded(ti);
    return;
  }
  if (h.to_offset + length > static_cast<uint64_t>(buffers_[to_buf].bytes) ||
      landed_bytes_[ti] + static_cast<int64_t>(length) > region_bytes) {
    Fail(absl::DataLossError(absl::StrCat("rank ", rank_, ": rank ", h.base.from_rank, " sent ",
                                          length, " bytes at offset ", h.to_offset,
                                          " outside transfer ", ti)));
    return;
  }
  if (length > 0) {
    if (buffers_[to_buf].kind == MemoryKind::kCuda && staging_[to_buf] == nullptr) {
      // Device memory registered directly (CUDA-enabled UCX).
      absl::Status st = cuda::CudaCopy(reg_addr_[to_buf] + h.to_offset, data, length);
      if (!st.ok()) {
        Fail(st);
        return;
      }
    } else {
      std::memcpy(reg_addr_[to_buf] + h.to_offset, data, length);
    }
  }
  landed_bytes_[ti] += static_cast<int64_t>(length);
  if (landed_bytes_[ti] == region_bytes) MarkLanded(ti);
}

void RefitEngine::Impl::OnAbort(const AmHeader& h, const std::string& reason) {
  if (h.from_rank < 0 || h.from_rank >= static_cast<int32_t>(peers_.size())) return;
  if (h.epoch <= reset_floor_) return;
  Peer& peer = peers_[h.from_rank];
  peer.aborted = true;
  peer.abort_reason = absl::StrCat("rank ", rank_, ", refit epoch ", epoch_, ": peer ", reason);
}

void RefitEngine::Impl::OnPutDone(void* request, ucs_status_t status, void* user_data) {
  auto* self = static_cast<Impl*>(user_data);
  self->outstanding_puts_--;
  if (status != UCS_OK && self->in_epoch_) {
    self->Fail(ucx::ToStatus(status, "ucp_put_nbx", absl::StrCat("rank ", self->rank_)));
  }
  ucp_request_free(request);
}

void RefitEngine::Impl::OnFlushDone(void* request, ucs_status_t status, void* user_data) {
  auto* batch = static_cast<Batch*>(user_data);
  batch->flushed = true;
  if (status != UCS_OK && batch->engine->in_epoch_) {
    batch->engine->Fail(
        ucx::ToStatus(status, "ucp_ep_flush_nbx", absl::StrCat("peer rank ", batch->peer)));
  }
  ucp_request_free(request);
}

void RefitEngine::Impl::OnSignalSent(void* request, ucs_status_t status, void* user_data) {
  auto* batch = static_cast<Batch*>(user_data);
  batch->pending_ams--;
  if (status != UCS_OK && batch->engine->in_epoch_) {
    batch->engine->Fail(ucx::ToStatus(status, "ucp_am_send_nbx (completion signal)",
                                      absl::StrCat("peer rank ", batch->peer)));
  }
  ucp_request_free(request);
}

void RefitEngine::Impl::OnGrantSent(void* request, ucs_status_t status, void* user_data) {
  auto* peer = static_cast<Peer*>(user_data);
  peer->grants_in_flight--;
  ucp_request_free(request);
  (void)status;  // A lost peer is reported through its endpoint.
}

std::string RefitEngine::Impl::Transports() const {
  std::vector<std::string> names;
  for (const Peer& peer : peers_) {
    if (!peer.active || peer.endpoint == nullptr) continue;
    for (absl::string_view name :
         absl::StrSplit(peer.endpoint->Transports(), ' ', absl::SkipEmpty())) {
      bool seen = false;
      for (const std::string& n : names) seen = seen || n == name;
      if (!seen) names.emplace_back(name);
    }
  }
  return absl::StrJoin(names, " ");
}

absl::Status RefitEngine::Impl::Shutdown(absl::Time deadline) {
  // Barrier among peers through the store, progressing nothing (every epoch is complete on
  // this rank, so nobody needs this worker for data), then flush-close in parallel.
  RESHARD_RETURN_IF_ERROR(store_->Set(absl::StrCat(options_.key_prefix, "/bye/", rank_), "1"));
  absl::Status result;
  for (uint32_t r = 0; r < peers_.size() && !failed_; ++r) {
    // A failed rank does not wait: its peers are failing too, and one of them may be dead.
    if (!peers_[r].active) continue;
    // Keep progressing while waiting: peers may still be finishing puts into this rank.
    while (true) {
      absl::StatusOr<std::string> v = store_->Get(absl::StrCat(options_.key_prefix, "/bye/", r),
                                                  absl::Now() + absl::Milliseconds(20));
      if (v.ok()) break;
      if (v.status().code() != absl::StatusCode::kDeadlineExceeded || absl::Now() >= deadline) {
        result = absl::Status(v.status().code(),
                              absl::StrCat("rank ", rank_, ": shutdown barrier waiting for rank ",
                                           r, ": ", std::string(v.status().message())));
        break;
      }
      for (int i = 0; i < 64; ++i) runtime_->worker->Progress();
    }
    if (!result.ok()) break;
  }
  for (Peer& peer : peers_) {
    if (peer.endpoint != nullptr) {
      peer.rkeys.clear();
      peer.endpoint->Close(deadline);
    }
  }
  return result;
}

RefitEngine::Impl::~Impl() {
  if (runtime_ == nullptr) return;
  // Keys before endpoints, endpoints (force-closed when failed) before regions and the worker.
  for (Peer& peer : peers_) peer.rkeys.clear();
  const absl::Time deadline = absl::Now() + absl::Milliseconds(500);
  for (Peer& peer : peers_) {
    if (peer.endpoint != nullptr) peer.endpoint->Close(deadline);
  }
  peers_.clear();
  batches_.clear();
  regions_.clear();
  send_scratch_region_.reset();
  recv_scratch_region_.reset();
  for (void* p : staging_) cuda::FreePinned(p);
  auto it = runtime_->engines.find(handle_);
  if (it != runtime_->engines.end() && it->second == this) runtime_->engines.erase(it);
}

// ---------------------------------------------------------------------------------------------
// Public wrapper.

RefitEngine::RefitEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RefitEngine::~RefitEngine() = default;

absl::StatusOr<std::unique_ptr<RefitEngine>> RefitEngine::Create(
    const plan::Plan& plan, int32_t rank, rendezvous::Store& store, std::vector<BufferView> buffers,
    const RefitEngineOptions& options) {
  auto impl = std::make_unique<Impl>(plan, rank, options);
  RESHARD_RETURN_IF_ERROR(impl->Init(store, std::move(buffers)));
  return std::unique_ptr<RefitEngine>(new RefitEngine(std::move(impl)));
}

absl::Status RefitEngine::Start(uint64_t epoch) { return impl_->Start(epoch); }
absl::Status RefitEngine::Progress(std::vector<uint32_t>* landed) {
  return impl_->Progress(landed);
}
absl::Status RefitEngine::Wait(absl::Time deadline) { return impl_->Wait(deadline); }
absl::Status RefitEngine::Execute(absl::Time deadline) {
  RESHARD_RETURN_IF_ERROR(impl_->Start(impl_->epoch_ + 1));
  return impl_->Wait(deadline);
}
void RefitEngine::Reset() { impl_->Reset(); }
bool RefitEngine::in_epoch() const { return impl_->in_epoch_; }
const absl::Status& RefitEngine::last_status() const { return impl_->status_; }
const RefitStats& RefitEngine::last_stats() const { return impl_->stats_; }
uint64_t RefitEngine::last_epoch() const { return impl_->epoch_; }
std::string RefitEngine::Transports() const { return impl_->Transports(); }
const char* RefitEngine::delivery() const { return impl_->am_data_ ? "am" : "put"; }
bool RefitEngine::peer_error_handling() const {
  return impl_->runtime_ != nullptr && impl_->runtime_->context->peer_error_handling();
}
absl::Status RefitEngine::Shutdown(absl::Time deadline) { return impl_->Shutdown(deadline); }

}  // namespace reshard::net
