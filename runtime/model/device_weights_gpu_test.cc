// GPU tests of LlamaDeviceWeights: the GPU's seeded initialisation equals the host's bit for
// bit (tiny shape in full, the 1B shape by sampling), and host weights (from a checkpoint)
// survive the trip to the device and back.
#include "runtime/model/device_weights.h"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "runtime/model/internal/gpu_test_helpers.h"
#include "runtime/model/internal/weight_init.h"
#include "runtime/model/llama_checkpoint.h"
#include "runtime/model/llama_weights.h"

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

}  // namespace
}  // namespace kiln
