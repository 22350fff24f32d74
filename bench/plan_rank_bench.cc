// plan_rank_bench: how long one rank's set-up planning takes and how much memory it needs
// (BuildRankPlan), for a sample of ranks, each planned in its own forked process so that ranks
// do not share allocator state or peak memory. Prints a row per rank and the slowest rank and
// the largest peak. A program, not a test: it prints figures and never fails on speed.
//
// Columns: wall and CPU seconds of BuildRankPlan (validation included; validate_cpu is
// ValidateForRank() alone, Validate() for the world), the child's peak RSS (VmHWM, the spec it inherited included) and how much
// planning added to it.
//
// usage: plan_rank_bench [SPEC SOURCE] [--ranks R,R,...|all] [--sample K] [--world]
//   SPEC SOURCE: --synthetic N (default: plan_bench's 50,000-tensor synthetic model)
//              | --mixed N (2-D sharded, replicated and mixed layouts, bench/synthetic_spec.h)
//              | --spec FILE.json
//              | --model M.json --cluster C.json --train P --infer P [--per-expert]
//   --sample K   K ranks evenly spread over the world plus the last rank (default 8)
//   --ranks      exactly these ranks, or every rank
//   --world      also plan the whole world once (BuildPlan) in its own process, for comparison
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/cpu_time.h"
#include "bench/synthetic_spec.h"
#include "src/plan/cluster.h"
#include "src/plan/layouts.h"
#include "src/plan/model.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"

namespace reshard::plan {
namespace {

using bench::CpuSeconds;

// A field of /proc/self/status in KiB ("VmHWM", "VmRSS"), or -1.
int64_t ProcStatusKiB(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::strtoll(line.c_str() + n + 1, nullptr, 10);
    }
  }
  return -1;
}

struct Sample {
  int32_t rank = -1;  // -1: the world plan.
  int ok = 0;
  double seconds = 0, cpu_seconds = 0;
  double validate_cpu_seconds = 0;  // Validate() alone, part of cpu_seconds.
  int64_t rss_before_kib = 0, peak_kib = 0;
  int64_t transfers = 0, regions = 0;
  uint64_t fingerprint = 0;
};

// Plans `rank` (or the world for -1) in a forked child and returns what it measured.
Sample PlanInChild(const std::shared_ptr<const RefitSpec>& spec, int32_t rank) {
  Sample s;
  s.rank = rank;
  int fds[2];
  if (pipe(fds) != 0) return s;
  const pid_t pid = fork();
  if (pid < 0) return s;
  if (pid == 0) {
    close(fds[0]);
    Sample m;
    m.rank = rank;
    m.rss_before_kib = ProcStatusKiB("VmRSS");
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = CpuSeconds();
    absl::StatusOr<Plan> plan = rank < 0 ? BuildPlan(spec) : BuildRankPlan(spec, rank);
    m.cpu_seconds = CpuSeconds() - cpu_start;
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    m.peak_kib = ProcStatusKiB("VmHWM");
    // Validation is part of planning (BuildPlan and BuildRankPlan validate first); timed again
    // on its own, after the peak was read, to tell it from the schedule's pass.
    const double validate_start = CpuSeconds();
    const bool valid = (rank < 0 ? Validate(*spec) : ValidateForRank(*spec, rank)).ok();
    m.validate_cpu_seconds = CpuSeconds() - validate_start;
    if (plan.ok() && valid) {
      m.ok = 1;
      m.transfers = static_cast<int64_t>(plan->transfers().size());
      m.regions = static_cast<int64_t>(plan->num_regions());
      m.fingerprint = plan->fingerprint();
    } else {
      std::fprintf(stderr, "plan_rank_bench: rank %d: %s\n", rank,
                   std::string(plan.status().message()).c_str());
    }
    const ssize_t w = write(fds[1], &m, sizeof(m));
    _exit(w == static_cast<ssize_t>(sizeof(m)) ? 0 : 1);
  }
  close(fds[1]);
  Sample got;
  const ssize_t r = read(fds[0], &got, sizeof(got));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (r == static_cast<ssize_t>(sizeof(got)) && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    return got;
  }
  return s;
}

