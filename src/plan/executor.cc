#include "src/plan/executor.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_format.h"
#include "src/common/checked.h"
#include "src/common/json.h"
#include "src/common/status.h"
#include "src/plan/fill.h"
#include "src/plan/quant_spec.h"
#include "src/plan/tiling.h"

namespace reshard::plan {
namespace {
constexpr uint8_t kPoison = 0xA5;
}

absl::StatusOr<LocalWorld> LocalWorld::Create(const Plan& plan, int64_t max_bytes) {
  if (plan.rank() >= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "verifying in process needs the whole plan, not rank %d's share", plan.rank()));
  }
  LocalWorld world(plan);
  const int32_t n = plan.world_size();
  std::vector<std::vector<int64_t>> sizes(n);
  for (int32_t r = 0; r < n; ++r) {
    sizes[r] = plan.BufferBytes(r);
    // Saturating: a sum past int64 is simply more than any limit.
    for (int64_t b : sizes[r]) world.total_bytes_ = SaturatingAdd(world.total_bytes_, b);
  }
  if (world.total_bytes_ > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("verifying in process needs %d bytes of buffers, more than the limit of %d",
                        world.total_bytes_, max_bytes));
  }
  try {
    world.buffers_.resize(n);
    for (int32_t r = 0; r < n; ++r) {
      world.buffers_[r].resize(sizes[r].size());
      for (size_t b = 0; b < sizes[r].size(); ++b) world.buffers_[r][b].assign(sizes[r][b], 0);
    }
  } catch (const std::bad_alloc&) {
    // Nothing throws across our APIs: a limit above what the host can give is still an error.
    return absl::ResourceExhaustedError(absl::StrFormat(
        "verifying in process needs %d bytes of buffers, more than this host can allocate",
        world.total_bytes_));
  }
  return world;
}

void LocalWorld::Prepare(uint64_t epoch) {
  const RefitSpec& spec = plan_->spec();
  for (auto& rank : buffers_) {
    for (size_t b = 0; b < rank.size(); ++b) {
      // memset with a null pointer is undefined even for 0 bytes; empty buffers have no data().
      if (plan_->buffers()[b].side == Side::kDst && !rank[b].empty()) {
        std::memset(rank[b].data(), kPoison, rank[b].size());
      }
    }
  }
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const uint32_t id = plan_->buffer_of(t, Side::kSrc);
    // Quantized tensors and their scales read internal buffers, filled below.
    if (plan_->buffers()[id].internal) continue;
    ForEachTile(spec, t, Side::kSrc, [&](int32_t rank, const Box& box) {
      FillTile(spec, t, Side::kSrc, box, epoch, buffer(rank, id));
    });
  }
  // A lowered spec's quantized sources: the user's tiles, then what each source rank quantizes
  // (after the amax exchange, done here in process, when source tiles share blocks).
  for (size_t q = 0; q < spec.quantized_sources.size(); ++q) {
    const QuantizedSource& qs = spec.quantized_sources[q];
    const uint32_t user = plan_->quantized_source_buffer(q);
    const uint32_t elements = plan_->buffer_of(qs.tensor, Side::kSrc);
    const uint32_t scales = plan_->buffer_of(qs.scale_tensor, Side::kSrc);
    TileGrid grid(qs.src, spec.tensors[qs.tensor].shape);
    auto for_each_tile = [&](auto&& fn) {
      for (int64_t flat = 0; flat < grid.num_cells(); ++flat) {
        const TileGrid::Cell cell = grid.CellAt(flat);
        const Box box = grid.CellBox(cell);
        for (int64_t j = 0; j < grid.num_replicas(); ++j) fn(grid.Holder(cell, j), box);
      }
    };
    // A requantized FP8 source: its scales' buffer, and room for a tile dequantized.
    const uint32_t user_scales = plan_->quantized_source_scale_buffer(q);
    auto scales_of = [&](int32_t rank) {
      return user_scales == Plan::kNoBuffer ? nullptr : buffer(rank, user_scales);
    };
    std::vector<float> dequantized;
    for_each_tile([&](int32_t rank, const Box& box) {
      FillQuantizedSourceTile(spec, q, box, epoch, buffer(rank, user), scales_of(rank));
      dequantized.resize(std::max(dequantized.size(),
                                  static_cast<size_t>(DequantizedElements(qs, box))));
    });
    if (!qs.exchange) {
      for_each_tile([&](int32_t rank, const Box& box) {
        QuantizeSourceTile(spec, q, box, buffer(rank, user), buffer(rank, elements),
                           buffer(rank, scales), nullptr, scales_of(rank), dequantized.data());
      });
      continue;
    }
    // The exchange: every tile's partial amaxes into the whole partial tensor, then each tile's
    // gathered part of it, combined.
    const TensorSpec& partials = spec.amax_exchange->tensors[qs.partial_tensor];
    const TileGrid partial_grid(partials.src, partials.shape);
    const TileGrid gathered_grid(partials.dst, partials.shape);
    int64_t n = 1;
    for (int64_t e : partials.shape) n *= e;
    std::vector<float> all(static_cast<size_t>(n), 0.0f), tile_amax, gathered, amax;
    const Layout row_major;  // Tile-local row-major offsets.
    for_each_tile([&](int32_t rank, const Box& box) {
      const Box pbox = partial_grid.CellBox(*partial_grid.CellOfRank(rank));
      tile_amax.assign(static_cast<size_t>(std::max<int64_t>(pbox.NumElements(), 0)), 0.0f);
      PartialAmaxTile(spec, q, box, buffer(rank, user), tile_amax.data(), scales_of(rank),
                      dequantized.data());
      ForEachElement(row_major, partials.shape, pbox,
                     [&](int64_t off, int64_t g) { all[g] = tile_amax[off]; });
    });
    for_each_tile([&](int32_t rank, const Box& box) {
      const Box gbox = gathered_grid.CellBox(*gathered_grid.CellOfRank(rank));
      gathered.assign(static_cast<size_t>(std::max<int64_t>(gbox.NumElements(), 0)), 0.0f);
      ForEachElement(row_major, partials.shape, gbox,
                     [&](int64_t off, int64_t g) { gathered[off] = all[g]; });
      amax.assign(gathered.size(), 0.0f);
      CombineAmax(qs, box, gathered.data(), amax.data());
      QuantizeSourceTile(spec, q, box, buffer(rank, user), buffer(rank, elements),
                         buffer(rank, scales), amax.data(), scales_of(rank), dequantized.data());
    });
  }
}

