// The plan: every copy that one refit performs, per rank, computed deterministically from a spec.
//
// Planning has two steps. Overlap (overlap.h) finds, for every destination tile, the minimal set
// of pieces (boxes of one source tile) covering it. Assignment decides which holder of a
// replicated source tile sends each piece to which destination rank, and emits Transfers.
// The result is byte-identical on every rank for the same spec and options; ranks compare a
// 64-bit fingerprint of what the plan is a function of before moving any data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/common/delta_codec.h"
#include "src/plan/region.h"
#include "src/plan/spec.h"

namespace reshard::plan {

enum class TransferKind : uint8_t {
  kLocal = 0,    // Source and destination on the same rank: a memory copy.
  kNetwork = 1,  // Between ranks: a one-sided put over the network.
  kFanout = 2,   // Inside a domain, from a rank that already received the data.
};
const char* TransferKindName(TransferKind k);

// One copy of one region. `from_side` says which of the sender's buffers it reads (a fan-out
// reads the destination buffer the data landed in; a relay or a forward from a staging receiver
// reads kDst or kStage). `to_side` is kDst, or kStage when the receiver does not hold the
// destination tile and forwards the data inside its domain. `after` is the index of the transfer
// whose arrival this one waits for, or -1; it always precedes this transfer in plan order.
//
// The domain-aware schedule emits: kNetwork from a source (from_side kSrc, after -1); kNetwork
// relays from a domain that already received the data (from_side kDst or kStage, after set);
// kFanout inside a domain, either from the rank that took the data off the network (after set)
// or from a source holder in the destination domain (from_side kSrc, after -1); kLocal copies.
//
// `feeds_relay` marks a kNetwork transfer that some kNetwork relay waits on (its `after`): the
// relay's domain gets the data only once this transfer landed, so these bytes are on the
// critical path of relay chains (the simulator's --relay-priority what-if reads it;
// docs/simulator.md, "Relay priority"). It is derived from the transfers (a function of what
// schedule_hash() covers), set in every plan that keeps the transfer, shares included.
struct Transfer {
  uint32_t tensor = 0;
  uint32_t region = 0;
  int32_t from_rank = 0;
  int32_t to_rank = 0;
  int32_t after = -1;
  TransferKind kind = TransferKind::kNetwork;
  Side from_side = Side::kSrc;
  Side to_side = Side::kDst;
  bool feeds_relay = false;
};

// A per-rank buffer: every rank holding a tile of a tensor on `side` has one buffer of this name.
struct BufferInfo {
  std::string name;
  Side side = Side::kSrc;
  int elem_bytes = 1;
  // A buffer the refit owns, not one the user gives: a lowered spec's quantized sources
  // (quant_spec.h; the staging buffer has Side::kStage instead).
  bool internal = false;
};

// The per-rank buffers a spec names: each side's buffers in order of first appearance
// (sources first), and each tensor's buffer per side. Every plan of the spec has these buffers.
// A lowered spec's buffers also include the user's source buffers of its quantized tensors
// (after the others, if no tensor reads them directly: quantized_source_buffer).
struct BufferTable {
  std::vector<BufferInfo> buffers;
  std::vector<uint32_t> tensor_buffer[2];  // [side][tensor] -> index into buffers.
  // Parallel to spec.quantized_sources: the user's source buffer each is quantized from, and
  // for a requantized FP8 source the user's buffer of its source scales (else 0xffffffff).
  std::vector<uint32_t> quantized_source_buffer;
  std::vector<uint32_t> quantized_source_scale_buffer;
};
BufferTable AssignBuffers(const RefitSpec& spec);
// Bytes of every buffer of `table` on `rank` (indexed by buffer id; 0 when the rank holds no
// tile of it, and for buffers no tensor names, such as a plan's staging buffer): the largest
// extent of the rank's tiles' views. O(tensors x mesh size).
std::vector<int64_t> BufferBytes(const RefitSpec& spec, const BufferTable& table, int32_t rank);

struct TensorStats {
  int64_t pieces = 0;           // Transfers into destination ranks (one per rank and source).
  int64_t bytes = 0;            // Bytes landing in destination buffers.
  int64_t runs = 0;             // Contiguous runs over all transfers.
  int64_t contiguous = 0;       // Transfers that are one contiguous run.
  int64_t max_sources = 0;      // Most distinct source ranks feeding one destination rank.
  int64_t dst_ranks = 0;        // Destination ranks with a non-empty tile.
};

struct PlanStats {
  int64_t tensors = 0;
  int64_t pieces = 0;
  int64_t regions = 0;
  int64_t runs = 0;
  int64_t bytes_dst_total = 0;  // Bytes that land in destination buffers.
  int64_t bytes_network = 0;    // Bytes moved by network transfers.
  int64_t bytes_local = 0;      // Bytes copied within a rank.
  int64_t bytes_fanout = 0;     // Bytes copied inside domains after landing.
  int64_t bytes_relay = 0;      // Part of bytes_network sent by a rank that received it first.
  int64_t bytes_staged = 0;     // Bytes landing in staging buffers (network or fan-out).
  int64_t max_nic_bytes = 0;    // Most network bytes one rank sends or receives (per direction).
};

class Plan {
 public:
  const RefitSpec& spec() const { return *spec_; }
  std::shared_ptr<const RefitSpec> shared_spec() const { return spec_; }
  int32_t world_size() const { return world_size_; }
  // A hash of everything the plan is a function of (the schedule's version, the options, the
  // domains and the spec's tensors): equal in the world plan and in every share of the same
  // spec and options, which ranks compare before moving any data.
  uint64_t fingerprint() const { return fingerprint_; }
  // The world plan only (0 in a share): a hash of its whole contents (every region and transfer
  // in plan order), to pin schedules in tests and compare plans across versions.
  uint64_t schedule_hash() const { return schedule_hash_; }
  const PlanStats& stats() const { return stats_; }
  const std::vector<TensorStats>& tensor_stats() const { return tensor_stats_; }

