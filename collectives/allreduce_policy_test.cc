#include "collectives/allreduce_policy.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"
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

}  // namespace
}  // namespace kiln
