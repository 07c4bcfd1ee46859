// GPU tests of LlamaDeviceWeights: the GPU's seeded initialisation equals the host's bit for
// bit (tiny shape in full, the 1B shape by sampling), host weights (from a checkpoint) survive
// the trip to the device and back, and Load streams a rank's shard from the files (BF16 or F32).
#include "runtime/model/device_weights.h"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/model/internal/gpu_test_helpers.h"
#include "runtime/model/internal/weight_init.h"
#include "runtime/model/llama_checkpoint.h"
#include "runtime/model/llama_weights.h"
#include "runtime/model/tensor_parallel.h"

namespace kiln {
namespace {

using testing_internal::GpuTest;

class DeviceWeightsGpuTest : public GpuTest {};

TEST_F(DeviceWeightsGpuTest, RandomMatchesTheHostInitialiserBitForBit) {
  for (bool tie : {false, true}) {
    LlamaShape shape = LlamaShape::Tiny();
    shape.tie_embeddings = tie;
    shape.qkv_bias = !tie;  // both layouts, with and without the biases and QK norms
    shape.qk_norm = !tie;
    const uint64_t seed = rng_();
    absl::StatusOr<LlamaDeviceWeights> dev = LlamaDeviceWeights::Random(shape, seed, stream());
    ASSERT_TRUE(dev.ok()) << dev.status();
    absl::StatusOr<LlamaHostWeights> back = dev->Download(stream());
    absl::StatusOr<LlamaHostWeights> host = RandomLlamaHostWeights(shape, seed);
    ASSERT_TRUE(back.ok() && host.ok());
    EXPECT_EQ(back->data, host->data);
    EXPECT_EQ(dev->bytes(), host->layout.total_bytes());
    EXPECT_EQ(dev->lm_head() == dev->embedding(), tie);
  }
}

TEST_F(DeviceWeightsGpuTest, Random1BWeightsMatchSampledHostValues) {
  const LlamaShape shape = LlamaShape::Llama1B();
  const uint64_t seed = rng_();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<LlamaDeviceWeights> dev = LlamaDeviceWeights::Random(shape, seed, stream());
  ASSERT_TRUE(dev.ok()) << dev.status();
  ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::cout << "1B random weights: " << dev->bytes() / double(1 << 30) << " GiB in " << ms
            << " ms (allocation included)\n";
  absl::StatusOr<LlamaHostWeights> back = dev->Download(stream());
  ASSERT_TRUE(back.ok()) << back.status();
  for (const WeightTensor& t : back->layout.tensors()) {
    const WeightInitRange range = InitRangeFor(t);
    const internal::UniformInit init =
        internal::MakeUniformInit(seed, t.index, range.amplitude, range.centre);
    const uint16_t* got = back->tensor(t);
    for (int i = 0; i < 2000; ++i) {
      const uint64_t index = i < 16 ? static_cast<uint64_t>(i)
                                    : (i < 32 ? static_cast<uint64_t>(t.elements() - 1 - (i - 16))
                                              : rng_() % static_cast<uint64_t>(t.elements()));
      ASSERT_EQ(got[index], internal::InitValueBits(init, index)) << t.name << "[" << index << "]";
    }
  }
}

TEST_F(DeviceWeightsGpuTest, CheckpointUploadRoundTrips) {
  const LlamaShape shape = LlamaShape::Tiny();
  absl::StatusOr<LlamaHostWeights> host = RandomLlamaHostWeights(shape, rng_());
  ASSERT_TRUE(host.ok());
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path =
      std::string(dir != nullptr ? dir : "/tmp") + "/device_weights.safetensors";
  ASSERT_TRUE(WriteLlamaSafetensors(path, *host).ok());
  absl::StatusOr<LlamaHostWeights> loaded = ReadLlamaSafetensors({path}, shape);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<LlamaDeviceWeights> dev = LlamaDeviceWeights::Upload(*loaded, stream());
  ASSERT_TRUE(dev.ok()) << dev.status();
  absl::StatusOr<LlamaHostWeights> back = dev->Download(stream());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data, host->data);

