#include "graph/capture_sizes.h"

#include <algorithm>
#include <climits>
#include <iterator>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The smallest size >= n by a linear scan: the reference the table must match.
std::optional<int> ScanPadded(const std::vector<int>& ascending, int n) {
  if (n < 1) return std::nullopt;
  for (int s : ascending) {
    if (s >= n) return s;
  }
  return std::nullopt;
}

void ExpectEveryNPadsCorrectly(const CaptureSizes& sizes) {
  const int max = sizes.max_size();
  for (int n = -2; n <= max + 3; ++n) {
    ASSERT_EQ(sizes.PaddedSize(n), ScanPadded(sizes.sizes(), n)) << "n = " << n;
  }
  EXPECT_EQ(sizes.PaddedSize(max), max);
  EXPECT_EQ(sizes.PaddedSize(max + 1), std::nullopt);
  EXPECT_EQ(sizes.PaddedSize(0), std::nullopt);
}

TEST(CaptureSizesTest, DefaultDecodeListUpTo1024) {
  std::vector<int> sizes = CaptureSizes::DefaultDecodeSizes(1024);
  ASSERT_EQ(sizes.size(), 51u);
  EXPECT_THAT(std::vector<int>(sizes.begin(), sizes.begin() + 5), ElementsAre(1, 2, 4, 8, 16));
  EXPECT_EQ(sizes[18], 128);
  EXPECT_EQ(sizes[19], 144);
  EXPECT_EQ(sizes[26], 256);
  EXPECT_EQ(sizes[27], 288);
  EXPECT_EQ(sizes.back(), 1024);
  EXPECT_TRUE(std::is_sorted(sizes.begin(), sizes.end()));
  for (size_t i = 19; i <= 26; ++i) EXPECT_EQ(sizes[i] - sizes[i - 1], 16) << i;
  for (size_t i = 27; i < sizes.size(); ++i) EXPECT_EQ(sizes[i] - sizes[i - 1], 32) << i;
}

TEST(CaptureSizesTest, DefaultDecodeIsCroppedAndClosedAtMaxNumSeqs) {
  EXPECT_THAT(CaptureSizes::DefaultDecodeSizes(1), ElementsAre(1));
  EXPECT_THAT(CaptureSizes::DefaultDecodeSizes(3), ElementsAre(1, 2, 3));
  EXPECT_THAT(CaptureSizes::DefaultDecodeSizes(20), ElementsAre(1, 2, 4, 8, 16, 20));
  std::vector<int> at256 = CaptureSizes::DefaultDecodeSizes(256);
  EXPECT_EQ(at256.size(), 27u);
  EXPECT_EQ(at256.back(), 256);
  std::vector<int> at300 = CaptureSizes::DefaultDecodeSizes(300);
  EXPECT_THAT(std::vector<int>(at300.end() - 3, at300.end()), ElementsAre(256, 288, 300));
  std::vector<int> at2000 = CaptureSizes::DefaultDecodeSizes(2000);
  EXPECT_THAT(std::vector<int>(at2000.end() - 2, at2000.end()), ElementsAre(1024, 2000));
  EXPECT_TRUE(CaptureSizes::DefaultDecodeSizes(0).empty());
  EXPECT_TRUE(CaptureSizes::DefaultDecodeSizes(CaptureSizes::kMaxLimit + 1).empty());
}

TEST(CaptureSizesTest, DefaultPrefillList) {
  EXPECT_THAT(CaptureSizes::DefaultPrefillSizes(),
              ElementsAre(16, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512));
  EXPECT_THAT(CaptureSizes::DefaultPrefillSizes(100), ElementsAre(16, 32, 48, 64, 96, 100));
  EXPECT_THAT(CaptureSizes::DefaultPrefillSizes(8), ElementsAre(8));
  std::vector<int> at2048 = CaptureSizes::DefaultPrefillSizes(2048);
  EXPECT_THAT(std::vector<int>(at2048.end() - 2, at2048.end()), ElementsAre(512, 2048));
}

TEST(CaptureSizesTest, EveryNPadsToTheSmallestSizeAtLeastN) {
  for (int max_num_seqs : {1, 2, 3, 7, 8, 9, 100, 128, 129, 256, 257, 1000, 1024, 4096}) {
    absl::StatusOr<CaptureSizes> decode = CaptureSizes::Decode(max_num_seqs);
    ASSERT_TRUE(decode.ok()) << decode.status();
    EXPECT_EQ(decode->max_size(), max_num_seqs);
    ExpectEveryNPadsCorrectly(*decode);
  }
  for (int max_tokens : {1, 16, 17, 500, 512, 8192}) {
    absl::StatusOr<CaptureSizes> prefill = CaptureSizes::Prefill(max_tokens);
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    EXPECT_EQ(prefill->max_size(), max_tokens);
    ExpectEveryNPadsCorrectly(*prefill);
  }
}

