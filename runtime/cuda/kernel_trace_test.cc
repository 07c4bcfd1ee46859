// Host tests of the trace analysis (ProfileReplays, FindRepeatedBlock, ShortKernelName) over
// hand-made records; recording itself is tested on a GPU (runtime/model/kernel_trace_gpu_test.cc).
#include "runtime/cuda/kernel_trace.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(ShortKernelNameTest, KeepsTheNameAndTemplateArgumentsOnly) {
  EXPECT_EQ(ShortKernelName("void kiln::(anonymous namespace)::PrefetchGemmKernel<(kiln::"
                            "Staging)0, __nv_bfloat16, true>(kiln::PrefetchGemmParams)"),
            "PrefetchGemmKernel<(Staging)0, __nv_bfloat16, true>");
  EXPECT_EQ(ShortKernelName("kiln::RopeKvAppendKernel(kiln::RopeArgs, int)"), "RopeKvAppendKernel");
  EXPECT_EQ(ShortKernelName("void kiln::attention_internal::DecodeAttentionKernel<(kiln::"
                            "AttentionDtype)0, 64, 4, false>(kiln::DecodeKernelArgs)"),
            "DecodeAttentionKernel<(AttentionDtype)0, 64, 4, false>");
  EXPECT_EQ(ShortKernelName("nvjet_sm90_tss_512x32_64x3_2x1_v_bz_TNT"),
            "nvjet_sm90_tss_512x32_64x3_2x1_v_bz_TNT");
  EXPECT_EQ(ShortKernelName(std::string(200, 'k')).size(), 80u);
}

KernelRecord Kernel(uint64_t start, uint64_t end, uint64_t node, std::string name,
                    uint32_t graph = 7) {
  return {start, end, graph, node, std::move(name)};
}

// Expects `got` to be `want`: the same kernels in the same order, launches and µs.
void ExpectShares(const std::vector<KernelShare>& got, const std::vector<KernelShare>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].kernel, want[i].kernel) << i;
    EXPECT_EQ(got[i].launches, want[i].launches) << want[i].kernel;
    EXPECT_DOUBLE_EQ(got[i].us, want[i].us) << want[i].kernel;
  }
}

// The same for nodes.
void ExpectNodes(const std::vector<NodeShare>& got, const std::vector<NodeShare>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].kernel, want[i].kernel) << i;
    EXPECT_DOUBLE_EQ(got[i].us, want[i].us) << i;
  }
}

// Three kernels per replay starting at t ns; B starts early (programmatic launch) and ends 5 µs
// after the first A; the second A lasts c ns.
std::vector<KernelRecord> Replay(uint64_t t, uint64_t c) {
  return {Kernel(t, t + 10000, 1, "void A(int)"), Kernel(t + 2000, t + 15000, 2, "void B(int)"),
          Kernel(t + 16000, t + 16000 + c, 3, "void A(int)")};
}

TEST(ProfileReplaysTest, GivesEachKernelItsIncrementOfTheMedianReplay) {
  std::vector<KernelRecord> records;
  // Spans 20, 40 and 30 µs: the median is the third.
  for (const auto& [t, c] :
       {std::pair<uint64_t, uint64_t>{0, 4000}, {100000, 24000}, {200000, 14000}}) {
    for (const KernelRecord& r : Replay(t, c)) records.push_back(r);
  }
  records.push_back(Kernel(50000, 60000, 9, "void Eager(int)", 0));  // outside any graph
  absl::StatusOr<ReplayProfile> profile = ProfileReplays(records);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->replays, 3);
  EXPECT_EQ(profile->kernels, 3);
  // The median replay: A 0–10 µs, B 2–15 µs, A 16–30 µs: increments A 10 + 15, B 5.
  EXPECT_DOUBLE_EQ(profile->span_us, 30.0);
  ExpectShares(profile->shares, {{"A", 2, 25.0}, {"B", 1, 5.0}});
  // Node by node, in order of start.
  ExpectNodes(profile->nodes, {{"A", 10.0}, {"B", 5.0}, {"A", 15.0}});
}

// Nodes named by the letters of `names`, the i-th with increment us(i).
std::vector<NodeShare> Nodes(const std::string& names, double (*us)(int)) {
  std::vector<NodeShare> nodes;
  for (size_t i = 0; i < names.size(); ++i) {
    nodes.push_back({std::string(1, names[i]), us(static_cast<int>(i))});
  }
  return nodes;
}

