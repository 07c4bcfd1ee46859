#include "graph/capture_context.h"

#include <climits>
#include <random>
#include <string>
#include <thread>
#include <vector>

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

// Scopes nested to a random depth (up to 200) with random phases and keys of any size and mode:
// each level sees its own phase and key, and each unwinding restores the level above exactly.
// KeyName spells any key, extreme sizes and modes outside GraphMode included.
void Nest(std::mt19937& rng, int depth, std::vector<std::pair<CapturePhase, CaptureKey>>* stack,
          int* checks) {
  if (depth == 0) return;
  const int sizes[] = {INT_MIN, -1, 0, 1, INT_MAX};
  const CapturePhase phase = static_cast<CapturePhase>(rng() % 4);
  const CaptureKey key{static_cast<GraphMode>(static_cast<int>(rng() % 5) - 1),
                       rng() % 2 == 0 ? sizes[rng() % 5] : static_cast<int>(rng())};
  {
    CaptureContext::Scope scope(phase, key);
    stack->push_back({phase, key});
    ASSERT_EQ(CaptureContext::Phase(), phase);
    ASSERT_EQ(CaptureContext::Key(), key);
    ASSERT_EQ(CaptureContext::IsCapturing(), phase == CapturePhase::kCapture);
    const int mode = static_cast<int>(key.mode);
    const std::string mode_name = mode == 0 ? "decode" : mode == 1 ? "prefill" : mode == 2 ? "mixed"
                                                                                   : "unknown";
    ASSERT_EQ(KeyName(key), mode_name + "/" + std::to_string(key.size));
    ++*checks;
    Nest(rng, rng() % 3 == 0 ? 0 : depth - 1, stack, checks);
    stack->pop_back();
  }
  if (stack->empty()) {
    ASSERT_EQ(CaptureContext::Phase(), CapturePhase::kEager);
    ASSERT_EQ(CaptureContext::Key(), CaptureKey{});
  } else {
    ASSERT_EQ(CaptureContext::Phase(), stack->back().first);
    ASSERT_EQ(CaptureContext::Key(), stack->back().second);
  }
}

TEST(CaptureContextTest, RandomNestingRestoresEveryLevel) {
  std::mt19937 rng(41);
  std::vector<std::pair<CapturePhase, CaptureKey>> stack;
  int checks = 0;
  for (int i = 0; i < 500; ++i) Nest(rng, 1 + static_cast<int>(rng() % 200), &stack, &checks);
  EXPECT_GT(checks, 1000);
  EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kEager);
  EXPECT_STREQ(PhaseName(static_cast<CapturePhase>(9)), "unknown");
}

}  // namespace
}  // namespace kiln
