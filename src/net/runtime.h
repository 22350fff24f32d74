// net::Runtime: the UCX context and worker of a process (or of one communicator), shared by
// every refit engine built on it, and the router of incoming active messages to those engines.
//
// The API layer's Communicator creates one Runtime and passes it to each handle; tests create
// their own with Runtime::Create(). Engines hold a shared_ptr, so the worker and the context
// outlive every endpoint, registration and request an engine made on them.
//
// Messages (src/net/wire.h) name the receiving handle; the runtime delivers each to the sink
// registered under that handle id and drops messages for handles that are gone (stale messages
// of a destroyed handle). Handlers run inside Worker::Progress on the caller's thread.
//
// Thread safety: thread-compatible, with the worker's thread model (src/net/ucx/worker.h): one
// thread drives the runtime and every engine on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/cuda/runtime.h"
#include "src/net/ucx/context.h"
#include "src/net/ucx/worker.h"
#include "src/net/wire.h"

namespace reshard::net {

// What an engine receives. `from` is the endpoint the message arrived on (null when UCX did not
// say); the sink checks that it is the endpoint of the rank the header names before acting.
// Messages that arrived through UCX's rendezvous protocol (never sent so by the engine) reach
// OnAbort as a protocol error.
class MessageSink {
 public:
  // `version`: the grant's payload (wire::kGrantAm), 0 when it has none.
  virtual void OnGrant(const wire::AmHeader& h, uint64_t version, ucp_ep_h from) = 0;
  virtual void OnHello(const wire::AmHeader& h, ucp_ep_h from) = 0;
  virtual void OnDone(const wire::AmHeader& h, const uint32_t* indices, size_t count,
                      ucp_ep_h from) = 0;
  virtual void OnData(const wire::DataHeader& h, const void* data, size_t length,
                      ucp_ep_h from) = 0;
  virtual void OnAbort(const wire::AmHeader& h, absl::string_view reason, ucp_ep_h from) = 0;
  // Landing rounds: wire::kRoundAm (`grant` false) and wire::kRoundGrantAm (true).
  virtual void OnRound(const wire::AmHeader& h, uint64_t round, bool grant, ucp_ep_h from) = 0;
  // wire::kProgressAm: 1 to kMaxProgressPerSignal records.
  virtual void OnProgress(const wire::AmHeader& h, const wire::ProgressRecord* records,
                          size_t count, ucp_ep_h from) = 0;

 protected:
  ~MessageSink() = default;
};

class Runtime {
 public:
  // Creates a UCX context (configured from the environment: UCX_TLS, UCX_NET_DEVICES, ...) and
  // one worker, and installs the engine's message handlers. Errors: FailedPrecondition when UCX
  // finds no usable transport, Internal otherwise.
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<Runtime>> Create();

  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  ucx::Context& context() const { return *context_; }
  ucx::Worker& worker() const { return *worker_; }
  // Whether endpoints detect lost peers (see ucx::Context::peer_error_handling()).
  bool peer_error_handling() const { return context_->peer_error_handling(); }
  // Whether UCX registers CUDA memory directly (otherwise engines stage it through host memory).
  // (While devices are emulated on the host, tests, src/cuda/runtime.h: as the emulation says.)
  bool supports_cuda_memory() const {
    if (cuda::DevicesEmulatedOnHost()) return cuda::EmulatedDeviceMemoryRegistered();
    return context_->supports_cuda_memory();
  }
  // The UCX memory type of CUDA buffers registered directly (host while devices are emulated).
  ucs_memory_type_t cuda_memory_type() const {
    return cuda::DevicesEmulatedOnHost() ? UCS_MEMORY_TYPE_HOST : UCS_MEMORY_TYPE_CUDA;
  }

  // Routes messages for `handle` to `sink` until Unregister. AlreadyExists when another sink
  // holds the handle (two live handles with the same key prefix and rank).
  [[nodiscard]] absl::Status Register(uint64_t handle, MessageSink* sink);
  // Stops routing `handle` if `sink` holds it.
  void Unregister(uint64_t handle, const MessageSink* sink);

  // Decodes one incoming active message (id from src/net/wire.h, its user header and payload)
  // and hands it to the sink of the handle it names. Unknown ids, malformed headers and
  // messages for handles that are gone are dropped. The UCX handlers call this; so do the fuzz harnesses
  // (tests/fuzz), which feed it arbitrary bytes.
  void Dispatch(unsigned id, const void* header, size_t header_length, const void* data,
                size_t length, bool rendezvous, ucp_ep_h from);

 private:
  Runtime() = default;
  MessageSink* Find(uint64_t handle) const;
  template <unsigned kId>
  static ucs_status_t OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);

  std::unique_ptr<ucx::Context> context_;  // Declared first: destroyed last.
  std::unique_ptr<ucx::Worker> worker_;
  absl::flat_hash_map<uint64_t, MessageSink*> sinks_;
};

}  // namespace reshard::net
