#include "src/plan/schedule.h"

#include <algorithm>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "src/common/hash.h"
#include "src/plan/overlap.h"
#include "src/plan/tiling.h"

namespace reshard::plan {
namespace {

int64_t CeilDiv64(int64_t a, int64_t b) { return b <= 0 ? 0 : (a + b - 1) / b; }

}  // namespace

DomainMap::DomainMap(const RefitSpec& spec) : DomainMap(spec, spec.WorldSize()) {}

DomainMap::DomainMap(const RefitSpec& spec, int32_t world) {
  std::vector<char> participates(world, 0);
  const std::vector<int32_t>* previous[2] = {nullptr, nullptr};  // As RefitSpec::WorldSize.
  for (const TensorSpec& t : spec.tensors) {
    for (int side = 0; side < 2; ++side) {
      const std::vector<int32_t>& ranks = (side == 0 ? t.src : t.dst).mesh.ranks;
      if (previous[side] != nullptr && *previous[side] == ranks) continue;
      previous[side] = &ranks;
      for (int32_t r : ranks) participates[r] = 1;
    }
  }
  domain_of_.assign(world, -1);
  absl::flat_hash_map<int32_t, int32_t> dense;  // Topology domain key -> dense id.
  for (int32_t r = 0; r < world; ++r) {
    if (!participates[r]) continue;
    ++participants_;
    auto [it, inserted] =
        dense.try_emplace(spec.topology.DomainOf(r), static_cast<int32_t>(ranks_.size()));
    if (inserted) ranks_.emplace_back();
    domain_of_[r] = it->second;
    ranks_[it->second].push_back(r);
  }
}

namespace {

// The lower bound's pass over every piece of the spec. The scheduler's own pre-pass shares its
// enumeration: `on_network_group(holders, begin, end, bytes)` sees each domain that needs a
// piece and holds no source replica (holders.by_domain[begin, end) are its holders of the
// destination cell), and `on_network_piece(t, src, sbase, bytes)` each piece that some such
// domain needs (tensor, source grid, the source cell's base index into its mesh's ranks).
// `dst_holders` groups destination holders by domain (the scheduler's, to keep its cells grouped);
// `num_pieces` counts the pieces.
template <typename OnNetworkGroup, typename OnNetworkPiece>
LowerBound LowerBoundPass(const RefitSpec& spec, const DomainMap& domains,
                          HolderGroups& dst_holders, int64_t& num_pieces,
                          OnNetworkGroup&& on_network_group, OnNetworkPiece&& on_network_piece) {
  LowerBound lb;
  const int32_t nd = domains.num_domains();
  std::vector<int64_t> ingest(nd, 0), need_sum(nd, 0);
  absl::flat_hash_map<std::vector<int32_t>, int64_t> egress;  // Sorted holder set -> bytes.
  // Membership per piece by stamp: rank_stamp[r] == stamp when r holds the piece's source
  // cell, domain_stamp[d] == stamp when d holds a source replica.
  std::vector<uint64_t> rank_stamp(domains.world_size(), 0), domain_stamp(nd, 0);
  uint64_t stamp = 0;
  // Egress per source cell of one tensor, indexed by the cell's base index into mesh.ranks
  // (the holders of a cell differ only by replica offsets from it); -1: no domain needs it.
  std::vector<int64_t> cell_egress;
  std::vector<int32_t> holders;
  GridCache src_grids, dst_grids;
  PieceCache pieces;
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const TensorSpec& ts = spec.tensors[t];
    const int64_t elem = DTypeSize(ts.dtype);
    const TileGrid& src = src_grids.Get(ts.src, ts.shape);
    const TileGrid& dst = dst_grids.Get(ts.dst, ts.shape);
    const std::vector<int32_t>& src_ranks = ts.src.mesh.ranks;
    const std::vector<int32_t>& dst_ranks = ts.dst.mesh.ranks;
    cell_egress.assign(src_ranks.size(), -1);
    const absl::Span<const int64_t> src_offsets = src.replica_offsets();
    dst_holders.Bind(dst_ranks, dst, domains);
    const absl::Span<const CachedPiece> tensor_pieces =
        pieces.Get(src, src_grids.last_key(), dst, dst_grids.last_key());
    num_pieces += static_cast<int64_t>(tensor_pieces.size());
    for (const CachedPiece& p : tensor_pieces) {
      const int64_t bytes = p.elements * elem;
      ++stamp;
      const int64_t sbase = p.src_base;
      for (int64_t offset : src_offsets) {
        const int32_t h = src_ranks[sbase + offset];
        rank_stamp[h] = stamp;
        domain_stamp[domains.domain_of(h)] = stamp;
      }
      bool network = false;
      const HolderGroups::View holders = dst_holders.Of(p.dst_base);
      for (const auto& [begin, end] : holders.groups) {
        const int32_t d = holders.by_domain[begin].first;
        if (domain_stamp[d] == stamp) {
          for (uint32_t k = begin; k < end; ++k) {
            if (rank_stamp[holders.by_domain[k].second] != stamp) need_sum[d] += bytes;
          }
          continue;
        }
        // No rank of d holds the source: every holder needs the piece, d takes it once.
        need_sum[d] += bytes * (end - begin);
        ingest[d] += bytes;
        lb.network_bytes += bytes;
        network = true;
        on_network_group(holders, begin, end, bytes);
      }
      if (network) {
        cell_egress[sbase] = std::max<int64_t>(cell_egress[sbase], 0) + bytes;
        on_network_piece(t, src, sbase, bytes);
      }
    }
    for (size_t base = 0; base < cell_egress.size(); ++base) {
      if (cell_egress[base] < 0) continue;
      holders.clear();
      for (int64_t j = 0; j < src.num_replicas(); ++j) {
        holders.push_back(src_ranks[base + src.replica_offset(j)]);
      }
      std::sort(holders.begin(), holders.end());
      egress[holders] += cell_egress[base];
    }
  }
  for (int32_t d = 0; d < nd; ++d) {
    const int64_t n = static_cast<int64_t>(domains.ranks(d).size());
    lb.domain_ingest_bytes = std::max(lb.domain_ingest_bytes, CeilDiv64(ingest[d], n));
    lb.nvlink_bytes =
        std::max(lb.nvlink_bytes, CeilDiv64(std::max<int64_t>(0, need_sum[d] - ingest[d]), n));
  }
  // Bytes whose every replica lies in a rank group G must leave G at least once: for every
  // candidate group (each replica set, each source mesh, the source ranks of each domain),
  // E_G = sum of E_S over replica sets S inside G, spread over |G| NICs at best.
  // Near-linear: a set S can only lie inside the groups that hold its smallest rank, so each
  // group visits the sets indexed under its own ranks and checks their members against a stamp
  // of the group (no world-sized bitsets, no groups x sets product).
  const int32_t world = domains.world_size();
  std::vector<std::pair<const std::vector<int32_t>*, int64_t>> sets;  // (sorted ranks, E_S)
  sets.reserve(egress.size());
  for (const auto& [set, bytes] : egress) sets.push_back({&set, bytes});
  std::vector<int32_t> by_min_begin(static_cast<size_t>(world) + 1, 0);
  for (const auto& [set, bytes] : sets) by_min_begin[set->front() + 1]++;
  for (int32_t r = 0; r < world; ++r) by_min_begin[r + 1] += by_min_begin[r];
  std::vector<int32_t> by_min(sets.size()), fill(by_min_begin.begin(), by_min_begin.end() - 1);
  for (size_t i = 0; i < sets.size(); ++i)
    by_min[fill[sets[i].first->front()]++] = static_cast<int32_t>(i);
  std::set<std::vector<int32_t>> groups;
  for (const auto& [set, bytes] : egress) groups.insert(set);
  std::vector<char> is_source(world, 0);
  const std::vector<int32_t>* previous_mesh = nullptr;
  for (const TensorSpec& ts : spec.tensors) {
    // Neighbouring tensors mostly share their source mesh: sort and insert it once.
    if (previous_mesh != nullptr && *previous_mesh == ts.src.mesh.ranks) continue;
    previous_mesh = &ts.src.mesh.ranks;
    std::vector<int32_t> mesh(ts.src.mesh.ranks.begin(), ts.src.mesh.ranks.end());
    std::sort(mesh.begin(), mesh.end());
    for (int32_t r : mesh) is_source[r] = 1;
    groups.insert(std::move(mesh));
  }
  std::vector<std::vector<int32_t>> src_by_domain(nd);  // Ascending source ranks per domain.
  for (int32_t r = 0; r < world; ++r) {
    if (is_source[r]) src_by_domain[domains.domain_of(r)].push_back(r);
  }
  for (const auto& ranks : src_by_domain) {
    if (!ranks.empty()) groups.insert(ranks);
  }
  std::vector<uint64_t> member(world, 0);
  uint64_t group_stamp = 0;
  for (const std::vector<int32_t>& group : groups) {
    ++group_stamp;
    for (int32_t r : group) member[r] = group_stamp;
    int64_t bytes = 0;
    for (int32_t r : group) {
      for (int32_t i = by_min_begin[r]; i < by_min_begin[r + 1]; ++i) {
        const auto& [set, e] = sets[by_min[i]];
        bool inside = true;
        for (int32_t h : *set) inside = inside && member[h] == group_stamp;
        if (inside) bytes += e;
      }
    }
    lb.source_egress_bytes =
        std::max(lb.source_egress_bytes, CeilDiv64(bytes, static_cast<int64_t>(group.size())));
  }
  lb.average_bytes = CeilDiv64(lb.network_bytes, domains.num_participants());
  lb.max_nic_bytes = std::max({lb.domain_ingest_bytes, lb.source_egress_bytes, lb.average_bytes});
  const double nic = spec.topology.nic_gbytes_per_s * 1e9;
  const double nvlink = spec.topology.nvlink_gbytes_per_s * 1e9;
  lb.seconds = std::max(lb.max_nic_bytes / nic, lb.nvlink_bytes / nvlink);
  return lb;
}

}  // namespace

