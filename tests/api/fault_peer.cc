// One rank of the fault-injection suite and bench (tests/api/fault_harness.h), on the public API
// only; identity from the launcher's environment. Faults come from outside (the harness kills,
// stops or cuts a rank, or kills the store) or from the library's test hook
// RESHARD_FAULT_INJECT (src/common/fault.h, docs/reliability.md).
//
//   fault_peer --spec pair|fanout|star [--steps N] [--deadline-ms D] [--first-deadline-ms F]
//              [--setup-timeout-ms S] [--barrier] [--reset] [--events DIR] [--go-file PATH]
//     pair    2 ranks, a 1024x1024 int32 matrix rows -> columns: each rank sends a 1 MiB piece
//             to the other (packed: one put, or four 256 KiB data messages) and copies one
//             locally, so every rank is a source and a destination of the other;
//     fanout  3 ranks, a 512x512 int32 matrix on rank 0 replicated to ranks 1 and 2, one domain
//             {1, 2}: it crosses the network once and the fan-out layer copies it inside the
//             domain;
//     star    3 ranks, a 1024x512 int32 matrix whose row halves on ranks 0 and 2 both go to
//             rank 1: ranks 0 and 2 are peers of rank 1 only, not of each other.
//   Each step fills the sources with a pattern of the step, poisons the destinations, runs
//   Execute(now + D) (now + F for the first refit; default D) and verifies every destination
//   element; --barrier adds
//   RefitHandle::Barrier after each refit. Without --reset the first failure ends the program
//   (exit 1); with --reset the rank calls Reset() and goes on (exit 0 when the last step
//   verified). A refit that returned OK with a wrong element prints WRONG and exits 3.
//   --events DIR: writes DIR/ready.<rank> once step 1 verified and DIR/failed.<rank> at the
//   first failure, for a harness that acts on them. --go-file PATH: after step 1, waits until
//   PATH exists before going on.
//   stdout, one line each (flushed; `at` is the wall clock in ns since the Unix epoch):
//     SETUP OK | SETUP FAIL code=<CODE> at=<ns> msg=<message>
//     STEP <n> OK ms=<ms> | STEP <n> FAIL code=<CODE> at=<ns> msg=<message>
//     BARRIER <n> FAIL code=<CODE> at=<ns> msg=<message>
//     WRONG step=<n> index=<i> got=<v> want=<w>
//     DONE ok=<steps verified> failed=<failures>
//     END at=<ns>      (after the handle and the communicator were destroyed)
//
//   fault_peer --serve-store TOKEN
//     Serves a reshard store on 127.0.0.1 (any free port), prints "STORE <port>" and serves
//     until killed (the harness kills it to take the store away mid-job).
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "reshard/launch.h"
#include "reshard/reshard.h"

