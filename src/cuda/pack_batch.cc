#include "src/cuda/pack_batch.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#include "absl/strings/str_format.h"
#include "src/common/checked.h"

namespace reshard::cuda {
namespace {

bool IsPowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// The largest power of two <= kMaxPackWidth dividing every value (0 divides nothing away).
int32_t CommonWidth(std::initializer_list<int64_t> values, int32_t width) {
  for (int64_t v : values) {
    while (width > 1 && v % width != 0) width /= 2;
  }
  return width;
}

}  // namespace

absl::StatusOr<PackBatch> BuildPackBatch(absl::Span<const StridedRegion> regions,
                                         const PackBatchOptions& options) {
  if (!IsPowerOfTwo(options.strided_base_align) || !IsPowerOfTwo(options.packed_base_align) ||
      !IsPowerOfTwo(options.region_align)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pack batch alignments must be powers of two (strided base %d, packed base %d, region %d)",
        options.strided_base_align, options.packed_base_align, options.region_align));
  }
  if (options.packed_begin < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pack batch stream offset %d is negative", options.packed_begin));
  }
  if (regions.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a pack batch holds at most %d regions, not %d", INT32_MAX, regions.size()));
  }
  PackBatch batch;
  batch.strided_base_align = options.strided_base_align;
  batch.packed_base_align = options.packed_base_align;
  batch.packed_offsets.reserve(regions.size());
  const int32_t base_width =
      CommonWidth({options.strided_base_align, options.packed_base_align}, kMaxPackWidth);
  int64_t cursor = options.packed_begin;
  for (size_t i = 0; i < regions.size(); ++i) {
    const StridedRegion& r = regions[i];
    if (r.ndims < 0 || r.ndims > kMaxPackDims) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pack region %d has %d outer dims; at most %d are supported", i, r.ndims, kMaxPackDims));
    }
    std::optional<int64_t> bytes = r.run_bytes;
    for (int d = 0; d < r.ndims; ++d) {
      if (r.count[d] < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "pack region %d has the negative count %d in dim %d", i, r.count[d], d));
      }
      bytes = CheckedMul(bytes, r.count[d]);
    }
    const std::optional<int64_t> aligned = CheckedAdd(
        cursor, (options.region_align - cursor % options.region_align) % options.region_align);
    if (r.run_bytes < 0 || !bytes || !aligned) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pack region %d has a negative run length or more bytes than int64 holds", i));
    }
    cursor = *aligned;
    batch.packed_offsets.push_back(cursor);
    if (*bytes == 0) continue;
    const std::optional<int64_t> end = CheckedAdd(cursor, *bytes);
    if (!end) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pack region %d ends past the int64 range of the stream", i));
    }
    PackEntry e;
    e.width = CommonWidth({r.run_bytes, r.offset, cursor}, base_width);
    for (int d = 0; d < r.ndims; ++d) {
      // A dim of count 1 never steps, so its stride does not limit the width.
      if (r.count[d] > 1) e.width = CommonWidth({r.stride[d]}, e.width);
      e.count[d] = r.count[d];
      e.stride[d] = r.stride[d];
    }
    e.ndims = r.ndims;
    e.units_begin = batch.total_units;
    e.units = static_cast<uint64_t>(*bytes / e.width);
    e.run_units = static_cast<uint64_t>(r.run_bytes / e.width);
    e.strided_offset = r.offset;
    e.packed_offset = cursor;
    batch.entries.push_back(e);
    batch.total_units += e.units;
    batch.bytes += *bytes;  // <= the stream's length, which fits.
    cursor = *end;
  }
  batch.packed_end = cursor;
  return batch;
}

absl::Status AppendPackBatch(const PackBatch& part, PackBatch* batch) {
  if (part.strided_base_align != batch->strided_base_align ||
      part.packed_base_align != batch->packed_base_align) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a pack batch built for base alignments %d/%d cannot join one built for %d/%d",
        part.strided_base_align, part.packed_base_align, batch->strided_base_align,
        batch->packed_base_align));
  }
  const int64_t begin = part.packed_offsets.empty() ? part.packed_end : part.packed_offsets[0];
  if (begin < batch->packed_end) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a pack batch whose stream starts at %d cannot follow one that ends at %d",
                        begin, batch->packed_end));
  }
  for (PackEntry e : part.entries) {
    e.units_begin += batch->total_units;
    batch->entries.push_back(e);
  }
  batch->packed_offsets.insert(batch->packed_offsets.end(), part.packed_offsets.begin(),
                               part.packed_offsets.end());
  batch->total_units += part.total_units;
  batch->bytes += part.bytes;
  batch->packed_end = part.packed_end;
  return absl::OkStatus();
}