LowerBound ComputeLowerBound(const RefitSpec& spec, const DomainMap& domains) {
  HolderGroups groups;
  int64_t pieces = 0;
  return LowerBoundPass(
      spec, domains, groups, pieces, [](auto&&...) {}, [](auto&&...) {});
}

DomainScheduler::DomainScheduler(const RefitSpec& spec, const DomainMap& domains,
                                 const PlanOptions& options)
    : domains_(domains), options_(options) {
  const int32_t world = domains.world_size();
  in_.assign(world, 0);
  out_.assign(world, 0);
  nvlink_out_.assign(world, 0);
  pending_.assign(world, 0);
  owed_.assign(world, 0);
  rank_stamp_.assign(world, 0);
  domain_stamp_.assign(domains.num_domains(), 0);
  least_.assign(domains.num_domains(), LeastInDomain{});
  // What every holder would ingest if each piece were spread evenly over the holders of its
  // destination cell in each domain that needs it. One pass with the bound's.
  lower_bound_ = LowerBoundPass(
      spec, domains, dst_groups_, num_pieces_,
      [&](const HolderGroups::View& holders, uint32_t begin, uint32_t end, int64_t piece_bytes) {
        const double bytes = static_cast<double>(piece_bytes);
        const double share = end - begin == 1 ? bytes : bytes / (end - begin);  // As SchedulePart.
        for (uint32_t k = begin; k < end; ++k) pending_[holders.by_domain[k].second] += share;
      },
      [&](size_t t, const TileGrid& src, int64_t sbase, int64_t piece_bytes) {
        const double bytes = static_cast<double>(piece_bytes);
        const std::vector<int32_t>& ranks = spec.tensors[t].src.mesh.ranks;
        const absl::Span<const int64_t> src_offsets = src.replica_offsets();
        const int64_t replicas = static_cast<int64_t>(src_offsets.size());
        for (int64_t offset : src_offsets) owed_[ranks[sbase + offset]] += bytes / replicas;
      });
  target_ = lower_bound_.max_nic_bytes;
}

