// Verification fills: every source element gets a strong hash of (tensor, global index, epoch);
// every destination element is checked against the same function. Shared by the in-process
// executor and the multi-process runs.
#pragma once

#include <cstdint>

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
