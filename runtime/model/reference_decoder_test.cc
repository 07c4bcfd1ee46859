#include "runtime/model/reference_decoder.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/model/bf16.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

double RelativeError(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / norm);
}

class ReferenceDecoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(shape_, seed_);
    ASSERT_TRUE(w.ok()) << w.status();
    weights_ = *std::move(w);
  }

  ReferenceDecoder Make(ReferenceDecoderOptions options = {}) {
    absl::StatusOr<ReferenceDecoder> d = ReferenceDecoder::Create(weights_, options);
    EXPECT_TRUE(d.ok()) << d.status();
    return *std::move(d);
  }

  std::vector<int32_t> RandomTokens(int n) {
    std::mt19937 rng(seed_ + n);
    std::vector<int32_t> t(n);
    for (auto& v : t) v = std::uniform_int_distribution<int32_t>(0, shape_.vocab - 1)(rng);
    return t;
  }

  // One token's logits computed directly: at position 0 attention returns v (with its bias).
  void ExpectFirstTokenMatchesAnIndependentComputation() {
    const LlamaWeightLayout& L = weights_.layout;
    auto value = [&](const WeightTensor& t, int64_t i) {
      return static_cast<double>(Bf16BitsToFloat(weights_.tensor(t)[i]));
    };
    auto matvec = [&](const WeightTensor& t, int64_t row0, int64_t rows,
                      const std::vector<double>& x) {
      std::vector<double> y(rows, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < t.cols; ++c) y[r] += value(t, (row0 + r) * t.cols + c) * x[c];
      }
      return y;
    };
    auto norm = [&](const WeightTensor& t, const std::vector<double>& x) {
      double ms = 0;
      for (double v : x) ms += v * v / x.size();
      std::vector<double> y(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        y[i] = x[i] / std::sqrt(ms + shape_.rms_eps) * value(t, i);
      }
      return y;
    };
    const int32_t token = RandomTokens(1)[0];
    std::vector<double> r(shape_.hidden);
    for (int i = 0; i < shape_.hidden; ++i) {
      r[i] = value(L.embedding(), int64_t{token} * shape_.hidden + i);
    }
    const int group = shape_.heads / shape_.kv_heads;
    for (int l = 0; l < shape_.layers; ++l) {
      std::vector<double> v = matvec(L.qkv(l), shape_.q_width() + shape_.kv_width(),
                                     shape_.kv_width(), norm(L.input_norm(l), r));
      if (shape_.qkv_bias) {
        for (int64_t i = 0; i < shape_.kv_width(); ++i) {
          v[i] += value(L.qkv_bias(l), shape_.q_width() + shape_.kv_width() + i);
        }
      }
      std::vector<double> attn(shape_.q_width());
      for (int h = 0; h < shape_.heads; ++h) {
        for (int i = 0; i < shape_.head_dim; ++i) {
          attn[h * shape_.head_dim + i] = v[(h / group) * shape_.head_dim + i];
        }
      }
      const std::vector<double> o = matvec(L.o(l), 0, shape_.hidden, attn);
      for (int i = 0; i < shape_.hidden; ++i) r[i] += o[i];
      const std::vector<double> gu =
          matvec(L.gate_up(l), 0, 2 * shape_.ffn, norm(L.post_norm(l), r));
      std::vector<double> act(shape_.ffn);
      for (int i = 0; i < shape_.ffn; ++i) {
        act[i] = gu[i] / (1 + std::exp(-gu[i])) * gu[shape_.ffn + i];
      }
      const std::vector<double> d = matvec(L.down(l), 0, shape_.hidden, act);
      for (int i = 0; i < shape_.hidden; ++i) r[i] += d[i];
    }
    const std::vector<double> expected =
        matvec(L.lm_head(), 0, shape_.vocab, norm(L.final_norm(), r));

    ReferenceDecoder ref = Make();
    absl::StatusOr<std::vector<double>> logits = ref.Forward(ref.AddSequence(), {token});
    ASSERT_TRUE(logits.ok());
    EXPECT_LT(RelativeError(*logits, expected), 1e-12);
  }

  LlamaShape shape_ = LlamaShape::Tiny();
  uint64_t seed_ = 0;
  LlamaHostWeights weights_;
};

TEST_F(ReferenceDecoderTest, ShapesAndFiniteLogits) {
  ReferenceDecoder ref = Make();
  const int seq = ref.AddSequence();
  absl::StatusOr<std::vector<double>> logits = ref.Forward(seq, RandomTokens(5));
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->size(), 5u * shape_.vocab);
  EXPECT_EQ(ref.Length(seq), 5);
  double sum_sq = 0;
  for (double v : *logits) {
    ASSERT_TRUE(std::isfinite(v));
    sum_sq += v * v;
  }
  // Activations are O(1): logits neither vanish nor blow up with the seeded scales.
  const double rms = std::sqrt(sum_sq / logits->size());
  EXPECT_GT(rms, 0.1);
  EXPECT_LT(rms, 100.0);
}

