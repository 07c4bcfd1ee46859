#include "runtime/model/llama_shape.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attention/rope_frequency.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(LlamaShapeTest, DefaultIsThe1BShape) {
  const LlamaShape s = LlamaShape::Llama1B();
  EXPECT_EQ(s.hidden, 2048);
  EXPECT_EQ(s.layers, 16);
  EXPECT_EQ(s.heads, 32);
  EXPECT_EQ(s.kv_heads, 8);
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.ffn, 8192);
  EXPECT_EQ(s.vocab, 128256);
  EXPECT_TRUE(s.tie_embeddings);
  EXPECT_EQ(s.rope_theta, 500000.0);
  // Llama 3.2 1B's config.json: rope_scaling llama3, factor 32, low 1, high 4, original 8192.
  EXPECT_EQ(s.rope_scaling, RopeScaling::Llama3(32.0, 1.0, 4.0, 8192));
  EXPECT_TRUE(s.Validate().ok());
  EXPECT_EQ(s.qkv_rows(), 3072);
  EXPECT_EQ(s.kv_width(), 512);
  // Llama 3.2 1B has 1,235,814,400 parameters.
  EXPECT_EQ(s.ParameterCount(), 1235814400);
}

TEST(LlamaShapeTest, TinyIsValidAndUntied) {
  const LlamaShape s = LlamaShape::Tiny();
  EXPECT_TRUE(s.Validate().ok());
  EXPECT_FALSE(s.rope_scaling.enabled());
  EXPECT_EQ(s.layers, 2);
  EXPECT_FALSE(s.tie_embeddings);
  EXPECT_EQ(s.heads * s.head_dim, s.hidden);
  const int64_t tied_params = [&] {
    LlamaShape t = s;
    t.tie_embeddings = true;
    return t.ParameterCount();
  }();
  EXPECT_EQ(s.ParameterCount() - tied_params, int64_t{s.vocab} * s.hidden);
}

TEST(LlamaShapeTest, ValidateNamesTheBadField) {
  LlamaShape s = LlamaShape::Tiny();
  s.kv_heads = 3;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("not a multiple of kv_heads 3"));
  s = LlamaShape::Tiny();
  s.layers = 0;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("LlamaShape.layers is 0"));
  s = LlamaShape::Tiny();
  s.head_dim = 66;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("head_dim is 66"));
  s = LlamaShape::Tiny();
  s.head_dim = 258;
  EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
  s = LlamaShape::Tiny();
  s.hidden = 260;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("hidden is 260"));
  s = LlamaShape::Tiny();
  s.rms_eps = 0.0;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("rms_eps"));
  s = LlamaShape::Tiny();
  s.rope_theta = 0.5;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("rope_theta"));
  EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
  s = LlamaShape::Tiny();
  s.rope_scaling = RopeScaling::Llama3(8.0, 1.0, 4.0, -1);
  EXPECT_THAT(std::string(s.Validate().message()),
              HasSubstr("LlamaShape.rope_scaling: RoPE scaling original_max_position is -1"));
}

// Sizes whose products overflow (heads + 2 kv_heads in int, QKV rows x hidden, a layer count
// that would build billions of tensors) are refused instead of wrapping into a small shape.
TEST(LlamaShapeTest, ValidateRefusesSizesBeyondAnyModel) {
  LlamaShape s = LlamaShape::Tiny();
  s.heads = 1431655766;  // heads + 2 · kv_heads = 2^32 + 2: 2 in int arithmetic
  s.kv_heads = 1431655766;
  EXPECT_EQ(s.qkv_rows(), int64_t{4294967298} * s.head_dim);
  absl::Status status = s.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("LlamaShape.heads is 1431655766, above 4096"));
  for (auto [field, set] :
       std::vector<std::pair<const char*, void (*)(LlamaShape&)>>{
           {"hidden", [](LlamaShape& t) { t.hidden = 1 << 30; }},
           {"ffn", [](LlamaShape& t) { t.ffn = 1 << 30; }},
           {"layers", [](LlamaShape& t) { t.layers = 1 << 30; }},
           {"vocab", [](LlamaShape& t) { t.vocab = 1 << 30; }}}) {
    s = LlamaShape::Tiny();
    set(s);
    EXPECT_THAT(std::string(s.Validate().message()),
                HasSubstr(std::string("LlamaShape.") + field + " is 1073741824, above"));
  }
  // The largest shapes every preset lies far inside still validate.
  s = LlamaShape::Tiny();
  s.hidden = s.ffn = 1 << 20;
  s.heads = s.kv_heads = s.layers = 1 << 12;
  s.vocab = 1 << 24;
  EXPECT_TRUE(s.Validate().ok()) << s.Validate();
}

