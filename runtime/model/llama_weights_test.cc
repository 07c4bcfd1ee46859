#include "runtime/model/llama_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/model/bf16.h"

namespace kiln {
namespace {

TEST(LlamaWeightLayoutTest, TensorsAreAlignedDisjointAndComplete) {
  for (bool tie : {false, true}) {
    LlamaShape shape = LlamaShape::Tiny();
    shape.tie_embeddings = tie;
    absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(shape);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const size_t expected_count = 2 + 6 * shape.layers + (tie ? 0 : 1);
    ASSERT_EQ(layout->tensors().size(), expected_count);
    int64_t elements = 0;
    size_t end = 0;
    std::set<std::string> names;
    for (size_t i = 0; i < layout->tensors().size(); ++i) {
      const WeightTensor& t = layout->tensors()[i];
      EXPECT_EQ(t.index, static_cast<int>(i));
      EXPECT_EQ(t.offset % LlamaWeightLayout::kAlignment, 0u) << t.name;
      EXPECT_GE(t.offset, end) << t.name << " overlaps its predecessor";
      end = t.offset + t.bytes();
      elements += t.elements();
      EXPECT_TRUE(names.insert(t.name).second) << t.name;
    }
    EXPECT_LE(end, layout->total_bytes());
    EXPECT_EQ(elements, shape.ParameterCount());
    EXPECT_EQ(layout->qkv(1).rows, shape.qkv_rows());
    EXPECT_EQ(layout->qkv(1).cols, shape.hidden);
    EXPECT_EQ(layout->o(0).cols, shape.q_width());
    EXPECT_EQ(layout->gate_up(1).rows, 2 * shape.ffn);
    EXPECT_EQ(layout->down(1).cols, shape.ffn);
    EXPECT_EQ(layout->final_norm().name, "final_norm");
    if (tie) {
      EXPECT_EQ(layout->lm_head().offset, layout->embedding().offset);
    } else {
      EXPECT_EQ(layout->lm_head().name, "lm_head");
      EXPECT_EQ(layout->lm_head().rows, shape.vocab);
    }
  }
}

// A step reads every tensor once; an untied embedding table only in the rows it gathers.
TEST(LlamaWeightLayoutTest, StepReadsTheEmbeddingTableOnlyWhereTheLmHeadIsIt) {
  for (bool tie : {false, true}) {
    LlamaShape shape = LlamaShape::Tiny();
    shape.tie_embeddings = tie;
    absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(shape);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const size_t all = static_cast<size_t>(shape.ParameterCount()) * 2;
    const size_t row = static_cast<size_t>(shape.hidden) * 2;
    const size_t table = static_cast<size_t>(shape.vocab) * row;
    for (int64_t tokens : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{shape.vocab},
                           int64_t{shape.vocab} + 5}) {
      const size_t gathered = static_cast<size_t>(std::min<int64_t>(tokens, shape.vocab)) * row;
      EXPECT_EQ(layout->StepReadBytes(tokens), tie ? all : all - table + gathered)
          << "tie " << tie << ", " << tokens << " tokens";
    }
  }
  // The 1B preset's figures: tied, so its 2.30 GiB are all read.
  absl::StatusOr<LlamaWeightLayout> one_b = LlamaWeightLayout::Create(LlamaShape::Llama1B());
  ASSERT_TRUE(one_b.ok()) << one_b.status();
  EXPECT_EQ(one_b->StepReadBytes(1),
            static_cast<size_t>(LlamaShape::Llama1B().ParameterCount()) * 2);
}

// Returns the weights of `before` and of `after`, a shape with `added` more tensors, both of seed
// 11, after checking that the added tensors come last: every tensor of `before` keeps its index,
// offset and seeded values in `after`, and `after` counts its parameters as its tensors hold them.
std::pair<LlamaHostWeights, LlamaHostWeights> ExpectAddedTensorsComeLast(const LlamaShape& before,
                                                                       const LlamaShape& after,
                                                                       size_t added) {
  absl::StatusOr<LlamaHostWeights> a = RandomLlamaHostWeights(before, 11);
  absl::StatusOr<LlamaHostWeights> b = RandomLlamaHostWeights(after, 11);
  EXPECT_TRUE(a.ok() && b.ok());
  if (!a.ok() || !b.ok()) return {};
  const size_t count = a->layout.tensors().size();
  EXPECT_EQ(b->layout.tensors().size(), count + added);
  for (size_t i = 0; i < count && i < b->layout.tensors().size(); ++i) {
    const WeightTensor& t = a->layout.tensors()[i];
    EXPECT_EQ(b->layout.tensors()[i].offset, t.offset) << t.name;
    EXPECT_TRUE(std::equal(a->tensor(t), a->tensor(t) + t.elements(), b->tensor(t))) << t.name;
  }
  int64_t elements = 0;
  for (const WeightTensor& t : b->layout.tensors()) elements += t.elements();
  EXPECT_EQ(elements, after.ParameterCount());
  return {*std::move(a), *std::move(b)};
}

// The biases come after every other tensor, so those keep their indices, offsets and seeded
// values with or without them.
TEST(LlamaWeightLayoutTest, QkvBiasesComeLast) {
  const LlamaShape plain = LlamaShape::Tiny();
  LlamaShape biased = plain;
  biased.qkv_bias = true;
  const auto [a, b] = ExpectAddedTensorsComeLast(plain, biased, plain.layers);
  if (HasFailure()) return;
  for (int l = 0; l < plain.layers; ++l) {
    const WeightTensor& bias = b.layout.qkv_bias(l);
    EXPECT_EQ(bias.name, "layers." + std::to_string(l) + ".qkv_bias");
    EXPECT_EQ(bias.kind, WeightKind::kBias);
    EXPECT_EQ(bias.rows, biased.qkv_rows());
    EXPECT_EQ(bias.cols, 1);
    EXPECT_GE(bias.offset, a.layout.total_bytes());
  }
}

// Qwen3's q and k norms come after the biases: every other tensor keeps its index, offset and
// seeded values.
TEST(LlamaWeightLayoutTest, QkNormsComeAfterTheBiases) {
  LlamaShape biased = LlamaShape::Tiny();
  biased.qkv_bias = true;
  LlamaShape normed = biased;
  normed.qk_norm = true;
  const auto [a, b] = ExpectAddedTensorsComeLast(biased, normed, 2 * normed.layers);
  if (HasFailure()) return;
  for (int l = 0; l < normed.layers; ++l) {
    for (const WeightTensor* t : {&b.layout.q_norm(l), &b.layout.k_norm(l)}) {
      EXPECT_EQ(t->kind, WeightKind::kNorm);
      EXPECT_EQ(t->rows, normed.head_dim);
      EXPECT_EQ(t->cols, 1);
      EXPECT_GE(t->offset, a.layout.total_bytes());
    }
    EXPECT_EQ(b.layout.q_norm(l).name, "layers." + std::to_string(l) + ".q_norm");
    EXPECT_EQ(b.layout.k_norm(l).name, "layers." + std::to_string(l) + ".k_norm");
  }
}

TEST(LlamaWeightLayoutTest, RejectsABadShape) {
  LlamaShape shape = LlamaShape::Tiny();
  shape.kv_heads = 3;
  EXPECT_EQ(LlamaWeightLayout::Create(shape).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RandomLlamaHostWeightsTest, DeterministicPerSeedAndScaled) {
  LlamaShape shape = LlamaShape::Tiny();
  shape.qkv_bias = true;  // every kind of tensor
  shape.qk_norm = true;
  absl::StatusOr<LlamaHostWeights> a = RandomLlamaHostWeights(shape, 7);
  absl::StatusOr<LlamaHostWeights> b = RandomLlamaHostWeights(shape, 7);
  absl::StatusOr<LlamaHostWeights> c = RandomLlamaHostWeights(shape, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->data, b->data);
  EXPECT_NE(a->data, c->data);

  for (const WeightTensor& t : a->layout.tensors()) {
    const uint16_t* v = a->tensor(t);
    double sum = 0, sum_sq = 0, lo = 1e30, hi = -1e30;
    for (int64_t i = 0; i < t.elements(); ++i) {
      const double x = Bf16BitsToFloat(v[i]);
      sum += x;
      sum_sq += x * x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    const double n = static_cast<double>(t.elements());
    const double mean = sum / n;
    const double std = std::sqrt(sum_sq / n - mean * mean);
    const WeightInitRange range = InitRangeFor(t);
    // Uniform in [centre - a, centre + a): std a / sqrt(3), mean centre.
    EXPECT_NEAR(mean, range.centre, 5 * range.amplitude / std::sqrt(3 * n) + 1e-3) << t.name;
    EXPECT_NEAR(std, range.amplitude / std::sqrt(3.0), 0.1 * range.amplitude) << t.name;
    EXPECT_GE(lo, range.centre - range.amplitude * 1.01) << t.name;
    EXPECT_LE(hi, range.centre + range.amplitude * 1.01) << t.name;
  }
  // Different tensors of the same shape differ (the tensor index seeds each one).
  EXPECT_NE(a->tensor(a->layout.qkv(0))[0], a->tensor(a->layout.qkv(1))[0]);
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(Bf16BitsToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(FloatToBf16Bits(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(FloatToBf16Bits(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(FloatToBf16Bits(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(std::nanf("")))));
  EXPECT_EQ(RoundToBf16(3.14159), 3.140625);
}

// ---- Sweeps of the layout over random valid shapes, and of what refuses a bad one.

// A random valid shape: widths multiples of 8 up to the limits, heads a multiple of kv_heads,
// mostly a few layers and now and then up to the 4096 limit, every optional tensor kind at random.
LlamaShape RandomValidShape(std::mt19937& rng) {
  auto log_uniform = [&](int max_log2) { return 1 << (rng() % (max_log2 + 1)); };
  LlamaShape s = LlamaShape::Tiny();
  s.hidden = 8 * static_cast<int>(1 + rng() % (rng() % 2 ? 64 : (1 << 17)));
  s.ffn = 8 * static_cast<int>(1 + rng() % (rng() % 2 ? 64 : (1 << 17)));
  s.head_dim = 8 * static_cast<int>(1 + rng() % 32);
  s.kv_heads = rng() % 2 ? log_uniform(6) : static_cast<int>(1 + rng() % 12);
  const int group = static_cast<int>(1 + rng() % 8);
  s.heads = std::min(s.kv_heads * group, 4096 / s.kv_heads * s.kv_heads);
  s.vocab = static_cast<int>(1 + rng() % (rng() % 2 ? 1000 : (1 << 24)));
  s.layers = rng() % 50 == 0 ? static_cast<int>(1 + rng() % 4096) : static_cast<int>(1 + rng() % 4);
  s.tie_embeddings = rng() % 2;
  s.qkv_bias = rng() % 2;
  s.qk_norm = rng() % 2;
  return s;
}

// Every tensor of `layout`, checked against the list in llama_weights.h computed here in 128 bits:
// names, kinds, sizes and indices; offsets 256-aligned, in order, disjoint, inside total_bytes,
// with at most 255 bytes of padding after each tensor; the parameter count and the bytes a step
// reads agree with the tensors.
void CheckLayout(const LlamaShape& s, const LlamaWeightLayout& layout) {
  struct Expected {
    std::string name;
    WeightKind kind;
    __int128 rows, cols;
  };
  const __int128 h = s.hidden, d = s.head_dim;
  const __int128 qkv = (__int128{s.heads} + 2 * __int128{s.kv_heads}) * d;
  std::vector<Expected> want = {{"embedding", WeightKind::kEmbedding, s.vocab, h}};
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    want.push_back({p + "input_norm", WeightKind::kNorm, h, 1});
    want.push_back({p + "qkv", WeightKind::kMatrix, qkv, h});
    want.push_back({p + "o", WeightKind::kMatrix, h, __int128{s.heads} * d});
    want.push_back({p + "post_norm", WeightKind::kNorm, h, 1});
    want.push_back({p + "gate_up", WeightKind::kMatrix, 2 * __int128{s.ffn}, h});
    want.push_back({p + "down", WeightKind::kMatrix, h, s.ffn});
  }
  want.push_back({"final_norm", WeightKind::kNorm, h, 1});
  if (!s.tie_embeddings) want.push_back({"lm_head", WeightKind::kMatrix, s.vocab, h});
  for (int l = 0; s.qkv_bias && l < s.layers; ++l) {
    want.push_back({absl::StrCat("layers.", l, ".qkv_bias"), WeightKind::kBias, qkv, 1});
  }
  for (int l = 0; s.qk_norm && l < s.layers; ++l) {
    want.push_back({absl::StrCat("layers.", l, ".q_norm"), WeightKind::kNorm, d, 1});
    want.push_back({absl::StrCat("layers.", l, ".k_norm"), WeightKind::kNorm, d, 1});
  }
  ASSERT_EQ(layout.tensors().size(), want.size());
  __int128 end = 0, elements = 0, bytes = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const WeightTensor& t = layout.tensors()[i];
    const Expected& e = want[i];
    ASSERT_EQ(t.name, e.name);
    ASSERT_EQ(t.index, static_cast<int>(i)) << t.name;
    ASSERT_TRUE(t.kind == e.kind) << t.name;
    ASSERT_TRUE(t.rows == e.rows && t.cols == e.cols) << t.name;
    ASSERT_EQ(t.offset % LlamaWeightLayout::kAlignment, 0u) << t.name;
    ASSERT_TRUE(t.offset >= end && t.offset - end < LlamaWeightLayout::kAlignment)
        << t.name << " at " << t.offset << " overlaps or leaves a gap";
    ASSERT_TRUE(__int128{t.bytes()} == e.rows * e.cols * 2) << t.name;
    end = __int128{t.offset} + e.rows * e.cols * 2;
    elements += e.rows * e.cols;
    bytes += e.rows * e.cols * 2;
  }
  ASSERT_TRUE(end <= layout.total_bytes() && layout.total_bytes() - end < 256);
  ASSERT_TRUE(__int128{s.ParameterCount()} == elements);
  EXPECT_EQ(layout.qkv(s.layers - 1).name, absl::StrCat("layers.", s.layers - 1, ".qkv"));
  EXPECT_EQ(layout.down(0).name, "layers.0.down");
  EXPECT_EQ(layout.final_norm().name, "final_norm");
  EXPECT_EQ(layout.lm_head().name, s.tie_embeddings ? "embedding" : "lm_head");
  if (s.qkv_bias) {
    EXPECT_EQ(layout.qkv_bias(s.layers - 1).name,
              want[want.size() - 1 - (s.qk_norm ? 2 * s.layers : 0)].name);
  }
  if (s.qk_norm) {
    EXPECT_EQ(layout.k_norm(s.layers - 1).name, want.back().name);
  }
  // A step reads everything; an untied table only in the tokens' rows (0 to the whole table).
  const __int128 table = __int128{s.vocab} * h * 2;
  for (int64_t tokens : {std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0},
                         int64_t{1}, int64_t{s.vocab}, int64_t{s.vocab} + 1,
                         std::numeric_limits<int64_t>::max()}) {
    const __int128 gathered =
        std::clamp<__int128>(tokens, 0, s.vocab) * h * 2;
    ASSERT_TRUE(__int128{layout.StepReadBytes(tokens)} ==
                (s.tie_embeddings ? bytes : bytes - table + gathered))
        << tokens << " tokens";
  }
}

// 500 random valid shapes (some of thousands of layers, some with tables of 2^24 x 2^20): the
// layout of each, checked tensor by tensor. Nothing is allocated.
TEST(LlamaWeightLayoutSweepTest, RandomValidShapesLayOutExactly) {
  std::mt19937 rng(7);
  for (int i = 0; i < 500; ++i) {
    const LlamaShape s = RandomValidShape(rng);
    SCOPED_TRACE(absl::StrCat("shape ", i, ": ", s.ToString()));
    ASSERT_TRUE(s.Validate().ok()) << s.Validate();
    absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(s);
    ASSERT_TRUE(layout.ok()) << layout.status();
    CheckLayout(s, *layout);
    if (HasFatalFailure()) return;
  }
}

// A shape Validate refuses gets its error, word for word, from Create, ZeroLlamaHostWeights and
// RandomLlamaHostWeights, before anything is allocated.
TEST(LlamaWeightLayoutSweepTest, BadShapesAreRefusedBeforeAllocating) {
  std::mt19937 rng(8);
  const int kEdges[] = {std::numeric_limits<int>::min(), -1, 0, 1, 3, 7, 9, 257, 1 << 20,
                        (1 << 20) + 8, 1 << 24, (1 << 24) + 1, std::numeric_limits<int>::max()};
  for (int i = 0; i < 2000; ++i) {
    LlamaShape s = RandomValidShape(rng);
    int LlamaShape::*fields[] = {&LlamaShape::hidden, &LlamaShape::layers, &LlamaShape::heads,
                                 &LlamaShape::kv_heads, &LlamaShape::head_dim, &LlamaShape::ffn,
                                 &LlamaShape::vocab};
    s.*fields[rng() % 7] = kEdges[rng() % std::size(kEdges)];
    const absl::Status expected = s.Validate();
    if (expected.ok()) continue;
    SCOPED_TRACE(s.ToString());
    EXPECT_EQ(LlamaWeightLayout::Create(s).status(), expected);
    EXPECT_EQ(ZeroLlamaHostWeights(s).status(), expected);
    EXPECT_EQ(RandomLlamaHostWeights(s, 1).status(), expected);
  }
}

// A valid shape whose weights no host holds (the largest: about 2^57 bytes) is ResourceExhausted
// naming the bytes, not an allocation that throws.
TEST(LlamaWeightLayoutSweepTest, WeightsBeyondMemoryAreResourceExhausted) {
  LlamaShape s = LlamaShape::Tiny();
  s.hidden = s.ffn = 1 << 20;
  s.heads = s.kv_heads = s.layers = 1 << 12;
  s.vocab = 1 << 24;
  s.head_dim = 256;
  ASSERT_TRUE(s.Validate().ok());
  absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(s);
  ASSERT_TRUE(layout.ok()) << layout.status();
  for (const absl::Status& status :
       {ZeroLlamaHostWeights(s).status(), ZeroLlamaHostWeights(*layout).status(),
        RandomLlamaHostWeights(s, 1).status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr(absl::StrCat("need ", layout->total_bytes(), " bytes")));
  }
  // A table of 2^24 x 2^20 alone: 32 TiB.
  s = LlamaShape::Tiny();
  s.vocab = 1 << 24;
  s.hidden = 1 << 20;
  EXPECT_EQ(ZeroLlamaHostWeights(s).status().code(), absl::StatusCode::kResourceExhausted);
}

// Zero weights from an existing layout take it over: the tensors, offsets and bytes of the
// shape's own, all zero, for every layout variant (tied or not, QKV bias, QK norm); a layout with
// no tensors is refused, naming the way to build one.
TEST(LlamaHostWeightsTest, ZeroWeightsFromALayoutMatchThoseFromItsShape) {
  for (int variant = 0; variant < 8; ++variant) {
    LlamaShape shape = LlamaShape::Tiny();
    shape.tie_embeddings = (variant & 1) != 0;
    shape.qkv_bias = (variant & 2) != 0;
    shape.qk_norm = (variant & 4) != 0;
    SCOPED_TRACE(shape.ToString());
    absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(shape);
    ASSERT_TRUE(layout.ok()) << layout.status();
    absl::StatusOr<LlamaHostWeights> from_layout = ZeroLlamaHostWeights(*layout);
    absl::StatusOr<LlamaHostWeights> from_shape = ZeroLlamaHostWeights(shape);
    ASSERT_TRUE(from_layout.ok()) << from_layout.status();
    ASSERT_TRUE(from_shape.ok()) << from_shape.status();
    EXPECT_TRUE(from_layout->Validate().ok()) << from_layout->Validate();
    EXPECT_EQ(from_layout->layout.total_bytes(), from_shape->layout.total_bytes());
    EXPECT_EQ(from_layout->layout.shape().ToString(), shape.ToString());
    ASSERT_EQ(from_layout->layout.tensors().size(), from_shape->layout.tensors().size());
    for (size_t i = 0; i < from_shape->layout.tensors().size(); ++i) {
      const WeightTensor& a = from_layout->layout.tensors()[i];
      const WeightTensor& b = from_shape->layout.tensors()[i];
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.kind, b.kind);
      EXPECT_EQ(a.rows, b.rows);
      EXPECT_EQ(a.cols, b.cols);
      EXPECT_EQ(a.offset, b.offset);
      EXPECT_EQ(a.index, b.index);
    }
    EXPECT_EQ(from_layout->data, from_shape->data);
    EXPECT_TRUE(std::all_of(from_layout->data.begin(), from_layout->data.end(),
                            [](uint16_t v) { return v == 0; }));
  }
  const absl::Status empty = ZeroLlamaHostWeights(LlamaWeightLayout{}).status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument) << empty;
  EXPECT_THAT(std::string(empty.message()), ::testing::HasSubstr("LlamaWeightLayout::Create"));
}

// Host weights whose data does not match their layout (default-constructed, moved from, resized)
// are refused by Validate, naming both sizes.
TEST(LlamaHostWeightsTest, ValidateRefusesDataThatDoesNotMatchTheLayout) {
  absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(LlamaShape::Tiny(), 3);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->Validate().ok());
  EXPECT_THAT(std::string(LlamaHostWeights{}.Validate().message()),
              ::testing::HasSubstr("hold 0 bytes but their layout (0 tensors) needs 0"));
  for (int64_t delta : {int64_t{-1}, int64_t{1}, -static_cast<int64_t>(w->data.size())}) {
    LlamaHostWeights resized = *w;
    resized.data.resize(static_cast<size_t>(static_cast<int64_t>(w->data.size()) + delta));
    const absl::Status status = resized.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << delta;
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr(absl::StrCat("needs ", w->layout.total_bytes())));
  }
  LlamaHostWeights moved = *w;
  LlamaHostWeights taken = std::move(moved);
  EXPECT_TRUE(taken.Validate().ok());
  EXPECT_EQ(moved.Validate().code(), absl::StatusCode::kInvalidArgument);  // NOLINT: moved from
}

}  // namespace
}  // namespace kiln
