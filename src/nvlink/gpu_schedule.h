// What the GPU fan-out backends launch, decided in plain C++ (no CUDA, no NCCL), so that every
// decision is tested on machines without a GPU by replaying it on host memory with the kernels'
// own index arithmetic (tests/nvlink/gpu_schedule_test.cc). Internal to src/nvlink.
//
// NCCL: the domain's fan-out edges are cut into batches of FanoutOptions::nccl_batch_edges
// edges (table order, the same on every rank). A batch runs as one or more *rounds*; a round is
// one ncclGroupStart/End in which every ordered pair of ranks with pieces in it exchanges one
// contiguous stream (one ncclSend, one ncclRecv). The sender packs every piece of the round into
// its device staging with one pack launch, the receiver unpacks its streams with one unpack
// launch. A batch whose streams fit the staging budget of each rank is one round; a larger one
// is cut into rounds (and regions larger than the budget into pieces) so that no rank's staging
// ever holds more than the budget. The rounds are a function of the table and the two options
// alone, so every rank derives the same ones (NCCL matches sends and receives in issue order).
//
// CUDA IPC: every edge is one copy call, chosen once per handle: cudaMemcpyAsync (contiguous),
// cudaMemcpy2DAsync / cudaMemcpy3DAsync (rows or slices of rows the copy engines take whole) or
// one launch of the strided-to-strided copy kernel (anything else, and narrow runs).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "src/cuda/pack_batch.h"
#include "src/nvlink/fanout.h"

namespace reshard::nvlink::internal {

// Pieces inside one stream start at multiples of this, so packed units can stay 16 bytes wide.
inline constexpr int64_t kStreamAlign = 16;
// The smallest staging budget accepted (FanoutOptions::gpu_staging_bytes).
inline constexpr int64_t kMinStagingBytes = 256;

// Edge `e`'s region with its dims inline.
cuda::CopyRegion CopyRegionOf(const FanoutTable& table, const FanoutEdge& e);

// Appends `r` cut into pieces of at most `max_bytes` (> 0) each, in run order: as many whole
// slices of the outermost dim as fit, else each slice cut the same way; a run longer than
// `max_bytes` is cut into parts of it. A region that fits is appended whole.
void SplitRegion(const cuda::CopyRegion& r, int64_t max_bytes, std::vector<cuda::CopyRegion>* out);

// One piece of a round: part of an edge's region, at `stream_offset` in the stream from the
// edge's sender to its receiver.
struct NcclPiece {
  uint32_t edge = 0;  // Table index.
  cuda::CopyRegion region;
  int64_t stream_offset = 0;
};

// One stream of a round: `bytes` (a multiple of kStreamAlign) from `from_rank` to `to_rank`.
struct NcclStreamSize {
  int32_t from_rank = 0;
  int32_t to_rank = 0;
  int64_t bytes = 0;
};

struct NcclRound {
  uint32_t batch = 0;
  std::vector<NcclPiece> pieces;        // Table order.
  std::vector<NcclStreamSize> streams;  // Sorted by (from_rank, to_rank).
};

// The domain's rounds, the same on every rank.
struct NcclSchedule {
  int32_t batch_edges = 1;
  int64_t staging_bytes = 0;  // The budget.
  uint32_t num_batches = 0;
  std::vector<NcclRound> rounds;  // By batch, then in issue order.
};

// InvalidArgument when `staging_bytes` is below kMinStagingBytes or not a multiple of
// kStreamAlign, or `batch_edges` < 1.
[[nodiscard]] absl::StatusOr<NcclSchedule> BuildNcclSchedule(const FanoutTable& table,
                                                             int32_t batch_edges,
                                                             int64_t staging_bytes);

// One stream of this rank in a round: with `peer`, at `staging_offset` in this rank's staging.
struct NcclStream {
  int32_t peer = 0;
  int64_t staging_offset = 0;
  int64_t bytes = 0;
};

// One round as this rank runs it: pack every send into staging (one launch), the group of sends
// and receives, unpack every receive (one launch). Staging holds the sends from offset 0 and the
// receives after them, peers in ascending order.
struct NcclRankRound {
  uint32_t round = 0;  // Index in NcclSchedule::rounds.
  std::vector<NcclStream> sends, recvs;
  cuda::PackBatch pack;    // Strided side: offsets from NcclRankProgram::from_base.
  cuda::PackBatch unpack;  // Strided side: offsets from NcclRankProgram::to_base.
};

struct NcclRankBatch {
  std::vector<uint32_t> sends, recvs;  // This rank's edges of the batch, table order.
  std::vector<NcclRankRound> rounds;   // Those with a stream of this rank.
};

// This rank's share of a schedule. A pack (unpack) launch reads (writes) several buffers of the
// rank through one base pointer: its regions' offsets are taken from the lowest buffer address
// the rank sends from (receives into), `from_base` (`to_base`), so that one launch covers every
// buffer (device memory shares one flat address space).
struct NcclRankProgram {
  std::vector<NcclRankBatch> batches;  // One per schedule batch.
  int64_t staging_bytes = 0;           // The most any round of this rank holds (<= budget).
  int64_t from_base = 0, to_base = 0;  // Addresses, as integers.
  int64_t rounds = 0;                  // Rounds with a stream of this rank.
  int64_t pieces = 0;                  // Pieces this rank packs or unpacks.
};

// `buffer_addresses[b]` is the address of this rank's plan buffer b (0 when it has none).
// InvalidArgument when an edge of this rank names a buffer without an address.
[[nodiscard]] absl::StatusOr<NcclRankProgram> BuildNcclRankProgram(
    const FanoutTable& table, const NcclSchedule& schedule, int32_t rank,
    const std::vector<int64_t>& buffer_addresses);

// CUDA IPC: how one edge is copied.
enum class GpuCopyMethod { kNothing, kMemcpy, kMemcpy2D, kMemcpy3D, kKernel };
const char* GpuCopyMethodName(GpuCopyMethod m);

// Runs narrower than this go to the copy kernel rather than the copy engines, which move a
// narrow row far below their bandwidth.
inline constexpr int64_t kMinCopyEngineRun = 512;

struct GpuCopy {
  GpuCopyMethod method = GpuCopyMethod::kNothing;
  // The region with dims of count 1 dropped and dims merged where both sides stay regular; a
  // kKernel copy launches exactly this.
  cuda::CopyRegion region;
  // kMemcpy*: width (bytes per row) x height rows x depth slices; row pitches; rows per slice
  // (the slice pitch is pitch * rows, as cudaPitchedPtr::ysize says).
  int64_t width = 0, height = 1, depth = 1;
  int64_t from_pitch = 0, to_pitch = 0;
  int64_t from_rows = 0, to_rows = 0;
};

// The copy for `r`; `kernel_only` (FanoutOptions::cuda_ipc_kernel_only) sends every non-empty
// region to the kernel.
GpuCopy ChooseGpuCopy(const cuda::CopyRegion& r, bool kernel_only);

// The largest power of two <= cuda::kMaxPackWidth dividing `address` (kMaxPackWidth for 0).
int64_t AddressAlignment(int64_t address);

}  // namespace reshard::nvlink::internal
