// delta_gpu_bench: the CUDA delta kernels (src/cuda/delta.h: encode against a device shadow,
// apply to a device destination) on one GPU, for one bf16 piece at several change fractions,
// against device-to-device cudaMemcpy of the piece's bytes.
//
//   delta_gpu_bench [--mib N] [--iters N] [--pieces N]
//   (defaults: 8 MiB of bf16, 20 iterations, 64 pieces of 1 MiB for the pipeline lines)
//
// Two versions A and B of the piece differ in a fraction F of their elements (scattered); the
// encodes alternate A, B, A, ... against the shadow and the applies alternate the streams A->B
// and B->A on a destination, so every call sees exactly F changed. Times are host wall-clock
// medians of the blocking calls (launches, the result's copy to the host, the host-side
// validation of the stream before an apply: what a refit pays per piece), and the memcpy row
// is timed the same way (cudaMemcpyAsync + synchronise). GB/s is the piece's bytes over that
// time. Columns: encode into device memory; encode with the stream copied to pageable host
// memory; apply from a device copy of the stream; apply from host memory (copied up first).
//
// Then the engine's GPU encode pipeline (docs/delta.md, "The GPU encode pipeline"): N pieces of
// 1 MiB of bf16 at 5% changed, each stream brought to host memory and copied into a send buffer
// (what the engine does before posting a piece), one by one (DeviceDeltaCodec::Encode: launch,
// wait, copy back, per piece) against pipelined (PlanBatches with the engine's 64 MiB
// pinned budget in two slots, EnqueueEncode per piece, one event per batch polled, the next
// batch enqueued as soon as a slot is consumed). The host's per-piece work then overlaps the
// GPU's encodes instead of alternating with them.
// Exit status: 0 after printing the table, 1 on a CUDA or kernel error, 3 when there is no
// usable CUDA device. It prints figures and never fails on speed.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/common/delta_codec.h"
#include "src/cuda/batch_plan.h"
#include "src/cuda/delta.h"
#include "src/cuda/runtime.h"

namespace {

constexpr int kExitNoDevice = 3;

bool Check(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "delta_gpu_bench: %s: %s\n", call, cudaGetErrorString(err));
  return false;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Median milliseconds of `iters` calls of fn(i) (after two warm-up calls); -1 when one fails.
template <typename Fn>
double Timed(int iters, Fn&& fn) {
  std::vector<double> ms;
  for (int i = 0; i < iters + 2; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!fn(i)) return -1;
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 2) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return Median(ms);
}

