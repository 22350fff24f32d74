// `reshard sim (--model M.json --cluster C.json --train P --infer P | --spec S.json) [--json]
//  [--svg F]`: our schedule, gather-broadcast, naive point-to-point and the lower bound.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/json.h"
#include "src/plan/cluster.h"
#include "src/plan/plan.h"
#include "src/plan/schedule.h"
#include "src/plan/sim.h"
#include "src/plan/quant_spec.h"
#include "src/plan/spec_json.h"
#include "tools/reshard/args.h"
#include "tools/reshard/commands.h"
#include "tools/reshard/model_args.h"
#include "tools/reshard/report.h"

namespace reshard::cli {
namespace {

using plan::Plan;
using plan::RefitSpec;
using plan::SimResult;

constexpr char kHelpHead[] =
    R"(usage: reshard sim --model M.json --cluster C.json --train P --infer P [options]
       reshard sim --spec S.json [--cluster C.json] [options]

Simulates one refit at flow level (per-GPU NIC egress/ingress and NVLink links, max-min fair
sharing, fan-out streaming behind arrivals) for our domain-aware schedule, gather-broadcast and
naive point-to-point, and prints them next to the lower bound. docs/simulator.md explains the model.

options:
  --cluster C.json   cluster description (GPUs per domain, NIC and NVLink bandwidth); with --spec
                     it replaces the spec's bandwidths and, when the spec has no domains, groups
                     gpus_per_domain consecutive ranks
)";

constexpr char kHelpTail[] = R"(  --spec S.json      simulate a refit spec instead of a model
  --no-relay         our schedule without relays between destination domains
  --no-staging       our schedule without staging receivers
  --relay-priority W a what-if: network transfers that some relay forwards travel as flows
                     of their own that weigh W (1 to 1e6) in the sharing of their NICs (default:
                     not simulated; every pair shares fairly, as the engine and NICs do today;
                     docs/simulator.md, "Relay priority")
  --no-baselines     simulate ours and the lower bound only, not naive point-to-point and
                     gather-broadcast; JSON gives null for them
  --batch-fraction F events closer than F x the current time are simulated together (default
                     0.01; 0 is exact but slow; batching errs on the slow side)
  --change-fraction F  also simulate ours with delta refits (docs/delta.md) when a random,
                     scattered fraction F (0..1) of the elements changed: network pieces from
                     sources (into destinations or staging) carry the expected delta stream
                     bytes (smaller of bitmap and runs per chunk, at most the piece), and so do
                     the relays that forward them; fan-out the plain bytes; printed next to the
                     full-copy lower bound (JSON: "delta")
  --json             one JSON object: ours, gather_broadcast (pipeline stages concurrent),
                     gather_broadcast_serial (stages in turn), naive_p2p, lower_bound,
                     nic_load_factor, time_factor, timings
  --svg F            write an SVG: rank-to-rank traffic of our schedule and per-NIC load bars
  --help             this text

exit status: 0 success, 2 invalid input or usage.
)";

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Seconds with 3 decimals for refit-sized times, with a unit below 10 ms.
std::string SecondsCell(double s) {
  return s >= 0.01 ? absl::StrFormat("%.3f", s) : FormatSeconds(s);
}

struct Row {
  std::string name;
  SimResult result;
};

std::string HeatColor(double v) {  // v in [0, 1]: white -> yellow -> red -> dark red.
  v = std::clamp(v, 0.0, 1.0);
  int r, g, b;
  if (v < 0.5) {
    r = 255;
    g = static_cast<int>(255 - 80 * v * 2);
    b = static_cast<int>(230 - 230 * v * 2);
  } else {
    r = static_cast<int>(255 - 115 * (v - 0.5) * 2);
    g = static_cast<int>(175 - 175 * (v - 0.5) * 2);
    b = 0;
  }
  return absl::StrFormat("#%02x%02x%02x", r, g, b);
}

