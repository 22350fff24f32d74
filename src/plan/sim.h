// A flow-level simulator of one refit on a cluster (docs/simulator.md).
//
// Every rank has four links: NIC egress, NIC ingress, NVLink egress and NVLink ingress, with the
// topology's per-rank, per-direction bandwidths. Transfers become flows; flows that share sender,
// receiver, link kind and stage (the depth of the dependency chain: 0 for data read from a
// source buffer, k+1 for data forwarded after a stage-k arrival) are aggregated into one flow.
// Rates are max-min fair (progressive filling). A dependent flow streams behind the data it
// forwards: at any time it may have sent at most the fraction of its bytes equal to the fraction
// of its sender's stage-(k-1) arrivals (of its kind, relay feeds or not, when the flows were split
// by them), so fan-out and relays start as soon as data arrives (chunk-level pipelining). Local
// copies (same rank) are free. Rates are weighted max-min when SimOptions::relay_feed_weight is
// not 1 (a what-if).
//
// Events are batched: every flow that would finish or catch up within `batch_fraction` of the
// current time of the earliest such event completes together. That only lets links idle or
// discards progress, so the result errs on the slow side (DeepSeek-V3 on GB200: 0.731 s batched
// with 0.01 against 0.720 s exact, which takes minutes instead of seconds).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "src/plan/plan.h"
#include "src/plan/schedule.h"
#include "src/plan/spec.h"

namespace reshard::plan {

struct Flow {
  int32_t from = 0;
  int32_t to = 0;
  int32_t stage = 0;
  bool nvlink = false;  // Inside a domain; otherwise over the NICs.
  int64_t bytes = 0;
  // Transfers a network relay waits on (Transfer::feeds_relay), and transfers that wait on
  // such (relays and fan-out of what a relay feed landed), when the flows were split by them
  // (FlowsFromPlan's by_relay_feed): a relay then streams behind the arrivals it forwards.
  bool feeds_relay = false;
  bool after_feed = false;
  // A pipelined chain (the gather-broadcast baseline): the hops after `from`, each (rank, over
  // NVLink), the last one `to`. It moves at one rate through every hop's links, as a chain
  // streaming chunk after chunk does; `nvlink` is unused. Empty for a flow of one hop.
  std::vector<std::pair<int32_t, bool>> via = {};
};

// Aggregated flows of a plan: network transfers over NICs, fan-out over NVLink, local copies
// dropped. One flow per (sender, receiver, link kind, stage): one queue pair's worth of fair
// share, as a NIC serves them. With `by_relay_feed`, relay feeds and the transfers that wait on
// them are flows of their own (Flow::feeds_relay, after_feed): a pair then shares as two, which
// is what a second, prioritised endpoint per pair would do (the --relay-priority what-if).
[[nodiscard]] std::vector<Flow> FlowsFromPlan(const Plan& plan, bool by_relay_feed = false);

// Delta refits (docs/delta.md): the expected stream bytes, relative to the plain piece, of a
// piece of `elem_bytes`-byte elements of which a random, scattered fraction `fraction` changed:
// per chunk the smaller of bitmap + values and runs + values, plus the chunk table, at most the
// plain piece; plus each segment's header (delta::kSegmentBytes).
[[nodiscard]] double DeltaBytesRatio(double fraction, int elem_bytes);
// FlowsFromPlan for delta refits at change fraction `fraction`: the pieces the engine sends as
// delta streams (DeltaElemBytes: network pieces read from a source into a destination tile or a
// staging slot, and the relays that forward their streams) carry DeltaBytesRatio of their
// bytes; fan-out the plain bytes, as the engine moves them.
struct DeltaFlowOptions {
  bool by_relay_feed = false;  // As FlowsFromPlan's.
};
[[nodiscard]] std::vector<Flow> DeltaFlowsFromPlan(const Plan& plan, double fraction,
                                                   const DeltaFlowOptions& options = {});

// The memory a delta refit of `plan` holds per rank, as the engine sizes it (docs/delta.md,
// "What it costs"): a shadow of every delta piece a rank encodes (relays keep none; device
// memory for CUDA sources), the send scratch of every delta piece it sends (the stream's
// capacity, relays included), and with put delivery the landing area of every delta piece it
// receives (the same capacity; nothing with active messages). The largest of each over ranks,
// with its rank (-1: none), and the totals.
struct DeltaMemory {
  int64_t max_shadow_bytes = 0, max_send_scratch_bytes = 0, max_landing_bytes = 0;
  int32_t max_shadow_rank = -1, max_send_scratch_rank = -1, max_landing_rank = -1;
  int64_t shadow_bytes = 0, send_scratch_bytes = 0, landing_bytes = 0;
};
[[nodiscard]] DeltaMemory DeltaMemoryOf(const Plan& plan);

// The gather-broadcast baseline: for every tensor the first holder of each source cell sends
// its tile to a gather rank (the smallest rank of the tensor's source mesh, one per pipeline
// stage); each gather rank then broadcasts everything it gathered along a pipelined chain
// through every destination rank (NCCL ring style): the chain enters each destination domain
// once over a NIC, visits the domain's ranks over NVLink and leaves for the next domain. Chains
// of different gather ranks enter and leave domains at different ranks. Every destination rank
// receives whole tensors and keeps its slice. Each chain is one flow through every hop's links
// (Flow::via), streaming behind its gathering. All gather ranks run concurrently (a
// bandwidth-only model, favourable to the baseline).
[[nodiscard]] std::vector<Flow> GatherBroadcastFlows(const RefitSpec& spec,
                                                     const DomainMap& domains);
// The same flows, one list per gather rank (ascending), for a model where pipeline stages take
// turns (one broadcast collective at a time): simulate each list alone and add the times.
[[nodiscard]] std::vector<std::vector<Flow>> GatherBroadcastStages(const RefitSpec& spec,
                                                                   const DomainMap& domains);

struct SimOptions {
  double batch_fraction = 0.01;
  // A what-if, with flows split by_relay_feed: network flows of relay feeds (Flow::feeds_relay)
  // weigh this much in the max-min sharing of both their links, so they get that many times
  // the rate of the others where they share a bottleneck. 1 (fair) is what the engine does:
  // NICs serve the queue pairs that have work in turn (docs/simulator.md, "Relay priority").
  double relay_feed_weight = 1;
};

struct SimResult {
  double seconds = 0;
  int64_t network_bytes = 0;
  int64_t nvlink_bytes = 0;
  int64_t max_nic_bytes = 0;             // Most bytes through one NIC direction.
  std::vector<int64_t> nic_in, nic_out;  // Per rank.
  int64_t flows = 0;
  int64_t events = 0;
  std::vector<double> finished;  // Per flow: when it finished (0 for an empty one).
};

// Simulates `flows` among `world_size` ranks with the topology's bandwidths.
[[nodiscard]] SimResult Simulate(const std::vector<Flow>& flows, int32_t world_size,
                                 const Topology& topology, const SimOptions& options = {});

}  // namespace reshard::plan
