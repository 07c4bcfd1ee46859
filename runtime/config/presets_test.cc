#include "runtime/config/presets.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/config/quoted.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(PresetsTest, EveryModelPresetIsComplete) {
  for (const std::string& name : ModelPresetNames()) {
    auto shape = ModelPreset(name);
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_TRUE(shape->has_name() && shape->has_hidden_size() && shape->has_num_layers() &&
                shape->has_num_heads() && shape->has_num_kv_heads() && shape->has_head_dim() &&
                shape->has_intermediate_size() && shape->has_vocab_size() && shape->has_dtype() &&
                shape->has_tie_embeddings() && shape->has_rope_theta() && shape->has_rms_norm_eps())
        << name;
    EXPECT_EQ(shape->num_heads() % shape->num_kv_heads(), 0) << name;
  }
}

TEST(PresetsTest, PublishedShapes) {
  auto l8 = ModelPreset("Llama-3.1-8B");  // any case
  ASSERT_TRUE(l8.ok());
  EXPECT_EQ(l8->hidden_size(), 4096);
  EXPECT_EQ(l8->num_layers(), 32);
  EXPECT_EQ(l8->num_kv_heads(), 8);
  EXPECT_EQ(l8->intermediate_size(), 14336);
  EXPECT_EQ(l8->vocab_size(), 128256);
  EXPECT_FALSE(l8->tie_embeddings());
  EXPECT_EQ(l8->rope_theta(), 500000.0);

  auto l1 = ModelPreset("llama-3.2-1b");
  ASSERT_TRUE(l1.ok());
  EXPECT_EQ(l1->head_dim(), 64);
  EXPECT_TRUE(l1->tie_embeddings());

  auto l3 = ModelPreset("llama-3.2-3b");
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ(l3->hidden_size(), 3072);
  EXPECT_EQ(l3->num_layers(), 28);
  EXPECT_EQ(l3->num_heads(), 24);  // 3 query heads per KV head
  EXPECT_EQ(l3->num_kv_heads(), 8);
  EXPECT_EQ(l3->head_dim(), 128);
  EXPECT_EQ(l3->intermediate_size(), 8192);
  EXPECT_TRUE(l3->tie_embeddings());

  auto l70 = ModelPreset("llama-3.1-70b");
  ASSERT_TRUE(l70.ok());
  EXPECT_EQ(l70->num_layers(), 80);
  EXPECT_EQ(l70->num_heads(), 64);

  auto m7 = ModelPreset("mistral-7b-v0.3");
  ASSERT_TRUE(m7.ok());
  EXPECT_EQ(m7->vocab_size(), 32768);
  EXPECT_EQ(m7->rope_theta(), 1e6);
  EXPECT_FALSE(m7->tie_embeddings());
  EXPECT_FALSE(m7->has_rope_scaling());
  EXPECT_FALSE(m7->has_sliding_window());

  auto q7 = ModelPreset("qwen2.5-7b");
  ASSERT_TRUE(q7.ok());
  EXPECT_EQ(q7->hidden_size(), 3584);
  EXPECT_EQ(q7->num_kv_heads(), 4);
  EXPECT_EQ(q7->vocab_size(), 152064);
  EXPECT_TRUE(q7->attention_bias());
  EXPECT_FALSE(q7->qk_norm());
  EXPECT_EQ(q7->rms_norm_eps(), 1e-6);

  // Qwen3: QK norm, no bias; 4B's query heads are wider together (32 x 128) than its hidden size.
  auto q8 = ModelPreset("qwen3-8b");
  ASSERT_TRUE(q8.ok());
  EXPECT_EQ(q8->num_layers(), 36);
  EXPECT_EQ(q8->intermediate_size(), 12288);
  EXPECT_EQ(q8->vocab_size(), 151936);
  EXPECT_TRUE(q8->qk_norm());
  EXPECT_FALSE(q8->attention_bias());
  EXPECT_FALSE(q8->tie_embeddings());
  auto q4 = ModelPreset("qwen3-4b");
  ASSERT_TRUE(q4.ok());
  EXPECT_EQ(q4->hidden_size(), 2560);
  EXPECT_EQ(q4->num_heads() * q4->head_dim(), 4096);
  EXPECT_TRUE(q4->qk_norm());
  EXPECT_TRUE(q4->tie_embeddings());
  EXPECT_FALSE(q4->has_rope_scaling());
  EXPECT_FALSE(ModelPreset("llama-3.1-8b")->qk_norm());
}

void ExpectLlama3Scaling(const config::ModelShape& shape, double factor) {
  ASSERT_TRUE(shape.has_rope_scaling()) << shape.name();
  const config::RopeScaling& scaling = shape.rope_scaling();
  EXPECT_EQ(scaling.rope_type(), "llama3") << shape.name();
  EXPECT_EQ(scaling.factor(), factor) << shape.name();
  EXPECT_EQ(scaling.low_freq_factor(), 1.0) << shape.name();
  EXPECT_EQ(scaling.high_freq_factor(), 4.0) << shape.name();
  EXPECT_EQ(scaling.original_max_position_embeddings(), 8192) << shape.name();
}

