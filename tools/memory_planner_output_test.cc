#include "tools/memory_planner_output.h"

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "runtime/config/presets.h"
#include "runtime/config/quoted.h"
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

// The title's first line as the table writes it.
std::string TitleLine(const MemoryPlan& plan) {
  const std::string table = RenderTable(plan, 8192);
  return table.substr(0, table.find('\n'));
}

// Model and GPU names (a flag's, a config file's) are escaped in the table's title, so that an
// ESC, a newline or U+009B neither breaks its line nor reaches the terminal; ordinary names are
// written as they are, and the SVG keeps its own escaping.
TEST(MemoryPlannerOutputTest, TableTitleEscapesOddNames) {
  EXPECT_EQ(TitleLine(Plan(DefaultPlannerConfig())),
            "kiln memory plan: Llama-3.1-8B (bf16) on NVIDIA H100 80GB HBM3, "
            "tensor_parallel_size 1");
  config::PlannerConfig config = DefaultPlannerConfig();
  config.mutable_model()->set_name("Llama 3.1 (\xc3\xa9" "dition) & <B>");
  config.mutable_gpu()->set_name("H100 \xe6\x97\xa5\xe6\x9c\xac");
  EXPECT_EQ(TitleLine(Plan(config)),
            "kiln memory plan: Llama 3.1 (\xc3\xa9" "dition) & <B> (bf16) on H100 "
            "\xe6\x97\xa5\xe6\x9c\xac, tensor_parallel_size 1");

  // An ESC (a terminal escape), a newline and U+009B (a terminal's CSI); a BEL, U+2028 and a byte
  // that is not UTF-8.
  config.mutable_model()->set_name("odd\033[31m\n\302\2332J");
  config.mutable_gpu()->set_name("gpu\a\xe2\x80\xa8\xff");
  const MemoryPlan plan = Plan(config);
  const std::string table = RenderTable(plan, 8192);
  EXPECT_EQ(TitleLine(plan),
            "kiln memory plan: odd\\x1b[31m\\n\\u009b2J (bf16) on gpu\\x07\\xe2\\x80\\xa8\\xff, "
            "tensor_parallel_size 1");
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    EXPECT_TRUE(IsOneCleanLine(line)) << line;
  }
  // A right-to-left override, which would show the rest of the title reversed.
  config::PlannerConfig reversed = DefaultPlannerConfig();
  reversed.mutable_model()->set_name("Llama\xe2\x80\xae" "B8-1.3");
  EXPECT_EQ(TitleLine(Plan(reversed)),
            "kiln memory plan: Llama\\u202eB8-1.3 (bf16) on NVIDIA H100 80GB HBM3, "
            "tensor_parallel_size 1");
  // The SVG's title holds the names as XML text: the ESC and the BEL (no XML characters) and the
  // stray byte replaced, the newline, U+009B and U+2028 as they are.
  EXPECT_THAT(RenderSvg(plan),
              HasSubstr("<title>kiln memory plan: odd\xef\xbf\xbd[31m\n\302\2332J (bf16) on "
                        "gpu\xef\xbf\xbd\xe2\x80\xa8\xef\xbf\xbd, tensor_parallel_size 1</title>"));
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

