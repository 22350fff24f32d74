// put_bench: the refit engine against large contiguous puts, same bytes, same processes.
//
// Four processes (forked, UCX over shared memory unless --tls says otherwise): ranks 0 and 1
// hold a 256 MiB bf16 tensor row-sharded, ranks 2 and 3 want it column-sharded, so every source
// puts a 64 MiB piece made of 16 KiB rows into every destination ("strided refit"). In the same
// processes a second handle moves the same bytes between the same pairs as one contiguous 64 MiB
// piece each ("contiguous puts"). Each iteration starts after a store barrier; its time is the
// slowest rank's Start -> Wait. Prints the median of each and their ratio.
//
//   put_bench [--iters N] [--rows R] [--cols C] [--tls UCX_TLS] [--batch BYTES]
//             [--outstanding N] [--delivery put|am] [--spec SPEC.json] [--cuda]
//             [--emulate-devices] [--emulate-registered] [--landing-bytes BYTES]
//             [--round-bytes BYTES]
// --spec replaces the strided case with any spec of 4 ranks (e.g. many small pieces, to compare
// --batch 0, one completion signal per piece, with batched signals).
// --cuda (builds with CUDA): every buffer is device memory on GPU 0 (the four processes share
// it), so with a UCX that cannot register CUDA memory the sources go through the staging ring
// and the destinations through their landing rounds (docs/data-plane.md); rank 0 also times
// a device-to-device cudaMemcpy of the same bytes, printed beside the refits. Exit 3 without a
// usable GPU.
// --emulate-devices (any build): every buffer is host memory marked CUDA with devices emulated
// on the host (cuda::EmulateDevicesOnHost, a test facility), so the staging protocol runs on the
// CPU: sources through the staging ring (its batches packed on the host by the kernels'
// arithmetic), destinations through the landing rounds of --landing-bytes
// (RefitEngineOptions::stage_landing_bytes, default 256 MiB) in rounds of at most --round-bytes
// (RefitEngineOptions::stage_round_bytes, default 8 MiB), each round scattered to the
// "device" by the scatter kernel's host twin. It measures the protocol's cost (batches, rounds,
// flushes, grants), not a GPU's.
// --emulate-registered: the same emulated devices standing for a CUDA-aware UCX (every buffer
// registered): the strided pieces through the device ring and the receivers' device round
// areas, each ring part one put per round (docs/data-plane.md, "Registered device memory").
// With --cuda and the emulations a third case, "rounds by slab copies", runs the first again
// with its landing rounds copied out by the copy engines, one 2-D copy per slab, instead of one
// scatter-kernel launch per round (RefitEngineOptions::scatter_rounds_by_kernel), so a GPU run
// shows which of the two a round area should use, and a fourth, "one round per sender", with
// each sender's stream in one round (stage_round_bytes unbounded: nothing is scattered before
// the stream's last byte landed), so a GPU run shows what scattering round by round while the
// next rounds land gains (--cuda prints both ratios to cudaMemcpy too).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/cuda/runtime.h"
#include "src/net/refit_engine.h"
#include "src/net/runtime.h"
#include "src/plan/fill.h"
#include "src/plan/spec_json.h"
#include "src/rendezvous/tcp_store.h"

#if RESHARD_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using reshard::common::BufferView;
using reshard::common::MemoryKind;
using reshard::net::RefitEngine;
using reshard::net::RefitEngineOptions;

struct Flags {
  int iters = 10;
  int64_t rows = 8192;
  int64_t cols = 16384;  // bf16: 8192 x 16384 x 2 B = 256 MiB.
  std::string tls = "posix,sysv,cma,self";
  int64_t batch = -1;
  int outstanding = -1;
  std::string delivery;
  std::string spec_path;  // Replaces the strided case (a world of 4 ranks).
  bool cuda = false;      // Device buffers (see the header).
  bool emulate = false;   // --emulate-devices (or --emulate-registered).
  bool registered = false;  // --emulate-registered.
  int64_t landing_bytes = 0;
  int64_t round_bytes = 0;
};

