#include "runtime/model/llama_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/config/hf_model.h"
#include "runtime/config/quoted.h"
#include "runtime/model/bf16.h"
#include "runtime/model/internal/odd_names.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tensor_parallel.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing_internal::ExpectQuotedStatus;
using testing_internal::kOddName;
using testing_internal::kOddNameEscaped;
using testing_internal::QuotedAsIs;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// Builds a checkpoint's entries from `w` (HF names), so a test can drop, rename or alter one.
std::vector<SafetensorsEntry> Entries(const LlamaHostWeights& w) {
  std::vector<SafetensorsEntry> entries;
  for (const HfTensorSlice& s : HfTensorSlices(w.layout)) {
    const WeightTensor& t = w.layout.tensors()[s.tensor_index];
    SafetensorsEntry e;
    e.name = s.hf_name;
    e.dtype = "BF16";
    e.shape = s.cols == 0 ? std::vector<int64_t>{s.rows} : std::vector<int64_t>{s.rows, s.cols};
    e.data = w.tensor(t) + s.first_row * t.cols;
    e.bytes = static_cast<size_t>(s.rows * t.cols) * 2;
    entries.push_back(e);
  }
  return entries;
}

class LlamaCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<LlamaHostWeights> w =
        RandomLlamaHostWeights(shape_, std::random_device{}());
    ASSERT_TRUE(w.ok()) << w.status();
    weights_ = *std::move(w);
  }

  absl::Status ReadWith(std::vector<SafetensorsEntry> entries, const std::string& name) {
    const std::string path = TempPath(name);
    absl::Status written = WriteSafetensors(path, entries);
    if (!written.ok()) return written;
    return ReadLlamaSafetensors({path}, shape_).status();
  }

  LlamaShape shape_ = LlamaShape::Tiny();
  LlamaHostWeights weights_;
};

TEST_F(LlamaCheckpointTest, RoundTripsThroughHfNames) {
  const std::string path = TempPath("tiny.safetensors");
  ASSERT_TRUE(WriteLlamaSafetensors(path, weights_).ok());

  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const SafetensorsTensor* k = reader->Find("model.layers.1.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (std::vector<int64_t>{shape_.kv_width(), shape_.hidden}));
  ASSERT_NE(reader->Find("lm_head.weight"), nullptr);
  EXPECT_EQ(reader->tensors().size(), 2 + 9 * shape_.layers + 1u);

  absl::StatusOr<LlamaHostWeights> back = ReadLlamaSafetensors({path}, shape_);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data, weights_.data);

  // The k rows of the fused qkv are exactly the file's k_proj.
  std::vector<uint16_t> k_file(k->bytes() / 2);
  ASSERT_TRUE(reader->Read(*k, k_file.data(), k->bytes()).ok());
  const uint16_t* fused_k = back->tensor(back->layout.qkv(1)) + shape_.q_width() * shape_.hidden;
  EXPECT_TRUE(std::equal(k_file.begin(), k_file.end(), fused_k));
}

// Qwen2's q, k and v biases: written and read under HF names, fused as the weights are; a shape
// without them names the fix.
TEST_F(LlamaCheckpointTest, RoundTripsQkvBiases) {
  LlamaShape biased = shape_;
  biased.qkv_bias = true;
  absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(biased, 3);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string path = TempPath("biased.safetensors");
  ASSERT_TRUE(WriteLlamaSafetensors(path, *w).ok());
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->tensors().size(), 2 + 12 * biased.layers + 1u);
  const SafetensorsTensor* v = reader->Find("model.layers.1.self_attn.v_proj.bias");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->shape, (std::vector<int64_t>{biased.kv_width()}));
  std::vector<uint16_t> v_file(v->bytes() / 2);
  ASSERT_TRUE(reader->Read(*v, v_file.data(), v->bytes()).ok());
  EXPECT_TRUE(std::equal(v_file.begin(), v_file.end(),
                         w->tensor(w->layout.qkv_bias(1)) + biased.q_width() + biased.kv_width()));

  absl::StatusOr<LlamaHostWeights> back = ReadLlamaSafetensors({path}, biased);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data, w->data);
  const absl::Status without = ReadLlamaSafetensors({path}, shape_).status();
  EXPECT_EQ(without.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(without.message()),
              HasSubstr("self_attn.k_proj.bias' in \"" + path +
                        "\" is unexpected: the LlamaShape has no QKV bias; set qkv_bias = true"));
}

// Qwen3's q and k norms: written and read under HF names; a shape without them names the fix.
TEST_F(LlamaCheckpointTest, RoundTripsQkNorms) {
  LlamaShape normed = shape_;
  normed.qk_norm = true;
  absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(normed, 4);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string path = TempPath("qk_norm.safetensors");
  ASSERT_TRUE(WriteLlamaSafetensors(path, *w).ok());
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->tensors().size(), 2 + 11 * normed.layers + 1u);
  const SafetensorsTensor* k = reader->Find("model.layers.1.self_attn.k_norm.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (std::vector<int64_t>{normed.head_dim}));
  std::vector<uint16_t> k_file(k->bytes() / 2);
  ASSERT_TRUE(reader->Read(*k, k_file.data(), k->bytes()).ok());
  EXPECT_TRUE(std::equal(k_file.begin(), k_file.end(), w->tensor(w->layout.k_norm(1))));

  absl::StatusOr<LlamaHostWeights> back = ReadLlamaSafetensors({path}, normed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data, w->data);
  const absl::Status without = ReadLlamaSafetensors({path}, shape_).status();
  EXPECT_EQ(without.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(without.message()),
              HasSubstr("_norm.weight' in \"" + path +
                        "\" is unexpected: the LlamaShape has no QK norm; set qk_norm = true"));
}

TEST_F(LlamaCheckpointTest, ReadsShardedCheckpoints) {
  std::vector<SafetensorsEntry> all = Entries(weights_);
  std::vector<SafetensorsEntry> first(all.begin(), all.begin() + all.size() / 2);
  std::vector<SafetensorsEntry> second(all.begin() + all.size() / 2, all.end());
  const std::string a = TempPath("shard-1.safetensors"), b = TempPath("shard-2.safetensors");
  ASSERT_TRUE(WriteSafetensors(a, first).ok());
  ASSERT_TRUE(WriteSafetensors(b, second).ok());
  absl::StatusOr<LlamaHostWeights> back = ReadLlamaSafetensors({a, b}, shape_);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data, weights_.data);
  // The same shard twice is ambiguous.
  absl::Status twice = ReadLlamaSafetensors({a, a, b}, shape_).status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(twice.message()),
              HasSubstr("appears in both \"" + a + "\" and \"" + a + "\"; pass each shard"));
}

// Each tensor-parallel rank reads its shard straight from the files (split across two of them):
// the bits ShardLlamaHostWeights cuts from the whole model, at 2 and 4 ranks, with KV heads split
// (2 ranks) and shared (4 ranks of 2 KV heads), with QKV biases and with QK norms; progress counts
// the rank's bytes alone.
TEST_F(LlamaCheckpointTest, ReadsEachTensorParallelRanksShardAlone) {
  LlamaShape biased = shape_;
  biased.qkv_bias = true;
  LlamaShape normed = shape_;
  normed.qk_norm = true;
  normed.tie_embeddings = true;
  for (const LlamaShape& shape : {shape_, biased, normed}) {
    absl::StatusOr<LlamaHostWeights> full = RandomLlamaHostWeights(shape, 11);
    ASSERT_TRUE(full.ok()) << full.status();
    std::vector<SafetensorsEntry> all = Entries(*full);
    std::vector<SafetensorsEntry> first(all.begin(), all.begin() + all.size() / 3);
    std::vector<SafetensorsEntry> second(all.begin() + all.size() / 3, all.end());
    const std::string a = TempPath("tp-1.safetensors"), b = TempPath("tp-2.safetensors");
    ASSERT_TRUE(WriteSafetensors(a, first).ok());
    ASSERT_TRUE(WriteSafetensors(b, second).ok());
    for (int world : {1, 2, 4}) {
      for (int rank = 0; rank < world; ++rank) {
        SCOPED_TRACE(absl::StrCat(shape.ToString(), ", rank ", rank, " of ", world));
        absl::StatusOr<LlamaHostWeights> expected = ShardLlamaHostWeights(*full, world, rank);
        ASSERT_TRUE(expected.ok()) << expected.status();
        int64_t last_done = 0, last_total = 0;
        absl::StatusOr<LlamaHostWeights> mine = ReadLlamaSafetensorsShard(
            {a, b}, shape, world, rank, [&](int64_t done, int64_t total) {
              EXPECT_GT(done, last_done);
              last_done = done;
              last_total = total;
            });
        ASSERT_TRUE(mine.ok()) << mine.status();
        EXPECT_EQ(mine->layout.shape().heads, shape.heads / world);
        EXPECT_EQ(mine->data, expected->data);
        // The weights are laid out as the reader's rank layout, the rank shape's own.
        EXPECT_TRUE(mine->Validate().ok()) << mine->Validate();
        EXPECT_EQ(mine->layout.total_bytes(), expected->layout.total_bytes());
        ASSERT_EQ(mine->layout.tensors().size(), expected->layout.tensors().size());
        for (size_t i = 0; i < mine->layout.tensors().size(); ++i) {
          EXPECT_EQ(mine->layout.tensors()[i].name, expected->layout.tensors()[i].name);
          EXPECT_EQ(mine->layout.tensors()[i].offset, expected->layout.tensors()[i].offset);
        }
        int64_t shard_bytes = 0;  // the tensors' own bytes, without the layout's alignment
        for (const WeightTensor& t : expected->layout.tensors()) shard_bytes += t.rows * t.cols * 2;
        EXPECT_EQ(last_total, shard_bytes);
        EXPECT_EQ(last_done, last_total);
      }
    }
  }
}

