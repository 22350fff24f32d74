#include "src/nvlink/fanout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/common/fault.h"
#include "src/common/idle.h"
#include "src/common/status.h"
#include "src/nvlink/cuda_ipc/factory.h"
#include "src/nvlink/host/factory.h"
#include "src/nvlink/nccl/factory.h"
#include "src/rendezvous/record.h"

namespace reshard::nvlink {

FanoutTable FanoutTable::FromPlan(const plan::Plan& plan, const std::vector<int32_t>& domain) {
  FanoutTable table;
  for (const auto& ts : plan.spec().tensors) table.tensor_names.push_back(ts.name);
  auto in_domain = [&](int32_t r) {
    return std::find(domain.begin(), domain.end(), r) != domain.end();
  };
  const auto& transfers = plan.transfers();
  for (uint32_t i = 0; i < transfers.size(); ++i) {
    const plan::Transfer& tr = transfers[i];
    if (tr.kind != plan::TransferKind::kFanout) continue;
    if (!in_domain(tr.from_rank) || !in_domain(tr.to_rank)) continue;
    const plan::Region& r = plan.region(tr.region);
    table.Add(plan.transfer_id(i), tr.after, tr.tensor, plan.buffer_of(tr.tensor, tr.from_side),
              plan.buffer_of(tr.tensor, tr.to_side), tr.from_rank, tr.to_rank, r,
              plan.region_dims(r));
  }
  return table;
}

void FanoutTable::Add(uint32_t transfer, int32_t after, uint32_t tensor, uint32_t from_buffer,
                      uint32_t to_buffer, int32_t from_rank, int32_t to_rank,
                      const plan::Region& region, const plan::RegionDim* region_dims) {
  FanoutEdge e;
  e.transfer = transfer;
  e.after = after;
  e.tensor = tensor;
  e.from_buffer = from_buffer;
  e.to_buffer = to_buffer;
  e.from_rank = from_rank;
  e.to_rank = to_rank;
  e.region = region;
  e.region.dims_begin = static_cast<uint32_t>(dims.size());
  for (int i = 0; i < region.ndims; ++i) dims.push_back(region_dims[i]);
  edges.push_back(e);
}

std::vector<const FanoutFactory*> AllFactories() {
  return {&HostFactory(), &CudaIpcFactory(), &NcclFactory()};
}

namespace {

absl::Status ValidateContext(const FanoutContext& ctx) {
  const FanoutTable& t = *ctx.table;
  if (std::find(ctx.domain.begin(), ctx.domain.end(), ctx.rank) == ctx.domain.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("fan-out: rank %d is not in its own domain", ctx.rank));
  }
  auto name = [&](const FanoutEdge& e) {
    return e.tensor < t.tensor_names.size() ? t.tensor_names[e.tensor]
                                            : absl::StrFormat("#%d", e.tensor);
  };
  for (const FanoutEdge& e : t.edges) {
    for (int32_t r : {e.from_rank, e.to_rank}) {
      if (std::find(ctx.domain.begin(), ctx.domain.end(), r) == ctx.domain.end()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tensor \"%s\": fan-out transfer %d from rank %d to rank %d leaves the domain of "
            "rank %d",
            name(e), e.transfer, e.from_rank, e.to_rank, ctx.rank));
      }
    }
    if (e.from_rank == e.to_rank) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor \"%s\": fan-out transfer %d copies rank %d into itself", name(e),
                          e.transfer, e.from_rank));
    }
    if (e.from_rank != ctx.rank && e.to_rank != ctx.rank) continue;
    const bool sending = e.from_rank == ctx.rank;
    const uint32_t buffer = sending ? e.from_buffer : e.to_buffer;
    if (buffer >= ctx.buffers.size() || ctx.buffers[buffer].data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor \"%s\": rank %d has no buffer %d for fan-out transfer %d",
                          name(e), ctx.rank, buffer, e.transfer));
    }
    // Every byte the region touches on this rank's side must lie inside the buffer.
    const plan::RegionDim* dims = t.dims_of(e);
    int64_t end = (sending ? e.region.from_offset : e.region.to_offset) + e.region.run_bytes;
    for (int i = 0; i < e.region.ndims; ++i) {
      end += (dims[i].count - 1) * (sending ? dims[i].from_stride : dims[i].to_stride);
    }
    if (e.region.bytes > 0 && end > ctx.buffers[buffer].bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor \"%s\": fan-out transfer %d needs %d bytes of rank %d's buffer %d, which "
          "holds %d",
          name(e), e.transfer, end, ctx.rank, buffer, ctx.buffers[buffer].bytes));
    }
  }
  return absl::OkStatus();
}

