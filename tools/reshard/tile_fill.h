// Test patterns for the per-rank programs (reshard-rank, reshard-bench-rank), on the public API
// only: every source element gets a value derived from (epoch, tensor, global flat index) by a
// strong 64-bit mix (DESIGN §9: never index % 256), so a piece put in the wrong place, a stale
// epoch or a missing piece shows up in VerifyTile.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "reshard/reshard.h"

namespace reshard::cli {

// The value of element `index` (flat, row-major over the global shape) of tensor number
// `tensor` in epoch `epoch`; the low DTypeSize bytes are stored.
uint64_t PatternValue(uint64_t epoch, uint64_t tensor, int64_t index);

// Writes epoch `epoch`'s pattern into every element of `tile` (elements at `base` + offsets).
void FillTile(const LocalTile& tile, uint64_t tensor, uint64_t epoch, void* base);
// Overwrites every element of `tile` with 0xA5 bytes.
void PoisonTile(const LocalTile& tile, void* base);
// DataLoss naming the tensor, the rank and the first wrong element when `tile` does not hold
// epoch `epoch`'s pattern.
[[nodiscard]] absl::Status VerifyTile(const LocalTile& tile, uint64_t tensor, uint64_t epoch,
                                      int rank, const void* base);

}  // namespace reshard::cli
