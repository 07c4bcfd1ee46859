// Host tests of NcclCommunicator's argument checks, which run before any CUDA or NCCL call; the
// communicator itself is tested on GPUs (custom_allreduce_multigpu_test.cc).
#include "collectives/nccl_communicator.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collectives/host_bootstrap.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(NcclCommunicatorTest, CreateRefusesATimeoutThatIsNotPositive) {
  absl::StatusOr<std::unique_ptr<HostBootstrap>> boot =
      HostBootstrap::FromConnectedSockets(0, 1, {}, absl::Seconds(10));
  ASSERT_TRUE(boot.ok()) << boot.status();
  for (absl::Duration timeout : {absl::ZeroDuration(), absl::Seconds(-1)}) {
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
        NcclCommunicator::Create(**boot, 0, timeout);
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
    EXPECT_THAT(std::string(comm.status().message()), HasSubstr("must be positive"));
  }
}

}  // namespace
}  // namespace kiln
