// Host-only checks of the decode launchers' validation: every refusal of LaunchDecodeAttention
// and RunDecodeAttention comes before anything is enqueued (on a host without a GPU a launch
// would fail with a CUDA error instead of the check's message), and the check of the RoPE
// scaling yields the frequencies the kernel gets.
#include "attention/decode_kernel.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/internal/test_util.h"
#include "attention/internal/unchecked_launch.h"
#include "attention/merge_kernel.h"
#include "attention/rope_frequency.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::kiln::attention_internal::HostStandIns;
using ::kiln::attention_internal::SetHostPlanPart;
using ::kiln::attention_internal::SetHostRopeAppend;
using ::kiln::attention_internal::SetHostShapeAndCache;
using ::kiln::attention_internal::SetHostSplit;
using ::testing::HasSubstr;

// Decode params over host stand-ins `host` (which must outlive them) that every check accepts:
// 8 query heads over 2 KV heads, head_dim 64, one work item of 4 rows, a split workspace with
// merge items and no merge counters (so RunDecodeAttention also launches the merge).
DecodeAttentionParams HostParams(HostStandIns* host) {
  DecodeAttentionParams p;
  SetHostShapeAndCache(host, &p);
  SetHostPlanPart(host, &p.plan);
  SetHostSplit(host, &p.plan);
  return p;
}

// Every field alike (the struct has padding, so not memcmp).
bool SameFrequencies(const RopeFrequencies& a, const RopeFrequencies& b) {
  return a.log2_theta == b.log2_theta && a.scaled == b.scaled && a.inv_factor == b.inv_factor &&
         a.keep_from == b.keep_from && a.divide_below == b.divide_below &&
         a.blend_scale == b.blend_scale && a.blend_offset == b.blend_offset;
}

AttentionMergeParams MergeOf(const DecodeAttentionParams& p) {
  AttentionMergeParams m;
  m.dtype = p.dtype;
  m.num_q_heads = p.num_q_heads;
  m.num_kv_heads = p.num_kv_heads;
  m.head_dim = p.head_dim;
  m.o = p.o;
  m.o_stride = p.o_stride;
  m.plan = p.plan;
  return m;
}

TEST(DecodeKernelTest, HostParamsPassEveryCheck) {
  HostStandIns host;
  DecodeAttentionParams p = HostParams(&host);
  EXPECT_TRUE(ValidateDecodeAttentionParams(p).ok());
  EXPECT_TRUE(ValidateAttentionMergeParams(MergeOf(p)).ok());
  SetHostRopeAppend(&host, 500000.0, RopeScaling::Llama3(32.0, 1.0, 4.0, 8192), &p.rope_append);
  EXPECT_TRUE(ValidateDecodeAttentionParams(p).ok());
  // A part that does not split (test_util.h's example) passes too.
  DecodeAttentionParams unsplit;
  SetHostShapeAndCache(&host, &unsplit);
  SetHostPlanPart(&host, &unsplit.plan);
  EXPECT_TRUE(ValidateDecodeAttentionParams(unsplit).ok());
}

// The check of the RoPE scaling derives the frequencies the kernel is launched with: the bits
// of RopeFrequencies::Make, so that the launch need not derive them again.
TEST(DecodeKernelTest, ValidationReturnsTheFrequenciesOfTheRopeAppend) {
  HostStandIns host;
  DecodeAttentionParams p = HostParams(&host);
  absl::StatusOr<RopeFrequencies> none = attention_internal::ValidateDecodeAttention(p);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(SameFrequencies(*none, RopeFrequencies()));  // no positions: none
  for (const double theta : {10000.0, 500000.0, 1e6}) {
    for (const RopeScaling& scaling : {RopeScaling(), RopeScaling::Llama3(32.0, 1.0, 4.0, 8192),
                                       RopeScaling::Llama3(8.0, 1.0, 4.0, 64)}) {
      SetHostRopeAppend(&host, theta, scaling, &p.rope_append);
      const absl::StatusOr<RopeFrequencies> got = attention_internal::ValidateDecodeAttention(p);
      ASSERT_TRUE(got.ok()) << got.status();
      const RopeFrequencies want = RopeFrequencies::Make(theta, scaling);
      EXPECT_TRUE(SameFrequencies(*got, want)) << theta << " " << scaling.ToString();
    }
  }
}

