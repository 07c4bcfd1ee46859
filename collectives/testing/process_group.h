// Launches one process per GPU (or per rank) on this host and connects them: the parent forks
// and re-executes its own binary world_size times, hands each child its rank and connected
// bootstrap sockets (star around rank 0) through inherited descriptors, kills children that do
// not finish in time, and returns how each ended with the path of its log. No gtest here: the
// all-reduce benchmark uses it directly; multiprocess_test_util.h builds gtest tests on it.
//
//   int main(int argc, char** argv) {
//     if (kiln::testing::IsProcessGroupChild()) {
//       absl::StatusOr<kiln::testing::ProcessGroupMember> me = kiln::testing::JoinProcessGroup();
//       ... cudaSetDevice(me->rank); use *me->bootstrap ...
//       return 0;
//     }
//     kiln::testing::ProcessGroupOptions options;
//     options.world_size = 2;
//     options.argv = {argv, argv + argc};
//     options.passthrough_rank = 0;                 // rank 0 prints to our stdout
//     absl::StatusOr<std::vector<kiln::testing::RankOutcome>> outcomes =
//         kiln::testing::RunProcessGroup(options);
//     ...
//   }
//
// Why re-execute instead of a bare fork: CUDA does not survive fork() in a process that already
// initialised it (the parent usually has, if only to count GPUs); a fresh image has no such
// state. The child's environment gets KILN_PG_* variables (rank, world size, descriptors) and
// NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 (NVLink
// multicast stays off on shared hosts). Children report structured records to the parent
// through a pipe (ReportRecord); the parent keeps them per rank. Not thread-safe.
#ifndef KILN_COLLECTIVES_TESTING_PROCESS_GROUP_H_
#define KILN_COLLECTIVES_TESTING_PROCESS_GROUP_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collectives/host_bootstrap.h"

namespace kiln {
namespace testing {

struct ProcessGroupOptions {
  int world_size = 0;                  // number of children (ranks), >= 1
  std::vector<std::string> argv;       // the children's argv; argv[0] is replaced by our binary
  std::vector<std::pair<std::string, std::string>> env;  // extra environment for every child
  absl::Duration timeout = absl::Seconds(240);  // after this, children still running are killed
  int passthrough_rank = -1;           // this rank writes to our stdout/stderr; others to logs
  std::string log_dir;                 // default: $TEST_TMPDIR, else /tmp
};

// How one child ended.
struct RankOutcome {
  int rank = 0;
  bool exited = false;            // exited normally (then exit_code is meaningful)
  int exit_code = -1;
  int signal = 0;                 // the signal that ended it, if any
  bool killed_after_timeout = false;
  std::string log_path;           // its stdout+stderr ("" for the passthrough rank)
  std::vector<std::string> records;  // what it sent with ReportRecord, in order
};

// Forks and re-executes this binary once per rank, waits up to options.timeout for all of them
// (then kills the rest with SIGKILL) and returns one outcome per rank. Errors only when the
// children could not be started.
absl::StatusOr<std::vector<RankOutcome>> RunProcessGroup(const ProcessGroupOptions& options);

// Returns true in a process started by RunProcessGroup.
bool IsProcessGroupChild();

// A child's view of its group.
struct ProcessGroupMember {
  int rank = 0;
  int world_size = 0;
  std::unique_ptr<HostBootstrap> bootstrap;  // connected to every other rank (through rank 0)
};

// Builds this child's member from its environment. FailedPrecondition outside a child.
absl::StatusOr<ProcessGroupMember> JoinProcessGroup(
    absl::Duration bootstrap_timeout = absl::Seconds(120));

// Sends one record (any bytes) to the parent, which appends it to this rank's outcome.records.
// No-op outside a child. Call from one thread at a time (records must not interleave).
void ReportRecord(absl::string_view record);

// Returns the last `max_bytes` of the file at `path` ("" if unreadable).
std::string ReadFileTail(const std::string& path, size_t max_bytes = 8192);

// Returns a one-line description: "rank 1 exited with code 3", "rank 0 was killed by signal 9
// after the 240s timeout".
std::string DescribeOutcome(const RankOutcome& outcome);

}  // namespace testing
}  // namespace kiln

#endif  // KILN_COLLECTIVES_TESTING_PROCESS_GROUP_H_
