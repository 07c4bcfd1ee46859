#include "runtime/memory/capture_sizes.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CaptureSizesTest, DefaultListFollowsTheLadder) {
  std::vector<int> expected = {1, 2, 4};
  for (int s = 8; s <= 128; s += 8) expected.push_back(s);
  for (int s = 144; s <= 256; s += 16) expected.push_back(s);
  for (int s = 288; s <= 1024; s += 32) expected.push_back(s);
  EXPECT_EQ(DefaultCaptureSizes(1024), expected);
  EXPECT_EQ(expected.size(), 3u + 16u + 8u + 24u);
}

TEST(CaptureSizesTest, DefaultListIsCroppedAndEndsAtTheLimit) {
  EXPECT_EQ(DefaultCaptureSizes(256).size(), 27u);
  EXPECT_EQ(DefaultCaptureSizes(256).back(), 256);
  EXPECT_THAT(DefaultCaptureSizes(20), ElementsAre(1, 2, 4, 8, 16, 20));
  EXPECT_THAT(DefaultCaptureSizes(3), ElementsAre(1, 2, 3));
  EXPECT_THAT(DefaultCaptureSizes(1), ElementsAre(1));
  EXPECT_TRUE(DefaultCaptureSizes(0).empty());
  // Above the ladder's top the limit itself is still captured.
  EXPECT_EQ(DefaultCaptureSizes(2048).back(), 2048);
  EXPECT_EQ(DefaultCaptureSizes(2048)[DefaultCaptureSizes(2048).size() - 2], 1024);
}

TEST(CaptureSizesTest, EverySizeUpToTheLimitHasAGraph) {
  for (int limit : {1, 7, 100, 256, 300, 1000}) {
    std::vector<int> sizes = DefaultCaptureSizes(limit);
    for (int n = 1; n <= limit; ++n) {
      bool covered = false;
      for (int s : sizes) covered = covered || s >= n;
      EXPECT_TRUE(covered) << "limit " << limit << " batch " << n;
    }
  }
}

TEST(CaptureSizesTest, ValidateSortsAGoodList) {
  auto sizes = ValidateCaptureSizes({8, 1, 4}, 8, "max_num_seqs");
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_THAT(*sizes, ElementsAre(1, 4, 8));
}

TEST(CaptureSizesTest, ValidateNamesTheBadValue) {
  auto above = ValidateCaptureSizes({1, 300}, 256, "max_num_seqs");
  EXPECT_EQ(above.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(above.status().message()),
            "Capture size 300 exceeds max_num_seqs 256; remove it or raise max_num_seqs");
  auto zero = ValidateCaptureSizes({0, 2}, 256, "max_num_seqs");
  EXPECT_THAT(std::string(zero.status().message()), HasSubstr("Capture size 0 is not positive"));
  auto twice = ValidateCaptureSizes({4, 2, 4}, 256, "max_num_seqs");
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("Capture size 4 appears twice"));
}

}  // namespace
}  // namespace kiln
