// reshard: refit model weights from trainer ranks to inference ranks, moving only the regions
// each destination needs. Include this header; link reshard::reshard (CMake) or `reshard`
// (pkg-config). docs/api.md walks through a complete example.
#pragma once

#include "reshard/communicator.h"  // IWYU pragma: export
#include "reshard/refit.h"         // IWYU pragma: export
#include "reshard/spec.h"          // IWYU pragma: export

#define RESHARD_VERSION_MAJOR 0
#define RESHARD_VERSION_MINOR 1
#define RESHARD_VERSION_PATCH 0

namespace reshard {
// "0.1.0"
const char* Version();
}  // namespace reshard
