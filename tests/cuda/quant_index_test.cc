// The per-element arithmetic of the CUDA quantization kernels (src/cuda/quant_index.h) on the
// CPU: composed exactly as quant_kernels.cu composes it (an amax pass over every element with its
// block's max, the blocks' scales, a quantize pass), it must equal plan::QuantizeTile and
// plan::BlockAmax bit for bit on random tiles of every dtype, scheme and format (padded,
// permuted and reversed sources, partial and oversized blocks, NaN, Inf, subnormals, zeros).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "src/cuda/quant_index.h"
#include "src/plan/quantize.h"
#include "tests/cuda/quant_test_util.h"

namespace reshard::cuda {
namespace {

// The kernels' three passes, one element at a time.
void HostTwin(const QuantShape& s, const uint8_t* src, const float* given_amax, uint8_t* out,
              uint8_t* scales, float* amax_out) {
  std::vector<uint32_t> amax(static_cast<size_t>(s.num_blocks), 0);
  if (given_amax != nullptr) {
    for (int64_t b = 0; b < s.num_blocks; ++b) amax[b] = quant::FloatBits(given_amax[b]);
  } else {
    for (int64_t e = 0; e < s.elements; ++e) {
      const QuantElement at = LocateQuantElement(s, e);
      amax[at.block] =
          std::max(amax[at.block], AmaxBits(LoadQuantSource(s.source, src, at.src_offset)));
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
    out[e] = QuantizeElement(s, LoadQuantSource(s.source, src, at.src_offset), factors[at.block]);
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

}  // namespace
}  // namespace reshard::cuda
