#include "reshard/refit.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "reshard/version.h"
#include "src/api/internal.h"
#include "src/api/refit_session.h"
#include "src/api/stream_order.h"
#include "src/common/fault.h"
#include "src/common/status.h"
#include "src/net/refit_engine.h"
#include "src/common/shared_memory.h"
#include "src/plan/plan.h"
#include "src/plan/schedule.h"

namespace reshard {

const char* MemoryKindName(MemoryKind kind) { return kind == MemoryKind::kHost ? "host" : "cuda"; }

LocalBuffers& LocalBuffers::Source(std::string name, void* data, int64_t bytes, MemoryKind kind) {
  return Add(Side::kSource, std::move(name), Buffer{data, bytes, kind});
}
LocalBuffers& LocalBuffers::Destination(std::string name, void* data, int64_t bytes,
                                        MemoryKind kind) {
  return Add(Side::kDestination, std::move(name), Buffer{data, bytes, kind});
}
LocalBuffers& LocalBuffers::Add(Side side, std::string name, Buffer buffer) {
  (side == Side::kSource ? sources_ : destinations_).emplace_back(std::move(name), buffer);
  return *this;
}

namespace internal {

namespace {
std::atomic<cuda::StreamOps*> stream_ops_override{nullptr};
}  // namespace

cuda::StreamOps& StreamOpsForHandles() {
  cuda::StreamOps* ops = stream_ops_override.load(std::memory_order_acquire);
  return ops != nullptr ? *ops : cuda::CudaStreamOps();
}

cuda::StreamOps* SetStreamOpsForTesting(cuda::StreamOps* ops) {
  return stream_ops_override.exchange(ops, std::memory_order_acq_rel);
}

std::vector<BufferRequirement> Requirements(const plan::RefitSpec& spec,
                                            const plan::BufferTable& table, int32_t rank) {
  std::vector<BufferRequirement> out;
  const std::vector<int64_t> bytes = plan::BufferBytes(spec, table, rank);
  // One pass over the tensors (specs have tens of thousands of tensors and of buffers).
  std::vector<std::vector<std::string>> tensors(table.buffers.size());
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    for (plan::Side side : {plan::Side::kSrc, plan::Side::kDst}) {
      if (spec.layout(t, side).mesh.IndexOf(rank) >= 0) {
        tensors[table.tensor_buffer[static_cast<int>(side)][t]].push_back(spec.tensors[t].name);
      }
    }
  }
  // A lowered spec's quantized tensors read the user's sources through internal buffers.
  for (size_t q = 0; q < spec.quantized_sources.size(); ++q) {
    const plan::QuantizedSource& qs = spec.quantized_sources[q];
    if (qs.src.mesh.IndexOf(rank) >= 0) {
      tensors[table.quantized_source_buffer[q]].push_back(spec.tensors[qs.tensor].name);
      if (qs.requantized()) {
        tensors[table.quantized_source_scale_buffer[q]].push_back(
            spec.tensors[qs.tensor].name + ".scale");
      }
    }
  }
  for (plan::Side side : {plan::Side::kSrc, plan::Side::kDst}) {
    for (uint32_t b = 0; b < table.buffers.size(); ++b) {
      const plan::BufferInfo& info = table.buffers[b];
      if (info.side != side || info.internal || tensors[b].empty()) continue;
      BufferRequirement req;
      req.tensors = std::move(tensors[b]);
      req.name = info.name;
      req.side = side == plan::Side::kSrc ? Side::kSource : Side::kDestination;
      req.bytes = bytes[b];
      out.push_back(std::move(req));
    }
  }
  return out;
}

}  // namespace internal

class RefitHandle::Impl {
 public:
  std::shared_ptr<Communicator::Impl> comm;
  std::string name;
  int rank = 0;
  uint64_t fingerprint = 0;
  // This rank's staging buffer (schedule-owned), in shared memory when the fan-out layer runs
  // (domain peers that forward relayed pieces then write it in one copy), else private memory.
  // relayed pieces write it in one copy.
  std::unique_ptr<SharedBuffer> shared_staging;
  std::vector<uint8_t> private_staging;
  // The lowered spec's internal buffers this rank holds (quantized sources), by plan order.
  std::vector<std::vector<uint8_t>> internal_buffers;
  // CUDA-stream ordering, made at the first StartOnStream or RecordCompletion. Declared before
  // the session, so destroyed after it: the streams waiting for the refit are released once
  // nothing of it runs any more.
  std::unique_ptr<internal::StreamOrder> streams;
  // Null for a rank the spec does not name (nothing to send or receive).
  std::unique_ptr<internal::RefitSession> session;

