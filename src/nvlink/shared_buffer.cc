#include "src/nvlink/shared_buffer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "absl/strings/str_format.h"

namespace reshard::nvlink {
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
  static std::atomic<uint64_t> counter{0};
  const std::string name =
      absl::StrFormat("/reshard-%d-%d-%s", getpid(), counter.fetch_add(1), Sanitize(tag));
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

int RemoveSharedObjectsOf(int64_t pid) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  const std::string a = absl::StrFormat("reshard-%d-", pid);
  const std::string b = absl::StrFormat("reshard-board-%d-", pid);
  int removed = 0;
  while (struct dirent* ent = readdir(dir)) {
    const std::string name = ent->d_name;
    if (name.rfind(a, 0) == 0 || name.rfind(b, 0) == 0) {
      removed += shm_unlink(("/" + name).c_str()) == 0;
    }
  }
  closedir(dir);
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

}  // namespace reshard::nvlink
