// The FP8 arithmetic of src/common/quant_math.h against references written here from the
// definitions (every fp8 byte, every binary16 pattern, a million fp32 inputs per format and
// every rounding midpoint), and QuantizeTile (src/plan/quantize.cc) against a naive per-element
// quantizer over random strided tiles with partial blocks. The comparison with ml_dtypes is
// tests/quant/check_ml_dtypes.py.
#include "src/plan/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace reshard::plan {
namespace {

using quant::Fp8Format;

constexpr Fp8Format kFormats[] = {Fp8Format::kE4M3, Fp8Format::kE5M2};

uint32_t MaxCode(Fp8Format f) { return f == Fp8Format::kE4M3 ? 0x7E : 0x7B; }
uint32_t NanCode(Fp8Format f) { return f == Fp8Format::kE4M3 ? 0x7F : 0x7E; }
float Bits(uint32_t u) { return quant::FloatFromBits(u); }

// Round to nearest, ties to even, by searching the format's finite values (decoded by
// DecodeFp8, whose values are checked below), saturating; the sign is applied afterwards.
class ReferenceEncoder {
 public:
  explicit ReferenceEncoder(Fp8Format f) : format_(f) {
    for (uint32_t c = 0; c <= MaxCode(f); ++c) values_.push_back(quant::DecodeFp8(c, f));
  }
  uint8_t Encode(float x) const {
    const uint32_t sign = (quant::FloatBits(x) >> 24) & 0x80;
    if (std::isnan(x)) return static_cast<uint8_t>(sign | NanCode(format_));
    const double a = std::fabs(static_cast<double>(x));
    if (a >= values_.back()) return static_cast<uint8_t>(sign | MaxCode(format_));
    // values_[c] <= a < values_[c + 1].
    const size_t c = std::upper_bound(values_.begin(), values_.end(), a) - values_.begin() - 1;
    const double below = a - values_[c];
    const double above = values_[c + 1] - a;
    const size_t code = below < above ? c : (above < below ? c + 1 : (c % 2 == 0 ? c : c + 1));
    return static_cast<uint8_t>(sign | code);
  }
  const std::vector<float>& values() const { return values_; }

