// reshard-rank: one process of a multi-process refit, started by `reshard run` / the launcher.
//
//   reshard-rank SPEC.json --iters N [--plan-mode ours|naive|gather_broadcast]
//                [--fanout auto|engine] [--delta] [--change-fraction F] [--memory host|cuda]
//
// Environment: RESHARD_RANK, RESHARD_WORLD_SIZE, RESHARD_STORE=host:port, RESHARD_STORE_TOKEN,
// RESHARD_TIMEOUT_MS (default 30000), RESHARD_EMULATED_NIC_RATE (informational), UCX_TLS and
// UCX_NET_DEVICES. Prints exactly one line of JSON on stdout (see rank.h); logs go to stderr.
// Exit status: 0 every refit verified, 1 a refit failed, 2 invalid input or usage.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tools/reshard/args.h"
#include "tools/reshard/commands.h"
#include "tools/reshard/rank.h"

namespace {

int Finish(const reshard::cli::RankReport& report) {
  std::printf("%s\n", reshard::cli::RankReportJson(report).c_str());
  std::fflush(stdout);
  if (!report.ok) {
    std::fprintf(stderr, "reshard-rank %d: %s\n", report.rank, report.error.c_str());
  }
  if (report.ok) return reshard::cli::kExitOk;
  return report.invalid_input ? reshard::cli::kExitUsage : reshard::cli::kExitFailed;
}

bool EnvInt(const char* name, int64_t fallback, int64_t& out, std::string& error) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    if (fallback < 0) {
      error = absl::StrCat(name, " is not set");
      return false;
    }
    out = fallback;
    return true;
  }
  if (!absl::SimpleAtoi(v, &out)) {
    error = absl::StrCat(name, "=\"", v, "\" is not an integer");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // stdout carries exactly one JSON line: UCX's own messages (warnings at teardown after a peer
  // was lost, for example) go to stderr unless the user chose a destination.
  setenv("UCX_LOG_FILE", "stderr", /*overwrite=*/0);
  reshard::cli::RankReport report;
  auto usage = [&](const std::string& message) {
    report.ok = false;
    report.invalid_input = true;
    report.error = message;
    return Finish(report);
  };
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf(
          "usage: reshard-rank SPEC.json --iters N [--plan-mode ours|naive|gather_broadcast]\n"
          "                    [--fanout auto|engine] [--delta] [--change-fraction F|random]\n"
          "                    [--fail-every K] [--memory host|cuda]\n"
          "One rank of a refit run; normally started by `reshard run`. Reads RESHARD_RANK,\n"
          "RESHARD_WORLD_SIZE, RESHARD_STORE, RESHARD_STORE_TOKEN, RESHARD_TIMEOUT_MS.\n");
      return reshard::cli::kExitOk;
    }
  }
  absl::StatusOr<reshard::cli::Args> args = reshard::cli::Args::Parse(
      argc - 1, argv + 1, {"delta"},
      {"iters", "plan-mode", "fanout", "change-fraction", "fail-every", "memory"});
  if (!args.ok()) return usage(std::string(args.status().message()));
  if (args->positional().size() != 1) return usage("expected exactly one SPEC.json argument");

  reshard::cli::RankOptions options;
  options.spec_path = args->positional()[0];
  absl::StatusOr<int64_t> iters = args->GetInt("iters", 1);
  if (!iters.ok()) return usage(std::string(iters.status().message()));
  if (*iters < 1) return usage("--iters must be at least 1");
  options.iters = static_cast<int>(*iters);
  options.plan_mode = args->Get("plan-mode").value_or("ours");
  options.fanout = args->Get("fanout").value_or("auto");
  options.delta = args->Has("delta");
  options.memory = args->Get("memory").value_or("host");
  options.random_fraction = args->Get("change-fraction").value_or("") == "random";
  absl::StatusOr<double> fraction =
      options.random_fraction ? absl::StatusOr<double>(-1) : args->GetDouble("change-fraction", -1);
  if (!fraction.ok()) return usage(std::string(fraction.status().message()));
  if (args->Get("change-fraction") && !options.random_fraction &&
      !(*fraction >= 0 && *fraction <= 1)) {
    return usage("--change-fraction must be between 0 and 1, or random");
  }
  options.change_fraction = *fraction;
  absl::StatusOr<int64_t> fail_every = args->GetInt("fail-every", 0);
  if (!fail_every.ok() || *fail_every < 0 || *fail_every == 1 || *fail_every > 1000000) {
    return usage("--fail-every must be 0 (never) or 2..1000000");
  }
  options.fail_every = static_cast<int>(*fail_every);

  // Checked here too so a bad variable is a usage error (exit 2) with this program's wording.
  int64_t rank = 0, world = 0, timeout_ms = 0;
  std::string error;
  if (!EnvInt("RESHARD_RANK", -1, rank, error) || !EnvInt("RESHARD_WORLD_SIZE", -1, world, error) ||
      !EnvInt("RESHARD_TIMEOUT_MS", 30000, timeout_ms, error)) {
    return usage(error);
  }
  report.rank = static_cast<int32_t>(rank);
  if (timeout_ms <= 0) return usage("RESHARD_TIMEOUT_MS must be positive");
  options.timeout = absl::Milliseconds(timeout_ms);

  absl::StatusOr<reshard::Communicator> comm = reshard::Communicator::FromEnvironment();
  if (!comm.ok()) {
    report.ok = false;
    report.invalid_input = comm.status().code() == absl::StatusCode::kInvalidArgument;
    report.error = std::string(comm.status().message());
    return Finish(report);
  }
  // The report is printed once the communicator (and its UCX worker) is gone.
  report = reshard::cli::RunRank(options, *comm);
  comm = absl::UnavailableError("released");
  return Finish(report);
}
