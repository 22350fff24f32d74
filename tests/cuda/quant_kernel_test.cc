// The FP8 quantization kernels on a device (cuda::DeviceQuantizer) against plan::QuantizeTile and
// plan::BlockAmax, bit for bit: random tiles of every dtype, scheme and format (padded, permuted,
// reversed sources; NaN, Inf, subnormals, zeros), amaxes given as the amax exchange gives them,
// and a large tile per scheme that spreads blocks over many threads and warps; requantized FP8
// sources (FP8 bytes and their own scales in device memory) against plan::DequantizeTile then
// plan::QuantizeTile for every pair of schemes. Every test skips without a usable GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/cuda/quantize.h"
#include "src/cuda/runtime.h"
#include "tests/cuda/skip_without_gpu.h"
#include "src/plan/quantize.h"
#include "tests/cuda/quant_test_util.h"

namespace reshard::cuda {
namespace {

// Copies the tile's whole source buffer to the device and quantizes it there.
void CheckOnDevice(const testing::RandomQuantTile& r, const std::string& what) {
  const plan::QuantTile& t = r.tile;
  const QuantShape s = testing::ShapeOf(t);
  if (s.elements == 0) return;
  const int scale_bytes = s.mx ? 1 : 4;
  std::vector<uint8_t> want_out(s.elements), want_scales(s.num_blocks * scale_bytes);
  plan::QuantTile q = t;
  q.out = want_out.data();
  q.scales = want_scales.data();
  plan::QuantizeTile(q);
  std::vector<float> want_amax(s.num_blocks);
  plan::BlockAmax(t, want_amax.data());

  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, r.source.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, r.source.data(), r.source.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  const uint8_t* src = static_cast<const uint8_t*>(device) + (t.src - r.source.data());
  auto quantizer = DeviceQuantizer::Create(s);
  ASSERT_TRUE(quantizer.ok()) << quantizer.status();
  std::vector<uint8_t> out(s.elements, 0xA5), scales(s.num_blocks * scale_bytes, 0xA5);
  ASSERT_TRUE((*quantizer)->Quantize(src, out.data(), scales.data()).ok()) << what;
  EXPECT_EQ(out, want_out) << what;
  EXPECT_EQ(scales, want_scales) << what;
  std::vector<float> amax(s.num_blocks, -1.0f);
  ASSERT_TRUE((*quantizer)->Amax(src, amax.data()).ok()) << what;
  EXPECT_EQ(0, std::memcmp(amax.data(), want_amax.data(), amax.size() * 4)) << what;
  // Given amaxes (the amax exchange): twice the tile's own.
  for (float& a : want_amax) a *= 2;
  q.amax = want_amax.data();
  plan::QuantizeTile(q);
  ASSERT_TRUE((*quantizer)->Quantize(src, out.data(), scales.data(), want_amax.data()).ok());
  EXPECT_EQ(out, want_out) << what << " with given amaxes";
  EXPECT_EQ(scales, want_scales) << what << " with given amaxes";
  cudaFree(device);
}

TEST(QuantKernelTest, RandomTilesEqualQuantizeTile) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(31);
  for (int i = 0; i < 300; ++i) {
    CheckOnDevice(testing::MakeRandomQuantTile(rng), "random tile " + std::to_string(i));
    if (HasFatalFailure()) return;
  }
}

TEST(QuantKernelTest, LargeTilesOfEveryScheme) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(7);
  // 1000 x 1100 bf16: 128 x 128 blocks (partial at the edges), MX rows of 32, a channel per row,
  // one block for the whole tile; contiguous and transposed.
  const int64_t blocks[][2] = {{128, 128}, {1, 32}, {1, 1100}, {1000, 1100}};
  for (const bool transposed : {false, true}) {
    for (const auto& block : blocks) {
      testing::RandomQuantTile r;
      plan::QuantTile& t = r.tile;
      t.src_dtype = plan::DType::kBf16;
      t.ndim = 2;
      t.extent[0] = 1000;
      t.extent[1] = 1100;
      t.src_strides[0] = transposed ? 1 : 1100;
      t.src_strides[1] = transposed ? 1000 : 1;
      t.block[0] = block[0];
      t.block[1] = block[1];
      t.arith = block[1] == 32 ? plan::QuantArith::kMx : plan::QuantArith::kFp32Scale;
      t.format = transposed ? quant::Fp8Format::kE5M2 : quant::Fp8Format::kE4M3;
      r.source.resize(1000 * 1100 * 2);
      for (size_t i = 0; i < r.source.size(); i += 2) {
        const uint32_t bits = testing::RandomSourceBits(rng, t.src_dtype);
        std::memcpy(&r.source[i], &bits, 2);
      }
      t.src = r.source.data();
      r.num_blocks = plan::NumBlocks(t);
      CheckOnDevice(r, "block " + std::to_string(block[0]) + " x " + std::to_string(block[1]) +
                           (transposed ? ", transposed" : ""));
    }
  }
}

