// Host-only checks of the prefill launcher's validation and of the test planner's tile bound;
// they need no GPU.
#include <cmath>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "attention/prefill_kernel.h"
#include "attention/prefill_kernel_internal.h"
#include "attention/prefill_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using prefill_testing::SeqSpec;

PrefillAttentionParams ValidParams() {
  alignas(16) static int dummy[4];
  static AttentionWorkItem item;
  PrefillAttentionParams p;
  p.num_q_heads = 32;
  p.num_kv_heads = 8;
  p.block_size = 16;
  p.max_blocks_per_seq = 4;
  p.q = dummy;
  p.o = dummy;
  p.k_cache = dummy;
  p.v_cache = dummy;
  p.block_table = dummy;
  p.seq_q_start = dummy;
  p.seq_kv_len = dummy;
  p.work_items = &item;
  p.num_work_items = 1;
  return p;
}

TEST(PrefillKernelTest, AcceptsSupportedConfigurations) {
  for (AttentionDtype dtype : {AttentionDtype::kBf16, AttentionDtype::kFp16}) {
    for (int head_dim : {64, 128}) {
      for (int tile_rows : {64, 128}) {
        PrefillAttentionParams p = ValidParams();
        p.dtype = dtype;
        p.head_dim = head_dim;
        p.tile_rows = tile_rows;
        EXPECT_TRUE(ValidatePrefillAttentionParams(p).ok());
        EXPECT_GT(PrefillAttentionSharedMemoryBytes(dtype, head_dim, tile_rows), 0);
        EXPECT_LE(PrefillAttentionSharedMemoryBytes(dtype, head_dim, tile_rows), 227 * 1024 / 2)
            << "two CTAs must fit one SM";
      }
    }
  }
}

TEST(PrefillKernelTest, RejectsBadValuesNamingThem) {
  PrefillAttentionParams p = ValidParams();
  p.head_dim = 96;
  absl::Status s = ValidatePrefillAttentionParams(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("head_dim 96"));

  p = ValidParams();
  p.tile_rows = 32;
  EXPECT_THAT(ValidatePrefillAttentionParams(p).message(), HasSubstr("tile_rows 32"));

  p = ValidParams();
  p.num_q_heads = 12;
  p.num_kv_heads = 8;
  EXPECT_THAT(ValidatePrefillAttentionParams(p).message(), HasSubstr("num_q_heads 12"));

  p = ValidParams();
  p.block_size = 0;
  EXPECT_THAT(ValidatePrefillAttentionParams(p).message(), HasSubstr("block_size 0"));

  p = ValidParams();
  p.q = nullptr;
  EXPECT_EQ(ValidatePrefillAttentionParams(p).code(), absl::StatusCode::kInvalidArgument);

  p = ValidParams();
  p.partial_o = reinterpret_cast<float*>(&p);
  EXPECT_THAT(ValidatePrefillAttentionParams(p).message(), HasSubstr("partial_lse"));

  p = ValidParams();
  p.q_stride = 100;
  EXPECT_THAT(ValidatePrefillAttentionParams(p).message(), HasSubstr("q_stride 100"));

  p = ValidParams();
  p.o_stride = 32 * 128 + 4;
  EXPECT_EQ(ValidatePrefillAttentionParams(p).code(), absl::StatusCode::kInvalidArgument);

  p = ValidParams();
  p.softmax_scale = -1.0f;
  EXPECT_THAT(ValidatePrefillAttentionParams(p).message(), HasSubstr("softmax_scale"));

  // cp.async copies q, k and v 16 bytes at a time.
  alignas(16) static int buffer[4];
  for (const void** tensor : {&p.q, &p.k_cache, &p.v_cache}) {
    p = ValidParams();
    *tensor = &buffer[1];  // 4 bytes past a 16-byte boundary
    EXPECT_THAT(ValidatePrefillAttentionParams(p).message(), HasSubstr("16-byte aligned"));
  }
}