std::string Svg(const std::string& title, const std::vector<plan::Flow>& flows, int32_t world,
                const SimResult& ours, const plan::LowerBound& lb) {
  const int cells = std::min<int32_t>(64, world);
  const int32_t per_cell = (world + cells - 1) / cells;
  const int n = (world + per_cell - 1) / per_cell;
  std::vector<double> net(n * n, 0), nvl(n * n, 0);
  for (const plan::Flow& f : flows) {
    (f.nvlink ? nvl : net)[(f.from / per_cell) * n + f.to / per_cell] +=
        static_cast<double>(f.bytes);
  }
  double max_cell = 1;
  for (int i = 0; i < n * n; ++i) max_cell = std::max(max_cell, net[i] + nvl[i]);
  const int map = 512, left = 80, top = 60, cell = map / n;
  const int map_size = cell * n;
  const int bars_top = top + map_size + 90, bars_h = 220;
  const int width = std::max(left + map_size + 260, left + 940), height = bars_top + bars_h + 90;
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
      "fill=\"white\"/>\n<text x=\"%d\" y=\"24\" font-size=\"15\" font-weight=\"bold\">%s</text>\n"
      "<text x=\"%d\" y=\"44\">Traffic of our schedule, sender rank (rows) to receiver rank "
      "(columns), %d rank(s) per cell; blue outline: NVLink only</text>\n",
      width, height, left, title, left, per_cell);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const double v = net[i * n + j] + nvl[i * n + j];
      if (v <= 0) continue;
      const double x = std::log10(v) / std::log10(max_cell);  // Log scale from 1 byte.
      const bool only_nvlink = net[i * n + j] <= 0;
      absl::StrAppend(
          &s,
          absl::StrFormat("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\"%s/>\n",
                          left + j * cell, top + i * cell, cell, cell, HeatColor(x),
                          only_nvlink ? " stroke=\"#1f5fbf\" stroke-width=\"1\"" : ""));
    }
  }
  absl::StrAppend(&s, absl::StrFormat("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                                      "fill=\"none\" stroke=\"black\"/>\n",
                                      left, top, map_size, map_size));
  for (int k = 0; k <= 4; ++k) {
    const int rank = static_cast<int>(static_cast<int64_t>(world) * k / 4);
    const int pos = static_cast<int>(static_cast<int64_t>(map_size) * k / 4);
    absl::StrAppend(&s,
                    absl::StrFormat("<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text>\n",
                                    left + pos, top + map_size + 16, rank));
    absl::StrAppend(&s, absl::StrFormat("<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%d</text>\n",
                                        left - 6, top + pos + 4, rank));
  }
  absl::StrAppend(&s, absl::StrFormat("<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">receiver "
                                      "rank</text>\n<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" "
                                      "transform=\"rotate(-90 %d %d)\">sender rank</text>\n",
                                      left + map_size / 2, top + map_size + 34, left - 50,
                                      top + map_size / 2, left - 50, top + map_size / 2));
  // Legend of the colour scale.
  const int lx = left + map_size + 30;
  absl::StrAppend(
      &s, absl::StrFormat("<text x=\"%d\" y=\"%d\">bytes per cell (log)</text>\n", lx, top));
  for (int k = 0; k < 10; ++k) {
    absl::StrAppend(&s, absl::StrFormat("<rect x=\"%d\" y=\"%d\" width=\"20\" height=\"20\" "
                                        "fill=\"%s\"/>\n",
                                        lx, top + 10 + 20 * (9 - k), HeatColor((k + 0.5) / 10)));
  }
  absl::StrAppend(
      &s,
      absl::StrFormat("<text x=\"%d\" y=\"%d\">%s</text>\n<text x=\"%d\" "
                      "y=\"%d\">1 B</text>\n<rect x=\"%d\" y=\"%d\" width=\"20\" "
                      "height=\"20\" fill=\"white\" stroke=\"#999\"/><text x=\"%d\" "
                      "y=\"%d\">no traffic</text>\n<rect x=\"%d\" y=\"%d\" width=\"20\" "
                      "height=\"20\" fill=\"%s\" stroke=\"#1f5fbf\"/><text x=\"%d\" "
                      "y=\"%d\">NVLink only</text>\n",
                      lx + 26, top + 24, FormatBytes(max_cell), lx + 26, top + 206, lx, top + 225,
                      lx + 26, top + 240, lx, top + 250, HeatColor(0.8), lx + 26, top + 265));
  // Per-NIC load bars.
  double max_bar = static_cast<double>(lb.max_nic_bytes);
  for (int32_t r = 0; r < world; ++r) {
    max_bar = std::max(
        {max_bar, static_cast<double>(ours.nic_in[r]), static_cast<double>(ours.nic_out[r])});
  }
  max_bar = std::max(max_bar, 1.0);
  const double bw = 900.0 / world;
  absl::StrAppend(
      &s, absl::StrFormat("<text x=\"%d\" y=\"%d\" font-size=\"14\" font-weight=\"bold\">Network "
                          "bytes per NIC (ours): ingress up, egress down</text>\n",
                          left, bars_top - 30));
  const int mid = bars_top + bars_h / 2;
  for (int32_t r = 0; r < world; ++r) {
    const double hin = ours.nic_in[r] / max_bar * (bars_h / 2 - 4);
    const double hout = ours.nic_out[r] / max_bar * (bars_h / 2 - 4);
    if (hin > 0) {
      absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
                                          "height=\"%.2f\" fill=\"#2b7bba\"/>\n",
                                          left + r * bw, mid - hin, std::max(bw, 0.5), hin));
    }
    if (hout > 0) {
      absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" "
                                          "height=\"%.2f\" fill=\"#e08214\"/>\n",
                                          left + r * bw, mid, std::max(bw, 0.5), hout));
    }
  }
  const double lbh = lb.max_nic_bytes / max_bar * (bars_h / 2 - 4);
  absl::StrAppend(
      &s, absl::StrFormat(
              "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
              "<line x1=\"%d\" x2=\"%d\" y1=\"%.2f\" y2=\"%.2f\" stroke=\"red\" "
              "stroke-dasharray=\"4 3\"/>\n<line x1=\"%d\" x2=\"%d\" y1=\"%.2f\" y2=\"%.2f\" "
              "stroke=\"red\" stroke-dasharray=\"4 3\"/>\n",
              left, left + 900, mid, mid, left, left + 900, mid - lbh, mid - lbh, left, left + 900,
              mid + lbh, mid + lbh));
  absl::StrAppend(&s, absl::StrFormat("<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n"
                                      "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">0</text>\n"
                                      "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n",
                                      left - 6, bars_top + 8, FormatBytes(max_bar), left - 6,
                                      mid + 4, left - 6, bars_top + bars_h, FormatBytes(max_bar)));
  for (int k = 0; k <= 4; ++k) {
    absl::StrAppend(&s,
                    absl::StrFormat("<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n",
                                    left + 900.0 * k / 4, bars_top + bars_h + 16,
                                    static_cast<int>(static_cast<int64_t>(world) * k / 4)));
  }
  absl::StrAppend(&s,
                  absl::StrFormat("<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">rank</text>\n",
                                  left + 450, bars_top + bars_h + 34));
  const int ly = bars_top + bars_h + 56;
  absl::StrAppend(
      &s,
      absl::StrFormat(
          "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"#2b7bba\"/><text x=\"%d\" "
          "y=\"%d\">NIC ingress</text>\n<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" "
          "fill=\"#e08214\"/><text x=\"%d\" y=\"%d\">NIC egress</text>\n<line x1=\"%d\" "
          "x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"red\" stroke-dasharray=\"4 3\"/><text x=\"%d\" "
          "y=\"%d\">lower bound per NIC (%s)</text>\n",
          left, ly, left + 20, ly + 12, left + 130, ly, left + 150, ly + 12, left + 260, left + 290,
          ly + 7, ly + 7, left + 296, ly + 12, FormatBytes(lb.max_nic_bytes)));
  s += "</svg>\n";
  return s;
}

}  // namespace