// Every peer this rank exchanges pieces with must have chosen the same backend.
absl::Status AgreeOnBackend(const FanoutContext& ctx, const std::string& mine) {
  std::vector<int32_t> peers = {ctx.rank};
  for (const FanoutEdge& e : ctx.table->edges) {
    if (e.from_rank == ctx.rank) peers.push_back(e.to_rank);
    if (e.to_rank == ctx.rank) peers.push_back(e.from_rank);
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return rendezvous::CheckAgreement(*ctx.store, absl::StrCat(ctx.options.key_prefix, "/backend"),
                                    ctx.rank, peers, mine, "fan-out backend",
                                    "every rank of a domain must be able to run the same backend",
                                    absl::Now() + ctx.options.setup_timeout);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Fanout>> Fanout::Create(FanoutTable table, int32_t rank,
                                                       std::vector<int32_t> domain,
                                                       rendezvous::Store& store,
                                                       std::vector<BufferView> buffers,
                                                       const FanoutOptions& options) {
  std::sort(domain.begin(), domain.end());
  domain.erase(std::unique(domain.begin(), domain.end()), domain.end());
  auto owned = std::make_unique<FanoutTable>(std::move(table));
  FanoutContext ctx;
  ctx.table = owned.get();
  ctx.rank = rank;
  ctx.domain = domain;
  ctx.store = &store;
  ctx.buffers = std::move(buffers);
  ctx.options = options;
  RESHARD_RETURN_IF_ERROR(ValidateContext(ctx));

  // Choose by capability: the first viable factory in order, or the named one.
  const FanoutFactory* chosen = nullptr;
  std::vector<std::string> reasons;
  bool any_cuda = false;
  for (const FanoutEdge& e : owned->edges) {
    if ((e.from_rank == rank && ctx.buffers[e.from_buffer].kind == MemoryKind::kCuda) ||
        (e.to_rank == rank && ctx.buffers[e.to_buffer].kind == MemoryKind::kCuda)) {
      any_cuda = true;
    }
  }
  for (const FanoutFactory* f : AllFactories()) {
    const std::string fname = f->name();
    if (options.backend != "auto" && options.backend != fname) continue;
    // Auto: host memory goes through the host backend, device memory through a GPU backend.
    if (options.backend == "auto" && (fname == "host") == any_cuda) continue;
    absl::Status viable = f->Viable(ctx);
    if (viable.ok()) {
      chosen = f;
      break;
    }
    reasons.push_back(absl::StrFormat("%s: %s", fname, std::string(viable.message())));
  }
  if (chosen == nullptr) {
    if (reasons.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("fan-out backend \"%s\" is unknown (known: host, cuda_ipc, nccl, auto)",
                          options.backend));
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "rank %d: no fan-out backend can run here (%s)", rank, absl::StrJoin(reasons, "; ")));
  }
  RESHARD_RETURN_IF_ERROR(AgreeOnBackend(ctx, chosen->name()));
  RESHARD_ASSIGN_OR_RETURN(std::unique_ptr<FanoutBackend> backend, chosen->Create(ctx));
  return std::unique_ptr<Fanout>(new Fanout(std::move(owned), rank, std::move(backend)));
}

