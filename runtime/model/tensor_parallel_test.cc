// Host tests of tensor-parallel sharding: rank shapes, errors, and what the shards compute. The
// products are checked against the full model's in float64: the column-parallel projections
// (QKV, gate-up) give each rank exactly its heads' and columns' rows of the full output, the
// row-parallel ones (O, down) sum over ranks to the full output, and replicated tensors are
// copies. Expected positions are derived from the heads each rank serves, not from the map.
#include "runtime/model/tensor_parallel.h"

#include <algorithm>
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

// ---- Sweeps: every tensor-parallel size from 1 to 16 and the absurd ones, every rank in and out
// of range, over shapes of many head groupings. The expected split is derived here from the heads
// each rank serves (tensor_parallel.h), not from the maps.

constexpr int kIntMin = std::numeric_limits<int>::min();
constexpr int kIntMax = std::numeric_limits<int>::max();

// Whether `full` splits over `tp` ranks, by the rules of tensor_parallel.h written out again.
bool Splits(const LlamaShape& full, int tp) {
  if (tp < 1 || full.heads % tp != 0 || full.ffn % tp != 0 || (full.ffn / tp) % 8 != 0) {
    return false;
  }
  return full.kv_heads >= tp ? full.kv_heads % tp == 0 : tp % full.kv_heads == 0;
}

// Small shapes (hidden 16, head_dim 8, vocab 8, one layer) with every head grouping of up to 48
// query heads, tied or not, with and without QKV biases and QK norms.
std::vector<LlamaShape> SweepShapes() {
  std::vector<LlamaShape> shapes;
  for (int heads : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48}) {
    for (int kv = 1; kv <= heads; ++kv) {
      if (heads % kv != 0) continue;
      LlamaShape s = LlamaShape::Tiny();
      s.hidden = 16;
      s.head_dim = 8;
      s.layers = 1;
      s.vocab = 8;
      s.heads = heads;
      s.kv_heads = kv;
      s.ffn = 8 * (heads % 5 == 0 ? 3 : 16);  // 128 splits up to 16 ways; 24 does not
      s.tie_embeddings = heads % 2 == 0;
      s.qkv_bias = kv % 2 == 1;
      s.qk_norm = heads % 3 == 0;
      shapes.push_back(s);
    }
  }
  return shapes;
}

// How tensor `index` of `layout` splits, from the layout's accessors: "qkv" (the QKV weights and
// biases), "gate_up", "o", "down", or "replicated".
std::string SplitOf(const LlamaWeightLayout& layout, int index) {
  const LlamaShape& s = layout.shape();
  for (int l = 0; l < s.layers; ++l) {
    if (layout.qkv(l).index == index || (s.qkv_bias && layout.qkv_bias(l).index == index)) {
      return "qkv";
    }
    if (layout.gate_up(l).index == index) return "gate_up";
    if (layout.o(l).index == index) return "o";
    if (layout.down(l).index == index) return "down";
  }
  return "replicated";
}

// The full tensor's flat index of rank `r`'s element (row, col) of tensor `t_full`'s shard, from
// the heads and columns the rank serves.
int64_t ExpectedFullIndex(const LlamaShape& full, int tp, int r, const WeightTensor& t_full,
                          const std::string& split, int64_t row, int64_t col) {
  const int64_t d = full.head_dim;
  const int64_t heads = full.heads / tp, ffn = full.ffn / tp;
  const int64_t kv = std::max(1, full.kv_heads / tp);
  const int64_t group = full.heads / full.kv_heads;
  const int64_t first_kv = r * heads / group;  // the KV head of the rank's first query head
  if (split == "qkv") {
    int64_t full_row;
    if (row < heads * d) {
      full_row = r * heads * d + row;
    } else if (row < (heads + kv) * d) {
      full_row = full.heads * d + first_kv * d + (row - heads * d);
    } else {
      full_row = (int64_t{full.heads} + full.kv_heads) * d + first_kv * d + (row - (heads + kv) * d);
    }
    return full_row * t_full.cols + col;
  }
  if (split == "gate_up") {
    const int64_t full_row = row < ffn ? r * ffn + row : full.ffn + r * ffn + (row - ffn);
    return full_row * t_full.cols + col;
  }
  if (split == "o") return row * t_full.cols + r * heads * d + col;
  if (split == "down") return row * t_full.cols + r * ffn + col;
  return row * t_full.cols + col;  // replicated
}

