#include "collectives/allreduce_policy.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "collectives/allreduce_config.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

// Addresses with chosen alignment; the policy never dereferences them.
const void* Address(uintptr_t value) { return reinterpret_cast<const void*>(value); }

AllReduceRequest Request(size_t bytes, int world = 2) {
  AllReduceRequest r;
  r.bytes = bytes;
  r.world_size = world;
  r.in = Address(0x10000000);
  r.out = Address(0x20000000);
  r.custom_available = true;
  r.custom_max_bytes = AllReduceConfig().buffer_bytes();
  return r;
}

// CheckCustomAllReducePlan of `request` as `request.bytes / 2` bf16 elements.
absl::Status CheckPlan(const AllReducePlan& plan, const AllReduceRequest& request) {
  return CheckCustomAllReducePlan(plan, request, request.bytes / 2, "bf16");
}

TEST(AllReducePolicyTest, DefaultsAreValidAndOrdered) {
  AllReduceConfig config;
  EXPECT_TRUE(ValidateAllReduceConfig(config).ok());
  EXPECT_TRUE(config.enable_custom());
  EXPECT_EQ(config.buffer_bytes() % 16, 0);
  for (int world : {2, 4, 6, 8}) {
    EXPECT_GT(OneShotMaxBytes(config, world), 0) << world;
    EXPECT_LE(OneShotMaxBytes(config, world), TwoShotMaxBytes(config, world)) << world;
    EXPECT_LE(TwoShotMaxBytes(config, world), config.buffer_bytes()) << world;
  }
  EXPECT_EQ(OneShotMaxBytes(config, 3), 0);
  EXPECT_EQ(TwoShotMaxBytes(config, 16), 0);
}

TEST(AllReducePolicyTest, CrossoversPickOneShotTwoShotThenNccl) {
  AllReduceConfig config;
  config.set_one_shot_max_bytes_world4(1024);
  config.set_two_shot_max_bytes_world4(4096);
  EXPECT_EQ(SelectAllReduce(config, Request(16, 4)).algorithm, AllReduceAlgorithm::kOneShot);
  EXPECT_EQ(SelectAllReduce(config, Request(1024, 4)).algorithm, AllReduceAlgorithm::kOneShot);
  EXPECT_EQ(SelectAllReduce(config, Request(1040, 4)).algorithm, AllReduceAlgorithm::kTwoShot);
  EXPECT_EQ(SelectAllReduce(config, Request(4096, 4)).algorithm, AllReduceAlgorithm::kTwoShot);
  EXPECT_EQ(SelectAllReduce(config, Request(4112, 4)).algorithm, AllReduceAlgorithm::kNccl);
}

TEST(AllReducePolicyTest, OnlyWorldSizesTwoFourSixEight) {
  AllReduceConfig config;
  for (int world : {1, 3, 5, 7, 9, 16}) {
    EXPECT_FALSE(IsCustomWorldSize(world));
    EXPECT_EQ(SelectAllReduce(config, Request(4096, world)).algorithm, AllReduceAlgorithm::kNccl)
        << world;
  }
  for (int world : {2, 4, 6, 8}) {
    EXPECT_TRUE(IsCustomWorldSize(world));
    EXPECT_NE(SelectAllReduce(config, Request(4096, world)).algorithm, AllReduceAlgorithm::kNccl)
        << world;
  }
}

TEST(AllReducePolicyTest, UnalignedSizesAndPointersTakeNccl) {
  AllReduceConfig config;
  for (size_t bytes : {size_t{0}, size_t{2}, size_t{8}, size_t{24}, size_t{4098}}) {
    EXPECT_EQ(SelectAllReduce(config, Request(bytes)).algorithm, AllReduceAlgorithm::kNccl)
        << bytes;
  }
  AllReduceRequest r = Request(4096);
  r.in = Address(0x10000002);
  EXPECT_EQ(SelectAllReduce(config, r).algorithm, AllReduceAlgorithm::kNccl);
  r = Request(4096);
  r.out = Address(0x20000008);
  EXPECT_EQ(SelectAllReduce(config, r).algorithm, AllReduceAlgorithm::kNccl);
  r = Request(4096);
  r.in = Address(0x10000010);  // 16-byte aligned, not 256: fine
  EXPECT_EQ(SelectAllReduce(config, r).algorithm, AllReduceAlgorithm::kOneShot);
}

TEST(AllReducePolicyTest, OversizeTakesNcclAlsoWhileCapturing) {
  AllReduceConfig config;
  for (bool capturing : {false, true}) {
    AllReduceRequest r = Request(config.buffer_bytes() + 16);
    r.capturing = capturing;
    EXPECT_EQ(SelectAllReduce(config, r).algorithm, AllReduceAlgorithm::kNccl) << capturing;
    r = Request(config.buffer_bytes());
    r.capturing = capturing;
    EXPECT_NE(SelectAllReduce(config, r).algorithm, AllReduceAlgorithm::kNccl) << capturing;
    // A smaller buffer than the config's (the object's actual limit) wins.
    r = Request(4096);
    r.custom_max_bytes = 2048;
    r.capturing = capturing;
    EXPECT_EQ(SelectAllReduce(config, r).algorithm, AllReduceAlgorithm::kNccl) << capturing;
  }
}

TEST(AllReducePolicyTest, UnprovedP2pOrDisabledCustomTakesNccl) {
  AllReduceConfig config;
  AllReduceRequest r = Request(4096);
  r.custom_available = false;
  EXPECT_EQ(SelectAllReduce(config, r).algorithm, AllReduceAlgorithm::kNccl);
  config.set_enable_custom(false);
  EXPECT_EQ(SelectAllReduce(config, Request(4096)).algorithm, AllReduceAlgorithm::kNccl);
}