int Usage(bool help) {
  std::fprintf(help ? stdout : stderr,
               "usage: plan_rank_bench [--synthetic N | --mixed N | --spec FILE.json | --model M.json "
               "--cluster C.json --train P --infer P [--per-expert]]\n"
               "                       [--ranks R,R,...|all] [--sample K] [--world]\n"
               "Plans single ranks' shares of a spec (BuildRankPlan), each in a forked process, "
               "and prints\neach rank's planning time and peak RSS, then the slowest rank and the "
               "largest peak.\nDefault spec: plan_bench's synthetic 50,000-tensor model; default "
               "sample: 8 ranks spread\nover the world and the last one. --world also plans the "
               "whole world once for comparison.\n");
  return help ? 0 : 2;
}

int Main(int argc, char** argv) {
  size_t synthetic = 50000, mixed = 0;
  std::string spec_path, model, cluster_path, train_text, infer_text, ranks_text;
  int sample = 8;
  bool world = false, per_expert = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--help") return Usage(true);
    if (a == "--world" || a == "--per-expert") {
      (a == "--world" ? world : per_expert) = true;
      continue;
    }
    if ((v = value()) == nullptr) return Usage(false);
    if (a == "--synthetic") {
      synthetic = std::strtoull(v, nullptr, 10);
    } else if (a == "--mixed") {
      mixed = std::strtoull(v, nullptr, 10);
    } else if (a == "--spec") {
      spec_path = v;
    } else if (a == "--model") {
      model = v;
    } else if (a == "--cluster") {
      cluster_path = v;
    } else if (a == "--train") {
      train_text = v;
    } else if (a == "--infer") {
      infer_text = v;
    } else if (a == "--ranks") {
      ranks_text = v;
    } else if (a == "--sample") {
      sample = std::max(1, std::atoi(v));
    } else {
      return Usage(false);
    }
  }

  std::string source;
  absl::StatusOr<RefitSpec> loaded;
  if (!spec_path.empty()) {
    loaded = LoadSpecFile(spec_path);
    source = spec_path;
  } else if (!model.empty()) {
    auto cfg = LoadModelConfig(model);
    auto cluster = LoadClusterFile(cluster_path);
    auto train = ParseTrainParallelism(train_text);
    auto infer = ParseInferParallelism(infer_text);
    for (const absl::Status& st : {cfg.status(), cluster.status(), train.status(), infer.status()}) {
      if (!st.ok()) {
        std::fprintf(stderr, "plan_rank_bench: %s\n", std::string(st.message()).c_str());
        return 2;
      }
    }
    ModelSpecOptions opts;
    if (per_expert) opts.experts = ExpertTensors::kPerExpert;
    loaded = MakeModelSpec(*cfg, *train, *infer, *cluster, opts);
    source = model + " on " + cluster_path + ", train " + train_text + " -> infer " + infer_text +
             (per_expert ? ", one tensor per expert matrix" : ", experts stacked");
  } else if (mixed > 0) {
    loaded = bench::MixedSpec(mixed);
    source = "mixed synthetic spec, " + std::to_string(mixed) + " tensors";
  } else {
    loaded = bench::SyntheticSpec(synthetic);
    source = "synthetic model (plan_bench), " + std::to_string(synthetic) + " tensors";
  }
  if (!loaded.ok()) {
    std::fprintf(stderr, "plan_rank_bench: %s\n", std::string(loaded.status().message()).c_str());
    return 2;
  }
  auto spec = std::make_shared<const RefitSpec>(*std::move(loaded));
  const int32_t world_size = spec->WorldSize();

  std::vector<int32_t> ranks;
  if (ranks_text == "all") {
    for (int32_t r = 0; r < world_size; ++r) ranks.push_back(r);
  } else if (!ranks_text.empty()) {
    for (absl::string_view part : absl::StrSplit(ranks_text, ',')) {
      int32_t r = 0;
      if (!absl::SimpleAtoi(part, &r) || r < 0 || r >= world_size) {
        std::fprintf(stderr, "plan_rank_bench: --ranks: \"%s\" is not a rank of the %d-rank world\n",
                     std::string(part).c_str(), world_size);
        return 2;
      }
      ranks.push_back(r);
    }
  } else {
    std::set<int32_t> picked;
    for (int k = 0; k < sample; ++k) {
      picked.insert(static_cast<int32_t>(static_cast<int64_t>(k) * world_size / sample));
    }
    picked.insert(world_size - 1);
    ranks.assign(picked.begin(), picked.end());
  }

  std::printf("plan_rank_bench: %s\n", source.c_str());
  std::printf("%zu tensors, %d ranks, %zu ranks sampled, each planned in its own process\n",
              spec->tensors.size(), world_size, ranks.size());
  std::printf("%8s %10s %10s %10s %10s %12s %12s %12s\n", "rank", "transfers", "regions",
              "seconds", "cpu_s", "validate_cpu", "peak_MiB", "+plan_MiB");
  auto row = [](const Sample& s) {
    if (!s.ok) {
      std::printf("%8d failed\n", s.rank);
      return;
    }
    std::printf("%8s %10lld %10lld %10.3f %10.3f %12.3f %12.1f %12.1f\n",
                s.rank < 0 ? "world" : std::to_string(s.rank).c_str(),
                static_cast<long long>(s.transfers), static_cast<long long>(s.regions), s.seconds,
                s.cpu_seconds, s.validate_cpu_seconds, s.peak_kib / 1024.0,
                (s.peak_kib - s.rss_before_kib) / 1024.0);
    std::fflush(stdout);
  };
  std::optional<Sample> slowest, largest;
  std::optional<uint64_t> fingerprint;
  bool agree = true, failed = false;
  for (int32_t r : ranks) {
    const Sample s = PlanInChild(spec, r);
    row(s);
    if (!s.ok) {
      failed = true;
      continue;
    }
    if (fingerprint && *fingerprint != s.fingerprint) agree = false;
    fingerprint = s.fingerprint;
    if (!slowest || s.cpu_seconds > slowest->cpu_seconds) slowest = s;
    if (!largest || s.peak_kib > largest->peak_kib) largest = s;
  }
  if (world) {
    const Sample s = PlanInChild(spec, -1);
    row(s);
    if (!s.ok) failed = true;
    if (s.ok && fingerprint && *fingerprint != s.fingerprint) agree = false;
  }
  if (!slowest) return 1;
  std::printf("slowest rank     %d: %.3f s (CPU %.3f s, of it %.3f s validating the spec)\n",
              slowest->rank, slowest->seconds, slowest->cpu_seconds,
              slowest->validate_cpu_seconds);
  std::printf("largest peak RSS rank %d: %.1f MiB (%.1f MiB of it before planning: the spec)\n",
              largest->rank, largest->peak_kib / 1024.0, largest->rss_before_kib / 1024.0);
  std::printf("fingerprints     %s\n", agree ? "equal on every rank planned" : "DIFFER");
  // CPU time decides: on a loaded machine a rank's wall time includes waiting for a core.
  std::printf("targets          < 1 s CPU per rank: %s; < 512 MiB per rank: %s\n",
              slowest->cpu_seconds < 1.0 ? "met" : "MISSED",
              largest->peak_kib < 512 * 1024 ? "met" : "MISSED");
  return failed || !agree ? 1 : 0;
}

}  // namespace
}  // namespace reshard::plan

int main(int argc, char** argv) { return reshard::plan::Main(argc, argv); }
