// Host test: the model shape the Runner builds from a config, the memory planner is asked
// about the graphs the Runner will really capture, and the steps' keys, planners and layouts
// (BuildStepSetup).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attention/split_kv_planner.h"
#include "gmock/gmock.h"
#include "graph/capture_context.h"
#include "graph/capture_sizes.h"
#include "gtest/gtest.h"
#include "runtime/config/presets.h"
#include "runtime/config/quoted.h"
#include "runtime/memory/memory_planner.h"
#include "runtime/model/llama_model.h"
#include "runtime/model/sampling.h"
#include "runtime/model/skinny_gemm.h"
#include "runtime/runner/runner.h"
#include "runtime/runner/sequence_table.h"
#include "runtime/runner/step_plan.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

// Values a server's config may hold for an int option: 0, ±1, powers of two ± 1 and the
// extremes, then seeded draws.
int Adversarial(std::mt19937& rng) {
  static const std::vector<int> kEdges = [] {
    std::vector<int> edges = {0, 1, -1, 2, 3, std::numeric_limits<int>::max(),
                              std::numeric_limits<int>::min(),
                              std::numeric_limits<int>::max() - 1,
                              std::numeric_limits<int>::min() + 1};
    for (int bit = 1; bit < 31; ++bit) {
      for (int d : {-1, 0, 1}) edges.push_back((1 << bit) + d);
      edges.push_back(-(1 << bit));
    }
    return edges;
  }();
  switch (rng() % 4) {
    case 0:
      return static_cast<int>(rng() % 80);  // near the real limits
    case 1:
      return static_cast<int>(rng());  // anything
    default:
      return kEdges[rng() % kEdges.size()];
  }
}

// Sometimes an adversarial value, mostly the default (so one bad option at a time is common).
int Maybe(std::mt19937& rng, int value, int one_in = 3) {
  return rng() % one_in == 0 ? Adversarial(rng) : value;
}

// A split rule list: empty, sorted, unsorted, duplicated or huge.
std::vector<SplitAim> AdversarialAims(std::mt19937& rng, const std::vector<SplitAim>& value) {
  std::vector<SplitAim> aims;
  switch (rng() % 6) {
    case 0:
      return value;
    case 1:
      return aims;  // empty: decode_ctas_per_sm everywhere
    case 2: {  // strictly ascending, valid
      const int n = 1 + static_cast<int>(rng() % 8);
      int seqs = 0;
      for (int i = 0; i < n; ++i) {
        seqs += 1 + static_cast<int>(rng() % 16);
        aims.push_back({seqs, 1 + static_cast<int>(rng() % kMaxCtasPerSm)});
      }
      return aims;
    }
    case 3: {  // huge (valid but long)
      static const std::vector<SplitAim> kHuge = [] {
        std::vector<SplitAim> huge;
        for (int i = 1; i <= 10000; ++i) huge.push_back({i, 1 + i % 4});
        return huge;
      }();
      return kHuge;
    }
    default: {  // anything, duplicates likely
      const int n = static_cast<int>(rng() % 6);
      for (int i = 0; i < n; ++i) {
        aims.push_back({rng() % 2 ? Adversarial(rng) : static_cast<int>(rng() % 4),
                        rng() % 2 ? Adversarial(rng) : static_cast<int>(rng() % 4)});
      }
      return aims;
    }
  }
}

// CheckSplitAims' rule, written out again.
bool AimsValid(const std::vector<SplitAim>& aims) {
  for (size_t i = 0; i < aims.size(); ++i) {
    if (aims[i].max_seqs < 1 || aims[i].ctas_per_sm < 1 || aims[i].ctas_per_sm > kMaxCtasPerSm ||
        (i > 0 && aims[i].max_seqs <= aims[i - 1].max_seqs)) {
      return false;
    }
  }
  return true;
}

bool RowsValid(const PrefetchGemmRows& r, int most) {
  return std::min({r.qkv, r.o, r.gate_up, r.down, r.lm_head}) >= 0 &&
         std::max({r.qkv, r.o, r.gate_up, r.down, r.lm_head}) <= most;
}

config::PlannerConfig OneBillion() {
  config::PlannerConfig config = DefaultPlannerConfig();
  config.set_model_preset("llama-3.2-1b");
  config.set_gpu_preset("h200-141gb");
  return config;
}

// What step_host_benchmark builds its StepSetup from, with its default flags: the llama-3.2-1b
// preset on the stand-in GPU preset, blocks of 64 tokens, the Runner's default options, one GPU.
struct StepSetupInputs {
  RunnerOptions options;
  config::PlannerConfig resolved;
  LlamaShape shape;
  int sm_count = 0;
  int max_blocks_per_seq = 0;
};

absl::StatusOr<StepSetupInputs> BenchmarkStepSetupInputs() {
  StepSetupInputs in;
  in.options.config.set_model_preset("llama-3.2-1b");
  in.options.config.set_block_size(64);
  in.options.config.set_gpu_preset(kStandInGpuPreset);
  absl::StatusOr<HostStepPlan> plan = PlanHostSteps(in.options);
  if (!plan.ok()) return plan.status();
  in.resolved = plan->resolved;
  in.shape = plan->shape;
  in.sm_count = plan->sm_count;
  in.max_blocks_per_seq = plan->max_blocks_per_seq;
  return in;
}

absl::StatusOr<StepSetup> BuildStepSetup(const StepSetupInputs& in) {
  return BuildStepSetup(in.resolved, in.options, in.shape, in.sm_count, in.max_blocks_per_seq);
}

TEST(RunnerConfigTest, PlanHostStepsRefusesWhatCreateWouldBeforeAnyDevice) {
  RunnerOptions options;
  options.config.set_model_preset("no-such-model");
  options.config.set_gpu_preset(kStandInGpuPreset);
  absl::StatusOr<HostStepPlan> plan = PlanHostSteps(options);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("no-such-model"), absl::string_view::npos)
      << plan.status();
  options.config.set_model_preset("llama-3.2-1b");
  options.decode_ctas_per_sm = -1;
  plan = PlanHostSteps(options);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_NE(plan.status().message().find("decode_ctas_per_sm"), absl::string_view::npos)
      << plan.status();
}

