// The refit spec: every tensor's layout on the source (trainer) and destination (inference)
// side, and the topology that groups ranks into fast local domains. DESIGN §2 and §7.
//
// Placement semantics follow PyTorch DTensor: per mesh axis `R` (replicate), `S(d)` (shard
// tensor dim d) or `_S(d, k)` (torch's _StridedShard(d, split_factor=k), which FSDP2 + TP
// trainers produce). Uneven dims split like torch.chunk (ceil chunks, trailing shards smaller or
// empty); several mesh axes sharding one dim apply in mesh-axis order (docs/spec-format.md).
//
// A spec is plain data. Validate() checks everything that the planner relies on and returns
// InvalidArgument with one sentence naming the tensor and the field.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "src/plan/dtype.h"

namespace reshard::plan {

inline constexpr int kMaxMeshDims = 8;
inline constexpr int kMaxTensorDims = 8;

// Limits that Validate() enforces (docs/spec-format.md, "Limits"). They keep every size, offset
// and byte count the planner and executors derive from a spec exact in int64_t: sums of two
// values below 2^62 cannot overflow, and nothing is allocated per rank beyond the world size.
//
// Ranks are in [0, kMaxWorldSize): per-rank tables of the planner and of `--verify` stay small,
// and a mesh (its ranks distinct) holds at most this many ranks.
inline constexpr int32_t kMaxWorldSize = 1 << 16;
// Elements of a tensor, its bytes, and the bytes of all tiles of all tensors on all ranks (both
// sides together) are below this.
inline constexpr int64_t kMaxSpecBytes = int64_t{1} << 62;
// Every byte a view addresses in a per-rank buffer is below this (64 PiB: no process can map
// more, even with 57-bit virtual addresses); view offsets and strides are bounded by it.
inline constexpr int64_t kMaxBufferBytes = int64_t{1} << 56;
inline constexpr size_t kMaxTensors = size_t{1} << 20;
// (Destination rank, source tile) pairs whose boxes intersect, over all tensors: a bound on the
// pieces of the plan. A rank's share (BuildRankPlan) holds only its own pieces, but every rank runs
// the world's greedy pass, and the world plan (`reshard plan`, `reshard sim`) holds every piece:
// at this limit about 5 s CPU per rank and 4-5 GB for the world plan. It admits one tensor per
// expert matrix of DeepSeek-V3 and Kimi-K2 into 1,024 inference GPUs (48 M and 72 M pairs).
inline constexpr int64_t kMaxPieces = int64_t{1} << 27;
// A strided shard's split factor: below 2^62 like every size, so that the torch.chunk arithmetic
// of a split (len + k - 1, chunk * index) stays exact. A factor above the dim's size is allowed,
// as in torch (its trailing chunks are empty).
inline constexpr int64_t kMaxSplitFactor = kMaxSpecBytes - 1;
// Tensor and buffer names, in bytes (valid UTF-8).
inline constexpr size_t kMaxNameBytes = 1024;
// NIC and NVLink bandwidths (GB/s per rank and direction, the spec's topology and cluster files):
// 1 MB/s to 1 PB/s, far around any link, so a typo (1e308, 1e-308) is refused instead of giving
// a lower bound and simulated times of 1e300 seconds.
inline constexpr double kMinGbytesPerS = 1e-3;
inline constexpr double kMaxGbytesPerS = 1e6;
// Whether `gbytes_per_s` is a bandwidth within those bounds (NaN is not).
inline bool BandwidthInRange(double gbytes_per_s) {
  return gbytes_per_s >= kMinGbytesPerS && gbytes_per_s <= kMaxGbytesPerS;
}
// What an error says of a bandwidth outside them, after the field's name ("is 1e+308; it must
// lie in [0.001, 1e+06] GB/s"): spec topologies and cluster files say the same.
std::string BandwidthRangeError(double gbytes_per_s);

// kStage is a per-rank staging buffer of the plan (a receiver that does not hold the destination
// tile lands the piece there and forwards it); specs only ever name kSrc and kDst.
enum class Side : uint8_t { kSrc = 0, kDst = 1, kStage = 2 };
inline const char* SideName(Side s) {
  return s == Side::kSrc ? "src" : s == Side::kDst ? "dst" : "stage";
}

// Per mesh axis. Placements apply left to right: each rank holds, per tensor dim, an ordered
// list of global indices (initially all of them). Over an axis of size n, S(d) keeps chunk i (a
// torch.chunk into n) of the rank's current list, i its coordinate on the axis; _S(d, k) cuts the
// current list into k torch.chunks, each of those into n, and keeps piece i of each, in order.
// A strided shard is a kShard with split_factor > 1: _S(d, 1) is S(d) (torch gives both the
// same tiles), so it has one representation and plans, caches and fingerprints as S(d).
struct Placement {
  enum class Kind : uint8_t { kReplicate, kShard };
  Kind kind = Kind::kReplicate;
  int dim = -1;               // Only for kShard.
  int64_t split_factor = 1;   // Only for kShard; in [1, kMaxSplitFactor] (Validate).