std::pair<int32_t, int64_t> DomainScheduler::LeastExpected(int32_t domain) {
  LeastInDomain& least = least_[domain];
  if (least.rank < 0) {
    for (int32_t r : domains_.ranks(domain)) {
      const int64_t e = Expected(r);
      if (least.rank < 0 || e < least.expected) {
        least.rank = r;
        least.expected = e;
      }
    }
  }
  return {least.rank, least.expected};
}

void DomainScheduler::Retrack(int32_t rank, int32_t domain, int64_t before, int64_t now) {
  // Exact without the call when now == before: least.expected == Expected(least.rank) always,
  // and a rank other than least.rank had before > least.expected or a higher rank on a tie.
  LeastInDomain& least = least_[domain];
  if (least.rank < 0) return;
  if (rank == least.rank) {
    if (now <= before) {
      least.expected = now;
    } else {
      least.rank = -1;  // It may no longer be the least: rescan when next asked.
    }
  } else if (now < least.expected || (now == least.expected && rank < least.rank)) {
    least.rank = rank;
    least.expected = now;
  }
}

void HolderGroups::Bind(const std::vector<int32_t>& ranks, const TileGrid& grid,
                        const DomainMap& domains) {
  bool same = domains_ == &domains && ranks_ == ranks &&
              offsets_.size() == static_cast<size_t>(grid.num_replicas());
  for (size_t j = 0; same && j < offsets_.size(); ++j) {
    same = offsets_[j] == grid.replica_offset(static_cast<int64_t>(j));
  }
  if (same) return;
  domains_ = &domains;
  ranks_ = ranks;
  offsets_.resize(static_cast<size_t>(grid.num_replicas()));
  for (size_t j = 0; j < offsets_.size(); ++j) {
    offsets_[j] = grid.replica_offset(static_cast<int64_t>(j));
  }
  entry_of_base_.assign(ranks.size(), UINT32_MAX);
  entries_.clear();
  by_domain_.clear();
  groups_.clear();
}