// A reader's blocks read any run of their rows; rows outside a block are refused.
TEST_F(LlamaCheckpointTest, ShardReaderReadsRunsOfABlocksRows) {
  const std::string path = TempPath("rows.safetensors");
  ASSERT_TRUE(WriteLlamaSafetensors(path, weights_).ok());
  absl::StatusOr<LlamaShardReader> reader = LlamaShardReader::Open({path}, shape_, 2, 1);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<LlamaHostWeights> shard = ShardLlamaHostWeights(weights_, 2, 1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  for (const LlamaShardReader::Block& b : reader->blocks()) {
    const WeightTensor& t = reader->layout().tensors()[b.tensor_index];
    const int64_t first = b.rows / 3, rows = b.rows - b.rows / 3 - b.rows / 4;
    std::vector<uint16_t> got(static_cast<size_t>(rows * t.cols), 0xdead);
    ASSERT_TRUE(reader->ReadRows(b, first, rows, got.data()).ok()) << t.name;
    const uint16_t* want = shard->tensor(t) + (b.local_row + first) * t.cols;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want)) << t.name;
  }
  const LlamaShardReader::Block& b = reader->blocks().front();
  std::vector<uint16_t> room(static_cast<size_t>((b.rows + 1) * reader->layout().tensors()[b.tensor_index].cols));
  absl::Status past = reader->ReadRows(b, 1, b.rows, room.data());
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(past.message()), HasSubstr(absl::StrCat("read rows within [0, ", b.rows, ")")));
  // first + rows would overflow int64 (and wrap to a range inside the block): refused, not read.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(reader->ReadRows(b, kMax, 2, room.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reader->ReadRows(b, 1, kMax, room.data()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LlamaCheckpointTest, ShardOfAnUnsplittableShapeOrRankIsRefused) {
  const std::string path = TempPath("tp-refused.safetensors");
  ASSERT_TRUE(WriteLlamaSafetensors(path, weights_).ok());
  absl::Status three = ReadLlamaSafetensorsShard({path}, shape_, 3, 0).status();
  EXPECT_EQ(three.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(three.message()), HasSubstr("heads 4 do not split over tensor-parallel size 3"));
  absl::Status rank = ReadLlamaSafetensorsShard({path}, shape_, 2, 2).status();
  EXPECT_EQ(rank.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(rank.message()), HasSubstr("Rank 2 is outside [0, 2)"));
  // The whole checkpoint's names are still checked: a missing tensor of another rank's rows.
  std::vector<SafetensorsEntry> entries = Entries(weights_);
  entries.erase(entries.begin() + 3);  // model.layers.0.self_attn.k_proj.weight
  ASSERT_TRUE(WriteSafetensors(path, entries).ok());
  absl::Status missing = ReadLlamaSafetensorsShard({path}, shape_, 2, 0).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("'model.layers.0.self_attn.k_proj.weight'"));
}

TEST_F(LlamaCheckpointTest, TiedShapeNeedsNoLmHead) {
  LlamaShape tied = shape_;
  tied.tie_embeddings = true;
  absl::StatusOr<LlamaHostWeights> w = RandomLlamaHostWeights(tied, 3);
  ASSERT_TRUE(w.ok());
  const std::string path = TempPath("tied.safetensors");
  ASSERT_TRUE(WriteLlamaSafetensors(path, *w).ok());
  absl::StatusOr<LlamaHostWeights> back = ReadLlamaSafetensors({path}, tied);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data, w->data);
  // The untied tiny shape needs the lm_head this file lacks.
  absl::Status missing = ReadLlamaSafetensors({path}, shape_).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("lacks tensor 'lm_head.weight'"));
}

TEST_F(LlamaCheckpointTest, MissingTensorNamesIt) {
  std::vector<SafetensorsEntry> entries = Entries(weights_);
  entries.erase(std::remove_if(entries.begin(), entries.end(),
                               [](const SafetensorsEntry& e) {
                                 return e.name == "model.layers.1.mlp.up_proj.weight";
                               }),
                entries.end());
  absl::Status s = ReadWith(entries, "missing.safetensors");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("lacks tensor 'model.layers.1.mlp.up_proj.weight'"));
}

TEST_F(LlamaCheckpointTest, UnexpectedNamesExplainTheFix) {
  std::vector<uint16_t> extra(shape_.hidden, 0x3f80);
  {
    std::vector<SafetensorsEntry> entries = Entries(weights_);
    entries.push_back({"model.layers.2.input_layernorm.weight", "BF16", {shape_.hidden},
                       extra.data(), extra.size() * 2});
    absl::Status s = ReadWith(entries, "extra_layer.safetensors");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("LlamaShape.layers is 2"));
  }
  {
    std::vector<SafetensorsEntry> entries = Entries(weights_);
    entries[3].name = "model.layers.0.self_attn.query.weight";  // a misspelt name
    absl::Status s = ReadWith(entries, "misspelt.safetensors");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("'model.layers.0.self_attn.query.weight'"));
  }
  {
    LlamaShape tied = shape_;
    tied.tie_embeddings = true;
    const std::string path = TempPath("untied.safetensors");
    ASSERT_TRUE(WriteLlamaSafetensors(path, weights_).ok());
    absl::Status s = ReadLlamaSafetensors({path}, tied).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("tie_embeddings = false"));
  }
  {
    // Old checkpoints carry RoPE buffers; they are ignored.
    std::vector<float> inv_freq(shape_.head_dim / 2, 1.0f);
    std::vector<SafetensorsEntry> entries = Entries(weights_);
    entries.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32",
                       {shape_.head_dim / 2}, inv_freq.data(), inv_freq.size() * 4});
    EXPECT_TRUE(ReadWith(entries, "inv_freq.safetensors").ok());
  }
}