TEST(CaptureSizesTest, SpotValues) {
  absl::StatusOr<CaptureSizes> decode = CaptureSizes::Decode(256);
  ASSERT_TRUE(decode.ok());
  EXPECT_EQ(decode->PaddedSize(1), 1);
  EXPECT_EQ(decode->PaddedSize(3), 4);
  EXPECT_EQ(decode->PaddedSize(5), 8);
  EXPECT_EQ(decode->PaddedSize(129), 144);
  EXPECT_EQ(decode->PaddedSize(256), 256);
  EXPECT_EQ(decode->PaddedSize(257), std::nullopt);
}

TEST(CaptureSizesTest, RandomUserListsPadCorrectly) {
  std::mt19937 rng(20261127);  // seeded: a failure reproduces
  for (int trial = 0; trial < 50; ++trial) {
    const int limit = std::uniform_int_distribution<int>(1, 3000)(rng);
    std::vector<int> pool(limit);
    for (int i = 0; i < limit; ++i) pool[i] = i + 1;
    std::shuffle(pool.begin(), pool.end(), rng);
    pool.resize(std::uniform_int_distribution<int>(1, std::min(limit, 60))(rng));
    absl::StatusOr<CaptureSizes> sizes = CaptureSizes::FromList(pool, limit, "max_num_seqs");
    ASSERT_TRUE(sizes.ok()) << sizes.status();
    EXPECT_EQ(sizes->sizes().size(), pool.size());
    EXPECT_TRUE(std::is_sorted(sizes->sizes().begin(), sizes->sizes().end()));
    ExpectEveryNPadsCorrectly(*sizes);
  }
}

TEST(CaptureSizesTest, UserListIsSortedAndNotExtended) {
  absl::StatusOr<CaptureSizes> sizes = CaptureSizes::Decode(256, {64, 1, 16});
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_THAT(sizes->sizes(), ElementsAre(1, 16, 64));
  EXPECT_THAT(sizes->LargestFirst(), ElementsAre(64, 16, 1));
  EXPECT_EQ(sizes->PaddedSize(65), std::nullopt);  // above the user's largest: eager
}

TEST(CaptureSizesTest, InvalidListsNameTheBadValue) {
  absl::Status too_big = CaptureSizes::Decode(256, {8, 300}).status();
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(too_big.message(),
            "Capture size 300 exceeds max_num_seqs 256; remove it or raise max_num_seqs");

  absl::Status zero = CaptureSizes::Decode(256, {8, 0}).status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(zero.message()), HasSubstr("Capture size 0 is not positive"));

  absl::Status negative = CaptureSizes::Prefill(512, {-16}).status();
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(negative.message()), HasSubstr("-16"));

  absl::Status duplicate = CaptureSizes::Decode(256, {8, 16, 8}).status();
  EXPECT_EQ(duplicate.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(duplicate.message()), HasSubstr("Capture size 8 appears more than once"));

  absl::Status prefill = CaptureSizes::Prefill(512, {1024}).status();
  EXPECT_THAT(std::string(prefill.message()), HasSubstr("exceeds max_num_tokens 512"));

  absl::Status bad_limit = CaptureSizes::Decode(0).status();
  EXPECT_EQ(bad_limit.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_limit.message()), HasSubstr("max_num_seqs 0 is out of range"));

  absl::Status empty = CaptureSizes::FromList({}, 16, "max_num_seqs").status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
}

// A limit above kMaxLimit refuses only the default list (which ends at the limit); a given list
// of smaller sizes is fine under it, since the largest size bounds the padding table (e.g.
// explicit prefill budgets under max_num_batched_tokens 131072).
TEST(CaptureSizesTest, ListsUnderALimitAboveTheTableBound) {
  absl::StatusOr<CaptureSizes> prefill = CaptureSizes::Prefill(131072, {64, 16});
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_EQ(prefill->sizes(), std::vector<int>({16, 64}));
  EXPECT_EQ(prefill->PaddedSize(17), 64);
  EXPECT_EQ(prefill->PaddedSize(65), std::nullopt);
  absl::StatusOr<CaptureSizes> decode =
      CaptureSizes::FromList({1, 2, 4}, 100000, "max_num_seqs");
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_EQ(decode->max_size(), 4);

  absl::Status huge = CaptureSizes::Decode(100000, {8, 70000}).status();
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(huge.message()), HasSubstr("Capture size 70000 is above 65536"));
  EXPECT_EQ(CaptureSizes::FromList({1}, -3, "max_num_seqs").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CaptureSizes::Decode(100000).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CaptureSizesTest, ToStringShortensLongLists) {
  absl::StatusOr<CaptureSizes> small = CaptureSizes::Decode(8);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->ToString(), "1, 2, 4, 8");
  absl::StatusOr<CaptureSizes> large = CaptureSizes::Decode(1024);
  ASSERT_TRUE(large.ok());
  EXPECT_EQ(large->ToString(4), "1, 2, 4, ..., 1024 (51 sizes)");
}