int SimCommand(int argc, char** argv) {
  std::set<std::string> flags = ModelFlags();
  flags.insert({"json", "help", "no-relay", "no-staging", "no-baselines"});
  std::set<std::string> options = ModelOptions();
  options.insert({"spec", "svg", "batch-fraction", "change-fraction", "relay-priority"});
  auto parsed = Args::Parse(argc, argv, flags, options);
  if (!parsed.ok()) return UsageError("sim", std::string(parsed.status().message()));
  const Args& args = *parsed;
  if (args.Has("help")) {
    std::printf("%s%s%s", kHelpHead, kModelOptionsHelp, kHelpTail);
    return kExitOk;
  }
  if (!args.positional().empty())
    return UsageError("sim", "takes no positional arguments (see --help)");
  const auto total_start = std::chrono::steady_clock::now();
  const std::clock_t cpu_start = std::clock();
  RefitSpec spec;
  std::string title;
  std::optional<plan::ClusterDesc> cluster;
  if (auto path = args.Get("cluster")) {
    auto loaded = plan::LoadClusterFile(*path);
    if (!loaded.ok()) return UsageError("sim", std::string(loaded.status().message()));
    cluster = *loaded;
  }
  if (auto path = args.Get("spec")) {
    for (const char* option : {"model", "train", "infer", "dtype", "layers", "per-expert",
                               "infer-dtype", "infer-quant"}) {
      if (args.Has(option)) {
        return UsageError("sim",
                          absl::StrCat("--spec excludes --", option,
                                       " (the spec already fixes the model and its layouts)"));
      }
    }
    auto loaded = plan::LoadSpecFile(*path);
    if (!loaded.ok()) return UsageError("sim", std::string(loaded.status().message()));
    spec = *std::move(loaded);
    if (cluster) {
      spec.topology.nic_gbytes_per_s = cluster->nic_gbytes_per_s;
      spec.topology.nvlink_gbytes_per_s = cluster->nvlink_gbytes_per_s;
      spec.topology.gpus_per_node = cluster->gpus_per_node;
      if (spec.topology.domains.empty() && spec.topology.ranks_per_domain == 0) {
        spec.topology.ranks_per_domain = cluster->gpus_per_domain;
      }
    }
    title = *path;
  } else {
    if (!args.Has("model")) {
      return UsageError("sim",
                        "needs --model, --cluster, --train and --infer, or --spec (see --help)");
    }
    auto made = ModelSpecFromArgs(args, ClusterDefault::kRequired);
    if (!made.ok()) return UsageError("sim", std::string(made.status().message()));
    spec = std::move(made->spec);
    auto base = [](const std::string& path) {
      std::string name = path.substr(path.find_last_of('/') + 1);
      return name.size() > 5 && name.ends_with(".json") ? name.substr(0, name.size() - 5) : name;
    };
    title = absl::StrFormat("%s on %s: train %s -> infer %s%s", base(*args.Get("model")),
                            base(*args.Get("cluster")), *args.Get("train"), *args.Get("infer"),
                            args.Has("per-expert") ? ", per-expert tensors" : "");
  }
  plan::SimOptions sim_options;
  auto change_fraction = args.GetDouble("change-fraction", -1);
  if (!change_fraction.ok() ||
      (args.Get("change-fraction") && !(*change_fraction >= 0 && *change_fraction <= 1))) {
    return UsageError("sim", "--change-fraction must be a number between 0 and 1");
  }
  auto batch = args.GetDouble("batch-fraction", sim_options.batch_fraction);
  if (!batch.ok() || !(*batch >= 0 && *batch < 1)) {
    return UsageError("sim", "--batch-fraction must be a number in [0, 1)");
  }
  sim_options.batch_fraction = *batch;
  auto weight = args.GetDouble("relay-priority", sim_options.relay_feed_weight);
  if (!weight.ok() || !(*weight >= 1 && *weight <= 1e6)) {
    return UsageError("sim", "--relay-priority must be a number between 1 and 1e6");
  }
  sim_options.relay_feed_weight = *weight;
  auto shared = std::make_shared<const RefitSpec>(std::move(spec));
  const RefitSpec& s = *shared;
  const int32_t world = s.WorldSize();

  auto t0 = std::chrono::steady_clock::now();
  plan::DomainMap domains(s);
  // Quantized destinations: the bound of what actually travels (FP8 bytes and scales). The
  // gather-and-broadcast baselines below move the spec as written, in its source dtype, as
  // NVIDIA's Reshard does for quantized weights (docs/quantization.md).
  auto lowered = plan::LowerQuantization(shared);
  if (!lowered.ok()) return UsageError("sim", std::string(lowered.status().message()));
  const plan::LowerBound lb = plan::ComputeLowerBound(**lowered, domains);
  const double lb_seconds = Seconds(t0);

  t0 = std::chrono::steady_clock::now();
  plan::PlanOptions ours_options;
  ours_options.relay = !args.Has("no-relay");
  ours_options.staging = !args.Has("no-staging");
  auto ours_plan = plan::BuildPlan(shared, ours_options);
  if (!ours_plan.ok()) {
    std::fprintf(stderr, "reshard sim: %s\n", std::string(ours_plan.status().message()).c_str());
    return ours_plan.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage
                                                                           : kExitFailed;
  }
  const double ours_plan_seconds = Seconds(t0);
  t0 = std::chrono::steady_clock::now();
  // The what-if of relay priority splits each pair's flows by relay feed (sim.h).
  const bool by_feed = args.Get("relay-priority").has_value();
  const std::vector<plan::Flow> ours_flows = plan::FlowsFromPlan(*ours_plan, by_feed);
  const plan::PlanStats ours_stats = ours_plan->stats();
  const std::vector<plan::Flow> delta_flows =
      *change_fraction >= 0
          ? plan::DeltaFlowsFromPlan(*ours_plan, *change_fraction, {.by_relay_feed = by_feed})
          : std::vector<plan::Flow>{};
  const plan::DeltaMemory delta_memory =
      *change_fraction >= 0 ? plan::DeltaMemoryOf(*ours_plan) : plan::DeltaMemory{};
  ours_plan = absl::UnknownError("released");  // Free the plan before the baselines.
  const SimResult ours = plan::Simulate(ours_flows, world, s.topology, sim_options);
  std::optional<SimResult> delta;
  if (*change_fraction >= 0) delta = plan::Simulate(delta_flows, world, s.topology, sim_options);
  const double ours_sim_seconds = Seconds(t0);

  // The baselines (naive point-to-point, gather-broadcast concurrent and in turn), unless
  // --no-baselines.
  const bool baselines = !args.Has("no-baselines");
  std::optional<SimResult> naive, gb, gb_serial;
  double naive_seconds = 0, gb_seconds = 0;
  if (baselines) {
    t0 = std::chrono::steady_clock::now();
    plan::PlanOptions p2p_options;
    p2p_options.schedule = plan::PlanOptions::Schedule::kPointToPoint;
    auto p2p_plan = plan::BuildPlan(shared, p2p_options);
    if (!p2p_plan.ok()) {
      std::fprintf(stderr, "reshard sim: %s\n", std::string(p2p_plan.status().message()).c_str());
      return kExitFailed;
    }
    naive = plan::Simulate(plan::FlowsFromPlan(*p2p_plan), world, s.topology, sim_options);
    p2p_plan = absl::UnknownError("released");
    naive_seconds = Seconds(t0);
    t0 = std::chrono::steady_clock::now();
    gb = plan::Simulate(plan::GatherBroadcastFlows(s, domains), world, s.topology, sim_options);
    gb_serial.emplace();
    for (const auto& stage : plan::GatherBroadcastStages(s, domains)) {
      const SimResult r = plan::Simulate(stage, world, s.topology, sim_options);
      gb_serial->seconds += r.seconds;
      gb_serial->network_bytes += r.network_bytes;
      gb_serial->nvlink_bytes += r.nvlink_bytes;
      gb_serial->flows += r.flows;
      gb_serial->events += r.events;
    }
    gb_serial->max_nic_bytes = gb->max_nic_bytes;  // Same flows in all: same per-NIC totals.
    gb_seconds = Seconds(t0);
  }
  const double total_seconds = Seconds(total_start);
  const double cpu_seconds = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;

  const double nic_factor =
      lb.max_nic_bytes > 0 ? static_cast<double>(ours.max_nic_bytes) / lb.max_nic_bytes : 1.0;
  auto ratio = [&](double x) { return lb.seconds > 0 ? x / lb.seconds : 0.0; };

  if (auto svg_path = args.Get("svg")) {
    std::ofstream out(*svg_path, std::ios::binary);
    out << Svg(title, ours_flows, world, ours, lb);
    if (!out) {
      std::fprintf(stderr, "reshard sim: cannot write %s\n", svg_path->c_str());
      return kExitFailed;
    }
  }

  if (args.Has("json")) {
    auto result_json = [&](const SimResult& r) {
      return absl::StrFormat(
          "{\"seconds\": %.6f, \"network_bytes\": %d, \"nvlink_bytes\": %d, \"max_nic_bytes\": %d, "
          "\"ratio_to_lower_bound\": %.4f, \"flows\": %d, \"events\": %d}",
          r.seconds, r.network_bytes, r.nvlink_bytes, r.max_nic_bytes, ratio(r.seconds), r.flows,
          r.events);
    };
    auto optional_json = [&](const std::optional<SimResult>& r) {
      return r ? result_json(*r) : std::string("null");
    };
    absl::PrintF(
        "{\"title\": %s, \"world_size\": %d, \"tensors\": %d, \"ours\": %s, "
        "\"ours_plan\": {\"bytes_network\": %d, \"bytes_relay\": %d, \"bytes_fanout\": %d, "
        "\"bytes_staged\": %d, \"pieces\": %d},\n \"gather_broadcast\": %s,\n "
        "\"gather_broadcast_serial\": %s,\n \"naive_p2p\": %s,\n"
        " \"lower_bound\": {\"seconds\": %.6f, \"max_nic_bytes\": %d, \"network_bytes\": %d, "
        "\"domain_ingest_bytes\": %d, \"source_egress_bytes\": %d, \"average_bytes\": %d, "
        "\"nvlink_bytes\": %d},\n \"delta\": %s,\n \"nic_load_factor\": %.4f, "
        "\"time_factor\": %.4f,\n"
        " \"timings\": {\"lower_bound\": %.3f, \"ours_plan\": %.3f, \"ours_sim\": %.3f, "
        "\"naive_p2p\": %s, \"gather_broadcast\": %s, \"total\": %.3f, \"cpu_total\": %.3f}}\n",
        json::Quote(title), world, s.tensors.size(), result_json(ours), ours_stats.bytes_network,
        ours_stats.bytes_relay, ours_stats.bytes_fanout, ours_stats.bytes_staged, ours_stats.pieces,
        optional_json(gb), optional_json(gb_serial), optional_json(naive), lb.seconds,
        lb.max_nic_bytes, lb.network_bytes, lb.domain_ingest_bytes, lb.source_egress_bytes,
        lb.average_bytes, lb.nvlink_bytes,
        delta ? absl::StrCat("{\"change_fraction\": ", *change_fraction,
                             ", \"bytes_ratio\": ", plan::DeltaBytesRatio(*change_fraction, 2),
                             ", \"result\": ", result_json(*delta), ", \"memory\": ",
                             absl::StrFormat(
                                 "{\"max_shadow_bytes\": %d, \"max_shadow_rank\": %d, "
                                 "\"max_send_scratch_bytes\": %d, \"max_send_scratch_rank\": %d, "
                                 "\"max_landing_bytes\": %d, \"max_landing_rank\": %d, "
                                 "\"shadow_bytes\": %d, \"send_scratch_bytes\": %d, "
                                 "\"landing_bytes\": %d}",
                                 delta_memory.max_shadow_bytes, delta_memory.max_shadow_rank,
                                 delta_memory.max_send_scratch_bytes,
                                 delta_memory.max_send_scratch_rank, delta_memory.max_landing_bytes,
                                 delta_memory.max_landing_rank, delta_memory.shadow_bytes,
                                 delta_memory.send_scratch_bytes, delta_memory.landing_bytes),
                             "}")
              : std::string("null"),
        nic_factor, ratio(ours.seconds), lb_seconds, ours_plan_seconds, ours_sim_seconds,
        baselines ? absl::StrFormat("%.3f", naive_seconds) : std::string("null"),
        baselines ? absl::StrFormat("%.3f", gb_seconds) : std::string("null"), total_seconds,
        cpu_seconds);
    return kExitOk;
  }
  absl::PrintF(
      "%s\n%d ranks, %d tensors, NIC %.0f GB/s, NVLink %.0f GB/s per GPU and direction\n\n",
      title.c_str(), world, s.tensors.size(), s.topology.nic_gbytes_per_s,
      s.topology.nvlink_gbytes_per_s);
  Table table(
      {"schedule", "seconds", "network bytes", "NVLink bytes", "max NIC bytes", "x lower bound"});
  std::vector<Row> rows = {Row{"ours", ours}};
  if (baselines) {
    rows.insert(rows.end(),
                {Row{"gather-broadcast", *gb}, Row{"gather-broadcast, stages in turn", *gb_serial},
                 Row{"naive P2P", *naive}});
  }
  for (const Row& row : rows) {
    const SimResult& r = row.result;
    table.AddRow({row.name, SecondsCell(r.seconds), FormatBytes(r.network_bytes),
                  FormatBytes(r.nvlink_bytes), FormatBytes(r.max_nic_bytes),
                  absl::StrFormat("%.2f", ratio(r.seconds))});
  }
  table.AddRow({"lower bound", SecondsCell(lb.seconds), FormatBytes(lb.network_bytes), "-",
                FormatBytes(lb.max_nic_bytes), "1.00"});
  if (delta) {
    table.AddRow({absl::StrFormat("ours, delta refits (%.3g changed)", *change_fraction),
                  SecondsCell(delta->seconds), FormatBytes(delta->network_bytes),
                  FormatBytes(delta->nvlink_bytes), FormatBytes(delta->max_nic_bytes),
                  absl::StrFormat("%.2f", ratio(delta->seconds))});
  }
  std::printf("%s\n", table.Render().c_str());
  std::printf("nic_load_factor %.3f (ours max NIC bytes / lower bound)\n", nic_factor);
  if (delta) {
    absl::PrintF(
        "delta memory per rank, at most: shadows %s (rank %d; device memory for CUDA sources), "
        "send scratch %s (rank %d), landing area %s with puts (rank %d; none with active "
        "messages)\n",
        FormatBytes(delta_memory.max_shadow_bytes), delta_memory.max_shadow_rank,
        FormatBytes(delta_memory.max_send_scratch_bytes), delta_memory.max_send_scratch_rank,
        FormatBytes(delta_memory.max_landing_bytes), delta_memory.max_landing_rank);
  }
  absl::PrintF("ours: %s relayed between domains, %s fan-out, %s staged\n",
               FormatBytes(ours_stats.bytes_relay).c_str(),
               FormatBytes(ours_stats.bytes_fanout).c_str(),
               FormatBytes(ours_stats.bytes_staged).c_str());
  std::printf(
      "runtime %.2f s wall, %.2f s CPU on one thread (wall: lower bound %.2f, ours plan "
      "%.2f + sim %.2f, %s)\n",
      total_seconds, cpu_seconds, lb_seconds, ours_plan_seconds, ours_sim_seconds,
      baselines
          ? absl::StrFormat("naive %.2f, gather-broadcast %.2f", naive_seconds, gb_seconds).c_str()
          : "baselines not simulated (--no-baselines)");
  return kExitOk;
}

}  // namespace reshard::cli
