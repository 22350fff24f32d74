// Brute-force per-element oracle over thousands of random specs.
//
// The oracle derives every tile from DTensor semantics directly (per rank and dim, the list of
// global indices it holds, cut left to right by torch.chunk as DTensor's
// _compute_local_shape_and_global_offset does for Shard and _StridedShard, not through TileGrid;
// a shard empty along a dim sits at [n, n) there, as in torch) and addresses every element
// through the view by hand. It
// then replays the plan's transfers run by run, maps every copied element back to (tensor,
// global index) on both ends, and checks:
//   - every destination element of every destination rank is written exactly once;
//   - every read lies inside a tile that the sending rank holds, and reads the same global
//     element that the write lands on (so the chosen source tile holds it);
//   - nothing is written outside the destination views of the transfer's tensor;
//   - relays and fan-outs (reads from a destination or staging buffer) only read data that a
//     transfer on their `after` chain landed there, and staging writes stay inside the rank's
//     staging buffer;
//   - transfer kinds agree with the ranks and domains, per-rank indexes list exactly the right
//     transfers;
//   - executing the plan in process (LocalWorld) verifies.
// Specs get random topologies, and plans random schedule options (domain-aware with and
// without staging, relays and tiny split thresholds; point-to-point with and without spreading).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "src/common/hash.h"
#include "src/plan/executor.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"
#include "tests/plan/rank_plan_check.h"

namespace reshard::plan {
namespace {

constexpr uint64_t kSeed = 0x0facade5eed2026ULL;
constexpr int kCases = 3000;

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return Mix64(state_++); }
  // Uniform in [lo, hi].
  int64_t Uniform(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool Coin(double p) { return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }
  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Uniform(0, i - 1)]);
  }

 private:
  uint64_t state_;
};

// ---------------------------------------------------------------------------------------------
// The oracle's own tiling and addressing (independent of tiling.cc and region.cc).

struct OracleTile {
  int32_t rank;
  std::vector<int64_t> lo, hi;
  // False when the rank's indices along some dim are not one range (a strided shard can do
  // that); lo and hi are then the first and last + 1, and Validate must reject the layout.
  bool contiguous = true;
  bool Empty() const {
    for (size_t d = 0; d < lo.size(); ++d) {
      if (hi[d] <= lo[d]) return true;
    }
    return false;
  }
};

// torch.chunk(list, parts) padded with empty chunks to `parts` (fill_empty_tensor_to_shards):
// chunks of ceil(len / parts), as many as it takes to hold the list.
std::vector<std::vector<int64_t>> TorchChunk(const std::vector<int64_t>& list, int64_t parts) {
  std::vector<std::vector<int64_t>> chunks;
  const int64_t len = static_cast<int64_t>(list.size());
  const int64_t size = (len + parts - 1) / parts;
  for (int64_t start = 0; start < len; start += size) {
    chunks.emplace_back(list.begin() + start, list.begin() + std::min(start + size, len));
  }
  while (static_cast<int64_t>(chunks.size()) < parts) chunks.emplace_back();
  return chunks;
}

std::vector<OracleTile> OracleTiles(const Layout& l, const std::vector<int64_t>& shape) {
  std::vector<OracleTile> tiles;
  const int mesh_ndim = l.mesh.ndim();
  for (int64_t index = 0; index < l.mesh.size(); ++index) {
    std::vector<int64_t> coord(mesh_ndim);
    int64_t rest = index;
    for (int a = mesh_ndim - 1; a >= 0; --a) {
      coord[a] = rest % l.mesh.shape[a];
      rest /= l.mesh.shape[a];
    }
    // Per dim, the global indices this rank holds, in order.
    std::vector<std::vector<int64_t>> held(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      for (int64_t i = 0; i < shape[d]; ++i) held[d].push_back(i);
    }
    for (int a = 0; a < mesh_ndim; ++a) {
      const Placement& p = l.placements[a];
      if (!p.is_shard()) continue;
      std::vector<int64_t>& list = held[p.dim];
      const int64_t k = l.mesh.shape[a];
      // Shard: piece coord of torch.chunk(list, k). _StridedShard(sf): torch.chunk(list, sf),
      // each chunk torch.chunk'ed into k, piece coord of each, concatenated.
      std::vector<int64_t> kept;
      for (const auto& chunk : TorchChunk(list, p.split_factor)) {
        const auto piece = TorchChunk(chunk, k)[coord[a]];
        kept.insert(kept.end(), piece.begin(), piece.end());
      }
      list = std::move(kept);
    }
    OracleTile t{l.mesh.ranks[index], std::vector<int64_t>(shape.size()), shape};
    for (size_t d = 0; d < shape.size(); ++d) {
      const std::vector<int64_t>& list = held[d];
      if (list.empty()) {
        // torch: a zero-sized shard's global offset is the dim's global size.
        t.lo[d] = t.hi[d] = shape[d];
        continue;
      }
      t.lo[d] = list.front();
      t.hi[d] = list.back() + 1;
      for (size_t i = 1; i < list.size(); ++i) t.contiguous = t.contiguous && list[i] == list[i - 1] + 1;
    }
    tiles.push_back(std::move(t));
  }
  return tiles;
}

bool OracleContiguous(const Layout& l, const std::vector<int64_t>& shape) {
  for (const OracleTile& t : OracleTiles(l, shape)) {
    if (!t.contiguous) return false;
  }
  return true;
}

// Element address of local index `local` of `tile` under the layout's view.
int64_t OracleAddress(const Layout& l, const OracleTile& tile, const std::vector<int64_t>& local) {
  int64_t address = l.view.offset;
  if (!l.view.strides.empty()) {
    for (size_t d = 0; d < local.size(); ++d) address += local[d] * l.view.strides[d];
    return address;
  }
  int64_t stride = 1;
  for (int d = static_cast<int>(local.size()) - 1; d >= 0; --d) {
    address += local[d] * stride;
    stride *= tile.hi[d] - tile.lo[d];
  }
  return address;
}

