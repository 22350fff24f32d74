// fault_bench: how long survivors take to notice each kind of fault, per transport (the table of
// docs/reliability.md). Each trial launches the ranks of tests/api/fault_peer.cc, injects one
// fault (the library's RESHARD_FAULT_INJECT hook, or from outside) and measures, on the wall
// clock all processes share, the time from the fault to the moment the last survivor's call
// returned its error. Prints figures; never fails on speed.
//
//   fault_bench [--trials N] [--transports sm,tcp] [--deadline-ms D] [--only TEXT] [--json]
//               [--verbose]   (each survivor's error, per trial, on stderr; errors of any
//                              other code than Unavailable / DeadlineExceeded always are)
//
// Faults (rank 1 of 2, or of 3 for fan-out; refit 3, after two verified refits):
//   killed between refits   SIGKILL as it starts refit 3 (hook between:kill)
//   killed mid-refit        SIGKILL after its first put of refit 3 (hook puts:kill)
//   killed in fan-out       SIGKILL as it forwards a piece to its domain peer (hook fanout:kill)
//   killed in set-up        SIGKILL during wire-up (hook setup:kill; set-up timeout 5 s)
//   stopped mid-refit       SIGSTOP after its first put (hook puts:stop): the deadline D
//   store killed            the store's process SIGKILLed; the next RefitHandle::Barrier fails
//   link down (netns)       `ip link set veth0 down` in rank 1's namespace mid-refit (tcp,
//                           root only): the deadline D
// The load average is printed first: figures from a loaded machine say little.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "tests/api/fault_harness.h"

namespace {

using reshard::fault::Outcome;
using reshard::fault::Scenario;

struct Fault {
  std::string name;
  bool netns = false;  // tcp across namespaces only.
  std::function<Scenario(const std::string& transport, int64_t deadline_ms)> make;
};

Scenario Base(const std::string& transport, int64_t deadline_ms) {
  Scenario s;
  s.transport = transport;
  s.peer_args = {"--steps", "1000", "--deadline-ms", std::to_string(deadline_ms)};
  return s;
}

Scenario Hook(const std::string& transport, const std::string& inject, int64_t deadline_ms,
              const std::string& spec = "pair") {
  Scenario s = Base(transport, deadline_ms);
  s.inject = inject;
  s.spec = spec;
  s.world_size = spec == "fanout" ? 3 : 2;
  return s;
}

std::vector<Fault> Faults() {
  const int64_t kLong = 30000;  // Losses must be detected, not timed out.
  return {
      {"killed between refits", false,
       [=](const std::string& t, int64_t) { return Hook(t, "between:kill:1:3", kLong); }},
      {"killed mid-refit", false,
       [=](const std::string& t, int64_t) { return Hook(t, "puts:kill:1:3", kLong); }},
      {"killed in fan-out", false,
       [=](const std::string& t, int64_t) { return Hook(t, "fanout:kill:1:3", kLong, "fanout"); }},
      {"killed in set-up", false,
       [=](const std::string& t, int64_t) {
         Scenario s = Hook(t, "setup:kill:1", kLong);
         s.peer_args.insert(s.peer_args.end(), {"--setup-timeout-ms", "5000"});
         return s;
       }},
      {"stopped mid-refit", false,
       [](const std::string& t, int64_t d) { return Hook(t, "puts:stop:1:3", d); }},
      {"store killed", false,
       [=](const std::string& t, int64_t) {
         Scenario s = Base(t, kLong);
         s.faulted_rank = -1;
         s.external = Scenario::External::kKillStore;
         s.go_after_store_kill = true;
         s.peer_args.push_back("--barrier");
         return s;
       }},
      {"link down (netns)", true,
       [](const std::string&, int64_t d) {
         Scenario s = Base("tcp", d);
         s.mode = reshard::launcher::Mode::kNetns;
         s.external = Scenario::External::kLinkDown;
         return s;
       }},
  };
}

struct Row {
  std::string fault, transport;
  std::vector<double> seconds;  // Per trial: the last survivor's detection.
  int missed = 0;               // Trials where a survivor reported nothing.
  std::map<std::string, int> codes;
};

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

}  // namespace

