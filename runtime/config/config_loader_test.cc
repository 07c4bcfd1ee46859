#include "runtime/config/config_loader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "runtime/config/file_text.h"
#include "runtime/config/presets.h"
#include "runtime/config/quoted.h"
#include "runtime/config/testing/file_helpers.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using ::kiln::testing::ReadText;
using ::kiln::testing::ScratchDir;
using ::kiln::testing::WriteText;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TestData(const std::string& name) { return "runtime/config/testdata/" + name; }

std::string Message(const absl::Status& status) { return std::string(status.message()); }

config::PlannerConfig Rich() {
  config::PlannerConfig c = DefaultPlannerConfig();
  c.mutable_model()->set_num_layers(7);
  c.mutable_model()->set_rms_norm_eps(1e-6);
  c.mutable_model()->set_tie_embeddings(false);
  c.mutable_gpu()->set_total_bytes(uint64_t{1} << 40);
  c.mutable_gpu()->set_name("big \"quoted\" GPU");
  c.set_kv_cache_dtype(config::DTYPE_FP8_E4M3);
  for (int s : {1, 3, 9}) c.mutable_graph()->add_capture_sizes(s);
  c.mutable_graph()->set_max_capture_size(9);
  c.mutable_calibration()->set_nccl_bytes(123456789012ull);
  return c;
}

TEST(ConfigLoaderTest, TextRoundTrip) {
  const config::PlannerConfig c = Rich();
  auto back = ParsePlannerConfigText(PlannerConfigToText(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), c.SerializeAsString());
  // Presence survives: an explicit false is still set after the trip.
  EXPECT_TRUE(back->model().has_tie_embeddings());
}

TEST(ConfigLoaderTest, JsonRoundTrip) {
  const config::PlannerConfig c = Rich();
  const std::string json = PlannerConfigToJson(c);
  EXPECT_THAT(json, HasSubstr("\"max_num_seqs\": 256"));
  auto back = ParsePlannerConfigJson(json);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
  EXPECT_EQ(back->SerializeAsString(), c.SerializeAsString());
}

TEST(ConfigLoaderTest, LoadsTextprotoFile) {
  auto c = LoadPlannerConfigFile(TestData("llama70b_tp4.textproto"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_preset(), "llama-3.1-70b");
  EXPECT_EQ(c->tensor_parallel_size(), 4);
  EXPECT_EQ(c->gpu_memory_utilization(), 0.85);
  EXPECT_THAT(c->graph().capture_sizes(), ElementsAre(1, 2, 4, 8, 16, 32, 64, 128));
}

TEST(ConfigLoaderTest, LoadsJsonFileWithEitherNameSpelling) {
  auto c = LoadPlannerConfigFile(TestData("custom_model.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model().num_layers(), 4);
  EXPECT_EQ(c->model().dtype(), config::DTYPE_FP16);
  EXPECT_EQ(c->gpu().total_bytes(), 25769803776ull);
  EXPECT_EQ(c->max_num_seqs(), 32);  // written maxNumSeqs
  EXPECT_EQ(c->kv_cache_dtype(), config::DTYPE_FP8_E4M3);
  EXPECT_EQ(c->calibration().margin_bytes(), 536870912u);
  EXPECT_FALSE(c->has_model_preset());
}

TEST(ConfigLoaderTest, ParsesRopeScaling) {
  auto text = ParsePlannerConfigText(R"(
      model_preset: "llama-3.2-1b"
      model { rope_scaling { rope_type: "llama3" factor: 32 low_freq_factor: 1
                             high_freq_factor: 4 original_max_position_embeddings: 8192 } }
  )");
  ASSERT_TRUE(text.ok()) << text.status();
  const config::RopeScaling& scaling = text->model().rope_scaling();
  EXPECT_EQ(scaling.rope_type(), "llama3");
  EXPECT_EQ(scaling.factor(), 32.0);
  EXPECT_EQ(scaling.low_freq_factor(), 1.0);
  EXPECT_EQ(scaling.high_freq_factor(), 4.0);
  EXPECT_EQ(scaling.original_max_position_embeddings(), 8192);

  // config.json's object reads as it is written there.
  auto json = ParsePlannerConfigJson(R"({"model": {"rope_scaling": {"rope_type": "llama3",
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}}})");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->model().rope_scaling().factor(), 8.0);
  EXPECT_EQ(json->model().rope_scaling().original_max_position_embeddings(), 8192);
}