// Calls fn(global_flat_index, address) for every element of a non-empty tile.
template <typename Fn>
void OracleElements(const Layout& l, const std::vector<int64_t>& shape, const OracleTile& tile,
                    Fn&& fn) {
  if (tile.Empty()) return;
  const size_t nd = shape.size();
  std::vector<int64_t> local(nd, 0);
  while (true) {
    int64_t global = 0;
    for (size_t d = 0; d < nd; ++d) global = global * shape[d] + tile.lo[d] + local[d];
    fn(global, OracleAddress(l, tile, local));
    int d = static_cast<int>(nd) - 1;
    while (d >= 0) {
      if (++local[d] < tile.hi[d] - tile.lo[d]) break;
      local[d] = 0;
      --d;
    }
    if (d < 0) return;
  }
}

// Largest tile extent per dim over all tiles of a layout.
std::vector<int64_t> LargestExtents(const Layout& l, const std::vector<int64_t>& shape) {
  std::vector<int64_t> ext(shape.size(), 0);
  for (const OracleTile& t : OracleTiles(l, shape)) {
    for (size_t d = 0; d < shape.size(); ++d) ext[d] = std::max(ext[d], t.hi[d] - t.lo[d]);
  }
  return ext;
}

// ---------------------------------------------------------------------------------------------
// Random specs.

constexpr DType kAllDTypes[] = {DType::kBool, DType::kU8,   DType::kI8,      DType::kI16,
                                DType::kI32,  DType::kI64,  DType::kFp8E4M3, DType::kFp8E5M2,
                                DType::kFp16, DType::kBf16, DType::kFp32,    DType::kFp64};

DType RandomDType(Rng& rng, int size) {
  std::vector<DType> options;
  for (DType t : kAllDTypes) {
    if (size == 0 || DTypeSize(t) == size) options.push_back(t);
  }
  return options[rng.Uniform(0, options.size() - 1)];
}

// `strided` > 0: each shard becomes a strided shard with that probability, its split factor
// mostly FSDP2 + TP's (the product of the later axes sharding the same dim), else 2 to 5.
Layout RandomLayout(Rng& rng, const std::vector<int32_t>& pool, int tensor_ndim,
                    double strided = 0) {
  Layout l;
  const int mesh_ndim = static_cast<int>(rng.Uniform(1, 3));
  int64_t size = 1;
  for (int a = 0; a < mesh_ndim; ++a) {
    int64_t n = rng.Uniform(1, 4);
    while (size * n > static_cast<int64_t>(pool.size())) --n;
    l.mesh.shape.push_back(n);
    size *= n;
  }
  std::vector<int32_t> ranks = pool;
  rng.Shuffle(ranks);  // Permuted rank lists; src and dst draw from one pool (shared ranks).
  l.mesh.ranks.assign(ranks.begin(), ranks.begin() + size);
  for (int a = 0; a < mesh_ndim; ++a) {
    if (tensor_ndim == 0 || rng.Coin(0.3)) {
      l.placements.push_back(Placement::Replicate());
    } else {
      l.placements.push_back(Placement::Shard(static_cast<int>(rng.Uniform(0, tensor_ndim - 1))));
    }
  }
  if (strided > 0) {
    // Axes that shard one dim: where strided shards matter (FSDP2 + TP shard dim 0 twice).
    for (Placement& p : l.placements) {
      if (p.is_shard() && rng.Coin(0.5)) p.dim = 0;
    }
    for (int a = 0; a < mesh_ndim; ++a) {
      Placement& p = l.placements[a];
      if (!p.is_shard() || !rng.Coin(strided)) continue;
      int64_t later = 1;
      for (int b = a + 1; b < mesh_ndim; ++b) {
        if (l.placements[b].is_shard() && l.placements[b].dim == p.dim) later *= l.mesh.shape[b];
      }
      p.split_factor = later > 1 && rng.Coin(0.6) ? later : rng.Uniform(2, 5);
    }
  }
  return l;
}

std::vector<int64_t> RandomShape(Rng& rng, int ndim) {
  std::vector<int64_t> shape;
  int64_t elements = 1;
  for (int d = 0; d < ndim; ++d) {
    int64_t n = rng.Coin(0.04) ? 0 : rng.Uniform(1, ndim <= 2 ? 11 : 6);
    while (n > 1 && elements * n > 700) --n;
    shape.push_back(n);
    elements *= std::max<int64_t>(n, 1);
  }
  return shape;
}

// Strides for a view holding tiles no larger than `ext`: padded, sometimes in a permuted dim
// order (e.g. column-major), sometimes with a gap between innermost elements.
std::vector<int64_t> RandomStrides(Rng& rng, const std::vector<int64_t>& ext) {
  const int nd = static_cast<int>(ext.size());
  std::vector<int> order(nd);  // Innermost first.
  std::iota(order.rbegin(), order.rend(), 0);
  if (rng.Coin(0.3)) rng.Shuffle(order);
  std::vector<int64_t> strides(nd);
  int64_t running = rng.Coin(0.2) ? 2 : 1;
  for (int d : order) {
    strides[d] = running;
    running *= std::max<int64_t>(ext[d], 1) + (rng.Coin(0.4) ? rng.Uniform(1, 2) : 0);
  }
  return strides;
}

// Elements a view of `l` spans for tiles no larger than `ext` (an upper bound).
int64_t ViewSpan(const Layout& l, const std::vector<int64_t>& ext) {
  if (l.view.strides.empty()) {
    int64_t n = 1;
    for (int64_t e : ext) n *= e;
    return n;
  }
  int64_t last = 0;
  for (size_t d = 0; d < ext.size(); ++d) {
    if (ext[d] == 0) return 0;
    last += (ext[d] - 1) * l.view.strides[d];
  }
  return last + 1;
}

