#include "src/net/peer_link.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/common/fault.h"
#include "src/common/idle.h"
#include "src/common/log.h"
#include "src/common/status.h"
#include "src/net/registered_memory.h"
#include "src/net/ucx/status.h"

namespace reshard::net {
namespace {

enum Kind : int { kPut, kData, kGrant, kHello, kAbort, kFlush, kSignal };

const char* CallName(int kind) {
  switch (kind) {
    case kPut:
      return "ucp_put_nbx";
    case kData:
      return "ucp_am_send_nbx (data)";
    case kFlush:
      return "ucp_ep_flush_nbx";
    case kSignal:
      return "ucp_am_send_nbx (completion signal)";
    default:
      return "ucp_am_send_nbx";
  }
}

}  // namespace

class PeerLink::Done final : public ucx::Completion {
 public:
  Done(PeerLink* link, int kind, Batch* batch = nullptr, int ring_slot = -1)
      : link_(link), kind_(kind), batch_(batch), ring_slot_(ring_slot) {}
  void Complete(ucs_status_t status) override {
    link_->Completed(kind_, batch_, status, ring_slot_);
  }

 private:
  PeerLink* link_;
  int kind_;
  Batch* batch_;
  int ring_slot_;
};

struct PeerLink::Batch {
  Batch(PeerLink* link) : flush_done(link, kFlush, this), signal_done(link, kSignal, this) {}
  Done flush_done, signal_done;
  std::vector<uint32_t> transfers;
  std::vector<wire::ProgressRecord> progress;
  int64_t bytes = 0;
  wire::AmHeader header;
  bool flushed = false;
  bool flush_pending = false;  // Closed, its flush in flight.
  bool signalled = false;
  bool abandoned = false;  // Of an epoch that was Reset: never signalled, not counted.
  int pending_signals = 0;
  int64_t round = -1;  // CloseRound: the landing round its signal completes, else -1.
  uint64_t round_payload = 0;
};

PeerLink::PeerLink(int32_t rank, int32_t peer, uint64_t peer_handle, ucx::Worker& worker,
                   LinkOwner& owner)
    : rank_(rank), peer_(peer), peer_handle_(peer_handle), worker_(worker), owner_(&owner) {
  put_done_ = std::make_unique<Done>(this, kPut);
  data_done_ = std::make_unique<Done>(this, kData);
  for (int i = 0; i < kMaxRingSlots; ++i) {
    ring_put_done_[i] = std::make_unique<Done>(this, kPut, nullptr, i);
    ring_data_done_[i] = std::make_unique<Done>(this, kData, nullptr, i);
  }
  grant_done_ = std::make_unique<Done>(this, kGrant);
  hello_done_ = std::make_unique<Done>(this, kHello);
  abort_done_ = std::make_unique<Done>(this, kAbort);
}

PeerLink::~PeerLink() { Close(absl::Now() + absl::Milliseconds(500), /*force=*/false); }

absl::Status PeerLink::Connect(const std::string& address, bool peer_error_handling) {
  RESHARD_ASSIGN_OR_RETURN(endpoint_,
                           ucx::Endpoint::Create(worker_, address, peer_, peer_error_handling));
  if (early_hello_from_ != nullptr && SentBy(early_hello_from_)) hello_received = true;
  return absl::OkStatus();
}

absl::Status PeerLink::LoadRemoteKeys(const rendezvous::Record& record, uint32_t ids) {
  rkeys_.resize(ids);
  remote_base_.assign(ids, 0);
  remote_bytes_.assign(ids, 0);
  remote_host_.assign(ids, false);
  remote_shm_.assign(ids, std::string());
  auto number = [&](const std::string& field) -> absl::StatusOr<uint64_t> {
    RESHARD_ASSIGN_OR_RETURN(std::string text, rendezvous::Field(record, field, peer_));
    uint64_t value = 0;
    if (!absl::SimpleAtoi(text, &value)) {
      return absl::DataLossError(
          absl::StrCat("the remote key record of rank ", peer_, " has a malformed ", field));
    }
    return value;
  };
  for (uint32_t id = 0; id < ids; ++id) {
    auto key = record.find(KeyField(id));
    if (key == record.end()) continue;
    RESHARD_ASSIGN_OR_RETURN(const uint64_t base, number(BaseField(id)));
    RESHARD_ASSIGN_OR_RETURN(const uint64_t bytes, number(SizeField(id)));
    if (bytes > UINT64_MAX - base) {
      return absl::DataLossError(absl::StrCat("the remote key record of rank ", peer_,
                                              " names a region ", id,
                                              " that wraps around the address space"));
    }
    RESHARD_ASSIGN_OR_RETURN(rkeys_[id], ucx::RemoteKey::Unpack(*endpoint_, key->second));
    remote_base_[id] = base;
    remote_bytes_[id] = bytes;
    remote_host_[id] = record.count(HostMemoryField(id)) != 0;
    if (auto shm = record.find(SharedMemoryField(id)); shm != record.end() && remote_host_[id]) {
      remote_shm_[id] = shm->second;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PeerLink::MapSharedRegions(uint64_t pidns) {
  mapped_.assign(remote_shm_.size(), nullptr);
  if (!watched_) return 0;
  int count = 0;
  for (uint32_t id = 0; id < remote_shm_.size(); ++id) {
    if (remote_shm_[id].empty()) continue;
    RESHARD_ASSIGN_OR_RETURN(const SharedRegion region,
                             ParseSharedRegion(remote_shm_[id], peer_, id, process_.pid, pidns,
                                               remote_bytes_[id]));
    absl::StatusOr<SharedMapping> mapping = SharedMapping::Open(region.name, region.mapped);
    if (!mapping.ok()) {
      RESHARD_LOG(kWarning,
                  "rank %d cannot map rank %d's region %d (%s); its pieces there travel by "
                  "process_vm_writev or UCX puts instead",
                  rank_, peer_, id, mapping.status().message());
      continue;
    }
    mappings_.push_back(*std::move(mapping));
    mapped_[id] = mappings_.back().data() + region.offset;
    ++count;
  }
  return count;
}

bool PeerLink::SentBy(ucp_ep_h from) const {
  return from != nullptr && endpoint_ != nullptr && endpoint_->get() == from;
}

std::string PeerLink::Transports() const {
  return endpoint_ != nullptr ? endpoint_->Transports() : std::string();
}

absl::Status PeerLink::Posted(ucs_status_t status, const char* call, bool* in_flight) {
  if (in_flight != nullptr) *in_flight = status == UCS_INPROGRESS;
  if (status == UCS_INPROGRESS) {
    in_flight_++;
    return absl::OkStatus();
  }
  if (status == UCS_OK) return absl::OkStatus();
  return ucx::ToStatus(status, call, absl::StrCat("rank ", rank_, " to peer rank ", peer_));
}

absl::Status PeerLink::SendHello() {
  hello_header_ = wire::AmHeader{wire::kMagic, rank_, peer_handle_, 0};
  bool in_flight = false;
  RESHARD_RETURN_IF_ERROR(
      Posted(ucx::SendAm(endpoint_->get(), wire::kHelloAm, &hello_header_, sizeof(hello_header_),
                         nullptr, 0, nullptr, hello_done_.get()),
             "ucp_am_send_nbx (wire-up)", &in_flight));
  hello_pending_ = in_flight;
  return absl::OkStatus();
}

absl::Status PeerLink::SendGrant(uint64_t epoch, uint64_t version) {
  common::FaultPoint(common::FaultStage::kGrant, rank_, epoch);
  grant_header_ = wire::AmHeader{wire::kMagic, rank_, peer_handle_, epoch};
  grant_version_ = version;
  bool in_flight = false;
  RESHARD_RETURN_IF_ERROR(
      Posted(ucx::SendAm(endpoint_->get(), wire::kGrantAm, &grant_header_, sizeof(grant_header_),
                         &grant_version_, sizeof(grant_version_), nullptr, grant_done_.get()),
             "ucp_am_send_nbx (grant)", &in_flight));
  if (in_flight) grants_in_flight_++;
  return absl::OkStatus();
}

absl::Status PeerLink::SendRoundGrant(uint64_t epoch, int64_t round) {
  if (grants_in_flight_ == 0) round_grants_.clear();
  RoundGrant& msg = round_grants_.emplace_back(RoundGrant{
      wire::AmHeader{wire::kMagic, rank_, peer_handle_, epoch}, static_cast<uint64_t>(round)});
  bool in_flight = false;
  RESHARD_RETURN_IF_ERROR(
      Posted(ucx::SendAm(endpoint_->get(), wire::kRoundGrantAm, &msg.header, sizeof(msg.header),
                         &msg.round, sizeof(msg.round), nullptr, grant_done_.get()),
             "ucp_am_send_nbx (round grant)", &in_flight));
  if (in_flight) grants_in_flight_++;
  return absl::OkStatus();
}

void PeerLink::SendAbort(uint64_t epoch, const std::string& reason) {
  if (endpoint_ == nullptr || !endpoint_->error().ok()) return;
  // Messages whose sends all completed are dropped: a handle that fails again and again keeps
  // only the aborts still in flight.
  if (aborts_in_flight_ == 0) aborts_.clear();
  AbortMessage& msg = aborts_.emplace_back(
      AbortMessage{wire::AmHeader{wire::kMagic, rank_, peer_handle_, epoch}, reason});
  bool in_flight = false;
  (void)Posted(ucx::SendAm(endpoint_->get(), wire::kAbortAm, &msg.header, sizeof(msg.header),
                           msg.reason.data(), msg.reason.size(), nullptr, abort_done_.get()),
               "ucp_am_send_nbx (abort)", &in_flight);
  if (in_flight) aborts_in_flight_++;
}

absl::Status PeerLink::Put(const void* local, size_t bytes, uint64_t remote, ucp_rkey_h rkey,
                           ucp_mem_h memh, bool* in_flight, int ring_slot) {
  puts_since_flush_++;
  Done* done = ring_slot >= 0 ? ring_put_done_[ring_slot].get() : put_done_.get();
  return Posted(ucx::Put(endpoint_->get(), local, bytes, remote, rkey, memh, done), "ucp_put_nbx",
                in_flight);
}

void PeerLink::ReserveDataHeaders(uint32_t run_begin, uint32_t run_end) {
  run_base_ = run_begin;
  data_headers_.resize(run_end - run_begin);
}

absl::Status PeerLink::SendData(uint32_t run, const wire::DataHeader& header, const void* data,
                                size_t bytes, ucp_mem_h memh, bool* in_flight, int ring_slot) {
  wire::DataHeader& h = data_headers_[run - run_base_];
  h = header;
  h.base.handle = peer_handle_;
  Done* done = ring_slot >= 0 ? ring_data_done_[ring_slot].get() : data_done_.get();
  return Posted(
      ucx::SendAm(endpoint_->get(), wire::kDataAm, &h, sizeof(h), data, bytes, memh, done),
      "ucp_am_send_nbx (data)", in_flight);
}

int64_t PeerLink::open_batch_bytes() const { return open_ != nullptr ? open_->bytes : 0; }

void PeerLink::AddToBatch(uint32_t id, int64_t bytes) {
  if (open_ == nullptr) {
    batches_.push_back(std::make_unique<Batch>(this));
    open_ = batches_.back().get();
  }
  open_->transfers.push_back(id);
  open_->bytes += bytes;
}

void PeerLink::AddProgressToBatch(uint32_t id, int64_t bytes) {
  if (open_ == nullptr) {
    batches_.push_back(std::make_unique<Batch>(this));
    open_ = batches_.back().get();
  }
  open_->progress.push_back({id, 0, static_cast<uint64_t>(bytes)});
  progress_added_++;
}

// Completion signals follow ucp_ep_flush_nbx, not ucp_worker_fence: a fence only orders RMA
// against later RMA, while the signal is an active message that may travel on another lane (and
// puts themselves are active messages on these transports). A flush completes when every earlier
// put on the endpoint is remotely complete, so the receiver never counts a piece before its bytes
// are in place. Its cost (one round trip) is paid per batch of pieces, not per piece.
absl::Status PeerLink::CloseBatch() {
  Batch* batch = open_;
  open_ = nullptr;
  if (batch == nullptr) return absl::OkStatus();
  if (puts_since_flush_ == 0) {
    // Only single-copy writes since the last flush: they were complete when process_vm_writev
    // returned, and there is nothing of UCX's to flush before the signal.
    batch->flushed = true;
    return absl::OkStatus();
  }
  puts_since_flush_ = 0;
  bool in_flight = false;
  RESHARD_RETURN_IF_ERROR(
      Posted(ucx::Flush(endpoint_->get(), &batch->flush_done), "ucp_ep_flush_nbx", &in_flight));
  batch->flushed = !in_flight;
  batch->flush_pending = in_flight;
  return absl::OkStatus();
}

absl::Status PeerLink::CloseRound(int64_t round) {
  if (open_ == nullptr) {
    batches_.push_back(std::make_unique<Batch>(this));
    open_ = batches_.back().get();
  }
  open_->round = round;
  puts_since_flush_ = std::max<int64_t>(puts_since_flush_, 1);  // Flush whatever was posted.
  return CloseBatch();
}

absl::Status PeerLink::SignalBatches(uint64_t epoch, int64_t* signals, int64_t* retired) {
  for (auto it = batches_.begin(); it != batches_.end();) {
    Batch& batch = **it;
    if (batch.flushed && !batch.signalled) {
      common::FaultPoint(common::FaultStage::kSignals, rank_, epoch);
      batch.signalled = true;
      batch.header = wire::AmHeader{wire::kMagic, rank_, peer_handle_, epoch};
      for (size_t i = 0; i < batch.transfers.size(); i += wire::kMaxIndicesPerSignal) {
        const size_t n = std::min(wire::kMaxIndicesPerSignal, batch.transfers.size() - i);
        bool in_flight = false;
        (*signals)++;
        RESHARD_RETURN_IF_ERROR(
            Posted(ucx::SendAm(endpoint_->get(), wire::kDoneAm, &batch.header, sizeof(batch.header),
                               batch.transfers.data() + i, n * sizeof(uint32_t), nullptr,
                               &batch.signal_done),
                   "ucp_am_send_nbx (completion signal)", &in_flight));
        if (in_flight) batch.pending_signals++;
      }
      for (size_t i = 0; i < batch.progress.size(); i += wire::kMaxProgressPerSignal) {
        const size_t n = std::min(wire::kMaxProgressPerSignal, batch.progress.size() - i);
        bool in_flight = false;
        (*signals)++;
        RESHARD_RETURN_IF_ERROR(
            Posted(ucx::SendAm(endpoint_->get(), wire::kProgressAm, &batch.header,
                               sizeof(batch.header), batch.progress.data() + i,
                               n * sizeof(wire::ProgressRecord), nullptr, &batch.signal_done),
                   "ucp_am_send_nbx (progress)", &in_flight));
        if (in_flight) batch.pending_signals++;
      }
      progress_signalled_ += static_cast<int64_t>(batch.progress.size());
      if (batch.round >= 0) {
        batch.round_payload = static_cast<uint64_t>(batch.round);
        bool in_flight = false;
        RESHARD_RETURN_IF_ERROR(
            Posted(ucx::SendAm(endpoint_->get(), wire::kRoundAm, &batch.header,
                               sizeof(batch.header), &batch.round_payload,
                               sizeof(batch.round_payload), nullptr, &batch.signal_done),
                   "ucp_am_send_nbx (landing round)", &in_flight));
        if (in_flight) batch.pending_signals++;
      }
    }
    if (batch.flushed && batch.signalled && batch.pending_signals == 0) {
      if (!batch.abandoned) {
        *retired += static_cast<int64_t>(batch.transfers.size()) + (batch.round >= 0 ? 1 : 0);
      }
      it = batches_.erase(it);
    } else {
      ++it;
    }
  }
  return absl::OkStatus();
}

void PeerLink::AbandonBatches() {
  if (single_copy_ != nullptr) single_copy_->Discard();
  open_ = nullptr;
  progress_signalled_ = progress_added_;  // A failed epoch's are never signalled.
  // Batches whose flush or signal is still in flight keep their memory until they finish.
  for (auto it = batches_.begin(); it != batches_.end();) {
    Batch& b = **it;
    if (!b.flush_pending && b.pending_signals == 0) {
      it = batches_.erase(it);
    } else {
      b.signalled = true;  // Never signal a failed epoch's batch.
      b.abandoned = true;
      ++it;
    }
  }
}

void PeerLink::Completed(int kind, Batch* batch, ucs_status_t status, int ring_slot) {
  in_flight_--;
  switch (kind) {
    case kPut:
    case kData:
      owner_->OnPutCompleted(ring_slot);
      break;
    case kGrant:
      grants_in_flight_--;
      return;  // A lost peer is reported through its endpoint.
    case kHello:
      hello_pending_ = false;
      if (status != UCS_OK && hello_status_.ok()) {
        hello_status_ = ucx::ToStatus(status, "ucp_am_send_nbx (wire-up)",
                                      absl::StrCat("rank ", rank_, " to peer rank ", peer_));
      }
      return;
    case kAbort:
      aborts_in_flight_--;
      return;
    case kFlush:
      batch->flushed = true;
      batch->flush_pending = false;
      break;
    case kSignal:
      batch->pending_signals--;
      break;
  }
  if (status != UCS_OK && (batch == nullptr || !batch->abandoned)) {
    owner_->OnSendError(ucx::ToStatus(status, CallName(kind), absl::StrCat("peer rank ", peer_)));
  }
}

void PeerLink::Orphan() {
  struct NoOwner final : LinkOwner {
    void OnSendError(absl::Status) override {}
    void OnPutCompleted(int) override {}
  };
  static NoOwner no_owner;
  owner_ = &no_owner;
}

void PeerLink::Close(absl::Time deadline, bool force) {
  rkeys_.clear();
  if (endpoint_ != nullptr) endpoint_->Close(deadline, force);
  // Requests may sit in UCX's pending queue until the peer's receive queue has room, which
  // raises no wake-up event: yield rather than block.
  IdlePolicy idle;
  while (in_flight_ > 0 && absl::Now() < deadline) idle.Round(worker_.Progress() > 0);
}

absl::Status PeerLink::Health(int32_t rank, uint64_t epoch) const {
  if (aborted) return absl::UnavailableError(abort_reason);
  if (!error().ok()) {
    return absl::UnavailableError(
        absl::StrCat("rank ", rank, ", refit epoch ", epoch, ": ", error().message()));
  }
  if (process_gone_) {
    return absl::UnavailableError(absl::StrCat("rank ", rank, ", refit epoch ", epoch,
                                               ": lost peer rank ", peer_, ": its process (pid ",
                                               process_.pid, ") exited"));
  }
  return absl::OkStatus();
}

std::string PeerLink::Pending(uint64_t epoch) const {
  std::string out;
  if (remaining_from > 0) absl::StrAppend(&out, remaining_from, " piece(s) from rank ", peer_);
  if (unsignalled > 0) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", unsignalled, " piece(s) to rank ", peer_,
                    !started ? absl::StrCat(" (no grant for epoch ", epoch, " yet)")
                    : round_to.quota > 0 && round_pos < round_to.total &&
                            round_to.RoundOf(round_pos) > round_granted
                        ? absl::StrCat(" (waiting for its grant of landing round ",
                                       round_to.RoundOf(round_pos), " of ", round_to.rounds, ")")
                        : "");
  }
  return out;
}

std::string TransportsOf(const std::vector<PeerLink*>& links) {
  std::vector<std::string> names;
  for (const PeerLink* link : links) {
    for (absl::string_view name : absl::StrSplit(link->Transports(), ' ', absl::SkipEmpty())) {
      if (std::find(names.begin(), names.end(), name) == names.end()) names.emplace_back(name);
    }
  }
  return absl::StrJoin(names, " ");
}

}  // namespace reshard::net