TEST(ConfigLoaderTest, FastDeployGraphOptimizationConfig) {
  auto c = LoadPlannerConfigFile(TestData("fastdeploy.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_num_seqs(), 128);
  EXPECT_EQ(c->graph().mode(), config::GRAPH_MODE_DECODE);
  EXPECT_THAT(c->graph().capture_sizes(), ElementsAre(1, 2, 4, 8, 16, 32, 64, 96, 128, 192));
  EXPECT_EQ(c->graph().max_capture_size(), 128);
}

TEST(ConfigLoaderTest, FastDeployModes) {
  auto off = ParsePlannerConfigJson(R"({"graph_optimization_config": {"use_cudagraph": false}})");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->graph().mode(), config::GRAPH_MODE_NONE);

  auto prefill = ParsePlannerConfigJson(
      R"({"use_cudagraph": true, "cudagraph_only_prefill": true})");  // top level works too
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_EQ(prefill->graph().mode(), config::GRAPH_MODE_PREFILL_ONLY);

  // FastDeploy's command line passes the object as a string.
  auto string_form = ParsePlannerConfigJson(
      R"({"graph_optimization_config": "{\"cudagraph_capture_sizes\": [1, 2]}"})");
  ASSERT_TRUE(string_form.ok()) << string_form.status();
  EXPECT_THAT(string_form->graph().capture_sizes(), ElementsAre(1, 2));
  EXPECT_FALSE(string_form->graph().has_mode());
}

TEST(ConfigLoaderTest, FastDeployErrors) {
  auto unknown = ParsePlannerConfigJson(
      R"({"graph_optimization_config": {"use_cudagraph": true, "cudagraph_warmups": 2}})",
      "fd.json");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(unknown.status()),
              HasSubstr("Unsupported key \"cudagraph_warmups\" in graph_optimization_config of "
                        "fd.json"));

  auto both = ParsePlannerConfigJson(
      R"({"graph": {"capture_sizes": [4]}, "cudagraph_capture_sizes": [8]})", "fd.json");
  EXPECT_THAT(Message(both.status()),
              HasSubstr("Both cudagraph_capture_sizes and graph.capture_sizes are set in "
                        "fd.json; keep one"));

  auto twice = ParsePlannerConfigJson(
      R"({"max_capture_size": 8, "graph_optimization_config": {"max_capture_size": 16}})");
  EXPECT_THAT(Message(twice.status()), HasSubstr("\"max_capture_size\" is set both"));

  auto not_bool = ParsePlannerConfigJson(R"({"use_cudagraph": 1})");
  EXPECT_THAT(Message(not_bool.status()), HasSubstr("use_cudagraph in JSON must be true or false"));

  auto not_list = ParsePlannerConfigJson(R"({"cudagraph_capture_sizes": 8})");
  EXPECT_THAT(Message(not_list.status()), HasSubstr("must be a list of integers"));

  auto fraction = ParsePlannerConfigJson(R"({"cudagraph_capture_sizes": [1.5]})");
  EXPECT_EQ(fraction.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigLoaderTest, UnparsableInputSaysWhereAndHowToFix) {
  auto text = ParsePlannerConfigText("max_num_seqs: 8\nmax_num_sequences: 4\n", "a.textproto");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  // The parser's own quotes stay as they are.
  EXPECT_EQ(Message(text.status()),
            "Cannot parse a.textproto as a kiln.config.PlannerConfig textproto at line 2 column "
            "18: Message type \"kiln.config.PlannerConfig\" has no field named "
            "\"max_num_sequences\"; fix the file (fields: runtime/config/planner_config.proto)");

  auto json = ParsePlannerConfigJson("{\"max_num_seqs\": }", "b.json");
  EXPECT_THAT(Message(json.status()), HasSubstr("Cannot parse b.json as a JSON object"));
  // What the JSON parser quotes of the file keeps its quotes too, with a caret at the spot.
  auto colon = ParsePlannerConfigJson("{\"max_num_seqs\" 1}", "b.json");
  EXPECT_EQ(Message(colon.status()),
            "Cannot parse b.json as a JSON object: Expected : between key:value pair, at ^ in "
            "\"{\"max_num_seqs\" ^1}\"; fix the file (a JSON object of kiln.config.PlannerConfig "
            "fields)");

  auto field = ParsePlannerConfigJson(R"({"max_seq_len_to_capture": 8192})", "c.json");
  EXPECT_THAT(Message(field.status()), HasSubstr("Cannot read c.json"));
  EXPECT_THAT(Message(field.status()), HasSubstr("max_seq_len_to_capture"));

  auto array = ParsePlannerConfigJson("[1, 2]", "d.json");
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);

  auto missing = LoadPlannerConfigFile("runtime/config/testdata/no_such_file.textproto");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing.status()), HasSubstr("check the path"));

  // A directory opens like a file on Linux and reads as nothing: an empty config, which would
  // plan the defaults as if the file had asked for them.
  auto directory = LoadPlannerConfigFile("runtime/config/testdata");
  EXPECT_FALSE(directory.ok());
  EXPECT_THAT(Message(directory.status()), HasSubstr("runtime/config/testdata"));
}

// The parser's own sentences lose their final period (a quoted value in one included); a token of
// the file it shows after "got: " is shown whole, a period included, and the end of the text is
// named.
TEST(ConfigLoaderTest, TextParserMessagesShowTheTokenWhole) {
  const std::string fix = "; fix the file (fields: runtime/config/planner_config.proto)";
  const struct {
    std::string text;
    std::string says;
  } cases[] = {
      {"max_num_seqs: 8.", "line 1 column 15: Expected integer, got: 8."},
      {"max_num_seqs: 8 .", "line 1 column 17: Expected identifier, got: ."},
      {"block_size: 16.", "line 1 column 13: Expected integer, got: 16."},
      {"gpu_preset: 8.", "line 1 column 13: Expected string, got: 8."},
      {"max_num_seqs: ", "line 1 column 15: Expected integer, got: the end of the text"},
      {"max_num_seqs: 8 [", "line 1 column 18: Expected identifier, got: the end of the text"},
      {"max_num_seqs: 8 max_num_seqs: 9",
       "line 1 column 29: Non-repeated field \"max_num_seqs\" is specified multiple times"},
      {"graph { capture_prefill: yes }",
       "line 1 column 30: Invalid value for boolean field \"capture_prefill\". Value: \"yes\""},
  };
  for (const auto& c : cases) {
    absl::StatusOr<config::PlannerConfig> got = ParsePlannerConfigText(c.text, "t.textproto");
    ASSERT_FALSE(got.ok()) << c.text;
    EXPECT_EQ(Message(got.status()),
              absl::StrCat("Cannot parse t.textproto as a kiln.config.PlannerConfig textproto at ",
                           c.says, fix));
  }
}

TEST(ConfigLoaderTest, MergeReplacesListsAndPresets) {
  config::PlannerConfig base = DefaultPlannerConfig();
  for (int s : {1, 2, 4}) base.mutable_graph()->add_capture_sizes(s);
  for (int s : {16, 32}) base.mutable_graph()->add_prefill_sizes(s);
  base.mutable_model()->set_num_layers(3);
  base.mutable_gpu()->set_sm_count(7);

  config::PlannerConfig overlay;
  overlay.mutable_graph()->add_capture_sizes(8);
  overlay.mutable_graph()->add_prefill_sizes(64);
  overlay.set_max_num_seqs(0);  // explicit zero is carried over (and rejected later)
  MergePlannerConfig(overlay, &base);
  EXPECT_THAT(base.graph().capture_sizes(), ElementsAre(8));
  EXPECT_THAT(base.graph().prefill_sizes(), ElementsAre(64));
  EXPECT_TRUE(base.has_max_num_seqs());
  EXPECT_EQ(base.max_num_seqs(), 0);
  EXPECT_EQ(base.model().num_layers(), 3);  // no preset named: explicit fields stay

  config::PlannerConfig preset;
  preset.set_model_preset("llama-3.2-1b");
  preset.set_gpu_preset("h200");
  MergePlannerConfig(preset, &base);
  EXPECT_EQ(base.model_preset(), "llama-3.2-1b");
  EXPECT_FALSE(base.model().has_num_layers());
  EXPECT_FALSE(base.gpu().has_sm_count());
}

// ---- Robustness: configs a user writes by hand, cut short, mistyped, or not configs at all. Run
// these under ASan and UBSan too.

