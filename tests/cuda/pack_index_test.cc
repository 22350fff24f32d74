// The pack kernels' index arithmetic (pack_index.h) and batch builder (pack_batch.h), run on the
// host: every unit a kernel thread would move is moved here by the same functions, then the
// bytes are compared with the in-process executor's region copy (plan::ForEachRun + memcpy),
// over thousands of random regions (ranks 0..kMaxTensorDims, strides of any order, runs of 1..3
// bytes and of every alignment) and over the plans of the example specs, verified by LocalWorld.
#include "src/cuda/pack_index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "src/cuda/pack.h"
#include "src/cuda/pack_batch.h"
#include "src/cuda/runtime.h"
#include "src/plan/executor.h"
#include "src/plan/plan.h"
#include "src/plan/region.h"
#include "src/plan/spec_json.h"
#include "tests/cuda/pack_test_util.h"

namespace reshard::cuda {
namespace {

static_assert(kMaxPackDims >= plan::kMaxTensorDims,
              "a plan region's outer dims must fit a pack region");

constexpr uint64_t kSeed = 0x9ac4ba7c4ed5eedULL;
constexpr int kRandomRegions = 3000;

using testing::AppendRuns;
using testing::CopyRegionsOf;
using testing::ExecutorCopy;
using testing::HostCopy;
using testing::HostMove;
using testing::MakeRandomBatch;
using testing::MakeRandomRegion;
using testing::RandomBatch;
using testing::RandomRegion;
using testing::Rng;
using testing::SideOf;

// Every unit's addresses are multiples of its width (so base pointers aligned as the batch
// assumed give aligned vector accesses), and the width never exceeds those base alignments.
void ExpectAlignedUnits(const PackBatch& batch) {
  for (const PackEntry& e : batch.entries) {
    ASSERT_TRUE(e.width == 1 || e.width == 2 || e.width == 4 || e.width == 8 || e.width == 16);
    ASSERT_LE(e.width, batch.strided_base_align);
    ASSERT_LE(e.width, batch.packed_base_align);
    for (uint64_t k = 0; k < e.units; k += 1 + e.units / 64) {
      const UnitAddress a = LocatePackUnit(e, k);
      ASSERT_EQ(a.strided_offset % e.width, 0);
      ASSERT_EQ(a.packed_offset % e.width, 0);
    }
  }
}

// Random regions, batched in groups of random size over one strided source buffer, one stream
// and one destination buffer (each region in its own slice at an unaligned base): pack must
// yield the runs in order, unpack must leave the destination byte for byte as the executor's
// copy does (including the poison between runs).
TEST(PackIndexTest, RandomRegionsMatchTheExecutorCopy) {
  Rng rng(kSeed);
  int regions_done = 0, batches = 0;
  uint64_t units = 0;
  int64_t widths[17] = {};
  while (regions_done < kRandomRegions) {
    const RandomBatch c = MakeRandomBatch(rng, 40);
    const int group = static_cast<int>(c.regions.size());
    const auto& [regions, from_base, to_base, from_size, to_size, options, from_side, to_side] = c;
    absl::StatusOr<PackBatch> pack = BuildPackBatch(from_side, options);
    absl::StatusOr<PackBatch> unpack = BuildPackBatch(to_side, options);
    ASSERT_TRUE(pack.ok()) << pack.status();
    ASSERT_TRUE(unpack.ok()) << unpack.status();
    ASSERT_EQ(pack->packed_offsets, unpack->packed_offsets);
    ASSERT_EQ(pack->packed_end, unpack->packed_end);
    ExpectAlignedUnits(*pack);
    ExpectAlignedUnits(*unpack);

    std::vector<uint8_t> source(from_size);
    for (auto& b : source) b = static_cast<uint8_t>(rng.Next());
    std::vector<uint8_t> expected(to_size, 0xA5), ours(to_size, 0xA5);
    std::vector<uint8_t> expected_stream(pack->packed_end, 0x5A);
    std::vector<uint8_t> stream(pack->packed_end, 0x5A);
    for (int i = 0; i < group; ++i) {
      const auto& rr = regions[i];
      ExecutorCopy(rr.region, rr.dims.data(), source.data() + from_base[i],
                   expected.data() + to_base[i]);
      AppendRuns(rr.region, rr.dims.data(), source.data(), from_base[i],
                 expected_stream.data() + pack->packed_offsets[i]);
    }
    ASSERT_TRUE(HostMove(*pack, true, source.data(), stream.data()));
    ASSERT_EQ(stream, expected_stream) << "pack, batch " << batches;
    ASSERT_TRUE(HostMove(*unpack, false, ours.data(), stream.data()));
    ASSERT_EQ(ours, expected) << "unpack, batch " << batches;

    for (const PackEntry& e : pack->entries) widths[e.width] += 1;
    units += pack->total_units;
    regions_done += group;
    ++batches;
  }
  // The random cases reach every width, so every vector path of the kernels has a host twin.
  for (int w : {1, 2, 4, 8, 16})
    EXPECT_GT(widths[w], 0) << "no region moved in " << w << "-byte units";
  std::printf("%d regions in %d batches, %llu units; widths 1:%lld 2:%lld 4:%lld 8:%lld 16:%lld\n",
              regions_done, batches, static_cast<unsigned long long>(units),
              static_cast<long long>(widths[1]), static_cast<long long>(widths[2]),
              static_cast<long long>(widths[4]), static_cast<long long>(widths[8]),
              static_cast<long long>(widths[16]));
}

// The 32-bit division path and the 64-bit one agree on every unit of random regions.
TEST(PackIndexTest, ThirtyTwoAndSixtyFourBitDivisionsAgree) {
  Rng rng(kSeed + 1);
  for (int i = 0; i < 500; ++i) {
    RandomRegion rr = MakeRandomRegion(rng);
    const StridedRegion side = SideOf(rr.region, rr.dims.data(), true);
    absl::StatusOr<PackBatch> batch = BuildPackBatch({&side, 1});
    ASSERT_TRUE(batch.ok()) << batch.status();
    for (const PackEntry& e : batch->entries) {
      for (uint64_t k = 0; k < e.units; ++k) {
        const UnitAddress a = LocatePackUnitAs<uint32_t>(e, static_cast<uint32_t>(k));
        const UnitAddress b = LocatePackUnitAs<uint64_t>(e, k);
        ASSERT_EQ(a.strided_offset, b.strided_offset);
        ASSERT_EQ(a.packed_offset, b.packed_offset);
      }
    }
  }
}

// Widths are the largest the run, offsets, strides and base alignments allow.
TEST(PackIndexTest, WidthIsTheLargestTheRegionAllows) {
  const auto width = [](StridedRegion r, PackBatchOptions o = {}) {
    absl::StatusOr<PackBatch> b = BuildPackBatch({&r, 1}, o);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() && !b->entries.empty() ? b->entries[0].width : -1;
  };
  StridedRegion r;
  r.run_bytes = 64;
  r.ndims = 1;
  r.count[0] = 10;
  r.stride[0] = 128;
  EXPECT_EQ(width(r), 16);
  r.offset = 8;
  EXPECT_EQ(width(r), 8);
  r.offset = 0;
  r.stride[0] = 132;
  EXPECT_EQ(width(r), 4);
  r.count[0] = 1;  // A dim that never steps does not limit the width.
  EXPECT_EQ(width(r), 16);
  r.count[0] = 10;
  r.stride[0] = 128;
  r.run_bytes = 2;
  EXPECT_EQ(width(r), 2);
  r.run_bytes = 3;
  EXPECT_EQ(width(r), 1);
  r.run_bytes = 64;
  PackBatchOptions o;
  o.packed_base_align = 4;
  EXPECT_EQ(width(r, o), 4);
  o.packed_base_align = 16;
  o.packed_begin = 2;
  EXPECT_EQ(width(r, o), 2);
  o.region_align = 16;  // The region then starts at stream offset 16.
  EXPECT_EQ(width(r, o), 16);
}

// Empty regions hold no entry but keep their place in the stream; the search skips them.
TEST(PackIndexTest, EmptyRegionsAreDroppedAndKeepTheirOffsets) {
  StridedRegion a, empty, b;
  a.run_bytes = 5;
  empty.run_bytes = 8;
  empty.ndims = 1;
  empty.count[0] = 0;
  b.run_bytes = 7;
  const std::vector<StridedRegion> regions = {empty, a, empty, empty, b, empty};
  absl::StatusOr<PackBatch> batch = BuildPackBatch(regions);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->entries.size(), 2u);
  EXPECT_EQ(batch->packed_offsets, (std::vector<int64_t>{0, 0, 5, 5, 5, 12}));
  EXPECT_EQ(batch->bytes, 12);
  EXPECT_EQ(batch->packed_end, 12);
  EXPECT_EQ(batch->total_units, 12u);
  for (uint64_t u = 0; u < 12; ++u) {
    EXPECT_EQ(FindPackEntry(batch->entries.data(), 0, 1, u), u < 5 ? 0 : 1) << u;
  }
  absl::StatusOr<PackBatch> none = BuildPackBatch({&empty, 1});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->entries.empty());
  EXPECT_EQ(none->total_units, 0u);
}