TEST(RunnerConfigTest, ModelShapeRoundTripsThroughTheConfig) {
  LlamaShape biased = LlamaShape::Tiny();
  biased.qkv_bias = true;
  LlamaShape normed = LlamaShape::Tiny();
  normed.qk_norm = true;
  for (const LlamaShape& shape : {LlamaShape::Tiny(), LlamaShape::Llama1B(), biased, normed}) {
    const config::ModelShape m = ModelShapeFromLlamaShape(shape, "x");
    EXPECT_EQ(m.name(), "x");
    absl::StatusOr<LlamaShape> back = LlamaShapeFromConfig(m);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->hidden, shape.hidden);
    EXPECT_EQ(back->layers, shape.layers);
    EXPECT_EQ(back->heads, shape.heads);
    EXPECT_EQ(back->kv_heads, shape.kv_heads);
    EXPECT_EQ(back->head_dim, shape.head_dim);
    EXPECT_EQ(back->ffn, shape.ffn);
    EXPECT_EQ(back->vocab, shape.vocab);
    EXPECT_EQ(back->tie_embeddings, shape.tie_embeddings);
    EXPECT_EQ(back->qkv_bias, shape.qkv_bias);
    EXPECT_EQ(back->qk_norm, shape.qk_norm);
    EXPECT_EQ(back->rope_theta, shape.rope_theta);
    EXPECT_EQ(back->rms_eps, shape.rms_eps);
    EXPECT_EQ(back->rope_scaling, shape.rope_scaling) << back->rope_scaling.ToString();
  }
}

TEST(RunnerConfigTest, RopeScalingRoundTripsThroughTheConfig) {
  LlamaShape shape = LlamaShape::Tiny();
  shape.rope_scaling = RopeScaling::Llama3(8.0, 1.5, 6.0, 4096);
  const config::ModelShape m = ModelShapeFromLlamaShape(shape, "scaled");
  ASSERT_TRUE(m.has_rope_scaling());
  EXPECT_EQ(m.rope_scaling().rope_type(), "llama3");
  EXPECT_EQ(m.rope_scaling().original_max_position_embeddings(), 4096);
  absl::StatusOr<LlamaShape> back = LlamaShapeFromConfig(m);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rope_scaling, shape.rope_scaling) << back->rope_scaling.ToString();

  // No scaling writes no rope_scaling, and none comes back.
  const config::ModelShape plain = ModelShapeFromLlamaShape(LlamaShape::Tiny(), "plain");
  EXPECT_FALSE(plain.has_rope_scaling());
  EXPECT_FALSE(LlamaShapeFromConfig(plain)->rope_scaling.enabled());
}

TEST(RunnerConfigTest, PresetRopeScalingReachesTheLlamaShape) {
  absl::StatusOr<config::PlannerConfig> resolved = ResolvePlannerConfig(OneBillion());
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  absl::StatusOr<LlamaShape> shape = LlamaShapeFromConfig(resolved->model());
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->rope_scaling, RopeScaling::Llama3(32.0, 1.0, 4.0, 8192))
      << shape->rope_scaling.ToString();
  EXPECT_EQ(shape->rope_scaling, LlamaShape::Llama1B().rope_scaling);

  // rope_type "default" over the preset turns its scaling off.
  config::PlannerConfig unscaled = OneBillion();
  unscaled.mutable_model()->mutable_rope_scaling()->set_rope_type("default");
  resolved = ResolvePlannerConfig(unscaled);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->model().rope_scaling().factor(), 32.0);  // merged from the preset
  shape = LlamaShapeFromConfig(resolved->model());
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_FALSE(shape->rope_scaling.enabled()) << shape->rope_scaling.ToString();
}

TEST(RunnerConfigTest, RefusesRopeScalingKilnDoesNotImplement) {
  const config::ModelShape base = ModelShapeFromLlamaShape(LlamaShape::Llama1B(), "1b");
  auto refused = [&](void (*edit)(config::RopeScaling*)) {
    config::ModelShape m = base;
    edit(m.mutable_rope_scaling());
    absl::Status status = LlamaShapeFromConfig(m).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  EXPECT_THAT(refused([](config::RopeScaling* r) { r->set_rope_type("yarn"); }),
              HasSubstr("Model rope_scaling.rope_type \"yarn\" is not supported; kiln implements "
                        "\"llama3\" RoPE scaling (or rope_type \"default\" for none)"));
  EXPECT_THAT(refused([](config::RopeScaling* r) { r->clear_rope_type(); }),
              HasSubstr("Model rope_scaling has no rope_type"));
  EXPECT_THAT(refused([](config::RopeScaling* r) { r->clear_original_max_position_embeddings(); }),
              HasSubstr("Model rope_scaling has no original_max_position_embeddings; give it "
                        "(Llama 3.x: 8192)"));
  EXPECT_THAT(refused([](config::RopeScaling* r) { r->clear_low_freq_factor(); }),
              HasSubstr("Model rope_scaling has no low_freq_factor"));
  EXPECT_THAT(refused([](config::RopeScaling* r) { r->set_factor(0.5); }),
              HasSubstr("factor is 0.5"));
  EXPECT_THAT(refused([](config::RopeScaling* r) { r->set_factor(0.0); }),
              HasSubstr("Model rope_scaling.factor is 0"));
  EXPECT_THAT(refused([](config::RopeScaling* r) { r->set_high_freq_factor(0.5); }),
              HasSubstr("high_freq_factor is 0.5"));
}

// Refused when the config is read, before any weight is read or memory allocated.
TEST(RunnerConfigTest, RefusesHeadsDecodeAttentionHasNoKernelFor) {
  LlamaShape nines = LlamaShape::Llama1B();  // groups of 9
  nines.hidden = 4608;
  nines.heads = 36;
  nines.kv_heads = 4;
  nines.head_dim = 128;
  absl::Status status = LlamaShapeFromConfig(ModelShapeFromLlamaShape(nines, "9s")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("Model \"9s\": Decode attention has no kernel for 36 query heads over 4 KV "
                        "heads (9 per KV head); it is built for 1, 2, 3, 4, 5, 6, 7, 8"));
  LlamaShape wide_heads = LlamaShape::Llama1B();
  wide_heads.heads = 16;
  wide_heads.kv_heads = 4;
  wide_heads.head_dim = 96;
  status = LlamaShapeFromConfig(ModelShapeFromLlamaShape(wide_heads, "hd96")).status();
  EXPECT_THAT(status.message(), HasSubstr("no kernel for head_dim 96; it is built for 64 and 128"));
  EXPECT_TRUE(LlamaShapeFromConfig(ModelShapeFromLlamaShape(LlamaShape::Llama1B(), "1b")).ok());
}

// A sliding window (Mistral 7B v0.1) is full attention for sequences that fit it; longer ones are
// refused.
TEST(RunnerConfigTest, SlidingWindowBoundsMaxModelLen) {
  config::ModelShape model = *ModelPreset("llama-3.1-8b");
  EXPECT_TRUE(CheckSlidingWindow(model, 131072).ok());  // no window
  model.set_name("Mistral-7B-v0.1");
  model.set_sliding_window(4096);
  EXPECT_TRUE(CheckSlidingWindow(model, 4096).ok());
  const absl::Status status = CheckSlidingWindow(model, 8192);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "Model \"Mistral-7B-v0.1\" attends over a sliding window of its last 4096 tokens, "
            "which kiln's attention does not implement; up to 4096 tokens full attention computes "
            "the same: set max_model_len (8192) to at most 4096");
}

