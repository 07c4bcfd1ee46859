#include "collectives/testing/multiprocess_test_util.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "collectives/testing/process_group.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "runtime/cuda/device_info.h"

namespace kiln {
namespace testing {
namespace {

constexpr char kInvocationVar[] = "KILN_MPT_INVOCATION";

// Record kinds sent from a child to the parent.
constexpr char kFailure = 'F';
constexpr char kSkip = 'S';
constexpr char kDone = 'D';
constexpr char kExitedOnPurpose = 'X';

// While a child runs its body: failures of its own thread, and of other threads.
::testing::TestPartResultArray* child_results = nullptr;
::testing::TestPartResultArray* child_other_results = nullptr;

std::string Encode(char kind, const std::string& file, int line, const std::string& message) {
  std::string out(1, kind);
  const uint32_t sizes[2] = {static_cast<uint32_t>(file.size()),
                             static_cast<uint32_t>(message.size())};
  out.append(reinterpret_cast<const char*>(sizes), sizeof(sizes));
  out.append(reinterpret_cast<const char*>(&line), sizeof(line));
  out.append(file);
  out.append(message);
  return out;
}

bool Decode(const std::string& record, char* kind, std::string* file, int* line,
            std::string* message) {
  constexpr size_t kHeader = 1 + 2 * sizeof(uint32_t) + sizeof(int);
  if (record.size() < kHeader) return false;
  uint32_t sizes[2];
  *kind = record[0];
  std::memcpy(sizes, record.data() + 1, sizeof(sizes));
  std::memcpy(line, record.data() + 1 + sizeof(sizes), sizeof(int));
  if (record.size() != kHeader + sizes[0] + sizes[1]) return false;
  *file = record.substr(kHeader, sizes[0]);
  *message = record.substr(kHeader + sizes[0], sizes[1]);
  return true;
}

void SendResults(const ::testing::TestPartResultArray& results, int from) {
  for (int i = from; i < results.size(); ++i) {
    const ::testing::TestPartResult& r = results.GetTestPartResult(i);
    if (r.type() == ::testing::TestPartResult::kSuccess) continue;
    const char kind = r.type() == ::testing::TestPartResult::kSkip ? kSkip : kFailure;
    ReportRecord(Encode(kind, r.file_name() != nullptr ? r.file_name() : "", r.line_number(),
                        r.message()));
  }
}

// The index of this RunOnEveryGpu call within the current test.
int NextInvocation() {
  static std::string test;
  static int next = 0;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name =
      info != nullptr ? absl::StrCat(info->test_suite_name(), ".", info->name()) : "";
  if (name != test) {
    test = name;
    next = 0;
  }
  return next++;
}

[[noreturn]] void RunChild(const std::function<void(RankContext&)>& body,
                           const MultiProcessTestOptions& options) {
  absl::StatusOr<ProcessGroupMember> member = JoinProcessGroup();
  if (!member.ok()) {
    ReportRecord(Encode(kFailure, __FILE__, __LINE__,
                        absl::StrCat("Could not join the process group: ",
                                     member.status().ToString())));
    std::fflush(nullptr);
    _exit(1);
  }
  RankContext ctx{member->rank, member->world_size, *member->bootstrap};
  // Two reporters: one for this thread (it overrides any reporter an enclosing gtest macro set
  // for this thread, such as EXPECT_NONFATAL_FAILURE), one for threads the body starts.
  ::testing::TestPartResultArray other_threads;
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter all(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &other_threads);
    ::testing::ScopedFakeTestPartResultReporter mine(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    child_results = &results;
    child_other_results = &other_threads;
    body(ctx);
    child_results = nullptr;
    child_other_results = nullptr;
  }
  SendResults(results, 0);
  SendResults(other_threads, 0);
  if (options.final_barrier) {
    absl::Status barrier = member->bootstrap->Barrier("multiprocess_test.final_barrier");
    if (!barrier.ok()) {
      ReportRecord(Encode(kFailure, __FILE__, __LINE__,
                          absl::StrCat("Final barrier after the body failed: ",
                                       barrier.ToString())));
    }
  }
  ReportRecord(Encode(kDone, "", 0, ""));
  std::fflush(nullptr);
  _exit(0);
}

}  // namespace

void RankContext::ExitProcessNow() {
  if (child_results != nullptr) SendResults(*child_results, 0);
  if (child_other_results != nullptr) SendResults(*child_other_results, 0);
  ReportRecord(Encode(kExitedOnPurpose, "", 0, ""));
  std::fflush(nullptr);
  _exit(0);
}

int TestWorldSize() {
  const char* forced = std::getenv("KILN_TEST_WORLD_SIZE");
  int world = 0;
  if (forced != nullptr && absl::SimpleAtoi(forced, &world) && world > 0) return world;
  return DeviceCount();
}

void RunOnEveryGpu(const std::function<void(RankContext&)>& body,
                   const MultiProcessTestOptions& options) {
  const int invocation = NextInvocation();
  if (IsProcessGroupChild()) {
    const char* wanted = std::getenv(kInvocationVar);
    int wanted_index = -1;
    if (wanted != nullptr && absl::SimpleAtoi(wanted, &wanted_index) &&
        wanted_index == invocation) {
      RunChild(body, options);
    }
    return;  // another RunOnEveryGpu call of this test is the one this child runs
  }

  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  ASSERT_NE(info, nullptr) << "RunOnEveryGpu must be called from a TEST body";
  ProcessGroupOptions group;
  group.world_size = options.world_size > 0 ? options.world_size : TestWorldSize();
  ASSERT_GE(group.world_size, 1) << "No GPUs and no KILN_TEST_WORLD_SIZE";
  group.timeout = options.timeout;
  group.argv = {"", absl::StrCat("--gtest_filter=", info->test_suite_name(), ".", info->name()),
                "--gtest_color=no"};
  group.env = {{kInvocationVar, absl::StrCat(invocation)}};
  absl::StatusOr<std::vector<RankOutcome>> outcomes = RunProcessGroup(group);
  ASSERT_TRUE(outcomes.ok()) << outcomes.status();

  int skipped = 0;
  std::string skip_reason;
  for (const RankOutcome& o : *outcomes) {
    bool done = false;
    bool exited_on_purpose = false;
    bool rank_skipped = false;
    for (const std::string& record : o.records) {
      char kind = 0;
      std::string file, message;
      int line = 0;
      if (!Decode(record, &kind, &file, &line, &message)) {
        ADD_FAILURE() << "Rank " << o.rank << " sent a malformed record";
        continue;
      }
      if (kind == kFailure) {
        ADD_FAILURE_AT(file.c_str(), line) << "[rank " << o.rank << "] " << message;
      } else if (kind == kSkip) {
        rank_skipped = true;
        skip_reason = message;
      } else if (kind == kDone) {
        done = true;
      } else if (kind == kExitedOnPurpose) {
        exited_on_purpose = true;
      }
    }
    if (rank_skipped) ++skipped;
    const bool clean_exit = o.exited && o.exit_code == 0;
    if (!clean_exit || !(done || exited_on_purpose)) {
      const std::string log =
          o.log_path.empty() ? "(its output went to this process's stdout)"
                             : ReadFileTail(o.log_path);
      ADD_FAILURE() << DescribeOutcome(o)
                    << (clean_exit ? " before finishing its body" : "")
                    << "\n---- end of the log of rank " << o.rank << " (" << o.log_path
                    << ") ----\n"
                    << log;
    }
  }
  if (skipped > 0 && skipped == static_cast<int>(outcomes->size())) {
    GTEST_SKIP() << "Every rank skipped: " << skip_reason;
  }
}

}  // namespace testing
}  // namespace kiln
