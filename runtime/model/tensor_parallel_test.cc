// Host tests of tensor-parallel sharding: rank shapes, errors, and what the shards compute. The
// products are checked against the full model's in float64: the column-parallel projections
// (QKV, gate-up) give each rank exactly its heads' and columns' rows of the full output, the
// row-parallel ones (O, down) sum over ranks to the full output, and replicated tensors are
// copies. Expected positions are derived from the heads each rank serves, not from the map.
#include "runtime/model/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/model/bf16.h"
#include "runtime/model/llama_weights.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

LlamaShape SplitShape(int heads, int kv_heads) {
  LlamaShape s = LlamaShape::Tiny();
  s.heads = heads;
  s.kv_heads = kv_heads;
  return s;
}

// y = W x in float64 for W [rows, cols] (bf16 bits) and x [cols].
std::vector<double> MatVec(const uint16_t* w, int64_t rows, int64_t cols,
                           const std::vector<double>& x) {
  std::vector<double> y(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += Bf16BitsToFloat(w[r * cols + c]) * x[c];
    y[r] = sum;
  }
  return y;
}

std::vector<double> RandomVector(int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

TEST(TensorParallelTest, RankShapesSplitHeadsAndFfn) {
  const LlamaShape full = SplitShape(16, 8);
  for (int tp : {1, 2, 4, 8}) {
    absl::StatusOr<LlamaShape> local = RankShape(full, tp);
    ASSERT_TRUE(local.ok()) << local.status();
    EXPECT_EQ(local->heads, 16 / tp);
    EXPECT_EQ(local->kv_heads, 8 / tp);
    EXPECT_EQ(local->ffn, full.ffn / tp);
    EXPECT_EQ(local->hidden, full.hidden);
    EXPECT_EQ(local->vocab, full.vocab);
    EXPECT_EQ(local->layers, full.layers);
  }
  // More ranks than KV heads: each rank keeps the one KV head its query heads use.
  absl::StatusOr<LlamaShape> replicated = RankShape(SplitShape(16, 2), 8);
  ASSERT_TRUE(replicated.ok()) << replicated.status();
  EXPECT_EQ(replicated->heads, 2);
  EXPECT_EQ(replicated->kv_heads, 1);
  EXPECT_EQ(KvHeadsPerRank(SplitShape(16, 2), 8), 1);
}

TEST(TensorParallelTest, ShapesThatDoNotSplitAreRefused) {
  EXPECT_THAT(std::string(RankShape(SplitShape(16, 8), 3).status().message()),
              HasSubstr("heads 16 do not split over tensor-parallel size 3"));
  EXPECT_THAT(std::string(RankShape(SplitShape(12, 6), 4).status().message()),
              HasSubstr("kv_heads 6 and tensor-parallel size 4"));
  LlamaShape odd_ffn = SplitShape(16, 8);
  odd_ffn.ffn = 520;
  EXPECT_THAT(std::string(RankShape(odd_ffn, 2).status().message()),
              HasSubstr("ffn 520 does not split"));
  EXPECT_TRUE(absl::IsInvalidArgument(RankShape(SplitShape(16, 8), 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ShardMapFor(SplitShape(16, 8), 2, 2, 1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ShardMapFor(SplitShape(16, 8), 2, 0, 999).status()));
}

// The QK norms' weights are shared by every head, so every rank keeps all of them.
TEST(TensorParallelTest, QkNormsAreReplicated) {
  LlamaShape full = SplitShape(16, 8);
  full.qkv_bias = true;
  full.qk_norm = true;
  absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(full, 6);
  ASSERT_TRUE(w.ok()) << w.status();
  for (int tp : {2, 8}) {
    for (int r = 0; r < tp; ++r) {
      absl::StatusOr<LlamaHostWeights> s = ShardLlamaHostWeights(*w, tp, r);
      ASSERT_TRUE(s.ok()) << s.status();
      for (int layer = 0; layer < full.layers; ++layer) {
        for (bool q : {true, false}) {
          const WeightTensor& all = q ? w->layout.q_norm(layer) : w->layout.k_norm(layer);
          const WeightTensor& mine = q ? s->layout.q_norm(layer) : s->layout.k_norm(layer);
          ASSERT_EQ(mine.elements(), full.head_dim);
          EXPECT_TRUE(std::equal(w->tensor(all), w->tensor(all) + all.elements(), s->tensor(mine)))
              << "tp " << tp << ", rank " << r << ", layer " << layer << (q ? " q" : " k");
        }
      }
    }
  }
}

// A QKV bias splits as the QKV rows do: each rank keeps its query heads' and KV heads' entries.
TEST(TensorParallelTest, QkvBiasesFollowTheHeads) {
  for (int kv_heads : {8, 2}) {
    LlamaShape full = SplitShape(16, kv_heads);
    full.qkv_bias = true;
    absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(full, 5);
    ASSERT_TRUE(w.ok()) << w.status();
    const int64_t d = full.head_dim;
    const int group = full.heads / full.kv_heads;
    for (int tp : {1, 2, 4, 8}) {
      const int heads = full.heads / tp;
      for (int r = 0; r < tp; ++r) {
        absl::StatusOr<LlamaHostWeights> s = ShardLlamaHostWeights(*w, tp, r);
        ASSERT_TRUE(s.ok()) << s.status();
        const LlamaShape& ls = s->layout.shape();
        const int kv_head = (r * heads) / group;
        for (int layer = 0; layer < full.layers; ++layer) {
          SCOPED_TRACE(absl::StrCat("kv_heads ", kv_heads, ", tp ", tp, ", rank ", r, ", layer ",
                                    layer));
          const uint16_t* all = w->tensor(w->layout.qkv_bias(layer));
          const uint16_t* mine = s->tensor(s->layout.qkv_bias(layer));
          for (int64_t i = 0; i < ls.q_width(); ++i) {
            ASSERT_EQ(mine[i], all[r * heads * d + i]) << "q " << i;
          }
          for (int64_t i = 0; i < ls.kv_width(); ++i) {
            ASSERT_EQ(mine[ls.q_width() + i], all[full.q_width() + kv_head * d + i]) << "k " << i;
            ASSERT_EQ(mine[ls.q_width() + ls.kv_width() + i],
                      all[full.q_width() + full.kv_width() + kv_head * d + i])
                << "v " << i;
          }
        }
      }
    }
  }
}

TEST(TensorParallelTest, ShardsComputeTheFullModelsProducts) {
  std::mt19937_64 rng(std::random_device{}());
  for (int kv_heads : {8, 2}) {
    for (bool tie : {false, true}) {
      LlamaShape full = SplitShape(16, kv_heads);
      full.tie_embeddings = tie;
      const uint64_t seed = rng();
      absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(full, seed);
      ASSERT_TRUE(w.ok()) << w.status();
      const int64_t d = full.head_dim, h = full.hidden;
      const int group = full.heads / full.kv_heads;
      for (int tp : {1, 2, 4, 8}) {
        std::vector<LlamaHostWeights> shards;
        for (int r = 0; r < tp; ++r) {
          absl::StatusOr<LlamaHostWeights> s = ShardLlamaHostWeights(*w, tp, r);
          ASSERT_TRUE(s.ok()) << s.status();
          EXPECT_EQ(s->layout.tensors().size(), w->layout.tensors().size());
          shards.push_back(*std::move(s));
        }
        const int heads = full.heads / tp;
        for (int layer = 0; layer < full.layers; ++layer) {
          SCOPED_TRACE(absl::StrCat("kv_heads ", kv_heads, ", tie ", tie, ", tp ", tp,
                                    ", layer ", layer, ", seed ", seed));
          // QKV: rank r's rows are its query heads' and the KV heads they use.
          const std::vector<double> x = RandomVector(h, rng);
          const std::vector<double> qkv =
              MatVec(w->tensor(w->layout.qkv(layer)), full.qkv_rows(), h, x);
          // gate-up.
          const std::vector<double> gu =
              MatVec(w->tensor(w->layout.gate_up(layer)), 2 * int64_t{full.ffn}, h, x);
          // O and down: the ranks' partial sums add up to the full product.
          const std::vector<double> attn = RandomVector(full.q_width(), rng);
          const std::vector<double> o =
              MatVec(w->tensor(w->layout.o(layer)), h, full.q_width(), attn);
          const std::vector<double> act = RandomVector(full.ffn, rng);
          const std::vector<double> down =
              MatVec(w->tensor(w->layout.down(layer)), h, full.ffn, act);
          std::vector<double> o_sum(h, 0.0), down_sum(h, 0.0);
          for (int r = 0; r < tp; ++r) {
            const LlamaHostWeights& s = shards[r];
            const LlamaShape& ls = s.layout.shape();
            const std::vector<double> mine =
                MatVec(s.tensor(s.layout.qkv(layer)), ls.qkv_rows(), h, x);
            const int kv_head = (r * heads) / group;  // the KV head of the rank's first q head
            for (int64_t i = 0; i < ls.q_width(); ++i) {
              ASSERT_EQ(mine[i], qkv[r * heads * d + i]) << "q row " << i << " of rank " << r;
            }
            for (int64_t i = 0; i < ls.kv_width(); ++i) {
              ASSERT_EQ(mine[ls.q_width() + i], qkv[full.q_width() + kv_head * d + i])
                  << "k row " << i << " of rank " << r;
              ASSERT_EQ(mine[ls.q_width() + ls.kv_width() + i],
                        qkv[full.q_width() + full.kv_width() + kv_head * d + i])
                  << "v row " << i << " of rank " << r;
            }
            const std::vector<double> gu_mine =
                MatVec(s.tensor(s.layout.gate_up(layer)), 2 * int64_t{ls.ffn}, h, x);
            for (int64_t i = 0; i < ls.ffn; ++i) {
              ASSERT_EQ(gu_mine[i], gu[r * ls.ffn + i]) << "gate row " << i;
              ASSERT_EQ(gu_mine[ls.ffn + i], gu[full.ffn + r * ls.ffn + i]) << "up row " << i;
            }
            const std::vector<double> attn_mine(attn.begin() + r * ls.q_width(),
                                                attn.begin() + (r + 1) * ls.q_width());
            const std::vector<double> act_mine(act.begin() + r * ls.ffn,
                                               act.begin() + (r + 1) * ls.ffn);
            const std::vector<double> o_mine =
                MatVec(s.tensor(s.layout.o(layer)), h, ls.q_width(), attn_mine);
            const std::vector<double> down_mine =
                MatVec(s.tensor(s.layout.down(layer)), h, ls.ffn, act_mine);
            for (int64_t i = 0; i < h; ++i) {
              o_sum[i] += o_mine[i];
              down_sum[i] += down_mine[i];
            }
            // Replicated tensors are copies.
            EXPECT_TRUE(std::equal(s.tensor(s.layout.input_norm(layer)),
                                   s.tensor(s.layout.input_norm(layer)) + h,
                                   w->tensor(w->layout.input_norm(layer))));
            EXPECT_TRUE(std::equal(s.tensor(s.layout.post_norm(layer)),
                                   s.tensor(s.layout.post_norm(layer)) + h,
                                   w->tensor(w->layout.post_norm(layer))));
          }
          for (int64_t i = 0; i < h; ++i) {
            ASSERT_NEAR(o_sum[i], o[i], 1e-9 * (1 + std::fabs(o[i]))) << "O output " << i;
            ASSERT_NEAR(down_sum[i], down[i], 1e-9 * (1 + std::fabs(down[i])))
                << "down output " << i;
          }
        }
        for (const LlamaHostWeights& s : shards) {
          const WeightTensor& emb = s.layout.embedding();
          EXPECT_TRUE(std::equal(s.tensor(emb), s.tensor(emb) + emb.elements(),
                                 w->tensor(w->layout.embedding())));
          const WeightTensor& head = s.layout.lm_head();
          EXPECT_TRUE(std::equal(s.tensor(head), s.tensor(head) + head.elements(),
                                 w->tensor(w->layout.lm_head())));
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln
