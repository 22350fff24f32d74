// A Communicator is this process's membership in a refit world: its rank, the world size, and
// the rendezvous store every rank reaches. RefitHandles are built from it.
//
// Three ways to create one:
//   Connect()       - a reshard TCP store at "host:port" protected by a shared token (started by
//                     the launcher, by rank 0 with Options::serve_store, or by `reshard run`);
//   FromCallbacks() - the framework's own key-value store (torch.distributed's store, a PMIx
//                     KV, etcd ...) given as set and get functions (list and delete optional);
//   FromEnvironment() - the variables of the launcher that started this process: reshard's own
//                     (RESHARD_RANK, RESHARD_WORLD_SIZE, RESHARD_STORE=host:port,
//                     RESHARD_STORE_TOKEN), torchrun's (RANK, WORLD_SIZE, LOCAL_RANK,
//                     MASTER_ADDR, MASTER_PORT), Open MPI's mpirun (OMPI_COMM_WORLD_*) or Slurm's
//                     srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); precedence and defaults
//                     in docs/configuration.md. A single-host mpirun job needs no store address.
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

// A framework-provided rendezvous store. Every function given must be thread-safe (the library
// calls them on the threads that call into it: RefitHandle::Create, Barrier and the handle's
// destructor) and visible to every rank (a value set on one rank is read by every other). Keys
// are printable ASCII; values are binary (they may contain NUL).
struct StoreCallbacks {
  // Required. Sets `key` to `value`, replacing any previous value.
  std::function<absl::Status(const std::string& key, const std::string& value)> set;
  // Required. Returns the value of `key`, waiting until some rank sets it; DeadlineExceeded
  // after `deadline` (the library polls with short deadlines and treats DeadlineExceeded as
  // "not yet", any other error as final).
  std::function<absl::StatusOr<std::string>(const std::string& key, absl::Time deadline)> get;
  // Optional: every key with its value that starts with `prefix`, sorted by key; does not wait.
  // The library itself never lists (torch.distributed's stores offer no listing on every
  // backend); it is here for tools that inspect a store.
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

  // Uses the framework's store. InvalidArgument when set or get is empty.
  [[nodiscard]] static absl::StatusOr<Communicator> FromCallbacks(StoreCallbacks store, int rank,
                                                                  int world_size);

  // Reads the environment of the launcher that started this process (see the file comment and
  // docs/configuration.md, which has the precedence table). The first launcher whose rank
  // variable is set names this rank: RESHARD_RANK, then torchrun's RANK, then mpirun's
  // OMPI_COMM_WORLD_RANK, then Slurm's SLURM_PROCID (the innermost launcher wins). The store is
  // RESHARD_STORE when set; under torchrun otherwise MASTER_ADDR at port RESHARD_STORE_PORT,
  // default MASTER_PORT + 1 (MASTER_PORT itself is torch's own store); a single-host mpirun job
  // without RESHARD_STORE meets in /dev/shm/reshard-mpi-<job id> (removed by rank 0 at the
  // end); under Slurm RESHARD_STORE is required. The token is RESHARD_STORE_TOKEN, under
  // torchrun by default TORCHELASTIC_RUN_ID unless it is "none". Rank 0 serves the store when
  // RESHARD_STORE_SERVE=1, and by default under torchrun, mpirun and Slurm (never by default
  // under RESHARD_RANK, whose launcher serves its own). RESHARD_TIMEOUT_MS overrides
  // Options::timeout. InvalidArgument naming the missing or malformed variable, also when only
  // half of a launcher's pair is set (RANK without WORLD_SIZE).
  [[nodiscard]] static absl::StatusOr<Communicator> FromEnvironment();

  int rank() const;
  int world_size() const;
  // This process's index among the ranks on its host, when the launcher said
  // (RESHARD_LOCAL_RANK, torchrun's LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID), e.g.
  // to pick a CUDA device; -1 when it did not, and always for Connect and FromCallbacks.
  int local_rank() const;
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