TEST(FindRepeatedBlockTest, FindsTheLayersAndTheirMedianIncrements) {
  // E, then four layers of n q a o n g d (two kernels each twice), then a final F and S.
  const std::vector<NodeShare> nodes =
      Nodes("Enqaongdnqaongdnqaongdnqaongd" + std::string("FS"),
            [](int i) { return static_cast<double>(i); });
  const std::optional<RepeatedBlock> block = FindRepeatedBlock(nodes);
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(block->first, 1);
  EXPECT_EQ(block->repeats, 4);
  ASSERT_EQ(block->nodes.size(), 7u);
  // Position j of the block sits at 1 + 7r + j; of the four repeats the median (the third of
  // the sorted increments) is r = 2.
  const std::string kernels = "nqaongd";
  for (int j = 0; j < 7; ++j) {
    EXPECT_EQ(block->nodes[j].kernel, std::string(1, kernels[j]));
    EXPECT_DOUBLE_EQ(block->nodes[j].us, 1 + 7 * 2 + j);
  }
}

TEST(FindRepeatedBlockTest, PrefersTheShortestBlockOfTheMostCoverage) {
  // "ab" eight times covers as much as "abab" four times: the shorter block wins.
  const std::optional<RepeatedBlock> block =
      FindRepeatedBlock(Nodes("abababababababab", [](int) { return 1.0; }));
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(block->first, 0);
  EXPECT_EQ(block->repeats, 8);
  EXPECT_EQ(block->nodes.size(), 2u);
  // A partial block at the end does not count: "xyz" three times, then "xy".
  const std::optional<RepeatedBlock> partial =
      FindRepeatedBlock(Nodes("xyzxyzxyzxy", [](int) { return 1.0; }));
  ASSERT_TRUE(partial.has_value());
  EXPECT_EQ(partial->repeats, 3);
  EXPECT_EQ(partial->nodes.size(), 3u);
}

TEST(FindRepeatedBlockTest, NeedsMinRepeats) {
  EXPECT_FALSE(FindRepeatedBlock(Nodes("abcabd", [](int) { return 1.0; })).has_value());
  EXPECT_FALSE(FindRepeatedBlock(Nodes("abab", [](int) { return 1.0; }), 3).has_value());
  EXPECT_TRUE(FindRepeatedBlock(Nodes("abab", [](int) { return 1.0; }), 2).has_value());
  EXPECT_FALSE(FindRepeatedBlock({}).has_value());
}

TEST(ProfileReplaysTest, AKernelEndingUnderAnEarlierOneAddsNothing) {
  std::vector<KernelRecord> records = {Kernel(0, 100, 1, "Long"), Kernel(10, 50, 2, "Inner"),
                                       Kernel(60, 120, 3, "Tail")};
  absl::StatusOr<ReplayProfile> profile = ProfileReplays(records);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->replays, 1);
  ExpectShares(profile->shares, {{"Long", 1, 0.1}, {"Tail", 1, 0.02}, {"Inner", 1, 0.0}});
  ExpectNodes(profile->nodes, {{"Long", 0.1}, {"Inner", 0.0}, {"Tail", 0.02}});
}

TEST(ProfileReplaysTest, TakesTheGraphWithTheMostKernels) {
  std::vector<KernelRecord> records = {Kernel(0, 10, 1, "Small", 3), Kernel(20, 30, 1, "Big", 4),
                                       Kernel(30, 40, 2, "Big", 4)};
  absl::StatusOr<ReplayProfile> profile = ProfileReplays(records);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->kernels, 2);
  ASSERT_EQ(profile->shares.size(), 1u);
  EXPECT_EQ(profile->shares[0].kernel, "Big");
}

TEST(ProfileReplaysTest, RefusesRecordsWithoutGraphsOrWithAPartialReplay) {
  absl::StatusOr<ReplayProfile> none = ProfileReplays({Kernel(0, 10, 1, "Eager", 0)});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("none of the 1 kernel records"));

  std::vector<KernelRecord> records = Replay(0, 10);
  records.push_back(Kernel(100000, 110000, 1, "A"));  // a second replay cut short
  absl::StatusOr<ReplayProfile> cut = ProfileReplays(records);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cut.status().message(), HasSubstr("replay 1 of graph 7 has 1 kernels, replay 0 3"));
}

TEST(ProfileReplaysTest, RefusesAKernelThatEndsBeforeItStarts) {
  // The replay's span is its last end - its first start in unsigned arithmetic: this replay of
  // one kernel from 100 to 50 ns spanned 2^64 - 50 ns.
  std::vector<KernelRecord> records = {Kernel(100, 50, 1, "void Backwards(int)")};
  absl::StatusOr<ReplayProfile> profile = ProfileReplays(records);
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(profile.status().message(), HasSubstr("Backwards (node 1 of graph 7) ends at 50"));
  // Kernels outside the profiled graph are not looked at.
  records = Replay(0, 10);
  records.push_back(Kernel(500, 400, 9, "void Eager(int)", 0));
  EXPECT_TRUE(ProfileReplays(records).ok());
}

}  // namespace
}  // namespace kiln