 private:
  Fp8Format format_;
  std::vector<float> values_;  // finite non-negative values by code, increasing
};

TEST(QuantMathTest, DecodesTheFormatsDefiningValues) {
  const Fp8Format e4 = Fp8Format::kE4M3, e5 = Fp8Format::kE5M2;
  EXPECT_EQ(quant::DecodeFp8(0x7E, e4), 448.0f);
  EXPECT_EQ(quant::DecodeFp8(0xFE, e4), -448.0f);
  EXPECT_EQ(quant::DecodeFp8(0x38, e4), 1.0f);
  EXPECT_EQ(quant::DecodeFp8(0x08, e4), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(quant::DecodeFp8(0x01, e4), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(quant::DecodeFp8(0x07, e4), std::ldexp(7.0f, -9));  // largest subnormal
  EXPECT_TRUE(std::isnan(quant::DecodeFp8(0x7F, e4)));
  EXPECT_TRUE(std::signbit(quant::DecodeFp8(0xFF, e4)));
  EXPECT_EQ(quant::DecodeFp8(0x7B, e5), 57344.0f);
  EXPECT_EQ(quant::DecodeFp8(0x3C, e5), 1.0f);
  EXPECT_EQ(quant::DecodeFp8(0x04, e5), std::ldexp(1.0f, -14));
  EXPECT_EQ(quant::DecodeFp8(0x01, e5), std::ldexp(1.0f, -16));
  EXPECT_EQ(quant::DecodeFp8(0x7C, e5), std::numeric_limits<float>::infinity());
  EXPECT_EQ(quant::DecodeFp8(0xFC, e5), -std::numeric_limits<float>::infinity());
  for (uint32_t b : {0x7Du, 0x7Eu, 0x7Fu, 0xFDu, 0xFEu, 0xFFu}) {
    EXPECT_TRUE(std::isnan(quant::DecodeFp8(b, e5))) << b;
    EXPECT_EQ(std::signbit(quant::DecodeFp8(b, e5)), b >= 0x80) << b;
  }
  EXPECT_EQ(quant::FloatBits(quant::DecodeFp8(0x80, e4)), 0x80000000u);
  EXPECT_EQ(quant::Fp8Max(e4), 448.0f);
  EXPECT_EQ(quant::Fp8Max(e5), 57344.0f);
  EXPECT_EQ(quant::Fp8Emax(e4), 8);
  EXPECT_EQ(quant::Fp8Emax(e5), 15);
}

TEST(QuantMathTest, EveryByteRoundTripsAndValuesIncrease) {
  for (Fp8Format f : kFormats) {
    float previous = -1;
    for (uint32_t b = 0; b < 256; ++b) {
      const float x = quant::DecodeFp8(b, f);
      const uint32_t magnitude = b & 0x7F;
      uint32_t expected = b;
      if (std::isnan(x)) expected = (b & 0x80) | NanCode(f);  // NaNs are canonicalised
      if (std::isinf(x)) expected = (b & 0x80) | MaxCode(f);  // e5m2's Inf saturates
      EXPECT_EQ(quant::EncodeFp8(x, f), expected) << "format " << int(f) << " byte " << b;
      if (magnitude <= MaxCode(f) && b < 0x80) {
        EXPECT_GT(x, previous) << "byte " << b;  // codes order as their values
        previous = x;
      }
      if (magnitude <= MaxCode(f)) {
        EXPECT_EQ(quant::DecodeFp8(b ^ 0x80, f), -x) << "byte " << b;
      }
    }
  }
}

TEST(QuantMathTest, EncodeMatchesTheNearestValueReferenceOnAMillionInputsAndEveryMidpoint) {
  for (Fp8Format f : kFormats) {
    const ReferenceEncoder reference(f);
    size_t checked = 0;
    auto check = [&](uint32_t u) {
      const float x = Bits(u);
      ASSERT_EQ(quant::EncodeFp8(x, f), reference.Encode(x))
          << "format " << int(f) << " x " << x << " bits 0x" << std::hex << u;
      ++checked;
    };
    // A stride prime to 2^32 through every sign, exponent and mantissa region.
    for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) check(static_cast<uint32_t>(u));
    // Every midpoint between neighbouring values (past max too), and the fp32s either side.
    const std::vector<float>& v = reference.values();
    for (size_t c = 0; c + 1 < v.size(); ++c) {
      const float mid = (v[c] + v[c + 1]) / 2;  // exact: a midpoint has one more mantissa bit
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
        check(quant::FloatBits(x));
        check(quant::FloatBits(-x));
      }
    }
    for (uint32_t u = 0; u < 4096; ++u) check(u);  // fp32 subnormals and zero
    EXPECT_GT(checked, 1'000'000u);
  }
}

TEST(QuantMathTest, TiesRoundToEven) {
  const Fp8Format e4 = Fp8Format::kE4M3, e5 = Fp8Format::kE5M2;
  EXPECT_EQ(quant::EncodeFp8(1.0625f, e4), 0x38);  // 1.0 | 1.125: down to the even 1.0
  EXPECT_EQ(quant::EncodeFp8(1.1875f, e4), 0x3A);  // 1.125 | 1.25: up to the even 1.25
  EXPECT_EQ(quant::EncodeFp8(std::nextafter(1.0625f, 2.0f), e4), 0x39);
  EXPECT_EQ(quant::EncodeFp8(-1.0625f, e4), 0xB8);
  EXPECT_EQ(quant::EncodeFp8(std::ldexp(0.5f, -9), e4), 0x00);  // half the smallest subnormal
  EXPECT_EQ(quant::EncodeFp8(std::ldexp(1.5f, -9), e4), 0x02);
  EXPECT_EQ(quant::EncodeFp8(std::ldexp(2.5f, -9), e4), 0x02);
  EXPECT_EQ(quant::EncodeFp8(std::ldexp(7.5f, -9), e4), 0x08);  // into the smallest normal
  EXPECT_EQ(quant::EncodeFp8(432.0f, e4), 0x7E);                // 416 | 448: up to the even 448
  EXPECT_EQ(quant::EncodeFp8(1.125f, e5), 0x3C);
  EXPECT_EQ(quant::EncodeFp8(1.375f, e5), 0x3E);
  EXPECT_EQ(quant::EncodeFp8(std::ldexp(0.5f, -16), e5), 0x00);
  EXPECT_EQ(quant::EncodeFp8(std::ldexp(1.5f, -16), e5), 0x02);
  EXPECT_EQ(quant::EncodeFp8(std::ldexp(3.5f, -16), e5), 0x04);  // into the smallest normal
}

TEST(QuantMathTest, SaturatesNaNsKeepTheirSignAndZerosTheirs) {
  const float inf = std::numeric_limits<float>::infinity();
  const float big = std::numeric_limits<float>::max();
  for (Fp8Format f : kFormats) {
    const uint8_t max = MaxCode(f), nan = NanCode(f);
    for (float x :
         {quant::Fp8Max(f), quant::Fp8Max(f) * 1.03f, quant::Fp8Max(f) * 1.2f, 1e30f, big, inf}) {
      EXPECT_EQ(quant::EncodeFp8(x, f), max) << x;
      EXPECT_EQ(quant::EncodeFp8(-x, f), 0x80 | max) << x;
    }
    for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0x7FA00000u}) {
      EXPECT_EQ(quant::EncodeFp8(Bits(u), f), nan);
      EXPECT_EQ(quant::EncodeFp8(Bits(u | 0x80000000u), f), 0x80 | nan);
    }
    EXPECT_EQ(quant::EncodeFp8(0.0f, f), 0x00);
    EXPECT_EQ(quant::EncodeFp8(-0.0f, f), 0x80);
    EXPECT_EQ(quant::EncodeFp8(Bits(0x00000001), f), 0x00);  // fp32 subnormals
    EXPECT_EQ(quant::EncodeFp8(Bits(0x807FFFFF), f), 0x80);
    EXPECT_EQ(quant::EncodeFp8(-1e-30f, f), 0x80);  // rounds to zero, keeps the sign
  }
}