// For every shape and tp in [1, 16] and the absurd sizes: RankShape and ShardMapFor accept exactly
// the splits the rules allow; refusals are InvalidArgument naming the size and the field; for each
// accepted split, every rank's every tensor maps each local element to the full element its heads
// and columns call for, the shard's bits are those elements, and across ranks the split tensors
// are tiled exactly once (q rows, gate and up rows, O and down columns), the KV rows once per
// rank that shares a KV head (max(1, tp / kv_heads) ranks), replicated tensors whole at every rank.
TEST(TensorParallelSweepTest, EverySizeAndRankTilesEachTensor) {
  int splits = 0, refused = 0, elements = 0;
  for (const LlamaShape& full : SweepShapes()) {
    absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(full, 21);
    ASSERT_TRUE(w.ok()) << w.status();
    const LlamaWeightLayout& fl = w->layout;
    for (int tp : {kIntMin, -16, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                   17, 24, 32, 48, 64, 1 << 20, kIntMax}) {
      SCOPED_TRACE(absl::StrCat(full.ToString(), ", tp ", tp));
      const absl::StatusOr<LlamaShape> local = RankShape(full, tp);
      ASSERT_EQ(local.ok(), Splits(full, tp)) << local.status();
      ASSERT_EQ(CheckTensorParallelShape(full, tp).ok(), Splits(full, tp));
      if (!local.ok()) {
        ++refused;
        ASSERT_EQ(local.status().code(), absl::StatusCode::kInvalidArgument);
        const std::string message(local.status().message());
        EXPECT_THAT(message, HasSubstr(absl::StrCat(tp)));
        EXPECT_TRUE(message.find("Tensor-parallel size") == 0 || message.find("heads") != std::string::npos ||
                    message.find("ffn") != std::string::npos)
            << message;
        EXPECT_EQ(KvHeadsPerRank(full, tp), -1);
        EXPECT_EQ(ShardMapFor(full, tp, 0, 0).status(), local.status());
        continue;
      }
      ++splits;
      EXPECT_EQ(KvHeadsPerRank(full, tp), std::max(1, full.kv_heads / tp));
      // How often each full element is held, over all ranks, per tensor.
      std::vector<std::vector<int>> held(fl.tensors().size());
      for (const WeightTensor& t : fl.tensors()) held[t.index].assign(t.elements(), 0);
      for (int r : {kIntMin, -1, tp, tp + 1, kIntMax}) {
        if (r == tp + 1 && tp == kIntMax) continue;
        const absl::Status status = ShardMapFor(full, tp, r, 0).status();
        EXPECT_THAT(std::string(status.message()),
                    HasSubstr(absl::StrCat("Rank ", r, " is outside [0, ", tp, ")")));
        EXPECT_EQ(ShardLlamaHostWeights(*w, tp, r).status(), status);
      }
      for (int index : {kIntMin, -1, static_cast<int>(fl.tensors().size()), kIntMax}) {
        EXPECT_THAT(std::string(ShardMapFor(full, tp, 0, index).status().message()),
                    HasSubstr(absl::StrCat("Weight tensor index ", index, " is outside [0, ",
                                           fl.tensors().size(), ")")));
      }
      for (int r = 0; r < tp; ++r) {
        absl::StatusOr<LlamaHostWeights> shard = ShardLlamaHostWeights(*w, tp, r);
        ASSERT_TRUE(shard.ok()) << shard.status();
        ASSERT_EQ(shard->layout.shape().heads, local->heads);
        ASSERT_EQ(shard->layout.tensors().size(), fl.tensors().size());
        for (const WeightTensor& t : shard->layout.tensors()) {
          const WeightTensor& tf = fl.tensors()[t.index];
          const std::string split = SplitOf(fl, tf.index);
          absl::StatusOr<WeightShardMap> map = ShardMapFor(full, tp, r, t.index);
          ASSERT_TRUE(map.ok()) << map.status();
          ASSERT_EQ(map->full_cols, tf.cols) << tf.name;
          ASSERT_EQ(map->identity, t.rows == tf.rows && t.cols == tf.cols) << tf.name;
          int64_t next_local = 0;  // the runs cover the local rows in order, once
          for (const WeightShardMap::Rows& run : map->rows) {
            ASSERT_EQ(run.local_first, next_local) << tf.name;
            ASSERT_TRUE(run.count >= 0 && run.full_first >= 0 && run.full_first + run.count <= tf.rows)
                << tf.name;
            next_local += run.count;
          }
          ASSERT_EQ(next_local, t.rows) << tf.name;
          ASSERT_EQ(map->cols, t.cols) << tf.name;
          // Elements outside the shard have no full index, whatever their values.
          constexpr int64_t kLo = std::numeric_limits<int64_t>::min();
          constexpr int64_t kHi = std::numeric_limits<int64_t>::max();
          for (const auto& [row, col] : std::vector<std::pair<int64_t, int64_t>>{
                   {-1, 0}, {t.rows, 0}, {0, -1}, {0, t.cols}, {kLo, 0}, {kHi, 0}, {0, kLo},
                   {0, kHi}, {kHi, kHi}, {kLo, kLo}, {t.rows - 1, t.cols}}) {
            ASSERT_EQ(map->FullIndex(row, col), -1) << tf.name << " (" << row << ", " << col << ")";
          }
          for (int64_t row = 0; row < t.rows; ++row) {
            for (int64_t col = 0; col < t.cols; ++col) {
              const int64_t want =
                  ExpectedFullIndex(full, tp, r, tf, split, row, col);
              ASSERT_TRUE(want >= 0 && want < tf.elements()) << tf.name;
              ASSERT_EQ(map->FullIndex(row, col), want) << tf.name << " (" << row << ", " << col << ")";
              ASSERT_EQ(shard->tensor(t)[row * t.cols + col], w->tensor(tf)[want]) << tf.name;
              ++held[t.index][want];
              ++elements;
            }
          }
        }
      }
      // Tiling: replicated tensors at every rank; q rows, gate/up rows, O and down columns once;
      // K and V rows once per rank that shares their head.
      const int64_t d = full.head_dim;
      const int kv_share = std::max(1, tp / full.kv_heads);
      for (const WeightTensor& tf : fl.tensors()) {
        const std::string split = SplitOf(fl, tf.index);
        for (int64_t e = 0; e < tf.elements(); ++e) {
          int want = 1;
          if (split == "replicated") {
            want = tp;
          } else if (split == "qkv") {
            want = e / tf.cols >= full.heads * d ? kv_share : 1;
          }
          ASSERT_EQ(held[tf.index][e], want) << tf.name << " element " << e;
        }
      }
    }
  }
  EXPECT_GT(splits, 150);
  EXPECT_GT(refused, 500);
  EXPECT_GT(elements, 1000000);
}