TEST(AllReducePolicyTest, InputModeFollowsCaptureAlgorithmAndAliasing) {
  AllReduceConfig config;
  config.set_one_shot_max_bytes_world4(4096);
  config.set_two_shot_max_bytes_world4(1 << 20);
  AllReduceRequest eager_one = Request(4096, 4);
  AllReduceRequest eager_two = Request(8192, 4);
  EXPECT_EQ(SelectAllReduce(config, eager_one).input, AllReduceInput::kStaged);
  EXPECT_EQ(SelectAllReduce(config, eager_two).input, AllReduceInput::kStaged);

  AllReduceRequest captured_two = eager_two;
  captured_two.capturing = true;
  EXPECT_EQ(SelectAllReduce(config, captured_two).algorithm, AllReduceAlgorithm::kTwoShot);
  EXPECT_EQ(SelectAllReduce(config, captured_two).input, AllReduceInput::kRegistered);
  captured_two.out = captured_two.in;  // two-shot in place is safe with registered inputs
  EXPECT_EQ(SelectAllReduce(config, captured_two).input, AllReduceInput::kRegistered);

  AllReduceRequest captured_one = eager_one;
  captured_one.capturing = true;
  EXPECT_EQ(SelectAllReduce(config, captured_one).input, AllReduceInput::kStaged);
  config.set_graph_one_shot_registered(true);
  EXPECT_EQ(SelectAllReduce(config, captured_one).input, AllReduceInput::kRegistered);
  captured_one.out = Address(reinterpret_cast<uintptr_t>(captured_one.in) + 16);  // overlaps
  EXPECT_EQ(SelectAllReduce(config, captured_one).input, AllReduceInput::kStaged);
}

TEST(AllReducePolicyTest, OverlapIsDetected) {
  EXPECT_TRUE(BuffersOverlap(Address(100), Address(100), 16));
  EXPECT_TRUE(BuffersOverlap(Address(100), Address(115), 16));
  EXPECT_FALSE(BuffersOverlap(Address(100), Address(116), 16));
  EXPECT_FALSE(BuffersOverlap(Address(116), Address(100), 16));
  EXPECT_FALSE(BuffersOverlap(Address(100), Address(100), 0));
}

TEST(AllReducePolicyTest, ValidationNamesTheBadField) {
  AllReduceConfig config;
  config.set_buffer_bytes(1000);
  EXPECT_THAT(std::string(ValidateAllReduceConfig(config).message()),
              HasSubstr("buffer_bytes 1000"));
  config = AllReduceConfig();
  config.set_threads_per_block(100);
  EXPECT_THAT(std::string(ValidateAllReduceConfig(config).message()),
              HasSubstr("threads_per_block 100"));
  config = AllReduceConfig();
  config.set_min_threads_per_block(48);
  EXPECT_THAT(std::string(ValidateAllReduceConfig(config).message()),
              HasSubstr("min_threads_per_block 48"));
  config = AllReduceConfig();
  config.set_max_blocks(129);
  EXPECT_THAT(std::string(ValidateAllReduceConfig(config).message()), HasSubstr("max_blocks 129"));
  config = AllReduceConfig();
  config.set_barrier_timeout_ms(0);
  EXPECT_EQ(ValidateAllReduceConfig(config).code(), absl::StatusCode::kInvalidArgument);
  config = AllReduceConfig();
  config.set_two_shot_max_bytes_world6(-1);
  EXPECT_THAT(std::string(ValidateAllReduceConfig(config).message()), HasSubstr("world size 6"));
  config = AllReduceConfig();
  config.set_max_graph_inputs(0);
  EXPECT_EQ(ValidateAllReduceConfig(config).code(), absl::StatusCode::kInvalidArgument);
}

TEST(AllReducePolicyTest, ValidationRefusesSizesAndTimeoutsThatWrap) {
  // 2 x buffer_bytes + 64 KiB wraps to 65,504 bytes: a tiny region the kernels would overrun.
  AllReduceConfig config;
  config.set_buffer_bytes(std::numeric_limits<int64_t>::max() - 15);
  EXPECT_EQ(ValidateAllReduceConfig(config).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ValidateAllReduceConfig(config).message()),
              HasSubstr("buffer_bytes 9223372036854775792"));
  config.set_buffer_bytes(kMaxAllReduceBufferBytes + 16);
  EXPECT_EQ(ValidateAllReduceConfig(config).code(), absl::StatusCode::kInvalidArgument);
  config.set_buffer_bytes(kMaxAllReduceBufferBytes);
  EXPECT_TRUE(ValidateAllReduceConfig(config).ok());

  // 2^58 ms is 2^64 x 15625 ns: the kernels' wait would wrap to 0 and time out at once.
  config = AllReduceConfig();
  config.set_barrier_timeout_ms(int64_t{1} << 58);
  EXPECT_EQ(ValidateAllReduceConfig(config).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ValidateAllReduceConfig(config).message()),
              HasSubstr("barrier_timeout_ms 288230376151711744"));
  config = AllReduceConfig();
  config.set_bootstrap_timeout_ms(std::numeric_limits<int64_t>::max());
  EXPECT_EQ(ValidateAllReduceConfig(config).code(), absl::StatusCode::kInvalidArgument);
  config = AllReduceConfig();
  config.set_barrier_timeout_ms(kMaxAllReduceTimeoutMs);
  config.set_bootstrap_timeout_ms(kMaxAllReduceTimeoutMs);
  EXPECT_TRUE(ValidateAllReduceConfig(config).ok());
}

