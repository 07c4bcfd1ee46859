// Host test: the model shape the Runner builds from a config, and the memory planner is asked
// about the graphs the Runner will really capture.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/config/presets.h"
#include "runtime/memory/memory_planner.h"
#include "runtime/model/llama_model.h"
#include "runtime/runner/runner.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

config::PlannerConfig OneBillion() {
  config::PlannerConfig config = DefaultPlannerConfig();
  config.set_model_preset("llama-3.2-1b");
  config.set_gpu_preset("h200-141gb");
  return config;
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
              HasSubstr("Model 9s: Decode attention has no kernel for 36 query heads over 4 KV "
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
            "Model Mistral-7B-v0.1 attends over a sliding window of its last 4096 tokens, which "
            "kiln's attention does not implement; up to 4096 tokens full attention computes the "
            "same: set max_model_len (8192) to at most 4096");
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

}  // namespace
}  // namespace kiln
