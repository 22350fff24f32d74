// plan_bench: plans a synthetic whole-model refit spec and prints how long planning takes and
// how much memory it needs. A program, not a test: it prints figures and never fails on speed.
//
// The model is DeepSeek-like (per-expert weight tensors dominate the tensor count) between two
// 128-rank meshes: trainers 0..127 as [dp=16, tp=8] (tp fastest), inference 128..255 as
// [dp=16, tp=8] numbered tp-major (a different rank order), NVL8 domains. Per layer:
//   - replicated norms (R,R -> R,R) and a replicated fp32 router;
//   - column-parallel projections, S(0) over tp -> S(0) over tp;
//   - row-parallel projections on trainers, column-parallel in inference (S(1) -> S(0));
//   - 64 routed experts as separate tensors (gate/up column, down row), each held by one trainer
//     tp group (EP over dp) and replicated over dp in inference;
//   - every tenth layer, 3-D expert stacks [E=160, out, in]: experts over dp (tp replicas) on
//     trainers, out (w13) or in (w2) over tp in inference;
//   - vocab-parallel embedding and lm_head with an uneven vocabulary of 151,937 rows.
//
// usage: plan_bench [--tensors N] [--repeats K] [--point-to-point]
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/cpu_time.h"
#include "bench/synthetic_spec.h"
#include "src/plan/plan.h"

namespace reshard::plan {
namespace {

using bench::CpuSeconds;

int64_t PeakRssKiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;  // KiB on Linux.
}

int Main(int argc, char** argv) {
  size_t tensors = 50000;
  int repeats = 3;
  PlanOptions options;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tensors") == 0 && i + 1 < argc) {
      tensors = std::strtoull(argv[++i], nullptr, 10);
    } else if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--point-to-point") == 0) {
      options.schedule = PlanOptions::Schedule::kPointToPoint;
    } else {
      std::fprintf(stderr,
                   "usage: plan_bench [--tensors N] [--repeats K] [--point-to-point]\n"
                   "Plans a synthetic whole-model spec (N tensors, default 50000) between two "
                   "128-rank meshes\nK times (default 3) on one thread and prints the median "
                   "planning time and peak memory.\n--point-to-point plans the naive baseline "
                   "instead of the domain-aware schedule.\n");
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  const auto build_start = std::chrono::steady_clock::now();
  auto spec = std::make_shared<const RefitSpec>(bench::SyntheticSpec(tensors));
  const double build_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - build_start).count();
  const int64_t rss_spec = PeakRssKiB();

  std::vector<double> seconds, cpu_seconds;
  PlanStats stats;
  size_t transfers = 0;
  uint64_t fingerprint = 0;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = CpuSeconds();
    auto plan = BuildPlan(spec, options);
    cpu_seconds.push_back(CpuSeconds() - cpu_start);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!plan.ok()) {
      std::fprintf(stderr, "plan_bench: %s\n", std::string(plan.status().message()).c_str());
      return 1;
    }
    if (i > 0 && plan->fingerprint() != fingerprint) {
      std::fprintf(stderr, "plan_bench: the plan is not deterministic across runs\n");
      return 1;
    }
    stats = plan->stats();
    transfers = plan->transfers().size();
    fingerprint = plan->fingerprint();
  }
  std::sort(seconds.begin(), seconds.end());
  std::sort(cpu_seconds.begin(), cpu_seconds.end());
  const double median = seconds[seconds.size() / 2];
  const double cpu_median = cpu_seconds[cpu_seconds.size() / 2];
  const int64_t rss = PeakRssKiB();

  std::printf("plan_bench: synthetic model, trainers [dp=16, tp=8] ranks 0..127 -> inference "
              "[dp=16, tp=8] ranks 128..255, NVL8 domains, %s schedule\n",
              options.schedule == PlanOptions::Schedule::kPointToPoint ? "point-to-point"
                                                                       : "domain-aware");
  std::printf("tensors          %lld\n", static_cast<long long>(stats.tensors));
  std::printf("pieces           %lld (transfers %zu)\n", static_cast<long long>(stats.pieces),
              transfers);
  std::printf("regions          %lld\n", static_cast<long long>(stats.regions));
  std::printf("runs             %lld\n", static_cast<long long>(stats.runs));
  std::printf("bytes            %.1f GiB land in destinations, %.1f GiB over the network\n",
              stats.bytes_dst_total / double(1 << 30), stats.bytes_network / double(1 << 30));
  std::printf("spec build       %.3f s (not timed below)\n", build_seconds);
  std::printf("plan seconds     %.3f median of %d (min %.3f, max %.3f), one thread\n", median,
              repeats, seconds.front(), seconds.back());
  std::printf("plan CPU seconds %.3f median of %d (min %.3f, max %.3f)\n", cpu_median, repeats,
              cpu_seconds.front(), cpu_seconds.back());
  std::printf("pieces/s         %.3g (per CPU second %.3g)\n", stats.pieces / median,
              stats.pieces / cpu_median);
  std::printf("peak RSS         %.1f MiB (%.1f MiB after building the spec)\n", rss / 1024.0,
              rss_spec / 1024.0);
  std::printf("fingerprint      %016llx\n", static_cast<unsigned long long>(fingerprint));
  std::printf("targets          plan < 1 s: %s (CPU %s); peak < 1 GiB: %s\n",
              median < 1.0 ? "met" : "MISSED", cpu_median < 1.0 ? "met" : "MISSED",
              rss < (1 << 20) ? "met" : "MISSED");
  return 0;
}

}  // namespace
}  // namespace reshard::plan

int main(int argc, char** argv) { return reshard::plan::Main(argc, argv); }