// Decodes `text` as UTF-8 code points; false where it is not well-formed (RFC 3629).
bool DecodeUtf8(const std::string& text, std::vector<uint32_t>* out) {
  for (size_t i = 0; i < text.size();) {
    const unsigned char b = text[i];
    const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    uint32_t cp = n == 1 ? b : b & (0x7f >> n);
    for (int k = 1; k < n; ++k) {
      const unsigned char c = text[i + k];
      if ((c >> 6) != 2) return false;
      cp = (cp << 6) | (c & 0x3f);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    out->push_back(cp);
    i += n;
  }
  return true;
}

// Model and GPU names of random bytes (NUL, controls, markup, broken UTF-8) on random plans, at
// any context: the table names every term and each of its lines is clean (the names escaped), the
// SVG is well-formed UTF-8 XML text (no character XML forbids, every '&' an entity, every element
// closed), and JSON and the textproto read back as the report, whose names are UTF-8.
TEST(MemoryPlannerOutputTest, SweepNamesAndPlansRenderWellFormed) {
  std::mt19937 rng(29);
  auto pick = [&](int hi) { return std::uniform_int_distribution<int>(0, hi)(rng); };
  const std::vector<std::string> models = {"llama-3.2-1b", "llama-3.1-8b", "qwen3-4b"};
  const int64_t contexts[] = {std::numeric_limits<int64_t>::min(), -1, 0, 1, 8192,
                              std::numeric_limits<int64_t>::max()};
  for (int trial = 0; trial < 150; ++trial) {
    config::PlannerConfig config = DefaultPlannerConfig();
    config.set_model_preset(models[pick(2)]);
    config.set_gpu_preset(pick(1) == 0 ? "h200" : "h100");
    config.set_tensor_parallel_size(1 << pick(2));
    config.mutable_graph()->set_mode(static_cast<config::GraphMode>(1 + pick(2)));
    std::string name, gpu_name;
    for (int i = pick(24); i > 0; --i) name.push_back(static_cast<char>(pick(255)));
    for (int i = pick(8); i > 0; --i) gpu_name.push_back("<&>\"'\x01\xc3\xa9\xff"[pick(8)]);
    config.mutable_model()->set_name(name);
    config.mutable_gpu()->set_name(gpu_name);
    absl::StatusOr<MemoryPlan> plan = PlanMemory(config);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int64_t context = contexts[pick(5)];

    const std::string table = RenderTable(*plan, context);
    for (const MemoryTerm& t : plan->terms) ASSERT_THAT(table, HasSubstr("\n" + t.name + " "));
    for (absl::string_view line : absl::StrSplit(table, '\n')) {
      ASSERT_TRUE(IsOneCleanLine(line)) << "a name of bytes " << name.size() << ": " << line;
    }

    const std::string svg = RenderSvg(*plan);
    std::vector<uint32_t> cps;
    ASSERT_TRUE(DecodeUtf8(svg, &cps)) << "not UTF-8 for a name of bytes " << name.size();
    for (uint32_t cp : cps) {
      ASSERT_TRUE(cp == '\n' || cp == '\t' || cp == '\r' ||
                  (cp >= 0x20 && cp != 0xfffe && cp != 0xffff))
          << "U+" << std::hex << cp << " is not an XML character";
    }
    for (size_t at = svg.find('&'); at != std::string::npos; at = svg.find('&', at + 1)) {
      const std::string rest = svg.substr(at, 6);
      ASSERT_TRUE(rest.rfind("&amp;", 0) == 0 || rest.rfind("&lt;", 0) == 0 ||
                  rest.rfind("&gt;", 0) == 0 || rest.rfind("&quot;", 0) == 0)
          << rest;
    }
    auto count = [&](const std::string& what) {
      int n = 0;
      for (size_t at = svg.find(what); at != std::string::npos; at = svg.find(what, at + 1)) ++n;
      return n;
    };
    ASSERT_EQ(count("<text "), count("</text>"));
    ASSERT_EQ(count("<title>"), count("</title>"));
    ASSERT_EQ(count("<svg "), 1);
    ASSERT_EQ(svg.substr(svg.size() - 7), "</svg>\n");

    const tools::MemoryPlanReport report = ToReport(*plan, context);
    std::vector<uint32_t> ignored;
    ASSERT_TRUE(DecodeUtf8(report.config().model().name(), &ignored));
    ASSERT_TRUE(DecodeUtf8(report.config().gpu().name(), &ignored));
    std::vector<uint32_t> name_cps;
    if (DecodeUtf8(name, &name_cps)) {
      ASSERT_EQ(report.config().model().name(), name);  // valid names are kept as they are
    }
    tools::MemoryPlanReport from_json;
    ASSERT_TRUE(
        google::protobuf::util::JsonStringToMessage(RenderJson(*plan, context), &from_json).ok());
    ASSERT_EQ(from_json.SerializeAsString(), report.SerializeAsString());
    tools::MemoryPlanReport from_text;
    ASSERT_TRUE(
        google::protobuf::TextFormat::ParseFromString(RenderTextProto(*plan, context), &from_text));
    ASSERT_EQ(from_text.SerializeAsString(), report.SerializeAsString());
    ASSERT_EQ(report.max_concurrency(), plan->MaxConcurrency(context));
  }
}

}  // namespace
}  // namespace kiln
