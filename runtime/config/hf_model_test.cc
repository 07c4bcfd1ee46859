#include "runtime/config/hf_model.h"

#include <dirent.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

constexpr char kLlamaDir[] = "runtime/config/testdata/Llama-3.2-1B";

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// Llama-3.2-1B's config.json keys as raw JSON values; tests change or drop single keys.
std::map<std::string, std::string> LlamaKeys() {
  return {
      {"architectures", R"(["LlamaForCausalLM"])"},
      {"attention_bias", "false"},
      {"bos_token_id", "128000"},
      {"eos_token_id", "[128001, 128008, 128009]"},
      {"head_dim", "64"},
      {"hidden_act", R"("silu")"},
      {"hidden_size", "2048"},
      {"intermediate_size", "8192"},
      {"max_position_embeddings", "131072"},
      {"mlp_bias", "false"},
      {"model_type", R"("llama")"},
      {"num_attention_heads", "32"},
      {"num_hidden_layers", "16"},
      {"num_key_value_heads", "8"},
      {"rms_norm_eps", "1e-05"},
      {"rope_scaling", R"({"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"})"},
      {"rope_theta", "500000.0"},
      {"tie_word_embeddings", "true"},
      {"torch_dtype", R"("bfloat16")"},
      {"vocab_size", "128256"},
  };
}

std::string Json(const std::map<std::string, std::string>& keys) {
  std::vector<std::string> pairs;
  for (const auto& [key, value] : keys) pairs.push_back(absl::StrCat("\"", key, "\": ", value));
  return absl::StrCat("{", absl::StrJoin(pairs, ",\n"), "}");
}

absl::StatusOr<config::ModelShape> Parse(const std::map<std::string, std::string>& keys) {
  return ModelShapeFromHfConfigJson(Json(keys), "test/config.json", "test model");
}

// The preset's shape without its name, for comparing shapes read under another name.
std::string Unnamed(config::ModelShape shape) {
  shape.clear_name();
  return shape.DebugString();
}

// A model directory holding Llama-3.2-1B's config.json and the named (empty) files.
fs::path ModelDir(const std::string& name, const std::vector<std::string>& files) {
  const fs::path dir = ScratchDir(name);
  fs::copy_file(fs::path(kLlamaDir) / "config.json", dir / "config.json");
  for (const std::string& file : files) WriteText(dir / file, "");
  return dir;
}

TEST(HfModelTest, PublishedConfigIsThePreset) {
  const std::string json = ReadText(fs::path(kLlamaDir) / "config.json");
  ASSERT_THAT(json, HasSubstr("\"transformers_version\""));
  absl::StatusOr<config::ModelShape> shape =
      ModelShapeFromHfConfigJson(json, "config.json", "my llama");
  ASSERT_TRUE(shape.ok()) << shape.status();
  absl::StatusOr<config::ModelShape> preset = ModelPreset("llama-3.2-1b");
  ASSERT_TRUE(preset.ok()) << preset.status();
  EXPECT_EQ(Unnamed(*shape), Unnamed(*preset));
  EXPECT_EQ(shape->name(), "my llama");
  // Presence matters to a config layered over a preset: an explicit false stays set.
  EXPECT_TRUE(shape->has_attention_bias());
}

TEST(HfModelTest, LoadsShapeNamedAfterTheDirectory) {
  absl::StatusOr<config::ModelShape> shape = LoadHfModelShape(kLlamaDir);
  ASSERT_TRUE(shape.ok()) << shape.status();
  absl::StatusOr<config::ModelShape> preset = ModelPreset("llama-3.2-1b");
  ASSERT_TRUE(preset.ok()) << preset.status();
  EXPECT_EQ(shape->DebugString(), preset->DebugString());  // the name too: "Llama-3.2-1B"
  shape = LoadHfModelShape(absl::StrCat(kLlamaDir, "/"));
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->name(), "Llama-3.2-1B");
}

TEST(HfModelTest, NullRopeScalingIsNoScaling) {
  auto keys = LlamaKeys();
  keys["rope_scaling"] = "null";
  absl::StatusOr<config::ModelShape> shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_FALSE(shape->has_rope_scaling());
  keys.erase("rope_scaling");
  shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_FALSE(shape->has_rope_scaling());
}

TEST(HfModelTest, HeadDimAbsentOrNullIsHiddenOverHeads) {
  auto keys = LlamaKeys();
  keys["hidden_size"] = "4096";
  keys.erase("head_dim");
  absl::StatusOr<config::ModelShape> shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->head_dim(), 128);
  keys["head_dim"] = "null";
  shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->head_dim(), 128);
}

// hidden_size / num_attention_heads rounds down to 0 when there are more heads than columns: a
// shape with head_dim 0 is refused here, naming the keys it came from.
TEST(HfModelTest, HeadDimDerivedAsZeroIsRefused) {
  auto keys = LlamaKeys();
  keys.erase("head_dim");
  keys["hidden_size"] = "16";
  absl::Status status = Parse(keys).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(Message(status), HasSubstr("hidden_size 16 / num_attention_heads 32 is 0"));
}

TEST(HfModelTest, AbsentOptionalKeysTakeLlamaConfigDefaults) {
  auto keys = LlamaKeys();
  for (const char* key :
       {"num_key_value_heads", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
        "attention_bias", "mlp_bias", "hidden_act", "architectures", "rope_scaling"}) {
    keys.erase(key);
  }
  absl::StatusOr<config::ModelShape> shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->num_kv_heads(), 32);  // no GQA
  EXPECT_EQ(shape->rope_theta(), 10000.0);
  EXPECT_EQ(shape->rms_norm_eps(), 1e-6);
  EXPECT_TRUE(shape->has_tie_embeddings());
  EXPECT_FALSE(shape->tie_embeddings());
  EXPECT_TRUE(shape->has_attention_bias());
  EXPECT_FALSE(shape->attention_bias());
}

TEST(HfModelTest, ReadsEitherDtypeKey) {
  auto keys = LlamaKeys();
  keys.erase("torch_dtype");
  keys["dtype"] = R"("float16")";
  absl::StatusOr<config::ModelShape> shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->dtype(), config::DTYPE_FP16);
  keys["torch_dtype"] = R"("float16")";  // both, agreeing, as some files have them
  shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->dtype(), config::DTYPE_FP16);
  keys.erase("dtype");
  keys["torch_dtype"] = R"("float32")";
  shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->dtype(), config::DTYPE_FP32);
}