// Whether two maps place every element alike: the same runs, columns and identity flag.
bool SameMap(const WeightShardMap& a, const WeightShardMap& b) {
  if (a.rows.size() != b.rows.size() || a.full_cols != b.full_cols ||
      a.col_offset != b.col_offset || a.cols != b.cols || a.identity != b.identity) {
    return false;
  }
  for (size_t i = 0; i < a.rows.size(); ++i) {
    if (a.rows[i].local_first != b.rows[i].local_first ||
        a.rows[i].full_first != b.rows[i].full_first || a.rows[i].count != b.rows[i].count) {
      return false;
    }
  }
  return true;
}

// ShardMapsFor, which checks the split and the rank once for the whole pass, gives each tensor's
// ShardMapFor, and refuses what ShardMapFor refuses with the same status, for every shape, size
// and rank of the sweep.
TEST(TensorParallelSweepTest, ShardMapsForIsEachTensorsShardMapFor) {
  int passes = 0, refused = 0;
  for (const LlamaShape& full : SweepShapes()) {
    absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(full);
    ASSERT_TRUE(layout.ok()) << layout.status();
    for (int tp : {kIntMin, -1, 0, 1, 2, 3, 4, 6, 8, 16, kIntMax}) {
      std::vector<int> ranks = {kIntMin, -1, 0, 1, kIntMax};
      if (tp > 0) ranks.insert(ranks.end(), {tp - 1, tp});
      for (int r : ranks) {
        SCOPED_TRACE(absl::StrCat(full.ToString(), ", tp ", tp, ", rank ", r));
        const absl::StatusOr<std::vector<WeightShardMap>> maps = ShardMapsFor(full, tp, r);
        const absl::Status first = ShardMapFor(full, tp, r, 0).status();
        if (!first.ok()) {
          ++refused;
          EXPECT_EQ(maps.status(), first);
          continue;
        }
        ++passes;
        ASSERT_TRUE(maps.ok()) << maps.status();
        ASSERT_EQ(maps->size(), layout->tensors().size());
        for (const WeightTensor& t : layout->tensors()) {
          absl::StatusOr<WeightShardMap> map = ShardMapFor(full, tp, r, t.index);
          ASSERT_TRUE(map.ok()) << map.status();
          EXPECT_TRUE(SameMap((*maps)[t.index], *map)) << t.name;
        }
      }
    }
  }
  EXPECT_GT(passes, 100);
  EXPECT_GT(refused, 500);
}

