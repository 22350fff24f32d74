// `reshard plan SPEC.json [--rank R] [--verify] [--json] [--explain] [--tiles]`
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/common/json.h"
#include "src/plan/executor.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"
#include "tools/reshard/args.h"
#include "tools/reshard/commands.h"
#include "tools/reshard/report.h"

namespace reshard::cli {
namespace {

using plan::Plan;
using plan::RefitSpec;
using plan::Side;

constexpr char kHelp[] = R"(usage: reshard plan SPEC.json [options]

Plans a refit spec: for every destination tile, the exact regions it needs from which source
tile, as contiguous runs and strided regions. Prints a readable summary.

options:
  --rank R             plan only rank R's share, as each rank of a refit does at set-up: the
                       transfers it sends, receives, relays or fans out, and the fan-out copies
                       between other ranks of its domain (every schedule decision the same as in
                       the whole plan, same fingerprint); prints what the rank moves, its
                       planning time and the process's peak memory (reading the spec included:
                       bench/plan_rank_bench measures planning alone)
  --verify             execute the plan in process over every rank's buffers (sources filled
                       with a strong hash of tensor name and global index) and check every
                       destination element and that nothing outside destination views changed
  --verify-max-bytes N refuse to verify when all buffers together exceed N bytes (default 4 GiB)
  --explain            a table per tensor: pieces, bytes, sources per destination, contiguity
  --tiles              every rank's tile per tensor and side as JSON (rank, global offset,
                       local shape), to check a layout against what a framework holds
  --json               one JSON object: ok, verify (passed|failed|skipped), tensors, pieces,
                       regions, runs, bytes {dst_total, network, relay, staged, local, fanout},
                       plan_seconds, fingerprint, world_size, schedule_hash (without --rank: a
                       hash of every region and transfer of the whole plan); with --explain or
                       --tiles also "explain"/"tiles"; with --rank also "rank" {rank,
                       transfers, regions, sends, receives, bytes {network_out, network_in,
                       relay_out, fanout_out, fanout_in, local, staged_in}, stage_bytes,
                       peak_rss_bytes}
  --help               this text

--verify executes the whole plan, so it cannot be combined with --rank.

exit status: 0 success, 1 verification failed, 2 invalid spec or usage.
)";

std::string TilesJson(const RefitSpec& spec) {
  std::string out = "[";
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    absl::StrAppend(&out, t ? ",\n " : "\n ", "{\"name\": ", json::Quote(spec.tensors[t].name));
    for (Side side : {Side::kSrc, Side::kDst}) {
      absl::StrAppend(&out, ", \"", plan::SideName(side), "\": [");
      bool first = true;
      std::vector<std::pair<int32_t, plan::Box>> tiles;
      plan::ForEachTile(spec, t, side, [&](int32_t rank, const plan::Box& box) {
        tiles.emplace_back(rank, box);
      });
      std::sort(tiles.begin(), tiles.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& [rank, box] : tiles) {
        std::vector<int64_t> offset, shape;
        for (int d = 0; d < box.ndim; ++d) {
          offset.push_back(box.lo[d]);
          shape.push_back(box.extent(d));
        }
        absl::StrAppend(&out, first ? "" : ", ", "{\"rank\": ", rank, ", \"offset\": [",
                        absl::StrJoin(offset, ", "), "], \"shape\": [", absl::StrJoin(shape, ", "),
                        "]}");
        first = false;
      }
      out += "]";
    }
    out += "}";
  }
  out += "\n]";
  return out;
}

std::string Placements(const plan::Layout& l) {
  std::vector<std::string> p;
  for (const auto& x : l.placements) p.push_back(x.ToString());
  std::vector<int64_t> shape = l.mesh.shape;
  return absl::StrCat("[", absl::StrJoin(shape, "x"), "] ", absl::StrJoin(p, ","));
}

std::string ExplainTable(const Plan& plan) {
  Table table({"tensor", "dtype", "shape", "src", "dst", "pieces", "bytes", "src/dst max",
               "contiguous", "runs/piece"});
  const RefitSpec& spec = plan.spec();
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const auto& ts = spec.tensors[t];
    const auto& st = plan.tensor_stats()[t];
    table.AddRow({ts.name, std::string(plan::DTypeName(ts.dtype)),
                  absl::StrCat("[", absl::StrJoin(ts.shape, ","), "]"), Placements(ts.src),
                  Placements(ts.dst), absl::StrCat(st.pieces), FormatBytes(st.bytes),
                  absl::StrCat(st.max_sources),
                  st.pieces ? absl::StrFormat("%.0f%%", 100.0 * st.contiguous / st.pieces) : "-",
                  st.pieces ? absl::StrFormat("%.1f", double(st.runs) / st.pieces) : "-"});
  }
  return table.Render();
}

std::string ExplainJson(const Plan& plan) {
  std::string out = "[";
  const RefitSpec& spec = plan.spec();
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const auto& st = plan.tensor_stats()[t];
    absl::StrAppend(&out, t ? ", " : "", "{\"name\": ", json::Quote(spec.tensors[t].name),
                    ", \"pieces\": ", st.pieces, ", \"bytes\": ", st.bytes,
                    ", \"max_sources_per_dst\": ", st.max_sources, ", \"contiguous_pieces\": ",
                    st.contiguous, ", \"runs\": ", st.runs, "}");
  }
  return out + "]";
}