// A model's name comes from the user (a config file, a --model_dir's directory name or its
// config.json): the messages that name it quote it, escaped, on one clean line, as they do the
// rope_type. An empty one shows as "".
TEST(RunnerConfigTest, MessagesQuoteTheModelsNameEscaped) {
  const std::vector<std::pair<std::string, std::string>> names = {
      {"", "\"\""},
      {"odd\x1b[31m\nname", "\"odd\\x1b[31m\\nname\""},
      {"x\xc2\x9b" "2J \"q\"", "\"x\\u009b2J \\\"q\\\"\""},
      {"report_\xe2\x80\xae" "exe.pdf", "\"report_\\u202eexe.pdf\""},
      {"caf\xc3\xa9\xff", "\"caf\\xc3\\xa9\\xff\""},
  };
  LlamaShape nines = LlamaShape::Llama1B();  // groups of 9: no decode attention kernel
  nines.hidden = 4608;
  nines.heads = 36;
  nines.kv_heads = 4;
  nines.head_dim = 128;
  for (const auto& [name, quoted] : names) {
    std::vector<std::pair<absl::Status, std::string>> cases;  // a refusal, how it starts
    cases.push_back({LlamaShapeFromConfig(ModelShapeFromLlamaShape(nines, name)).status(),
                     absl::StrCat("Model ", quoted, ": Decode attention has no kernel for 36")});
    config::ModelShape windowed = ModelShapeFromLlamaShape(LlamaShape::Llama1B(), name);
    windowed.set_sliding_window(1024);
    cases.push_back({CheckSlidingWindow(windowed, 4096),
                     absl::StrCat("Model ", quoted, " attends over a sliding window of its last "
                                  "1024 tokens")});
    config::PlannerConfig resolved = *ResolvePlannerConfig(OneBillion());
    *resolved.mutable_model() = windowed;
    cases.push_back({CheckRunnerModel(resolved, 4096).status(),
                     absl::StrCat("Model ", quoted, " attends over a sliding window")});
    config::ModelShape roped = ModelShapeFromLlamaShape(LlamaShape::Llama1B(), "1b");
    roped.mutable_rope_scaling()->set_rope_type(name);
    cases.push_back({LlamaShapeFromConfig(roped).status(),
                     absl::StrCat("Model rope_scaling.rope_type ", quoted, " is not supported")});
    for (const auto& [status, start] : cases) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << start;
      EXPECT_TRUE(absl::StartsWith(status.message(), start)) << status.message();
      EXPECT_TRUE(IsOneCleanLine(status.message())) << absl::CHexEscape(status.message());
    }
  }
}

// What Runner::Create refuses about the model before it allocates, checked on the host.
TEST(RunnerConfigTest, CheckRunnerModelRefusesWhatTheRunnerCannotBuild) {
  absl::StatusOr<config::PlannerConfig> resolved = ResolvePlannerConfig(OneBillion());
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  absl::StatusOr<LlamaShape> shape = CheckRunnerModel(*resolved, 4096);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->hidden, 2048);
  EXPECT_EQ(shape->layers, 16);

  config::PlannerConfig fp8 = *resolved;
  fp8.set_kv_cache_dtype(config::DTYPE_FP8_E4M3);
  EXPECT_THAT(CheckRunnerModel(fp8, 4096).status().message(),
              HasSubstr("kv_cache_dtype fp8 is not supported; kiln's KV cache is bf16"));

  config::PlannerConfig windowed = *resolved;
  windowed.mutable_model()->set_sliding_window(1024);
  EXPECT_TRUE(CheckRunnerModel(windowed, 1024).ok());
  EXPECT_THAT(CheckRunnerModel(windowed, 4096).status().message(),
              HasSubstr("set max_model_len (4096) to at most 1024"));

  config::PlannerConfig head_dim_96 = *resolved;
  head_dim_96.mutable_model()->set_head_dim(96);
  EXPECT_EQ(CheckRunnerModel(head_dim_96, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);

  // The planner takes up to 2^20 sequences (with listed capture sizes); a step samples them all
  // in one launch of at most 65535 rows, which would refuse a larger step after its model ran.
  config::PlannerConfig many = *resolved;
  many.set_max_num_seqs(65535);
  many.set_max_num_batched_tokens(65536);
  EXPECT_TRUE(CheckRunnerModel(many, 4096).ok());
  many.set_max_num_seqs(65536);
  EXPECT_THAT(CheckRunnerModel(many, 4096).status().message(),
              HasSubstr("max_num_seqs 65536 is above 65535"));
}

