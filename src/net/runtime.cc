#include "src/net/runtime.h"

#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "src/common/status.h"

namespace reshard::net {
namespace {

bool Rendezvous(const ucp_am_recv_param_t* param) {
  return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Runtime>> Runtime::Create() {
  std::shared_ptr<Runtime> runtime(new Runtime());
  RESHARD_ASSIGN_OR_RETURN(runtime->context_, ucx::Context::Create());
  RESHARD_ASSIGN_OR_RETURN(runtime->worker_, ucx::Worker::Create(*runtime->context_));
  Runtime* self = runtime.get();
  RESHARD_RETURN_IF_ERROR(
      self->worker_->SetAmHandler(wire::kGrantAm, &Runtime::OnControl<wire::kGrantAm>, self));
  RESHARD_RETURN_IF_ERROR(
      self->worker_->SetAmHandler(wire::kDoneAm, &Runtime::OnControl<wire::kDoneAm>, self));
  RESHARD_RETURN_IF_ERROR(
      self->worker_->SetAmHandler(wire::kAbortAm, &Runtime::OnControl<wire::kAbortAm>, self));
  RESHARD_RETURN_IF_ERROR(
      self->worker_->SetAmHandler(wire::kHelloAm, &Runtime::OnControl<wire::kHelloAm>, self));
  RESHARD_RETURN_IF_ERROR(
      runtime->worker_->SetAmHandler(wire::kDataAm, &Runtime::OnData, runtime.get()));
  return runtime;
}

Runtime::~Runtime() = default;

absl::Status Runtime::Register(uint64_t handle, MessageSink* sink) {
  auto [it, inserted] = sinks_.emplace(handle, sink);
  if (!inserted && it->second != sink) {
    return absl::AlreadyExistsError(
        "a refit handle with the same key prefix and rank already "
        "exists on this runtime");
  }
  return absl::OkStatus();
}

void Runtime::Unregister(uint64_t handle, const MessageSink* sink) {
  auto it = sinks_.find(handle);
  if (it != sinks_.end() && it->second == sink) sinks_.erase(it);
}

MessageSink* Runtime::Find(uint64_t handle) const {
  auto it = sinks_.find(handle);
  return it == sinks_.end() ? nullptr : it->second;
}

ucs_status_t Runtime::OnData(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Runtime*>(arg);
  if (header_length != sizeof(wire::DataHeader)) return UCS_OK;
  wire::DataHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (h.base.magic != wire::kMagic) return UCS_OK;
  MessageSink* sink = self->Find(h.base.handle);
  if (sink == nullptr) return UCS_OK;  // A handle that is gone: stale message.
  if (Rendezvous(param)) {
    sink->OnAbort(h.base, "received a rendezvous data message (protocol error)");
  } else {
    sink->OnData(h, data, length);
  }
  return UCS_OK;
}

template <unsigned kId>
ucs_status_t Runtime::OnControl(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Runtime*>(arg);
  if (header_length != sizeof(wire::AmHeader)) return UCS_OK;
  wire::AmHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (h.magic != wire::kMagic) return UCS_OK;
  MessageSink* sink = self->Find(h.handle);
  if (sink == nullptr) return UCS_OK;  // A handle that is gone: stale message.
  if (Rendezvous(param)) {
    // Messages are sent eager; a rendezvous one is a protocol error.
    sink->OnAbort(h, "received a rendezvous control message (protocol error)");
    return UCS_OK;
  }
  if constexpr (kId == wire::kGrantAm) {
    sink->OnGrant(h);
  } else if constexpr (kId == wire::kHelloAm) {
    sink->OnHello(h);
  } else if constexpr (kId == wire::kDoneAm) {
    // No allocation: a signal carries at most kMaxIndicesPerSignal indices.
    std::array<uint32_t, wire::kMaxIndicesPerSignal> indices;
    const size_t count = length / sizeof(uint32_t);
    if (count > indices.size() || length % sizeof(uint32_t) != 0) {
      sink->OnAbort(h, "received a malformed completion signal (protocol error)");
      return UCS_OK;
    }
    if (count > 0) std::memcpy(indices.data(), data, count * sizeof(uint32_t));
    sink->OnDone(h, indices.data(), count);
  } else {
    sink->OnAbort(h, absl::string_view(static_cast<const char*>(data), length));
  }
  return UCS_OK;
}

}  // namespace reshard::net
