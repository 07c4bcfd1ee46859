#include "attention/paged_kv_cache.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/attention_params.h"
#include "attention/internal/test_util.h"
#include "attention/paged_kv_layout.h"
#include "attention/plan_buffers.h"
#include "attention/split_kv_planner.h"
#include "gtest/gtest.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

using attention_internal::FastRng;

constexpr uint16_t kPoison = 0xabab;

#define ASSERT_OK(expr)                          \
  do {                                           \
    const absl::Status status_ = (expr);         \
    ASSERT_TRUE(status_.ok()) << status_;        \
  } while (false)

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

struct AppendCase {
  int block_size;
  int head_dim;
  bool slot_mapping;  // explicit slots instead of the plan-derived ones
  int stride_factor;  // k/v rows are stride_factor × (heads × head_dim) apart (fused QKV)
};

class AppendKvGpuTest : public ::testing::TestWithParam<AppendCase> {};

TEST_P(AppendKvGpuTest, WritesEveryNewTokenToItsSlotAndNothingElse) {
  KILN_REQUIRE_GPUS(1);
  const AppendCase c = GetParam();
  const int kv_heads = 2;
  const PagedKvLayout layout{48, c.block_size, kv_heads, c.head_dim, AttentionDtype::kBf16};
  const int max_seqs = 5;
  const int max_tokens = 24;
  auto cache = PagedKvCache::Create(layout, max_seqs, /*max_blocks_per_seq=*/8);
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto stream = Stream::Create();
  ASSERT_TRUE(stream.ok());

  // Blocks scattered over the pool.
  std::vector<int32_t> order(layout.num_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 gen(1234 + c.block_size + c.head_dim);
  std::shuffle(order.begin(), order.end(), gen);
  ASSERT_OK(cache->block_table().SetFreeOrder(order));
  // Prefill with history, decode tokens, an idle sequence, a fresh prompt, a block-crossing one.
  const std::vector<SeqLens> seqs = {
      {3, 18}, {1, 41}, {0, 7}, {5, 5}, {4, c.block_size + 2}};
  for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
    ASSERT_OK(cache->block_table().Reserve(s, seqs[s].kv_len));
  }
  ASSERT_OK(cache->UploadBlockTable(stream->get()));

  SplitKvPlannerOptions options;
  options.num_q_heads = kv_heads * 4;
  options.num_kv_heads = kv_heads;
  options.head_dim = c.head_dim;
  options.sm_count = 4;
  options.key = {max_seqs, max_tokens, 512};
  options.decode.tile_rows = 4;
  options.prefill.tile_rows = 16;
  auto planner = SplitKvPlanner::Create(options);
  ASSERT_TRUE(planner.ok()) << planner.status();
  auto buffers = PlanBuffers::Create(planner->layout());
  ASSERT_TRUE(buffers.ok()) << buffers.status();
  auto summary = planner->Plan(seqs, buffers->host_plan());
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_OK(buffers->Upload(stream->get()));

  // New rows, poisoned pools.
  const int64_t row = static_cast<int64_t>(kv_heads) * c.head_dim;
  const int64_t stride = row * c.stride_factor;
  std::vector<uint16_t> k_host(max_tokens * stride), v_host(max_tokens * stride);
  FastRng rng(99 + c.block_size);
  for (auto& x : k_host) x = attention_internal::ToBits(rng.Uniform(-1, 1), layout.dtype);
  for (auto& x : v_host) x = attention_internal::ToBits(rng.Uniform(-1, 1), layout.dtype);
  auto k_dev = DeviceBuffer::Allocate(k_host.size() * 2, "k");
  auto v_dev = DeviceBuffer::Allocate(v_host.size() * 2, "v");
  ASSERT_TRUE(k_dev.ok() && v_dev.ok());
  ASSERT_CUDA(cudaMemcpy(k_dev->data(), k_host.data(), k_host.size() * 2, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(v_dev->data(), v_host.data(), v_host.size() * 2, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(cache->k_cache(), 0xab, layout.PoolBytes()));
  ASSERT_CUDA(cudaMemset(cache->v_cache(), 0xab, layout.PoolBytes()));

  std::vector<int32_t> slots(max_tokens);
  ASSERT_OK(FillSlotMapping(seqs, cache->block_table(), absl::MakeSpan(slots)));
  auto slots_dev = DeviceBuffer::Allocate(slots.size() * 4, "slots");
  ASSERT_TRUE(slots_dev.ok());
  ASSERT_CUDA(
      cudaMemcpy(slots_dev->data(), slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));

  AppendKvParams append;
  append.k = k_dev->data();
  append.v = v_dev->data();
  append.k_stride = c.stride_factor == 1 ? 0 : stride;
  append.v_stride = c.stride_factor == 1 ? 0 : stride;
  append.max_tokens = max_tokens;
  append.slot_mapping = c.slot_mapping ? slots_dev->as<int32_t>() : nullptr;
  append.plan = buffers->decode();
  ASSERT_OK(cache->Append(append, stream->get()));
  ASSERT_OK(stream->Synchronize());

  std::vector<uint16_t> k_pool(layout.PoolBytes() / 2), v_pool(layout.PoolBytes() / 2);
  ASSERT_CUDA(
      cudaMemcpy(k_pool.data(), cache->k_cache(), layout.PoolBytes(), cudaMemcpyDeviceToHost));
  ASSERT_CUDA(
      cudaMemcpy(v_pool.data(), cache->v_cache(), layout.PoolBytes(), cudaMemcpyDeviceToHost));
  std::vector<bool> written(k_pool.size(), false);
  int tokens = 0;
  for (int t = 0; t < max_tokens; ++t) {
    if (slots[t] < 0) continue;
    ++tokens;
    for (int h = 0; h < kv_heads; ++h) {
      const size_t dst = layout.ElementOffset(slots[t], h);
      for (int d = 0; d < c.head_dim; ++d) {
        const size_t src = t * stride + h * c.head_dim + d;
        ASSERT_EQ(k_pool[dst + d], k_host[src]) << "token " << t << " head " << h << " dim " << d;
        ASSERT_EQ(v_pool[dst + d], v_host[src]) << "token " << t << " head " << h << " dim " << d;
        written[dst + d] = true;
      }
    }
  }
  EXPECT_EQ(tokens, 3 + 1 + 5 + 4);
  for (size_t i = 0; i < k_pool.size(); ++i) {
    if (written[i]) continue;
    ASSERT_EQ(k_pool[i], kPoison) << "K element " << i << " written but no token maps there";
    ASSERT_EQ(v_pool[i], kPoison) << "V element " << i << " written but no token maps there";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, AppendKvGpuTest,
                         ::testing::Values(AppendCase{16, 128, false, 1},
                                           AppendCase{64, 128, false, 1},
                                           AppendCase{16, 64, true, 1},
                                           AppendCase{64, 64, true, 3},
                                           AppendCase{16, 128, false, 3}));

TEST(PagedKvCacheGpuTest, UploadsAreRefusedDuringCapture) {
  KILN_REQUIRE_GPUS(1);
  const PagedKvLayout layout{8, 16, 1, 64, AttentionDtype::kFp16};
  auto cache = PagedKvCache::Create(layout, 2, 2);
  ASSERT_TRUE(cache.ok()) << cache.status();
  ASSERT_OK(cache->block_table().Reserve(0, 20));
  SplitKvPlannerOptions options;
  options.num_q_heads = 1;
  options.num_kv_heads = 1;
  options.head_dim = 64;
  options.sm_count = 1;
  options.key = {2, 2, 32};
  options.decode.tile_rows = 1;
  auto planner = SplitKvPlanner::Create(options);
  ASSERT_TRUE(planner.ok());
  auto buffers = PlanBuffers::Create(planner->layout());
  ASSERT_TRUE(buffers.ok());
  auto stream = Stream::Create();
  ASSERT_TRUE(stream.ok());
  ASSERT_CUDA(cudaStreamBeginCapture(stream->get(), cudaStreamCaptureModeThreadLocal));
  const absl::Status table = cache->UploadBlockTable(stream->get());
  const absl::Status plan = buffers->Upload(stream->get());
  cudaGraph_t graph = nullptr;
  ASSERT_CUDA(cudaStreamEndCapture(stream->get(), &graph));
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_EQ(table.code(), absl::StatusCode::kFailedPrecondition) << table;
  EXPECT_EQ(plan.code(), absl::StatusCode::kFailedPrecondition) << plan;
  // Outside capture both work.
  ASSERT_OK(cache->UploadBlockTable(stream->get()));
  ASSERT_OK(buffers->Upload(stream->get()));
  ASSERT_OK(stream->Synchronize());
}

}  // namespace
}  // namespace kiln