TEST(PrefillKernelTest, ZeroItemsLaunchNothing) {
  PrefillAttentionParams p = ValidParams();
  p.num_work_items = 0;
  EXPECT_TRUE(LaunchPrefillAttention(p, nullptr).ok());
}

// The DESIGN example: [13,13] needs 4 tiles with G = 5, T = 64; the closed form covers it.
TEST(PrefillKernelTest, TileCapacityCoversEverySplit) {
  EXPECT_EQ(prefill_testing::BuildPlan({{13, 13}, {13, 13}}, 5, 64, 0).items.size(), 4u);
  EXPECT_EQ(prefill_testing::TileCapacity(26, 2, 5, 64), 4);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int group = 1 + static_cast<int>(rng() % 8);
    const int tile_rows = rng() % 2 ? 64 : 128;
    const int budget = 1 + static_cast<int>(rng() % 600);
    const int max_seqs = 1 + static_cast<int>(rng() % 32);
    std::vector<SeqSpec> seqs;
    int left = budget;
    while (left > 0 && static_cast<int>(seqs.size()) < max_seqs) {
      const int q = 1 + static_cast<int>(rng() % left);
      seqs.push_back({q, q});
      left -= q;
    }
    const int items =
        static_cast<int>(prefill_testing::BuildPlan(seqs, group, tile_rows, 0).items.size());
    ASSERT_LE(items, prefill_testing::TileCapacity(budget, max_seqs, group, tile_rows));
  }
}

TEST(PrefillKernelTest, SplitPlanCoversEachTileOnce) {
  const std::vector<SeqSpec> seqs = {{100, 500}, {1, 1}, {64, 1000}};
  const auto plan = prefill_testing::BuildPlan(seqs, 4, 64, 128, /*extra_empty_chunk=*/true);
  int slots = 0;
  for (const AttentionMergeItem& m : plan.merges) {
    EXPECT_EQ(m.first_slot, slots);
    EXPECT_GE(m.num_slots, 2);
    slots += m.num_slots;
  }
  EXPECT_EQ(slots, plan.num_slots);
  int partial = 0;
  for (const AttentionWorkItem& it : plan.items) partial += it.partial_slot >= 0;
  EXPECT_EQ(partial, plan.num_slots);
}

TEST(PrefillKernelTest, FastDivMatchesDivision) {
  std::mt19937 rng(11);
  for (uint32_t d : {1u, 2u, 3u, 5u, 7u, 16u, 24u, 100u, 128u, 1000u, 4097u, 65535u, 1u << 20}) {
    const auto f = prefill_internal::FastDiv::Make(d);
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, 2 * d - 1, 2 * d, 0x7FFFFFFFu, 0x7FFFFFFFu - d}) {
      ASSERT_EQ(f.Div(n), n / d) << n << " / " << d;
    }
    for (int i = 0; i < 20000; ++i) {
      const uint32_t n = rng() & 0x7FFFFFFFu;
      ASSERT_EQ(f.Div(n), n / d) << n << " / " << d;
    }
  }
}

TEST(PrefillKernelTest, HalfAndBf16ConversionsRoundTrip) {
  for (float v : {0.0f, 1.0f, -2.0f, 0.333f, 1e-6f, 65504.0f, -7.5e-5f}) {
    for (AttentionDtype d : {AttentionDtype::kBf16, AttentionDtype::kFp16}) {
      const float back = prefill_testing::BitsToFloat(prefill_testing::FloatToBits(v, d), d);
      EXPECT_NEAR(back, v, std::fabs(v) * (d == AttentionDtype::kBf16 ? 4e-3 : 5e-4) + 6e-8)
          << v;
    }
  }
  EXPECT_EQ(prefill_testing::FloatToBits(1.0f, AttentionDtype::kFp16), 0x3C00);
  EXPECT_EQ(prefill_testing::FloatToBits(1.0f, AttentionDtype::kBf16), 0x3F80);
}

}  // namespace
}  // namespace kiln
