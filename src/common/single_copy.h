// Single-copy writes into a process of the same host (cross-memory attach): the sending
// process's kernel copies many runs straight from its memory into a peer's registered buffer
// with process_vm_writev, up to kMaxRuns runs per system call, through no intermediate buffer.
//
// Two users: the network engine's put delivery (src/net/delivery.h) to a peer that UCX reaches
// over shared memory, where UCX 1.13 would emulate each put with active messages (two copies
// and a handler per run; docs/data-plane.md, "Single copy on one host"), and the host fan-out
// backend (src/nvlink/host) into a domain peer's private memory. Both check first that the
// peer runs in this pid namespace and that the kernel allows it (same user, ptrace access, no
// seccomp filter). The writes are complete when Write() returns.
//
// Thread-compatible; Add and Write neither allocate nor lock.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace reshard {

class SingleCopyWriter {
 public:
  // Runs per system call (the kernel's UIO_MAXIOV).
  static constexpr size_t kMaxRuns = 1024;

  // Whether this process may write into process `pid` and that `pid` is rank `peer`: reads the
  // 8-byte `token` the peer published at `token_address` (a record naming a pid that was
  // reused, or another pid namespace's, reads something else). OK, or the refusal naming both
  // ranks: PermissionDenied for EPERM/EACCES, Unavailable for ESRCH, Unimplemented for ENOSYS
  // (a kernel without process_vm_*), FailedPrecondition when another token was read, DataLoss
  // otherwise.
  [[nodiscard]] static absl::Status Probe(int32_t rank, int32_t peer, int64_t pid,
                                          uint64_t token_address, uint64_t token);

  // A token for Probe: random, never 0, different in every process. Lives until exit.
  static const uint64_t* OwnToken();

  SingleCopyWriter(int32_t rank, int32_t peer, int64_t pid);

  // Queues `bytes` from `local` to `remote` in the peer; writes the queue first when full.
  [[nodiscard]] absl::Status Add(const void* local, uint64_t remote, size_t bytes);
  // Writes every queued run. OK once every byte is in the peer's memory; on error the peer's
  // buffer may hold part of the runs (the epoch fails, as with a failed put).
  [[nodiscard]] absl::Status Write();

  // Forgets queued runs (a failed epoch's).
  void Discard() { queued_ = 0; }

  int64_t calls() const { return calls_; }
  int64_t bytes() const { return bytes_; }
  int64_t pid() const { return pid_; }

 private:
  const int32_t rank_;
  const int32_t peer_;
  const int64_t pid_;
  std::vector<iovec> local_, remote_;  // kMaxRuns each, reserved once.
  size_t queued_ = 0;
  int64_t calls_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace reshard