namespace {

struct Args {
  std::string spec = "pair";
  int steps = 3;
  int64_t deadline_ms = 10000;
  int64_t first_deadline_ms = -1;  // -1: deadline_ms.
  int64_t setup_timeout_ms = 20000;
  bool barrier = false;
  bool reset = false;
  std::string events;
  std::string go_file;
  std::string serve_store_token;
};

uint32_t Pattern(int step, int64_t index) {
  return static_cast<uint32_t>(step) * 0x9E3779B1u + static_cast<uint32_t>(index) * 7u + 1u;
}
constexpr uint32_t kPoison = 0xDEADBEEFu;

std::string OneLine(absl::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

void Report(const std::string& what, const absl::Status& st) {
  std::printf(
      "%s FAIL code=%s at=%lld msg=%s\n", what.c_str(), absl::StatusCodeToString(st.code()).c_str(),
      static_cast<long long>(absl::ToUnixNanos(absl::Now())), OneLine(st.message()).c_str());
  std::fflush(stdout);
}

void Touch(const std::string& path) {
  const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd >= 0) close(fd);
}

void Event(const Args& args, const char* name, int rank) {
  if (!args.events.empty()) Touch(args.events + "/" + name + "." + std::to_string(rank));
}

int ServeStore(const std::string& token) {
  auto server = reshard::StoreServer::Start("127.0.0.1", 0, token);
  if (!server.ok()) {
    std::fprintf(stderr, "fault_peer: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("STORE %d\n", (*server)->port());
  std::fflush(stdout);
  while (true) pause();
}

// This rank's buffers and their expected contents for one spec.
struct World {
  reshard::RefitSpec spec;
  std::vector<uint32_t> src, dst;
  // Global element index of every source / destination element of this rank.
  std::vector<int64_t> src_index, dst_index;
};

World Build(const std::string& name, int rank) {
  using reshard::Layout;
  using reshard::Mesh;
  World w;
  if (name == "fanout") {
    constexpr int64_t n = 512;
    w.spec.AddTensor("w", reshard::DType::kI32, {n, n}, Layout(Mesh({0}), {reshard::Replicate()}),
                     Layout(Mesh({1, 2}), {reshard::Replicate()}));
    w.spec.SetDomains({{0}, {1, 2}});
    std::vector<int64_t>& index = rank == 0 ? w.src_index : w.dst_index;
    for (int64_t i = 0; i < n * n; ++i) index.push_back(i);
  } else if (name == "star") {
    constexpr int64_t rows = 1024, cols = 512, half = rows / 2;
    w.spec.AddTensor("w", reshard::DType::kI32, {rows, cols},
                     Layout(Mesh({0, 2}), {reshard::Shard(0)}),
                     Layout(Mesh({1}), {reshard::Replicate()}));
    if (rank == 1) {
      for (int64_t i = 0; i < rows * cols; ++i) w.dst_index.push_back(i);
    } else {
      const int64_t first = (rank / 2) * half * cols;
      for (int64_t i = 0; i < half * cols; ++i) w.src_index.push_back(first + i);
    }
  } else {
    constexpr int64_t n = 1024, half = n / 2;
    w.spec.AddTensor("w", reshard::DType::kI32, {n, n},
                     Layout(Mesh::Range(0, 2), {reshard::Shard(0)}),
                     Layout(Mesh::Range(0, 2), {reshard::Shard(1)}));
    for (int64_t r = 0; r < half; ++r) {
      for (int64_t c = 0; c < n; ++c) w.src_index.push_back((rank * half + r) * n + c);
    }
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < half; ++c) w.dst_index.push_back(r * n + rank * half + c);
    }
  }
  w.src.assign(w.src_index.size(), 0);
  w.dst.assign(w.dst_index.size(), kPoison);
  return w;
}

void End() {
  std::printf("END at=%lld\n", static_cast<long long>(absl::ToUnixNanos(absl::Now())));
  std::fflush(stdout);
}

int Refit(const Args& args);

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--spec") {
      args.spec = value();
    } else if (a == "--steps") {
      args.steps = std::atoi(value().c_str());
    } else if (a == "--deadline-ms") {
      args.deadline_ms = std::atoll(value().c_str());
    } else if (a == "--first-deadline-ms") {
      args.first_deadline_ms = std::atoll(value().c_str());
    } else if (a == "--setup-timeout-ms") {
      args.setup_timeout_ms = std::atoll(value().c_str());
    } else if (a == "--events") {
      args.events = value();
    } else if (a == "--go-file") {
      args.go_file = value();
    } else if (a == "--serve-store") {
      args.serve_store_token = value();
    } else if (a == "--barrier") {
      args.barrier = true;
    } else if (a == "--reset") {
      args.reset = true;
    } else {
      std::fprintf(stderr, "fault_peer: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (!args.serve_store_token.empty()) return ServeStore(args.serve_store_token);
  const int code = Refit(args);  // Destroys the handle and the communicator before returning.
  End();
  return code;
}

namespace {

int Refit(const Args& args) {
  auto comm = reshard::Communicator::FromEnvironment();
  if (!comm.ok()) {
    Report("SETUP", comm.status());
    return 1;
  }
  const int rank = comm->rank();
  World w = Build(args.spec, rank);
  reshard::LocalBuffers buffers;
  if (!w.src.empty()) buffers.Source("w", w.src.data(), static_cast<int64_t>(w.src.size() * 4));
  if (!w.dst.empty()) {
    buffers.Destination("w", w.dst.data(), static_cast<int64_t>(w.dst.size() * 4));
  }
  reshard::HandleOptions options;
  options.setup_timeout = absl::Milliseconds(args.setup_timeout_ms);
  auto handle = reshard::RefitHandle::Create(*comm, w.spec, std::move(buffers), options);
  if (!handle.ok()) {
    Report("SETUP", handle.status());
    Event(args, "failed", rank);
    return 1;
  }
  std::printf("SETUP OK\n");
  std::fflush(stdout);

  int verified = 0, failures = 0;
  bool last_ok = false;
  for (int step = 1; step <= args.steps; ++step) {
    for (size_t i = 0; i < w.src.size(); ++i) w.src[i] = Pattern(step, w.src_index[i]);
    std::fill(w.dst.begin(), w.dst.end(), kPoison);
    const absl::Time begin = absl::Now();
    const int64_t deadline_ms =
        step == 1 && args.first_deadline_ms >= 0 ? args.first_deadline_ms : args.deadline_ms;
    absl::Status st = handle->Execute(begin + absl::Milliseconds(deadline_ms));
    if (st.ok()) {
      for (size_t i = 0; i < w.dst.size(); ++i) {
        if (w.dst[i] != Pattern(step, w.dst_index[i])) {
          std::printf("WRONG step=%d index=%lld got=%u want=%u\n", step,
                      static_cast<long long>(w.dst_index[i]), w.dst[i],
                      Pattern(step, w.dst_index[i]));
          std::fflush(stdout);
          return 3;
        }
      }
      std::printf("STEP %d OK ms=%.3f\n", step, absl::ToDoubleMilliseconds(absl::Now() - begin));
      std::fflush(stdout);
      ++verified;
      if (step == 1) {
        Event(args, "ready", rank);
        while (!args.go_file.empty() && access(args.go_file.c_str(), F_OK) != 0) usleep(2000);
      }
      if (args.barrier) {
        st = handle->Barrier(absl::Now() + absl::Milliseconds(args.deadline_ms));
        if (!st.ok()) Report("BARRIER " + std::to_string(step), st);
      }
    } else {
      Report("STEP " + std::to_string(step), st);
    }
    last_ok = st.ok();
    if (!st.ok()) {
      if (failures++ == 0) Event(args, "failed", rank);
      if (!args.reset) break;
      handle->Reset();
    }
  }
  std::printf("DONE ok=%d failed=%d\n", verified, failures);
  std::fflush(stdout);
  return last_ok ? 0 : 1;
}

}  // namespace
