// RESHARD_LOG: the one way the library writes diagnostics (stderr, one line each).
//
//   RESHARD_LOG(kWarning, "UCX refused peer error handling towards rank %d", peer);
//
// Levels: kError, kWarning (default threshold), kInfo, kDebug. RESHARD_LOG_LEVEL sets the
// threshold by name (error, warning, info, debug) or number (0-3), read once per process; an
// unknown value keeps the default and says so once. Arguments are not evaluated when the level
// is below the threshold. Thread-safe (one write(2) per line).
#pragma once

#include <string>

#include "absl/strings/str_format.h"

namespace reshard::log {

enum Level : int { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

// The threshold from RESHARD_LOG_LEVEL (kWarning when unset).
Level Threshold();
inline bool Enabled(Level level) { return level <= Threshold(); }
// Writes "reshard[<pid>] <level>: <message>\n" to stderr in one write.
void Write(Level level, const std::string& message);

// Parses a RESHARD_LOG_LEVEL value; false when it is none of the accepted spellings.
bool ParseLevel(const std::string& text, Level* level);

}  // namespace reshard::log

#define RESHARD_LOG(level, ...)                                                     \
  do {                                                                              \
    if (::reshard::log::Enabled(::reshard::log::level)) {                           \
      ::reshard::log::Write(::reshard::log::level, ::absl::StrFormat(__VA_ARGS__)); \
    }                                                                               \
  } while (0)
