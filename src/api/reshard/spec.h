// Describing a refit: layouts that mirror PyTorch DTensor, and the spec listing every tensor with
// its source (trainer) and destination (inference) layout.
//
//   reshard::RefitSpec spec;
//   spec.AddTensor("layers.0.mlp.up_proj", reshard::DType::kBf16, {4096, 1024},
//                  reshard::Layout(reshard::Mesh::Range(0, 2), {reshard::Shard(0)}),
//                  reshard::Layout(reshard::Mesh({{2, 3}, {4, 5}}),
//                                  {reshard::Replicate(), reshard::Shard(1)}));
//   spec.SetRanksPerDomain(4);
//
// Semantics follow DTensor exactly: a mesh is an N-D array of global ranks; per mesh axis a
// placement replicates the tensor, shards tensor dim d (Shard) or strided-shards it
// (StridedShard: torch's _StridedShard, which FSDP2 + TP trainers produce); uneven dims split
// like torch.chunk (chunk c = ceil(n / k), shard i covers [i*c, min((i+1)*c, n)), possibly
// empty). Placements apply in mesh-axis order, each to the indices its predecessors left a rank
// (docs/spec-format.md): Shard keeps chunk i of them, StridedShard(d, k) cuts them into k chunks
// and keeps piece i of each. A rank must end up with one contiguous range per dim (Validate). A
// layout may place every tile of one side inside a larger per-rank buffer through a view (fused
// parameters such as qkv_proj).
//
// These are plain value types: copyable, thread-compatible, no I/O. Building never fails;
// Validate() reports the first problem of the whole spec as InvalidArgument with one sentence
// naming the tensor and the field. RefitHandle::Create leaves checking to planning: each rank
// checks, as it plans its share, what its share relies on (and a rank that fails makes the
// others fail).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard {

enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kI32,
  kI64,
  kFp8E4M3,
  kFp8E5M2,
  kFp16,
  kBf16,
  kFp32,
  kFp64,
};
// Size of one element in bytes.
int DTypeSize(DType dtype);
// Spec spelling: "bf16", "fp8e4m3", ...
const char* DTypeName(DType dtype);

// Per mesh axis: replicate, or shard tensor dim `dim`; a shard with split_factor > 1 is torch's
// _StridedShard(dim, split_factor=split_factor). split_factor 1 is a plain Shard (torch gives
// both the same tiles), so StridedShard(d, 1) == Shard(d).
struct Placement {
  bool shard = false;
  int dim = -1;
  int64_t split_factor = 1;  // Shards only; at least 1 and below 2^62 (Validate).
  bool operator==(const Placement&) const = default;
};
inline Placement Shard(int dim) { return Placement{true, dim}; }
inline Placement Replicate() { return Placement{false, -1}; }
// FSDP2 + TP on a (dp, tp) mesh, both sharding dim 0: {StridedShard(0, tp), Shard(0)}.
inline Placement StridedShard(int dim, int64_t split_factor) {
  return Placement{true, dim, split_factor};
}

// An N-D array of global ranks (any ranks, any order), row-major, like torch's DeviceMesh.
class Mesh {
 public:
  Mesh() = default;
  // A 1-D mesh over `ranks`.
  explicit Mesh(std::vector<int32_t> ranks);
  // A 2-D mesh: one row per inner list (rows must have equal length; Validate checks).
  Mesh(std::initializer_list<std::initializer_list<int32_t>> rows);
  // An N-D mesh of `shape` over `ranks` in row-major order.
  Mesh(std::vector<int64_t> shape, std::vector<int32_t> ranks);
  // 1-D mesh of ranks [first, first + count).
  static Mesh Range(int32_t first, int32_t count);

  // The same ranks viewed with another shape (product must match; Validate checks).
  Mesh Reshape(std::vector<int64_t> shape) const;

  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int32_t>& ranks() const { return ranks_; }
  int ndim() const { return static_cast<int>(shape_.size()); }

 private:
  std::vector<int64_t> shape_;
  std::vector<int32_t> ranks_;
};

