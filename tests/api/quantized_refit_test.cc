// Quantized destinations through real refits (issue 13, docs/quantization.md): six forked ranks
// refit a spec with every scheme (block, mx, channel, tensor) and both FP8 formats from bf16, fp16
// and fp32 sources over shared memory and tcp, three of them from source tiles that share blocks
// (the amax exchange runs first); every destination element and scale must equal what the
// in-process reference (plan::ExpectQuantized, the quantizer the ml_dtypes test checks) computes
// from the whole tensor, bit for bit, in each of three refits. Two sources already hold FP8:
// one with the destination's scheme (bytes and scales move as they are: checked like plain
// tensors), one with MX scales into channel scales (dequantized and quantized again, after the
// amax exchange of its column shards).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "reshard/reshard.h"
#include "src/plan/fill.h"
#include "src/plan/plan.h"
#include "src/plan/quant_spec.h"
#include "src/plan/spec_json.h"
#include "src/plan/tiling.h"
#include "src/rendezvous/file_store.h"
#include "tests/api/forked_ranks.h"
#include "tests/testing/multiprocess.h"

#if RESHARD_HAVE_CUDA_KERNELS
#include <cuda_runtime_api.h>
#endif

namespace reshard {
namespace {

using forked::Callbacks;
using forked::Transport;

std::string StoreDir(const std::string& tag) { return forked::StoreDir("quant", tag); }

// Sources on ranks 0-1, destinations on 2-5 (two domains of two). "t" is replicated on the
// source and its one scale replicated on every destination (fan-out); "plain" is not quantized.
constexpr char kSpec[] = R"json({"topology": {"ranks_per_domain": 2}, "tensors": [
  {"name": "w", "dtype": "bf16", "shape": [512, 1024],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(1)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "block", "block": [128, 128]}}},
  {"name": "v", "dtype": "fp32", "shape": [256, 128],
   "src": {"mesh": [0, 1], "placements": ["S(1)"]},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(0)"], "dtype": "fp8e5m2",
           "quant": {"scheme": "mx", "block": [1, 32]}}},
  {"name": "c", "dtype": "fp16", "shape": [64, 200],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(1)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "channel"}, "scale_buffer": "scales", "scale_view": {"offset": 8}}},
  {"name": "t", "dtype": "bf16", "shape": [100, 30],
   "src": {"mesh": [0, 1], "placements": ["R"]},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(0)"], "dtype": "fp8e5m2",
           "quant": {"scheme": "tensor"}}},
  {"name": "plain", "dtype": "bf16", "shape": [64, 64],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(1)"]}},
  {"name": "channel_cut", "dtype": "bf16", "shape": [64, 200],
   "src": {"mesh": [0, 1], "placements": ["S(1)"]},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(0)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "channel"}}},
  {"name": "tensor_cut", "dtype": "fp32", "shape": [30, 50],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(1)"], "dtype": "fp8e5m2",
           "quant": {"scheme": "tensor"}}},
  {"name": "mx_cut", "dtype": "fp16", "shape": [48, 20],
   "src": {"mesh": [0, 1], "placements": ["S(1)"]},
   "dst": {"mesh": [2, 3], "placements": ["S(0)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "mx"}}},
  {"name": "fp8_same", "dtype": "bf16", "shape": [256, 512],
   "src": {"mesh": [0, 1], "placements": ["S(0)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "block", "block": [128, 128]}, "scale_buffer": "src_scales",
           "scale_view": {"offset": 3}},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(1)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "block", "block": [128, 128]}}},
  {"name": "fp8_requant", "dtype": "bf16", "shape": [64, 256],
   "src": {"mesh": [0, 1], "placements": ["S(1)"], "dtype": "fp8e5m2",
           "quant": {"scheme": "mx", "block": [1, 32]}, "scale_buffer": "src_mx_scales",
           "scale_view": {"offset": 40}},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(0)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "channel"}}}]})json";
constexpr int kWorld = 6;
constexpr uint8_t kPoison = 0xA5;

// `rank`'s tile of `layout`, or nullopt.
std::optional<plan::Box> TileOf(const plan::Layout& layout, const std::vector<int64_t>& shape,
                                int32_t rank) {
  const plan::TileGrid grid(layout, shape);
  const auto cell = grid.CellOfRank(rank);
  if (!cell) return std::nullopt;
  return grid.CellBox(*cell);
}

using Memory = std::map<std::pair<plan::Side, std::string>, std::vector<uint8_t>>;

