#include "src/common/status.h"

namespace reshard::internal {

void CheckFailed(const char* file, int line, const char* condition, const char* message) {
  std::fprintf(stderr, "reshard: internal check failed at %s:%d: %s %s\n", file, line, condition,
               message);
  std::fflush(stderr);
  std::abort();
}

}  // namespace reshard::internal