// How a destination stores a tensor quantized (docs/quantization.md): FP8 elements with one
// scale per block. kBlock takes the block's extents over the last dims ([128, 128]: DeepSeek-V3's
// fp32 scale per 128 x 128 block); kMx an E8M0 scale per block (default [32] along the last
// dim); kChannel an fp32 scale per row; kTensor one fp32 scale.
enum class QuantScheme : uint8_t { kNone, kBlock, kMx, kChannel, kTensor };

// A tensor's layout on one side.
struct Layout {
  Layout() = default;
  Layout(Mesh mesh, std::vector<Placement> placements)
      : mesh(std::move(mesh)), placements(std::move(placements)) {}

  // Places every tile of this side inside the per-rank buffer `buffer_name` at element
  // `offset`, with element `strides` (empty: row-major contiguous tile). Returns *this.
  Layout& InBuffer(std::string buffer_name, int64_t offset = 0, std::vector<int64_t> strides = {});
  // The tiles are `fp8` (kFp8E4M3 or kFp8E5M2) quantized by `scheme` with `block` (kBlock;
  // optional for kMx; none for the others). A destination is then quantized by its sources; a
  // source already holds FP8 with scales (FP8 training; its destination must be quantized too):
  // with the destination's format, scheme and block its bytes and scales move as they are,
  // otherwise each source tile is dequantized and quantized again. Returns *this.
  Layout& Quantized(DType fp8, QuantScheme scheme, std::vector<int64_t> block = {});
  // Where a quantized side's scales live (default: a buffer "<tensor>.scale" of their own,
  // row-major over the blocked tile), like InBuffer. Returns *this.
  Layout& ScalesInBuffer(std::string buffer_name, int64_t offset = 0,
                         std::vector<int64_t> strides = {});

  Mesh mesh;
  std::vector<Placement> placements;  // One per mesh axis.
  // Per-rank buffer holding the tile. Empty: a buffer of its own named after the tensor.
  std::string buffer;
  int64_t view_offset = 0;            // In elements.
  std::vector<int64_t> view_strides;  // In elements; empty: contiguous.
  bool has_view = false;
  // Quantized sides (Quantized, ScalesInBuffer); dtype unset: the tensor's.
  std::optional<DType> dtype;
  QuantScheme quant_scheme = QuantScheme::kNone;
  std::vector<int64_t> quant_block;
  std::string scale_buffer;
  int64_t scale_view_offset = 0;
  std::vector<int64_t> scale_view_strides;
  bool has_scale_view = false;
};

struct TensorDesc {
  std::string name;
  DType dtype = DType::kFp32;
  std::vector<int64_t> shape;
  Layout src;
  Layout dst;
};

// Which side of the refit a buffer belongs to. A rank may hold both a source and a destination
// buffer of the same name; they never alias.
enum class Side : uint8_t { kSource = 0, kDestination = 1 };
const char* SideName(Side side);

// A buffer this rank must provide to RefitHandle::Create.
struct BufferRequirement {
  std::string name;
  Side side = Side::kSource;
  int64_t bytes = 0;
  std::vector<std::string> tensors;  // Tensors whose tiles live in it.
};

// The part of one tensor that one rank holds: global box [lo, hi) and where its elements sit in
// the rank's buffer (element (i0, i1, ...) of the tile at offset + sum(i_k * strides[k])).
struct LocalTile {
  std::string tensor;
  std::string buffer;
  Side side = Side::kSource;
  DType dtype = DType::kFp32;
  std::vector<int64_t> global_shape;
  std::vector<int64_t> lo, hi;
  int64_t offset = 0;            // In elements.
  std::vector<int64_t> strides;  // In elements, resolved (never empty for ndim > 0).
  // Non-empty when this tile holds the scales of that quantized tensor (destinations, and
  // sources that hold FP8: `tensor` is then "<that>.scale", over the blocked shape;
  // docs/quantization.md).
  std::string scales_of;
  int64_t num_elements() const;
};

