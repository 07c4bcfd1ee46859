#include "graph/pool_arena.h"

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// A model of the arena's rules in 128 bits: Rebase, Begin, Allocate, NeedsGrowth and End drawn
// at random (budgets and sizes from 0 to SIZE_MAX, bases anywhere, aligned or not, up to the top
// of the address space; keys with any size and mode) must give the model's answer, and every
// address handed out is aligned, inside [base, base + reserved) and disjoint from the others of
// its sequence.
TEST(PoolArenaTest, RandomOperationsFollowTheModel) {
  using u128 = unsigned __int128;
  std::mt19937_64 rng(17);
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  auto pick_size = [&]() -> size_t {
    static const size_t kEdges[] = {0, 1, 255, 256, 257, 4096, 1 << 20, kMax / 2, kMax - 256,
                                    kMax - 255, kMax - 1, kMax};
    switch (rng() % 3) {
      case 0:
        return kEdges[rng() % 12];
      case 1:
        return static_cast<size_t>(rng() % 5000);
      default:
        return static_cast<size_t>(rng() >> (rng() % 64));
    }
  };
  int allocations = 0, exhausted = 0, growth = 0, rebase_refused = 0;
  for (int arena_index = 0; arena_index < 300; ++arena_index) {
    const size_t budget = rng() % 4 == 0 ? pick_size() : 1 + rng() % (1 << 20);
    PoolArena arena(budget);
    // The model.
    u128 base = 0, reserved = 0, offset = 0, high = 0;
    bool open = false;
    CaptureKey key;
    std::map<CaptureKey, size_t> per_key;
    std::vector<std::pair<u128, u128>> taken;  // this sequence's [begin, end)
    for (int op = 0; op < 200; ++op) {
      switch (rng() % 6) {
        case 0: {  // Rebase
          uintptr_t new_base;
          switch (rng() % 3) {
            case 0:
              new_base = kMax - rng() % 4096;  // at the top: the region may wrap
              break;
            case 1:
              new_base = static_cast<uintptr_t>(rng());
              break;
            default:
              new_base = static_cast<uintptr_t>(rng()) / 256 * 256;
          }
          if (rng() % 2 == 0) new_base = new_base / 256 * 256;
          const size_t bytes = rng() % 2 == 0 ? pick_size() : static_cast<size_t>(rng() % 8192);
          const absl::Status s = arena.Rebase(new_base, bytes);
          // Refused while open; then unaligned, running past the top of the address space (the
          // arena would hand out wrapped addresses), or over the budget.
          absl::StatusCode want = absl::StatusCode::kOk;
          if (open) {
            want = absl::StatusCode::kFailedPrecondition;
          } else if (new_base % 256 != 0 || static_cast<u128>(new_base) + bytes > kMax ||
                     bytes > budget) {
            want = absl::StatusCode::kInvalidArgument;
          }
          ASSERT_EQ(s.code(), want) << s << " base " << new_base << " bytes " << bytes;
          if (s.ok()) {
            base = new_base;
            reserved = bytes;
          } else {
            ++rebase_refused;
            EXPECT_TRUE(s.message()[0] >= 'A' && s.message()[0] <= 'Z') << s;
          }
          break;
        }
        case 1: {  // Begin
          const int sizes[] = {std::numeric_limits<int>::min(), -1, 0, 1, 8, 256, 65536,
                               std::numeric_limits<int>::max()};
          key = CaptureKey{static_cast<GraphMode>(rng() % 5), sizes[rng() % 8]};
          arena.Begin(key);
          open = true;
          offset = 0;
          taken.clear();
          per_key.emplace(key, 0);
          break;
        }
        case 2:
          arena.End();
          open = false;
          break;
        default: {  // Allocate (and NeedsGrowth first)
          const size_t bytes = pick_size();
          const u128 aligned = (static_cast<u128>(bytes) + 255) / 256 * 256;
          const bool over_budget = offset + aligned > budget;
          const bool needs_growth = !over_budget && offset + aligned > reserved;
          ASSERT_EQ(arena.NeedsGrowth(bytes), open && needs_growth) << bytes;
          const absl::StatusOr<uintptr_t> p = arena.Allocate(bytes, "chunk");
          if (!open) {
            ASSERT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
            break;
          }
          if (over_budget) {
            ++exhausted;
            ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << bytes;
            ASSERT_THAT(std::string(p.status().message()),
                        HasSubstr(absl::StrCat("capturing ", KeyName(key), ": 'chunk' asks ",
                                               bytes, " bytes")));
            break;
          }
          if (needs_growth) {
            ++growth;
            ASSERT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition) << bytes;
            ASSERT_THAT(std::string(p.status().message()),
                        HasSubstr(absl::StrCat("grow to ",
                                               static_cast<uint64_t>(offset + aligned))));
            break;
          }
          ASSERT_TRUE(p.ok()) << p.status();
          ++allocations;
          const u128 at = *p;
          ASSERT_EQ(at, base + offset);
          ASSERT_EQ(at % 256, 0u);
          ASSERT_LE(at + aligned, base + reserved);
          for (const auto& [b, e] : taken) {
            ASSERT_TRUE(at + aligned <= b || e <= at || aligned == 0);
          }
          taken.push_back({at, at + aligned});
          offset += aligned;
          high = std::max(high, offset);
          per_key[key] = std::max<size_t>(per_key[key], static_cast<size_t>(offset));
        }
      }
      ASSERT_EQ(arena.open(), open);
      ASSERT_EQ(arena.in_use_bytes(), open ? static_cast<size_t>(offset) : 0u);
      ASSERT_LE(arena.in_use_bytes(), budget);
      ASSERT_EQ(arena.high_water_bytes(), static_cast<size_t>(high));
      ASSERT_EQ(arena.per_key_high_water(), per_key);
    }
  }
  EXPECT_GT(allocations, 2000);
  EXPECT_GT(exhausted, 300);
  EXPECT_GT(growth, 300);
  EXPECT_GT(rebase_refused, 300);
  // The region that used to be accepted: 4 KiB at 2^64 - 256 runs past the end.
  PoolArena top(1 << 20);
  EXPECT_EQ(top.Rebase(kMax - 255, 4096).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