// This rank's sources for refit `step`: plain tensors as usual, quantized ones (and FP8 sources
// with their scales) with real numbers and specials.
void FillSources(const plan::RefitSpec& lowered, int32_t rank, uint64_t step, Memory& memory) {
  for (size_t t = 0; t < lowered.tensors.size(); ++t) {
    const plan::TensorSpec& ts = lowered.tensors[t];
    if (absl::StartsWith(ts.src_buffer(), plan::kReservedBufferPrefix)) continue;
    if (auto box = TileOf(ts.src, ts.shape, rank)) {
      plan::FillTile(lowered, t, plan::Side::kSrc, *box, step,
                     memory.at({plan::Side::kSrc, ts.src_buffer()}).data());
    }
  }
  for (size_t q = 0; q < lowered.quantized_sources.size(); ++q) {
    const plan::QuantizedSource& qs = lowered.quantized_sources[q];
    if (auto box = TileOf(qs.src, lowered.tensors[qs.tensor].shape, rank)) {
      uint8_t* scales =
          qs.requantized() ? memory.at({plan::Side::kSrc, qs.src_scales.buffer}).data() : nullptr;
      plan::FillQuantizedSourceTile(lowered, q, *box, step,
                                    memory.at({plan::Side::kSrc, qs.src.buffer}).data(), scales);
    }
  }
}

// This rank's destinations after refit `step`: quantized tensors and scales against the
// reference, the rest exact. The number of elements checked, or the first difference.
absl::StatusOr<int64_t> VerifyDestinations(const plan::RefitSpec& lowered, int32_t rank,
                                           uint64_t step, const Memory& memory) {
  std::vector<plan::QuantizedExpectation> expected;
  for (size_t q = 0; q < lowered.quantized_sources.size(); ++q) {
    expected.push_back(plan::ExpectQuantized(lowered, q, step));
  }
  int64_t checked = 0;
  for (size_t t = 0; t < lowered.tensors.size(); ++t) {
    const plan::TensorSpec& ts = lowered.tensors[t];
    auto box = TileOf(ts.dst, ts.shape, rank);
    if (!box) continue;
    const uint8_t* buffer = memory.at({plan::Side::kDst, ts.dst_buffer()}).data();
    const std::vector<uint8_t>* want = nullptr;
    for (size_t q = 0; q < lowered.quantized_sources.size(); ++q) {
      if (lowered.quantized_sources[q].tensor == t) want = &expected[q].elements;
      if (lowered.quantized_sources[q].scale_tensor == t) want = &expected[q].scales;
    }
    const absl::Status v =
        want != nullptr ? plan::VerifyTileAgainst(lowered, t, *box, rank, buffer, want->data())
                        : plan::VerifyTile(lowered, t, *box, step, rank, buffer);
    if (!v.ok()) return absl::Status(v.code(), absl::StrCat("refit ", step, ": ", v.message()));
    checked += box->NumElements();
  }
  return checked;
}