struct Case {
  std::string name;
  std::string spec;
  std::string prefix;
  // RefitEngineOptions::scatter_rounds_by_kernel = false: landing rounds copied out slab by
  // slab by the copy engines.
  bool slab_copies = false;
  // RefitEngineOptions::stage_round_bytes (0: --round-bytes, else the default).
  int64_t round_bytes = 0;
};

std::string StridedSpec(const Flags& f) {
  return absl::StrCat(R"j({"tensors": [{"name": "w", "dtype": "bf16", "shape": [)j", f.rows, ", ",
                      f.cols, R"j(], "src": {"mesh": [0, 1], "placements": ["S(0)"]},)j",
                      R"j( "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})j");
}

// Tensor a: [2, n] split by rows over sources 0 and 1, wholly on rank 2; b the same onto rank 3.
// Every source -> destination pair moves one contiguous quarter of the bytes.
std::string ContiguousSpec(const Flags& f) {
  const int64_t n = f.rows * f.cols / 4;
  std::string out = R"j({"tensors": [)j";
  for (int d = 0; d < 2; ++d) {
    absl::StrAppend(&out, d ? ", " : "", R"j({"name": ")j", d ? "b" : "a",
                    R"j(", "dtype": "bf16", "shape": [2, )j", n,
                    R"j(], "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [)j",
                    2 + d, R"j(], "placements": ["R"]}})j");
  }
  return out + "]}";
}

struct Handle {
  reshard::plan::Plan plan;
  std::vector<std::unique_ptr<uint8_t, decltype(&std::free)>> memory;
  std::vector<BufferView> buffers;  // The host memory above, or device copies of it (--cuda).
  std::unique_ptr<RefitEngine> engine;
};

