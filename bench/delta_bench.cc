// delta_bench: the delta encoding (src/common/delta_codec.h) on sparse changes of one bf16
// piece. For each change fraction, scattered (every element independently, as RL updates are)
// and clustered (runs of 32 elements), it prints the stream size against the plain piece for
// the per-chunk choice and for bitmap-only and runs-only encodings, which chunk encodings won,
// and the encode and apply speeds (CPU time, median of 5). Never fails on speed.
//
//   delta_bench [--elems N]   (default 16M elements = 32 MiB)
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/cpu_time.h"
#include "src/common/delta_codec.h"

namespace {

using reshard::plan::bench::CpuSeconds;
namespace delta = reshard::delta;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t elems = int64_t{16} << 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--elems") elems = std::stoll(argv[++i]);
  }
  constexpr int es = 2;
  const int64_t raw = elems * es;
  std::mt19937_64 rng(1);
  std::vector<uint16_t> old_values(static_cast<size_t>(elems));
  for (auto& v : old_values) v = static_cast<uint16_t>(rng());
  std::vector<uint8_t> stream(static_cast<size_t>(delta::StreamCapacity(elems, es)));
  std::printf("bf16 piece of %lld elements (%.1f MiB), chunks of %lld elements\n",
              static_cast<long long>(elems), raw / 1048576.0,
              static_cast<long long>(delta::kChunkElems));
  std::printf("%-9s %-6s %9s %9s %9s  %6s %6s %6s %6s  %9s %9s\n", "changes", "spread", "chosen",
              "bitmap", "runs", "same", "bitmap", "runs", "raw", "enc GB/s", "apply GB/s");
  for (const char* spread : {"scatter", "runs32"}) {
    const int64_t run = std::string(spread) == "scatter" ? 1 : 32;
    for (double f : {0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0}) {
      std::vector<uint16_t> new_values = old_values;
      std::uniform_real_distribution<double> u(0, 1);
      for (int64_t e = 0; e < elems; e += run) {
        if (u(rng) >= f) continue;
        for (int64_t k = e; k < std::min(elems, e + run); ++k) {
          new_values[static_cast<size_t>(k)] ^= static_cast<uint16_t>(1 + rng() % 15);
        }
      }
      // Bitmap-only and runs-only sizes from the same masks the encoder computes.
      int64_t bitmap_only = sizeof(delta::StreamHeader) + 4 * delta::NumChunks(elems);
      int64_t runs_only = bitmap_only;
      uint64_t words[delta::kWordsPerChunk];
      const auto* now = reinterpret_cast<const uint8_t*>(new_values.data());
      const auto* before = reinterpret_cast<const uint8_t*>(old_values.data());
      for (int64_t c = 0; c * delta::kChunkElems < elems; ++c) {
        const int64_t first = c * delta::kChunkElems;
        const int64_t n = std::min(delta::kChunkElems, elems - first);
        int64_t runs = 0;
        const int64_t changed =
            delta::ChunkMask<uint16_t>(now + first * es, before + first * es, n, words, &runs);
        bitmap_only += delta::BitmapBytes(n, changed, es);
        runs_only += delta::RunsBytes(runs, changed, es);
      }
      std::vector<double> enc, dec;
      delta::EncodeResult r;
      for (int k = 0; k < 5; ++k) {
        std::vector<uint16_t> shadow = old_values;
        double t0 = CpuSeconds();
        r = delta::EncodePiece(new_values.data(), shadow.data(), elems, es, 1, true, stream.data());
        enc.push_back(CpuSeconds() - t0);
        std::vector<uint16_t> dst = old_values;
        delta::Decoder d;
        t0 = CpuSeconds();
        if (d.Init(stream.data(), r.bytes, elems, es, 1) != delta::DecodeError::kOk) {
          std::fprintf(stderr, "delta_bench: the stream does not decode\n");
          return 1;
        }
        d.Apply(reinterpret_cast<uint8_t*>(dst.data()), elems);
        dec.push_back(CpuSeconds() - t0);
        if (dst != new_values) {
          std::fprintf(stderr, "delta_bench: applied values differ\n");
          return 1;
        }
      }
      std::printf("%-9.3f %-6s %8.4fx %8.4fx %8.4fx  %6lld %6lld %6lld %6lld  %9.2f %9.2f\n", f,
                  spread, static_cast<double>(r.bytes) / raw,
                  static_cast<double>(bitmap_only) / raw, static_cast<double>(runs_only) / raw,
                  static_cast<long long>(r.chunks[0]), static_cast<long long>(r.chunks[1]),
                  static_cast<long long>(r.chunks[2]), static_cast<long long>(r.chunks[3]),
                  raw / Median(enc) / 1e9, raw / Median(dec) / 1e9);
    }
  }
  return 0;
}