enum class ViewMode { kNone, kPadded, kFused, kInterleaved };

void ApplyViews(Rng& rng, RefitSpec& spec, Side side, ViewMode mode) {
  const size_t n = spec.tensors.size();
  auto layout = [&](size_t t) -> Layout& {
    return side == Side::kSrc ? spec.tensors[t].src : spec.tensors[t].dst;
  };
  switch (mode) {
    case ViewMode::kNone:
      return;
    case ViewMode::kPadded:
      for (size_t t = 0; t < n; ++t) {
        if (rng.Coin(0.5)) continue;
        Layout& l = layout(t);
        l.has_view = true;
        l.view.offset = rng.Uniform(0, 5);
        l.view.strides = RandomStrides(rng, LargestExtents(l, spec.tensors[t].shape));
      }
      return;
    case ViewMode::kFused: {
      // Consecutive slices of one buffer: [t0 | gap | t1 | gap | t2].
      int64_t base = rng.Uniform(0, 3);
      for (size_t t = 0; t < n; ++t) {
        Layout& l = layout(t);
        l.buffer = "fused";
        l.has_view = true;
        l.view.offset = base;
        const auto ext = LargestExtents(l, spec.tensors[t].shape);
        if (rng.Coin(0.5)) l.view.strides = RandomStrides(rng, ext);
        base += ViewSpan(l, ext) + rng.Uniform(0, 2);
      }
      return;
    }
    case ViewMode::kInterleaved: {
      // Element i of tensor k at base + k + n * i: views that interleave without overlapping.
      const size_t nd = spec.tensors[0].shape.size();
      std::vector<int64_t> bound(nd, 1);
      for (size_t t = 0; t < n; ++t) {
        const auto ext = LargestExtents(layout(t), spec.tensors[t].shape);
        for (size_t d = 0; d < nd; ++d) bound[d] = std::max(bound[d], ext[d]);
      }
      std::vector<int64_t> strides(nd);
      int64_t running = static_cast<int64_t>(n);
      for (int d = static_cast<int>(nd) - 1; d >= 0; --d) {
        strides[d] = running;
        running *= bound[d];
      }
      const int64_t base = rng.Uniform(0, 3);
      for (size_t t = 0; t < n; ++t) {
        Layout& l = layout(t);
        l.buffer = "fused";
        l.has_view = true;
        l.view.offset = base + static_cast<int64_t>(t);
        l.view.strides = strides;
      }
      return;
    }
  }
}

RefitSpec RandomSpec(Rng& rng, double strided = 0) {
  RefitSpec spec;
  const int world = static_cast<int>(rng.Uniform(2, 12));
  std::vector<int32_t> pool(world);
  std::iota(pool.begin(), pool.end(), 0);
  const size_t num_tensors = static_cast<size_t>(rng.Uniform(1, 3));
  // Fused buffers need one element size; interleaving also needs one tensor rank.
  const bool one_ndim = num_tensors > 1 && rng.Coin(0.35);
  const int elem_size = num_tensors > 1 && rng.Coin(0.6) ? DTypeSize(RandomDType(rng, 0)) : 0;
  const int common_ndim = static_cast<int>(rng.Uniform(0, 4));
  for (size_t i = 0; i < num_tensors; ++i) {
    TensorSpec t;
    t.name = absl::StrCat("t", i);
    t.dtype = RandomDType(rng, elem_size);
    int ndim = one_ndim ? common_ndim : static_cast<int>(rng.Uniform(0, 4));
    if (!one_ndim && ndim == 0 && rng.Coin(0.5)) ndim = 2;  // 0-D tensors: rarer.
    t.shape = RandomShape(rng, ndim);
    t.src = RandomLayout(rng, pool, ndim, strided);
    t.dst = RandomLayout(rng, pool, ndim, strided);
    spec.tensors.push_back(std::move(t));
  }
  // Topology: none (every rank its own domain), consecutive groups, or a random partition.
  const int topo = static_cast<int>(rng.Uniform(0, 2));
  if (topo == 1) {
    spec.topology.ranks_per_domain = rng.Uniform(2, 4);
  } else if (topo == 2) {
    std::vector<int32_t> ranks = pool;
    rng.Shuffle(ranks);
    size_t i = 0;
    while (i < ranks.size()) {
      const size_t n = std::min<size_t>(rng.Uniform(1, 4), ranks.size() - i);
      if (rng.Coin(0.85)) spec.topology.domains.emplace_back(ranks.begin() + i, ranks.begin() + i + n);
      i += n;
    }
  }
  for (Side side : {Side::kSrc, Side::kDst}) {
    std::vector<ViewMode> modes = {ViewMode::kNone, ViewMode::kNone, ViewMode::kPadded};
    if (elem_size != 0) {
      modes.push_back(ViewMode::kFused);
      modes.push_back(ViewMode::kFused);
      if (one_ndim) modes.push_back(ViewMode::kInterleaved), modes.push_back(ViewMode::kInterleaved);
    }
    ApplyViews(rng, spec, side, modes[rng.Uniform(0, modes.size() - 1)]);
  }
  return spec;
}

// ---------------------------------------------------------------------------------------------
// The check.

struct Owner {
  int32_t tensor = -1;
  int64_t global = -1;
};
// (side, rank, buffer name) -> owner of every element address.
using AddressMap = std::map<std::tuple<int, int32_t, std::string>, std::vector<Owner>>;

std::string Describe(const RefitSpec& spec) { return SpecToJson(spec); }

