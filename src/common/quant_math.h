// The arithmetic of FP8 quantization, compiled for host and device (docs/quantization.md).
//
// A quantized tensor travels as FP8 elements plus one scale per block of elements. The tile
// quantizer on the host (src/plan/quantize.h) and the CUDA kernels call these same functions, so
// a tensor quantized on either side is bit for bit the same, and the arithmetic is tested on
// machines without a GPU: exhaustively against itself (tests/plan/quantize_test.cc) and against
// the `ml_dtypes` Python package (tests/quant/check_ml_dtypes.py).
//
// Everything is integer bit manipulation plus exactly one IEEE fp32 division or multiplication
// per element, written out with __fdiv_rn / __fmul_rn on the device: nothing depends on the
// rounding mode, and nvcc's --prec-div cannot change a result. What the results do assume is
// that fp32 subnormals are kept, since x / scale may be one: no flush-to-zero, the default of
// nvcc (-ftz=false, which --use_fast_math would turn on) and of host compilers without
// -ffast-math.
//
// Formats (OCP 8-bit floating point):
//   kE4M3: "E4M3FN": bias 7, no infinities, NaN = S.1111.111 (0x7F / 0xFF), max 448 (0x7E).
//   kE5M2: IEEE-like: bias 15, Inf = S.11111.00, NaN = S.11111.{01,10,11}, max 57344 (0x7B).
#pragma once

#include <cstdint>
#include <cstring>

#include "src/common/host_device.h"

namespace reshard::quant {

enum class Fp8Format : uint8_t { kE4M3, kE5M2 };

// ----- Bit casts and exact helpers, identical on host and device -----

RESHARD_HD inline uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

RESHARD_HD inline float FloatFromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

namespace internal {

// Index of the highest set bit of u (u != 0).
RESHARD_HD inline int HighestBit(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return 31 - __clz(u);
#else
  return 31 - __builtin_clz(u);
#endif
}

// One correctly rounded (round to nearest even) fp32 division and multiplication. On the
// device the intrinsics keep nvcc's --use_fast_math and --prec-div from changing them.
RESHARD_HD inline float DivRn(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(x, y);
#else
  return x / y;
#endif
}

RESHARD_HD inline float MulRn(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(x, y);
#else
  return x * y;
#endif
}

// `r`, the result of an fp32 operation on operands whose sign bits XOR to `sign`, or when `r`
// is NaN the quiet NaN with that sign (the sign rule of a product or quotient). Which NaN an
// operation returns is not the same everywhere (x86 returns a NaN operand, its first one when
// both are NaN, in whichever order the compiler put them, and a negative NaN for Inf x 0;
// a GPU may return one canonical NaN), and the FP8 encoders keep a NaN's sign, so the sign of
// every NaN result is written out. Branch-free (a compare and a select).
RESHARD_HD inline float NanWithSign(float r, uint32_t sign) {
  const uint32_t bits = FloatBits(r);
  return FloatFromBits((bits & 0x7FFFFFFFu) > 0x7F800000u ? (sign & 0x80000000u) | 0x7FC00000u
                                                          : bits);
}

// The constants of one format, in the terms of the encoder below.
template <Fp8Format F>
struct Fp8Traits;

template <>
struct Fp8Traits<Fp8Format::kE4M3> {
  static constexpr int kMantissaBits = 3;
  static constexpr int kBias = 7;
  static constexpr uint32_t kMaxCode = 0x7E;       // 448 = 1.75 * 2^8
  static constexpr int32_t kMaxBits = 0x43E00000;  // 448 as fp32
  static constexpr uint32_t kNanCode = 0x7F;
  static constexpr int kEmax = 8;
};

template <>
struct Fp8Traits<Fp8Format::kE5M2> {
  static constexpr int kMantissaBits = 2;
  static constexpr int kBias = 15;
  static constexpr uint32_t kMaxCode = 0x7B;       // 57344 = 1.75 * 2^15
  static constexpr int32_t kMaxBits = 0x47600000;  // 57344 as fp32
  static constexpr uint32_t kNanCode = 0x7E;       // the quiet NaN ml_dtypes produces
  static constexpr int kEmax = 15;
};

}  // namespace internal

// 2^n as an fp32, exactly, for n in [-149, 127] (below -126 a subnormal).
RESHARD_HD inline float Pow2(int n) {
  return n >= -126 ? FloatFromBits(static_cast<uint32_t>(n + 127) << 23)
                   : FloatFromBits(1u << (n + 149));
}

// ----- Formats -----

// The largest finite value: 448 (e4m3), 57344 (e5m2).
RESHARD_HD inline float Fp8Max(Fp8Format f) { return f == Fp8Format::kE4M3 ? 448.0f : 57344.0f; }

// The exponent of the largest power of two <= Fp8Max: 8 (e4m3), 15 (e5m2).
RESHARD_HD inline int Fp8Emax(Fp8Format f) { return f == Fp8Format::kE4M3 ? 8 : 15; }

// ----- Source element types -----

RESHARD_HD inline float Bf16ToFloat(uint16_t bits) {
  return FloatFromBits(static_cast<uint32_t>(bits) << 16);
}

// IEEE binary16 -> fp32, exact for every bit pattern: subnormals, +-0, +-Inf, and NaN with its
// sign and payload (as numpy converts).
RESHARD_HD inline float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const int32_t exponent = (bits >> 10) & 0x1F;
  const int32_t mantissa = bits & 0x3FF;
  const uint32_t normal =
      (static_cast<uint32_t>(exponent + 112) << 23) | (static_cast<uint32_t>(mantissa) << 13);
  const uint32_t inf_nan = 0x7F800000u | (static_cast<uint32_t>(mantissa) << 13);
  // Subnormal (mantissa * 2^-24): shift the mantissa up until its top bit reaches the hidden
  // bit's place (bit 10), in constant steps of 8, 4, 2 and 1, lowering the exponent as it goes.
  // Integers and selects only: loops over this vectorise with SSE2, with no float operation
  // that -ftrapping-math would keep inside a branch.
  int32_t m = mantissa;
  int32_t e = 113;  // the exponent field of 2^-14, less one per step of shift
  e = m < (1 << 3) ? e - 8 : e;
  m = m < (1 << 3) ? m << 8 : m;
  e = m < (1 << 7) ? e - 4 : e;
  m = m < (1 << 7) ? m << 4 : m;
  e = m < (1 << 9) ? e - 2 : e;
  m = m < (1 << 9) ? m << 2 : m;
  e = m < (1 << 10) ? e - 1 : e;
  m = m < (1 << 10) ? m << 1 : m;
  const uint32_t subnormal =
      mantissa == 0 ? 0u
                    : (static_cast<uint32_t>(e) << 23) | (static_cast<uint32_t>(m & 0x3FF) << 13);
  return FloatFromBits(sign | (exponent == 0x1F ? inf_nan : (exponent == 0 ? subnormal : normal)));
}