// A scaling RopeScaling::Validate refuses is refused by every decode entry point with its
// message, before anything is launched; so is one whose derived band edges overflow.
TEST(DecodeKernelTest, EveryEntryPointRefusesABadScalingBeforeLaunching) {
  HostStandIns host;
  for (const RopeScaling& scaling : {RopeScaling::Llama3(0.5, 1.0, 4.0, 8192),
                                     RopeScaling::Llama3(8.0, 4.0, 1.0, 8192),
                                     RopeScaling::Llama3(8.0, 1.0, 1.7e308, 8192)}) {
    DecodeAttentionParams p = HostParams(&host);
    SetHostRopeAppend(&host, 500000.0, scaling, &p.rope_append);
    const absl::Status want = scaling.Validate();
    ASSERT_FALSE(want.ok()) << scaling.ToString();
    const std::string message = "Decode " + std::string(want.message());
    for (const absl::Status& got :
         {ValidateDecodeAttentionParams(p), attention_internal::ValidateDecodeAttention(p).status(),
          LaunchDecodeAttention(p, nullptr), RunDecodeAttention(p, nullptr)}) {
      EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument) << got;
      EXPECT_EQ(got.message(), message);
    }
  }
}

// The dtype is checked with the other fields, not left to the launch's dispatch.
TEST(DecodeKernelTest, RefusesAnUnknownDtypeBeforeLaunching) {
  HostStandIns host;
  DecodeAttentionParams p = HostParams(&host);
  p.dtype = static_cast<AttentionDtype>(7);
  EXPECT_THAT(ValidateDecodeAttentionParams(p).message(),
              HasSubstr("Decode dtype 7 is not supported"));
  EXPECT_THAT(LaunchDecodeAttention(p, nullptr).message(),
              HasSubstr("Decode dtype 7 is not supported"));
  EXPECT_THAT(ValidateAttentionMergeParams(MergeOf(p)).message(),
              HasSubstr("Merge dtype 7 is not supported"));
  EXPECT_THAT(LaunchAttentionMerge(MergeOf(p), nullptr).message(),
              HasSubstr("Merge dtype 7 is not supported"));
}

// RunDecodeAttention checks the merge before the kernel is enqueued: a refused merge must not
// follow a kernel that already wrote partials (or was captured into a graph).
TEST(DecodeKernelTest, RunDecodeAttentionRefusesABadMergeBeforeTheKernel) {
  HostStandIns host;
  DecodeAttentionParams p = HostParams(&host);
  p.plan.merge_items = nullptr;  // the kernel does not read them; the merge does
  ASSERT_TRUE(ValidateDecodeAttentionParams(p).ok());
  absl::Status s = RunDecodeAttention(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("Merge needs o, the plan's merge items"));
  // With merge counters the kernel merges itself: no merge launch, so nothing to refuse there.
  p.plan.header = &host.header;
  p.plan.merge_counters = host.merge_counters;
  p.kv.block_size = 24;  // refused by the kernel's check instead
  EXPECT_THAT(RunDecodeAttention(p, nullptr).message(), HasSubstr("block_size 24"));
}

