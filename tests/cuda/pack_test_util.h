// Shared by the pack tests: random regions as plans make them, the host twin of the kernels
// (every unit moved through pack_index.h exactly as a thread moves it), and the executor's copy.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "src/common/hash.h"
#include "src/cuda/pack_batch.h"
#include "src/cuda/pack_index.h"
#include "src/plan/region.h"

namespace reshard::cuda::testing {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return Mix64(state_++); }
  int64_t Uniform(int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool Coin(int percent) { return Uniform(0, 99) < percent; }

 private:
  uint64_t state_;
};

// The host twin of the kernels: every unit of the batch, located exactly as a thread does
// (binary search over the whole batch, then the unit's address).
// Fails when the search lands on an entry that does not hold the unit.
inline ::testing::AssertionResult HostMove(const PackBatch& batch, bool pack, uint8_t* strided,
                                           uint8_t* packed) {
  const int32_t n = static_cast<int32_t>(batch.entries.size());
  for (uint64_t u = 0; u < batch.total_units; ++u) {
    const int32_t i = FindPackEntry(batch.entries.data(), 0, n - 1, u);
    const PackEntry& e = batch.entries[i];
    if (u < e.units_begin || u - e.units_begin >= e.units) {
      return ::testing::AssertionFailure()
             << "unit " << u << " found in entry " << i << ", which holds [" << e.units_begin
             << ", " << e.units_begin + e.units << ")";
    }
    const UnitAddress a = LocatePackUnit(e, u - e.units_begin);
    if (pack) {
      std::memcpy(packed + a.packed_offset, strided + a.strided_offset, a.width);
    } else {
      std::memcpy(strided + a.strided_offset, packed + a.packed_offset, a.width);
    }
  }
  return ::testing::AssertionSuccess();
}

inline StridedRegion SideOf(const plan::Region& r, const plan::RegionDim* dims, bool from,
                            int64_t base = 0) {
  StridedRegion s;
  s.offset = base + (from ? r.from_offset : r.to_offset);
  s.run_bytes = r.run_bytes;
  s.ndims = r.ndims;
  for (int d = 0; d < r.ndims; ++d) {
    s.count[d] = dims[d].count;
    s.stride[d] = from ? dims[d].from_stride : dims[d].to_stride;
  }
  return s;
}

// A random region with its own dim pool and the buffer sizes its two sides need. Reads may
// alias (any non-negative from-strides, smaller than the run or 0 included); writes never do
// (to-strides nest the dims in a random order with random gaps), as in every plan.
struct RandomRegion {
  plan::Region region;
  std::vector<plan::RegionDim> dims;
  int64_t from_size = 0;
  int64_t to_size = 0;
};

inline RandomRegion MakeRandomRegion(Rng& rng) {
  RandomRegion out;
  plan::Region& r = out.region;
  switch (rng.Uniform(0, 4)) {
    case 0:
      r.run_bytes = rng.Uniform(1, 3);
      break;
    case 1:
      r.run_bytes = int64_t{1} << rng.Uniform(2, 6);
      break;
    case 2:
      r.run_bytes = 16 * rng.Uniform(1, 24);
      break;
    case 3:
      r.run_bytes = 2 * rng.Uniform(1, 40);
      break;
    default:
      r.run_bytes = rng.Uniform(1, 300);
      break;
  }
  const int ndims = static_cast<int>(rng.Uniform(0, plan::kMaxTensorDims));
  int64_t runs = 1;
  for (int d = 0; d < ndims; ++d) {
    const int64_t count = runs > 256 ? 1 : rng.Uniform(1, ndims > 4 ? 3 : 6);
    runs *= count;
    out.dims.push_back({count, 0, 0});
  }
  // Strides that keep the offsets aligned most of the time, unaligned some of the time.
  const int64_t grain = rng.Coin(50) ? 16 : rng.Coin(60) ? (int64_t{1} << rng.Uniform(0, 3)) : 1;
  // From side: any non-negative strides.
  int64_t from_span = r.run_bytes;
  for (auto& d : out.dims) {
    d.from_stride = rng.Coin(10) ? 0 : grain * rng.Uniform(0, (r.run_bytes + 64) / grain + 1);
    from_span += d.from_stride * (d.count - 1);
  }
  // To side: nest the dims in a random order, each stride past the span of those before it.
  std::vector<int> order(ndims);
  for (int d = 0; d < ndims; ++d) order[d] = d;
  for (int i = ndims - 1; i > 0; --i) std::swap(order[i], order[rng.Uniform(0, i)]);
  int64_t to_span = r.run_bytes;
  for (int d : order) {
    const int64_t gap = rng.Coin(40) ? 0 : rng.Uniform(0, 40);
    const int64_t stride = (to_span + gap + grain - 1) / grain * grain;
    out.dims[d].to_stride = stride;
    to_span = stride * (out.dims[d].count - 1) + to_span;
  }
  r.from_offset = rng.Coin(80) ? grain * rng.Uniform(0, 8) : rng.Uniform(0, 40);
  r.to_offset = rng.Coin(80) ? grain * rng.Uniform(0, 8) : rng.Uniform(0, 40);
  r.bytes = r.run_bytes * runs;
  r.ndims = static_cast<uint8_t>(ndims);
  out.from_size = r.from_offset + from_span;
  out.to_size = r.to_offset + to_span;
  return out;
}

