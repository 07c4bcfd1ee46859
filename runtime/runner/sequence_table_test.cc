#include "runtime/runner/sequence_table.h"

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SequenceTableTest, NewSequencesStartEmptyAndGrowByWholeBlocks) {
  SequenceTable table(/*num_blocks=*/10, /*block_size=*/16, /*max_tokens=*/64);
  std::vector<SequenceTable::Entry> step = {{7, 16}, {9, 17}};
  auto lens = table.Reserve(step);
  ASSERT_TRUE(lens.ok()) << lens.status();
  ASSERT_EQ(lens->size(), 2u);
  EXPECT_EQ((*lens)[0].q_len, 16);
  EXPECT_EQ((*lens)[0].kv_len, 16);
  EXPECT_EQ((*lens)[1].kv_len, 17);
  // Exactly one block for 16 tokens (a boundary), two for 17; handed out in ascending order.
  EXPECT_THAT(table.Blocks(7), ElementsAre(0));
  EXPECT_THAT(table.Blocks(9), ElementsAre(1, 2));
  EXPECT_EQ(table.free_blocks(), 7);
  EXPECT_EQ(table.Length(7), 0);  // not committed yet
  table.Commit(step);
  EXPECT_EQ(table.Length(7), 16);
  EXPECT_EQ(table.Length(9), 17);

  // A decode step at the boundary of sequence 7 takes its second block; 9 needs none.
  std::vector<SequenceTable::Entry> decode = {{7, 1}, {9, 1}};
  lens = table.Reserve(decode);
  ASSERT_TRUE(lens.ok());
  EXPECT_EQ((*lens)[0].kv_len, 17);
  EXPECT_EQ((*lens)[1].kv_len, 18);
  EXPECT_THAT(table.Blocks(7), ElementsAre(0, 3));
  EXPECT_EQ(table.free_blocks(), 6);
}

TEST(SequenceTableTest, ReserveWithoutCommitIsRepeatable) {
  SequenceTable table(8, 16, 128);
  std::vector<SequenceTable::Entry> step = {{1, 40}};
  ASSERT_TRUE(table.Reserve(step).ok());
  const int free_after_first = table.free_blocks();
  auto again = table.Reserve(step);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0].kv_len, 40);
  EXPECT_EQ(table.free_blocks(), free_after_first);
}

TEST(SequenceTableTest, ErrorsChangeNothing) {
  SequenceTable table(/*num_blocks=*/4, /*block_size=*/16, /*max_tokens=*/48);
  ASSERT_TRUE(table.Reserve(std::vector<SequenceTable::Entry>{{1, 20}}).ok());
  const int free_before = table.free_blocks();

  auto dup = table.Reserve(std::vector<SequenceTable::Entry>{{2, 1}, {2, 1}});
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.status().message(), HasSubstr("appears twice"));

  auto empty = table.Reserve(std::vector<SequenceTable::Entry>{{3, 0}});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);

  auto too_long = table.Reserve(std::vector<SequenceTable::Entry>{{4, 49}});
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_long.status().message(), HasSubstr("max_model_len"));

  // 2 free blocks; sequence 5 needs 3 (48 tokens): nothing is taken, 6 gets nothing either.
  auto full = table.Reserve(std::vector<SequenceTable::Entry>{{6, 1}, {5, 48}});
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("needs 4 more KV blocks but 2"));
  EXPECT_EQ(table.free_blocks(), free_before);
  EXPECT_FALSE(table.Contains(5));
  EXPECT_FALSE(table.Contains(6));
}

// Lengths are int32: a max_tokens above 2^31 - 1 admits no more than that, and a sequence that
// would pass it is refused, not wrapped to a negative kv_len.
TEST(SequenceTableTest, LengthsStayWithinInt32) {
  SequenceTable table(/*num_blocks=*/1 << 16, /*block_size=*/1 << 16,
                      /*max_tokens=*/int64_t{1} << 32);
  EXPECT_EQ(table.max_tokens(), 2147483647);
  EXPECT_EQ(table.max_blocks_per_seq(), 1 << 15);
  const std::vector<SequenceTable::Entry> prompt = {{1, 2147483647}};
  auto lens = table.Reserve(prompt);
  ASSERT_TRUE(lens.ok()) << lens.status();
  EXPECT_EQ((*lens)[0].kv_len, 2147483647);
  table.Commit(prompt);
  const std::vector<SequenceTable::Entry> next = {{1, 1}};
  absl::Status status = table.Reserve(next).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("above max_model_len 2147483647 (lengths are int32)"));
  EXPECT_EQ(table.Length(1), 2147483647);
}

