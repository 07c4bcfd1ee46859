// Internal, tests and benchmarks only: host conversions between float and the 16-bit element
// types, and a fast seeded generator for filling large host arrays.
#ifndef KILN_ATTENTION_INTERNAL_TEST_UTIL_H_
#define KILN_ATTENTION_INTERNAL_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/attention_params.h"

namespace kiln {
namespace attention_internal {

// Bits of `x` rounded to nearest even in `dtype`.
inline uint16_t ToBits(float x, AttentionDtype dtype) {
  if (dtype == AttentionDtype::kBf16) {
    const __nv_bfloat16_raw raw = __float2bfloat16_rn(x);
    return raw.x;
  }
  const __half_raw raw = __float2half_rn(x);
  return raw.x;
}

// The float value of 16-bit `bits` in `dtype`.
inline float FromBits(uint16_t bits, AttentionDtype dtype) {
  if (dtype == AttentionDtype::kBf16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

// A quiet NaN in `dtype`: stale or unwritten memory in tests.
inline uint16_t NanBits(AttentionDtype dtype) {
  return dtype == AttentionDtype::kBf16 ? 0x7fc0 : 0x7e00;
}

// xorshift64*: fast, seeded, good enough for test data.
class FastRng {
 public:
  explicit FastRng(uint64_t seed) : state_(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t Next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545f4914f6cdd1dull;
  }
  // Uniform in [lo, hi).
  float Uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(Next() >> 40) * (1.f / 16777216.f);
  }

 private:
  uint64_t state_;
};

}  // namespace attention_internal
}  // namespace kiln

#endif  // KILN_ATTENTION_INTERNAL_TEST_UTIL_H_