// What the loader adds to protobuf's parsers, checked field by field without reflection: every
// double finite, every enum one the enum defines. Returns the first violation, or "".
std::string MeaninglessValue(const config::PlannerConfig& c) {
  const std::vector<std::pair<const char*, double>> doubles = {
      {"gpu_memory_utilization", c.gpu_memory_utilization()},
      {"model.rope_theta", c.model().rope_theta()},
      {"model.rms_norm_eps", c.model().rms_norm_eps()},
      {"model.rope_scaling.factor", c.model().rope_scaling().factor()},
      {"model.rope_scaling.low_freq_factor", c.model().rope_scaling().low_freq_factor()},
      {"model.rope_scaling.high_freq_factor", c.model().rope_scaling().high_freq_factor()},
  };
  for (const auto& [name, value] : doubles) {
    if (!std::isfinite(value)) return name;
  }
  const std::vector<std::pair<const char*, bool>> enums = {
      {"model.dtype", config::DType_IsValid(c.model().dtype())},
      {"kv_cache_dtype", config::DType_IsValid(c.kv_cache_dtype())},
      {"graph.mode", config::GraphMode_IsValid(c.graph().mode())},
      {"graph.execution", config::GraphExecution_IsValid(c.graph().execution())},
  };
  for (const auto& [name, valid] : enums) {
    if (!valid) return name;
  }
  const std::vector<std::pair<const char*, const std::string*>> strings = {
      {"model_preset", &c.model_preset()},
      {"gpu_preset", &c.gpu_preset()},
      {"model.name", &c.model().name()},
      {"model.rope_scaling.rope_type", &c.model().rope_scaling().rope_type()},
      {"gpu.name", &c.gpu().name()},
  };
  for (const auto& [name, value] : strings) {
    if (!IsUtf8(*value)) return name;
  }
  return "";
}

enum class Format { kText, kJson, kFastDeployJson };