TEST(HfModelTest, RopeScalingTypeKeyAndRopeParameters) {
  auto keys = LlamaKeys();
  keys["rope_scaling"] = R"({"type": "linear", "factor": 2})";
  absl::StatusOr<config::ModelShape> shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->rope_scaling().rope_type(), "linear");
  EXPECT_EQ(shape->rope_scaling().factor(), 2.0);
  EXPECT_FALSE(shape->rope_scaling().has_low_freq_factor());

  // transformers 5 writes rope_theta and the scaling as one "rope_parameters" object (an integer
  // written as 8192.0 reads as 8192).
  keys.erase("rope_scaling");
  keys.erase("rope_theta");
  keys["rope_parameters"] = R"({"rope_theta": 500000.0, "rope_type": "llama3", "factor": 32.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192.0})";
  shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  absl::StatusOr<config::ModelShape> preset = ModelPreset("llama-3.2-1b");
  ASSERT_TRUE(preset.ok()) << preset.status();
  EXPECT_EQ(Unnamed(*shape), Unnamed(*preset));
  keys["rope_parameters"] = R"({"rope_theta": 1000000.0, "rope_type": "default"})";
  shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->rope_theta(), 1000000.0);
  EXPECT_FALSE(shape->has_rope_scaling());
}

TEST(HfModelTest, NameFallsBackToArchitecture) {
  absl::StatusOr<config::ModelShape> shape =
      ModelShapeFromHfConfigJson(Json(LlamaKeys()), "config.json");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->name(), "LlamaForCausalLM");
  auto keys = LlamaKeys();
  keys.erase("architectures");
  shape = ModelShapeFromHfConfigJson(Json(keys), "config.json");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->name(), "llama");
}

TEST(HfModelTest, RefusesOtherModelTypes) {
  auto keys = LlamaKeys();
  keys["model_type"] = R"("gemma2")";
  EXPECT_EQ(Message(Parse(keys).status()),
            "\"test/config.json\": model_type \"gemma2\" is not a Llama-family decoder kiln runs; "
            "kiln's model runs model_type \"llama\", \"mistral\", \"qwen2\" and \"qwen3\"");
  EXPECT_TRUE(absl::IsInvalidArgument(Parse(keys).status()));
  keys.erase("model_type");
  EXPECT_THAT(Message(Parse(keys).status()),
              HasSubstr("\"test/config.json\" has no \"model_type\""));
}

// Mistral-7B-v0.3's config.json keys (mistralai/Mistral-7B-v0.3) as raw JSON values.
std::map<std::string, std::string> MistralKeys() {
  return {
      {"architectures", R"(["MistralForCausalLM"])"},
      {"attention_dropout", "0.0"},
      {"bos_token_id", "1"},
      {"eos_token_id", "2"},
      {"hidden_act", R"("silu")"},
      {"hidden_size", "4096"},
      {"initializer_range", "0.02"},
      {"intermediate_size", "14336"},
      {"max_position_embeddings", "32768"},
      {"model_type", R"("mistral")"},
      {"num_attention_heads", "32"},
      {"num_hidden_layers", "32"},
      {"num_key_value_heads", "8"},
      {"rms_norm_eps", "1e-05"},
      {"rope_theta", "1000000.0"},
      {"sliding_window", "null"},
      {"tie_word_embeddings", "false"},
      {"torch_dtype", R"("bfloat16")"},
      {"use_cache", "true"},
      {"vocab_size", "32768"},
  };
}

TEST(HfModelTest, ReadsMistral) {
  auto shape = ModelShapeFromHfConfigJson(Json(MistralKeys()), "config.json");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->name(), "MistralForCausalLM");
  EXPECT_EQ(shape->hidden_size(), 4096);
  EXPECT_EQ(shape->num_heads(), 32);
  EXPECT_EQ(shape->num_kv_heads(), 8);
  EXPECT_EQ(shape->head_dim(), 128);  // hidden_size / num_attention_heads
  EXPECT_EQ(shape->vocab_size(), 32768);
  EXPECT_EQ(shape->rope_theta(), 1e6);
  EXPECT_EQ(shape->rms_norm_eps(), 1e-5);
  EXPECT_FALSE(shape->tie_embeddings());
  EXPECT_FALSE(shape->attention_bias());
  EXPECT_FALSE(shape->has_rope_scaling());
  EXPECT_FALSE(shape->has_sliding_window());  // null: attention over every token
}

// MistralConfig's defaults differ from LlamaConfig's: 8 KV heads, a window of 4096 tokens.
TEST(HfModelTest, MistralSlidingWindowAndDefaults) {
  auto keys = MistralKeys();
  keys["sliding_window"] = "4096";  // Mistral-7B-v0.1
  auto shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->sliding_window(), 4096);
  keys.erase("sliding_window");
  keys.erase("num_key_value_heads");
  shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->sliding_window(), 4096);
  EXPECT_EQ(shape->num_kv_heads(), 8);
  keys["sliding_window"] = "0";
  EXPECT_THAT(Message(Parse(keys).status()),
              HasSubstr("\"test/config.json\": sliding_window is 0; it must be positive"));
  // A Llama's config.json has no sliding window; transformers ignores the key there.
  auto llama = LlamaKeys();
  llama["sliding_window"] = "4096";
  shape = Parse(llama);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_FALSE(shape->has_sliding_window());
  llama.erase("num_key_value_heads");
  EXPECT_EQ(Parse(llama)->num_kv_heads(), 32);  // LlamaConfig: num_attention_heads
}

// Qwen2.5-3B's config.json keys (Qwen/Qwen2.5-3B) as raw JSON values.
std::map<std::string, std::string> Qwen2Keys() {
  return {
      {"architectures", R"(["Qwen2ForCausalLM"])"},
      {"attention_dropout", "0.0"},
      {"bos_token_id", "151643"},
      {"eos_token_id", "151643"},
      {"hidden_act", R"("silu")"},
      {"hidden_size", "2048"},
      {"intermediate_size", "11008"},
      {"max_position_embeddings", "32768"},
      {"max_window_layers", "36"},
      {"model_type", R"("qwen2")"},
      {"num_attention_heads", "16"},
      {"num_hidden_layers", "36"},
      {"num_key_value_heads", "2"},
      {"rms_norm_eps", "1e-06"},
      {"rope_theta", "1000000.0"},
      {"sliding_window", "32768"},
      {"tie_word_embeddings", "true"},
      {"torch_dtype", R"("bfloat16")"},
      {"use_sliding_window", "false"},
      {"vocab_size", "151936"},
  };
}