Fanout::Fanout(std::unique_ptr<FanoutTable> table, int32_t rank,
               std::unique_ptr<FanoutBackend> backend)
    : table_(std::move(table)), rank_(rank), backend_(std::move(backend)) {
  for (uint32_t i = 0; i < table_->edges.size(); ++i) {
    const FanoutEdge& e = table_->edges[i];
    if (e.to_rank == rank_) {
      incoming_.push_back(i);
      by_transfer_.push_back({e.transfer, i});
    }
    if (e.from_rank == rank_) {
      outgoing_.push_back(i);
      by_transfer_.push_back({e.transfer, i});
      after_.Add(e.after, i);
    }
  }
  after_.Finish();
  std::sort(by_transfer_.begin(), by_transfer_.end());
  for (const FanoutEdge& e : table_->edges) {
    if (e.from_rank == rank_) peers_.push_back(e.to_rank);
    if (e.to_rank == rank_) peers_.push_back(e.from_rank);
  }
  std::sort(peers_.begin(), peers_.end());
  peers_.erase(std::unique(peers_.begin(), peers_.end()), peers_.end());
  arrived_.assign(table_->edges.size(), 0);
  forwarded_.assign(table_->edges.size(), 0);
  completed_.assign(table_->edges.size(), 0);
}

Fanout::~Fanout() = default;

const char* Fanout::backend_name() const { return backend_->name(); }
int64_t Fanout::mappings_created() const { return backend_->mappings_created(); }

bool Fanout::Handles(uint32_t transfer) const {
  auto it = std::lower_bound(by_transfer_.begin(), by_transfer_.end(),
                             std::make_pair(transfer, uint32_t{0}));
  return it != by_transfer_.end() && it->first == transfer;
}

absl::Status Fanout::Start(uint64_t epoch) {
  if (epoch <= epoch_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fan-out on rank %d: epoch %d does not follow epoch %d", rank_, epoch, epoch_));
  }
  epoch_ = epoch;
  std::fill(arrived_.begin(), arrived_.end(), 0);
  std::fill(forwarded_.begin(), forwarded_.end(), 0);
  std::fill(completed_.begin(), completed_.end(), 0);
  arrived_count_ = completed_count_ = 0;
  waiting_grant_.clear();
  ready_arrivals_.clear();
  busy_.clear();
  in_flight_ = 0;
  network_done_ = false;
  stats_final_ = false;
  stats_ = FanoutStats{};
  epoch_start_ = network_end_ = absl::Now();
  next_peer_check_ = epoch_start_ + kPeerCheckInterval;
  // Edges with no dependency can go as soon as the peers grant.
  RESHARD_RETURN_IF_ERROR(backend_->Grant(epoch));
  for (uint32_t i : after_.initial()) waiting_grant_.push_back(i);
  return Pump(epoch);
}

absl::Status Fanout::Landed(uint32_t transfer, uint64_t epoch) {
  if (epoch != epoch_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("fan-out on rank %d: transfer %d landed for epoch %d during epoch %d",
                        rank_, transfer, epoch, epoch_));
  }
  if (!Handles(transfer)) network_end_ = absl::Now();
  for (uint32_t i : after_.WaitingOn(transfer)) {
    if (!forwarded_[i]) waiting_grant_.push_back(i);
  }
  return Pump(epoch);
}

absl::Status Fanout::Forward(uint32_t transfer, uint64_t epoch) {
  auto it = std::lower_bound(by_transfer_.begin(), by_transfer_.end(),
                             std::make_pair(transfer, uint32_t{0}));
  for (; it != by_transfer_.end() && it->first == transfer; ++it) {
    if (table_->edges[it->second].from_rank != rank_) continue;
    if (!forwarded_[it->second]) waiting_grant_.push_back(it->second);
    return Pump(epoch);
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "fan-out on rank %d: transfer %d is not a fan-out this rank sends", rank_, transfer));
}

