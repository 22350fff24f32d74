// quant_tool: quantizes one tile read from a file with QuantizeTile (src/plan/quantize.h) and
// writes the FP8 elements and the scales, for tests/quant/check_ml_dtypes.py, which compares them
// with a numpy + ml_dtypes reference. See --help for the file formats.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "src/common/quant_math.h"
#include "src/plan/quantize.h"

namespace {

using reshard::plan::DType;
using reshard::plan::QuantArith;
using reshard::plan::QuantTile;
using reshard::quant::Fp8Format;

constexpr char kMagic[4] = {'R', 'S', 'Q', '1'};
// The arith field's value for "encode every element with EncodeFp8, no scale".
constexpr uint8_t kEncodeOnly = 2;

void PrintHelp() {
  std::printf(
      "usage: quant_tool INPUT OUTPUT\n\n"
      "Quantizes the tile in INPUT with reshard's CPU quantizer (QuantizeTile) and writes OUTPUT.\n\n"
      "INPUT, little-endian:\n"
      "  4 bytes  magic \"RSQ1\"\n"
      "  u8       format: 0 e4m3, 1 e5m2\n"
      "  u8       arith: 0 fp32 scale, 1 MX (E8M0 scale), 2 encode only (EncodeFp8, no scale)\n"
      "  u8       source dtype: 0 bf16, 1 fp16, 2 fp32\n"
      "  u8       layout: 0 row-major, 1 column-major (the tile is then read with strides:\n"
      "           the last dim is not contiguous)\n"
      "  u8       ndim (0..8), then 3 bytes of zero\n"
      "  i64[ndim] extents, i64[ndim] block extents (ignored for encode only)\n"
      "  the source elements in the given layout\n"
      "OUTPUT: the FP8 elements row-major (1 byte each), then the scales row-major over the\n"
      "blocks (fp32, 4 bytes each, or E8M0, 1 byte each; none for encode only).\n\n"
      "Exit status: 0 success, 1 the files could not be read or written, 2 invalid input.\n");
}

int Fail(int status, const std::string& message) {
  std::fprintf(stderr, "quant_tool: %s\n", message.c_str());
  return status;
}

bool ReadFile(const char* path, std::vector<uint8_t>& data) {
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) return false;
  uint8_t buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) data.insert(data.end(), buffer, buffer + n);
  const bool ok = std::ferror(f) == 0;
  std::fclose(f);
  return ok;
}

float SourceToFloat(DType dtype, const uint8_t* p) {
  if (dtype == DType::kFp32) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    return reshard::quant::FloatFromBits(u);
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == DType::kBf16 ? reshard::quant::Bf16ToFloat(h) : reshard::quant::HalfToFloat(h);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    PrintHelp();
    return 0;
  }
  if (argc != 3) return Fail(2, "expects INPUT and OUTPUT (see --help).");
  std::vector<uint8_t> in;
  if (!ReadFile(argv[1], in)) return Fail(1, std::string("cannot read ") + argv[1] + ".");

  constexpr size_t kFixedHeader = 12;
  if (in.size() < kFixedHeader || std::memcmp(in.data(), kMagic, 4) != 0) {
    return Fail(2, std::string(argv[1]) + " does not start with the \"RSQ1\" header.");
  }
  const uint8_t format = in[4], arith = in[5], dtype_code = in[6], layout = in[7], ndim = in[8];
  if (format > 1 || arith > kEncodeOnly || dtype_code > 2 || layout > 1 ||
      ndim > reshard::plan::kMaxTensorDims) {
    return Fail(2, std::string(argv[1]) + " has a header field out of range.");
  }
  const size_t header = kFixedHeader + 16 * size_t{ndim};
  if (in.size() < header) return Fail(2, std::string(argv[1]) + " is truncated in its header.");

  QuantTile t;
  const DType dtypes[] = {DType::kBf16, DType::kFp16, DType::kFp32};
  t.src_dtype = dtypes[dtype_code];
  t.format = format == 0 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  t.arith = arith == 1 ? QuantArith::kMx : QuantArith::kFp32Scale;
  t.ndim = ndim;
  int64_t elements = 1;
  for (int k = 0; k < ndim; ++k) {
    std::memcpy(&t.extent[k], &in[kFixedHeader + 8 * k], 8);
    std::memcpy(&t.block[k], &in[kFixedHeader + 8 * (ndim + k)], 8);
    if (arith == kEncodeOnly) t.block[k] = 1;
    if (t.extent[k] < 0 || t.extent[k] > (int64_t{1} << 32) || t.block[k] < 1) {
      return Fail(2, std::string(argv[1]) + " has a negative or huge extent or a block below 1.");
    }
    elements *= t.extent[k];
    if (elements > (int64_t{1} << 32)) return Fail(2, std::string(argv[1]) + " is too large.");
  }
  const int elem = reshard::plan::DTypeSize(t.src_dtype);
  if (in.size() != header + static_cast<size_t>(elements) * elem) {
    return Fail(2, std::string(argv[1]) + " holds " + std::to_string(in.size() - header) +
                       " bytes of elements, not the " + std::to_string(elements * elem) +
                       " its header says.");
  }
  // Strides of the stored layout, in elements.
  int64_t stride = 1;
  for (int i = 0; i < ndim; ++i) {
    const int k = layout == 0 ? ndim - 1 - i : i;
    t.src_strides[k] = stride;
    stride *= t.extent[k];
  }
  t.src = in.data() + header;

  std::vector<uint8_t> out(static_cast<size_t>(elements));
  if (arith == kEncodeOnly) {
    // Element by element through the stored layout; out is row-major like QuantizeTile's.
    for (int64_t flat = 0; flat < elements; ++flat) {
      int64_t rest = flat, offset = 0;
      for (int k = ndim - 1; k >= 0; --k) {
        offset += (rest % t.extent[k]) * t.src_strides[k];
        rest /= t.extent[k];
      }
      out[flat] = reshard::quant::EncodeFp8(SourceToFloat(t.src_dtype, t.src + offset * elem),
                                            t.format);
    }
  } else {
    const size_t scale_bytes = reshard::plan::NumBlocks(t) * reshard::plan::ScaleBytes(t.arith);
    out.resize(out.size() + scale_bytes);
    t.out = out.data();
    t.scales = out.data() + elements;
    reshard::plan::QuantizeTile(t);
  }

  FILE* f = std::fopen(argv[2], "wb");
  if (f == nullptr) return Fail(1, std::string("cannot create ") + argv[2] + ".");
  const bool written = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) != 0 || !written) return Fail(1, std::string("cannot write ") + argv[2] + ".");
  return 0;
}
