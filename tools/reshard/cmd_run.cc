// `reshard run SPEC.json [--iters N] [--transport sm|tcp] [--netns] [--emulate-nic RATE]
//  [--plan-mode ours|naive|gather_broadcast] [--fanout auto|engine] [--timeout-ms MS]
//  [--deadline-s S] [--delta] [--change-fraction F] [--memory host|cuda] [--json]`
//
// Launches one `reshard-rank` per rank of the spec's world through the launcher, then merges
// the one JSON line each rank prints into a report.
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "reshard/system.h"
#include "src/common/json.h"
#include "src/plan/spec_json.h"
#include "tools/launcher/launcher.h"
#include "tools/reshard/args.h"
#include "tools/reshard/commands.h"
#include "tools/reshard/device_memory.h"
#include "tools/reshard/report.h"

namespace reshard::cli {
namespace {

constexpr char kHelp[] = R"(usage: reshard run SPEC.json [options]

Runs real refits between processes on this machine: one `reshard-rank` process per rank of the
spec's world (found next to `reshard`). Every rank allocates its buffers, fills its sources with
a strong hash that changes every iteration, runs N refits on one persistent handle over UCX and
verifies every destination byte after each. Prints per-iteration refit times (the slowest rank
of each iteration), bytes per refit, memory registrations and the UCX transports selected.

options:
  --iters N            refits to run on one handle (default 3)
  --transport sm|tcp   loopback processes over shared memory (UCX_TLS=sm,self, the default) or
                       tcp over lo (UCX_TLS=tcp, UCX_NET_DEVICES=lo)
  --netns              every rank in its own network namespace with its own veth (emulated
                       hosts; needs root, else falls back to loopback tcp and says so); tcp
  --emulate-nic RATE   like --netns, and each rank's veth is shaped to RATE in both directions
                       (tc notation: 200mbit, 1gbit); the report adds the emulated lower bound
                       (max per-rank network bytes in or out / RATE) and the ratio to it
  --mtu BYTES          with --netns or --emulate-nic: the MTU of every veth (default 9000,
                       jumbo frames, as the RDMA NICs the emulation stands for: TCP/IP headers
                       in 1500-byte frames take 4.5% of the shaped rate, in 9000-byte 0.7%)
  --plan-mode MODE     ours (domain-aware schedule, default), naive (point to point), or
                       gather_broadcast (a simulated baseline only: see `reshard sim`)
  --fanout auto|engine auto (default): copies inside a domain (kFanout) go through the host
                       fan-out backend (shared memory between the domain's processes,
                       overlapped with the network stage); engine: the UCX engine puts them
                       over the network like any other transfer
  --delta              delta refits (docs/delta.md): sources send only the elements that
                       changed since the last refit; destinations keep their values between
                       refits (poisoned before the first only); the report adds the bytes sent
                       against the plain pieces' bytes (what a full refit sends)
  --change-fraction F  each refit after the first changes a random fraction F (0..1) of every
                       source tensor's elements by 1-15 ulp (scattered), instead of all of
                       them; destinations are verified against exactly those values.
                       `random`: a fraction drawn per refit (0 every 10th, 1 the one after)
  --memory host|cuda   where every rank's buffers live: host memory (default), or device
                       memory on GPU (local rank mod GPUs), allocated with the CUDA runtime as a
                       framework would (the library must be built with CUDA; the runtime is
                       opened with dlopen). Sources are filled on the host and
                       copied to the device before each refit, destinations copied back and
                       verified after it, outside the timed refit. When the UCX build registers
                       CUDA memory, UCX_TLS adds cuda_copy,cuda_ipc (sm) or cuda_copy (tcp);
                       otherwise the handle stages device buffers through pinned host memory.
                       The report adds how many CUDA buffers were registered and how many
                       staged, the staging copies, and a device-to-device cudaMemcpy of the
                       bytes the refit writes with the median refit's ratio to it
                       (docs/running.md; tools/gpu_check.sh runs it on a GPU)
  --fail-every K       every K-th refit (K >= 2) the last rank gives up at once; every rank
                       then calls Reset() and the run goes on (the next refit is full, the
                       failed ones are neither timed nor verified)
  --timeout-ms MS      deadline for every wait inside a rank (RESHARD_TIMEOUT_MS, default 30000)
  --deadline-s S       the whole launch is killed after S seconds (default 600)
  --json               one JSON object: ok, iters, world_size, mode, transport, ucx_tls,
                       iter_ms (per iteration, slowest rank), first_ms, median_ms (median of
                       iterations 2..N, or the first when N = 1), p90_ms (their nearest-rank
                       90th percentile), median_landing_ms and p90_landing_ms (the same
                       over receiving ranks only: from granting the epoch to the last piece
                       landing; source clocks also count waiting for destinations that are
                       still verifying the previous refit), bytes_network (per refit, all
                       ranks), max_rank_network_bytes, registrations_first,
                       registrations_after_first, transports, fanout, bytes_fanout (per
                       refit), fanout_busy_ms (fan-out copy time summed over ranks) and
                       fanout_hidden_fraction (the part of it inside each rank's network
                       stage: before its last network landing), fanout_domain_hidden_fraction
                       (the same against the domain's network stage), and with --emulate-nic rate, mtu,
                       lower_bound_ms and ratio; memory; with --memory cuda gpus,
                       destination_bytes, cuda_buffers_registered, cuda_buffers_staged,
                       bytes_staged_to_host, bytes_staged_to_device (last refit, all ranks),
                       stage_ring_bytes, stage_copy_bytes and stage_landing_bytes (all
                       ranks), device_copy_ms and
                       ratio_device_copy (0 and device_copy_error when the copy failed);
                       errors lists every failed rank
  --help               this text

exit status: 0 every refit on every rank verified, 1 a refit or a rank failed, 2 invalid spec or
usage (also when a rank reports invalid input), 3 --memory cuda without a usable CUDA device,
130 interrupted. (A library built without CUDA refuses device buffers: each rank fails naming
its buffer, exit 1.)
)";

// --memory cuda figures of one rank, or summed over ranks: destination bytes (what a refit
// writes), CUDA buffers registered with UCX and staged, the last refit's staging copies, the
// staging ring's pinned bytes, the pinned host copies of staged buffers and the landing
// rounds' pinned areas.
struct CudaFigures {
  int64_t destination_bytes = 0, registered = 0, staged = 0, to_host = 0, to_device = 0,
          ring_bytes = 0, copy_bytes = 0, landing_bytes = 0;
  void Add(const CudaFigures& o) {
    destination_bytes += o.destination_bytes;
    registered += o.registered;
    staged += o.staged;
    to_host += o.to_host;
    to_device += o.to_device;
    ring_bytes += o.ring_bytes;
    copy_bytes += o.copy_bytes;
    landing_bytes += o.landing_bytes;
  }
};

struct RankLine {
  bool parsed = false;
  bool ok = false;
  int64_t failed_on_purpose = 0;
  std::vector<double> iter_ms;
  int64_t sent = 0, received = 0, pieces = 0, reg_first = 0, reg_after = 0;
  std::string transports, error;
  std::string fanout;
  int64_t fanout_sent = 0;
  double fanout_busy_ms = 0, fanout_hidden = 1, fanout_domain_hidden = 1;
  double quantize_ms = 0, amax_exchange_ms = 0;
  int64_t quantize_buffer_bytes = 0;
  int64_t delta_pieces = 0, delta_full_pieces = 0, delta_stream_bytes = 0, delta_plain_bytes = 0,
          delta_shadow_bytes = 0;
  int64_t landing_area_bytes = 0, send_scratch_bytes = 0, delta_relay_early_segments = 0;
  int64_t relay_early_bytes = 0;
  std::string memory, gpu;
  CudaFigures cuda;
};

RankLine ParseRankLine(const std::string& line) {
  RankLine r;
  auto v = json::Parse(line);
  if (!v.ok() || !v->is_object()) return r;
  auto num = [&](const char* key) -> int64_t {
    const json::Value* f = v->Find(key);
    return f && f->is_number() ? static_cast<int64_t>(f->as_double()) : 0;
  };
  auto str = [&](const char* key) -> std::string {
    const json::Value* f = v->Find(key);
    return f && f->is_string() ? f->as_string() : "";
  };
  const json::Value* ok = v->Find("ok");
  r.ok = ok && ok->is_bool() && ok->as_bool();
  if (const json::Value* ms = v->Find("iter_ms"); ms && ms->is_array()) {
    for (const auto& x : ms->items()) r.iter_ms.push_back(x.as_double());
  }
  r.failed_on_purpose = num("failed_on_purpose");
  r.sent = num("bytes_network_sent");
  r.received = num("bytes_network_received");
  r.pieces = num("pieces_received");
  r.reg_first = num("registrations_first");
  r.reg_after = num("registrations_after_first");
  r.transports = str("transports");
  r.fanout = str("fanout");
  r.fanout_sent = num("bytes_fanout_sent");
  r.delta_pieces = num("delta_pieces");
  r.delta_full_pieces = num("delta_full_pieces");
  r.delta_stream_bytes = num("delta_stream_bytes");
  r.delta_plain_bytes = num("delta_plain_bytes");
  r.delta_shadow_bytes = num("delta_shadow_bytes");
  r.landing_area_bytes = num("landing_area_bytes");
  r.send_scratch_bytes = num("send_scratch_bytes");
  r.delta_relay_early_segments = num("delta_relay_early_segments");
  r.relay_early_bytes = num("relay_early_bytes");
  if (const json::Value* f = v->Find("fanout_busy_ms"); f && f->is_number()) {
    r.fanout_busy_ms = f->as_double();
  }
  if (const json::Value* f = v->Find("fanout_hidden_fraction"); f && f->is_number()) {
    r.fanout_hidden = f->as_double();
  }
  if (const json::Value* f = v->Find("fanout_domain_hidden_fraction"); f && f->is_number()) {
    r.fanout_domain_hidden = f->as_double();
  }
  if (const json::Value* f = v->Find("quantize_ms"); f && f->is_number()) {
    r.quantize_ms = f->as_double();
  }
  if (const json::Value* f = v->Find("amax_exchange_ms"); f && f->is_number()) {
    r.amax_exchange_ms = f->as_double();
  }
  r.quantize_buffer_bytes = num("quantize_buffer_bytes");
  r.memory = str("memory");
  r.gpu = str("gpu");
  r.cuda = CudaFigures{num("destination_bytes"),      num("cuda_buffers_registered"),
                       num("cuda_buffers_staged"),    num("bytes_staged_to_host"),
                       num("bytes_staged_to_device"), num("stage_ring_bytes"),
                       num("stage_copy_bytes"),       num("stage_landing_bytes")};
  r.error = str("error");
  r.parsed = true;
  return r;
}

std::string RankBinary() {
  if (const char* over = std::getenv("RESHARD_RANK_BINARY"); over && *over) return over;
  char self[PATH_MAX] = {0};
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(".");
  dir = dir.substr(0, dir.rfind('/'));
  return dir + "/reshard-rank";
}

std::string Ms(double ms) { return absl::StrFormat("%.2f", ms); }

}  // namespace

int RunCommand(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("%s", kHelp);
      return kExitOk;
    }
  }
  absl::StatusOr<Args> args =
      Args::Parse(argc, argv, {"json", "netns", "delta"},
                  {"iters", "transport", "emulate-nic", "plan-mode", "fanout", "timeout-ms",
                   "deadline-s", "change-fraction", "mtu", "fail-every", "memory"});
  if (!args.ok()) return UsageError("run", std::string(args.status().message()));
  if (args->positional().size() != 1) return UsageError("run", "expected one SPEC.json");
  const std::string spec_path = args->positional()[0];
  absl::StatusOr<int64_t> iters = args->GetInt("iters", 3);
  if (!iters.ok()) return UsageError("run", std::string(iters.status().message()));
  if (*iters < 1 || *iters > 1000000) return UsageError("run", "--iters must be 1..1000000");
  absl::StatusOr<int64_t> timeout_ms = args->GetInt("timeout-ms", 30000);
  if (!timeout_ms.ok() || *timeout_ms <= 0) {
    return UsageError("run", "--timeout-ms must be a positive number of milliseconds");
  }
  absl::StatusOr<double> deadline_s = args->GetDouble("deadline-s", 600);
  if (!deadline_s.ok() || !(*deadline_s > 0)) {
    return UsageError("run", "--deadline-s must be a positive number of seconds");
  }
  const bool random_fraction = args->Get("change-fraction").value_or("") == "random";
  absl::StatusOr<double> change_fraction =
      random_fraction ? absl::StatusOr<double>(-1) : args->GetDouble("change-fraction", -1);
  if (!change_fraction.ok() || (args->Get("change-fraction") && !random_fraction &&
                                !(*change_fraction >= 0 && *change_fraction <= 1))) {
    return UsageError("run", "--change-fraction must be a number between 0 and 1, or random");
  }
  absl::StatusOr<int64_t> fail_every = args->GetInt("fail-every", 0);
  if (!fail_every.ok() || *fail_every < 0 || *fail_every == 1 || *fail_every > 1000000) {
    return UsageError("run", "--fail-every must be 0 (never) or 2..1000000");
  }
  const bool delta = args->Has("delta");
  const std::string plan_mode = args->Get("plan-mode").value_or("ours");
  if (plan_mode != "ours" && plan_mode != "naive" && plan_mode != "gather_broadcast") {
    return UsageError("run", absl::StrCat("--plan-mode must be ours, naive or gather_broadcast, "
                                          "not \"", plan_mode, "\""));
  }
  const std::string fanout_mode = args->Get("fanout").value_or("auto");
  if (fanout_mode != "auto" && fanout_mode != "engine") {
    return UsageError("run", absl::StrCat("--fanout must be auto or engine, not \"", fanout_mode,
                                          "\""));
  }
  const std::string memory = args->Get("memory").value_or("host");
  if (memory != "host" && memory != "cuda") {
    return UsageError("run", absl::StrCat("--memory must be host or cuda, not \"", memory, "\""));
  }
  const bool cuda = memory == "cuda";
  const std::string rate = args->Get("emulate-nic").value_or("");
  double rate_bits = 0;
  if (!rate.empty()) {
    absl::StatusOr<double> bits = launcher::ParseTcRate(rate);
    if (!bits.ok()) return UsageError("run", std::string(bits.status().message()));
    rate_bits = *bits;
  }
  const bool netns = args->Has("netns") || !rate.empty();
  absl::StatusOr<int64_t> mtu = args->GetInt("mtu", launcher::kDefaultNetnsMtu);
  if (!mtu.ok() || *mtu < 1280 || *mtu > 65535) {
    return UsageError("run", "--mtu must be a number of bytes between 1280 and 65535");
  }
  if (args->Get("mtu") && !netns) {
    return UsageError("run", "--mtu needs --netns or --emulate-nic (loopback has its own MTU)");
  }
  std::string transport = args->Get("transport").value_or(netns ? "tcp" : "sm");
  if (transport != "sm" && transport != "tcp") {
    return UsageError("run", absl::StrCat("--transport must be sm or tcp, not \"", transport,
                                          "\""));
  }
  if (netns && transport != "tcp") {
    return UsageError("run", "ranks in separate network namespaces can only use --transport tcp");
  }

  absl::StatusOr<plan::RefitSpec> spec = plan::LoadSpecFile(spec_path);
  if (!spec.ok()) {
    std::fprintf(stderr, "reshard run: %s\n", std::string(spec.status().message()).c_str());
    return kExitUsage;
  }
  const int world = spec->WorldSize();
  // --memory cuda: a device to put the buffers on, and the transports that carry them.
  bool ucx_registers_cuda = false;
  if (cuda) {
    std::string why;
    if (gpu::Devices(&why) == 0) {
      std::fprintf(stderr, "reshard run: --memory cuda needs a usable CUDA device: %s\n",
                   why.c_str());
      return kExitNoDevice;
    }
    ucx_registers_cuda = ProbeSystem().ucx.registers_cuda_memory;
  }
  const std::string rank_binary = RankBinary();
  if (access(rank_binary.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "reshard run: the rank program %s is missing (build the reshard_rank "
                 "target, or set RESHARD_RANK_BINARY)\n", rank_binary.c_str());
    return kExitFailed;
  }
  char cwd[PATH_MAX] = {0};
  std::string spec_abs = spec_path;
  if (!spec_path.empty() && spec_path[0] != '/' && getcwd(cwd, sizeof(cwd))) {
    spec_abs = absl::StrCat(cwd, "/", spec_path);
  }

  launcher::LaunchOptions options;
  options.argv = {rank_binary, spec_abs, "--iters", absl::StrCat(*iters), "--plan-mode",
                  plan_mode, "--fanout", fanout_mode};
  if (delta) options.argv.push_back("--delta");
  if (*change_fraction >= 0 || random_fraction) {
    options.argv.push_back("--change-fraction");
    options.argv.push_back(random_fraction ? "random" : absl::StrCat(*change_fraction));
  }
  if (*fail_every > 0) {
    options.argv.push_back("--fail-every");
    options.argv.push_back(absl::StrCat(*fail_every));
  }
  if (cuda) {
    options.argv.push_back("--memory");
    options.argv.push_back("cuda");
  }
  options.world_size = world;
  options.mode = netns ? launcher::Mode::kNetns : launcher::Mode::kLoopback;
  options.transport = transport;
  options.rate = rate;
  options.mtu = static_cast<int>(*mtu);
  options.rank_timeout_ms = *timeout_ms;
  options.deadline = absl::Seconds(*deadline_s);
  options.failure_grace = absl::Milliseconds(*timeout_ms) + absl::Seconds(5);
  options.handle_signals = true;
  if (!rate.empty()) options.extra_env.push_back({"RESHARD_EMULATED_NIC_RATE", rate});
  if (ucx_registers_cuda) {
    // UCX moves registered device memory through its CUDA transports only when UCX_TLS names
    // them: cuda_copy (device <-> host inside UCX), cuda_ipc (between processes on one host).
    options.extra_env.push_back(
        {"UCX_TLS", transport == "sm" && !netns ? "sm,self,cuda_copy,cuda_ipc" : "tcp,cuda_copy"});
  }
  absl::StatusOr<launcher::LaunchResult> launched = launcher::Run(options);
  if (!launched.ok()) {
    std::fprintf(stderr, "reshard run: cannot launch the ranks: %s\n",
                 std::string(launched.status().message()).c_str());
    return absl::IsInvalidArgument(launched.status()) ? kExitUsage : kExitFailed;
  }
  const launcher::LaunchResult& result = *launched;

  // Merge the ranks' reports.
  std::vector<RankLine> lines(static_cast<size_t>(world));
  std::vector<std::string> errors;
  bool invalid_input = false;
  for (const launcher::RankResult& r : result.ranks) {
    RankLine& line = lines[static_cast<size_t>(r.rank)];
    if (!r.json_line.empty()) line = ParseRankLine(r.json_line);
    if (r.exited && r.exit_code == kExitUsage) invalid_input = true;
    if (!line.parsed) {
      errors.push_back(absl::StrCat("rank ", r.rank, " printed no report (", r.Describe(), ")"));
    } else if (!line.ok || !r.ok()) {
      errors.push_back(absl::StrCat("rank ", r.rank, " (", r.Describe(), "): ",
                                    line.error.empty() ? "failed without a message" : line.error));
    }
  }
  if (result.deadline_exceeded) {
    errors.push_back(absl::StrCat("the launch ran past --deadline-s ", *deadline_s));
  }
  const bool ok = result.ok() && errors.empty();

  // Refit time of iteration i: the slowest rank's.
  // --fail-every: refits failed on purpose (every rank knows which), and how many ranks failed
  // them (the quitter always; the others when its abort reached them before they finished).
  int64_t failed_refits = 0, rank_failures = 0;
  for (int64_t e = 2; *fail_every > 0 && e <= *iters; ++e) failed_refits += e % *fail_every == 0;
  for (const RankLine& l : lines) rank_failures += l.failed_on_purpose;
  size_t completed = static_cast<size_t>(*iters);
  for (const RankLine& l : lines) completed = std::min(completed, l.iter_ms.size());
  std::vector<double> refit_ms(completed, 0.0), fastest_ms(completed, 1e300);
  std::vector<int> slowest_rank(completed, 0);
  for (size_t i = 0; i < completed; ++i) {
    for (int r = 0; r < world; ++r) {
      double v = lines[static_cast<size_t>(r)].iter_ms[i];
      if (v > refit_ms[i]) {
        refit_ms[i] = v;
        slowest_rank[i] = r;
      }
      fastest_ms[i] = std::min(fastest_ms[i], v);
    }
  }
  // The destinations' view: each receiving rank's clock runs from granting the epoch to the
  // last piece landing. Source ranks' clocks also include waiting for destinations that are
  // still verifying the previous iteration, so the slowest-rank time overstates a refit by that
  // skew; the landing time does not.
  std::vector<double> landing_ms(completed, 0.0);
  for (size_t i = 0; i < completed; ++i) {
    for (int r = 0; r < world; ++r) {
      const RankLine& l = lines[static_cast<size_t>(r)];
      if (l.pieces > 0) landing_ms[i] = std::max(landing_ms[i], l.iter_ms[i]);
    }
  }
  // Statistics over iterations 2..N (the first includes lazy connection set-up), or over the
  // first alone when N = 1.
  auto steady = [completed](const std::vector<double>& v) {
    return completed > 1 ? std::vector<double>(v.begin() + 1, v.end()) : v;
  };
  const double median_landing_ms = Median(steady(landing_ms));
  const double p90_landing_ms = NearestRankPercentile(steady(landing_ms), 90);
  const double first_ms = completed > 0 ? refit_ms[0] : 0;
  const double median_ms = Median(steady(refit_ms));
  const double p90_ms = NearestRankPercentile(steady(refit_ms), 90);
  int64_t bytes_network = 0, max_rank_bytes = 0, reg_first = 0, reg_after = 0, pieces = 0;
  int max_rank = 0;
  int64_t bytes_fanout = 0;
  std::string fanout_backend = fanout_mode == "engine" ? "engine" : "none";
  double fanout_busy_ms = 0, fanout_hidden_ms = 0, fanout_domain_hidden_ms = 0;  // All ranks.
  // Quantized destinations, last refit: the slowest rank's quantizing and exchange, all ranks'
  // buffers.
  double quantize_ms = 0, amax_exchange_ms = 0;
  int64_t quantize_buffer_bytes = 0;
  int64_t delta_pieces = 0, delta_full_pieces = 0, delta_stream_bytes = 0, delta_plain_bytes = 0,
          delta_shadow_bytes = 0, delta_relay_early_segments = 0;  // All ranks, the last refit.
  // Host memory held for streams: all ranks' landing areas and send scratch, the largest rank.
  int64_t landing_area_bytes = 0, send_scratch_bytes = 0, max_stream_memory = 0;
  int max_stream_memory_rank = 0;
  int64_t relay_early_bytes = 0;  // All ranks, the last refit.
  std::map<std::string, std::vector<int>> transports;
  // --memory cuda: all ranks' CUDA buffers and last-refit staging copies, the GPUs they used.
  CudaFigures cuda_all;
  std::set<std::string> gpus;
  for (int r = 0; r < world; ++r) {
    const RankLine& l = lines[static_cast<size_t>(r)];
    cuda_all.Add(l.cuda);
    if (!l.gpu.empty()) gpus.insert(l.gpu);
    bytes_network += l.sent;
    int64_t rank_bytes = std::max(l.sent, l.received);
    if (rank_bytes > max_rank_bytes) {
      max_rank_bytes = rank_bytes;
      max_rank = r;
    }
    reg_first += l.reg_first;
    reg_after += l.reg_after;
    pieces += l.pieces;
    if (l.parsed) transports[l.transports.empty() ? "(none)" : l.transports].push_back(r);
    bytes_fanout += l.fanout_sent;
    delta_pieces += l.delta_pieces;
    delta_full_pieces += l.delta_full_pieces;
    delta_stream_bytes += l.delta_stream_bytes;
    delta_plain_bytes += l.delta_plain_bytes;
    delta_shadow_bytes += l.delta_shadow_bytes;
    delta_relay_early_segments += l.delta_relay_early_segments;
    relay_early_bytes += l.relay_early_bytes;
    landing_area_bytes += l.landing_area_bytes;
    send_scratch_bytes += l.send_scratch_bytes;
    if (l.landing_area_bytes + l.send_scratch_bytes > max_stream_memory) {
      max_stream_memory = l.landing_area_bytes + l.send_scratch_bytes;
      max_stream_memory_rank = r;
    }
    if (!l.fanout.empty()) fanout_backend = l.fanout;
    fanout_busy_ms += l.fanout_busy_ms;
    fanout_hidden_ms += l.fanout_busy_ms * l.fanout_hidden;
    fanout_domain_hidden_ms += l.fanout_busy_ms * l.fanout_domain_hidden;
    quantize_ms = std::max(quantize_ms, l.quantize_ms);
    amax_exchange_ms = std::max(amax_exchange_ms, l.amax_exchange_ms);
    quantize_buffer_bytes += l.quantize_buffer_bytes;
  }
  const double fanout_hidden = fanout_busy_ms > 0 ? fanout_hidden_ms / fanout_busy_ms : 1.0;
  const double fanout_domain_hidden =
      fanout_busy_ms > 0 ? fanout_domain_hidden_ms / fanout_busy_ms : 1.0;
  std::string transports_text;
  if (transports.size() == 1) {
    transports_text = transports.begin()->first;
  } else {
    std::vector<std::string> parts;
    for (const auto& [t, ranks] : transports) {
      parts.push_back(absl::StrCat("ranks ", absl::StrJoin(ranks, ","), ": ", t));
    }
    transports_text = absl::StrJoin(parts, "; ");
  }
  const double lower_bound_ms = rate_bits > 0 ? max_rank_bytes * 8.0 / rate_bits * 1e3 : 0;
  const double ratio = lower_bound_ms > 0 && completed > 0 ? median_ms / lower_bound_ms : 0;
  const double ratio_landing =
      lower_bound_ms > 0 && completed > 0 ? median_landing_ms / lower_bound_ms : 0;
  const char* mode_name = result.mode == launcher::Mode::kNetns ? "netns" : "loopback";
  // The GPU reference: a device-to-device cudaMemcpy of the bytes one refit writes, on the
  // first rank's GPU, timed once the ranks are gone (a quiet device).
  double device_copy_ms = 0;
  std::string device_copy_error;
  if (cuda && completed > 0 && cuda_all.destination_bytes > 0) {
    absl::Status st = gpu::SelectForLocalRank(0);
    absl::StatusOr<double> copy_ms =
        st.ok() ? gpu::CopyMs(cuda_all.destination_bytes, 10) : absl::StatusOr<double>(st);
    if (copy_ms.ok()) {
      device_copy_ms = *copy_ms;
    } else {
      device_copy_error = std::string(copy_ms.status().message());
    }
  }
  const double ratio_device_copy = device_copy_ms > 0 ? median_ms / device_copy_ms : 0;

  if (args->Has("json")) {
    using json::Quote;
    std::vector<std::string> ms, quoted_errors;
    for (double v : refit_ms) ms.push_back(Ms(v));
    for (const auto& e : errors) quoted_errors.push_back(Quote(e));
    std::string out = absl::StrCat(
        "{\"ok\":", ok ? "true" : "false", ",\"iters\":", *iters,
        ",\"completed_iters\":", completed, ",\"failed_on_purpose\":", failed_refits,
        ",\"rank_failures_on_purpose\":", rank_failures, ",\"world_size\":", world,
        ",\"mode\":", Quote(mode_name),
        ",\"transport\":", Quote(result.mode == launcher::Mode::kNetns ? "tcp" : transport),
        ",\"ucx_tls\":", Quote(result.ucx_tls), ",\"plan_mode\":", Quote(plan_mode),
        ",\"iter_ms\":[", absl::StrJoin(ms, ","), "],\"first_ms\":", Ms(first_ms),
        ",\"median_ms\":", Ms(median_ms), ",\"p90_ms\":", Ms(p90_ms),
        ",\"median_landing_ms\":", Ms(median_landing_ms),
        ",\"p90_landing_ms\":", Ms(p90_landing_ms), ",\"bytes_network\":", bytes_network,
        ",\"max_rank_network_bytes\":", max_rank_bytes, ",\"pieces_received\":", pieces,
        ",\"registrations_first\":", reg_first, ",\"registrations_after_first\":", reg_after,
        ",\"transports\":", Quote(transports_text), ",\"fanout\":", Quote(fanout_backend),
        ",\"bytes_fanout\":", bytes_fanout, ",\"fanout_busy_ms\":", Ms(fanout_busy_ms),
        ",\"fanout_hidden_fraction\":", absl::StrFormat("%.3f", fanout_hidden),
        ",\"fanout_domain_hidden_fraction\":", absl::StrFormat("%.3f", fanout_domain_hidden),
        ",\"quantize_ms\":", Ms(quantize_ms), ",\"amax_exchange_ms\":", Ms(amax_exchange_ms),
        ",\"quantize_buffer_bytes\":", quantize_buffer_bytes,
        ",\"landing_area_bytes\":", landing_area_bytes,
        ",\"send_scratch_bytes\":", send_scratch_bytes,
        ",\"max_rank_stream_memory_bytes\":", max_stream_memory,
        ",\"relay_early_bytes\":", relay_early_bytes);
    if (delta || *change_fraction >= 0 || random_fraction) {
      absl::StrAppend(&out, ",\"delta\":", delta ? "true" : "false", ",\"change_fraction\":",
                      random_fraction         ? std::string("\"random\"")
                      : *change_fraction >= 0 ? absl::StrCat(*change_fraction)
                                              : std::string("null"),
                      ",\"delta_pieces\":", delta_pieces,
                      ",\"delta_full_pieces\":", delta_full_pieces,
                      ",\"delta_stream_bytes\":", delta_stream_bytes,
                      ",\"delta_plain_bytes\":", delta_plain_bytes,
                      ",\"delta_shadow_bytes\":", delta_shadow_bytes,
                      ",\"delta_relay_early_segments\":", delta_relay_early_segments);
    }
    if (rate_bits > 0) {
      absl::StrAppend(&out, ",\"rate\":", Quote(rate), ",\"mtu\":", *mtu,
                      ",\"lower_bound_ms\":", Ms(lower_bound_ms),
                      ",\"ratio\":", absl::StrFormat("%.3f", ratio),
                      ",\"ratio_landing\":", absl::StrFormat("%.3f", ratio_landing));
    }
    absl::StrAppend(&out, ",\"memory\":", Quote(memory));
    if (cuda) {
      std::vector<std::string> quoted_gpus;
      for (const auto& g : gpus) quoted_gpus.push_back(Quote(g));
      absl::StrAppend(&out, ",\"gpus\":[", absl::StrJoin(quoted_gpus, ","),
                      "],\"destination_bytes\":", cuda_all.destination_bytes,
                      ",\"cuda_buffers_registered\":", cuda_all.registered,
                      ",\"cuda_buffers_staged\":", cuda_all.staged,
                      ",\"bytes_staged_to_host\":", cuda_all.to_host,
                      ",\"bytes_staged_to_device\":", cuda_all.to_device,
                      ",\"stage_ring_bytes\":", cuda_all.ring_bytes,
                      ",\"stage_copy_bytes\":", cuda_all.copy_bytes,
                      ",\"stage_landing_bytes\":", cuda_all.landing_bytes,
                      ",\"device_copy_ms\":", Ms(device_copy_ms),
                      ",\"ratio_device_copy\":", absl::StrFormat("%.3f", ratio_device_copy));
      if (!device_copy_error.empty()) {
        absl::StrAppend(&out, ",\"device_copy_error\":", Quote(device_copy_error));
      }
    }
    if (!result.fallback_reason.empty()) {
      absl::StrAppend(&out, ",\"fallback\":", Quote(result.fallback_reason));
    }
    absl::StrAppend(&out, ",\"errors\":[", absl::StrJoin(quoted_errors, ","), "]}");
    std::printf("%s\n", out.c_str());
  } else {
    std::printf("reshard run %s: %d ranks, %s, UCX_TLS=%s, plan %s\n", spec_path.c_str(), world,
                result.mode == launcher::Mode::kNetns
                    ? (rate.empty() ? "one network namespace per rank"
                                    : absl::StrCat("one network namespace per rank, NIC ", rate,
                                                   " each way")
                                          .c_str())
                    : absl::StrCat("loopback processes over ", transport).c_str(),
                result.ucx_tls.c_str(), plan_mode.c_str());
    if (!result.fallback_reason.empty()) {
      std::printf("note: %s\n", result.fallback_reason.c_str());
    }
    Table table({"iter", "refit", "landing", "fastest rank", "slowest rank"});
    for (size_t i = 0; i < completed; ++i) {
      table.AddRow({absl::StrCat(i + 1), FormatSeconds(refit_ms[i] / 1e3),
                    FormatSeconds(landing_ms[i] / 1e3), FormatSeconds(fastest_ms[i] / 1e3),
                    absl::StrCat(slowest_rank[i])});
    }
    std::printf("%s", table.Render().c_str());
    std::printf("refit time      first %s, median %s, p90 %s%s; landing median %s, p90 %s\n",
                FormatSeconds(first_ms / 1e3).c_str(), FormatSeconds(median_ms / 1e3).c_str(),
                FormatSeconds(p90_ms / 1e3).c_str(), completed > 1 ? " (iterations 2..N)" : "",
                FormatSeconds(median_landing_ms / 1e3).c_str(),
                FormatSeconds(p90_landing_ms / 1e3).c_str());
    std::printf("bytes per refit %s over the network (busiest rank %d: %s in or out), "
                "%lld pieces received\n",
                FormatBytes(static_cast<double>(bytes_network)).c_str(), max_rank,
                FormatBytes(static_cast<double>(max_rank_bytes)).c_str(),
                static_cast<long long>(pieces));
    if (relay_early_bytes > 0) {
      std::printf(
          "relays          forwarded %s before the piece they forward had landed (all "
          "ranks, last refit)\n",
          FormatBytes(static_cast<double>(relay_early_bytes)).c_str());
    }
    std::printf("registrations   %lld in the first refit, %lld after it\n",
                static_cast<long long>(reg_first), static_cast<long long>(reg_after));
    std::printf("transports      %s\n", transports_text.c_str());
    if (bytes_fanout > 0) {
      std::printf("fan-out         %s: %s per refit inside domains; of the fan-out copy time "
                  "(%s, all ranks) %.0f%% hid under the domain's network stage, %.0f%% under "
                  "the copying rank's own\n",
                  fanout_backend.c_str(), FormatBytes(static_cast<double>(bytes_fanout)).c_str(),
                  FormatSeconds(fanout_busy_ms / 1e3).c_str(), fanout_domain_hidden * 100,
                  fanout_hidden * 100);
    }
    if (landing_area_bytes + send_scratch_bytes > 0) {
      std::printf(
          "stream memory   %s of landing areas, %s of send scratch (host, all ranks); "
          "rank %d holds the most: %s\n",
          FormatBytes(static_cast<double>(landing_area_bytes)).c_str(),
          FormatBytes(static_cast<double>(send_scratch_bytes)).c_str(), max_stream_memory_rank,
          FormatBytes(static_cast<double>(max_stream_memory)).c_str());
    }
    if (quantize_buffer_bytes > 0) {
      std::printf("quantization    last refit: %s on the slowest rank, amax exchange %s; %s of "
                  "host buffers for it (all ranks)\n",
                  FormatSeconds(quantize_ms / 1e3).c_str(),
                  FormatSeconds(amax_exchange_ms / 1e3).c_str(),
                  FormatBytes(static_cast<double>(quantize_buffer_bytes)).c_str());
    }
    if (delta) {
      std::printf(
          "delta           last refit: %lld piece(s) as deltas, %lld plain; %s sent for "
          "pieces of %s (%.3fx, what a full refit sends); shadows %s%s\n",
          static_cast<long long>(delta_pieces), static_cast<long long>(delta_full_pieces),
          FormatBytes(static_cast<double>(delta_stream_bytes)).c_str(),
          FormatBytes(static_cast<double>(delta_plain_bytes)).c_str(),
          delta_plain_bytes > 0
              ? static_cast<double>(delta_stream_bytes) / static_cast<double>(delta_plain_bytes)
              : 0.0,
          FormatBytes(static_cast<double>(delta_shadow_bytes)).c_str(),
          random_fraction         ? ", change fraction random per refit"
          : *change_fraction >= 0 ? absl::StrCat(", change fraction ", *change_fraction).c_str()
                                  : ", every element changes (--change-fraction not given)");
      if (delta_relay_early_segments > 0) {
        std::printf(
            "                relays forwarded %lld segment(s) before their piece had "
            "landed (all ranks, last refit)\n",
            static_cast<long long>(delta_relay_early_segments));
      }
    }
    if (rate_bits > 0 && random_fraction) {
      // Each refit moves its own fraction's bytes: the last refit's bound says nothing about
      // the median over all of them.
      std::printf("emulated NIC    %s, MTU %d: lower bound %s for the last refit's bytes "
                  "(busiest rank's bytes / rate); no ratio to the median: refits of random "
                  "change fractions move different bytes\n",
                  rate.c_str(), static_cast<int>(*mtu),
                  FormatSeconds(lower_bound_ms / 1e3).c_str());
    } else if (rate_bits > 0) {
      std::printf("emulated NIC    %s, MTU %d: lower bound %s (busiest rank's bytes / rate); "
                  "median is %.2fx the bound, landing median %.2fx\n",
                  rate.c_str(), static_cast<int>(*mtu), FormatSeconds(lower_bound_ms / 1e3).c_str(),
                  ratio, ratio_landing);
    }
    if (cuda) {
      // The pinned host memory staging holds, all ranks: the rings, the landing rounds' areas
      // and the full-size copies.
      std::vector<std::string> pinned;
      if (cuda_all.ring_bytes > 0) {
        pinned.push_back(
            absl::StrCat("staging rings ", FormatBytes(static_cast<double>(cuda_all.ring_bytes))));
      }
      if (cuda_all.landing_bytes > 0) {
        pinned.push_back(absl::StrCat("landing rounds ",
                                      FormatBytes(static_cast<double>(cuda_all.landing_bytes))));
      }
      if (cuda_all.copy_bytes > 0) {
        pinned.push_back(absl::StrCat("full-size copies ",
                                      FormatBytes(static_cast<double>(cuda_all.copy_bytes))));
      }
      std::printf(
          "CUDA memory     device buffers on %zu GPU(s) (%s): %lld registered with UCX "
          "directly, %lld staged through pinned host memory%s; last refit staged %s "
          "device -> host and %s host -> device (all ranks)\n",
          gpus.size(), absl::StrJoin(gpus, ", ").c_str(),
          static_cast<long long>(cuda_all.registered), static_cast<long long>(cuda_all.staged),
          pinned.empty() ? "" : absl::StrCat(" (", absl::StrJoin(pinned, ", "), ")").c_str(),
          FormatBytes(static_cast<double>(cuda_all.to_host)).c_str(),
          FormatBytes(static_cast<double>(cuda_all.to_device)).c_str());
      if (device_copy_ms > 0) {
        std::printf(
            "cudaMemcpy      device to device of the %s one refit writes: %s; median "
            "refit is %.2fx that\n",
            FormatBytes(static_cast<double>(cuda_all.destination_bytes)).c_str(),
            FormatSeconds(device_copy_ms / 1e3).c_str(), ratio_device_copy);
      } else if (!device_copy_error.empty()) {
        std::printf("cudaMemcpy      not measured: %s\n", device_copy_error.c_str());
      }
    }
    std::printf("result          %s\n",
                ok ? absl::StrCat("every destination verified byte-exact in ", completed,
                                  " refit(s)",
                                  failed_refits > 0
                                      ? absl::StrCat("; ", failed_refits,
                                                     " refit(s) in between failed on purpose (",
                                                     rank_failures,
                                                     " rank failures), every rank reset")
                                      : "")
                         .c_str()
                   : "FAILED");
  }
  for (const auto& e : errors) std::fprintf(stderr, "reshard run: %s\n", e.c_str());
  if (result.interrupted) return 130;
  if (ok) return kExitOk;
  return invalid_input ? kExitUsage : kExitFailed;
}

}  // namespace reshard::cli
