// Identities of processes and hosts, for watching same-host peers whose transport cannot report
// their loss (UCX's shared-memory transports refuse peer error handling).
//
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace reshard {

// This machine's boot id (/proc/sys/kernel/random/boot_id): processes with the same one run on
// one kernel. Their pids mean the same process only inside one pid namespace (containers on
// one host share the boot id): compare PidNamespace() too before reading another's pid.
std::string HostIdentity();

// The pid namespace of this process: the inode of /proc/self/ns/pid, 0 when unreadable.
uint64_t PidNamespace();

// A process, robust to pid reuse: pid plus its start time (clock ticks after boot, field 22 of
// /proc/<pid>/stat).
struct ProcessId {
  int64_t pid = 0;
  uint64_t start_time = 0;

  // This process.
  static ProcessId Self();
  // Process `pid` as it runs now; NotFound when /proc has no such process.
  [[nodiscard]] static absl::StatusOr<ProcessId> Of(int64_t pid);
  // "pid:start_time".
  std::string Encode() const;
  // InvalidArgument when `text` is not "pid:start_time".
  [[nodiscard]] static absl::StatusOr<ProcessId> Decode(const std::string& text);
};

// False once `id` exited, was killed (a zombie counts as gone) or its pid belongs to another
// process now; true while it runs, sleeps or is stopped. One read of /proc/<pid>/stat.
bool ProcessAlive(const ProcessId& id);

}  // namespace reshard