TEST(PresetsTest, PublishedRopeScaling) {
  ExpectLlama3Scaling(*ModelPreset("llama-3.2-1b"), 32.0);
  ExpectLlama3Scaling(*ModelPreset("llama-3.2-3b"), 32.0);
  ExpectLlama3Scaling(*ModelPreset("llama-3.1-8b"), 8.0);
  ExpectLlama3Scaling(*ModelPreset("llama-3.1-70b"), 8.0);
  auto q7 = ModelPreset("qwen2.5-7b");
  ASSERT_TRUE(q7.ok());
  EXPECT_FALSE(q7->has_rope_scaling());  // published without RoPE scaling
}

TEST(PresetsTest, GpuPresets) {
  auto h100 = GpuPreset("h100-80gb");
  ASSERT_TRUE(h100.ok());
  EXPECT_EQ(h100->total_bytes(), 81559ull << 20);
  EXPECT_EQ(h100->sm_count(), 132);
  auto h200 = GpuPreset("H200");  // short name, any case
  ASSERT_TRUE(h200.ok());
  EXPECT_EQ(h200->total_bytes(), 143771ull << 20);
  EXPECT_EQ(GpuPreset("a100")->sm_count(), 108);
  EXPECT_EQ(GpuPreset("l40s-48gb")->sm_count(), 142);
  EXPECT_EQ(GpuPresetNames().size(), 4u);
}

// "auto" is the device's GPU in any case, never a preset GpuPreset resolves; the stand-in for it
// is a preset that does.
TEST(PresetsTest, AutoGpuInAnyCase) {
  EXPECT_TRUE(IsAutoGpuPreset("auto"));
  EXPECT_TRUE(IsAutoGpuPreset("AUTO"));
  EXPECT_TRUE(IsAutoGpuPreset("Auto"));
  EXPECT_FALSE(IsAutoGpuPreset(""));
  EXPECT_FALSE(IsAutoGpuPreset("h100"));
  EXPECT_FALSE(IsAutoGpuPreset("automatic"));
  EXPECT_FALSE(GpuPreset("auto").ok());
  EXPECT_TRUE(GpuPreset(kStandInGpuPreset).ok());
}

TEST(PresetsTest, UsesDeviceGpuWithAutoOrNoGpuGiven) {
  config::PlannerConfig config;
  EXPECT_TRUE(UsesDeviceGpu(config));
  config.mutable_gpu()->set_sm_count(100);  // a field that overrides the device's
  EXPECT_TRUE(UsesDeviceGpu(config));
  config.mutable_gpu()->set_total_bytes(int64_t{40} << 30);
  EXPECT_FALSE(UsesDeviceGpu(config));
  config.set_gpu_preset("AUTO");
  EXPECT_TRUE(UsesDeviceGpu(config));
  config.set_gpu_preset("h200");
  EXPECT_FALSE(UsesDeviceGpu(config));
}

TEST(PresetsTest, UnknownNamesListTheKnownOnes) {
  auto model = ModelPreset("gpt-5");
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("Unknown model preset \"gpt-5\"; use one of llama-3.2-1b, llama-3.2-3b, "
                        "llama-3.1-8b, llama-3.1-70b, mistral-7b-v0.3, qwen2.5-7b"));
  auto gpu = GpuPreset("v100");
  EXPECT_THAT(std::string(gpu.status().message()),
              HasSubstr("Unknown GPU preset \"v100\"; use one of h100-80gb, h200-141gb"));
}

TEST(PresetsTest, DefaultConfig) {
  config::PlannerConfig config = DefaultPlannerConfig();
  EXPECT_EQ(config.model_preset(), "llama-3.1-8b");
  EXPECT_EQ(config.gpu_preset(), "h100-80gb");
  EXPECT_EQ(config.gpu_memory_utilization(), 0.9);
  EXPECT_EQ(config.max_num_seqs(), 256);
  EXPECT_EQ(config.graph().capture_sizes_size(), 0);  // the default list
}

// Returns `name` with each letter's case flipped at random.
std::string RandomCase(const std::string& name, std::mt19937& rng) {
  std::string out = name;
  for (char& c : out) {
    if (std::uniform_int_distribution<int>(0, 1)(rng) == 0) {
      c = static_cast<char>(std::isupper(static_cast<unsigned char>(c))
                                ? std::tolower(static_cast<unsigned char>(c))
                                : std::toupper(static_cast<unsigned char>(c)));
    }
  }
  return out;
}