absl::StatusOr<CopyBatch> BuildCopyBatch(absl::Span<const CopyRegion> regions,
                                         const CopyBatchOptions& options) {
  if (!IsPowerOfTwo(options.from_base_align) || !IsPowerOfTwo(options.to_base_align)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "copy batch alignments must be powers of two (source base %d, destination base %d)",
        options.from_base_align, options.to_base_align));
  }
  if (regions.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a copy batch holds at most %d regions, not %d", INT32_MAX, regions.size()));
  }
  CopyBatch batch;
  batch.from_base_align = options.from_base_align;
  batch.to_base_align = options.to_base_align;
  const int32_t base_width =
      CommonWidth({options.from_base_align, options.to_base_align}, kMaxPackWidth);
  for (size_t i = 0; i < regions.size(); ++i) {
    const CopyRegion& r = regions[i];
    if (r.ndims < 0 || r.ndims > kMaxPackDims) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "copy region %d has %d outer dims; at most %d are supported", i, r.ndims, kMaxPackDims));
    }
    std::optional<int64_t> bytes = r.run_bytes;
    for (int d = 0; d < r.ndims; ++d) {
      if (r.count[d] < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "copy region %d has the negative count %d in dim %d", i, r.count[d], d));
      }
      bytes = CheckedMul(bytes, r.count[d]);
    }
    if (r.run_bytes < 0 || !bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "copy region %d has a negative run length or more bytes than int64 holds", i));
    }
    if (*bytes == 0) continue;
    const std::optional<int64_t> total = CheckedAdd(batch.bytes, *bytes);
    if (!total) {
      return absl::InvalidArgumentError(
          absl::StrFormat("copy region %d takes the batch past the int64 range", i));
    }
    CopyEntry e;
    e.width = CommonWidth({r.run_bytes, r.from_offset, r.to_offset}, base_width);
    for (int d = 0; d < r.ndims; ++d) {
      if (r.count[d] > 1) e.width = CommonWidth({r.from_stride[d], r.to_stride[d]}, e.width);
      e.count[d] = r.count[d];
      e.from_stride[d] = r.from_stride[d];
      e.to_stride[d] = r.to_stride[d];
    }
    e.ndims = r.ndims;
    e.units_begin = batch.total_units;
    e.units = static_cast<uint64_t>(*bytes / e.width);
    e.run_units = static_cast<uint64_t>(r.run_bytes / e.width);
    e.from_offset = r.from_offset;
    e.to_offset = r.to_offset;
    batch.entries.push_back(e);
    batch.total_units += e.units;
    batch.bytes = *total;
  }
  return batch;
}

namespace {
// Calls move(strided_offset, packed_offset, bytes) once per run of `batch`.
template <typename Move>
void ForEachPackRun(const PackBatch& batch, Move move) {
  for (const PackEntry& e : batch.entries) {
    const uint64_t run = e.run_units > 0 ? e.run_units : e.units;
    for (uint64_t u = 0; u < e.units; u += run) {
      const UnitAddress a = LocatePackUnit(e, u);
      move(a.strided_offset, a.packed_offset,
           static_cast<size_t>(std::min(run, e.units - u) * static_cast<uint64_t>(a.width)));
    }
  }
}
}  // namespace

void PackOnHost(const PackBatch& batch, const uint8_t* strided, uint8_t* packed) {
  ForEachPackRun(batch,
                 [&](int64_t s, int64_t p, size_t n) { std::memcpy(packed + p, strided + s, n); });
}

void UnpackOnHost(const PackBatch& batch, const uint8_t* packed, uint8_t* strided) {
  ForEachPackRun(batch,
                 [&](int64_t s, int64_t p, size_t n) { std::memcpy(strided + s, packed + p, n); });
}

void CopyOnHost(const CopyBatch& batch, const uint8_t* from, uint8_t* to) {
  for (const CopyEntry& e : batch.entries) {
    const uint64_t run = e.run_units > 0 ? e.run_units : e.units;
    for (uint64_t u = 0; u < e.units; u += run) {
      const CopyUnitAddress a = LocateCopyUnit(e, u);
      std::memcpy(to + a.to_offset, from + a.from_offset,
                  static_cast<size_t>(std::min(run, e.units - u) * static_cast<uint64_t>(a.width)));
    }
  }
}

}  // namespace reshard::cuda
