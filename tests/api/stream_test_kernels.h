// Kernels for the stream-ordered refit test (api_stream_refit_test), launched on a caller's
// stream: a slow producer of source values, and a reader of destinations.
#pragma once

#include <cstdint>

namespace reshard::testing {

// One thread that spins on the device's global timer for `nanoseconds` (work that keeps the
// stream busy), then returns.
void LaunchSpin(void* stream, int64_t nanoseconds);
// out[r * cols + c] = base + (row0 + r) * total_cols + c for a rows x cols tile.
void LaunchFillRows(void* stream, int32_t* out, int64_t rows, int64_t cols, int64_t row0,
                    int64_t total_cols, int32_t base);
// to[i] = from[i] for i < n.
void LaunchCopy(void* stream, const int32_t* from, int32_t* to, int64_t n);

}  // namespace reshard::testing