// ----- Encoding and decoding -----

// fp32 -> fp8, round to nearest, ties to even, saturating:
//   - |x| above Fp8Max rounds to +-max (+-Inf too): the result of clipping to [-max, max] first;
//   - NaN (any sign, any payload) -> sign | 0x7F (e4m3), sign | 0x7E (e5m2), the sign being the
//     fp32 sign bit (ml_dtypes keeps it too);
//   - fp8 subnormals are produced exactly; values below half the smallest one (every fp32
//     subnormal among them) become zero; zero keeps its sign, as does a value that rounds to zero.
// Bit for bit `np.clip(x, -max, max).astype(ml_dtypes.float8_e4m3fn)` (resp. float8_e5m2).
// Integer arithmetic only, without branches on the value and with constant shifts, so loops over
// it vectorise (SSE2 has no per-lane variable shift) and no floating-point mode can change it.
template <Fp8Format F>
RESHARD_HD inline uint8_t EncodeFp8As(float x) {
  using T = internal::Fp8Traits<F>;
  constexpr int kShift = 23 - T::kMantissaBits;  // fp32 mantissa bits dropped
  constexpr uint32_t kRebias = static_cast<uint32_t>(127 - T::kBias) << 23;
  constexpr int32_t kMinNormal = (128 - T::kBias) << 23;  // 2^(1-bias)
  // Above max (which rounds to max or beyond) the result is max: the clip before the encode.
  constexpr int32_t kMaxBits = T::kMaxBits;

  const uint32_t u = FloatBits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;

  // Normal range: rebase the exponent, then round the mantissa to its top bits; a carry out of
  // the mantissa correctly bumps the exponent. (Computed for every a, used only when normal.)
  const uint32_t code = a - kRebias;
  const uint32_t normal = (code + (1u << (kShift - 1)) - 1 + ((code >> kShift) & 1u)) >> kShift;

  // Subnormal range: |x| in units of the smallest subnormal 2^(1-bias-mbits), as a fixed-point
  // number with 25 fraction bits: the significand (hidden bit included) shifted left by its
  // exponent's distance from the lowest one that matters, then rounded to nearest even at the
  // binary point. Exponents below that lowest one hold less than a quarter of the smallest
  // subnormal and give 0; the highest one below the normal range needs a shift of mbits + 1. The shift is done in three constant steps (1, 2, 4) so that
  // the code stays free of per-lane variable shifts and of floating-point operations: SSE2
  // vectorises it, and flush-to-zero modes cannot change it.
  constexpr int32_t kLowestExponent = 151 - T::kBias - T::kMantissaBits - 25;
  static_assert(127 - T::kBias - kLowestExponent <= 7, "three shift steps cover 0..7");
  const int32_t biased_exponent = static_cast<int32_t>(a >> 23);
  const uint32_t significand = biased_exponent != 0 ? ((a & 0x7FFFFFu) | 0x800000u) : a;
  // Only the low three bits matter: lanes whose exponent is out of 0..7 take another path.
  const int32_t distance = biased_exponent - kLowestExponent;
  uint32_t fixed = significand;  // < 2^24, and < 2^31 after the shifts
  fixed = (distance & 1) != 0 ? fixed << 1 : fixed;
  fixed = (distance & 2) != 0 ? fixed << 2 : fixed;
  fixed = (distance & 4) != 0 ? fixed << 4 : fixed;
  uint32_t subnormal = (fixed + (1u << 24) - 1 + ((fixed >> 25) & 1u)) >> 25;
  subnormal = distance < 0 ? 0 : subnormal;

  // The comparisons are on a < 2^31 as a signed integer (SSE2 compares only signed 32-bit
  // lanes), against constants rather than as min/max (SSE2 has no 32-bit min/max either).
  const int32_t magnitude_bits = static_cast<int32_t>(a);
  uint32_t magnitude = magnitude_bits < kMinNormal ? subnormal : normal;
  magnitude = magnitude_bits > kMaxBits ? T::kMaxCode : magnitude;  // saturate (Inf included)
  magnitude = magnitude_bits > 0x7F800000 ? T::kNanCode : magnitude;
  return static_cast<uint8_t>(sign | magnitude);
}