// The block extents per dim of a tensor of `shape` quantized by `scheme` with `block` as
// Layout::Quantized takes it (kBlock: over the last dims; kMx: default [32]; kChannel: the last
// dim whole; kTensor: the shape).
std::vector<int64_t> QuantBlockShape(const std::vector<int64_t>& shape, QuantScheme scheme,
                                     const std::vector<int64_t>& block);
// The quantizer every source runs before a refit (docs/quantization.md), for checking what
// lands: quantizes the row-major tile `src` of `src_dtype` (bf16, fp16 or fp32) with `extents`,
// whose origin is a block origin, into `fp8` bytes row-major at `out` and one scale per block
// (`block_shape` per dim; fp32, or E8M0 bytes for kMx) row-major over ceil(extents / block) at
// `scales`. InvalidArgument for other dtypes, a missing scheme, or mismatched extents.
[[nodiscard]] absl::Status QuantizeReference(DType src_dtype, const void* src,
                                             const std::vector<int64_t>& extents, DType fp8,
                                             QuantScheme scheme,
                                             const std::vector<int64_t>& block_shape, void* out,
                                             void* scales);

// What one element of an FP8 source stands for (docs/quantization.md, "FP8 sources"): `byte`
// of `fp8` decoded exactly times its block's scale, one IEEE fp32 multiplication; `scale` points
// to the block's fp32 scale, or for kMx to its E8M0 byte. NaN for a dtype other than fp8e4m3 or
// fp8e5m2, or for kNone.
float DequantizeReference(DType fp8, uint8_t byte, QuantScheme scheme, const void* scale);

class RefitSpec {
 public:
  RefitSpec() = default;

  // Parses the JSON spec format (docs/spec-format in DESIGN §7). InvalidArgument with the line
  // and column on any error; the result is valid.
  [[nodiscard]] static absl::StatusOr<RefitSpec> FromJson(const std::string& text);
  // Reads and parses a file; the path is named in every error.
  [[nodiscard]] static absl::StatusOr<RefitSpec> FromFile(const std::string& path);
  // The JSON form, which FromJson reads back to an equal spec.
  std::string ToJson() const;

  // Appends a tensor. Returns *this for chaining.
  RefitSpec& AddTensor(std::string name, DType dtype, std::vector<int64_t> shape, Layout src,
                       Layout dst);
  // Topology: explicit fast-fabric domains (NVLink domains; processes of one host). Ranks in
  // no listed domain are domains of their own.
  RefitSpec& SetDomains(std::vector<std::vector<int32_t>> domains);
  // Topology: consecutive ranks grouped by `n` (an NVL8 node: 8).
  RefitSpec& SetRanksPerDomain(int64_t n);
  RefitSpec& SetComment(std::string comment);

  const std::vector<TensorDesc>& tensors() const { return tensors_; }
  const std::vector<std::vector<int32_t>>& domains() const { return domains_; }
  int64_t ranks_per_domain() const { return ranks_per_domain_; }
  const std::string& comment() const { return comment_; }

  // OK or InvalidArgument naming the tensor and field.
  [[nodiscard]] absl::Status Validate() const;
  // 1 + the largest rank the spec names.
  int32_t WorldSize() const;
  // The buffers `rank` must pass to RefitHandle::Create, with their exact sizes (sources first,
  // then destinations, in order of first appearance). InvalidArgument for an invalid spec; as in
  // Create, views of one buffer are checked for overlap on `rank` only (an overlap on another
  // rank fails that rank), so the cost grows with the rank's tiles, not the world's.
  [[nodiscard]] absl::StatusOr<std::vector<BufferRequirement>> LocalBuffers(int32_t rank) const;
  // Every tile `rank` holds on `side`, in tensor order (empty tiles of uneven shards included).
  [[nodiscard]] absl::StatusOr<std::vector<LocalTile>> LocalTiles(int32_t rank, Side side) const;

 private:
  std::string comment_;
  std::vector<TensorDesc> tensors_;
  std::vector<std::vector<int32_t>> domains_;
  int64_t ranks_per_domain_ = 0;
};

}  // namespace reshard
