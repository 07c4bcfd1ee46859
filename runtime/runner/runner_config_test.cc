// Host test: the memory planner is asked about the graphs the Runner will really capture.
#include "gtest/gtest.h"
#include "runtime/config/presets.h"
#include "runtime/memory/memory_planner.h"
#include "runtime/runner/runner.h"

namespace kiln {
namespace {

config::PlannerConfig OneBillion() {
  config::PlannerConfig config = DefaultPlannerConfig();
  config.set_model_preset("llama-3.2-1b");
  config.set_gpu_preset("h200-141gb");
  return config;
}

TEST(RunnerConfigTest, ModelShapeRoundTripsThroughTheConfig) {
  for (const LlamaShape& shape : {LlamaShape::Tiny(), LlamaShape::Llama1B()}) {
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
    EXPECT_EQ(back->rope_theta, shape.rope_theta);
    EXPECT_EQ(back->rms_eps, shape.rms_eps);
  }
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