// Qwen2's q, k and v projections have a bias though its config.json has no attention_bias; its
// sliding_window applies only with use_sliding_window.
TEST(HfModelTest, ReadsQwen2) {
  auto shape = ModelShapeFromHfConfigJson(Json(Qwen2Keys()), "config.json");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->name(), "Qwen2ForCausalLM");
  EXPECT_TRUE(shape->attention_bias());
  EXPECT_EQ(shape->num_heads(), 16);
  EXPECT_EQ(shape->num_kv_heads(), 2);
  EXPECT_EQ(shape->head_dim(), 128);
  EXPECT_EQ(shape->intermediate_size(), 11008);
  EXPECT_EQ(shape->vocab_size(), 151936);
  EXPECT_EQ(shape->rope_theta(), 1e6);
  EXPECT_EQ(shape->rms_norm_eps(), 1e-6);
  EXPECT_TRUE(shape->tie_embeddings());
  EXPECT_FALSE(shape->has_sliding_window());
  auto keys = Qwen2Keys();
  keys["use_sliding_window"] = "true";
  shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->sliding_window(), 32768);
}

// Qwen3-4B's config.json keys (Qwen/Qwen3-4B) as raw JSON values: its query heads are 4096
// wide against a hidden size of 2560.
std::map<std::string, std::string> Qwen3Keys() {
  return {
      {"architectures", R"(["Qwen3ForCausalLM"])"},
      {"attention_bias", "false"},
      {"attention_dropout", "0.0"},
      {"bos_token_id", "151643"},
      {"eos_token_id", "151645"},
      {"head_dim", "128"},
      {"hidden_act", R"("silu")"},
      {"hidden_size", "2560"},
      {"intermediate_size", "9728"},
      {"max_position_embeddings", "40960"},
      {"max_window_layers", "36"},
      {"model_type", R"("qwen3")"},
      {"num_attention_heads", "32"},
      {"num_hidden_layers", "36"},
      {"num_key_value_heads", "8"},
      {"rms_norm_eps", "1e-06"},
      {"rope_scaling", "null"},
      {"rope_theta", "1000000"},
      {"sliding_window", "null"},
      {"tie_word_embeddings", "true"},
      {"torch_dtype", R"("bfloat16")"},
      {"use_sliding_window", "false"},
      {"vocab_size", "151936"},
  };
}

// Qwen3 norms each query and key head; its head_dim is its own (128 where the file leaves it
// out, as Qwen3Config's default), not hidden_size / num_attention_heads.
TEST(HfModelTest, ReadsQwen3) {
  auto shape = ModelShapeFromHfConfigJson(Json(Qwen3Keys()), "config.json");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->name(), "Qwen3ForCausalLM");
  EXPECT_TRUE(shape->qk_norm());
  EXPECT_FALSE(shape->attention_bias());
  EXPECT_EQ(shape->hidden_size(), 2560);
  EXPECT_EQ(shape->num_heads(), 32);
  EXPECT_EQ(shape->num_kv_heads(), 8);
  EXPECT_EQ(shape->head_dim(), 128);
  EXPECT_EQ(shape->intermediate_size(), 9728);
  EXPECT_EQ(shape->rope_theta(), 1e6);
  EXPECT_EQ(shape->rms_norm_eps(), 1e-6);
  EXPECT_TRUE(shape->tie_embeddings());
  EXPECT_FALSE(shape->has_sliding_window());
  EXPECT_FALSE(shape->has_rope_scaling());
  auto keys = Qwen3Keys();
  keys.erase("head_dim");
  shape = Parse(keys);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->head_dim(), 128);  // not 2560 / 32
  // A Llama config never gets the QK norm.
  EXPECT_FALSE(Parse(LlamaKeys())->qk_norm());
}

TEST(HfModelTest, RefusesOtherActivationsAndMlpBias) {
  auto keys = LlamaKeys();
  keys["hidden_act"] = R"("gelu")";
  EXPECT_THAT(Message(Parse(keys).status()),
              HasSubstr("\"test/config.json\": hidden_act \"gelu\" is not supported"));
  keys = LlamaKeys();
  keys["mlp_bias"] = "true";
  EXPECT_THAT(Message(Parse(keys).status()), HasSubstr("\"test/config.json\": mlp_bias is true"));
}

TEST(HfModelTest, NamesEachMissingRequiredKey) {
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "vocab_size"}) {
    auto keys = LlamaKeys();
    keys.erase(key);
    absl::Status status = Parse(keys).status();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << key << ": " << status;
    EXPECT_THAT(Message(status),
                HasSubstr(absl::StrCat("\"test/config.json\" has no \"", key, "\"")));
  }
  auto keys = LlamaKeys();
  keys.erase("torch_dtype");
  EXPECT_THAT(Message(Parse(keys).status()),
              HasSubstr("\"test/config.json\" has no \"torch_dtype\" (or \"dtype\")"));
}

TEST(HfModelTest, RefusesNonPositiveSizes) {
  for (const char* key :
       {"num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim"}) {
    auto keys = LlamaKeys();
    keys[key] = "0";
    EXPECT_THAT(
        Message(Parse(keys).status()),
        HasSubstr(absl::StrCat("\"test/config.json\": ", key, " is 0; it must be positive")));
  }
}

TEST(HfModelTest, RefusesUnknownOrConflictingDtype) {
  auto keys = LlamaKeys();
  keys["torch_dtype"] = R"("int8")";
  EXPECT_THAT(Message(Parse(keys).status()),
              HasSubstr("\"test/config.json\": torch_dtype \"int8\" is not a type kiln reads"));
  keys["torch_dtype"] = R"("bfloat16")";
  keys["dtype"] = R"("float16")";
  EXPECT_THAT(Message(Parse(keys).status()),
              HasSubstr("\"dtype\" is \"float16\" but \"torch_dtype\" is \"bfloat16\"; keep one"));
}

TEST(HfModelTest, RefusesBadJson) {
  absl::Status status = ModelShapeFromHfConfigJson("{\"hidden_size\": 2048,,}", "c.json").status();
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_THAT(Message(status), HasSubstr("Cannot read \"c.json\" as a Hugging Face config.json"));
  auto keys = LlamaKeys();
  keys["hidden_size"] = R"("wide")";
  EXPECT_THAT(Message(Parse(keys).status()),
              HasSubstr("Cannot read \"test/config.json\" as a Hugging Face config.json"));
}