// A batch of 1..max_group random regions over one source buffer, one stream and one destination
// buffer, each region in its own slice (mostly at 16-byte aligned bases, some unaligned), with
// random base and stream alignments.
struct RandomBatch {
  std::vector<RandomRegion> regions;
  std::vector<int64_t> from_base, to_base;
  int64_t from_size = 0, to_size = 0;
  PackBatchOptions options;
  std::vector<StridedRegion> from_side, to_side;
};

inline RandomBatch MakeRandomBatch(Rng& rng, int max_group) {
  RandomBatch c;
  const int group = static_cast<int>(rng.Uniform(1, max_group));
  for (int i = 0; i < group; ++i) {
    c.regions.push_back(MakeRandomRegion(rng));
    // Mostly 16-byte aligned slices, so that most regions can use wide units.
    const bool aligned = rng.Coin(70);
    c.from_size = aligned ? (c.from_size + 15) / 16 * 16 : c.from_size + rng.Uniform(0, 17);
    c.to_size = aligned ? (c.to_size + 15) / 16 * 16 : c.to_size + rng.Uniform(0, 17);
    c.from_base.push_back(c.from_size);
    c.to_base.push_back(c.to_size);
    c.from_size += c.regions.back().from_size;
    c.to_size += c.regions.back().to_size;
  }
  c.options.strided_base_align = rng.Coin(80) ? 16 : int64_t{1} << rng.Uniform(0, 5);
  c.options.packed_base_align = rng.Coin(80) ? 16 : int64_t{1} << rng.Uniform(0, 5);
  c.options.region_align = rng.Coin(30) ? 1 : int64_t{1} << rng.Uniform(0, 5);
  c.options.packed_begin = rng.Coin(50) ? 0 : rng.Uniform(0, 33);
  for (int i = 0; i < group; ++i) {
    const RandomRegion& rr = c.regions[i];
    c.from_side.push_back(SideOf(rr.region, rr.dims.data(), true, c.from_base[i]));
    c.to_side.push_back(SideOf(rr.region, rr.dims.data(), false, c.to_base[i]));
  }
  return c;
}

// The reference copy of the in-process executor (executor.cc): memcpy per run.
inline void ExecutorCopy(const plan::Region& r, const plan::RegionDim* dims, const uint8_t* from,
                         uint8_t* to) {
  plan::ForEachRun(r, dims, [&](int64_t f, int64_t t, int64_t n) {
    if (n > 0) std::memcpy(to + t, from + f, n);
  });
}

// The stream a pack must produce: every run in order, each region at its packed offset.
inline void AppendRuns(const plan::Region& r, const plan::RegionDim* dims, const uint8_t* from,
                       int64_t from_base, uint8_t* stream) {
  int64_t at = 0;
  plan::ForEachRun(r, dims, [&](int64_t f, int64_t, int64_t n) {
    std::memcpy(stream + at, from + from_base + f, n);
    at += n;
  });
}

// The copy kernel's host twin: every unit of the batch, located as a thread does.
inline ::testing::AssertionResult HostCopy(const CopyBatch& batch, const uint8_t* from,
                                           uint8_t* to) {
  const int32_t n = static_cast<int32_t>(batch.entries.size());
  for (uint64_t u = 0; u < batch.total_units; ++u) {
    const int32_t i = FindCopyEntry(batch.entries.data(), 0, n - 1, u);
    const CopyEntry& e = batch.entries[i];
    if (u < e.units_begin || u - e.units_begin >= e.units) {
      return ::testing::AssertionFailure()
             << "unit " << u << " found in copy entry " << i << ", which holds [" << e.units_begin
             << ", " << e.units_begin + e.units << ")";
    }
    const CopyUnitAddress a = LocateCopyUnit(e, u - e.units_begin);
    std::memcpy(to + a.to_offset, from + a.from_offset, a.width);
  }
  return ::testing::AssertionSuccess();
}

// A plan region as a copy region, its two sides moved by the bases.
inline CopyRegion CopyRegionOf(const plan::Region& r, const plan::RegionDim* dims,
                               int64_t from_base, int64_t to_base) {
  CopyRegion c;
  c.from_offset = from_base + r.from_offset;
  c.to_offset = to_base + r.to_offset;
  c.run_bytes = r.run_bytes;
  c.ndims = r.ndims;
  for (int d = 0; d < r.ndims; ++d) {
    c.count[d] = dims[d].count;
    c.from_stride[d] = dims[d].from_stride;
    c.to_stride[d] = dims[d].to_stride;
  }
  return c;
}

// The copy regions of a random batch (each region in its own slices).
inline std::vector<CopyRegion> CopyRegionsOf(const RandomBatch& c) {
  std::vector<CopyRegion> out;
  for (size_t i = 0; i < c.regions.size(); ++i) {
    out.push_back(
        CopyRegionOf(c.regions[i].region, c.regions[i].dims.data(), c.from_base[i], c.to_base[i]));
  }
  return out;
}

}  // namespace reshard::cuda::testing