TEST(PackIndexTest, InvalidBatchesAreRejected) {
  StridedRegion r;
  r.run_bytes = 4;
  PackBatchOptions o;
  o.region_align = 3;
  EXPECT_EQ(BuildPackBatch({&r, 1}, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.packed_begin = -1;
  EXPECT_EQ(BuildPackBatch({&r, 1}, o).status().code(), absl::StatusCode::kInvalidArgument);
  StridedRegion deep = r;
  deep.ndims = kMaxPackDims + 1;
  EXPECT_EQ(BuildPackBatch({&deep, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  StridedRegion negative = r;
  negative.ndims = 1;
  negative.count[0] = -2;
  EXPECT_EQ(BuildPackBatch({&negative, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  StridedRegion huge = r;
  huge.run_bytes = int64_t{1} << 40;
  huge.ndims = 2;
  huge.count[0] = huge.count[1] = int64_t{1} << 20;
  EXPECT_EQ(BuildPackBatch({&huge, 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Without CUDA in the build, or without a device, the kernels say so instead of crashing; with
// a device the batch is created (cuda_pack_kernel_test then runs it).
TEST(PackIndexTest, DeviceBatchIsCreatedExactlyWhenADeviceIsPresent) {
  std::string why;
  const bool device_present = CudaDeviceCount(&why) > 0;
  StridedRegion r;
  r.run_bytes = 16;
  absl::StatusOr<PackBatch> batch = BuildPackBatch({&r, 1});
  ASSERT_TRUE(batch.ok()) << batch.status();
  absl::StatusOr<std::unique_ptr<DevicePackBatch>> device = DevicePackBatch::Create(*batch);
  if (device_present) {
    EXPECT_TRUE(device.ok()) << device.status();
  } else {
    EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition) << device.status();
  }
}

// Real plans: every transfer of the example specs' plans is packed from its source buffer and
// unpacked into its destination buffer through the index arithmetic (one batch per transfer,
// fan-outs after the transfers they depend on, as the executor runs them); the in-process
// executor's verification then checks every destination element and the untouched poison.
// The specs: rows -> columns, fused q/k/v views (strided tiles inside one buffer), uneven nested
// shards, and a domain with fan-out copies (the small ones: verification is per element, and
// the sanitizer trees run this test too).
TEST(PackIndexTest, ExampleSpecPlansVerifyInProcess) {
  const std::string root = RESHARD_SOURCE_DIR;
  for (const std::string& path :
       {root + "/examples/specs/fig1-rows-to-cols.json", root + "/examples/specs/fused-qkv.json",
        root + "/examples/specs/uneven-nested.json",
        root + "/tests/nvlink/specs/tp4-to-tp2dp2.json"}) {
    SCOPED_TRACE(path);
    absl::StatusOr<plan::RefitSpec> spec = plan::LoadSpecFile(path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<plan::Plan> plan =
        plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*std::move(spec)));
    ASSERT_TRUE(plan.ok()) << plan.status();
    absl::StatusOr<plan::LocalWorld> world = plan::LocalWorld::Create(*plan, int64_t{1} << 30);
    ASSERT_TRUE(world.ok()) << world.status();
    constexpr uint64_t kEpoch = 3;
    world->Prepare(kEpoch);
    std::vector<uint8_t> stream;
    for (const plan::Transfer& tr : plan->transfers()) {
      const plan::Region& r = plan->region(tr.region);
      const plan::RegionDim* dims = plan->region_dims(r);
      const StridedRegion from = SideOf(r, dims, true), to = SideOf(r, dims, false);
      absl::StatusOr<PackBatch> pack = BuildPackBatch({&from, 1});
      absl::StatusOr<PackBatch> unpack = BuildPackBatch({&to, 1});
      ASSERT_TRUE(pack.ok() && unpack.ok());
      stream.assign(pack->packed_end, 0);
      ASSERT_TRUE(HostMove(*pack, true,
                           world->buffer(tr.from_rank, plan->buffer_of(tr.tensor, tr.from_side)),
                           stream.data()));
      ASSERT_TRUE(HostMove(*unpack, false,
                           world->buffer(tr.to_rank, plan->buffer_of(tr.tensor, tr.to_side)),
                           stream.data()));
    }
    const absl::Status verified = world->Verify(kEpoch);
    EXPECT_TRUE(verified.ok()) << verified;
  }
}

// The strided-to-strided copy (CopyEntry): random batches copied unit by unit through
// LocateCopyUnit leave the destination exactly as the executor's copy does, poison included.
TEST(CopyIndexTest, RandomRegionsMatchTheExecutorCopy) {
  Rng rng(kSeed + 7);
  int regions_done = 0;
  int64_t widths[17] = {};
  while (regions_done < kRandomRegions) {
    const RandomBatch c = MakeRandomBatch(rng, 40);
    const std::vector<CopyRegion> regions = CopyRegionsOf(c);
    CopyBatchOptions o;
    o.from_base_align = c.options.strided_base_align;
    o.to_base_align = c.options.packed_base_align;
    absl::StatusOr<CopyBatch> batch = BuildCopyBatch(regions, o);
    ASSERT_TRUE(batch.ok()) << batch.status();
    std::vector<uint8_t> source(c.from_size);
    for (auto& b : source) b = static_cast<uint8_t>(rng.Next());
    std::vector<uint8_t> expected(c.to_size, 0xA5), ours(c.to_size, 0xA5);
    for (size_t i = 0; i < c.regions.size(); ++i) {
      ExecutorCopy(c.regions[i].region, c.regions[i].dims.data(), source.data() + c.from_base[i],
                   expected.data() + c.to_base[i]);
    }
    ASSERT_TRUE(HostCopy(*batch, source.data(), ours.data()));
    ASSERT_EQ(ours, expected) << "after " << regions_done << " regions";
    for (const CopyEntry& e : batch->entries) {
      ASSERT_LE(e.width, o.from_base_align);
      ASSERT_LE(e.width, o.to_base_align);
      for (uint64_t k = 0; k < e.units; k += 1 + e.units / 16) {
        const CopyUnitAddress a = LocateCopyUnit(e, k);
        ASSERT_EQ(a.from_offset % e.width, 0);
        ASSERT_EQ(a.to_offset % e.width, 0);
        const CopyUnitAddress b = LocateCopyUnitAs<uint64_t>(e, k);
        ASSERT_EQ(a.from_offset, b.from_offset);
        ASSERT_EQ(a.to_offset, b.to_offset);
      }
      widths[e.width] += 1;
    }
    regions_done += static_cast<int>(c.regions.size());
  }
  for (int w : {1, 2, 4, 8, 16})
    EXPECT_GT(widths[w], 0) << "no region copied in " << w << "-byte units";
}

TEST(CopyIndexTest, InvalidBatchesAreRejectedAndEmptyRegionsDropped) {
  CopyRegion r;
  r.run_bytes = 4;
  CopyBatchOptions o;
  o.to_base_align = 3;
  EXPECT_EQ(BuildCopyBatch({&r, 1}, o).status().code(), absl::StatusCode::kInvalidArgument);
  CopyRegion deep = r;
  deep.ndims = kMaxPackDims + 1;
  EXPECT_EQ(BuildCopyBatch({&deep, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  CopyRegion negative = r;
  negative.ndims = 1;
  negative.count[0] = -1;
  EXPECT_EQ(BuildCopyBatch({&negative, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  CopyRegion huge = r;
  huge.run_bytes = int64_t{1} << 40;
  huge.ndims = 2;
  huge.count[0] = huge.count[1] = int64_t{1} << 20;
  EXPECT_EQ(BuildCopyBatch({&huge, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  CopyRegion empty = r;
  empty.ndims = 1;
  empty.count[0] = 0;
  const std::vector<CopyRegion> regions = {empty, r, empty};
  absl::StatusOr<CopyBatch> batch = BuildCopyBatch(regions);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->entries.size(), 1u);
  EXPECT_EQ(batch->bytes, 4);
  EXPECT_EQ(batch->total_units, 1u);
  EXPECT_EQ(batch->entries[0].width, 4);
}

// As for DevicePackBatch: the batch sets exist exactly when a device does.
TEST(CopyIndexTest, DeviceBatchSetsAreCreatedExactlyWhenADeviceIsPresent) {
  std::string why;
  const bool device_present = CudaDeviceCount(&why) > 0;
  CopyRegion r;
  r.run_bytes = 16;
  absl::StatusOr<CopyBatch> copy = BuildCopyBatch({&r, 1});
  StridedRegion s;
  s.run_bytes = 16;
  absl::StatusOr<PackBatch> pack = BuildPackBatch({&s, 1});
  ASSERT_TRUE(copy.ok() && pack.ok());
  absl::StatusOr<std::unique_ptr<DeviceCopyBatches>> copies = DeviceCopyBatches::Create({*copy});
  absl::StatusOr<std::unique_ptr<DevicePackBatches>> packs = DevicePackBatches::Create({*pack});
  if (device_present) {
    EXPECT_TRUE(copies.ok()) << copies.status();
    EXPECT_TRUE(packs.ok()) << packs.status();
  } else {
    EXPECT_EQ(copies.status().code(), absl::StatusCode::kFailedPrecondition) << copies.status();
    EXPECT_EQ(packs.status().code(), absl::StatusCode::kFailedPrecondition) << packs.status();
  }
}

}  // namespace
}  // namespace reshard::cuda
