#include "attention/rope_frequency.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// A base the kernels take: finite and above 1 (a subnormal one makes the frequencies infinite).
TEST(RopeFrequencyTest, ThetaIsAFiniteBaseAboveOne) {
  for (double theta : {1.0000001, 10000.0, 500000.0, 1e300}) {
    EXPECT_TRUE(IsRopeTheta(theta)) << theta;
  }
  for (double theta : {1.0, 0.5, 1e-310, 0.0, -10000.0, std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_FALSE(IsRopeTheta(theta)) << theta;
  }
}

// Every field alike (the struct has padding, so not memcmp).
bool SameFrequencies(const RopeFrequencies& a, const RopeFrequencies& b) {
  return a.log2_theta == b.log2_theta && a.scaled == b.scaled && a.inv_factor == b.inv_factor &&
         a.keep_from == b.keep_from && a.divide_below == b.divide_below &&
         a.blend_scale == b.blend_scale && a.blend_offset == b.blend_offset;
}

// MakeValidated is Validate and Make in one derivation: the same refusal, else the same bits.
TEST(RopeFrequencyTest, MakeValidatedIsValidateThenMake) {
  for (const RopeScaling& s :
       {RopeScaling(), RopeScaling::Llama3(32.0, 1.0, 4.0, 8192),
        RopeScaling::Llama3(8.0, 1.0, 4.0, 64), RopeScaling::Llama3(0.5, 1.0, 4.0, 8192),
        RopeScaling::Llama3(8.0, 4.0, 4.0, 8192), RopeScaling::Llama3(8.0, 1.0, 4.0, 0),
        RopeScaling::Llama3(8.0, 1.0, 1.7e308, 8192)}) {
    for (double theta : {10000.0, 500000.0, 1e300}) {
      const absl::StatusOr<RopeFrequencies> f = RopeFrequencies::MakeValidated(theta, s);
      EXPECT_EQ(f.status(), s.Validate()) << s.ToString();
      if (f.ok()) {
        EXPECT_TRUE(SameFrequencies(*f, RopeFrequencies::Make(theta, s))) << s.ToString();
      }
    }
  }
  // The overflow of the band edges is refused like the fields.
  EXPECT_THAT(std::string(RopeFrequencies::MakeValidated(
                              500000.0, RopeScaling::Llama3(8.0, 1.0, 1.7e308, 8192))
                              .status()
                              .message()),
              HasSubstr("overflow a double"));
}

TEST(RopeFrequencyTest, ToStringNamesTheValues) {
  EXPECT_EQ(RopeScaling().ToString(), "none");
  EXPECT_EQ(RopeScaling::Llama3(32.0, 1.0, 4.0, 8192).ToString(),
            "llama3 x32 (low 1, high 4, original 8192)");
}


// --- Adversarial sweep: scalings and thetas as a config.json might hold them. Seeded.

// Zero of both signs, the smallest and largest doubles, values around 1, infinities and NaN.
double DrawDouble(std::mt19937& rng) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  static const double kEdges[] = {0.0,
                                  -0.0,
                                  std::numeric_limits<double>::denorm_min(),
                                  std::numeric_limits<double>::min(),
                                  1e-300,
                                  1e-9,
                                  0.5,
                                  1.0 - std::numeric_limits<double>::epsilon() / 2,
                                  1.0,
                                  1.0 + std::numeric_limits<double>::epsilon(),
                                  2.0,
                                  4.0,
                                  8.0,
                                  32.0,
                                  1e9,
                                  1e300,
                                  std::numeric_limits<double>::max(),
                                  kInf,
                                  -kInf,
                                  std::nan(""),
                                  -1.0,
                                  -1e-300};
  if (std::uniform_int_distribution<int>(0, 2)(rng) == 0) {
    return kEdges[std::uniform_int_distribution<size_t>(0, std::size(kEdges) - 1)(rng)];
  }
  // Mostly plausible: log-uniform over [2^-8, 2^20].
  return std::exp2(std::uniform_real_distribution<double>(-8, 20)(rng));
}

int32_t DrawLength(std::mt19937& rng) {
  static const int32_t kEdges[] = {std::numeric_limits<int32_t>::min(), -1, 0, 1, 2, 8192,
                                   65536, std::numeric_limits<int32_t>::max()};
  if (std::uniform_int_distribution<int>(0, 2)(rng) == 0) {
    return kEdges[std::uniform_int_distribution<size_t>(0, std::size(kEdges) - 1)(rng)];
  }
  return std::uniform_int_distribution<int32_t>(1, 1 << 20)(rng);
}