absl::Status Fanout::Pump(uint64_t epoch) {
  // Forward what the peers granted, in arrival order.
  size_t keep = 0;
  for (size_t k = 0; k < waiting_grant_.size(); ++k) {
    const uint32_t i = waiting_grant_[k];
    if (forwarded_[i]) continue;
    if (!backend_->Granted(table_->edges[i].to_rank, epoch)) {
      waiting_grant_[keep++] = i;
      continue;
    }
    common::FaultPoint(common::FaultStage::kFanout, rank_, epoch);
    forwarded_[i] = 1;
    const absl::Time begin = absl::Now();
    if (in_flight_++ == 0) busy_since_ = begin;
    RESHARD_ASSIGN_OR_RETURN(const bool done, backend_->Forward(i, epoch));
    ++stats_.forwards;
    stats_.bytes_sent += table_->edges[i].region.bytes;
    if (done) {
      completed_[i] = 1;
      ++completed_count_;
      if (--in_flight_ == 0) busy_.push_back({busy_since_, absl::Now()});
    }
  }
  waiting_grant_.resize(keep);

  std::vector<uint32_t>& arrived = scratch_arrived_;
  std::vector<uint32_t>& completed = scratch_completed_;
  arrived.clear();
  completed.clear();
  RESHARD_RETURN_IF_ERROR(backend_->Progress(epoch, &arrived, &completed));
  bool relay = false;
  for (uint32_t i : completed) {
    if (completed_[i]) continue;
    completed_[i] = 1;
    ++completed_count_;
    if (--in_flight_ == 0) busy_.push_back({busy_since_, absl::Now()});
  }
  for (uint32_t i : arrived) {
    if (arrived_[i]) continue;
    arrived_[i] = 1;
    ++arrived_count_;
    ++stats_.arrivals;
    stats_.bytes_received += table_->edges[i].region.bytes;
    ready_arrivals_.push_back(table_->edges[i].transfer);
    // A piece that arrived by fan-out may feed further fan-outs (relays inside the domain).
    for (uint32_t next : after_.WaitingOn(table_->edges[i].transfer)) {
      if (!forwarded_[next]) {
        waiting_grant_.push_back(next);
        relay = true;
      }
    }
  }
  if (relay) return Pump(epoch);
  if (!stats_final_ && Done()) FinishStats();
  return absl::OkStatus();
}

absl::Status Fanout::Poll(uint64_t epoch, std::vector<uint32_t>* arrived) {
  if (epoch != epoch_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fan-out on rank %d: polled epoch %d during epoch %d", rank_, epoch, epoch_));
  }
  RESHARD_RETURN_IF_ERROR(Pump(epoch));
  if (arrived != nullptr)
    arrived->insert(arrived->end(), ready_arrivals_.begin(), ready_arrivals_.end());
  ready_arrivals_.clear();
  return absl::OkStatus();
}

bool Fanout::Done() const {
  return arrived_count_ == static_cast<int64_t>(incoming_.size()) &&
         completed_count_ == static_cast<int64_t>(outgoing_.size());
}

bool Fanout::WaitsOnDomainPeers() const {
  return arrived_count_ < static_cast<int64_t>(incoming_.size()) || !waiting_grant_.empty() ||
         in_flight_ > 0;
}

