// Quantized destinations and FP8 sources in the spec (docs/quantization.md): what a block is for each scheme,
// the scales as a tensor of their own, and the lowering that turns a spec with quantized
// destinations into a plain spec the planner, the engine and the executors move as it is.
//
// Lowering. A tensor whose destination is FP8 with scales becomes two tensors of the lowered
// spec: the tensor itself with the FP8 dtype, whose source tiles are read from an internal
// per-rank buffer (kQuantizedBuffer, 1-byte elements), and its scales (`<name>.scale`, over the
// blocked shape, fp32 or E8M0 bytes), read from kQuantizedBuffer or kScaleBuffer (fp32) and
// written to the destination's scale buffer. Before every refit each source rank fills its tiles
// of those internal buffers by quantizing its tile of the user's source block by block
// (QuantizedSource, quantize.h). So only FP8 bytes and scales cross the network, and relays and
// fan-out forward them as any other bytes.
//
// FP8 sources (src.dtype, src.quant: FP8 training). When the source's format, scheme and block
// are the destination's, lowering makes the tensor and its scales plain tensors read from the
// user's source buffers (no QuantizedSource): bytes and scales move as they are. Otherwise the
// tensor is a QuantizedSource like any other whose tiles are dequantized to fp32 first
// (QuantizedSource::requantized); its source tiles must then hold whole source blocks too.
//
// Blocks and tiles. A source rank quantizes the blocks its tile holds, so source tiles must start
// on block boundaries, except along a dim the block covers whole (one block: channel's last dim,
// every dim of tensor): the source tiles that share such a block combine their partial amaxes
// first (the amax exchange: RefitSpec::amax_exchange, a small refit before the quantization),
// and every one of them holds the block's scale. A destination tile that cuts a block is an error
// too, with the same exception: every destination rank of such a dim holds the scale, replicated.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/plan/quantize.h"
#include "src/plan/spec.h"
#include "src/plan/tiling.h"

