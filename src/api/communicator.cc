#include "reshard/communicator.h"

#include <filesystem>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/api/environment.h"
#include "src/api/internal.h"
#include "src/common/status.h"
#include "src/rendezvous/file_store.h"
#include "src/rendezvous/record.h"
#include "src/rendezvous/tcp_store.h"

namespace reshard {
namespace {

constexpr char kExitKey[] = "reshard/comm/exit";
constexpr absl::Duration kExitBound = absl::Seconds(10);

// Every rank announces it let go of its communicator; the rank that owns the store (serves it,
// or removes its directory) waits until every rank did, so peers still finishing their set-up
// or shutdown never lose the store under them. Bounded by min(timeout, 10 s).
absl::Status ExitBarrier(const Communicator::Impl& comm, rendezvous::Store& store, bool owner) {
  std::vector<int32_t> everyone;
  if (owner) {
    for (int32_t r = 0; r < comm.world_size; ++r) everyone.push_back(r);
  }
  return rendezvous::Barrier(store, kExitKey, comm.rank, everyone,
                             absl::Now() + std::min(comm.timeout, kExitBound));
}

class TcpImpl final : public Communicator::Impl {
 public:
  ~TcpImpl() override {
    if (client == nullptr) return;  // Connect failed half way: nothing to say goodbye to.
    // A serving rank keeps the store up until every rank has let go of its communicator, so
    // peers still finishing their set-up or shutdown never lose the store under them. The
    // exit's store calls share its bound: a rank cut off from the store (its link down) must
    // not wait the whole store timeout in Set.
    client->set_op_timeout(std::min(timeout, kExitBound));
    (void)ExitBarrier(*this, *client, server != nullptr);
    client.reset();
    server.reset();
  }
  rendezvous::Store& store() override { return *client; }

  std::unique_ptr<rendezvous::TcpStoreServer> server;  // Outlives the client (destroyed after it).
  std::unique_ptr<rendezvous::TcpStore> client;
};

// A single-host mpirun job without RESHARD_STORE: the ranks meet in a directory under /dev/shm
// named after the job, which rank 0 removes once every rank has let go.
class FileImpl final : public Communicator::Impl {
 public:
  ~FileImpl() override {
    if (ExitBarrier(*this, *store_, rank == 0).ok() && rank == 0) {
      std::error_code ignored;
      std::filesystem::remove_all(store_->directory(), ignored);
    }
  }
  rendezvous::Store& store() override { return *store_; }
  std::unique_ptr<rendezvous::FileStore> store_;
};

class CallbackStore final : public rendezvous::Store {
 public:
  explicit CallbackStore(StoreCallbacks cb) : cb_(std::move(cb)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return cb_.set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline) override {
    return cb_.get(key, deadline);
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& prefix) override {
    if (!cb_.list) {
      return absl::UnimplementedError(
          "the store callbacks have no list function (StoreCallbacks::list is optional)");
    }
    return cb_.list(prefix);
  }
  absl::Status Delete(const std::string& key) override {
    return cb_.del ? cb_.del(key) : absl::OkStatus();
  }

 private:
  StoreCallbacks cb_;
};

class CallbackImpl final : public Communicator::Impl {
 public:
  explicit CallbackImpl(StoreCallbacks cb) : store_(std::move(cb)) {}
  rendezvous::Store& store() override { return store_; }

 private:
  CallbackStore store_;
};

absl::Status CheckRank(int rank, int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", world_size, " is not positive"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the world of ", world_size, " ranks"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Communicator> Communicator::Connect(const std::string& store_address,
                                                   const std::string& token, int rank,
                                                   int world_size, const Options& options) {
  RESHARD_RETURN_IF_ERROR(CheckRank(rank, world_size));
  if (token.empty()) {
    return absl::InvalidArgumentError("the store token is empty (RESHARD_STORE_TOKEN)");
  }
  RESHARD_ASSIGN_OR_RETURN(auto host_port, rendezvous::ParseHostPort(store_address));
  auto impl = std::make_shared<TcpImpl>();
  impl->rank = rank;
  impl->world_size = world_size;
  impl->timeout = options.timeout;
  impl->description = absl::StrCat("tcp://", store_address);
  if (options.serve_store && rank == 0) {
    absl::StatusOr<std::unique_ptr<rendezvous::TcpStoreServer>> server =
        rendezvous::TcpStoreServer::Start(host_port.first, host_port.second, token);
    if (!server.ok()) {
      return absl::Status(server.status().code(),
                          absl::StrCat("rank 0 could not serve the store on ", store_address,
                                       " (it binds that address, which must be this host's): ",
                                       server.status().message()));
    }
    impl->server = std::move(server).value();
  }
  absl::StatusOr<std::unique_ptr<rendezvous::TcpStore>> client = rendezvous::TcpStore::Connect(
      host_port.first, host_port.second, token, absl::Now() + options.timeout);
  if (!client.ok()) {
    return absl::Status(client.status().code(),
                        absl::StrCat("rank ", rank, " could not reach the store at ", store_address,
                                     ": ", client.status().message()));
  }
  impl->client = std::move(client).value();
  impl->client->set_op_timeout(options.timeout);
  return Communicator(std::move(impl));
}

absl::StatusOr<Communicator> Communicator::FromCallbacks(StoreCallbacks store, int rank,
                                                         int world_size) {
  RESHARD_RETURN_IF_ERROR(CheckRank(rank, world_size));
  if (!store.set || !store.get) {
    return absl::InvalidArgumentError(absl::StrCat("StoreCallbacks needs both set and get; ",
                                                   store.set ? "get" : "set", " is empty"));
  }
  auto impl = std::make_shared<CallbackImpl>(std::move(store));
  impl->rank = rank;
  impl->world_size = world_size;
  impl->description = "callbacks";
  return Communicator(std::move(impl));
}

absl::StatusOr<Communicator> Communicator::FromEnvironment() {
  RESHARD_ASSIGN_OR_RETURN(internal::LaunchEnvironment env,
                           internal::ParseLaunchEnvironment(internal::ReadLaunchVariables()));
  if (!env.file_store_directory.empty()) {
    RESHARD_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::FileStore> fs,
                             rendezvous::FileStore::Open(env.file_store_directory));
    auto impl = std::make_shared<FileImpl>();
    impl->rank = env.rank;
    impl->world_size = env.world_size;
    impl->local_rank = env.local_rank;
    impl->timeout = env.timeout;
    impl->description = absl::StrCat("file://", fs->directory());
    impl->store_ = std::move(fs);
    return Communicator(std::move(impl));
  }
  Options options;
  options.timeout = env.timeout;
  options.serve_store = env.serve_store;
  RESHARD_ASSIGN_OR_RETURN(Communicator comm,
                           Connect(env.store_address, env.token, env.rank, env.world_size, options));
  comm.impl_->local_rank = env.local_rank;
  return comm;
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::world_size() const { return impl_->world_size; }
int Communicator::local_rank() const { return impl_->local_rank; }
std::string Communicator::store_description() const { return impl_->description; }

}  // namespace reshard