  LlamaHostWeights broken = *host;
  broken.data.pop_back();
  EXPECT_EQ(LlamaDeviceWeights::Upload(broken, stream()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Load streams a rank's shard from the files through the pinned stages: the bits of the host
// read, at 1, 2 and 4 ranks, with stages of a few rows (many copies in flight, each stage reused)
// read by 1 and by 4 threads, and with the defaults; progress reaches the reader's bytes; a file
// cut after Open is DataLoss; no thread is refused.
TEST_F(DeviceWeightsGpuTest, LoadStreamsEachRanksShardFromTheFiles) {
  LlamaShape shape = LlamaShape::Tiny();
  shape.qkv_bias = true;
  shape.qk_norm = true;
  absl::StatusOr<LlamaHostWeights> host = RandomLlamaHostWeights(shape, rng_());
  ASSERT_TRUE(host.ok());
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/load.safetensors";
  ASSERT_TRUE(WriteLlamaSafetensors(path, *host).ok());
  for (int world : {1, 2, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      for (const WeightLoadOptions load : {WeightLoadOptions{1, 4096}, WeightLoadOptions{4, 4096},
                                           WeightLoadOptions{}}) {
        const size_t staging = load.staging_bytes;
        SCOPED_TRACE(::testing::Message() << "rank " << rank << " of " << world << ", "
                                          << load.threads << " threads, stages of " << staging
                                          << " bytes");
        absl::StatusOr<LlamaHostWeights> expected = ShardLlamaHostWeights(*host, world, rank);
        ASSERT_TRUE(expected.ok()) << expected.status();
        absl::StatusOr<LlamaShardReader> reader = LlamaShardReader::Open({path}, shape, world, rank);
        ASSERT_TRUE(reader.ok()) << reader.status();
        int64_t done = 0, calls = 0;
        absl::StatusOr<LlamaDeviceWeights> dev = LlamaDeviceWeights::Load(
            *reader, stream(),
            [&](int64_t bytes, int64_t total) {
              EXPECT_GT(bytes, done);
              EXPECT_EQ(total, reader->bytes());
              done = bytes;
              ++calls;
            },
            load);
        ASSERT_TRUE(dev.ok()) << dev.status();
        EXPECT_EQ(done, reader->bytes());
        if (staging == 4096) {
          EXPECT_GT(calls, static_cast<int64_t>(reader->blocks().size()));
        }
        // The weights take the reader's rank layout.
        EXPECT_EQ(dev->bytes(), reader->layout().total_bytes());
        ASSERT_EQ(dev->layout().tensors().size(), reader->layout().tensors().size());
        for (size_t i = 0; i < dev->layout().tensors().size(); ++i) {
          EXPECT_EQ(dev->layout().tensors()[i].offset, reader->layout().tensors()[i].offset);
        }
        absl::StatusOr<LlamaHostWeights> back = dev->Download(stream());
        ASSERT_TRUE(back.ok());
        EXPECT_EQ(back->data, expected->data);
      }
    }
  }

  // An F32 checkpoint (each value the bf16 one, exactly) loads to the same bits, rank 1 of 2.
  const std::string f32 = std::string(dir != nullptr ? dir : "/tmp") + "/load_f32.safetensors";
  ASSERT_TRUE(WriteLlamaSafetensors(f32, *host, "F32").ok());
  absl::StatusOr<LlamaShardReader> f32_reader = LlamaShardReader::Open({f32}, shape, 2, 1);
  ASSERT_TRUE(f32_reader.ok()) << f32_reader.status();
  absl::StatusOr<LlamaDeviceWeights> f32_dev =
      LlamaDeviceWeights::Load(*f32_reader, stream(), nullptr, {3, 4096});
  ASSERT_TRUE(f32_dev.ok()) << f32_dev.status();
  absl::StatusOr<LlamaHostWeights> f32_back = f32_dev->Download(stream());
  absl::StatusOr<LlamaHostWeights> shard = ShardLlamaHostWeights(*host, 2, 1);
  ASSERT_TRUE(f32_back.ok() && shard.ok());
  EXPECT_EQ(f32_back->data, shard->data);

  absl::StatusOr<LlamaShardReader> reader = LlamaShardReader::Open({path}, shape, 2, 1);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(truncate(path.c_str(), 4096), 0);
  absl::StatusOr<LlamaDeviceWeights> none = LlamaDeviceWeights::Load(*reader, stream(), nullptr, {0});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument) << none.status();
  absl::StatusOr<LlamaDeviceWeights> cut = LlamaDeviceWeights::Load(*reader, stream());
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << cut.status();
  EXPECT_NE(cut.status().message().find("shrank"), std::string::npos) << cut.status();
}

// A rank outside the split, or a split the shape does not take, is refused before the shard is
// allocated or its fill enqueued (these cases need no GPU: the refusal comes first), with
// ShardMapsFor's and RankShape's messages.
TEST(DeviceWeightsTest, RandomShardRefusesARankOutsideTheSplitFirst) {
  const LlamaShape shape = LlamaShape::Tiny();
  for (int rank : {-1, 2}) {
    absl::StatusOr<LlamaDeviceWeights> shard =
        LlamaDeviceWeights::RandomShard(shape, /*tp_size=*/2, rank, /*seed=*/1, nullptr);
    EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument) << shard.status();
    EXPECT_NE(shard.status().message().find(absl::StrCat("Rank ", rank)), std::string::npos)
        << shard.status();
    EXPECT_EQ(shard.status(), ShardMapsFor(shape, 2, rank).status());
  }
  for (int tp_size : {0, 3}) {
    absl::StatusOr<LlamaDeviceWeights> shard =
        LlamaDeviceWeights::RandomShard(shape, tp_size, /*rank=*/0, /*seed=*/1, nullptr);
    EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument) << shard.status();
    EXPECT_EQ(shard.status(), RankShape(shape, tp_size).status());
  }
}

}  // namespace
}  // namespace kiln