TEST(AllReducePolicyTest, LaunchShapeSpreadsThreadsOverBlocksFirst) {
  AllReduceConfig config;
  config.set_max_blocks(128);
  config.set_threads_per_block(512);
  config.set_min_threads_per_block(128);
  auto shape = [&](AllReduceAlgorithm algorithm, size_t bytes, int world) {
    const CustomLaunchShape s = ChooseCustomLaunchShape(config, algorithm, bytes, world);
    return std::make_pair(s.blocks, s.threads);
  };
  const AllReduceAlgorithm one = AllReduceAlgorithm::kOneShot;
  const AllReduceAlgorithm two = AllReduceAlgorithm::kTwoShot;
  EXPECT_EQ(shape(one, 16, 4), std::make_pair(1, 128));             // 1 pack
  EXPECT_EQ(shape(one, 4096, 4), std::make_pair(2, 128));           // 256 packs
  EXPECT_EQ(shape(one, 256 << 10, 4), std::make_pair(128, 128));    // 16384 packs
  EXPECT_EQ(shape(one, 1 << 20, 2), std::make_pair(128, 512));      // 65536 packs
  EXPECT_EQ(shape(one, 8 << 20, 2), std::make_pair(128, 512));      // 8 passes
  EXPECT_EQ(shape(two, 1 << 20, 4), std::make_pair(128, 128));      // shard of 16384 packs
  EXPECT_EQ(shape(two, 16 * 65537, 4), std::make_pair(103, 160));   // shard of 16385 packs
  EXPECT_EQ(shape(two, 4 << 20, 8), std::make_pair(128, 256));      // shard of 32768 packs

  // min_threads_per_block at threads_per_block: full blocks, fewer of them (the old shape).
  config.set_min_threads_per_block(512);
  EXPECT_EQ(shape(two, 1 << 20, 4), std::make_pair(32, 512));
  EXPECT_EQ(shape(one, 4096, 4), std::make_pair(1, 512));
  // A minimum above threads_per_block acts as threads_per_block.
  config.set_min_threads_per_block(1024);
  config.set_threads_per_block(256);
  EXPECT_EQ(shape(two, 1 << 20, 4), std::make_pair(64, 256));

  // Any size: whole warps within the limits, enough threads for one pack each unless the
  // blocks are capped.
  config.set_max_blocks(7);
  config.set_threads_per_block(96);
  config.set_min_threads_per_block(64);
  for (int world : {2, 4, 6, 8}) {
    for (size_t bytes = 16; bytes <= (size_t{8} << 20); bytes = bytes * 3 + 16) {
      for (AllReduceAlgorithm algorithm : {one, two}) {
        const CustomLaunchShape s = ChooseCustomLaunchShape(config, algorithm, bytes, world);
        const size_t work = algorithm == two ? (bytes / 16 + world - 1) / world : bytes / 16;
        EXPECT_GE(s.blocks, 1);
        EXPECT_LE(s.blocks, 7);
        EXPECT_EQ(s.threads % 32, 0);
        EXPECT_GE(s.threads, 64);
        EXPECT_LE(s.threads, 96);
        EXPECT_TRUE(static_cast<size_t>(s.blocks) * s.threads >= work || s.blocks == 7)
            << bytes << " bytes, world " << world;
      }
    }
  }
}

TEST(AllReducePolicyTest, ConfigParsesFromTextproto) {
  AllReduceConfig config;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "enable_custom: false buffer_bytes: 1048576 one_shot_max_bytes_world8: 32768 "
      "graph_one_shot_registered: true",
      &config));
  EXPECT_FALSE(config.enable_custom());
  EXPECT_EQ(config.buffer_bytes(), 1048576);
  EXPECT_EQ(config.one_shot_max_bytes_world8(), 32768);
  EXPECT_TRUE(config.graph_one_shot_registered());
  EXPECT_EQ(config.threads_per_block(), AllReduceConfig().threads_per_block());  // default kept
  EXPECT_TRUE(ValidateAllReduceConfig(config).ok());
}