// Every preset name in random cases resolves to the same preset; every near miss (spaces around
// it, a character more or less, NUL, newline, a terminal escape, bytes that are not UTF-8, a
// megabyte of text) is InvalidArgument with the name quoted on one line, escaped, and the known
// names listed.
TEST(PresetsTest, SweepNamesAndNearMisses) {
  std::mt19937 rng(23);
  auto pick = [&](int hi) { return std::uniform_int_distribution<int>(0, hi)(rng); };
  std::vector<std::string> gpu_names = GpuPresetNames();
  for (const char* short_name : {"h100", "h200", "a100", "l40s"}) gpu_names.push_back(short_name);
  const std::string decorations[] = {
      " ",       "\t",   "\n", "\r", std::string(1, '\0'),
      "\x1b[2J", "\xff", "-",  "x",  "\xe2\x80\x8b" /* zero-width space */};
  for (int trial = 0; trial < 3000; ++trial) {
    const bool model = pick(1) == 0;
    const std::vector<std::string> names = model ? ModelPresetNames() : gpu_names;
    const std::string& canonical = names[pick(static_cast<int>(names.size()) - 1)];
    const std::string name = RandomCase(canonical, rng);
    if (model) {
      absl::StatusOr<config::ModelShape> shape = ModelPreset(name);
      ASSERT_TRUE(shape.ok()) << name << ": " << shape.status();
      ASSERT_EQ(shape->SerializeAsString(), ModelPreset(canonical)->SerializeAsString());
    } else {
      absl::StatusOr<config::GpuSpec> gpu = GpuPreset(name);
      ASSERT_TRUE(gpu.ok()) << name << ": " << gpu.status();
      ASSERT_EQ(gpu->SerializeAsString(), GpuPreset(canonical)->SerializeAsString());
    }

    std::string miss = name;
    switch (pick(4)) {
      case 0:
        miss = decorations[pick(9)] + miss;
        break;
      case 1:
        miss += decorations[pick(9)];
        break;
      case 2:
        miss.erase(pick(static_cast<int>(miss.size()) - 1), 1);
        break;
      case 3:
        miss.insert(pick(static_cast<int>(miss.size())), decorations[pick(9)]);
        break;
      default:
        miss = std::string(pick(3), 'q');  // empty, or nothing like a name
    }
    const absl::Status status = model ? ModelPreset(miss).status() : GpuPreset(miss).status();
    ASSERT_FALSE(status.ok()) << absl::CHexEscape(miss);
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    const std::string message(status.message());
    ASSERT_THAT(message,
                HasSubstr(absl::StrCat(model ? "Unknown model preset \"" : "Unknown GPU preset \"",
                                       Escaped(miss), "\"; use one of ",
                                       model ? "llama-3.2-1b" : "h100-80gb")));
    ASSERT_EQ(message.find('\n'), std::string::npos);
    ASSERT_EQ(message.find('\0'), std::string::npos);
    ASSERT_EQ(message.find('\x1b'), std::string::npos);
    ASSERT_FALSE(IsAutoGpuPreset(miss)) << absl::CHexEscape(miss);
  }
  for (int trial = 0; trial < 100; ++trial) {
    EXPECT_TRUE(IsAutoGpuPreset(RandomCase("auto", rng)));
  }
  // A megabyte of name: refused like any other (and quoted whole).
  const std::string huge((1 << 20) + 3, 'q');
  EXPECT_THAT(std::string(ModelPreset(huge).status().message()), HasSubstr(huge + "\"; use"));
  EXPECT_THAT(std::string(GpuPreset(huge).status().message()), HasSubstr(huge + "\"; use"));
}

// What the planner relies on: every model preset is a valid shape well inside its bounds, every
// GPU preset a positive memory below a PiB with positive SMs, and the names are unique.
TEST(PresetsTest, EveryPresetIsWithinThePlannersBounds) {
  std::vector<std::string> seen;
  for (const std::string& name : ModelPresetNames()) {
    absl::StatusOr<config::ModelShape> m = ModelPreset(name);
    ASSERT_TRUE(m.ok()) << m.status();
    for (int v : {m->hidden_size(), m->num_layers(), m->num_heads(), m->num_kv_heads(),
                  m->head_dim(), m->intermediate_size(), m->vocab_size()}) {
      EXPECT_GE(v, 1) << name;
      EXPECT_LE(v, 1 << 20) << name;
    }
    EXPECT_LE(m->num_heads() / m->num_kv_heads(), 64) << name;  // kiln's attention's limit
    EXPECT_GT(m->rope_theta(), 0) << name;
    EXPECT_GT(m->rms_norm_eps(), 0) << name;
    EXPECT_EQ(m->dtype(), config::DTYPE_BF16) << name;
    seen.push_back(absl::AsciiStrToLower(name));
  }
  for (const std::string& name : GpuPresetNames()) {
    absl::StatusOr<config::GpuSpec> g = GpuPreset(name);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_GT(g->total_bytes(), 0u) << name;
    EXPECT_LE(g->total_bytes(), uint64_t{1} << 50) << name;
    EXPECT_GT(g->sm_count(), 0) << name;
    seen.push_back(absl::AsciiStrToLower(name));
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
}

}  // namespace
}  // namespace kiln
