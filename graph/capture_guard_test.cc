// Host tests of CaptureGuard's refusals that come before any CUDA call; captures themselves are
// tested on a GPU (capture_guard_gpu_test.cc).
#include "graph/capture_guard.h"

#include <cstdint>
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

}  // namespace
}  // namespace kiln