RESHARD_HD inline uint8_t EncodeFp8(float x, Fp8Format f) {
  return f == Fp8Format::kE4M3 ? EncodeFp8As<Fp8Format::kE4M3>(x)
                               : EncodeFp8As<Fp8Format::kE5M2>(x);
}

// fp8 -> fp32, exact. NaN codes decode to the quiet NaN of their sign; e5m2's Inf to Inf.
template <Fp8Format F>
RESHARD_HD inline float DecodeFp8As(uint8_t b) {
  using T = internal::Fp8Traits<F>;
  constexpr int kMantissaBits = T::kMantissaBits;
  constexpr uint32_t kExponentMask = (0x7Fu >> kMantissaBits);
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exponent = (b & 0x7Fu) >> kMantissaBits;
  const uint32_t mantissa = b & ((1u << kMantissaBits) - 1);
  if constexpr (F == Fp8Format::kE4M3) {
    if ((b & 0x7Fu) == T::kNanCode) return FloatFromBits(sign | 0x7FC00000u);
  } else if (exponent == kExponentMask) {
    return FloatFromBits(sign | (mantissa == 0 ? 0x7F800000u : 0x7FC00000u));
  }
  if (exponent != 0) {
    return FloatFromBits(sign | ((exponent + 127 - T::kBias) << 23) |
                         (mantissa << (23 - kMantissaBits)));
  }
  // Subnormal: mantissa * 2^(1 - bias - mbits), exact in fp32.
  const float magnitude = static_cast<float>(mantissa) * Pow2(1 - T::kBias - kMantissaBits);
  return FloatFromBits(sign | FloatBits(magnitude));
}

RESHARD_HD inline float DecodeFp8(uint8_t b, Fp8Format f) {
  return f == Fp8Format::kE4M3 ? DecodeFp8As<Fp8Format::kE4M3>(b)
                               : DecodeFp8As<Fp8Format::kE5M2>(b);
}

// Dequantization of one element with its block's scale (an fp32 scale, or MxScale of the E8M0
// byte): DecodeFp8(q) * scale, one IEEE fp32 multiplication; a NaN result (a NaN code or scale,
// or e5m2's Inf times 0) has the sign of the code's sign XOR the scale's (NanWithSign). FP8
// sources of another scheme are dequantized with this before they are quantized again.
template <Fp8Format F>
RESHARD_HD inline float DequantizeAs(uint8_t q, float scale) {
  const float x = DecodeFp8As<F>(q);
  return internal::NanWithSign(internal::MulRn(x, scale), FloatBits(x) ^ FloatBits(scale));
}

RESHARD_HD inline float Dequantize(uint8_t q, float scale, Fp8Format f) {
  return f == Fp8Format::kE4M3 ? DequantizeAs<Fp8Format::kE4M3>(q, scale)
                               : DequantizeAs<Fp8Format::kE5M2>(q, scale);
}