  uint64_t epoch = 0;
  uint64_t barriers = 0;
  bool in_flight = false;
  bool failed = false;
  absl::Status failure;
  absl::Time started;
  int64_t registrations_at_start = 0;
  Stats stats;

  ~Impl() {
    if (session != nullptr) {
      // Orderly close so peers still finishing see no lost endpoint; errors do not matter here.
      // A handle whose refit failed or was abandoned still arrives at the closing barrier (and
      // does not wait there): a peer whose own refit of it succeeded waits for that arrival, and
      // without it would sit out its whole shutdown deadline while this rank went on to its
      // next handle (issue 10: the next handle then missed its deadline).
      const bool orderly = !failed && !in_flight;
      (void)session->Shutdown(orderly ? absl::Now() + std::min(comm->timeout, absl::Seconds(10))
                                      : absl::Now());
    }
    session.reset();
  }

  std::string Who() const { return absl::StrCat("refit handle \"", name, "\" on rank ", rank); }

  absl::Status Streams() {
    if (streams != nullptr) return absl::OkStatus();
    cuda::StreamOps& ops = internal::StreamOpsForHandles();
    RESHARD_RETURN_IF_ERROR(ops.Available());
    streams = std::make_unique<internal::StreamOrder>(ops);
    return absl::OkStatus();
  }
  // Start (`on_stream` false) or StartOnStream.
  absl::Status Begin(bool on_stream, void* stream);
};

namespace {

// Matches the caller's buffers with the plan's, by side and name.
absl::StatusOr<std::vector<common::BufferView>> MatchBuffers(const plan::Plan& plan, int32_t rank,
                                                             const LocalBuffers& given,
                                                             const HandleOptions& options,
                                                             RefitHandle::Impl& impl) {
  const std::vector<int64_t> required = plan.BufferBytes(rank);
  std::vector<common::BufferView> out(plan.buffers().size());
  // The first tensor of buffer `b` this rank holds, for messages (a scan: only on errors).
  auto tensor_of = [&](uint32_t b, plan::Side ps) -> std::string {
    for (size_t t = 0; t < plan.spec().tensors.size(); ++t) {
      if (plan.buffer_of(t, ps) == b && plan.spec().layout(t, ps).mesh.IndexOf(rank) >= 0) {
        return plan.spec().tensors[t].name;
      }
    }
    return plan.buffers()[b].name;
  };
  for (Side side : {Side::kSource, Side::kDestination}) {
    const plan::Side ps = side == Side::kSource ? plan::Side::kSrc : plan::Side::kDst;
    absl::flat_hash_map<std::string, uint32_t> ids;
    for (uint32_t b = 0; b < plan.buffers().size(); ++b) {
      if (plan.buffers()[b].side == ps && !plan.buffers()[b].internal) ids[plan.buffers()[b].name] = b;
    }
    const auto& list = side == Side::kSource ? given.sources() : given.destinations();
    absl::flat_hash_set<std::string> seen;
    for (const auto& [name, buf] : list) {
      auto it = ids.find(name);
      if (it == ids.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", rank, ": no tensor of the spec lives in a ", SideName(side),
                         " buffer named \"", name,
                         "\" (buffers are named by Layout::InBuffer, or after their tensor)"));
      }
      if (!seen.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", rank, ": ", SideName(side),
                                                       " buffer \"", name, "\" is given twice"));
      }
      const uint32_t b = it->second;
      const int64_t want = required[b];
      if (buf.bytes < 0 || (buf.bytes > 0 && buf.data == nullptr)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", tensor_of(b, ps), "\" on rank ", rank, ": ", SideName(side),
                         " buffer \"", name, "\" has a null pointer or negative size"));
      }
      if (buf.bytes < want || (buf.bytes > want && !options.allow_larger_buffers)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", tensor_of(b, ps), "\" on rank ", rank, ": ", SideName(side),
            " buffer \"", name, "\" has ", buf.bytes, " bytes, expected ", want,
            buf.bytes > want ? " (set HandleOptions::allow_larger_buffers to accept more)" : ""));
      }
      // The GPU kernels (pack, quantize, delta) load whole elements from device memory: a
      // misaligned address there is a CUDA fault that ends the process's context, so it is
      // refused here. Host memory is read with memcpy and takes any address.
      const int elem = plan.buffers()[b].elem_bytes;
      if (buf.kind == MemoryKind::kCuda && elem > 1 &&
          reinterpret_cast<uintptr_t>(buf.data) % static_cast<uintptr_t>(elem) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", tensor_of(b, ps), "\" on rank ", rank, ": ", SideName(side),
                         " buffer \"", name, "\" starts at CUDA address ",
                         absl::Hex(reinterpret_cast<uintptr_t>(buf.data), absl::kZeroPad16),
                         ", which is not a multiple of its ", elem,
                         "-byte elements (GPU kernels load whole elements)"));
      }
      out[b] = common::BufferView{buf.data, buf.bytes, internal::ToCommon(buf.kind)};
    }
    for (uint32_t b = 0; b < plan.buffers().size(); ++b) {
      if (plan.buffers()[b].side != ps || required[b] == 0 || out[b].data != nullptr) continue;
      if (plan.buffers()[b].internal) {
        // What this rank quantizes its sources into before each refit (quant_spec.h): host
        // memory the handle owns (the session checks that the sources are host memory too).
        impl.internal_buffers.emplace_back(static_cast<size_t>(required[b]), 0);
        out[b] = common::BufferView{impl.internal_buffers.back().data(), required[b],
                                    common::MemoryKind::kHost};
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", tensor_of(b, ps), "\" on rank ", rank, ": no ", SideName(side), " buffer \"",
          plan.buffers()[b].name, "\" was given (", required[b], " bytes expected)"));
    }
  }
  if (plan.stage_buffer() != plan::Plan::kNoBuffer) {
    const int64_t bytes = plan.stage_bytes(rank);
    const bool fanout_layer = options.fanout == Fanout::kAuto && plan.stats().bytes_fanout > 0;
    uint8_t* data = nullptr;
    if (bytes > 0 && fanout_layer) {
      RESHARD_ASSIGN_OR_RETURN(impl.shared_staging, SharedBuffer::Allocate(
                                                        absl::StrCat("r", rank, "-stage"), bytes));
      data = impl.shared_staging->data();
    } else if (bytes > 0) {
      impl.private_staging.assign(static_cast<size_t>(bytes), 0);
      data = impl.private_staging.data();
    }
    out[plan.stage_buffer()] = common::BufferView{data, bytes, common::MemoryKind::kHost};
  }
  return out;
}

