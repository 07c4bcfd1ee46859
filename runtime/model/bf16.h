// Host and device helpers for bfloat16 values held as raw bits (uint16_t), so host code
// (checkpoints, the CPU reference, tests) needs no CUDA header.
//
//   uint16_t bits = kiln::FloatToBf16Bits(0.1f);   // round to nearest even
//   float back = kiln::Bf16BitsToFloat(bits);       // exact
//
// The conversion is written out in integer arithmetic, so host and device produce identical
// bits (the seeded weight initialisation relies on that). Header-only; thread-safe.
#ifndef KILN_RUNTIME_MODEL_BF16_H_
#define KILN_RUNTIME_MODEL_BF16_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln {

// Returns the bfloat16 nearest to `value` (ties to even) as raw bits. NaN stays a quiet NaN.
KILN_HOST_DEVICE inline uint16_t FloatToBf16Bits(float value) {
  uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(value);
#else
  std::memcpy(&bits, &value, sizeof(bits));
#endif
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN: keep it a NaN after truncation
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Returns the float whose value equals the bfloat16 `bits` (exact).
KILN_HOST_DEVICE inline float Bf16BitsToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(wide);
#else
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
#endif
}

// Returns the float whose value equals the IEEE half-precision `bits` (exact; subnormals, infinities
// and NaNs included). Host-only: checkpoints stored in float16 convert through it.
inline float Fp16BitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t wide;
  if (exponent == 0x1fu) {
    wide = sign | 0x7f800000u | (mantissa << 13);  // infinity or NaN
  } else if (exponent != 0) {
    wide = sign | ((exponent + 112u) << 23) | (mantissa << 13);  // rebias 15 -> 127
  } else if (mantissa == 0) {
    wide = sign;  // signed zero
  } else {
    // A subnormal, mantissa * 2^-24: shift its leading one into the implicit bit.
    exponent = 113u;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    wide = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// Returns `value` rounded to float and then to the nearest bfloat16 (ties to even), as a double:
// the rounding a kernel applies when it stores a float result as bf16.
inline double RoundToBf16(double value) {
  return static_cast<double>(Bf16BitsToFloat(FloatToBf16Bits(static_cast<float>(value))));
}

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_BF16_H_
