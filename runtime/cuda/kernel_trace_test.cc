// Host tests of the trace analysis (ProfileReplays, FindRepeatedBlock, ShortKernelName) over
// hand-made records; recording itself is tested on a GPU (runtime/model/kernel_trace_gpu_test.cc).
#include "runtime/cuda/kernel_trace.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
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


// ---- Sweeps over seeded random input: names the demangler could give, records CUPTI could give
// (or a caller could pass), checked against independent reference computations.

// Random names from the pieces a demangled kernel name is made of, and raw bytes.
TEST(ShortKernelNameTest, AnyTextGivesAShortNameWithoutQualifiers) {
  const std::vector<std::string> pieces = {"void ", "kiln::",     "(anonymous namespace)::",
                                           "Kern",  "<",          ">",
                                           "(",     ")",          ", ",
                                           "int",   "::",         "_",
                                           "3",     " ",          "\xc3\xa9",
                                           "\xff",  "operator()", "&"};
  std::mt19937 rng(21);
  for (int i = 0; i < 20000; ++i) {
    std::string name;
    const int n = static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) name += pieces[rng() % pieces.size()];
    if (i % 10 == 0) name += std::string(rng() % 200, 'x');
    const std::string short_name = ShortKernelName(name);
    ASSERT_LE(short_name.size(), 80u) << name;
    // Never cut inside a UTF-8 sequence: the byte after the cut starts a character.
    if (!short_name.empty() && short_name.size() == 80) {
      const std::string rest = ShortKernelName(name);
      ASSERT_EQ(rest, short_name);  // deterministic
    }
    for (size_t k = 0; k + 1 < short_name.size(); ++k) {
      const unsigned char c = static_cast<unsigned char>(short_name[k]);
      if (c == 0xc3) {
        ASSERT_LT(k + 1, short_name.size()) << name;
      }
    }
    if (!short_name.empty()) {
      ASSERT_NE(static_cast<unsigned char>(short_name.back()), 0xc3u) << name;
    }
  }
  // A qualified name keeps its last component, whatever the namespaces.
  for (int i = 0; i < 2000; ++i) {
    std::string name = "void ";
    const int depth = static_cast<int>(rng() % 6);
    for (int d = 0; d < depth; ++d) name += "ns" + std::to_string(rng() % 100) + "::";
    const std::string last = "Kernel" + std::to_string(i);
    name += last + "(int, float*)";
    ASSERT_EQ(ShortKernelName(name), last) << name;
  }
  // 79 ASCII bytes then a two-byte character: cut before it, not through it.
  EXPECT_EQ(ShortKernelName(std::string(79, 'k') + "\xc3\xa9tail"), std::string(79, 'k'));
}

// The reference profile of one graph's replays, computed the plain way: split at the first
// repeated node, take the replay of median span, and each kernel's increment over the latest end
// before it.
struct ReferenceProfile {
  int replays = 0;
  double span_us = 0;
  std::vector<double> increments_us;
};

ReferenceProfile Reference(const std::vector<KernelRecord>& sorted_replays, int per_replay) {
  ReferenceProfile ref;
  const int replays = static_cast<int>(sorted_replays.size()) / per_replay;
  ref.replays = replays;
  std::vector<std::pair<uint64_t, int>> spans;
  for (int r = 0; r < replays; ++r) {
    uint64_t last = 0;
    for (int k = 0; k < per_replay; ++k)
      last = std::max(last, sorted_replays[r * per_replay + k].end_ns);
    spans.push_back({last - sorted_replays[r * per_replay].start_ns, r});
  }
  std::sort(spans.begin(), spans.end());
  const int median = spans[spans.size() / 2].second;
  ref.span_us = static_cast<double>(spans[spans.size() / 2].first) / 1e3;
  uint64_t latest = sorted_replays[median * per_replay].start_ns;
  for (int k = 0; k < per_replay; ++k) {
    const KernelRecord& r = sorted_replays[median * per_replay + k];
    ref.increments_us.push_back(r.end_ns > latest ? static_cast<double>(r.end_ns - latest) / 1e3
                                                  : 0);
    latest = std::max(latest, r.end_ns);
  }
  return ref;
}

