#include "src/api/refit_session.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/api/quant_shape.h"
#include "src/common/idle.h"
#include "src/common/log.h"
#include "src/common/status.h"
#include "src/common/json.h"
#include "src/plan/quant_spec.h"
#include "src/plan/schedule.h"
#include "src/rendezvous/record.h"

namespace reshard::internal {

std::vector<int32_t> AllRanks(const plan::Plan& plan) {
  std::vector<int32_t> ranks(static_cast<size_t>(plan.world_size()));
  for (int32_t r = 0; r < plan.world_size(); ++r) ranks[r] = r;
  return ranks;
}

RefitSession::RefitSession(std::shared_ptr<const plan::Plan> plan, int32_t rank,
                           rendezvous::Store& store, SessionConfig config)
    : plan_(std::move(plan)), rank_(rank), store_(store), config_(std::move(config)) {}

RefitSession::~RefitSession() {
  // Fan-out before the engine: its mappings may point at memory the engine registered.
  fanout_.reset();
  engine_.reset();
}

namespace {

std::string AgreementKey(const SessionConfig& config) {
  return absl::StrCat(config.key_prefix, "/fp");
}

}  // namespace

void RefitSession::AbandonSetUp(rendezvous::Store& store, const SessionConfig& config,
                                int32_t rank, const absl::Status& status) {
  absl::Status posted = rendezvous::PostFailure(store, AgreementKey(config), rank, status);
  if (!posted.ok()) {
    RESHARD_LOG(kWarning, "rank %d: could not tell the other ranks that its set-up failed: %s",
                rank, posted.message());
  }
}

absl::StatusOr<std::unique_ptr<RefitSession>> RefitSession::Create(
    std::shared_ptr<const plan::Plan> plan, int32_t rank, rendezvous::Store& store,
    std::shared_ptr<net::Runtime> runtime, std::vector<common::BufferView> buffers,
    const SessionConfig& config) {
  const absl::Time deadline = absl::Now() + config.setup_timeout;
  auto session =
      std::unique_ptr<RefitSession>(new RefitSession(std::move(plan), rank, store, config));
  const plan::Plan& p = *session->plan_;

  // 1. Agreement first: nothing is mapped or registered for a rank that planned something else.
  const std::string agreed =
      absl::StrFormat("%016x (world of %d ranks, fan-out by the %s%s)", p.fingerprint(),
                      p.world_size(), config.fanout_layer ? "fan-out layer" : "engine",
                      config.engine.delta ? ", delta refits" : "");
  RESHARD_RETURN_IF_ERROR(rendezvous::CheckAgreement(store, AgreementKey(config),
                                                     rank, AllRanks(p), agreed, "plan fingerprint",
                                                     "every rank must be given the same spec and "
                                                     "options, nothing was written",
                                                     deadline));

  // 2. Intra-domain fan-out: when the plan copies pieces inside domains and the layer runs
  // them, the engine runs only the network stage (every rank decides the same from the same
  // plan and the agreed option).
  net::RefitEngineOptions engine_options = config.engine;
  engine_options.key_prefix = absl::StrCat(config.key_prefix, "/net");
  engine_options.setup_timeout = std::max(absl::ZeroDuration(), deadline - absl::Now());
  engine_options.execute_fanout = true;
  if (p.stats().bytes_fanout > 0) {
    if (config.fanout_layer) {
      engine_options.execute_fanout = false;
      RESHARD_RETURN_IF_ERROR(session->BuildFanout(buffers));
    } else {
      session->fanout_name_ = "engine";
    }
  }

  RESHARD_RETURN_IF_ERROR(session->PrepareQuantization(buffers, runtime, deadline));

  // 3. The network engine.
  RESHARD_ASSIGN_OR_RETURN(session->engine_,
                           net::RefitEngine::Create(session->plan_, rank, store,
                                                    std::move(runtime), std::move(buffers),
                                                    engine_options));
  return session;
}

absl::Status RefitSession::BuildFanout(const std::vector<common::BufferView>& buffers) {
  const plan::Plan& p = *plan_;
  const plan::DomainMap domains(p.spec());
  const int32_t d = domains.domain_of(rank_);
  std::vector<int32_t> domain = d >= 0 ? domains.ranks(d) : std::vector<int32_t>{rank_};
  nvlink::FanoutTable table = nvlink::FanoutTable::FromPlan(p, domain);
  bool mine = false;
  for (const nvlink::FanoutEdge& e : table.edges) {
    mine = mine || e.from_rank == rank_ || e.to_rank == rank_;
  }
  if (!mine) return absl::OkStatus();
  nvlink::FanoutOptions options;
  options.key_prefix = absl::StrCat(config_.key_prefix, "/fanout");
  options.setup_timeout = config_.setup_timeout;
  absl::StatusOr<std::unique_ptr<nvlink::Fanout>> fanout =
      nvlink::Fanout::Create(std::move(table), rank_, std::move(domain), store_, buffers, options);
  if (!fanout.ok()) {
    return absl::Status(fanout.status().code(),
                        absl::StrCat("fan-out set-up failed: ", fanout.status().message()));
  }
  fanout_ = *std::move(fanout);
  fanout_name_ = fanout_->backend_name();
  return absl::OkStatus();
}

absl::Status RefitSession::PrepareQuantization(const std::vector<common::BufferView>& buffers,
                                               std::shared_ptr<net::Runtime> runtime,
                                               absl::Time deadline) {
  const plan::Plan& p = *plan_;
  const plan::RefitSpec& spec = p.spec();
  // The amax exchange: a refit of partial amaxes among the source ranks, planned once, with
  // buffers of its own. Every rank of its world takes part (its set-up is collective).
  std::shared_ptr<const plan::Plan> exchange_plan;
  if (spec.amax_exchange != nullptr && rank_ < spec.amax_exchange->WorldSize()) {
    absl::StatusOr<plan::Plan> planned = plan::BuildRankPlan(spec.amax_exchange, rank_);
    if (!planned.ok()) {
      return absl::Status(planned.status().code(),
                          absl::StrCat("the amax exchange did not plan: ", planned.status().message()));
    }
    exchange_plan = std::make_shared<const plan::Plan>(*std::move(planned));
    const std::vector<int64_t> bytes = exchange_plan->BufferBytes(rank_);
    std::vector<common::BufferView> views(exchange_plan->buffers().size());
    amax_memory_.resize(views.size());
    for (size_t b = 0; b < views.size(); ++b) {
      const int64_t n = b == exchange_plan->stage_buffer() ? exchange_plan->stage_bytes(rank_)
                                                            : bytes[b];
      amax_memory_[b].assign(static_cast<size_t>(n), 0);
      views[b] = common::BufferView{amax_memory_[b].data(), n, common::MemoryKind::kHost};
    }
    SessionConfig config = config_;
    config.key_prefix = absl::StrCat(config_.key_prefix, "/amax");
    config.setup_timeout = std::max(absl::ZeroDuration(), deadline - absl::Now());
    config.fanout_layer = false;  // A few floats: the engine copies them inside domains too.
    config.engine.delta = false;  // A few floats, all of them new every refit.
    absl::StatusOr<std::unique_ptr<RefitSession>> exchange =
        Create(exchange_plan, rank_, store_, std::move(runtime), std::move(views), config);
    if (!exchange.ok()) {
      return absl::Status(exchange.status().code(),
                          absl::StrCat("the amax exchange's set-up failed: ",
                                       exchange.status().message()));
    }
    amax_ = *std::move(exchange);
  }
  for (size_t q = 0; q < spec.quantized_sources.size(); ++q) {
    const plan::QuantizedSource& qs = spec.quantized_sources[q];
    const plan::TensorSpec& t = spec.tensors[qs.tensor];
    const plan::TileGrid grid(qs.src, t.shape);
    const std::optional<plan::TileGrid::Cell> cell = grid.CellOfRank(rank_);
    if (!cell.has_value()) continue;
    const common::BufferView& user = buffers[p.quantized_source_buffer(q)];
    QuantizeJob job;
    job.source = q;
    job.tile = grid.CellBox(*cell);
    job.user = static_cast<const uint8_t*>(user.data);
    if (const uint32_t b = p.quantized_source_scale_buffer(q); b != plan::Plan::kNoBuffer) {
      // Dequantized where the elements are: on the host, or by the CUDA kernels.
      if (buffers[b].kind != user.kind) {
        return absl::UnimplementedError(absl::StrFormat(
            "tensor %s on rank %d: its FP8 source is requantized, and its elements are in %s "
            "memory but its source scales in %s memory; give both in the same kind of memory",
            json::QuoteForMessage(t.name), rank_, common::MemoryKindName(user.kind),
            common::MemoryKindName(buffers[b].kind)));
      }
      job.user_scales = static_cast<const uint8_t*>(buffers[b].data);
      if (user.kind == common::MemoryKind::kHost) {
        dequantized_.resize(std::max(
            dequantized_.size(), static_cast<size_t>(plan::DequantizedElements(qs, job.tile))));
      }
    }
    job.elements = static_cast<uint8_t*>(buffers[p.buffer_of(qs.tensor, plan::Side::kSrc)].data);
    job.scales = static_cast<uint8_t*>(buffers[p.buffer_of(qs.scale_tensor, plan::Side::kSrc)].data);
    if (user.kind != common::MemoryKind::kHost && !job.tile.empty()) {
      // A source in GPU memory: the CUDA kernels quantize it into the internal host buffers (a
      // requantized FP8 source dequantized with its own scales as the kernels read it).
      const plan::QuantTile qt = plan::SourceQuantTile(spec, q, job.tile, job.user, job.elements,
                                                       job.scales);
      std::optional<plan::DequantSource> fp8;
      if (qs.requantized()) {
        fp8 = plan::DequantSourceOf(qs, job.tile, job.user_scales);
        job.device_src_scales = fp8->scales;
      }
      const cuda::QuantShape shape = QuantShapeOf(qt, fp8 ? &*fp8 : nullptr);
      absl::StatusOr<std::unique_ptr<cuda::DeviceQuantizer>> device =
          cuda::DeviceQuantizer::Create(shape);
      if (!device.ok()) {
        return absl::Status(device.status().code(),
                            absl::StrFormat("tensor %s on rank %d: its source is in GPU memory "
                                            "and its destination quantized: %s",
                                            json::QuoteForMessage(t.name), rank_,
                                            device.status().message()));
      }
      job.device = *std::move(device);
      job.device_src = qt.src;
      job.device_out = qt.out;
      job.device_scales = qt.scales;
    }
    if (qs.exchange) {
      if (exchange_plan == nullptr) {
        return absl::InternalError(absl::StrFormat(
            "tensor %s on rank %d needs the amax exchange, which has no plan on this rank",
            json::QuoteForMessage(t.name), rank_));
      }
      const plan::TensorSpec& partials = spec.amax_exchange->tensors[qs.partial_tensor];
      auto at = [&](plan::Side side) {
        return reinterpret_cast<float*>(
                   amax_memory_[exchange_plan->buffer_of(qs.partial_tensor, side)].data()) +
               partials.layout(side).view.offset;
      };
      job.partial = at(plan::Side::kSrc);
      job.gathered = at(plan::Side::kDst);
      const std::array<int64_t, plan::kMaxTensorDims> blocks = plan::TileBlocks(qs, job.tile);
      int64_t n = 1;
      for (int d = 0; d < job.tile.ndim; ++d) n *= blocks[d];
      job.amax.assign(static_cast<size_t>(n), 0.0f);
      exchange_jobs_ = true;
    }
    quantize_.push_back(std::move(job));
  }
  return absl::OkStatus();
}

absl::Status RefitSession::QuantizeJobTile(const QuantizeJob& job, const float* amax) {
  if (job.device == nullptr) {
    plan::QuantizeSourceTile(plan_->spec(), job.source, job.tile, job.user, job.elements,
                             job.scales, amax, job.user_scales, dequantized_.data());
    return absl::OkStatus();
  }
  const absl::Status st = job.device->Quantize(job.device_src, job.device_out,
                                               job.device_scales, amax, job.device_src_scales);
  if (st.ok()) return st;
  const plan::RefitSpec& spec = plan_->spec();
  const std::string& name = spec.tensors[spec.quantized_sources[job.source].tensor].name;
  return absl::Status(st.code(),
                      absl::StrFormat("tensor %s on rank %d: quantizing on the GPU: %s",
                                      json::QuoteForMessage(name), rank_, st.message()));
}

absl::Status RefitSession::StartLayers(uint64_t epoch) {
  if (fanout_ != nullptr) RESHARD_RETURN_IF_ERROR(fanout_->Start(epoch));
  return engine_->Start(epoch);
}

absl::Status RefitSession::Start(uint64_t epoch, StreamOrder* gate) {
  gate_ = nullptr;
  if (gate != nullptr) {
    const absl::StatusOr<bool> open = gate->Open();
    if (!open.ok()) {
      return absl::Status(open.status().code(),
                          absl::StrCat("the work queued on the CUDA stream given to Start failed: ",
                                       open.status().message()));
    }
    if (!*open) {
      gate_ = gate;
      gated_since_ = absl::Now();
      return absl::OkStatus();
    }
  }
  return BeginEpoch(epoch);
}

absl::Status RefitSession::BeginEpoch(uint64_t epoch) {
  // Quantized sources. Those whose blocks other tiles share post their partial amaxes to the
  // exchange and are quantized in Wait once it has gathered the others' (the layers then start
  // there). The others are quantized one at a time in Wait's rounds while the network runs: the
  // engine holds the puts and local copies that read them until each is written.
  next_held_ = quantize_.size();
  quantize_time_ = absl::ZeroDuration();
  exchange_time_ = absl::ZeroDuration();
  const absl::Time began = absl::Now();
  for (size_t i = 0; i < quantize_.size(); ++i) {
    const QuantizeJob& job = quantize_[i];
    if (job.partial == nullptr) {
      const plan::QuantizedSource& qs = plan_->spec().quantized_sources[job.source];
      engine_->HoldSource(qs.tensor);
      engine_->HoldSource(qs.scale_tensor);
      next_held_ = std::min(next_held_, i);
    } else if (job.device != nullptr) {
      RESHARD_RETURN_IF_ERROR(
          job.device->Amax(job.device_src, job.partial, job.device_src_scales));
    } else {
      plan::PartialAmaxTile(plan_->spec(), job.source, job.tile, job.user, job.partial,
                            job.user_scales, dequantized_.data());
    }
  }
  if (exchange_jobs_) quantize_time_ += absl::Now() - began;  // The partial amaxes.
  if (amax_ != nullptr) {
    exchange_started_ = absl::Now();
    RESHARD_RETURN_IF_ERROR(amax_->Start(epoch));
    exchange_pending_ = true;
    if (exchange_jobs_) return absl::OkStatus();
  }
  return StartLayers(epoch);
}

absl::Status RefitSession::QuantizeNextHeld(bool* did) {
  *did = false;
  while (next_held_ < quantize_.size() && quantize_[next_held_].partial != nullptr) ++next_held_;
  if (next_held_ == quantize_.size()) return absl::OkStatus();
  const QuantizeJob& job = quantize_[next_held_++];
  const absl::Time began = absl::Now();
  RESHARD_RETURN_IF_ERROR(QuantizeJobTile(job, nullptr));
  quantize_time_ += absl::Now() - began;
  const plan::QuantizedSource& qs = plan_->spec().quantized_sources[job.source];
  engine_->ReleaseSource(qs.tensor);
  engine_->ReleaseSource(qs.scale_tensor);
  *did = true;
  return absl::OkStatus();
}

namespace {

// What a waiting refit sleeps on (src/common/idle.h): the UCX worker while the network stage
// runs, the fan-out doorbell once it ended. While the fan-out also waits on domain peers (an
// incoming piece, a grant, a copy in flight), each sleep on the worker is cut to
// kBothPendingSlice, so what they bring is seen within it.
class WaitEvents final : public Blocker {
 public:
  static constexpr absl::Duration kBothPendingSlice = absl::Microseconds(250);
  WaitEvents(Blocker& network, nvlink::Fanout* fanout) : network_(network), fanout_(fanout) {}
  bool network_running = true;
  void Block(absl::Duration timeout) override {
    if (!network_running) {
      if (fanout_ != nullptr && !fanout_->Done()) fanout_->Block(timeout);
      return;
    }
    const bool fanout_waits = fanout_ != nullptr && fanout_->WaitsOnDomainPeers();
    network_.Block(fanout_waits ? std::min(timeout, kBothPendingSlice) : timeout);
  }

