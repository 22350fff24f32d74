#include "src/net/runtime.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "src/common/status.h"

namespace reshard::net {

absl::StatusOr<std::shared_ptr<Runtime>> Runtime::Create() {
  std::shared_ptr<Runtime> runtime(new Runtime());
  RESHARD_ASSIGN_OR_RETURN(runtime->context_, ucx::Context::Create());
  RESHARD_ASSIGN_OR_RETURN(runtime->worker_, ucx::Worker::Create(*runtime->context_));
  Runtime* self = runtime.get();
  ucx::Worker& worker = *self->worker_;
  RESHARD_RETURN_IF_ERROR(
      worker.SetAmHandler(wire::kGrantAm, &Runtime::OnMessage<wire::kGrantAm>, self));
  RESHARD_RETURN_IF_ERROR(
      worker.SetAmHandler(wire::kDoneAm, &Runtime::OnMessage<wire::kDoneAm>, self));
  RESHARD_RETURN_IF_ERROR(
      worker.SetAmHandler(wire::kAbortAm, &Runtime::OnMessage<wire::kAbortAm>, self));
  RESHARD_RETURN_IF_ERROR(
      worker.SetAmHandler(wire::kHelloAm, &Runtime::OnMessage<wire::kHelloAm>, self));
  RESHARD_RETURN_IF_ERROR(
      worker.SetAmHandler(wire::kDataAm, &Runtime::OnMessage<wire::kDataAm>, self));
  RESHARD_RETURN_IF_ERROR(
      worker.SetAmHandler(wire::kRoundAm, &Runtime::OnMessage<wire::kRoundAm>, self));
  RESHARD_RETURN_IF_ERROR(
      worker.SetAmHandler(wire::kRoundGrantAm, &Runtime::OnMessage<wire::kRoundGrantAm>, self));
  RESHARD_RETURN_IF_ERROR(
      worker.SetAmHandler(wire::kProgressAm, &Runtime::OnMessage<wire::kProgressAm>, self));
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

template <unsigned kId>
ucs_status_t Runtime::OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const ucp_ep_h from =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
  static_cast<Runtime*>(arg)->Dispatch(kId, header, header_length, data, length, rendezvous, from);
  // Never UCS_INPROGRESS: the payload is consumed (copied) before returning.
  return UCS_OK;
}

namespace {

// The abort reason for a message its named peer should never send: the engine shows it as the
// peer's own ("peer rank 2 sent a malformed completion signal (protocol error)"), once Origin
// has checked that it came from that peer.
std::string Malformed(const wire::AmHeader& h, absl::string_view what) {
  return absl::StrCat("rank ", h.from_rank, " sent ", what, " (protocol error)");
}

}  // namespace

void Runtime::Dispatch(unsigned id, const void* header, size_t header_length, const void* data,
                       size_t length, bool rendezvous, ucp_ep_h from) {
  if (header == nullptr) return;
  // Unknown ids are dropped before anything else (a rendezvous one is no protocol error of a
  // sink's peer: it names no message of ours).
  if (id != wire::kGrantAm && id != wire::kDoneAm && id != wire::kAbortAm && id != wire::kDataAm &&
      id != wire::kHelloAm && id != wire::kRoundAm && id != wire::kRoundGrantAm &&
      id != wire::kProgressAm) {
    return;
  }
  if (id == wire::kDataAm) {
    if (header_length != sizeof(wire::DataHeader)) return;
    wire::DataHeader h;
    std::memcpy(&h, header, sizeof(h));
    if (h.base.magic != wire::kMagic) return;
    MessageSink* sink = Find(h.base.handle);
    if (sink == nullptr) return;  // A handle that is gone: stale message.
    if (rendezvous) {
      sink->OnAbort(h.base, Malformed(h.base, "a rendezvous data message"), from);
    } else {
      sink->OnData(h, data, length, from);
    }
    return;
  }
  if (header_length != sizeof(wire::AmHeader)) return;
  wire::AmHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (h.magic != wire::kMagic) return;
  MessageSink* sink = Find(h.handle);
  if (sink == nullptr) return;  // A handle that is gone: stale message.
  if (rendezvous) {
    // Messages are sent eager; a rendezvous one is a protocol error.
    sink->OnAbort(h, Malformed(h, "a rendezvous control message"), from);
    return;
  }
  switch (id) {
    case wire::kGrantAm: {
      uint64_t version = 0;
      if (length == sizeof(version) && data != nullptr) std::memcpy(&version, data, length);
      sink->OnGrant(h, version, from);
      return;
    }
    case wire::kHelloAm:
      sink->OnHello(h, from);
      return;
    case wire::kRoundAm:
    case wire::kRoundGrantAm: {
      uint64_t round = 0;
      if (length != sizeof(round) || data == nullptr) {
        sink->OnAbort(h, Malformed(h, "a malformed landing round message"), from);
        return;
      }
      std::memcpy(&round, data, sizeof(round));
      sink->OnRound(h, round, id == wire::kRoundGrantAm, from);
      return;
    }
    case wire::kDoneAm: {
      // No allocation: a signal carries at most kMaxIndicesPerSignal indices.
      std::array<uint32_t, wire::kMaxIndicesPerSignal> indices;
      const size_t count = length / sizeof(uint32_t);
      if (count > indices.size() || length % sizeof(uint32_t) != 0 ||
          (count > 0 && data == nullptr)) {
        sink->OnAbort(h, Malformed(h, "a malformed completion signal"), from);
        return;
      }
      if (count > 0) std::memcpy(indices.data(), data, count * sizeof(uint32_t));
      sink->OnDone(h, indices.data(), count, from);
      return;
    }
    case wire::kProgressAm: {
      // No allocation: a message carries at most kMaxProgressPerSignal records.
      std::array<wire::ProgressRecord, wire::kMaxProgressPerSignal> records;
      const size_t count = length / sizeof(wire::ProgressRecord);
      if (count == 0 || count > records.size() || length % sizeof(wire::ProgressRecord) != 0 ||
          data == nullptr) {
        sink->OnAbort(h, Malformed(h, "a malformed progress message"), from);
        return;
      }
      std::memcpy(records.data(), data, count * sizeof(wire::ProgressRecord));
      sink->OnProgress(h, records.data(), count, from);
      return;
    }
    case wire::kAbortAm:
      sink->OnAbort(h,
                    data == nullptr
                        ? absl::string_view()
                        : absl::string_view(static_cast<const char*>(data),
                                            std::min(length, wire::kMaxAbortReasonBytes)),
                    from);
      return;
    default:
      return;
  }
}

}  // namespace reshard::net