// Every limit a caller can pass, in and out of [1, kMaxLimit]: the default lists are ascending,
// unique, within [1, limit] and end at the limit, and Decode/Prefill take exactly the limits the
// lists do.
TEST(CaptureSizesTest, SweepDefaultListsOverEveryLimit) {
  const int max = CaptureSizes::kMaxLimit;
  std::vector<int> limits = {INT_MIN, INT_MIN + 1, -max,        -1,     0,
                             max + 1, max + 2,     INT_MAX - 1, INT_MAX};
  for (int limit = 1; limit <= max; ++limit) limits.push_back(limit);
  for (int limit : limits) {
    const bool valid = limit >= 1 && limit <= max;
    const std::vector<int> decode = CaptureSizes::DefaultDecodeSizes(limit);
    const std::vector<int> prefill = CaptureSizes::DefaultPrefillSizes(limit);
    for (const std::vector<int>* list : {&decode, &prefill}) {
      if (!valid) {
        ASSERT_TRUE(list->empty()) << "limit " << limit;
        continue;
      }
      ASSERT_FALSE(list->empty()) << "limit " << limit;
      ASSERT_GE(list->front(), 1) << "limit " << limit;
      ASSERT_EQ(list->back(), limit) << "limit " << limit;
      ASSERT_TRUE(std::adjacent_find(list->begin(), list->end(),
                                     [](int a, int b) { return a >= b; }) == list->end())
          << "limit " << limit << ": not strictly ascending";
      ASSERT_LE(list->size(), 52u) << "limit " << limit;
    }
    if (valid && limit % 97 != 0 && limit > 1100) continue;  // Decode/Prefill: a sample
    absl::StatusOr<CaptureSizes> d = CaptureSizes::Decode(limit);
    absl::StatusOr<CaptureSizes> p = CaptureSizes::Prefill(limit);
    ASSERT_EQ(d.ok(), valid) << "limit " << limit << ": " << d.status();
    ASSERT_EQ(p.ok(), valid) << "limit " << limit << ": " << p.status();
    if (valid) {
      ASSERT_EQ(d->sizes(), decode);
      ASSERT_EQ(p->sizes(), prefill);
      ASSERT_EQ(d->PaddedSize(limit), limit);
      ASSERT_EQ(d->PaddedSize(limit + 1), std::nullopt);
    } else {
      ASSERT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
      ASSERT_THAT(std::string(d.status().message()),
                  HasSubstr("max_num_seqs " + std::to_string(limit) + " is out of range"));
      ASSERT_THAT(std::string(p.status().message()),
                  HasSubstr("max_num_tokens " + std::to_string(limit) + " is out of range"));
    }
  }
}

// The message FromList must give for `sizes` under `limit`, found by the rules in the header
// (the first bad size in the caller's order); empty when the list is valid.
std::string ExpectedError(const std::vector<int>& sizes, int limit) {
  if (limit < 1) return "max_num_seqs " + std::to_string(limit) + " is out of range";
  if (sizes.empty()) return "The capture size list is empty";
  std::set<int> seen;
  for (int s : sizes) {
    const std::string prefix = "Capture size " + std::to_string(s);
    if (s < 1) return prefix + " is not positive";
    if (s > limit) return prefix + " exceeds max_num_seqs " + std::to_string(limit);
    if (s > CaptureSizes::kMaxLimit) return prefix + " is above 65536";
    if (!seen.insert(s).second) return prefix + " appears more than once";
  }
  return "";
}