HolderGroups::View HolderGroups::Of(int64_t base) {
  uint32_t& slot = entry_of_base_[static_cast<size_t>(base)];
  if (slot == UINT32_MAX) {
    slot = static_cast<uint32_t>(entries_.size());
    Entry e;
    e.by_domain = static_cast<uint32_t>(by_domain_.size());
    e.groups = static_cast<uint32_t>(groups_.size());
    for (int64_t offset : offsets_) {
      const int32_t r = ranks_[static_cast<size_t>(base + offset)];
      by_domain_.push_back({domains_->domain_of(r), r});
    }
    const auto first = by_domain_.begin() + e.by_domain;
    // Holders usually come in ascending rank order already (mesh ranks ascending along the
    // replicate axes), hence in domain order.
    if (!std::is_sorted(first, by_domain_.end())) std::sort(first, by_domain_.end());
    const uint32_t n = static_cast<uint32_t>(by_domain_.size()) - e.by_domain;
    uint32_t begin = 0;
    for (uint32_t i = 1; i <= n; ++i) {
      if (i == n || first[i].first != first[begin].first) {
        groups_.push_back({begin, i});
        begin = i;
      }
    }
    e.num_groups = static_cast<uint32_t>(groups_.size()) - e.groups;
    entries_.push_back(e);
  }
  const Entry& e = entries_[slot];
  return View{by_domain_.data() + e.by_domain,
              absl::Span<const std::pair<uint32_t, uint32_t>>(groups_.data() + e.groups,
                                                              e.num_groups)};
}

const RegionShape& DomainScheduler::ShapeCache::Get(const Box& box, const TileAddress& from,
                                                    const TileAddress& to, int elem) {
  bool hit = valid_ && ndim_ == box.ndim && elem_ == elem;
  for (int d = 0; hit && d < box.ndim; ++d) {
    hit = extent_[d] == box.extent(d) && from_strides_[d] == from.strides[d] &&
          to_strides_[d] == to.strides[d];
  }
  if (!hit) {
    valid_ = true;
    ndim_ = box.ndim;
    elem_ = elem;
    for (int d = 0; d < box.ndim; ++d) {
      extent_[d] = box.extent(d);
      from_strides_[d] = from.strides[d];
      to_strides_[d] = to.strides[d];
    }
    shape_ = ShapeOfRegion(box, from, to, elem);
  }
  return shape_;
}

