#include "src/nvlink/signal_board.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/str_format.h"
#include "src/common/shared_memory.h"
#include "src/common/status.h"

namespace reshard::nvlink {

constexpr uint64_t kBoardMagic = 0x5245534852444232ULL;  // "RESHRDB2"

struct alignas(64) BoardHeader {
  uint64_t magic;
  uint64_t slots;
  alignas(64) uint64_t granted;     // Accessed through std::atomic_ref.
  alignas(64) uint64_t doorbell;    // Accessed through std::atomic_ref.
  uint32_t sleepers;                // Owner threads blocked on the doorbell (futex).
  alignas(64) uint64_t net_end_ns;  // Written before net_epoch (release).
  uint64_t net_epoch;
  alignas(64) uint64_t failed_epoch;         // Written after failure_reason (release).
  char failure_reason[kFailureReasonBytes];  // NUL-terminated.
};
static_assert(sizeof(BoardHeader) % 64 == 0);

namespace {

int64_t BoardBytes(int64_t slots) {
  return static_cast<int64_t>(sizeof(BoardHeader)) + slots * static_cast<int64_t>(sizeof(uint64_t));
}
uint64_t* SlotPtr(uint8_t* data, int64_t slot) {
  return reinterpret_cast<uint64_t*>(data + sizeof(BoardHeader)) + slot;
}
BoardHeader* Header(uint8_t* data) { return reinterpret_cast<BoardHeader*>(data); }

// The futex word of the doorbell: its low 32 bits (a futex is 32 bits wide; the doorbell never
// returns to the same low half while anybody waits on it).
static_assert(std::endian::native == std::endian::little);
uint32_t* DoorbellWord(BoardHeader* h) { return reinterpret_cast<uint32_t*>(&h->doorbell); }

// Bumps the doorbell and wakes the owner when it sleeps on it. Sequentially consistent with
// SignalBoard::WaitForRing: either the owner sees the new doorbell before it sleeps, or this
// sees the owner's sleepers count and wakes it (the futex re-checks the word in the kernel).
void RingDoorbell(BoardHeader* h) {
  std::atomic_ref<uint64_t>(h->doorbell).fetch_add(1, std::memory_order_seq_cst);
  if (std::atomic_ref<uint32_t>(h->sleepers).load(std::memory_order_seq_cst) != 0) {
    syscall(SYS_futex, DoorbellWord(h), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

// Lock byte 0 of the object through an open file description lock: held by the owner until its
// last descriptor closes (process exit included).
struct flock LockRequest(short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 1;
  return fl;
}

}  // namespace

absl::StatusOr<SignalBoard> SignalBoard::Create(const std::string& tag, int64_t slots) {
  static std::atomic<uint64_t> counter{0};
  SignalBoard b;
  b.name_ =
      absl::StrFormat("/reshard-board-%s-%d-%s", SharedObjectOwner(), counter.fetch_add(1), tag);
  b.slots_ = slots;
  b.bytes_ = BoardBytes(slots);
  b.fd_ = shm_open(b.name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (b.fd_ < 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("shm_open(%s): %s", b.name_, std::strerror(errno)));
  }
  if (ftruncate(b.fd_, b.bytes_) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("ftruncate(%s): %s", b.name_, std::strerror(errno)));
  }
  struct flock fl = LockRequest(F_WRLCK);
  if (fcntl(b.fd_, F_OFD_SETLK, &fl) != 0) {
    return absl::InternalError(
        absl::StrFormat("fcntl(%s, F_OFD_SETLK): %s", b.name_, std::strerror(errno)));
  }
  void* p = mmap(nullptr, b.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd_, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrFormat("mmap(%s): %s", b.name_, std::strerror(errno)));
  }
  b.data_ = static_cast<uint8_t*>(p);
  BoardHeader* h = Header(b.data_);
  h->slots = static_cast<uint64_t>(slots);
  std::atomic_ref<uint64_t>(h->magic).store(kBoardMagic, std::memory_order_release);
  return b;
}

SignalBoard::SignalBoard(SignalBoard&& o) noexcept { *this = std::move(o); }

SignalBoard& SignalBoard::operator=(SignalBoard&& o) noexcept {
  if (this != &o) {
    Release();
    name_ = std::move(o.name_);
    fd_ = o.fd_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    slots_ = o.slots_;
    unlinked_ = o.unlinked_;
    o.fd_ = -1;
    o.data_ = nullptr;
    o.unlinked_ = true;
  }
  return *this;
}

SignalBoard::~SignalBoard() { Release(); }

void SignalBoard::Release() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (fd_ >= 0) {
    close(fd_);
    if (!unlinked_) shm_unlink(name_.c_str());
  }
  data_ = nullptr;
  fd_ = -1;
}

void SignalBoard::Unlink() {
  if (!unlinked_ && fd_ >= 0) shm_unlink(name_.c_str());
  unlinked_ = true;
}

void SignalBoard::Grant(uint64_t epoch) {
  std::atomic_ref<uint64_t>(Header(data_)->granted).store(epoch, std::memory_order_release);
}

uint64_t SignalBoard::doorbell() const {
  return std::atomic_ref<uint64_t>(Header(data_)->doorbell).load(std::memory_order_acquire);
}

void SignalBoard::WaitForRing(uint64_t seen, absl::Duration timeout) {
  BoardHeader* h = Header(data_);
  std::atomic_ref<uint32_t> sleepers(h->sleepers);
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (std::atomic_ref<uint64_t>(h->doorbell).load(std::memory_order_seq_cst) == seen) {
    const timespec ts = absl::ToTimespec(timeout);
    // Returns at a ring (FUTEX_WAKE), when the word already differs (EAGAIN), at the timeout
    // or on a signal (EINTR): the caller's next round looks in every case.
    syscall(SYS_futex, DoorbellWord(h), FUTEX_WAIT, static_cast<uint32_t>(seen), &ts, nullptr, 0);
  }
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

bool SignalBoard::Arrived(int64_t slot, uint64_t epoch) const {
  RESHARD_CHECK(slot >= 0 && slot < slots_);
  return std::atomic_ref<uint64_t>(*SlotPtr(data_, slot)).load(std::memory_order_acquire) == epoch;
}

void SignalBoard::PublishNetworkEnd(uint64_t epoch, int64_t unix_ns) {
  BoardHeader* h = Header(data_);
  std::atomic_ref<uint64_t>(h->net_end_ns)
      .store(static_cast<uint64_t>(unix_ns), std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(h->net_epoch).store(epoch, std::memory_order_release);
}

void SignalBoard::PublishFailure(uint64_t epoch, absl::string_view reason) {
  BoardHeader* h = Header(data_);
  const size_t n = std::min(reason.size(), static_cast<size_t>(kFailureReasonBytes - 1));
  std::memcpy(h->failure_reason, reason.data(), n);
  h->failure_reason[n] = '\0';
  std::atomic_ref<uint64_t>(h->failed_epoch).store(epoch, std::memory_order_release);
}

absl::StatusOr<PeerBoard> PeerBoard::Open(const std::string& name, int64_t slots) {
  PeerBoard b;
  b.fd_ = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (b.fd_ < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrFormat(
          "signal board %s does not exist (the peer is on another host or exited)", name));
    }
    return absl::InternalError(absl::StrFormat("shm_open(%s): %s", name, std::strerror(err)));
  }
  struct stat st {};
  if (fstat(b.fd_, &st) != 0 || st.st_size < BoardBytes(slots)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "signal board %s is smaller than its %d slots: the ranks planned different specs", name,
        slots));
  }
  b.bytes_ = st.st_size;
  void* p = mmap(nullptr, b.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd_, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrFormat("mmap(%s): %s", name, std::strerror(errno)));
  }
  b.data_ = static_cast<uint8_t*>(p);
  b.slots_ = static_cast<int64_t>(Header(b.data_)->slots);
  // The header is the peer's to write: its slot count must fit the object actually mapped.
  if (std::atomic_ref<uint64_t>(Header(b.data_)->magic).load(std::memory_order_acquire) !=
          kBoardMagic ||
      b.slots_ < slots || b.slots_ > (b.bytes_ - BoardBytes(0)) / 8) {
    return absl::InvalidArgumentError(
        absl::StrFormat("signal board %s is not a reshard board with %d slots", name, slots));
  }
  return b;
}

