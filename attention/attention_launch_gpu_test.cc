// Mixed decode + prefill steps through RunAttentionStep with the real planner, plan buffers,
// decode, prefill and merge kernels: every step matches the CPU float64 reference, and one graph
// captured per key replays every later step bit for bit like the eager launches.
#include "attention/attention_launch.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attention/attention_params.h"
#include "attention/plan_buffers.h"
#include "attention/prefill_test_util.h"
#include "attention/split_kv_planner.h"
#include "gtest/gtest.h"
#include "runtime/cuda/device_info.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/cuda/status_macros.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

using prefill_testing::BatchSizes;
using prefill_testing::DeviceBatch;
using prefill_testing::HostBatch;
using prefill_testing::SeqSpec;
using prefill_testing::Shape;
using prefill_testing::TestPlan;

constexpr int kMaxSeqs = 16;
constexpr int kMaxTokens = 256;
constexpr int kMaxKv = 2048;

std::vector<SeqSpec> Decodes(const std::vector<int>& kv_lens) {
  std::vector<SeqSpec> seqs;
  for (int kv : kv_lens) seqs.push_back({1, kv});
  return seqs;
}

std::vector<SeqSpec> Concat(std::vector<SeqSpec> a, const std::vector<SeqSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Mixed steps within the key: decodes next to [13,13]-style prefills, one long prefill plus
// singles, all decode, all equal prefills, a long cached prefix that splits, random mixes.
std::vector<std::vector<SeqSpec>> Steps(std::mt19937_64& rng) {
  std::vector<std::vector<SeqSpec>> steps;
  steps.push_back(Concat(Decodes({100, 1, 2000, 17, 64, 65, 700, 300, 33, 1024, 5, 129}),
                         {{13, 13}, {13, 13}}));
  steps.push_back(Concat({{241, 741}}, Decodes({9, 99, 999, 1999, 2048, 1, 2, 3, 4, 5, 6, 7, 8,
                                                 10, 11})));
  steps.push_back(Decodes({2048, 1, 1500, 77, 16, 15, 1000, 500, 250, 125, 60, 30, 12, 6, 3, 2}));
  steps.push_back(std::vector<SeqSpec>(kMaxSeqs, SeqSpec{16, 16}));
  steps.push_back(Concat(Decodes({2048}), {{200, 2000}, {30, 1830}}));
  for (int r = 0; r < 3; ++r) {
    std::vector<SeqSpec> seqs;
    int tokens = 0;
    const int n = 2 + static_cast<int>(rng() % (kMaxSeqs - 1));
    for (int s = 0; s < n; ++s) {
      const bool decode = rng() % 2 == 0;
      const int budget = kMaxTokens - tokens - (n - s - 1);
      const int q = decode ? 1 : 1 + static_cast<int>(rng() % std::max(1, std::min(budget, 120)));
      const int prefix = static_cast<int>(rng() % (kMaxKv - q + 1));
      seqs.push_back({q, q + prefix});
      tokens += q;
    }
    steps.push_back(seqs);
  }
  return steps;
}

std::string Describe(const std::vector<SeqSpec>& seqs) {
  return absl::StrJoin(seqs, ",", [](std::string* out, const SeqSpec& s) {
    absl::StrAppend(out, s.q_len, "/", s.kv_len);
  });
}

struct MixedCase {
  AttentionDtype dtype;
  int head_dim;
  int num_q_heads;
  int num_kv_heads;
  int prefill_tile_rows;
};

class AttentionLaunchGpuTest : public ::testing::TestWithParam<MixedCase> {};

TEST_P(AttentionLaunchGpuTest, MixedStepsMatchReferenceAndReplayBitExact) {
  KILN_REQUIRE_GPUS(1);
  const MixedCase c = GetParam();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto stream_or = Stream::Create();
  ASSERT_TRUE(stream_or.ok()) << stream_or.status();
  Stream stream = std::move(stream_or).value();
  std::random_device rd;
  const uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  std::mt19937_64 rng(seed);

  const Shape shape{c.dtype, c.head_dim, c.prefill_tile_rows, c.num_q_heads, c.num_kv_heads, 16};
  auto info = DeviceInfo::Query(0);
  SplitKvPlannerOptions options;
  options.num_q_heads = shape.num_q_heads;
  options.num_kv_heads = shape.num_kv_heads;
  options.head_dim = shape.head_dim;
  options.sm_count = info.ok() ? info->sm_count : 132;
  options.key = {kMaxSeqs, kMaxTokens, kMaxKv};
  options.decode.tile_rows = shape.group();
  options.prefill.tile_rows = shape.tile_rows;
  auto planner_or = SplitKvPlanner::Create(options);
  ASSERT_TRUE(planner_or.ok()) << planner_or.status();
  const SplitKvPlanner& planner = *planner_or;
  auto buffers_or = PlanBuffers::Create(planner.layout());
  ASSERT_TRUE(buffers_or.ok()) << buffers_or.status();
  const PlanBuffers& buffers = *buffers_or;

  // Fixed q, o and cache buffers for the key; every step rewrites their contents.
  BatchSizes sizes;
  sizes.num_tokens = kMaxTokens;
  sizes.max_seqs = kMaxSeqs;
  sizes.max_blocks_per_seq = kMaxKv / shape.block_size;
  sizes.num_blocks = kMaxSeqs * sizes.max_blocks_per_seq + 8;
  const std::vector<std::vector<SeqSpec>> steps = Steps(rng);
  auto dev_or = DeviceBatch::Upload(prefill_testing::MakeRandomBatch(shape, steps[0], rng(), sizes),
                                    TestPlan{}, /*capacity=*/1);
  ASSERT_TRUE(dev_or.ok()) << dev_or.status();
  DeviceBatch dev = std::move(dev_or).value();
  const PrefillAttentionParams raw = dev.Params();

  AttentionStepParams step;
  step.dtype = shape.dtype;
  step.num_q_heads = shape.num_q_heads;
  step.num_kv_heads = shape.num_kv_heads;
  step.head_dim = shape.head_dim;
  step.q = raw.q;
  step.o = raw.o;
  step.kv.k_cache = raw.k_cache;
  step.kv.v_cache = raw.v_cache;
  step.kv.block_table = raw.block_table;
  step.kv.max_blocks_per_seq = raw.max_blocks_per_seq;
  step.kv.block_size = shape.block_size;
  step.decode = buffers.decode();
  step.prefill = buffers.prefill();

  auto plan_step = [&](const std::vector<SeqSpec>& seqs, const HostBatch& batch,
                       PlanSummary* summary) -> absl::Status {
    std::vector<SeqLens> lens;
    for (const SeqSpec& s : seqs) lens.push_back({s.q_len, s.kv_len});
    ASSIGN_OR_RETURN(*summary, planner.Plan(lens, buffers.host_plan()));
    RETURN_IF_ERROR(dev.Update(batch, TestPlan{}, stream.get()));
    return buffers.Upload(stream.get());
  };

  // Warm up eagerly, then capture once for the key.
  {
    const HostBatch batch = prefill_testing::MakeRandomBatch(shape, steps[0], rng(), sizes);
    PlanSummary summary;
    ASSERT_TRUE(plan_step(steps[0], batch, &summary).ok());
    ASSERT_TRUE(RunAttentionStep(step, stream.get()).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  }
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal), cudaSuccess);
  const absl::Status captured = RunAttentionStep(step, stream.get());
  ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  int split_steps = 0;
  for (const std::vector<SeqSpec>& seqs : steps) {
    SCOPED_TRACE(absl::StrCat("step q/kv: ", Describe(seqs)));
    const HostBatch batch = prefill_testing::MakeRandomBatch(shape, seqs, rng(), sizes);
    PlanSummary summary;
    const absl::Status planned = plan_step(seqs, batch, &summary);
    ASSERT_TRUE(planned.ok()) << planned;
    split_steps += summary.decode.num_merge_items + summary.prefill.num_merge_items > 0;

    ASSERT_TRUE(dev.Poison(stream.get()).ok());
    const absl::Status ran = RunAttentionStep(step, stream.get());
    ASSERT_TRUE(ran.ok()) << ran;
    auto eager = dev.DownloadOutputBits(stream.get());
    ASSERT_TRUE(eager.ok()) << eager.status();

    ASSERT_TRUE(dev.Poison(stream.get()).ok());
    ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
    auto replayed = dev.DownloadOutputBits(stream.get());
    ASSERT_TRUE(replayed.ok()) << replayed.status();
    ASSERT_EQ(*replayed, *eager) << "graph replay differs from the eager step";

    std::vector<float> out(eager->size());
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = prefill_testing::BitsToFloat((*eager)[i], shape.dtype);
    }
    const int token_elems = shape.num_q_heads * shape.head_dim;
    const std::vector<double> ref = prefill_testing::ReferenceOutput(batch, 0.0f);
    EXPECT_LT(prefill_testing::MaxTokenRelativeError(out, ref, batch.num_tokens, token_elems),
              shape.dtype == AttentionDtype::kBf16 ? 1e-2 : 2e-3);
    for (size_t i = static_cast<size_t>(batch.num_tokens) * token_elems; i < out.size(); ++i) {
      ASSERT_EQ((*eager)[i], 0xFFFF) << "padding token element " << i << " was written";
    }
  }
  EXPECT_GT(split_steps, 0) << "some step should have split its KV";
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionLaunchGpuTest,
    ::testing::Values(MixedCase{AttentionDtype::kBf16, 128, 32, 8, 128},
                      MixedCase{AttentionDtype::kBf16, 128, 10, 2, 64},
                      MixedCase{AttentionDtype::kFp16, 64, 8, 8, 64},
                      MixedCase{AttentionDtype::kFp16, 128, 16, 4, 128}));

}  // namespace
}  // namespace kiln