// Scalings from the whole double range: Validate names the first field a config could get
// wrong, and every scaling it accepts gives, for every theta > 0 and head width, finite
// positive frequencies between freq / factor and freq that match the wavelength form.
TEST(RopeFrequencyTest, SweepValidatesAndAcceptedScalingsGiveFiniteFrequencies) {
  std::mt19937 rng(31337);
  int accepted = 0, refused = 0, pairs = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const RopeScaling s =
        RopeScaling::Llama3(DrawDouble(rng), DrawDouble(rng), DrawDouble(rng), DrawLength(rng));
    const absl::Status status = s.Validate();
    const std::string where = "scaling " + s.ToString();
    // The derivation a launch keeps answers as Validate does, whatever the theta (not drawn
    // from rng, so the draws below stay those of the seed).
    const double any_theta = 2.0 + 97.0 * trial;
    const absl::StatusOr<RopeFrequencies> made = RopeFrequencies::MakeValidated(any_theta, s);
    ASSERT_EQ(made.status(), status) << where;
    if (made.ok()) {
      ASSERT_TRUE(SameFrequencies(*made, RopeFrequencies::Make(any_theta, s))) << where;
    }
    // The model: the first rule a field breaks, in the order Validate documents.
    std::string want;
    if (s.factor == 0.0) {
      want = "";
    } else if (!(s.factor >= 1.0) || !std::isfinite(s.factor)) {
      want = "factor is";
    } else if (!(s.low_freq_factor > 0.0) || !std::isfinite(s.low_freq_factor)) {
      want = "low_freq_factor is";
    } else if (!(s.high_freq_factor > s.low_freq_factor) || !std::isfinite(s.high_freq_factor)) {
      want = "high_freq_factor is";
    } else if (s.original_max_position <= 0) {
      want = "original_max_position is " + std::to_string(s.original_max_position);
    } else {
      // Make()'s terms 2π·high (then / L), L / (2π·(high − low)) and low / (high − low) must
      // fit a double: computed here in long double, where they never overflow.
      constexpr long double kTwoPi = 6.283185307179586476925286766559L;
      const long double high = s.high_freq_factor, low = s.low_freq_factor;
      const long double length = s.original_max_position, band = high - low;
      const long double max = std::numeric_limits<double>::max();
      const long double keep = kTwoPi * high, slope = length / (kTwoPi * band);
      // Either side of the limit by more than rounding, so the model does not depend on it.
      if (keep > max * 1.0001L || slope > max * 1.0001L || low / band > max * 1.0001L ||
          slope < std::numeric_limits<double>::denorm_min()) {
        want = "overflow a double";
      } else if (keep > max * 0.9999L || slope > max * 0.9999L || low / band > max * 0.9999L) {
        continue;  // within rounding of the limit: either answer is right
      }
    }
    if (!want.empty()) {
      ++refused;
      ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << where;
      ASSERT_THAT(std::string(status.message()), HasSubstr(want)) << where;
      ASSERT_TRUE(std::isupper(static_cast<unsigned char>(status.message()[0]))) << status;
      continue;
    }
    ASSERT_TRUE(status.ok()) << where << ": " << status;
    ++accepted;
    for (int k = 0; k < 4; ++k) {
      double theta = DrawDouble(rng);
      if (!(theta > 1.0) || !std::isfinite(theta)) theta = 10000.0;  // LlamaShape's rule
      const int d = 2 * std::uniform_int_distribution<int>(1, 128)(rng);
      const RopeFrequencies f = RopeFrequencies::Make(theta, s);
      for (int i = 0; i < d / 2; ++i) {
        ++pairs;
        const double plain = std::exp2(-2.0 * i / d * std::log2(theta));
        const double got = RopeFrequency(f, i, d);
        const std::string at = where + " theta " + std::to_string(theta) + " d " +
                               std::to_string(d) + " pair " + std::to_string(i);
        ASSERT_TRUE(std::isfinite(got)) << at << ": " << got;
        if (!s.enabled()) {
          ASSERT_EQ(got, plain) << at;
          continue;
        }
        // Positive, unless freq / factor is below the smallest normal double (it may round to 0).
        ASSERT_GE(got, 0.0) << at;
        if (plain / s.factor >= std::numeric_limits<double>::min()) {
          ASSERT_GT(got, 0.0) << at;
        }
        // Between freq / factor and freq (the blend is a convex combination), up to rounding,
        // which the blend's low / (high − low) amplifies (its condition number).
        const double tol =
            1e-12 * plain * (1.0 + s.low_freq_factor / (s.high_freq_factor - s.low_freq_factor));
        ASSERT_LE(got, plain + tol) << at;
        ASSERT_GE(got, plain / s.factor - tol) << at;
      }
    }
  }
  RecordProperty("accepted", accepted);
  RecordProperty("refused", refused);
  RecordProperty("pairs", pairs);
  EXPECT_GT(accepted, 2000);
  EXPECT_GT(refused, 2000);
}

}  // namespace
}  // namespace kiln
