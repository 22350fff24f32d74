// The one place that composes the layers of a refit (DESIGN §3-4): plan fingerprints first,
// then the intra-domain fan-out (src/nvlink) and the network engine (src/net), then one progress
// loop that drives both and merges their figures. RefitHandle is a thin shell over it; every
// program that refits (reshard-rank, reshard-bench-rank, the examples) goes through RefitHandle.
//
// The plan is this rank's share (plan::BuildRankPlan, what RefitHandle passes) or the world plan;
// everything the session reads from it (fingerprint, world size, stats, the domain's fan-out
// transfers, this rank's transfers and buffers) is the same in both.
//
// Set-up order (Create), collective over every rank of the plan:
//   1. the plan fingerprint, world size and fan-out choice are compared through the store
//      (rendezvous::CheckAgreement): ranks given different specs or options fail with
//      FailedPrecondition naming both ranks before anything is mapped, registered or written;
//      a rank whose set-up failed before (its share did not plan, its buffers did not match)
//      posts its failure there instead (AbandonSetUp), and the others fail at once naming it;
//   2. the fan-out layer maps this rank's domain peers (only ranks with fan-out edges);
//   3. the engine registers buffers, exchanges worker addresses and remote keys, wires up.
// Store keys: `<key_prefix>/fp/<rank>`, `<key_prefix>/fanout/...`, `<key_prefix>/net/...`,
// `<key_prefix>/barrier/<n>/<rank>`.
//
// One refit (Start, then Wait): Start grants the epoch to fan-out and network peers and posts
// what it can (or, with a start gate that is not open yet, nothing: see Start); Wait is the only
// loop of a refit. Each round it progresses the engine, hands
// every piece that landed to the fan-out layer (forwarded while later pieces are still on the
// network), progresses the fan-out, and idles by the one IdlePolicy. Deadlines end it with the
// layer's own message naming what is missing.
//
// Thread-compatible (one thread per session; the thread that progresses the runtime's worker).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "reshard/refit.h"
#include "src/api/stream_order.h"
#include "src/common/memory.h"
#include "src/cuda/quantize.h"
#include "src/net/refit_engine.h"
#include "src/net/runtime.h"
#include "src/nvlink/fanout.h"
#include "src/plan/plan.h"
#include "src/plan/tiling.h"
#include "src/rendezvous/store.h"

namespace reshard::internal {

struct SessionConfig {
  std::string key_prefix;  // "reshard/<handle name>"; every rank of a handle uses the same.
  absl::Duration setup_timeout = absl::Seconds(60);
  // Fan-out pieces go through the fan-out layer (Fanout::kAuto) or as engine puts (kEngine).
  bool fanout_layer = true;
  // Engine tuning; key_prefix, setup_timeout and execute_fanout are set by the session.
  net::RefitEngineOptions engine;
};

class RefitSession {
 public:
  // `buffers` has one view per plan buffer id (the staging buffer included).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RefitSession>> Create(
      std::shared_ptr<const plan::Plan> plan, int32_t rank, rendezvous::Store& store,
      std::shared_ptr<net::Runtime> runtime, std::vector<common::BufferView> buffers,
      const SessionConfig& config);
  // For a rank of the plan whose set-up failed before Create (planning, buffers): tells the
  // ranks waiting in Create's agreement step, which then fail at once with `status`'s code,
  // naming this rank and its reason, instead of at their set-up deadline. Best effort (a store
  // error is logged).
  static void AbandonSetUp(rendezvous::Store& store, const SessionConfig& config, int32_t rank,
                           const absl::Status& status);
  ~RefitSession();
  RefitSession(const RefitSession&) = delete;
  RefitSession& operator=(const RefitSession&) = delete;

  // Enters `epoch` (strictly increasing) on both layers without blocking. With a `gate` (the
  // work on a caller's CUDA stream, src/api/stream_order.h; it must outlive the epoch) that is
  // not open yet, the epoch starts in Wait once it opens: until then nothing reads this rank's
  // sources or writes its destinations (no grant, staging, quantization, put or local copy),
  // while Wait still takes in peers' messages. A gate that fails or stays closed past Wait's
  // deadline fails the epoch without entering it (Start or Wait returns the error; Abort then
  // tells the peers at once).
  [[nodiscard]] absl::Status Start(uint64_t epoch, StreamOrder* gate = nullptr);
  // The refit's progress loop, until this rank's part of `epoch` is done or `deadline`.
  [[nodiscard]] absl::Status Wait(uint64_t epoch, absl::Time deadline);
  // The n-th barrier among every rank of the plan, progressing the engine while waiting.
  [[nodiscard]] absl::Status Barrier(uint64_t n, absl::Time deadline);
  // This rank's refit `epoch` failed (`why`, from any layer): every layer still running it
  // fails too and tells its peers at once, so ranks waiting on this one through another layer
  // (a domain peer waiting only for its fan-out copies) fail now rather than at their deadline.
  void Abort(uint64_t epoch, const absl::Status& why);
  // Forgets a failed epoch (see RefitHandle::Reset).
  void Reset();
  // Orderly close after the last refit (see RefitEngine::Shutdown).
  [[nodiscard]] absl::Status Shutdown(absl::Time deadline);

