// Runs RunBenchmarkOnEveryGpu's parent side for real (two ranks of this binary, no GPU needed:
// the world size is given) and checks the exit code it makes of how the ranks ended. A rank
// re-runs main with the scenario as argv[1]; main sends it to RunScenario instead of gtest.
#include "collectives/testing/multiprocess_benchmark_util.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "collectives/testing/process_group.h"
#include "gtest/gtest.h"

namespace kiln {
namespace testing {
namespace {

std::string self_path;  // argv[0] of the parent

BenchmarkGroupOptions Options(int world_size) {
  BenchmarkGroupOptions options;
  options.name = "multiprocess_benchmark_util_test";
  options.world_size = world_size;
  options.timeout = absl::Seconds(60);
  options.bootstrap_timeout = absl::Seconds(30);
  return options;
}

// What a rank does in each scenario.
absl::StatusOr<int> ScenarioBody(const std::string& scenario, ProcessGroupMember& member) {
  // Every scenario first proves the group is connected.
  absl::StatusOr<std::vector<std::string>> all = member.bootstrap->AllGather(
      absl::StrCat(member.rank), "multiprocess_benchmark_util_test.ranks");
  if (!all.ok()) return all.status();
  if (static_cast<int>(all->size()) != member.world_size || (*all)[1] != "1") {
    return absl::InternalError("the ranks did not exchange their numbers");
  }
  if (scenario == "wrong" && member.rank == 1) return kWrongValuesExitCode;
  if (scenario == "error" && member.rank == 1) return absl::InternalError("rank 1 failed");
  if (scenario == "mixed") {
    if (member.rank == 0) return kWrongValuesExitCode;
    return absl::InternalError("rank 1 failed");
  }
  return 0;
}

int RunScenario(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  return RunBenchmarkOnEveryGpu(argc, argv, Options(2), [&](ProcessGroupMember& member) {
    return ScenarioBody(scenario, member);
  });
}

// Starts the ranks of `scenario` and returns the parent's exit code.
int Parent(const std::string& scenario, int world_size = 2) {
  std::vector<std::string> args = {self_path, scenario};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return RunBenchmarkOnEveryGpu(static_cast<int>(argv.size()), argv.data(), Options(world_size),
                                [](ProcessGroupMember&) -> absl::StatusOr<int> {
                                  return absl::InternalError("the parent ran a rank's body");
                                });
}

TEST(MultiprocessBenchmarkUtilTest, EveryRankSucceeding) { EXPECT_EQ(Parent("ok"), 0); }

TEST(MultiprocessBenchmarkUtilTest, WrongValuesOnOneRank) {
  EXPECT_EQ(Parent("wrong"), kWrongValuesExitCode);
}

TEST(MultiprocessBenchmarkUtilTest, ErrorOnOneRank) { EXPECT_EQ(Parent("error"), 1); }

TEST(MultiprocessBenchmarkUtilTest, AnErrorOutweighsWrongValues) { EXPECT_EQ(Parent("mixed"), 1); }

TEST(MultiprocessBenchmarkUtilTest, FewerThanTwoRanksStartNothing) {
  EXPECT_EQ(Parent("ok", 1), 2);
}

}  // namespace
}  // namespace testing
}  // namespace kiln

int main(int argc, char** argv) {
  if (kiln::testing::IsProcessGroupChild()) return kiln::testing::RunScenario(argc, argv);
  kiln::testing::self_path = argv[0];
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
