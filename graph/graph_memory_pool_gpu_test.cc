// GraphMemoryPool on a GPU: the region is real device memory, allocations are aligned and
// rewound per capture, the budget and region growth are enforced, and growth inside a capture
// is refused by name.
#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "graph/capture_guard.h"
#include "graph/graph_memory_pool.h"
#include "graph/internal/gpu_test_helpers.h"
#include "graph/internal/test_kernels.h"
#include "gtest/gtest.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

using graph_internal::Download;
using graph_internal::LaunchFill;
using ::testing::HasSubstr;

class GraphMemoryPoolGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPUS(1);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    KILN_ASSERT_OK_AND_ASSIGN(stream_, Stream::Create());
  }
  Stream stream_;
};

TEST_F(GraphMemoryPoolGpuTest, AllocationsAreAlignedDeviceMemoryRewoundPerCapture) {
  KILN_ASSERT_OK_AND_ASSIGN(GraphMemoryPool pool, GraphMemoryPool::Create(1 << 20));
  EXPECT_EQ(pool.reserved_bytes(), size_t{1} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.base()) % PoolArena::kAlignment, 0u);
  std::mt19937 rng(std::random_device{}());
  const CaptureKey key{GraphMode::kDecode, 16};
  pool.Begin(key);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    const size_t bytes = 1000 + rng() % 5000;
    void* p = nullptr;
    KILN_ASSERT_OK_AND_ASSIGN(p, pool.Allocate(bytes, "block"));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % PoolArena::kAlignment, 0u);
    blocks.push_back(p);
    // Real device memory: a kernel writes it, the host reads it back.
    const float value = static_cast<float>(rng() % 1000) + 0.5f;
    const int n = static_cast<int>(bytes / sizeof(float));
    ASSERT_EQ(LaunchFill(static_cast<float*>(p), n, value, stream_.get()), cudaSuccess);
    std::vector<float> got;
    KILN_ASSERT_OK_AND_ASSIGN(got, Download(p, n));
    for (int j = 0; j < n; ++j) ASSERT_EQ(got[j], value);
  }
  pool.End();
  EXPECT_EQ(blocks.front(), pool.base());
  pool.Begin({GraphMode::kDecode, 8});  // the next capture starts from the base again
  void* again = nullptr;
  KILN_ASSERT_OK_AND_ASSIGN(again, pool.Allocate(64, "again"));
  EXPECT_EQ(again, pool.base());
  pool.End();
  EXPECT_EQ(pool.high_water_bytes(), pool.HighWater(key));
}

TEST_F(GraphMemoryPoolGpuTest, GrowthInsideACaptureIsNamedAndOutsideMovesTheRegion) {
  KILN_ASSERT_OK_AND_ASSIGN(GraphMemoryPool pool,
                            GraphMemoryPool::Create(/*budget_bytes=*/4 << 20,
                                                    /*reserve_bytes=*/1 << 20));
  EXPECT_EQ(pool.reserved_bytes(), size_t{1} << 20);
  const uint64_t generation = pool.generation();
  {
    CaptureGuard guard(stream_.get(), {GraphMode::kDecode, 32});
    ASSERT_TRUE(guard.ok());
    absl::Status grow = pool.Reserve(2 << 20);
    EXPECT_EQ(grow.code(), absl::StatusCode::kFailedPrecondition);
    absl::StatusOr<OwnedGraph> graph = guard.End();
    EXPECT_THAT(std::string(graph.status().message()),
                HasSubstr("Capture of decode/32 failed: Graph memory pool growth from 1048576 to "
                          "2097152 bytes is illegal during CUDA graph capture"));
  }
  EXPECT_EQ(pool.generation(), generation);
  EXPECT_EQ(pool.reserved_bytes(), size_t{1} << 20);

  KILN_ASSERT_OK(pool.Reserve(2 << 20));
  EXPECT_EQ(pool.reserved_bytes(), size_t{2} << 20);
  EXPECT_NE(pool.generation(), generation);
  EXPECT_EQ(pool.Reserve(8 << 20).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GraphMemoryPoolGpuTest, ImpossibleRegionIsResourceExhausted) {
  absl::StatusOr<GraphMemoryPool> huge = GraphMemoryPool::Create(size_t{1} << 50);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("graph memory pool"));
  KILN_ASSERT_OK_AND_ASSIGN(GraphMemoryPool empty, GraphMemoryPool::Create(0));
  empty.Begin({GraphMode::kDecode, 1});
  EXPECT_EQ(empty.Allocate(1, "x").status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(FormatBytes(12 << 20), "12.0 MiB");
}

}  // namespace
}  // namespace kiln
