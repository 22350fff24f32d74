#include "tools/reshard/rank.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/common/escape.h"
#include "tools/reshard/device_memory.h"
#include "tools/reshard/tile_fill.h"

namespace reshard::cli {
namespace {

constexpr size_t kPage = 4096;

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};

// This rank's buffers, owned. Host memory: sources in private page-aligned memory;
// destinations in HostBuffers (same-host senders and domain peers that forward pieces to this
// rank map them: one memcpy per run), or private memory with a note when /dev/shm cannot hold
// them. CUDA memory (--memory cuda): every buffer is device memory on this rank's GPU, with a
// private host mirror that the tile patterns are filled into and verified from; the handle only
// sees the device pointers.
class RankBuffers {
 public:
  RankBuffers() = default;
  RankBuffers(const RankBuffers&) = delete;
  RankBuffers& operator=(const RankBuffers&) = delete;
  ~RankBuffers() {
    for (const auto& [key, device] : device_) gpu::Free(device);
  }

  absl::Status Allocate(const std::vector<BufferRequirement>& requirements, int rank, bool cuda) {
    rank_ = rank;
    for (const BufferRequirement& r : requirements) {
      void* data = nullptr;
      absl::StatusOr<HostBuffer> hb = absl::UnavailableError("");
      const char* side = r.side == Side::kSource ? "source" : "destination";
      if (r.bytes > 0 && r.side == Side::kDestination && !cuda) {
        hb = HostBuffer::Allocate(r.bytes, absl::StrCat("r", rank, "-", r.name));
        if (!hb.ok()) {
          std::fprintf(stderr,
                       "rank %d: destination buffer \"%s\" is private memory (senders on this "
                       "host write it by process_vm_writev): %s\n",
                       rank, r.name.c_str(), std::string(hb.status().message()).c_str());
        }
      }
      if (r.bytes == 0) {
        // Only empty tiles live here (uneven shards): nothing to allocate.
      } else if (hb.ok()) {
        data = hb->data();
        shared_.push_back(*std::move(hb));
      } else {
        const size_t rounded = (static_cast<size_t>(r.bytes) + kPage - 1) / kPage * kPage;
        private_.emplace_back(static_cast<uint8_t*>(std::aligned_alloc(kPage, rounded)));
        data = private_.back().get();
        if (data == nullptr) {
          return absl::ResourceExhaustedError(
              absl::StrFormat("rank %d cannot allocate %d bytes for %s buffer \"%s\"", rank,
                              r.bytes, side, r.name));
        }
      }
      if (data != nullptr) std::memset(data, 0xA5, static_cast<size_t>(r.bytes));
      const Buffer host{data, r.bytes, MemoryKind::kHost};
      by_name_[{r.side, r.name}] = host;
      if (!cuda || data == nullptr) {
        local_.Add(r.side, r.name, host);
        continue;
      }
      absl::StatusOr<void*> device = gpu::Alloc(r.bytes);
      if (!device.ok()) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "rank %d cannot allocate %d bytes of device memory for %s buffer \"%s\": %s", rank,
            r.bytes, side, r.name, device.status().message()));
      }
      device_[{r.side, r.name}] = *device;
      local_.Add(r.side, r.name, Buffer{*device, r.bytes, MemoryKind::kCuda});
    }
    return absl::OkStatus();
  }
  // The host memory of a buffer: the buffer itself, or the mirror of a device buffer.
  const Buffer& Get(Side side, const std::string& name) const { return by_name_.at({side, name}); }
  void PoisonDestinations() {
    for (const auto& [key, buffer] : by_name_) {
      if (key.first == Side::kDestination && buffer.data != nullptr) {
        std::memset(buffer.data, 0xA5, static_cast<size_t>(buffer.bytes));
      }
    }
  }
  // Device buffers: poisons the destinations on the device too; copies the mirrors of the
  // sources to the device; copies the destinations back into their mirrors (verification).
  absl::Status PoisonDeviceDestinations() { return ForDevice(Side::kDestination, kPoison); }
  absl::Status SourcesToDevice() { return ForDevice(Side::kSource, kToDevice); }
  absl::Status DestinationsToHost() { return ForDevice(Side::kDestination, kToHost); }
  LocalBuffers TakeLocal() { return std::move(local_); }

 private:
  enum DeviceStep { kPoison, kToDevice, kToHost };
  absl::Status ForDevice(Side side, DeviceStep step) {
    for (const auto& [key, device] : device_) {
      if (key.first != side) continue;
      const Buffer& host = by_name_.at(key);
      absl::Status st = step == kPoison     ? gpu::Fill(device, 0xA5, host.bytes)
                        : step == kToDevice ? gpu::ToDevice(device, host.data, host.bytes)
                                            : gpu::ToHost(host.data, device, host.bytes);
      if (!st.ok()) {
        static constexpr const char* kWhat[] = {"poisoning destination", "copying source",
                                                "reading back destination"};
        return absl::InternalError(absl::StrFormat("rank %d: %s buffer \"%s\" on the device: %s",
                                                   rank_, kWhat[step], key.second, st.message()));
      }
    }
    return absl::OkStatus();
  }

  std::vector<std::unique_ptr<uint8_t, AlignedFree>> private_;
  std::vector<HostBuffer> shared_;
  std::map<std::pair<Side, std::string>, Buffer> by_name_;
  std::map<std::pair<Side, std::string>, void*> device_;
  LocalBuffers local_;
  int rank_ = 0;
};

}  // namespace

