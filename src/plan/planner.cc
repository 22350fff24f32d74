// BuildPlan: overlap -> assignment -> per-rank indexes -> fingerprint.
#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "src/common/hash.h"
#include "src/common/status.h"
#include "src/plan/overlap.h"
#include "src/plan/plan.h"
#include "src/plan/quant_spec.h"
#include "src/plan/schedule.h"

namespace reshard::plan {
namespace {

// The version of the schedule, hashed into every plan's fingerprint: ranks whose planners would
// schedule the same spec differently must not agree. Bump it whenever a change alters any world
// plan (ScheduleTest.ScheduleHashesArePinned fails until then).
// 2: domains served from a hashed start; 3: relays also feed heavy receivers (schedule.cc).
constexpr uint64_t kScheduleVersion = 3;

}  // namespace

const char* TransferKindName(TransferKind k) {
  switch (k) {
    case TransferKind::kLocal: return "local";
    case TransferKind::kNetwork: return "network";
    case TransferKind::kFanout: return "fanout";
  }
  return "?";
}

BufferTable AssignBuffers(const RefitSpec& spec) {
  BufferTable table;
  absl::flat_hash_map<std::pair<int, std::string>, uint32_t> ids;
  for (Side side : {Side::kSrc, Side::kDst}) {
    auto& per_tensor = table.tensor_buffer[static_cast<int>(side)];
    per_tensor.resize(spec.tensors.size());
    for (size_t t = 0; t < spec.tensors.size(); ++t) {
      const TensorSpec& ts = spec.tensors[t];
      const std::string& name = side == Side::kSrc ? ts.src_buffer() : ts.dst_buffer();
      auto [it, inserted] = ids.try_emplace(std::make_pair(static_cast<int>(side), name),
                                            static_cast<uint32_t>(table.buffers.size()));
      if (inserted) {
        table.buffers.push_back({name, side, DTypeSize(ts.dtype),
                                 absl::StartsWith(name, kReservedBufferPrefix) &&
                                     !spec.quantized_sources.empty()});
      }
      per_tensor[t] = it->second;
    }
  }
  for (const QuantizedSource& q : spec.quantized_sources) {
    auto [it, inserted] = ids.try_emplace(std::make_pair(static_cast<int>(Side::kSrc), q.src.buffer),
                                          static_cast<uint32_t>(table.buffers.size()));
    if (inserted) table.buffers.push_back({q.src.buffer, Side::kSrc, DTypeSize(q.dtype)});
    table.quantized_source_buffer.push_back(it->second);
    uint32_t scales = Plan::kNoBuffer;
    if (q.requantized()) {
      auto [sit, sinserted] =
          ids.try_emplace(std::make_pair(static_cast<int>(Side::kSrc), q.src_scales.buffer),
                          static_cast<uint32_t>(table.buffers.size()));
      if (sinserted) {
        table.buffers.push_back(
            {q.src_scales.buffer, Side::kSrc, q.src_scheme == QuantScheme::kMx ? 1 : 4});
      }
      scales = sit->second;
    }
    table.quantized_source_scale_buffer.push_back(scales);
  }
  return table;
}

std::vector<int64_t> BufferBytes(const RefitSpec& spec, const BufferTable& table, int32_t rank) {
  std::vector<int64_t> bytes(table.buffers.size(), 0);
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    for (Side side : {Side::kSrc, Side::kDst}) {
      const Layout& layout = spec.layout(t, side);
      if (layout.mesh.IndexOf(rank) < 0) continue;
      TileGrid grid(layout, spec.tensors[t].shape);
      const Box box = grid.CellBox(*grid.CellOfRank(rank));
      const uint32_t b = table.tensor_buffer[static_cast<int>(side)][t];
      bytes[b] = std::max(bytes[b], TileExtent(layout, box) * table.buffers[b].elem_bytes);
    }
  }
  for (size_t i = 0; i < spec.quantized_sources.size(); ++i) {
    const QuantizedSource& q = spec.quantized_sources[i];
    if (q.src.mesh.IndexOf(rank) < 0) continue;
    TileGrid grid(q.src, spec.tensors[q.tensor].shape);
    const Box box = grid.CellBox(*grid.CellOfRank(rank));
    const uint32_t b = table.quantized_source_buffer[i];
    bytes[b] = std::max(bytes[b], TileExtent(q.src, box) * table.buffers[b].elem_bytes);
    if (q.requantized()) {
      const std::vector<int64_t> blocked =
          BlockedShape(spec.tensors[q.tensor].shape, q.src_block);
      TileGrid scale_grid(q.src_scales, blocked);
      const Box scale_box = scale_grid.CellBox(*scale_grid.CellOfRank(rank));
      const uint32_t sb = table.quantized_source_scale_buffer[i];
      bytes[sb] = std::max(bytes[sb], TileExtent(q.src_scales, scale_box) *
                                          table.buffers[sb].elem_bytes);
    }
  }
  return bytes;
}

