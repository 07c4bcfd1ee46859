// Host-only checks of PagedKvCache's and AppendKv's refusals: each comes before anything is
// launched (on a host without a GPU a launch would fail with a CUDA error instead of the check's
// message), so none of these needs a GPU and the stand-in pointers are never read.
#include "attention/paged_kv_cache.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "attention/attention_params.h"
#include "attention/internal/unchecked_launch.h"
#include "attention/paged_kv_layout.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

// AppendKv's refusals come before anything is launched: the kernel copies 16-byte vectors and,
// without a slot mapping, indexes the block table by rows of max_blocks_per_seq.
TEST(PagedKvCacheTest, AppendRefusesMisalignedTensorsAndEmptyBlockTableRows) {
  const PagedKvLayout layout{8, 16, 1, 64, AttentionDtype::kBf16};
  alignas(16) int32_t buffers[16] = {};
  AppendKvParams append;
  append.k = &buffers[0];
  append.v = &buffers[4];
  append.max_tokens = 1;
  append.plan.seq_q_start = &buffers[8];
  append.plan.seq_kv_len = &buffers[10];
  append.plan.max_seqs = 1;
  PagedKvDevice kv;
  kv.block_table = &buffers[12];
  kv.max_blocks_per_seq = 0;
  kv.block_size = 16;
  void* pool = &buffers[0];
  absl::Status s = AppendKv(append, layout, kv, pool, pool, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("max_blocks_per_seq 0"), std::string::npos) << s;
  kv.max_blocks_per_seq = 2;
  append.v = &buffers[5];  // 4 bytes past a 16-byte boundary
  s = AppendKv(append, layout, kv, pool, pool, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("16-byte aligned"), std::string::npos) << s;
  append.v = &buffers[4];
  s = AppendKv(append, layout, kv, pool, &buffers[1], nullptr);
  EXPECT_NE(s.message().find("16-byte aligned"), std::string::npos) << s;
  kv.block_size = 32;  // attention would read blocks of 32 where the append writes blocks of 16
  s = AppendKv(append, layout, kv, pool, pool, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("block_size 32 differs from the layout's 16"), std::string::npos)
      << s;
}

// PagedKvCache::Append leaves the layout's check to Create: a cache Create did not make (no
// pools, an empty layout) is refused before anything is launched, and the raw AppendKv still
// checks the layout it is given.
TEST(PagedKvCacheTest, AppendRefusesACacheCreateDidNotMakeAndABadLayout) {
  alignas(16) int32_t buffers[16] = {};
  AppendKvParams append;
  append.k = &buffers[0];
  append.v = &buffers[4];
  append.max_tokens = 1;
  append.slot_mapping = &buffers[8];
  PagedKvCache empty;
  absl::Status s = empty.Append(append, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("needs k, v and both cache pools"), std::string::npos) << s;

  const PagedKvLayout bad{8, 24, 1, 64, AttentionDtype::kBf16};  // block_size not a power of 2
  PagedKvDevice kv;
  kv.block_size = 24;
  void* pool = &buffers[0];
  s = AppendKv(append, bad, kv, pool, pool, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("KV block_size 24 must be a power of two"), std::string::npos) << s;
}

// The append for a layout validated once still checks every per-call argument, with AppendKv's
// status, before anything is launched.
TEST(PagedKvCacheTest, AppendWithValidLayoutRefusesWhatAppendKvRefuses) {
  const PagedKvLayout layout{8, 16, 1, 64, AttentionDtype::kBf16};
  ASSERT_TRUE(layout.Validate().ok());
  alignas(16) int32_t buffers[16] = {};
  AppendKvParams append;
  append.k = &buffers[0];
  append.v = &buffers[4];
  append.max_tokens = 1;
  append.plan.seq_q_start = &buffers[8];
  append.plan.seq_kv_len = &buffers[10];
  append.plan.max_seqs = 1;
  PagedKvDevice kv;
  kv.block_table = &buffers[12];
  kv.max_blocks_per_seq = 2;
  kv.block_size = 16;
  void* pool = &buffers[0];
  const auto expect_same = [&](void* v_cache, const std::string& want) {
    const absl::Status raw = AppendKv(append, layout, kv, pool, v_cache, nullptr);
    const absl::Status unchecked =
        attention_internal::AppendKvWithValidLayout(append, layout, kv, pool, v_cache, nullptr);
    EXPECT_EQ(unchecked.code(), absl::StatusCode::kInvalidArgument) << unchecked;
    EXPECT_NE(unchecked.message().find(want), std::string::npos) << unchecked;
    EXPECT_EQ(unchecked, raw);
  };
  expect_same(nullptr, "needs k, v and both cache pools");
  expect_same(&buffers[1], "16-byte aligned");
  append.k_stride = 12;
  expect_same(pool, "k_stride 12 and v_stride 0 must be 0 or multiples of 8");
  append.k_stride = 0;
  kv.block_size = 32;
  expect_same(pool, "block_size 32 differs from the layout's 16");
  kv.block_size = 16;
  kv.max_blocks_per_seq = 0;
  expect_same(pool, "max_blocks_per_seq 0");
  append.max_tokens = 0;  // nothing to append: nothing is checked or launched
  EXPECT_TRUE(attention_internal::AppendKvWithValidLayout(append, layout, kv, pool, nullptr,
                                                          nullptr)
                  .ok());
}

}  // namespace
}  // namespace kiln