TEST_F(LlamaCheckpointTest, WrongShapeNamesTheFields) {
  std::vector<SafetensorsEntry> entries = Entries(weights_);
  for (SafetensorsEntry& e : entries) {
    if (e.name == "model.layers.0.self_attn.k_proj.weight") {
      e.shape = {shape_.hidden, shape_.kv_width()};  // transposed: same bytes, wrong shape
    }
  }
  absl::Status s = ReadWith(entries, "shape.safetensors");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("'model.layers.0.self_attn.k_proj.weight' has shape [256, 128]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("[kv_heads * head_dim, hidden] = [128, 256]"));
}

TEST_F(LlamaCheckpointTest, WrongDtypeSaysConvert) {
  std::vector<SafetensorsEntry> entries = Entries(weights_);
  std::vector<int8_t> norm(shape_.hidden, 1);
  for (SafetensorsEntry& e : entries) {
    if (e.name == "model.norm.weight") {
      e.dtype = "I8";
      e.data = norm.data();
      e.bytes = norm.size();
    }
  }
  absl::Status s = ReadWith(entries, "dtype.safetensors");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'model.norm.weight' has dtype I8"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("F16 or F32 ones converted to BF16"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("bfloat16"));
}

// F32 and F16 checkpoints load as bf16: F32 values that are bf16 values come back exactly (whole
// model and each tensor-parallel rank's shard, whose column blocks are then 4-byte values), values
// between two bf16s round to nearest with ties to even, F16 values are rounded the same way, and
// the reader names what it converted.
TEST_F(LlamaCheckpointTest, ConvertsF32AndF16ToBf16) {
  const std::string f32 = TempPath("f32.safetensors");
  ASSERT_TRUE(WriteLlamaSafetensors(f32, weights_, "F32").ok());
  EXPECT_EQ(WriteLlamaSafetensors(f32, weights_, "F16").code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<LlamaHostWeights> whole = ReadLlamaSafetensors({f32}, shape_);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->data, weights_.data);
  for (int world : {2, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      absl::StatusOr<LlamaHostWeights> expected = ShardLlamaHostWeights(weights_, world, rank);
      ASSERT_TRUE(expected.ok()) << expected.status();
      absl::StatusOr<LlamaHostWeights> mine = ReadLlamaSafetensorsShard({f32}, shape_, world, rank);
      ASSERT_TRUE(mine.ok()) << mine.status();
      EXPECT_EQ(mine->data, expected->data) << "rank " << rank << " of " << world;
    }
  }
  absl::StatusOr<LlamaShardReader> reader = LlamaShardReader::Open({f32}, shape_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->converted_dtypes(), (std::set<std::string>{"F32"}));

  // The final norm in F32 between bf16 values: 1 + 2^-8 is a tie (to 1, even), 1 + 3 * 2^-9 rounds
  // up to 1 + 2^-7, 1 + 2^-7 + 2^-8 is a tie (to 1 + 2^-6, even), -(1 + 2^-9) rounds to -1.
  std::vector<SafetensorsEntry> entries = Entries(weights_);
  std::vector<float> norm(shape_.hidden);
  const float cases[4] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-9f, 1.0f + 0x1p-7f + 0x1p-8f,
                          -(1.0f + 0x1p-9f)};
  const float rounded[4] = {1.0f, 1.0f + 0x1p-7f, 1.0f + 0x1p-6f, -1.0f};
  for (int i = 0; i < shape_.hidden; ++i) norm[i] = cases[i % 4];
  // An F16 embedding of random finite halves.
  std::mt19937 rng(std::random_device{}());
  std::vector<uint16_t> half(static_cast<size_t>(shape_.vocab) * shape_.hidden);
  for (uint16_t& h : half) {
    h = static_cast<uint16_t>(rng() & 0xffffu);
    if (((h >> 10) & 0x1fu) == 0x1fu) h &= 0xbfffu;  // no infinities or NaNs
  }
  for (SafetensorsEntry& e : entries) {
    if (e.name == "model.norm.weight") {
      e.dtype = "F32";
      e.data = norm.data();
      e.bytes = norm.size() * 4;
    } else if (e.name == "model.embed_tokens.weight") {
      e.dtype = "F16";
      e.data = half.data();
      e.bytes = half.size() * 2;
    }
  }
  const std::string mixed = TempPath("mixed.safetensors");
  ASSERT_TRUE(WriteSafetensors(mixed, entries).ok());
  absl::StatusOr<LlamaHostWeights> back = ReadLlamaSafetensors({mixed}, shape_);
  ASSERT_TRUE(back.ok()) << back.status();
  const uint16_t* got_norm = back->tensor(back->layout.final_norm());
  for (int i = 0; i < shape_.hidden; ++i) {
    ASSERT_EQ(Bf16BitsToFloat(got_norm[i]), rounded[i % 4]) << i;
  }
  const uint16_t* got_embedding = back->tensor(back->layout.embedding());
  for (size_t i = 0; i < half.size(); ++i) {
    ASSERT_EQ(got_embedding[i], FloatToBf16Bits(Fp16BitsToFloat(half[i]))) << i;
  }
  const uint16_t* got_qkv = back->tensor(back->layout.qkv(1));
  const uint16_t* want_qkv = weights_.tensor(weights_.layout.qkv(1));
  EXPECT_TRUE(std::equal(got_qkv, got_qkv + weights_.layout.qkv(1).elements(), want_qkv));
  reader = LlamaShardReader::Open({mixed}, shape_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->converted_dtypes(), (std::set<std::string>{"F16", "F32"}));
}

TEST_F(LlamaCheckpointTest, TruncatedFileIsDataLoss) {
  const std::string path = TempPath("cut.safetensors");
  ASSERT_TRUE(WriteLlamaSafetensors(path, weights_).ok());
  std::string raw;
  {
    std::ifstream f(path, std::ios::binary);
    raw.assign(std::istreambuf_iterator<char>(f), {});
  }
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << raw.substr(0, raw.size() - 1000);
  }
  absl::Status s = ReadLlamaSafetensors({path}, shape_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("truncated"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("lm_head.weight"));
}

TEST_F(LlamaCheckpointTest, ReportsProgressUpToEveryByte) {
  const std::string a = TempPath("progress.safetensors");
  ASSERT_TRUE(WriteLlamaSafetensors(a, weights_).ok());
  std::vector<std::pair<int64_t, int64_t>> calls;
  absl::StatusOr<LlamaHostWeights> back = ReadLlamaSafetensors(
      {a}, shape_, [&](int64_t done, int64_t total) { calls.emplace_back(done, total); });
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data, weights_.data);
  ASSERT_EQ(calls.size(), HfTensorSlices(weights_.layout).size());  // one call per tensor
  const int64_t total = static_cast<int64_t>(weights_.layout.total_bytes());
  int64_t last = 0;
  for (const auto& [done, reported_total] : calls) {
    EXPECT_EQ(reported_total, total);
    EXPECT_GT(done, last);
    last = done;
  }
  EXPECT_EQ(last, total);
}

TEST_F(LlamaCheckpointTest, NoFilesIsInvalidArgument) {
  EXPECT_EQ(ReadLlamaSafetensors({}, shape_).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- Sweeps over checkpoints written as above and then mutated: every tensor missing, doubled,
// misshapen or of another dtype; shardings and dtypes at random; every byte of a shard's header
// and of a sharded checkpoint's index replaced. Accepted inputs must read back bit for bit as
// computed here (conversion included); refused ones must say which tensor or file, on one line.

namespace fs = std::filesystem;

// A small shape with every kind of tensor (QKV biases, QK norms, an untied LM head) that splits
// over 1, 2 and 4 ranks: hidden 32, 2 layers, 4/2 heads of 8, ffn 64, vocab 40. 21k values.
LlamaShape SmallShape() {
  LlamaShape s = LlamaShape::Tiny();
  s.hidden = 32;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 8;
  s.ffn = 64;
  s.vocab = 40;
  s.qkv_bias = true;
  s.qk_norm = true;
  return s;
}

// The value of IEEE half `bits`, written apart from bf16.h: (1024 + m) · 2^(e - 25), or m · 2^-24
// for a subnormal.
float HalfValue(uint16_t bits) {
  const float sign = (bits & 0x8000u) ? -1.0f : 1.0f;
  const int e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
  if (e == 0x1f) {
    return std::copysign(m != 0 ? std::numeric_limits<float>::quiet_NaN()
                                : std::numeric_limits<float>::infinity(),
                         sign);
  }
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
  return sign * std::ldexp(static_cast<float>(1024 + m), e - 25);
}

// The bf16 nearest `value`, ties to even, found by comparing the distances to the two bf16
// neighbours in double (not bf16.h's integer rounding); past the largest bf16 the upper
// neighbour is 2^128, so values from halfway there round to infinity, as IEEE rounding does.
// NaN gives a quiet NaN of the same sign.
uint16_t NearestBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(value)) return sign | 0x7fc0;
  const uint16_t down = static_cast<uint16_t>(bits >> 16);  // toward zero
  if ((bits & 0xffffu) == 0 || std::isinf(value)) return down;
  const uint16_t up = static_cast<uint16_t>(down + 1);  // away from zero
  const double v = std::fabs(static_cast<double>(value));
  const double lo = std::fabs(static_cast<double>(Bf16BitsToFloat(down)));
  const double hi = (up & 0x7fffu) == 0x7f80u ? std::ldexp(1.0, 128)
                                             : std::fabs(static_cast<double>(Bf16BitsToFloat(up)));
  if (v - lo != hi - v) return v - lo < hi - v ? down : up;
  return (down & 1u) ? up : down;
}

// Equal bf16 bits, or both NaN of the same sign (a NaN's payload is not part of the contract).
bool SameBf16(uint16_t a, uint16_t b) {
  const bool nan_a = (a & 0x7fffu) > 0x7f80u, nan_b = (b & 0x7fffu) > 0x7f80u;
  if (nan_a || nan_b) return nan_a && nan_b && (a & 0x8000u) == (b & 0x8000u);
  return a == b;
}

// One HF tensor of a test checkpoint: its values and, for each, the bf16 kiln must load.
struct HfTensor {
  std::string name;
  std::string dtype = "BF16";
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  std::vector<uint16_t> want;  // the loaded bf16 of each value
  int tensor_index = 0;        // kiln tensor it fills
  int64_t first_row = 0;       // from this row

  SafetensorsEntry Entry() const { return {name, dtype, shape, bytes.data(), bytes.size()}; }
};

