// The index arithmetic of the pack and unpack kernels, compiled for host and device.
//
// A pack batch gathers strided regions of one buffer into one contiguous stream (pack) or
// scatters the stream back (unpack). The batch is flattened into "units": every region moves in
// units of `width` bytes (16, 8, 4, 2 or 1: the largest that divides its run length, its offsets
// and strides, and the alignment of both base pointers), and a region's units are numbered in
// stream order after those of the regions before it (`units_begin`, an exclusive prefix sum).
// A thread given a unit finds its region by a binary search over the batch and its two byte
// offsets by dividing the unit number by the run's units and the outer counts; nothing else loops.
//
// The kernels (pack_kernels.cu) and the host reference (tests/cuda/pack_index_test.cc) call the
// same functions, so the arithmetic is tested on machines without a GPU. Nothing here needs CUDA
// (RESHARD_HD, from src/common/host_device.h, is empty on a plain C++ compiler) or any other
// header: nvcc compiles it quickly.
// Batches are built on the host by BuildPackBatch (pack_batch.h).
#pragma once

#include <cstdint>

#include "src/common/host_device.h"

namespace reshard::cuda {

// The most outer dims a region may have (the planner's kMaxTensorDims; code that sees both
// asserts that they agree).
inline constexpr int kMaxPackDims = 8;
// The widest unit: one 16-byte vector load and store per thread.
inline constexpr int kMaxPackWidth = 16;

// One region of a batch, ready for the kernels (a plain struct copied to device memory).
struct PackEntry {
  uint64_t units_begin = 0;    // Units of the regions before this one.
  uint64_t units = 0;          // This region's units (bytes / width).
  uint64_t run_units = 0;      // Units per run (run_bytes / width).
  int64_t strided_offset = 0;  // StridedRegion::offset.
  int64_t packed_offset = 0;   // Bytes from the stream's base to this region's first byte.
  int32_t width = 1;           // Bytes per unit: 16, 8, 4, 2 or 1.
  int32_t ndims = 0;
  int64_t count[kMaxPackDims] = {};
  int64_t stride[kMaxPackDims] = {};
};

// The bytes one unit moves: `width` bytes at strided_offset in the strided buffer and at
// packed_offset in the stream.
struct UnitAddress {
  int64_t strided_offset;
  int64_t packed_offset;
  int32_t width;
};

// Index of the entry holding unit `unit`, searched in entries[lo, hi] (inclusive; the caller
// knows unit lies in that range). Entries (PackEntry, CopyEntry) are non-empty and sorted by
// units_begin.
template <typename Entry>
RESHARD_HD inline int32_t FindEntryOfUnit(const Entry* entries, int32_t lo, int32_t hi,
                                          uint64_t unit) {
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (entries[mid].units_begin <= unit) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}
RESHARD_HD inline int32_t FindPackEntry(const PackEntry* entries, int32_t lo, int32_t hi,
                                        uint64_t unit) {
  return FindEntryOfUnit(entries, lo, hi, unit);
}

// The address of unit `k` of entry `e` (0 <= k < e.units), dividing in `Index`: uint32_t needs
// e.units <= UINT32_MAX (GPUs divide 32-bit integers several times faster than 64-bit ones).
template <typename Index>
RESHARD_HD inline UnitAddress LocatePackUnitAs(const PackEntry& e, Index k) {
  const Index run_units = static_cast<Index>(e.run_units);
  Index run = k / run_units;
  const Index within = k - run * run_units;
  int64_t strided = e.strided_offset + static_cast<int64_t>(within) * e.width;
  for (int32_t d = e.ndims - 1; d >= 0 && run != 0; --d) {
    const Index count = static_cast<Index>(e.count[d]);
    const Index next = run / count;
    strided += static_cast<int64_t>(run - next * count) * e.stride[d];
    run = next;
  }
  return {strided, e.packed_offset + static_cast<int64_t>(k) * e.width, e.width};
}

// The same, dividing in 32 bits whenever the entry allows.
RESHARD_HD inline UnitAddress LocatePackUnit(const PackEntry& e, uint64_t k) {
  return e.units <= UINT32_MAX ? LocatePackUnitAs<uint32_t>(e, static_cast<uint32_t>(k))
                               : LocatePackUnitAs<uint64_t>(e, k);
}

}  // namespace reshard::cuda

namespace reshard::cuda {

// A strided-to-strided copy (the CUDA IPC fan-out: a region of any rank, read from one buffer
// and written into another with its own strides, in one launch). Units as in a pack entry, but
// both sides are strided: a unit's two addresses come from the same run index and outer counts
// with each side's strides, so there is no stream in between.
struct CopyEntry {
  uint64_t units_begin = 0;  // Units of the entries before this one.
  uint64_t units = 0;        // This entry's units (bytes / width).
  uint64_t run_units = 0;    // Units per run.
  int64_t from_offset = 0;   // Bytes from the source base to the first run.
  int64_t to_offset = 0;     // Bytes from the destination base to the first run.
  int32_t width = 1;         // Bytes per unit: 16, 8, 4, 2 or 1.
  int32_t ndims = 0;
  int64_t count[kMaxPackDims] = {};
  int64_t from_stride[kMaxPackDims] = {};  // Bytes, any sign (reads may alias).
  int64_t to_stride[kMaxPackDims] = {};    // Bytes; writes never alias.
};

// The bytes one copy unit moves: `width` bytes from `from_offset` to `to_offset`.
struct CopyUnitAddress {
  int64_t from_offset;
  int64_t to_offset;
  int32_t width;
};

// Index of the copy entry holding unit `unit` in entries[lo, hi] (as FindPackEntry).
RESHARD_HD inline int32_t FindCopyEntry(const CopyEntry* entries, int32_t lo, int32_t hi,
                                        uint64_t unit) {
  return FindEntryOfUnit(entries, lo, hi, unit);
}

// The two addresses of unit `k` of entry `e` (0 <= k < e.units), dividing in `Index`.
template <typename Index>
RESHARD_HD inline CopyUnitAddress LocateCopyUnitAs(const CopyEntry& e, Index k) {
  const Index run_units = static_cast<Index>(e.run_units);
  Index run = k / run_units;
  const int64_t within = static_cast<int64_t>(k - run * run_units) * e.width;
  int64_t from = e.from_offset + within;
  int64_t to = e.to_offset + within;
  for (int32_t d = e.ndims - 1; d >= 0 && run != 0; --d) {
    const Index count = static_cast<Index>(e.count[d]);
    const Index next = run / count;
    const int64_t i = static_cast<int64_t>(run - next * count);
    from += i * e.from_stride[d];
    to += i * e.to_stride[d];
    run = next;
  }
  return {from, to, e.width};
}

// The same, dividing in 32 bits whenever the entry allows.
RESHARD_HD inline CopyUnitAddress LocateCopyUnit(const CopyEntry& e, uint64_t k) {
  return e.units <= UINT32_MAX ? LocateCopyUnitAs<uint32_t>(e, static_cast<uint32_t>(k))
                               : LocateCopyUnitAs<uint64_t>(e, k);
}

}  // namespace reshard::cuda
