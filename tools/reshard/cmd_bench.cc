// `reshard bench`: side-by-side refit timings of the same redistribution done three ways by the
// same engine in the same processes -- ours (domain-aware plan), naive point-to-point, and the
// traditional gather-broadcast -- interleaved, plus optionally MPI_Alltoallw with subarray
// types (`--mpi`). The ranks are `reshard-bench-rank` processes (public API only) started by the
// local launcher; see bench_rank.cc for what each mode does.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/json.h"
#include "src/plan/layouts.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"
#include "tools/launcher/launcher.h"
#include "tools/reshard/args.h"
#include "tools/reshard/commands.h"
#include "tools/reshard/model_args.h"
#include "tools/reshard/report.h"

namespace reshard::cli {
namespace {

constexpr char kHelpHead[] = R"(usage: reshard bench SPEC.json [options]
       reshard bench --model M.json --train P --infer P [--cluster C.json] [options]

Times one refit done three ways by the same engine in the same processes, interleaved (each
iteration runs every mode once, in rotating order) and verified:
  ours              the domain-aware plan: each region crosses the network once per domain
  naive             point-to-point: each destination rank receives its own tile from a source
  gather_broadcast  each tensor gathered whole on one trainer rank, broadcast whole to every
                    destination rank (itself planned domain-aware, i.e. a tree), sliced locally
Reports the median and p90 (nearest rank) over iterations of the slowest rank's time per mode,
and the ratios of the medians.

options:
  --iters N            iterations (default 5)
  --transport sm|tcp   UCX transports between the local processes (default sm)
  --emulate-nic RATE   every rank in its own network namespace with a veth NIC limited to RATE
                       (tc notation: 800mbit, 2gbit); needs root, else loopback tcp (said so)
  --mtu BYTES          with --emulate-nic: the MTU of every veth (default 9000, jumbo frames, as
                       the RDMA NICs the emulation stands for; 1500-byte frames spend 4.5% of
                       the rate on TCP/IP headers)
  --mpi                also time MPI_Alltoallw with subarray datatypes for the same
                       redistribution (mpirun --allow-run-as-root --oversubscribe); needs
                       Open MPI and a spec without buffer views
  --verify ends|all|none  which iterations verify every destination element (default ends)
  --dst-dtype T        the spec's matrices land as T (fp8e4m3, fp8e5m2), quantized by the
                       sources (docs/quantization.md; --model specs: --infer-dtype does the same
                       as part of the model); adds the mode "ours, unquantized": the same refit
                       with the destinations as written, timed in the same run
  --dst-quant Q        with --dst-dtype: block:AxB (default block:128x128), mx[:N], channel,
                       tensor
  --delta              adds the mode "ours, delta": ours with delta refits (docs/delta.md),
                       timed and counted in the same run; the report gives its network bytes
                       and median time against ours (its first iteration is a full refit)
  --change-fraction F  each iteration after the first changes a random fraction F (0..1) of
                       every source tensor's elements by 1-15 ulp, scattered, instead of all
  --timeout-ms N       per-rank deadline for every wait (default 120000)
  --json               one JSON object: ours_ms, gather_broadcast_ms, naive_p2p_ms, mpi_ms (or
                       null) (medians), ours_p90_ms, gather_broadcast_p90_ms, naive_p2p_p90_ms,
                       mpi_p90_ms, gather_broadcast_over_ours, naive_p2p_over_ours,
                       mpi_over_ours, ...
  --help               this text

with --model instead of SPEC.json:
)";

constexpr char kHelpTail[] =
    R"(  --cluster C.json   NVLink domains and bandwidths (default: one domain per inference TP
                     group; the processes of this host stand in for GPUs)

exit status: 0 success, 1 a rank or a refit failed, 2 invalid input or usage.
)";

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

bool Executable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

std::optional<std::string> FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return std::nullopt;
  std::string p(path);
  size_t start = 0;
  while (start <= p.size()) {
    const size_t end = std::min(p.find(':', start), p.size());
    const std::string candidate = p.substr(start, end - start) + "/" + name;
    if (Executable(candidate)) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

// Runs argv, returns (exit status, stdout).
std::pair<int, std::string> Capture(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) return {-1, ""};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string LastJsonLine(const std::string& text) {
  std::string last;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start && text[start] == '{') last = text.substr(start, end - start);
    start = end + 1;
  }
  return last;
}

std::string Num(std::optional<double> v) {
  return v ? absl::StrFormat("%.3f", *v) : std::string("null");
}

}  // namespace