// The pipeline lines (see the top): `n` pieces of 1 MiB of bf16, 5% changed.
int Pipeline(int64_t n, int iters) {
  using reshard::cuda::DeviceDeltaCodec;
  constexpr int64_t kPieceBytes = 1 << 20, kElems = kPieceBytes / 2;
  const int64_t total = n * kPieceBytes;
  auto codec = DeviceDeltaCodec::Create(total, kPieceBytes);
  if (!codec.ok()) {
    std::fprintf(stderr, "delta_gpu_bench: %s\n", codec.status().ToString().c_str());
    return 1;
  }
  DeviceDeltaCodec& c = **codec;
  const reshard::cuda::DeltaPiece piece = reshard::cuda::ContiguousDeltaPiece(kElems, 2);
  const int64_t capacity = reshard::delta::StreamCapacity(kElems, 2);
  std::vector<reshard::cuda::BatchPiece> list;
  for (int64_t i = 0; i < n; ++i) list.push_back({static_cast<uint32_t>(i), capacity});
  const reshard::cuda::BatchPlan plan = reshard::cuda::PlanBatches(
      list, reshard::cuda::kDeltaBatchBudget, reshard::cuda::kDeltaBatchSlots);
  if (absl::Status st = c.ReservePipeline(plan.slots, plan.slot_bytes, n); !st.ok()) {
    std::fprintf(stderr, "delta_gpu_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<uint16_t> a(static_cast<size_t>(total / 2)), b;
  for (auto& x : a) x = static_cast<uint16_t>(0x3800 + rng() % 0x1000);
  b = a;
  for (auto& x : b) {
    if (unit(rng) < 0.05) x ^= static_cast<uint16_t>(1 + rng() % 0xff);
  }
  void *a_dev = nullptr, *b_dev = nullptr;
  for (void** p : {&a_dev, &b_dev}) {
    if (!Check(cudaMalloc(p, static_cast<size_t>(total)), "cudaMalloc")) return 1;
  }
  if (!Check(cudaMemcpy(a_dev, a.data(), static_cast<size_t>(total), cudaMemcpyHostToDevice),
             "cudaMemcpy") ||
      !Check(cudaMemcpy(b_dev, b.data(), static_cast<size_t>(total), cudaMemcpyHostToDevice),
             "cudaMemcpy")) {
    return 1;
  }
  // The engine's send scratch: pageable host memory, one stream per piece.
  std::vector<uint8_t> scratch(static_cast<size_t>(n * capacity));
  auto source = [&](int i, int64_t k) {
    return static_cast<const uint8_t*>(i % 2 == 0 ? b_dev : a_dev) + k * kPieceBytes;
  };
  // Every call alternates the source version, so each encode sees 5% changed (the shadows start
  // at zero: the first warm-up call sends every piece plain).
  const double one_by_one_ms = Timed(iters, [&](int i) {
    for (int64_t k = 0; k < n; ++k) {
      if (!c.Encode(piece, source(i, k), k * kPieceBytes, 1, true, scratch.data() + k * capacity)
               .ok()) {
        return false;
      }
    }
    return true;
  });
  const double pipelined_ms = Timed(iters, [&](int i) {
    int32_t enqueued = 0;
    for (int32_t batch = 0; batch < plan.batches(); ++batch) {
      for (; enqueued < plan.batches() && enqueued < batch + plan.slots; ++enqueued) {
        uint8_t* slot = c.pinned_slot(enqueued % plan.slots);
        for (uint32_t e = plan.batch_begin[enqueued]; e < plan.batch_begin[enqueued + 1]; ++e) {
          const int64_t k = plan.entries[e].id;
          if (!c.EnqueueEncode(piece, source(i, k), k * kPieceBytes, 1, true,
                               slot + plan.entries[e].offset, e)
                   .ok()) {
            return false;
          }
        }
        if (!c.RecordSlot(enqueued % plan.slots).ok()) return false;
      }
      for (;;) {  // Polled, as the engine's progress loop does.
        absl::StatusOr<bool> done = c.SlotDone(batch % plan.slots);
        if (!done.ok()) return false;
        if (*done) break;
      }
      const uint8_t* slot = c.pinned_slot(batch % plan.slots);
      for (uint32_t e = plan.batch_begin[batch]; e < plan.batch_begin[batch + 1]; ++e) {
        std::memcpy(scratch.data() + plan.entries[e].id * capacity, slot + plan.entries[e].offset,
                    static_cast<size_t>(c.pinned_result(e).bytes));
      }
    }
    return true;
  });
  cudaFree(a_dev);
  cudaFree(b_dev);
  if (one_by_one_ms < 0 || pipelined_ms < 0) {
    std::fprintf(stderr, "delta_gpu_bench: a pipeline encode failed\n");
    return 1;
  }
  std::printf(
      "encode of %lld x 1 MiB bf16 pieces, 5%% changed, streams to host memory: one by "
      "one %.3f ms, pipelined (%d batches, %d slots of %.1f MiB pinned) %.3f ms: %.2fx\n",
      static_cast<long long>(n), one_by_one_ms, plan.batches(), plan.slots,
      static_cast<double>(plan.slot_bytes) / (1 << 20), pipelined_ms, one_by_one_ms / pipelined_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using reshard::cuda::DeviceDeltaCodec;
  int64_t mib = 8;
  int iters = 20;
  int64_t pieces = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") {
      std::printf("usage: delta_gpu_bench [--mib N] [--iters N] [--pieces N]\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "delta_gpu_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    const long long v = std::atoll(argv[++i]);
    if (v < 1) {
      std::fprintf(stderr, "delta_gpu_bench: %s must be at least 1\n", a.c_str());
      return 2;
    }
    if (a == "--mib") {
      mib = v;
    } else if (a == "--iters") {
      iters = static_cast<int>(v);
    } else if (a == "--pieces") {
      pieces = v;
    } else {
      std::fprintf(stderr, "delta_gpu_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::string why;
  if (reshard::cuda::CudaDeviceCount(&why) == 0) {
    std::fprintf(stderr, "delta_gpu_bench: no usable CUDA device: %s\n", why.c_str());
    return kExitNoDevice;
  }
  const int64_t bytes = mib << 20, elems = bytes / 2;
  const reshard::cuda::DeltaPiece piece = reshard::cuda::ContiguousDeltaPiece(elems, 2);
  auto codec = DeviceDeltaCodec::Create(bytes, bytes);
  if (!codec.ok()) {
    std::fprintf(stderr, "delta_gpu_bench: %s\n", codec.status().ToString().c_str());
    return 1;
  }
  DeviceDeltaCodec& c = **codec;
  const size_t capacity = static_cast<size_t>(reshard::delta::StreamCapacity(elems, 2));
  void *a_dev = nullptr, *b_dev = nullptr, *dst = nullptr, *copy = nullptr;
  void *stream_ab = nullptr, *stream_ba = nullptr;
  for (void** p : {&a_dev, &b_dev, &dst, &copy}) {
    if (!Check(cudaMalloc(p, static_cast<size_t>(bytes)), "cudaMalloc")) return 1;
  }
  for (void** p : {&stream_ab, &stream_ba}) {
    if (!Check(cudaMalloc(p, capacity), "cudaMalloc")) return 1;
  }
  cudaStream_t stream;
  if (!Check(cudaStreamCreate(&stream), "cudaStreamCreate")) return 1;
  const double memcpy_ms = Timed(iters, [&](int) {
    return Check(cudaMemcpyAsync(copy, a_dev, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                                 stream),
                 "cudaMemcpyAsync") &&
           Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  });
  if (memcpy_ms < 0) return 1;
  auto gbs = [&](double ms) { return static_cast<double>(bytes) / ms / 1e6; };
  std::printf("CUDA delta kernels, one %lld MiB bf16 piece, median of %d (host wall clock)\n",
              static_cast<long long>(mib), iters);
  std::printf("%-16s %11s %10s %12s %11s %12s %12s\n", "changed", "stream", "encode", "encode+d2h",
              "apply", "apply+h2d", "vs memcpy");
  std::printf("%-16s %11s %7.1f GB/s (%.3f ms)\n", "cudaMemcpy d2d", "-", gbs(memcpy_ms),
              memcpy_ms);
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<uint16_t> a(static_cast<size_t>(elems)), b;
  for (auto& x : a) x = static_cast<uint16_t>(0x3800 + rng() % 0x1000);
  std::vector<uint8_t> host_ab(capacity), host_ba(capacity), host_out(capacity);
  for (const double f : {0.0, 0.01, 0.05, 0.2, 1.0}) {
    b = a;
    for (auto& x : b) {
      if (unit(rng) < f) x ^= static_cast<uint16_t>(1 + rng() % 0xff);
    }
    if (!Check(cudaMemcpy(a_dev, a.data(), static_cast<size_t>(bytes), cudaMemcpyHostToDevice),
               "cudaMemcpy") ||
        !Check(cudaMemcpy(b_dev, b.data(), static_cast<size_t>(bytes), cudaMemcpyHostToDevice),
               "cudaMemcpy")) {
      return 1;
    }
    // The shadow holds A; the streams A->B and B->A, on the host and on the device.
    int64_t ab_bytes = 0, ba_bytes = 0;
    bool ok = c.Encode(piece, a_dev, 0, 1, false, host_out.data()).ok();
    absl::StatusOr<reshard::delta::EncodeResult> r =
        c.Encode(piece, b_dev, 0, 1, true, host_ab.data());
    ok = ok && r.ok();
    if (ok) ab_bytes = r->bytes;
    r = c.Encode(piece, a_dev, 0, 1, true, host_ba.data());
    ok = ok && r.ok();
    if (ok) ba_bytes = r->bytes;
    if (!ok ||
        !Check(cudaMemcpy(stream_ab, host_ab.data(), static_cast<size_t>(ab_bytes),
                          cudaMemcpyHostToDevice),
               "cudaMemcpy") ||
        !Check(cudaMemcpy(stream_ba, host_ba.data(), static_cast<size_t>(ba_bytes),
                          cudaMemcpyHostToDevice),
               "cudaMemcpy")) {
      std::fprintf(stderr, "delta_gpu_bench: the encode failed\n");
      return 1;
    }
    // The shadow holds A again: encodes alternate B, A, B, ...
    auto encode = [&](bool to_host) {
      return [&, to_host](int i) {
        const void* src = i % 2 == 0 ? b_dev : a_dev;
        return to_host ? c.Encode(piece, src, 0, 1, true, host_out.data()).ok()
                       : c.EncodeOnDevice(piece, src, 0, 1, true).ok();
      };
    };
    const double encode_ms = Timed(iters, encode(false));
    // An even number of calls (iters + 2 when iters is even) leaves the shadow at A or B.
    const double encode_host_ms = Timed(iters, encode(true));
    // The destination holds A: applies alternate A->B, B->A.
    if (!Check(cudaMemcpy(dst, a_dev, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice),
               "cudaMemcpy")) {
      return 1;
    }
    auto apply = [&](bool from_host) {
      return [&, from_host](int i) {
        const bool ab = i % 2 == 0;
        const std::vector<uint8_t>& host = ab ? host_ab : host_ba;
        return c
            .Apply(piece, host.data(), ab ? ab_bytes : ba_bytes, 1, dst,
                   from_host ? nullptr : (ab ? stream_ab : stream_ba))
            .ok();
      };
    };
    const double apply_ms = Timed(iters, apply(false));
    const double apply_host_ms = Timed(iters + (iters % 2), apply(true));
    if (encode_ms < 0 || encode_host_ms < 0 || apply_ms < 0 || apply_host_ms < 0) {
      std::fprintf(stderr, "delta_gpu_bench: a kernel failed at fraction %.2f\n", f);
      return 1;
    }
    char label[32], size[32];
    std::snprintf(label, sizeof(label), "%.0f%% scattered", f * 100);
    std::snprintf(size, sizeof(size), "%.3fx", static_cast<double>(ab_bytes) / bytes);
    std::printf("%-16s %11s %7.1f GB/s %7.1f GB/s %6.1f GB/s %7.1f GB/s %5.2fx/%.2fx\n", label,
                size, gbs(encode_ms), gbs(encode_host_ms), gbs(apply_ms), gbs(apply_host_ms),
                memcpy_ms / encode_ms, memcpy_ms / apply_ms);
  }
  // Check the last apply pair left the destination at A or B (it must be one of them).
  std::vector<uint16_t> back(static_cast<size_t>(elems));
  if (!Check(cudaMemcpy(back.data(), dst, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost),
             "cudaMemcpy")) {
    return 1;
  }
  if (back != a && back != b) {
    std::fprintf(stderr, "delta_gpu_bench: the destination holds neither version\n");
    return 1;
  }
  for (void* p : {a_dev, b_dev, dst, copy, stream_ab, stream_ba}) cudaFree(p);
  cudaStreamDestroy(stream);
  codec->reset();
  return Pipeline(pieces, iters);
}