// Returns an empty string when the plan passes, else the first violation.
std::string CheckPlan(const Plan& plan, int64_t& elements_checked) {
  const RefitSpec& spec = plan.spec();
  AddressMap maps;
  int64_t expected_dst_bytes = 0;
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const TensorSpec& ts = spec.tensors[t];
    for (Side side : {Side::kSrc, Side::kDst}) {
      const Layout& l = spec.layout(t, side);
      const std::string& buffer = side == Side::kSrc ? ts.src_buffer() : ts.dst_buffer();
      const auto tiles = OracleTiles(l, ts.shape);
      // The planner's tiles must be the oracle's tiles, empty ones included.
      std::map<int32_t, Box> planner_tiles;
      ForEachTile(spec, t, side, [&](int32_t rank, const Box& box) { planner_tiles[rank] = box; });
      if (planner_tiles.size() != tiles.size()) return "ForEachTile visits the wrong ranks";
      for (const OracleTile& tile : tiles) {
        const Box& box = planner_tiles[tile.rank];
        for (size_t d = 0; d < ts.shape.size(); ++d) {
          if (box.lo[d] != tile.lo[d] || box.hi[d] != tile.hi[d]) {
            return absl::StrCat("tensor ", ts.name, " ", SideName(side), " rank ", tile.rank,
                                ": tile dim ", d, " is [", box.lo[d], ",", box.hi[d],
                                ") but DTensor says [", tile.lo[d], ",", tile.hi[d], ")");
          }
        }
        auto& map = maps[{static_cast<int>(side), tile.rank, buffer}];
        std::string error;
        OracleElements(l, ts.shape, tile, [&](int64_t global, int64_t address) {
          if (static_cast<int64_t>(map.size()) <= address) map.resize(address + 1);
          if (map[address].tensor >= 0 && error.empty()) {
            error = absl::StrCat("generator bug: two elements at address ", address);
          }
          map[address] = {static_cast<int32_t>(t), global};
          if (side == Side::kDst) expected_dst_bytes += DTypeSize(ts.dtype);
        });
        if (!error.empty()) return error;
      }
    }
  }

  // Replay the transfers in plan order. Destination and staging elements remember the transfer
  // that wrote them; staging bytes also remember what they hold.
  struct Written {
    int32_t count = 0;
    int32_t writer = -1;
  };
  struct StageByte {
    int32_t tensor = -1;
    int64_t global = -1;
    int32_t byte = 0;
    int32_t writer = -1;
  };
  std::map<std::tuple<int, int32_t, std::string>, std::vector<Written>> writes;
  std::map<int32_t, std::vector<StageByte>> stage;
  const auto& transfers = plan.transfers();
  const Topology& topo = spec.topology;
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& tr = transfers[i];
    const TensorSpec& ts = spec.tensors[tr.tensor];
    const int elem = DTypeSize(ts.dtype);
    const std::string where =
        absl::StrCat("transfer ", i, " (tensor ", ts.name, ", ", TransferKindName(tr.kind),
                     ", rank ", tr.from_rank, " ", SideName(tr.from_side), " -> ", tr.to_rank,
                     " ", SideName(tr.to_side), ")");
    if ((tr.kind == TransferKind::kLocal) != (tr.from_rank == tr.to_rank)) {
      return where + ": kind disagrees with the ranks";
    }
    if (tr.kind == TransferKind::kFanout && topo.DomainOf(tr.from_rank) != topo.DomainOf(tr.to_rank)) {
      return where + ": fan-out leaves its domain";
    }
    if (tr.after >= static_cast<int64_t>(i) || tr.after < -1) {
      return where + ": waits for a later transfer";
    }
    if (tr.from_side != Side::kSrc && tr.after < 0) {
      return where + ": forwards received data without waiting for its arrival";
    }
    if (tr.to_side == Side::kSrc) return where + ": writes a source buffer";
    // The transfers this one waits for, directly or through their own waits.
    std::vector<int32_t> chain;
    for (int32_t a = tr.after; a >= 0; a = transfers[a].after) chain.push_back(a);
    auto on_chain = [&](int32_t writer) {
      return std::find(chain.begin(), chain.end(), writer) != chain.end();
    };

    const std::vector<Owner>* from_map = nullptr;
    const std::vector<Written>* from_written = nullptr;
    std::vector<StageByte>* from_stage = nullptr;
    if (tr.from_side == Side::kStage) {
      from_stage = &stage[tr.from_rank];
    } else {
      const std::string& buffer = tr.from_side == Side::kSrc ? ts.src_buffer() : ts.dst_buffer();
      auto it = maps.find({static_cast<int>(tr.from_side), tr.from_rank, buffer});
      if (it == maps.end()) return where + ": the sender holds no tile of this tensor";
      from_map = &it->second;
      if (tr.from_side == Side::kDst) from_written = &writes[it->first];
    }
    const std::vector<Owner>* to_map = nullptr;
    std::vector<Written>* to_written = nullptr;
    std::vector<StageByte>* to_stage = nullptr;
    if (tr.to_side == Side::kStage) {
      to_stage = &stage[tr.to_rank];
      to_stage->resize(plan.stage_bytes(tr.to_rank));
    } else {
      auto it = maps.find({static_cast<int>(Side::kDst), tr.to_rank, ts.dst_buffer()});
      if (it == maps.end()) return where + ": the receiver holds no tile of this tensor";
      to_map = &it->second;
      to_written = &writes[it->first];
      to_written->resize(to_map->size());
    }

    const Region& r = plan.region(tr.region);
    std::string error;
    // What the read at byte `f` holds: (global element, byte within it), or an error.
    auto read = [&](int64_t f, int64_t& global, int32_t& byte) -> bool {
      if (from_stage != nullptr) {
        if (f < 0 || f >= static_cast<int64_t>(from_stage->size()) ||
            (*from_stage)[f].tensor != static_cast<int32_t>(tr.tensor)) {
          error = absl::StrCat(where, ": reads staging byte ", f, " that holds nothing of it");
          return false;
        }
        if (!on_chain((*from_stage)[f].writer)) {
          error = absl::StrCat(where, ": reads staging byte ", f, " without waiting for transfer ",
                               (*from_stage)[f].writer, " that wrote it");
          return false;
        }
        global = (*from_stage)[f].global;
        byte = (*from_stage)[f].byte;
        return true;
      }
      const int64_t fa = f / elem;
      if (fa < 0 || fa >= static_cast<int64_t>(from_map->size()) ||
          (*from_map)[fa].tensor != static_cast<int32_t>(tr.tensor)) {
        error = absl::StrCat(where, ": reads element address ", fa,
                             " outside every tile the sender holds");
        return false;
      }
      if (from_written != nullptr) {
        if (fa >= static_cast<int64_t>(from_written->size()) || (*from_written)[fa].count == 0) {
          error = where + ": forwards data that has not landed";
          return false;
        }
        if (!on_chain((*from_written)[fa].writer)) {
          error = absl::StrCat(where, ": forwards element address ", fa,
                               " without waiting for transfer ", (*from_written)[fa].writer);
          return false;
        }
      }
      global = (*from_map)[fa].global;
      byte = static_cast<int32_t>(f % elem);
      return true;
    };
    ForEachRun(r, plan.region_dims(r), [&](int64_t f, int64_t to, int64_t n) {
      if (!error.empty()) return;
      if (n <= 0) {
        error = where + ": an empty run";
        return;
      }
      if (to_stage != nullptr) {
        // Byte by byte: staging offsets need not be element-aligned.
        if (to < 0 || to + n > static_cast<int64_t>(to_stage->size())) {
          error = absl::StrCat(where, ": writes staging bytes [", to, ", ", to + n,
                               ") outside the rank's staging buffer of ", to_stage->size());
          return;
        }
        for (int64_t k = 0; k < n; ++k) {
          int64_t global = -1;
          int32_t byte = 0;
          if (!read(f + k, global, byte)) return;
          (*to_stage)[to + k] = {static_cast<int32_t>(tr.tensor), global, byte,
                                 static_cast<int32_t>(i)};
        }
        return;
      }
      if (to % elem || n % elem) {
        error = where + ": a destination run is not made of whole elements";
        return;
      }
      for (int64_t k = 0; k < n / elem; ++k) {
        const int64_t ta = to / elem + k;
        if (ta < 0 || ta >= static_cast<int64_t>(to_map->size()) ||
            (*to_map)[ta].tensor != static_cast<int32_t>(tr.tensor)) {
          error = absl::StrCat(where, ": writes element address ", ta,
                               " outside the destination view");
          return;
        }
        for (int b = 0; b < elem; ++b) {
          int64_t global = -1;
          int32_t byte = 0;
          if (!read(f + k * elem + b, global, byte)) return;
          if (global != (*to_map)[ta].global || byte != b) {
            error = absl::StrCat(where, ": copies byte ", byte, " of global element ", global,
                                 " onto byte ", b, " of global element ", (*to_map)[ta].global);
            return;
          }
        }
        Written& w = (*to_written)[ta];
        if (w.count == 0) w.writer = static_cast<int32_t>(i);
        ++w.count;
      }
    });
    if (!error.empty()) return error;
  }
  int64_t dst_bytes = 0;
  for (const auto& [key, map] : maps) {
    if (std::get<0>(key) != static_cast<int>(Side::kDst)) continue;
    auto it = writes.find(key);
    for (size_t a = 0; a < map.size(); ++a) {
      if (map[a].tensor < 0) continue;
      const int count = it == writes.end() || a >= it->second.size() ? 0 : it->second[a].count;
      if (count != 1) {
        return absl::StrCat("tensor ", spec.tensors[map[a].tensor].name, ": rank ",
                            std::get<1>(key), " global element ", map[a].global, " written ",
                            count, " times");
      }
      ++elements_checked;
      dst_bytes += DTypeSize(spec.tensors[map[a].tensor].dtype);
    }
  }
  if (dst_bytes != expected_dst_bytes || plan.stats().bytes_dst_total != expected_dst_bytes) {
    return absl::StrCat("stats.bytes_dst_total ", plan.stats().bytes_dst_total, " but ",
                        expected_dst_bytes, " destination bytes exist");
  }

  // Per-rank indexes: exactly the transfers of each rank, in plan order.
  size_t sent = 0, received = 0;
  for (int32_t rank = 0; rank < plan.world_size(); ++rank) {
    auto [sb, se] = plan.sends(rank);
    for (const uint32_t* p = sb; p != se; ++p) {
      if (transfers[*p].from_rank != rank || (p != sb && p[-1] >= *p)) {
        return absl::StrCat("sends(", rank, ") is wrong");
      }
    }
    auto [rb, re] = plan.receives(rank);
    for (const uint32_t* p = rb; p != re; ++p) {
      if (transfers[*p].to_rank != rank || (p != rb && p[-1] >= *p)) {
        return absl::StrCat("receives(", rank, ") is wrong");
      }
    }
    sent += se - sb;
    received += re - rb;
  }
  if (sent != transfers.size() || received != transfers.size()) {
    return "per-rank indexes do not cover every transfer";
  }
  absl::Status verified = VerifyPlanInProcess(plan, int64_t{1} << 26);
  if (!verified.ok()) return absl::StrCat("LocalWorld: ", std::string(verified.message()));
  return "";
}

