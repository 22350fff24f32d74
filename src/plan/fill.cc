#include "src/plan/fill.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/common/hash.h"
#include "src/common/json.h"

namespace reshard::plan {
namespace {

std::string Coordinates(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> coord(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    coord[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(coord, ", "), "]");
}

}  // namespace

void FillTile(const RefitSpec& spec, size_t tensor, Side side, const Box& tile, uint64_t epoch,
              uint8_t* buffer) {
  const TensorSpec& t = spec.tensors[tensor];
  const int elem = DTypeSize(t.dtype);
  const uint64_t key = HashString(t.name);
  ForEachElement(spec.layout(tensor, side), t.shape, tile, [&](int64_t offset, int64_t global) {
    const uint64_t v = FillValue(key, static_cast<uint64_t>(global), epoch);
    std::memcpy(buffer + offset * elem, &v, elem);
  });
}

absl::Status VerifyTile(const RefitSpec& spec, size_t tensor, const Box& tile, uint64_t epoch,
                        int32_t rank, const uint8_t* buffer) {
  const TensorSpec& t = spec.tensors[tensor];
  const int elem = DTypeSize(t.dtype);
  const uint64_t key = HashString(t.name);
  int64_t bad = -1;
  int64_t mismatches = 0;
  ForEachElement(t.dst, t.shape, tile, [&](int64_t offset, int64_t global) {
    const uint64_t v = FillValue(key, static_cast<uint64_t>(global), epoch);
    if (std::memcmp(buffer + offset * elem, &v, elem) != 0) {
      if (bad < 0) bad = global;
      ++mismatches;
    }
  });
  if (bad < 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "tensor %s: rank %d holds a wrong value at global index %s (%d of %d elements wrong)",
      json::QuoteForMessage(t.name), rank, Coordinates(t.shape, bad), mismatches, tile.NumElements()));
}

}  // namespace reshard::plan
