#include "runtime/runner/sequence_table.h"

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
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
  ASSERT_TRUE(table.Commit(step).ok());
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
  ASSERT_TRUE(table.Commit(prompt).ok());
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
  ASSERT_TRUE(table.Commit(std::vector<SequenceTable::Entry>{{1, 30}}).ok());
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
        ASSERT_TRUE(table.Commit(std::vector<SequenceTable::Entry>{{next_id, len}}).ok());
        live.push_back(next_id);
      }
      ++next_id;
    } else if (action == 1) {
      const int64_t id = live[rng() % live.size()];
      const SequenceTable::Entry e{id, 1 + static_cast<int>(rng() % 20)};
      if (table.Reserve({&e, 1}).ok()) {
        ASSERT_TRUE(table.Commit({&e, 1}).ok());
      }
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

// q_len is int64 in CheckGrowth: a length plus a q_len near INT64_MAX must be refused, not
// overflow (signed overflow is undefined; it used to wrap to a negative kv_len that passed).
TEST(SequenceTableTest, CheckGrowthRefusesHugeQLenWithoutOverflow) {
  SequenceTable table(/*num_blocks=*/4, /*block_size=*/16, /*max_tokens=*/64);
  const std::vector<SequenceTable::Entry> prompt = {{3, 10}};
  ASSERT_TRUE(table.Reserve(prompt).ok());
  ASSERT_TRUE(table.Commit(prompt).ok());
  for (int64_t q_len :
       {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 5,
        int64_t{1} << 62, int64_t{std::numeric_limits<int32_t>::max()} + 1}) {
    const absl::Status s = table.CheckGrowth(3, q_len);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << q_len;
    EXPECT_THAT(std::string(s.message()), HasSubstr("Sequence 3 would hold ")) << q_len;
    EXPECT_THAT(std::string(s.message()), HasSubstr("above max_model_len 64")) << q_len;
  }
  EXPECT_THAT(std::string(table.CheckGrowth(3, std::numeric_limits<int64_t>::max()).message()),
              HasSubstr("more than 9223372036854775807"));
  EXPECT_EQ(table.CheckGrowth(3, std::numeric_limits<int64_t>::min()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(table.CheckGrowth(3, 54).ok());
  EXPECT_EQ(table.Length(3), 10);
}

// Commit advances only what the latest Reserve covered, once: a repeated, stray or altered
// commit used to push a length past its blocks (and, repeated, past INT32_MAX).
TEST(SequenceTableTest, CommitAdvancesOnlyTheLatestReservationOnce) {
  SequenceTable table(/*num_blocks=*/8, /*block_size=*/16, /*max_tokens=*/128);
  const std::vector<SequenceTable::Entry> step = {{1, 16}, {2, 3}};
  ASSERT_TRUE(table.Reserve(step).ok());
  ASSERT_TRUE(table.CheckCommit(step).ok());
  ASSERT_TRUE(table.Commit(step).ok());
  EXPECT_EQ(table.Length(1), 16);
  EXPECT_EQ(table.Length(2), 3);

  // The same commit again: nothing left to commit.
  absl::Status again = table.CheckCommit(step);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.message()), HasSubstr("Sequence 1 commits 16 tokens"));
  EXPECT_EQ(table.Commit(step).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table.Length(1), 16);

  // Never reserved, unknown, twice in one commit, or another q_len than reserved.
  EXPECT_EQ(table.CheckCommit(std::vector<SequenceTable::Entry>{{9, 1}}).code(),
            absl::StatusCode::kNotFound);
  const std::vector<SequenceTable::Entry> decode = {{1, 1}};
  ASSERT_TRUE(table.Reserve(decode).ok());
  EXPECT_EQ(table.CheckCommit(std::vector<SequenceTable::Entry>{{1, 1}, {1, 1}}).code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status other = table.CheckCommit(std::vector<SequenceTable::Entry>{{1, 40}});
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(other.message()), HasSubstr("its latest Reserve was for 1"));
  EXPECT_EQ(table.CheckCommit(std::vector<SequenceTable::Entry>{{1, -5}}).code(),
            absl::StatusCode::kFailedPrecondition);
  // A refused commit is all or nothing: sequence 1 is reserved, 2 is not.
  EXPECT_EQ(table.Commit(std::vector<SequenceTable::Entry>{{1, 1}, {2, 3}}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table.Length(1), 16);
  EXPECT_EQ(table.Length(2), 3);
  ASSERT_TRUE(table.Commit(decode).ok());
  EXPECT_EQ(table.Length(1), 17);
  EXPECT_EQ(table.Blocks(1).size(), 2u);

  // A step reserved again before its commit (it ran but was not committed) commits the latest.
  ASSERT_TRUE(table.Reserve(std::vector<SequenceTable::Entry>{{2, 30}}).ok());
  ASSERT_TRUE(table.Reserve(std::vector<SequenceTable::Entry>{{2, 2}}).ok());
  EXPECT_EQ(table.CheckCommit(std::vector<SequenceTable::Entry>{{2, 30}}).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(table.Commit(std::vector<SequenceTable::Entry>{{2, 2}}).ok());
  EXPECT_EQ(table.Length(2), 5);
  EXPECT_EQ(table.Blocks(2).size(), 3u);  // what the first reservation took stays

  // Released: its reservation goes with it.
  ASSERT_TRUE(table.Reserve(decode).ok());
  ASSERT_TRUE(table.Release(1).ok());
  EXPECT_EQ(table.CheckCommit(decode).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Commit(decode).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(table.Contains(1));
}

// CheckCommit finds a repeated id by marking each sequence it sees, not with a set of its own:
// marks left by earlier calls (Reserve's and CheckCommit's, refused or not) never make a single
// entry look repeated, and a repeat is refused in every round, before anything advances.
TEST(SequenceTableTest, RepeatedIdsAreRefusedInEveryCallAfterEarlierCalls) {
  SequenceTable table(/*num_blocks=*/64, /*block_size=*/16, /*max_tokens=*/1024);
  const std::vector<SequenceTable::Entry> step = {{1, 1}, {2, 1}, {3, 1}};
  for (int round = 0; round < 50; ++round) {
    ASSERT_TRUE(table.Reserve(step).ok()) << "round " << round;
    ASSERT_TRUE(table.CheckCommit(step).ok()) << "round " << round;
    ASSERT_TRUE(table.CheckCommit(step).ok()) << "round " << round;  // checking changes nothing
    for (const std::vector<SequenceTable::Entry>& repeated :
         {std::vector<SequenceTable::Entry>{{1, 1}, {2, 1}, {3, 1}, {1, 1}},
          std::vector<SequenceTable::Entry>{{2, 1}, {2, 1}},
          std::vector<SequenceTable::Entry>{{3, 1}, {1, 1}, {2, 1}, {3, 1}}}) {
      const absl::Status commit = table.Commit(repeated);
      ASSERT_EQ(commit.code(), absl::StatusCode::kInvalidArgument) << "round " << round;
      ASSERT_THAT(std::string(commit.message()),
                  HasSubstr(absl::StrCat("Sequence ", repeated.back().id,
                                         " appears twice in one commit")));
      // Reserve refuses the same repeats (these ids are known: marked the same way).
      const absl::Status reserve = table.Reserve(repeated).status();
      ASSERT_EQ(reserve.code(), absl::StatusCode::kInvalidArgument) << "round " << round;
      ASSERT_THAT(std::string(reserve.message()),
                  HasSubstr(absl::StrCat("Sequence ", repeated.back().id,
                                         " appears twice in one step")));
    }
    for (int64_t id : {1, 2, 3}) ASSERT_EQ(table.Length(id), round) << "round " << round;
    ASSERT_TRUE(table.Commit(step).ok()) << "round " << round;
  }
  EXPECT_EQ(table.Length(1), 50);
}

// Ids the table does not know yet have nothing to mark: their repeats are found apart from the
// known ones', and still reported in entry order, before a later entry's refusal and after an
// earlier one's.
TEST(SequenceTableTest, RepeatedNewIdsAreRefusedInEntryOrder) {
  SequenceTable table(/*num_blocks=*/16, /*block_size=*/16, /*max_tokens=*/64);
  ASSERT_TRUE(table.Reserve(std::vector<SequenceTable::Entry>{{1, 10}}).ok());
  ASSERT_TRUE(table.Commit(std::vector<SequenceTable::Entry>{{1, 10}}).ok());
  const int free_before = table.free_blocks();
  auto message = [&table](std::vector<SequenceTable::Entry> entries) {
    return std::string(table.Reserve(entries).status().message());
  };
  // New 7 repeats at entry 2, before entry 3 (too long) and before known 1's repeat.
  EXPECT_THAT(message({{7, 1}, {1, 1}, {7, 1}, {9, 65}, {1, 1}}),
              HasSubstr("Sequence 7 appears twice"));
  // Entry 1 is refused before new 7 repeats at entry 2.
  EXPECT_THAT(message({{7, 1}, {9, 65}, {7, 1}}), HasSubstr("Sequence 9 would hold 65 tokens"));
  // The repeat is itself the refused entry: the repeat comes first.
  EXPECT_THAT(message({{7, 1}, {7, 0}}), HasSubstr("Sequence 7 appears twice"));
  // Known 1 repeats at entry 2, before new 8 does at entry 3.
  EXPECT_THAT(message({{1, 1}, {8, 1}, {1, 1}, {8, 1}}), HasSubstr("Sequence 1 appears twice"));
  // New 8 repeats at entry 2, before known 1 does at entry 3; of two new repeats, the earlier.
  EXPECT_THAT(message({{1, 1}, {8, 1}, {8, 1}, {1, 1}}), HasSubstr("Sequence 8 appears twice"));
  EXPECT_THAT(message({{9, 1}, {8, 1}, {8, 1}, {9, 1}}), HasSubstr("Sequence 8 appears twice"));
  EXPECT_THAT(message({{9, 1}, {8, 1}, {9, 1}, {8, 1}}), HasSubstr("Sequence 9 appears twice"));
  EXPECT_THAT(message({{5, 1}, {6, 1}, {5, 1}, {6, 1}, {5, 1}}),
              HasSubstr("Sequence 5 appears twice"));
  EXPECT_EQ(table.free_blocks(), free_before);
  EXPECT_EQ(table.num_sequences(), 1);
  EXPECT_EQ(table.Length(1), 10);
  // The same new ids once each are admitted.
  auto lens = table.Reserve(std::vector<SequenceTable::Entry>{{9, 1}, {8, 1}, {1, 1}});
  ASSERT_TRUE(lens.ok()) << lens.status();
  EXPECT_EQ((*lens)[2].kv_len, 11);
  EXPECT_EQ(table.num_sequences(), 3);
}

// Reserve's `admit` sees the step's lengths once every entry passed its checks and before the
// pool's; its refusal is returned and changes nothing, as any other refusal.
TEST(SequenceTableTest, ReserveAdmitSeesTheLengthsAndItsRefusalChangesNothing) {
  SequenceTable table(/*num_blocks=*/4, /*block_size=*/16, /*max_tokens=*/64);
  ASSERT_TRUE(table.Reserve(std::vector<SequenceTable::Entry>{{1, 20}}).ok());
  ASSERT_TRUE(table.Commit(std::vector<SequenceTable::Entry>{{1, 20}}).ok());
  const std::vector<SequenceTable::Entry> decode = {{1, 1}};
  ASSERT_TRUE(table.Reserve(decode).ok());  // reserved, not committed
  const int free_before = table.free_blocks();
  std::vector<SeqLens> seen;
  int calls = 0;
  auto refuse = [&](absl::Span<const SeqLens> lens) {
    ++calls;
    seen.assign(lens.begin(), lens.end());
    return absl::FailedPreconditionError("Not this step");
  };

  const std::vector<SequenceTable::Entry> step = {{1, 12}, {2, 5}};
  absl::StatusOr<std::vector<SeqLens>> refused = table.Reserve(step, refuse);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(), "Not this step");
  ASSERT_EQ(calls, 1);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].q_len, 12);
  EXPECT_EQ(seen[0].kv_len, 32);
  EXPECT_EQ(seen[1].q_len, 5);
  EXPECT_EQ(seen[1].kv_len, 5);
  EXPECT_EQ(table.free_blocks(), free_before);
  EXPECT_FALSE(table.Contains(2));
  EXPECT_TRUE(table.CheckCommit(decode).ok());  // the earlier reservation stands

  // An entry refused by the table: `admit` is not asked.
  EXPECT_EQ(table.Reserve(std::vector<SequenceTable::Entry>{{1, 45}}, refuse).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      table.Reserve(std::vector<SequenceTable::Entry>{{2, 1}, {2, 1}}, refuse).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);
  // Before the pool's check: a step too big for the pool gets admit's refusal.
  const std::vector<SequenceTable::Entry> big = {{3, 64}};
  EXPECT_EQ(table.Reserve(big, refuse).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(calls, 2);
  auto admit = [&](absl::Span<const SeqLens> lens) {
    ++calls;
    seen.assign(lens.begin(), lens.end());
    return absl::OkStatus();
  };
  EXPECT_EQ(table.Reserve(big, admit).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(table.free_blocks(), free_before);

  absl::StatusOr<std::vector<SeqLens>> lens = table.Reserve(step, admit);
  ASSERT_TRUE(lens.ok()) << lens.status();
  EXPECT_EQ(calls, 4);
  ASSERT_EQ(lens->size(), seen.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ((*lens)[i].q_len, seen[i].q_len);
    EXPECT_EQ((*lens)[i].kv_len, seen[i].kv_len);
  }
  EXPECT_EQ(table.Blocks(1).size(), 2u);
  EXPECT_EQ(table.Blocks(2).size(), 1u);
  EXPECT_TRUE(table.CheckCommit(step).ok());
}

// The overload into caller-owned vectors gives what the StatusOr overload returns, step after
// step, from vectors that still hold an earlier step's contents (longer or shorter, or left by a
// refused step), and each entry's blocks as Blocks(id) gives them.
TEST(SequenceTableTest, ReserveIntoVectorsMatchesTheReturnedLengths) {
  constexpr int kBlocks = 64, kBlockSize = 16, kMaxTokens = 300;
  SequenceTable returned(kBlocks, kBlockSize, kMaxTokens);
  SequenceTable filled(kBlocks, kBlockSize, kMaxTokens);
  std::vector<SeqLens> lens = {{7, 7}, {8, 8}, {9, 9}};  // stale: must be replaced
  std::vector<absl::Span<const int32_t>> blocks(5);
  std::mt19937 rng(3);
  auto admit = [](absl::Span<const SeqLens> step) {
    // Refuses a step whose first entry brings 13 tokens: an admit refusal changes nothing either.
    return !step.empty() && step[0].q_len == 13 ? absl::FailedPreconditionError("Not 13")
                                                : absl::OkStatus();
  };
  int ok = 0, refused = 0;
  for (int round = 0; round < 2000; ++round) {
    std::vector<SequenceTable::Entry> step(1 + rng() % 6);
    for (SequenceTable::Entry& e : step) {
      e.id = rng() % 10;
      e.q_len = rng() % 4 == 0 ? static_cast<int>(rng() % 40) - 2 : 1;
    }
    absl::StatusOr<std::vector<SeqLens>> want = returned.Reserve(step, admit);
    const absl::Status got = filled.Reserve(step, admit, &lens, &blocks);
    ASSERT_EQ(got, want.status()) << round;
    ASSERT_EQ(filled.free_blocks(), returned.free_blocks()) << round;
    if (want.ok()) {
      ++ok;
      ASSERT_EQ(lens.size(), want->size()) << round;
      ASSERT_EQ(blocks.size(), step.size()) << round;
      for (size_t i = 0; i < step.size(); ++i) {
        EXPECT_EQ(lens[i].q_len, (*want)[i].q_len) << round << " " << i;
        EXPECT_EQ(lens[i].kv_len, (*want)[i].kv_len) << round << " " << i;
        const absl::Span<const int32_t> table_blocks = filled.Blocks(step[i].id);
        EXPECT_EQ(blocks[i].data(), table_blocks.data()) << round << " " << i;
        EXPECT_EQ(blocks[i].size(), table_blocks.size()) << round << " " << i;
        EXPECT_EQ(std::vector<int32_t>(table_blocks.begin(), table_blocks.end()),
                  std::vector<int32_t>(returned.Blocks(step[i].id).begin(),
                                       returned.Blocks(step[i].id).end()));
      }
      if (rng() % 2 == 0) {
        ASSERT_TRUE(returned.Commit(step).ok());
        ASSERT_TRUE(filled.Commit(step).ok());
      }
    } else {
      ++refused;
    }
    if (rng() % 8 == 0) {
      const int64_t id = rng() % 10;
      ASSERT_EQ(filled.Release(id), returned.Release(id));
    }
  }
  // Both kinds of outcome were exercised.
  EXPECT_GT(ok, 100);
  EXPECT_GT(refused, 100);
  // Without `blocks`: the lengths alone.
  SequenceTable table(4, 16, 64);
  ASSERT_TRUE(table.Reserve(std::vector<SequenceTable::Entry>{{1, 20}, {2, 3}}, admit, &lens).ok());
  ASSERT_EQ(lens.size(), 2u);
  EXPECT_EQ(lens[0].kv_len, 20);
  EXPECT_EQ(lens[1].kv_len, 3);
}

// MaxBlocksPerSeq is the max_blocks_per_seq of the table the same values build, raised and
// capped as the constructor raises and caps them.
TEST(SequenceTableTest, MaxBlocksPerSeqMatchesATable) {
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  constexpr int kMax32 = std::numeric_limits<int32_t>::max();
  for (const int block_size : {-7, 0, 1, 3, 16, 64, 1 << 20, kMax32}) {
    for (const int64_t max_tokens : {int64_t{-5}, int64_t{0}, int64_t{1}, int64_t{15},
                                     int64_t{16}, int64_t{17}, int64_t{4096}, int64_t{kMax32},
                                     int64_t{kMax32} + 1, kMax64}) {
      EXPECT_EQ(SequenceTable::MaxBlocksPerSeq(block_size, max_tokens),
                SequenceTable(1, block_size, max_tokens).max_blocks_per_seq())
          << block_size << " " << max_tokens;
    }
  }
  EXPECT_EQ(SequenceTable::MaxBlocksPerSeq(64, 4096), 64);
  EXPECT_EQ(SequenceTable::MaxBlocksPerSeq(16, 40), 3);
  EXPECT_EQ(SequenceTable::MaxBlocksPerSeq(1, kMax64), kMax32);
  EXPECT_EQ(SequenceTable::MaxBlocksPerSeq(0, -1), 0);
}

// A reference of what the table should hold, checked against it after every operation.
class TableModel {
 public:
  struct Sequence {
    int64_t length = 0;
    int64_t reserved_q_len = 0;
    std::vector<int32_t> blocks;
  };

  TableModel(int num_blocks, int block_size, int64_t max_tokens)
      : num_blocks_(std::max(num_blocks, 0)),
        block_size_(std::max(block_size, 1)),
        max_tokens_(std::clamp<int64_t>(max_tokens, 0, std::numeric_limits<int32_t>::max())),
        free_(num_blocks_) {}

  int64_t BlocksFor(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  int64_t Length(int64_t id) const {
    auto it = seqs_.find(id);
    return it == seqs_.end() ? 0 : it->second.length;
  }
  int64_t NumBlocks(int64_t id) const {
    auto it = seqs_.find(id);
    return it == seqs_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
  }

  // The status CheckGrowth should give, and the text its message must hold.
  absl::StatusCode Growth(int64_t id, int64_t q_len, std::string* text) const {
    if (q_len < 1) {
      *text = absl::StrCat("Sequence ", id, " brings ", q_len, " tokens");
      return absl::StatusCode::kInvalidArgument;
    }
    const int64_t length = Length(id);
    if (q_len > max_tokens_ - length) {
      *text = absl::StrCat("Sequence ", id, " would hold ");
      if (q_len <= std::numeric_limits<int64_t>::max() - length) {
        absl::StrAppend(text, length + q_len, " tokens, above max_model_len ", max_tokens_);
      }
      return absl::StatusCode::kInvalidArgument;
    }
    return absl::StatusCode::kOk;
  }

  absl::StatusCode Reserve(absl::Span<const SequenceTable::Entry> entries, std::string* text,
                           int64_t* needed_out) const {
    std::set<int64_t> seen;
    int64_t needed = 0;
    for (const SequenceTable::Entry& e : entries) {
      if (!seen.insert(e.id).second) {
        *text = absl::StrCat("Sequence ", e.id, " appears twice");
        return absl::StatusCode::kInvalidArgument;
      }
      if (absl::StatusCode c = Growth(e.id, e.q_len, text); c != absl::StatusCode::kOk) return c;
      needed += std::max<int64_t>(0, BlocksFor(Length(e.id) + e.q_len) - NumBlocks(e.id));
    }
    *needed_out = needed;
    if (needed > free_) {
      *text = absl::StrCat("needs ", needed, " more KV blocks but ", free_, " of ", num_blocks_,
                           " are free");
      return absl::StatusCode::kResourceExhausted;
    }
    return absl::StatusCode::kOk;
  }

  absl::StatusCode Commit(absl::Span<const SequenceTable::Entry> entries, std::string* text) const {
    std::set<int64_t> seen;
    for (const SequenceTable::Entry& e : entries) {
      *text = absl::StrCat("Sequence ", e.id, " ");
      if (!seen.insert(e.id).second) return absl::StatusCode::kInvalidArgument;
      auto it = seqs_.find(e.id);
      if (it == seqs_.end()) return absl::StatusCode::kNotFound;
      if (it->second.reserved_q_len == 0 || it->second.reserved_q_len != e.q_len) {
        return absl::StatusCode::kFailedPrecondition;
      }
    }
    return absl::StatusCode::kOk;
  }

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int64_t max_tokens() const { return max_tokens_; }
  int64_t free_blocks() const { return free_; }
  std::map<int64_t, Sequence>& seqs() { return seqs_; }
  const std::map<int64_t, Sequence>& seqs() const { return seqs_; }
  void Take(int64_t n) { free_ -= n; }
  void Give(int64_t n) { free_ += n; }

 private:
  int num_blocks_;
  int block_size_;
  int64_t max_tokens_;
  int64_t free_;
  std::map<int64_t, Sequence> seqs_;
};

// Checks the table against the model: the same sequences, lengths and block lists; blocks in
// range, owned once, covering each reservation, within max_blocks_per_seq; none lost.
void ExpectSameState(const SequenceTable& table, const TableModel& model, int op) {
  ASSERT_EQ(table.num_sequences(), static_cast<int>(model.seqs().size())) << "op " << op;
  ASSERT_EQ(table.free_blocks(), model.free_blocks()) << "op " << op;
  // Plain tests in the loops (gtest's macros cost more than the walk), one report on failure.
  std::vector<char> owned(model.num_blocks(), 0);
  int64_t in_use = 0;
  for (const auto& [id, seq] : model.seqs()) {
    const absl::Span<const int32_t> blocks = table.Blocks(id);
    if (!table.Contains(id) || table.Length(id) != seq.length) {
      FAIL() << "op " << op << ": sequence " << id << " holds " << table.Length(id)
             << " tokens, the model " << seq.length;
    }
    if (!std::equal(blocks.begin(), blocks.end(), seq.blocks.begin(), seq.blocks.end())) {
      FAIL() << "op " << op << ": sequence " << id << " has other blocks than the model";
    }
    if (static_cast<int64_t>(blocks.size()) * model.block_size() <
            seq.length + seq.reserved_q_len ||
        seq.length + seq.reserved_q_len > model.max_tokens() ||
        static_cast<int64_t>(blocks.size()) > table.max_blocks_per_seq()) {
      FAIL() << "op " << op << ": sequence " << id << " of " << seq.length << " tokens and "
             << seq.reserved_q_len << " reserved has " << blocks.size() << " blocks";
    }
    for (int32_t b : blocks) {
      if (b < 0 || b >= model.num_blocks() || owned[b] != 0) {
        FAIL() << "op " << op << " id " << id << ": block " << b
               << " is out of range or owned twice";
      }
      owned[b] = 1;
      ++in_use;
    }
  }
  ASSERT_EQ(in_use + table.free_blocks(), model.num_blocks()) << "op " << op;
}

struct TableShape {
  int num_blocks;
  int block_size;
  int64_t max_tokens;
};

// Random and adversarial traffic against a model: batches that mix new, continuing and
// released ids, decode steps and prefill chunks, lengths at block boundaries and at max_tokens,
// duplicates, q_len of 0, negative or near INT32_MAX, CheckGrowth with any int64, commits that
// do and do not match their reservation, releases of unknown and released ids; tables of 0 and 1
// block, blocks of 1 token and of 2^31 - 1, max_tokens from 0 to INT64_MAX. After every
// operation the table must equal the model; a refused operation changes nothing.
TEST(SequenceTableTest, AdversarialSweepMatchesAModel) {
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin32 = std::numeric_limits<int32_t>::min();
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
  const std::vector<TableShape> shapes = {
      {0, 16, 256},        {1, 1, 1},     {1, 16, 16},    {1, 16, 40},     {2, 1, 5},
      {7, 3, 20},          {64, 16, 256}, {64, 1, 64},    {8, 1000, 5000}, {4096, 1 << 20, kMax64},
      {3, kMax32, kMax64}, {16, 64, 1},   {5, 7, kMax32}, {-3, 0, -5},     {4, -7, 100},
      {4, 16, 0},          {32, 4, 1000}, {12, 5, 59},
  };
  constexpr int kOpsPerShape = 3000;
  int checked = 0;
  std::map<std::string, int> outcomes;  // "operation code" -> count, to show what was covered
  auto tally = [&outcomes](absl::string_view op, absl::StatusCode code) {
    ++outcomes[absl::StrCat(op, " ", absl::StatusCodeToString(code))];
  };
  for (size_t shape_index = 0; shape_index < shapes.size(); ++shape_index) {
    const TableShape& shape = shapes[shape_index];
    SCOPED_TRACE(absl::StrCat("table ", shape.num_blocks, " x ", shape.block_size, ", max ",
                              shape.max_tokens));
    std::mt19937 rng(1234 + static_cast<uint32_t>(shape_index));
    auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
    SequenceTable table(shape.num_blocks, shape.block_size, shape.max_tokens);
    TableModel model(shape.num_blocks, shape.block_size, shape.max_tokens);
    ASSERT_EQ(table.num_blocks(), model.num_blocks());
    ASSERT_EQ(table.block_size(), model.block_size());
    ASSERT_EQ(table.max_tokens(), model.max_tokens());
    ASSERT_EQ(table.max_blocks_per_seq(), model.BlocksFor(model.max_tokens()));

    std::vector<int64_t> released;
    std::vector<int64_t> extremes = {kMin64, kMax64, -1, 0};
    int64_t next_id = 1;
    auto fresh_id = [&]() -> int64_t {
      if (!extremes.empty() && pick(8) == 0) {
        const int64_t id = extremes.back();
        extremes.pop_back();
        if (!model.seqs().count(id)) return id;
      }
      next_id += 1 + pick(3);
      return pick(4) == 0 ? next_id * 1000003 : next_id;
    };
    auto live_id = [&]() -> int64_t {
      auto it = model.seqs().begin();
      std::advance(it, pick(static_cast<int>(model.seqs().size())));
      return it->first;
    };
    auto any_id = [&]() -> int64_t {
      const int kind = pick(10);
      if (kind < 6 && !model.seqs().empty()) return live_id();
      if (kind < 7 && !released.empty()) return released[pick(static_cast<int>(released.size()))];
      return fresh_id();
    };
    // Mostly lengths a server would send (within max_tokens), else anything.
    auto q_len_for = [&](int64_t id, bool adversarial = true) -> int64_t {
      const int64_t length = model.Length(id);
      const int64_t bs = model.block_size();
      const int64_t room = model.max_tokens() - length;
      if (!adversarial && room >= 1) {
        switch (pick(5)) {
          case 0:
          case 1:
            return 1;
          case 2:
            return std::min<int64_t>(room,
                                     1 + pick(static_cast<int>(std::min<int64_t>(3 * bs, 500))));
          case 3:
            return std::min(room, bs - length % bs);
          default:
            return room;
        }
      }
      switch (pick(16)) {
        case 0:
        case 1:
        case 2:
        case 3:
          return 1;
        case 4:
        case 5:
          return 1 + pick(static_cast<int>(std::min<int64_t>(3 * bs, 500)));
        case 6:
          return bs - length % bs;  // to the block boundary
        case 7:
          return bs - length % bs + 1;  // one past it
        case 8:
          return model.max_tokens() - length;  // to max_tokens
        case 9:
          return model.max_tokens() - length + 1;  // one past it
        case 10:
          return 0;
        case 11:
          return -1 - pick(1000);
        case 12:
          return kMax32;
        case 13:
          return kMin32;
        case 14:
          return 1 + static_cast<int64_t>(rng() % kMax32);
        default:
          return std::max<int64_t>(1, (model.max_tokens() - length) / 2);
      }
    };
    auto to_int = [](int64_t v) {
      return static_cast<int>(std::clamp<int64_t>(v, kMin32, kMax32));
    };

    std::vector<SequenceTable::Entry> last_reserved;
    for (int op = 0; op < kOpsPerShape; ++op) {
      const int action = pick(20);
      if (action < 11) {  // Reserve a batch, usually committed after
        std::vector<SequenceTable::Entry> entries;
        const int n = pick(7);
        const bool adversarial = pick(3) == 0;
        for (int i = 0; i < n; ++i) {
          const int64_t id = any_id();
          bool taken = false;
          for (const auto& e : entries) taken = taken || e.id == id;
          if (taken && pick(4) != 0) continue;  // mostly distinct ids; sometimes a duplicate
          entries.push_back({id, to_int(q_len_for(id, adversarial))});
        }
        if (!entries.empty() && pick(12) == 0) {
          entries.push_back(entries[pick(static_cast<int>(entries.size()))]);
        }
        std::string text;
        int64_t needed = 0;
        const absl::StatusCode want = model.Reserve(entries, &text, &needed);
        // Every other op through `admit`, which must see the lengths Reserve returns, exactly
        // when the entries pass the table's checks.
        const bool with_admit = op % 2 == 0;
        int admit_calls = 0;
        std::vector<SeqLens> admitted;
        auto admit = [&](absl::Span<const SeqLens> l) {
          ++admit_calls;
          admitted.assign(l.begin(), l.end());
          return absl::OkStatus();
        };
        absl::StatusOr<std::vector<SeqLens>> lens =
            with_admit ? table.Reserve(entries, admit) : table.Reserve(entries);
        ASSERT_EQ(lens.status().code(), want) << "op " << op << ": " << lens.status();
        tally("Reserve", want);
        if (with_admit) {
          const bool checked = want == absl::StatusCode::kOk ||
                               want == absl::StatusCode::kResourceExhausted;
          ASSERT_EQ(admit_calls, checked ? 1 : 0) << "op " << op;
          if (lens.ok()) {
            ASSERT_EQ(admitted.size(), lens->size()) << "op " << op;
            for (size_t i = 0; i < admitted.size(); ++i) {
              ASSERT_EQ(admitted[i].q_len, (*lens)[i].q_len) << "op " << op;
              ASSERT_EQ(admitted[i].kv_len, (*lens)[i].kv_len) << "op " << op;
            }
          }
        }
        if (want != absl::StatusCode::kOk) {
          ASSERT_THAT(std::string(lens.status().message()), HasSubstr(text)) << "op " << op;
        } else {
          ASSERT_EQ(lens->size(), entries.size());
          int64_t taken = 0;
          for (size_t i = 0; i < entries.size(); ++i) {
            const SequenceTable::Entry& e = entries[i];
            TableModel::Sequence& seq = model.seqs()[e.id];
            ASSERT_EQ((*lens)[i].q_len, e.q_len) << "op " << op;
            ASSERT_EQ((*lens)[i].kv_len, seq.length + e.q_len) << "op " << op;
            if ((*lens)[i].kv_len == model.max_tokens()) ++outcomes["kv_len at max_tokens"];
            if ((*lens)[i].kv_len > (1 << 30)) ++outcomes["kv_len above 2^30"];
            if ((*lens)[i].kv_len % model.block_size() == 0) ++outcomes["kv_len at a block end"];
            const absl::Span<const int32_t> got = table.Blocks(e.id);
            const size_t want_blocks = std::max<size_t>(
                seq.blocks.size(), static_cast<size_t>(model.BlocksFor(seq.length + e.q_len)));
            ASSERT_EQ(got.size(), want_blocks) << "op " << op;
            // Blocks never move: the old list is a prefix of the new one.
            ASSERT_TRUE(std::equal(seq.blocks.begin(), seq.blocks.end(), got.begin()))
                << "op " << op;
            taken += static_cast<int64_t>(got.size() - seq.blocks.size());
            seq.blocks.assign(got.begin(), got.end());
            seq.reserved_q_len = e.q_len;
          }
          ASSERT_EQ(taken, needed) << "op " << op;
          model.Take(taken);
          last_reserved = entries;
          if (pick(8) != 0) {  // the step ran and is committed
            ASSERT_TRUE(table.CheckCommit(entries).ok()) << "op " << op;
            ASSERT_TRUE(table.Commit(entries).ok());
            for (const auto& e : entries) {
              model.seqs()[e.id].length += e.q_len;
              model.seqs()[e.id].reserved_q_len = 0;
            }
          }
        }
      } else if (action < 14) {  // Commit: stray, repeated, altered or the last reservation
        std::vector<SequenceTable::Entry> entries = last_reserved;
        switch (pick(5)) {
          case 0:
            break;
          case 1:  // another q_len than reserved
            if (!entries.empty()) {
              int& q_len = entries[pick(static_cast<int>(entries.size()))].q_len;
              q_len = to_int(int64_t{q_len} + pick(3) - 1);
            }
            break;
          case 2:  // an id twice
            if (!entries.empty()) entries.push_back(entries.front());
            break;
          case 3:  // one more entry, reserved or not
            entries.push_back({any_id(), to_int(q_len_for(0))});
            break;
          default:
            entries = {{any_id(), pick(3)}};
        }
        std::string text;
        const absl::StatusCode want = model.Commit(entries, &text);
        const absl::Status check = table.CheckCommit(entries);
        ASSERT_EQ(check.code(), want) << "op " << op << ": " << check;
        tally("Commit", want);
        if (want != absl::StatusCode::kOk) {
          ASSERT_THAT(std::string(check.message()), HasSubstr(text)) << "op " << op;
        }
        ASSERT_EQ(table.Commit(entries).code(), want) << "op " << op;
        if (want == absl::StatusCode::kOk) {
          for (const auto& e : entries) {
            model.seqs()[e.id].length += e.q_len;
            model.seqs()[e.id].reserved_q_len = 0;
          }
        }
      } else if (action < 17) {  // Release a live, released or unknown id
        const int64_t id = any_id();
        const absl::Status s = table.Release(id);
        auto it = model.seqs().find(id);
        tally("Release", s.code());
        if (it == model.seqs().end()) {
          ASSERT_EQ(s.code(), absl::StatusCode::kNotFound) << "op " << op;
          ASSERT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("Sequence ", id, " ")));
        } else {
          ASSERT_TRUE(s.ok()) << "op " << op << ": " << s;
          model.Give(static_cast<int64_t>(it->second.blocks.size()));
          model.seqs().erase(it);
          released.push_back(id);
        }
      } else {  // CheckGrowth with any int64
        const int64_t id = any_id();
        const int64_t extreme[] = {
            kMax64,       kMin64, kMax64 - model.Length(id), kMax64 - 1, int64_t{kMax32} + 1,
            q_len_for(id)};
        const int64_t q_len = extreme[pick(6)];
        std::string text;
        const absl::StatusCode want = model.Growth(id, q_len, &text);
        const absl::Status s = table.CheckGrowth(id, q_len);
        ASSERT_EQ(s.code(), want) << "op " << op << " q_len " << q_len << ": " << s;
        tally("CheckGrowth", want);
        if (want != absl::StatusCode::kOk) {
          ASSERT_THAT(std::string(s.message()), HasSubstr(text)) << "op " << op;
        }
      }
      ASSERT_NO_FATAL_FAILURE(ExpectSameState(table, model, op));
      // Ids the table must not know.
      const int64_t stranger =
          released.empty() ? kMin64 + 7 : released[pick(static_cast<int>(released.size()))];
      if (!model.seqs().count(stranger)) {
        ASSERT_FALSE(table.Contains(stranger));
        ASSERT_EQ(table.Length(stranger), 0);
        ASSERT_TRUE(table.Blocks(stranger).empty());
      }
      ++checked;
    }
    // Releasing everything returns every block.
    while (!model.seqs().empty()) {
      const int64_t id = model.seqs().begin()->first;
      ASSERT_TRUE(table.Release(id).ok());
      model.Give(static_cast<int64_t>(model.seqs().begin()->second.blocks.size()));
      model.seqs().erase(model.seqs().begin());
    }
    ASSERT_EQ(table.free_blocks(), model.num_blocks());
    ASSERT_EQ(table.num_sequences(), 0);
  }
  EXPECT_EQ(checked, static_cast<int>(shapes.size()) * kOpsPerShape);
  for (const auto& [what, count] : outcomes) std::cout << what << ": " << count << "\n";
  for (const char* what :
       {"Reserve OK", "Reserve INVALID_ARGUMENT", "Reserve RESOURCE_EXHAUSTED", "Commit OK",
        "Commit INVALID_ARGUMENT", "Commit NOT_FOUND", "Commit FAILED_PRECONDITION", "Release OK",
        "Release NOT_FOUND", "CheckGrowth OK", "CheckGrowth INVALID_ARGUMENT",
        "kv_len at max_tokens", "kv_len above 2^30", "kv_len at a block end"}) {
    EXPECT_GT(outcomes[what], 0) << what << " never happened";
  }
}

}  // namespace
}  // namespace kiln