TEST(OracleTest, RandomSpecsPlanExactly) {
  const auto start = std::chrono::steady_clock::now();
  Rng rng(kSeed);
  int64_t elements = 0, transfers = 0, kinds[3] = {0, 0, 0}, staged = 0, relays = 0;
  int64_t rank_plans = 0;
  int fused = 0, strided = 0, shared_ranks = 0, nested = 0, replicated_both = 0, empty_shards = 0;
  for (int c = 0; c < kCases; ++c) {
    RefitSpec spec = RandomSpec(rng);
    // Coverage counters: the generator must actually produce the interesting layouts.
    for (const TensorSpec& t : spec.tensors) {
      fused += t.dst.buffer == "fused" || t.src.buffer == "fused";
      strided += !t.src.view.strides.empty() || !t.dst.view.strides.empty();
      bool shares = false;
      for (int32_t r : t.src.mesh.ranks) shares = shares || t.dst.mesh.IndexOf(r) >= 0;
      shared_ranks += shares;
      for (const Layout* l : {&t.src, &t.dst}) {
        std::vector<int> per_dim(t.shape.size(), 0);
        for (const Placement& p : l->placements) {
          if (p.is_shard()) ++per_dim[p.dim];
        }
        nested += std::any_of(per_dim.begin(), per_dim.end(), [](int k) { return k > 1; });
        for (const OracleTile& tile : OracleTiles(*l, t.shape)) {
          if (tile.Empty()) {
            ++empty_shards;
            break;
          }
        }
      }
      auto has_r = [](const Layout& l) {
        return std::any_of(l.placements.begin(), l.placements.end(),
                           [](const Placement& p) { return !p.is_shard(); });
      };
      replicated_both += has_r(t.src) && has_r(t.dst);
    }
    absl::Status valid = Validate(spec);
    ASSERT_TRUE(valid.ok()) << "case " << c << ": " << valid << "\n" << Describe(spec);
    PlanOptions options;
    switch (c % 8) {
      case 0: case 1: case 2:
        break;  // Defaults: domain-aware.
      case 3:
        options.split_min_bytes = 8;  // Split nearly every piece across the domain.
        options.split_part_bytes = 2;
        break;
      case 4:
        options.staging = false;
        options.relay = c % 16 == 4;
        options.split_min_bytes = 16;
        options.split_part_bytes = 4;
        break;
      case 5:
        options.relay = false;
        break;
      case 6:
        options.schedule = PlanOptions::Schedule::kPointToPoint;
        break;
      case 7:
        options.schedule = PlanOptions::Schedule::kPointToPoint;
        options.spread_replicas = false;
        break;
    }
    auto shared = std::make_shared<const RefitSpec>(spec);
    auto plan = BuildPlan(shared, options);
    ASSERT_TRUE(plan.ok()) << "case " << c << ": " << plan.status();
    const std::string error = CheckPlan(*plan, elements);
    ASSERT_EQ(error, "") << "case " << c << "\n" << Describe(spec);
    // A few ranks' shares equal the world plan restricted to them (ranks chosen from the case
    // number, so the random stream of specs stays the same).
    const int32_t world = plan->world_size();
    for (int32_t rank : {static_cast<int32_t>(c % world), static_cast<int32_t>((7 * c + 3) % world),
                         world - 1}) {
      auto share = BuildRankPlan(shared, rank, options);
      ASSERT_TRUE(share.ok()) << "case " << c << ": " << share.status();
      ASSERT_EQ(CompareRankPlan(*plan, *share, rank), "") << "case " << c << "\n" << Describe(spec);
      ++rank_plans;
    }
    transfers += static_cast<int64_t>(plan->transfers().size());
    for (const Transfer& tr : plan->transfers()) {
      ++kinds[static_cast<int>(tr.kind)];
      staged += tr.to_side == Side::kStage;
      relays += tr.kind == TransferKind::kNetwork && tr.from_side != Side::kSrc;
    }
    if (c % 8 == 0) {
      // JSON round trip plans to the same fingerprint.
      auto reparsed = ParseSpecJson(SpecToJson(spec));
      ASSERT_TRUE(reparsed.ok()) << "case " << c << ": " << reparsed.status();
      auto replanned = BuildPlan(std::make_shared<const RefitSpec>(*std::move(reparsed)), options);
      ASSERT_TRUE(replanned.ok());
      EXPECT_EQ(replanned->fingerprint(), plan->fingerprint()) << "case " << c;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("oracle: %d cases, %lld transfers, %lld destination elements checked in %.2f s\n",
              kCases, static_cast<long long>(transfers), static_cast<long long>(elements), seconds);
  std::printf("rank plans: %lld equal to the world plan restricted to their rank\n",
              static_cast<long long>(rank_plans));
  std::printf("coverage (tensors): fused %d, strided views %d, shared ranks %d, nested %d, "
              "replicated both sides %d, layouts with empty shards %d\n",
              fused, strided, shared_ranks, nested, replicated_both, empty_shards);
  std::printf("transfers: %lld local, %lld network (%lld relays), %lld fan-out, %lld into "
              "staging\n", static_cast<long long>(kinds[0]), static_cast<long long>(kinds[1]),
              static_cast<long long>(relays), static_cast<long long>(kinds[2]),
              static_cast<long long>(staged));
  EXPECT_GT(kinds[0], 1000);
  EXPECT_GT(kinds[1], 1000);
  EXPECT_GT(kinds[2], 1000);
  EXPECT_GT(staged, 100);
  EXPECT_GT(fused, 200);
  EXPECT_GT(strided, 300);
  EXPECT_GT(shared_ranks, 1000);
  EXPECT_GT(nested, 300);
  EXPECT_GT(replicated_both, 300);
  EXPECT_GT(empty_shards, 300);
}

// Strided shards (torch's _StridedShard, "_S(d, k)") mixed with R and S(d) on random layouts,
// even and uneven, empty shards included: Validate accepts a spec exactly when the oracle's
// index lists give every rank one range per dim, with the documented sentence otherwise, and
// every accepted spec plans exactly (tiles equal to the oracle's, every element once, rank
// shares equal to the world plan, JSON round trip to the same fingerprint).
TEST(OracleTest, StridedShardsPlanExactlyOrAreRejected) {
  Rng rng(kSeed ^ 0x57d1dedULL);
  int accepted = 0, rejected = 0, strided = 0, fsdp_tp = 0, uneven = 0, empty = 0;
  int64_t elements = 0;
  for (int c = 0; c < 3000; ++c) {
    RefitSpec spec = RandomSpec(rng, 0.5);
    bool contiguous = true;
    for (const TensorSpec& t : spec.tensors) {
      contiguous = contiguous && OracleContiguous(t.src, t.shape) && OracleContiguous(t.dst, t.shape);
    }
    const absl::Status valid = Validate(spec);
    ASSERT_EQ(valid.ok(), contiguous) << "case " << c << ": " << valid << "\n" << Describe(spec);
    if (!valid.ok()) {
      ++rejected;
      const std::string message(valid.message());
      EXPECT_NE(message.find("not one contiguous range; reshard holds one box per rank"),
                std::string::npos) << message;
      EXPECT_EQ(ValidateForRank(spec, 0), valid);
      continue;
    }
    ++accepted;
    for (const TensorSpec& t : spec.tensors) {
      for (const Layout* l : {&t.src, &t.dst}) {
        bool has_strided = false, fsdp = false;
        for (size_t a = 0; a < l->placements.size(); ++a) {
          const Placement& p = l->placements[a];
          if (!p.is_strided()) continue;
          has_strided = true;
          int64_t later = 1;
          for (size_t b = a + 1; b < l->placements.size(); ++b) {
            if (l->placements[b].is_shard() && l->placements[b].dim == p.dim) later *= l->mesh.shape[b];
          }
          fsdp = fsdp || (later > 1 && later == p.split_factor);
        }
        if (!has_strided) continue;
        ++strided;
        fsdp_tp += fsdp;
        const auto tiles = OracleTiles(*l, t.shape);
        bool any_empty = false, unequal = false;
        for (const OracleTile& tile : tiles) {
          any_empty = any_empty || tile.Empty();
          for (size_t d = 0; d < t.shape.size(); ++d) {
            unequal = unequal || tile.hi[d] - tile.lo[d] != tiles[0].hi[d] - tiles[0].lo[d];
          }
        }
        empty += any_empty;
        uneven += unequal;
      }
    }
    PlanOptions options;
    if (c % 4 == 1) options.schedule = PlanOptions::Schedule::kPointToPoint;
    if (c % 4 == 2) options.split_min_bytes = 8, options.split_part_bytes = 2;
    auto shared = std::make_shared<const RefitSpec>(spec);
    auto plan = BuildPlan(shared, options);
    ASSERT_TRUE(plan.ok()) << "case " << c << ": " << plan.status();
    ASSERT_EQ(CheckPlan(*plan, elements), "") << "case " << c << "\n" << Describe(spec);
    const int32_t world = plan->world_size();
    for (int32_t rank : {static_cast<int32_t>(c % world), world - 1}) {
      auto share = BuildRankPlan(shared, rank, options);
      ASSERT_TRUE(share.ok()) << "case " << c << ": " << share.status();
      ASSERT_EQ(CompareRankPlan(*plan, *share, rank), "") << "case " << c << "\n" << Describe(spec);
    }
    if (c % 4 == 0) {
      auto reparsed = ParseSpecJson(SpecToJson(spec));
      ASSERT_TRUE(reparsed.ok()) << "case " << c << ": " << reparsed.status();
      auto replanned = BuildPlan(std::make_shared<const RefitSpec>(*std::move(reparsed)), options);
      ASSERT_TRUE(replanned.ok());
      EXPECT_EQ(replanned->fingerprint(), plan->fingerprint()) << "case " << c;
    }
  }
  std::printf("strided shards: %d specs accepted and planned exactly (%lld destination elements), "
              "%d rejected as non-contiguous; accepted layouts with _S: %d (FSDP2+TP split "
              "factor %d, uneven %d, with empty shards %d)\n",
              accepted, static_cast<long long>(elements), rejected, strided, fsdp_tp, uneven, empty);
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(rejected, 500);
  EXPECT_GT(strided, 1000);
  EXPECT_GT(fsdp_tp, 150);
  EXPECT_GT(uneven, 300);
  EXPECT_GT(empty, 300);
}

// Validate's view checks against brute force: random offsets and strides (some aliasing, some
// interleaving) in buffers shared by all tensors of a side. A spec must be rejected exactly when
// two elements share an address: within the layout's largest tile (the documented, conservative
// rule: it holds every tile's local box) or across the tiles of one rank's buffer. Accepted
// specs must then plan exactly.
bool SelfAliases(const Layout& l, const std::vector<int64_t>& shape) {
  if (l.view.strides.empty()) return false;
  const std::vector<int64_t> ext = LargestExtents(l, shape);
  OracleTile largest{0, std::vector<int64_t>(shape.size(), 0), ext};
  std::vector<int64_t> addresses;
  OracleElements(l, ext, largest, [&](int64_t, int64_t a) { addresses.push_back(a); });
  std::sort(addresses.begin(), addresses.end());
  return std::adjacent_find(addresses.begin(), addresses.end()) != addresses.end();
}

// `only_rank` >= 0: tiles of that rank only.
bool BuffersAlias(const RefitSpec& spec, Side side, int32_t only_rank = -1) {
  std::map<std::pair<int32_t, std::string>, std::vector<std::pair<int64_t, size_t>>> by_buffer;
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const TensorSpec& ts = spec.tensors[t];
    const Layout& l = spec.layout(t, side);
    const std::string& buffer = side == Side::kSrc ? ts.src_buffer() : ts.dst_buffer();
    for (const OracleTile& tile : OracleTiles(l, ts.shape)) {
      if (only_rank >= 0 && tile.rank != only_rank) continue;
      auto& v = by_buffer[{tile.rank, buffer}];
      OracleElements(l, ts.shape, tile, [&](int64_t, int64_t a) { v.push_back({a, t}); });
    }
  }
  for (auto& [key, v] : by_buffer) {
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i) {
      if (v[i].first == v[i - 1].first && v[i].second != v[i - 1].second) return true;
    }
  }
  return false;
}