void PlannedBytes(const plan::Plan& plan, int32_t rank, Stats& s) {
  auto add = [&](uint32_t i, bool incoming) {
    const plan::Transfer& t = plan.transfers()[i];
    const int64_t bytes = plan.region(t.region).bytes;
    switch (t.kind) {
      case plan::TransferKind::kLocal:
        if (incoming) s.planned_local += bytes;
        break;
      case plan::TransferKind::kNetwork:
        (incoming ? s.planned_network_in : s.planned_network_out) += bytes;
        break;
      case plan::TransferKind::kFanout:
        (incoming ? s.planned_fanout_in : s.planned_fanout_out) += bytes;
        break;
    }
  };
  auto [rb, re] = plan.receives(rank);
  for (const uint32_t* p = rb; p != re; ++p) add(*p, true);
  s.pieces_expected = re - rb;
  auto [sb, se] = plan.sends(rank);
  for (const uint32_t* p = sb; p != se; ++p) add(*p, false);
}

}  // namespace

absl::StatusOr<RefitHandle> RefitHandle::Create(const Communicator& comm, const RefitSpec& spec,
                                                LocalBuffers buffers,
                                                const HandleOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->comm = comm.impl();
  impl->rank = comm.rank();
  // Every rank takes its handle number first, whatever fails below, so names stay aligned.
  impl->name =
      options.name.empty() ? absl::StrCat("h", impl->comm->NextHandleNumber()) : options.name;
  if (spec.tensors().empty()) return absl::InvalidArgumentError("the refit spec lists no tensors");
  auto shared = std::make_shared<const plan::RefitSpec>(internal::ToPlanSpec(spec));
  const int32_t spec_world = shared->WorldSize();
  if (comm.world_size() < spec_world) {
    return absl::InvalidArgumentError(absl::StrCat("the spec names ranks up to ", spec_world - 1,
                                                   " but the communicator has ", comm.world_size(),
                                                   " ranks"));
  }
  internal::SessionConfig config;
  config.key_prefix = absl::StrCat("reshard/", impl->name);
  config.setup_timeout = options.setup_timeout;
  config.fanout_layer = options.fanout == Fanout::kAuto;
  config.engine.delta = options.delta;
  config.engine.stage_ring_bytes = options.stage_ring_bytes;
  config.engine.stage_landing_bytes = options.stage_landing_bytes;
  config.engine.stage_round_bytes = options.stage_round_bytes;
  const bool in_spec = impl->rank < spec_world;
  // A rank of the spec that fails before the session's agreement step tells the others, which
  // would otherwise wait for its fingerprint until their set-up deadline.
  auto fail = [&](absl::Status st) {
    if (in_spec) internal::RefitSession::AbandonSetUp(impl->comm->store(), config, impl->rank, st);
    return st;
  };
  plan::PlanOptions popts;
  popts.schedule = options.schedule == Schedule::kPointToPoint
                       ? plan::PlanOptions::Schedule::kPointToPoint
                       : plan::PlanOptions::Schedule::kDomainAware;
  // This rank's share of the plan: memory and work scale with what it moves (docs/planning.md),
  // validation with what concerns it. A rank the spec does not name plans rank 0's share: every
  // share carries the world plan's fingerprint.
  absl::StatusOr<plan::Plan> planned =
      plan::BuildRankPlan(shared, in_spec ? impl->rank : 0, popts);
  if (!planned.ok()) return fail(planned.status());
  auto plan = std::make_shared<const plan::Plan>(*std::move(planned));
  impl->fingerprint = plan->fingerprint();
  impl->stats.fanout = "none";
  if (!in_spec) {
    // The spec does not name this rank: it has nothing to send or receive.
    for (Side side : {Side::kSource, Side::kDestination}) {
      const auto& list = side == Side::kSource ? buffers.sources() : buffers.destinations();
      if (!list.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", impl->rank, ": the spec names no tile on this rank, yet ",
                         SideName(side), " buffer \"", list.front().first, "\" was given"));
      }
    }
    return RefitHandle(std::move(impl));
  }
  absl::StatusOr<std::vector<common::BufferView>> local =
      MatchBuffers(*plan, impl->rank, buffers, options, *impl);
  if (!local.ok()) return fail(local.status());
  PlannedBytes(*plan, impl->rank, impl->stats);
  absl::StatusOr<std::shared_ptr<net::Runtime>> runtime = impl->comm->Runtime();
  if (!runtime.ok()) return fail(runtime.status());
  absl::StatusOr<std::unique_ptr<internal::RefitSession>> session = internal::RefitSession::Create(
      std::move(plan), impl->rank, impl->comm->store(), *std::move(runtime), *std::move(local),
      config);
  if (!session.ok()) {
    return absl::Status(session.status().code(),
                        absl::StrCat(impl->Who(), ": set-up failed: ", session.status().message()));
  }
  impl->session = *std::move(session);
  impl->stats.fanout = impl->session->fanout_name();
  return RefitHandle(std::move(impl));
}