std::vector<int64_t> Plan::BufferBytes(int32_t rank) const {
  std::vector<int64_t> bytes = plan::BufferBytes(*spec_, buffers_, rank);
  if (stage_buffer_ != kNoBuffer) bytes[stage_buffer_] = stage_bytes(rank);
  return bytes;
}

// Builds the world plan (rank -1) or one rank's share of it. Both schedule the whole spec and
// see every region and transfer in the same order: statistics, NIC loads, staging sizes and the
// fingerprint are computed as they stream past, and only what the plan keeps is stored.
class PlanBuilder : public ScheduleSink {
 public:
  // `world` is spec->WorldSize().
  PlanBuilder(std::shared_ptr<const RefitSpec> spec, int32_t world, const PlanOptions& options,
              int32_t rank)
      : ScheduleSink(rank, world, spec->tensors.size()), options_(options), rank_(rank) {
    plan_.spec_ = std::move(spec);
    plan_.world_size_ = world;
    plan_.rank_ = rank;
  }

  absl::StatusOr<Plan> Build() {
    const RefitSpec& spec = *plan_.spec_;
    load_.assign(plan_.world_size_, 0);
    AssignBuffers();
    std::unique_ptr<DomainMap> domains;
    if (options_.schedule == PlanOptions::Schedule::kDomainAware) {
      domains = std::make_unique<DomainMap>(spec, plan_.world_size_);
      KeepDomainOf(domains.get());
      scheduler_ = std::make_unique<DomainScheduler>(spec, *domains, options_);
      // Mostly two regions per piece (source to a holder, holder to holder in its domain), and
      // a quarter more for split pieces and staging: spares regrowth copies and page faults.
      if (rank_ < 0) {
        const size_t pieces = static_cast<size_t>(scheduler_->num_pieces());
        plan_.regions_.reserve(2 * pieces + pieces / 4);
      }
    }
    // Typically every destination rank receives a transfer or more per tensor: reserving that
    // and a quarter more spares whole-model plans most regrowth of millions of transfers.
    if (rank_ < 0) {
      size_t expected_transfers = 0;
      for (const TensorSpec& ts : spec.tensors) expected_transfers += ts.dst.mesh.ranks.size();
      plan_.transfers_.reserve(expected_transfers + expected_transfers / 4);
    }
    for (size_t t = 0; t < spec.tensors.size(); ++t) {
      RESHARD_RETURN_IF_ERROR(PlanTensor(t));
    }
    scheduler_.reset();
    KeepDomainOf(nullptr);
    if (!stage_bytes_.empty()) {
      plan_.stage_buffer_ = static_cast<uint32_t>(plan_.buffers_.buffers.size());
      plan_.buffers_.buffers.push_back({"(staging)", Side::kStage, 1});
      plan_.stage_bytes_ = std::move(stage_bytes_);
    }
    plan_.world_transfers_ = world_transfers_;
    BuildIndexes();
    FinishStats();
    ComputeFingerprint();
    return std::move(plan_);
  }

