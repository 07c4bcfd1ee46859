// Host-only checks of the prefill launcher's validation and of the test planner's tile bound;
// they need no GPU.
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "attention/prefill_kernel.h"
#include "attention/internal/sweep_values.h"
#include "attention/prefill_kernel_internal.h"
#include "attention/prefill_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using attention_internal::EdgeValues;
using attention_internal::Pick;
using attention_internal::Uniform;
using attention_internal::kInt32Max;

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


// --- Adversarial sweeps of the host-side checks. Seeded, so a failure reproduces.


// Each field of a valid launch, replaced now and then by an adversarial value: the check
// refuses exactly what the kernel's documented contract excludes, naming a bad field, and
// LaunchPrefillAttention (with no items: nothing reaches a GPU) answers the same.
TEST(PrefillKernelTest, ValidationSweepRefusesExactlyTheContractsExclusions) {
  std::mt19937 rng(2718);
  const std::vector<int32_t> edges = EdgeValues();
  alignas(16) static char buffer[64];
  const std::vector<const void*> pointers = {buffer, buffer + 16, nullptr, buffer + 4,
                                             buffer + 8, buffer + 2};
  const std::vector<float> scales = {0.0f,
                                     0.125f,
                                     1.0f,
                                     -0.0f,
                                     -1.0f,
                                     std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity(),
                                     std::nanf(""),
                                     std::numeric_limits<float>::denorm_min(),
                                     std::numeric_limits<float>::max()};
  int accepted = 0, refused = 0;
  for (int trial = 0; trial < 50000; ++trial) {
    PrefillAttentionParams p = ValidParams();
    p.dtype = rng() % 2 ? AttentionDtype::kBf16 : AttentionDtype::kFp16;
    p.head_dim = rng() % 2 ? 64 : 128;
    p.tile_rows = rng() % 2 ? 64 : 128;
    const auto edge = [&](int32_t fallback) {
      return rng() % 8 == 0 ? Pick(rng, edges) : fallback;
    };
    // Usually one to three fields go bad; the rest stay valid.
    const int mutations = Uniform(rng, 0, 3);
    for (int m = 0; m < mutations; ++m) {
      switch (Uniform(rng, 0, 16)) {
        case 0: p.dtype = static_cast<AttentionDtype>(Pick<int32_t>(rng, {-1, 2, 7, 0, 1})); break;
        case 1: p.head_dim = Pick<int32_t>(rng, {0, -64, 32, 63, 64, 96, 128, 256}); break;
        case 2: p.tile_rows = Pick<int32_t>(rng, {0, -1, 16, 32, 63, 64, 127, 128, 256}); break;
        case 3: p.num_kv_heads = edge(Uniform(rng, 1, 70000)); break;
        case 4:  // a whole group, or one head more
          p.num_q_heads = edge(static_cast<int32_t>(std::min<int64_t>(
              kInt32Max, int64_t{p.num_kv_heads} * Uniform(rng, 1, 8) + Uniform(rng, 0, 1))));
          break;
        case 5: p.block_size = edge(Uniform(rng, -2, 64)); break;
        case 6: p.max_blocks_per_seq = edge(Uniform(rng, -2, 64)); break;
        case 7: p.q_stride = Pick<int64_t>(rng, {0, -8, 8, 100, 4096, 4096 + 4, 4104, 1LL << 40,
                                                 std::numeric_limits<int64_t>::min()}); break;
        case 8: p.o_stride = Pick<int64_t>(rng, {0, -8, 8, 100, 8192, 8192 + 2, 8200,
                                                 std::numeric_limits<int64_t>::max()}); break;
        case 9: p.num_work_items = edge(Uniform(rng, -1, 4)); break;
        case 10: p.softmax_scale = Pick(rng, scales); break;
        case 11: p.q = Pick(rng, pointers); break;
        case 12: p.o = const_cast<void*>(Pick(rng, pointers)); break;
        case 13: p.k_cache = Pick(rng, pointers); break;
        case 14: p.v_cache = Pick(rng, pointers); break;
        case 15: p.partial_o = static_cast<float*>(const_cast<void*>(Pick(rng, pointers))); break;
        default: p.partial_lse = static_cast<float*>(const_cast<void*>(Pick(rng, pointers)));
      }
    }
    // The contract (prefill_kernel.h), written out here: every string of one entry must appear
    // in the message of a refusal.
    std::vector<std::vector<std::string>> bad;
    const int dtype = static_cast<int>(p.dtype);
    if (dtype != 0 && dtype != 1) bad.push_back({"dtype " + std::to_string(dtype)});
    if (p.head_dim != 64 && p.head_dim != 128) {
      bad.push_back({"head_dim " + std::to_string(p.head_dim)});
    }
    if (p.tile_rows != 64 && p.tile_rows != 128) {
      bad.push_back({"tile_rows " + std::to_string(p.tile_rows)});
    }
    if (p.num_kv_heads <= 0 || p.num_kv_heads > 65535) {
      bad.push_back({"num_kv_heads " + std::to_string(p.num_kv_heads)});
    } else if (p.num_q_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) {
      bad.push_back({"num_q_heads " + std::to_string(p.num_q_heads)});
    }
    if (p.block_size <= 0) bad.push_back({"block_size " + std::to_string(p.block_size)});
    if (p.max_blocks_per_seq <= 0) {
      bad.push_back({"max_blocks_per_seq " + std::to_string(p.max_blocks_per_seq)});
    }
    const int64_t row = int64_t{p.num_q_heads} * p.head_dim;
    if (p.q_stride != 0 && (p.q_stride < row || p.q_stride % 8 != 0)) {
      bad.push_back({"q_stride " + std::to_string(p.q_stride)});
    }
    if (p.o_stride != 0 && (p.o_stride < row || p.o_stride % 8 != 0)) {
      bad.push_back({"o_stride " + std::to_string(p.o_stride)});
    }
    if (p.num_work_items < 0) {
      bad.push_back({"num_work_items " + std::to_string(p.num_work_items)});
    }
    if (!(p.softmax_scale >= 0.0f) || std::isinf(p.softmax_scale)) {
      bad.push_back({"softmax_scale"});
    }
    if (p.q == nullptr || p.o == nullptr || p.k_cache == nullptr || p.v_cache == nullptr) {
      bad.push_back({"one is null"});
    }
    if ((p.partial_o == nullptr) != (p.partial_lse == nullptr)) {
      bad.push_back({"partial_o and partial_lse"});
    }
    const auto misaligned = [](const void* ptr, uintptr_t bytes) {
      return reinterpret_cast<uintptr_t>(ptr) % bytes != 0;
    };
    if (misaligned(p.q, 16) || misaligned(p.k_cache, 16) || misaligned(p.v_cache, 16) ||
        misaligned(p.o, 4) || misaligned(p.partial_o, 8)) {
      bad.push_back({"aligned"});
    }
    const absl::Status status = ValidatePrefillAttentionParams(p);
    const std::string where = "trial " + std::to_string(trial) + ": " + status.ToString();
    if (bad.empty()) {
      ASSERT_TRUE(status.ok()) << where;
      ++accepted;
    } else {
      ++refused;
      ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << where;
      const std::string message(status.message());
      ASSERT_FALSE(message.empty());
      ASSERT_TRUE(std::isupper(static_cast<unsigned char>(message[0])) ||
                  message.rfind("num_", 0) == 0 || message.rfind("softmax_scale", 0) == 0)
          << where;
      ASSERT_NE(message.back(), '.') << where;
      bool named = false;
      for (const auto& any : bad) {
        bool all = true;
        for (const std::string& part : any) all = all && message.find(part) != std::string::npos;
        named = named || all;
      }
      ASSERT_TRUE(named) << where;
    }
    // With no work items the launcher validates and returns: the same answer, nothing launched.
    p.num_work_items = p.num_work_items < 0 ? p.num_work_items : 0;
    if (p.num_work_items == 0) {
      ASSERT_EQ(LaunchPrefillAttention(p, nullptr).code(), status.code()) << where;
    }
  }
  RecordProperty("accepted", accepted);
  RecordProperty("refused", refused);
  EXPECT_GT(accepted, 5000);
  EXPECT_GT(refused, 20000);
}