absl::StatusOr<Schedule> ScheduleForMode(const std::string& mode) {
  if (mode == "ours") return Schedule::kDomainAware;
  if (mode == "naive") return Schedule::kPointToPoint;
  if (mode == "gather_broadcast") {
    return absl::InvalidArgumentError(
        "--plan-mode gather_broadcast is a simulated baseline (see `reshard sim`); reshard-rank "
        "executes \"ours\" or \"naive\"");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--plan-mode must be ours, naive or gather_broadcast, not \"", mode, "\""));
}

RankReport RunRank(const RankOptions& options, const Communicator& comm) {
  RankReport report;
  const int me = comm.rank();
  report.rank = me;
  auto fail = [&](const absl::Status& status, bool invalid) {
    report.ok = false;
    report.invalid_input = invalid;
    report.error = std::string(status.message());
    return report;
  };

  absl::StatusOr<Schedule> schedule = ScheduleForMode(options.plan_mode);
  if (!schedule.ok()) return fail(schedule.status(), true);
  if (options.fanout != "auto" && options.fanout != "engine") {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat("--fanout must be auto or engine, not \"", options.fanout, "\"")),
                true);
  }
  if (options.memory != "host" && options.memory != "cuda") {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat("--memory must be host or cuda, not \"", options.memory, "\"")),
                true);
  }
  const bool cuda = options.memory == "cuda";
  report.memory = options.memory;
  if (cuda) {
    if (absl::Status st = gpu::SelectForLocalRank(comm.local_rank()); !st.ok()) {
      return fail(absl::FailedPreconditionError(absl::StrCat(
                      "rank ", me, " has no CUDA device for --memory cuda: ", st.message())),
                  false);
    }
    report.gpu = gpu::CurrentBusId();
  }
  absl::StatusOr<RefitSpec> spec = RefitSpec::FromFile(options.spec_path);
  if (!spec.ok()) return fail(spec.status(), true);
  if (comm.world_size() != spec->WorldSize()) {
    return fail(absl::InvalidArgumentError(absl::StrFormat(
                    "rank %d of a world of %d ranks, but the spec %s names %d ranks", me,
                    comm.world_size(), options.spec_path, spec->WorldSize())),
                true);
  }
  absl::StatusOr<std::vector<BufferRequirement>> requirements = spec->LocalBuffers(me);
  if (!requirements.ok()) return fail(requirements.status(), true);
  absl::StatusOr<std::vector<LocalTile>> sources = spec->LocalTiles(me, Side::kSource);
  absl::StatusOr<std::vector<LocalTile>> destinations = spec->LocalTiles(me, Side::kDestination);
  if (!sources.ok()) return fail(sources.status(), true);
  if (!destinations.ok()) return fail(destinations.status(), true);
  const TilePatterns patterns(*spec);
  const bool sparse_changes = options.change_fraction >= 0 || options.random_fraction;
  for (const BufferRequirement& r : *requirements) {
    if (r.side == Side::kDestination) report.destination_bytes += r.bytes;
  }
  RankBuffers buffers;
  if (absl::Status st = buffers.Allocate(*requirements, me, cuda); !st.ok()) {
    return fail(st, false);
  }
  HandleOptions handle_options;
  handle_options.name = options.handle_name;
  handle_options.schedule = *schedule;
  handle_options.fanout = options.fanout == "engine" ? Fanout::kEngine : Fanout::kAuto;
  handle_options.setup_timeout = options.timeout;
  handle_options.delta = options.delta;
  absl::StatusOr<RefitHandle> handle =
      RefitHandle::Create(comm, *spec, buffers.TakeLocal(), handle_options);
  if (!handle.ok()) {
    return fail(handle.status(), handle.status().code() == absl::StatusCode::kInvalidArgument);
  }

  // Sparse changes: what each destination tile must hold, advanced refit by refit.
  std::vector<std::vector<uint8_t>> expected(destinations->size());
  for (int i = 0; i < options.iters; ++i) {
    const uint64_t epoch = static_cast<uint64_t>(i) + 1;
    const bool sparse = sparse_changes && epoch > 1;
    const double fraction =
        options.random_fraction ? RandomChangeFraction(epoch) : options.change_fraction;
    for (const LocalTile& tile : *sources) {
      void* base = buffers.Get(Side::kSource, tile.buffer).data;
      if (sparse) {
        patterns.Change(tile, epoch, fraction, base);
      } else {
        patterns.Fill(tile, epoch, base);
      }
    }
    if (sparse_changes) {
      for (size_t d = 0; d < destinations->size(); ++d) {
        patterns.AdvanceChanged((*destinations)[d], epoch, fraction, &expected[d]);
      }
    }
    // Delta refits build on what the destinations hold: poisoned only before the first one.
    if (!options.delta || i == 0) {
      buffers.PoisonDestinations();
      if (absl::Status st = cuda ? buffers.PoisonDeviceDestinations() : absl::OkStatus();
          !st.ok()) {
        return fail(st, false);
      }
    }
    if (absl::Status st = cuda ? buffers.SourcesToDevice() : absl::OkStatus(); !st.ok()) {
      return fail(st, false);
    }
    // Measurement barrier (not part of a refit): without it a source starts its clock while
    // destinations still verify the previous refit. It keeps the handle progressing, so a peer
    // lost meanwhile fails this rank at once.
    if (absl::Status st = handle->Barrier(absl::Now() + options.timeout); !st.ok()) {
      return fail(st, false);
    }
    if (options.fail_every > 0 && epoch > 1 && epoch % options.fail_every == 0) {
      // A refit failed on purpose: the last rank gives up at once, the others learn it from its
      // abort (or finish first). Every rank resets, whatever its outcome; the next refit is full.
      const bool quitter = me == comm.world_size() - 1;
      absl::Status st = handle->Start();
      if (st.ok()) st = handle->Wait(quitter ? absl::InfinitePast() : absl::Now() + options.timeout);
      report.failed_on_purpose += st.ok() ? 0 : 1;
      handle->Reset();
      continue;
    }
    const absl::Time start = absl::Now();
    absl::Status status = handle->Execute(start + options.timeout);
    const absl::Time end = absl::Now();
    if (!status.ok()) return fail(status, false);
    report.iter_ms.push_back(absl::ToDoubleMilliseconds(end - start));
    const Stats& s = handle->stats();
    report.bytes_network_sent = s.bytes_network_sent;
    report.bytes_network_received = s.bytes_network_received;
    report.pieces_received = s.pieces_received;
    report.puts = s.puts;
    report.data_messages = s.data_messages;
    report.single_copy_writes = s.single_copy_writes;
    report.mapped_copies = s.mapped_copies;
    const bool layer = s.fanout != "none" && s.fanout != "engine";
    report.fanout_backend = layer ? s.fanout : "";
    report.bytes_fanout_sent = s.bytes_fanout_sent;
    report.fanout_busy_ms = s.fanout_busy_seconds * 1e3;
    report.quantize_ms = s.quantize_seconds * 1e3;
    report.amax_exchange_ms = s.amax_exchange_seconds * 1e3;
    report.quantize_buffer_bytes = s.quantize_buffer_bytes;
    report.landing_area_bytes = s.landing_area_bytes;
    report.send_scratch_bytes = s.send_scratch_bytes;
    report.delta_relay_early_segments = s.delta_relay_early_segments;
    report.relay_early_bytes = s.relay_early_bytes;
    report.fanout_hidden_fraction = s.fanout_hidden_fraction;
    report.fanout_domain_hidden_fraction = s.fanout_domain_hidden_fraction;
    report.delta_pieces = s.delta_pieces;
    report.delta_full_pieces =
        s.delta_full_no_base + s.delta_full_receiver_version + s.delta_full_not_smaller;
    report.delta_stream_bytes = s.delta_stream_bytes;
    report.delta_plain_bytes = s.delta_plain_bytes;
    report.delta_shadow_bytes = s.delta_shadow_bytes;
    report.cuda_buffers_registered = s.cuda_buffers_registered;
    report.cuda_buffers_staged = s.cuda_buffers_staged;
    report.bytes_staged_to_host = s.bytes_staged_to_host;
    report.bytes_staged_to_device = s.bytes_staged_to_device;
    report.stage_ring_bytes = s.stage_ring_bytes;
    report.stage_copy_bytes = s.stage_copy_bytes;
    report.stage_landing_bytes = s.stage_landing_bytes;
    if (i == 0) {
      report.registrations_first = s.registrations_total;
      report.transports = s.transports;
    }
    report.registrations_after_first = s.registrations_total - report.registrations_first;
    // Second measurement barrier: a destination that finished early would otherwise verify
    // its tiles (CPU-bound) while sources still copy into the others, and on machines with
    // fewer cores than ranks that slows the refit being timed (measured: 2 -> 2 ranks of 128 MiB
    // on 2 cores, one destination done in 20 ms verified while the sources filled the other).
    if (absl::Status st = handle->Barrier(absl::Now() + options.timeout); !st.ok()) {
      return fail(st, false);
    }
    if (absl::Status st = cuda ? buffers.DestinationsToHost() : absl::OkStatus(); !st.ok()) {
      return fail(st, false);
    }
    for (size_t d = 0; d < destinations->size(); ++d) {
      const LocalTile& tile = (*destinations)[d];
      const void* base = buffers.Get(Side::kDestination, tile.buffer).data;
      status = sparse_changes ? patterns.VerifyChangedLow(tile, epoch, expected[d], me, base)
                              : patterns.Verify(tile, epoch, me, base);
      if (!status.ok()) {
        return fail(absl::DataLossError(absl::StrCat("refit ", epoch, ": ", status.message())),
                    false);
      }
    }
  }
  report.ok = true;
  return report;
}