 private:
  // ScheduleSink: regions and transfers the plan keeps (all of them in the world plan, whose
  // region ids are then world ids).
  uint32_t AddRegion(const Box& box, const TileAddress& from, const TileAddress& to) override {
    const auto id = static_cast<uint32_t>(plan_.regions_.size());
    plan_.regions_.push_back(MakeRegion(box, from, to, elem_, plan_.region_dims_));
    if (rank_ < 0) HashRegion(plan_.regions_.back(), plan_.region_dims(plan_.regions_.back()));
    return id;
  }
  void AddTransfer(const Transfer& tr, int32_t world_id) override {
    plan_.transfers_.push_back(tr);
    if (rank_ < 0) {
      HashTransfer(tr);
    } else {
      plan_.transfer_ids_.push_back(static_cast<uint32_t>(world_id));
    }
  }
  void MarkFeedsRelay(int32_t world_id) override {
    if (rank_ < 0) {
      plan_.transfers_[world_id].feeds_relay = true;
      return;
    }
    // Kept transfers ascend by world index; the relay follows its parent within one part.
    const std::vector<uint32_t>& ids = plan_.transfer_ids_;
    const auto it = std::lower_bound(ids.begin(), ids.end(), static_cast<uint32_t>(world_id));
    if (it != ids.end() && *it == static_cast<uint32_t>(world_id)) {
      plan_.transfers_[it - ids.begin()].feeds_relay = true;
    }
  }
  int64_t AllocateStage(int32_t rank, int64_t bytes) override {
    if (stage_bytes_.empty()) stage_bytes_.assign(plan_.world_size_, 0);
    const int64_t offset = stage_bytes_[rank];
    stage_bytes_[rank] += (bytes + 63) / 64 * 64;
    return offset;
  }

  void HashRegion(const Region& r, const RegionDim* dims) {
    Fingerprint& fp = region_fp_;
    fp.Add(static_cast<uint64_t>(r.from_offset));
    fp.Add(static_cast<uint64_t>(r.to_offset));
    fp.Add(static_cast<uint64_t>(r.run_bytes));
    fp.Add(static_cast<uint64_t>(r.bytes));
    fp.Add(static_cast<uint64_t>(r.ndims));
    for (int i = 0; i < r.ndims; ++i) {
      fp.Add(static_cast<uint64_t>(dims[i].count));
      fp.Add(static_cast<uint64_t>(dims[i].from_stride));
      fp.Add(static_cast<uint64_t>(dims[i].to_stride));
    }
  }
  void HashTransfer(const Transfer& tr) {
    Fingerprint& fp = transfer_fp_;
    fp.Add((static_cast<uint64_t>(tr.tensor) << 32) | tr.region);
    fp.Add((static_cast<uint64_t>(static_cast<uint32_t>(tr.from_rank)) << 32) |
           static_cast<uint32_t>(tr.to_rank));
    fp.Add((static_cast<uint64_t>(static_cast<uint32_t>(tr.after)) << 24) |
           (static_cast<uint64_t>(tr.to_side) << 16) | (static_cast<uint64_t>(tr.kind) << 8) |
           static_cast<uint64_t>(tr.from_side));
  }

  void AssignBuffers() {
    plan_.buffers_ = plan::AssignBuffers(*plan_.spec_);
  }

