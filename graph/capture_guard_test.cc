// Host tests of CaptureGuard's refusals that come before any CUDA call; captures themselves are
// tested on a GPU (capture_guard_gpu_test.cc).
#include "graph/capture_guard.h"

#include <climits>
#include <cstdint>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "graph/capture_context.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(CaptureGuardTest, TheDefaultStreamIsRefused) {
  for (cudaStream_t stream : {cudaStream_t{nullptr}, cudaStreamLegacy, cudaStreamPerThread}) {
    CaptureGuard guard(stream, {GraphMode::kDecode, 4});
    EXPECT_FALSE(guard.ok());
    EXPECT_EQ(guard.begin_status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kEager);
  }
}

TEST(CaptureGuardTest, ANestedCaptureIsRefusedNamingBothKeys) {
  // The phase a capture of prefill/512 sets for its thread; the inner guard must refuse before it
  // asks CUDA anything, so the handle below is never used.
  CaptureContext::Scope outer(CapturePhase::kCapture, {GraphMode::kPrefill, 512});
  const cudaStream_t never_used = reinterpret_cast<cudaStream_t>(uintptr_t{0x1000});
  CaptureGuard inner(never_used, {GraphMode::kDecode, 4});
  EXPECT_FALSE(inner.ok());
  EXPECT_FALSE(inner.capturing());
  EXPECT_EQ(inner.begin_status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(inner.begin_status().message()),
              HasSubstr("Capture of decode/4 began while this thread captures prefill/512"));
  EXPECT_EQ(inner.End().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kCapture);  // the outer phase is untouched
}

TEST(CaptureGuardTest, RefusalsNameAnyKeyAndLeaveThePhaseAlone) {
  // Keys of any size and mode, on the default streams and nested under a capture of another
  // random key: each guard refuses before asking CUDA anything, names the key(s), ends cleanly
  // (End returns the refusal, twice), and the thread's phase and key are what they were.
  std::mt19937 rng(37);
  const int sizes[] = {INT_MIN, -1, 0, 1, 512, INT_MAX};
  auto random_key = [&]() {
    return CaptureKey{static_cast<GraphMode>(static_cast<int>(rng() % 5) - 1),
                      rng() % 2 == 0 ? sizes[rng() % 6] : static_cast<int>(rng())};
  };
  const cudaStream_t defaults[] = {nullptr, cudaStreamLegacy, cudaStreamPerThread};
  for (int i = 0; i < 3000; ++i) {
    const CaptureKey key = random_key();
    if (rng() % 2 == 0) {
      CaptureGuard guard(defaults[rng() % 3], key);
      EXPECT_FALSE(guard.ok());
      EXPECT_FALSE(guard.capturing());
      EXPECT_EQ(guard.begin_status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(guard.begin_status().message()),
                  HasSubstr("Capture of " + KeyName(key) + " on the default stream"));
      EXPECT_EQ(guard.End().status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(guard.End().status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kEager);
      continue;
    }
    const CaptureKey outer_key = random_key();
    CaptureContext::Scope outer(CapturePhase::kCapture, outer_key);
    {
      CaptureGuard inner(reinterpret_cast<cudaStream_t>(uintptr_t{0x1000}), key);
      EXPECT_EQ(inner.begin_status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(inner.begin_status().message()),
                  HasSubstr("Capture of " + KeyName(key) + " began while this thread captures " +
                            KeyName(outer_key)));
    }
    EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kCapture);
    EXPECT_EQ(CaptureContext::Key(), outer_key);
  }
  EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kEager);
}

}  // namespace
}  // namespace kiln