 private:
  Blocker& network_;
  nvlink::Fanout* fanout_;
};

// What a refit waiting for its start gate sleeps on: the UCX worker (peers' messages), for at
// most kSlice at a time, since a CUDA event completing raises no event of its own.
class GateEvents final : public Blocker {
 public:
  static constexpr absl::Duration kSlice = absl::Microseconds(100);
  explicit GateEvents(Blocker& network) : network_(network) {}
  void Block(absl::Duration timeout) override { network_.Block(std::min(timeout, kSlice)); }

 private:
  Blocker& network_;
};

}  // namespace

absl::Status RefitSession::WaitForGate(uint64_t epoch, absl::Time deadline) {
  GateEvents events(engine_->events());
  IdlePolicy idle(&events);
  absl::Status st;
  while (true) {
    const absl::StatusOr<bool> open = gate_->Open();
    if (!open.ok()) {
      st = absl::Status(open.status().code(),
                        absl::StrCat("the work queued on the CUDA stream given to Start failed: ",
                                     open.status().message()));
      break;
    }
    if (*open) break;
    // Peers' grants and aborts keep arriving meanwhile; the engine weighs them when the epoch
    // starts (an abort about an epoch this rank completed does not fail the next one, so
    // CheckAllPeers, which reports it, is not the test here).
    bool progressed = false;
    st = engine_->Progress(nullptr, &progressed);
    if (!st.ok()) break;
    if (absl::Now() >= deadline) {
      st = absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank_, ": the work queued on the CUDA stream given to Start ",
          "did not finish within ", absl::FormatDuration(absl::Now() - gated_since_),
          ", before the deadline; nothing of refit epoch ", epoch, " was read or written"));
      break;
    }
    idle.Round(progressed);
  }
  gate_ = nullptr;
  if (!st.ok()) return st;  // The handle aborts the epoch on every layer (Abort).
  return BeginEpoch(epoch);
}

