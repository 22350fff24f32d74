// reshard: refit model weights from trainer ranks to inference ranks, moving only the regions
// each destination needs. Include this header; link reshard::reshard (CMake) or `reshard`
// (pkg-config). docs/api.md walks through a complete example.
#pragma once

#include "reshard/communicator.h"  // IWYU pragma: export
#include "reshard/launch.h"        // IWYU pragma: export
#include "reshard/refit.h"         // IWYU pragma: export
#include "reshard/spec.h"          // IWYU pragma: export
#include "reshard/system.h"        // IWYU pragma: export
#include "reshard/version.h"       // IWYU pragma: export

namespace reshard {
// The library's version, RESHARD_VERSION_STRING of the build (e.g. "0.1.0").
const char* Version();
}  // namespace reshard
