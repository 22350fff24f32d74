// The per-element arithmetic of the CUDA quantization kernels (src/cuda/quant_index.h) on the
// CPU: composed exactly as quant_kernels.cu composes it (an amax pass over every element with its
// block's max, the blocks' scales, a quantize pass), it must equal plan::QuantizeTile and
// plan::BlockAmax bit for bit on random tiles of every dtype, scheme and format (padded,
// permuted and reversed sources, partial and oversized blocks, NaN, Inf, subnormals, zeros);
// for requantized FP8 sources (dequantized with their own block scales as they are loaded) they
// must equal plan::DequantizeTile then plan::QuantizeTile, for every pair of schemes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "src/api/quant_shape.h"
#include "src/cuda/quant_index.h"
#include "src/plan/fill.h"
#include "src/plan/plan.h"
#include "src/plan/quant_spec.h"
#include "src/plan/quantize.h"
#include "src/plan/spec_json.h"
#include "tests/cuda/quant_test_util.h"

namespace reshard::cuda {
namespace {

// The kernels' three passes, one element at a time.
void HostTwin(const QuantShape& s, const uint8_t* src, const float* given_amax, uint8_t* out,
              uint8_t* scales, float* amax_out, const uint8_t* src_scales = nullptr) {
  std::vector<uint32_t> amax(static_cast<size_t>(s.num_blocks), 0);
  if (given_amax != nullptr) {
    for (int64_t b = 0; b < s.num_blocks; ++b) amax[b] = quant::FloatBits(given_amax[b]);
  } else {
    for (int64_t e = 0; e < s.elements; ++e) {
      const QuantElement at = LocateQuantElement(s, e);
      amax[at.block] = std::max(amax[at.block], AmaxBits(LoadQuantElement(s, src, src_scales, at)));
    }
  }
  if (amax_out != nullptr) {
    for (int64_t b = 0; b < s.num_blocks; ++b) amax_out[b] = quant::FloatFromBits(amax[b]);
    return;
  }
  std::vector<float> factors(static_cast<size_t>(s.num_blocks));
  for (int64_t b = 0; b < s.num_blocks; ++b) {
    factors[b] = BlockScale(s, quant::FloatFromBits(amax[b]), scales + b * (s.mx ? 1 : 4));
  }
  for (int64_t e = 0; e < s.elements; ++e) {
    const QuantElement at = LocateQuantElement(s, e);
    out[e] = QuantizeElement(s, LoadQuantElement(s, src, src_scales, at), factors[at.block]);
  }
}

TEST(QuantIndexTest, TheKernelsPassesEqualQuantizeTileBitForBit) {
  std::mt19937_64 rng(13);
  int64_t elements = 0;
  for (int i = 0; i < 2000; ++i) {
    testing::RandomQuantTile r = testing::MakeRandomQuantTile(rng);
    const plan::QuantTile& t = r.tile;
    const QuantShape s = testing::ShapeOf(t);
    ASSERT_EQ(s.num_blocks, r.num_blocks);
    const int scale_bytes = s.mx ? 1 : 4;
    std::vector<uint8_t> out(static_cast<size_t>(s.elements)), scales(s.num_blocks * scale_bytes);
    std::vector<uint8_t> want_out = out, want_scales = scales;
    plan::QuantTile q = t;
    q.out = want_out.data();
    q.scales = want_scales.data();
    if (s.elements == 0) continue;
    plan::QuantizeTile(q);
    HostTwin(s, static_cast<const uint8_t*>(t.src), nullptr, out.data(), scales.data(), nullptr);
    ASSERT_EQ(out, want_out) << "tile " << i;
    ASSERT_EQ(scales, want_scales) << "tile " << i;
    // The amax pass alone, and quantizing with given amaxes (the amax exchange).
    std::vector<float> amax(s.num_blocks), want_amax(s.num_blocks);
    plan::BlockAmax(t, want_amax.data());
    HostTwin(s, static_cast<const uint8_t*>(t.src), nullptr, nullptr, nullptr, amax.data());
    ASSERT_EQ(0, std::memcmp(amax.data(), want_amax.data(), amax.size() * 4)) << "tile " << i;
    for (float& a : want_amax) a *= 2;
    q.amax = want_amax.data();
    plan::QuantizeTile(q);
    HostTwin(s, static_cast<const uint8_t*>(t.src), want_amax.data(), out.data(), scales.data(),
             nullptr);
    ASSERT_EQ(out, want_out) << "tile " << i << " with given amaxes";
    ASSERT_EQ(scales, want_scales) << "tile " << i << " with given amaxes";
    elements += s.elements;
  }
  EXPECT_GT(elements, 10000);
}

TEST(QuantIndexTest, RequantizingEqualsDequantizeTileThenQuantizeTileForEverySchemePair) {
  using plan::QuantScheme;
  const QuantScheme schemes[] = {QuantScheme::kBlock, QuantScheme::kChannel, QuantScheme::kTensor,
                                 QuantScheme::kMx};
  std::mt19937_64 rng(1313);
  for (const QuantScheme src : schemes) {
    for (const QuantScheme dst : schemes) {
      int64_t elements = 0, phased = 0;
      for (int i = 0; i < 2000; ++i) {
        const testing::RandomRequantTile r = testing::MakeRandomRequantTile(rng, src, dst);
        const QuantShape s = internal::QuantShapeOf(r.tile, &r.fp8);
        ASSERT_TRUE(IsFp8Source(s.source));
        std::vector<uint8_t> want_out, want_scales;
        testing::RequantizeOnHost(r, want_out, want_scales);
        std::vector<uint8_t> out(want_out.size(), 0xA5), scales(want_scales.size(), 0xA5);
        const std::string what = "scheme " + std::to_string(static_cast<int>(src)) + " -> " +
                                 std::to_string(static_cast<int>(dst)) + ", tile " +
                                 std::to_string(i);
        HostTwin(s, r.tile.src, nullptr, out.data(), scales.data(), nullptr, r.fp8.scales);
        ASSERT_EQ(out, want_out) << what;
        ASSERT_EQ(scales, want_scales) << what;
        // The amax pass alone (the amax exchange's partial amaxes), and given amaxes.
        std::vector<float> want_amax = testing::RequantAmaxOnHost(r);
        std::vector<float> amax(want_amax.size(), -1.0f);
        HostTwin(s, r.tile.src, nullptr, nullptr, nullptr, amax.data(), r.fp8.scales);
        ASSERT_EQ(0, std::memcmp(amax.data(), want_amax.data(), amax.size() * 4)) << what;
        for (float& a : want_amax) a *= 2;
        testing::RequantizeOnHost(r, want_out, want_scales, want_amax.data());
        HostTwin(s, r.tile.src, want_amax.data(), out.data(), scales.data(), nullptr,
                 r.fp8.scales);
        ASSERT_EQ(out, want_out) << what << " with given amaxes";
        ASSERT_EQ(scales, want_scales) << what << " with given amaxes";
        elements += s.elements;
        for (int d = 0; d < s.ndim; ++d) phased += s.fp8_phase[d] != 0;
      }
      EXPECT_GT(elements, 5000) << static_cast<int>(src) << " -> " << static_cast<int>(dst);
      // Tiles that start inside a source block were among them.
      EXPECT_GT(phased, 100) << static_cast<int>(src) << " -> " << static_cast<int>(dst);
    }
  }
}

// What RefitSession gives the kernels for a source tile in GPU memory (SourceQuantTile,
// DequantSourceOf, QuantShapeOf), composed as the kernels compose it, equals what the host path
// writes (QuantizeSourceTile; PartialAmaxTile for the amax pass of the amax exchange), for every
// source tile of FP8 sources requantized through views and scale views, with and without the
// exchange, and a bf16 source through a transposed view.
TEST(QuantIndexTest, TheSessionsDeviceTilesEqualQuantizeSourceTile) {
  constexpr char kSpec[] = R"json({"tensors": [
    {"name": "requant", "dtype": "bf16", "shape": [64, 256],
     "src": {"mesh": [0, 1], "placements": ["S(1)"], "dtype": "fp8e5m2",
             "quant": {"scheme": "mx", "block": [1, 32]}, "scale_buffer": "mx_scales",
             "scale_view": {"offset": 40}},
     "dst": {"mesh": [2, 3], "placements": ["S(0)"], "dtype": "fp8e4m3",
             "quant": {"scheme": "channel"}}},
    {"name": "reblock", "dtype": "bf16", "shape": [256, 384],
     "src": {"mesh": [0, 1], "placements": ["S(0)"], "dtype": "fp8e4m3",
             "view": {"offset": 8, "strides": [1, 136]},
             "quant": {"scheme": "block", "block": [128, 128]}, "scale_buffer": "block_scales",
             "scale_view": {"offset": 3, "strides": [1, 2]}},
     "dst": {"mesh": [2, 3], "placements": ["S(1)"], "dtype": "fp8e5m2",
             "quant": {"scheme": "mx", "block": [1, 32]}}},
    {"name": "plain", "dtype": "bf16", "shape": [128, 96],
     "src": {"mesh": [0, 1], "placements": ["S(1)"], "view": {"offset": 0, "strides": [1, 128]}},
     "dst": {"mesh": [2, 3], "placements": ["S(0)"], "dtype": "fp8e4m3",
             "quant": {"scheme": "block", "block": [32, 48]}}}]})json";
  auto parsed = plan::ParseSpecJson(kSpec);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto built = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*parsed));
  ASSERT_TRUE(built.ok()) << built.status();
  const plan::Plan& p = *built;
  const plan::RefitSpec& spec = p.spec();
  ASSERT_EQ(spec.quantized_sources.size(), 3u);
  int exchanged = 0, quantized = 0;
  for (int32_t rank = 0; rank < 2; ++rank) {
    const std::vector<int64_t> bytes = p.BufferBytes(rank);
    std::vector<std::vector<uint8_t>> memory(bytes.size());
    for (size_t b = 0; b < bytes.size(); ++b) memory[b].assign(static_cast<size_t>(bytes[b]), 0);
    for (size_t q = 0; q < spec.quantized_sources.size(); ++q) {
      const plan::QuantizedSource& qs = spec.quantized_sources[q];
      SCOPED_TRACE(spec.tensors[qs.tensor].name + " on rank " + std::to_string(rank));
      const plan::TileGrid grid(qs.src, spec.tensors[qs.tensor].shape);
      const auto cell = grid.CellOfRank(rank);
      ASSERT_TRUE(cell.has_value());
      const plan::Box tile = grid.CellBox(*cell);
      uint8_t* user = memory[p.quantized_source_buffer(q)].data();
      const uint32_t scale_buffer = p.quantized_source_scale_buffer(q);
      uint8_t* user_scales =
          scale_buffer == plan::Plan::kNoBuffer ? nullptr : memory[scale_buffer].data();
      ASSERT_EQ(user_scales != nullptr, qs.requantized());
      plan::FillQuantizedSourceTile(spec, q, tile, /*epoch=*/3, user, user_scales);
      uint8_t* elements = memory[p.buffer_of(qs.tensor, plan::Side::kSrc)].data();
      uint8_t* scales = memory[p.buffer_of(qs.scale_tensor, plan::Side::kSrc)].data();
      const plan::QuantTile qt = plan::SourceQuantTile(spec, q, tile, user, elements, scales);
      std::optional<plan::DequantSource> fp8;
      if (qs.requantized()) fp8 = plan::DequantSourceOf(qs, tile, user_scales);
      const QuantShape s = internal::QuantShapeOf(qt, fp8 ? &*fp8 : nullptr);
      const uint8_t* src_scales = fp8 ? fp8->scales : nullptr;
      std::vector<float> dequantized(
          static_cast<size_t>(std::max<int64_t>(1, plan::DequantizedElements(qs, tile))));
      if (qs.exchange) {
        // The amax pass alone: the tile's partial amaxes.
        std::vector<float> want(static_cast<size_t>(s.num_blocks)), got(want.size(), -1.0f);
        plan::PartialAmaxTile(spec, q, tile, user, want.data(), user_scales, dequantized.data());
        HostTwin(s, qt.src, nullptr, nullptr, nullptr, got.data(), src_scales);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4));
        ++exchanged;
        continue;
      }
      const size_t scale_bytes = static_cast<size_t>(s.num_blocks * (s.mx ? 1 : 4));
      plan::QuantizeSourceTile(spec, q, tile, user, elements, scales, nullptr, user_scales,
                               dequantized.data());
      const std::vector<uint8_t> want_out(qt.out, qt.out + s.elements);
      const std::vector<uint8_t> want_scales(qt.scales, qt.scales + scale_bytes);
      std::vector<uint8_t> out(want_out.size(), 0xA5), got_scales(scale_bytes, 0xA5);
      HostTwin(s, qt.src, nullptr, out.data(), got_scales.data(), nullptr, src_scales);
      EXPECT_EQ(out, want_out);
      EXPECT_EQ(got_scales, want_scales);
      ++quantized;
    }
  }
  EXPECT_EQ(exchanged, 2);  // "requant": MX column shards into channel scales.
  EXPECT_EQ(quantized, 4);
}

}  // namespace
}  // namespace reshard::cuda