absl::Status RefitSession::Wait(uint64_t epoch, absl::Time deadline) {
  if (gate_ != nullptr) RESHARD_RETURN_IF_ERROR(WaitForGate(epoch, deadline));
  if (exchange_pending_) {
    exchange_pending_ = false;
    const absl::Status exchanged = amax_->Wait(epoch, deadline);
    exchange_time_ = absl::Now() - exchange_started_;
    if (!exchanged.ok()) {
      return absl::Status(exchanged.code(),
                          absl::StrCat("the amax exchange failed: ", exchanged.message()));
    }
    if (exchange_jobs_) {
      const absl::Time began = absl::Now();
      for (QuantizeJob& job : quantize_) {
        if (job.partial == nullptr) continue;
        const plan::QuantizedSource& qs = plan_->spec().quantized_sources[job.source];
        plan::CombineAmax(qs, job.tile, job.gathered, job.amax.data());
        RESHARD_RETURN_IF_ERROR(QuantizeJobTile(job, job.amax.data()));
      }
      quantize_time_ += absl::Now() - began;
      RESHARD_RETURN_IF_ERROR(StartLayers(epoch));
    }
  }
  WaitEvents events(engine_->events(), fanout_.get());
  IdlePolicy idle(&events);
  bool network_done = false;
  absl::Status st;
  while (true) {
    // Read before progressing: the round that starts with the engine finished is the one that
    // drains its last landings (an epoch of local copies only may finish inside Start).
    const bool engine_running = engine_->in_epoch();
    events.network_running = engine_running;
    // One held source per round: its puts post in this round's Progress, while the network
    // carries them and the next ones quantize.
    bool quantized = false;
    if (engine_running) st = QuantizeNextHeld(&quantized);
    if (!st.ok()) break;
    landed_.clear();
    bool progressed = quantized;
    st = engine_->Progress(&landed_, &progressed);
    progressed = progressed || quantized;
    if (!st.ok()) break;
    if (fanout_ != nullptr) {
      // Forward each piece as soon as it landed, while later pieces are still on the network.
      for (uint32_t t : landed_) {
        st = fanout_->Landed(t, epoch);
        if (!st.ok()) break;
      }
      if (!st.ok()) break;
      if (!engine_running && !network_done) {
        fanout_->NetworkDone(epoch);
        network_done = true;
      }
      const int64_t before = fanout_->stats().arrivals + fanout_->stats().forwards;
      st = fanout_->Check(epoch, deadline);
      if (!st.ok()) break;
      progressed = progressed || fanout_->stats().arrivals + fanout_->stats().forwards != before;
    }
    if (!engine_running && (fanout_ == nullptr || fanout_->Done())) break;
    if (engine_running && absl::Now() >= deadline) break;  // The engine names what is missing.
    idle.Round(progressed);
  }
  // Done, failed, or past the deadline: the engine reports its part (at once when done; one
  // more round then DeadlineExceeded naming the missing pieces when the deadline passed).
  if (st.ok()) st = engine_->Wait(deadline);
  return st;
}