const TileAddress& DomainScheduler::AddressOf(const Endpoint& e, const Box& part, int elem,
                                              const TileAddress& src, const TileAddress& dst,
                                              TileAddress& scratch) const {
  if (e.side == Side::kSrc) return src;
  if (e.side == Side::kDst) return dst;
  scratch.tile = part;
  scratch.offset = e.stage_offset / elem;
  int64_t stride = 1;
  for (int d = part.ndim - 1; d >= 0; --d) {
    scratch.strides[d] = stride;
    stride *= part.extent(d);
  }
  return scratch;
}

void DomainScheduler::SchedulePiece(uint32_t tensor, int elem, const Box& piece,
                                    const TileAddress& src, const TileAddress& dst,
                                    const std::vector<int32_t>& src_holders,
                                    int64_t dst_base, ScheduleSink& sink) {
  const HolderGroups::View holders = dst_groups_.Of(dst_base);
  dst_by_domain_ = holders.by_domain;
  domain_groups_ = holders.groups;
  ++stamp_;
  src_domains_.clear();
  for (int32_t h : src_holders) {
    const int32_t d = domains_.domain_of(h);
    src_domains_.push_back(d);
    domain_stamp_[d] = stamp_;
    rank_stamp_[h] = stamp_;
  }

  // How many parts: as many as receivers can usefully take in the widest network domain.
  const int64_t bytes = piece.NumElements() * elem;
  int64_t parts = 1;
  if (options_.split_min_bytes > 0 && bytes >= options_.split_min_bytes) {
    int64_t widest = 1;
    for (const auto& [begin, end] : domain_groups_) {
      const int32_t d = dst_by_domain_[begin].first;
      if (!HoldsSource(d)) {
        const int64_t candidates = options_.staging ? static_cast<int64_t>(domains_.ranks(d).size())
                                                    : static_cast<int64_t>(end - begin);
        widest = std::max(widest, candidates);
      }
    }
    parts =
        std::min<int64_t>({widest, bytes / std::max<int64_t>(1, options_.split_part_bytes), 64});
  }
  int split_dim = -1;
  if (parts > 1) {
    for (int d = 0; d < piece.ndim; ++d) {
      if (piece.extent(d) > 1) {
        split_dim = d;
        break;
      }
    }
    if (split_dim < 0)
      parts = 1;
    else
      parts = std::min(parts, piece.extent(split_dim));
  }
  if (parts <= 1) {
    SchedulePart(tensor, elem, piece, src, dst, src_holders, sink);
    return;
  }
  for (int64_t p = 0; p < parts; ++p) {
    Box part = piece;
    const Interval iv = ChunkInterval({piece.lo[split_dim], piece.hi[split_dim]}, parts, p);
    if (iv.size() <= 0) continue;
    part.lo[split_dim] = iv.lo;
    part.hi[split_dim] = iv.hi;
    SchedulePart(tensor, elem, part, src, dst, src_holders, sink);
  }
}