// The kernel's division by the group and the block size, for every divisor an int32 can be
// (including int32's largest) and dividends up to 2^31 - 1, against the hardware division.
TEST(PrefillKernelTest, FastDivSweepMatchesDivisionForEveryDivisorRange) {
  std::mt19937 rng(99);
  std::vector<uint32_t> divisors;
  for (int32_t d : EdgeValues()) {
    if (d > 0) divisors.push_back(static_cast<uint32_t>(d));
  }
  for (int i = 0; i < 2000; ++i) {
    divisors.push_back(1 + static_cast<uint32_t>(rng() % 0x7FFFFFFFu));
    divisors.push_back(1 + static_cast<uint32_t>(rng() % 4096));
  }
  for (uint32_t d : divisors) {
    const auto f = prefill_internal::FastDiv::Make(d);
    ASSERT_EQ(f.divisor, d);
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, 0x7FFFFFFFu, 0x7FFFFFFFu - 1, 0x7FFFFFFFu - d,
                       0x40000000u}) {
      if (n > 0x7FFFFFFFu) continue;
      ASSERT_EQ(f.Div(n), n / d) << n << " / " << d;
    }
    for (int i = 0; i < 100; ++i) {
      const uint32_t n = rng() & 0x7FFFFFFFu;
      ASSERT_EQ(f.Div(n), n / d) << n << " / " << d;
      const uint32_t near = static_cast<uint32_t>(
          std::min<uint64_t>(0x7FFFFFFFu, uint64_t{d} * (n % 64) + (rng() % 3)));
      ASSERT_EQ(f.Div(near), near / d) << near << " / " << d;
    }
  }
}

}  // namespace
}  // namespace kiln
