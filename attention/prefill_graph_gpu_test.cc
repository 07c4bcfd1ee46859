// A prefill-only CUDA graph captured once for a token budget replays correctly for every way of
// splitting that budget into sequences: its grid is the planner's work capacity (the closed-form
// tile bound), padding items exit, and the replay equals an eager launch of the exact plan bit
// for bit.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attention/prefill_kernel.h"
#include "attention/prefill_test_util.h"
#include "attention/split_kv_planner.h"
#include "gtest/gtest.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

using prefill_testing::BatchSizes;
using prefill_testing::DeviceBatch;
using prefill_testing::HostBatch;
using prefill_testing::SeqSpec;
using prefill_testing::Shape;
using prefill_testing::TestPlan;

constexpr int kTokenBudget = 256;  // N: the capture key's size
constexpr int kMaxSeqs = 16;       // B
constexpr int kMaxKv = 1024;

std::vector<SeqSpec> Prompts(const std::vector<int>& lengths, int prefix = 0) {
  std::vector<SeqSpec> seqs;
  for (int len : lengths) seqs.push_back({len, len + prefix});
  return seqs;
}

std::vector<std::vector<SeqSpec>> Splits(std::mt19937_64& rng) {
  std::vector<std::vector<SeqSpec>> splits;
  splits.push_back(Prompts({13, 13}));  // 4 tiles with G = 5, T = 64
  std::vector<int> long_and_singles(kMaxSeqs, 1);
  long_and_singles[0] = kTokenBudget - (kMaxSeqs - 1);
  splits.push_back(Prompts(long_and_singles));
  splits.push_back(Prompts(std::vector<int>(kMaxSeqs, kTokenBudget / kMaxSeqs)));
  splits.push_back(Prompts(std::vector<int>(kMaxSeqs, 1), /*prefix=*/700));
  splits.push_back(Prompts({kTokenBudget}));
  splits.push_back(Prompts({kTokenBudget - 1}, /*prefix=*/kMaxKv - kTokenBudget));
  splits.push_back(Prompts({100, 60, 13, 13, 1, 1, 68}, /*prefix=*/33));
  for (int r = 0; r < 4; ++r) {  // random splits with random cached prefixes
    std::vector<SeqSpec> seqs;
    int left = kTokenBudget - static_cast<int>(rng() % 40);
    const int n = 1 + static_cast<int>(rng() % kMaxSeqs);
    for (int s = 0; s < n && left > 0; ++s) {
      const int q = s + 1 == n ? left : 1 + static_cast<int>(rng() % left);
      const int prefix = static_cast<int>(rng() % (kMaxKv - q + 1));
      seqs.push_back({q, q + prefix});
      left -= q;
    }
    splits.push_back(seqs);
  }
  return splits;
}

std::string Lengths(const std::vector<SeqSpec>& seqs) {
  return absl::StrJoin(seqs, ",", [](std::string* out, const SeqSpec& s) {
    absl::StrAppend(out, s.q_len, "/", s.kv_len);
  });
}