PeerBoard::PeerBoard(PeerBoard&& o) noexcept { *this = std::move(o); }

PeerBoard& PeerBoard::operator=(PeerBoard&& o) noexcept {
  if (this != &o) {
    Release();
    fd_ = o.fd_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    slots_ = o.slots_;
    o.fd_ = -1;
    o.data_ = nullptr;
  }
  return *this;
}

PeerBoard::~PeerBoard() { Release(); }

void PeerBoard::Release() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  fd_ = -1;
}

uint64_t PeerBoard::granted() const {
  return std::atomic_ref<uint64_t>(Header(data_)->granted).load(std::memory_order_acquire);
}

void PeerBoard::Signal(int64_t slot, uint64_t epoch) {
  RESHARD_CHECK(slot >= 0 && slot < slots_);
  std::atomic_ref<uint64_t>(*SlotPtr(data_, slot)).store(epoch, std::memory_order_release);
  RingDoorbell(Header(data_));
}

void PeerBoard::Ring() { RingDoorbell(Header(data_)); }

int64_t PeerBoard::NetworkEnd(uint64_t epoch) const {
  BoardHeader* h = Header(data_);
  if (std::atomic_ref<uint64_t>(h->net_epoch).load(std::memory_order_acquire) != epoch) return 0;
  return static_cast<int64_t>(
      std::atomic_ref<uint64_t>(h->net_end_ns).load(std::memory_order_relaxed));
}

uint64_t PeerBoard::FailedEpoch(std::string* reason) const {
  BoardHeader* h = Header(data_);
  const uint64_t epoch = std::atomic_ref<uint64_t>(h->failed_epoch).load(std::memory_order_acquire);
  if (reason != nullptr && epoch != 0) {
    // The peer's bytes: bounded by the array whatever it wrote, printable on one line.
    const char* r = h->failure_reason;
    reason->assign(r, strnlen(r, kFailureReasonBytes));
    for (char& c : *reason) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
    }
  }
  return epoch;
}

bool PeerBoard::Alive() const {
  struct flock fl = LockRequest(F_WRLCK);
  if (fcntl(fd_, F_OFD_GETLK, &fl) != 0) return true;  // Cannot tell: assume alive.
  return fl.l_type != F_UNLCK;
}

}  // namespace reshard::nvlink
