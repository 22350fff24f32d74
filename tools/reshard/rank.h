// One rank of a multi-process refit run: the body of `reshard-rank` (see rank_main.cc), also
// called directly by tests and benchmarks in forked children.
//
// It plans the spec (every rank plans the whole spec deterministically), allocates this rank's
// buffers (page-aligned host memory), creates one RefitEngine, and for each iteration i fills
// its source tiles with the fill of epoch i + 1, poisons its destination and staging buffers,
// runs one refit, verifies every destination tile and records the time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "src/net/refit_engine.h"
#include "src/rendezvous/store.h"
#include "src/plan/plan.h"

namespace reshard::cli {

struct RankOptions {
  std::string spec_path;
  int iters = 1;
  std::string plan_mode = "ours";  // ours | naive
  int32_t rank = 0;
  int32_t world_size = 0;          // Must equal the spec's world size.
  absl::Duration timeout = absl::Milliseconds(30000);  // Every wait (RESHARD_TIMEOUT_MS).
  std::string key_prefix = "reshard/rank";
  net::RefitEngineOptions engine;  // key_prefix and setup_timeout are overridden.
  // kFanout transfers: "auto" hands those between ranks of this rank's domain to the intra-domain
  // fan-out layer (src/nvlink; the host backend, destination and staging buffers allocated as
  // nvlink::SharedBuffer) and the engine runs only the network stage; "engine" lets the engine
  // put them over the network like any other transfer (engine.execute_fanout).
  std::string fanout = "auto";
};

struct RankReport {
  int32_t rank = 0;
  bool ok = false;
  bool invalid_input = false;  // The spec, the plan mode or the world size was wrong (exit 2).
  std::vector<double> iter_ms;
  int64_t bytes_network_sent = 0;      // Per refit (the last one that ran).
  int64_t bytes_network_received = 0;  // Per refit.
  int64_t pieces_received = 0;         // Per refit, local copies included.
  int64_t registrations_first = 0;     // Registrations up to the end of the first refit.
  int64_t registrations_after_first = 0;
  std::string transports;
  std::string fanout_backend;          // "host", ... or "" when the engine ran the fan-out.
  int64_t bytes_fanout_sent = 0;       // Per refit (the last one), by the fan-out layer.
  double fanout_busy_ms = 0;           // Last refit: time with a fan-out copy in flight.
  double fanout_hidden_fraction = 1;   // Last refit: share of it inside the network stage.
  double fanout_domain_hidden_fraction = 1;  // Same, inside the domain's network stage.
  std::string error;
};

// Maps a --plan-mode value to planner options. InvalidArgument for an unknown mode or for
// gather_broadcast, which is a simulated baseline only (`reshard sim`).
[[nodiscard]] absl::StatusOr<plan::PlanOptions> PlanOptionsForMode(const std::string& mode);

// Runs every iteration; never throws or aborts on bad input. The report says what happened.
RankReport RunRank(const RankOptions& options, rendezvous::Store& store);

// The report as one line of JSON (no newline):
// {"rank":R,"ok":true,"iter_ms":[...],"bytes_network_sent":B,"bytes_network_received":B,
//  "pieces_received":N,"registrations_first":N,"registrations_after_first":N,
//  "transports":"...","fanout":"host","bytes_fanout_sent":B,"fanout_busy_ms":T,
//  "fanout_hidden_fraction":F,"fanout_domain_hidden_fraction":F,"error":"..."}
std::string RankReportJson(const RankReport& report);

}  // namespace reshard::cli