absl::Status RefitHandle::Abandon(const Communicator& comm, const RefitSpec& spec,
                                  absl::Status why, const HandleOptions& options) {
  const int32_t rank = comm.rank();
  // The same number and key prefix Create takes first, whatever fails after it.
  const std::string name =
      options.name.empty() ? absl::StrCat("h", comm.impl()->NextHandleNumber()) : options.name;
  if (why.ok()) {
    why = absl::UnknownError(
        absl::StrCat("rank ", rank, " abandoned the set-up of refit handle \"", name,
                     "\" without saying why"));
  }
  if (spec.tensors().empty()) return why;
  // Ranks the spec does not name take part in nothing; the others wait for this rank's
  // fingerprint, which the failure replaces.
  if (rank < spec.WorldSize()) {
    internal::SessionConfig config;
    config.key_prefix = absl::StrCat("reshard/", name);
    internal::RefitSession::AbandonSetUp(comm.impl()->store(), config, rank, why);
  }
  return why;
}

RefitHandle::RefitHandle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RefitHandle::RefitHandle(RefitHandle&&) noexcept = default;
RefitHandle& RefitHandle::operator=(RefitHandle&&) noexcept = default;
RefitHandle::~RefitHandle() = default;

absl::Status RefitHandle::Start() { return impl_->Begin(false, nullptr); }
absl::Status RefitHandle::StartOnStream(void* stream) { return impl_->Begin(true, stream); }