// Parses `text` as the loader does and checks its promise against protobuf's own parser, run
// directly (the reference, for files without FastDeploy keys): a config the loader returns is the
// one protobuf reads and holds no meaningless value; a refusal is InvalidArgument naming
// `source`, on one clean line, and where protobuf reads the text, says what the loader found
// wrong with it. Returns whether the text read as a config.
bool ReadsOrFailsCleanly(const std::string& text, Format format, const std::string& what) {
  const std::string source = "sweep.cfg";
  absl::StatusOr<config::PlannerConfig> got = format == Format::kText
                                                  ? ParsePlannerConfigText(text, source)
                                                  : ParsePlannerConfigJson(text, source);
  config::PlannerConfig reference;
  bool reference_ok = false;
  if (format == Format::kText) {
    google::protobuf::TextFormat::Parser parser;
    struct Quiet : google::protobuf::io::ErrorCollector {
      void AddError(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
    } quiet;
    parser.RecordErrorsTo(&quiet);
    reference_ok = parser.ParseFromString(text, &reference);
  } else if (format == Format::kJson) {
    reference_ok = google::protobuf::util::JsonStringToMessage(text, &reference).ok();
  }
  if (!got.ok()) {
    const std::string message = Message(got.status());
    EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << what << ": " << got.status();
    EXPECT_THAT(message, HasSubstr(source)) << what;
    EXPECT_TRUE(IsOneCleanLine(message)) << what << ": " << absl::CHexEscape(message);
    if (reference_ok) {
      const std::string meaningless = MeaninglessValue(reference);
      // Besides such a value, JSON alone is refused for what protobuf reads without a word.
      const bool explained =
          (!meaningless.empty() && absl::StrContains(message, meaningless)) ||
          (format == Format::kJson && (absl::StrContains(message, "a list inside a list") ||
                                       absl::StrContains(message, "] in sweep.cfg is null") ||
                                       absl::StrContains(message, "Repeated map key")));
      EXPECT_TRUE(explained) << what << ": protobuf reads it, the loader says " << message;
    }
    return false;
  }
  EXPECT_EQ(MeaninglessValue(*got), "") << what;
  if (format != Format::kFastDeployJson) {
    EXPECT_TRUE(reference_ok) << what << ": the loader reads what protobuf refuses";
    EXPECT_EQ(got->SerializeAsString(), reference.SerializeAsString()) << what;
  }
  // Whatever it read, it writes back out in both forms and reads back to the same.
  absl::StatusOr<config::PlannerConfig> text_back =
      ParsePlannerConfigText(PlannerConfigToText(*got));
  absl::StatusOr<config::PlannerConfig> json_back =
      ParsePlannerConfigJson(PlannerConfigToJson(*got));
  EXPECT_TRUE(text_back.ok() && text_back->SerializeAsString() == got->SerializeAsString()) << what;
  EXPECT_TRUE(json_back.ok() && json_back->SerializeAsString() == got->SerializeAsString()) << what;
  return true;
}

// Truncates `text` to every length and replaces each byte with each of a few others. Returns
// the inputs tried and how many read as a config.
std::pair<int, int> SweepTruncationsAndMutations(const std::string& text, Format format,
                                                 const std::string& name) {
  int tried = 0, read = 0;
  for (size_t length = 0; length <= text.size(); ++length) {
    ++tried;
    read += ReadsOrFailsCleanly(text.substr(0, length), format,
                                absl::StrCat(name, " cut to ", length, " of ", text.size()));
  }
  // JSON's and the text format's punctuation, digits, a sign, spaces, escapes, the first letters
  // of literals (nan, inf, true), and bytes that neither format holds.
  const char kValues[] = {'\x00', '\xff', '{', '}', '[', ']', '"', ',', ':', '9',    '0', '-',
                          ' ',    '\\',   '.', 'e', 'n', 'i', 't', '#', '<', '\x80', '\n'};
  for (size_t at = 0; at < text.size(); ++at) {
    for (const char value : kValues) {
      if (text[at] == value) continue;
      std::string mutated = text;
      mutated[at] = value;
      ++tried;
      read += ReadsOrFailsCleanly(
          mutated, format,
          absl::StrCat(name, " byte ", at, " '", absl::CHexEscape(text.substr(at, 1)), "' -> '",
                       absl::CHexEscape(std::string(1, value)), "'"));
    }
  }
  return {tried, read};
}

TEST(ConfigLoaderRobustnessTest, TruncatedOrMutatedFilesReadOrFailCleanly) {
  const config::PlannerConfig rich = Rich();
  const std::vector<std::tuple<std::string, std::string, Format>> inputs = {
      {"llama70b_tp4.textproto", ReadText(TestData("llama70b_tp4.textproto")), Format::kText},
      {"custom_model.json", ReadText(TestData("custom_model.json")), Format::kJson},
      {"fastdeploy.json", ReadText(TestData("fastdeploy.json")), Format::kFastDeployJson},
      {"Rich() as text", PlannerConfigToText(rich), Format::kText},
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& [name, text, format] : inputs) {
    ASSERT_TRUE(ReadsOrFailsCleanly(text, format, name)) << name;
    const auto [tried, read] = SweepTruncationsAndMutations(text, format, name);
    EXPECT_GT(read, 0) << name;
    EXPECT_LT(read, tried) << name;
    std::printf("%s, %zu bytes: %d truncations and mutations, %d read as a config\n", name.c_str(),
                text.size(), tried, read);
  }
  std::printf("%.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// One field of a random JSON config: its names, and values protobuf reads (with what they read
// as) or that the loader must refuse.
struct FieldValues {
  std::string snake;
  std::string camel;
  std::vector<std::string> good;  // JSON text
  std::vector<std::string> bad;
  // Checks that `c` holds the value of good[i].
  std::function<bool(const config::PlannerConfig&, size_t)> holds;
};

// Draws configs of random fields, each a good value or (sometimes) a bad one, written under
// either of its names and at times with FastDeploy's keys; checks each against what it should
// be: every value read exactly (64-bit integers past 2^53 included, with FastDeploy keys too), or
// a refusal when any value is bad.
TEST(ConfigLoaderRobustnessTest, RandomConfigsReadExactlyOrAreRefused) {
  constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();
  const std::vector<std::string> bad_int = {"2147483648", "-2147483649", "1.5", "\"x\"",
                                            "true",       "{}",          "[1]", "1e400",
                                            "\"NaN\"",    "[[1]]"};
  const std::vector<int> ints = {
      0, 1, -5, std::numeric_limits<int>::max(), std::numeric_limits<int>::min(), 12, 1, 1000};
  const std::vector<std::string> int_text = {"0",           "1",      "-5",  "2147483647",
                                             "-2147483648", "\"12\"", "1.0", "1e3"};
  auto int_field = [&](const char* snake, const char* camel,
                       int (config::PlannerConfig::*get)() const) {
    return FieldValues{
        snake, camel, int_text, bad_int,
        [get, &ints](const config::PlannerConfig& c, size_t i) { return (c.*get)() == ints[i]; }};
  };
  const std::vector<uint64_t> u64s = {
      0, kMax64, kMax64, 9007199254740993ull, 123, (uint64_t{1} << 60) + 1};
  const std::vector<std::string> u64_text = {
      "0",   "18446744073709551615", "\"18446744073709551615\"", "9007199254740993",
      "123", "1152921504606846977"};
  const std::vector<std::string> bad_u64 = {"-1",    "18446744073709551616", "1.5", "\"abc\"", "[]",
                                            "\"-1\""};
  const std::vector<double> doubles = {0.5, 1e-300, -2.5, std::numeric_limits<double>::max()};
  const std::vector<std::string> double_text = {"0.5", "1e-300", "-2.5", "1.7976931348623157e308"};
  const std::vector<std::string> bad_double = {"\"NaN\"", "\"Infinity\"", "\"-Infinity\"", "1e400",
                                               "\"x\"",   "true",         "[0.5]"};
  const std::vector<FieldValues> fields = {
      int_field("max_num_seqs", "maxNumSeqs", &config::PlannerConfig::max_num_seqs),
      int_field("max_num_batched_tokens", "maxNumBatchedTokens",
                &config::PlannerConfig::max_num_batched_tokens),
      int_field("block_size", "blockSize", &config::PlannerConfig::block_size),
      {"gpu_memory_utilization", "gpuMemoryUtilization", double_text, bad_double,
       [&](const config::PlannerConfig& c, size_t i) {
         return c.gpu_memory_utilization() == doubles[i];
       }},
      {"kv_cache_dtype",
       "kvCacheDtype",
       {"\"DTYPE_BF16\"", "2", "\"DTYPE_FP8_E4M3\""},
       {"99", "-1", "\"DTYPE_X\"", "1.5", "\"\""},
       [](const config::PlannerConfig& c, size_t i) {
         return c.kv_cache_dtype() == std::vector<int>{1, 2, 4}[i];
       }},
      {"gpu",
       "gpu",
       {R"({"total_bytes": 18446744073709551615, "name": "H\u00e9"})",
        R"({"totalBytes": "9007199254740993"})", R"({"total_bytes": 85520809984})"},
       {R"({"total_bytes": -1})", R"({"total_bytes": 18446744073709551616})", R"({"name": 5})",
        R"({"total_bytes": 1, "totalBytes": 1})", R"({"sm_count": 1e10})", "[]", "7"},
       [](const config::PlannerConfig& c, size_t i) {
         const std::vector<uint64_t> want = {kMax64, 9007199254740993ull, 85520809984ull};
         return c.gpu().total_bytes() == want[i] && (i != 0 || c.gpu().name() == "H\xc3\xa9");
       }},
      {"calibration", "calibration", {}, {}, nullptr},  // filled below
      {"model",
       "model",
       {R"({"rope_theta": 500000, "num_layers": 3, "tie_embeddings": false})",
        R"({"dtype": "DTYPE_FP16", "rms_norm_eps": 1e-5})",
        R"({"rope_scaling": {"factor": 8, "rope_type": "llama3"}})"},
       {R"({"rope_theta": "NaN"})", R"({"rms_norm_eps": "-Infinity"})", R"({"dtype": 7})",
        R"({"num_layers": 3, "numLayers": 3})", R"({"rope_scaling": {"factor": "Infinity"}})",
        R"({"tie_embeddings": [true]})", R"({"no_such_field": 1})"},
       [](const config::PlannerConfig& c, size_t i) {
         const config::ModelShape& m = c.model();
         if (i == 0)
           return m.rope_theta() == 500000 && m.num_layers() == 3 && m.has_tie_embeddings() &&
                  !m.tie_embeddings();
         if (i == 1) return m.dtype() == config::DTYPE_FP16 && m.rms_norm_eps() == 1e-5;
         return m.rope_scaling().factor() == 8 && m.rope_scaling().rope_type() == "llama3";
       }},
  };
  std::vector<FieldValues> all = fields;
  {
    FieldValues& calibration = all[6];
    for (size_t i = 0; i < u64_text.size(); ++i) {
      calibration.good.push_back(absl::StrCat("{\"nccl_bytes\": ", u64_text[i], "}"));
    }
    for (const std::string& bad : bad_u64) {
      calibration.bad.push_back(absl::StrCat("{\"marginBytes\": ", bad, "}"));
    }
    calibration.holds = [u64s](const config::PlannerConfig& c, size_t i) {
      return c.calibration().nccl_bytes() == u64s[i];
    };
  }

  std::mt19937 rng(1234);
  int accepted = 0, refused = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<std::string> members;
    std::vector<std::pair<const FieldValues*, size_t>> expected;
    bool any_bad = false;
    for (const FieldValues& f : all) {
      if (rng() % 2 == 0) continue;
      const std::string& key = rng() % 2 == 0 ? f.snake : f.camel;
      if (rng() % 12 == 0) {
        any_bad = true;
        members.push_back(absl::StrCat("\"", key, "\": ", f.bad[rng() % f.bad.size()]));
      } else {
        const size_t i = rng() % f.good.size();
        expected.push_back({&f, i});
        members.push_back(absl::StrCat("\"", key, "\": ", f.good[i]));
      }
    }
    // FastDeploy's keys send the file through the rewrite into kiln's graph object.
    const int fastdeploy = static_cast<int>(rng() % 4);
    if (fastdeploy == 1) members.push_back("\"use_cudagraph\": false");
    if (fastdeploy == 2) {
      members.push_back(R"("graph_optimization_config": {"use_cudagraph": true,)"
                        R"( "cudagraph_capture_sizes": [1, 2, 8]})");
    }
    if (fastdeploy == 3) members.push_back("\"graph_opt_level\": 1");
    std::shuffle(members.begin(), members.end(), rng);
    const std::string json = absl::StrCat("{", absl::StrJoin(members, ", "), "}");
    absl::StatusOr<config::PlannerConfig> got = ParsePlannerConfigJson(json, "random.json");
    if (any_bad) {
      ASSERT_FALSE(got.ok()) << json;
      ASSERT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
      ASSERT_THAT(Message(got.status()), HasSubstr("random.json")) << json;
      ASSERT_TRUE(IsOneCleanLine(Message(got.status()))) << got.status();
      ++refused;
      continue;
    }
    ASSERT_TRUE(got.ok()) << json << "\n" << got.status();
    for (const auto& [field, i] : expected) {
      ASSERT_TRUE(field->holds(*got, i)) << field->snake << " = " << field->good[i] << " in "
                                         << json << "\nread " << got->ShortDebugString();
    }
    if (fastdeploy == 1) {
      ASSERT_EQ(got->graph().mode(), config::GRAPH_MODE_NONE) << json;
    }
    if (fastdeploy == 2) {
      ASSERT_EQ(got->graph().mode(), config::GRAPH_MODE_DECODE) << json;
      ASSERT_THAT(got->graph().capture_sizes(), ElementsAre(1, 2, 8)) << json;
    }
    if (fastdeploy == 0 || fastdeploy == 3) {
      ASSERT_FALSE(got->has_graph()) << json;
    }
    ++accepted;
  }
  std::printf("%d random configs read exactly, %d refused\n", accepted, refused);
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(refused, 500);
}

TEST(ConfigLoaderRobustnessTest, RefusesNonFiniteNumbersAndUndefinedEnums) {
  struct Case {
    std::string text;
    Format format;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"gpu_memory_utilization: nan", Format::kText, "gpu_memory_utilization in s is nan"},
      {"gpu_memory_utilization: inf", Format::kText, "gpu_memory_utilization in s is inf"},
      {"model { rope_theta: -inf }", Format::kText, "model.rope_theta in s is -inf"},
      {"model { rope_scaling { factor: nan } }", Format::kText, "model.rope_scaling.factor in s"},
      {"kv_cache_dtype: 99", Format::kText,
       "kv_cache_dtype in s is 99, which is no DType; use one of DTYPE_BF16, DTYPE_FP16, "
       "DTYPE_FP32, DTYPE_FP8_E4M3"},
      {"graph { mode: 7 }", Format::kText, "graph.mode in s is 7, which is no GraphMode"},
      {R"({"gpu_memory_utilization": "NaN"})", Format::kJson, "gpu_memory_utilization in s is nan"},
      {R"({"model": {"rmsNormEps": "Infinity"}})", Format::kJson, "model.rms_norm_eps in s is inf"},
      {R"({"kv_cache_dtype": -1})", Format::kJson, "kv_cache_dtype in s is -1, which is no DType"},
      {R"({"graph": {"execution": 9}})", Format::kJson, "graph.execution in s is 9"},
      // Through FastDeploy's rewrite too.
      {R"({"use_cudagraph": true, "model": {"rope_theta": "-Infinity"}})", Format::kJson,
       "model.rope_theta in s is -inf"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<config::PlannerConfig> got = c.format == Format::kText
                                                    ? ParsePlannerConfigText(c.text, "s")
                                                    : ParsePlannerConfigJson(c.text, "s");
    EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << c.text << ": " << got.status();
    EXPECT_THAT(Message(got.status()), HasSubstr(c.message)) << c.text;
    EXPECT_THAT(Message(got.status()),
                ::testing::AnyOf(HasSubstr("; use one of DTYPE"), HasSubstr("; use one of GRAPH"),
                                 HasSubstr("; give a finite number")));
  }
}

TEST(ConfigLoaderRobustnessTest, RefusesWhatProtobufWouldReadSilently) {
  struct Case {
    std::string json;
    std::string message;
  };
  const std::vector<Case> cases = {
      // protobuf flattens nested lists and drops nulls in one.
      {R"({"graph": {"capture_sizes": [[1], [2, 3]]}})",
       "graph.capture_sizes[0] in j.json is a list inside a list; write a flat list"},
      {R"({"graph": {"capture_sizes": [1, null, 2]}})", "graph.capture_sizes[1] in j.json is null"},
      {R"({"cudagraph_capture_sizes": [1, [2]]})", "graph.capture_sizes[1] in j.json is a list"},
      {R"({"graph_optimization_config": "{\"cudagraph_capture_sizes\": [[4]]}"})",
       "graph.capture_sizes[0] in j.json is a list inside a list"},
      // One field under both of its names.
      {R"({"max_num_seqs": 3, "maxNumSeqs": 4})",
       "j.json sets max_num_seqs twice, as \"max_num_seqs\" and \"maxNumSeqs\"; keep one"},
      {R"({"model": {"num_kv_heads": 1, "numKvHeads": 2}})",
       "j.json sets model.num_kv_heads twice"},
      // The same name twice: a JSON object's keys are unique.
      {R"({"max_num_seqs": 3, "max_num_seqs": 4})",
       R"(max_num_seqs: Repeated map key: 'max_num_seqs' is already set)"},
      {R"({"model": {"num_layers": 3, "num_layers": 3}})",
       R"(num_layers: Repeated map key: 'num_layers')"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<config::PlannerConfig> got = ParsePlannerConfigJson(c.json, "j.json");
    EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << c.json << ": " << got.status();
    EXPECT_THAT(Message(got.status()), HasSubstr(c.message)) << c.json;
  }
  // A null field is an unset one, as proto3's JSON mapping says; so is an empty list.
  absl::StatusOr<config::PlannerConfig> nulls = ParsePlannerConfigJson(
      R"({"model": null, "graph": {"capture_sizes": []}, "block_size": null})");
  ASSERT_TRUE(nulls.ok()) << nulls.status();
  EXPECT_FALSE(nulls->has_model());
  EXPECT_FALSE(nulls->has_block_size());
  EXPECT_EQ(nulls->graph().ByteSizeLong(), 0u);
}

// The FastDeploy rewrite copies every other member as the file writes it, in any of the forms
// the loader reads (unquoted keys, escapes in keys, a trailing comma, a ' inside a string).
TEST(ConfigLoaderRobustnessTest, FastDeployRewriteKeepsSixtyFourBitNumbersExact) {
  const std::vector<std::string> forms = {
      R"({"calibration": {"nccl_bytes": 9007199254740993}, "use_cudagraph": true})",
      R"({"model_preset": "it's", "calibration": {"nccl_bytes": 9007199254740993},)"
      R"( "use_cudagraph": true})",
      R"({calibration: {"nccl_bytes": 9007199254740993}, use_cudagraph: true,})",
      R"({"calib\u0072ation" : {"nccl_bytes":9007199254740993} ,"use_cudagraph":true})",
      "\t{\n\"use_cudagraph\"\t:\ttrue ,\n \"calibration\": {\"nccl_bytes\": "
      "9007199254740993}\n}\n",
  };
  for (const std::string& json : forms) {
    absl::StatusOr<config::PlannerConfig> got = ParsePlannerConfigJson(json);
    ASSERT_TRUE(got.ok()) << json << ": " << got.status();
    EXPECT_EQ(got->calibration().nccl_bytes(), 9007199254740993ull) << json;
    EXPECT_EQ(got->graph().mode(), config::GRAPH_MODE_DECODE) << json;
  }
  absl::StatusOr<config::PlannerConfig> max = ParsePlannerConfigJson(
      R"({"gpu": {"total_bytes": 18446744073709551615}, "cudagraph_capture_sizes": [2]})");
  ASSERT_TRUE(max.ok()) << max.status();
  EXPECT_EQ(max->gpu().total_bytes(), std::numeric_limits<uint64_t>::max());
}

// JSON strings are double-quoted only, for the nesting check and the rewrite's scanner alike: a '
// inside a string is a character of it, and one outside a string is refused before protobuf's
// parser, which would take it for a quote, reads the text.
TEST(ConfigLoaderRobustnessTest, SingleQuotesAreCharactersInStringsAndRefusedOutside) {
  const std::string deep = absl::StrCat(std::string(25, '['), std::string(25, ']'));
  // Inside strings: brackets after a ' still count where they are outside the string...
  absl::StatusOr<config::PlannerConfig> counted = ParsePlannerConfigJson(
      absl::StrCat(R"({"model_preset": "it's", "x": )", deep, "}"), "q.json");
  EXPECT_THAT(
      Message(counted.status()),
      HasSubstr("Cannot parse q.json as a JSON object: its objects and lists nest 26 deep"));
  // ...and those inside the string do not count, nor end the member the rewrite copies.
  absl::StatusOr<config::PlannerConfig> read = ParsePlannerConfigJson(
      absl::StrCat(R"({"model": {"name": "'", "rope_scaling": {"rope_type": "')", deep,
                   R"('"}}, "gpu": {"total_bytes": 18446744073709551615}, "use_cudagraph": true})"),
      "q.json");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->model().name(), "'");
  EXPECT_EQ(read->model().rope_scaling().rope_type(), absl::StrCat("'", deep, "'"));
  EXPECT_EQ(read->gpu().total_bytes(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(read->graph().mode(), config::GRAPH_MODE_DECODE);

  // Outside strings, wherever it stands, with the line and column.
  struct Case {
    std::string json;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"({'max_num_seqs': 8})",
       "Cannot parse q.json as a JSON object: line 1 column 2 holds a ' outside a string: JSON "
       "strings take double quotes only; fix the file (a JSON object of kiln.config.PlannerConfig "
       "fields)"},
      {"{\"max_num_seqs\": 8,\n  \"model_preset\": 'llama-3.1-8b'}",
       "Cannot parse q.json as a JSON object: line 2 column 19 holds a ' outside a string"},
      // protobuf reads 'x"' as a key: the nesting between the two " would go uncounted.
      {absl::StrCat(R"({'a"': )", deep, R"(, 'b"': 1})"), "line 1 column 2 holds a '"},
      {R"({"graph_optimization_config": "{'use_cudagraph': true}"})",
       "graph_optimization_config in q.json is a string that is not a JSON object (its line 1 "
       "column 2 holds a ' outside a string: JSON strings take double quotes only); write it as "
       "an object"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<config::PlannerConfig> got = ParsePlannerConfigJson(c.json, "q.json");
    EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << c.json << ": " << got.status();
    EXPECT_THAT(Message(got.status()), HasSubstr(c.message)) << c.json;
  }
  // The nesting check counts what the rewrite's scanner skips: both step over the same strings.
  for (const std::string json : {R"({"model_preset": "'[[", "use_cudagraph": true})",
                                 R"({"model_preset": "\"'{", "use_cudagraph": true})"}) {
    absl::StatusOr<config::PlannerConfig> got = ParsePlannerConfigJson(json, "q.json");
    ASSERT_TRUE(got.ok()) << json << ": " << got.status();
    EXPECT_EQ(JsonNestingDepth(json), 1) << json;
    EXPECT_EQ(SkipJsonValue(json, 0), json.size()) << json;
  }
}