TEST(LlamaShapeTest, ToStringNamesTheRopeScaling) {
  EXPECT_THAT(LlamaShape::Llama1B().ToString(),
              HasSubstr("rope_theta 500000, rope_scaling llama3 x32 (low 1, high 4, original "
                        "8192), rms_eps 1e-05"));
  EXPECT_THAT(LlamaShape::Tiny().ToString(), HasSubstr("rope_scaling none"));
}

// ---- Sweeps: every field at its edges and at random, each verdict checked against the rules
// written out again here (not Validate's code), each refusal's message against the field it names.

constexpr int kIntMin = std::numeric_limits<int>::min();
constexpr int kIntMax = std::numeric_limits<int>::max();

// 0, ±1, small values, powers of two and their neighbours up to 2^30 (both signs), the int
// extremes: the values a typo, a wrapped count or a hostile config gives.
std::vector<int> EdgeInts() {
  std::set<int> v = {kIntMin, kIntMin + 1, kIntMax - 1, kIntMax, 0, 6, 10, 12, 24, 48, 96, 100,
                     1000, 128256, 151936};
  for (int k = 0; k <= 30; ++k) {
    const int p = 1 << k;
    for (int x : {p - 1, p, p + 1}) {
      v.insert(x);
      v.insert(-x);
    }
  }
  return {v.begin(), v.end()};
}