TEST_F(ReferenceDecoderTest, Deterministic) {
  const std::vector<int32_t> prompt = RandomTokens(6);
  ReferenceDecoder a = Make(), b = Make();
  absl::StatusOr<std::vector<int32_t>> ga = a.GenerateGreedy(prompt, 8);
  absl::StatusOr<std::vector<int32_t>> gb = b.GenerateGreedy(prompt, 8);
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_EQ(*ga, *gb);
  ASSERT_EQ(ga->size(), 8u);
  for (int32_t t : *ga) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, shape_.vocab);
  }
}

TEST_F(ReferenceDecoderTest, GreedyFollowsTheLogits) {
  const std::vector<int32_t> prompt = RandomTokens(4);
  ReferenceDecoder gen = Make();
  absl::StatusOr<std::vector<int32_t>> tokens = gen.GenerateGreedy(prompt, 3);
  ASSERT_TRUE(tokens.ok());
  // Replay step by step on a fresh decoder: each generated token is the argmax of the
  // previous step's logits.
  ReferenceDecoder ref = Make();
  const int seq = ref.AddSequence();
  absl::StatusOr<std::vector<double>> logits = ref.Forward(seq, prompt);
  ASSERT_TRUE(logits.ok());
  const size_t vocab = shape_.vocab;
  for (int32_t expected : *tokens) {
    absl::Span<const double> last(logits->data() + logits->size() - vocab, vocab);
    EXPECT_EQ(ArgmaxLowestIndex(last), expected);
    logits = ref.Forward(seq, {expected});
    ASSERT_TRUE(logits.ok());
  }
}

TEST_F(ReferenceDecoderTest, AttentionIsCausalAndUsesHistory) {
  std::vector<int32_t> tokens = RandomTokens(6);
  ReferenceDecoder a = Make(), b = Make();
  const int sa = a.AddSequence(), sb = b.AddSequence();
  absl::StatusOr<std::vector<double>> la = a.Forward(sa, tokens);
  tokens[3] = (tokens[3] + 1) % shape_.vocab;
  absl::StatusOr<std::vector<double>> lb = b.Forward(sb, tokens);
  ASSERT_TRUE(la.ok() && lb.ok());
  const size_t vocab = shape_.vocab;
  for (size_t t = 0; t < 6; ++t) {
    const std::vector<double> ra(la->begin() + t * vocab, la->begin() + (t + 1) * vocab);
    const std::vector<double> rb(lb->begin() + t * vocab, lb->begin() + (t + 1) * vocab);
    if (t < 3) {
      EXPECT_EQ(ra, rb) << "token " << t << " saw a later token";
    } else {
      EXPECT_GT(RelativeError(ra, rb), 1e-6) << "token " << t << " ignored token 3";
    }
  }
}

TEST_F(ReferenceDecoderTest, SequencesAreIndependentAndPrefillMatchesDecodeSteps) {
  const std::vector<int32_t> x = RandomTokens(5), y = RandomTokens(7);
  ReferenceDecoder solo = Make();
  const int s = solo.AddSequence();
  absl::StatusOr<std::vector<double>> expected = solo.Forward(s, x);
  ASSERT_TRUE(expected.ok());

  // Interleave x (one token at a time) with another sequence y.
  ReferenceDecoder mixed = Make();
  const int sy = mixed.AddSequence();
  const int sx = mixed.AddSequence();
  std::vector<double> got;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(mixed.Forward(sy, {y[i]}).ok());
    absl::StatusOr<std::vector<double>> step = mixed.Forward(sx, {x[i]});
    ASSERT_TRUE(step.ok());
    got.insert(got.end(), step->begin(), step->end());
  }
  EXPECT_EQ(got, *expected);
  EXPECT_EQ(mixed.Length(sx), 5);
  EXPECT_EQ(mixed.Length(sy), 5);
}

// For the first token, attention over one position returns that position's V and RoPE at
// position 0 is the identity, so the decoder reduces to projections and norms that this test
// computes on its own.
TEST_F(ReferenceDecoderTest, FirstTokenMatchesAnIndependentComputation) {
  ExpectFirstTokenMatchesAnIndependentComputation();
}