// The HF tensors of `shape`, named and placed by llama_checkpoint.h's list (written out here, not
// taken from HfTensorSlices), each of a dtype drawn from `dtypes` and of random values: any bits
// for BF16 and F16, any F32 bits whose value bf16 holds (finite values past bf16's range are a
// separate test).
std::vector<HfTensor> RandomHfTensors(const LlamaShape& shape, const LlamaWeightLayout& layout,
                                      const std::vector<std::string>& dtypes, std::mt19937& rng) {
  std::vector<HfTensor> out;
  const int64_t h = shape.hidden, q = shape.q_width(), kv = shape.kv_width();
  auto add = [&](std::string name, const WeightTensor& t, int64_t first_row, int64_t rows,
                 bool matrix) {
    HfTensor e;
    e.name = std::move(name);
    e.dtype = dtypes[rng() % dtypes.size()];
    e.shape = matrix ? std::vector<int64_t>{rows, t.cols} : std::vector<int64_t>{rows};
    e.tensor_index = t.index;
    e.first_row = first_row;
    const int64_t n = rows * t.cols;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits = static_cast<uint32_t>(rng());
      if (e.dtype == "F32") {
        float value;
        std::memcpy(&value, &bits, 4);
        while (std::isfinite(value) && (NearestBf16(value) & 0x7fffu) == 0x7f80u) {
          bits = static_cast<uint32_t>(rng());
          std::memcpy(&value, &bits, 4);
        }
        e.want.push_back(NearestBf16(value));
        for (int b = 0; b < 4; ++b) e.bytes.push_back(static_cast<uint8_t>(bits >> (8 * b)));
      } else {
        const uint16_t half = static_cast<uint16_t>(bits);
        e.want.push_back(e.dtype == "F16" ? NearestBf16(HalfValue(half)) : half);
        e.bytes.push_back(static_cast<uint8_t>(half));
        e.bytes.push_back(static_cast<uint8_t>(half >> 8));
      }
    }
    out.push_back(std::move(e));
  };
  add("model.embed_tokens.weight", layout.embedding(), 0, shape.vocab, true);
  for (int l = 0; l < shape.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", layout.input_norm(l), 0, h, false);
    add(p + "self_attn.q_proj.weight", layout.qkv(l), 0, q, true);
    add(p + "self_attn.k_proj.weight", layout.qkv(l), q, kv, true);
    add(p + "self_attn.v_proj.weight", layout.qkv(l), q + kv, kv, true);
    if (shape.qkv_bias) {
      add(p + "self_attn.q_proj.bias", layout.qkv_bias(l), 0, q, false);
      add(p + "self_attn.k_proj.bias", layout.qkv_bias(l), q, kv, false);
      add(p + "self_attn.v_proj.bias", layout.qkv_bias(l), q + kv, kv, false);
    }
    if (shape.qk_norm) {
      add(p + "self_attn.q_norm.weight", layout.q_norm(l), 0, shape.head_dim, false);
      add(p + "self_attn.k_norm.weight", layout.k_norm(l), 0, shape.head_dim, false);
    }
    add(p + "self_attn.o_proj.weight", layout.o(l), 0, h, true);
    add(p + "post_attention_layernorm.weight", layout.post_norm(l), 0, h, false);
    add(p + "mlp.gate_proj.weight", layout.gate_up(l), 0, shape.ffn, true);
    add(p + "mlp.up_proj.weight", layout.gate_up(l), shape.ffn, shape.ffn, true);
    add(p + "mlp.down_proj.weight", layout.down(l), 0, h, true);
  }
  add("model.norm.weight", layout.final_norm(), 0, h, false);
  if (!shape.tie_embeddings) add("lm_head.weight", layout.lm_head(), 0, shape.vocab, true);
  return out;
}

// The host weights the HF tensors should load as: each tensor's `want` at its place.
LlamaHostWeights ExpectedWeights(const LlamaShape& shape, const std::vector<HfTensor>& tensors) {
  absl::StatusOr<LlamaHostWeights> w = ZeroLlamaHostWeights(shape);
  EXPECT_TRUE(w.ok()) << w.status();
  for (const HfTensor& e : tensors) {
    const WeightTensor& t = w->layout.tensors()[e.tensor_index];
    std::copy(e.want.begin(), e.want.end(), w->mutable_tensor(t) + e.first_row * t.cols);
  }
  return *std::move(w);
}

// Checks `got` against `want` value by value (SameBf16), naming the first difference.
void ExpectSameWeights(const LlamaHostWeights& got, const LlamaHostWeights& want) {
  ASSERT_EQ(got.data.size(), want.data.size());
  for (const WeightTensor& t : want.layout.tensors()) {
    for (int64_t i = 0; i < t.elements(); ++i) {
      ASSERT_TRUE(SameBf16(got.tensor(t)[i], want.tensor(t)[i]))
          << t.name << "[" << i << "]: got 0x" << std::hex << got.tensor(t)[i] << ", want 0x"
          << want.tensor(t)[i];
    }
  }
}

// Replaces the contents of `path` with `bytes` in place, without truncating the file to nothing
// first: the sweeps rewrite one small file thousands of times, and where the file system discards
// freed blocks (ext4 mounted with discard) each truncating rewrite costs milliseconds.
void Overwrite(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(bytes.size())), 0);
  ASSERT_EQ(::close(fd), 0);
}

std::vector<SafetensorsEntry> EntriesOf(const std::vector<HfTensor>& tensors) {
  std::vector<SafetensorsEntry> entries;
  for (const HfTensor& e : tensors) entries.push_back(e.Entry());
  return entries;
}