// head_dim 128 models (measured on Llama 3.1 8B) aim at 2 CTAs per SM for 8 sequences; the 1B
// shape's rules aim at 4.
TEST(RunnerConfigTest, DecodeSplitRulesFollowTheModelsHeadDim) {
  const RunnerOptions defaults;
  auto aims_at_8_rows = [&](const char* preset) {
    auto model = ModelPreset(preset);
    EXPECT_TRUE(model.ok()) << model.status();
    auto shape = LlamaShapeFromConfig(*model);
    EXPECT_TRUE(shape.ok()) << shape.status();
    for (const SplitAim& aim : DecodeSplitRules(defaults, shape->head_dim)) {
      if (aim.max_seqs >= 8) return aim.ctas_per_sm;
    }
    return -1;
  };
  EXPECT_EQ(aims_at_8_rows("llama-3.2-1b"), 4);
  EXPECT_EQ(aims_at_8_rows("llama-3.2-3b"), 2);
  EXPECT_EQ(aims_at_8_rows("llama-3.1-8b"), 2);
  RunnerOptions custom;
  custom.decode_split_by_rows = {{4, 3}};
  custom.decode_split_by_rows_head_dim_128 = {{16, 1}};
  EXPECT_EQ(DecodeSplitRules(custom, 64).front().ctas_per_sm, 3);
  EXPECT_EQ(DecodeSplitRules(custom, 128).front().max_seqs, 16);
}

// Options whose bad values need no GPU to see are refused before the device is touched (on a
// host without one, too), not after the weights and the KV cache were allocated or at the
// first prefill step.
// What LlamaModel::Create refuses, which Runner::Create now checks before the weights upload.
TEST(RunnerConfigTest, ModelOptionsAreCheckedOnTheHost) {
  LlamaModelOptions options;
  options.num_kv_blocks = 100;
  EXPECT_TRUE(CheckLlamaModelOptions(LlamaShape::Llama1B(), options).ok());
  LlamaModelOptions bad = options;
  bad.layer_kernel_rows = 99;
  EXPECT_THAT(std::string(CheckLlamaModelOptions(LlamaShape::Llama1B(), bad).message()),
              HasSubstr("layer_kernel_rows 99 is outside [0, "));
  bad = options;
  bad.num_kv_blocks = 0;
  EXPECT_THAT(std::string(CheckLlamaModelOptions(LlamaShape::Llama1B(), bad).message()),
              HasSubstr("num_kv_blocks 0 must be positive"));
  bad = options;
  bad.tma_gemm_ctas_per_sm = 3;
  EXPECT_TRUE(absl::IsInvalidArgument(CheckLlamaModelOptions(LlamaShape::Llama1B(), bad)));
  LlamaShape biased = LlamaShape::Llama1B();
  biased.qkv_bias = true;
  bad = options;
  bad.layer_kernel_rows = 1;
  EXPECT_THAT(std::string(CheckLlamaModelOptions(biased, bad).message()),
              HasSubstr("the decode layer kernel has no QKV bias"));
}

TEST(RunnerConfigTest, RefusesBadAttentionOptionsBeforeTheDevice) {
  RunnerOptions options;
  options.config = OneBillion();
  options.prefill_tile_rows = 96;
  absl::Status status = Runner::Create(options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("prefill_tile_rows 96"));
  options.prefill_tile_rows = 64;
  options.decode_min_kv_chunk = 0;
  status = Runner::Create(options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("decode_min_kv_chunk 0"));
  options.decode_min_kv_chunk = 64;
  options.decode_ctas_per_sm = 0;
  status = Runner::Create(options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("decode_ctas_per_sm 0"));
}

// Values the sweep below found accepted on the host, each refused now before the device: an enum
// value outside GraphExecution (captured as neither mode), and decode split aims past what an SM
// holds (a partial workspace of hundreds of GiB, sized after the weights were uploaded).
TEST(RunnerConfigTest, RefusesOutOfRangeRunnerOptionsBeforeTheDevice) {
  RunnerOptions options;
  options.config = OneBillion();
  options.graphs = static_cast<GraphExecution>(7);
  absl::Status status = Runner::Create(options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("RunnerOptions::graphs 7 is not a GraphExecution; use kFull"));
  options.graphs = GraphExecution::kFull;
  options.decode_ctas_per_sm = 1 << 24;
  status = Runner::Create(options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("decode_ctas_per_sm 16777216 is above 32, the most CTAs an SM holds"));
  options.decode_ctas_per_sm = 2;
  options.decode_split_by_rows = {{4, 2}, {8, 1 << 30}};
  status = Runner::Create(options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("RunnerOptions::decode_split_by_rows[1] (max_seqs 8, ctas_per_sm "
                        "1073741824) aims above 32"));
  options.decode_split_by_rows = {};
  options.sharded_prefetch_gemm_rows.o = -1;
  EXPECT_THAT(std::string(CheckRunnerOptions(options).message()),
              HasSubstr("RunnerOptions::sharded_prefetch_gemm_rows (qkv 8, o -1"));
  options.sharded_prefetch_gemm_rows.o = 8;
  EXPECT_TRUE(CheckRunnerOptions(options).ok());
}

// Runner::Step's first check, the one its step fill relies on for token ids
// (StepIds::kCheckedByCaller): every token of every sequence in [0, vocab), and no sequence
// above max_num_batched_tokens, each named.
TEST(RunnerConfigTest, StepTokensOutsideTheVocabularyAreRefused) {
  constexpr int kVocab = 128256;
  const std::vector<SequenceTokens> good = {{1, {0, 5, kVocab - 1}}, {2, {7}}, {3, {}}};
  EXPECT_TRUE(CheckStepTokens(good, kVocab, 8).ok());
  EXPECT_TRUE(CheckStepTokens({}, kVocab, 8).ok());  // Step's StepKeys::Check refuses it
  for (int32_t bad : {-1, std::numeric_limits<int32_t>::min(), kVocab,
                      std::numeric_limits<int32_t>::max()}) {
    const std::vector<SequenceTokens> batch = {{1, {4, 5}}, {9, {3, bad, 2}}, {4, {-2}}};
    const absl::Status status = CheckStepTokens(batch, kVocab, 8);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat("Sequence 9 has token ", bad,
                                       " outside the vocabulary [0, 128256)")));
  }
  const std::vector<SequenceTokens> long_batch = {{1, {4}}, {6, std::vector<int32_t>(9, 1)}};
  absl::Status status = CheckStepTokens(long_batch, kVocab, 8);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("Sequence 6 brings 9 tokens, above max_num_batched_tokens 8"));
  EXPECT_TRUE(CheckStepTokens(long_batch, kVocab, 9).ok());
  // A limit below 0 admits no token rather than wrapping to a huge one.
  status = CheckStepTokens(long_batch, kVocab, -1);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("Sequence 1 brings 1 tokens, above max_num_batched_tokens -1"));
}