TEST(ProfileReplaysTest, RandomReplaysMatchTheReference) {
  std::mt19937_64 rng(22);
  int profiled = 0, refused = 0;
  for (int round = 0; round < 3000; ++round) {
    const int per_replay = 1 + static_cast<int>(rng() % 12);
    const int replays = 1 + static_cast<int>(rng() % 6);
    // Timestamps near zero, or near the top of uint64 (a span must not wrap).
    const uint64_t base =
        rng() % 3 == 0 ? std::numeric_limits<uint64_t>::max() - (uint64_t{1} << 40) : rng() % 1000;
    std::vector<KernelRecord> graph;
    uint64_t t = base;
    for (int r = 0; r < replays; ++r) {
      for (int k = 0; k < per_replay; ++k) {
        t += 1 + rng() % 5000;  // strictly increasing starts: the order is unambiguous
        const uint64_t length = rng() % 20000;
        graph.push_back(Kernel(t, t + length, static_cast<uint64_t>(k) * 7 + 1,
                               "void K" + std::to_string(rng() % 4) + "(int)"));
      }
      t += 100000;
    }
    std::vector<KernelRecord> records = graph;
    // Kernels outside graphs, and a smaller graph, are ignored.
    for (int e = 0; e < static_cast<int>(rng() % 4); ++e) {
      records.push_back(Kernel(rng() % 1000000, rng() % 1000000, 99, "Eager", 0));
    }
    if (graph.size() > 1) records.push_back(Kernel(5, 10, 1, "Other", 8));
    const bool backwards = rng() % 10 == 0;
    if (backwards) std::swap(graph[0].start_ns, graph[0].end_ns), records[0] = graph[0];
    const bool partial = !backwards && replays > 1 && per_replay > 1 && rng() % 10 == 0;
    if (partial) records.erase(records.begin() + per_replay);  // replay 1 loses a kernel
    std::shuffle(records.begin(), records.end(), rng);

    absl::StatusOr<ReplayProfile> profile = ProfileReplays(records);
    if ((backwards && graph[0].end_ns < graph[0].start_ns) || partial) {
      ASSERT_EQ(profile.status().code(), absl::StatusCode::kInvalidArgument) << round;
      ++refused;
      continue;
    }
    ASSERT_TRUE(profile.ok()) << round << ": " << profile.status();
    const ReferenceProfile ref = Reference(graph, per_replay);
    ASSERT_EQ(profile->replays, ref.replays) << round;
    ASSERT_EQ(profile->kernels, per_replay) << round;
    ASSERT_DOUBLE_EQ(profile->span_us, ref.span_us) << round;
    ASSERT_EQ(profile->nodes.size(), ref.increments_us.size()) << round;
    double sum = 0, shares = 0;
    for (size_t k = 0; k < ref.increments_us.size(); ++k) {
      ASSERT_DOUBLE_EQ(profile->nodes[k].us, ref.increments_us[k]) << round << " node " << k;
      sum += profile->nodes[k].us;
    }
    for (const KernelShare& share : profile->shares) shares += share.us;
    // The increments add up to the span, and the shares to the increments.
    ASSERT_NEAR(sum, profile->span_us, 1e-6 * std::max(1.0, profile->span_us)) << round;
    ASSERT_NEAR(shares, sum, 1e-6 * std::max(1.0, sum)) << round;
    ++profiled;
  }
  EXPECT_GT(profiled, 2000);
  EXPECT_GT(refused, 100);
}

// The block FindRepeatedBlock should find, by brute force over every period and start.
std::optional<RepeatedBlock> BruteForceBlock(const std::vector<NodeShare>& nodes, int min_repeats) {
  const int n = static_cast<int>(nodes.size());
  min_repeats = std::max(min_repeats, 2);
  int best_p = 0, best_a = 0, best_r = 0;
  for (int p = 1; p <= n; ++p) {
    for (int a = 0; a + p <= n; ++a) {
      int r = 1;
      while (a + (r + 1) * p <= n) {
        bool same = true;
        for (int j = 0; j < p && same; ++j)
          same = nodes[a + r * p + j].kernel == nodes[a + j].kernel;
        if (!same) break;
        ++r;
      }
      if (r >= min_repeats && r * p > best_r * best_p) {
        best_p = p;
        best_a = a;
        best_r = r;
      }
    }
  }
  if (best_r == 0) return std::nullopt;
  RepeatedBlock block;
  block.first = best_a;
  block.repeats = best_r;
  for (int j = 0; j < best_p; ++j) {
    std::vector<double> us;
    for (int r = 0; r < best_r; ++r) us.push_back(nodes[best_a + r * best_p + j].us);
    std::sort(us.begin(), us.end());
    block.nodes.push_back({nodes[best_a + j].kernel, us[us.size() / 2]});
  }
  return block;
}

TEST(FindRepeatedBlockTest, MatchesBruteForceOnRandomSequences) {
  std::mt19937 rng(23);
  int found = 0;
  for (int round = 0; round < 3000; ++round) {
    // Mostly a repeated layer with noise around it; sometimes plain noise.
    std::string names;
    for (int k = static_cast<int>(rng() % 4); k > 0; --k)
      names += static_cast<char>('a' + rng() % 3);
    const std::string layer = [&] {
      std::string l;
      for (int k = 1 + static_cast<int>(rng() % 5); k > 0; --k)
        l += static_cast<char>('a' + rng() % 4);
      return l;
    }();
    for (int r = static_cast<int>(rng() % 6); r > 0; --r) names += layer;
    for (int k = static_cast<int>(rng() % 4); k > 0; --k)
      names += static_cast<char>('a' + rng() % 3);
    std::vector<NodeShare> nodes;
    for (char c : names) nodes.push_back({std::string(1, c), static_cast<double>(rng() % 100)});
    const std::vector<int> mins = {std::numeric_limits<int>::min(), -1, 0, 1, 2, 3, 4,
                                   std::numeric_limits<int>::max()};
    for (int min_repeats : mins) {
      const std::optional<RepeatedBlock> got = FindRepeatedBlock(nodes, min_repeats);
      const std::optional<RepeatedBlock> want = BruteForceBlock(nodes, min_repeats);
      ASSERT_EQ(got.has_value(), want.has_value()) << names << " min " << min_repeats;
      if (!got.has_value()) continue;
      ++found;
      ASSERT_EQ(got->first, want->first) << names << " min " << min_repeats;
      ASSERT_EQ(got->repeats, want->repeats) << names << " min " << min_repeats;
      ASSERT_EQ(got->nodes.size(), want->nodes.size()) << names << " min " << min_repeats;
      for (size_t j = 0; j < want->nodes.size(); ++j) {
        ASSERT_EQ(got->nodes[j].kernel, want->nodes[j].kernel) << names;
        ASSERT_EQ(got->nodes[j].us, want->nodes[j].us) << names;
      }
    }
  }
  EXPECT_GT(found, 3000);
}
}  // namespace
}  // namespace kiln
