// Host tests of the bf16 helpers' float16 conversion: every one of the 65,536 half-precision bit
// patterns against the value its fields define (sign, exponent, mantissa through std::ldexp).
#include "runtime/model/bf16.h"

#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(Bf16Test, Fp16BitsToFloatIsExactForEveryPattern) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const double sign = (bits & 0x8000u) != 0 ? -1.0 : 1.0;
    const int exponent = static_cast<int>((bits >> 10) & 0x1fu);
    const int mantissa = static_cast<int>(bits & 0x3ffu);
    const float got = Fp16BitsToFloat(static_cast<uint16_t>(bits));
    if (exponent == 31) {
      if (mantissa == 0) {
        EXPECT_TRUE(std::isinf(got) && std::signbit(got) == (sign < 0)) << bits;
      } else {
        EXPECT_TRUE(std::isnan(got)) << bits;
      }
      continue;
    }
    const double want = exponent == 0 ? sign * std::ldexp(mantissa, -24)
                                      : sign * std::ldexp(1024 + mantissa, exponent - 25);
    EXPECT_EQ(static_cast<double>(got), want) << "bits 0x" << std::hex << bits;
    EXPECT_EQ(std::signbit(got), sign < 0) << bits;  // -0 stays -0
  }
}

}  // namespace
}  // namespace kiln