TEST(RunnerConfigTest, WritesTheRunnersGraphChoicesIntoThePlannerConfig) {
  RunnerOptions options;
  options.config = OneBillion();
  options.graphs = GraphExecution::kPiecewise;
  options.capture_prefill = false;
  options.prefill_sizes = {32, 128};
  options.max_model_len = 2048;
  const config::PlannerConfig config = Runner::PlannerConfigFor(options);
  EXPECT_EQ(config.graph().execution(), config::GRAPH_EXECUTION_PIECEWISE);
  EXPECT_FALSE(config.graph().capture_prefill());
  ASSERT_EQ(config.graph().prefill_sizes_size(), 2);
  EXPECT_EQ(config.graph().prefill_sizes(1), 128);
  EXPECT_EQ(config.max_model_len(), 2048);
  EXPECT_EQ(config.model_preset(), "llama-3.2-1b");  // the rest is the caller's config
}

TEST(RunnerConfigTest, PrefillOnlyConfigsStillPlan) {
  RunnerOptions options;
  options.config = OneBillion();
  options.config.mutable_graph()->set_mode(config::GRAPH_MODE_PREFILL_ONLY);
  options.prefill_sizes = {32, 128};  // ignored: prefill-only graphs use the capture sizes
  const config::PlannerConfig config = Runner::PlannerConfigFor(options);
  EXPECT_EQ(config.graph().prefill_sizes_size(), 0);
  absl::StatusOr<MemoryPlan> plan = PlanMemory(config);
  EXPECT_TRUE(plan.ok()) << plan.status();
}

TEST(RunnerConfigTest, PiecewisePlanHasNoPoolAndMoreExecutablesThanFull) {
  RunnerOptions full;
  full.config = OneBillion();
  full.graphs = GraphExecution::kFull;
  RunnerOptions piecewise = full;
  piecewise.graphs = GraphExecution::kPiecewise;

  absl::StatusOr<MemoryPlan> full_plan = PlanMemory(Runner::PlannerConfigFor(full));
  absl::StatusOr<MemoryPlan> piece_plan = PlanMemory(Runner::PlannerConfigFor(piecewise));
  ASSERT_TRUE(full_plan.ok()) << full_plan.status();
  ASSERT_TRUE(piece_plan.ok()) << piece_plan.status();
  const MemoryTerm* full_pool = full_plan->Find("graph_pool");
  const MemoryTerm* piece_pool = piece_plan->Find("graph_pool");
  const MemoryTerm* full_exec = full_plan->Find("graph_executables");
  const MemoryTerm* piece_exec = piece_plan->Find("graph_executables");
  ASSERT_TRUE(full_pool && piece_pool && full_exec && piece_exec);
  EXPECT_GT(full_pool->bytes, 0);
  EXPECT_EQ(piece_pool->bytes, 0);  // piecewise activations live in the eager arena
  EXPECT_GT(piece_exec->bytes, full_exec->bytes);  // layers + 1 graphs per key
}

// Seeded sweep of CheckRunnerOptions (what Runner::Create refuses before it touches the device):
// every refusal is InvalidArgument naming the option; every acceptance satisfies the documented
// ranges, checked here independently.
TEST(RunnerConfigTest, CheckRunnerOptionsSweep) {
  std::mt19937 rng(20261127);
  int accepted = 0, refused = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    RunnerOptions o;
    o.max_model_len = Maybe(rng, o.max_model_len);
    if (rng() % 8 == 0) o.graphs = static_cast<GraphExecution>(Adversarial(rng));
    if (rng() % 8 == 0) o.progress = static_cast<CaptureProgress>(Adversarial(rng));
    if (rng() % 2 == 0) o.decode_split_by_rows = AdversarialAims(rng, o.decode_split_by_rows);
    if (rng() % 4 == 0) {
      o.decode_split_by_rows_head_dim_128 =
          AdversarialAims(rng, o.decode_split_by_rows_head_dim_128);
    }
    o.prefill_tile_rows = rng() % 2 ? Maybe(rng, o.prefill_tile_rows) : 128;
    o.decode_min_kv_chunk = Maybe(rng, o.decode_min_kv_chunk);
    o.decode_ctas_per_sm = Maybe(rng, o.decode_ctas_per_sm);
    PrefetchGemmRows& sharded = o.sharded_prefetch_gemm_rows;
    for (int* field : {&sharded.qkv, &sharded.o, &sharded.gate_up, &sharded.down,
                       &sharded.lm_head}) {
      if (rng() % 10 == 0) *field = Adversarial(rng);
    }
    const int graphs = static_cast<int>(o.graphs);
    const int progress = static_cast<int>(o.progress);
    const bool valid =
        o.max_model_len >= 1 && graphs >= 0 && graphs <= 2 && progress >= 0 && progress <= 4 &&
        AimsValid(o.decode_split_by_rows) && AimsValid(o.decode_split_by_rows_head_dim_128) &&
        (o.prefill_tile_rows == 64 || o.prefill_tile_rows == 128) &&
        o.decode_min_kv_chunk >= 1 && o.decode_ctas_per_sm >= 1 &&
        o.decode_ctas_per_sm <= kMaxCtasPerSm && RowsValid(sharded, kPrefetchGemmMaxRows);
    const absl::Status status = CheckRunnerOptions(o);
    ASSERT_EQ(status.ok(), valid) << "trial " << trial << ": " << status;
    if (status.ok()) {
      ++accepted;
      continue;
    }
    ++refused;
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    const std::string message(status.message());
    // The first bad option, in the order the check runs, is the one named.
    const char* named = nullptr;
    if (o.max_model_len < 1) {
      named = "max_model_len";
    } else if (graphs < 0 || graphs > 2) {
      named = "RunnerOptions::graphs";
    } else if (progress < 0 || progress > 4) {
      named = "RunnerOptions::progress";
    } else if (!AimsValid(o.decode_split_by_rows)) {
      named = "RunnerOptions::decode_split_by_rows[";
    } else if (!AimsValid(o.decode_split_by_rows_head_dim_128)) {
      named = "RunnerOptions::decode_split_by_rows_head_dim_128[";
    } else if (o.prefill_tile_rows != 64 && o.prefill_tile_rows != 128) {
      named = "prefill_tile_rows";
    } else if (o.decode_min_kv_chunk < 1 || o.decode_ctas_per_sm < 1 ||
               o.decode_ctas_per_sm > kMaxCtasPerSm) {
      named = "decode_ctas_per_sm";
    } else {
      named = "sharded_prefetch_gemm_rows";
    }
    EXPECT_THAT(message, HasSubstr(named)) << "trial " << trial;
    // Capitalised or starting with the option's name, no final period.
    EXPECT_NE(message.back(), '.') << message;
  }
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(refused, 1000);
}

