// One rank of a multi-process refit run: the body of `reshard-rank` (see rank_main.cc), written
// against the public API only (reshard/reshard.h): what it exercises is RefitHandle, the object
// users call.
//
// It reads the spec, creates one RefitHandle over this rank's buffers (destination buffers in
// HostBuffers that domain peers map, sources in private page-aligned memory), and for each
// iteration i fills its source tiles with the pattern of epoch i + 1 (tile_fill.h), poisons its
// destination buffers, lines the ranks up with RefitHandle::Barrier (so a source's clock does
// not include waiting for destinations still verifying the previous refit), runs one refit,
// records its time and verifies every destination tile. With `memory` "cuda" the buffers are
// device memory (see RankOptions::memory). With `delta` the handle runs delta
// refits (docs/delta.md) and destinations are poisoned only before the first refit (they must
// keep the last refit's values); with `change_fraction` >= 0 each refit after the first changes
// that fraction of the source elements (TilePatterns::Change) instead of all of them, and
// destinations are checked against exactly those values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "reshard/reshard.h"

namespace reshard::cli {

struct RankOptions {
  std::string spec_path;
  int iters = 1;
  std::string plan_mode = "ours";  // ours | naive
  std::string fanout = "auto";     // auto (fan-out layer) | engine (engine puts)
  std::string handle_name = "rank";
  absl::Duration timeout = absl::Milliseconds(30000);  // Every wait (RESHARD_TIMEOUT_MS).
  bool delta = false;
  double change_fraction = -1;  // < 0: every element changes every refit.
  // Each refit after the first changes RandomChangeFraction(epoch) of the elements (implies
  // sparse changes; change_fraction is then ignored).
  bool random_fraction = false;
  // Every fail_every-th refit (epoch % fail_every == 0, > 1) the last rank gives up at once
  // (Start, then Wait with a deadline already past); every rank then calls Reset() and goes on.
  // Those refits are neither timed nor verified. 0: none.
  int fail_every = 0;
  // "host", or "cuda": every buffer is device memory on GPU local_rank % devices, allocated with
  // the CUDA runtime; sources are filled through a host mirror and copied to the device before
  // each refit, destinations copied back after it and verified (outside the timed refit).
  std::string memory = "host";
};

// The change fraction of refit `epoch` (>= 2) under --change-fraction random: 0 for every 10th,
// 1 for the one after it, else uniform in [0, 1) (a hash of the epoch, the same on every rank).
double RandomChangeFraction(uint64_t epoch);

struct RankReport {
  int32_t rank = 0;
  bool ok = false;
  int failed_on_purpose = 0;  // Refits of fail_every that failed on this rank.
  bool invalid_input = false;  // The spec, the options or the world size was wrong (exit 2).
  std::vector<double> iter_ms;
  int64_t bytes_network_sent = 0;      // Per refit (the last one that ran).
  int64_t bytes_network_received = 0;  // Per refit.
  int64_t pieces_received = 0;         // Per refit: network, fan-out and local pieces.
  int64_t puts = 0;                    // Per refit: one-sided puts posted.
  int64_t data_messages = 0;           // Per refit: data active messages posted.
  int64_t single_copy_writes = 0;      // Per refit: process_vm_writev calls to same-host peers.
  int64_t mapped_copies = 0;           // Per refit: runs copied into mapped same-host buffers.
  int64_t registrations_first = 0;     // Registrations up to the end of the first refit.
  int64_t registrations_after_first = 0;
  std::string transports;
  std::string fanout_backend;  // "host", "cuda_ipc", "nccl", or "" (no fan-out-layer copies).
  int64_t bytes_fanout_sent = 0;       // Per refit (the last one), by the fan-out layer.
  double fanout_busy_ms = 0;           // Last refit: time with a fan-out copy in flight.
  double fanout_hidden_fraction = 1;   // Last refit: share of it inside the network stage.
  double fanout_domain_hidden_fraction = 1;  // Same, inside the domain's network stage.
  double quantize_ms = 0;              // Last refit: quantizing this rank's sources.
  double amax_exchange_ms = 0;         // Last refit: the amax exchange, start to end.
  int64_t quantize_buffer_bytes = 0;   // Host memory held for quantizing.
  // Delta refits, the last refit: pieces sent as deltas and as plain pieces, the bytes sent for
  // them and their plain bytes, the shadow this rank keeps.
  int64_t delta_pieces = 0, delta_full_pieces = 0;
  int64_t delta_stream_bytes = 0, delta_plain_bytes = 0, delta_shadow_bytes = 0;
  // Host memory the handle holds for streams (Stats::landing_area_bytes, send_scratch_bytes).
  int64_t landing_area_bytes = 0, send_scratch_bytes = 0;
  int64_t delta_relay_early_segments = 0;  // Last refit (Stats::delta_relay_early_segments).
  int64_t relay_early_bytes = 0;           // Last refit (Stats::relay_early_bytes).
  // --memory: "host" or "cuda", the GPU's PCI bus id, this rank's destination bytes (what a
  // refit writes here), and the Stats of CUDA buffers (registered by UCX or staged) and of the
  // last refit's staging copies.
  std::string memory = "host";
  std::string gpu;
  int64_t destination_bytes = 0;
  int64_t cuda_buffers_registered = 0, cuda_buffers_staged = 0;
  int64_t bytes_staged_to_host = 0, bytes_staged_to_device = 0, stage_ring_bytes = 0;
  int64_t stage_copy_bytes = 0, stage_landing_bytes = 0;
  std::string error;
};

// Maps a --plan-mode value to a schedule. InvalidArgument for an unknown mode or for
// gather_broadcast, which is a simulated baseline only (`reshard sim`).
[[nodiscard]] absl::StatusOr<Schedule> ScheduleForMode(const std::string& mode);

// Runs every iteration; never throws or aborts on bad input. The report says what happened.
RankReport RunRank(const RankOptions& options, const Communicator& comm);

// The report as one line of JSON (no newline), fields as in RankReport:
// {"rank":R,"ok":true,"iter_ms":[...],"bytes_network_sent":B,"bytes_network_received":B,
//  "pieces_received":N,"puts":N,"data_messages":N,"single_copy_writes":N,"mapped_copies":N,
//  "registrations_first":N,
//  "registrations_after_first":N,"transports":"...","fanout":"host","bytes_fanout_sent":B,
//  "fanout_busy_ms":T,"fanout_hidden_fraction":F,"fanout_domain_hidden_fraction":F,
//  "quantize_ms":T,"amax_exchange_ms":T,"quantize_buffer_bytes":B,
//  "delta_pieces":N,"delta_full_pieces":N,"delta_stream_bytes":B,"delta_plain_bytes":B,
//  "delta_shadow_bytes":B,"delta_relay_early_segments":N,"relay_early_bytes":B,
//  "landing_area_bytes":B,
//  "send_scratch_bytes":B,
//  "memory":"host","gpu":"","destination_bytes":B,
//  "cuda_buffers_registered":N,"cuda_buffers_staged":N,"bytes_staged_to_host":B,
//  "bytes_staged_to_device":B,"stage_ring_bytes":B,"stage_copy_bytes":B,
//  "stage_landing_bytes":B,"error":"..."}
std::string RankReportJson(const RankReport& report);

}  // namespace reshard::cli