TEST(OracleTest, ValidateRejectsExactlyTheViewsThatAlias) {
  Rng rng(kSeed ^ 0x5eedULL);
  int accepted = 0, rejected = 0;
  int64_t elements = 0;
  for (int c = 0; c < 2000; ++c) {
    RefitSpec spec = RandomSpec(rng);
    spec.topology = Topology{};
    const DType dtype = spec.tensors[0].dtype;
    for (Side side : {Side::kSrc, Side::kDst}) {
      if (side == Side::kSrc && rng.Coin(0.6)) continue;
      const bool shared = rng.Coin(0.7);
      for (size_t t = 0; t < spec.tensors.size(); ++t) {
        TensorSpec& ts = spec.tensors[t];
        if (shared) ts.dtype = dtype;
        Layout& l = side == Side::kSrc ? ts.src : ts.dst;
        l.buffer = shared ? "b" : "";
        l.has_view = true;
        l.view.offset = rng.Uniform(0, 8);
        if (rng.Coin(0.5)) {
          l.view.strides = RandomStrides(rng, LargestExtents(l, ts.shape));
        } else {
          l.view.strides.clear();
          for (size_t d = 0; d < ts.shape.size(); ++d) l.view.strides.push_back(rng.Uniform(0, 4));
        }
      }
    }
    bool aliases = BuffersAlias(spec, Side::kSrc) || BuffersAlias(spec, Side::kDst);
    for (const TensorSpec& ts : spec.tensors) {
      aliases = aliases || SelfAliases(ts.src, ts.shape) || SelfAliases(ts.dst, ts.shape);
    }
    const absl::Status valid = Validate(spec);
    ASSERT_EQ(valid.ok(), !aliases) << "case " << c << ": " << valid << "\n" << Describe(spec);
    // A rank's share validates the buffers of that rank only (BuildRankPlan): it fails exactly
    // where the rank's own tiles alias, or any tile aliases itself (checked on every rank).
    bool self_aliases = false;
    for (const TensorSpec& ts : spec.tensors) {
      self_aliases = self_aliases || SelfAliases(ts.src, ts.shape) || SelfAliases(ts.dst, ts.shape);
    }
    for (int32_t r = 0; r < spec.WorldSize(); ++r) {
      const bool rank_aliases =
          self_aliases || BuffersAlias(spec, Side::kSrc, r) || BuffersAlias(spec, Side::kDst, r);
      const absl::Status rank_valid = ValidateForRank(spec, r);
      ASSERT_EQ(rank_valid.ok(), !rank_aliases)
          << "case " << c << " rank " << r << ": " << rank_valid << "\n" << Describe(spec);
      if (!rank_valid.ok() && !self_aliases) {
        EXPECT_NE(std::string(rank_valid.message()).find(absl::StrCat("on rank ", r, " ")),
                  std::string::npos)
            << rank_valid;
      }
    }
    if (!valid.ok()) {
      ++rejected;
      const std::string message(valid.message());
      EXPECT_TRUE(message.find("overlaps tensor") != std::string::npos ||
                  message.find("the same address") != std::string::npos)
          << message;
      continue;
    }
    ++accepted;
    auto plan = BuildPlan(std::make_shared<const RefitSpec>(spec));
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(CheckPlan(*plan, elements), "") << "case " << c << "\n" << Describe(spec);
  }
  std::printf("views: %d specs accepted and planned exactly, %d rejected for aliasing\n",
              accepted, rejected);
  EXPECT_GT(accepted, 300);
  EXPECT_GT(rejected, 300);
}

