#include "src/common/shared_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "absl/strings/str_format.h"
#include "src/common/process.h"

namespace reshard {
namespace {

struct Entry {
  uintptr_t end;
  std::string name;
  int64_t mapped;
};

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
std::map<uintptr_t, Entry>& Registry() {
  static auto* registry = new std::map<uintptr_t, Entry>();
  return *registry;
}

std::string Sanitize(const std::string& tag) {
  std::string out;
  for (char c : tag.substr(0, 64)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    out.push_back(ok ? c : '_');
  }
  return out;
}

// Parses "<pid>.<pidns>-" at the start of `rest` (after "reshard-" or "reshard-board-").
bool ParseOwner(const std::string& rest, int64_t* pid, uint64_t* ns) {
  char* end = nullptr;
  errno = 0;
  const long long p = std::strtoll(rest.c_str(), &end, 10);
  if (errno != 0 || end == rest.c_str() || *end != '.' || p <= 0) return false;
  const char* ns_begin = end + 1;
  const unsigned long long n = std::strtoull(ns_begin, &end, 10);
  if (errno != 0 || end == ns_begin || *end != '-') return false;
  *pid = p;
  *ns = n;
  return true;
}

// Calls `f(name, pid)` for every reshard object of this pid namespace in /dev/shm.
template <typename F>
void ForEachObject(F&& f) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  while (struct dirent* ent = readdir(dir)) {
    const std::string name = ent->d_name;
    std::string rest;
    if (name.rfind("reshard-board-", 0) == 0) {
      rest = name.substr(14);
    } else if (name.rfind("reshard-", 0) == 0) {
      rest = name.substr(8);
    } else {
      continue;
    }
    int64_t pid = 0;
    uint64_t ns = 0;
    if (ParseOwner(rest, &pid, &ns) && ns == PidNamespace()) f(name, pid, dirfd(dir));
  }
  closedir(dir);
}

int64_t PageRound(int64_t bytes) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  return (bytes + page - 1) / page * page;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedBuffer>> SharedBuffer::Allocate(const std::string& tag,
                                                                     int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shared buffer \"%s\": size %d must be positive", tag, bytes));
  }
  // Once per process: objects that killed ranks of earlier jobs left behind go first.
  static std::once_flag swept;
  std::call_once(swept, [] { RemoveSharedObjectsOfDeadProcesses(); });
  static std::atomic<uint64_t> counter{0};
  const std::string name = absl::StrFormat("/reshard-%s-%d-%s", SharedObjectOwner(),
                                           counter.fetch_add(1), Sanitize(tag));
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("shm_open(%s): %s", name, std::strerror(errno)));
  }
  const int64_t mapped = PageRound(bytes);
  if (ftruncate(fd, mapped) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrFormat("ftruncate(%s, %d bytes): %s", name, mapped, std::strerror(err)));
  }
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrFormat("mmap(%s, %d bytes): %s", name, mapped, std::strerror(err)));
  }
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    Registry()[reinterpret_cast<uintptr_t>(p)] = {reinterpret_cast<uintptr_t>(p) + mapped, name,
                                                  mapped};
  }
  return std::unique_ptr<SharedBuffer>(
      new SharedBuffer(name, static_cast<uint8_t*>(p), bytes, mapped));
}

SharedBuffer::~SharedBuffer() {
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    Registry().erase(reinterpret_cast<uintptr_t>(data_));
  }
  munmap(data_, mapped_);
  shm_unlink(name_.c_str());
}

std::optional<SharedBuffer::Location> SharedBuffer::Lookup(const void* ptr, int64_t bytes) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto& registry = Registry();
  auto it = registry.upper_bound(p);
  if (it == registry.begin()) return std::nullopt;
  --it;
  if (p + static_cast<uintptr_t>(bytes) > it->second.end) return std::nullopt;
  return Location{it->second.name, static_cast<int64_t>(p - it->first), it->second.mapped};
}

std::string SharedObjectOwner() { return absl::StrFormat("%d.%d", getpid(), PidNamespace()); }

int RemoveSharedObjectsOf(int64_t pid) {
  int removed = 0;
  ForEachObject([&](const std::string& name, int64_t owner, int) {
    if (owner == pid) removed += shm_unlink(("/" + name).c_str()) == 0;
  });
  return removed;
}

int RemoveSharedObjectsOfDeadProcesses() {
  int removed = 0;
  const uid_t uid = geteuid();
  ForEachObject([&](const std::string& name, int64_t owner, int dir_fd) {
    struct stat st;
    if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != uid) return;
    if (kill(static_cast<pid_t>(owner), 0) == 0 || errno != ESRCH) return;  // Alive, or not ours.
    removed += shm_unlink(("/" + name).c_str()) == 0;
  });
  return removed;
}

absl::StatusOr<SharedMapping> SharedMapping::Open(const std::string& name, int64_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrFormat(
          "shared memory %s does not exist (its owner unlinked it or runs on another host)", name));
    }
    return absl::InternalError(absl::StrFormat("shm_open(%s): %s", name, std::strerror(err)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < bytes) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrFormat("shared memory %s holds %d bytes, fewer than the %d expected", name,
                        static_cast<int64_t>(st.st_size), bytes));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    return absl::InternalError(
        absl::StrFormat("mmap(%s, %d bytes): %s", name, bytes, std::strerror(err)));
  }
  SharedMapping m;
  m.data_ = static_cast<uint8_t*>(p);
  m.bytes_ = bytes;
  return m;
}

SharedMapping::SharedMapping(SharedMapping&& o) noexcept : data_(o.data_), bytes_(o.bytes_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}

SharedMapping& SharedMapping::operator=(SharedMapping&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) munmap(data_, bytes_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

SharedMapping::~SharedMapping() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

}  // namespace reshard