TEST(AllReducePolicyTest, FusedAddRmsNormExactlyWhereOneShotIsPicked) {
  AllReduceConfig config;
  const size_t buffer = config.buffer_bytes();
  // The decode shapes of a 1B model (hidden 2048) at world 2 and 4.
  for (int64_t tokens : {1, 7, 8, 32, 64, 128}) {
    EXPECT_TRUE(FusedAddRmsNormEligible(config, 2, true, buffer, tokens, 2048)) << tokens;
    EXPECT_EQ(FusedAddRmsNormEligible(config, 4, true, buffer, tokens, 2048), tokens <= 64)
        << tokens;
  }
  // World 4 crosses to two-shot above 256 KiB (64 rows of 2048): no fusion there.
  EXPECT_FALSE(FusedAddRmsNormEligible(config, 4, true, buffer, 65, 2048));
  EXPECT_FALSE(FusedAddRmsNormEligible(config, 4, true, buffer, 256, 2048));
  // At every size the answer is SelectAllReduce's one-shot choice for the same bytes.
  for (int world : {2, 4, 6, 8}) {
    for (int64_t tokens : {1, 3, 16, 100, 256, 1024, 2048, 2049}) {
      for (int64_t hidden : {256, 2048, 4096}) {
        AllReduceRequest r = Request(static_cast<size_t>(tokens * hidden * 2), world);
        r.custom_max_bytes = buffer;
        EXPECT_EQ(FusedAddRmsNormEligible(config, world, true, buffer, tokens, hidden),
                  SelectAllReduce(config, r).algorithm == AllReduceAlgorithm::kOneShot)
            << "world " << world << " tokens " << tokens << " hidden " << hidden;
      }
    }
  }
  // Beyond the buffer (world 2's one-shot crossover is the whole buffer).
  EXPECT_TRUE(FusedAddRmsNormEligible(config, 2, true, buffer, 2048, 2048));
  EXPECT_FALSE(FusedAddRmsNormEligible(config, 2, true, buffer, 2049, 2048));
  // No custom all-reduce, custom disabled, or a world size without custom kernels.
  EXPECT_FALSE(FusedAddRmsNormEligible(config, 2, false, buffer, 1, 2048));
  EXPECT_FALSE(FusedAddRmsNormEligible(config, 3, true, buffer, 1, 2048));
  AllReduceConfig disabled;
  disabled.set_enable_custom(false);
  EXPECT_FALSE(FusedAddRmsNormEligible(disabled, 2, true, buffer, 1, 2048));
  // Rows the kernel cannot take: not a multiple of 8, too wide, empty.
  EXPECT_FALSE(FusedAddRmsNormEligible(config, 2, true, buffer, 1, 2044));
  EXPECT_TRUE(FusedAddRmsNormEligible(config, 2, true, buffer, 1, kFusedAddRmsNormMaxHidden));
  EXPECT_FALSE(
      FusedAddRmsNormEligible(config, 2, true, buffer, 1, kFusedAddRmsNormMaxHidden + 8));
  EXPECT_FALSE(FusedAddRmsNormEligible(config, 2, true, buffer, 0, 2048));
  EXPECT_FALSE(FusedAddRmsNormEligible(config, 2, true, buffer, 1, 0));
  EXPECT_FALSE(FusedAddRmsNormEligible(config, 2, true, buffer, -1, 2048));
}

TEST(AllReducePolicyTest, Names) {
  EXPECT_STREQ(AllReduceAlgorithmName(AllReduceAlgorithm::kNccl), "nccl");
  EXPECT_STREQ(AllReduceAlgorithmName(AllReduceAlgorithm::kOneShot), "one-shot");
  EXPECT_STREQ(AllReduceAlgorithmName(AllReduceAlgorithm::kTwoShot), "two-shot");
  EXPECT_STREQ(AllReduceInputName(AllReduceInput::kStaged), "staged");
  EXPECT_STREQ(AllReduceInputName(AllReduceInput::kRegistered), "registered");
}

// ---------------------------------------------------------------------------------------------
// Sweeps with random and adversarial values; each result is checked against an independent
// restatement of the header's rules, computed in 128 bits so that nothing in the oracle wraps.

using u128 = unsigned __int128;

// Values around every edge an int64 field has here, and random ones.
int64_t PickInt64(std::mt19937_64& rng) {
  static const int64_t kEdges[] = {std::numeric_limits<int64_t>::min(),
                                   -1,
                                   0,
                                   1,
                                   15,
                                   16,
                                   17,
                                   1024,
                                   8 << 20,
                                   kMaxAllReduceBufferBytes - 16,
                                   kMaxAllReduceBufferBytes,
                                   kMaxAllReduceBufferBytes + 16,
                                   kMaxAllReduceTimeoutMs,
                                   kMaxAllReduceTimeoutMs + 1,
                                   std::numeric_limits<int64_t>::max() - 15,
                                   std::numeric_limits<int64_t>::max()};
  switch (rng() % 4) {
    case 0:
      return kEdges[rng() % (sizeof(kEdges) / sizeof(kEdges[0]))];
    case 1:
      return static_cast<int64_t>(rng());
    case 2:
      return static_cast<int64_t>(rng() % (16 << 20)) / 16 * 16;  // plausible sizes
    default:
      return static_cast<int64_t>(rng() % 100000);
  }
}

int32_t PickInt32(std::mt19937_64& rng) {
  static const int32_t kEdges[] = {INT32_MIN, -32, -1, 0, 1, 31, 32, 63, 64, 96, 127, 128, 129,
                                   256, 512, 1000, 1024, 1025, 1056, kMaxAllReduceGraphInputs,
                                   kMaxAllReduceGraphInputs + 1, INT32_MAX};
  switch (rng() % 3) {
    case 0:
      return kEdges[rng() % (sizeof(kEdges) / sizeof(kEdges[0]))];
    case 1:
      return static_cast<int32_t>(rng());
    default:
      return static_cast<int32_t>(rng() % 1100);
  }
}

// A config with every field drawn at random (many out of range), or left at its default.
AllReduceConfig RandomConfig(std::mt19937_64& rng) {
  AllReduceConfig c;
  auto maybe = [&]() { return rng() % 3 == 0; };
  c.set_enable_custom(rng() % 5 != 0);
  if (maybe()) c.set_buffer_bytes(PickInt64(rng));
  if (maybe()) c.set_one_shot_max_bytes_world2(PickInt64(rng));
  if (maybe()) c.set_two_shot_max_bytes_world2(PickInt64(rng));
  if (maybe()) c.set_one_shot_max_bytes_world4(PickInt64(rng));
  if (maybe()) c.set_two_shot_max_bytes_world4(PickInt64(rng));
  if (maybe()) c.set_one_shot_max_bytes_world6(PickInt64(rng));
  if (maybe()) c.set_two_shot_max_bytes_world6(PickInt64(rng));
  if (maybe()) c.set_one_shot_max_bytes_world8(PickInt64(rng));
  if (maybe()) c.set_two_shot_max_bytes_world8(PickInt64(rng));
  if (maybe()) c.set_max_blocks(PickInt32(rng));
  if (maybe()) c.set_threads_per_block(PickInt32(rng));
  if (maybe()) c.set_min_threads_per_block(PickInt32(rng));
  if (maybe()) c.set_barrier_timeout_ms(PickInt64(rng));
  if (maybe()) c.set_bootstrap_timeout_ms(PickInt64(rng));
  if (maybe()) c.set_max_graph_inputs(PickInt32(rng));
  c.set_graph_one_shot_registered(rng() % 2 == 0);
  return c;
}

