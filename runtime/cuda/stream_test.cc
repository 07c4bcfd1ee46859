// Host tests of Stream's checks that need no GPU; streams at work are tested on a GPU
// (cuda_base_gpu_test.cc).
#include "runtime/cuda/stream.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(StreamTest, AnEmptyStreamRefusesToSynchronize) {
  // cudaStreamSynchronize(nullptr) waits for the legacy stream, not for any of kiln's
  // non-blocking streams: an empty Stream must not report their work done.
  Stream empty;
  const absl::Status status = empty.Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("empty Stream"));
  Stream moved_to = std::move(empty);
  EXPECT_EQ(moved_to.Synchronize().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kiln