class QuantizedRefitTest : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizedRefitTest, ElementsAndScalesMatchTheReferenceBitForBit) {
  const std::string transport = GetParam();
  auto parsed = plan::ParseSpecJson(kSpec);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto lowered_or = plan::LowerQuantization(std::make_shared<const plan::RefitSpec>(*parsed));
  ASSERT_TRUE(lowered_or.ok()) << lowered_or.status();
  const std::shared_ptr<const plan::RefitSpec> lowered = *lowered_or;
  // fp8_same moves as it is (plain tensors); fp8_requant is dequantized and quantized again.
  ASSERT_EQ(lowered->quantized_sources.size(), 8u);
  ASSERT_TRUE(lowered->quantized_sources[7].requantized());
  ASSERT_NE(lowered->amax_exchange, nullptr);  // The *_cut tensors share blocks across sources.
  // The internal buffers (FP8 bytes and fp32 scales) each source rank holds.
  auto plan = plan::BuildPlan(lowered);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t internal_bytes[2] = {0, 0};
  for (int32_t r = 0; r < 2; ++r) {
    const std::vector<int64_t> bytes = plan->BufferBytes(r);
    for (size_t b = 0; b < bytes.size(); ++b) {
      if (plan->buffers()[b].internal) internal_bytes[r] += bytes[b];
    }
  }
  ASSERT_GT(internal_bytes[0], 0);
  const std::string dir = StoreDir(transport);
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(kWorld),
      [&](int32_t rank) {
        auto store = rendezvous::FileStore::Open(dir);
        CHILD_EXPECT(store.ok(), store.status().ToString());
        auto comm = Communicator::FromCallbacks(Callbacks(store->get()), rank, kWorld);
        CHILD_EXPECT(comm.ok(), comm.status().ToString());
        auto spec = RefitSpec::FromJson(kSpec);
        CHILD_EXPECT(spec.ok(), spec.status().ToString());
        auto reqs = spec->LocalBuffers(rank);
        CHILD_EXPECT(reqs.ok(), reqs.status().ToString());
        Memory memory;
        LocalBuffers views;
        for (const BufferRequirement& r : *reqs) {
          CHILD_EXPECT(!absl::StartsWith(r.name, plan::kReservedBufferPrefix), r.name);
          const plan::Side side = r.side == Side::kSource ? plan::Side::kSrc : plan::Side::kDst;
          auto& bytes = memory[{side, r.name}];
          bytes.assign(static_cast<size_t>(r.bytes), kPoison);
          views.Add(r.side, r.name, Buffer{bytes.data(), r.bytes});
        }
        HandleOptions options;
        options.setup_timeout = absl::Seconds(30);
        auto handle = RefitHandle::Create(*comm, *spec, std::move(views), options);
        CHILD_EXPECT(handle.ok(), handle.status().ToString());
        for (uint64_t step = 1; step <= 3; ++step) {
          FillSources(*lowered, rank, step, memory);
          for (auto& [key, bytes] : memory) {
            if (key.first == plan::Side::kDst) std::fill(bytes.begin(), bytes.end(), kPoison);
          }
          const absl::Status st = handle->Execute(absl::Now() + absl::Seconds(30));
          CHILD_EXPECT(st.ok(), st.ToString());
          const absl::StatusOr<int64_t> checked =
              VerifyDestinations(*lowered, rank, step, memory);
          CHILD_EXPECT(checked.ok(), checked.status().ToString());
          if (rank >= 2) CHILD_EXPECT(*checked > 0);
          // Stats: sources quantize and exchange amaxes, holding at least the internal FP8 and
          // scale buffers; destinations do neither.
          const Stats& stats = handle->stats();
          if (rank < 2) {
            CHILD_EXPECT(stats.quantize_seconds > 0 && stats.amax_exchange_seconds > 0,
                         absl::StrCat(stats.quantize_seconds, " s, ", stats.amax_exchange_seconds,
                                      " s"));
            CHILD_EXPECT(stats.quantize_buffer_bytes >= internal_bytes[rank],
                         absl::StrCat(stats.quantize_buffer_bytes, " < ", internal_bytes[rank]));
          } else {
            CHILD_EXPECT(stats.quantize_seconds == 0 && stats.quantize_buffer_bytes == 0);
          }
        }
        return 0;
      },
      Transport(transport));
  for (int32_t r = 0; r < kWorld; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Transports, QuantizedRefitTest, ::testing::Values("sm", "tcp"));

// Sources in GPU memory (label gpu: it skips without a device): the CUDA kernels quantize them
// (src/cuda/quantize.h) into the refit's host buffers; a matching FP8 source is a plain copy,
// staged like any GPU buffer; requantized FP8 sources (elements and scales in GPU memory) are
// dequantized by the same kernels as they read them, one through the amax exchange (MX column
// shards into channel scales) and one without (128 x 128 fp32 scales with a scale view into MX
// e5m2). The same reference, bit for bit, over shared memory.
constexpr char kCudaSpec[] = R"json({"topology": {"ranks_per_domain": 2}, "tensors": [
  {"name": "w", "dtype": "bf16", "shape": [512, 1024],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(1)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "block", "block": [128, 128]}}},
  {"name": "v", "dtype": "fp32", "shape": [256, 128],
   "src": {"mesh": [0, 1], "placements": ["S(1)"], "view": {"offset": 0, "strides": [1, 256]}},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(0)"], "dtype": "fp8e5m2",
           "quant": {"scheme": "mx", "block": [1, 32]}}},
  {"name": "channel_cut", "dtype": "fp16", "shape": [64, 200],
   "src": {"mesh": [0, 1], "placements": ["S(1)"]},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(0)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "channel"}}},
  {"name": "fp8_same", "dtype": "bf16", "shape": [256, 512],
   "src": {"mesh": [0, 1], "placements": ["S(0)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "block", "block": [128, 128]}},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(1)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "block", "block": [128, 128]}}},
  {"name": "fp8_requant", "dtype": "bf16", "shape": [64, 256],
   "src": {"mesh": [0, 1], "placements": ["S(1)"], "dtype": "fp8e5m2",
           "quant": {"scheme": "mx", "block": [1, 32]}, "scale_buffer": "src_mx_scales",
           "scale_view": {"offset": 40}},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(0)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "channel"}}},
  {"name": "fp8_reblock", "dtype": "bf16", "shape": [256, 384],
   "src": {"mesh": [0, 1], "placements": ["S(0)"], "dtype": "fp8e4m3",
           "view": {"offset": 8, "strides": [1, 136]},
           "quant": {"scheme": "block", "block": [128, 128]}, "scale_buffer": "src_block_scales",
           "scale_view": {"offset": 3, "strides": [1, 2]}},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(1)"], "dtype": "fp8e5m2",
           "quant": {"scheme": "mx", "block": [1, 32]}}}]})json";