// Seeded sweep of CheckLlamaModelOptions over the shapes the Runner builds (and one with a QKV
// bias, one with few KV heads): GEMM row limits, CTAs per SM, TMA splits, layer_kernel_rows,
// rope_in_attention rows, skinny rows, KV blocks and block sizes at 0, negative, powers of two ± 1
// and the int extremes. Refusals are InvalidArgument naming the option; acceptances lie in the
// documented ranges, and their KV pools fit 64 bits.
TEST(RunnerConfigTest, CheckLlamaModelOptionsSweep) {
  LlamaShape biased = LlamaShape::Llama1B();
  biased.qkv_bias = true;
  LlamaShape eight_b = LlamaShape::Llama1B();
  eight_b.head_dim = 128;
  eight_b.heads = 16;
  eight_b.hidden = 2048;
  const std::vector<LlamaShape> shapes = {LlamaShape::Tiny(), LlamaShape::Llama1B(), biased,
                                          eight_b};
  std::mt19937 rng(7);
  int accepted = 0, refused = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const LlamaShape& s = shapes[rng() % shapes.size()];
    if (!s.Validate().ok()) continue;
    LlamaModelOptions o;
    o.num_kv_blocks = rng() % 2 ? Adversarial(rng) : 1 + static_cast<int>(rng() % 4096);
    o.block_size = Maybe(rng, rng() % 2 ? 16 : 64, 10);
    o.skinny_gemm_max_rows = Maybe(rng, o.skinny_gemm_max_rows, 10);
    o.prefetch_gemm_ctas_per_sm = Maybe(rng, o.prefetch_gemm_ctas_per_sm, 10);
    o.tma_gemm_ctas_per_sm = Maybe(rng, o.tma_gemm_ctas_per_sm, 10);
    o.layer_kernel_rows = Maybe(rng, rng() % 2 ? 0 : 2, 10);
    o.rope_in_attention_rows = Maybe(rng, o.rope_in_attention_rows, 10);
    o.rope_in_attention_min_rows = Maybe(rng, o.rope_in_attention_min_rows, 10);
    std::vector<int*> rows = {&o.prefetch_gemm_rows.qkv,    &o.prefetch_gemm_rows.o,
                              &o.prefetch_gemm_rows.gate_up, &o.prefetch_gemm_rows.down,
                              &o.prefetch_gemm_rows.lm_head, &o.tma_gemm_rows.qkv,
                              &o.tma_gemm_rows.o,            &o.tma_gemm_rows.gate_up,
                              &o.tma_gemm_rows.down,         &o.decode_gemm_rows.qkv,
                              &o.decode_gemm_rows.o,         &o.decode_gemm_rows.gate_up,
                              &o.decode_gemm_rows.down,      &o.decode_gemm_rows.lm_head,
                              &o.tma_gemm_max_splits.qkv,    &o.tma_gemm_max_splits.qkv_at_32_rows,
                              &o.tma_gemm_max_splits.o,      &o.tma_gemm_max_splits.gate_up,
                              &o.tma_gemm_max_splits.down};
    for (int* field : rows) {
      if (rng() % 40 == 0) *field = Adversarial(rng);
    }
    const absl::Status status = CheckLlamaModelOptions(s, o);
    if (!status.ok()) {
      ++refused;
      ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      const std::string message(status.message());
      EXPECT_TRUE(absl::StrContains(message, "rows") || absl::StrContains(message, "ctas") ||
                  absl::StrContains(message, "splits") ||
                  absl::StrContains(message, "num_kv_blocks") ||
                  absl::StrContains(message, "num_blocks") ||
                  absl::StrContains(message, "block_size") ||
                  absl::StrContains(message, "KV layout"))
          << message;
      EXPECT_NE(message.back(), '.') << message;
      continue;
    }
    ++accepted;
    auto in = [](int v, int lo, int hi) { return v >= lo && v <= hi; };
    const PrefetchGemmRows& p = o.prefetch_gemm_rows;
    const TmaGemmRows& t = o.tma_gemm_rows;
    const DecodeGemmRows& d = o.decode_gemm_rows;
    const TmaGemmSplits& sp = o.tma_gemm_max_splits;
    for (int v : {p.qkv, p.o, p.gate_up, p.down, p.lm_head}) {
      EXPECT_TRUE(in(v, 0, kPrefetchGemmMaxRows)) << v;
    }
    for (int v : {t.qkv, t.o, t.gate_up, t.down}) EXPECT_TRUE(in(v, 0, kTmaGemmMaxRows)) << v;
    for (int v : {d.qkv, d.o, d.gate_up, d.down, d.lm_head}) {
      EXPECT_TRUE(in(v, 0, kDecodeGemmMaxRows)) << v;
    }
    for (int v : {sp.qkv, sp.qkv_at_32_rows, sp.o, sp.gate_up, sp.down}) {
      EXPECT_TRUE(in(v, 1, kTmaGemmMaxSplits)) << v;
    }
    EXPECT_TRUE(in(o.skinny_gemm_max_rows, 0, kSkinnyGemmMaxRows));
    EXPECT_TRUE(in(o.prefetch_gemm_ctas_per_sm, 1, 2));
    EXPECT_TRUE(in(o.tma_gemm_ctas_per_sm, 1, 2));
    EXPECT_TRUE(in(o.layer_kernel_rows, 0, kDecodeLayerMaxRows));
    if (s.qkv_bias || s.qk_norm) {
      EXPECT_EQ(o.layer_kernel_rows, 0);
    }
    EXPECT_GE(o.rope_in_attention_rows, 0);
    EXPECT_GE(o.rope_in_attention_min_rows, 1);
    EXPECT_GE(o.num_kv_blocks, 1);
    EXPECT_GE(o.block_size, 16);
    EXPECT_EQ(o.block_size & (o.block_size - 1), 0);
    // K and V pools of every layer, computed without wrapping: within int64.
    const long double bytes = 2.0L * s.layers * s.kv_heads * s.head_dim * 2.0L *
                              static_cast<long double>(o.block_size) * o.num_kv_blocks;
    EXPECT_LT(bytes, 9.3e18L) << o.num_kv_blocks << " blocks of " << o.block_size;
  }
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(refused, 1000);
}