  static Placement Replicate() { return {Kind::kReplicate, -1}; }
  static Placement Shard(int d) { return {Kind::kShard, d}; }
  static Placement StridedShard(int d, int64_t k) { return {Kind::kShard, d, k}; }
  bool is_shard() const { return kind == Kind::kShard; }
  bool is_strided() const { return kind == Kind::kShard && split_factor != 1; }
  std::string ToString() const;  // "R", "S(d)" or "_S(d, k)" (torch's str())
  bool operator==(const Placement&) const = default;
};

// An N-D array of global ranks, row-major. shape.size() is the mesh ndim (1..8).
struct Mesh {
  std::vector<int64_t> shape;
  std::vector<int32_t> ranks;

  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t size() const { return static_cast<int64_t>(ranks.size()); }
  // Index into `ranks` of `rank`, or -1 when the rank is not in the mesh. O(size).
  int64_t IndexOf(int32_t rank) const;
  bool operator==(const Mesh&) const = default;
};

// Where a rank's tile lives in its buffer: element (i0, i1, ...) of the local tile is at
// element offset + sum(i_k * strides[k]). Empty strides mean row-major contiguous.
struct View {
  int64_t offset = 0;
  std::vector<int64_t> strides;
  bool operator==(const View&) const = default;
};

// How a destination stores a tensor quantized (docs/quantization.md): FP8 elements and one scale
// per block. `block` gives the block's extents over the tensor's last block.size() dims (the
// dims before have extent 1); kMx defaults to [32], kChannel is [1, ..., 1, last dim] and kTensor
// the whole shape (neither takes a block).
enum class QuantScheme : uint8_t { kNone, kBlock, kMx, kChannel, kTensor };
const char* QuantSchemeName(QuantScheme s);  // "none", "block", "mx", "channel", "tensor"
struct Quant {
  QuantScheme scheme = QuantScheme::kNone;
  std::vector<int64_t> block;  // As written (kBlock, kMx); BlockShape() resolves it per dim.
  bool operator==(const Quant&) const = default;
};

struct Layout {
  Mesh mesh;
  std::vector<Placement> placements;  // One per mesh axis.
  // Per-rank buffer the tile lives in. Empty: a buffer of its own, named after the tensor.
  // Buffers are per side: a source buffer and a destination buffer never alias.
  std::string buffer;
  View view;
  bool has_view = false;  // True when the spec gave a view (even a contiguous one).
  // The element type on this side when it differs from the tensor's (an FP8 type, with `quant`;
  // a source may be FP8 only when its destination is quantized too), how it is quantized, and
  // where its scales live on this side: buffer `scale_buffer` (default "<tensor>.scale") with
  // `scale_view` over the blocked shape.
  std::optional<DType> dtype;
  Quant quant;
  std::string scale_buffer;
  View scale_view;
  bool has_scale_view = false;
};

struct TensorSpec {
  std::string name;
  DType dtype = DType::kFp32;
  std::vector<int64_t> shape;
  Layout src;
  Layout dst;

