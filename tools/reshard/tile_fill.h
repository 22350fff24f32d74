// Test patterns for the per-rank programs (reshard-rank, reshard-bench-rank), on the public API
// only: every source element gets a value derived from (epoch, tensor, global flat index) by a
// strong 64-bit mix (DESIGN §9: never index % 256), so a piece put in the wrong place, a stale
// epoch or a missing piece shows up in TilePatterns::Verify.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "reshard/reshard.h"

namespace reshard::cli {

// The value of element `index` (flat, row-major over the global shape) of tensor number
// `tensor` in epoch `epoch`; the low DTypeSize bytes are stored.
uint64_t PatternValue(uint64_t epoch, uint64_t tensor, int64_t index);

// Overwrites every element of `tile` with 0xA5 bytes.
void PoisonTile(const LocalTile& tile, void* base);

// Sparse changes (`--change-fraction F`, docs/delta.md): epoch 1 holds PatternValue(1, ...);
// each later epoch e changes element `index` with probability F (a hash of e, tensor and index,
// so changes scatter over every tensor) by XOR-ing 1..15 into its lowest byte: 1 to 15 ulp of a
// little-endian float's mantissa (of an FP8 source, its byte: another code), never a no-op.
// ChangeXor is 0 for an element e leaves alone.
uint8_t ChangeXor(uint64_t epoch, uint64_t tensor, int64_t index, double fraction);

// Fill and check for every tile of a spec, quantized destinations included
// (docs/quantization.md): the sources of a tensor whose destination is quantized get real numbers
// of their dtype (mostly 2^-6 to 2^6, with rare zeros, subnormals, NaN, Inf and huge values)
// instead of bit patterns, and its destination tiles, FP8 elements and scales, are checked
// against QuantizeReference of those numbers; every other tile with PatternValue's bytes.
// FP8 sources (src.quant) hold PatternValue's bytes (every FP8 code); their source scales are bit
// patterns when the destination has the same format, scheme and block (both then arrive as they
// are), else real scales (fp32 of 2^-12 to 2^12, E8M0 bytes 107 to 147), and the destination is
// checked against QuantizeReference of the dequantized source (DequantizeReference).
class TilePatterns {
 public:
  // `values_of`, when given, is the spec whose quantized destinations decide which sources get
  // real numbers (a spec that differs only in its destinations, e.g. the same refit unquantized:
  // its destinations are then checked for exactly those numbers).
  explicit TilePatterns(const RefitSpec& spec, const RefitSpec* values_of = nullptr);
  // Writes epoch `epoch`'s values into source tile `tile` (elements at `base` + offsets).
  void Fill(const LocalTile& tile, uint64_t epoch, void* base) const;
  // DataLoss naming the tensor, rank and first wrong element when destination tile `tile`
  // (a tensor's, or its scales') does not hold what epoch `epoch`'s sources give.
  [[nodiscard]] absl::Status Verify(const LocalTile& tile, uint64_t epoch, int rank,
                                    const void* base) const;
  // Sparse changes (ChangeXor), for every kind of tile: applies epoch `epoch`'s changes (>= 2)
  // to source tile `tile`, which holds epoch - 1's values (the elements of a tensor, real
  // numbers and FP8 bytes included; an FP8 source's scales never change); and checks a
  // destination tile against epoch `epoch`'s values (recomputing the changes of every epoch
  // 2..epoch). A quantized destination (elements or scales) is checked against
  // QuantizeReference of the changed source values of every block it covers, so a change that
  // moves a block's amax shows up in all of the block's bytes.
  void Change(const LocalTile& tile, uint64_t epoch, double fraction, void* base) const;
  [[nodiscard]] absl::Status VerifyChanged(const LocalTile& tile, uint64_t epoch, double fraction,
                                           int rank, const void* base) const;
  // The same over many refits, each with its own fraction: `low` holds, for destination tile
  // `tile` after epoch `epoch`, the lowest byte of each element (ForEachElement's order), or
  // for a quantized tile the XOR of every change so far to each source element of the blocks
  // it covers (row-major), advanced one epoch at a time (epoch 1 sets it), so checking N
  // refits costs N passes over the tile instead of VerifyChanged's N^2 / 2.
  void AdvanceChanged(const LocalTile& tile, uint64_t epoch, double fraction,
                      std::vector<uint8_t>* low) const;
  [[nodiscard]] absl::Status VerifyChangedLow(const LocalTile& tile, uint64_t epoch,
                                              const std::vector<uint8_t>& low, int rank,
                                              const void* base) const;

 private:
  struct Tensor {
    uint64_t number = 0;
    const TensorDesc* desc = nullptr;
    bool quantized = false;  // Its destination is quantized from real numbers in this spec.
    bool real = false;       // Its sources hold real numbers (quantized in `values_of`).
    bool fp8_source = false;   // Its source holds FP8 with scales (src.quant).
    bool fp8_matched = false;  // ... with the destination's format, scheme and block.
    uint64_t scale_number = 0;  // The pattern number of its scales.
  };
  const Tensor& Of(const std::string& name) const;
  // The bytes of the source scale of block `block` (flat over the source's blocked shape) of an
  // FP8 source whose scales are real (not fp8_matched): 4 (fp32) or 1 (E8M0) bytes at `out`.
  void SourceScale(const Tensor& t, uint64_t epoch, int64_t block, uint8_t* out) const;
  const Tensor& Of(const LocalTile& tile) const {
    return Of(tile.scales_of.empty() ? tile.tensor : tile.scales_of);
  }
  // What Fill writes into element `g` of a tile of `dtype` holding `t` (or, `scales`, its
  // source scales) in epoch `epoch`: DTypeSize(dtype) bytes at `out`.
  void Element(const Tensor& t, bool scales, DType dtype, uint64_t epoch, int64_t g,
               uint8_t* out) const;
  // The source elements a quantized destination tile's values come from: the tile's box
  // aligned outwards to the destination's blocks (for a scale tile, its blocks' elements),
  // `lo` and `extents` per dim in elements; `blocks_lo` the first block per dim. False when the
  // tile is empty.
  bool QuantizedRegion(const LocalTile& tile, const Tensor& t, std::vector<int64_t>* lo,
                       std::vector<int64_t>* extents, std::vector<int64_t>* blocks_lo) const;
  // `changes` (null: none): the XOR to each region element's lowest byte (AdvanceChanged's
  // order), applied to epoch 1's values, `epoch` then only naming the refit in errors.
  absl::Status VerifyQuantized(const LocalTile& tile, const Tensor& t, uint64_t epoch, int rank,
                               const void* base,
                               const std::vector<uint8_t>* changes = nullptr) const;
  std::vector<TensorDesc> tensors_;
  std::map<std::string, Tensor> by_name_;
};

}  // namespace reshard::cli