TEST(ConfigLoaderRobustnessTest, DeepOrHugeJsonIsQuick) {
  struct Case {
    std::string json;
    bool ok;
  };
  const std::string deep(100000, '[');
  const std::vector<Case> cases = {
      // protobuf's Struct parser takes minutes over 100,000 nested lists.
      {absl::StrCat(R"({"x": )", deep, std::string(100000, ']'), "}"), false},
      {absl::StrCat(R"({"x": )", deep), false},
      {absl::StrCat(R"({"graph_optimization_config": ")", deep, R"("})"), false},
      {absl::StrCat(R"({"graph": {"capture_sizes": )", std::string(40, '['), "1",
                    std::string(40, ']'), "}}"),
       false},
      // 100,000 capture sizes: a big file, read in linear time.
      {absl::StrCat(R"({"graph": {"capture_sizes": [)",
                    [] {
                      std::vector<int> sizes(100000);
                      for (int i = 0; i < 100000; ++i) sizes[i] = i + 1;
                      return absl::StrJoin(sizes, ",");
                    }(),
                    "]}}"),
       true},
  };
  for (const Case& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<config::PlannerConfig> got = ParsePlannerConfigJson(c.json, "deep.json");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << c.json.size();
    EXPECT_EQ(got.ok(), c.ok) << got.status();
    if (!got.ok()) {
      EXPECT_TRUE(absl::IsInvalidArgument(got.status()));
      EXPECT_TRUE(IsOneCleanLine(Message(got.status())));
    }
  }
  absl::StatusOr<config::PlannerConfig> too_deep =
      ParsePlannerConfigJson(absl::StrCat("{\"x\": ", deep, "}"), "deep.json");
  EXPECT_THAT(Message(too_deep.status()),
              HasSubstr("Cannot parse deep.json as a JSON object: its objects and lists nest "
                        "100001 deep, more than the 24 kiln reads"));
  // The FastDeploy string spelling says how deep its text nests.
  absl::StatusOr<config::PlannerConfig> deep_string = ParsePlannerConfigJson(
      absl::StrCat(R"({"graph_optimization_config": ")", deep, R"("})"), "deep.json");
  EXPECT_THAT(Message(deep_string.status()),
              HasSubstr("graph_optimization_config in deep.json is a string that is not a JSON "
                        "object (its objects and lists nest 100000 deep, more than the 24 kiln "
                        "reads); write it as an object"));
  // 24 deep, of lists or of objects, is still read: refused for the list of lists or the unknown
  // key, by name.
  std::string objects = "1";
  for (int i = 0; i < 23; ++i) objects = absl::StrCat("{\"o\": ", objects, "}");
  const std::string lists = absl::StrCat(std::string(23, '['), std::string(23, ']'));
  for (const auto& [value, message] : {std::pair{objects, "x: Cannot find field"},
                                       {lists, "x[0] in deep.json is a list inside a list"}}) {
    absl::StatusOr<config::PlannerConfig> at_limit =
        ParsePlannerConfigJson(absl::StrCat("{\"x\": ", value, "}"), "deep.json");
    EXPECT_THAT(Message(at_limit.status()), HasSubstr(message)) << value;
    absl::StatusOr<config::PlannerConfig> past_limit =
        ParsePlannerConfigJson(absl::StrCat("{\"x\": [", value, "]}"), "deep.json");
    EXPECT_THAT(Message(past_limit.status()), HasSubstr("nest 25 deep, more than the 24"));
  }
  // The text format has no lists of lists; a long file of many sizes reads.
  std::string text = "graph {";
  for (int i = 1; i <= 100000; ++i) absl::StrAppend(&text, " capture_sizes: ", i);
  absl::StrAppend(&text, " }");
  absl::StatusOr<config::PlannerConfig> long_text = ParsePlannerConfigText(text);
  ASSERT_TRUE(long_text.ok()) << long_text.status();
  EXPECT_EQ(long_text->graph().capture_sizes_size(), 100000);
}

