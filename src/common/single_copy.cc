#include "src/common/single_copy.h"

#include <sys/types.h>
#include <sys/uio.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace reshard {
namespace {

absl::Status Refused(int err, const std::string& what) {
  const std::string message = absl::StrFormat("%s: %s", what, std::strerror(err));
  switch (err) {
    case EPERM:
    case EACCES:
      return absl::PermissionDeniedError(message);
    case ESRCH:
      return absl::UnavailableError(message);
    case ENOSYS:
      return absl::UnimplementedError(message);
    default:
      return absl::DataLossError(message);
  }
}

}  // namespace

absl::Status SingleCopyWriter::Probe(int32_t rank, int32_t peer, int64_t pid,
                                     uint64_t token_address, uint64_t token) {
  uint64_t seen = 0;
  iovec local{&seen, sizeof(seen)};
  iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(token_address)), sizeof(seen)};
  const ssize_t n = process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
  const std::string what = absl::StrFormat(
      "rank %d cannot write into rank %d's memory (pid %d) with process_vm_writev", rank, peer,
      pid);
  if (n == static_cast<ssize_t>(sizeof(seen))) {
    if (seen == token) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": pid ", pid, " is another process (its probe token differs)"));
  }
  return Refused(n < 0 ? errno : EFAULT, what);
}

const uint64_t* SingleCopyWriter::OwnToken() {
  static const uint64_t token = [] {
    std::random_device rd;
    uint64_t t = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
    return t == 0 ? uint64_t{1} : t;
  }();
  return &token;
}

SingleCopyWriter::SingleCopyWriter(int32_t rank, int32_t peer, int64_t pid)
    : rank_(rank), peer_(peer), pid_(pid), local_(kMaxRuns), remote_(kMaxRuns) {}

absl::Status SingleCopyWriter::Add(const void* local, uint64_t remote, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (queued_ == kMaxRuns) {
    absl::Status written = Write();
    if (!written.ok()) return written;
  }
  local_[queued_] = iovec{const_cast<void*>(local), bytes};
  remote_[queued_] = iovec{reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), bytes};
  queued_++;
  return absl::OkStatus();
}

absl::Status SingleCopyWriter::Write() {
  // local_[i] and remote_[i] have the same length: a short count ends inside one run pair,
  // and the next call resumes there.
  size_t first = 0;
  while (first < queued_) {
    const ssize_t n = process_vm_writev(static_cast<pid_t>(pid_), &local_[first], queued_ - first,
                                        &remote_[first], queued_ - first, 0);
    calls_++;
    if (n <= 0) {
      const int err = n < 0 ? errno : EFAULT;
      if (err == EINTR) continue;
      const size_t runs = queued_ - first;
      queued_ = 0;
      return Refused(err, absl::StrFormat("rank %d: a single-copy write of %d run(s) into rank "
                                          "%d (pid %d) failed",
                                          rank_, runs, peer_, pid_));
    }
    bytes_ += n;
    size_t left = static_cast<size_t>(n);
    while (first < queued_ && left >= local_[first].iov_len) left -= local_[first++].iov_len;
    if (left > 0) {
      local_[first].iov_base = static_cast<char*>(local_[first].iov_base) + left;
      local_[first].iov_len -= left;
      remote_[first].iov_base = static_cast<char*>(remote_[first].iov_base) + left;
      remote_[first].iov_len -= left;
    }
  }
  queued_ = 0;
  return absl::OkStatus();
}

}  // namespace reshard