  absl::Status PlanTensor(size_t t) {
    const RefitSpec& spec = *plan_.spec_;
    const TensorSpec& ts = spec.tensors[t];
    const int elem = DTypeSize(ts.dtype);
    const TileGrid& src = src_grids_.Get(ts.src, ts.shape);
    const TileGrid& dst = dst_grids_.Get(ts.dst, ts.shape);
    TensorStats& stats = tensor_stats_[t];
    const int64_t src_replicas = src.num_replicas();
    const int64_t dst_replicas = dst.num_replicas();
    std::vector<int32_t> src_holders(src_replicas);
    const absl::Span<const int64_t> src_offsets = src.replica_offsets();
    // Distinct sources per destination cell, for the explain table.
    int64_t current_dst_cell = -1, sources_in_cell = 0;
    elem_ = elem;
    std::vector<int32_t> dst_holders(scheduler_ ? 0 : dst_replicas);
    if (scheduler_) scheduler_->BindDestination(ts.dst.mesh.ranks, dst);
    TileAddress src_address;
    bool src_address_valid = false;
    const absl::Span<const CachedPiece> pieces =
        pieces_.Get(src, src_grids_.last_key(), dst, dst_grids_.last_key());
    stats.dst_ranks += pieces_.nonempty_dst_cells() * dst_replicas;
    for (const CachedPiece& p : pieces) {
      if (p.dst_flat != current_dst_cell) {
        current_dst_cell = p.dst_flat;
        sources_in_cell = 0;
      }
      ++sources_in_cell;
      stats.max_sources = std::max(stats.max_sources, sources_in_cell);
      const int64_t sbase = p.src_base;
      for (int64_t j = 0; j < src_replicas; ++j) {
        src_holders[j] = ts.src.mesh.ranks[sbase + src_offsets[j]];
      }
      const int64_t dbase = p.dst_base;
      if (scheduler_) {
        // Consecutive pieces often read one source tile (an expert's matrix on one trainer).
        if (!src_address_valid || !SameBox(src_address.tile, p.src_box)) {
          src_address = MakeTileAddress(ts.src, p.src_box);
          src_address_valid = true;
        }
        scheduler_->SchedulePiece(static_cast<uint32_t>(t), elem, p.piece, src_address,
                                  MakeTileAddress(ts.dst, p.dst_box), src_holders, dbase, *this);
        continue;
      }
      for (int64_t j = 0; j < dst_replicas; ++j) {
        dst_holders[j] = ts.dst.mesh.ranks[dbase + dst.replica_offset(j)];
      }
      const TileAddress from = MakeTileAddress(ts.src, p.src_box);
      const TileAddress to = MakeTileAddress(ts.dst, p.dst_box);
      const RegionShape shape = ShapeOfRegion(p.piece, from, to, elem);
      CountRegion();
      uint32_t region = UINT32_MAX;  // Built for the first kept transfer.
      for (const int32_t to_rank : dst_holders) {
        const int32_t from_rank = ChooseSource(src_holders, to_rank);
        load_[from_rank] += shape.bytes;
        Transfer tr;
        tr.tensor = static_cast<uint32_t>(t);
        tr.from_rank = from_rank;
        tr.to_rank = to_rank;
        tr.kind = from_rank == to_rank ? TransferKind::kLocal : TransferKind::kNetwork;
        tr.from_side = Side::kSrc;
        const int32_t id = CountTransfer(tr, shape);
        if (Keeps(tr)) {
          if (region == UINT32_MAX) region = AddRegion(p.piece, from, to);
          tr.region = region;
          AddTransfer(tr, id);
        }
      }
    }
    if (world_transfers_ >= std::numeric_limits<uint32_t>::max() ||
        world_regions_ >= std::numeric_limits<uint32_t>::max() ||
        plan_.region_dims_.size() >= std::numeric_limits<uint32_t>::max()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "tensor \"%s\": the plan exceeds 2^32 transfers or regions; split the spec", ts.name));
    }
    return absl::OkStatus();
  }

  static bool SameBox(const Box& a, const Box& b) {
    if (a.ndim != b.ndim) return false;
    for (int d = 0; d < a.ndim; ++d) {
      if (a.lo[d] != b.lo[d] || a.hi[d] != b.hi[d]) return false;
    }
    return true;
  }

  int32_t ChooseSource(const std::vector<int32_t>& holders, int32_t to) const {
    if (holders.size() == 1) return holders[0];
    for (int32_t h : holders) {
      if (h == to) return h;
    }
    if (!options_.spread_replicas) return holders[0];
    // Point-to-point baseline.
    int32_t best = holders[0];
    for (int32_t h : holders) {
      if (load_[h] < load_[best]) best = h;
    }
    return best;
  }

  // Counting sort of transfer indices by sender and by receiver, stable in plan order. Both
  // indexes are built together: one pass counts, one pass places.
  void BuildIndexes() {
    const size_t world = static_cast<size_t>(plan_.world_size_);
    const std::vector<Transfer>& transfers = plan_.transfers_;
    std::vector<uint32_t>& send_begin = plan_.sender_begin_;
    std::vector<uint32_t>& recv_begin = plan_.receiver_begin_;
    send_begin.assign(world + 1, 0);
    recv_begin.assign(world + 1, 0);
    for (const Transfer& tr : transfers) {
      ++send_begin[tr.from_rank + 1];
      ++recv_begin[tr.to_rank + 1];
    }
    for (size_t r = 0; r < world; ++r) {
      send_begin[r + 1] += send_begin[r];
      recv_begin[r + 1] += recv_begin[r];
    }
    plan_.by_sender_.resize(transfers.size());
    plan_.by_receiver_.resize(transfers.size());
    std::vector<uint32_t> next_send(send_begin.begin(), send_begin.end() - 1);
    std::vector<uint32_t> next_recv(recv_begin.begin(), recv_begin.end() - 1);
    for (uint32_t i = 0; i < transfers.size(); ++i) {
      plan_.by_sender_[next_send[transfers[i].from_rank]++] = i;
      plan_.by_receiver_[next_recv[transfers[i].to_rank]++] = i;
    }
  }

  void FinishStats() {
    PlanStats& s = stats_;
    s.tensors = static_cast<int64_t>(plan_.spec_->tensors.size());
    s.regions = static_cast<int64_t>(world_regions_);
    for (int32_t rank = 0; rank < plan_.world_size_; ++rank) {
      s.max_nic_bytes = std::max({s.max_nic_bytes, nic_in_[rank], nic_out_[rank]});
    }
    plan_.stats_ = stats_;
    plan_.tensor_stats_ = std::move(tensor_stats_);
    plan_.nic_in_ = std::move(nic_in_);
    plan_.nic_out_ = std::move(nic_out_);
  }

  // The fingerprint hashes everything the plan is a function of: the schedule's version, the
  // options, the domain of every rank, and the spec's tensors (names, dtypes, shapes, meshes,
  // placements, buffers and views; not its comment). Ranks compare it before moving data, so it
  // catches ranks given different specs, options or topologies, and ranks running schedules of
  // different versions; a share computes it as cheaply as the world plan does. The world plan
  // also hashes its whole contents as they stream past (schedule_hash(): the spec's names, the
  // buffers, every region and transfer in plan order), which tests pin to catch a schedule that
  // changed without a new kScheduleVersion.
  void ComputeFingerprint() {
    const RefitSpec& spec = *plan_.spec_;
    Fingerprint fp;
    fp.Add(kScheduleVersion);
    fp.Add(static_cast<uint64_t>(plan_.world_size_));
    fp.Add(static_cast<uint64_t>(options_.schedule));
    fp.Add((uint64_t{options_.spread_replicas} << 2) | (uint64_t{options_.relay} << 1) |
           uint64_t{options_.staging});
    fp.Add(static_cast<uint64_t>(options_.split_min_bytes));
    fp.Add(static_cast<uint64_t>(options_.split_part_bytes));
    for (int32_t r = 0; r < plan_.world_size_; ++r) {
      fp.Add(static_cast<uint64_t>(static_cast<uint32_t>(spec.topology.DomainOf(r))));
    }
    fp.Add(spec.tensors.size());
    // A mesh equal to the previous tensor's on the same side (most of a model's) is hashed as
    // "the same" (a comparison, not a hash of hundreds of ranks per tensor).
    const std::vector<int32_t>* previous[2] = {nullptr, nullptr};
    auto add_layout = [&fp, &previous](const Layout& l, const std::string& buffer, int side) {
      fp.Add(l.mesh.shape.size());
      for (int64_t e : l.mesh.shape) fp.Add(static_cast<uint64_t>(e));
      const std::vector<int32_t>& ranks = l.mesh.ranks;
      fp.Add(ranks.size());
      if (previous[side] != nullptr && *previous[side] == ranks) {
        fp.Add(uint64_t{0x53616d654d657368});  // "SameMesh"
      } else {
        size_t i = 0;
        for (; i + 1 < ranks.size(); i += 2) {
          fp.Add((static_cast<uint64_t>(static_cast<uint32_t>(ranks[i])) << 32) |
                 static_cast<uint32_t>(ranks[i + 1]));
        }
        if (i < ranks.size()) fp.Add(static_cast<uint64_t>(static_cast<uint32_t>(ranks[i])));
      }
      previous[side] = &ranks;
      for (const Placement& p : l.placements) {
        // A strided shard flags its word and adds its split factor; other placements hash as
        // before, so their plans keep their fingerprints.
        fp.Add((static_cast<uint64_t>(p.is_strided()) << 40) |
               (static_cast<uint64_t>(p.kind) << 32) | static_cast<uint32_t>(p.dim));
        if (p.is_strided()) fp.Add(static_cast<uint64_t>(p.split_factor));
      }
      fp.Add(buffer);
      fp.Add(uint64_t{l.has_view});
      fp.Add(static_cast<uint64_t>(l.view.offset));
      fp.Add(l.view.strides.size());
      for (int64_t st : l.view.strides) fp.Add(static_cast<uint64_t>(st));
    };
    for (const TensorSpec& ts : spec.tensors) {
      fp.Add(ts.name);
      fp.Add(static_cast<uint64_t>(ts.dtype));
      fp.Add(ts.shape.size());
      for (int64_t e : ts.shape) fp.Add(static_cast<uint64_t>(e));
      add_layout(ts.src, ts.src_buffer(), 0);
      add_layout(ts.dst, ts.dst_buffer(), 1);
    }
    // A lowered spec: where its quantized tensors come from, and how they are quantized.
    for (const QuantizedSource& q : spec.quantized_sources) {
      fp.Add((uint64_t{q.tensor} << 32) | q.scale_tensor);
      fp.Add((static_cast<uint64_t>(q.dtype) << 8) | static_cast<uint64_t>(q.scheme));
      for (int64_t b : q.block) fp.Add(static_cast<uint64_t>(b));
      add_layout(q.src, q.src.buffer, 0);
      if (q.requantized()) {
        fp.Add(static_cast<uint64_t>(q.src_scheme));
        for (int64_t b : q.src_block) fp.Add(static_cast<uint64_t>(b));
        add_layout(q.src_scales, q.src_scales.buffer, 0);
      }
    }
    plan_.fingerprint_ = fp.value();
    if (rank_ >= 0) return;
    Fingerprint contents;
    contents.Add(static_cast<uint64_t>(plan_.world_size_));
    contents.Add(spec.tensors.size());
    for (const TensorSpec& ts : spec.tensors) {
      contents.Add(ts.name);
      contents.Add(static_cast<uint64_t>(ts.dtype));
    }
    for (const BufferInfo& b : plan_.buffers_.buffers) {
      contents.Add(b.name);
      contents.Add(static_cast<uint64_t>(b.side));
    }
    contents.Add(static_cast<uint64_t>(world_regions_));
    contents.Add(region_fp_.value());
    contents.Add(world_transfers_);
    contents.Add(transfer_fp_.value());
    plan_.schedule_hash_ = contents.value();
  }

  PlanOptions options_;
  const int32_t rank_;
  Plan plan_;
  std::unique_ptr<DomainScheduler> scheduler_;
  GridCache src_grids_, dst_grids_;
  PieceCache pieces_;  // Over src_grids_ and dst_grids_.
  std::vector<int64_t> stage_bytes_;
  int elem_ = 1;
  std::vector<int64_t> load_;  // Bytes each rank sends so far, for spreading replicas.
  Fingerprint region_fp_, transfer_fp_;
};

