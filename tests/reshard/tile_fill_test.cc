// The test patterns of `reshard run` and `reshard bench` under sparse changes
// (tools/reshard/tile_fill.h): what TilePatterns expects a destination to hold after a run of
// refits, each changing its own fraction of the source elements, must be exactly what the
// changed sources give. Rank 0 holds every tensor whole, so each refit's destinations are
// computed here from its buffers (QuantizeReference of the values for quantized tensors, the
// bytes as they are otherwise), independently of the expectations under test.
#include "tools/reshard/tile_fill.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace reshard::cli {
namespace {

// Every quantization scheme from real numbers of each source dtype, FP8 bytes and scales that
// arrive as they are, and a plain tensor; rank 0 holds each whole, ranks 1 and 2 a shard.
constexpr char kSpec[] = R"json({
  "tensors": [
    {"name": "w", "dtype": "bf16", "shape": [256, 256],
     "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1, 2], "placements": ["S(1)"], "dtype": "fp8e4m3",
             "quant": {"scheme": "block", "block": [128, 128]}}},
    {"name": "m", "dtype": "fp32", "shape": [64, 96],
     "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1, 2], "placements": ["S(0)"], "dtype": "fp8e5m2",
             "quant": {"scheme": "mx", "block": [1, 32]}}},
    {"name": "c", "dtype": "fp16", "shape": [64, 200],
     "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1, 2], "placements": ["S(1)"], "dtype": "fp8e4m3",
             "quant": {"scheme": "channel"}}},
    {"name": "t", "dtype": "bf16", "shape": [100, 30],
     "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1, 2], "placements": ["S(0)"], "dtype": "fp8e4m3",
             "quant": {"scheme": "tensor"}}},
    {"name": "plain", "dtype": "bf16", "shape": [64, 64],
     "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1, 2], "placements": ["S(1)"]}},
    {"name": "f", "dtype": "bf16", "shape": [256, 256],
     "src": {"mesh": [0], "placements": ["R"], "dtype": "fp8e4m3",
             "quant": {"scheme": "block", "block": [128, 128]}},
     "dst": {"mesh": [1, 2], "placements": ["S(1)"], "dtype": "fp8e4m3",
             "quant": {"scheme": "block", "block": [128, 128]}}}
  ]
})json";

using Buffers = std::map<std::pair<int, std::string>, std::vector<uint8_t>>;

// Calls fn(offset in elements, row-major index within the tile's box, the element's global
// multi-index) for every element of `tile`.
template <typename Fn>
void ForEach(const LocalTile& tile, Fn&& fn) {
  const size_t nd = tile.lo.size();
  int64_t count = 1;
  for (size_t d = 0; d < nd; ++d) count *= tile.hi[d] - tile.lo[d];
  std::vector<int64_t> idx(nd, 0), global(nd);
  for (int64_t i = 0; i < count; ++i) {
    int64_t offset = tile.offset;
    for (size_t d = 0; d < nd; ++d) {
      offset += idx[d] * tile.strides[d];
      global[d] = tile.lo[d] + idx[d];
    }
    fn(offset, i, global);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < tile.hi[d] - tile.lo[d]) break;
      idx[d] = 0;
    }
  }
}

int64_t Flat(const std::vector<int64_t>& index, const std::vector<int64_t>& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
  return flat;
}

class TilePatternsChangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<RefitSpec> spec = RefitSpec::FromJson(kSpec);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *std::move(spec);
    for (int rank = 0; rank < 3; ++rank) {
      absl::StatusOr<std::vector<BufferRequirement>> need = spec_.LocalBuffers(rank);
      ASSERT_TRUE(need.ok()) << need.status();
      for (const BufferRequirement& r : *need) {
        buffers_[{rank, r.name}].assign(static_cast<size_t>(r.bytes), 0);
      }
      const Side side = rank == 0 ? Side::kSource : Side::kDestination;
      absl::StatusOr<std::vector<LocalTile>> tiles = spec_.LocalTiles(rank, side);
      ASSERT_TRUE(tiles.ok()) << tiles.status();
      for (LocalTile& t : *tiles) {
        if (rank == 0) {
          sources_[t.tensor] = t;
        } else {
          destinations_.push_back({rank, t});
        }
      }
    }
  }

  uint8_t* Data(int rank, const LocalTile& tile) { return buffers_[{rank, tile.buffer}].data(); }

  // What refit leaves in every destination, from rank 0's sources.
  void Refit() {
    for (const auto& [rank, tile] : destinations_) {
      const std::string& name = tile.scales_of.empty() ? tile.tensor : tile.scales_of;
      const TensorDesc& desc = Desc(name);
      uint8_t* to = Data(rank, tile);
      const int eb = DTypeSize(tile.dtype);
      const bool quantize = desc.dst.quant_scheme != QuantScheme::kNone &&
                            desc.src.quant_scheme == QuantScheme::kNone;
      if (!quantize) {
        // Moved as it is: the source tile of the same name (an FP8 source's scales too).
        const LocalTile& from = sources_.at(tile.tensor);
        const uint8_t* src = Data(0, from);
        ForEach(tile, [&](int64_t offset, int64_t, const std::vector<int64_t>& g) {
          int64_t at = from.offset;
          for (size_t d = 0; d < g.size(); ++d) at += (g[d] - from.lo[d]) * from.strides[d];
          std::memcpy(to + offset * eb, src + at * eb, static_cast<size_t>(eb));
        });
        continue;
      }
      // The whole tensor's values, row-major, quantized by the reference.
      const LocalTile& from = sources_.at(name);
      const int sb = DTypeSize(desc.dtype);
      std::vector<uint8_t> values(static_cast<size_t>(from.num_elements() * sb));
      ForEach(from, [&](int64_t offset, int64_t i, const std::vector<int64_t>&) {
        std::memcpy(values.data() + i * sb, Data(0, from) + offset * sb, static_cast<size_t>(sb));
      });
      const std::vector<int64_t> block =
          QuantBlockShape(desc.shape, desc.dst.quant_scheme, desc.dst.quant_block);
      std::vector<int64_t> blocked(desc.shape.size());
      int64_t blocks = 1;
      for (size_t d = 0; d < blocked.size(); ++d) {
        blocked[d] = (desc.shape[d] + block[d] - 1) / block[d];
        blocks *= blocked[d];
      }
      const int scale_bytes = desc.dst.quant_scheme == QuantScheme::kMx ? 1 : 4;
      std::vector<uint8_t> fp8(static_cast<size_t>(from.num_elements()));
      std::vector<uint8_t> scales(static_cast<size_t>(blocks * scale_bytes));
      ASSERT_TRUE(QuantizeReference(desc.dtype, values.data(), desc.shape, *desc.dst.dtype,
                                    desc.dst.quant_scheme, block, fp8.data(), scales.data())
                      .ok());
      const bool scale_tile = !tile.scales_of.empty();
      ForEach(tile, [&](int64_t offset, int64_t, const std::vector<int64_t>& g) {
        const int64_t at = Flat(g, scale_tile ? blocked : desc.shape) * eb;
        std::memcpy(to + offset * eb, (scale_tile ? scales : fp8).data() + at,
                    static_cast<size_t>(eb));
      });
    }
  }

  const TensorDesc& Desc(const std::string& name) const {
    for (const TensorDesc& t : spec_.tensors()) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << "no tensor " << name;
    return spec_.tensors()[0];
  }

  RefitSpec spec_;
  Buffers buffers_;
  std::map<std::string, LocalTile> sources_;  // Rank 0's, by tile.tensor.
  std::vector<std::pair<int, LocalTile>> destinations_;
};

