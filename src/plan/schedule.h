// The domain-aware schedule: who sends each piece over which NIC, and how it spreads inside an
// NVLink domain (DESIGN §1, §4; docs/simulator.md).
//
// For every piece (source cell x destination cell) and every destination domain that needs it
// and holds no source replica, exactly one network transfer lands the piece (or each part of a
// split piece) in the domain; fan-out copies then reach every other holder of the destination
// cell in that domain. The network receiver is the least loaded holder, or, with staging, any
// rank of the domain whose NIC is less loaded (it lands the part in its staging buffer and
// forwards it). The sender is the least loaded source replica, or, with relays, a rank of a
// domain that already took the part off the network, when the source NICs would exceed the
// lower bound, or when the receiver must ingest near the bound and a lightly loaded domain has
// the part (a source NIC is shared by every receiver, a relay's is not). Domains holding a source
// replica copy locally or over their own fabric. Everything is greedy in plan order with load
// tracking: deterministic.
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "absl/types/span.h"

#include "src/plan/plan.h"
#include "src/plan/region.h"
#include "src/plan/spec.h"
#include "src/plan/tiling.h"

namespace reshard::plan {

// Dense NVLink domains over the ranks that take part in a spec (ranks named by some mesh).
// Domain ids follow the smallest participating rank; ranks() lists participants, ascending.
class DomainMap {
 public:
  explicit DomainMap(const RefitSpec& spec);
  // `world` == spec.WorldSize(), when the caller has it (a whole-model spec names hundreds of
  // ranks per tensor: every pass over the meshes counts).
  DomainMap(const RefitSpec& spec, int32_t world);

  int32_t world_size() const { return static_cast<int32_t>(domain_of_.size()); }
  int32_t num_domains() const { return static_cast<int32_t>(ranks_.size()); }
  // Dense domain id of `rank`, or -1 when the rank holds no tile on either side.
  int32_t domain_of(int32_t rank) const { return domain_of_[rank]; }
  const std::vector<int32_t>& ranks(int32_t domain) const { return ranks_[domain]; }
  int64_t num_participants() const { return participants_; }

 private:
  std::vector<int32_t> domain_of_;
  std::vector<std::vector<int32_t>> ranks_;
  int64_t participants_ = 0;
};

// What any schedule must move, given the domain placement (formulas in docs/simulator.md).
struct LowerBound {
  // sum over domains d of U_d, the bytes ranks of d need that no rank of d holds: the least
  // that crosses the network.
  int64_t network_bytes = 0;
  // max_d ceil(U_d / |d|): a domain ingests U_d through its |d| NICs at best evenly.
  int64_t domain_ingest_bytes = 0;
  // max over rank groups G of ceil(E_G / |G|), E_G the bytes of pieces whose replicas all lie in
  // G that some domain without a replica needs (they leave G at least once). Groups: every
  // replica set, every source mesh, the source ranks of every domain.
  int64_t source_egress_bytes = 0;
  // ceil(network_bytes / participating ranks): every byte leaves some NIC.
  int64_t average_bytes = 0;
  // max of the three terms above: the least possible load of the most loaded NIC direction.
  int64_t max_nic_bytes = 0;
  // max_d ceil((sum_{r in d} N_r - U_d) / |d|), N_r the bytes rank r needs and does not hold:
  // what must move over the domain's fabric at best evenly.
  int64_t nvlink_bytes = 0;
  // max(max_nic_bytes / NIC bandwidth, nvlink_bytes / NVLink bandwidth).
  double seconds = 0;
};

[[nodiscard]] LowerBound ComputeLowerBound(const RefitSpec& spec, const DomainMap& domains);

// Where the schedule puts regions, transfers and staging space (implemented by the planner).
// The schedule streams every transfer of the world plan past the sink in plan order: the sink
// counts each (statistics and NIC loads, inline: a share counts millions it does not keep) and
// is handed only those it keeps, so that regions and addresses are built only for those.
class ScheduleSink {
 public:
  virtual ~ScheduleSink() = default;

  // Whether the plan keeps `tr` (every field but `region` set): the world plan keeps every
  // transfer; a rank's share keeps what the rank sends or receives, and every fan-out copy
  // between two ranks of its domain (the fan-out layer numbers signal slots and NCCL batches
  // over the domain's whole fan-out table, which every rank of the domain derives alike).
  bool Keeps(const Transfer& tr) const {
    if (keep_rank_ < 0 || tr.from_rank == keep_rank_ || tr.to_rank == keep_rank_) return true;
    return tr.kind == TransferKind::kFanout && keep_domain_ >= 0 &&
           keep_domains_->domain_of(tr.from_rank) == keep_domain_ &&
           keep_domains_->domain_of(tr.to_rank) == keep_domain_;
  }
  // Counts one region of the world plan; called once per region, before AddRegion (if any).
  void CountRegion() { ++world_regions_; }
  // Counts one transfer of the world plan whose region has `shape`; returns its world index.
  int32_t CountTransfer(const Transfer& tr, const RegionShape& r) {
    const int64_t runs = r.num_runs();
    stats_.runs += runs;
    switch (tr.kind) {
      case TransferKind::kLocal:
        stats_.bytes_local += r.bytes;
        break;
      case TransferKind::kNetwork:
        stats_.bytes_network += r.bytes;
        if (tr.from_side != Side::kSrc) stats_.bytes_relay += r.bytes;
        nic_out_[tr.from_rank] += r.bytes;
        nic_in_[tr.to_rank] += r.bytes;
        break;
      case TransferKind::kFanout:
        stats_.bytes_fanout += r.bytes;
        break;
    }
    ++stats_.pieces;
    if (tr.to_side == Side::kDst) {
      stats_.bytes_dst_total += r.bytes;
      TensorStats& t = tensor_stats_[tr.tensor];
      ++t.pieces;
      t.bytes += r.bytes;
      t.runs += runs;
      if (r.ndims == 0) ++t.contiguous;
    } else {
      stats_.bytes_staged += r.bytes;
    }
    return static_cast<int32_t>(world_transfers_++);
  }