TEST(QuantMathTest, HalfToFloatIsExactForEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const bool negative = h & 0x8000;
    const int exponent = (h >> 10) & 0x1F;
    const int mantissa = h & 0x3FF;
    const float got = quant::HalfToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(std::signbit(got), negative) << h;
    if (exponent == 31) {
      if (mantissa == 0) {
        ASSERT_TRUE(std::isinf(got)) << h;
      } else {
        ASSERT_TRUE(std::isnan(got)) << h;
        ASSERT_EQ(quant::FloatBits(got) & 0x7FFFFF, uint32_t(mantissa) << 13) << h;  // payload
      }
      continue;
    }
    const double magnitude = exponent == 0 ? std::ldexp(double(mantissa), -24)
                                           : std::ldexp(double(1024 + mantissa), exponent - 25);
    ASSERT_EQ(double(got), negative ? -magnitude : magnitude) << h;
  }
  EXPECT_EQ(quant::Bf16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(quant::Bf16ToFloat(0xC040), -3.0f);
  EXPECT_EQ(quant::FloatBits(quant::Bf16ToFloat(0x0001)), 0x00010000u);  // a subnormal
}

TEST(QuantMathTest, AmaxSkipsNaNAndInf) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(quant::AmaxUpdate(0, -3), 3);
  EXPECT_EQ(quant::AmaxUpdate(5, -3), 5);
  EXPECT_EQ(quant::AmaxUpdate(5, inf), 5);
  EXPECT_EQ(quant::AmaxUpdate(5, -inf), 5);
  EXPECT_EQ(quant::AmaxUpdate(5, nan), 5);
  EXPECT_EQ(quant::AmaxUpdate(5, -nan), 5);
  EXPECT_EQ(quant::AmaxUpdate(0, -0.0f), 0);
  EXPECT_EQ(quant::AmaxUpdate(0, Bits(0x80000001)), Bits(1));
  EXPECT_EQ(quant::AmaxUpdate(0, std::numeric_limits<float>::max()),
            std::numeric_limits<float>::max());
}