// Copies a requantized tile's FP8 buffer and scale buffer to the device and requantizes it there.
void CheckRequantOnDevice(const testing::RandomRequantTile& r, const std::string& what) {
  const QuantShape s = internal::QuantShapeOf(r.tile, &r.fp8);
  std::vector<uint8_t> want_out, want_scales;
  testing::RequantizeOnHost(r, want_out, want_scales);
  std::vector<float> want_amax = testing::RequantAmaxOnHost(r);
  void* bytes = nullptr;
  void* scales_dev = nullptr;
  ASSERT_EQ(cudaMalloc(&bytes, r.bytes.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&scales_dev, r.scales.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(bytes, r.bytes.data(), r.bytes.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(scales_dev, r.scales.data(), r.scales.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  const uint8_t* src = static_cast<const uint8_t*>(bytes) + (r.tile.src - r.bytes.data());
  const uint8_t* src_scales =
      static_cast<const uint8_t*>(scales_dev) + (r.fp8.scales - r.scales.data());
  auto quantizer = DeviceQuantizer::Create(s);
  ASSERT_TRUE(quantizer.ok()) << quantizer.status();
  std::vector<uint8_t> out(want_out.size(), 0xA5), scales(want_scales.size(), 0xA5);
  ASSERT_TRUE((*quantizer)->Quantize(src, out.data(), scales.data(), nullptr, src_scales).ok())
      << what;
  EXPECT_EQ(out, want_out) << what;
  EXPECT_EQ(scales, want_scales) << what;
  std::vector<float> amax(want_amax.size(), -1.0f);
  ASSERT_TRUE((*quantizer)->Amax(src, amax.data(), src_scales).ok()) << what;
  EXPECT_EQ(0, std::memcmp(amax.data(), want_amax.data(), amax.size() * 4)) << what;
  for (float& a : want_amax) a *= 2;
  testing::RequantizeOnHost(r, want_out, want_scales, want_amax.data());
  ASSERT_TRUE(
      (*quantizer)->Quantize(src, out.data(), scales.data(), want_amax.data(), src_scales).ok());
  EXPECT_EQ(out, want_out) << what << " with given amaxes";
  EXPECT_EQ(scales, want_scales) << what << " with given amaxes";
  cudaFree(bytes);
  cudaFree(scales_dev);
}

TEST(QuantKernelTest, RequantizedFp8TilesEqualDequantizeTileThenQuantizeTile) {
  SKIP_WITHOUT_GPU();
  using plan::QuantScheme;
  const QuantScheme schemes[] = {QuantScheme::kBlock, QuantScheme::kChannel, QuantScheme::kTensor,
                                 QuantScheme::kMx};
  std::mt19937_64 rng(37);
  for (const QuantScheme src : schemes) {
    for (const QuantScheme dst : schemes) {
      for (int i = 0; i < 40; ++i) {
        CheckRequantOnDevice(testing::MakeRandomRequantTile(rng, src, dst),
                             "scheme " + std::to_string(static_cast<int>(src)) + " -> " +
                                 std::to_string(static_cast<int>(dst)) + ", tile " +
                                 std::to_string(i));
        if (HasFatalFailure()) return;
      }
    }
  }
  // One large tile: 1000 x 1100 e4m3 with 128 x 128 fp32-scaled source blocks, transposed,
  // into MX e5m2 rows of 32 (many warps per block, blocks that straddle warps).
  testing::RandomRequantTile r;
  r.qs.dtype = plan::DType::kFp8E4M3;
  r.qs.src_scheme = QuantScheme::kBlock;
  r.qs.src_block = {128, 128};
  r.shape = {1000, 1100};
  r.box.ndim = 2;
  r.box.hi = {1000, 1100};
  r.qs.src.view = plan::View{0, {1, 1000}};
  r.qs.src.has_view = true;
  r.qs.src_scales.view = plan::View{0, {}};  // Row-major over 8 x 9 blocks.
  r.bytes.resize(1000 * 1100);
  for (uint8_t& b : r.bytes) b = static_cast<uint8_t>(rng());
  r.scales.resize(8 * 9 * 4);
  for (size_t i = 0; i < 72; ++i) {
    const uint32_t v = testing::RandomSourceScale(rng, false);
    std::memcpy(&r.scales[4 * i], &v, 4);
  }
  plan::QuantTile& t = r.tile;
  t.src_dtype = r.qs.dtype;
  t.ndim = 2;
  t.extent[0] = 1000;
  t.extent[1] = 1100;
  t.src_strides[0] = 1;
  t.src_strides[1] = 1000;
  t.block[0] = 1;
  t.block[1] = 32;
  t.arith = plan::QuantArith::kMx;
  t.format = quant::Fp8Format::kE5M2;
  t.src = r.bytes.data();
  r.fp8 = plan::DequantSourceOf(r.qs, r.box, r.scales.data());
  CheckRequantOnDevice(r, "1000 x 1100, 128 x 128 source blocks into MX");
}

}  // namespace
}  // namespace reshard::cuda
