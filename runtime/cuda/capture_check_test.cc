// Host tests of the capture checks: outside any capture nothing is refused, whether or not this
// machine has a GPU; a capture noted for the thread refuses by name and records the first one.
#include "runtime/cuda/capture_check.h"

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(CaptureCheckTest, NothingIsRefusedOutsideACapture) {
  // Without a GPU or driver, cudaStreamIsCapturing fails; that is no capture, and the guarded
  // operation must report CUDA's own error instead of "illegal during CUDA graph capture".
  EXPECT_FALSE(IsCapturing(nullptr));
  EXPECT_TRUE(CheckNotCapturing(nullptr, "cudaMalloc of 'x'").ok());
  EXPECT_EQ(TakeFirstIllegalDuringCapture(), "");
}

TEST(CaptureCheckTest, ANotedCaptureRefusesByNameAndRecordsTheFirst) {
  NoteCaptureBegin(nullptr);
  EXPECT_TRUE(IsCapturing(nullptr));
  const absl::Status first = CheckNotCapturing(nullptr, "Stream::Synchronize");
  EXPECT_EQ(first.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(first.message()),
              HasSubstr("Stream::Synchronize is illegal during CUDA graph capture"));
  EXPECT_FALSE(CheckNotCapturing(nullptr, "cudaMalloc of 'x'").ok());
  NoteCaptureEnd();
  EXPECT_EQ(TakeFirstIllegalDuringCapture(), "Stream::Synchronize");
  EXPECT_FALSE(IsCapturing(nullptr));
}


// The record is per thread and keeps the first operation, whatever bytes its name holds.
TEST(CaptureCheckTest, RecordsAreFirstOnlyAndPerThread) {
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &wrong] {
      std::mt19937 rng(30 + t);
      for (int round = 0; round < 500; ++round) {
        std::string first(rng() % 50, '\0');
        for (char& c : first) c = static_cast<char>(rng());
        RecordIllegalDuringCapture(first);
        RecordIllegalDuringCapture("second");
        if (TakeFirstIllegalDuringCapture() != (first.empty() ? "second" : first)) ++wrong;
        if (!TakeFirstIllegalDuringCapture().empty()) ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}
}  // namespace
}  // namespace kiln