  const std::string& src_buffer() const { return src.buffer.empty() ? name : src.buffer; }
  const std::string& dst_buffer() const { return dst.buffer.empty() ? name : dst.buffer; }
  const Layout& layout(Side side) const { return side == Side::kSrc ? src : dst; }
  // The destination's element type: dst.dtype, or the tensor's.
  DType dst_dtype() const { return dst.dtype.value_or(dtype); }
  // The source's element type: src.dtype (an FP8 source), or the tensor's.
  DType src_dtype() const { return src.dtype.value_or(dtype); }
  bool quantized() const { return dst.quant.scheme != QuantScheme::kNone; }
  // The source already holds FP8 with block scales (src.quant).
  bool src_quantized() const { return src.quant.scheme != QuantScheme::kNone; }
};

// Where a tensor of a lowered spec (plan::LowerQuantization, quant_spec.h) takes its source from:
// its source layout reads an internal buffer that each source rank fills before every refit by
// quantizing its tile of the user's source (this layout, of dtype `dtype`) block by block.
struct QuantizedSource {
  uint32_t tensor = 0;        // The FP8 tensor in the lowered spec (same index as the user's).
  uint32_t scale_tensor = 0;  // Its scales, a tensor of the lowered spec over the blocked shape.
  DType dtype = DType::kBf16; // The user's source element type.
  Layout src;                 // The user's source layout (buffer resolved: never empty).
  QuantScheme scheme = QuantScheme::kNone;
  std::vector<int64_t> block; // Per dim of the tensor.
  // Per dim: how many source tiles split it when it is one block that the source shards (its
  // blocks' amaxes are then combined across those tiles before quantizing: the amax exchange),
  // else 1. `partial_tensor` is then this tensor's partial amaxes in RefitSpec::amax_exchange.
  std::vector<int64_t> cut_parts;
  bool exchange = false;
  uint32_t partial_tensor = 0;
  // A source that already holds FP8 (src.quant) with another scheme, block or format than the
  // destination's: `dtype` is its FP8 type, and each tile is dequantized (DecodeFp8(q) times its
  // source block's scale, in fp32) before it is quantized again. kNone for bf16/fp16/fp32.
  QuantScheme src_scheme = QuantScheme::kNone;
  std::vector<int64_t> src_block;  // Per dim: the source's blocks.
  Layout src_scales;               // The source's scales over its blocked shape (buffer resolved).
  bool requantized() const { return src_scheme != QuantScheme::kNone; }
};

// Which ranks share a fast local fabric (an NVLink domain; on a CPU host, one host), and the
// bandwidths the schedule and simulator use. Ranks in no listed domain are domains of their own.
struct Topology {
  std::vector<std::vector<int32_t>> domains;  // Explicit grouping, or empty.
  int64_t ranks_per_domain = 0;               // Consecutive grouping when > 0.
  double nic_gbytes_per_s = 50.0;             // Per rank, per direction.
  double nvlink_gbytes_per_s = 450.0;         // Per rank, per direction.
  int64_t gpus_per_node = 0;                  // Informational (0: unknown); one NIC per rank.

  // Domain id of `rank`: dense ids in order of first appearance are not needed by callers, so
  // this returns the smallest rank of the domain, which is stable and unique.
  int32_t DomainOf(int32_t rank) const;
};

struct RefitSpec {
  std::string comment;
  Topology topology;
  std::vector<TensorSpec> tensors;
  // Empty in a spec as written; set by plan::LowerQuantization only (never in JSON).
  std::vector<QuantizedSource> quantized_sources;
  // A lowered spec whose quantized sources share blocks across source tiles: the refit of their
  // partial amaxes that runs before they are quantized (quant_spec.h), else null.
  std::shared_ptr<const RefitSpec> amax_exchange;

  const Layout& layout(size_t tensor, Side side) const {
    return side == Side::kSrc ? tensors[tensor].src : tensors[tensor].dst;
  }
  // 1 + the largest rank named anywhere in the spec (meshes and topology).
  int32_t WorldSize() const;
};

// Checks a spec for everything the planner relies on, including the limits above. Errors are
// InvalidArgument, one line, and name the tensor and field, e.g.
// `tensor "w": dst.placements[1] shards dim 2 of a 2-D tensor`; user strings in them are quoted
// and cut at 64 characters (json::QuoteForMessage).
[[nodiscard]] absl::Status Validate(const RefitSpec& spec);

// What one rank's share of the plan relies on (BuildRankPlan): every check of Validate() on
// every tensor, except that the views of tensors sharing a buffer are checked for overlap on
// `rank` only (the one check that grows with the world's tiles): an overlap on `rank` fails here
// with Validate()'s error, an overlap on another rank fails that rank's set-up.
[[nodiscard]] absl::Status ValidateForRank(const RefitSpec& spec, int32_t rank);

}  // namespace reshard::plan
