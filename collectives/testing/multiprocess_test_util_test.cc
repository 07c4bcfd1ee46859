// Host-only tests of the multi-process harness itself (no GPU needed: world sizes are given).
#include "collectives/testing/multiprocess_test_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/testing/process_group.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace kiln {
namespace testing {
namespace {

MultiProcessTestOptions World(int n) {
  MultiProcessTestOptions options;
  options.world_size = n;
  options.timeout = absl::Seconds(60);
  return options;
}

TEST(MultiProcessTest, EveryRankRunsInItsOwnProcessAndTheyTalk) {
  RunOnEveryGpu(
      [](RankContext& ctx) {
        EXPECT_EQ(ctx.world_size, 3);
        EXPECT_EQ(ctx.device(), ctx.rank);
        auto all =
            ctx.bootstrap.AllGather(absl::StrCat(getpid()), "multiprocess_test_util_test.pids");
        ASSERT_TRUE(all.ok()) << all.status();
        // Distinct processes, none of them the parent.
        for (int r = 0; r < 3; ++r) {
          for (int q = r + 1; q < 3; ++q) EXPECT_NE((*all)[r], (*all)[q]);
        }
        EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
      },
      World(3));
}

TEST(MultiProcessTest, SecondInvocationInOneTestRunsTheSecondBody) {
  RunOnEveryGpu([](RankContext& ctx) { EXPECT_EQ(ctx.world_size, 2); }, World(2));
  RunOnEveryGpu(
      [](RankContext& ctx) {
        EXPECT_EQ(ctx.world_size, 4);
        EXPECT_TRUE(ctx.bootstrap.Barrier("multiprocess_test_util_test.second_body").ok());
      },
      World(4));
}

// In the tests below that expect a failure, the children run under the same
// EXPECT_NONFATAL_FAILURE (they re-enter the test), but exit inside RunOnEveryGpu: only the
// parent's check counts.
void FailingBody(RankContext& ctx) {
  if (ctx.rank == 1) ADD_FAILURE() << "planted failure on rank one";
}

TEST(MultiProcessTest, ChildFailuresReachTheParentWithTheirRank) {
  EXPECT_NONFATAL_FAILURE(RunOnEveryGpu(FailingBody, World(2)),
                          "[rank 1] Failed\nplanted failure on rank one");
}

TEST(MultiProcessTest, StuckChildIsKilledAndItsLogShown) {
  MultiProcessTestOptions options = World(2);
  options.timeout = absl::Seconds(2);
  options.final_barrier = false;  // rank 0 finishes; only rank 1 is stuck
  const absl::Time start = absl::Now();
  EXPECT_NONFATAL_FAILURE(RunOnEveryGpu(
                              [](RankContext& ctx) {
                                if (ctx.rank == 1) {
                                  std::printf("rank one is about to hang\n");
                                  std::fflush(stdout);
                                  absl::SleepFor(absl::Hours(1));
                                }
                              },
                              options),
                          "rank one is about to hang");
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST(MultiProcessTest, CrashingChildFailsTheParent) {
  EXPECT_NONFATAL_FAILURE(RunOnEveryGpu(
                              [](RankContext& ctx) {
                                if (ctx.rank == 0) std::abort();
                              },
                              [] {
                                MultiProcessTestOptions o = World(2);
                                o.final_barrier = false;
                                return o;
                              }()),
                          "rank 0 was ended by signal");
}

TEST(MultiProcessTest, IntendedExitIsNotAFailure) {
  MultiProcessTestOptions options = World(2);
  options.final_barrier = false;
  RunOnEveryGpu(
      [](RankContext& ctx) {
        if (ctx.rank == 1) ctx.ExitProcessNow();
        // Rank 0 sees its peer go away.
        EXPECT_FALSE(ctx.bootstrap.AllGather("x", "multiprocess_test_util_test.after_exit").ok());
      },
      options);
}

TEST(MultiProcessTest, ExitWithoutFinishingFailsTheParent) {
  EXPECT_NONFATAL_FAILURE(RunOnEveryGpu(
                              [](RankContext& ctx) {
                                if (ctx.rank == 1) _exit(0);
                              },
                              [] {
                                MultiProcessTestOptions o;
                                o.world_size = 2;
                                o.final_barrier = false;
                                return o;
                              }()),
                          "before finishing its body");
}

TEST(MultiProcessTest, SkipInEveryRankSkipsTheParent) {
  RunOnEveryGpu([](RankContext&) { GTEST_SKIP() << "nothing to do here"; }, World(2));
  EXPECT_TRUE(IsSkipped());
}

}  // namespace
}  // namespace testing
}  // namespace kiln