// NaN, infinities, zeros, subnormals, the float and double extremes and the values near 1 and
// near the least normal float, both signs.
std::vector<double> EdgeDoubles() {
  using D = std::numeric_limits<double>;
  using F = std::numeric_limits<float>;
  std::vector<double> v = {D::quiet_NaN(), -D::quiet_NaN(), D::infinity(), D::denorm_min(),
                           D::min(), static_cast<double>(F::denorm_min()),
                           static_cast<double>(F::min()),
                           std::nextafter(static_cast<double>(F::min()), 0.0),
                           std::nextafter(static_cast<double>(F::min()), 1.0),
                           static_cast<double>(F::min()) / 2, 1e-300, 1e-45, 1e-38, 1e-12,
                           1e-6, 1e-5, 0.5, std::nextafter(1.0, 0.0), 1.0,
                           std::nextafter(1.0, 2.0), 2.0, 10000.0, 500000.0, 1e30, 1e300,
                           static_cast<double>(F::max()), D::max(), 0.0};
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

// The int fields, by name, for sweeps that set one at a time.
struct IntField {
  const char* name;
  int LlamaShape::*member;
};
constexpr IntField kIntFields[] = {
    {"hidden", &LlamaShape::hidden}, {"layers", &LlamaShape::layers},
    {"heads", &LlamaShape::heads},   {"kv_heads", &LlamaShape::kv_heads},
    {"head_dim", &LlamaShape::head_dim}, {"ffn", &LlamaShape::ffn},
    {"vocab", &LlamaShape::vocab}};

// The fields of `s` that break a rule of llama_shape.h, written out independently of Validate;
// a heads / kv_heads mismatch counts against both.
std::set<std::string> FieldProblems(const LlamaShape& s) {
  std::set<std::string> bad;
  auto check = [&](const char* field, int value, int limit, int multiple) {
    if (value <= 0 || value > limit || value % multiple != 0) bad.insert(field);
  };
  check("hidden", s.hidden, 1 << 20, 8);
  check("ffn", s.ffn, 1 << 20, 8);
  check("layers", s.layers, 1 << 12, 1);
  check("heads", s.heads, 1 << 12, 1);
  check("kv_heads", s.kv_heads, 1 << 12, 1);
  check("vocab", s.vocab, 1 << 24, 1);
  check("head_dim", s.head_dim, 256, 8);
  if (s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads != 0) {
    bad.insert("heads");
    bad.insert("kv_heads");
  }
  if (!(s.rope_theta > 1.0) || !std::isfinite(s.rope_theta)) bad.insert("rope_theta");
  if (!s.rope_scaling.Validate().ok()) bad.insert("rope_scaling");
  if (!(s.rms_eps >= std::numeric_limits<float>::min()) || !(s.rms_eps < 1.0)) {
    bad.insert("rms_eps");
  }
  return bad;
}

// The parameter count of a valid shape, in 128 bits from the tensor list of llama_weights.h.
__int128 ExpectedParameters(const LlamaShape& s) {
  const __int128 h = s.hidden, d = s.head_dim;
  const __int128 qkv = (__int128{s.heads} + 2 * __int128{s.kv_heads}) * d;
  const __int128 per_layer = 2 * h + qkv * h + h * s.heads * d + 3 * __int128{s.ffn} * h +
                             (s.qkv_bias ? qkv : 0) + (s.qk_norm ? 2 * d : 0);
  return __int128{s.vocab} * h * (s.tie_embeddings ? 1 : 2) + s.layers * per_layer + h;
}

// Checks one shape: Validate's verdict against FieldProblems; a refusal is InvalidArgument whose
// message starts "LlamaShape.<field>" for a field that is in fact bad and shows its value, on one
// line; an accepted shape's derived sizes are exact and usable by the kernels (a finite RoPE
// frequency in [0, 1] for every pair, a normal float epsilon; a frequency may underflow to 0 under
// an absurd but finite scaling factor, which rotates nothing but breaks nothing). The derived sizes and ToString are
// called on every shape: they must not overflow (UBSan would stop the test) even when invalid.
void CheckShape(const LlamaShape& s, const std::string& trace) {
  SCOPED_TRACE(trace);
  const std::set<std::string> bad = FieldProblems(s);
  const absl::Status status = s.Validate();
  (void)s.qkv_rows();
  (void)s.ParameterCount();
  (void)s.ToString();
  ASSERT_EQ(status.ok(), bad.empty()) << status << "; " << s.ToString();
  if (!status.ok()) {
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    const std::string message(status.message());
    ASSERT_TRUE(absl::StartsWith(message, "LlamaShape.")) << message;
    const std::string named = message.substr(11, message.find_first_of(" :", 11) - 11);
    EXPECT_TRUE(bad.count(named)) << "message names " << named << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.back(), '.') << message;
    if (named != "rope_scaling" && named != "rope_theta" && named != "rms_eps") {
      for (const IntField& f : kIntFields) {
        if (named == f.name) {
          EXPECT_THAT(message, HasSubstr(absl::StrCat(s.*f.member))) << message;
        }
      }
    }
    return;
  }
  EXPECT_EQ(s.qkv_rows(), static_cast<int64_t>((__int128{s.heads} + 2 * s.kv_heads) * s.head_dim));
  EXPECT_EQ(s.ParameterCount(), static_cast<int64_t>(ExpectedParameters(s)));
  EXPECT_TRUE(ExpectedParameters(s) * 2 < (__int128{1} << 58));  // bytes fit with room to spare
  const float eps = static_cast<float>(s.rms_eps);
  EXPECT_EQ(std::fpclassify(eps), FP_NORMAL) << s.rms_eps;
  const RopeFrequencies f = RopeFrequencies::Make(s.rope_theta, s.rope_scaling);
  for (int i = 0; i < s.head_dim / 2; ++i) {
    const double freq = RopeFrequency(f, i, s.head_dim);
    ASSERT_TRUE(std::isfinite(freq) && freq >= 0.0 && freq <= 1.0) << "pair " << i << ": " << freq;
  }
}

