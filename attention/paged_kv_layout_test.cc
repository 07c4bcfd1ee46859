#include "attention/paged_kv_layout.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kiln {
namespace {

PagedKvLayout Layout(int num_blocks, int block_size) {
  return PagedKvLayout{num_blocks, block_size, /*num_kv_heads=*/2, /*head_dim=*/64,
                       AttentionDtype::kBf16};
}

TEST(PagedKvLayoutTest, ValidatesBlockSizeAndShape) {
  EXPECT_TRUE(Layout(8, 16).Validate().ok());
  EXPECT_TRUE(Layout(8, 64).Validate().ok());
  const absl::Status bad = Layout(8, 24).Validate();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("block_size 24"), std::string::npos) << bad;
  EXPECT_FALSE(Layout(8, 8).Validate().ok());
  EXPECT_FALSE(Layout(0, 16).Validate().ok());
  PagedKvLayout odd = Layout(8, 16);
  odd.head_dim = 60;
  EXPECT_FALSE(odd.Validate().ok());
}

TEST(PagedKvLayoutTest, RefusesMoreSlotsThanInt32Holds) {
  EXPECT_TRUE(Layout((1 << 27) - 1, 16).Validate().ok());
  const absl::Status many = Layout(1 << 27, 16).Validate();  // 2^31 slots
  EXPECT_EQ(many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(many.message().find("134217728 blocks x 16 tokens"), std::string::npos) << many;
}

TEST(PagedKvLayoutTest, OffsetsFollowBlockHeadTokenOrder) {
  for (int bs : {16, 64}) {
    const PagedKvLayout l = Layout(10, bs);
    EXPECT_EQ(l.BlockElements(), static_cast<size_t>(2 * bs * 64));
    EXPECT_EQ(l.PoolBytes(), static_cast<size_t>(10) * 2 * bs * 64 * 2);
    // slot = block 3, offset 5; head 1.
    const int64_t slot = 3 * bs + 5;
    EXPECT_EQ(l.ElementOffset(slot, 1), static_cast<size_t>(((3 * 2 + 1) * bs + 5) * 64));
    EXPECT_EQ(l.ElementOffset(0, 0), 0u);
  }
}

TEST(BlockTableTest, ReservesGrowsAndReleases) {
  for (int bs : {16, 64}) {
    const PagedKvLayout l = Layout(8, bs);
    std::vector<int32_t> storage(3 * 4, 1234);
    BlockTable table(absl::MakeSpan(storage), /*max_seqs=*/3, /*max_blocks_per_seq=*/4, l);
    for (int32_t e : storage) EXPECT_EQ(e, -1);
    EXPECT_EQ(table.free_blocks(), 8);
    ASSERT_TRUE(table.Reserve(0, bs + 1).ok());  // 2 blocks
    EXPECT_EQ(table.blocks_of(0), 2);
    ASSERT_TRUE(table.Reserve(0, bs).ok());  // already has enough
    EXPECT_EQ(table.blocks_of(0), 2);
    ASSERT_TRUE(table.Reserve(1, 3 * bs).ok());
    ASSERT_TRUE(table.Reserve(0, 4 * bs).ok());  // grows to 4
    EXPECT_EQ(table.free_blocks(), 1);
    EXPECT_EQ(table.max_blocks_in_use(), 4);
    std::set<int32_t> used;
    for (int s = 0; s < 2; ++s) {
      for (int b = 0; b < table.blocks_of(s); ++b) {
        const int32_t block = table.at(s, b);
        EXPECT_GE(block, 0);
        EXPECT_LT(block, 8);
        EXPECT_TRUE(used.insert(block).second) << "block " << block << " given twice";
      }
    }
    const absl::Status full = table.Reserve(2, 2 * bs);
    EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(table.blocks_of(2), 0);  // nothing taken on failure
    EXPECT_EQ(table.Reserve(2, 5 * bs).code(), absl::StatusCode::kInvalidArgument);
    table.Release(1);
    EXPECT_EQ(table.free_blocks(), 4);
    EXPECT_EQ(table.at(1, 0), -1);
    EXPECT_TRUE(table.Reserve(2, 2 * bs).ok());
  }
}

TEST(BlockTableTest, FreeOrderScattersBlocks) {
  const PagedKvLayout l = Layout(4, 16);
  std::vector<int32_t> storage(2 * 2);
  BlockTable table(absl::MakeSpan(storage), 2, 2, l);
  const std::vector<int32_t> order = {3, 1, 0, 2};
  ASSERT_TRUE(table.SetFreeOrder(order).ok());
  ASSERT_TRUE(table.Reserve(0, 32).ok());
  ASSERT_TRUE(table.Reserve(1, 20).ok());
  EXPECT_EQ(table.at(0, 0), 3);
  EXPECT_EQ(table.at(0, 1), 1);
  EXPECT_EQ(table.at(1, 0), 0);
  EXPECT_EQ(table.at(1, 1), 2);
  EXPECT_FALSE(table.SetFreeOrder(order).ok());  // blocks are in use
  const std::vector<int32_t> repeated = {0, 0, 1, 2};
  table.Release(0);
  table.Release(1);
  EXPECT_EQ(table.SetFreeOrder(repeated).code(), absl::StatusCode::kInvalidArgument);
}

// Sizes near int32's limit, storage shorter than the rows, and an unvalidated layout are refused
// with a Status, never a wrapped block count, a write past the storage or a division by zero.
TEST(BlockTableTest, RefusesWhatWouldOverflowOrWritePastTheStorage) {
  const PagedKvLayout l = Layout(8, 16);
  std::vector<int32_t> storage(2 * 4);
  BlockTable table(absl::MakeSpan(storage), 2, 4, l);
  const absl::Status huge = table.Reserve(0, 2147483647);
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument) << huge;
  EXPECT_EQ(table.blocks_of(0), 0);

  std::vector<int32_t> short_storage(4 + 2, 7);  // one row and a half for two sequences
  BlockTable short_table(absl::MakeSpan(short_storage), 2, 4, l);
  EXPECT_TRUE(short_table.Reserve(0, 64).ok());
  const absl::Status past = short_table.Reserve(1, 16);
  EXPECT_EQ(past.code(), absl::StatusCode::kFailedPrecondition) << past;
  EXPECT_EQ(short_table.blocks_of(1), 0);

  std::vector<int32_t> none;
  BlockTable unvalidated(absl::MakeSpan(none), 1, 0, Layout(4, 0));
  EXPECT_EQ(unvalidated.Reserve(0, 1).code(), absl::StatusCode::kFailedPrecondition);
  BlockTable negative(absl::MakeSpan(none), -1, -2, Layout(-3, 16));
  EXPECT_EQ(negative.free_blocks(), 0);
  EXPECT_EQ(negative.Reserve(0, 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(FillSlotMappingTest, RefusesMoreSequencesThanTheTable) {
  const PagedKvLayout l = Layout(8, 16);
  std::vector<int32_t> storage(2 * 2);
  BlockTable table(absl::MakeSpan(storage), 2, 2, l);
  ASSERT_TRUE(table.Reserve(0, 4).ok());
  ASSERT_TRUE(table.Reserve(1, 4).ok());
  std::vector<int32_t> slots(8);
  const std::vector<SeqLens> three = {{1, 4}, {1, 4}, {1, 4}};
  const absl::Status more = FillSlotMapping(three, table, absl::MakeSpan(slots));
  EXPECT_EQ(more.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(more.message().find("3 sequences; the block table holds 2"), std::string::npos)
      << more;
  const std::vector<SeqLens> two = {{1, 4}, {1, 4}};
  EXPECT_TRUE(FillSlotMapping(two, table, absl::MakeSpan(slots)).ok());
}

TEST(FillSlotMappingTest, MapsNewTokensAndPadsTheRest) {
  const int bs = 16;
  const PagedKvLayout l = Layout(16, bs);
  std::vector<int32_t> storage(3 * 4);
  BlockTable table(absl::MakeSpan(storage), 3, 4, l);
  const std::vector<int32_t> order = {5, 9, 2, 7, 0, 1, 3, 4, 6, 8, 10, 11, 12, 13, 14, 15};
  ASSERT_TRUE(table.SetFreeOrder(order).ok());
  // Sequence 0: 3 new tokens ending at kv_len 18 (positions 15, 16, 17); sequence 1: one
  // decode token at position 40; sequence 2: nothing new.
  const std::vector<SeqLens> seqs = {{3, 18}, {1, 41}, {0, 7}};
  ASSERT_TRUE(table.Reserve(0, 18).ok());  // blocks 5, 9
  ASSERT_TRUE(table.Reserve(1, 41).ok());  // blocks 2, 7, 0
  ASSERT_TRUE(table.Reserve(2, 7).ok());   // block 1
  std::vector<int32_t> slots(6, 99);
  ASSERT_TRUE(FillSlotMapping(seqs, table, absl::MakeSpan(slots)).ok());
  EXPECT_EQ(slots[0], 5 * bs + 15);
  EXPECT_EQ(slots[1], 9 * bs + 0);
  EXPECT_EQ(slots[2], 9 * bs + 1);
  EXPECT_EQ(slots[3], 0 * bs + 8);  // position 40: logical block 2 -> block 0, offset 8
  EXPECT_EQ(slots[4], -1);
  EXPECT_EQ(slots[5], -1);
  std::vector<int32_t> short_slots(2);
  EXPECT_FALSE(FillSlotMapping(seqs, table, absl::MakeSpan(short_slots)).ok());
  const std::vector<SeqLens> unreserved = {{1, 70}};
  EXPECT_FALSE(FillSlotMapping(unreserved, table, absl::MakeSpan(slots)).ok());
}

}  // namespace
}  // namespace kiln
