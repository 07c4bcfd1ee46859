// GPU test of LlamaDeviceWeights::RandomShard: every rank's shard, made on the GPU without a full
// copy, equals the host's cut of the full seeded weights bit for bit, for tensor-parallel sizes
// 1, 2, 4 and 8 (KV heads split and replicated), tied and untied. One GPU is enough: the shards
// of every rank are made on it in turn.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/model/device_weights.h"
#include "runtime/model/internal/gpu_test_helpers.h"
#include "runtime/model/llama_weights.h"
#include "runtime/model/tensor_parallel.h"

namespace kiln {
namespace {

using testing_internal::GpuTest;

class TensorParallelGpuTest : public GpuTest {};

TEST_F(TensorParallelGpuTest, RandomShardEqualsTheHostCutOfTheFullWeights) {
  for (bool tie : {false, true}) {
    for (int kv_heads : {8, 2}) {
      LlamaShape full = LlamaShape::Tiny();
      full.heads = 16;
      full.kv_heads = kv_heads;
      full.tie_embeddings = tie;
      full.qkv_bias = tie;  // the biases split as the QKV rows do; the QK norms are whole
      full.qk_norm = tie;
      const uint64_t seed = rng_();
      absl::StatusOr<LlamaHostWeights> host = RandomLlamaHostWeights(full, seed);
      ASSERT_TRUE(host.ok()) << host.status();
      for (int tp : {1, 2, 4, 8}) {
        for (int rank = 0; rank < tp; ++rank) {
          SCOPED_TRACE(absl::StrCat("tie ", tie, ", kv_heads ", kv_heads, ", tp ", tp, ", rank ",
                                    rank, ", seed ", seed));
          absl::StatusOr<LlamaDeviceWeights> dev =
              LlamaDeviceWeights::RandomShard(full, tp, rank, seed, stream());
          ASSERT_TRUE(dev.ok()) << dev.status();
          EXPECT_EQ(dev->shape().heads, full.heads / tp);
          absl::StatusOr<LlamaHostWeights> back = dev->Download(stream());
          absl::StatusOr<LlamaHostWeights> want = ShardLlamaHostWeights(*host, tp, rank);
          ASSERT_TRUE(back.ok() && want.ok());
          EXPECT_EQ(back->data, want->data);
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln
