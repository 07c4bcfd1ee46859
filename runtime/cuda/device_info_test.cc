// Host tests of DeviceInfo's argument checks (on any machine: they ask about devices that do not
// exist); the properties of real GPUs are tested in cuda_base_gpu_test.cc.
#include "runtime/cuda/device_info.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(DeviceInfoTest, DevicesThatDoNotExistAreInvalidArgument) {
  const int count = DeviceCount();
  EXPECT_GE(count, 0);
  EXPECT_EQ(DeviceInfo::Query(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceInfo::Query(count).status().code(), absl::StatusCode::kInvalidArgument);
  // A device is not "its own peer" when it does not exist.
  for (int device : {-1, count}) {
    absl::StatusOr<bool> self = CanAccessPeer(device, device);
    EXPECT_EQ(self.status().code(), absl::StatusCode::kInvalidArgument) << device;
    EXPECT_THAT(std::string(self.status().message()),
                HasSubstr("Device " + std::to_string(device) + " does not exist"));
  }
  EXPECT_EQ(CanAccessPeer(0, count).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CanAccessPeer(-3, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