// Every int field of three valid shapes (Tiny, 1B, the largest accepted) set to every edge value,
// one at a time: 7 fields x 3 shapes x 193 values.
TEST(LlamaShapeSweepTest, EveryIntFieldAtEveryEdgeValue) {
  LlamaShape largest = LlamaShape::Tiny();
  largest.hidden = largest.ffn = 1 << 20;
  largest.heads = largest.kv_heads = largest.layers = 1 << 12;
  largest.vocab = 1 << 24;
  largest.head_dim = 256;
  largest.qkv_bias = largest.qk_norm = true;
  largest.tie_embeddings = false;
  int checked = 0;
  for (const LlamaShape& base : {LlamaShape::Tiny(), LlamaShape::Llama1B(), largest}) {
    ASSERT_TRUE(base.Validate().ok()) << base.Validate();
    for (const IntField& f : kIntFields) {
      for (int value : EdgeInts()) {
        LlamaShape s = base;
        s.*f.member = value;
        CheckShape(s, absl::StrCat(f.name, " = ", value, " in ", base.ToString()));
        if (HasFatalFailure()) return;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 7 * 3 * 193);
}

// rope_theta and rms_eps at NaN, infinities, zeros, subnormals and the float and double extremes
// (both signs), and the RoPE scaling's fields at the same values, one at a time.
TEST(LlamaShapeSweepTest, EveryFloatFieldAtEveryEdgeValue) {
  for (double value : EdgeDoubles()) {
    for (const char* field : {"rope_theta", "rms_eps", "factor", "low_freq_factor",
                              "high_freq_factor"}) {
      LlamaShape s = LlamaShape::Llama1B();
      const std::string f = field;
      if (f == "rope_theta") s.rope_theta = value;
      if (f == "rms_eps") s.rms_eps = value;
      if (f == "factor") s.rope_scaling.factor = value;
      if (f == "low_freq_factor") s.rope_scaling.low_freq_factor = value;
      if (f == "high_freq_factor") s.rope_scaling.high_freq_factor = value;
      CheckShape(s, absl::StrCat(field, " = ", value));
      if (HasFatalFailure()) return;
    }
  }
  for (int value : EdgeInts()) {
    LlamaShape s = LlamaShape::Llama1B();
    s.rope_scaling.original_max_position = value;
    CheckShape(s, absl::StrCat("original_max_position = ", value));
    if (HasFatalFailure()) return;
  }
  // An epsilon that is positive in double but 0 or subnormal in float is refused by name.
  LlamaShape s = LlamaShape::Tiny();
  s.rms_eps = 1e-40;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("LlamaShape.rms_eps is 1e-40"));
}

// 100,000 shapes with every field drawn at once, from the edge values, from the sizes real
// models use and from all 32-bit ints, so that several fields are bad together and the message
// must still name one that is bad.
TEST(LlamaShapeSweepTest, RandomShapesAreJudgedByTheirFields) {
  std::mt19937 rng(20240611);
  const std::vector<int> edges = EdgeInts();
  const std::vector<double> doubles = EdgeDoubles();
  auto pick_int = [&](std::vector<int> usual) {
    switch (rng() % 4) {
      case 0:
        return edges[rng() % edges.size()];
      case 1:
        return static_cast<int>(rng());
      default:
        return usual[rng() % usual.size()];
    }
  };
  auto pick_double = [&](double usual) {
    return rng() % 4 == 0 ? doubles[rng() % doubles.size()] : usual;
  };
  int valid = 0;
  for (int i = 0; i < 100000; ++i) {
    LlamaShape s;
    s.hidden = pick_int({64, 256, 2048, 4096, 8192});
    s.layers = pick_int({1, 2, 16, 32, 80});
    s.heads = pick_int({1, 4, 8, 32, 64});
    s.kv_heads = pick_int({1, 2, 4, 8});
    s.head_dim = pick_int({8, 64, 128, 256});
    s.ffn = pick_int({128, 512, 8192, 14336});
    s.vocab = pick_int({96, 32000, 128256});
    s.rope_theta = pick_double(500000.0);
    s.rms_eps = pick_double(1e-5);
    if (rng() % 2 == 0) s.rope_scaling = RopeScaling::Llama3(32.0, 1.0, 4.0, 8192);
    if (rng() % 16 == 0) s.rope_scaling.factor = pick_double(8.0);
    s.tie_embeddings = rng() % 2;
    s.qkv_bias = rng() % 2;
    s.qk_norm = rng() % 2;
    CheckShape(s, absl::StrCat("random shape ", i));
    if (HasFatalFailure()) return;
    valid += s.Validate().ok();
  }
  RecordProperty("valid", valid);
  EXPECT_GT(valid, 500);  // the sweep reaches accepted shapes too
}

// The derived sizes of shapes far outside the limits saturate instead of wrapping.
TEST(LlamaShapeSweepTest, DerivedSizesOfHugeShapesSaturate) {
  LlamaShape s = LlamaShape::Tiny();
  s.heads = s.kv_heads = s.head_dim = kIntMax;
  EXPECT_EQ(s.qkv_rows(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(s.ParameterCount(), std::numeric_limits<int64_t>::max());
  s.head_dim = kIntMin;
  EXPECT_EQ(s.qkv_rows(), std::numeric_limits<int64_t>::min());
  s = LlamaShape::Tiny();
  s.vocab = s.hidden = kIntMax;
  EXPECT_EQ(s.ParameterCount(), std::numeric_limits<int64_t>::max());
}

}  // namespace
}  // namespace kiln
