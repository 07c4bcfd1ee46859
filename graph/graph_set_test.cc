// Host tests of GraphSet's checks that come before any CUDA call: an empty step function, and
// keys with no graph. Capture and replay themselves are tested on a GPU (graph_set_gpu_test.cc).
#include "graph/graph_set.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "graph/capture_context.h"
#include "graph/capture_sizes.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

constexpr CaptureKey kKey{GraphMode::kDecode, 8};

TEST(GraphSetTest, AnEmptyStepFunctionIsInvalidArgument) {
  // Calling it would throw std::bad_function_call out of the library.
  GraphSet graphs;
  const absl::Status status = graphs.Capture(kKey, StepFn(), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("decode/8 got an empty step function"));
  EXPECT_FALSE(graphs.Contains(kKey));

  absl::StatusOr<CaptureSizes> sizes = CaptureSizes::Decode(8);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  absl::StatusOr<CaptureSummary> all =
      graphs.CaptureAll(GraphMode::kDecode, *sizes, KeyedStepFn(), nullptr);
  EXPECT_EQ(all.status().code(), absl::StatusCode::kInvalidArgument) << all.status();
  EXPECT_THAT(std::string(all.status().message()), HasSubstr("empty step function"));
  EXPECT_EQ(graphs.size(), 0u);
}

TEST(GraphSetTest, KeysNeverCapturedAreFailedPrecondition) {
  GraphSet graphs;
  const absl::Status replay = graphs.Replay(kKey, nullptr);
  EXPECT_EQ(replay.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(replay.message()), HasSubstr("No graph for decode/8"));
  EXPECT_EQ(graphs.Verify({GraphMode::kPrefill, 64}, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(graphs.Stats(kKey), nullptr);
  graphs.Erase(kKey);  // no-op
  EXPECT_TRUE(graphs.AllStats().empty());
}

}  // namespace
}  // namespace kiln