void LocalWorld::Execute() {
  // Transfers are emitted so that a dependency always precedes its dependants.
  for (const Transfer& tr : plan_->transfers()) {
    const Region& r = plan_->region(tr.region);
    const uint8_t* from = buffer(tr.from_rank, plan_->buffer_of(tr.tensor, tr.from_side));
    uint8_t* to = buffer(tr.to_rank, plan_->buffer_of(tr.tensor, tr.to_side));
    ForEachRun(r, plan_->region_dims(r), [&](int64_t f, int64_t t, int64_t n) {
      if (n > 0) std::memcpy(to + t, from + f, n);
    });
  }
}

absl::Status LocalWorld::Verify(uint64_t epoch) const {
  const RefitSpec& spec = plan_->spec();
  // Coverage of destination views, to check that nothing outside them was written.
  std::vector<std::vector<std::vector<bool>>> covered(buffers_.size());
  for (size_t r = 0; r < buffers_.size(); ++r) covered[r].resize(buffers_[r].size());
  // What quantized tensors and their scales must hold: the source's values, quantized.
  std::vector<const std::vector<uint8_t>*> expected(spec.tensors.size(), nullptr);
  std::vector<QuantizedExpectation> quantized;
  quantized.reserve(spec.quantized_sources.size());
  for (size_t q = 0; q < spec.quantized_sources.size(); ++q) {
    quantized.push_back(ExpectQuantized(spec, q, epoch));
    expected[spec.quantized_sources[q].tensor] = &quantized.back().elements;
    expected[spec.quantized_sources[q].scale_tensor] = &quantized.back().scales;
  }
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const uint32_t id = plan_->buffer_of(t, Side::kDst);
    const int elem = DTypeSize(spec.tensors[t].dtype);
    absl::Status status;
    ForEachTile(spec, t, Side::kDst, [&](int32_t rank, const Box& box) {
      if (!status.ok()) return;
      status = expected[t] != nullptr
                   ? VerifyTileAgainst(spec, t, box, rank, buffers_[rank][id].data(),
                                       expected[t]->data())
                   : VerifyTile(spec, t, box, epoch, rank, buffers_[rank][id].data());
      auto& mask = covered[rank][id];
      mask.resize(buffers_[rank][id].size(), false);
      ForEachElement(spec.tensors[t].dst, spec.tensors[t].shape, box, [&](int64_t off, int64_t) {
        for (int i = 0; i < elem; ++i) mask[off * elem + i] = true;
      });
    });
    RESHARD_RETURN_IF_ERROR(status);
  }
  for (size_t r = 0; r < buffers_.size(); ++r) {
    for (size_t b = 0; b < buffers_[r].size(); ++b) {
      if (plan_->buffers()[b].side != Side::kDst) continue;
      const auto& bytes = buffers_[r][b];
      const auto& mask = covered[r][b];
      for (size_t i = 0; i < bytes.size(); ++i) {
        if ((i >= mask.size() || !mask[i]) && bytes[i] != kPoison) {
          return absl::DataLossError(absl::StrFormat(
              "buffer %s: rank %d byte %d lies outside every destination view but was written",
              json::QuoteForMessage(plan_->buffers()[b].name), r, i));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status VerifyPlanInProcess(const Plan& plan, int64_t max_bytes) {
  RESHARD_ASSIGN_OR_RETURN(LocalWorld world, LocalWorld::Create(plan, max_bytes));
  constexpr uint64_t kEpoch = 1;
  world.Prepare(kEpoch);
  world.Execute();
  return world.Verify(kEpoch);
}

}  // namespace reshard::plan
