#include "src/rendezvous/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace reshard::rendezvous {
namespace {

// Keys may hold any byte; file names keep [A-Za-z0-9_-] and escape the rest as %XX, so no name
// starts with '.', which is reserved for temporary files.
std::string EncodeKey(const std::string& key) {
  std::string out;
  for (unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '_' || ch == '-') {
      out.push_back(static_cast<char>(ch));
    } else {
      out.append(absl::StrFormat("%%%02X", ch));
    }
  }
  return out.empty() ? std::string("%") : out;  // "%" alone names the empty key
}

bool DecodeKey(const std::string& name, std::string* key) {
  key->clear();
  if (name == "%") return true;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] != '%') {
      key->push_back(name[i]);
      continue;
    }
    if (i + 2 >= name.size()) return false;
    int v = 0;
    for (int j = 1; j <= 2; ++j) {
      char c = name[i + j];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= c - '0';
      else if (c >= 'A' && c <= 'F')
        v |= c - 'A' + 10;
      else
        return false;
    }
    key->push_back(static_cast<char>(v));
    i += 2;
  }
  return true;
}

// Reads the whole file; NotFound when it does not exist.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(path);
    return absl::UnavailableError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      return absl::UnavailableError(absl::StrCat("read ", path, ": ", std::strerror(err)));
    }
    break;
  }
  close(fd);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& directory) {
  if (directory.empty()) return absl::InvalidArgumentError("file store directory is empty");
  if (mkdir(directory.c_str(), 0700) < 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("cannot create store directory ", directory, ": ", std::strerror(errno)));
  }
  // Whoever can write the directory can speak for every rank, and anyone who can read it learns
  // every rank's address: it must be this user's, reachable by nobody else, and not a link (a
  // directory another user created first under the expected name is refused, not trusted).
  struct stat st {};
  if (lstat(directory.c_str(), &st) < 0 || !S_ISDIR(st.st_mode)) {
    return absl::UnavailableError(
        absl::StrCat("store path ", directory, " is not a directory (symbolic links are refused)"));
  }
  if (st.st_uid != geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "store directory ", directory, " belongs to uid ", st.st_uid, ", not to this user (uid ",
        geteuid(), "); refusing a store another user controls"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "store directory %s has mode %04o; other users could read or forge records, so it must "
        "be accessible by its owner only (chmod 700)",
        directory, st.st_mode & 07777));
  }
  return std::unique_ptr<FileStore>(new FileStore(directory));
}

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  static std::atomic<uint64_t> counter{0};
  const std::string final_path = absl::StrCat(directory_, "/", EncodeKey(key));
  const std::string tmp_path =
      absl::StrCat(directory_, "/.tmp.", getpid(), ".", counter.fetch_add(1));
  int fd = open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("store Set \"", key, "\": open ", tmp_path, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < value.size()) {
    ssize_t n = write(fd, value.data() + done, value.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      unlink(tmp_path.c_str());
      return absl::UnavailableError(
          absl::StrCat("store Set \"", key, "\": write: ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  if (rename(tmp_path.c_str(), final_path.c_str()) < 0) {
    int err = errno;
    unlink(tmp_path.c_str());
    return absl::UnavailableError(
        absl::StrCat("store Set \"", key, "\": rename: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileStore::Get(const std::string& key, absl::Time deadline) {
  const std::string path = absl::StrCat(directory_, "/", EncodeKey(key));
  absl::Duration backoff = absl::Milliseconds(1);
  while (true) {
    absl::StatusOr<std::string> value = ReadFile(path);
    if (value.ok() || !absl::IsNotFound(value.status())) return value;
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("store key \"", key, "\" was not set before the deadline"));
    }
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, absl::Milliseconds(20));
  }
}

absl::Status FileStore::Delete(const std::string& key) {
  const std::string path = absl::StrCat(directory_, "/", EncodeKey(key));
  if (unlink(path.c_str()) < 0 && errno != ENOENT) {
    return absl::UnavailableError(
        absl::StrCat("store Delete \"", key, "\": unlink ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> FileStore::List(
    const std::string& prefix) {
  DIR* dir = opendir(directory_.c_str());
  if (dir == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("store List: opendir ", directory_, ": ", std::strerror(errno)));
  }
  std::vector<std::string> keys;
  while (dirent* entry = readdir(dir)) {
    std::string name = entry->d_name;
    if (name.empty() || name[0] == '.') continue;
    std::string key;
    if (!DecodeKey(name, &key)) continue;
    if (key.compare(0, prefix.size(), prefix) == 0) keys.push_back(std::move(key));
  }
  closedir(dir);
  std::sort(keys.begin(), keys.end());
  std::vector<std::pair<std::string, std::string>> out;
  for (std::string& key : keys) {
    absl::StatusOr<std::string> value = ReadFile(absl::StrCat(directory_, "/", EncodeKey(key)));
    if (!value.ok()) {
      if (absl::IsNotFound(value.status())) continue;
      return value.status();
    }
    out.emplace_back(std::move(key), *std::move(value));
  }
  return out;
}

}  // namespace reshard::rendezvous