#if RESHARD_BENCH_CUDA
void* DeviceAlloc(int64_t bytes) {
  void* p = nullptr;
  return bytes > 0 && cudaMalloc(&p, static_cast<size_t>(bytes)) == cudaSuccess ? p : nullptr;
}
// Median milliseconds of a device-to-device cudaMemcpy of `bytes` (-1 on failure).
double DeviceCopyMs(int64_t bytes, int iters) {
  void* a = DeviceAlloc(bytes);
  void* b = DeviceAlloc(bytes);
  std::vector<double> ms;
  for (int i = 0; a != nullptr && b != nullptr && i < iters + 1; ++i) {
    const absl::Time start = absl::Now();
    // A device-to-device cudaMemcpy returns before the copy ends: wait for it.
    if (cudaMemcpy(b, a, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      break;
    }
    if (i > 0) ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  cudaFree(a);
  cudaFree(b);
  if (ms.size() != static_cast<size_t>(iters)) return -1;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
#else
void* DeviceAlloc(int64_t) { return nullptr; }
double DeviceCopyMs(int64_t, int) { return -1; }
#endif

int Child(int rank, const Flags& flags, const std::vector<Case>& cases, int port,
          const std::string& token) {
  setenv("UCX_TLS", flags.tls.c_str(), 1);
  setenv("UCX_NET_DEVICES", flags.tls.find("tcp") != std::string::npos ? "lo" : "all", 1);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
  if (!flags.delivery.empty()) setenv("RESHARD_DELIVERY", flags.delivery.c_str(), 1);
  const absl::Time setup_deadline = absl::Now() + absl::Seconds(60);
  auto store = reshard::rendezvous::TcpStore::Connect("127.0.0.1", port, token, setup_deadline);
  if (!store.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(store.status().message()).c_str());
    return 1;
  }
  // One runtime (context + worker) for every handle of this process, declared first so it
  // outlives them.
  auto runtime = reshard::net::Runtime::Create();
  if (!runtime.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(runtime.status().message()).c_str());
    return 1;
  }
  std::vector<Handle> handles;
  for (const Case& c : cases) {
    auto spec = reshard::plan::ParseSpecJson(c.spec);
    if (!spec.ok()) return 2;
    auto plan = reshard::plan::BuildPlan(std::make_shared<const reshard::plan::RefitSpec>(*spec));
    if (!plan.ok()) return 2;
    Handle h{*std::move(plan), {}, {}, nullptr};
    std::vector<BufferView>& buffers = h.buffers;
    for (int64_t bytes : h.plan.BufferBytes(rank)) {
      const size_t rounded = (static_cast<size_t>(bytes) + 4095) / 4096 * 4096;
      auto* p = bytes > 0 ? static_cast<uint8_t*>(std::aligned_alloc(4096, rounded)) : nullptr;
      if (p != nullptr) std::memset(p, 0xA5, rounded);
      h.memory.emplace_back(p, &std::free);
      buffers.push_back(
          BufferView{p, bytes, flags.emulate ? MemoryKind::kCuda : MemoryKind::kHost});
      if (flags.cuda && bytes > 0) {
        // Never freed: the process exits after the benchmark.
        buffers.back() = BufferView{DeviceAlloc(bytes), bytes, MemoryKind::kCuda};
        if (buffers.back().data == nullptr) {
          std::fprintf(stderr, "rank %d: cudaMalloc of %lld bytes failed\n", rank,
                       static_cast<long long>(bytes));
          return 1;
        }
      }
    }
    const reshard::plan::RefitSpec& s = h.plan.spec();
    for (size_t t = 0; t < s.tensors.size(); ++t) {
      uint8_t* src = h.memory[h.plan.buffer_of(t, reshard::plan::Side::kSrc)].get();
      reshard::plan::ForEachTile(
          s, t, reshard::plan::Side::kSrc, [&](int32_t r, const reshard::plan::Box& box) {
            if (r == rank) {
              reshard::plan::FillTile(s, t, reshard::plan::Side::kSrc, box, 1, src);
            }
          });
    }
    for (size_t b = 0; flags.cuda && b < buffers.size(); ++b) {
      if (buffers[b].data != nullptr &&
          !reshard::cuda::CudaCopy(buffers[b].data, h.memory[b].get(), buffers[b].bytes).ok()) {
        return 1;
      }
    }
    RefitEngineOptions options;
    options.key_prefix = c.prefix;
    options.setup_timeout = absl::Seconds(300);  // Filling 128 MiB per rank on a busy machine.
    if (flags.batch >= 0) options.signal_batch_bytes = flags.batch;
    if (flags.outstanding > 0) options.max_outstanding_puts = flags.outstanding;
    if (flags.landing_bytes > 0) options.stage_landing_bytes = flags.landing_bytes;
    if (flags.round_bytes > 0) options.stage_round_bytes = flags.round_bytes;
    if (c.round_bytes > 0) options.stage_round_bytes = c.round_bytes;
    options.scatter_rounds_by_kernel = !c.slab_copies;
    auto engine = RefitEngine::Create(h.plan, rank, **store, *runtime, buffers, options);
    if (!engine.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, std::string(engine.status().message()).c_str());
      return 1;
    }
    h.engine = *std::move(engine);
    handles.push_back(std::move(h));
  }
  // Interleave the cases iteration by iteration so both see the same machine state.
  std::vector<std::vector<double>> ms(cases.size());
  for (int i = 0; i < flags.iters + 1; ++i) {  // Iteration 0 warms up (wireup, page faults).
    for (size_t c = 0; c < cases.size(); ++c) {
      const std::string barrier = absl::StrCat("bench/barrier/", i, "/", c, "/");
      (void)(*store)->Set(absl::StrCat(barrier, rank), "1");
      for (int r = 0; r < 4; ++r) {
        if (!(*store)->Get(absl::StrCat(barrier, r), absl::Now() + absl::Seconds(300)).ok())
          return 1;
      }
      RefitEngine& e = *handles[c].engine;
      const absl::Time start = absl::Now();
      absl::Status st = e.Start(static_cast<uint64_t>(i) + 1);
      if (st.ok()) st = e.Wait(absl::Now() + absl::Seconds(60));
      if (!st.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, std::string(st.message()).c_str());
        return 1;
      }
      if (i > 0) ms[c].push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
  }
  // Check the last refit of each case landed correctly (destinations).
  for (size_t c = 0; c < cases.size(); ++c) {
    const Handle& h = handles[c];
    const reshard::plan::RefitSpec& s = h.plan.spec();
    for (size_t t = 0; t < s.tensors.size(); ++t) {
      const uint32_t b = h.plan.buffer_of(t, reshard::plan::Side::kDst);
      const uint8_t* dst = h.memory[b].get();
      if (flags.cuda && h.buffers[b].data != nullptr &&
          !reshard::cuda::CudaCopy(h.memory[b].get(), h.buffers[b].data, h.buffers[b].bytes).ok()) {
        return 1;
      }
      absl::Status st;
      reshard::plan::ForEachTile(s, t, reshard::plan::Side::kDst,
                                 [&](int32_t r, const reshard::plan::Box& box) {
                                   if (r == rank && st.ok()) {
                                     st = reshard::plan::VerifyTile(s, t, box, 1, rank, dst);
                                   }
                                 });
      if (!st.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, std::string(st.message()).c_str());
        return 1;
      }
    }
  }
  for (size_t c = 0; c < cases.size(); ++c) {
    std::vector<std::string> parts;
    for (double v : ms[c]) parts.push_back(absl::StrCat(v));
    (void)(*store)->Set(absl::StrCat("bench/result/", c, "/", rank), absl::StrJoin(parts, ","));
  }
  if (rank == 2 && (flags.emulate || flags.cuda)) {
    const reshard::net::RefitStats& st = handles[0].engine->last_stats();
    std::fprintf(stderr,
                 "rank 2 (a destination%s): landing rounds area %lld bytes, %lld "
                 "rounds (%lld scattered by the kernel), %lld bytes to the \"device\" per refit; "
                 "full-size copies %lld bytes\n",
                 flags.emulate ? ", devices emulated" : ", device buffers",
                 static_cast<long long>(st.stage_landing_bytes),
                 static_cast<long long>(st.stage_landing_rounds),
                 static_cast<long long>(st.stage_round_scatters),
                 static_cast<long long>(st.bytes_staged_to_device),
                 static_cast<long long>(st.stage_copy_bytes));
  }
  if (rank == 0) {
    std::fprintf(stderr, "transports: %s, delivery: %s\n", handles[0].engine->Transports().c_str(),
                 handles[0].engine->delivery());
    if (flags.emulate) {
      const reshard::net::RefitStats& st = handles[0].engine->last_stats();
      std::fprintf(stderr,
                   "rank 0 (a source, devices emulated%s): %lld puts per strided refit, staging "
                   "ring %lld bytes in %lld batches\n",
                   flags.registered ? ", registered" : "", static_cast<long long>(st.puts),
                   static_cast<long long>(st.stage_ring_bytes),
                   static_cast<long long>(st.stage_ring_batches));
    }
    if (flags.cuda) {
      const reshard::net::RefitStats& st = handles[0].engine->last_stats();
      std::fprintf(stderr,
                   "rank 0 (a source): %lld CUDA buffer(s) staged, %lld registered; staging ring "
                   "%lld bytes, %lld batches, %lld bytes packed per refit\n",
                   static_cast<long long>(st.cuda_buffers_staged),
                   static_cast<long long>(st.cuda_buffers_registered),
                   static_cast<long long>(st.stage_ring_bytes),
                   static_cast<long long>(st.stage_ring_batches),
                   static_cast<long long>(st.bytes_ring_packed));
      const double copy = DeviceCopyMs(flags.rows * flags.cols * 2, flags.iters);
      (void)(*store)->Set("bench/devcopy", absl::StrCat(copy));
    }
  }
  for (Handle& h : handles) (void)h.engine->Shutdown(absl::Now() + absl::Seconds(10));
  return 0;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    int64_t v = 0;
    if (a == "--iters" && absl::SimpleAtoi(next(), &v)) {
      flags.iters = static_cast<int>(v);
    } else if (a == "--rows" && absl::SimpleAtoi(next(), &v)) {
      flags.rows = v;
    } else if (a == "--cols" && absl::SimpleAtoi(next(), &v)) {
      flags.cols = v;
    } else if (a == "--tls") {
      flags.tls = next();
    } else if (a == "--batch" && absl::SimpleAtoi(next(), &v)) {
      flags.batch = v;
    } else if (a == "--outstanding" && absl::SimpleAtoi(next(), &v)) {
      flags.outstanding = static_cast<int>(v);
    } else if (a == "--delivery") {
      flags.delivery = next();
    } else if (a == "--spec") {
      flags.spec_path = next();
    } else if (a == "--cuda") {
      flags.cuda = true;
    } else if (a == "--emulate-devices") {
      flags.emulate = true;
    } else if (a == "--emulate-registered") {
      flags.emulate = flags.registered = true;
    } else if (a == "--landing-bytes" && absl::SimpleAtoi(next(), &v) && v > 0) {
      flags.landing_bytes = v;
    } else if (a == "--round-bytes" && absl::SimpleAtoi(next(), &v) && v > 0) {
      flags.round_bytes = v;
    } else {
      std::fprintf(stderr,
                   "usage: put_bench [--iters N] [--rows R] [--cols C] [--tls UCX_TLS] "
                   "[--batch BYTES] [--outstanding N] [--delivery put|am] [--spec SPEC.json] "
                   "[--cuda] [--emulate-devices] [--emulate-registered] [--landing-bytes BYTES] "
                   "[--round-bytes BYTES]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (flags.rows % 4 != 0 || flags.cols % 2 != 0) {
    std::fprintf(stderr, "put_bench: --rows must be a multiple of 4 and --cols even\n");
    return 2;
  }
  if (flags.cuda && flags.emulate) {
    std::fprintf(stderr, "put_bench: --cuda and --emulate-devices exclude each other\n");
    return 2;
  }
  // Inherited by the forked ranks.
  if (flags.emulate) reshard::cuda::EmulateDevicesOnHost(true, flags.registered);
  if (flags.cuda) {
    // Probed in a child: the CUDA runtime must not be initialised before the ranks fork.
    const pid_t probe = fork();
    if (probe == 0) _exit(reshard::cuda::CudaDeviceCount() > 0 ? 0 : 3);
    int status = 0;
    waitpid(probe, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "put_bench --cuda: no usable GPU (or a build without CUDA)\n");
      return 3;
    }
  }
  std::vector<Case> cases = {{"strided refit (rows -> cols)", StridedSpec(flags), "bench/strided"},
                             {"contiguous puts", ContiguousSpec(flags), "bench/contiguous"}};
  if (!flags.spec_path.empty()) {
    auto spec = reshard::plan::LoadSpecFile(flags.spec_path);
    if (!spec.ok() || spec->WorldSize() != 4) {
      std::fprintf(stderr, "put_bench: --spec must name a valid spec of 4 ranks\n");
      return 2;
    }
    cases[0] = {flags.spec_path, reshard::plan::SpecToJson(*spec), "bench/spec"};
  }
  if (flags.cuda || flags.emulate) {
    // The first case again, its landing rounds copied out by the copy engines instead of the
    // scatter kernel: which of the two a round area should use is measured here.
    cases.push_back({"same, rounds by slab copies", cases[0].spec, "bench/slabs", true});
    // And with one round per sender: what scattering while the next rounds land gains.
    cases.push_back({"same, one round per sender", cases[0].spec, "bench/oneround", false,
                     std::numeric_limits<int64_t>::max()});
  }
  std::random_device rd;
  const std::string token = absl::StrCat("bench", rd());
  // Fork the ranks before the store server starts its thread: a child forked while another
  // thread holds a lock (UCX's memory hooks take one on mmap) can deadlock. Each child reads
  // the port from a pipe.
  std::vector<pid_t> pids;
  std::vector<int> port_pipes;
  for (int r = 0; r < 4; ++r) {
    int fds[2];
    if (pipe(fds) != 0) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[1]);
      int port = 0;
      if (read(fds[0], &port, sizeof(port)) != sizeof(port)) _exit(1);
      _exit(Child(r, flags, cases, port, token));
    }
    close(fds[0]);
    port_pipes.push_back(fds[1]);
    pids.push_back(pid);
  }
  auto server = reshard::rendezvous::TcpStoreServer::Start("127.0.0.1", 0, token);
  if (!server.ok()) {
    std::fprintf(stderr, "put_bench: %s\n", std::string(server.status().message()).c_str());
    for (int fd : port_pipes) close(fd);  // Children exit on the short read.
    for (pid_t pid : pids) waitpid(pid, nullptr, 0);
    return 1;
  }
  const int port = (*server)->port();
  for (int fd : port_pipes) {
    if (write(fd, &port, sizeof(port)) != sizeof(port)) return 1;
    close(fd);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!ok) {
    std::fprintf(stderr, "put_bench: a rank failed\n");
    return 1;
  }
  auto client = reshard::rendezvous::TcpStore::Connect("127.0.0.1", (*server)->port(), token,
                                                absl::Now() + absl::Seconds(10));
  if (!client.ok()) return 1;
  const double bytes = static_cast<double>(flags.rows) * flags.cols * 2;
  std::printf(
      "put_bench: %lld x %lld bf16 (%.0f MiB), 2 sources -> 2 destinations, UCX_TLS=%s, "
      "%d iterations\n",
      static_cast<long long>(flags.rows), static_cast<long long>(flags.cols), bytes / (1 << 20),
      flags.tls.c_str(), flags.iters);
  std::vector<double> medians;
  for (size_t c = 0; c < cases.size(); ++c) {
    std::vector<double> slowest(flags.iters, 0);
    for (int r = 0; r < 4; ++r) {
      auto v = (*client)->Get(absl::StrCat("bench/result/", c, "/", r), absl::Now());
      if (!v.ok()) return 1;
      int i = 0;
      for (absl::string_view part : absl::StrSplit(*v, ',', absl::SkipEmpty())) {
        double x = 0;
        if (absl::SimpleAtod(part, &x) && i < flags.iters) slowest[i] = std::max(slowest[i], x);
        ++i;
      }
    }
    const double med = Median(slowest);
    medians.push_back(med);
    std::printf("  %-30s median %8.2f ms  (%6.2f GB/s aggregate)  min %.2f  max %.2f\n",
                cases[c].name.c_str(), med, bytes / (med * 1e6),
                *std::min_element(slowest.begin(), slowest.end()),
                *std::max_element(slowest.begin(), slowest.end()));
  }
  std::printf("  ratio strided / contiguous: %.3f (target <= 1.3)\n", medians[0] / medians[1]);
  if (flags.cuda) {
    double copy = -1;
    auto v = (*client)->Get("bench/devcopy", absl::Now());
    if (v.ok()) (void)absl::SimpleAtod(*v, &copy);
    std::printf("  %-30s median %8.2f ms  (%6.2f GB/s)  strided refit / cudaMemcpy: %.2f\n",
                "cudaMemcpy device to device", copy, copy > 0 ? bytes / (copy * 1e6) : 0.0,
                copy > 0 ? medians[0] / copy : 0.0);
    std::printf("  %-30s rounds by slab copies / cudaMemcpy: %.2f\n", "",
                copy > 0 ? medians[2] / copy : 0.0);
    std::printf("  %-30s one round per sender / cudaMemcpy: %.2f\n", "",
                copy > 0 ? medians[3] / copy : 0.0);
  }
  return 0;
}