  const std::vector<BufferInfo>& buffers() const { return buffers_.buffers; }
  // The user's source buffer that spec().quantized_sources[q] is quantized from (quant_spec.h).
  uint32_t quantized_source_buffer(size_t q) const { return buffers_.quantized_source_buffer[q]; }
  // The user's buffer of its source scales when it is a requantized FP8 source, else kNoBuffer.
  uint32_t quantized_source_scale_buffer(size_t q) const {
    return buffers_.quantized_source_scale_buffer[q];
  }
  // Buffer id of `tensor` on `side`.
  uint32_t buffer_of(size_t tensor, Side side) const {
    return side == Side::kStage ? stage_buffer_ : buffers_.tensor_buffer[static_cast<int>(side)][tensor];
  }
  // Id of the staging buffer (BufferInfo side kStage, elem_bytes 1), or kNoBuffer when no
  // transfer uses staging. Every rank has one; its size is stage_bytes(rank).
  static constexpr uint32_t kNoBuffer = 0xffffffffu;
  uint32_t stage_buffer() const { return stage_buffer_; }
  int64_t stage_bytes(int32_t rank) const {
    return stage_bytes_.empty() ? 0 : stage_bytes_[rank];
  }
  // Network bytes each rank receives and sends (indexed by rank).
  const std::vector<int64_t>& nic_in_bytes() const { return nic_in_; }
  const std::vector<int64_t>& nic_out_bytes() const { return nic_out_; }