  // Stores the region a kept transfer uses; returns its index in the plan's regions.
  virtual uint32_t AddRegion(const Box& box, const TileAddress& from, const TileAddress& to) = 0;
  // A kept transfer (`tr.region` set), counted as world transfer `world_id`.
  virtual void AddTransfer(const Transfer& tr, int32_t world_id) = 0;
  // World transfer `world_id`, counted before, is a network transfer a network relay waits on:
  // sets its feeds_relay where the plan keeps it.
  virtual void MarkFeedsRelay(int32_t world_id) = 0;
  // Reserves `bytes` of `rank`'s staging buffer; returns the byte offset (aligned to 64).
  virtual int64_t AllocateStage(int32_t rank, int64_t bytes) = 0;

 protected:
  // Keeps what `rank`'s share keeps (every transfer when rank < 0); `domains` groups the ranks
  // of a domain-aware plan (nullptr otherwise). Counts over `world` ranks and `tensors`.
  ScheduleSink(int32_t rank, int32_t world, size_t tensors)
      : keep_rank_(rank), nic_in_(world, 0), nic_out_(world, 0), tensor_stats_(tensors) {}
  void KeepDomainOf(const DomainMap* domains) {
    keep_domains_ = domains;
    keep_domain_ = domains != nullptr && keep_rank_ >= 0 ? domains->domain_of(keep_rank_) : -1;
  }

  const int32_t keep_rank_;
  int32_t keep_domain_ = -1;
  const DomainMap* keep_domains_ = nullptr;
  // What the world plan's transfers add up to.
  PlanStats stats_;
  std::vector<int64_t> nic_in_, nic_out_;
  std::vector<TensorStats> tensor_stats_;
  uint64_t world_regions_ = 0, world_transfers_ = 0;
};

// The holders of each destination cell grouped by domain, per cell of the bound destination
// layout. A model's tensors repeat a few destination meshes and grids, so each cell is
// grouped once while they do, not once per piece and pass (it was a twentieth of a share's
// planning). A view stays valid until the next Of().
class HolderGroups {
 public:
  struct View {
    const std::pair<int32_t, int32_t>* by_domain;            // (domain, rank), sorted.
    absl::Span<const std::pair<uint32_t, uint32_t>> groups;  // [begin, end) per domain.
  };
  // Keeps the cells grouped so far when `ranks` and the grid's replica offsets are those of
  // the previous binding.
  void Bind(const std::vector<int32_t>& ranks, const TileGrid& grid, const DomainMap& domains);
  View Of(int64_t base);

 private:
  const DomainMap* domains_ = nullptr;
  std::vector<int32_t> ranks_;
  std::vector<int64_t> offsets_;  // Replica offsets of the bound grid.
  struct Entry {
    uint32_t by_domain = 0, groups = 0, num_groups = 0;
  };
  std::vector<uint32_t> entry_of_base_;  // UINT32_MAX: not grouped yet.
  std::vector<Entry> entries_;
  std::vector<std::pair<int32_t, int32_t>> by_domain_;
  std::vector<std::pair<uint32_t, uint32_t>> groups_;  // Relative to the entry's by_domain.
};

class DomainScheduler {
 public:
  // Computes the lower bound and the expected loads in one pass over the spec's pieces; relays
  // start once a source NIC would exceed the bound's max_nic_bytes.
  DomainScheduler(const RefitSpec& spec, const DomainMap& domains, const PlanOptions& options);

  // ComputeLowerBound(spec, domains), computed by the constructor's pass.
  const LowerBound& lower_bound() const { return lower_bound_; }

  // The destination layout of the pieces scheduled next: mesh ranks `ranks` (of the tensor's
  // destination layout) and its grid `grid`. Call once per tensor, before its pieces.
  void BindDestination(const std::vector<int32_t>& ranks, const TileGrid& grid) {
    dst_groups_.Bind(ranks, grid, domains_);
  }
  // Schedules one piece of tensor `tensor` (element size `elem`): `src_holders` hold source
  // tile `src` (all at the same address), the holders of the destination cell whose base index
  // into the bound mesh's ranks is `dst_base` (TileGrid::CellBaseIndex) need destination tile
  // `dst`.
  void SchedulePiece(uint32_t tensor, int elem, const Box& piece, const TileAddress& src,
                     const TileAddress& dst, const std::vector<int32_t>& src_holders,
                     int64_t dst_base, ScheduleSink& sink);