TEST_F(TilePatternsChangeTest, ExpectationsFollowTheChangedSourcesThroughEverySchemeAndRefit) {
  const TilePatterns patterns(spec_);
  // Refit 1 fills; then 5%, nothing, everything, 30%, 0.1%.
  const std::vector<double> fractions = {-1, 0.05, 0.0, 1.0, 0.3, 0.001};
  std::vector<std::vector<uint8_t>> low(destinations_.size());
  std::vector<std::vector<uint8_t>> before(destinations_.size());
  for (size_t i = 0; i < fractions.size(); ++i) {
    const uint64_t epoch = i + 1;
    SCOPED_TRACE(::testing::Message() << "refit " << epoch << ", fraction " << fractions[i]);
    for (const auto& [name, tile] : sources_) {
      if (epoch == 1) {
        patterns.Fill(tile, epoch, Data(0, tile));
      } else {
        patterns.Change(tile, epoch, fractions[i], Data(0, tile));
      }
    }
    Refit();
    int64_t changed = 0, elements = 0;
    for (size_t d = 0; d < destinations_.size(); ++d) {
      const auto& [rank, tile] = destinations_[d];
      patterns.AdvanceChanged(tile, epoch, fractions[i], &low[d]);
      const uint8_t* data = Data(rank, tile);
      EXPECT_TRUE(patterns.VerifyChangedLow(tile, epoch, low[d], rank, data).ok())
          << tile.tensor << " on rank " << rank << ": "
          << patterns.VerifyChangedLow(tile, epoch, low[d], rank, data);
      // Without the history, from the fraction alone (every refit's the same).
      if (fractions[i] > 0 && epoch == 2) {
        EXPECT_TRUE(patterns.VerifyChanged(tile, epoch, fractions[i], rank, data).ok())
            << tile.tensor;
      }
      const int eb = DTypeSize(tile.dtype);
      std::vector<uint8_t> now;
      ForEach(tile, [&](int64_t offset, int64_t, const std::vector<int64_t>&) {
        now.insert(now.end(), data + offset * eb, data + (offset + 1) * eb);
      });
      if (epoch > 1 && tile.scales_of.empty()) {
        elements += static_cast<int64_t>(now.size()) / eb;
        for (size_t k = 0; k < now.size(); k += static_cast<size_t>(eb)) {
          changed += std::memcmp(&now[k], &before[d][k], static_cast<size_t>(eb)) != 0;
        }
      }
      before[d] = std::move(now);
    }
    if (epoch == 1) continue;
    // The changes reach the destinations: none when nothing changed, some otherwise, most
    // when every element did (an FP8 byte may round to the same code).
    const double share = static_cast<double>(changed) / static_cast<double>(elements);
    if (fractions[i] == 0) {
      EXPECT_EQ(changed, 0);
    } else {
      EXPECT_GT(changed, 0);
    }
    if (fractions[i] == 1) {
      EXPECT_GT(share, 0.5);
    }
    if (fractions[i] == 0.05) {
      EXPECT_LT(share, 0.5);
    }
  }
}

// The expectations are sharp: a destination that missed one refit's changes, or one byte of
// them, fails its check with the tensor, rank and refit named.
TEST_F(TilePatternsChangeTest, AStaleOrWrongByteFailsItsTile) {
  const TilePatterns patterns(spec_);
  std::vector<std::vector<uint8_t>> low(destinations_.size());
  for (const auto& [name, tile] : sources_) patterns.Fill(tile, 1, Data(0, tile));
  Refit();
  for (size_t d = 0; d < destinations_.size(); ++d) {
    patterns.AdvanceChanged(destinations_[d].second, 1, 0, &low[d]);
  }
  for (const auto& [name, tile] : sources_) patterns.Change(tile, 2, 0.2, Data(0, tile));
  for (size_t d = 0; d < destinations_.size(); ++d) {
    const auto& [rank, tile] = destinations_[d];
    patterns.AdvanceChanged(tile, 2, 0.2, &low[d]);
    // Still refit 1's values. Scales need not differ (an FP8 source's never change, a block's
    // only when its amax moved), nor can m's FP8 elements: 1 to 15 ulp of an fp32 is far
    // below an e5m2 step. Every other element tile does.
    const absl::Status stale = patterns.VerifyChangedLow(tile, 2, low[d], rank, Data(rank, tile));
    if (tile.scales_of.empty() && tile.tensor != "m") {
      EXPECT_EQ(stale.code(), absl::StatusCode::kDataLoss) << tile.tensor << " on rank " << rank;
      EXPECT_NE(stale.message().find("on rank " + std::to_string(rank)), std::string::npos)
          << stale;
      EXPECT_NE(stale.message().find("refit 2"), std::string::npos) << stale;
    }
  }
  Refit();
  for (size_t d = 0; d < destinations_.size(); ++d) {
    const auto& [rank, tile] = destinations_[d];
    uint8_t* data = Data(rank, tile);
    ASSERT_TRUE(patterns.VerifyChangedLow(tile, 2, low[d], rank, data).ok()) << tile.tensor;
    // One byte of the tile's last element.
    int64_t last = tile.offset;
    for (size_t k = 0; k < tile.lo.size(); ++k)
      last += (tile.hi[k] - tile.lo[k] - 1) * tile.strides[k];
    data[last * DTypeSize(tile.dtype)] ^= 0x40;
    const absl::Status wrong = patterns.VerifyChangedLow(tile, 2, low[d], rank, data);
    EXPECT_EQ(wrong.code(), absl::StatusCode::kDataLoss) << tile.tensor << " on rank " << rank;
    EXPECT_NE(wrong.message().find(tile.tensor), std::string::npos) << wrong;
    data[last * DTypeSize(tile.dtype)] ^= 0x40;
  }
}

}  // namespace
}  // namespace reshard::cli