  // Adds the figures of the last epoch (bytes, pieces, puts, fan-out, transports) to `stats`.
  void FillStats(Stats& stats) const;
  // "host", "cuda_ipc", "nccl" (fan-out layer), "engine" (engine puts), "none".
  const std::string& fanout_name() const { return fanout_name_; }

 private:
  RefitSession(std::shared_ptr<const plan::Plan> plan, int32_t rank, rendezvous::Store& store,
               SessionConfig config);
  absl::Status BuildFanout(const std::vector<common::BufferView>& buffers);

  // Members in dependency order: the fan-out and engine point into the plan and the store.
  std::shared_ptr<const plan::Plan> plan_;
  const int32_t rank_;
  rendezvous::Store& store_;
  const SessionConfig config_;
  std::string fanout_name_ = "none";
  std::unique_ptr<nvlink::Fanout> fanout_;
  std::unique_ptr<net::RefitEngine> engine_;
  std::vector<uint32_t> landed_;  // Reused by every round of Wait: no allocation per refit.
  // This rank's tiles of quantized sources (plan::QuantizedSource), quantized by Start before
  // anything is posted: from the user's source buffer into the internal ones the puts read.
  struct QuantizeJob {
    size_t source = 0;  // Index into the plan's spec().quantized_sources.
    plan::Box tile;
    const uint8_t* user = nullptr;
    const uint8_t* user_scales = nullptr;  // A requantized FP8 source's scales, else null.
    // A non-empty tile in GPU memory: the CUDA kernels quantize it (cuda::DeviceQuantizer) from
    // `device_src` into the internal host buffers at `device_out` and `device_scales`; a
    // requantized FP8 source's scales from `device_src_scales` (GPU memory too).
    std::unique_ptr<cuda::DeviceQuantizer> device;
    const void* device_src = nullptr;
    const void* device_src_scales = nullptr;
    uint8_t* device_out = nullptr;
    uint8_t* device_scales = nullptr;
    uint8_t* elements = nullptr;
    uint8_t* scales = nullptr;
    // A source whose blocks other tiles share (QuantizedSource::exchange): this tile's partial
    // amaxes and what the exchange gathers (in amax_memory_), and their combination.
    float* partial = nullptr;
    const float* gathered = nullptr;
    std::vector<float> amax;
  };
  std::vector<QuantizeJob> quantize_;
  // Room for the largest of this rank's requantized FP8 source tiles as fp32 (one at a time).
  std::vector<float> dequantized_;
  // Quantizes `job` (after the amax exchange: `amax`), on the host or with the CUDA kernels.
  absl::Status QuantizeJobTile(const QuantizeJob& job, const float* amax);
  // Quantizes the next job held in the engine (RefitEngine::HoldSource) and releases its
  // tensor and scales, so their puts post while later jobs quantize; `did` says whether there
  // was one.
  absl::Status QuantizeNextHeld(bool* did);
  size_t next_held_ = 0;  // quantize_ from here on may still be held.
  // This refit's quantization figures (Stats::quantize_seconds, amax_exchange_seconds).
  absl::Duration quantize_time_;
  absl::Time exchange_started_;
  absl::Duration exchange_time_;
  absl::Status PrepareQuantization(const std::vector<common::BufferView>& buffers,
                                   std::shared_ptr<net::Runtime> runtime, absl::Time deadline);
  // Starts the fan-out layer and the engine on `epoch`.
  absl::Status StartLayers(uint64_t epoch);
  // What Start does once the gate is open: quantization, the amax exchange, the layers.
  absl::Status BeginEpoch(uint64_t epoch);
  // Wait's first part while the gate is closed: polls it, progressing the engine meanwhile.
  absl::Status WaitForGate(uint64_t epoch, absl::Time deadline);
  StreamOrder* gate_ = nullptr;  // A closed start gate: the epoch starts in Wait.
  absl::Time gated_since_;
  // The amax exchange (plan::RefitSpec::amax_exchange), a session of its own on every rank of its
  // world, run before this rank quantizes the sources that need it; null without one.
  std::unique_ptr<RefitSession> amax_;
  std::vector<std::vector<uint8_t>> amax_memory_;  // Its buffers on this rank, by its plan's ids.
  bool exchange_jobs_ = false;  // Some job waits for the exchange: the layers start in Wait.
  bool exchange_pending_ = false;  // Start began the exchange's epoch; Wait finishes it.
};

// The plan's world size and every rank in it, for collective set-up steps.
std::vector<int32_t> AllRanks(const plan::Plan& plan);

}  // namespace reshard::internal