// ----- Block statistics and scales -----

// max(amax, |x|) over finite x: NaN and +-Inf leave amax unchanged (so a block's amax is 0
// when it holds no finite nonzero element). Starts from amax = 0.
RESHARD_HD inline float AmaxUpdate(float amax, float x) {
  const uint32_t a = FloatBits(x) & 0x7FFFFFFFu;
  // Non-negative floats order as their bit patterns; a NaN or Inf (>= 0x7F800000) never wins.
  return a < 0x7F800000u && FloatFromBits(a) > amax ? FloatFromBits(a) : amax;
}

// fp32-scale schemes (per block, per channel, per tensor: only the block shape differs):
// amax / Fp8Max, one IEEE fp32 division; 1.0f when that is not > 0 (amax 0: an all-zero block
// or one without a finite element; or an amax so small that the quotient underflows), and when
// amax is not finite (AmaxUpdate never produces one). Dequantization is q * scale.
RESHARD_HD inline float ScaleFromAmax(float amax, Fp8Format f) {
  if ((FloatBits(amax) & 0x7FFFFFFFu) >= 0x7F800000u) return 1.0f;  // Inf or NaN
  const float scale = internal::DivRn(amax, Fp8Max(f));
  return scale > 0 ? scale : 1.0f;
}

// One element of an fp32-scale scheme: EncodeFp8(x / scale), one IEEE fp32 division.
template <Fp8Format F>
RESHARD_HD inline uint8_t QuantizeScaledAs(float x, float scale) {
  return EncodeFp8As<F>(
      internal::NanWithSign(internal::DivRn(x, scale), FloatBits(x) ^ FloatBits(scale)));
}

RESHARD_HD inline uint8_t QuantizeScaled(float x, float scale, Fp8Format f) {
  return EncodeFp8(
      internal::NanWithSign(internal::DivRn(x, scale), FloatBits(x) ^ FloatBits(scale)), f);
}

// MX (OCP microscaling) scale of a block, as its E8M0 byte e + 127 (the scale being 2^e):
// e = floor(log2(amax)) - Fp8Emax(f), from the fp32 bits (subnormal amax included), clamped to
// [-127, 127]; e = 0 (byte 127) when amax is 0, and when it is negative or not finite
// (AmaxUpdate produces neither). The block's largest element then lands in the format's top
// binade. Byte 255 (E8M0's NaN) is never produced.
RESHARD_HD inline uint8_t MxScaleFromAmax(float amax, Fp8Format f) {
  const uint32_t a = FloatBits(amax);
  if (a == 0 || a >= 0x7F800000u) return 127;  // +0; +Inf, NaN and every negative value
  const uint32_t biased_exponent = a >> 23;
  const int floor_log2 = biased_exponent != 0 ? static_cast<int>(biased_exponent) - 127
                                              : internal::HighestBit(a) - 149;
  int e = floor_log2 - Fp8Emax(f);
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return static_cast<uint8_t>(e + 127);
}

// The fp32 factor an MX element is multiplied by before encoding, 2^-(b - 127), exact for every
// byte the encoder produces (2^-127 is an fp32 subnormal). Byte 255, E8M0's NaN, gives NaN.
RESHARD_HD inline float MxMultiplier(uint8_t e8m0) {
  return e8m0 == 255 ? FloatFromBits(0x7FC00000u) : Pow2(127 - static_cast<int>(e8m0));
}

// The scale an MX element is dequantized with, q * 2^(b - 127). Byte 255 gives NaN.
RESHARD_HD inline float MxScale(uint8_t e8m0) {
  return e8m0 == 255 ? FloatFromBits(0x7FC00000u) : Pow2(static_cast<int>(e8m0) - 127);
}

// One MX element: EncodeFp8(x * 2^-(b - 127)), one IEEE fp32 multiplication (exact unless the
// product is an fp32 subnormal, then rounded once more by the encoder, identically everywhere).
template <Fp8Format F>
RESHARD_HD inline uint8_t QuantizeMxAs(float x, float multiplier) {
  return EncodeFp8As<F>(
      internal::NanWithSign(internal::MulRn(x, multiplier), FloatBits(x) ^ FloatBits(multiplier)));
}

RESHARD_HD inline uint8_t QuantizeMx(float x, uint8_t e8m0, Fp8Format f) {
  const float m = MxMultiplier(e8m0);
  return EncodeFp8(internal::NanWithSign(internal::MulRn(x, m), FloatBits(x) ^ FloatBits(m)), f);
}

}  // namespace reshard::quant