// Random and adversarial lists (empty, unsorted, duplicated, zero, negative, above the limit and
// the table bound, INT_MIN/INT_MAX) under random and adversarial limits: a valid list comes back
// sorted and pads every n to the smallest size >= n; any other is InvalidArgument naming the
// first bad value.
TEST(CaptureSizesTest, SweepUserListsAgainstTheRules) {
  std::mt19937 rng(1127);
  const int max = CaptureSizes::kMaxLimit;
  const int special[] = {INT_MIN, INT_MIN + 1, -max, -1,      0,   1,       2,           3,      8,
                         255,     256,         257,  max - 1, max, max + 1, INT_MAX - 1, INT_MAX};
  auto pick = [&](int hi) { return std::uniform_int_distribution<int>(0, hi)(rng); };
  int valid = 0, invalid = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    int limit;
    switch (pick(3)) {
      case 0:
        limit = special[pick(static_cast<int>(std::size(special)) - 1)];
        break;
      case 1:
        limit = 1 + pick(300);
        break;
      case 2:
        limit = 1 + pick(max + 100);
        break;
      default:
        limit = std::uniform_int_distribution<int>(INT_MIN, INT_MAX)(rng);
    }
    const int length = pick(4) == 0 ? 0 : 1 + pick(pick(1) == 0 ? 8 : 200);
    std::vector<int> sizes;
    for (int i = 0; i < length; ++i) {
      const int kind = pick(19);
      if (kind == 0) {
        sizes.push_back(special[pick(static_cast<int>(std::size(special)) - 1)]);
      } else if (kind == 1 && !sizes.empty()) {
        sizes.push_back(sizes[pick(static_cast<int>(sizes.size()) - 1)]);  // a duplicate
      } else if (kind == 2) {
        sizes.push_back(std::uniform_int_distribution<int>(INT_MIN, INT_MAX)(rng));
      } else {
        // Mostly plausible sizes under the limit, so that many lists are valid.
        const int hi = std::max(1, std::min(limit, max));
        sizes.push_back(1 + pick(hi - 1));
      }
    }
    if (pick(1) == 0) {  // drop duplicates half the time, again for more valid lists
      std::vector<int> unique;
      std::set<int> seen;
      for (int s : sizes) {
        if (seen.insert(s).second) unique.push_back(s);
      }
      sizes = unique;
    }
    const std::string want = ExpectedError(sizes, limit);
    absl::StatusOr<CaptureSizes> got = CaptureSizes::FromList(sizes, limit, "max_num_seqs");
    if (!want.empty()) {
      ++invalid;
      ASSERT_FALSE(got.ok()) << "limit " << limit << ", want: " << want;
      ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
      ASSERT_THAT(std::string(got.status().message()), HasSubstr(want));
      continue;
    }
    ++valid;
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<int> sorted = sizes;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(got->sizes(), sorted);
    ASSERT_EQ(got->max_size(), sorted.back());
    ASSERT_EQ(got->LargestFirst(), std::vector<int>(sorted.rbegin(), sorted.rend()));
    for (int n : {INT_MIN, -1, 0, 1, sorted.front(), sorted.back() - 1, sorted.back(),
                  sorted.back() + 1, max, max + 1, INT_MAX, 1 + pick(sorted.back())}) {
      ASSERT_EQ(got->PaddedSize(n), ScanPadded(sorted, n)) << "n " << n;
    }
    for (int items : {INT_MIN, -1, 0, 1, 2, 3, 12, INT_MAX}) {
      const std::string text = got->ToString(items);
      ASSERT_THAT(text, HasSubstr(std::to_string(sorted.back())));
      ASSERT_EQ(text.find('\n'), std::string::npos);
    }
  }
  // Both outcomes are exercised in earnest.
  EXPECT_GT(valid, 500);
  EXPECT_GT(invalid, 500);
}

// The largest lists: every size up to the table bound (the whole padding table), and a very long
// list that repeats a size, which must fail at the repeat rather than build a huge table.
TEST(CaptureSizesTest, LongestLists) {
  std::vector<int> every(CaptureSizes::kMaxLimit);
  for (int i = 0; i < CaptureSizes::kMaxLimit; ++i) every[i] = CaptureSizes::kMaxLimit - i;
  absl::StatusOr<CaptureSizes> all = CaptureSizes::FromList(every, INT_MAX, "max_num_seqs");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->sizes().size(), static_cast<size_t>(CaptureSizes::kMaxLimit));
  EXPECT_EQ(all->PaddedSize(CaptureSizes::kMaxLimit), CaptureSizes::kMaxLimit);
  EXPECT_EQ(all->PaddedSize(12345), 12345);
  EXPECT_EQ(all->ToString(3), "1, 2, ..., 65536 (65536 sizes)");

  std::vector<int> repeated(1 << 20, 7);
  absl::Status status = CaptureSizes::FromList(repeated, 8, "max_num_seqs").status();
  EXPECT_THAT(std::string(status.message()), HasSubstr("Capture size 7 appears more than once"));
  every.push_back(CaptureSizes::kMaxLimit + 1);
  status = CaptureSizes::FromList(every, INT_MAX, "max_num_seqs").status();
  EXPECT_THAT(std::string(status.message()), HasSubstr("Capture size 65537 is above 65536"));
}

}  // namespace
}  // namespace kiln
