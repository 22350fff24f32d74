// The FP8 quantization kernels on a device (cuda::DeviceQuantizer) against plan::QuantizeTile and
// plan::BlockAmax, bit for bit: random tiles of every dtype, scheme and format (padded, permuted,
// reversed sources; NaN, Inf, subnormals, zeros), amaxes given as the amax exchange gives them,
// and a large tile per scheme that spreads blocks over many threads and warps. Every test skips
// without a usable GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/cuda/quantize.h"
#include "src/cuda/runtime.h"
#include "src/plan/quantize.h"
#include "tests/cuda/quant_test_util.h"

namespace reshard::cuda {
namespace {

#define SKIP_WITHOUT_GPU()                                                    \
  do {                                                                        \
    std::string why;                                                          \
    if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no usable GPU: " << why; \
  } while (0)

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

}  // namespace
}  // namespace reshard::cuda