TEST(PrefillGraphGpuTest, OneCaptureReplaysEverySplitBitExact) {
  KILN_REQUIRE_GPUS(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto stream_or = Stream::Create();
  ASSERT_TRUE(stream_or.ok()) << stream_or.status();
  Stream stream = std::move(stream_or).value();
  std::random_device rd;
  const uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  std::mt19937_64 rng(seed);

  const Shape shape{AttentionDtype::kBf16, 128, 64, 10, 2, 16};  // G = 5
  // The real planner under one prefill-only key; its work capacity is the grid baked in.
  SplitKvPlannerOptions options;
  options.num_q_heads = shape.num_q_heads;
  options.num_kv_heads = shape.num_kv_heads;
  options.head_dim = shape.head_dim;
  options.sm_count = 132;
  options.key = {kMaxSeqs, kTokenBudget, kMaxKv};
  options.prefill.tile_rows = shape.tile_rows;
  options.prefill.allow_split = false;
  auto planner_or = SplitKvPlanner::Create(options);
  ASSERT_TRUE(planner_or.ok()) << planner_or.status();
  const SplitKvPlanner& planner = *planner_or;
  const int capacity = planner.layout().prefill.work_capacity;
  ASSERT_EQ(capacity, prefill_testing::TileCapacity(kTokenBudget, kMaxSeqs, shape.group(),
                                                    shape.tile_rows));
  BatchSizes sizes;
  sizes.num_tokens = kTokenBudget;
  sizes.max_seqs = kMaxSeqs;
  sizes.max_blocks_per_seq = kMaxKv / shape.block_size;
  sizes.num_blocks = kMaxSeqs * sizes.max_blocks_per_seq + 8;

  const std::vector<std::vector<SeqSpec>> splits = Splits(rng);
  HostBatch first = prefill_testing::MakeRandomBatch(shape, splits[0], rng(), sizes);
  int planned_capacity = 0;
  auto first_plan_or = prefill_testing::PlanWithPlanner(planner, splits[0], &planned_capacity);
  ASSERT_TRUE(first_plan_or.ok()) << first_plan_or.status();
  const TestPlan& first_plan = *first_plan_or;
  ASSERT_EQ(first_plan.items.size(), 4u) << "[13,13] with G=5, T=64 needs 4 tiles";
  auto dev_or = DeviceBatch::Upload(first, first_plan, capacity);
  ASSERT_TRUE(dev_or.ok()) << dev_or.status();
  DeviceBatch dev = std::move(dev_or).value();

  // Warm up through the eager path, then capture once, for the key's capacity.
  ASSERT_TRUE(LaunchPrefillAttention(dev.Params(), stream.get()).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal), cudaSuccess);
  const absl::Status captured = LaunchPrefillAttention(dev.Params(), stream.get());
  ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (const std::vector<SeqSpec>& seqs : splits) {
    SCOPED_TRACE(absl::StrCat("split q/kv: ", Lengths(seqs)));
    const HostBatch batch = prefill_testing::MakeRandomBatch(shape, seqs, rng(), sizes);
    auto plan_or = prefill_testing::PlanWithPlanner(planner, seqs, &planned_capacity);
    ASSERT_TRUE(plan_or.ok()) << plan_or.status();
    const TestPlan& plan = *plan_or;
    ASSERT_EQ(planned_capacity, capacity);
    ASSERT_TRUE(plan.merges.empty());
    ASSERT_TRUE(dev.Update(batch, plan, stream.get()).ok());

    ASSERT_TRUE(dev.Poison(stream.get()).ok());
    ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
    auto replayed = dev.DownloadOutputBits(stream.get());
    ASSERT_TRUE(replayed.ok()) << replayed.status();

    // Eager launch of exactly the plan's items (no padding) into the same buffers.
    ASSERT_TRUE(dev.Poison(stream.get()).ok());
    PrefillAttentionParams eager = dev.Params();
    eager.num_work_items = static_cast<int>(plan.items.size());
    ASSERT_TRUE(LaunchPrefillAttention(eager, stream.get()).ok());
    auto direct = dev.DownloadOutputBits(stream.get());
    ASSERT_TRUE(direct.ok()) << direct.status();
    ASSERT_EQ(*replayed, *direct) << "graph replay differs from the eager launch";

    std::vector<float> out(replayed->size());
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = prefill_testing::BitsToFloat((*replayed)[i], shape.dtype);
    }
    const std::vector<double> ref = prefill_testing::ReferenceOutput(batch, 0.0f);
    const int token_elems = shape.num_q_heads * shape.head_dim;
    EXPECT_LT(prefill_testing::MaxTokenRelativeError(out, ref, batch.num_tokens, token_elems),
              1e-2);
    for (size_t i = static_cast<size_t>(batch.num_tokens) * token_elems; i < out.size(); ++i) {
      ASSERT_EQ((*replayed)[i], 0xFFFF) << "padding token element " << i << " was written";
    }
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

}  // namespace
}  // namespace kiln
