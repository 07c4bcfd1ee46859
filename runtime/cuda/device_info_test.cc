// Host tests of DeviceInfo's argument checks (on any machine: they ask about devices that do not
// exist); the properties of real GPUs are tested in cuda_base_gpu_test.cc.
#include "runtime/cuda/device_info.h"

#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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


// Every ordinal against every small count, and the int range's ends: OK exactly for 0 .. count-1,
// else InvalidArgument naming the ordinal and what is visible; never an overflow (count - 1 for
// INT_MIN) under UBSan.
TEST(DeviceInfoTest, CheckDeviceOrdinalOverTheIntRange) {
  constexpr int kMin = std::numeric_limits<int>::min();
  constexpr int kMax = std::numeric_limits<int>::max();
  std::vector<int> values = {kMin, kMin + 1, -2, -1, 0, 1, 2, 7, 8, 9, kMax - 1, kMax};
  std::mt19937 rng(11);
  for (int i = 0; i < 20; ++i) values.push_back(static_cast<int>(rng()));
  for (int count : values) {
    for (int device : values) {
      const absl::Status s = CheckDeviceOrdinal(device, count);
      const bool exists = device >= 0 && device < count;
      ASSERT_EQ(s.ok(), exists) << device << " of " << count;
      if (exists) continue;
      ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      const std::string message(s.message());
      ASSERT_THAT(message, HasSubstr(absl::StrCat("Device ", device, " does not exist")));
      if (count <= 0) {
        ASSERT_THAT(message, HasSubstr("no CUDA device is visible; check the GPU, its driver"));
      } else {
        ASSERT_THAT(message, HasSubstr(absl::StrCat("(", count, " visible); pick 0..", count - 1)));
      }
    }
  }
  // On a machine without a GPU, Query says so rather than "pick 0..-1".
  if (DeviceCount() == 0) {
    const absl::Status none = DeviceInfo::Query(0).status();
    EXPECT_THAT(std::string(none.message()), HasSubstr("no CUDA device is visible"));
  }
}

// ToString of any properties, against the format it documents.
TEST(DeviceInfoTest, ToStringOfAnyProperties) {
  std::mt19937_64 rng(12);
  for (int i = 0; i < 2000; ++i) {
    DeviceInfo info;
    info.name = std::string(rng() % 64, 'G');
    info.cc_major = static_cast<int>(rng());
    info.cc_minor = static_cast<int>(rng() % 10);
    info.sm_count = static_cast<int>(rng());
    info.l2_bytes = i % 10 == 0 ? std::numeric_limits<size_t>::max() : rng() % (size_t{1} << 40);
    info.total_memory_bytes = i % 7 == 0 ? std::numeric_limits<size_t>::max() : rng();
    char want[512];
    std::snprintf(want, sizeof(want), "%s (sm_%d%d, %d SMs, %.0f MiB L2, %.1f GiB)",
                  info.name.c_str(), info.cc_major, info.cc_minor, info.sm_count,
                  static_cast<double>(info.l2_bytes) / 1048576.0,
                  static_cast<double>(info.total_memory_bytes) / 1073741824.0);
    ASSERT_EQ(info.ToString(), want);
  }
}
}  // namespace
}  // namespace kiln