namespace {

// The spec a plan moves (quant_spec.h): the lowered spec when a destination is quantized,
// validated too (its scale tensors' destination buffers and views), for `rank` only when >= 0.
absl::StatusOr<std::shared_ptr<const RefitSpec>> LowerIfQuantized(
    std::shared_ptr<const RefitSpec> spec, int32_t rank) {
  RESHARD_ASSIGN_OR_RETURN(std::shared_ptr<const RefitSpec> lowered,
                           LowerQuantization(spec));
  if (lowered != spec) {
    RESHARD_RETURN_IF_ERROR(rank < 0 ? Validate(*lowered) : ValidateForRank(*lowered, rank));
  }
  return lowered;
}

}  // namespace

absl::StatusOr<Plan> BuildPlan(std::shared_ptr<const RefitSpec> spec, const PlanOptions& options) {
  RESHARD_RETURN_IF_ERROR(Validate(*spec));
  RESHARD_ASSIGN_OR_RETURN(spec, LowerIfQuantized(std::move(spec), -1));
  const int32_t world = spec->WorldSize();
  return PlanBuilder(std::move(spec), world, options, -1).Build();
}

absl::StatusOr<Plan> BuildRankPlan(std::shared_ptr<const RefitSpec> spec, int32_t rank,
                                   const PlanOptions& options) {
  const int32_t world = spec->WorldSize();
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d is outside the spec's world of %d ranks", rank, world));
  }
  RESHARD_RETURN_IF_ERROR(ValidateForRank(*spec, rank));
  RESHARD_ASSIGN_OR_RETURN(spec, LowerIfQuantized(std::move(spec), rank));
  return PlanBuilder(std::move(spec), world, options, rank).Build();
}

}  // namespace reshard::plan
