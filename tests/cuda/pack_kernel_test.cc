// The pack and unpack kernels on a device, against their host twin (the same index arithmetic,
// tests/cuda/pack_test_util.h), byte for byte. Every test skips without a usable GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "src/cuda/pack.h"
#include "src/cuda/pack_batch.h"
#include "src/cuda/runtime.h"
#include "tests/cuda/skip_without_gpu.h"
#include "tests/cuda/pack_test_util.h"

namespace reshard::cuda {
namespace {

using testing::CopyRegionsOf;
using testing::HostCopy;
using testing::HostMove;
using testing::MakeRandomBatch;
using testing::RandomBatch;
using testing::Rng;

#define ASSERT_CUDA(call)                                                      \
  do {                                                                         \
    const cudaError_t err_ = (call);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
  } while (0)

// Device memory that frees itself.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) {
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBytes() { cudaFree(ptr_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// Packs and unpacks one random batch on the device at bases aligned exactly as the batch
// assumed (and no more, where the allocation allows), comparing stream and destination with the
// host twin, then with the poison between runs intact.
void CheckBatch(const RandomBatch& c, Rng& rng, cudaStream_t stream) {
  absl::StatusOr<PackBatch> pack = BuildPackBatch(c.from_side, c.options);
  absl::StatusOr<PackBatch> unpack = BuildPackBatch(c.to_side, c.options);
  ASSERT_TRUE(pack.ok()) << pack.status();
  ASSERT_TRUE(unpack.ok()) << unpack.status();

  std::vector<uint8_t> source(c.from_size);
  for (auto& b : source) b = static_cast<uint8_t>(rng.Next());
  std::vector<uint8_t> host_stream(pack->packed_end, 0x5A), host_dest(c.to_size, 0xA5);
  ASSERT_TRUE(HostMove(*pack, true, source.data(), host_stream.data()));
  ASSERT_TRUE(HostMove(*unpack, false, host_dest.data(), host_stream.data()));

  // Each buffer starts `align` bytes into a 256-byte aligned allocation.
  const int64_t sa = c.options.strided_base_align, pa = c.options.packed_base_align;
  DeviceBytes src(c.from_size + 32), packed(pack->packed_end + 32), dst(c.to_size + 32);
  ASSERT_NE(src.get(), nullptr);
  ASSERT_NE(packed.get(), nullptr);
  ASSERT_NE(dst.get(), nullptr);
  uint8_t* d_src = src.get() + sa;
  uint8_t* d_packed = packed.get() + pa;
  uint8_t* d_dst = dst.get() + sa;
  ASSERT_CUDA(cudaMemcpy(d_src, source.data(), source.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(d_packed, 0x5A, pack->packed_end));
  ASSERT_CUDA(cudaMemset(d_dst, 0xA5, c.to_size));

  absl::StatusOr<std::unique_ptr<DevicePackBatch>> dpack = DevicePackBatch::Create(*pack);
  absl::StatusOr<std::unique_ptr<DevicePackBatch>> dunpack = DevicePackBatch::Create(*unpack);
  ASSERT_TRUE(dpack.ok()) << dpack.status();
  ASSERT_TRUE(dunpack.ok()) << dunpack.status();
  const absl::Status packed_ok = (*dpack)->Pack(d_src, d_packed, stream);
  ASSERT_TRUE(packed_ok.ok()) << packed_ok;
  const absl::Status unpacked_ok = (*dunpack)->Unpack(d_packed, d_dst, stream);
  ASSERT_TRUE(unpacked_ok.ok()) << unpacked_ok;
  ASSERT_CUDA(cudaStreamSynchronize(stream));

  std::vector<uint8_t> got_stream(pack->packed_end), got_dest(c.to_size);
  ASSERT_CUDA(cudaMemcpy(got_stream.data(), d_packed, got_stream.size(), cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(got_dest.data(), d_dst, got_dest.size(), cudaMemcpyDeviceToHost));
  ASSERT_EQ(got_stream, host_stream);
  ASSERT_EQ(got_dest, host_dest);
}

TEST(PackKernelTest, RandomBatchesMatchTheHostArithmetic) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Rng rng(0x6b7a11e5eedULL);
  int regions = 0;
  for (int b = 0; regions < 2000; ++b) {
    const RandomBatch c = MakeRandomBatch(rng, 60);
    regions += static_cast<int>(c.regions.size());
    SCOPED_TRACE(b);
    CheckBatch(c, rng, stream);
    if (HasFatalFailure()) break;
  }
  cudaStreamDestroy(stream);
}

// A batch larger than one pass of the grid (grid-stride tiles), mixing 4-byte runs with regions
// of 1..3-byte and 16-byte units, on the default stream.
TEST(PackKernelTest, LargeBatchCoversEveryTile) {
  SKIP_WITHOUT_GPU();
  RandomBatch c;
  const auto add = [&](int64_t run, int64_t count, int64_t from_stride) {
    StridedRegion from, to;
    from.offset = c.from_size;
    from.run_bytes = to.run_bytes = run;
    from.ndims = to.ndims = 1;
    from.count[0] = to.count[0] = count;
    from.stride[0] = from_stride;
    to.stride[0] = run;
    to.offset = c.to_size;
    c.from_size += from_stride * count + 16;
    c.to_size += run * count + 16;
    c.from_side.push_back(from);
    c.to_side.push_back(to);
  };
  add(4, int64_t{1} << 22, 8);     // 16 MiB of 4-byte runs, every other one.
  add(3, 100000, 5);               // 1-byte units.
  add(64, int64_t{1} << 18, 128);  // 16 MiB of 16-byte units.
  for (int i = 0; i < 1000; ++i) add(2 + i % 3, 1 + i % 7, 7);
  c.from_size += 16;
  c.to_size += 16;
  Rng rng(7);
  CheckBatch(c, rng, nullptr);
}

TEST(PackKernelTest, MisalignedBasesAreRejected) {
  SKIP_WITHOUT_GPU();
  StridedRegion r;
  r.run_bytes = 64;
  absl::StatusOr<PackBatch> batch = BuildPackBatch({&r, 1});
  ASSERT_TRUE(batch.ok()) << batch.status();
  absl::StatusOr<std::unique_ptr<DevicePackBatch>> device = DevicePackBatch::Create(*batch);
  ASSERT_TRUE(device.ok()) << device.status();
  DeviceBytes a(256), b(256);
  EXPECT_EQ((*device)->Pack(a.get() + 4, b.get(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*device)->Unpack(a.get(), b.get() + 8, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*device)->Pack(a.get(), b.get(), nullptr).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
}

// The strided-to-strided copy kernel: random batches, several uploaded at once
// (DeviceCopyBatches), each launched at bases aligned as built, against the host twin.
TEST(CopyKernelTest, RandomBatchesMatchTheHostArithmetic) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Rng rng(0xc0b711e5ULL);
  for (int round = 0; round < 20; ++round) {
    std::vector<RandomBatch> cases;
    std::vector<CopyBatch> batches;
    for (int i = 0; i < 8; ++i) {
      cases.push_back(MakeRandomBatch(rng, 40));
      CopyBatchOptions o;
      o.from_base_align = cases.back().options.strided_base_align;
      o.to_base_align = cases.back().options.packed_base_align;
      absl::StatusOr<CopyBatch> b = BuildCopyBatch(CopyRegionsOf(cases.back()), o);
      ASSERT_TRUE(b.ok()) << b.status();
      batches.push_back(*std::move(b));
    }
    absl::StatusOr<std::unique_ptr<DeviceCopyBatches>> device = DeviceCopyBatches::Create(batches);
    ASSERT_TRUE(device.ok()) << device.status();
    for (size_t i = 0; i < cases.size(); ++i) {
      const RandomBatch& c = cases[i];
      std::vector<uint8_t> source(c.from_size);
      for (auto& b : source) b = static_cast<uint8_t>(rng.Next());
      std::vector<uint8_t> host_dest(c.to_size, 0xA5);
      ASSERT_TRUE(HostCopy(batches[i], source.data(), host_dest.data()));
      DeviceBytes src(c.from_size + 32), dst(c.to_size + 32);
      ASSERT_NE(src.get(), nullptr);
      ASSERT_NE(dst.get(), nullptr);
      uint8_t* d_src = src.get() + batches[i].from_base_align;
      uint8_t* d_dst = dst.get() + batches[i].to_base_align;
      ASSERT_CUDA(cudaMemcpy(d_src, source.data(), source.size(), cudaMemcpyHostToDevice));
      ASSERT_CUDA(cudaMemset(d_dst, 0xA5, c.to_size));
      const absl::Status copied = (*device)->Copy(i, d_src, d_dst, stream);
      ASSERT_TRUE(copied.ok()) << copied;
      ASSERT_CUDA(cudaStreamSynchronize(stream));
      std::vector<uint8_t> got(c.to_size);
      ASSERT_CUDA(cudaMemcpy(got.data(), d_dst, got.size(), cudaMemcpyDeviceToHost));
      ASSERT_EQ(got, host_dest) << "round " << round << " batch " << i;
    }
  }
  cudaStreamDestroy(stream);
}

// Several pack batches in one upload (DevicePackBatches, what the NCCL fan-out launches): each
// packs and unpacks exactly as a DevicePackBatch of its own.
TEST(PackKernelTest, BatchSetPacksEachBatchAsItsOwn) {
  SKIP_WITHOUT_GPU();
  Rng rng(0x5e7ULL);
  std::vector<RandomBatch> cases;
  std::vector<PackBatch> packs;
  for (int i = 0; i < 12; ++i) {
    cases.push_back(MakeRandomBatch(rng, 30));
    absl::StatusOr<PackBatch> b = BuildPackBatch(cases.back().from_side, cases.back().options);
    ASSERT_TRUE(b.ok()) << b.status();
    packs.push_back(*std::move(b));
  }
  absl::StatusOr<std::unique_ptr<DevicePackBatches>> device = DevicePackBatches::Create(packs);
  ASSERT_TRUE(device.ok()) << device.status();
  ASSERT_EQ((*device)->size(), packs.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const RandomBatch& c = cases[i];
    std::vector<uint8_t> source(c.from_size);
    for (auto& b : source) b = static_cast<uint8_t>(rng.Next());
    std::vector<uint8_t> host_stream(packs[i].packed_end, 0x5A);
    ASSERT_TRUE(HostMove(packs[i], true, source.data(), host_stream.data()));
    DeviceBytes src(c.from_size + 32), packed(packs[i].packed_end + 32);
    uint8_t* d_src = src.get() + c.options.strided_base_align;
    uint8_t* d_packed = packed.get() + c.options.packed_base_align;
    ASSERT_CUDA(cudaMemcpy(d_src, source.data(), source.size(), cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemset(d_packed, 0x5A, packs[i].packed_end));
    const absl::Status ok = (*device)->Pack(i, d_src, d_packed, nullptr);
    ASSERT_TRUE(ok.ok()) << ok;
    std::vector<uint8_t> got(packs[i].packed_end);
    ASSERT_CUDA(cudaMemcpy(got.data(), d_packed, got.size(), cudaMemcpyDeviceToHost));
    ASSERT_EQ(got, host_stream) << "batch " << i;
  }
}

}  // namespace
}  // namespace reshard::cuda
