#include "tools/reshard/rank.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/common/json.h"
#include "src/common/status.h"
#include "src/nvlink/fanout.h"
#include "src/nvlink/shared_buffer.h"
#include "src/plan/fill.h"
#include "src/plan/schedule.h"
#include "src/plan/spec_json.h"

namespace reshard::cli {
namespace {

constexpr uint8_t kPoison = 0xA5;
constexpr size_t kPage = 4096;

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, AlignedFree>;

}  // namespace

absl::StatusOr<plan::PlanOptions> PlanOptionsForMode(const std::string& mode) {
  plan::PlanOptions options;
  if (mode == "ours") {
    options.schedule = plan::PlanOptions::Schedule::kDomainAware;
  } else if (mode == "naive") {
    options.schedule = plan::PlanOptions::Schedule::kPointToPoint;
  } else if (mode == "gather_broadcast") {
    return absl::InvalidArgumentError(
        "--plan-mode gather_broadcast is a simulated baseline (see `reshard sim`); reshard-rank "
        "executes \"ours\" or \"naive\"");
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--plan-mode must be ours, naive or gather_broadcast, not \"", mode, "\""));
  }
  return options;
}

RankReport RunRank(const RankOptions& options, rendezvous::Store& store) {
  RankReport report;
  report.rank = options.rank;
  auto fail = [&](const absl::Status& status, bool invalid) {
    report.ok = false;
    report.invalid_input = invalid;
    report.error = std::string(status.message());
    return report;
  };

  absl::StatusOr<plan::PlanOptions> plan_options = PlanOptionsForMode(options.plan_mode);
  if (!plan_options.ok()) return fail(plan_options.status(), true);
  absl::StatusOr<plan::RefitSpec> spec = plan::LoadSpecFile(options.spec_path);
  if (!spec.ok()) return fail(spec.status(), true);
  auto shared = std::make_shared<const plan::RefitSpec>(*std::move(spec));
  absl::StatusOr<plan::Plan> plan = plan::BuildPlan(shared, *plan_options);
  if (!plan.ok()) return fail(plan.status(), true);
  if (options.world_size != plan->world_size() || options.rank < 0 ||
      options.rank >= plan->world_size()) {
    return fail(absl::InvalidArgumentError(absl::StrFormat(
                    "rank %d of a world of %d ranks, but the spec %s names %d ranks",
                    options.rank, options.world_size, options.spec_path, plan->world_size())),
                true);
  }
  const plan::RefitSpec& s = plan->spec();
  const int32_t me = options.rank;
  if (options.fanout != "auto" && options.fanout != "engine") {
    return fail(absl::InvalidArgumentError(absl::StrCat(
                    "--fanout must be auto or engine, not \"", options.fanout, "\"")),
                true);
  }
  // This rank's fan-out edges inside its domain; the fan-out layer takes them over.
  const plan::DomainMap domains(s);
  std::vector<int32_t> domain =
      domains.domain_of(me) >= 0 ? domains.ranks(domains.domain_of(me)) : std::vector<int32_t>{me};
  nvlink::FanoutTable fanout_table = nvlink::FanoutTable::FromPlan(*plan, domain);
  bool use_fanout = false;
  if (options.fanout == "auto") {
    for (const nvlink::FanoutEdge& e : fanout_table.edges) {
      use_fanout = use_fanout || e.from_rank == me || e.to_rank == me;
    }
  }

  // Buffers: page-aligned host memory, one per plan buffer id; destination and staging buffers
  // in shared memory when domain peers copy into them.
  const std::vector<int64_t> bytes = plan->BufferBytes(me);
  std::vector<AlignedBuffer> memory(bytes.size());
  std::vector<std::unique_ptr<nvlink::SharedBuffer>> shm(bytes.size());
  std::vector<uint8_t*> base(bytes.size(), nullptr);
  std::vector<common::BufferView> buffers(bytes.size());
  for (size_t b = 0; b < bytes.size(); ++b) {
    if (bytes[b] == 0) continue;
    const size_t rounded = (static_cast<size_t>(bytes[b]) + kPage - 1) / kPage * kPage;
    if (use_fanout && plan->buffers()[b].side != plan::Side::kSrc) {
      absl::StatusOr<std::unique_ptr<nvlink::SharedBuffer>> sb = nvlink::SharedBuffer::Allocate(
          absl::StrCat("r", me, "-", plan->buffers()[b].name), bytes[b]);
      if (!sb.ok()) return fail(sb.status(), false);
      shm[b] = *std::move(sb);
      base[b] = shm[b]->data();
    } else {
      memory[b].reset(static_cast<uint8_t*>(std::aligned_alloc(kPage, rounded)));
      base[b] = memory[b].get();
    }
    if (base[b] == nullptr) {
      return fail(absl::ResourceExhaustedError(absl::StrFormat(
                      "rank %d cannot allocate %d bytes for buffer \"%s\"", me, bytes[b],
                      plan->buffers()[b].name)),
                  false);
    }
    std::memset(base[b], kPoison, static_cast<size_t>(bytes[b]));
    buffers[b] = common::BufferView{base[b], bytes[b], common::MemoryKind::kHost};
  }

  net::RefitEngineOptions engine_options = options.engine;
  engine_options.key_prefix = options.key_prefix;
  engine_options.setup_timeout = options.timeout;
  // The engine skips kFanout transfers everywhere when the layer runs them (every rank decides
  // the same way from the same plan and option).
  if (options.fanout == "auto" && plan->stats().bytes_fanout > 0) {
    engine_options.execute_fanout = false;
  }
  std::unique_ptr<nvlink::Fanout> fanout;
  if (use_fanout) {
    std::vector<common::BufferView> fanout_buffers(bytes.size());
    for (size_t b = 0; b < bytes.size(); ++b) {
      fanout_buffers[b] = {base[b], bytes[b], common::MemoryKind::kHost};
    }
    nvlink::FanoutOptions fo;
    fo.key_prefix = options.key_prefix + "/fanout";
    fo.setup_timeout = options.timeout;
    absl::StatusOr<std::unique_ptr<nvlink::Fanout>> created = nvlink::Fanout::Create(
        std::move(fanout_table), me, domain, store, std::move(fanout_buffers), fo);
    if (!created.ok()) return fail(created.status(), false);
    fanout = *std::move(created);
    report.fanout_backend = fanout->backend_name();
  }
  absl::StatusOr<std::unique_ptr<net::RefitEngine>> engine =
      net::RefitEngine::Create(*plan, me, store, buffers, engine_options);
  if (!engine.ok()) return fail(engine.status(), false);

  for (int i = 0; i < options.iters; ++i) {
    const uint64_t epoch = static_cast<uint64_t>(i) + 1;
    for (size_t t = 0; t < s.tensors.size(); ++t) {
      uint8_t* src = base[plan->buffer_of(t, plan::Side::kSrc)];
      plan::ForEachTile(s, t, plan::Side::kSrc, [&](int32_t rank, const plan::Box& box) {
        if (rank == me) plan::FillTile(s, t, plan::Side::kSrc, box, epoch, src);
      });
    }
    for (size_t b = 0; b < bytes.size(); ++b) {
      if (bytes[b] > 0 && plan->buffers()[b].side != plan::Side::kSrc) {
        std::memset(base[b], kPoison, static_cast<size_t>(bytes[b]));
      }
    }
    // Measurement barrier (this program only, not part of a refit): without it a source starts
    // its clock while destinations still verify the previous refit, and the time it then waits
    // for their grant would be counted as refit time. It waits in short store reads and keeps
    // the engine progressing in between, so a peer lost meanwhile (or a peer's abort) fails this
    // rank at once instead of after the whole timeout.
    {
      const std::string key = absl::StrCat(options.key_prefix, "/iter/", epoch, "/");
      absl::Status b = store.Set(absl::StrCat(key, me), "1");
      const absl::Time barrier_deadline = absl::Now() + options.timeout;
      for (int32_t r = 0; b.ok() && r < plan->world_size(); ++r) {
        while (true) {
          b = store.Get(absl::StrCat(key, r), absl::Now() + absl::Milliseconds(20)).status();
          if (b.ok() || !absl::IsDeadlineExceeded(b)) break;
          b = (*engine)->Progress(nullptr);
          if (!b.ok()) break;
          if (absl::Now() >= barrier_deadline) {
            b = absl::DeadlineExceededError(absl::StrFormat(
                "rank %d: rank %d did not reach refit %d within %s", me, r, epoch,
                absl::FormatDuration(options.timeout)));
            break;
          }
        }
      }
      if (!b.ok()) return fail(b, false);
    }
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + options.timeout;
    absl::Status status = fanout ? fanout->Start(epoch) : absl::OkStatus();
    if (status.ok()) status = (*engine)->Start(epoch);
    int64_t fanout_arrivals = 0;
    if (fanout) {
      // Forward each piece as soon as the engine reports it landed, while later pieces are
      // still on the network; count fan-out arrivals like network pieces.
      // One more pass after the engine finished drains the last landings (an epoch of local
      // copies only may finish inside Start()).
      std::vector<uint32_t> landed;
      bool more = true;
      while (status.ok() && more) {
        more = (*engine)->in_epoch();
        landed.clear();
        status = (*engine)->Progress(&landed);
        for (size_t k = 0; k < landed.size() && status.ok(); ++k) {
          status = fanout->Landed(landed[k], epoch);
        }
        if (status.ok()) {
          absl::StatusOr<std::vector<uint32_t>> arrived = fanout->Poll(epoch);
          if (arrived.ok()) {
            fanout_arrivals += static_cast<int64_t>(arrived->size());
          } else {
            status = arrived.status();
          }
        }
        if (status.ok() && absl::Now() >= deadline) break;  // Wait() names what is missing.
      }
      if (status.ok() && !(*engine)->in_epoch()) fanout->NetworkDone(epoch);
    }
    if (status.ok()) status = (*engine)->Wait(deadline);
    if (status.ok() && fanout) status = fanout->Wait(epoch, deadline);
    const absl::Time end = absl::Now();
    if (!status.ok()) {
      fail(status, false);
      break;
    }
    report.iter_ms.push_back(absl::ToDoubleMilliseconds(end - start));
    const net::RefitStats& stats = (*engine)->last_stats();
    report.bytes_network_sent = stats.bytes_network_sent;
    report.bytes_network_received = stats.bytes_network_received;
    report.pieces_received = stats.pieces_received + (fanout ? fanout->stats().arrivals : 0);
    (void)fanout_arrivals;
    if (fanout) {
      report.bytes_fanout_sent = fanout->stats().bytes_sent;
      report.fanout_busy_ms = fanout->stats().busy_seconds * 1e3;
      report.fanout_hidden_fraction = fanout->stats().hidden_fraction;
      report.fanout_domain_hidden_fraction = fanout->stats().domain_hidden_fraction;
    }
    if (i == 0) {
      report.registrations_first = net::RegistrationCount();
      report.transports = (*engine)->Transports();
    }
    for (size_t t = 0; t < s.tensors.size() && status.ok(); ++t) {
      const uint8_t* dst = base[plan->buffer_of(t, plan::Side::kDst)];
      plan::ForEachTile(s, t, plan::Side::kDst, [&](int32_t rank, const plan::Box& box) {
        if (rank == me && status.ok()) status = plan::VerifyTile(s, t, box, epoch, me, dst);
      });
    }
    if (!status.ok()) {
      fail(absl::DataLossError(absl::StrCat("refit ", epoch, ": ", std::string(status.message()))),
           false);
      break;
    }
  }
  report.registrations_after_first =
      report.iter_ms.empty() ? 0 : net::RegistrationCount() - report.registrations_first;
  if (report.error.empty()) report.ok = true;
  absl::Status bye = (*engine)->Shutdown(absl::Now() + options.timeout);
  if (!bye.ok() && report.ok) {
    std::fprintf(stderr, "reshard-rank %d: %s\n", me, std::string(bye.message()).c_str());
  }
  return report;
}