// 30 checkpoints of random dtypes per tensor (BF16, F16 and F32 mixed, all bit patterns, NaN and
// infinities included) split over 1 to 5 shards at random (some empty, some holding RoPE buffers
// to ignore), given in a random order: the whole model and every rank at tp 2 and 4 read back bit
// for bit.
TEST(LlamaCheckpointSweepTest, RandomShardingsAndDtypesReadBitExact) {
  std::mt19937 rng(101);
  const std::vector<std::vector<std::string>> dtype_sets = {
      {"BF16"}, {"F16"}, {"F32"}, {"BF16", "F16", "F32"}};
  for (int trial = 0; trial < 30; ++trial) {
    LlamaShape shape = SmallShape();
    shape.tie_embeddings = trial % 3 == 0;
    shape.qkv_bias = trial % 2 == 0;
    shape.qk_norm = trial % 4 < 2;
    absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(shape);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const std::vector<HfTensor> tensors =
        RandomHfTensors(shape, *layout, dtype_sets[trial % dtype_sets.size()], rng);
    const LlamaHostWeights want = ExpectedWeights(shape, tensors);
    const int num_shards = 1 + static_cast<int>(rng() % 5);
    std::vector<std::vector<SafetensorsEntry>> shards(num_shards);
    for (const HfTensor& e : tensors) shards[rng() % num_shards].push_back(e.Entry());
    std::vector<float> inv_freq(shape.head_dim / 2, 0.5f);
    if (rng() % 2) {
      shards[rng() % num_shards].push_back({"model.layers.1.self_attn.rotary_emb.inv_freq", "F32",
                                            {shape.head_dim / 2}, inv_freq.data(),
                                            inv_freq.size() * 4});
    }
    std::vector<std::string> paths;
    for (int i = 0; i < num_shards; ++i) {
      paths.push_back(
          TempPath(absl::StrCat("sweep-", trial, "-", i, "-of-", num_shards, ".safetensors")));
      ASSERT_TRUE(WriteSafetensors(paths.back(), shards[i]).ok());
    }
    std::shuffle(paths.begin(), paths.end(), rng);
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": ", shape.ToString(), ", ", num_shards,
                              " shards"));
    absl::StatusOr<LlamaHostWeights> whole = ReadLlamaSafetensors(paths, shape);
    ASSERT_TRUE(whole.ok()) << whole.status();
    ExpectSameWeights(*whole, want);
    if (HasFatalFailure()) return;
    for (int tp : {2, 4}) {
      for (int rank = 0; rank < tp; ++rank) {
        SCOPED_TRACE(absl::StrCat("rank ", rank, " of ", tp));
        absl::StatusOr<LlamaHostWeights> expected = ShardLlamaHostWeights(want, tp, rank);
        ASSERT_TRUE(expected.ok()) << expected.status();
        absl::StatusOr<LlamaHostWeights> mine = ReadLlamaSafetensorsShard(paths, shape, tp, rank);
        ASSERT_TRUE(mine.ok()) << mine.status();
        ExpectSameWeights(*mine, *expected);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Reads `first` as one file (plus `second`, when not empty, as another) and returns the status.
// Each call writes new files (a rewrite that truncates costs a discard on some file systems).
absl::Status ReadMutated(const std::vector<SafetensorsEntry>& first,
                         const std::vector<SafetensorsEntry>& second, const LlamaShape& shape,
                         int tp = 1, int rank = 0) {
  static int calls = 0;
  ++calls;
  std::vector<std::string> paths = {TempPath(absl::StrCat("mutated-", calls, "-1.safetensors"))};
  absl::Status status = WriteSafetensors(paths[0], first);
  if (status.ok() && !second.empty()) {
    paths.push_back(TempPath(absl::StrCat("mutated-", calls, "-2.safetensors")));
    status = WriteSafetensors(paths[1], second);
  }
  if (status.ok()) status = ReadLlamaSafetensorsShard(paths, shape, tp, rank).status();
  for (const std::string& path : paths) fs::remove(path);
  return status;
}

// Every HF tensor of a checkpoint with every kind of tensor, one at a time: missing; renamed; in a
// second shard as well; of 7 or 8 wrong shapes (a row more or fewer, transposed, flattened, an
// extra dimension, 2-D for 1-D, empty, a scalar); of each of the 12 dtypes kiln does not load.
// Each is InvalidArgument naming the tensor (quoted) and what is wrong. The first three at one rank
// and at rank 1 of 2 (whose own rows may not include the tensor: the whole checkpoint is checked),
// the others at one of the two, alternating over the tensors.
TEST(LlamaCheckpointSweepTest, EveryTensorMutatedIsRefusedByName) {
  std::mt19937 rng(102);
  const LlamaShape shape = SmallShape();
  absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(shape);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<HfTensor> tensors = RandomHfTensors(shape, *layout, {"BF16"}, rng);
  const std::vector<std::string> bad_dtypes = {"BOOL", "U8",  "I8",  "F8_E4M3", "F8_E5M2", "I16",
                                               "U16",  "I32", "U32", "I64",     "U64",     "F64"};
  std::vector<uint8_t> filler(1 << 20, 0x3c);
  int refused = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const HfTensor& target = tensors[k];
    const std::string name = target.name;
    SCOPED_TRACE(name);
    const std::string quoted = "'" + name + "'";
    auto expect = [&](const absl::Status& status, const std::string& what) {
      ++refused;
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what << ": " << status;
      const std::string message(status.message());
      EXPECT_THAT(message, HasSubstr(what));
      EXPECT_TRUE(IsOneCleanLine(message)) << message;
    };
    std::vector<SafetensorsEntry> all = EntriesOf(tensors);
    for (int tp : {1, 2}) {
      const int rank = tp - 1;
      const bool all_kinds = static_cast<int>(k % 2) + 1 == tp;
      // Missing.
      std::vector<SafetensorsEntry> entries = all;
      entries.erase(entries.begin() + k);
      expect(ReadMutated(entries, {}, shape, tp, rank), "lacks tensor " + quoted);
      // Renamed: the new name is unexpected (and the old one would be missing).
      entries = all;
      entries[k].name = name + ".old";
      expect(ReadMutated(entries, {}, shape, tp, rank),
             "Checkpoint tensor '" + name + ".old' in \"");
      // In a second shard as well.
      expect(ReadMutated(all, {all[k]}, shape, tp, rank),
             "Checkpoint tensor " + quoted + " appears in both");
      if (!all_kinds) continue;
      // Wrong shapes, with data to match each.
      const std::vector<int64_t>& good = target.shape;
      std::vector<std::vector<int64_t>> shapes = {{good[0] + 1}, {good[0] * 2}, {0}, {}};
      if (good[0] > 1) shapes.push_back({good[0] - 1});
      if (good.size() == 2) {
        shapes = {{good[0] + 1, good[1]}, {good[0], good[1] - 8}, {good[0] * good[1]},
                  {good[0], good[1], 1}, {1, good[0], good[1]}, {0, good[1]}, {}};
        if (good[0] != good[1]) shapes.push_back({good[1], good[0]});
      } else {
        shapes.push_back({good[0], 1});
        shapes.push_back({1, good[0]});
      }
      for (const std::vector<int64_t>& bad : shapes) {
        entries = all;
        int64_t n = 1;
        for (int64_t d : bad) n *= d;
        entries[k].shape = bad;
        entries[k].data = filler.data();
        entries[k].bytes = static_cast<size_t>(n) * 2;
        expect(ReadMutated(entries, {}, shape, tp, rank),
               absl::StrCat(quoted, " has shape [", absl::StrJoin(bad, ", "), "] but LlamaShape needs "));
      }
      // Wrong dtypes, with the data each needs.
      for (const std::string& dtype : bad_dtypes) {
        entries = all;
        int64_t n = 1;
        for (int64_t d : good) n *= d;
        entries[k].dtype = dtype;
        entries[k].data = filler.data();
        entries[k].bytes = static_cast<size_t>(n) * SafetensorsDtypeSize(dtype);
        expect(ReadMutated(entries, {}, shape, tp, rank), quoted + " has dtype " + dtype + ";");
      }
    }
    if (HasFailure()) return;
  }
  RecordProperty("refused", refused);
  EXPECT_GT(refused, 700);
}

// Names a checkpoint should not have: each is refused by name with the fix for the likeliest cause,
// and names holding control characters are escaped in the message.
TEST(LlamaCheckpointSweepTest, UnexpectedNamesAreQuotedWithTheFix) {
  std::mt19937 rng(103);
  LlamaShape plain = SmallShape();
  plain.qkv_bias = plain.qk_norm = false;
  plain.tie_embeddings = true;
  absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(plain);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<HfTensor> tensors = RandomHfTensors(plain, *layout, {"BF16"}, rng);
  std::vector<uint16_t> extra(static_cast<size_t>(plain.vocab) * plain.hidden, 0x3f80);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.layers.2.input_layernorm.weight", "LlamaShape.layers is 2"},
      {"model.layers.4095.mlp.up_proj.weight", "belongs to layer 4095"},
      {"model.layers.99999999999999999999.mlp.up_proj.weight", "no such weight"},
      {"model.layers.-1.mlp.up_proj.weight", "no such weight"},
      {"model.layers.", "no such weight"},
      {"lm_head.weight", "set tie_embeddings = false"},
      {"model.layers.0.self_attn.v_proj.bias", "set qkv_bias = true"},
      {"model.layers.1.self_attn.q_norm.weight", "set qk_norm = true"},
      {std::string("model.norm.weight\n\x01\0", 20), "'model.norm.weight\\n\\x01\\x00'"},
      {"model.norm.weight\t'quoted'", "'model.norm.weight\\t\\'quoted\\''"},
      {"model.embed_tokens.weight ", "'model.embed_tokens.weight '"},
      {"\xc3\xa9t\xc3\xa9", "'\xc3\xa9t\xc3\xa9'"}};
  for (const auto& [name, what] : cases) {
    SCOPED_TRACE(absl::CHexEscape(name));
    std::vector<SafetensorsEntry> entries = EntriesOf(tensors);
    entries.push_back({name, "BF16", {static_cast<int64_t>(extra.size())}, extra.data(),
                       extra.size() * 2});
    const absl::Status status = ReadMutated(entries, {}, plain);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(what));
    EXPECT_TRUE(IsOneCleanLine(status.message())) << status;
  }
}

// Paths that are not a checkpoint's shards: missing (NotFound naming it), a directory, a FIFO, a
// device, empty, garbage, the same shard twice, a shard of another model, and a thousand shards
// holding nothing.
TEST(LlamaCheckpointSweepTest, PathsThatAreNotShardsAreRefused) {
  std::mt19937 rng(104);
  const LlamaShape shape = SmallShape();
  absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(shape);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<HfTensor> tensors = RandomHfTensors(shape, *layout, {"BF16"}, rng);
  const std::string good = TempPath("paths-good.safetensors");
  ASSERT_TRUE(WriteSafetensors(good, EntriesOf(tensors)).ok());
  const std::string missing = TempPath("paths-missing.safetensors");
  const std::string dir = TempPath("paths-dir.safetensors");
  fs::create_directories(dir);
  const std::string empty = TempPath("paths-empty.safetensors");
  const std::string garbage = TempPath("paths-garbage.safetensors");
  {
    std::ofstream(empty, std::ios::binary | std::ios::trunc);
    std::ofstream g(garbage, std::ios::binary | std::ios::trunc);
    for (int i = 0; i < 4096; ++i) g.put(static_cast<char>(rng()));
  }
  const std::string nothing = TempPath("paths-nothing.safetensors");
  ASSERT_TRUE(WriteSafetensors(nothing, {}).ok());
  LlamaShape other = shape;  // a different model: wider MLP
  other.ffn = 128;
  absl::StatusOr<LlamaWeightLayout> other_layout = LlamaWeightLayout::Create(other);
  ASSERT_TRUE(other_layout.ok());
  std::vector<HfTensor> other_tensors = RandomHfTensors(other, *other_layout, {"BF16"}, rng);
  const std::string mixed_a = TempPath("paths-mixed-a.safetensors");
  const std::string mixed_b = TempPath("paths-mixed-b.safetensors");
  std::vector<SafetensorsEntry> a, b;
  for (size_t i = 0; i < tensors.size(); ++i) {
    (i % 2 ? b : a).push_back(i % 2 ? other_tensors[i].Entry() : tensors[i].Entry());
  }
  ASSERT_TRUE(WriteSafetensors(mixed_a, a).ok());
  ASSERT_TRUE(WriteSafetensors(mixed_b, b).ok());

  // `code` kUnknown: any error.
  auto check = [&](const std::vector<std::string>& paths, absl::StatusCode code,
                   const std::string& what) {
    const absl::Status status = ReadLlamaSafetensors(paths, shape).status();
    EXPECT_FALSE(status.ok());
    if (code != absl::StatusCode::kUnknown) {
      EXPECT_EQ(status.code(), code) << status;
    }
    EXPECT_THAT(std::string(status.message()), HasSubstr(what));
    EXPECT_TRUE(IsOneCleanLine(status.message())) << status;
  };
  check({good, missing}, absl::StatusCode::kNotFound, "\"" + missing + "\"");
  check({dir}, absl::StatusCode::kInvalidArgument, "\"" + dir + "\" is a directory, not a file");
  // A FIFO would block the open until a writer comes: refused without opening it.
  const std::string fifo = TempPath("paths-fifo.safetensors");
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  check({good, fifo}, absl::StatusCode::kInvalidArgument,
        "\"" + fifo + "\" is a FIFO, not a file");
  check({"/dev/zero"}, absl::StatusCode::kInvalidArgument, "\"/dev/zero\" is a device, not a file");
  check({empty, good}, absl::StatusCode::kDataLoss, "\"" + empty + "\"");
  check({garbage}, absl::StatusCode::kDataLoss, "\"" + garbage + "\"");
  check({good, good}, absl::StatusCode::kInvalidArgument,
        "appears in both \"" + good + "\" and \"" + good + "\"");
  check({mixed_a, mixed_b}, absl::StatusCode::kInvalidArgument, "_proj.weight' has shape [128, 32]");
  check({nothing}, absl::StatusCode::kInvalidArgument, "lacks tensor 'model.embed_tokens.weight'");
  std::vector<std::string> many(1000, nothing);
  many.push_back(good);
  absl::StatusOr<LlamaHostWeights> back = ReadLlamaSafetensors(many, shape);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameWeights(*back, ExpectedWeights(shape, tensors));
}