int main(int argc, char** argv) {
  int trials = 5;
  int64_t deadline_ms = 1000;
  std::vector<std::string> transports = {"sm", "tcp"};
  std::string only;
  bool json = false, verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--trials") {
      trials = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--deadline-ms") {
      deadline_ms = std::max<int64_t>(1, std::atoll(value().c_str()));
    } else if (a == "--transports") {
      transports = absl::StrSplit(value(), ',', absl::SkipEmpty());
    } else if (a == "--only") {
      only = value();
    } else if (a == "--json") {
      json = true;
    } else if (a == "--verbose") {
      verbose = true;
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: fault_bench [--trials N] [--transports sm,tcp] [--deadline-ms D] [--only TEXT] "
          "[--json] [--verbose]\nMeasures how long surviving ranks take to notice each fault (see "
          "docs/reliability.md).\n");
      return 0;
    } else {
      std::fprintf(stderr, "fault_bench: unknown argument %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  const std::string load = LoadAverage();
  if (!json) {
    std::printf("load average before: %s; %d trial(s) each; deadline for stalls %lld ms\n",
                load.c_str(), trials, static_cast<long long>(deadline_ms));
  }
  std::vector<Row> rows;
  for (const Fault& fault : Faults()) {
    if (!only.empty() && !absl::StrContains(fault.name, only)) continue;
    for (const std::string& transport : transports) {
      if (fault.netns && transport != "tcp") continue;
      if (fault.netns && !reshard::launcher::CanUseNetns()) {
        std::fprintf(stderr, "fault_bench: %s needs root; skipped\n", fault.name.c_str());
        continue;
      }
      Row row;
      row.fault = fault.name;
      row.transport = transport;
      for (int t = 0; t < trials; ++t) {
        absl::StatusOr<Outcome> o = reshard::fault::RunScenario(fault.make(transport, deadline_ms));
        if (!o.ok()) {
          std::fprintf(stderr, "fault_bench: %s over %s: %s\n", fault.name.c_str(),
                       transport.c_str(), o.status().ToString().c_str());
          return 1;
        }
        const int faulted = fault.make(transport, deadline_ms).faulted_rank;
        double worst = -1;
        bool missed = o->fault_at_ns < 0;
        for (size_t r = 0; r < o->ranks.size(); ++r) {
          if (static_cast<int>(r) == faulted) continue;
          const double d = o->DetectionSeconds(static_cast<int>(r));
          if (d < 0) {
            missed = true;
            continue;
          }
          worst = std::max(worst, d);
          const reshard::fault::Failure& f = o->ranks[r].failures.front();
          row.codes[f.code]++;
          if (verbose || (f.code != "UNAVAILABLE" && f.code != "DEADLINE_EXCEEDED")) {
            std::fprintf(stderr, "%s over %s, trial %d: rank %zu after %.3f s: %s: %s\n",
                         fault.name.c_str(), transport.c_str(), t + 1, r, d, f.code.c_str(),
                         f.message.c_str());
          }
        }
        if (missed) {
          ++row.missed;
          std::fprintf(stderr, "fault_bench: %s over %s, trial %d: a survivor reported nothing\n%s",
                       fault.name.c_str(), transport.c_str(), t + 1, o->Describe().c_str());
        } else {
          row.seconds.push_back(worst);
        }
      }
      rows.push_back(std::move(row));
      if (!json) {
        const Row& r = rows.back();
        std::string codes;
        for (const auto& [code, n] : r.codes) {
          absl::StrAppend(&codes, codes.empty() ? "" : ", ", code, " x", n);
        }
        if (r.missed) absl::StrAppend(&codes, " (", r.missed, " trial(s) missed)");
        const double max =
            r.seconds.empty() ? -1.0 : *std::max_element(r.seconds.begin(), r.seconds.end());
        std::printf("%-24s %-4s trials %2zu  median %7.3f s  max %7.3f s  %s\n", r.fault.c_str(),
                    r.transport.c_str(), r.seconds.size(), Median(r.seconds), max, codes.c_str());
        std::fflush(stdout);
      }
    }
  }
  if (json) {
    std::string out = absl::StrCat("{\"load_average\":\"", load, "\",\"trials\":", trials,
                                   ",\"deadline_ms\":", deadline_ms, ",\"rows\":[");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      absl::StrAppendFormat(
          &out,
          "%s{\"fault\":\"%s\",\"transport\":\"%s\",\"median_s\":%.4f,"
          "\"max_s\":%.4f,\"missed\":%d}",
          i ? "," : "", r.fault, r.transport, Median(r.seconds),
          r.seconds.empty() ? -1.0 : *std::max_element(r.seconds.begin(), r.seconds.end()),
          r.missed);
    }
    std::printf("%s]}\n", out.c_str());
  }
  return 0;
}
