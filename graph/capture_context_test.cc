#include "graph/capture_context.h"

#include <thread>

#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(CaptureContextTest, DefaultsToEager) {
  EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kEager);
  EXPECT_FALSE(CaptureContext::IsCapturing());
}

TEST(CaptureContextTest, ScopesNestAndRestore) {
  {
    CaptureContext::Scope warmup(CapturePhase::kWarmup, {GraphMode::kDecode, 8});
    EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kWarmup);
    EXPECT_FALSE(CaptureContext::IsCapturing());  // warm-up is not capture
    EXPECT_EQ(CaptureContext::Key(), (CaptureKey{GraphMode::kDecode, 8}));
    {
      CaptureContext::Scope capture(CapturePhase::kCapture, {GraphMode::kPrefill, 512});
      EXPECT_TRUE(CaptureContext::IsCapturing());
      EXPECT_EQ(KeyName(CaptureContext::Key()), "prefill/512");
    }
    EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kWarmup);
    EXPECT_EQ(CaptureContext::Key().size, 8);
  }
  EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kEager);
}

TEST(CaptureContextTest, IsPerThread) {
  CaptureContext::Scope capture(CapturePhase::kCapture, {GraphMode::kMixed, 64});
  CapturePhase other = CapturePhase::kCapture;
  std::thread t([&] { other = CaptureContext::Phase(); });
  t.join();
  EXPECT_EQ(other, CapturePhase::kEager);
  EXPECT_TRUE(CaptureContext::IsCapturing());
}

TEST(CaptureContextTest, NamesAndOrdering) {
  EXPECT_STREQ(PhaseName(CapturePhase::kReplayPrepare), "replay-prepare");
  EXPECT_STREQ(PhaseName(CapturePhase::kWarmup), "warm-up");
  EXPECT_STREQ(GraphModeName(GraphMode::kMixed), "mixed");
  EXPECT_TRUE((CaptureKey{GraphMode::kDecode, 256}) < (CaptureKey{GraphMode::kPrefill, 1}));
  EXPECT_TRUE((CaptureKey{GraphMode::kDecode, 1}) < (CaptureKey{GraphMode::kDecode, 2}));
  EXPECT_NE((CaptureKey{GraphMode::kDecode, 1}), (CaptureKey{GraphMode::kDecode, 2}));
}

}  // namespace
}  // namespace kiln