// Peak resident memory of this process (VmHWM), or -1 when /proc does not say.
int64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return -1;
}

// What one rank's share moves (a rank's plan holds only its own transfers).
struct RankShare {
  int64_t sends = 0, receives = 0;
  int64_t network_out = 0, network_in = 0, relay_out = 0, fanout_out = 0, fanout_in = 0;
  int64_t local = 0, staged_in = 0;
};

RankShare ShareOf(const Plan& p, int32_t rank) {
  RankShare s;
  for (const plan::Transfer& t : p.transfers()) {
    const int64_t bytes = p.region(t.region).bytes;
    if (t.kind == plan::TransferKind::kLocal) {
      if (t.to_rank == rank) s.local += bytes;
      continue;
    }
    const bool network = t.kind == plan::TransferKind::kNetwork;
    if (t.from_rank == rank) {
      ++s.sends;
      (network ? s.network_out : s.fanout_out) += bytes;
      if (network && t.from_side != Side::kSrc) s.relay_out += bytes;
    }
    if (t.to_rank == rank) {
      ++s.receives;
      (network ? s.network_in : s.fanout_in) += bytes;
      if (t.to_side == Side::kStage) s.staged_in += bytes;
    }
  }
  return s;
}

}  // namespace

int PlanCommand(int argc, char** argv) {
  auto parsed = Args::Parse(argc, argv, {"verify", "json", "explain", "tiles", "help"},
                            {"verify-max-bytes", "rank"});
  if (!parsed.ok()) return UsageError("plan", std::string(parsed.status().message()));
  const Args& args = *parsed;
  if (args.Has("help")) {
    std::fputs(kHelp, stdout);
    return kExitOk;
  }
  if (args.positional().size() != 1) return UsageError("plan", "expects one SPEC.json (see --help)");
  auto max_bytes = args.GetInt("verify-max-bytes", int64_t{4} << 30);
  if (!max_bytes.ok()) return UsageError("plan", std::string(max_bytes.status().message()));
  auto rank_arg = args.GetInt("rank", -1);
  if (!rank_arg.ok()) return UsageError("plan", std::string(rank_arg.status().message()));
  const bool one_rank = args.Has("rank");
  if (one_rank && args.Has("verify")) {
    return UsageError("plan", "--verify executes the whole plan and cannot be combined with --rank");
  }

  const std::string& path = args.positional()[0];
  auto loaded = plan::LoadSpecFile(path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "reshard plan: %s\n", std::string(loaded.status().message()).c_str());
    return kExitUsage;
  }
  auto spec = std::make_shared<const RefitSpec>(*std::move(loaded));
  if (one_rank && (*rank_arg < 0 || *rank_arg >= spec->WorldSize())) {
    return UsageError("plan", absl::StrFormat("--rank %d is not a rank of the spec's world of %d",
                                              *rank_arg, spec->WorldSize()));
  }
  const int32_t rank = static_cast<int32_t>(*rank_arg);
  const auto start = std::chrono::steady_clock::now();
  auto built = one_rank ? plan::BuildRankPlan(spec, rank) : plan::BuildPlan(spec);
  const double plan_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!built.ok()) {
    std::fprintf(stderr, "reshard plan: %s: %s\n", path.c_str(),
                 std::string(built.status().message()).c_str());
    return built.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailed;
  }
  const Plan& p = *built;

  std::string verify = "skipped";
  std::string verify_error;
  double verify_seconds = 0;
  if (args.Has("verify")) {
    const auto vstart = std::chrono::steady_clock::now();
    absl::Status v = plan::VerifyPlanInProcess(p, *max_bytes);
    verify_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - vstart).count();
    if (v.code() == absl::StatusCode::kResourceExhausted) {
      std::fprintf(stderr, "reshard plan: %s: cannot verify: %s (raise --verify-max-bytes or drop "
                   "--verify)\n", path.c_str(), std::string(v.message()).c_str());
      return kExitUsage;
    }
    verify = v.ok() ? "passed" : "failed";
    verify_error = std::string(v.message());
  }
  const bool ok = verify != "failed";
  const auto& s = p.stats();
  const int64_t peak_rss = PeakRssBytes();
  const RankShare share = one_rank ? ShareOf(p, rank) : RankShare{};

  if (args.Has("json")) {
    std::string out = absl::StrFormat(
        "{\"ok\": %s, \"spec\": %s, \"verify\": \"%s\", \"tensors\": %d, \"pieces\": %d, "
        "\"regions\": %d, \"runs\": %d, \"world_size\": %d, "
        "\"bytes\": {\"dst_total\": %d, \"network\": %d, \"relay\": %d, \"staged\": %d, "
        "\"local\": %d, \"fanout\": %d}, \"plan_seconds\": %.6f, \"fingerprint\": \"%s\"",
        ok ? "true" : "false", json::Quote(path), verify, s.tensors, s.pieces, s.regions, s.runs,
        p.world_size(), s.bytes_dst_total, s.bytes_network, s.bytes_relay, s.bytes_staged,
        s.bytes_local, s.bytes_fanout, plan_seconds, FormatFingerprint(p.fingerprint()));
    if (!one_rank) {
      absl::StrAppend(&out, ", \"schedule_hash\": \"", FormatFingerprint(p.schedule_hash()), "\"");
    }
    if (!verify_error.empty()) absl::StrAppend(&out, ", \"error\": ", json::Quote(verify_error));
    if (one_rank) {
      absl::StrAppend(
          &out,
          absl::StrFormat(
              ", \"rank\": {\"rank\": %d, \"transfers\": %d, \"regions\": %d, \"sends\": %d, "
              "\"receives\": %d, \"bytes\": {\"network_out\": %d, \"network_in\": %d, "
              "\"relay_out\": %d, \"fanout_out\": %d, \"fanout_in\": %d, \"local\": %d, "
              "\"staged_in\": %d}, \"stage_bytes\": %d, \"peak_rss_bytes\": %d}",
              rank, p.transfers().size(), p.num_regions(), share.sends, share.receives,
              share.network_out, share.network_in, share.relay_out, share.fanout_out,
              share.fanout_in, share.local, share.staged_in, p.stage_bytes(rank), peak_rss));
    }
    if (args.Has("explain")) absl::StrAppend(&out, ", \"explain\": ", ExplainJson(p));
    if (args.Has("tiles")) absl::StrAppend(&out, ", \"tiles\": ", TilesJson(*spec));
    out += "}\n";
    std::fputs(out.c_str(), stdout);
  } else if (args.Has("tiles") && !args.Has("explain")) {
    std::printf("%s\n", TilesJson(*spec).c_str());
  } else {
    std::printf("spec        %s%s%s\n", path.c_str(), spec->comment.empty() ? "" : "\n            ",
                spec->comment.c_str());
    std::printf("tensors     %lld across %d ranks\n", static_cast<long long>(s.tensors),
                p.world_size());
    std::printf("plan        %lld pieces, %lld regions, %lld contiguous runs, planned in %s\n",
                static_cast<long long>(s.pieces), static_cast<long long>(s.regions),
                static_cast<long long>(s.runs), FormatSeconds(plan_seconds).c_str());
    // Relayed bytes (sent on by a domain that received them) are part of the network's.
    std::string network = absl::StrCat(FormatBytes(s.bytes_network), " over the network");
    if (s.bytes_relay > 0 || s.bytes_staged > 0) {
      absl::StrAppend(&network, " (", FormatBytes(s.bytes_relay),
                      " of it relayed between domains, ", FormatBytes(s.bytes_staged),
                      " into staging buffers)");
    }
    std::printf("bytes       %s land in destinations: %s, %s local copies, %s fan-out\n",
                FormatBytes(s.bytes_dst_total).c_str(), network.c_str(),
                FormatBytes(s.bytes_local).c_str(), FormatBytes(s.bytes_fanout).c_str());
    std::printf("fingerprint %s", FormatFingerprint(p.fingerprint()).c_str());
    if (!one_rank) std::printf(" (schedule hash %s)", FormatFingerprint(p.schedule_hash()).c_str());
    std::printf("\n");
    if (one_rank) {
      std::printf("%-12s%zu transfers, %zu regions, planned in %s; process peak memory %s "
                  "(reading the spec included)\n",
                  absl::StrCat("rank ", rank).c_str(), p.transfers().size(), p.num_regions(),
                  FormatSeconds(plan_seconds).c_str(),
                  peak_rss < 0 ? "unknown" : FormatBytes(static_cast<double>(peak_rss)).c_str());
      std::printf("  sends     %lld: %s over the network (%s of it relayed), %s fan-out\n",
                  static_cast<long long>(share.sends), FormatBytes(share.network_out).c_str(),
                  FormatBytes(share.relay_out).c_str(), FormatBytes(share.fanout_out).c_str());
      std::printf("  receives  %lld: %s over the network (%s into staging), %s fan-out, %s local "
                  "copies\n",
                  static_cast<long long>(share.receives), FormatBytes(share.network_in).c_str(),
                  FormatBytes(share.staged_in).c_str(), FormatBytes(share.fanout_in).c_str(),
                  FormatBytes(share.local).c_str());
      std::printf("  staging   %s\n", FormatBytes(p.stage_bytes(rank)).c_str());
    }
    if (args.Has("verify")) {
      std::printf("verify      %s in %s%s%s\n", verify.c_str(), FormatSeconds(verify_seconds).c_str(),
                  verify_error.empty() ? "" : ": ", verify_error.c_str());
    }
    if (args.Has("explain")) std::printf("\n%s", ExplainTable(p).c_str());
    if (args.Has("tiles")) std::printf("\n%s\n", TilesJson(*spec).c_str());
  }
  if (!ok) {
    std::fprintf(stderr, "reshard plan: %s: verification failed: %s\n", path.c_str(),
                 verify_error.c_str());
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace reshard::cli
