// The main of a benchmark binary that runs one process per GPU: the parent starts the ranks
// (collectives/testing/process_group.h), waits for them and turns how they ended into an exit
// code; each rank joins the group and runs the benchmark body. Rank 0 prints to our stdout, the
// others to logs whose ends are printed when they fail.
//
//   int main(int argc, char** argv) {
//     absl::ParseCommandLine(argc, argv);
//     kiln::testing::BenchmarkGroupOptions options;
//     options.name = "allreduce_benchmark";
//     options.world_size = absl::GetFlag(FLAGS_world_size);  // 0: every visible GPU
//     return kiln::testing::RunBenchmarkOnEveryGpu(
//         argc, argv, options, [](kiln::testing::ProcessGroupMember& member) {
//           return RunRank(member);  // absl::StatusOr<int>: the rank's exit code
//         });
//   }
//
// Not thread-safe; call once, from main, after parsing flags (the ranks re-run main with the
// same arguments).
#ifndef KILN_COLLECTIVES_TESTING_MULTIPROCESS_BENCHMARK_UTIL_H_
#define KILN_COLLECTIVES_TESTING_MULTIPROCESS_BENCHMARK_UTIL_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/testing/process_group.h"

namespace kiln {
namespace testing {

// Exit code of a rank whose results were wrong: the parent reports "wrong values" for it and
// returns this code (other failures return 1).
inline constexpr int kWrongValuesExitCode = 3;

struct BenchmarkGroupOptions {
  std::string name = "benchmark";                         // the program, in messages
  int world_size = 0;                                     // ranks; 0 = every visible GPU
  absl::Duration timeout = absl::Seconds(540);            // then ranks still running are killed
  absl::Duration bootstrap_timeout = absl::Seconds(120);  // a rank's wait to join its group
};

// In the process the user started: starts options.world_size ranks running this binary with
// `argv`, waits up to options.timeout and returns 0 when every rank exited with 0,
// kWrongValuesExitCode when the only failures were ranks reporting wrong values, 2 when there
// are fewer than 2 ranks (none starts), 1 otherwise; each failed rank is described on stderr
// with the end of its log.
// In a rank: joins the group and returns `rank_main`'s exit code, or 1 after printing its error
// (or the joining error) on stderr.
int RunBenchmarkOnEveryGpu(
    int argc, char** argv, const BenchmarkGroupOptions& options,
    const std::function<absl::StatusOr<int>(ProcessGroupMember&)>& rank_main);

}  // namespace testing
}  // namespace kiln

#endif  // KILN_COLLECTIVES_TESTING_MULTIPROCESS_BENCHMARK_UTIL_H_
