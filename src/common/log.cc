#include "src/common/log.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"

namespace reshard::log {
namespace {

const char* LevelName(Level level) {
  switch (level) {
    case kError:
      return "error";
    case kWarning:
      return "warning";
    case kInfo:
      return "info";
    case kDebug:
      return "debug";
  }
  return "?";
}

Level ReadThreshold() {
  const char* env = std::getenv("RESHARD_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return kWarning;
  Level level = kWarning;
  if (!ParseLevel(env, &level)) {
    Write(kWarning, absl::StrFormat("RESHARD_LOG_LEVEL=\"%s\" is not error, warning, info, "
                                    "debug or 0-3; using warning",
                                    env));
    return kWarning;
  }
  return level;
}

}  // namespace

bool ParseLevel(const std::string& text, Level* level) {
  const std::string t = absl::AsciiStrToLower(text);
  int n = -1;
  if (t == "error") n = kError;
  if (t == "warning" || t == "warn") n = kWarning;
  if (t == "info") n = kInfo;
  if (t == "debug") n = kDebug;
  if (n < 0 && (!absl::SimpleAtoi(t, &n) || n < kError || n > kDebug)) return false;
  *level = static_cast<Level>(n);
  return true;
}

Level Threshold() {
  static const Level threshold = ReadThreshold();
  return threshold;
}

void Write(Level level, const std::string& message) {
  const std::string line = absl::StrFormat("reshard[%d] %s: %s\n", static_cast<int>(getpid()),
                                           LevelName(level), message);
  // One write so lines of concurrent ranks and threads never interleave; stderr is unbuffered.
  ssize_t rc = ::write(STDERR_FILENO, line.data(), line.size());
  (void)rc;
}

}  // namespace reshard::log