TEST(QuantMathTest, Fp32ScalesAreAmaxOverMaxOrOne) {
  const Fp8Format e4 = Fp8Format::kE4M3, e5 = Fp8Format::kE5M2;
  EXPECT_EQ(quant::ScaleFromAmax(0, e4), 1.0f);
  EXPECT_EQ(quant::ScaleFromAmax(448, e4), 1.0f);
  EXPECT_EQ(quant::ScaleFromAmax(57344, e5), 1.0f);
  EXPECT_EQ(quant::ScaleFromAmax(1, e4), 1.0f / 448.0f);
  EXPECT_EQ(quant::ScaleFromAmax(Bits(1), e4), 1.0f);                    // underflows to 0
  EXPECT_EQ(quant::ScaleFromAmax(Bits(1024), e4), Bits(1024) / 448.0f);  // a subnormal scale
  EXPECT_GT(quant::ScaleFromAmax(Bits(1024), e4), 0.0f);
  EXPECT_EQ(quant::ScaleFromAmax(std::numeric_limits<float>::infinity(), e4), 1.0f);
  EXPECT_EQ(quant::QuantizeScaled(448, 1, e4), 0x7E);
  EXPECT_EQ(quant::QuantizeScaled(-1, 1.0f / 448.0f, e4), 0xFE);
}

TEST(QuantMathTest, MxScalesAreTheAmaxBinadeLessEmax) {
  const Fp8Format e4 = Fp8Format::kE4M3, e5 = Fp8Format::kE5M2;
  EXPECT_EQ(quant::MxScaleFromAmax(0, e4), 127);
  EXPECT_EQ(quant::MxScaleFromAmax(448, e4), 127);
  EXPECT_EQ(quant::MxScaleFromAmax(256, e4), 127);
  EXPECT_EQ(quant::MxScaleFromAmax(255.9f, e4), 126);
  EXPECT_EQ(quant::MxScaleFromAmax(1, e4), 119);
  EXPECT_EQ(quant::MxScaleFromAmax(1, e5), 112);
  EXPECT_EQ(quant::MxScaleFromAmax(std::numeric_limits<float>::max(), e4), 127 + 127 - 8);
  EXPECT_EQ(quant::MxScaleFromAmax(std::ldexp(1.0f, -100), e4), 127 - 108);
  EXPECT_EQ(quant::MxScaleFromAmax(std::ldexp(1.0f, -119), e4), 0);  // -127, the clamp
  EXPECT_EQ(quant::MxScaleFromAmax(std::ldexp(1.0f, -140), e4), 0);  // subnormal, clamped
  EXPECT_EQ(quant::MxScaleFromAmax(std::ldexp(1.0f, -140), e5), 0);
  EXPECT_EQ(quant::MxScaleFromAmax(std::ldexp(1.0f, -110), e5), 2);
  EXPECT_EQ(quant::MxScaleFromAmax(std::ldexp(3.0f, -112), e5), 1);  // 2^-111 binade -15 = -126
  EXPECT_EQ(quant::MxScaleFromAmax(std::numeric_limits<float>::infinity(), e4), 127);
  // Subnormal amaxes: floor(log2) from the highest set bit of the fp32 pattern (always below
  // -127 once Emax is taken off, so clamped).
  for (int bit = 0; bit < 23; ++bit) {
    const int e = std::max(bit - 149 - 8, -127);
    const uint32_t amax = (1u << bit) | ((1u << bit) - 1) / 2;  // highest set bit: `bit`
    EXPECT_EQ(quant::MxScaleFromAmax(Bits(amax), e4), e + 127) << bit;
  }
  for (int b = 0; b < 255; ++b) {
    EXPECT_EQ(quant::MxMultiplier(b), std::ldexp(1.0f, 127 - b)) << b;
    EXPECT_EQ(quant::MxScale(b), std::ldexp(1.0f, b - 127)) << b;
  }
  EXPECT_TRUE(std::isnan(quant::MxMultiplier(255)));
  EXPECT_EQ(quant::QuantizeMx(448, 127, e4), 0x7E);
  EXPECT_EQ(quant::QuantizeMx(3.5f, 119, e4), 0x7E);  // 3.5 * 2^8 = 896 saturates
  EXPECT_EQ(quant::QuantizeMx(1.75f, 119, e4), 0x7E);
}

// ----- QuantizeTile against a naive quantizer -----

