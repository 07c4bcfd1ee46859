#include "graph/pool_arena.h"

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

constexpr uintptr_t kBase = 0x7f0000000000;  // a fake device address, 256-byte aligned
constexpr CaptureKey kDecode8{GraphMode::kDecode, 8};
constexpr CaptureKey kDecode64{GraphMode::kDecode, 64};

TEST(PoolArenaTest, AllocationsAreAlignedAndContiguous) {
  PoolArena arena(1 << 20);
  ASSERT_TRUE(arena.Rebase(kBase, 1 << 20).ok());
  arena.Begin(kDecode8);
  absl::StatusOr<uintptr_t> a = arena.Allocate(1, "a");
  absl::StatusOr<uintptr_t> b = arena.Allocate(257, "b");
  absl::StatusOr<uintptr_t> c = arena.Allocate(256, "c");
  absl::StatusOr<uintptr_t> empty = arena.Allocate(0, "empty");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && empty.ok());
  EXPECT_EQ(*a, kBase);
  EXPECT_EQ(*b, kBase + 256);
  EXPECT_EQ(*c, kBase + 256 + 512);
  EXPECT_EQ(*empty, kBase + 1024);
  EXPECT_EQ(arena.in_use_bytes(), 1024u);
  for (uintptr_t p : {*a, *b, *c}) EXPECT_EQ(p % PoolArena::kAlignment, 0u);
  arena.End();
  EXPECT_EQ(arena.in_use_bytes(), 0u);
  EXPECT_EQ(arena.HighWater(kDecode8), 1024u);
}

TEST(PoolArenaTest, EverySequenceStartsAtTheBaseAndHighWaterIsTheMaximum) {
  PoolArena arena(64 << 20);
  ASSERT_TRUE(arena.Rebase(kBase, 64 << 20).ok());
  // Largest first, as GraphSet::CaptureAll does; each key asks a random number of chunks.
  size_t max_over_keys = 0, sum_over_keys = 0;
  for (int size : {256, 128, 64, 32, 8, 1}) {
    const CaptureKey key{GraphMode::kDecode, size};
    size_t expected = 0;
    for (int round = 0; round < 3; ++round) {  // two warm-ups and a capture: same addresses
      arena.Begin(key);
      std::mt19937 same(static_cast<uint32_t>(size));
      size_t offset = 0;
      const int chunks = 1 + size % 5;
      for (int i = 0; i < chunks; ++i) {
        const size_t bytes = static_cast<size_t>(size) * 1000 + same() % 777;
        absl::StatusOr<uintptr_t> p = arena.Allocate(bytes, "chunk");
        ASSERT_TRUE(p.ok()) << p.status();
        EXPECT_EQ(*p, kBase + offset);
        offset += PoolArena::AlignUp(bytes);
      }
      arena.End();
      expected = offset;
    }
    EXPECT_EQ(arena.HighWater(key), expected);
    max_over_keys = std::max(max_over_keys, expected);
    sum_over_keys += expected;
  }
  EXPECT_EQ(arena.high_water_bytes(), max_over_keys);
  EXPECT_LT(arena.high_water_bytes(), sum_over_keys);
  EXPECT_EQ(arena.per_key_high_water().size(), 6u);
  EXPECT_EQ(arena.per_key_high_water().rbegin()->first, (CaptureKey{GraphMode::kDecode, 256}));
}

TEST(PoolArenaTest, OverBudgetIsResourceExhaustedNamingKeyBytesAndBudget) {
  PoolArena arena(4096);
  ASSERT_TRUE(arena.Rebase(kBase, 4096).ok());
  arena.Begin(kDecode64);
  ASSERT_TRUE(arena.Allocate(3000, "weights scratch").ok());
  absl::StatusOr<uintptr_t> over = arena.Allocate(2000, "attention workspace");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(over.status().message());
  EXPECT_THAT(message, HasSubstr("decode/64"));
  EXPECT_THAT(message, HasSubstr("'attention workspace' asks 2000 bytes"));
  EXPECT_THAT(message, HasSubstr("3072 in use"));
  EXPECT_THAT(message, HasSubstr("budget of 4096 bytes"));
  // A huge request does not wrap around.
  EXPECT_EQ(arena.Allocate(~size_t{0}, "huge").status().code(),
            absl::StatusCode::kResourceExhausted);
  // The failed requests took nothing; the next capture starts clean.
  EXPECT_EQ(arena.in_use_bytes(), 3072u);
  arena.Begin(kDecode8);
  EXPECT_TRUE(arena.Allocate(4096, "all of it").ok());
  EXPECT_EQ(arena.high_water_bytes(), 4096u);
}

TEST(PoolArenaTest, GrowthBeyondTheReservedRegionIsSeparateFromTheBudget) {
  PoolArena arena(1 << 20);
  ASSERT_TRUE(arena.Rebase(kBase, 4096).ok());
  arena.Begin(kDecode8);
  EXPECT_FALSE(arena.NeedsGrowth(4096));
  EXPECT_TRUE(arena.NeedsGrowth(4097));
  EXPECT_FALSE(arena.NeedsGrowth((1 << 20) + 1));  // over budget, not growth
  absl::StatusOr<uintptr_t> grow = arena.Allocate(8192, "kv scratch");
  EXPECT_EQ(grow.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(grow.status().message()), HasSubstr("grow to 8192 bytes"));
  arena.End();
  EXPECT_EQ(arena.Rebase(kBase, 2 << 20).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arena.Rebase(kBase + 8, 4096).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(arena.Rebase(kBase + 0x100000, 8192).ok());
  arena.Begin(kDecode8);
  absl::StatusOr<uintptr_t> fits = arena.Allocate(8192, "kv scratch");
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(*fits, kBase + 0x100000);
  EXPECT_EQ(arena.Rebase(kBase, 4096).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PoolArenaTest, AllocationOutsideASequenceIsRefused) {
  PoolArena arena(4096);
  ASSERT_TRUE(arena.Rebase(kBase, 4096).ok());
  absl::StatusOr<uintptr_t> p = arena.Allocate(16, "early");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("'early'"));
  EXPECT_EQ(arena.HighWater(kDecode8), 0u);
}

// A budget of SIZE_MAX ("no limit") must not let a size within an alignment of SIZE_MAX round
// up to 0 bytes and come back as an allocation.
TEST(PoolArenaTest, SizesThatWouldWrapWhenAlignedAreRefused) {
  PoolArena arena(std::numeric_limits<size_t>::max());
  ASSERT_TRUE(arena.Rebase(kBase, 1 << 20).ok());
  arena.Begin(kDecode8);
  const size_t huge = std::numeric_limits<size_t>::max() - 10;
  EXPECT_FALSE(arena.NeedsGrowth(huge));
  absl::StatusOr<uintptr_t> p = arena.Allocate(huge, "huge");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(arena.in_use_bytes(), 0u);
  EXPECT_TRUE(arena.NeedsGrowth(2 << 20));
  absl::StatusOr<uintptr_t> small = arena.Allocate(300, "small");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(arena.in_use_bytes(), 512u);
}

TEST(PoolArenaTest, ZeroBudgetRefusesEverything) {
  PoolArena arena(0);
  ASSERT_TRUE(arena.Rebase(0, 0).ok());
  arena.Begin(kDecode8);
  EXPECT_EQ(arena.Allocate(1, "x").status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(arena.Allocate(0, "nothing").ok());
}

}  // namespace
}  // namespace kiln
