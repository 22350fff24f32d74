#include "src/common/process.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace reshard {
namespace {

// State and start time of /proc/<pid>/stat; false when it cannot be read. The command name
// (field 2) is in parentheses and may contain spaces: parse after its last ')'.
bool ReadStat(int64_t pid, char* state, uint64_t* start_time) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text;
  if (!std::getline(in, text)) return false;
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(text).substr(close + 2), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state); field 22 (starttime) is fields[19].
  if (fields.size() < 20 || fields[0].empty()) return false;
  *state = fields[0][0];
  return absl::SimpleAtoi(fields[19], start_time);
}

}  // namespace

std::string HostIdentity() {
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return boot.empty() ? "unknown-boot-id" : boot;
}

uint64_t PidNamespace() {
  static const uint64_t ns = [] {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : uint64_t{0};
  }();
  return ns;
}

ProcessId ProcessId::Self() {
  absl::StatusOr<ProcessId> self = Of(getpid());
  return self.ok() ? *self : ProcessId{getpid(), 0};
}

absl::StatusOr<ProcessId> ProcessId::Of(int64_t pid) {
  ProcessId id{pid, 0};
  char state = 0;
  if (pid <= 0 || !ReadStat(pid, &state, &id.start_time)) {
    return absl::NotFoundError(absl::StrCat("no process ", pid, " in /proc"));
  }
  return id;
}

std::string ProcessId::Encode() const { return absl::StrCat(pid, ":", start_time); }

absl::StatusOr<ProcessId> ProcessId::Decode(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  ProcessId id;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &id.pid) || id.pid <= 0 ||
      !absl::SimpleAtoi(parts[1], &id.start_time)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text.substr(0, 64), "\" is not a process id (pid:start_time)"));
  }
  return id;
}

bool ProcessAlive(const ProcessId& id) {
  char state = 0;
  uint64_t start_time = 0;
  if (!ReadStat(id.pid, &state, &start_time)) return false;
  if (state == 'Z' || state == 'X' || state == 'x') return false;  // Exited, not yet reaped.
  return start_time == id.start_time;
}

}  // namespace reshard