absl::Status RefitSession::Barrier(uint64_t n, absl::Time deadline) {
  return rendezvous::RepeatedBarrier(store_, absl::StrCat(config_.key_prefix, "/barrier"), n, rank_,
                                     AllRanks(*plan_), deadline, [this] {
                                       RESHARD_RETURN_IF_ERROR(engine_->Progress(nullptr));
                                       return engine_->CheckAllPeers();
                                     });
}

void RefitSession::Abort(uint64_t epoch, const absl::Status& why) {
  engine_->Abort(epoch, why);
  if (fanout_ != nullptr) fanout_->Abort(epoch, why);
  if (amax_ != nullptr) amax_->Abort(epoch, why);
}

void RefitSession::Reset() {
  gate_ = nullptr;
  engine_->Reset();
  if (amax_ != nullptr) amax_->Reset();
  exchange_pending_ = false;
}

absl::Status RefitSession::Shutdown(absl::Time deadline) {
  const absl::Status st = engine_->Shutdown(deadline);
  if (amax_ != nullptr) {
    const absl::Status exchange = amax_->Shutdown(deadline);
    if (st.ok() && !exchange.ok()) return exchange;
  }
  return st;
}

void RefitSession::FillStats(Stats& s) const {
  const net::RefitStats& e = engine_->last_stats();
  s.bytes_network_sent = e.bytes_network_sent;
  s.bytes_network_received = e.bytes_network_received;
  s.bytes_local = e.bytes_local;
  s.pieces_received = e.pieces_received;
  s.puts = e.puts;
  s.data_messages = e.data_messages;
  s.single_copy_writes = e.single_copy_writes;
  s.mapped_copies = e.mapped_copies;
  s.signals = e.signals;
  s.delta_pieces = e.delta_pieces;
  s.delta_full_no_base = e.delta_full_no_base;
  s.delta_full_receiver_version = e.delta_full_receiver_version;
  s.delta_full_not_smaller = e.delta_full_not_smaller;
  s.delta_stream_bytes = e.delta_stream_bytes;
  s.delta_plain_bytes = e.delta_plain_bytes;
  s.delta_shadow_bytes = e.delta_shadow_bytes;
  s.delta_device_shadow_bytes = e.delta_device_shadow_bytes;
  s.delta_pinned_bytes = e.delta_pinned_bytes;
  s.deltas_applied = e.deltas_applied;
  s.cuda_buffers_registered = e.cuda_buffers_registered;
  s.cuda_buffers_staged = e.cuda_buffers_staged;
  s.bytes_staged_to_host = e.bytes_staged_to_host;
  s.bytes_staged_to_device = e.bytes_staged_to_device;
  s.stage_ring_bytes = e.stage_ring_bytes;
  s.stage_copy_bytes = e.stage_copy_bytes;
  s.stage_landing_bytes = e.stage_landing_bytes;
  s.stage_landing_rounds = e.stage_landing_rounds;
  s.stage_ring_batches = e.stage_ring_batches;
  s.bytes_ring_packed = e.bytes_ring_packed;
  s.stage_round_scatters = e.stage_round_scatters;
  s.local_copy_launches = e.local_copy_launches;
  s.stage_bounce_bytes = e.stage_bounce_bytes;
  s.bounced_data_messages = e.bounced_data_messages;
  s.bounce_waits = e.bounce_waits;
  s.landing_area_bytes = e.landing_area_bytes;
  s.send_scratch_bytes = e.send_scratch_bytes;
  s.delta_relay_early_segments = e.delta_relay_early_segments;
  s.relay_early_bytes = e.relay_early_bytes;
  s.transports = engine_->Transports();
  s.fanout = fanout_name_;
  s.quantize_seconds = absl::ToDoubleSeconds(quantize_time_);
  s.amax_exchange_seconds = absl::ToDoubleSeconds(exchange_time_);
  s.quantize_buffer_bytes = static_cast<int64_t>(dequantized_.size() * sizeof(float));
  for (const auto& b : amax_memory_) s.quantize_buffer_bytes += static_cast<int64_t>(b.size());
  for (const QuantizeJob& job : quantize_) {
    s.quantize_buffer_bytes += static_cast<int64_t>(job.amax.size() * sizeof(float));
  }
  if (fanout_ != nullptr) {
    const nvlink::FanoutStats& f = fanout_->stats();
    s.pieces_received += f.arrivals;
    s.bytes_fanout_sent = f.bytes_sent;
    s.bytes_fanout_received = f.bytes_received;
    s.fanout_busy_seconds = f.busy_seconds;
    s.fanout_hidden_fraction = f.hidden_fraction;
    s.fanout_domain_hidden_fraction = f.domain_hidden_fraction;
  }
}

}  // namespace reshard::internal