// Decode params with fields replaced by adversarial values: LaunchDecodeAttention refuses
// exactly what ValidateDecodeAttentionParams refuses, and RunDecodeAttention what it or (when
// the merge runs) ValidateAttentionMergeParams refuses, in that order, each with the check's
// status, before anything is enqueued. Params every check accepts are counted, not launched.
TEST(DecodeKernelTest, SweepRefusesWhatTheChecksRefuseBeforeAnyLaunch) {
  std::mt19937 rng(4242);
  HostStandIns host;
  const std::vector<const void*> pointers = {&host.buffers[0], &host.buffers[16], nullptr,
                                             &host.buffers[1], &host.buffers[2]};
  const auto ptr = [&]() { return const_cast<void*>(pointers[rng() % pointers.size()]); };
  const std::vector<int> ints = {-1, 0, 1, 2, 3, 4, 8, 9, 16, 17, 24, 32, 64, 96, 128, 65536};
  const auto pick_int = [&]() { return ints[rng() % ints.size()]; };
  const std::vector<int64_t> strides = {0, -8, 100, 512, 520};
  const std::vector<RopeScaling> scalings = {RopeScaling(),
                                             RopeScaling::Llama3(32.0, 1.0, 4.0, 8192),
                                             RopeScaling::Llama3(0.5, 1.0, 4.0, 8192),
                                             RopeScaling::Llama3(8.0, 1.0, 1.7e308, 8192),
                                             RopeScaling::Llama3(8.0, 1.0, 4.0, 0)};
  int refused = 0, accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    DecodeAttentionParams p = HostParams(&host);
    if (rng() % 2) {
      SetHostRopeAppend(&host, 500000.0, RopeScaling::Llama3(32.0, 1.0, 4.0, 8192), &p.rope_append);
    }
    const int mutations = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 16) {
        case 0: p.dtype = static_cast<AttentionDtype>(static_cast<int>(rng() % 4) - 1); break;
        case 1: p.num_q_heads = pick_int(); break;
        case 2: p.num_kv_heads = pick_int(); break;
        case 3: p.head_dim = pick_int(); break;
        case 4: p.o = ptr(); break;
        case 5: p.o_stride = strides[rng() % strides.size()]; break;
        case 6: p.kv.block_size = pick_int(); break;
        case 7: p.plan.tile_rows = pick_int(); break;
        case 8: p.plan.work_capacity = pick_int(); break;
        case 9: p.plan.merge_capacity = pick_int(); break;
        case 10: p.plan.merge_items = rng() % 2 ? nullptr : p.plan.merge_items; break;
        case 11: p.plan.partial_o = static_cast<float*>(ptr()); break;
        case 12:
          p.plan.merge_counters = rng() % 2 ? nullptr : host.merge_counters;
          p.plan.header = rng() % 2 ? nullptr : &host.header;
          break;
        case 13: p.rope_append.scaling = scalings[rng() % scalings.size()]; break;
        case 14: p.rope_append.theta = rng() % 2 ? 1.0 : 10000.0; break;
        default: p.rope_append.k = ptr();
      }
    }
    const bool kernel_runs = p.plan.work_capacity > 0;
    const bool merge_runs = p.plan.merge_counters == nullptr && p.plan.merge_capacity > 0;
    const absl::Status decode = kernel_runs ? ValidateDecodeAttentionParams(p) : absl::OkStatus();
    const absl::Status merge =
        merge_runs ? ValidateAttentionMergeParams(MergeOf(p)) : absl::OkStatus();
    const std::string where = "trial " + std::to_string(trial);
    if (!decode.ok()) {
      ++refused;
      ASSERT_EQ(LaunchDecodeAttention(p, nullptr), decode) << where;
      ASSERT_EQ(RunDecodeAttention(p, nullptr), decode) << where;
      continue;
    }
    if (!merge.ok()) {
      ++refused;
      ASSERT_EQ(RunDecodeAttention(p, nullptr), merge) << where;
      continue;
    }
    ++accepted;  // every launch would go ahead: not run on host buffers
  }
  RecordProperty("refused", refused);
  RecordProperty("accepted_not_launched", accepted);
  EXPECT_GT(refused, 10000);
  EXPECT_GT(accepted, 1000);
}

}  // namespace
}  // namespace kiln