// The first field ValidateAllReduceConfig must name, in the header's order ("" when valid).
std::string FirstBadField(const AllReduceConfig& c) {
  if (c.buffer_bytes() <= 0 || c.buffer_bytes() % 16 != 0 ||
      c.buffer_bytes() > kMaxAllReduceBufferBytes) {
    return absl::StrCat("buffer_bytes ", c.buffer_bytes());
  }
  auto threads_ok = [](int t) { return t >= 64 && t <= 1024 && t % 32 == 0; };
  if (!threads_ok(c.threads_per_block())) {
    return absl::StrCat("threads_per_block ", c.threads_per_block());
  }
  if (!threads_ok(c.min_threads_per_block())) {
    return absl::StrCat("min_threads_per_block ", c.min_threads_per_block());
  }
  if (c.max_blocks() < 1 || c.max_blocks() > 128) {
    return absl::StrCat("max_blocks ", c.max_blocks());
  }
  for (int64_t t : {c.barrier_timeout_ms(), c.bootstrap_timeout_ms()}) {
    if (t < 1 || t > kMaxAllReduceTimeoutMs) {
      return absl::StrCat("barrier_timeout_ms ", c.barrier_timeout_ms(), ", bootstrap_timeout_ms ",
                          c.bootstrap_timeout_ms());
    }
  }
  if (c.max_graph_inputs() < 1 || c.max_graph_inputs() > kMaxAllReduceGraphInputs) {
    return absl::StrCat("max_graph_inputs ", c.max_graph_inputs());
  }
  const int64_t crossovers[4][2] = {
      {c.one_shot_max_bytes_world2(), c.two_shot_max_bytes_world2()},
      {c.one_shot_max_bytes_world4(), c.two_shot_max_bytes_world4()},
      {c.one_shot_max_bytes_world6(), c.two_shot_max_bytes_world6()},
      {c.one_shot_max_bytes_world8(), c.two_shot_max_bytes_world8()}};
  for (int i = 0; i < 4; ++i) {
    if (crossovers[i][0] < 0 || crossovers[i][1] < 0) {
      return absl::StrCat("world size ", 2 * (i + 1), " must not be negative (one-shot ",
                          crossovers[i][0], ", two-shot ", crossovers[i][1], ")");
    }
  }
  return "";
}

TEST(AllReducePolicySweepTest, ValidationAcceptsExactlyTheDocumentedRangesAndNamesTheField) {
  std::mt19937_64 rng(1);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    const AllReduceConfig config = RandomConfig(rng);
    const std::string bad = FirstBadField(config);
    const absl::Status status = ValidateAllReduceConfig(config);
    if (bad.empty()) {
      ASSERT_TRUE(status.ok()) << status << "\n" << config.DebugString();
      ++accepted;
      continue;
    }
    ++refused;
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << config.DebugString();
    ASSERT_THAT(std::string(status.message()), HasSubstr(bad)) << config.DebugString();
    // Capitalised, no final period: the house style for messages.
    ASSERT_TRUE(status.message()[0] >= 'A' && status.message()[0] <= 'Z') << status;
    ASSERT_NE(status.message().back(), '.') << status;
  }
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(refused, 5000);
}

// The rules of SelectAllReduce, restated.
AllReducePlan ExpectedPlan(const AllReduceConfig& c, const AllReduceRequest& r) {
  AllReducePlan plan;
  const uintptr_t in = reinterpret_cast<uintptr_t>(r.in);
  const uintptr_t out = reinterpret_cast<uintptr_t>(r.out);
  const bool world_ok =
      r.world_size == 2 || r.world_size == 4 || r.world_size == 6 || r.world_size == 8;
  if (!c.enable_custom() || !r.custom_available || !world_ok || r.bytes == 0 ||
      r.bytes % 16 != 0 || r.bytes > r.custom_max_bytes || in % 16 != 0 || out % 16 != 0) {
    return plan;
  }
  const int i = r.world_size / 2 - 1;
  const int64_t one[] = {c.one_shot_max_bytes_world2(), c.one_shot_max_bytes_world4(),
                         c.one_shot_max_bytes_world6(), c.one_shot_max_bytes_world8()};
  const int64_t two[] = {c.two_shot_max_bytes_world2(), c.two_shot_max_bytes_world4(),
                         c.two_shot_max_bytes_world6(), c.two_shot_max_bytes_world8()};
  // Sizes and crossovers as mathematical integers: a negative crossover admits nothing.
  auto at_most = [&](int64_t limit) {
    return limit >= 0 && static_cast<u128>(r.bytes) <= static_cast<u128>(limit);
  };
  if (at_most(one[i])) {
    plan.algorithm = AllReduceAlgorithm::kOneShot;
  } else if (at_most(two[i])) {
    plan.algorithm = AllReduceAlgorithm::kTwoShot;
  } else {
    return plan;
  }
  const bool overlap = r.bytes > 0 && static_cast<u128>(in) < static_cast<u128>(out) + r.bytes &&
                       static_cast<u128>(out) < static_cast<u128>(in) + r.bytes;
  if (!r.capturing) {
    plan.input = AllReduceInput::kStaged;
  } else if (plan.algorithm == AllReduceAlgorithm::kTwoShot) {
    plan.input = AllReduceInput::kRegistered;
  } else {
    plan.input = c.graph_one_shot_registered() && !overlap ? AllReduceInput::kRegistered
                                                           : AllReduceInput::kStaged;
  }
  return plan;
}

