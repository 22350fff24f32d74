// A Communicator is this process's membership in a refit world: its rank, the world size, and
// the rendezvous store every rank reaches. RefitHandles are built from it.
//
// Three ways to create one:
//   Connect()       - a reshard TCP store at "host:port" protected by a shared token (started by
//                     the launcher, by rank 0 with Options::serve_store, or by `reshard run`);
//   FromCallbacks() - the framework's own key-value store (torch.distributed's store, a PMIx
//                     KV, etcd ...) given as three functions;
//   FromEnvironment() - torchrun-style variables RESHARD_RANK, RESHARD_WORLD_SIZE,
//                     RESHARD_STORE=host:port and RESHARD_STORE_TOKEN, or under `mpirun` Open
//                     MPI's OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE for rank and size
//                     (docs/configuration.md); a single-host mpirun job needs no store
//                     address.
//
// Ownership: a Communicator is a cheap, copyable reference to shared state; the store
// connection (and the store server, when this rank serves it) lives until the last copy and
// the last RefitHandle built from it are destroyed.
// Thread safety: thread-safe (the store is; rank and size are immutable).
// Errors: InvalidArgument for a malformed address, rank or size; PermissionDenied for a wrong
// token; Unavailable when the store cannot be reached before the timeout.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace reshard {

// A framework-provided rendezvous store. All three functions must be thread-safe and visible to
// every rank (a value set on one rank is read by every other).
struct StoreCallbacks {
  // Sets `key` to `value`, replacing any previous value.
  std::function<absl::Status(const std::string& key, const std::string& value)> set;
  // Returns the value of `key`, waiting until some rank sets it; DeadlineExceeded after
  // `deadline`.
  std::function<absl::StatusOr<std::string>(const std::string& key, absl::Time deadline)> get;
  // Every key with its value that starts with `prefix`, sorted by key; does not wait.
  std::function<absl::StatusOr<std::vector<std::pair<std::string, std::string>>>(
      const std::string& prefix)>
      list;
  // Optional: removes `key` (OK when absent). With it, the keys of finished barrier generations
  // (RefitHandle::Barrier) are deleted, so a store that lives for thousands of refits stays
  // bounded; without it they accumulate (a few bytes per rank and barrier).
  std::function<absl::Status(const std::string& key)> del;
};

class Communicator {
 public:
  struct Options {
    // Bound on connecting to the store (and on each later set-up exchange made through it).
    absl::Duration timeout = absl::Seconds(30);
    // Rank 0 starts a store server on the address (binding exactly that host and port, so
    // "127.0.0.1:port" serves this machine only), like torchrun's master. Other ranks ignore it.
    bool serve_store = false;
  };

  // Connects to the reshard TCP store at `store_address` ("host:port" or "[v6]:port").
  [[nodiscard]] static absl::StatusOr<Communicator> Connect(const std::string& store_address,
                                                            const std::string& token, int rank,
                                                            int world_size, const Options& options);
  [[nodiscard]] static absl::StatusOr<Communicator> Connect(const std::string& store_address,
                                                            const std::string& token, int rank,
                                                            int world_size) {
    return Connect(store_address, token, rank, world_size, Options());
  }

  // Uses the framework's store. InvalidArgument when a callback is empty.
  [[nodiscard]] static absl::StatusOr<Communicator> FromCallbacks(StoreCallbacks store, int rank,
                                                                  int world_size);

  // Reads the environment (see the file comment). Rank 0 serves the store when
  // RESHARD_STORE_SERVE=1, or when launched by mpirun and RESHARD_STORE_SERVE is unset. A
  // single-host mpirun job without RESHARD_STORE needs no store address at all: its ranks meet
  // in /dev/shm/reshard-mpi-<job id> (removed by rank 0 at the end).
  // RESHARD_TIMEOUT_MS overrides Options::timeout. InvalidArgument naming the missing or
  // malformed variable.
  [[nodiscard]] static absl::StatusOr<Communicator> FromEnvironment();

  int rank() const;
  int world_size() const;
  // "tcp://host:port", "callbacks", for reports.
  std::string store_description() const;

  class Impl;
  // Internal: used by RefitHandle.
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  explicit Communicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace reshard