TEST_F(ReferenceDecoderTest, FirstTokenWithQkvBiasMatchesAnIndependentComputation) {
  shape_.qkv_bias = true;
  absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(shape_, seed_);
  ASSERT_TRUE(w.ok()) << w.status();
  weights_ = *std::move(w);
  ExpectFirstTokenMatchesAnIndependentComputation();
}

// With Qwen3's QK norm each query and key head is divided by its own RMS, so scaling the q and k
// rows of the QKV projection by 2 (exact in bf16) leaves the logits as they were (to eps's
// share); without the norm the attention scores, and so the logits, change.
TEST_F(ReferenceDecoderTest, QkNormMakesAttentionIndependentOfTheScaleOfQAndK) {
  for (bool qk_norm : {true, false}) {
    SCOPED_TRACE(qk_norm ? "with QK norm" : "without");
    shape_.qk_norm = qk_norm;
    absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(shape_, seed_);
    ASSERT_TRUE(w.ok()) << w.status();
    LlamaHostWeights scaled = *w;
    for (int l = 0; l < shape_.layers; ++l) {
      uint16_t* qk = scaled.mutable_tensor(scaled.layout.qkv(l));
      for (int64_t i = 0; i < (shape_.q_width() + shape_.kv_width()) * shape_.hidden; ++i) {
        qk[i] = FloatToBf16Bits(2.0f * Bf16BitsToFloat(qk[i]));
      }
    }
    const std::vector<int32_t> tokens = RandomTokens(6);
    absl::StatusOr<ReferenceDecoder> a = ReferenceDecoder::Create(*std::move(w));
    absl::StatusOr<ReferenceDecoder> b = ReferenceDecoder::Create(std::move(scaled));
    ASSERT_TRUE(a.ok() && b.ok());
    absl::StatusOr<std::vector<double>> la = a->Forward(a->AddSequence(), tokens);
    absl::StatusOr<std::vector<double>> lb = b->Forward(b->AddSequence(), tokens);
    ASSERT_TRUE(la.ok() && lb.ok());
    if (qk_norm) {
      EXPECT_LT(RelativeError(*lb, *la), 1e-5);
    } else {
      EXPECT_GT(RelativeError(*lb, *la), 1e-3);
    }
  }
}

TEST_F(ReferenceDecoderTest, Bf16ActivationsStayCloseToFloat64) {
  const std::vector<int32_t> tokens = RandomTokens(8);
  ReferenceDecoder exact = Make();
  ReferenceDecoder rounded = Make({/*bf16_activations=*/true});
  absl::StatusOr<std::vector<double>> a = exact.Forward(exact.AddSequence(), tokens);
  absl::StatusOr<std::vector<double>> b = rounded.Forward(rounded.AddSequence(), tokens);
  ASSERT_TRUE(a.ok() && b.ok());
  const double err = RelativeError(*b, *a);
  EXPECT_GT(err, 1e-5);  // the rounding is really applied
  EXPECT_LT(err, 5e-2);  // and stays at bf16 level
}