void DomainScheduler::SchedulePart(uint32_t tensor, int elem, const Box& part,
                                   const TileAddress& src, const TileAddress& dst,
                                   const std::vector<int32_t>& src_holders, ScheduleSink& sink) {
  const int64_t bytes = part.NumElements() * elem;
  // A region of the part: the plain ones (source -> destination, destination -> destination
  // tile) are shared by every transfer that copies between those tiles; one that reads or
  // writes staging is its own. Counted once, shaped once, built only when a kept transfer uses
  // it.
  struct RegionSlot {
    bool counted = false, shaped = false;
    uint32_t id = UINT32_MAX;
    RegionShape shape;
  };
  RegionSlot plain[2];  // From the source tile, from the destination tile.
  RegionSlot staged;    // The region of a transfer that reads or writes staging.
  // Inlined: called for every transfer of the world (the call itself was a seventh of it).
  auto emit = [&](const Endpoint& from, const Endpoint& to, TransferKind kind,
                  int32_t after) __attribute__((always_inline)) {
    Transfer tr;
    tr.tensor = tensor;
    tr.from_rank = from.rank;
    tr.to_rank = to.rank;
    tr.after = after;
    tr.kind = kind;
    tr.from_side = from.side;
    tr.to_side = to.side;
    const bool plain_region = from.side != Side::kStage && to.side == Side::kDst;
    if (!plain_region) staged = RegionSlot{};
    RegionSlot& slot = plain_region ? plain[from.side == Side::kSrc ? 0 : 1] : staged;
    if (!slot.counted) {
      slot.counted = true;
      sink.CountRegion();
    }
    const bool keep = sink.Keeps(tr);
    if (!slot.shaped || (keep && slot.id == UINT32_MAX)) {
      const TileAddress& a = AddressOf(from, part, elem, src, dst, from_scratch_);
      const TileAddress& b = AddressOf(to, part, elem, src, dst, to_scratch_);
      if (!slot.shaped) {
        slot.shape = shapes_[plain_region ? (from.side == Side::kSrc ? 0 : 1) : 2].Get(part, a, b,
                                                                                      elem);
        slot.shaped = true;
      }
      if (keep && slot.id == UINT32_MAX) slot.id = sink.AddRegion(part, a, b);
    }
    const int32_t id = sink.CountTransfer(tr, slot.shape);
    if (keep) {
      tr.region = slot.id;
      sink.AddTransfer(tr, id);
    }
    return id;
  };

  // Domains that hold a source replica: local copies and copies over their own fabric.
  network_groups_.clear();
  for (const auto& [begin, end] : domain_groups_) {
    const int32_t d = dst_by_domain_[begin].first;
    if (!HoldsSource(d)) {
      network_groups_.push_back({begin, end});
      continue;
    }
    for (size_t k = begin; k < end; ++k) {
      const int32_t to = dst_by_domain_[k].second;
      Endpoint target{to, Side::kDst};
      if (rank_stamp_[to] == stamp_) {
        emit(Endpoint{to, Side::kSrc}, target, TransferKind::kLocal, -1);
        continue;
      }
      int32_t best = -1;
      for (size_t s = 0; s < src_holders.size(); ++s) {
        if (src_domains_[s] != d) continue;
        const int32_t h = src_holders[s];
        if (best < 0 || nvlink_out_[h] < nvlink_out_[best]) best = h;
      }
      nvlink_out_[best] += bytes;
      emit(Endpoint{best, Side::kSrc}, target, TransferKind::kFanout, -1);
    }
  }
  if (network_groups_.empty()) return;
  for (int32_t h : src_holders) {
    owed_[h] = std::max(0.0, owed_[h] - static_cast<double>(bytes) / src_holders.size());
  }

  // Network domains, starting at a position that changes with every part, so no domain is always
  // served first (and relays, chosen among the domains served before, spread over all of them).
  // The start is a hash of the part's number, not the number: a counter aliases with the spec's
  // period. One tensor per expert has as many pieces as the inference TP degree, a multiple of
  // the domains served, so each TP slice was first served to the same replica every time and a
  // few ranks of each domain did most of the relaying (DeepSeek-V3 into tp=32,dp=16: 1.40x the
  // bound with the counter, 1.03x with the hash; docs/simulator.md).
  const size_t n = network_groups_.size();
  size_t next = static_cast<size_t>(Mix64(rotation_++) % n);
  std::vector<Endpoint>& received = received_;  // Receivers that may relay the part.
  received.clear();
  for (size_t step = 0; step < n; ++step) {
    const auto [begin, end] = network_groups_[next];
    if (++next == n) next = 0;
    const int32_t d = dst_by_domain_[begin].first;
    // Receiver: the holder expected to end least loaded, or a rank of the domain expected to
    // end with room to spare, through staging.
    int32_t holder = -1;
    for (size_t k = begin; k < end; ++k) {
      const int32_t r = dst_by_domain_[k].second;
      if (holder < 0 || Expected(r) < Expected(holder)) holder = r;
    }
    Endpoint receiver{holder, Side::kDst};
    if (options_.staging) {
      // The domain's rank expected to end least loaded (lowest rank on ties). A scan: domains
      // are small, and keeping every rank in an ordered set cost a third of planning time.
      const auto [rank, expected] = LeastExpected(d);
      if (expected + bytes <= Expected(holder)) {
        receiver.rank = rank;
        receiver.side = Side::kStage;
        receiver.stage_offset = sink.AllocateStage(rank, bytes);
      }
    }
    // The receiver's load changes twice (what it still needs, then what it received): the
    // least-loaded tracking hears of it once, after both.
    const int64_t receiver_before = Expected(receiver.rank);
    // A domain's holders are mostly one rank: x / 1.0 is x, without the division.
    const double share = end - begin == 1
                             ? static_cast<double>(bytes)
                             : static_cast<double>(bytes) / static_cast<double>(end - begin);
    for (size_t k = begin; k < end; ++k) {
      const int32_t r = dst_by_domain_[k].second;
      const int64_t before = Expected(r);
      pending_[r] = std::max(0.0, pending_[r] - share);
      if (r != receiver.rank) ExpectedChanged(r, d, before);
    }
    // Sender: the least loaded source replica, unless it would pass the target and a domain
    // that already has the part can relay it with less load.
    int32_t source = src_holders[0];
    for (int32_t h : src_holders) {
      if (out_[h] < out_[source]) source = h;
    }
    Endpoint sender{source, Side::kSrc};
    int32_t after = -1;
    // Relays also feed a receiver that must ingest near the bound (kHeavyReceiver), from a
    // domain that ingests well below it (kLightRelay). Such a receiver needs its NIC busy for
    // the whole refit, but a source NIC serves every receiver of the refit at once, so under
    // fair sharing each gets a fraction of it and the heavy one falls behind; a relay's NIC
    // sends nothing else. On GB200 NVL72 the last, partial inference domain is such: DeepSeek-V3
    // into tp=32,dp=16 went from 1.30x to 1.02x the bound (docs/simulator.md).
    const double target = static_cast<double>(target_);
    // A source keeps room for one send of each piece it still owes.
    const bool source_full = static_cast<double>(out_[source] + bytes) + owed_[source] > target;
    const bool heavy = static_cast<double>(Expected(receiver.rank)) >= kHeavyReceiver * target;
    if (options_.relay && !received.empty() && (source_full || heavy)) {
      const Endpoint* best = nullptr;
      for (const Endpoint& e : received) {
        if (e.depth >= kMaxRelayDepth) continue;
        if (!source_full && static_cast<double>(Expected(e.rank)) > kLightRelay * target) continue;
        if (best == nullptr || out_[e.rank] < out_[best->rank] ||
            (out_[e.rank] == out_[best->rank] && e.depth < best->depth)) {
          best = &e;
        }
      }
      // For a heavy receiver only within the target: the source has room.
      if (best != nullptr && (out_[best->rank] + bytes <= target_ ||
                              (source_full && out_[best->rank] < out_[source]))) {
        sender = *best;
        after = best->transfer;
      }
    }
    out_[sender.rank] += bytes;
    in_[receiver.rank] += bytes;
    ExpectedChanged(receiver.rank, d, receiver_before);
    const int depth = after < 0 ? 1 : sender.depth + 1;
    const int32_t transfer = emit(sender, receiver, TransferKind::kNetwork, after);
    if (after >= 0) sink.MarkFeedsRelay(after);
    // Built from values in registers: storing them into `receiver` and copying it read them
    // back as one 8-byte load right after two 4-byte stores, which the CPU cannot forward.
    received.push_back(
        Endpoint{receiver.rank, receiver.side, receiver.stage_offset, transfer, depth});
    // Fan-out to the domain's other holders.
    for (size_t k = begin; k < end; ++k) {
      const int32_t to = dst_by_domain_[k].second;
      if (to == receiver.rank && receiver.side == Side::kDst) continue;
      nvlink_out_[receiver.rank] += bytes;
      emit(receiver, Endpoint{to, Side::kDst}, TransferKind::kFanout, transfer);
    }
  }
}

}  // namespace reshard::plan
