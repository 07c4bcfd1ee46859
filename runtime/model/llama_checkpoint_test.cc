#include "runtime/model/llama_checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "runtime/model/bf16.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tensor_parallel.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

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
              HasSubstr("self_attn.k_proj.bias' in '" + path +
                        "' is unexpected: the LlamaShape has no QKV bias; set qkv_bias = true"));
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
              HasSubstr("_norm.weight' in '" + path +
                        "' is unexpected: the LlamaShape has no QK norm; set qk_norm = true"));
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
  EXPECT_THAT(std::string(twice.message()), HasSubstr("appears in both"));
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

}  // namespace
}  // namespace kiln