TEST(QuantizedCudaSourceTest, CudaSourcesQuantizeOnTheGpu) {
  std::string why;
  if (testing::ProbeCudaDevices(&why) == 0) GTEST_SKIP() << "no usable GPU: " << why;
#if RESHARD_HAVE_CUDA_KERNELS
  auto parsed = plan::ParseSpecJson(kCudaSpec);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto lowered_or = plan::LowerQuantization(std::make_shared<const plan::RefitSpec>(*parsed));
  ASSERT_TRUE(lowered_or.ok()) << lowered_or.status();
  const std::shared_ptr<const plan::RefitSpec> lowered = *lowered_or;
  const std::string dir = StoreDir("cuda");
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(kWorld),
      [&](int32_t rank) {
        auto store = rendezvous::FileStore::Open(dir);
        CHILD_EXPECT(store.ok(), store.status().ToString());
        auto comm = Communicator::FromCallbacks(Callbacks(store->get()), rank, kWorld);
        CHILD_EXPECT(comm.ok(), comm.status().ToString());
        auto spec = RefitSpec::FromJson(kCudaSpec);
        CHILD_EXPECT(spec.ok(), spec.status().ToString());
        auto reqs = spec->LocalBuffers(rank);
        CHILD_EXPECT(reqs.ok(), reqs.status().ToString());
        Memory memory;
        std::map<std::string, void*> device;  // Source buffers' device copies.
        LocalBuffers views;
        for (const BufferRequirement& r : *reqs) {
          const plan::Side side = r.side == Side::kSource ? plan::Side::kSrc : plan::Side::kDst;
          auto& bytes = memory[{side, r.name}];
          bytes.assign(static_cast<size_t>(r.bytes), kPoison);
          if (r.side == Side::kSource) {
            void* d = nullptr;
            CHILD_EXPECT(cudaMalloc(&d, std::max<int64_t>(r.bytes, 1)) == cudaSuccess);
            device[r.name] = d;
            views.Add(r.side, r.name, Buffer{d, r.bytes, MemoryKind::kCuda});
          } else {
            views.Add(r.side, r.name, Buffer{bytes.data(), r.bytes});
          }
        }
        HandleOptions options;
        options.setup_timeout = absl::Seconds(30);
        auto handle = RefitHandle::Create(*comm, *spec, std::move(views), options);
        CHILD_EXPECT(handle.ok(), handle.status().ToString());
        for (uint64_t step = 1; step <= 2; ++step) {
          FillSources(*lowered, rank, step, memory);
          for (auto& [key, bytes] : memory) {
            if (key.first == plan::Side::kDst) {
              std::fill(bytes.begin(), bytes.end(), kPoison);
            } else {
              CHILD_EXPECT(cudaMemcpy(device.at(key.second), bytes.data(), bytes.size(),
                                      cudaMemcpyHostToDevice) == cudaSuccess);
            }
          }
          const absl::Status st = handle->Execute(absl::Now() + absl::Seconds(30));
          CHILD_EXPECT(st.ok(), st.ToString());
          const absl::StatusOr<int64_t> checked =
              VerifyDestinations(*lowered, rank, step, memory);
          CHILD_EXPECT(checked.ok(), checked.status().ToString());
        }
        for (auto& [name, d] : device) cudaFree(d);
        return 0;
      },
      Transport("sm"));
  for (int32_t r = 0; r < kWorld; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
#else
  GTEST_SKIP() << "this build has no CUDA kernels";
#endif
}

}  // namespace
}  // namespace reshard
