// What the spec and model harnesses plan and verify: specs that cost milliseconds, decided from
// the spec alone before planning (a valid spec of a few hundred bytes may name 65,536 ranks or a
// 2^56-byte buffer, both within the documented limits).
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/common/checked.h"
#include "src/plan/dtype.h"
#include "src/plan/spec.h"

namespace reshard::plan {

struct SpecBudget {
  int32_t max_world;
  size_t max_tensors;
  int64_t max_bytes;  // Of every rank's buffers together, bounded as below.
};

// An upper bound of the bytes of `layout`'s buffers over all its ranks: every rank's buffer is
// at most the extent its view reaches for the whole tensor.
inline int64_t LayoutBytesBound(const TensorSpec& t, const Layout& layout) {
  const int64_t elem = DTypeSize(t.dtype);
  int64_t extent = 1;
  if (layout.view.strides.empty()) {
    for (int64_t d : t.shape) extent = SaturatingMul(extent, d);
  } else {
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (t.shape[d] == 0) return 0;
      extent = SaturatingAdd(extent, SaturatingMul(t.shape[d] - 1, layout.view.strides[d]));
    }
  }
  extent = SaturatingAdd(extent, layout.view.offset);
  return SaturatingMul(SaturatingMul(extent, elem), layout.mesh.size());
}

inline bool WithinBudget(const RefitSpec& spec, const SpecBudget& budget) {
  if (spec.WorldSize() > budget.max_world || spec.tensors.size() > budget.max_tensors) {
    return false;
  }
  int64_t bytes = 0;
  for (const TensorSpec& t : spec.tensors) {
    bytes = SaturatingAdd(bytes, LayoutBytesBound(t, t.src));
    bytes = SaturatingAdd(bytes, LayoutBytesBound(t, t.dst));
  }
  return bytes <= budget.max_bytes;
}

}  // namespace reshard::plan