  // The world plan (rank() == -1) holds every transfer; a rank's plan (BuildRankPlan) holds only
  // the transfers it sends or receives, and the fan-out transfers between two other ranks of its
  // domain (DomainMap; the fan-out layer derives the domain's table from them), in plan order,
  // and only the regions they use. In both, Transfer::after and transfer_id() are indices into
  // the world plan's transfers (what names a piece between ranks), Transfer::region indexes this
  // plan's regions, and sends()/receives() index this plan's transfers(). Everything else
  // (stats, tensor stats, NIC loads, staging sizes, buffers, fingerprint) is the world's,
  // identical in both.
  int32_t rank() const { return rank_; }
  const std::vector<Transfer>& transfers() const { return transfers_; }
  // World index of transfers()[i].
  uint32_t transfer_id(size_t i) const {
    return transfer_ids_.empty() ? static_cast<uint32_t>(i) : transfer_ids_[i];
  }
  // Transfers in the world plan.
  uint64_t world_transfers() const { return world_transfers_; }
  const Region& region(uint32_t i) const { return regions_[i]; }
  const RegionDim* region_dims(const Region& r) const { return region_dims_.data() + r.dims_begin; }
  size_t num_regions() const { return regions_.size(); }

  // Indices into transfers() of what `rank` sends (from_rank == rank), in plan order.
  std::pair<const uint32_t*, const uint32_t*> sends(int32_t rank) const {
    return {by_sender_.data() + sender_begin_[rank], by_sender_.data() + sender_begin_[rank + 1]};
  }
  // Indices into transfers() of what lands on `rank` (to_rank == rank), in plan order.
  std::pair<const uint32_t*, const uint32_t*> receives(int32_t rank) const {
    return {by_receiver_.data() + receiver_begin_[rank],
            by_receiver_.data() + receiver_begin_[rank + 1]};
  }

  // Bytes of every buffer on `rank` (indexed by buffer id; 0 when the rank holds no tile of it).
  // O(tensors x mesh size).
  std::vector<int64_t> BufferBytes(int32_t rank) const;