// max_tokens need not be a multiple of the block size: the last block is only partly usable,
// and CheckGrowth refuses what Reserve would, without changing anything.
TEST(SequenceTableTest, MaxTokensWithinTheLastBlock) {
  SequenceTable table(/*num_blocks=*/8, /*block_size=*/16, /*max_tokens=*/40);
  EXPECT_EQ(table.max_tokens(), 40);
  EXPECT_EQ(table.max_blocks_per_seq(), 3);
  ASSERT_TRUE(table.Reserve(std::vector<SequenceTable::Entry>{{1, 30}}).ok());
  table.Commit(std::vector<SequenceTable::Entry>{{1, 30}});
  const int free_before = table.free_blocks();

  EXPECT_TRUE(table.CheckGrowth(1, 10).ok());
  absl::Status past = table.CheckGrowth(1, 11);
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(past.message()),
              HasSubstr("Sequence 1 would hold 41 tokens, above max_model_len 40"));
  EXPECT_EQ(table.CheckGrowth(2, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.CheckGrowth(2, 41).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(table.CheckGrowth(2, 40).ok());

  // 41 tokens fit three blocks, but not max_tokens: refused, no block taken.
  EXPECT_EQ(table.Reserve(std::vector<SequenceTable::Entry>{{1, 11}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.free_blocks(), free_before);
  EXPECT_EQ(table.Length(1), 30);
  auto lens = table.Reserve(std::vector<SequenceTable::Entry>{{1, 10}});
  ASSERT_TRUE(lens.ok()) << lens.status();
  EXPECT_EQ((*lens)[0].kv_len, 40);
  EXPECT_EQ(table.Blocks(1).size(), 3u);
}

TEST(SequenceTableTest, ReleaseReturnsBlocksForReuse) {
  SequenceTable table(6, 16, 96);
  ASSERT_TRUE(table.Reserve(std::vector<SequenceTable::Entry>{{1, 64}, {2, 32}}).ok());
  EXPECT_EQ(table.free_blocks(), 0);
  ASSERT_TRUE(table.Release(1).ok());
  EXPECT_EQ(table.free_blocks(), 4);
  EXPECT_EQ(table.Release(1).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(table.Reserve(std::vector<SequenceTable::Entry>{{3, 64}}).ok());
  std::set<int32_t> got(table.Blocks(3).begin(), table.Blocks(3).end());
  EXPECT_EQ(got, (std::set<int32_t>{0, 1, 2, 3}));
}

// Random admissions, growth and releases never hand one block to two sequences and never lose
// one.
TEST(SequenceTableTest, RandomTrafficKeepsBlocksDisjoint) {
  std::mt19937 rng(std::random_device{}());
  SequenceTable table(/*num_blocks=*/64, /*block_size=*/16, /*max_tokens=*/256);
  std::vector<int64_t> live;
  int64_t next_id = 0;
  for (int round = 0; round < 2000; ++round) {
    const int action = static_cast<int>(rng() % 3);
    if (action == 0 || live.empty()) {
      const int len = 1 + static_cast<int>(rng() % 100);
      if (table.Reserve(std::vector<SequenceTable::Entry>{{next_id, len}}).ok()) {
        table.Commit(std::vector<SequenceTable::Entry>{{next_id, len}});
        live.push_back(next_id);
      }
      ++next_id;
    } else if (action == 1) {
      const int64_t id = live[rng() % live.size()];
      const SequenceTable::Entry e{id, 1 + static_cast<int>(rng() % 20)};
      if (table.Reserve({&e, 1}).ok()) table.Commit({&e, 1});
    } else {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(table.Release(live[i]).ok());
      live.erase(live.begin() + i);
    }
    std::set<int32_t> used;
    int total = 0;
    for (int64_t id : live) {
      ASSERT_EQ(static_cast<int>(table.Blocks(id).size()), (table.Length(id) + 15) / 16);
      for (int32_t b : table.Blocks(id)) {
        ASSERT_TRUE(used.insert(b).second) << "block " << b << " owned twice";
        ++total;
      }
    }
    ASSERT_EQ(total + table.free_blocks(), 64);
  }
}

}  // namespace
}  // namespace kiln
