#include "runtime/config/config_loader.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/config/presets.h"

namespace kiln {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

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
  EXPECT_THAT(Message(text.status()), HasSubstr("Cannot parse a.textproto"));
  EXPECT_THAT(Message(text.status()), HasSubstr("line 2 column"));
  EXPECT_THAT(Message(text.status()), HasSubstr("max_num_sequences"));

  auto json = ParsePlannerConfigJson("{\"max_num_seqs\": }", "b.json");
  EXPECT_THAT(Message(json.status()), HasSubstr("Cannot parse b.json as a JSON object"));

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

}  // namespace
}  // namespace kiln