TEST(ConfigLoaderRobustnessTest, PathsThatAreNotConfigFiles) {
  const fs::path dir = ScratchDir("config_paths");
  const fs::path fifo = dir / "fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path big = dir / "big.textproto";
  WriteText(big, "");
  fs::resize_file(big, uintmax_t{1} << 32);  // sparse: no disk, no memory
  const fs::path empty_json = dir / "empty.json";
  WriteText(empty_json, "");
  const fs::path binary = dir / "binary.textproto";
  std::string bytes(4096, '\0');
  std::mt19937 rng(3);
  for (char& c : bytes) c = static_cast<char>(rng());
  WriteText(binary, bytes);
  struct Case {
    std::string path;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {dir.string(), absl::StatusCode::kNotFound,
       absl::StrCat("Cannot read config file \"", dir.string(), "\": Is a directory")},
      {fifo.string(), absl::StatusCode::kNotFound, "Is a FIFO"},
      {"/dev/zero", absl::StatusCode::kNotFound, "Is a device"},
      {"/dev/urandom", absl::StatusCode::kNotFound, "Is a device"},
      {big.string(), absl::StatusCode::kInvalidArgument, "it holds 4294967296 bytes"},
      {empty_json.string(), absl::StatusCode::kInvalidArgument,
       absl::StrCat("Cannot parse ", empty_json.string(), " as a JSON object")},
      {binary.string(), absl::StatusCode::kInvalidArgument,
       absl::StrCat("Cannot parse ", binary.string(), " as a kiln.config.PlannerConfig textproto")},
  };
  for (const Case& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<config::PlannerConfig> got = LoadPlannerConfigFile(c.path);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << c.path;
    EXPECT_EQ(got.status().code(), c.code) << c.path << ": " << got.status();
    EXPECT_THAT(Message(got.status()), HasSubstr(c.message)) << c.path;
    EXPECT_TRUE(IsOneCleanLine(Message(got.status()))) << got.status();
  }
  // A byte order mark, as Windows editors write, is skipped in either format.
  WriteText(dir / "bom.json", "\xEF\xBB\xBF{\"max_num_seqs\": 7}");
  WriteText(dir / "bom.textproto", "\xEF\xBB\xBFmax_num_seqs: 9");
  absl::StatusOr<config::PlannerConfig> json = LoadPlannerConfigFile((dir / "bom.json").string());
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->max_num_seqs(), 7);
  absl::StatusOr<config::PlannerConfig> text =
      LoadPlannerConfigFile((dir / "bom.textproto").string());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->max_num_seqs(), 9);
  if (::geteuid() != 0) {  // root reads files whatever their mode
    WriteText(dir / "locked.json", "{}");
    fs::permissions(dir / "locked.json", fs::perms::none);
    absl::StatusOr<config::PlannerConfig> locked =
        LoadPlannerConfigFile((dir / "locked.json").string());
    EXPECT_TRUE(absl::IsNotFound(locked.status())) << locked.status();
    EXPECT_THAT(Message(locked.status()), HasSubstr("Permission denied"));
  }
}

