// Host test of the --measure mode's output: RenderMeasured's table and calibration block, with
// ordinary and odd model and GPU names. MeasurePlan itself needs a GPU.
#include "tools/memory_planner_measure.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/config/presets.h"
#include "runtime/config/quoted.h"
#include "runtime/memory/memory_planner.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

// A measurement of the default config's plan, with two terms and a calibration.
MeasuredPlan Measured() {
  MeasuredPlan m;
  absl::StatusOr<MemoryPlan> plan = PlanMemory(DefaultPlannerConfig());
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (plan.ok()) m.plan = *plan;
  m.terms.push_back({"weights", 1000, 1100, "DeviceWeights"});
  m.terms.push_back({"nccl", 0, 0, "not measured (tensor_parallel_size 1)"});
  m.num_graphs = 35;
  m.calibration.set_graph_bytes_per_node(4096);
  m.calibration.set_cublaslt_workspace_bytes(1 << 25);
  m.calibration.set_margin_bytes(1 << 29);
  return m;
}

// The first line of the rendering.
std::string Title(const MeasuredPlan& m) {
  const std::string out = RenderMeasured(m);
  return out.substr(0, out.find('\n'));
}

TEST(RenderMeasuredTest, WritesTheTableAndTheCalibration) {
  const MeasuredPlan m = Measured();
  const std::string out = RenderMeasured(m);
  EXPECT_EQ(Title(m), absl::StrCat("Measured on NVIDIA H100 80GB HBM3 (",
                                   FormatBytes(m.plan.total_bytes),
                                   "): Llama-3.1-8B, 35 full graphs"));
  EXPECT_THAT(out, HasSubstr("+10.0%  DeviceWeights\n"));
  EXPECT_THAT(out, HasSubstr("calibration {\n  graph_bytes_per_node: 4096\n"
                             "  cublaslt_workspace_bytes: 33554432\n"
                             "  margin_bytes: 536870912\n}\n"));
}

// Model and GPU names come from the user (a flag, a config file, a model directory's name): the
// title writes them as Escaped does, as the plan's table does, so that an ESC, a newline, U+009B
// or a right-to-left override neither breaks its line, reaches the terminal nor reorders it.
TEST(RenderMeasuredTest, TitleEscapesOddNames) {
  MeasuredPlan m = Measured();
  m.plan.config.mutable_model()->set_name("odd\033[31m\n\302\2332J \"q\"");
  m.plan.config.mutable_gpu()->set_name("gpu\a\xe2\x80\xae" "xyz\xff");
  EXPECT_EQ(Title(m), absl::StrCat("Measured on gpu\\x07\\xe2\\x80\\xaexyz\\xff (",
                                   FormatBytes(m.plan.total_bytes),
                                   "): odd\\x1b[31m\\n\\u009b2J \\\"q\\\", 35 full graphs"));
  m.plan.config.mutable_gpu()->set_name("H100 \xe2\x80\xae" "001H");
  EXPECT_THAT(Title(m), HasSubstr("Measured on H100 \\u202e001H ("));
  const std::string out = RenderMeasured(m);
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    EXPECT_TRUE(IsOneCleanLine(line)) << line;
  }
}

}  // namespace
}  // namespace kiln
