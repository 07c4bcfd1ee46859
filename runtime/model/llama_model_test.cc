// Host tests of LlamaModel's step-argument check (CheckLlamaStepArgs), the one check Forward makes
// per step and RunPiece and RunAttention make per call: every refused view alone, each with a
// message that names it, and views that pass; and of CheckedLlamaStepArgs, through which the
// Runner's piecewise step checks once what each layer's attention then runs with unchecked.
// Nothing here touches a GPU; the stand-in pointers are never read.
#include "runtime/model/llama_model.h"

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/model/internal/step_args_stand_ins.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Stand-ins that the check accepts, as a decode step of 4 tokens in 2 rows.
struct StandIns : testing_internal::StepArgsStandIns {
  LlamaStepArgs Args() { return StepArgsStandIns::Args(/*num_tokens=*/4, /*num_rows=*/2); }
};

TEST(CheckLlamaStepArgsTest, AcceptsSetViewsWithSizesInOrder) {
  StandIns s;
  EXPECT_TRUE(CheckLlamaStepArgs(s.Args()).ok()) << CheckLlamaStepArgs(s.Args());
  LlamaStepArgs prefill_only = s.Args();
  prefill_only.decode.work_capacity = 0;
  prefill_only.prefill.work_capacity = 3;
  EXPECT_TRUE(CheckLlamaStepArgs(prefill_only).ok()) << CheckLlamaStepArgs(prefill_only);
  LlamaStepArgs one_row_per_token = s.Args();
  one_row_per_token.num_rows = one_row_per_token.num_tokens;
  EXPECT_TRUE(CheckLlamaStepArgs(one_row_per_token).ok());
  // The mirror is optional.
  LlamaStepArgs mirrored = s.Args();
  mirrored.next_tokens_mirror = s.ints;
  EXPECT_TRUE(CheckLlamaStepArgs(mirrored).ok());
}

// Views that CheckLlamaStepArgs refuses, one fault each (two null views in one), each with what
// its message must say.
std::vector<std::pair<std::string, LlamaStepArgs>> BadCases(StandIns& s) {
  std::vector<std::pair<std::string, LlamaStepArgs>> cases;
  auto add = [&](const std::string& expect, auto change) {
    LlamaStepArgs args = s.Args();
    change(args);
    cases.emplace_back(expect, args);
  };
  add("num_tokens 0 and num_rows 2", [](LlamaStepArgs& a) { a.num_tokens = 0; });
  add("num_tokens -4 and num_rows 2", [](LlamaStepArgs& a) { a.num_tokens = -4; });
  add("num_tokens 4 and num_rows 0", [](LlamaStepArgs& a) { a.num_rows = 0; });
  add("num_tokens 4 and num_rows 5", [](LlamaStepArgs& a) { a.num_rows = 5; });
  add("256-byte aligned", [](LlamaStepArgs& a) { a.activations = nullptr; });
  add("256-byte aligned", [&](LlamaStepArgs& a) { a.activations = s.region + 16; });
  add("Step view token_ids is null", [](LlamaStepArgs& a) { a.token_ids = nullptr; });
  add("Step view positions is null", [](LlamaStepArgs& a) { a.positions = nullptr; });
  add("Step view last_token_rows is null", [](LlamaStepArgs& a) { a.last_token_rows = nullptr; });
  add("Step view block_table is null", [](LlamaStepArgs& a) { a.block_table = nullptr; });
  add("Step view logits is null", [](LlamaStepArgs& a) { a.logits = nullptr; });
  add("Step view next_tokens is null", [](LlamaStepArgs& a) { a.next_tokens = nullptr; });
  // With several null views the first in declaration order is named.
  add("Step view positions is null", [](LlamaStepArgs& a) {
    a.positions = nullptr;
    a.next_tokens = nullptr;
  });
  add("max_blocks_per_seq 0 is below 1", [](LlamaStepArgs& a) { a.max_blocks_per_seq = 0; });
  add("no enabled plan part (work_capacity decode 0, prefill 0)",
      [](LlamaStepArgs& a) { a.decode.work_capacity = 0; });
  add("no enabled plan part (work_capacity decode -1, prefill 0)",
      [](LlamaStepArgs& a) { a.decode.work_capacity = -1; });
  return cases;
}

TEST(CheckLlamaStepArgsTest, RefusesEachBadViewNamingIt) {
  StandIns s;
  const std::vector<std::pair<std::string, LlamaStepArgs>> cases = BadCases(s);
  ASSERT_EQ(cases.size(), 16u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const absl::Status status = CheckLlamaStepArgs(cases[i].second);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << "case " << i << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(cases[i].first)) << "case " << i;
    EXPECT_THAT(std::string(status.message()), Not(HasSubstr("\n"))) << "case " << i;
  }
}

// The piecewise step's attention (LlamaModel::RunAttention with CheckedLlamaStepArgs) checks only
// its layer: the views are checked when the step makes its CheckedLlamaStepArgs, before it
// enqueues anything. Check refuses every view CheckLlamaStepArgs refuses, with its status, and
// is the only way to make one, so no attention runs with views that were not checked.
TEST(CheckedLlamaStepArgsTest, RefusesWhatCheckLlamaStepArgsRefusesAndIsMadeOnlyByIt) {
  static_assert(!std::is_default_constructible_v<CheckedLlamaStepArgs>);
  static_assert(!std::is_constructible_v<CheckedLlamaStepArgs, const LlamaStepArgs&>);
  static_assert(!std::is_convertible_v<LlamaStepArgs, CheckedLlamaStepArgs>);
  StandIns s;
  for (const auto& [expect, args] : BadCases(s)) {
    const absl::StatusOr<CheckedLlamaStepArgs> checked = CheckedLlamaStepArgs::Check(args);
    EXPECT_EQ(checked.status(), CheckLlamaStepArgs(args)) << expect;
    EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument) << expect;
    EXPECT_THAT(std::string(checked.status().message()), HasSubstr(expect));
  }
  // Accepted views come back as they were.
  LlamaStepArgs good = s.Args();
  good.next_tokens_mirror = s.ints;
  good.prefill.work_capacity = 3;
  const absl::StatusOr<CheckedLlamaStepArgs> checked = CheckedLlamaStepArgs::Check(good);
  ASSERT_TRUE(checked.ok()) << checked.status();
  const LlamaStepArgs& a = checked->args();
  EXPECT_EQ(a.num_tokens, 4);
  EXPECT_EQ(a.num_rows, 2);
  EXPECT_EQ(a.token_ids, good.token_ids);
  EXPECT_EQ(a.positions, good.positions);
  EXPECT_EQ(a.last_token_rows, good.last_token_rows);
  EXPECT_EQ(a.block_table, good.block_table);
  EXPECT_EQ(a.max_blocks_per_seq, good.max_blocks_per_seq);
  EXPECT_EQ(a.decode.work_capacity, 1);
  EXPECT_EQ(a.prefill.work_capacity, 3);
  EXPECT_EQ(a.activations, static_cast<void*>(s.region));
  EXPECT_EQ(a.logits, good.logits);
  EXPECT_EQ(a.next_tokens, good.next_tokens);
  EXPECT_EQ(a.next_tokens_mirror, s.ints);
}

}  // namespace
}  // namespace kiln
