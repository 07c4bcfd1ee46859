// Host tests of the custom all-reduce's device layout (custom_allreduce_kernels.h): where a call's
// data lands in a rank's IPC region, for any element count, dtype and world size, and when the
// pushed-input layouts fit a staging half. No GPU: the layout is plain arithmetic.
#include "collectives/internal/custom_allreduce_kernels.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kiln {
namespace internal {
namespace {

using u128 = unsigned __int128;

// PushedInputsFit's rule, in 128 bits: one-shot needs W * packs packs of staging, two-shot
// 2 * W * ceil(packs / W) (custom_allreduce_kernels.cuh), 16 bytes each.
bool FitsReference(uint64_t packs, int world, bool two_shot, uint64_t half_bytes) {
  if (world < 1) return false;
  const u128 w = static_cast<u128>(world);
  const u128 needed = two_shot ? 2 * w * ((static_cast<u128>(packs) + w - 1) / w) : w * packs;
  return needed * 16 <= half_bytes;
}

uint64_t PickPacks(std::mt19937_64& rng) {
  static const uint64_t kEdges[] = {0,
                                    1,
                                    2,
                                    7,
                                    8,
                                    4096,
                                    65536,
                                    uint64_t{1} << 36,
                                    uint64_t{1} << 59,
                                    uint64_t{1} << 60,  // x 16 bytes = 2^64
                                    uint64_t{1} << 61,
                                    (uint64_t{1} << 62) + 1,
                                    std::numeric_limits<uint64_t>::max() - 1,
                                    std::numeric_limits<uint64_t>::max()};
  switch (rng() % 3) {
    case 0:
      return kEdges[rng() % (sizeof(kEdges) / sizeof(kEdges[0]))];
    case 1:
      return rng() >> (rng() % 64);
    default:
      return rng() % 100000;
  }
}

uint64_t PickHalfBytes(std::mt19937_64& rng) {
  static const uint64_t kEdges[] = {0, 15, 16, 32, 8 << 20, uint64_t{1} << 40,
                                    std::numeric_limits<uint64_t>::max()};
  return rng() % 3 == 0 ? kEdges[rng() % 7] : (rng() >> (rng() % 64)) / 16 * 16;
}

TEST(CustomAllReduceLayoutTest, PushedInputsFitIsExactForAnyPacksWorldAndHalf) {
  // Counts up to 2^64 - 1 packs used to wrap W * packs * 16 to a small number that "fit" (2^60
  // packs at world 8 needed 2^67 bytes and read as 0), and world 0 divided by zero.
  std::mt19937_64 rng(11);
  const int worlds[] = {INT_MIN, -8, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 1024, INT_MAX};
  int fits = 0;
  for (int i = 0; i < 300000; ++i) {
    const uint64_t packs = PickPacks(rng);
    const int world = rng() % 2 == 0 ? worlds[rng() % 16] : 2 * (1 + static_cast<int>(rng() % 4));
    const bool two_shot = rng() % 2 == 0;
    const uint64_t half = PickHalfBytes(rng);
    const bool want = FitsReference(packs, world, two_shot, half);
    ASSERT_EQ(PushedInputsFit(packs, world, two_shot, half), want)
        << "packs " << packs << " world " << world << " two_shot " << two_shot << " half "
        << half;
    fits += want;
  }
  EXPECT_GT(fits, 30000);
  EXPECT_FALSE(PushedInputsFit(uint64_t{1} << 60, 8, false, 8 << 20));
  EXPECT_FALSE(PushedInputsFit(16, 0, true, 8 << 20));
}

// One writer's range of packs within a staging half: [begin, end).
struct Range {
  u128 begin, end;
  std::string what;
};

// Where a call of `packs` on `world` ranks writes into one rank's staging half, per writer, as
// custom_allreduce_kernels.cuh lays it out.
std::vector<Range> StagingRanges(uint64_t packs, int world, bool two_shot, bool push_inputs) {
  const u128 n = packs, w = static_cast<u128>(world);
  std::vector<Range> out;
  if (!two_shot) {
    if (!push_inputs) return {{0, n, "own input"}};
    for (int r = 0; r < world; ++r) out.push_back({r * n, (r + 1) * n, "pushed input of a rank"});
    return out;
  }
  const u128 shard = (n + w - 1) / w;
  if (!push_inputs) return {{0, n, "own input, then gathered shards"}};
  for (int r = 0; r < world; ++r) {
    out.push_back({r * shard, (r + 1) * shard, "inbox of a rank"});
  }
  out.push_back({w * shard, w * shard + n, "gather area"});
  return out;
}

TEST(CustomAllReduceLayoutTest, EveryAcceptedCallStaysInsideItsStagingHalfAndDisjoint) {
  // Every call the host lets through (bytes a positive multiple of 16 of at most half_bytes, for
  // every dtype's element count and every custom world size, pushing its inputs only where
  // PushedInputsFit says so): each writer's range ends within the staging half, the writers'
  // ranges are disjoint, both halves are 16-byte aligned and end within the region the host
  // allocates (kStagingOffset + 2 * half_bytes, which does not wrap for any half_bytes up to the
  // config's 1 TiB), after the barrier flags and probe slots.
  static_assert(kFlagsBytes <= kProbeOffset, "flags overlap the probes");
  static_assert(kProbeOffset + kMaxRanks * 16 <= kStagingOffset, "probes overlap staging");
  static_assert(kStagingOffset % 16 == 0, "staging is not 16-byte aligned");
  std::mt19937_64 rng(12);
  const size_t dtype_sizes[] = {2, 2, 4};  // bf16, fp16, fp32
  std::vector<uint64_t> halves = {16, 32, 48, 4096, 65536, 8 << 20, uint64_t{1} << 40};
  for (int i = 0; i < 20; ++i) halves.push_back((1 + rng() % (uint64_t{1} << 40) / 16) * 16);
  int calls = 0, pushed = 0;
  for (uint64_t half : halves) {
    const u128 region = static_cast<u128>(kStagingOffset) + 2 * static_cast<u128>(half);
    ASSERT_LE(region, static_cast<u128>(std::numeric_limits<size_t>::max()));
    for (int world : {2, 4, 6, 8}) {
      for (bool two_shot : {false, true}) {
        // Every count for small halves, a random sample and the edges for the others.
        std::vector<uint64_t> counts;
        const uint64_t max_count = half / 2;  // bf16 elements filling the half
        if (max_count <= 4096) {
          for (uint64_t c = 1; c <= max_count; ++c) counts.push_back(c);
        } else {
          for (int j = 0; j < 600; ++j) {
            const uint64_t c = 1 + rng() % max_count;
            counts.push_back(j % 2 == 0 ? std::max<uint64_t>(8, c / 8 * 8) : c);  // most fit
          }
          for (uint64_t c : {uint64_t{1}, uint64_t{8}, max_count / 2, max_count - 8, max_count}) {
            counts.push_back(c);
          }
        }
        for (uint64_t count : counts) {
          for (size_t element : dtype_sizes) {
            const u128 bytes = static_cast<u128>(count) * element;
            if (bytes == 0 || bytes % 16 != 0 || bytes > half) continue;  // the host refuses
            const uint64_t packs = static_cast<uint64_t>(bytes / 16);
            ++calls;
            for (bool push : {false, true}) {
              if (push && !PushedInputsFit(packs, world, two_shot, half)) continue;
              pushed += push;
              std::vector<Range> ranges = StagingRanges(packs, world, two_shot, push);
              std::sort(ranges.begin(), ranges.end(),
                        [](const Range& a, const Range& b) { return a.begin < b.begin; });
              for (size_t k = 0; k < ranges.size(); ++k) {
                const Range& r = ranges[k];
                ASSERT_LE(r.end * 16, static_cast<u128>(half))
                    << r.what << " of " << packs << " packs, world " << world << ", half "
                    << half << (two_shot ? " two-shot" : " one-shot") << (push ? " push" : "");
                if (k > 0) {
                  ASSERT_LE(ranges[k - 1].end, r.begin) << r.what << " overlaps";
                }
                // Both staging halves: aligned, after the flags, inside the region.
                for (u128 set : {u128{0}, u128{1}}) {
                  const u128 at = kStagingOffset + set * half + r.begin * 16;
                  ASSERT_EQ(at % 16, 0u);
                  ASSERT_GE(at, static_cast<u128>(kStagingOffset));
                  ASSERT_LE(kStagingOffset + set * half + r.end * 16, region);
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(calls, 50000);
  EXPECT_GT(pushed, 10000);
}

}  // namespace
}  // namespace internal
}  // namespace kiln
