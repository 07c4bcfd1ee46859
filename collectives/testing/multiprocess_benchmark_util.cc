#include "collectives/testing/multiprocess_benchmark_util.h"

#include <cstdio>
#include <vector>

#include "runtime/cuda/device_info.h"

namespace kiln {
namespace testing {
namespace {

int RankMain(const BenchmarkGroupOptions& options,
             const std::function<absl::StatusOr<int>(ProcessGroupMember&)>& rank_main) {
  absl::StatusOr<ProcessGroupMember> member = JoinProcessGroup(options.bootstrap_timeout);
  if (!member.ok()) {
    std::fprintf(stderr, "%s: %s\n", options.name.c_str(), member.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<int> code = rank_main(*member);
  if (!code.ok()) {
    std::fprintf(stderr, "%s rank %d: %s\n", options.name.c_str(), member->rank,
                 code.status().ToString().c_str());
    return 1;
  }
  return *code;
}

int ParentMain(int argc, char** argv, const BenchmarkGroupOptions& options) {
  const int world = options.world_size > 0 ? options.world_size : DeviceCount();
  if (world < 2) {
    std::fprintf(stderr, "%s: needs at least 2 GPUs (found %d); pass --world_size\n",
                 options.name.c_str(), world);
    return 2;
  }
  ProcessGroupOptions group;
  group.world_size = world;
  group.argv.assign(argv, argv + argc);
  group.passthrough_rank = 0;
  group.timeout = options.timeout;
  absl::StatusOr<std::vector<RankOutcome>> outcomes = RunProcessGroup(group);
  if (!outcomes.ok()) {
    std::fprintf(stderr, "%s: %s\n", options.name.c_str(), outcomes.status().ToString().c_str());
    return 1;
  }
  int rc = 0;
  for (const RankOutcome& o : *outcomes) {
    if (o.exited && o.exit_code == 0) continue;
    const bool wrong = o.exited && o.exit_code == kWrongValuesExitCode;
    if (rc != 1) rc = wrong ? kWrongValuesExitCode : 1;
    std::fprintf(stderr, "%s: %s%s\n", options.name.c_str(), DescribeOutcome(o).c_str(),
                 wrong ? " (wrong values)" : "");
    if (!o.log_path.empty()) {
      std::fprintf(stderr, "---- log of rank %d ----\n%s\n", o.rank,
                   ReadFileTail(o.log_path).c_str());
    }
  }
  return rc;
}

}  // namespace

int RunBenchmarkOnEveryGpu(
    int argc, char** argv, const BenchmarkGroupOptions& options,
    const std::function<absl::StatusOr<int>(ProcessGroupMember&)>& rank_main) {
  if (IsProcessGroupChild()) return RankMain(options, rank_main);
  return ParentMain(argc, argv, options);
}

}  // namespace testing
}  // namespace kiln