// Shards whose paths hold an ESC, a newline and U+009B: every message that names one quotes it,
// escaped, on one clean line (a missing shard, a directory, a bad header, an unexpected tensor, a
// tensor in two shards, a shard that shrank before its rows were read, the writer's), and one that
// names only a tensor (a wrong shape) holds nothing of the path. The writer quotes a bad dtype too.
TEST(LlamaCheckpointSweepTest, OddPathsAreQuotedInEveryMessage) {
  std::mt19937 rng(110);
  const LlamaShape shape = SmallShape();
  absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(shape);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<HfTensor> tensors = RandomHfTensors(shape, *layout, {"BF16"}, rng);
  const std::string base = TempPath("");
  ASSERT_TRUE(QuotedAsIs(base));
  const std::string dir = base + kOddName;
  fs::remove_all(dir);
  ASSERT_TRUE(fs::create_directories(dir));
  // The file `dir`/kOddName`suffix`, and its path as Quoted writes it.
  auto odd = [&](const std::string& suffix) { return absl::StrCat(dir, "/", kOddName, suffix); };
  auto quoted = [&](const std::string& suffix) {
    return absl::StrCat("\"", base, kOddNameEscaped, "/", kOddNameEscaped, suffix, "\"");
  };
  // Each message holds `want`.
  auto expect = [](const absl::Status& status, absl::StatusCode code, const std::string& want) {
    ExpectQuotedStatus(status, code, HasSubstr(want));
  };
  const std::string good = odd("-good.safetensors");
  ASSERT_TRUE(WriteSafetensors(good, EntriesOf(tensors)).ok());

  expect(ReadLlamaSafetensors({good, odd("-missing.safetensors")}, shape).status(),
         absl::StatusCode::kNotFound,
         "Cannot open safetensors file " + quoted("-missing.safetensors") +
             ": No such file or directory");
  ASSERT_TRUE(fs::create_directories(odd("-dir.safetensors")));
  expect(ReadLlamaSafetensors({good, odd("-dir.safetensors")}, shape).status(),
         absl::StatusCode::kInvalidArgument,
         "Safetensors path " + quoted("-dir.safetensors") +
             " is a directory, not a file; pass a .safetensors file");
  const std::string bad = odd("-bad.safetensors");
  std::ofstream(bad, std::ios::binary | std::ios::trunc)
      << std::string("\x02\0\0\0\0\0\0\0[]", 10);  // a header of 2 bytes: "[]"
  expect(ReadLlamaSafetensors({good, bad}, shape).status(), absl::StatusCode::kDataLoss,
         "Safetensors header of " + quoted("-bad.safetensors") +
             " is an array; expected an object");
  const std::string extra = odd("-extra.safetensors");
  std::vector<uint16_t> values(4, 0x3f80);
  ASSERT_TRUE(
      WriteSafetensors(extra, {{"model.extra.weight", "BF16", {4}, values.data(), 8}}).ok());
  expect(ReadLlamaSafetensors({good, extra}, shape).status(), absl::StatusCode::kInvalidArgument,
         "Checkpoint tensor 'model.extra.weight' in " + quoted("-extra.safetensors") +
             " is unexpected: kiln's Llama decoder has no such weight");
  const std::string copy = odd("-copy.safetensors");
  ASSERT_TRUE(WriteSafetensors(copy, EntriesOf(tensors)).ok());
  expect(ReadLlamaSafetensors({good, copy}, shape).status(), absl::StatusCode::kInvalidArgument,
         "' appears in both " + quoted("-good.safetensors") + " and " +
             quoted("-copy.safetensors") + "; pass each shard of one checkpoint once");

  // A wrong shape names the tensor, not the file.
  std::vector<SafetensorsEntry> entries = EntriesOf(tensors);
  auto embed = std::find_if(entries.begin(), entries.end(), [](const SafetensorsEntry& e) {
    return e.name == "model.embed_tokens.weight";
  });
  ASSERT_NE(embed, entries.end());
  std::vector<uint16_t> wide(static_cast<size_t>(shape.vocab) * (shape.hidden + 1), 0x3f80);
  *embed = {embed->name, "BF16", {shape.vocab, shape.hidden + 1}, wide.data(), wide.size() * 2};
  const std::string wrong_shape = odd("-shape.safetensors");
  ASSERT_TRUE(WriteSafetensors(wrong_shape, entries).ok());
  const absl::Status shape_status = ReadLlamaSafetensors({wrong_shape}, shape).status();
  expect(shape_status, absl::StatusCode::kInvalidArgument,
         "Checkpoint tensor 'model.embed_tokens.weight' has shape [40, 33] but LlamaShape needs "
         "[vocab, hidden] = [40, 32]");
  EXPECT_THAT(std::string(shape_status.message()), Not(HasSubstr(kOddNameEscaped)));

  // A shard emptied after it was opened: its rows cannot be read.
  const std::string shrinking = odd("-shrinking.safetensors");
  ASSERT_TRUE(WriteSafetensors(shrinking, EntriesOf(tensors)).ok());
  absl::StatusOr<LlamaShardReader> reader = LlamaShardReader::Open({shrinking}, shape);
  ASSERT_TRUE(reader.ok()) << reader.status();
  fs::resize_file(shrinking, 0);
  const LlamaShardReader::Block& first = reader->blocks().front();
  std::vector<uint16_t> rows(static_cast<size_t>(shape.vocab) * shape.hidden);
  expect(reader->ReadRows(first, 0, first.rows, rows.data()), absl::StatusCode::kDataLoss,
         "Read stopped at byte 0 of tensor 'model.embed_tokens.weight' (2560 bytes) in " +
             quoted("-shrinking.safetensors") + "; the file shrank since it was opened");

  // The writer: into a directory that does not exist, and in a dtype it does not write.
  const LlamaHostWeights weights = ExpectedWeights(shape, tensors);
  expect(WriteLlamaSafetensors(odd("/w.safetensors"), weights), absl::StatusCode::kNotFound,
         "Cannot open for writing " + quoted("/w.safetensors") + ": No such file or directory");
  expect(WriteLlamaSafetensors(odd("-w.safetensors"), weights, kOddName),
         absl::StatusCode::kInvalidArgument,
         absl::StrCat("WriteLlamaSafetensors writes dtype BF16 or F32 (each bf16 value exactly), "
                      "not \"", kOddNameEscaped, "\""));
}