size_t PickBytes(std::mt19937_64& rng) {
  static const size_t kEdges[] = {0,
                                  1,
                                  15,
                                  16,
                                  32,
                                  65536,
                                  65552,
                                  262144,
                                  8 << 20,
                                  (8 << 20) + 16,
                                  size_t{1} << 40,
                                  (size_t{1} << 63) - 16,
                                  size_t{1} << 63,
                                  (size_t{1} << 63) + 16,
                                  std::numeric_limits<size_t>::max() - 15,
                                  std::numeric_limits<size_t>::max()};
  switch (rng() % 3) {
    case 0:
      return kEdges[rng() % (sizeof(kEdges) / sizeof(kEdges[0]))];
    case 1:
      return static_cast<size_t>(rng());
    default:
      return static_cast<size_t>(rng() % (1 << 24)) / 16 * 16;
  }
}

const void* PickPointer(std::mt19937_64& rng) {
  static const uintptr_t kEdges[] = {0, 16, 0x10000000, 0x10000008,
                                     std::numeric_limits<uintptr_t>::max() - 15,
                                     std::numeric_limits<uintptr_t>::max() - 31,
                                     std::numeric_limits<uintptr_t>::max()};
  const uintptr_t p = rng() % 3 == 0 ? kEdges[rng() % 7] : static_cast<uintptr_t>(rng()) / 16 * 16;
  return reinterpret_cast<const void*>(p);
}

TEST(AllReducePolicySweepTest, SelectionMatchesTheRulesForAnyRequest) {
  // Random configs (crossovers negative or near 2^63 included; validation is not required for
  // the policy to be defined), sizes from 0 to 2^64 - 1 (a size of 2^63 or more used to be cast
  // to a negative int64 and pass every crossover as one-shot), worlds from INT_MIN to INT_MAX,
  // pointers anywhere up to the top of the address space.
  std::mt19937_64 rng(2);
  int one = 0, two = 0, nccl = 0, registered = 0;
  const int worlds[] = {INT_MIN, -2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, INT_MAX};
  for (int i = 0; i < 100000; ++i) {
    const AllReduceConfig config = RandomConfig(rng);
    AllReduceRequest r;
    r.bytes = PickBytes(rng);
    r.world_size = rng() % 4 == 0 ? worlds[rng() % 14] : 2 * (1 + static_cast<int>(rng() % 4));
    r.in = PickPointer(rng);
    r.out = rng() % 4 == 0 ? r.in : PickPointer(rng);
    if (rng() % 4 == 0) {  // close to `in`: overlapping or just not
      r.out = reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(r.in) +
                                            (rng() % 2 == 0 ? 16 : 0) * (rng() % 1024));
    }
    r.capturing = rng() % 2 == 0;
    r.custom_available = rng() % 6 != 0;
    r.custom_max_bytes = rng() % 3 == 0 ? PickBytes(rng) : static_cast<size_t>(8 << 20);
    const AllReducePlan want = ExpectedPlan(config, r);
    const AllReducePlan got = SelectAllReduce(config, r);
    ASSERT_EQ(got.algorithm, want.algorithm)
        << "bytes " << r.bytes << " world " << r.world_size << "\n" << config.DebugString();
    if (want.algorithm != AllReduceAlgorithm::kNccl) {
      ASSERT_EQ(got.input, want.input) << "bytes " << r.bytes << " in " << r.in << " out " << r.out;
    }
    ASSERT_EQ(CustomAllReduceEligible(config, r),
              ExpectedPlan(config, r).algorithm != AllReduceAlgorithm::kNccl ||
                  (config.enable_custom() && r.custom_available &&
                   IsCustomWorldSize(r.world_size) && r.bytes > 0 && r.bytes % 16 == 0 &&
                   r.bytes <= r.custom_max_bytes &&
                   reinterpret_cast<uintptr_t>(r.in) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(r.out) % 16 == 0));
    one += want.algorithm == AllReduceAlgorithm::kOneShot;
    two += want.algorithm == AllReduceAlgorithm::kTwoShot;
    nccl += want.algorithm == AllReduceAlgorithm::kNccl;
    registered +=
        want.algorithm != AllReduceAlgorithm::kNccl && want.input == AllReduceInput::kRegistered;
  }
  EXPECT_GT(one, 1000);
  EXPECT_GT(two, 1000);
  EXPECT_GT(nccl, 1000);
  EXPECT_GT(registered, 500);

  // The case that used to pass: 2^63 + 16 bytes, a buffer that claims to hold it.
  AllReduceRequest huge = Request((size_t{1} << 63) + 16, 2);
  huge.custom_max_bytes = std::numeric_limits<size_t>::max();
  EXPECT_EQ(SelectAllReduce(AllReduceConfig(), huge).algorithm, AllReduceAlgorithm::kNccl);
}