// A key kiln ignores, nested 100,000 deep, is refused before any parse (protobuf's parser would
// take minutes, and Mistral's sliding-window lookup parses the file twice).
TEST(HfModelTest, RefusesJsonNestedPastTheLimit) {
  auto keys = LlamaKeys();
  keys["model_type"] = R"("mistral")";
  keys["ignored"] = std::string(100000, '[') + std::string(100000, ']');
  const auto start = std::chrono::steady_clock::now();
  const absl::Status status = Parse(keys).status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(Message(status), HasSubstr("nest 100001 deep, more than the 24 kiln reads"));
}

// JSON strings are double-quoted: a ' inside one is a character of it; one outside is refused
// before any parse (protobuf's parser would read 'a"' as a string, and the nesting behind it would
// go uncounted).
TEST(HfModelTest, SingleQuotesAreCharactersInStringsAndRefusedOutside) {
  auto keys = LlamaKeys();
  keys["model_type"] = R"("mistral")";
  keys["ignored"] = R"("it's [[[")";
  absl::StatusOr<config::ModelShape> inside = Parse(keys);
  ASSERT_TRUE(inside.ok()) << inside.status();
  keys["ignored"] = absl::StrCat(R"({'a"': )", std::string(100000, '['), std::string(100000, ']'),
                                 R"(, 'b"': 1})");
  const auto start = std::chrono::steady_clock::now();
  const absl::Status outside = Parse(keys).status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsInvalidArgument(outside)) << outside;
  // The key's line: one a key, in name order.
  EXPECT_THAT(
      Message(outside),
      HasSubstr("Cannot read \"test/config.json\" as a Hugging Face config.json: line 8 column "
                "13 holds a ' outside a string: JSON strings take double quotes only; fix "
                "the file or download it again"));
}

// ---- Robustness: every truncation and single-byte mutation of a config.json reads as a shape
// or fails with InvalidArgument naming the file; never a crash, a hang or a read out of bounds
// (run these under ASan and UBSan).

// Parses `json` as "test/config.json" and checks the parser's promise: a shape it returns has
// every size positive and a dtype kiln reads; text it refuses is InvalidArgument, with a
// message that names the file and holds only printable ASCII (the keys and values it quotes
// come from ASCII text, and any other byte must not reach it raw). `what` describes the input
// for failure messages. Returns whether the text read as a shape.
bool ReadsAsShapeOrFailsCleanly(const std::string& json, const std::string& what) {
  absl::StatusOr<config::ModelShape> shape =
      ModelShapeFromHfConfigJson(json, "test/config.json", "test model");
  if (!shape.ok()) {
    const std::string message = Message(shape.status());
    EXPECT_TRUE(absl::IsInvalidArgument(shape.status())) << what << ": " << shape.status();
    EXPECT_THAT(message, HasSubstr("\"test/config.json\"")) << what;
    EXPECT_TRUE(std::all_of(message.begin(), message.end(),
                            [](char c) { return c >= 0x20 && c < 0x7f; }))
        << what << ": " << absl::CHexEscape(message);
    return false;
  }
  EXPECT_EQ(shape->name(), "test model") << what;
  for (const auto& [key, value] :
       {std::pair{"hidden_size", shape->hidden_size()}, {"num_layers", shape->num_layers()},
        {"num_heads", shape->num_heads()}, {"num_kv_heads", shape->num_kv_heads()},
        {"head_dim", shape->head_dim()}, {"intermediate_size", shape->intermediate_size()},
        {"vocab_size", shape->vocab_size()}}) {
    EXPECT_GT(value, 0) << what << ": " << key;
  }
  EXPECT_TRUE(shape->dtype() == config::DTYPE_BF16 || shape->dtype() == config::DTYPE_FP16 ||
              shape->dtype() == config::DTYPE_FP32)
      << what << ": dtype " << shape->dtype();
  EXPECT_TRUE(shape->has_rope_theta() && shape->has_rms_norm_eps()) << what;
  return true;
}

// Truncates `json` to every length and mutates each of its bytes to each of a few values.
// Returns the number of inputs tried and how many read as a shape.
std::pair<int, int> SweepTruncationsAndMutations(const std::string& json,
                                                 const std::string& name) {
  int tried = 0;
  int read = 0;
  // Every cut that loses the closing brace is refused; only trailing whitespace may go.
  const size_t end = json.rfind('}') + 1;
  for (size_t length = 0; length <= json.size(); ++length) {
    ++tried;
    const bool ok = ReadsAsShapeOrFailsCleanly(
        json.substr(0, length), absl::StrCat(name, " cut to ", length, " of ", json.size()));
    EXPECT_EQ(ok, length >= end) << name << " cut to " << length << " of " << json.size();
    read += ok;
  }
  // JSON's structural characters, digits, a sign, spaces, an escape, letters that start
  // literals, and bytes that JSON text never holds.
  const char kValues[] = {'\x00', '\xff', '{', '}', '[', ']', '"', ',', ':', '9', '0',
                          '-',    ' ',    '\\', '.', 'e', 'n', 't', '\x80', '\n'};
  for (size_t at = 0; at < json.size(); ++at) {
    for (const char value : kValues) {
      if (json[at] == value) continue;
      std::string mutated = json;
      mutated[at] = value;
      ++tried;
      read += ReadsAsShapeOrFailsCleanly(
          mutated, absl::StrCat(name, " byte ", at, " '", absl::CHexEscape(json.substr(at, 1)),
                                "' -> '", absl::CHexEscape(std::string(1, value)), "'"));
    }
  }
  return {tried, read};
}

TEST(HfModelTest, TruncatedOrMutatedConfigReadsOrFailsCleanly) {
  // The published Llama file, and a Mistral one, whose null sliding_window is read a second
  // time, as a Struct.
  const std::string llama = ReadText(fs::path(kLlamaDir) / "config.json");
  const std::string mistral = Json(MistralKeys());
  ASSERT_TRUE(ReadsAsShapeOrFailsCleanly(llama, "llama config.json"));
  ASSERT_TRUE(ReadsAsShapeOrFailsCleanly(mistral, "mistral config.json"));
  for (const auto& [name, json] : {std::pair{"llama", &llama}, {"mistral", &mistral}}) {
    const auto [tried, read] = SweepTruncationsAndMutations(*json, name);
    // Most mutations break the JSON or a value; some (in ignored keys, digits of sizes) do not.
    EXPECT_GT(read, 0) << name;
    EXPECT_LT(read, tried / 2) << name;
    std::printf("%s config.json, %zu bytes: %d truncations and mutations, %d read as a shape\n",
                name, json->size(), tried, read);
  }
}

