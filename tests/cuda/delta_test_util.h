// Random delta pieces for the delta kernels' tests (delta_index_test on the CPU,
// delta_kernel_test on a device): a source piece laid out in a buffer (contiguous, or runs over
// one or two outer dims with gaps), its old values (what the shadow and the destination hold)
// differing from the new ones in a random fraction of the elements, scattered or in runs, and a
// destination laid out in other runs.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/common/delta_codec.h"
#include "src/cuda/delta_index.h"

namespace reshard::cuda::testing {

// A piece of `elems` elements (about) laid out in a buffer: contiguous at an offset, or runs
// over one or two outer dims with gaps between them (strides of either sign are not needed:
// plan regions of a destination never alias). `runs` lists each run's byte offset, in order.
struct Layout {
  DeltaPiece piece;
  std::vector<int64_t> runs;
  int64_t run_bytes = 0;
  int64_t buffer_bytes = 0;
};

// `exact`: exactly `elems` elements (runs of a divisor of it); else about `elems`.
inline Layout RandomLayout(std::mt19937_64& rng, int64_t elems, int es, bool exact) {
  Layout l;
  const int64_t offset = es * static_cast<int64_t>(rng() % 5);
  const int shape = static_cast<int>(rng() % 3);
  if (shape == 0 || elems < 4) {
    l.piece = MakeDeltaPiece(offset, elems * es, 0, nullptr, nullptr, es);
    l.runs = {offset};
    l.run_bytes = elems * es;
    l.buffer_bytes = offset + elems * es + 3;
    return l;
  }
  int64_t run_elems = 1 + static_cast<int64_t>(rng() % std::min<int64_t>(elems, 700));
  if (exact) {
    while (elems % run_elems != 0) --run_elems;
  }
  // run_elems * count[0] (* count[1]) elements.
  int64_t count[2] = {std::max<int64_t>(1, elems / run_elems), 1};
  int ndims = 1;
  if (shape == 2) {
    for (int64_t k : {2, 3, 4}) {
      if (count[0] % k == 0 && count[0] > k) {
        count[1] = count[0] / k;  // Inner.
        count[0] = k;
        ndims = 2;
        break;
      }
    }
  }
  const int64_t inner = (run_elems + static_cast<int64_t>(rng() % 3)) * es;
  int64_t stride[2] = {inner, 0};
  if (ndims == 2) {
    stride[1] = inner;
    stride[0] = inner * count[1] + es * static_cast<int64_t>(rng() % 4);
  }
  l.piece = MakeDeltaPiece(offset, run_elems * es, ndims, count, stride, es);
  l.run_bytes = run_elems * es;
  int64_t end = 0;
  for (int64_t a = 0; a < count[0]; ++a) {
    for (int64_t b = 0; b < (ndims == 2 ? count[1] : 1); ++b) {
      const int64_t at = offset + a * stride[0] + (ndims == 2 ? b * stride[1] : 0);
      l.runs.push_back(at);
      end = std::max(end, at + l.run_bytes);
    }
  }
  l.buffer_bytes = end + 5;
  return l;
}

struct DeltaCase {
  Layout src, dst;
  std::vector<uint8_t> source;  // The source buffer: the piece's new values at src.runs.
  std::vector<uint8_t> now;     // The new values, contiguous (the host codec's input).
  std::vector<uint8_t> old;     // The old values, contiguous (the shadow).
  bool delta = true;            // A base to build on.
  uint64_t base = 0;            // The shadow's version.
  std::string what;
};

// Case `iter` of a series: element sizes 1/2/4/8; sizes around word and chunk boundaries, or
// random below 13000 elements; change fractions 0 or 1 now and then, else uniform, or (every
// fourth case) each chunk its own fraction of 0, 2% or all, so that kDelta streams hold kRaw
// chunks beside sparse ones; scattered or in runs of up to 200 elements.
inline DeltaCase MakeDeltaCase(std::mt19937_64& rng, int iter) {
  static constexpr int64_t kSizes[] = {1,    2,    63,   64,   65,   127,   4095, 4096,
                                       4097, 5000, 8191, 8192, 8193, 12287, 12289};
  std::uniform_real_distribution<double> unit(0, 1);
  DeltaCase dc;
  const int es = 1 << (rng() % 4);
  const int64_t target =
      iter % 3 == 0 ? 1 + static_cast<int64_t>(rng() % 13000) : kSizes[rng() % std::size(kSizes)];
  dc.src = RandomLayout(rng, target, es, false);
  const int64_t elems = dc.src.piece.elems;
  dc.dst = RandomLayout(rng, elems, es, true);
  const double f = iter % 10 == 0 ? 0.0 : (iter % 10 == 1 ? 1.0 : unit(rng));
  const int64_t run = rng() % 2 == 0 ? 1 : 1 + static_cast<int64_t>(rng() % 200);
  const bool mixed = iter % 4 == 3;
  dc.source.resize(static_cast<size_t>(dc.src.buffer_bytes));
  for (auto& b : dc.source) b = static_cast<uint8_t>(rng());
  for (int64_t at : dc.src.runs) {
    dc.now.insert(dc.now.end(), &dc.source[at], &dc.source[at] + dc.src.run_bytes);
  }
  std::vector<double> chunk_f(static_cast<size_t>(delta::NumChunks(elems)));
  for (double& cf : chunk_f) cf = std::array<double, 3>{0.0, 0.02, 1.0}[rng() % 3];
  dc.old = dc.now;
  for (int64_t e = 0; e < elems; e += run) {
    if (unit(rng) >= (mixed ? chunk_f[e / delta::kChunkElems] : f)) continue;
    for (int64_t k = e; k < std::min(elems, e + run); ++k) {
      // Any byte of the element, so every bit position differs somewhere.
      dc.old[static_cast<size_t>(k * es + static_cast<int64_t>(rng() % es))] ^=
          static_cast<uint8_t>(1 + rng() % 255);
    }
  }
  dc.delta = rng() % 8 != 0;
  dc.base = 5 + rng() % 3;
  dc.what = "es " + std::to_string(es) + " elems " + std::to_string(elems) + " f " +
            std::to_string(f) + (mixed ? " mixed" : "") + " run " + std::to_string(run) +
            " src dims " + std::to_string(dc.src.piece.layout.ndims) + " dst dims " +
            std::to_string(dc.dst.piece.layout.ndims) + (dc.delta ? "" : " no base");
  return dc;
}

// A destination buffer of random bytes whose piece (at dst's runs) holds `values`.
inline std::vector<uint8_t> DestinationHolding(std::mt19937_64& rng, const Layout& dst,
                                               const std::vector<uint8_t>& values) {
  std::vector<uint8_t> buffer(static_cast<size_t>(dst.buffer_bytes));
  for (auto& b : buffer) b = static_cast<uint8_t>(rng());
  int64_t pos = 0;
  for (int64_t at : dst.runs) {
    std::memcpy(&buffer[at], values.data() + pos, static_cast<size_t>(dst.run_bytes));
    pos += dst.run_bytes;
  }
  return buffer;
}

}  // namespace reshard::cuda::testing
