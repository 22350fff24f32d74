// Builds the batch descriptors of the pack and unpack kernels (pack_index.h) on the host:
// the regions' units, their widths and prefix sums. Pure host code; needs no CUDA.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "src/cuda/pack_index.h"

namespace reshard::cuda {

// One side of a region, as the kernels see it: `run_bytes` contiguous bytes at `offset`, repeated
// over `ndims` outer dims (outermost first) with byte strides. Mirrors one side of plan::Region.
struct StridedRegion {
  int64_t offset = 0;  // Bytes from the strided buffer's base to the first run.
  int64_t run_bytes = 0;
  int32_t ndims = 0;
  int64_t count[kMaxPackDims] = {};
  int64_t stride[kMaxPackDims] = {};  // Bytes; any sign (reads may alias, writes must not).
};

struct PackBatchOptions {
  // Alignment (a power of two) that the strided and packed base pointers will have at every
  // launch; the launch checks it. cudaMalloc gives 256, pinned host memory a page.
  int64_t strided_base_align = kMaxPackWidth;
  int64_t packed_base_align = kMaxPackWidth;
  // Each region starts in the stream at a multiple of this (a power of two); 1 packs densely,
  // kMaxPackWidth lets every region keep 16-byte units when its own offsets allow.
  int64_t region_align = 1;
  // Stream offset of the first region.
  int64_t packed_begin = 0;
};

// A batch: its non-empty regions in stream order, and the totals. Regions with no bytes are
// dropped; packed_offsets[i] is where input region i starts in the stream (also for empty ones).
struct PackBatch {
  std::vector<PackEntry> entries;
  std::vector<int64_t> packed_offsets;
  uint64_t total_units = 0;
  int64_t packed_end = 0;  // One past the last stream byte (packed_begin + bytes + padding).
  int64_t bytes = 0;       // Payload bytes moved.
  int64_t strided_base_align = kMaxPackWidth;
  int64_t packed_base_align = kMaxPackWidth;
};

// Builds a batch. InvalidArgument when a region has a negative run length or count, more than
// kMaxPackDims dims, an alignment is not a power of two, or the sizes overflow int64. The batch
// does not know the strided buffer's size: every region must lie inside it, as the regions of a
// plan do by construction (net and nvlink bounds-check what peers send before it gets here).
[[nodiscard]] absl::StatusOr<PackBatch> BuildPackBatch(absl::Span<const StridedRegion> regions,
                                                       const PackBatchOptions& options = {});

// Appends the regions of `part` to `batch`, so that one launch moves both: their units follow
// batch's, and their stream offsets stay as `part` was built (PackBatchOptions::packed_begin at
// or past batch->packed_end: streams of several parts may leave gaps between them).
// InvalidArgument when `part`'s stream starts before batch's ends (an empty batch ends at 0) or
// the two were built for other base alignments.
[[nodiscard]] absl::Status AppendPackBatch(const PackBatch& part, PackBatch* batch);

// A strided-to-strided copy region: `run_bytes` contiguous bytes on both sides, repeated over
// `ndims` outer dims (outermost first) with each side's byte strides. Mirrors plan::Region with
// its dims inline (a region cut into pieces keeps its own counts).
struct CopyRegion {
  int64_t from_offset = 0;
  int64_t to_offset = 0;
  int64_t run_bytes = 0;
  int32_t ndims = 0;
  int64_t count[kMaxPackDims] = {};
  int64_t from_stride[kMaxPackDims] = {};
  int64_t to_stride[kMaxPackDims] = {};

  // run_bytes times every count (the caller keeps it inside int64, as plan regions are).
  int64_t bytes() const {
    int64_t b = run_bytes;
    for (int d = 0; d < ndims; ++d) b *= count[d];
    return b;
  }
  // One side as a pack region, its offset moved by `base`.
  StridedRegion FromSide(int64_t base = 0) const { return Side(true, base); }
  StridedRegion ToSide(int64_t base = 0) const { return Side(false, base); }

 private:
  StridedRegion Side(bool from, int64_t base) const {
    StridedRegion s;
    s.offset = base + (from ? from_offset : to_offset);
    s.run_bytes = run_bytes;
    s.ndims = ndims;
    for (int d = 0; d < ndims; ++d) {
      s.count[d] = count[d];
      s.stride[d] = from ? from_stride[d] : to_stride[d];
    }
    return s;
  }
};

struct CopyBatchOptions {
  // Alignments (powers of two) the source and destination base pointers will have.
  int64_t from_base_align = kMaxPackWidth;
  int64_t to_base_align = kMaxPackWidth;
};

// A batch of strided-to-strided copies for one launch: its non-empty regions, in order.
struct CopyBatch {
  std::vector<CopyEntry> entries;
  uint64_t total_units = 0;
  int64_t bytes = 0;
  int64_t from_base_align = kMaxPackWidth;
  int64_t to_base_align = kMaxPackWidth;
};

// Builds a copy batch; InvalidArgument as BuildPackBatch. The destination bytes of the regions
// must not overlap (each written once); reads may.
[[nodiscard]] absl::StatusOr<CopyBatch> BuildCopyBatch(absl::Span<const CopyRegion> regions,
                                                       const CopyBatchOptions& options = {});

// The kernels' host twins (the same index arithmetic, a run at a time: a run's units are
// consecutive on both sides), for devices emulated on the host (runtime.h) and CPU tests.
// Gathers every region of `batch` from `strided` into the stream at `packed`, and the scatter
// back.
void PackOnHost(const PackBatch& batch, const uint8_t* strided, uint8_t* packed);
void UnpackOnHost(const PackBatch& batch, const uint8_t* packed, uint8_t* strided);
// Copies every region of `batch` from `from` to `to`.
void CopyOnHost(const CopyBatch& batch, const uint8_t* from, uint8_t* to);

}  // namespace reshard::cuda