 private:
  friend class PlanBuilder;
  std::shared_ptr<const RefitSpec> spec_;
  int32_t world_size_ = 0;
  int32_t rank_ = -1;
  uint64_t world_transfers_ = 0;
  std::vector<uint32_t> transfer_ids_;  // Empty in the world plan (identity).
  uint64_t fingerprint_ = 0;
  uint64_t schedule_hash_ = 0;
  PlanStats stats_;
  std::vector<TensorStats> tensor_stats_;
  BufferTable buffers_;  // The spec's (AssignBuffers), then the staging buffer if any.
  std::vector<Region> regions_;
  std::vector<RegionDim> region_dims_;
  std::vector<Transfer> transfers_;
  std::vector<uint32_t> sender_begin_, by_sender_, receiver_begin_, by_receiver_;
  uint32_t stage_buffer_ = kNoBuffer;
  std::vector<int64_t> stage_bytes_;
  std::vector<int64_t> nic_in_, nic_out_;
};

struct PlanOptions {
  enum class Schedule : uint8_t {
    // Every piece crosses the network once per destination domain, then fans out over the
    // domain's fabric; see schedule.h.
    kDomainAware,
    // Naive baseline: every destination rank receives its own tile from a source holder.
    kPointToPoint,
  };
  Schedule schedule = Schedule::kDomainAware;
  // kPointToPoint: spread pieces of replicated source tiles over their holders (least bytes
  // sent so far); otherwise the first holder sends everything. A holder on the destination rank
  // always wins. kDomainAware always balances.
  bool spread_replicas = true;
  // kDomainAware: a domain that received a piece may relay it to another domain when the source
  // NICs are the bottleneck.
  bool relay = true;
  // kDomainAware: a rank that does not hold the destination tile may take a piece off the
  // network into its staging buffer and forward it inside the domain.
  bool staging = true;
  // kDomainAware: pieces of at least split_min_bytes are split into parts of at least
  // split_part_bytes received by different ranks of a domain.
  int64_t split_min_bytes = int64_t{32} << 20;
  int64_t split_part_bytes = int64_t{8} << 20;
};

// Plans a spec that passed Validate(). Errors: InvalidArgument when the spec is invalid,
// ResourceExhausted when the plan would exceed 2^32 transfers or regions.
[[nodiscard]] absl::StatusOr<Plan> BuildPlan(std::shared_ptr<const RefitSpec> spec,
                                             const PlanOptions& options = {});

// The share of `rank` in the plan BuildPlan(spec, options) makes: every schedule decision is
// the same (the whole spec is scheduled), but only the transfers `rank` sends or receives (its
// network sends and receives, relays, fan-out copies in and out, local copies), the fan-out
// copies between other ranks of its domain, and their regions are kept, so memory scales with
// the rank's share. Stats and fingerprint equal the world plan's.
// Errors as BuildPlan, and InvalidArgument when rank is outside [0, world size).
[[nodiscard]] absl::StatusOr<Plan> BuildRankPlan(std::shared_ptr<const RefitSpec> spec,
                                                 int32_t rank, const PlanOptions& options = {});

// A relay: a network piece from a domain that already received the part (its destination tile
// or staging slot) to another domain, once its feed (`after`) landed there.
inline bool IsRelay(const Transfer& t) {
  return t.kind == TransferKind::kNetwork && t.after >= 0 && t.from_side != Side::kSrc;
}

// Delta refits (docs/delta.md): the element size at which the engine compares and encodes `t`
// as a delta stream (the destination dtype's 2, 4 or 8 bytes when the piece is whole elements of
// it, else 1: byte by byte), or 0 when `t` travels plain whatever the refit. Encoded: a network
// piece of more than delta::kShortestStream bytes (no stream of a smaller piece is smaller than
// it) into a destination tile or a staging slot (each piece has its own,
// which keeps what the last refit wrote, as a destination does) that is read from a source tile
// (the source encodes it against its shadow), or a relay (read from the destination tile or
// staging slot its feed landed in, after it: the relay forwards the stream it received; every
// relay chain of the domain-aware schedule starts at a piece read from a source, of the same
// part, so the rule needs no transfer but `t`, which a downstream rank's share of the plan
// lacks). net::DeltaElemBytes applies it to delta refits; the simulator to its delta flows.
inline int DeltaElemBytes(const Plan& plan, const Transfer& t) {
  if (t.kind != TransferKind::kNetwork || t.from_rank == t.to_rank ||
      (t.to_side != Side::kDst && t.to_side != Side::kStage) ||
      !((t.from_side == Side::kSrc && t.after < 0) || IsRelay(t))) {
    return 0;
  }
  const int64_t bytes = plan.region(t.region).bytes;
  if (bytes <= delta::kShortestStream) return 0;
  const int es = plan.buffers()[plan.buffer_of(t.tensor, Side::kDst)].elem_bytes;
  return (es == 2 || es == 4 || es == 8) && bytes % es == 0 ? es : 1;
}

// Calls fn(rank, box) for every rank holding a tile of `tensor` on `side`, empty tiles included.
template <typename Fn>
void ForEachTile(const RefitSpec& spec, size_t tensor, Side side, Fn&& fn);

}  // namespace reshard::plan

#include "src/plan/tiling.h"

template <typename Fn>
void reshard::plan::ForEachTile(const RefitSpec& spec, size_t tensor, Side side, Fn&& fn) {
  const Layout& layout = spec.layout(tensor, side);
  TileGrid grid(layout, spec.tensors[tensor].shape);
  for (int64_t flat = 0; flat < grid.num_cells(); ++flat) {
    const TileGrid::Cell cell = grid.CellAt(flat);
    const Box box = grid.CellBox(cell);
    const int64_t base = grid.CellBaseIndex(cell);
    for (int64_t j = 0; j < grid.num_replicas(); ++j) {
      fn(layout.mesh.ranks[base + grid.replica_offset(j)], box);
    }
  }
}