TEST(HfModelTest, DirWithOneFile) {
  const fs::path dir = ModelDir("one_file", {"model.safetensors", "README.md"});
  absl::StatusOr<HfModel> model = LoadHfModelDir(dir.string());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT(model->weight_files, ElementsAre((dir / "model.safetensors").string()));
  EXPECT_EQ(model->model.name(), "one_file");
  EXPECT_EQ(model->model.hidden_size(), 2048);
}

TEST(HfModelTest, ShardedDirReadsTheIndex) {
  const fs::path dir =
      ModelDir("sharded", {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "unrelated.safetensors"});
  WriteText(dir / "model.safetensors.index.json", R"({
      "metadata": {"total_size": 2471645184},
      "weight_map": {
        "lm_head.weight": "model-00002-of-00002.safetensors",
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.layers.0.mlp.down_proj.weight": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00002-of-00002.safetensors"
      }})");
  absl::StatusOr<HfModel> model = LoadHfModelDir(dir.string());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT(model->weight_files,
              ElementsAre((dir / "model-00001-of-00002.safetensors").string(),
                          (dir / "model-00002-of-00002.safetensors").string()));
}

TEST(HfModelTest, IndexNamingAMissingShardIsNotFound) {
  const fs::path dir = ModelDir("missing_shard", {"model-00001-of-00002.safetensors"});
  WriteText(dir / "model.safetensors.index.json",
            R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                               "b": "model-00002-of-00002.safetensors"}})");
  absl::Status status = LoadHfModelDir(dir.string()).status();
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(Message(status),
              HasSubstr(absl::StrCat("Weight file \"",
                                     (dir / "model-00002-of-00002.safetensors").string(), "\"")));
  WriteText(dir / "model.safetensors.index.json", R"({"metadata": {}})");
  status = LoadHfModelDir(dir.string()).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(Message(status), HasSubstr("names no weight files"));
}

TEST(HfModelTest, OtherSafetensorsFilesAreSorted) {
  const fs::path dir = ModelDir("globbed", {"b.safetensors", "a.safetensors", "c.bin"});
  absl::StatusOr<HfModel> model = LoadHfModelDir(dir.string());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT(model->weight_files,
              ElementsAre((dir / "a.safetensors").string(), (dir / "b.safetensors").string()));
}

TEST(HfModelTest, DirWithoutSafetensorsIsNotFound) {
  const fs::path dir = ModelDir("no_weights", {"pytorch_model.bin"});
  absl::Status status = LoadHfModelDir(dir.string()).status();
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(Message(status),
              HasSubstr("holds no weights: no model.safetensors.index.json, no model.safetensors "
                        "and no other *.safetensors file"));
  // The shape alone needs no weights.
  EXPECT_TRUE(LoadHfModelShape(dir.string()).ok());
}

TEST(HfModelTest, MissingConfigOrDirIsNotFound) {
  const fs::path dir = ScratchDir("no_config");
  WriteText(dir / "model.safetensors", "");
  absl::Status status = LoadHfModelDir(dir.string()).status();
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(Message(status), HasSubstr((dir / "config.json").string()));

  const std::string missing = (dir / "no_such_model").string();
  status = LoadHfModelDir(missing).status();
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(Message(status), HasSubstr(absl::StrCat("Model directory \"", missing, "\"")));
}

TEST(HfModelTest, CacheSnapshotIsNamedAfterTheRepository) {
  const fs::path root = ScratchDir("hub");
  const fs::path dir = root / "models--meta-llama--Llama-3.2-1B" / "snapshots" / "4e20de3";
  fs::create_directories(dir);
  fs::copy_file(fs::path(kLlamaDir) / "config.json", dir / "config.json");
  absl::StatusOr<config::ModelShape> shape = LoadHfModelShape(dir.string());
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->name(), "Llama-3.2-1B");
}

// float16 and float32 models run in bf16 (their weights rounded as they load); other dtypes stay.
TEST(HfModelTest, RunInBf16TakesFloat16AndFloat32) {
  for (config::DType stored : {config::DTYPE_FP16, config::DTYPE_FP32}) {
    config::ModelShape model;
    model.set_dtype(stored);
    EXPECT_EQ(RunInBf16(&model), std::optional<config::DType>(stored));
    EXPECT_EQ(model.dtype(), config::DTYPE_BF16);
  }
  for (config::DType other : {config::DTYPE_BF16, config::DTYPE_FP8_E4M3}) {
    config::ModelShape model;
    model.set_dtype(other);
    EXPECT_EQ(RunInBf16(&model), std::nullopt);
    EXPECT_EQ(model.dtype(), other);
  }
}


// ---- Robustness of the model directory: its model.safetensors.index.json truncated, mutated or
// naming files it should not, and indexes that are not files. Run these under ASan and UBSan.

// The index of a three-shard checkpoint, as transformers writes one.
std::string ThreeShardIndex() {
  return R"({
  "metadata": {"total_size": 6425499648},
  "weight_map": {
    "lm_head.weight": "model-00003-of-00003.safetensors",
    "model.embed_tokens.weight": "model-00001-of-00003.safetensors",
    "model.layers.0.mlp.down_proj.weight": "model-00001-of-00003.safetensors",
    "model.layers.1.mlp.down_proj.weight": "model-00002-of-00003.safetensors",
    "model.norm.weight": "model-00003-of-00003.safetensors"
  }
})";
}

// Loads `dir` with `index` as its index and checks the promise: the files it returns are
// distinct, sorted, each an existing file directly in `dir` (the only files there are shards);
// a refusal is InvalidArgument or NotFound, on one clean line, naming the index or the file.
// Returns whether it loaded.
bool LoadsOrFailsCleanly(const fs::path& dir, const std::string& index, const std::string& what) {
  WriteText(dir / "model.safetensors.index.json", index);
  absl::StatusOr<HfModel> model = LoadHfModelDir(dir.string());
  if (!model.ok()) {
    const std::string message = Message(model.status());
    EXPECT_TRUE(absl::IsInvalidArgument(model.status()) || absl::IsNotFound(model.status()))
        << what << ": " << model.status();
    EXPECT_THAT(message, HasSubstr(dir.string())) << what;
    EXPECT_TRUE(IsOneCleanLine(message)) << what << ": " << absl::CHexEscape(message);
    return false;
  }
  EXPECT_FALSE(model->weight_files.empty()) << what;
  EXPECT_TRUE(std::is_sorted(model->weight_files.begin(), model->weight_files.end())) << what;
  EXPECT_EQ(std::adjacent_find(model->weight_files.begin(), model->weight_files.end()),
            model->weight_files.end())
      << what;
  for (const std::string& file : model->weight_files) {
    EXPECT_EQ(fs::path(file).parent_path(), dir) << what << ": " << file;
    EXPECT_TRUE(fs::is_regular_file(file)) << what << ": " << file;
  }
  return true;
}