TEST_F(ReferenceDecoderTest, RejectsBadInput) {
  ReferenceDecoder ref = Make();
  EXPECT_EQ(ref.Forward(0, {1}).status().code(), absl::StatusCode::kInvalidArgument);
  const int seq = ref.AddSequence();
  EXPECT_EQ(ref.Forward(seq, {shape_.vocab}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ref.Forward(seq, {-1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ref.GenerateGreedy({}, 3).status().code(), absl::StatusCode::kInvalidArgument);
  LlamaHostWeights broken = weights_;
  broken.data.resize(10);
  EXPECT_EQ(ReferenceDecoder::Create(broken).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ArgmaxLowestIndexTest, TiesGoToTheLowestIndexAndNanNeverWins) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(ArgmaxLowestIndex({1.0, 3.0, 2.0, 3.0}), 1);
  EXPECT_EQ(ArgmaxLowestIndex({nan, -5.0, nan}), 1);
  EXPECT_EQ(ArgmaxLowestIndex({nan, nan}), -1);
  EXPECT_EQ(ArgmaxLowestIndex({-std::numeric_limits<double>::infinity()}), 0);
}

// ---- Sweeps of the decoder's inputs: sequence ids, tokens and step counts at their edges, and
// weights that do not match their layout or hold NaN.

// A small shape (hidden 32, 2 layers, 4/2 heads of 8, ffn 64, vocab 40) so each step is quick.
LlamaShape SmallShape() {
  LlamaShape s = LlamaShape::Tiny();
  s.hidden = 32;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 8;
  s.ffn = 64;
  s.vocab = 40;
  return s;
}

// Every bad sequence id and token (the int extremes, -1, vocab and past it), alone or after good
// tokens, is InvalidArgument naming the value and its index, and leaves the sequence as it was:
// a later good step gives the same logits as on a fresh decoder.
TEST(ReferenceDecoderSweepTest, BadSequencesAndTokensAreRefusedByValue) {
  const LlamaShape shape = SmallShape();
  absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(shape, 9);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<ReferenceDecoder> ref = ReferenceDecoder::Create(*w);
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<ReferenceDecoder> fresh = ReferenceDecoder::Create(*w);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  constexpr int kMin = std::numeric_limits<int>::min(), kMax = std::numeric_limits<int>::max();
  for (int seq : {kMin, -1, 0, 1, kMax}) {
    const absl::Status status = ref->Forward(seq, {1}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << seq;
    EXPECT_THAT(std::string(status.message()), HasSubstr(absl::StrCat("Sequence ", seq)));
    EXPECT_EQ(ref->Length(seq), 0);
  }
  const int seq = ref->AddSequence();
  const int fresh_seq = fresh->AddSequence();
  ASSERT_TRUE(ref->Forward(seq, {3, 4}).ok());
  for (int32_t token : {kMin, kMin + 1, -2, -1, shape.vocab, shape.vocab + 1, kMax}) {
    for (size_t at : {0, 1, 2}) {
      std::vector<int32_t> tokens = {5, 6, 7};
      tokens[at] = token;
      const absl::Status status = ref->Forward(seq, tokens).status();
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << token;
      EXPECT_THAT(std::string(status.message()),
                  HasSubstr(absl::StrCat("Token ", token, " at index ", at,
                                         " is outside the vocabulary [0, ", shape.vocab, ")")));
      EXPECT_EQ(ref->Length(seq), 2);
    }
  }
  absl::StatusOr<std::vector<double>> got = ref->Forward(seq, {8});
  ASSERT_TRUE(got.ok()) << got.status();
  absl::StatusOr<std::vector<double>> want = fresh->Forward(fresh_seq, {3, 4, 8});
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(*got, std::vector<double>(want->end() - shape.vocab, want->end()));
  for (int steps : {kMin, -1}) {
    EXPECT_EQ(ref->GenerateGreedy({1}, steps).status().code(), absl::StatusCode::kInvalidArgument);
  }
  absl::StatusOr<std::vector<int32_t>> none = ref->GenerateGreedy({1}, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

// Weights whose data does not match their layout (default, moved from, one value more or fewer,
// empty) are refused at Create, naming the sizes.
TEST(ReferenceDecoderSweepTest, WeightsThatDoNotMatchTheirLayoutAreRefused) {
  absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(SmallShape(), 9);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<LlamaHostWeights> bad(5);
  bad[1] = *w;
  bad[1].data.push_back(0);
  bad[2] = *w;
  bad[2].data.pop_back();
  bad[3] = *w;
  bad[3].data.clear();
  LlamaHostWeights moved = *w;
  LlamaHostWeights taken = std::move(moved);
  bad[4] = std::move(moved);  // NOLINT: moved from on purpose
  for (size_t i = 0; i < bad.size(); ++i) {
    const absl::Status status = ReferenceDecoder::Create(std::move(bad[i])).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << i;
    EXPECT_THAT(std::string(status.message()), HasSubstr("LlamaHostWeights hold")) << i;
  }
  EXPECT_TRUE(ReferenceDecoder::Create(std::move(taken)).ok());
}

// A NaN in the weights makes every logit NaN: greedy decoding says so instead of returning -1, a
// token that does not exist, or feeding it back as the next token.
TEST(ReferenceDecoderSweepTest, AllNanLogitsAreAnErrorNotATokenMinusOne) {
  const LlamaShape shape = SmallShape();
  for (const char* where : {"final_norm", "embedding", "lm_head"}) {
    absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(shape, 10);
    ASSERT_TRUE(w.ok()) << w.status();
    const WeightTensor& t = std::string(where) == "final_norm" ? w->layout.final_norm()
                            : std::string(where) == "embedding" ? w->layout.embedding()
                                                                : w->layout.lm_head();
    std::fill(w->mutable_tensor(t), w->mutable_tensor(t) + t.elements(), uint16_t{0x7fc0});
    absl::StatusOr<ReferenceDecoder> ref = ReferenceDecoder::Create(*std::move(w));
    ASSERT_TRUE(ref.ok()) << ref.status();
    for (int steps : {1, 3}) {
      absl::StatusOr<std::vector<int32_t>> tokens = ref->GenerateGreedy({1, 2}, steps);
      EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument) << where;
      EXPECT_THAT(std::string(tokens.status().message()),
                  HasSubstr("Every logit of greedy step 0 is NaN"))
          << where;
    }
  }
}

}  // namespace
}  // namespace kiln
