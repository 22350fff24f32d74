#include "tools/reshard/tile_fill.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace reshard::cli {
namespace {

// Calls fn(element offset in the buffer, global flat index) for every element of `tile`, run
// by run along the innermost dim.
template <typename Fn>
void ForEachElement(const LocalTile& tile, Fn&& fn) {
  const size_t nd = tile.lo.size();
  for (size_t d = 0; d < nd; ++d) {
    if (tile.hi[d] <= tile.lo[d]) return;
  }
  if (nd == 0) {
    fn(tile.offset, int64_t{0});
    return;
  }
  std::vector<int64_t> idx(nd, 0);
  const int64_t inner = tile.hi[nd - 1] - tile.lo[nd - 1];
  while (true) {
    int64_t offset = tile.offset, global = 0;
    for (size_t d = 0; d < nd; ++d) {
      offset += idx[d] * tile.strides[d];
      global = global * tile.global_shape[d] + tile.lo[d] + idx[d];
    }
    for (int64_t i = 0; i < inner; ++i) fn(offset + i * tile.strides[nd - 1], global + i);
    if (nd == 1) return;
    size_t d = nd - 1;
    while (true) {
      --d;
      if (++idx[d] < tile.hi[d] - tile.lo[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
  }
}

}  // namespace

uint64_t PatternValue(uint64_t epoch, uint64_t tensor, int64_t index) {
  uint64_t x = (epoch << 48) ^ (tensor << 40) ^ static_cast<uint64_t>(index);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void FillTile(const LocalTile& tile, uint64_t tensor, uint64_t epoch, void* base) {
  auto* bytes = static_cast<uint8_t*>(base);
  const int eb = DTypeSize(tile.dtype);
  ForEachElement(tile, [&](int64_t off, int64_t g) {
    const uint64_t v = PatternValue(epoch, tensor, g);
    std::memcpy(bytes + off * eb, &v, static_cast<size_t>(eb));
  });
}

void PoisonTile(const LocalTile& tile, void* base) {
  auto* bytes = static_cast<uint8_t*>(base);
  const int eb = DTypeSize(tile.dtype);
  ForEachElement(tile, [&](int64_t off, int64_t) { std::memset(bytes + off * eb, 0xA5, eb); });
}

absl::Status VerifyTile(const LocalTile& tile, uint64_t tensor, uint64_t epoch, int rank,
                        const void* base) {
  const auto* bytes = static_cast<const uint8_t*>(base);
  const int eb = DTypeSize(tile.dtype);
  int64_t bad = -1;
  ForEachElement(tile, [&](int64_t off, int64_t g) {
    if (bad >= 0) return;
    const uint64_t v = PatternValue(epoch, tensor, g);
    if (std::memcmp(bytes + off * eb, &v, static_cast<size_t>(eb)) != 0) bad = g;
  });
  if (bad < 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("tensor \"", tile.tensor, "\" on rank ", rank,
                                          ": element ", bad, " (flat index) does not hold epoch ",
                                          epoch, "'s value (tile [", absl::StrJoin(tile.lo, ","),
                                          "] to [", absl::StrJoin(tile.hi, ","), "))"));
}

}  // namespace reshard::cli