// Seeded sweep of what a server's config names and sizes, through ResolvePlannerConfig and
// CheckRunnerModel: model presets by odd names (empty, cased, padded, a path, a NUL, 64 KiB
// long), max_num_seqs and max_model_len at the int extremes and powers of two ± 1, unknown KV
// cache dtypes and sliding windows. Never a crash; a refusal names its option; an acceptance
// takes at most kGreedySampleMaxRows sequences, a bf16 KV cache and no window shorter than
// max_model_len.
TEST(RunnerConfigTest, CheckRunnerModelSweep) {
  const std::vector<std::string> names = {
      "llama-3.2-1b", "llama-3.1-8b", "qwen3-4b", "mistral-7b-v0.3", "", "LLAMA-3.2-1B",
      "llama-3.2-1b ", " llama-3.2-1b", "../llama-3.2-1b", std::string("llama\0-3.2-1b", 14),
      std::string(65536, 'x'), "llama-3.2-1b\n"};
  std::mt19937 rng(11);
  int accepted = 0, refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    config::PlannerConfig c = OneBillion();
    const std::string& name = names[rng() % names.size()];
    c.set_model_preset(name);
    if (rng() % 2) c.set_max_num_seqs(Adversarial(rng));
    // DType is an open (proto3) enum: 5..7 are values no release names.
    if (rng() % 4 == 0) c.set_kv_cache_dtype(static_cast<config::DType>(rng() % 8));
    if (rng() % 4 == 0) c.mutable_model()->set_sliding_window(Adversarial(rng));
    const int max_model_len = Maybe(rng, 4096);
    absl::StatusOr<config::PlannerConfig> resolved = ResolvePlannerConfig(c);
    if (!resolved.ok()) {
      ++refused;
      EXPECT_NE(resolved.status().code(), absl::StatusCode::kInternal) << resolved.status();
      continue;
    }
    absl::StatusOr<LlamaShape> shape = CheckRunnerModel(*resolved, max_model_len);
    if (!shape.ok()) {
      ++refused;
      ASSERT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument) << shape.status();
      const std::string message(shape.status().message());
      EXPECT_TRUE(absl::StrContains(message, "max_num_seqs") ||
                  absl::StrContains(message, "kv_cache_dtype") ||
                  absl::StrContains(message, "sliding window"))
          << message;
      continue;
    }
    ++accepted;
    EXPECT_LE(resolved->max_num_seqs(), kGreedySampleMaxRows);
    EXPECT_EQ(resolved->kv_cache_dtype(), config::DTYPE_BF16);
    if (resolved->model().has_sliding_window()) {
      EXPECT_LE(max_model_len, resolved->model().sliding_window());
    }
    EXPECT_TRUE(shape->Validate().ok());
  }
  EXPECT_GT(accepted, 300);
  EXPECT_GT(refused, 300);
}