// Keys and values with control bytes, quotes and bytes that are not UTF-8: each message names
// them escaped, on one line.
TEST(ConfigLoaderRobustnessTest, MessagesEscapeWhatTheFileHolds) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"graph_optimization_config\": {\"\\u001b[31mred\": 1}}", "\"\\x1b[31mred\""},
      {"max_num_seqs: 8\n\x1b[2Jmax: 1\n", "Invalid control characters"},
      {"gpu { name: \"\xff\xfe\" } max_num_sequences: 1", "max_num_sequences"},
      {"{\"gpu\": {\"name\": \"\xff\"}}", "non UTF-8"},
      {"{\"model\": {\"na\x01me\": 1}}", "Cannot"},
  };
  for (const auto& [text, message] : cases) {
    const bool json = text[0] == '{';
    absl::StatusOr<config::PlannerConfig> got =
        json ? ParsePlannerConfigJson(text, "m.cfg") : ParsePlannerConfigText(text, "m.cfg");
    ASSERT_FALSE(got.ok()) << absl::CHexEscape(text);
    EXPECT_THAT(Message(got.status()), HasSubstr(message)) << got.status();
    EXPECT_TRUE(IsOneCleanLine(Message(got.status()))) << absl::CHexEscape(Message(got.status()));
  }
  // The source's own name is escaped too.
  absl::StatusOr<config::PlannerConfig> named = ParsePlannerConfigText("x: 1", "a\nb.textproto");
  EXPECT_THAT(Message(named.status()), HasSubstr("Cannot parse a\\nb.textproto as a"));
  // What the parser quotes of the file: only what is not printable is escaped.
  absl::StatusOr<config::PlannerConfig> quoted =
      ParsePlannerConfigText("max_num_seqs: \"8\\\\\x1b[2J\"", "q.textproto");
  EXPECT_THAT(Message(quoted.status()),
              HasSubstr(R"(at line 1 column 15: Expected integer, got: "8\\\x1b[2J"; fix)"));
}