uint32_t RandomSourceBits(std::mt19937_64& rng, DType dtype, double block_scale) {
  std::uniform_int_distribution<int> kind(0, 99);
  const int k = kind(rng);
  float x;
  if (k < 60) {
    x = static_cast<float>(std::normal_distribution<double>(0, block_scale)(rng));
  } else if (k < 64) {
    x = k % 2 ? 0.0f : -0.0f;
  } else if (k < 66) {
    x = (k % 2 ? 1 : -1) * std::numeric_limits<float>::infinity();
  } else if (k < 68) {
    x = (k % 2 ? 1 : -1) * std::numeric_limits<float>::quiet_NaN();
  } else if (k < 70) {
    x = static_cast<float>(block_scale * 1e6);  // an isolated huge value
  } else {
    // Any bit pattern of the source type: subnormals, huge and tiny values, NaN payloads.
    const uint64_t bits = rng();
    return dtype == DType::kFp32 ? static_cast<uint32_t>(bits) : static_cast<uint16_t>(bits);
  }
  const uint32_t u = quant::FloatBits(x);
  if (dtype == DType::kFp32) return u;
  if (dtype == DType::kBf16) return u >> 16;
  // fp16 by truncation is fine here: the test only needs binary16 patterns near x.
  const uint32_t sign = (u >> 16) & 0x8000;
  const int e = static_cast<int>((u >> 23) & 0xFF) - 127 + 15;
  if (std::isnan(x)) return sign | 0x7E00;
  if (e >= 31) return sign | 0x7C00;
  if (e <= 0) return sign;
  return sign | (e << 10) | ((u >> 13) & 0x3FF);
}