TEST(HfModelDirRobustnessTest, TruncatedOrMutatedIndexLoadsOrFailsCleanly) {
  const fs::path dir = ModelDir(
      "mutated_index", {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                        "model-00003-of-00003.safetensors"});
  const std::string index = ThreeShardIndex();
  ASSERT_TRUE(LoadsOrFailsCleanly(dir, index, "the index"));
  int tried = 0, loaded = 0;
  const size_t end = index.rfind('}') + 1;
  for (size_t length = 0; length <= index.size(); ++length) {
    ++tried;
    const bool ok = LoadsOrFailsCleanly(dir, index.substr(0, length),
                                        absl::StrCat("cut to ", length, " of ", index.size()));
    EXPECT_EQ(ok, length >= end) << "cut to " << length;
    loaded += ok;
  }
  // Structure, quotes, escapes, path separators and dots (to "..", absolute paths), digits,
  // and bytes JSON text never holds.
  const char kValues[] = {'\x00', '\xff', '{',  '}', '[', ']', '"',    ',', ':',
                          '/',    '.',    '\\', '0', 'n', ' ', '\x80', '\n'};
  for (size_t at = 0; at < index.size(); ++at) {
    for (const char value : kValues) {
      if (index[at] == value) continue;
      std::string mutated = index;
      mutated[at] = value;
      ++tried;
      loaded +=
          LoadsOrFailsCleanly(dir, mutated,
                              absl::StrCat("byte ", at, " '", absl::CHexEscape(index.substr(at, 1)),
                                           "' -> '", absl::CHexEscape(std::string(1, value)), "'"));
    }
  }
  EXPECT_GT(loaded, 0);
  EXPECT_LT(loaded, tried / 2);
  std::printf("index of %zu bytes: %d truncations and mutations, %d loaded\n", index.size(), tried,
              loaded);
}

// Random indexes over a pool of names, good and bad, checked against what each should give: the
// first bad name (in tensor order) refused by name, else the first missing file, else the
// distinct files sorted.
TEST(HfModelDirRobustnessTest, RandomIndexesGiveTheirFilesOrNameTheFirstBadEntry) {
  const fs::path dir = ModelDir("random_index", {"a.safetensors", "b.safetensors"});
  fs::create_directories(dir / "sub");
  WriteText(dir / "sub" / "c.safetensors", "");
  fs::create_directories(dir / "folder.safetensors");  // a directory, not a file
  WriteText(dir.parent_path() / "outside.safetensors", "");
  struct Name {
    std::string json;     // as the index writes it
    std::string file;     // the file it names, relative to dir; empty for a bad name
    std::string refusal;  // for a bad name: what the message says
    bool exists;
  };
  const std::string outside = (dir.parent_path() / "outside.safetensors").string();
  const std::vector<Name> names = {
      {"\"a.safetensors\"", "a.safetensors", "", true},
      {"\"./a.safetensors\"", "a.safetensors", "", true},
      {"\"b.safetensors\"", "b.safetensors", "", true},
      {"\"sub/c.safetensors\"", "sub/c.safetensors", "", true},
      {"\"sub//c.safetensors\"", "sub/c.safetensors", "", true},
      {"\"missing.safetensors\"", "missing.safetensors", "", false},
      {"\"folder.safetensors\"", "folder.safetensors", "", false},
      {"\"\"", "", "an empty file name", false},
      {"null", "", "an empty file name", false},
      {"\"../outside.safetensors\"", "", "a path with \"..\"", false},
      {"\"sub/../../outside.safetensors\"", "", "a path with \"..\"", false},
      {"\"sub/../a.safetensors\"", "", "a path with \"..\"", false},
      {absl::StrCat("\"", outside, "\""), "", "an absolute path", false},
      {"\"/etc/passwd\"", "", "an absolute path", false},
      {"\"a.safetensors\\u0000.txt\"", "", "a NUL byte", false},
  };
  std::mt19937 rng(77);
  int loaded = 0, refused_name = 0, missing = 0;
  for (int round = 0; round < 400; ++round) {
    const int entries = 1 + static_cast<int>(rng() % 6);
    std::map<std::string, const Name*> map;
    for (int e = 0; e < entries; ++e) {
      // Tensors named so that map order is the order drawn.
      map[absl::StrCat("model.t", e)] = &names[rng() % names.size()];
    }
    std::vector<std::string> pairs;
    for (const auto& [tensor, name] : map)
      pairs.push_back(absl::StrCat("\"", tensor, "\": ", name->json));
    std::shuffle(pairs.begin(), pairs.end(), rng);
    const std::string index = absl::StrCat(R"({"metadata": {"total_size": 1}, "weight_map": {)",
                                           absl::StrJoin(pairs, ", "), "}}");
    WriteText(dir / "model.safetensors.index.json", index);
    absl::StatusOr<HfModel> model = LoadHfModelDir(dir.string());

    const Name* first_bad = nullptr;
    std::string first_bad_tensor;
    std::set<std::string> files;
    for (const auto& [tensor, name] : map) {
      if (name->file.empty()) {
        first_bad = name;
        first_bad_tensor = tensor;
        break;
      }
      files.insert((dir / name->file).string());
    }
    if (first_bad != nullptr) {
      ASSERT_TRUE(absl::IsInvalidArgument(model.status())) << index << ": " << model.status();
      ASSERT_THAT(Message(model.status()),
                  HasSubstr(absl::StrCat("maps tensor \"", first_bad_tensor, "\" to ")))
          << index;
      ASSERT_THAT(Message(model.status()), HasSubstr(first_bad->refusal)) << index;
      ASSERT_TRUE(IsOneCleanLine(Message(model.status()))) << model.status();
      ++refused_name;
      continue;
    }
    const auto absent = std::find_if(files.begin(), files.end(),
                                     [](const std::string& f) { return !fs::is_regular_file(f); });
    if (absent != files.end()) {
      ASSERT_TRUE(absl::IsNotFound(model.status())) << index << ": " << model.status();
      ASSERT_THAT(Message(model.status()), HasSubstr(absl::StrCat("Weight file \"", *absent, "\"")))
          << index;
      ++missing;
      continue;
    }
    ASSERT_TRUE(model.ok()) << index << ": " << model.status();
    ASSERT_EQ(model->weight_files, std::vector<std::string>(files.begin(), files.end())) << index;
    ++loaded;
  }
  std::printf("400 random indexes: %d loaded, %d refused for a bad name, %d for a missing file\n",
              loaded, refused_name, missing);
  EXPECT_GT(loaded, 20);
  EXPECT_GT(refused_name, 100);
  EXPECT_GT(missing, 20);
}

