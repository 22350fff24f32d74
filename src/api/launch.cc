#include "reshard/launch.h"

#include <utility>

#include "reshard/refit.h"
#include "src/common/status.h"
#include "src/common/shared_memory.h"
#include "src/rendezvous/tcp_store.h"

namespace reshard {

class StoreServer::Impl {
 public:
  std::unique_ptr<rendezvous::TcpStoreServer> server;
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreServer::~StoreServer() = default;

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& host, int port,
                                                                const std::string& token) {
  auto impl = std::make_unique<Impl>();
  RESHARD_ASSIGN_OR_RETURN(impl->server, rendezvous::TcpStoreServer::Start(host, port, token));
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

int StoreServer::port() const { return impl_->server->port(); }
int64_t StoreServer::refused() const { return impl_->server->refused_clients(); }

int RemoveSharedMemoryOf(int64_t pid) { return RemoveSharedObjectsOf(pid); }
int RemoveSharedMemoryOfDeadProcesses() { return RemoveSharedObjectsOfDeadProcesses(); }

class HostBuffer::Impl {
 public:
  std::unique_ptr<SharedBuffer> shared;
};

HostBuffer::HostBuffer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HostBuffer::HostBuffer(HostBuffer&&) noexcept = default;
HostBuffer& HostBuffer::operator=(HostBuffer&&) noexcept = default;
HostBuffer::~HostBuffer() = default;

absl::StatusOr<HostBuffer> HostBuffer::Allocate(int64_t bytes, const std::string& tag) {
  auto impl = std::make_unique<Impl>();
  RESHARD_ASSIGN_OR_RETURN(impl->shared, SharedBuffer::Allocate(tag, bytes));
  return HostBuffer(std::move(impl));
}

void* HostBuffer::data() const { return impl_ == nullptr ? nullptr : impl_->shared->data(); }
int64_t HostBuffer::bytes() const { return impl_ == nullptr ? 0 : impl_->shared->bytes(); }

}  // namespace reshard