int BenchCommand(int argc, char** argv) {
  std::set<std::string> flags = ModelFlags();
  flags.insert({"help", "json", "mpi", "delta"});
  std::set<std::string> options = ModelOptions();
  options.insert({"iters", "transport", "emulate-nic", "verify", "timeout-ms", "dst-dtype",
                  "dst-quant", "change-fraction", "mtu"});
  auto parsed = Args::Parse(argc, argv, flags, options);
  if (!parsed.ok()) return UsageError("bench", std::string(parsed.status().message()));
  const Args& args = *parsed;
  if (args.Has("help")) {
    std::printf("%s%s%s", kHelpHead, kModelOptionsHelp, kHelpTail);
    return kExitOk;
  }
  auto iters = args.GetInt("iters", 5);
  auto timeout_ms = args.GetInt("timeout-ms", 120000);
  if (!iters.ok() || *iters < 1) return UsageError("bench", "--iters must be a positive integer");
  if (!timeout_ms.ok() || *timeout_ms < 1) {
    return UsageError("bench", "--timeout-ms must be a positive integer");
  }
  const std::string transport = args.Get("transport").value_or("sm");
  if (transport != "sm" && transport != "tcp") {
    return UsageError("bench", "--transport must be sm or tcp");
  }
  const std::string verify = args.Get("verify").value_or("ends");
  if (verify != "ends" && verify != "all" && verify != "none") {
    return UsageError("bench", "--verify must be ends, all or none");
  }
  const std::string rate = args.Get("emulate-nic").value_or("");
  if (!rate.empty()) {
    auto bits = launcher::ParseTcRate(rate);
    if (!bits.ok()) return UsageError("bench", std::string(bits.status().message()));
  }
  auto mtu = args.GetInt("mtu", launcher::kDefaultNetnsMtu);
  if (!mtu.ok() || *mtu < 1280 || *mtu > 65535) {
    return UsageError("bench", "--mtu must be a number of bytes between 1280 and 65535");
  }
  if (args.Get("mtu") && rate.empty()) return UsageError("bench", "--mtu needs --emulate-nic");
  const bool delta = args.Has("delta");
  auto change_fraction = args.GetDouble("change-fraction", -1);
  if (!change_fraction.ok() ||
      (args.Get("change-fraction") && !(*change_fraction >= 0 && *change_fraction <= 1))) {
    return UsageError("bench", "--change-fraction must be a number between 0 and 1");
  }

  // The spec: a file, or a model expanded with trainer and inference layouts.
  plan::RefitSpec spec;
  std::string title;
  if (args.positional().size() == 1) {
    if (args.Has("model")) return UsageError("bench", "give SPEC.json or --model, not both");
    auto loaded = plan::LoadSpecFile(args.positional()[0]);
    if (!loaded.ok()) return UsageError("bench", std::string(loaded.status().message()));
    spec = *std::move(loaded);
    title = args.positional()[0];
  } else if (args.positional().empty() && args.Has("model")) {
    auto made = ModelSpecFromArgs(args, ClusterDefault::kDomainPerInferenceTp);
    if (!made.ok()) return UsageError("bench", std::string(made.status().message()));
    spec = std::move(made->spec);
    title = absl::StrCat(*args.Get("model"), ": train ", *args.Get("train"), " -> infer ",
                         *args.Get("infer"), args.Has("per-expert") ? ", per-expert tensors" : "");
  } else {
    return UsageError("bench",
                      "needs SPEC.json or --model M.json --train P --infer P (see --help)");
  }
  // --dst-dtype: the spec's matrices land quantized (docs/quantization.md); the ranks then also
  // time the same spec with unquantized destinations, in the same run.
  if (auto fp8 = args.Get("dst-dtype")) {
    auto d = ParseFp8Option(*fp8, "dst-dtype");
    if (!d.ok()) return UsageError("bench", std::string(d.status().message()));
    plan::Quant quant{plan::QuantScheme::kBlock, {128, 128}};
    if (auto q = args.Get("dst-quant")) {
      auto parsed = ParseQuantOption(*q, "dst-quant");
      if (!parsed.ok()) return UsageError("bench", std::string(parsed.status().message()));
      quant = *parsed;
    }
    if (plan::QuantizeMatrices(*d, quant, spec) == 0) {
      return UsageError("bench", absl::StrCat("--dst-dtype: no tensor of the spec can be "
                                              "quantized (", spec.comment, ")"));
    }
    title += absl::StrCat(", ", *fp8, " destinations");
  } else if (args.Has("dst-quant")) {
    return UsageError("bench", "--dst-quant needs --dst-dtype");
  }
  bool quantized = false;
  for (const plan::TensorSpec& t : spec.tensors) quantized = quantized || t.quantized();
  auto shared = std::make_shared<const plan::RefitSpec>(spec);
  auto planned = plan::BuildPlan(shared);
  if (!planned.ok()) return UsageError("bench", std::string(planned.status().message()));
  const int world = planned->world_size();
  int64_t max_rank_bytes = 0;
  for (int r = 0; r < world; ++r) {
    int64_t sum = 0;
    for (int64_t b : planned->BufferBytes(r)) sum += b;
    max_rank_bytes = std::max(max_rank_bytes, sum);
  }
  int64_t total_bytes = planned->stats().bytes_dst_total;

  // The ranks read the spec from a file.
  char tmpl[] = "/tmp/reshard-bench-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) {
    std::fprintf(stderr, "reshard bench: cannot create a temporary file\n");
    return kExitFailed;
  }
  close(fd);
  const std::string spec_file = tmpl;
  {
    std::ofstream out(spec_file);
    out << plan::SpecToJson(spec);
  }

  const std::string rank_program = SelfDir() + "/reshard-bench-rank";
  if (!Executable(rank_program)) {
    std::remove(spec_file.c_str());
    std::fprintf(stderr, "reshard bench: %s is missing (build the reshard_bench_rank target)\n",
                 rank_program.c_str());
    return kExitFailed;
  }
  launcher::LaunchOptions lo;
  lo.argv = {rank_program,           "--spec",   spec_file, "--iters",
             std::to_string(*iters), "--verify", verify};
  if (delta) lo.argv.insert(lo.argv.end(), {"--delta", "1"});
  if (*change_fraction >= 0) {
    lo.argv.insert(lo.argv.end(), {"--change-fraction", absl::StrCat(*change_fraction)});
  }
  lo.world_size = world;
  lo.transport = transport;
  if (!rate.empty()) {
    lo.mode = launcher::Mode::kNetns;
    lo.rate = rate;
    lo.mtu = static_cast<int>(*mtu);
  }
  lo.rank_timeout_ms = *timeout_ms;
  lo.deadline = absl::Milliseconds(*timeout_ms) * 4 + absl::Minutes(2);
  lo.handle_signals = true;
  auto launched = launcher::Run(lo);
  if (!launched.ok()) {
    std::remove(spec_file.c_str());
    std::fprintf(stderr, "reshard bench: launch failed: %s\n",
                 std::string(launched.status().message()).c_str());
    return kExitFailed;
  }
  if (!launched->fallback_reason.empty()) {
    std::fprintf(stderr, "reshard bench: no emulated NICs (%s); ran on loopback tcp\n",
                 launched->fallback_reason.c_str());
  }

  // Per mode: per iteration, the slowest rank.
  std::vector<std::string> modes = {"ours", "naive", "gather_broadcast"};
  if (quantized) modes.push_back("unquantized");
  if (delta) modes.push_back("delta");
  std::map<std::string, std::vector<double>> slowest;
  std::map<std::string, int64_t> bytes_network, bytes_fanout;
  std::string transports, error;
  for (const launcher::RankResult& r : launched->ranks) {
    auto doc = json::Parse(r.json_line.empty() ? "{}" : r.json_line);
    const json::Value* ok = doc.ok() ? doc->Find("ok") : nullptr;
    if (!r.ok() || ok == nullptr || !ok->as_bool()) {
      const json::Value* e = doc.ok() ? doc->Find("error") : nullptr;
      if (error.empty()) {
        error = absl::StrCat("rank ", r.rank, " ", r.Describe(), ": ",
                             e != nullptr && e->is_string() ? e->as_string() : r.stderr_tail);
      }
      continue;
    }
    for (const std::string& mode : modes) {
      const json::Value* ms = doc->Find("ms") ? doc->Find("ms")->Find(mode) : nullptr;
      if (ms == nullptr || !ms->is_array()) continue;
      auto& s = slowest[mode];
      if (s.size() < ms->items().size()) s.resize(ms->items().size(), 0);
      for (size_t i = 0; i < ms->items().size(); ++i) {
        s[i] = std::max(s[i], ms->items()[i].as_double());
      }
      const json::Value* b =
          doc->Find("bytes_sent") ? doc->Find("bytes_sent")->Find(mode) : nullptr;
      if (b != nullptr) bytes_network[mode] += b->as_int();
      const json::Value* f =
          doc->Find("bytes_fanout") ? doc->Find("bytes_fanout")->Find(mode) : nullptr;
      if (f != nullptr) bytes_fanout[mode] += f->as_int();
    }
    if (r.rank == 0 || transports.empty()) {
      const json::Value* t = doc->Find("transports");
      if (t != nullptr && t->is_string() && !t->as_string().empty()) transports = t->as_string();
    }
  }

  // MPI reference.
  std::optional<double> mpi_ms, mpi_p90_ms;
  std::string mpi_note = "not requested (--mpi)";
  if (args.Has("mpi") && error.empty()) {
    const std::string mpi_program = SelfDir() + "/reshard-bench-mpi";
    auto mpirun = FindInPath("mpirun");
    if (!mpirun) {
      mpi_note = "mpirun not found (install Debian's openmpi-bin)";
    } else if (!Executable(mpi_program)) {
      mpi_note = "reshard-bench-mpi was not built (Open MPI headers missing at configure time)";
    } else {
      const std::string btl = transport == "tcp" || !rate.empty() ? "self,tcp" : "self,vader";
      auto [code, out] =
          Capture({*mpirun, "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(world),
                   "--mca", "pml", "ob1", "--mca", "btl", btl, mpi_program, "--spec", spec_file,
                   "--iters", std::to_string(*iters)});
      auto doc = json::Parse(LastJsonLine(out).empty() ? "{}" : LastJsonLine(out));
      const json::Value* v = doc.ok() ? doc->Find("mpi_ms") : nullptr;
      const json::Value* iter_ms = doc.ok() ? doc->Find("iter_ms") : nullptr;
      if (code == 0 && v != nullptr && v->is_number()) {
        // Median and p90 of the iterations, computed like the engine modes' when available.
        std::vector<double> samples;
        if (iter_ms != nullptr && iter_ms->is_array()) {
          for (const json::Value& x : iter_ms->items()) samples.push_back(x.as_double());
        }
        mpi_ms = samples.empty() ? v->as_double() : Median(samples);
        mpi_p90_ms = samples.empty() ? v->as_double() : NearestRankPercentile(samples, 90);
        mpi_note = absl::StrCat("MPI_Alltoallw, subarray types, btl ", btl);
      } else {
        const json::Value* u = doc.ok() ? doc->Find("unsupported") : nullptr;
        mpi_note = u != nullptr && u->is_string()
                       ? u->as_string()
                       : absl::StrCat("mpirun failed (exit ", code, "): ", LastJsonLine(out));
      }
    }
  }
  std::remove(spec_file.c_str());

  if (!error.empty()) {
    if (args.Has("json")) {
      std::printf("{\"ok\":false,\"error\":%s}\n", json::Quote(error).c_str());
    }
    std::fprintf(stderr, "reshard bench: %s\n", error.c_str());
    return kExitFailed;
  }
  const double ours = Median(slowest["ours"]);
  const double naive = Median(slowest["naive"]);
  const double gb = Median(slowest["gather_broadcast"]);
  auto p90 = [&](const std::string& mode) { return NearestRankPercentile(slowest[mode], 90); };
  auto ratio = [&](std::optional<double> v) -> std::optional<double> {
    if (!v || ours <= 0) return std::nullopt;
    return *v / ours;
  };
  const std::string net = rate.empty() ? absl::StrCat("loopback ", launched->ucx_tls)
                                       : (launched->fallback_reason.empty()
                                              ? absl::StrCat("emulated NIC ", rate,
                                                             " per rank, MTU ", *mtu)
                                              : "loopback tcp (no namespaces)");
  if (args.Has("json")) {
    std::string out = absl::StrCat(
        "{\"ok\":true,\"spec\":", json::Quote(title), ",\"world\":", world, ",\"iters\":", *iters,
        ",\"network\":", json::Quote(net), ",\"bytes_dst_total\":", total_bytes,
        ",\"ours_ms\":", Num(ours), ",\"gather_broadcast_ms\":", Num(gb),
        ",\"naive_p2p_ms\":", Num(naive), ",\"mpi_ms\":", Num(mpi_ms),
        ",\"ours_p90_ms\":", Num(p90("ours")),
        ",\"gather_broadcast_p90_ms\":", Num(p90("gather_broadcast")),
        ",\"naive_p2p_p90_ms\":", Num(p90("naive")), ",\"mpi_p90_ms\":", Num(mpi_p90_ms),
        ",\"gather_broadcast_over_ours\":", Num(ratio(gb)),
        ",\"naive_p2p_over_ours\":", Num(ratio(naive)), ",\"mpi_over_ours\":", Num(ratio(mpi_ms)),
        ",\"mpi_note\":", json::Quote(mpi_note), ",\"unquantized_ms\":",
        Num(quantized ? std::optional<double>(Median(slowest["unquantized"])) : std::nullopt),
        ",\"ours_over_unquantized\":",
        Num(quantized && Median(slowest["unquantized"]) > 0
                ? std::optional<double>(ours / Median(slowest["unquantized"]))
                : std::nullopt),
        ",\"change_fraction\":",
        Num(*change_fraction >= 0 ? std::optional<double>(*change_fraction) : std::nullopt),
        ",\"delta_ms\":",
        Num(delta ? std::optional<double>(Median(slowest["delta"])) : std::nullopt),
        ",\"delta_over_ours\":",
        Num(delta && ours > 0 ? std::optional<double>(Median(slowest["delta"]) / ours)
                              : std::nullopt),
        ",\"delta_bytes_over_ours\":",
        Num(delta && bytes_network["ours"] > 0
                ? std::optional<double>(static_cast<double>(bytes_network["delta"]) /
                                        static_cast<double>(bytes_network["ours"]))
                : std::nullopt),
        ",\"bytes_network\":{\"ours\":", bytes_network["ours"],
        ",\"delta\":", bytes_network["delta"], ",\"naive_p2p\":", bytes_network["naive"],
        ",\"gather_broadcast\":", bytes_network["gather_broadcast"],
        "},\"bytes_fanout\":{\"ours\":", bytes_fanout["ours"],
        ",\"naive_p2p\":", bytes_fanout["naive"],
        ",\"gather_broadcast\":", bytes_fanout["gather_broadcast"],
        "},\"transports\":", json::Quote(transports), ",\"iter_ms\":{");
    bool first = true;
    for (const std::string& mode : modes) {
      out +=
          absl::StrCat(first ? "" : ",", json::Quote(mode == "naive" ? "naive_p2p" : mode), ":[");
      for (size_t i = 0; i < slowest[mode].size(); ++i) {
        out += absl::StrFormat("%s%.3f", i ? "," : "", slowest[mode][i]);
      }
      out += "]";
      first = false;
    }
    out += "}}";
    std::printf("%s\n", out.c_str());
    return kExitOk;
  }
  std::printf("reshard bench: %s\n", title.c_str());
  std::printf(
      "  %d ranks, %s, %lld iterations interleaved, %s land in destinations per refit, "
      "largest rank holds %s\n",
      world, net.c_str(), static_cast<long long>(*iters),
      FormatBytes(static_cast<double>(total_bytes)).c_str(),
      FormatBytes(static_cast<double>(max_rank_bytes)).c_str());
  Table table({"mode", "median", "p90", "min", "max", "network", "fan-out", "vs ours"});
  auto row = [&](const std::string& name, const std::string& key) {
    const auto& v = slowest[key];
    table.AddRow({name, FormatSeconds(Median(v) / 1e3), FormatSeconds(p90(key) / 1e3),
                  FormatSeconds(*std::min_element(v.begin(), v.end()) / 1e3),
                  FormatSeconds(*std::max_element(v.begin(), v.end()) / 1e3),
                  FormatBytes(static_cast<double>(bytes_network[key])),
                  FormatBytes(static_cast<double>(bytes_fanout[key])),
                  absl::StrFormat("%.2fx", Median(v) / ours)});
  };
  row("ours", "ours");
  row("naive p2p", "naive");
  row("gather-broadcast", "gather_broadcast");
  if (quantized) row("ours, unquantized", "unquantized");
  if (delta) row("ours, delta", "delta");
  if (mpi_ms) {
    table.AddRow({"MPI_Alltoallw", FormatSeconds(*mpi_ms / 1e3), FormatSeconds(*mpi_p90_ms / 1e3),
                  "", "", "", "", absl::StrFormat("%.2fx", *mpi_ms / ours)});
  }
  std::printf("%s", table.Render().c_str());
  if (quantized) {
    std::printf("  quantized destinations: ours takes %.2fx the time of the same refit with "
                "unquantized destinations (%s)\n",
                ours / Median(slowest["unquantized"]), spec.comment.c_str());
  }
  if (delta) {
    std::printf(
        "  delta refits%s: %.3fx ours' network bytes (last iteration), %.3fx its median "
        "time\n",
        *change_fraction >= 0 ? absl::StrCat(", change fraction ", *change_fraction).c_str()
                              : ", every element changing",
        bytes_network["ours"] > 0 ? static_cast<double>(bytes_network["delta"]) /
                                        static_cast<double>(bytes_network["ours"])
                                  : 0.0,
        ours > 0 ? Median(slowest["delta"]) / ours : 0.0);
  }
  std::printf("  MPI: %s\n  transports (ours): %s\n", mpi_note.c_str(),
              transports.empty() ? "(no network peer: everything moved inside domains)"
                                 : transports.c_str());
  return kExitOk;
}

}  // namespace reshard::cli