std::string RankReportJson(const RankReport& r) {
  std::vector<std::string> ms;
  for (double v : r.iter_ms) ms.push_back(absl::StrFormat("%.3f", v));
  return absl::StrCat(
      "{\"rank\":", r.rank, ",\"ok\":", r.ok ? "true" : "false", ",\"iter_ms\":[",
      absl::StrJoin(ms, ","), "],\"bytes_network_sent\":", r.bytes_network_sent,
      ",\"bytes_network_received\":", r.bytes_network_received,
      ",\"pieces_received\":", r.pieces_received, ",\"registrations_first\":",
      r.registrations_first, ",\"registrations_after_first\":", r.registrations_after_first,
      ",\"transports\":", json::Quote(r.transports), ",\"fanout\":", json::Quote(r.fanout_backend),
      ",\"bytes_fanout_sent\":", r.bytes_fanout_sent, ",\"fanout_busy_ms\":",
      absl::StrFormat("%.3f", r.fanout_busy_ms), ",\"fanout_hidden_fraction\":",
      absl::StrFormat("%.3f", r.fanout_hidden_fraction), ",\"fanout_domain_hidden_fraction\":",
      absl::StrFormat("%.3f", r.fanout_domain_hidden_fraction), ",\"error\":", json::Quote(r.error),
      "}");
}

}  // namespace reshard::cli