// The oracle itself must catch a broken plan; otherwise passing means nothing.
TEST(OracleTest, OracleRejectsCorruptedPlans) {
  RefitSpec spec;
  TensorSpec t;
  t.name = "w";
  t.dtype = DType::kFp32;
  t.shape = {8, 8};
  t.src.mesh = {{2}, {0, 1}};
  t.src.placements = {Placement::Shard(0)};
  t.dst.mesh = {{4}, {2, 3, 4, 5}};
  t.dst.placements = {Placement::Shard(1)};
  spec.tensors.push_back(t);
  auto plan = BuildPlan(std::make_shared<const RefitSpec>(spec));
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t elements = 0;
  ASSERT_EQ(CheckPlan(*plan, elements), "");
  EXPECT_EQ(elements, 64);
  EXPECT_EQ(plan->stats().pieces, 8);  // Every inference rank: a 4x2 block from each trainer.

  // Same spec with a corrupted transfer: dropping a destination rank's piece must be caught.
  Plan broken = *std::move(plan);
  auto& transfers = const_cast<std::vector<Transfer>&>(broken.transfers());
  std::swap(transfers[0].to_rank, transfers[2].to_rank);
  EXPECT_NE(CheckPlan(broken, elements), "");
  std::swap(transfers[0].to_rank, transfers[2].to_rank);
  std::swap(transfers[0].from_rank, transfers[1].from_rank);
  EXPECT_NE(CheckPlan(broken, elements), "");
}

}  // namespace
}  // namespace reshard::plan