// KvHeadsPerRank never divides by a size of 0 or below, and says -1 for a split that is refused.
TEST(TensorParallelSweepTest, KvHeadsPerRankOfEverySize) {
  for (const LlamaShape& full : SweepShapes()) {
    for (int tp = -20; tp <= 64; ++tp) {
      EXPECT_EQ(KvHeadsPerRank(full, tp), Splits(full, tp) ? std::max(1, full.kv_heads / tp) : -1)
          << full.ToString() << ", tp " << tp;
    }
    for (int tp : {kIntMin, kIntMax}) EXPECT_EQ(KvHeadsPerRank(full, tp), -1);
  }
  LlamaShape bad = LlamaShape::Tiny();
  bad.kv_heads = 0;  // Validate refuses it: no split at all, and no division by it
  for (int tp : {kIntMin, -1, 0, 1, 2}) {
    EXPECT_EQ(KvHeadsPerRank(bad, tp), -1);
    EXPECT_EQ(RankShape(bad, tp).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// A pass over every tensor of the largest layer count (4096 layers with QKV biases and QK norms:
// 36,867 tensors) is linear: each map costs the same whatever the tensor count. Each map's sizes
// agree with the layout's.
TEST(TensorParallelSweepTest, MapsOfEveryTensorOfThousandsOfLayersAreLinear) {
  LlamaShape full = LlamaShape::Tiny();
  full.hidden = 16;
  full.ffn = 32;
  full.head_dim = 8;
  full.vocab = 8;
  full.layers = 4096;
  full.qkv_bias = full.qk_norm = true;
  absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(full);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->tensors().size(), 36867u);  // 1 + 6 * 4096 + 2 + 4096 + 2 * 4096
  absl::StatusOr<LlamaShape> local_shape = RankShape(full, 4);
  ASSERT_TRUE(local_shape.ok()) << local_shape.status();
  absl::StatusOr<LlamaWeightLayout> local = LlamaWeightLayout::Create(*local_shape);
  ASSERT_TRUE(local.ok()) << local.status();
  for (const WeightTensor& t : layout->tensors()) {
    absl::StatusOr<WeightShardMap> map = ShardMapFor(full, 4, 3, t.index);
    ASSERT_TRUE(map.ok()) << map.status();
    ASSERT_EQ(map->full_cols, t.cols) << t.name;
    int64_t rows = 0;
    for (const WeightShardMap::Rows& run : map->rows) rows += run.count;
    ASSERT_EQ(rows, local->tensors()[t.index].rows) << t.name;
  }
  absl::StatusOr<std::vector<WeightShardMap>> maps = ShardMapsFor(full, 4, 3);
  ASSERT_TRUE(maps.ok()) << maps.status();
  ASSERT_EQ(maps->size(), 36867u);
  for (const WeightTensor& t : local->tensors()) {
    int64_t rows = 0;
    for (const WeightShardMap::Rows& run : (*maps)[t.index].rows) rows += run.count;
    ASSERT_EQ(rows, t.rows) << t.name;
    ASSERT_EQ((*maps)[t.index].cols, t.cols) << t.name;
  }
  absl::StatusOr<LlamaHostWeights> w = ZeroLlamaHostWeights(full);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<LlamaHostWeights> shard = ShardLlamaHostWeights(*w, 4, 3);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->layout.tensors().size(), 36867u);
}

// Weights whose data does not match their layout are refused, not read out of bounds.
TEST(TensorParallelSweepTest, ShardOfInconsistentWeightsIsRefused) {
  absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(SplitShape(16, 8), 2);
  ASSERT_TRUE(w.ok()) << w.status();
  const LlamaHostWeights short_data = [&] {
    LlamaHostWeights cut = *w;
    cut.data.resize(cut.data.size() / 2);
    return cut;
  }();
  const LlamaHostWeights empty;
  for (const LlamaHostWeights* bad : {&short_data, &empty}) {
    const absl::Status status = ShardLlamaHostWeights(*bad, 2, 0).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("LlamaHostWeights hold"));
  }
}

}  // namespace
}  // namespace kiln