// F32 values past bf16's range would load as infinity: refused naming the tensor, the value and
// its place in the HF tensor (also when only a tensor-parallel rank's columns hold it). The
// largest value that rounds to bf16's largest loads; infinities and NaNs load as they are.
TEST(LlamaCheckpointSweepTest, F32ValuesBeyondBf16AreRefused) {
  std::mt19937 rng(105);
  const LlamaShape shape = SmallShape();
  absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(shape);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<HfTensor> tensors = RandomHfTensors(shape, *layout, {"F32"}, rng);
  auto o_proj = std::find_if(tensors.begin(), tensors.end(), [](const HfTensor& e) {
    return e.name == "model.layers.1.self_attn.o_proj.weight";
  });
  ASSERT_NE(o_proj, tensors.end());
  const int64_t cols = o_proj->shape[1];
  auto set = [&](int64_t row, int64_t col, uint32_t bits) {
    std::memcpy(o_proj->bytes.data() + 4 * (row * cols + col), &bits, 4);
  };
  // Row 5, column cols - 3: in rank 1's half of the O projection's columns at tp 2.
  const int64_t row = 5, col = cols - 3;
  for (uint32_t bits : {0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f8001u}) {
    set(row, col, bits);
    const std::string path = TempPath("f32-overflow.safetensors");
    ASSERT_TRUE(WriteSafetensors(path, EntriesOf(tensors)).ok());
    for (int rank : {-1, 1}) {  // the whole model, then rank 1 of 2
      const absl::Status status = rank < 0 ? ReadLlamaSafetensors({path}, shape).status()
                                           : ReadLlamaSafetensorsShard({path}, shape, 2, rank).status();
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << std::hex << bits;
      EXPECT_THAT(std::string(status.message()),
                  HasSubstr(absl::StrCat("'model.layers.1.self_attn.o_proj.weight' holds ")));
      EXPECT_THAT(std::string(status.message()), HasSubstr(absl::StrCat(" at [", row, ", ", col, "]")));
    }
    // Rank 0 reads no value of that column.
    EXPECT_TRUE(ReadLlamaSafetensorsShard({path}, shape, 2, 0).ok());
  }
  // Just below the halfway point to 2^128: bf16's largest. Infinity and NaN: as they are.
  const std::vector<std::pair<uint32_t, uint16_t>> loads = {
      {0x7f7f7fffu, 0x7f7f}, {0xff7f7fffu, 0xff7f}, {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},
      {0x7fc00001u, 0x7fc0}, {0x00000001u, 0x0000}, {0x80010000u, 0x8001}};
  for (const auto& [bits, want] : loads) {
    set(row, col, bits);
    const std::string path = TempPath("f32-edge.safetensors");
    ASSERT_TRUE(WriteSafetensors(path, EntriesOf(tensors)).ok());
    absl::StatusOr<LlamaHostWeights> back = ReadLlamaSafetensors({path}, shape);
    ASSERT_TRUE(back.ok()) << back.status();
    const uint16_t got = back->tensor(back->layout.o(1))[row * cols + col];
    EXPECT_TRUE(SameBf16(got, want)) << std::hex << bits << " -> " << got;
  }
}

// Every byte of a shard file's length field and header, replaced by each of 16 bytes, and the file
// cut at every length up to its data (and at every 37th byte after): the checkpoint either reads back bit for bit (a change JSON ignores) or is
// refused as corrupt or unexpected, on one line, never read wrongly.
TEST(LlamaCheckpointSweepTest, EveryHeaderByteOfAShardMutated) {
  std::mt19937 rng(106);
  LlamaShape shape = SmallShape();
  shape.layers = 1;  // a short first shard: each of the 6,000 opens parses it
  absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(shape);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<HfTensor> tensors = RandomHfTensors(shape, *layout, {"BF16", "F32"}, rng);
  const LlamaHostWeights want = ExpectedWeights(shape, tensors);
  // The second shard: two norms of the layer and the final norm (a short header to sweep).
  std::vector<SafetensorsEntry> first, second;
  for (const HfTensor& e : tensors) {
    const bool small = e.name == "model.norm.weight" ||
                       e.name == "model.layers.0.post_attention_layernorm.weight" ||
                       e.name == "model.layers.0.self_attn.k_norm.weight";
    (small ? second : first).push_back(e.Entry());
  }
  const std::string a = TempPath("header-a.safetensors"), b = TempPath("header-b.safetensors");
  ASSERT_TRUE(WriteSafetensors(a, first).ok());
  ASSERT_TRUE(WriteSafetensors(b, second).ok());
  std::string original;
  {
    std::ifstream f(b, std::ios::binary);
    original.assign(std::istreambuf_iterator<char>(f), {});
  }
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<unsigned char>(original[i]);
  ASSERT_LT(8 + header, original.size());
  int accepted = 0, refused = 0;
  auto try_file = [&](const std::string& bytes, const std::string& what) {
    Overwrite(b, bytes);
    absl::StatusOr<LlamaHostWeights> back = ReadLlamaSafetensors({a, b}, shape);
    if (back.ok()) {
      ++accepted;
      ExpectSameWeights(*back, want);
      return;
    }
    ++refused;
    const absl::StatusCode code = back.status().code();
    const std::string message(back.status().message());
    EXPECT_TRUE(code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kInvalidArgument)
        << what << ": " << back.status();
    EXPECT_TRUE(IsOneCleanLine(message)) << what << ": " << absl::CHexEscape(message);
    // A quoted tensor ('name') or file ("path").
    EXPECT_TRUE(absl::StrContains(message, "'") ||
                absl::StrContains(message, absl::StrCat("\"", a, "\"")) ||
                absl::StrContains(message, absl::StrCat("\"", b, "\"")))
        << what << ": " << message;
  };
  const char kBytes[] = {'\0', '"', '{', '}', '[', ',', ':', '0', '9', ' ', '\t', '\n', 'x', '\\'};
  for (size_t i = 0; i < 8 + header; ++i) {
    for (char c : kBytes) {
      if (original[i] == c) continue;
      std::string bytes = original;
      bytes[i] = c;
      try_file(bytes, absl::StrCat("byte ", i, " = ", static_cast<int>(c)));
    }
    for (unsigned char c : {0x80, 0xff}) {
      std::string bytes = original;
      bytes[i] = static_cast<char>(c);
      try_file(bytes, absl::StrCat("byte ", i, " = ", static_cast<int>(c)));
    }
    if (HasFailure()) return;
  }
  // Cut anywhere in the length field or header, or a few places in the data.
  for (size_t size = 0; size < original.size(); size += size < 8 + header ? 1 : 37) {
    try_file(original.substr(0, size), absl::StrCat("cut at ", size));
    if (HasFailure()) return;
  }
  try_file(original + "x", "one byte more");
  RecordProperty("accepted", accepted);
  RecordProperty("refused", refused);
  EXPECT_GT(refused, 3000);
  EXPECT_GT(accepted, 0);  // whitespace changes, padding
}

// Sizes and ranks that do not split, and shapes Validate refuses, are refused before any file is
// opened (the path does not exist); every rank of every size that splits opens.
TEST(LlamaCheckpointSweepTest, EveryTensorParallelSizeAndRank) {
  std::mt19937 rng(108);
  const LlamaShape shape = SmallShape();
  absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(shape);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::string path = TempPath("tp-sweep.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, EntriesOf(RandomHfTensors(shape, *layout, {"BF16"}, rng))).ok());
  const std::string nowhere = TempPath("tp-sweep-missing.safetensors");
  constexpr int kMin = std::numeric_limits<int>::min(), kMax = std::numeric_limits<int>::max();
  for (int tp : {kMin, -4, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 16, kMax}) {
    const bool splits = tp == 1 || tp == 2 || tp == 4;  // heads 4, kv_heads 2, ffn 64
    for (int rank : {kMin, -1, 0, 1, 2, 3, 4, kMax}) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " of ", tp));
      const absl::Status refused = LlamaShardReader::Open({nowhere}, shape, tp, rank).status();
      if (!splits || rank < 0 || rank >= tp) {
        EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
        EXPECT_THAT(std::string(refused.message()),
                    HasSubstr(splits ? absl::StrCat("Rank ", rank) : absl::StrCat(tp)));
        continue;
      }
      EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound) << refused;
      absl::StatusOr<LlamaShardReader> reader = LlamaShardReader::Open({path}, shape, tp, rank);
      ASSERT_TRUE(reader.ok()) << reader.status();
      EXPECT_EQ(reader->layout().shape().heads, shape.heads / tp);
    }
  }
  LlamaShape bad = shape;
  bad.kv_heads = 3;
  EXPECT_EQ(LlamaShardReader::Open({path}, bad).status(), bad.Validate());
}