TEST(HfModelDirRobustnessTest, IndexOfTheWrongShapeIsInvalidArgument) {
  const fs::path dir = ModelDir("bad_index", {"a.safetensors"});
  struct Case {
    std::string index;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"({"weight_map": {"x": "a.safetensors", "x": "a.safetensors"}})", "Repeated map key"},
      {R"({"weight_map": {"x": 1}})", "invalid value 1 for type TYPE_STRING"},
      {R"({"weight_map": {"x": true}})", "invalid value true"},
      {R"({"weight_map": {"x": ["a.safetensors"]}})", "Cannot read"},
      {R"({"weight_map": {"x": {"file": "a.safetensors"}}})", "Cannot read"},
      {R"({"weight_map": ["a.safetensors"]})", "Cannot bind a list to map"},
      {R"({"weight_map": "a.safetensors"})", "Cannot read"},
      {R"({"weight_map": null})", "names no weight files"},
      {R"({"weight_map": {}})", "names no weight files"},
      {R"({})", "names no weight files"},
      {R"([])", "Cannot read"},
      {R"("a.safetensors")", "Cannot read"},
      {"", "Cannot read"},
      {"\xef\xbb\xbf{}", "Cannot read"},
      {R"({"weight_map": {"x": "\ud800"}})", "surrogate"},
      {"{\"weight_map\": {\"x\": \"\xff.safetensors\"}}", "non UTF-8"},
      {absl::StrCat(R"({"metadata": )", std::string(200, '{'), std::string(200, '}'), "}"),
       "Cannot read"},
  };
  for (const Case& c : cases) {
    WriteText(dir / "model.safetensors.index.json", c.index);
    absl::Status status = LoadHfModelDir(dir.string()).status();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << c.index << ": " << status;
    EXPECT_THAT(Message(status), HasSubstr(c.message)) << c.index;
    EXPECT_THAT(Message(status), HasSubstr("model.safetensors.index.json")) << c.index;
    EXPECT_TRUE(IsOneCleanLine(Message(status))) << absl::CHexEscape(Message(status));
  }
  // Arrays nested deep, even in keys kiln skips, are refused at once (an index nests 2 deep).
  WriteText(dir / "model.safetensors.index.json",
            absl::StrCat(R"({"metadata": )", std::string(1000000, '['), std::string(1000000, ']'),
                         R"(, "weight_map": {"x": "a.safetensors"}})"));
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<HfModel> deep = LoadHfModelDir(dir.string());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_TRUE(absl::IsInvalidArgument(deep.status())) << deep.status();
  EXPECT_THAT(Message(deep.status()), HasSubstr("nest 1000001 deep, more than the 24 kiln reads"));
}

// A big index (DeepSeek-V3's maps about 90,000 tensors to 163 shards) reads quickly.
TEST(HfModelDirRobustnessTest, HugeIndexReadsQuickly) {
  std::vector<std::string> shards;
  for (int i = 1; i <= 200; ++i) shards.push_back(absl::StrCat("model-", i, "-of-200.safetensors"));
  const fs::path dir = ModelDir("huge_index", shards);
  std::vector<std::string> pairs;
  for (int t = 0; t < 100000; ++t) {
    pairs.push_back(absl::StrCat("\"model.layers.", t, ".weight\": \"", shards[t % 200], "\""));
  }
  WriteText(dir / "model.safetensors.index.json",
            absl::StrCat(R"({"weight_map": {)", absl::StrJoin(pairs, ",\n"), "}}"));
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<HfModel> model = LoadHfModelDir(dir.string());
  // 0.6 s in a normal build, under 4 s with ASan: anything worse than linear would be far more.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->weight_files.size(), 200u);
  // An index past ReadFileText's 64 MiB is refused from its size (a sparse file: no memory).
  fs::resize_file(dir / "model.safetensors.index.json", uintmax_t{1} << 33);
  absl::Status status = LoadHfModelDir(dir.string()).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(Message(status), HasSubstr("it holds 8589934592 bytes, more than the 67108864"));
}

// An index that is there but is no readable file is a broken download: the shards beside it are
// not read instead, as they may be only some of them.
TEST(HfModelDirRobustnessTest, IndexThatIsNoFileIsNotFound) {
  struct Case {
    std::string name;
    std::function<void(const fs::path&)> make;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"dangling_index",
       [](const fs::path& index) {
         fs::create_symlink(index.parent_path() / "blobs" / "missing", index);
       },
       "model.safetensors.index.json\" is a link to nothing; download the model's "
       "model.safetensors.index.json again"},
      {"directory_index", [](const fs::path& index) { fs::create_directories(index); },
       "model.safetensors.index.json\" is not a regular file"},
      {"fifo_index", [](const fs::path& index) { ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0); },
       "model.safetensors.index.json\" is not a regular file"},
      {"device_index", [](const fs::path& index) { fs::create_symlink("/dev/zero", index); },
       "model.safetensors.index.json\" is not a regular file"},
  };
  for (const Case& c : cases) {
    const fs::path dir = ModelDir(c.name, {"model-00001-of-00002.safetensors"});
    c.make(dir / "model.safetensors.index.json");
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status status = LoadHfModelDir(dir.string()).status();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << c.name;
    EXPECT_TRUE(absl::IsNotFound(status)) << c.name << ": " << status;
    EXPECT_THAT(Message(status), HasSubstr(c.message)) << c.name;
  }
  // A link to an index elsewhere (a Hugging Face cache's blobs) is read.
  const fs::path dir = ModelDir("linked_index", {"a.safetensors"});
  fs::create_directories(dir / "blobs");
  WriteText(dir / "blobs" / "1234", R"({"weight_map": {"x": "a.safetensors"}})");
  fs::create_symlink(dir / "blobs" / "1234", dir / "model.safetensors.index.json");
  absl::StatusOr<HfModel> model = LoadHfModelDir(dir.string());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT(model->weight_files, ElementsAre((dir / "a.safetensors").string()));
}