float SourceToFloat(DType dtype, const uint8_t* p) {
  if (dtype == DType::kFp32) {
    float x;
    std::memcpy(&x, p, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == DType::kBf16 ? quant::Bf16ToFloat(h) : quant::HalfToFloat(h);
}

// Every element by its multi-index: its block's index, the block's amax, then its byte.
void NaiveQuantize(const QuantTile& t, std::vector<uint8_t>& out, std::vector<uint8_t>& scales) {
  const int nd = t.ndim;
  int64_t elements = 1, blocks = 1;
  int64_t nb[kMaxTensorDims];
  for (int k = 0; k < nd; ++k) {
    elements *= t.extent[k];
    nb[k] = (t.extent[k] + t.block[k] - 1) / t.block[k];
    blocks *= nb[k];
  }
  out.assign(elements, 0);
  scales.assign(blocks * ScaleBytes(t.arith), 0);
  std::vector<float> amax(blocks, 0.0f);
  const int elem = DTypeSize(t.src_dtype);
  auto visit = [&](auto&& fn) {
    for (int64_t flat = 0; flat < elements; ++flat) {
      int64_t rest = flat, src = 0, block = 0, block_stride = 1;
      for (int k = nd - 1; k >= 0; --k) {
        const int64_t i = rest % t.extent[k];
        rest /= t.extent[k];
        src += i * t.src_strides[k];
        block += (i / t.block[k]) * block_stride;
        block_stride *= nb[k];
      }
      fn(flat, SourceToFloat(t.src_dtype, t.src + src * elem), block);
    }
  };
  visit([&](int64_t, float x, int64_t b) { amax[b] = quant::AmaxUpdate(amax[b], x); });
  for (int64_t b = 0; b < blocks; ++b) {
    if (t.arith == QuantArith::kMx) {
      scales[b] = quant::MxScaleFromAmax(amax[b], t.format);
    } else {
      const float s = quant::ScaleFromAmax(amax[b], t.format);
      std::memcpy(&scales[b * 4], &s, 4);
    }
  }
  visit([&](int64_t flat, float x, int64_t b) {
    out[flat] = t.arith == QuantArith::kMx
                    ? quant::QuantizeMx(x, scales[b], t.format)
                    : quant::QuantizeScaled(x, quant::FloatFromBits([&] {
                                              uint32_t u;
                                              std::memcpy(&u, &scales[b * 4], 4);
                                              return u;
                                            }()),
                                            t.format);
  });
}

// A tile of random extents and blocks inside a bigger source buffer: dims permuted, padded and
// sometimes reversed (negative strides), so nothing is contiguous but what the case asks for.
struct TileCase {
  QuantTile tile;
  std::vector<uint8_t> source;
};

TileCase RandomTile(std::mt19937_64& rng, int ndim, const int64_t* extents, const int64_t* blocks,
                    bool contiguous_last) {
  TileCase c;
  QuantTile& t = c.tile;
  const DType dtypes[] = {DType::kBf16, DType::kFp16, DType::kFp32};
  t.src_dtype = dtypes[rng() % 3];
  t.arith = rng() % 2 ? QuantArith::kMx : QuantArith::kFp32Scale;
  t.format = rng() % 2 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  t.ndim = ndim;
  // Layout: dims in a random order, each with some padding.
  int order[kMaxTensorDims];
  for (int k = 0; k < ndim; ++k) order[k] = k;
  std::shuffle(order, order + ndim, rng);
  if (contiguous_last && ndim > 0) {
    std::swap(*std::find(order, order + ndim, ndim - 1), order[ndim - 1]);
  }
  int64_t stride = 1, span = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    const int k = order[i];
    const bool pad = !(contiguous_last && i == ndim - 1) && rng() % 2;
    const int64_t step = stride * (pad ? 1 + rng() % 3 : 1);
    t.extent[k] = extents[k];
    t.block[k] = blocks[k];
    t.src_strides[k] = step;
    stride = step * std::max<int64_t>(extents[k], 1) + (rng() % 2);
    span = stride;
  }
  int64_t base = 0;
  for (int k = 0; k < ndim; ++k) {
    if (!(contiguous_last && k == ndim - 1) && rng() % 4 == 0 && t.extent[k] > 0) {
      base += (t.extent[k] - 1) * t.src_strides[k];  // walk this dim backwards
      t.src_strides[k] = -t.src_strides[k];
    }
  }
  const int elem = DTypeSize(t.src_dtype);
  c.source.resize((span + 1) * elem);
  // Per-block magnitudes over a huge range, so blocks differ in scale.
  const double block_scale = std::ldexp(1.0, static_cast<int>(rng() % 60) - 30);
  for (int64_t i = 0; i < span + 1; ++i) {
    const uint32_t bits = RandomSourceBits(rng, t.src_dtype, block_scale);
    std::memcpy(&c.source[i * elem], &bits, elem);  // little-endian: the low bytes
  }
  t.src = c.source.data() + base * elem;
  return c;
}

void ExpectMatchesNaive(QuantTile t, const std::string& what) {
  std::vector<uint8_t> want_out, want_scales;
  NaiveQuantize(t, want_out, want_scales);
  // Guard bytes after both outputs: nothing may be written beyond them.
  std::vector<uint8_t> out(want_out.size() + 16, 0xA5), scales(want_scales.size() + 16, 0xA5);
  t.out = out.data();
  t.scales = scales.data();
  ASSERT_EQ(NumBlocks(t) * ScaleBytes(t.arith), static_cast<int64_t>(want_scales.size()));
  QuantizeTile(t);
  for (size_t i = 0; i < want_scales.size(); ++i) {
    ASSERT_EQ(scales[i], want_scales[i]) << what << ": scale byte " << i;
  }
  for (size_t i = 0; i < want_out.size(); ++i) {
    ASSERT_EQ(out[i], want_out[i]) << what << ": element " << i;
  }
  for (size_t i = 0; i < 16; ++i) {
    ASSERT_EQ(out[want_out.size() + i], 0xA5) << what;
    ASSERT_EQ(scales[want_scales.size() + i], 0xA5) << what;
  }
}

std::string Describe(const QuantTile& t, int iteration) {
  std::string s = "case " + std::to_string(iteration) + " dtype " +
                  std::string(DTypeName(t.src_dtype)) +
                  (t.arith == QuantArith::kMx ? " mx" : " fp32-scale") +
                  (t.format == Fp8Format::kE4M3 ? " e4m3" : " e5m2") + " extents";
  for (int k = 0; k < t.ndim; ++k) s += " " + std::to_string(t.extent[k]);
  s += " blocks";
  for (int k = 0; k < t.ndim; ++k) s += " " + std::to_string(t.block[k]);
  s += " strides";
  for (int k = 0; k < t.ndim; ++k) s += " " + std::to_string(t.src_strides[k]);
  return s;
}

TEST(QuantizeTileTest, RandomStridedTilesWithPartialBlocksMatchTheNaiveQuantizer) {
  std::mt19937_64 rng(13);
  for (int iteration = 0; iteration < 1500; ++iteration) {
    const int ndim = static_cast<int>(rng() % 5);
    int64_t extents[kMaxTensorDims], blocks[kMaxTensorDims];
    for (int k = 0; k < ndim; ++k) {
      extents[k] = rng() % 20 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 9);
      blocks[k] = 1 + static_cast<int64_t>(rng() % (extents[k] + 3));  // partial, even oversized
    }
    TileCase c = RandomTile(rng, ndim, extents, blocks, rng() % 2);
    ExpectMatchesNaive(c.tile, Describe(c.tile, iteration));
    if (HasFatalFailure()) return;
  }
}