// A block copied from the reader reads; one that is not the reader's (another reader's file or
// tensor, an index outside the layout, a dtype size that disagrees, no file) is refused before it
// is read. Default-constructed weights and layouts have no tensors to write or name.
TEST(LlamaCheckpointSweepTest, ForgedBlocksAndEmptyWeightsAreRefused) {
  std::mt19937 rng(109);
  const LlamaShape shape = SmallShape();
  absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(shape);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<HfTensor> tensors = RandomHfTensors(shape, *layout, {"BF16", "F32"}, rng);
  const std::string path = TempPath("forged.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, EntriesOf(tensors)).ok());
  absl::StatusOr<LlamaShardReader> reader = LlamaShardReader::Open({path}, shape, 2, 1);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<LlamaShardReader> other = LlamaShardReader::Open({path}, shape, 2, 1);
  ASSERT_TRUE(other.ok()) << other.status();
  std::vector<uint16_t> dst(1 << 16, 0xdead);
  for (size_t i = 0; i < reader->blocks().size(); ++i) {
    const LlamaShardReader::Block good = reader->blocks()[i];  // a copy
    ASSERT_TRUE(reader->ReadRows(good, 0, good.rows, dst.data()).ok());
    std::vector<std::pair<std::string, LlamaShardReader::Block>> forged;
    auto forge = [&](const std::string& what, auto change) {
      LlamaShardReader::Block b = good;
      change(b);
      forged.emplace_back(what, b);
    };
    const LlamaShardReader::Block& theirs = other->blocks()[i];
    forge("another reader's file", [&](auto& b) { b.file = theirs.file; });
    forge("another reader's tensor", [&](auto& b) { b.tensor = theirs.tensor; });
    forge("no file", [&](auto& b) { b.file = nullptr; });
    forge("no tensor", [&](auto& b) { b.tensor = nullptr; });
    forge("index -1", [&](auto& b) { b.tensor_index = -1; });
    forge("index past the layout",
          [&](auto& b) { b.tensor_index = static_cast<int>(reader->layout().tensors().size()); });
    forge("index INT_MIN", [&](auto& b) { b.tensor_index = std::numeric_limits<int>::min(); });
    forge("source bytes", [&](auto& b) { b.source_bytes = 6 - b.source_bytes; });
    forge("no stride", [&](auto& b) { b.row_stride = 0; });
    forge("negative rows", [&](auto& b) { b.rows = -1; });
    for (const auto& [what, b] : forged) {
      const absl::Status status = reader->ReadRows(b, 0, 1, dst.data());
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what;
      EXPECT_THAT(std::string(status.message()), HasSubstr("not one of this LlamaShardReader's"))
          << what;
    }
  }
  EXPECT_TRUE(HfTensorSlices(LlamaWeightLayout()).empty());
  const absl::Status empty = WriteLlamaSafetensors(TempPath("empty.safetensors"), LlamaHostWeights());
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.message()), HasSubstr("LlamaHostWeights hold 0 bytes"));
}

// ---- A sharded Hugging Face directory: config.json, two shards and model.safetensors.index.json,
// read as the runner does (LoadHfModelDir for the files, then the loader).

class HfDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(107);
    shape_ = SmallShape();
    shape_.qkv_bias = shape_.qk_norm = false;
    shape_.layers = 1;  // an index of 12 tensors, about 1,000 bytes to sweep
    absl::StatusOr<LlamaWeightLayout> layout = LlamaWeightLayout::Create(shape_);
    ASSERT_TRUE(layout.ok()) << layout.status();
    tensors_ = RandomHfTensors(shape_, *layout, {"BF16"}, rng);
    want_ = ExpectedWeights(shape_, tensors_);
    dir_ = TempPath("hf-dir");
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "config.json")
        << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,)"
        << R"( "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,)"
        << R"( "head_dim": 8, "intermediate_size": 64, "vocab_size": 40,)"
        << R"( "tie_word_embeddings": false, "torch_dtype": "bfloat16"})";
    std::vector<SafetensorsEntry> first, second;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const bool in_first = i < tensors_.size() / 2;
      (in_first ? first : second).push_back(tensors_[i].Entry());
      file_of_[tensors_[i].name] = in_first ? kFirst : kSecond;
    }
    ASSERT_TRUE(WriteSafetensors((dir_ / kFirst).string(), first).ok());
    ASSERT_TRUE(WriteSafetensors((dir_ / kSecond).string(), second).ok());
  }

  // The index text for `weight_map` (name → file), compact, in name order.
  static std::string IndexJson(const std::map<std::string, std::string>& weight_map) {
    std::string json = R"({"metadata":{"total_size":84160},"weight_map":{)";
    bool first = true;
    for (const auto& [name, file] : weight_map) {
      absl::StrAppend(&json, first ? "" : ",", "\"", name, "\":\"", file, "\"");
      first = false;
    }
    return json + "}}";
  }

  void WriteIndex(const std::string& text) {
    Overwrite((dir_ / "model.safetensors.index.json").string(), text);
  }

  // Loads the directory's files and then the weights (one rank).
  absl::StatusOr<LlamaHostWeights> Load() {
    absl::StatusOr<HfModel> hf = LoadHfModelDir(dir_.string());
    if (!hf.ok()) return hf.status();
    return ReadLlamaSafetensors(hf->weight_files, shape_);
  }

  static constexpr char kFirst[] = "model-00001-of-00002.safetensors";
  static constexpr char kSecond[] = "model-00002-of-00002.safetensors";
  LlamaShape shape_;
  std::vector<HfTensor> tensors_;
  LlamaHostWeights want_;
  fs::path dir_;
  std::map<std::string, std::string> file_of_;
};

// The index as written, with a tensor under the wrong shard (the files' contents decide where a
// tensor is, so it still loads exactly), and with a shard the index does not name, a shard that
// does not exist, and a tensor in both shards.
TEST_F(HfDirTest, IndexNamesTheShards) {
  WriteIndex(IndexJson(file_of_));
  absl::StatusOr<LlamaHostWeights> back = Load();
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameWeights(*back, want_);

  std::map<std::string, std::string> swapped = file_of_;
  swapped["model.norm.weight"] = kFirst;
  swapped["model.embed_tokens.weight"] = kSecond;
  WriteIndex(IndexJson(swapped));
  back = Load();
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameWeights(*back, want_);

  std::map<std::string, std::string> first_only;
  for (const auto& [name, file] : file_of_) first_only[name] = kFirst;
  WriteIndex(IndexJson(first_only));  // the second shard's tensors are then missing
  absl::Status status = Load().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("Checkpoint lacks tensor '"));

  std::map<std::string, std::string> missing = file_of_;
  missing["lm_head.weight"] = "model-00003-of-00003.safetensors";
  WriteIndex(IndexJson(missing));
  status = Load().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("model-00003-of-00003.safetensors"));

  std::map<std::string, std::string> not_a_shard = file_of_;
  not_a_shard["lm_head.weight"] = "config.json";
  WriteIndex(IndexJson(not_a_shard));
  status = Load().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("config.json"));

  // A third shard repeating a tensor of the first: ambiguous, refused naming both files.
  const std::string third = (dir_ / "model-extra.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(third, {tensors_[0].Entry()}).ok());
  std::map<std::string, std::string> doubled = file_of_;
  doubled["model.layers.0.input_layernorm.weight.extra"] = "model-extra.safetensors";
  WriteIndex(IndexJson(doubled));
  status = Load().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("'" + tensors_[0].name + "' appears in both"));
}

// Every byte of the index replaced by each of 6 bytes or deleted, and the index cut at every
// length: the directory either loads bit for bit, or is refused (a bad index, a missing file, a
// missing tensor; LoadHfModelDir's messages and the loader's on one clean line); never loads wrong
// weights.
TEST_F(HfDirTest, EveryIndexByteMutated) {
  const std::string index = IndexJson(file_of_);
  std::map<std::vector<std::string>, absl::Status> read;  // the loader's verdict per file list
  int loaded = 0, refused = 0;
  auto try_index = [&](const std::string& text, const std::string& what) {
    WriteIndex(text);
    absl::StatusOr<HfModel> hf = LoadHfModelDir(dir_.string());
    absl::Status status = hf.status();
    if (hf.ok()) {
      auto it = read.find(hf->weight_files);
      if (it == read.end()) {
        absl::StatusOr<LlamaHostWeights> back = ReadLlamaSafetensors(hf->weight_files, shape_);
        if (back.ok()) ExpectSameWeights(*back, want_);
        it = read.emplace(hf->weight_files, back.status()).first;
      }
      status = it->second;
    }
    if (status.ok()) {
      ++loaded;
      return;
    }
    ++refused;
    const absl::StatusCode code = status.code();
    EXPECT_TRUE(code == absl::StatusCode::kInvalidArgument ||
                code == absl::StatusCode::kNotFound || code == absl::StatusCode::kDataLoss)
        << what << ": " << status;
    EXPECT_FALSE(status.message().empty()) << what;
    EXPECT_TRUE(IsOneCleanLine(status.message())) << what << ": " << status;
  };
  for (size_t i = 0; i < index.size(); ++i) {
    std::string cut = index;
    cut.erase(i, 1);
    try_index(cut, absl::StrCat("byte ", i, " deleted"));
    for (char c : {'\0', '"', '}', 'x', '\\', '\xff'}) {
      if (index[i] == c) continue;
      std::string bytes = index;
      bytes[i] = c;
      try_index(bytes, absl::StrCat("byte ", i, " = ", static_cast<int>(c)));
    }
    try_index(index.substr(0, i), absl::StrCat("cut at ", i));
    if (HasFailure()) return;
  }
  RecordProperty("loaded", loaded);
  RecordProperty("refused", refused);
  RecordProperty("file_lists_read", static_cast<int>(read.size()));
  EXPECT_GT(loaded, 1000);  // tensor names, whitespace, metadata: not the files
  EXPECT_GT(refused, 2000);
}

}  // namespace
}  // namespace kiln