// The setup step_host_benchmark measures by default: the default decode sizes (1, 2, 4, 8..128
// step 8, 144..256 step 16), every batch of 1..256 decode sequences routed to the smallest that
// holds it (what the benchmark prints as its key), and per key the planner and layout of the
// model's heads, the GPU's SMs and the Runner's split rules.
TEST(RunnerConfigTest, BuildStepSetupBuildsTheBenchmarksKeysPlannersAndLayouts) {
  absl::StatusOr<StepSetupInputs> in = BenchmarkStepSetupInputs();
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_EQ(in->resolved.max_num_seqs(), 256);
  ASSERT_EQ(in->sm_count, 132);
  ASSERT_EQ(in->max_blocks_per_seq, 64);  // 4096 tokens in blocks of 64
  absl::StatusOr<StepSetup> setup = BuildStepSetup(*in);
  ASSERT_TRUE(setup.ok()) << setup.status();

  std::vector<int> decode = {1, 2, 4};
  for (int size = 8; size <= 128; size += 8) decode.push_back(size);
  for (int size = 144; size <= 256; size += 16) decode.push_back(size);
  ASSERT_TRUE(setup->decode_sizes.has_value() && setup->prefill_sizes.has_value());
  EXPECT_EQ(setup->decode_sizes->sizes(), decode);
  EXPECT_EQ(setup->prefill_sizes->sizes(),
            CaptureSizes::DefaultPrefillSizes(
                std::min(512, static_cast<int>(in->resolved.max_num_batched_tokens()))));
  const StepKeys& keys = setup->keys;
  ASSERT_EQ(keys.keys().size(), decode.size() + setup->prefill_sizes->sizes().size() + 1);
  for (int batch = 1; batch <= 256; ++batch) {
    const std::vector<SeqLens> lens(batch, SeqLens{1, 1024});
    ASSERT_TRUE(keys.Check(lens).ok()) << "batch " << batch;
    const StepRoute route = keys.Route(lens);
    const int padded = *std::lower_bound(decode.begin(), decode.end(), batch);
    EXPECT_EQ(KeyName(keys.key(route.key_index).key), absl::StrCat("decode/", padded))
        << "batch " << batch;
    EXPECT_EQ(route.num_rows, padded) << "batch " << batch;
  }

  ASSERT_EQ(setup->planners.size(), keys.keys().size());
  ASSERT_EQ(setup->layouts.size(), keys.keys().size());
  for (size_t i = 0; i < keys.keys().size(); ++i) {
    const StepKey& key = keys.keys()[i];
    SCOPED_TRACE(KeyName(key.key));
    const SplitKvPlannerOptions& planner = setup->planners[i].options();
    EXPECT_EQ(planner.num_q_heads, 32);
    EXPECT_EQ(planner.num_kv_heads, 8);
    EXPECT_EQ(planner.head_dim, 64);
    EXPECT_EQ(planner.sm_count, 132);
    EXPECT_EQ(planner.key.max_seqs, key.max_rows);
    EXPECT_EQ(planner.key.max_tokens, key.max_tokens);
    EXPECT_EQ(planner.key.max_kv_len, 4096);
    EXPECT_EQ(planner.decode.tile_rows, key.decode_part ? 4 : 0);  // 32 / 8 query heads
    EXPECT_EQ(planner.prefill.tile_rows, key.prefill_part ? 64 : 0);
    EXPECT_EQ(planner.decode.min_kv_chunk, 64);
    const MetadataLayout& layout = setup->layouts[i];
    EXPECT_EQ(layout.max_tokens, key.max_tokens);
    EXPECT_EQ(layout.max_rows, key.max_rows);
    EXPECT_EQ(layout.max_blocks_per_seq, 64);
    // The plan section holds the key's planner's blob (sections are 256-byte aligned).
    const size_t plan_bytes = setup->planners[i].layout().plan_bytes;
    EXPECT_EQ(layout.block_table - layout.plan, (plan_bytes + 255) / 256 * 256);
    EXPECT_EQ(layout.bytes, MetadataLayout::Create(key, plan_bytes, 64).bytes);
  }
  // The 1B model's split rules ({7, 2}, {8, 4}, {24, 1}, then 2): decode/8 takes batches of 5..8
  // and aims at 4 CTAs per SM, decode/16 (9..16) at 1, decode/32 (25..32) at 2.
  auto decode_ctas = [&](int size) {
    return setup->planners[keys.Find({GraphMode::kDecode, size})].options().decode.ctas_per_sm;
  };
  EXPECT_EQ(decode_ctas(8), 4);
  EXPECT_EQ(decode_ctas(16), 1);
  EXPECT_EQ(decode_ctas(32), 2);
}

// In GRAPH_MODE_PREFILL_ONLY the config's capture sizes are the prefill budgets and the decode
// sizes the default list; in GRAPH_MODE_DECODE RunnerOptions::prefill_sizes are the budgets.
TEST(RunnerConfigTest, BuildStepSetupFollowsTheGraphMode) {
  absl::StatusOr<StepSetupInputs> in = BenchmarkStepSetupInputs();
  ASSERT_TRUE(in.ok()) << in.status();
  StepSetupInputs prefill_only = *in;
  prefill_only.resolved.mutable_graph()->set_mode(config::GRAPH_MODE_PREFILL_ONLY);
  prefill_only.resolved.mutable_graph()->clear_capture_sizes();
  for (int size : {32, 96}) prefill_only.resolved.mutable_graph()->add_capture_sizes(size);
  absl::StatusOr<StepSetup> setup = BuildStepSetup(prefill_only);
  ASSERT_TRUE(setup.ok()) << setup.status();
  EXPECT_EQ(setup->prefill_sizes->sizes(), std::vector<int>({32, 96}));
  EXPECT_EQ(setup->decode_sizes->sizes(), CaptureSizes::DefaultDecodeSizes(256));

  StepSetupInputs listed = *in;
  listed.options.prefill_sizes = {48, 128};
  setup = BuildStepSetup(listed);
  ASSERT_TRUE(setup.ok()) << setup.status();
  EXPECT_EQ(setup->prefill_sizes->sizes(), std::vector<int>({48, 128}));
  EXPECT_NE(setup->keys.Find({GraphMode::kPrefill, 48}), -1);
}

// Each refusal is InvalidArgument naming the bad value and the way out.
TEST(RunnerConfigTest, BuildStepSetupRefusesBadInputs) {
  absl::StatusOr<StepSetupInputs> in = BenchmarkStepSetupInputs();
  ASSERT_TRUE(in.ok()) << in.status();
  auto refusal = [](const StepSetupInputs& bad) {
    const absl::Status status = BuildStepSetup(bad).status();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    return std::string(status.message());
  };
  StepSetupInputs bad = *in;
  bad.resolved.mutable_graph()->clear_capture_sizes();
  for (int size : {8, 300}) bad.resolved.mutable_graph()->add_capture_sizes(size);
  EXPECT_THAT(refusal(bad),
              HasSubstr("Capture size 300 exceeds max_num_seqs 256; remove it or raise "
                        "max_num_seqs"));
  bad = *in;
  bad.options.prefill_sizes = {64, 64};
  EXPECT_THAT(refusal(bad), HasSubstr("Capture size 64 appears more than once"));
  bad = *in;
  bad.sm_count = 0;
  EXPECT_THAT(refusal(bad), HasSubstr("Planner sm_count 0 must be positive"));
  bad = *in;
  bad.shape.kv_heads = 0;
  EXPECT_THAT(refusal(bad), HasSubstr("Planner num_q_heads 32 and num_kv_heads 0"));
  for (int blocks : {0, -1}) {
    bad = *in;
    bad.max_blocks_per_seq = blocks;
    EXPECT_THAT(refusal(bad),
                HasSubstr(absl::StrCat("max_blocks_per_seq ", blocks,
                                       " must be positive; pass the SequenceTable's")));
  }
}

}  // namespace
}  // namespace kiln