// Directory paths with control characters, quotes and bytes that are not UTF-8 are named escaped.
TEST(HfModelDirRobustnessTest, OddDirectoryNamesAreQuoted) {
  const fs::path root = ScratchDir("odd_names");
  for (const std::string& name : {std::string("new\nline"), std::string("quote\"d"),
                                 std::string("esc\x1b[31m"), std::string("caf\xc3\xa9")}) {
    const std::string missing = (root / name).string();
    absl::Status status = LoadHfModelDir(missing).status();
    EXPECT_TRUE(absl::IsNotFound(status)) << status;
    EXPECT_THAT(Message(status), HasSubstr(Quoted(missing)));
    EXPECT_TRUE(IsOneCleanLine(Message(status))) << absl::CHexEscape(Message(status));
  }
  EXPECT_TRUE(absl::IsNotFound(LoadHfModelDir("").status()));
}

// A name holding an ESC (a terminal escape), a newline and U+009B (a terminal's CSI).
constexpr char kOddName[] = "odd\033[31m\n\302\2332J";
// kOddName as Quoted and Escaped write it.
constexpr char kOddNameEscaped[] = "odd\\x1b[31m\\n\\u009b2J";

// The config.json's path names every refusal of its text quoted: the text given, and the file of
// a model directory.
TEST(HfModelDirRobustnessTest, OddConfigPathsAreQuoted) {
  const std::string source = absl::StrCat("models/", kOddName, "/config.json");
  auto keys = LlamaKeys();
  keys["hidden_act"] = R"("gelu")";
  auto no_type = LlamaKeys();
  no_type.erase("model_type");
  auto zero = LlamaKeys();
  zero["hidden_size"] = "0";
  auto int8 = LlamaKeys();
  int8["torch_dtype"] = R"("int8")";
  for (const std::string& json : {Json(keys), Json(no_type), Json(zero), Json(int8),
                                  std::string("{,}"), std::string("{'a': 1}")}) {
    const absl::Status status = ModelShapeFromHfConfigJson(json, source, "odd").status();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << json << ": " << status;
    EXPECT_THAT(Message(status), HasSubstr(Quoted(source))) << json;
    EXPECT_THAT(Message(status), HasSubstr(kOddNameEscaped)) << json;
    EXPECT_TRUE(IsOneCleanLine(Message(status))) << absl::CHexEscape(Message(status));
  }

  const fs::path dir = ModelDir(kOddName, {});
  WriteText(dir / "config.json", Json(keys));
  const absl::Status status = LoadHfModelDir(dir.string()).status();
  EXPECT_EQ(Message(status),
            absl::StrCat(Quoted((dir / "config.json").string()),
                         ": hidden_act \"gelu\" is not supported; kiln's MLP is SwiGLU "
                         "(hidden_act \"silu\"), as Llama's is"));
  EXPECT_THAT(Message(status), HasSubstr(kOddNameEscaped));
  EXPECT_TRUE(IsOneCleanLine(Message(status))) << absl::CHexEscape(Message(status));
}

// The index's path is named quoted where it does not parse.
TEST(HfModelDirRobustnessTest, OddIndexPathsAreQuoted) {
  const fs::path dir = ModelDir(kOddName, {"a.safetensors"});
  for (const std::string& index : {std::string("[]"), std::string("{'weight_map': {}}"),
                                   std::string(100, '[') + std::string(100, ']')}) {
    WriteText(dir / "model.safetensors.index.json", index);
    const absl::Status status = LoadHfModelDir(dir.string()).status();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << index << ": " << status;
    EXPECT_THAT(Message(status),
                HasSubstr(absl::StrCat("Cannot read ",
                                       Quoted((dir / "model.safetensors.index.json").string()),
                                       " as a safetensors index: ")))
        << index;
    EXPECT_THAT(Message(status), HasSubstr(kOddNameEscaped)) << index;
    EXPECT_TRUE(IsOneCleanLine(Message(status))) << absl::CHexEscape(Message(status));
  }
}

// Clears CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the calling thread's effective
// capabilities while it lives, so that root, too, is refused a directory without read permission;
// restores them after. Changes nothing for a process without them.
class WithoutDacOverride {
 public:
  WithoutDacOverride() {
    if (::syscall(SYS_capget, &header_, saved_) != 0) return;
    __user_cap_data_struct dropped[2] = {saved_[0], saved_[1]};
    dropped[0].effective &= ~((1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH));
    dropped_ = ::syscall(SYS_capset, &header_, dropped) == 0;
  }
  ~WithoutDacOverride() {
    if (dropped_) ::syscall(SYS_capset, &header_, saved_);
  }
  WithoutDacOverride(const WithoutDacOverride&) = delete;
  WithoutDacOverride& operator=(const WithoutDacOverride&) = delete;

 private:
  __user_cap_header_struct header_ = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct saved_[2] = {};
  bool dropped_ = false;
};

// A model directory that cannot be listed (its safetensors files are looked for there) is named
// quoted.
TEST(HfModelDirRobustnessTest, UnlistableOddDirectoryIsQuoted) {
  const fs::path dir = ModelDir(kOddName, {});
  // Search but no read permission: config.json is read, the directory cannot be listed.
  ASSERT_EQ(::chmod(dir.c_str(), 0311), 0);
  absl::Status status;
  bool listable = false;
  {
    const WithoutDacOverride without;
    DIR* listing = ::opendir(dir.c_str());
    listable = listing != nullptr;
    if (listable) ::closedir(listing);
    status = LoadHfModelDir(dir.string()).status();
  }
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  if (listable) GTEST_SKIP() << "this process lists a directory without read permission";
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_EQ(Message(status), absl::StrCat("Cannot list model directory ", Quoted(dir.string()),
                                          ": Permission denied; check its permissions"));
  EXPECT_THAT(Message(status), HasSubstr(kOddNameEscaped));
  EXPECT_TRUE(IsOneCleanLine(Message(status))) << absl::CHexEscape(Message(status));
}
}  // namespace
}  // namespace kiln