// Shapes of the real schemes, large enough that the last dim is cut into several chunks of
// blocks (256 blocks, or the blocks of 256 KiB of source).
TEST(QuantizeTileTest, SchemeShapesAcrossChunksMatchTheNaiveQuantizer) {
  std::mt19937_64 rng(1313);
  struct Shape {
    int ndim;
    int64_t extent[3];
    int64_t block[3];
  };
  const Shape shapes[] = {
      {2, {3, 9000}, {1, 32}},       // MX rows: 282 blocks per row, the last partial
      {2, {130, 1100}, {128, 128}},  // 128x128 blocks, several per chunk, partial at both ends
      {2, {7, 3001}, {1, 3001}},     // per channel
      {2, {45, 77}, {45, 77}},       // per tensor
      {2, {45, 77}, {90, 200}},      // a tile of a sharded tensor: one partial block
      {3, {3, 5, 700}, {2, 3, 32}}, {1, {20000}, {32}},
  };
  int iteration = 0;
  for (const Shape& s : shapes) {
    for (bool contiguous : {true, false}) {
      TileCase c = RandomTile(rng, s.ndim, s.extent, s.block, contiguous);
      ExpectMatchesNaive(c.tile, Describe(c.tile, iteration++));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(QuantizeTileTest, ZeroDimTileIsOneBlockOfOneElement) {
  const float x = -3.0f;
  QuantTile t;
  t.src_dtype = DType::kFp32;
  t.src = reinterpret_cast<const uint8_t*>(&x);
  uint8_t out = 0;
  uint8_t scales[4] = {};
  t.out = &out;
  t.scales = scales;
  EXPECT_EQ(NumBlocks(t), 1);
  QuantizeTile(t);
  float scale;
  std::memcpy(&scale, scales, 4);
  EXPECT_EQ(scale, 3.0f / 448.0f);
  EXPECT_EQ(out, 0xFE);  // -max: the block's amax element lands on the format's max
  t.arith = QuantArith::kMx;
  QuantizeTile(t);
  EXPECT_EQ(scales[0], 127 + 1 - 8);
  EXPECT_EQ(out, quant::EncodeFp8(-3.0f * std::ldexp(1.0f, 7), Fp8Format::kE4M3));
}

TEST(QuantizeTileTest, AllZeroNaNOrInfBlocksGetTheNeutralScale) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float x[8] = {0.0f, -0.0f, 0.0f, 0.0f, nan, -nan, inf, -inf};
  QuantTile t;
  t.src_dtype = DType::kFp32;
  t.src = reinterpret_cast<const uint8_t*>(x);
  t.ndim = 1;
  t.extent[0] = 8;
  t.src_strides[0] = 1;
  t.block[0] = 4;
  uint8_t out[8];
  uint8_t scales[8];
  t.out = out;
  t.scales = scales;
  QuantizeTile(t);
  float s[2];
  std::memcpy(s, scales, 8);
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], 1.0f);
  const uint8_t want[8] = {0x00, 0x80, 0x00, 0x00, 0x7F, 0xFF, 0x7E, 0xFE};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], want[i]) << i;
  t.arith = QuantArith::kMx;
  QuantizeTile(t);
  EXPECT_EQ(scales[0], 127);
  EXPECT_EQ(scales[1], 127);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], want[i]) << i;
}

TEST(QuantizeTileTest, EmptyTileWritesNothing) {
  QuantTile t;
  t.ndim = 2;
  t.extent[0] = 0;
  t.extent[1] = 5;
  t.block[0] = t.block[1] = 2;
  EXPECT_EQ(NumBlocks(t), 0);
  QuantizeTile(t);  // null pointers are fine: nothing is read or written
}

TEST(QuantizeTileDeathTest, InvalidTilesAreBrokenInvariants) {
  QuantTile t;
  t.ndim = 1;
  t.extent[0] = 4;
  t.block[0] = 0;
  EXPECT_DEATH(NumBlocks(t), "block extents must be at least 1");
  t.block[0] = 2;
  t.src_dtype = DType::kI8;
  EXPECT_DEATH(NumBlocks(t), "bf16, fp16 or fp32");
}

}  // namespace
}  // namespace reshard::plan
