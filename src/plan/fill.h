// Verification fills: every source element gets a strong hash of (tensor, global index, epoch);
// every destination element is checked against the same function. Shared by the in-process
// executor and the multi-process runs.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "src/plan/spec.h"
#include "src/plan/tiling.h"

namespace reshard::plan {

// Writes the fill of `epoch` into `tile` of `tensor` on `side`, laid out per the layout's view
// inside `buffer` (the rank's buffer for that tensor and side).
void FillTile(const RefitSpec& spec, size_t tensor, Side side, const Box& tile, uint64_t epoch,
              uint8_t* buffer);

// Checks every element of a destination tile. On mismatch: DataLoss naming the tensor, rank and
// global index (as a coordinate tuple).
[[nodiscard]] absl::Status VerifyTile(const RefitSpec& spec, size_t tensor, const Box& tile,
                                      uint64_t epoch, int32_t rank, const uint8_t* buffer);

// The fill of a quantized tensor's source (quantized source `q` of a lowered spec,
// quant_spec.h), written into the user's source buffer: real numbers of its dtype, most with
// magnitudes over a few binades, a few zeros of both signs, subnormals, NaN of both signs and
// +-Inf, and rarely a huge value (a block's scale then comes from it), each a hash of the tensor,
// global index and epoch.
// A requantized FP8 source (QuantizedSource::requantized) gets random FP8 bytes (every code:
// zeros, subnormals, NaN, e5m2's Inf) and its tile's source scales, written into `user_scales`
// per qs.src_scales, random per global block: fp32 scales of 2^-12 to 2^12, rarely tiny (the
// products round or underflow) or huge (they overflow to Inf); E8M0 bytes around 127, rarely
// 0, 254 or 255 (NaN).
void FillQuantizedSourceTile(const RefitSpec& lowered, size_t q, const Box& tile, uint64_t epoch,
                             uint8_t* user_buffer, uint8_t* user_scales = nullptr);
// The box of source blocks (qs.src_block) that `tile` of a requantized source covers: the
// rank's tile of the source scales (a dim of one block: [0, 1)).
Box SourceScaleBox(const QuantizedSource& qs, const Box& tile);
// What the destination of quantized source `q` must hold after a refit of `epoch`: the FP8
// elements of the whole tensor and its scales, row-major over the shape and the blocked shape.
struct QuantizedExpectation {
  std::vector<uint8_t> elements;
  std::vector<uint8_t> scales;
};
QuantizedExpectation ExpectQuantized(const RefitSpec& lowered, size_t q, uint64_t epoch);
// Checks a destination tile of `tensor` against `expected`, row-major over the whole tensor
// (elements of the tensor's dtype). Errors as VerifyTile.
[[nodiscard]] absl::Status VerifyTileAgainst(const RefitSpec& spec, size_t tensor, const Box& tile,
                                             int32_t rank, const uint8_t* buffer,
                                             const uint8_t* expected);

// Calls fn(element_offset, global_flat_index) for every element of `tile` under `layout`.
template <typename Fn>
void ForEachElement(const Layout& layout, const std::vector<int64_t>& shape, const Box& tile,
                    Fn&& fn) {
  if (tile.empty()) return;
  std::array<int64_t, kMaxTensorDims> strides;
  TileStrides(layout, tile, strides);
  const int nd = tile.ndim;
  if (nd == 0) {
    fn(layout.view.offset, int64_t{0});
    return;
  }
  std::array<int64_t, kMaxTensorDims> global_strides{};
  int64_t gs = 1;
  for (int d = nd - 1; d >= 0; --d) {
    global_strides[d] = gs;
    gs *= shape[d];
  }
  std::array<int64_t, kMaxTensorDims> idx{};
  const int64_t inner = tile.extent(nd - 1);
  while (true) {
    int64_t offset = layout.view.offset, global = 0;
    for (int d = 0; d < nd - 1; ++d) {
      offset += idx[d] * strides[d];
      global += (tile.lo[d] + idx[d]) * global_strides[d];
    }
    global += tile.lo[nd - 1];
    for (int64_t i = 0; i < inner; ++i) fn(offset + i * strides[nd - 1], global + i);
    int d = nd - 2;
    while (d >= 0) {
      if (++idx[d] < tile.extent(d)) break;
      idx[d] = 0;
      --d;
    }
    if (d < 0) return;
  }
}

}  // namespace reshard::plan