absl::Status RefitHandle::Impl::Begin(bool on_stream, void* stream) {
  Impl& h = *this;
  if (h.in_flight) {
    return absl::FailedPreconditionError(
        absl::StrCat(h.Who(), ": refit ", h.epoch, " is still in flight; call Wait() first"));
  }
  if (h.failed) {
    return absl::FailedPreconditionError(
        absl::StrCat(h.Who(), ": refit ", h.epoch, " failed (", h.failure.ToString(),
                     "); call Reset() on every rank before refitting again"));
  }
  internal::StreamOrder* gate = nullptr;
  if (on_stream) {
    absl::Status gated = h.Streams();
    if (gated.ok()) gated = h.streams->Gate(stream);
    if (!gated.ok()) {
      return absl::Status(gated.code(), absl::StrCat(h.Who(), ": StartOnStream: ", gated.message(),
                                                     "; refit ", h.epoch + 1, " did not start"));
    }
    gate = h.streams.get();
  } else if (h.streams != nullptr) {
    h.streams->ClearGate();
  }
  common::FaultPoint(common::FaultStage::kBetween, h.rank, h.epoch + 1);
  ++h.epoch;
  h.in_flight = true;
  h.started = absl::Now();
  h.registrations_at_start = net::RegistrationCount();
  if (h.session == nullptr) return absl::OkStatus();
  absl::Status st = h.session->Start(h.epoch, gate);
  h.stats.start_seconds = absl::ToDoubleSeconds(absl::Now() - h.started);
  if (!st.ok()) {
    h.session->Abort(h.epoch, st);
    if (h.streams != nullptr) h.streams->Release();
    h.in_flight = false;
    h.failed = true;
    h.failure = st;
    return absl::Status(st.code(), absl::StrCat(h.Who(), ": refit ", h.epoch, ": ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status RefitHandle::Wait(absl::Time deadline) {
  Impl& h = *impl_;
  if (!h.in_flight) {
    return absl::FailedPreconditionError(
        absl::StrCat(h.Who(), ": Wait() without a refit in flight; call Start() first"));
  }
  const absl::Time wait_start = absl::Now();
  absl::Status st = h.session != nullptr ? h.session->Wait(h.epoch, deadline) : absl::OkStatus();
  const absl::Time end = absl::Now();
  // Done or failed: streams queued behind this refit run on (a failure is what Wait returns).
  if (h.streams != nullptr) h.streams->Release();
  h.in_flight = false;
  Stats& s = h.stats;
  s.epoch = h.epoch;
  s.wait_seconds = absl::ToDoubleSeconds(end - wait_start);
  s.total_seconds = absl::ToDoubleSeconds(end - h.started);
  s.registrations_total = net::RegistrationCount();
  s.registrations_this_refit = s.registrations_total - h.registrations_at_start;
  if (h.session != nullptr) h.session->FillStats(s);
  for (const auto& b : h.internal_buffers) s.quantize_buffer_bytes += static_cast<int64_t>(b.size());
  if (!st.ok()) {
    if (h.session != nullptr) h.session->Abort(h.epoch, st);
    h.failed = true;
    h.failure = st;
    return absl::Status(st.code(), absl::StrCat(h.Who(), ": refit ", h.epoch, ": ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status RefitHandle::RecordCompletion(void* stream) {
  Impl& h = *impl_;
  if (!h.in_flight) {
    return absl::FailedPreconditionError(absl::StrCat(
        h.Who(), ": RecordCompletion() without a refit in flight; call it between Start() and ",
        "Wait()"));
  }
  absl::Status st = h.Streams();
  if (st.ok()) st = h.streams->AddCompletionStream(stream);
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat(h.Who(), ": RecordCompletion (refit ", h.epoch,
                                                "): ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status RefitHandle::Execute(absl::Time deadline) {
  RESHARD_RETURN_IF_ERROR(Start());
  return Wait(deadline);
}

absl::Status RefitHandle::Barrier(absl::Time deadline) {
  Impl& h = *impl_;
  if (h.in_flight) {
    return absl::FailedPreconditionError(
        absl::StrCat(h.Who(), ": Barrier() while refit ", h.epoch, " is in flight"));
  }
  ++h.barriers;
  if (h.session == nullptr) return absl::OkStatus();
  absl::Status st = h.session->Barrier(h.barriers, deadline);
  if (!st.ok()) {
    // A peer is gone or late: refits would fail the same way, and the orderly shutdown at
    // destruction must not wait for it.
    h.failed = true;
    h.failure = st;
    return absl::Status(st.code(),
                        absl::StrCat(h.Who(), ": barrier ", h.barriers, ": ", st.message()));
  }
  return absl::OkStatus();
}

void RefitHandle::Reset() {
  Impl& h = *impl_;
  if (h.session != nullptr) h.session->Reset();
  if (h.streams != nullptr) {
    h.streams->Release();
    h.streams->ClearGate();
  }
  h.failed = false;
  h.in_flight = false;
  h.failure = absl::OkStatus();
}

bool RefitHandle::failed() const { return impl_->failed; }
uint64_t RefitHandle::epoch() const { return impl_->epoch; }
const Stats& RefitHandle::stats() const { return impl_->stats; }
int RefitHandle::rank() const { return impl_->rank; }
uint64_t RefitHandle::plan_fingerprint() const { return impl_->fingerprint; }

const char* Version() { return RESHARD_VERSION_STRING; }

}  // namespace reshard