  // Pieces of the whole spec (counted by the constructor's pass), to size the plan's arrays.
  int64_t num_pieces() const { return num_pieces_; }

 private:
  struct Endpoint {
    int32_t rank = -1;
    Side side = Side::kDst;
    int64_t stage_offset = 0;  // Byte offset in the staging buffer when side == kStage.
    int32_t transfer = -1;     // The transfer that landed the data here.
    int depth = 0;             // Network hops from the source.
  };
  static constexpr int kMaxRelayDepth = 3;
  // A receiver expected to ingest at least this fraction of the target takes relays from
  // ranks expected to ingest at most kLightRelay of it, also while the source has room
  // (SchedulePart). Simulated figures do not move between 0.8 and 0.95, nor 0.5 and 0.9.
  static constexpr double kHeavyReceiver = 0.9;
  static constexpr double kLightRelay = 0.75;
  void SchedulePart(uint32_t tensor, int elem, const Box& part, const TileAddress& src,
                    const TileAddress& dst, const std::vector<int32_t>& src_holders,
                    ScheduleSink& sink);
  // The address of the part at endpoint `e`: `src` or `dst`, or a staging address written to
  // `scratch`.
  const TileAddress& AddressOf(const Endpoint& e, const Box& part, int elem,
                               const TileAddress& src, const TileAddress& dst,
                               TileAddress& scratch) const;
  // Expected final ingress of a rank: what it received plus its share of what its cells still
  // need (a holder-only schedule spreading every piece evenly over the domain's holders).
  int64_t Expected(int32_t rank) const { return in_[rank] + static_cast<int64_t>(pending_[rank]); }
  // The rank of `domain` expected to end least loaded (the lowest on ties) and its Expected().
  // Kept per domain and updated as loads change (ExpectedChanged), instead of a scan of the
  // domain per network part: the scan was a sixth of a share's planning time.
  std::pair<int32_t, int64_t> LeastExpected(int32_t domain);
  // Called after Expected(rank) of a rank of `domain` may have changed from `before`. Mostly it
  // did not (a one-holder domain's receiver needs less by what it received): nothing to track.
  void ExpectedChanged(int32_t rank, int32_t domain, int64_t before) {
    const int64_t now = Expected(rank);
    if (now != before) Retrack(rank, domain, before, now);
  }
  // The least-expected rank of `domain` after Expected(rank) went from `before` to `now`.
  void Retrack(int32_t rank, int32_t domain, int64_t before, int64_t now);
  bool HoldsSource(int32_t domain) const { return domain_stamp_[domain] == stamp_; }

  const DomainMap& domains_;
  PlanOptions options_;
  LowerBound lower_bound_;
  int64_t target_ = 0;
  std::vector<int64_t> in_, out_, nvlink_out_;
  std::vector<double> pending_;
  // Egress each source rank still owes: one send of every piece it holds that some domain
  // without a replica needs, shared among the piece's replicas.
  std::vector<double> owed_;
  struct LeastInDomain {
    int32_t rank = -1;  // -1: unknown, rescan.
    int64_t expected = 0;
  };
  std::vector<LeastInDomain> least_;  // Per domain.
  uint64_t rotation_ = 0;
  int64_t num_pieces_ = 0;
  HolderGroups dst_groups_;
  // The current piece's destination holders grouped by domain (dst_groups_.Of()).
  const std::pair<int32_t, int32_t>* dst_by_domain_ = nullptr;     // (domain, rank).
  absl::Span<const std::pair<uint32_t, uint32_t>> domain_groups_;  // [begin, end) per domain.
  std::vector<std::pair<uint32_t, uint32_t>> network_groups_;  // Groups without a source replica.
  std::vector<Endpoint> received_;                          // Receivers that may relay a part.
  TileAddress from_scratch_, to_scratch_;                   // Staging addresses of a region.
  // The last region shape computed (ShapeOfRegion): a shape depends only on the extents, the
  // strides of both sides and the element size, which a tensor's pieces mostly share.
  class ShapeCache {
   public:
    const RegionShape& Get(const Box& box, const TileAddress& from, const TileAddress& to,
                           int elem);

   private:
    bool valid_ = false;
    int ndim_ = 0, elem_ = 0;
    std::array<int64_t, kMaxTensorDims> extent_{}, from_strides_{}, to_strides_{};
    RegionShape shape_;
  };
  // From the source tile, from the destination tile, through staging (as SchedulePart's slots).
  ShapeCache shapes_[3];
  std::vector<int32_t> src_domains_;                        // Parallel to the source holders.
  // Source membership of the current piece: rank_stamp_[r] == stamp_ when rank r holds the
  // source tile, domain_stamp_[d] == stamp_ when domain d holds a source replica.
  uint64_t stamp_ = 0;
  std::vector<uint64_t> rank_stamp_, domain_stamp_;
};

}  // namespace reshard::plan
