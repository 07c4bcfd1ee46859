#include "attention/rope_frequency.h"

#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

constexpr double kPi = 3.14159265358979323846;

// Llama 3's scaling as Meta's reference and Hugging Face write it: by wavelength.
double Llama3Frequency(double theta, int i, int d, const RopeScaling& s) {
  const double freq = 1.0 / std::pow(theta, 2.0 * i / d);
  const double wavelength = 2.0 * kPi / freq;
  const double low_wavelength = s.original_max_position / s.low_freq_factor;
  const double high_wavelength = s.original_max_position / s.high_freq_factor;
  if (wavelength < high_wavelength) return freq;
  if (wavelength > low_wavelength) return freq / s.factor;
  const double smooth = (s.original_max_position / wavelength - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * freq / s.factor + smooth * freq;
}

TEST(RopeFrequencyTest, UnscaledIsThetaToTheMinusTwoIOverD) {
  for (double theta : {10000.0, 500000.0, 1000000.0}) {
    for (int d : {64, 128}) {
      const RopeFrequencies f = RopeFrequencies::Make(theta, RopeScaling());
      EXPECT_EQ(f.scaled, 0);
      for (int i = 0; i < d / 2; ++i) {
        const double want = std::pow(theta, -2.0 * i / d);
        EXPECT_NEAR(RopeFrequency(f, i, d), want, 1e-14 * want) << theta << " " << d << " " << i;
      }
    }
  }
}

// Llama 3.2 1B (factor 32) and Llama 3.1 8B (factor 8) at their head widths, and a short
// original length that puts most pairs of a small theta in the blended band.
TEST(RopeFrequencyTest, Llama3ScalingMatchesTheWavelengthForm) {
  struct Case {
    double theta;
    int d;
    RopeScaling s;
  };
  const Case cases[] = {{500000.0, 64, RopeScaling::Llama3(32.0, 1.0, 4.0, 8192)},
                        {500000.0, 128, RopeScaling::Llama3(8.0, 1.0, 4.0, 8192)},
                        {10000.0, 64, RopeScaling::Llama3(8.0, 1.0, 4.0, 64)}};
  for (const Case& c : cases) {
    ASSERT_TRUE(c.s.Validate().ok());
    const RopeFrequencies f = RopeFrequencies::Make(c.theta, c.s);
    int kept = 0, divided = 0, blended = 0;
    for (int i = 0; i < c.d / 2; ++i) {
      const double plain = std::pow(c.theta, -2.0 * i / c.d);
      const double got = RopeFrequency(f, i, c.d);
      const double want = Llama3Frequency(c.theta, i, c.d, c.s);
      EXPECT_NEAR(got, want, 1e-13 * want) << c.s.ToString() << " pair " << i;
      if (std::abs(got - plain) <= 1e-13 * plain) {
        ++kept;
      } else if (std::abs(got - plain / c.s.factor) <= 1e-13 * plain) {
        ++divided;
      } else {
        EXPECT_LT(got, plain);
        EXPECT_GT(got, plain / c.s.factor);
        ++blended;
      }
    }
    // Every case has pairs in each band, so each branch is checked.
    EXPECT_GT(kept, 0) << c.s.ToString();
    EXPECT_GT(divided, 0) << c.s.ToString();
    EXPECT_GT(blended, 0) << c.s.ToString();
  }
}

TEST(RopeFrequencyTest, ScalingIsContinuousAtTheBandEdges) {
  const RopeScaling s = RopeScaling::Llama3(32.0, 1.0, 4.0, 8192);
  const RopeFrequencies f = RopeFrequencies::Make(500000.0, s);
  // Between the edges the blend runs from freq / factor (s = 0) to freq (s = 1).
  EXPECT_NEAR(f.divide_below * f.blend_scale - f.blend_offset, 0.0, 1e-12);
  EXPECT_NEAR(f.keep_from * f.blend_scale - f.blend_offset, 1.0, 1e-12);
  EXPECT_NEAR(f.divide_below, 2.0 * kPi / 8192.0, 1e-18);
  EXPECT_NEAR(f.keep_from, 2.0 * kPi * 4.0 / 8192.0, 1e-18);
}

TEST(RopeFrequencyTest, ValidateNamesTheBadField) {
  EXPECT_TRUE(RopeScaling().Validate().ok());
  EXPECT_THAT(std::string(RopeScaling::Llama3(0.5, 1.0, 4.0, 8192).Validate().message()),
              HasSubstr("factor is 0.5"));
  EXPECT_THAT(std::string(RopeScaling::Llama3(8.0, 0.0, 4.0, 8192).Validate().message()),
              HasSubstr("low_freq_factor is 0"));
  EXPECT_THAT(std::string(RopeScaling::Llama3(8.0, 4.0, 4.0, 8192).Validate().message()),
              HasSubstr("high_freq_factor is 4; it must be finite and above low_freq_factor 4"));
  EXPECT_THAT(std::string(RopeScaling::Llama3(8.0, 1.0, 4.0, 0).Validate().message()),
              HasSubstr("original_max_position is 0"));
  EXPECT_THAT(std::string(RopeScaling::Llama3(NAN, 1.0, 4.0, 8192).Validate().message()),
              HasSubstr("factor is nan"));
}

TEST(RopeFrequencyTest, ToStringNamesTheValues) {
  EXPECT_EQ(RopeScaling().ToString(), "none");
  EXPECT_EQ(RopeScaling::Llama3(32.0, 1.0, 4.0, 8192).ToString(),
            "llama3 x32 (low 1, high 4, original 8192)");
}

}  // namespace
}  // namespace kiln