namespace reshard::plan {

// The internal source buffers of a lowered spec (Side::kSrc; BufferInfo::internal). User buffer
// names starting with "reshard:" are reserved.
inline constexpr char kQuantizedBuffer[] = "reshard:fp8";
inline constexpr char kScaleBuffer[] = "reshard:fp8-scales";
inline constexpr char kReservedBufferPrefix[] = "reshard:";
// The buffers of RefitSpec::amax_exchange (source ranks only; fp32; a spec of their own).
inline constexpr char kPartialAmaxBuffer[] = "amax.partial";
inline constexpr char kGatheredAmaxBuffer[] = "amax.gathered";

// The block's extent along every dim of a tensor of `shape` quantized by `q` (resolved).
std::vector<int64_t> BlockShape(const std::vector<int64_t>& shape, const Quant& q);
// The destination's blocks of `t` (dst.quant) and the source's (src.quant).
std::vector<int64_t> BlockShape(const TensorSpec& t);
std::vector<int64_t> SourceBlockShape(const TensorSpec& t);
// An FP8 source whose format, scheme and block are the destination's: its bytes and scales move
// as they are (lowering makes them plain tensors read from the user's buffers).
bool SourceMatchesDestination(const TensorSpec& t);
// ceil(shape / block) per dim: the shape of the scale tensor.
std::vector<int64_t> BlockedShape(const std::vector<int64_t>& shape,
                                  const std::vector<int64_t>& block);
// The element type of the scales: fp32, or E8M0 bytes (u8) for kMx.
DType ScaleDType(QuantScheme scheme);
// The scales' layout on a side: the same mesh and placements, except that a mesh axis that
// shards a dim of one block replicates instead: every tile of the dim holds part of that block,
// so every one needs its scale (on the source, every one computes it from the combined amax).
Layout ScaleLayout(const Layout& l, const std::vector<int64_t>& shape,
                   const std::vector<int64_t>& block);
// The scales of quantized `t` on `side` (dst.quant, or src.quant of an FP8 source) as a tensor
// of their own: "<name>.scale" over that side's blocked shape, with that side's ScaleLayout in
// its scale buffer (default "<name>.scale") and scale view. Only the `side` layout is set.
TensorSpec ScaleTensor(const TensorSpec& t, Side side);

// The quantization checks of Validate() for tensor `t`: dtypes, scheme, block, scale fields, and
// that source and destination tiles start on block boundaries (above). InvalidArgument naming the
// tensor, the field, and for a cut block the dim and a rank whose tile cuts it.
[[nodiscard]] absl::Status ValidateQuant(const TensorSpec& t);

// The lowered spec (above) of a valid spec; `spec` itself when no tensor is quantized.
// InvalidArgument when a scale tensor's name is taken by another tensor.
[[nodiscard]] absl::StatusOr<std::shared_ptr<const RefitSpec>> LowerQuantization(
    std::shared_ptr<const RefitSpec> spec);

// Quantizes one tile of quantized source `qs` to the FP8 type `fp8`: the tile's first element is
// at `src`, the others at element `strides` (of qs.dtype); its FP8 bytes go row-major to `out`
// and its scales row-major (over ceil(extent / block)) to `scales`. The tile starts on block
// boundaries (ValidateQuant). Allocates nothing.
void QuantizeBox(const QuantizedSource& qs, DType fp8, const Box& tile, const uint8_t* src,
                 const std::array<int64_t, kMaxTensorDims>& strides, uint8_t* out,
                 uint8_t* scales);
// What a source rank does before each refit, for one of its tiles of quantized source `q` of a
// lowered spec: reads the tile from the user's buffer (`user_buffer`, per qs.src's view) and
// writes its FP8 elements and scales where the lowered spec's tensors read them
// (`elements_buffer`: the rank's buffer of the FP8 tensor's source, `scales_buffer`: of its
// scale tensor's; both internal). For a source with qs.exchange, `amax` is CombineAmax's (the
// scales are written from it even when the tile is empty); otherwise null. For a requantized
// source, `user_scales` is the rank's buffer of its source scales (qs.src_scales) and
// `dequantized` holds DequantizedElements(qs, tile) floats; both are null otherwise.
void QuantizeSourceTile(const RefitSpec& lowered, size_t q, const Box& tile,
                        const uint8_t* user_buffer, uint8_t* elements_buffer,
                        uint8_t* scales_buffer, const float* amax = nullptr,
                        const uint8_t* user_scales = nullptr, float* dequantized = nullptr);

// The QuantTile that QuantizeSourceTile quantizes for a non-empty `tile` of quantized source `q`,
// with its out and scales set: for quantizing it elsewhere (the CUDA kernels,
// src/cuda/quantize.h). Its src is user_buffer plus the view's offset. For a requantized source
// it describes the FP8 tile itself (src_dtype the FP8 type, src_strides the FP8 elements'),
// which QuantizeTile does not take: the kernels read it with DequantSourceOf's scales.
QuantTile SourceQuantTile(const RefitSpec& lowered, size_t q, const Box& tile,
                          const uint8_t* user_buffer, uint8_t* elements_buffer,
                          uint8_t* scales_buffer);

// Where DequantizeTile finds a requantized source's scales for a non-empty `tile`: the scale of
// the tile's first source block (`scales`, in user_scales), and per dim the source's block, the
// tile's start inside its first block (tile.lo modulo the block: nonzero only along a dim of one
// block) and the scales' element strides. Element i of a dim has the scale
// (phase + i) / block scale strides from `scales` on.
struct DequantSource {
  const uint8_t* scales = nullptr;
  bool mx = false;  // E8M0 scales, else fp32.
  std::array<int64_t, kMaxTensorDims> block{};
  std::array<int64_t, kMaxTensorDims> phase{};
  std::array<int64_t, kMaxTensorDims> scale_strides{};
};
DequantSource DequantSourceOf(const QuantizedSource& qs, const Box& tile,
                              const uint8_t* user_scales);

// A requantized source's tile (qs.requantized()) as fp32, row-major into `out`:
// DecodeFp8(byte) * its source block's scale (fp32, or MxScale of the E8M0 byte), one IEEE fp32
// multiplication per element. `user_buffer` and `user_scales` are the rank's buffers of the
// FP8 elements (qs.src) and of their scales (qs.src_scales). Allocates nothing.
void DequantizeTile(const QuantizedSource& qs, const std::vector<int64_t>& shape,
                    const Box& tile, const uint8_t* user_buffer, const uint8_t* user_scales,
                    float* out);
// The floats DequantizeTile writes for `tile` of qs: its elements for a requantized source, 0
// otherwise.
int64_t DequantizedElements(const QuantizedSource& qs, const Box& tile);

// The amax exchange (qs.exchange: the source shards a dim of one block). A rank's tile has
// TileBlocks(qs, tile) blocks per dim (1 along a cut dim), in the row-major order of its scales.
// Before each refit the rank writes its partial amaxes (PartialAmaxTile, into its tile of the
// partial tensor of RefitSpec::amax_exchange), the exchange refits them to every tile that shares
// the blocks, and CombineAmax takes the max over the parts (the rank's tile of the gathered
// tensor: row-major over TileBlocks with every cut dim widened to qs.cut_parts) for
// QuantizeSourceTile.
std::array<int64_t, kMaxTensorDims> TileBlocks(const QuantizedSource& qs, const Box& tile);
void PartialAmaxTile(const RefitSpec& lowered, size_t q, const Box& tile,
                     const uint8_t* user_buffer, float* partial,
                     const uint8_t* user_scales = nullptr, float* dequantized = nullptr);
void CombineAmax(const QuantizedSource& qs, const Box& tile, const float* gathered, float* amax);

}  // namespace reshard::plan