// C1 controls (U+0085 NEL ends a line on some terminals, U+009B CSI starts a terminal escape),
// the line and paragraph separators and bidirectional controls (U+202E shows what follows it
// reversed), in a path, a source name and what the parser quotes of the file: every message
// writes them as \uHHHH, and its text stays one clean line.
TEST(ConfigLoaderRobustnessTest, MessagesEscapeC1ControlsAndLineSeparators) {
  const fs::path dir = ScratchDir("c1");
  const std::vector<std::pair<std::string, std::string>> characters = {
      {"\xc2\x80", "\\u0080"}, {"\xc2\x85", "\\u0085"},     {"\xc2\x9b", "\\u009b"},
      {"\xc2\x9f", "\\u009f"}, {"\xe2\x80\xa8", "\\u2028"}, {"\xe2\x80\xa9", "\\u2029"},
      {"\xe2\x80\xae", "\\u202e"}, {"\xe2\x81\xa6", "\\u2066"}, {"\xd8\x9c", "\\u061c"},
  };
  const std::string fix = "; fix the file (fields: runtime/config/planner_config.proto)";
  for (const auto& [raw, escaped] : characters) {
    std::vector<std::pair<absl::Status, std::string>> cases;  // a refusal, what it must say
    // A path: of no file, of a textproto and of JSON that do not parse.
    cases.push_back({LoadPlannerConfigFile((dir / ("no" + raw + ".textproto")).string()).status(),
                     absl::StrCat("Cannot open config file \"", (dir / "no").string(), escaped,
                                  ".textproto\": No such file or directory; check the path")});
    const fs::path text_path = dir / ("bad" + raw + ".textproto");
    WriteText(text_path, "max_num_seqs: 8\nmodel { num_layer: 3 }\n");
    cases.push_back({LoadPlannerConfigFile(text_path.string()).status(),
                     absl::StrCat("Cannot parse ", (dir / "bad").string(), escaped,
                                  ".textproto as a kiln.config.PlannerConfig textproto at line 2 "
                                  "column 18: Message type \"kiln.config.ModelShape\" has no "
                                  "field named \"num_layer\"",
                                  fix)});
    const fs::path json_path = dir / ("bad" + raw + ".json");
    WriteText(json_path, "{\"max_num_seqs\": }");
    cases.push_back({LoadPlannerConfigFile(json_path.string()).status(),
                     absl::StrCat("Cannot parse ", (dir / "bad").string(), escaped,
                                  ".json as a JSON object: ")});
    // A source name, with a value refused after parsing, and a key refused in JSON.
    cases.push_back({ParsePlannerConfigText("max_num_seqs: 1 gpu_memory_utilization: nan",
                                            "src" + raw)
                         .status(),
                     absl::StrCat("gpu_memory_utilization in src", escaped,
                                  " is nan; give a finite number")});
    cases.push_back(
        {ParsePlannerConfigJson("{\"graph_optimization_config\": {\"k" + raw + "\": 1}}",
                                "src" + raw)
             .status(),
         absl::StrCat("Unsupported key \"k", escaped, "\" in graph_optimization_config of src",
                      escaped, "; kiln reads")});
    // What the parser quotes of the file.
    cases.push_back({ParsePlannerConfigText("max_num_seqs: \"8" + raw + "\"", "p.cfg").status(),
                     absl::StrCat("Cannot parse p.cfg as a kiln.config.PlannerConfig "
                                  "textproto at line 1 column 15: Expected integer, got: \"8",
                                  escaped, "\"", fix)});
    for (const auto& [status, message] : cases) {
      EXPECT_FALSE(status.ok()) << escaped;
      EXPECT_THAT(Message(status), HasSubstr(message)) << escaped;
      EXPECT_THAT(Message(status), Not(HasSubstr(raw))) << escaped;
      EXPECT_TRUE(IsOneCleanLine(Message(status))) << absl::CHexEscape(Message(status));
    }
  }
}
}  // namespace
}  // namespace kiln