absl::Status Fanout::Check(uint64_t epoch, absl::Time deadline) {
  if (epoch != epoch_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fan-out on rank %d: waited for epoch %d during epoch %d", rank_, epoch, epoch_));
  }
  RESHARD_RETURN_IF_ERROR(Pump(epoch));
  if (Done()) {
    if (!stats_final_) FinishStats();
    return absl::OkStatus();
  }
  const absl::Time now = absl::Now();
  if (now >= next_peer_check_) {
    // Only the peers this rank still waits for: one that got everything it needed from us
    // may legitimately finish and exit.
    std::vector<int32_t>& waiting_on = scratch_peers_;
    waiting_on.clear();
    for (uint32_t i : incoming_) {
      if (!arrived_[i]) waiting_on.push_back(table_->edges[i].from_rank);
    }
    for (uint32_t i : outgoing_) {
      if (!completed_[i]) waiting_on.push_back(table_->edges[i].to_rank);
    }
    std::sort(waiting_on.begin(), waiting_on.end());
    waiting_on.erase(std::unique(waiting_on.begin(), waiting_on.end()), waiting_on.end());
    RESHARD_RETURN_IF_ERROR(backend_->CheckPeers(waiting_on));
    next_peer_check_ = now + kPeerCheckInterval;
  }
  if (now < deadline) return absl::OkStatus();
  // Name the first piece still missing.
  for (uint32_t i : incoming_) {
    if (arrived_[i]) continue;
    const FanoutEdge& e = table_->edges[i];
    return absl::DeadlineExceededError(absl::StrFormat(
        "tensor \"%s\": fan-out piece %d from rank %d did not reach rank %d in epoch %d "
        "before the deadline (%d of %d pieces arrived)",
        e.tensor < table_->tensor_names.size() ? table_->tensor_names[e.tensor] : "?", e.transfer,
        e.from_rank, rank_, epoch, arrived_count_, incoming_.size()));
  }
  for (uint32_t i : outgoing_) {
    if (completed_[i]) continue;
    const FanoutEdge& e = table_->edges[i];
    return absl::DeadlineExceededError(absl::StrFormat(
        "tensor \"%s\": rank %d could not forward fan-out piece %d to rank %d in epoch %d "
        "before the deadline (%s)",
        e.tensor < table_->tensor_names.size() ? table_->tensor_names[e.tensor] : "?", rank_,
        e.transfer, e.to_rank, epoch,
        forwarded_[i]
            ? "copy in flight"
            : (backend_->Granted(e.to_rank, epoch) ? "the piece never landed here"
                                                   : "the peer never granted the epoch")));
  }
  return absl::OkStatus();
}

absl::Status Fanout::Wait(uint64_t epoch, absl::Time deadline) {
  IdlePolicy idle(this);
  while (true) {
    const int64_t before = arrived_count_ + completed_count_;
    RESHARD_RETURN_IF_ERROR(Check(epoch, deadline));
    if (Done()) return absl::OkStatus();
    idle.Round(arrived_count_ + completed_count_ != before);
  }
}

void Fanout::NetworkDone(uint64_t epoch) {
  if (epoch != epoch_ || network_done_) return;
  network_done_ = true;
  backend_->PublishNetworkEnd(epoch, absl::ToUnixNanos(network_end_));
  if (Done()) FinishStats();
}

void Fanout::Abort(uint64_t epoch, const absl::Status& why) {
  if (epoch < epoch_ || aborted_epoch_ == epoch) return;
  aborted_epoch_ = epoch;
  backend_->PublishFailure(epoch, why.message());
}

void Fanout::FinishStats() {
  stats_final_ = true;
  double busy = 0, hidden = 0;
  for (const auto& [b, e] : busy_) {
    busy += absl::ToDoubleSeconds(e - b);
    const absl::Time hi = std::min(e, network_end_);
    if (hi > b) hidden += absl::ToDoubleSeconds(hi - b);
  }
  stats_.busy_seconds = busy;
  stats_.hidden_seconds = hidden;
  stats_.network_seconds = absl::ToDoubleSeconds(network_end_ - epoch_start_);
  stats_.hidden_fraction = busy > 0 ? hidden / busy : 1.0;
  // The domain's network stage: this rank's (now while it is not done) and its peers'.
  const absl::Time now = absl::Now();
  absl::Time domain_end = network_done_ ? network_end_ : now;
  for (int32_t p : peers_) {
    const int64_t ns = backend_->PeerNetworkEnd(p, epoch_);
    if (ns < 0) continue;
    domain_end = std::max(domain_end, ns == 0 ? now : absl::FromUnixNanos(ns));
  }
  double domain_hidden = 0;
  for (const auto& [b, e] : busy_) {
    const absl::Time hi = std::min(e, domain_end);
    if (hi > b) domain_hidden += absl::ToDoubleSeconds(hi - b);
  }
  stats_.domain_hidden_seconds = domain_hidden;
  stats_.domain_hidden_fraction = busy > 0 ? domain_hidden / busy : 1.0;
}

}  // namespace reshard::nvlink