TEST(AllReducePolicyTest, CustomPlanCheckNamesWhatTheKernelsCannotTake) {
  const AllReducePlan one_staged{AllReduceAlgorithm::kOneShot, AllReduceInput::kStaged};
  const AllReducePlan one_registered{AllReduceAlgorithm::kOneShot, AllReduceInput::kRegistered};
  const AllReducePlan two_registered{AllReduceAlgorithm::kTwoShot, AllReduceInput::kRegistered};
  EXPECT_TRUE(CheckPlan(one_staged, Request(4096)).ok());
  EXPECT_TRUE(CheckPlan(two_registered, Request(4096)).ok());

  auto refusal = [](const AllReducePlan& plan, const AllReduceRequest& r) {
    const absl::Status s = CheckPlan(plan, r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  EXPECT_THAT(refusal(AllReducePlan{}, Request(4096)), HasSubstr("not nccl"));
  for (size_t bytes : {size_t{0}, size_t{24}, size_t{8 << 20} + 16}) {
    EXPECT_THAT(refusal(one_staged, Request(bytes)),
                HasSubstr(absl::StrCat("Custom all-reduce of ", bytes / 2, " x bf16 = ", bytes,
                                       " bytes must be a positive multiple of 16")));
  }
  // The call's own count and dtype name, as given.
  const absl::Status fp32 = CheckCustomAllReducePlan(one_staged, Request(24), 6, "fp32");
  EXPECT_EQ(fp32.code(), absl::StatusCode::kInvalidArgument) << fp32;
  EXPECT_THAT(std::string(fp32.message()),
              HasSubstr("Custom all-reduce of 6 x fp32 = 24 bytes must be a positive multiple of "
                        "16 bytes and at most buffer_bytes"));
  AllReduceRequest unaligned = Request(4096);
  unaligned.out = Address(0x20000008);
  EXPECT_THAT(refusal(two_registered, unaligned), HasSubstr("16-byte-aligned buffers"));
  // In place: fine staged, or two-shot registered (peers read shards this rank reduced before
  // writing); not one-shot registered.
  AllReduceRequest in_place = Request(4096);
  in_place.out = in_place.in;
  EXPECT_TRUE(CheckPlan(one_staged, in_place).ok());
  EXPECT_TRUE(CheckPlan(two_registered, in_place).ok());
  EXPECT_THAT(refusal(one_registered, in_place), HasSubstr("cannot read a registered input"));
}

TEST(AllReducePolicySweepTest, EveryCustomPlanPassesTheCustomPlanCheck) {
  // AutoCommunicator checks a call's arguments once: CheckAllReduceArgs, then SelectAllReduce,
  // and the custom all-reduce under it enqueues without CheckCustomAllReducePlan. That skips no
  // refusal only if every custom plan SelectAllReduce returns passes the check, for any valid
  // config, size, pointers, world and capture state; and, the other way, if what the check
  // refuses SelectAllReduce sends to NCCL (for every custom plan it could have made).
  std::mt19937_64 rng(5);
  int custom = 0, refused = 0;
  for (int i = 0; i < 200000; ++i) {
    AllReduceConfig config = RandomConfig(rng);
    if (!ValidateAllReduceConfig(config).ok()) config = AllReduceConfig();
    if (rng() % 2 == 0) config.set_graph_one_shot_registered(true);
    AllReduceRequest r;
    r.bytes = rng() % 2 == 0 ? PickBytes(rng) : static_cast<size_t>(rng() % (1 << 20)) / 16 * 16;
    r.world_size = 2 * (1 + static_cast<int>(rng() % 4));
    r.in = PickPointer(rng);
    r.out = rng() % 4 == 0 ? r.in : PickPointer(rng);
    if (rng() % 3 == 0) {  // close to `in`: overlapping or just not
      r.out = reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(r.in) +
                                            (rng() % 2 == 0 ? 16 : 8) * (rng() % 1024));
    }
    r.capturing = rng() % 2 == 0;
    r.custom_available = true;
    r.custom_max_bytes =
        rng() % 3 == 0 ? PickBytes(rng) : static_cast<size_t>(config.buffer_bytes());
    const AllReducePlan plan = SelectAllReduce(config, r);
    if (plan.algorithm != AllReduceAlgorithm::kNccl) {
      ++custom;
      const absl::Status check = CheckPlan(plan, r);
      ASSERT_TRUE(check.ok()) << check << " bytes " << r.bytes << " in " << r.in << " out " << r.out
                              << " " << AllReduceAlgorithmName(plan.algorithm) << " "
                              << AllReduceInputName(plan.input);
      continue;
    }
    for (AllReduceAlgorithm algorithm :
         {AllReduceAlgorithm::kOneShot, AllReduceAlgorithm::kTwoShot}) {
      const AllReducePlan forced{algorithm, ChooseAllReduceInput(config, algorithm, r)};
      if (!CheckPlan(forced, r).ok()) {
        ++refused;
        ASSERT_FALSE(CustomAllReduceEligible(config, r)) << "bytes " << r.bytes;
      }
    }
  }
  EXPECT_GT(custom, 20000);
  EXPECT_GT(refused, 20000);
}

TEST(AllReducePolicySweepTest, OverlapIsExactEvenAtTheTopOfTheAddressSpace) {
  std::mt19937_64 rng(3);
  const uintptr_t top = std::numeric_limits<uintptr_t>::max();
  int overlaps = 0;
  for (int i = 0; i < 200000; ++i) {
    uintptr_t a, b;
    size_t bytes;
    switch (rng() % 3) {
      case 0:  // near the top: a + bytes may wrap
        a = top - rng() % 4096;
        b = top - rng() % 4096;
        bytes = rng() % 8192;
        break;
      case 1:  // close together anywhere
        a = static_cast<uintptr_t>(rng());
        b = a + rng() % 512 - 256;
        bytes = rng() % 600;
        break;
      default:
        a = static_cast<uintptr_t>(rng());
        b = static_cast<uintptr_t>(rng());
        bytes = rng() % 2 == 0 ? static_cast<size_t>(rng()) : PickBytes(rng);
    }
    // Intervals of the integers, not of addresses modulo 2^64.
    const bool want = bytes > 0 && static_cast<u128>(a) < static_cast<u128>(b) + bytes &&
                      static_cast<u128>(b) < static_cast<u128>(a) + bytes;
    ASSERT_EQ(BuffersOverlap(reinterpret_cast<const void*>(a), reinterpret_cast<const void*>(b),
                             bytes),
              want)
        << std::hex << a << " " << b << " " << std::dec << bytes;
    overlaps += want;
  }
  EXPECT_GT(overlaps, 10000);
  // The case that used to say no: 32 bytes at top - 31 and at top - 15 share 16 bytes, but
  // top - 31 + 32 wraps to 0.
  EXPECT_TRUE(BuffersOverlap(reinterpret_cast<const void*>(top - 31),
                             reinterpret_cast<const void*>(top - 15), 32));
}

TEST(AllReducePolicySweepTest, LaunchShapeIsLaunchableForAnyConfigSizeAndWorld) {
  // Any config (threads_per_block 0 used to divide by zero; negative values gave negative
  // threads), any size up to 2^64 - 1, any world size: 1..128 blocks of a multiple of 32 in
  // 64..1024 threads. For a valid config: within its limits, and enough threads for one pack
  // each unless the blocks are capped.
  std::mt19937_64 rng(4);
  int valid_configs = 0;
  const int worlds[] = {INT_MIN, -1, 0, 1, 2, 3, 4, 6, 8, 1000, INT_MAX};
  for (int i = 0; i < 100000; ++i) {
    const AllReduceConfig config = RandomConfig(rng);
    const size_t bytes = PickBytes(rng);
    const int world = worlds[rng() % 11];
    const AllReduceAlgorithm algorithm =
        rng() % 2 == 0 ? AllReduceAlgorithm::kOneShot : AllReduceAlgorithm::kTwoShot;
    const CustomLaunchShape s = ChooseCustomLaunchShape(config, algorithm, bytes, world);
    ASSERT_GE(s.blocks, 1);
    ASSERT_LE(s.blocks, 128);
    ASSERT_EQ(s.threads % 32, 0) << s.threads;
    ASSERT_GE(s.threads, 64);
    ASSERT_LE(s.threads, 1024);
    if (!ValidateAllReduceConfig(config).ok()) continue;
    ++valid_configs;
    const int max_threads = config.threads_per_block();
    const int min_threads = std::min(config.min_threads_per_block(), max_threads);
    ASSERT_LE(s.blocks, config.max_blocks());
    ASSERT_LE(s.threads, max_threads);
    ASSERT_GE(s.threads, min_threads);
    const u128 packs = bytes / 16;
    const u128 work = algorithm == AllReduceAlgorithm::kTwoShot && world > 0
                          ? (packs + world - 1) / static_cast<u128>(world)
                          : packs;
    ASSERT_TRUE(static_cast<u128>(s.blocks) * s.threads >= work || s.blocks == config.max_blocks())
        << bytes << " bytes, world " << world;
  }
  EXPECT_GT(valid_configs, 5000);
  AllReduceConfig zero;
  zero.set_threads_per_block(0);
  EXPECT_GE(ChooseCustomLaunchShape(zero, AllReduceAlgorithm::kOneShot, 4096, 2).threads, 64);
}

TEST(AllReducePolicySweepTest, FusedEligibilityIsDefinedForAnyRowShape) {
  // tokens and hidden anywhere in int64 (a product that overflows must not be computed):
  // eligible exactly when the rows are a positive multiple of 8 wide up to the kernel's limit and
  // SelectAllReduce picks one-shot for tokens * hidden * 2 bytes (computed here in 128 bits).
  std::mt19937_64 rng(6);
  const int64_t edges[] = {std::numeric_limits<int64_t>::min(), -8, -1, 0, 1, 7, 8, 9, 2048,
                           kFusedAddRmsNormMaxHidden, kFusedAddRmsNormMaxHidden + 8,
                           int64_t{1} << 31, int64_t{1} << 40, std::numeric_limits<int64_t>::max()};
  int eligible = 0;
  for (int i = 0; i < 100000; ++i) {
    AllReduceConfig config = RandomConfig(rng);
    if (!ValidateAllReduceConfig(config).ok()) config = AllReduceConfig();
    const int world = 2 * (1 + static_cast<int>(rng() % 4)) + (rng() % 8 == 0 ? 1 : 0);
    const int64_t tokens = rng() % 3 == 0 ? edges[rng() % 14] : static_cast<int64_t>(rng() % 300);
    const int64_t hidden =
        rng() % 3 == 0 ? edges[rng() % 14] : static_cast<int64_t>(8 * (rng() % 600));
    const size_t max_bytes = rng() % 2 == 0 ? static_cast<size_t>(config.buffer_bytes())
                                            : PickBytes(rng);
    const bool available = rng() % 8 != 0;
    bool want = false;
    if (tokens >= 1 && hidden >= 8 && hidden % 8 == 0 && hidden <= kFusedAddRmsNormMaxHidden) {
      const u128 bytes = static_cast<u128>(tokens) * static_cast<u128>(hidden) * 2;
      if (bytes <= (u128{1} << 41)) {
        AllReduceRequest r;
        r.bytes = static_cast<size_t>(bytes);
        r.world_size = world;
        r.custom_available = available;
        r.custom_max_bytes = max_bytes;
        want = ExpectedPlan(config, r).algorithm == AllReduceAlgorithm::kOneShot;
      }
    }
    ASSERT_EQ(FusedAddRmsNormEligible(config, world, available, max_bytes, tokens, hidden), want)
        << "tokens " << tokens << " hidden " << hidden << " world " << world;
    eligible += want;
  }
  EXPECT_GT(eligible, 2000);
}

}  // namespace
}  // namespace kiln
