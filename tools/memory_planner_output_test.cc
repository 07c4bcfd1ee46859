#include "tools/memory_planner_output.h"

#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "runtime/config/presets.h"
#include "runtime/memory/memory_planner.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

MemoryPlan Plan(const config::PlannerConfig& config) {
  auto plan = PlanMemory(config);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : MemoryPlan{};
}

TEST(MemoryPlannerOutputTest, ReportCarriesEveryTerm) {
  const MemoryPlan plan = Plan(DefaultPlannerConfig());
  const tools::MemoryPlanReport report = ToReport(plan, 8192);
  ASSERT_EQ(report.terms_size(), static_cast<int>(plan.terms.size()));
  int64_t sum = 0;
  for (int i = 0; i < report.terms_size(); ++i) {
    EXPECT_EQ(report.terms(i).name(), plan.terms[i].name);
    EXPECT_EQ(report.terms(i).bytes(), plan.terms[i].bytes);
    sum += report.terms(i).bytes();
  }
  EXPECT_EQ(sum, report.budget_bytes());
  EXPECT_EQ(report.num_kv_blocks(), plan.num_kv_blocks);
  EXPECT_EQ(report.max_concurrency(), plan.MaxConcurrency(8192));
  EXPECT_EQ(report.config().model().num_layers(), 32);  // resolved, not just the preset name
}

TEST(MemoryPlannerOutputTest, JsonAndTextprotoReadBack) {
  config::PlannerConfig config = DefaultPlannerConfig();
  config.set_tensor_parallel_size(2);
  const MemoryPlan plan = Plan(config);
  const std::string want = ToReport(plan, 4096).SerializeAsString();

  tools::MemoryPlanReport from_json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(RenderJson(plan, 4096), &from_json).ok());
  EXPECT_EQ(from_json.SerializeAsString(), want);

  tools::MemoryPlanReport from_text;
  ASSERT_TRUE(
      google::protobuf::TextFormat::ParseFromString(RenderTextProto(plan, 4096), &from_text));
  EXPECT_EQ(from_text.SerializeAsString(), want);
}

TEST(MemoryPlannerOutputTest, TableHasARowPerTermAndIsDeterministic) {
  const MemoryPlan plan = Plan(DefaultPlannerConfig());
  const std::string table = RenderTable(plan, 8192);
  EXPECT_EQ(table, RenderTable(plan, 8192));
  for (const MemoryTerm& t : plan.terms) {
    EXPECT_THAT(table, HasSubstr("\n" + t.name + " ")) << t.name;
    EXPECT_THAT(table, HasSubstr(t.explanation)) << t.name;
  }
  EXPECT_THAT(table, HasSubstr("KV cache: 6,969 blocks of 64 tokens = 446,016 tokens"));
}

TEST(MemoryPlannerOutputTest, SvgSegmentsCoverTheBarInProportion) {
  config::PlannerConfig config = DefaultPlannerConfig();
  config.mutable_model()->set_name("A & <B>");  // escaped, not raw markup
  const MemoryPlan plan = Plan(config);
  const std::string svg = RenderSvg(plan);
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_THAT(svg, HasSubstr("A &amp; &lt;B&gt;"));
  EXPECT_EQ(svg.find("A & <B>"), std::string::npos);
  EXPECT_THAT(svg, HasSubstr("</svg>\n"));
  // The KV cache segment's width is its share of the GPU's memory times the 1240 px bar.
  const double kv_width = 1240.0 * plan.Find("kv_cache")->bytes / plan.total_bytes;
  char expected[64];
  snprintf(expected, sizeof(expected), "width=\"%.2f\"", kv_width);
  EXPECT_THAT(svg, HasSubstr(expected));
  EXPECT_THAT(svg, HasSubstr("outside budget"));
}

}  // namespace
}  // namespace kiln
