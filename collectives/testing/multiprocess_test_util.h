// Multi-process gtest tests, one process per GPU: the test body runs once in each child, its
// EXPECT/ASSERT failures come back to the parent test (as "[rank r] ..." at the child's file and
// line), a child that crashes, exits early or hangs past the timeout fails the parent test with
// the end of that child's log, and a child that skipped makes the parent skip.
//
//   TEST(CustomAllReduceMultiGpuTest, MatchesNccl) {
//     KILN_REQUIRE_GPUS(2);
//     kiln::testing::RunOnEveryGpu([](kiln::testing::RankContext& ctx) {
//       ASSERT_EQ(cudaSetDevice(ctx.device()), cudaSuccess);
//       auto comm = kiln::AutoCommunicator::Create(ctx.bootstrap, ctx.device(), config);
//       ASSERT_TRUE(comm.ok()) << comm.status();
//       ...
//     });
//   }
//
// How it works: the parent re-executes the test binary once per rank with
// --gtest_filter=<this test> (collectives/testing/process_group.h); in each child the same test
// reaches the same RunOnEveryGpu call (matched by its order within the test, so a test may call
// it several times), runs the body with a connected HostBootstrap, reports and exits. The world
// size is $KILN_TEST_WORLD_SIZE when set, else the number of visible GPUs, so the same binary
// runs at 2, 4 or 8. The body must synchronise its own GPU work before returning; by default
// the ranks meet at a barrier after the body, so no rank frees memory a peer still reads.
// Call from the test's main thread.
#ifndef KILN_COLLECTIVES_TESTING_MULTIPROCESS_TEST_UTIL_H_
#define KILN_COLLECTIVES_TESTING_MULTIPROCESS_TEST_UTIL_H_

#include <functional>

#include "absl/time/time.h"
#include "collectives/host_bootstrap.h"

namespace kiln {
namespace testing {

// What the body of one rank sees.
struct RankContext {
  int rank = 0;
  int world_size = 0;
  HostBootstrap& bootstrap;  // owned by the harness, valid during the body

  // Returns the GPU of this rank (its rank: one process per GPU, all GPUs visible).
  int device() const { return rank; }

  // Ends this process at once, as a peer that dies mid-job would; failures recorded so far are
  // still reported, and the parent treats this exit as intended.
  [[noreturn]] void ExitProcessNow();
};

struct MultiProcessTestOptions {
  int world_size = 0;                           // 0: TestWorldSize()
  absl::Duration timeout = absl::Seconds(180);  // then every child still running is killed
  bool final_barrier = true;                    // meet after the body (off when a rank exits)
};

// Returns $KILN_TEST_WORLD_SIZE if set, else the number of visible GPUs.
int TestWorldSize();

// Runs `body` in world_size child processes, one per rank, and reports their results into the
// current test (see the file comment). Must be called from a TEST body.
void RunOnEveryGpu(const std::function<void(RankContext&)>& body,
                   const MultiProcessTestOptions& options = MultiProcessTestOptions());

}  // namespace testing
}  // namespace kiln

#endif  // KILN_COLLECTIVES_TESTING_MULTIPROCESS_TEST_UTIL_H_
