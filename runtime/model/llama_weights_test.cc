#include "runtime/model/llama_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <utility>

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

}  // namespace
}  // namespace kiln