double RandomChangeFraction(uint64_t epoch) {
  if (epoch % 10 == 0) return 0;
  if (epoch % 10 == 1) return 1;
  uint64_t h = (epoch + 1) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

std::string RankReportJson(const RankReport& r) {
  std::vector<std::string> ms;
  for (double v : r.iter_ms) ms.push_back(absl::StrFormat("%.3f", v));
  return absl::StrCat(
      "{\"rank\":", r.rank, ",\"ok\":", r.ok ? "true" : "false",
      ",\"failed_on_purpose\":", r.failed_on_purpose, ",\"iter_ms\":[", absl::StrJoin(ms, ","),
      "],\"bytes_network_sent\":", r.bytes_network_sent,
      ",\"bytes_network_received\":", r.bytes_network_received,
      ",\"pieces_received\":", r.pieces_received, ",\"puts\":", r.puts,
      ",\"data_messages\":", r.data_messages, ",\"single_copy_writes\":", r.single_copy_writes,
      ",\"mapped_copies\":", r.mapped_copies, ",\"registrations_first\":", r.registrations_first,
      ",\"registrations_after_first\":", r.registrations_after_first,
      ",\"transports\":", JsonQuote(r.transports), ",\"fanout\":", JsonQuote(r.fanout_backend),
      ",\"bytes_fanout_sent\":", r.bytes_fanout_sent,
      ",\"fanout_busy_ms\":", absl::StrFormat("%.3f", r.fanout_busy_ms),
      ",\"fanout_hidden_fraction\":", absl::StrFormat("%.3f", r.fanout_hidden_fraction),
      ",\"fanout_domain_hidden_fraction\":",
      absl::StrFormat("%.3f", r.fanout_domain_hidden_fraction),
      ",\"quantize_ms\":", absl::StrFormat("%.3f", r.quantize_ms),
      ",\"amax_exchange_ms\":", absl::StrFormat("%.3f", r.amax_exchange_ms),
      ",\"quantize_buffer_bytes\":", r.quantize_buffer_bytes, ",\"delta_pieces\":", r.delta_pieces,
      ",\"delta_full_pieces\":", r.delta_full_pieces,
      ",\"delta_stream_bytes\":", r.delta_stream_bytes,
      ",\"delta_plain_bytes\":", r.delta_plain_bytes,
      ",\"delta_shadow_bytes\":", r.delta_shadow_bytes,
      ",\"delta_relay_early_segments\":", r.delta_relay_early_segments,
      ",\"relay_early_bytes\":", r.relay_early_bytes,
      ",\"landing_area_bytes\":", r.landing_area_bytes,
      ",\"send_scratch_bytes\":", r.send_scratch_bytes, ",\"memory\":", JsonQuote(r.memory),
      ",\"gpu\":", JsonQuote(r.gpu), ",\"destination_bytes\":", r.destination_bytes,
      ",\"cuda_buffers_registered\":", r.cuda_buffers_registered,
      ",\"cuda_buffers_staged\":", r.cuda_buffers_staged,
      ",\"bytes_staged_to_host\":", r.bytes_staged_to_host,
      ",\"bytes_staged_to_device\":", r.bytes_staged_to_device,
      ",\"stage_ring_bytes\":", r.stage_ring_bytes, ",\"stage_copy_bytes\":", r.stage_copy_bytes,
      ",\"stage_landing_bytes\":", r.stage_landing_bytes, ",\"error\":", JsonQuote(r.error), "}");
}

}  // namespace reshard::cli
