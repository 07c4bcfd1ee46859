#include "runtime/memory/memory_planner.h"

#include <cstdint>
#include <limits>
#include <string>

#include "attention/split_kv_planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/config/presets.h"

namespace kiln {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

config::ModelShape Preset(const char* name) {
  auto shape = ModelPreset(name);
  EXPECT_TRUE(shape.ok()) << shape.status();
  return *shape;
}

// Returns the attention plan blob of the eager key (256 sequences, 8192 tokens, KV up to 4096) at
// the Runner's options, rounded up to the metadata blob's 256-byte sections.
int64_t EagerPlanBytes(int heads, int kv_heads, int head_dim, int sm_count) {
  SplitKvPlannerOptions o;
  o.num_q_heads = heads;
  o.num_kv_heads = kv_heads;
  o.head_dim = head_dim;
  o.sm_count = sm_count;
  o.key = {256, 8192, 4096};
  o.decode.tile_rows = heads / kv_heads;
  o.prefill.tile_rows = 64;
  auto planner = SplitKvPlanner::Create(o);
  EXPECT_TRUE(planner.ok()) << planner.status();
  return planner.ok() ? (static_cast<int64_t>(planner->layout().plan_bytes) + 255) / 256 * 256 : 0;
}

MemoryPlan PlanOrDie(const config::PlannerConfig& config) {
  auto plan = PlanMemory(config);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : MemoryPlan{};
}

// Parameter counts by hand from the published shapes (they match the models' published sizes:
// 8.03 B, 1.24 B, 70.6 B, 7.62 B).
TEST(MemoryPlannerTest, WeightParamsMatchHandCounts) {
  // Llama-3.1-8B: embedding + 32 × (QKV + O + gate-up + down + norms) + final norm + lm head.
  const int64_t l8 =
      128256LL * 4096 +
      32 * (4096LL * 6144 + 4096LL * 4096 + 4096LL * 28672 + 14336LL * 4096 + 2 * 4096) + 4096 +
      128256LL * 4096;
  EXPECT_EQ(l8, 8030261248);
  EXPECT_EQ(WeightParamsPerRank(Preset("llama-3.1-8b"), 1), l8);

  // Llama-3.2-1B ties the lm head to the embedding.
  const int64_t l1 =
      128256LL * 2048 +
      16 * (2048LL * 3072 + 2048LL * 2048 + 2048LL * 16384 + 8192LL * 2048 + 2 * 2048) + 2048;
  EXPECT_EQ(l1, 1235814400);
  EXPECT_EQ(WeightParamsPerRank(Preset("llama-3.2-1b"), 1), l1);

  EXPECT_EQ(WeightParamsPerRank(Preset("llama-3.1-70b"), 1), 70553706496);

  // Qwen2.5-7B has a bias on QKV: (28 + 2 × 4) × 128 per layer.
  const int64_t q7 =
      152064LL * 3584 +
      28 * (3584LL * 4608 + 4608 + 3584LL * 3584 + 3584LL * 37888 + 18944LL * 3584 + 2 * 3584) +
      3584 + 152064LL * 3584;
  EXPECT_EQ(q7, 7615616512);
  EXPECT_EQ(WeightParamsPerRank(Preset("qwen2.5-7b"), 1), q7);
}

TEST(MemoryPlannerTest, TensorParallelShardsWeights) {
  // Llama-3.1-70B over 4 ranks: 16 query heads and 2 KV heads, 7168 MLP, and the whole
  // 128256-row embedding and LM head (replicated) each.
  const int64_t per_layer =
      8192LL * (16 + 4) * 128 + 16LL * 128 * 8192 + 8192LL * 2 * 7168 + 7168LL * 8192 + 2 * 8192;
  const int64_t rank = 128256LL * 8192 + 80 * per_layer + 8192 + 128256LL * 8192;
  EXPECT_EQ(rank, 19215425536);
  EXPECT_EQ(WeightParamsPerRank(Preset("llama-3.1-70b"), 4), rank);
}

TEST(MemoryPlannerTest, KvBytesPerToken) {
  // Llama-3.1-8B in bf16: 2 × 32 layers × 8 KV heads × 128 × 2 B = 128 KiB per token.
  EXPECT_EQ(KvBytesPerToken(Preset("llama-3.1-8b"), config::DTYPE_BF16, 1), 128 * 1024);
  EXPECT_EQ(KvBytesPerToken(Preset("llama-3.1-8b"), config::DTYPE_FP8_E4M3, 1), 64 * 1024);
  EXPECT_EQ(KvBytesPerToken(Preset("llama-3.2-1b"), config::DTYPE_BF16, 1), 2 * 16 * 8 * 64 * 2);
  // 70B over 4 ranks: 2 KV heads each. Over 16 ranks (more ranks than KV heads): replicated, 1.
  EXPECT_EQ(KvHeadsPerRank(Preset("llama-3.1-70b"), 4), 2);
  EXPECT_EQ(KvBytesPerToken(Preset("llama-3.1-70b"), config::DTYPE_BF16, 4), 2 * 80 * 2 * 128 * 2);
  EXPECT_EQ(KvHeadsPerRank(Preset("llama-3.1-70b"), 16), 1);
}

TEST(MemoryPlannerTest, ActivationBytesPerTokenFollowsTheModel) {
  // 3 × hidden (residual, O/down output, normed) + QKV + attention output + 3 × ffn, in bf16.
  EXPECT_EQ(ActivationBytesPerToken(Preset("llama-3.1-8b"), 1),
            (3 * 4096 + 48 * 128 + 32 * 128 + 3 * 14336) * 2);
  EXPECT_EQ(ActivationBytesPerToken(Preset("llama-3.1-8b"), 2),
            (3 * 4096 + 24 * 128 + 16 * 128 + 3 * 7168) * 2);
}

// Pins the mirror of LlamaModel::ActivationBytes (runtime/model/llama_model.cc, Offsets): nine
// 256-byte aligned sections, then num_rows hidden-wide rows and min(num_tokens, 8) hidden-wide
// rows (the residual between the QKV and gate-up GEMMs where they fold the norms). The figures
// are what the Runner allocated on an H200 for the 1B model (runtime/runner/NOTES.md) before
// that last section (32 KiB): a 561 MiB eager arena (562 MiB in 2 MiB steps) for 8192 tokens
// and 256 sequences, and a 36.0 MiB graph pool, the 512-token prefill key's activations. Change
// this test and the model together.
TEST(MemoryPlannerTest, ActivationLayoutMatchesTheModel) {
  const config::ModelShape m = Preset("llama-3.2-1b");
  auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / kMiB; };
  //                      residual, O/down, normed  QKV       attention  gate-up    SiLU       last
  EXPECT_EQ(ActivationArenaBytes(m, 1, 8192, 256),
            3 * 8192 * 2048 * 2 + 8192 * 3072 * 2 + 8192 * 2048 * 2 + 8192 * 16384 * 2 +
                8192 * 8192 * 2 + 256 * 2048 * 2 + 8 * 2048 * 2);  // ... mid residual
  constexpr double kMidResidualMiB = 8 * 2048 * 2 / 1048576.0;
  EXPECT_EQ(mib(ActivationArenaBytes(m, 1, 8192, 256)), 561.0 + kMidResidualMiB);
  EXPECT_EQ(mib(ActivationArenaBytes(m, 1, 512, 256)), 36.0 + kMidResidualMiB);  // prefill/512
  EXPECT_EQ(mib(ActivationArenaBytes(m, 1, 256, 256)), 18.5 + kMidResidualMiB);  // decode/256
  // Fewer token rows than the fold's most: as many mid-residual rows as tokens.
  EXPECT_EQ(ActivationArenaBytes(m, 1, 3, 3),
            3 * 3 * 2048 * 2 + 3 * 3072 * 2 + 3 * 2048 * 2 + 3 * 16384 * 2 + 3 * 8192 * 2 +
                3 * 2048 * 2 + 3 * 2048 * 2);
  // Each section is aligned on its own: with a 100-wide hidden and MLP, one token's 200 B rows
  // round up to 256 B (QKV and attention output, 3072 and 2048 wide, are aligned already).
  config::ModelShape odd = m;
  odd.set_hidden_size(100);
  odd.set_intermediate_size(100);
  EXPECT_EQ(ActivationArenaBytes(odd, 1, 1, 1), 3 * 256 + 6144 + 4096 + 512 + 256 + 256 + 256);
}

// The Runner's step keys (runtime/runner/step_plan.cc, StepKeys::Create) in each graph mode.
TEST(MemoryPlannerTest, StepKeysFollowTheRunner) {
  auto keys_of = [](const config::PlannerConfig& config) {
    auto resolved = ResolvePlannerConfig(config);
    EXPECT_TRUE(resolved.ok()) << resolved.status();
    auto keys = PlanStepKeys(*resolved);
    EXPECT_TRUE(keys.ok()) << keys.status();
    return keys.ok() ? *keys : std::vector<PlannedStepKey>{};
  };
  auto count = [](const std::vector<PlannedStepKey>& keys, GraphMode mode, bool captured) {
    int n = 0;
    for (const PlannedStepKey& k : keys) n += k.key.mode == mode && k.captured == captured;
    return n;
  };
  config::PlannerConfig config = DefaultPlannerConfig();
  std::vector<PlannedStepKey> keys = keys_of(config);
  ASSERT_EQ(keys.size(), 27u + 14u + 1u);
  EXPECT_EQ(count(keys, GraphMode::kDecode, true), 27);
  EXPECT_EQ(count(keys, GraphMode::kPrefill, true), 14);
  const PlannedStepKey& prefill512 = keys[27 + 13];
  EXPECT_EQ(prefill512.key, (CaptureKey{GraphMode::kPrefill, 512}));
  EXPECT_EQ(prefill512.max_tokens, 512);
  EXPECT_EQ(prefill512.max_rows, 256);  // min(tokens, max_num_seqs)
  EXPECT_EQ(keys[27].max_rows, 16);     // prefill/16
  const PlannedStepKey& eager = keys.back();
  EXPECT_EQ(eager.key, (CaptureKey{GraphMode::kMixed, 8192}));
  EXPECT_EQ(eager.max_rows, 256);
  EXPECT_FALSE(eager.captured);
  // Decode keys run one attention part and its merge; the others both parts and both merges.
  EXPECT_EQ(keys[0].attention_kernels_per_layer, 2);
  EXPECT_EQ(prefill512.attention_kernels_per_layer, 4);

  // Without prefill capture the prefill keys remain (batches with a prompt pad to them).
  config.mutable_graph()->set_capture_prefill(false);
  keys = keys_of(config);
  EXPECT_EQ(count(keys, GraphMode::kPrefill, false), 14);
  EXPECT_EQ(count(keys, GraphMode::kDecode, true), 27);

  // Prefill-only graphs: the token budgets are captured, the default decode keys only pad.
  config = DefaultPlannerConfig();
  config.mutable_graph()->set_mode(config::GRAPH_MODE_PREFILL_ONLY);
  keys = keys_of(config);
  EXPECT_EQ(count(keys, GraphMode::kDecode, false), 27);
  EXPECT_EQ(count(keys, GraphMode::kPrefill, true), 14);

  // No graphs: the same keys, none captured.
  config.mutable_graph()->set_mode(config::GRAPH_MODE_NONE);
  keys = keys_of(config);
  EXPECT_EQ(keys.size(), 42u);
  for (const PlannedStepKey& k : keys) EXPECT_FALSE(k.captured) << KeyName(k.key);

  // An unresolved config is refused, not divided by zero.
  EXPECT_EQ(PlanStepKeys(config::PlannerConfig()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The split-kv workspace and the step metadata come from the attention planner's own layout at
// the Runner's options; the 1B on an H200 (132 SMs): ceil(2 × 132 / 8) = 33 slots per part, decode
// tiles of G = 4 rows, prefill tiles of 64 rows, head_dim 64. On the GPU the Runner's five buffers
// took 8 MiB, the 2 MiB steps cudaMemGetInfo moves in (runtime/runner/NOTES.md).
TEST(MemoryPlannerTest, AttentionWorkspaceIsThePlannersLayout) {
  config::PlannerConfig config = DefaultPlannerConfig();
  config.set_model_preset("llama-3.2-1b");
  config.set_gpu_preset("h200");
  MemoryPlan plan = PlanOrDie(config);
  const int64_t decode = 33 * 8 * 4 * (64 + 1) * 4;
  const int64_t prefill = 33 * 8 * 64 * (64 + 1) * 4;

  // The eager key's metadata is the largest: token ids and positions (8192 each), last-token
  // rows (256), its plan, and a block table of 256 rows × 4096 / 64 blocks.
  const int64_t metadata = 2 * 8192 * 4 + 256 * 4 + EagerPlanBytes(32, 8, 64, 132) + 256 * 64 * 4;
  EXPECT_EQ(plan.step_keys.back().metadata_bytes, metadata);
  EXPECT_EQ(plan.Find("attention_workspace")->bytes, decode + prefill + metadata);
  EXPECT_LT(plan.Find("attention_workspace")->bytes, 5 * kMiB);

  // A longer max_model_len widens only the block table; KV no longer than a chunk never splits.
  config.set_max_model_len(8192);
  EXPECT_EQ(PlanOrDie(config).Find("attention_workspace")->bytes,
            decode + prefill + metadata + 256 * 64 * 4);
  config.set_max_model_len(256);
  MemoryPlan unsplit = PlanOrDie(config);
  EXPECT_EQ(unsplit.Find("attention_workspace")->bytes, unsplit.step_keys.back().metadata_bytes);
  EXPECT_EQ(unsplit.step_keys.front().attention_kernels_per_layer, 1);  // no merge
}

// The default configuration, every term by hand.
TEST(MemoryPlannerTest, DefaultPlanByHand) {
  MemoryPlan plan = PlanOrDie(DefaultPlannerConfig());
  const int64_t total = 81559 * kMiB;
  const int64_t budget = 76968728985;  // floor(0.9 × 85520809984)
  EXPECT_EQ(plan.total_bytes, total);
  EXPECT_EQ(plan.budget_bytes, budget);

  const int64_t per_token = (3 * 4096 + 48 * 128 + 32 * 128 + 3 * 14336) * 2;  // 131072
  const int64_t weights = 8030261248LL * 2;
  // The eager key: 8192 tokens, 256 rows, and 8 rows of the residual between the QKV and gate-up
  // GEMMs (where they fold the norms).
  const int64_t mid_residual = 8 * 4096 * 2;
  const int64_t arena = 8192 * per_token + 256 * 4096 * 2 + mid_residual;
  // 33 = ceil(2 × 132 SMs / 8 KV heads) split slots per part, decode rows G = 4, prefill rows 64,
  // and the eager key's step metadata: token ids, positions, last-token rows, plan, block table.
  const int64_t partials = 33 * 8LL * (4 + 64) * (128 + 1) * 4;
  const int64_t metadata = 2 * 8192 * 4 + 256 * 4 + EagerPlanBytes(32, 8, 128, 132) + 256 * 64 * 4;
  const int64_t attention = partials + metadata;
  // prefill/512, the largest captured key.
  const int64_t pool = 512 * per_token + 256 * 4096 * 2 + mid_residual;
  // 27 decode graphs of 32 × (9 + 2) + 6 nodes, 14 prefill graphs of 32 × (9 + 4) + 6.
  const int64_t executables = 41 * 128 * 1024 + (27 * 358 + 14 * 422) * 3072LL;
  const int64_t workspace = 32 * kMiB;
  const int64_t logits = 256LL * (128256 + 1) * 4;
  const int64_t margin = 1024 * kMiB;
  EXPECT_EQ(plan.num_graphs, 41);
  EXPECT_EQ(plan.num_graph_nodes, 27 * 358 + 14 * 422);
  ASSERT_NE(plan.Find("weights"), nullptr);
  EXPECT_EQ(plan.Find("weights")->bytes, weights);
  EXPECT_EQ(plan.Find("activation_arena")->bytes, arena);
  EXPECT_EQ(plan.Find("attention_workspace")->bytes, attention);
  EXPECT_EQ(plan.Find("graph_pool")->bytes, pool);
  EXPECT_EQ(plan.Find("graph_executables")->bytes, executables);
  EXPECT_EQ(plan.Find("custom_allreduce")->bytes, 0);
  EXPECT_EQ(plan.Find("nccl")->bytes, 0);
  EXPECT_EQ(plan.Find("cublaslt_workspace")->bytes, workspace);
  EXPECT_EQ(plan.Find("logits")->bytes, logits);
  EXPECT_EQ(plan.Find("margin")->bytes, margin);

  const int64_t reserved =
      weights + arena + attention + pool + executables + workspace + logits + margin;
  EXPECT_EQ(plan.reserved_bytes, reserved);
  const int64_t block = 128 * 1024 * 64;
  EXPECT_EQ(plan.kv_block_bytes, block);
  EXPECT_EQ(plan.num_kv_blocks, (budget - reserved) / block);
  EXPECT_EQ(plan.num_kv_blocks, 6969);
  EXPECT_EQ(plan.KvTokens(), 6969 * 64);
  EXPECT_EQ(plan.MaxConcurrency(8192), 6969 / 128);
  EXPECT_EQ(plan.MaxConcurrency(8193), 6969 / 129);
  EXPECT_EQ(plan.MaxConcurrency(1), 6969);
  EXPECT_EQ(plan.MaxConcurrency(0), 0);
  // A context longer than any cache holds no sequence (its block count must not wrap negative).
  EXPECT_EQ(plan.MaxConcurrency(std::numeric_limits<int64_t>::max()), 0);
  EXPECT_EQ(plan.Find("kv_cache")->bytes, 6969 * block);
  EXPECT_EQ(plan.Find("unused")->bytes, budget - reserved - 6969 * block);
  EXPECT_LT(plan.Find("unused")->bytes, block);
}

TEST(MemoryPlannerTest, TermsSumToTheBudgetAndEachIsExplained) {
  for (int tp : {1, 2, 4, 8}) {
    config::PlannerConfig config = DefaultPlannerConfig();
    config.set_model_preset("llama-3.1-70b");
    config.set_gpu_preset("h200-141gb");
    config.set_tensor_parallel_size(tp);
    auto plan = PlanMemory(config);
    if (tp == 1) {
      // 131 GiB of weights do not fit in 0.9 of one H200.
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
      continue;
    }
    ASSERT_TRUE(plan.ok()) << plan.status();
    int64_t sum = 0;
    for (const MemoryTerm& t : plan->terms) {
      sum += t.bytes;
      EXPECT_FALSE(t.explanation.empty()) << t.name;
      EXPECT_EQ(t.explanation.find('\n'), std::string::npos) << t.name;
      EXPECT_GE(t.bytes, 0) << t.name;
    }
    EXPECT_EQ(sum, plan->budget_bytes) << "tp " << tp;
    EXPECT_GT(plan->Find("nccl")->bytes, 0);
    EXPECT_GT(plan->Find("custom_allreduce")->bytes, 0);
  }
}

TEST(MemoryPlannerTest, GraphPoolIsCountedOnceHoweverManySizes) {
  const config::ModelShape m = Preset("llama-3.1-8b");
  for (bool capture_prefill : {false, true}) {
    config::PlannerConfig one = DefaultPlannerConfig();
    one.mutable_graph()->add_capture_sizes(256);
    one.mutable_graph()->set_capture_prefill(capture_prefill);
    config::PlannerConfig many = DefaultPlannerConfig();  // 27 sizes up to 256
    many.mutable_graph()->set_capture_prefill(capture_prefill);
    MemoryPlan a = PlanOrDie(one);
    MemoryPlan b = PlanOrDie(many);
    EXPECT_EQ(a.config.graph().capture_sizes_size(), 1);
    EXPECT_EQ(b.config.graph().capture_sizes_size(), 27);
    EXPECT_EQ(a.Find("graph_pool")->bytes, b.Find("graph_pool")->bytes);
    // The largest captured key: prefill/512 (512 tokens, 256 rows), else decode/256.
    EXPECT_EQ(b.Find("graph_pool")->bytes, capture_prefill ? ActivationArenaBytes(m, 1, 512, 256)
                                                           : ActivationArenaBytes(m, 1, 256, 256));
    // Only the executables scale with the number of graphs: 26 decode graphs more.
    EXPECT_EQ(b.num_graphs - a.num_graphs, 26);
    EXPECT_EQ(b.Find("graph_executables")->bytes - a.Find("graph_executables")->bytes,
              26 * (128 * 1024 + (32 * 11 + 6) * 3072LL));
  }
}

TEST(MemoryPlannerTest, MoreUtilizationNeverFewerBlocks) {
  for (const char* model : {"llama-3.2-1b", "llama-3.1-8b", "qwen2.5-7b"}) {
    int64_t previous = 0;
    for (int percent = 30; percent <= 100; ++percent) {
      config::PlannerConfig config = DefaultPlannerConfig();
      config.set_model_preset(model);
      config.set_gpu_memory_utilization(percent / 100.0);
      auto plan = PlanMemory(config);
      const int64_t blocks = plan.ok() ? plan->num_kv_blocks : 0;
      EXPECT_GE(blocks, previous) << model << " at " << percent << "%";
      previous = blocks;
    }
    EXPECT_GT(previous, 0) << model;
  }
}

TEST(MemoryPlannerTest, MoreCaptureSizesNeverMoreBlocks) {
  const std::vector<int> all = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256};
  const std::vector<int> all_prefill = {16, 32, 64, 128, 256, 384, 512, 1024, 2048};
  // Growing a list one size at a time, smallest first and largest first: the decode sizes, and
  // the prefill budgets captured beside them.
  for (bool prefill : {false, true}) {
    const std::vector<int>& sizes = prefill ? all_prefill : all;
    for (bool largest_first : {false, true}) {
      config::PlannerConfig none = DefaultPlannerConfig();
      none.mutable_graph()->set_mode(config::GRAPH_MODE_NONE);
      int64_t previous = PlanOrDie(none).num_kv_blocks;
      config::PlannerConfig config = DefaultPlannerConfig();
      if (prefill) {
        // No prefill graphs at first (a given prefill list replaces the default one).
        config.mutable_graph()->set_capture_prefill(false);
        config.mutable_graph()->add_capture_sizes(1);
        const int64_t blocks = PlanOrDie(config).num_kv_blocks;
        EXPECT_LE(blocks, previous);
        previous = blocks;
      }
      for (size_t i = 0; i < sizes.size(); ++i) {
        const int size = largest_first ? sizes[sizes.size() - 1 - i] : sizes[i];
        if (prefill) {
          config.mutable_graph()->set_capture_prefill(true);
          config.mutable_graph()->add_prefill_sizes(size);
        } else {
          config.mutable_graph()->add_capture_sizes(size);
        }
        const int64_t blocks = PlanOrDie(config).num_kv_blocks;
        EXPECT_LE(blocks, previous) << "with " << i + 1 << (prefill ? " prefill" : "") << " sizes";
        previous = blocks;
      }
    }
  }
}

TEST(MemoryPlannerTest, TensorParallelAddsCollectivesAndShrinksPerRankWeights) {
  config::PlannerConfig config = DefaultPlannerConfig();
  MemoryPlan one = PlanOrDie(config);
  config.set_tensor_parallel_size(2);
  MemoryPlan two = PlanOrDie(config);
  EXPECT_EQ(one.Find("nccl")->bytes, 0);
  EXPECT_EQ(two.Find("nccl")->bytes, 400 * kMiB);
  EXPECT_EQ(two.Find("custom_allreduce")->bytes, 16 * kMiB + 2 * 2 * 512 * 1024);
  EXPECT_LT(two.Find("weights")->bytes, one.Find("weights")->bytes);
  EXPECT_EQ(two.kv_bytes_per_token * 2, one.kv_bytes_per_token);
  // With TP each graph has two all-reduces per layer (the LM head is replicated: no gather).
  EXPECT_EQ(GraphNodesOutsideAttention(Preset("llama-3.1-8b"), 1), 32 * 9 + 6);
  EXPECT_EQ(GraphNodesOutsideAttention(Preset("llama-3.1-8b"), 2), 32 * 11 + 6);
}

TEST(MemoryPlannerTest, CalibrationReplacesEstimates) {
  config::PlannerConfig config = DefaultPlannerConfig();
  config.mutable_calibration()->set_activation_bytes_per_token(100000);
  config.mutable_calibration()->set_graph_bytes_per_graph(50000);
  config.mutable_calibration()->set_graph_bytes_per_node(1000);
  config.mutable_calibration()->set_margin_bytes(12345);
  config.mutable_calibration()->set_cublaslt_workspace_bytes(4 * kMiB);
  MemoryPlan plan = PlanOrDie(config);
  EXPECT_EQ(plan.Find("activation_arena")->bytes, 8192 * 100000LL);
  EXPECT_EQ(plan.Find("graph_pool")->bytes, 512 * 100000LL);  // prefill/512
  EXPECT_EQ(plan.Find("graph_executables")->bytes,
            41 * 50000LL + (27 * 358 + 14 * 422) * 1000LL);
  EXPECT_EQ(plan.Find("margin")->bytes, 12345);
  EXPECT_EQ(plan.Find("cublaslt_workspace")->bytes, 4 * kMiB);
  EXPECT_THAT(plan.Find("margin")->explanation, HasSubstr("(calibrated)"));
  EXPECT_THAT(plan.Find("graph_executables")->explanation, HasSubstr("(calibrated)"));
  EXPECT_THAT(plan.Find("activation_arena")->explanation, HasSubstr("(calibrated)"));
  EXPECT_THAT(plan.Find("graph_pool")->explanation,
              HasSubstr("512 tokens x 97.7 KiB (calibrated)"));
}

TEST(MemoryPlannerTest, GraphModes) {
  config::PlannerConfig none = DefaultPlannerConfig();
  none.mutable_graph()->set_mode(config::GRAPH_MODE_NONE);
  none.mutable_graph()->add_capture_sizes(8);  // ignored without graphs
  none.mutable_graph()->add_prefill_sizes(64);
  none.mutable_graph()->set_execution(config::GRAPH_EXECUTION_PIECEWISE);
  MemoryPlan plan = PlanOrDie(none);
  EXPECT_EQ(plan.Find("graph_pool")->bytes, 0);
  EXPECT_EQ(plan.Find("graph_executables")->bytes, 0);
  EXPECT_EQ(plan.num_graphs, 0);
  EXPECT_EQ(plan.config.graph().capture_sizes_size(), 0);
  EXPECT_EQ(plan.config.graph().prefill_sizes_size(), 0);
  EXPECT_FALSE(plan.config.graph().has_execution());

  config::PlannerConfig prefill = DefaultPlannerConfig();
  prefill.mutable_graph()->set_mode(config::GRAPH_MODE_PREFILL_ONLY);
  plan = PlanOrDie(prefill);
  // Token counts up to 512 by default (not max_num_seqs); no decode graphs.
  EXPECT_EQ(plan.config.graph().max_capture_size(), 512);
  EXPECT_EQ(plan.num_graphs, 14);
  EXPECT_FALSE(plan.config.graph().has_capture_prefill());
  EXPECT_EQ(plan.Find("graph_pool")->bytes,
            ActivationArenaBytes(plan.config.model(), 1, 512, 256));

  // Decode graphs: the prefill budgets are captured too unless capture_prefill is false.
  config::PlannerConfig decode = DefaultPlannerConfig();
  plan = PlanOrDie(decode);
  EXPECT_EQ(plan.config.graph().execution(), config::GRAPH_EXECUTION_FULL);
  EXPECT_TRUE(plan.config.graph().capture_prefill());
  EXPECT_EQ(plan.config.graph().prefill_sizes_size(), 14);
  EXPECT_EQ(plan.config.graph().prefill_sizes(13), 512);
  EXPECT_EQ(plan.num_graphs, 41);
  decode.mutable_graph()->set_capture_prefill(false);
  EXPECT_EQ(PlanOrDie(decode).num_graphs, 27);
  decode.mutable_graph()->set_capture_prefill(true);
  for (int s : {64, 128}) decode.mutable_graph()->add_prefill_sizes(s);
  plan = PlanOrDie(decode);
  EXPECT_EQ(plan.num_graphs, 29);
  EXPECT_EQ(plan.Find("graph_pool")->bytes,
            ActivationArenaBytes(plan.config.model(), 1, 256, 256));  // decode/256 is largest now
}

// Piecewise graphs: layers + 1 per captured key, attention (and its merge) run eagerly between
// them, activations stay in the eager arena. The 1B's 41 keys make 697 graphs (measured: 94 MiB).
TEST(MemoryPlannerTest, PiecewiseGraphsHaveNoPoolAndOneGraphPerPiece) {
  config::PlannerConfig config = DefaultPlannerConfig();
  config.set_model_preset("llama-3.2-1b");
  config.set_gpu_preset("h200");
  MemoryPlan full = PlanOrDie(config);
  config.mutable_graph()->set_execution(config::GRAPH_EXECUTION_PIECEWISE);
  MemoryPlan piecewise = PlanOrDie(config);
  EXPECT_EQ(piecewise.num_graphs, 41 * 17);
  EXPECT_EQ(piecewise.num_graph_nodes, 41 * (16 * 9 + 6));
  EXPECT_EQ(piecewise.Find("graph_pool")->bytes, 0);
  EXPECT_EQ(piecewise.Find("graph_executables")->bytes,
            41 * 17 * 128 * 1024 + 41 * (16 * 9 + 6) * 3072LL);
  EXPECT_EQ(piecewise.Find("activation_arena")->bytes, full.Find("activation_arena")->bytes);
  EXPECT_EQ(full.Find("graph_pool")->bytes, 36 * kMiB + 8 * 2048 * 2);  // + the mid residual
}

TEST(MemoryPlannerTest, MaxCaptureSizeCropsLikeFastDeploy) {
  config::PlannerConfig config = DefaultPlannerConfig();
  config.mutable_graph()->set_max_capture_size(100);
  MemoryPlan plan = PlanOrDie(config);
  EXPECT_EQ(plan.config.graph().capture_sizes_size(), 3 + 12 + 1);  // 1, 2, 4, 8..96, 100
  EXPECT_EQ(plan.config.graph().max_capture_size(), 100);

  // A given list: sizes above max_capture_size are dropped, not reported.
  for (int s : {1, 64, 128, 512}) config.mutable_graph()->add_capture_sizes(s);
  plan = PlanOrDie(config);
  EXPECT_EQ(plan.config.graph().capture_sizes_size(), 2);
  EXPECT_EQ(plan.config.graph().max_capture_size(), 64);
}

TEST(MemoryPlannerTest, ResolveIsIdempotent) {
  for (const char* mode : {"decode", "prefill", "none", "piecewise"}) {
    config::PlannerConfig config = DefaultPlannerConfig();
    config.set_tensor_parallel_size(2);
    if (std::string(mode) == "piecewise") {
      config.mutable_graph()->set_execution(config::GRAPH_EXECUTION_PIECEWISE);
      for (int s : {512, 64}) config.mutable_graph()->add_prefill_sizes(s);
    } else if (std::string(mode) == "prefill") {
      config.mutable_graph()->set_mode(config::GRAPH_MODE_PREFILL_ONLY);
    } else if (std::string(mode) == "none") {
      config.mutable_graph()->set_mode(config::GRAPH_MODE_NONE);
    }
    auto once = ResolvePlannerConfig(config);
    ASSERT_TRUE(once.ok()) << once.status();
    auto twice = ResolvePlannerConfig(*once);
    ASSERT_TRUE(twice.ok()) << twice.status();
    EXPECT_EQ(once->SerializeAsString(), twice->SerializeAsString()) << mode;
  }
}

absl::Status PlanStatus(const config::PlannerConfig& config) { return PlanMemory(config).status(); }

TEST(MemoryPlannerTest, BadInputsNameTheValueAndTheFix) {
  config::PlannerConfig c = DefaultPlannerConfig();
  c.set_gpu_memory_utilization(0);
  EXPECT_EQ(PlanStatus(c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("gpu_memory_utilization 0 is outside (0, 1]"));
  c.set_gpu_memory_utilization(1.01);
  EXPECT_THAT(std::string(PlanStatus(c).message()), HasSubstr("1.01 is outside (0, 1]"));

  c = DefaultPlannerConfig();
  c.mutable_model()->set_num_layers(0);
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("model.num_layers must be positive, got 0; set it (--num_layers)"));

  c = DefaultPlannerConfig();
  c.clear_model_preset();
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("model.hidden_size is not set; set it (--hidden_size) or pick a model "
                        "preset"));

  c = DefaultPlannerConfig();
  c.set_model_preset("llama-9");
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("Unknown model preset \"llama-9\"; use one of llama-3.2-1b"));

  c = DefaultPlannerConfig();
  c.set_gpu_preset("auto");
  EXPECT_THAT(std::string(PlanStatus(c).message()), HasSubstr("needs a device query"));

  c = DefaultPlannerConfig();
  c.mutable_model()->set_num_kv_heads(5);
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("model.num_heads 32 is not a multiple of model.num_kv_heads 5"));

  c = DefaultPlannerConfig();
  c.set_tensor_parallel_size(3);
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("model.num_heads 32 does not split over tensor_parallel_size 3"));

  c = DefaultPlannerConfig();
  c.set_max_num_batched_tokens(128);
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("max_num_batched_tokens 128 is below max_num_seqs 256"));

  // Open enums: a textproto may give a number no value names.
  c = DefaultPlannerConfig();
  c.mutable_graph()->set_mode(static_cast<config::GraphMode>(7));
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("graph.mode 7 is not a graph mode; use GRAPH_MODE_DECODE"));
  c = DefaultPlannerConfig();
  c.mutable_graph()->set_execution(static_cast<config::GraphExecution>(9));
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("graph.execution 9 is not a graph execution"));

  c = DefaultPlannerConfig();
  c.mutable_graph()->add_capture_sizes(300);
  EXPECT_EQ(std::string(PlanStatus(c).message()),
            "Capture size 300 exceeds max_num_seqs 256; remove it or raise max_num_seqs");

  // Absurd values are rejected before any product could overflow.
  c = DefaultPlannerConfig();
  c.mutable_model()->set_hidden_size(2000000000);
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("model.hidden_size 2000000000 is above 1048576"));
  c = DefaultPlannerConfig();
  c.mutable_calibration()->set_graph_bytes_per_node(uint64_t{1} << 62);
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("calibration.graph_bytes_per_node 4611686018427387904 is above"));
  c = DefaultPlannerConfig();
  c.set_max_num_seqs(2000000000);
  c.set_max_num_batched_tokens(2000000000);
  EXPECT_THAT(std::string(PlanStatus(c).message()), HasSubstr("max_num_seqs 2000000000 is above"));

  c = DefaultPlannerConfig();
  c.set_block_size(0);
  EXPECT_THAT(std::string(PlanStatus(c).message()), HasSubstr("block_size must be positive"));

  c = DefaultPlannerConfig();
  c.set_max_model_len(0);
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("max_model_len must be positive, got 0; set --max_model_len"));

  c = DefaultPlannerConfig();
  c.mutable_graph()->add_prefill_sizes(10000);
  EXPECT_EQ(std::string(PlanStatus(c).message()),
            "Capture size 10000 exceeds max_num_batched_tokens 8192; remove it or raise "
            "max_num_batched_tokens");

  c = DefaultPlannerConfig();
  c.mutable_graph()->set_mode(config::GRAPH_MODE_PREFILL_ONLY);
  c.mutable_graph()->add_prefill_sizes(64);
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("graph.prefill_sizes is for GRAPH_MODE_DECODE"));

  c = DefaultPlannerConfig();
  c.set_max_num_seqs(100000);
  c.set_max_num_batched_tokens(100000);
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("max_num_seqs 100000 is above 65536, the largest limit graph sizes are "
                        "padded to"));

  // The fix that message gives works: listed sizes under that limit plan.
  c.mutable_graph()->add_capture_sizes(1);
  c.mutable_graph()->add_capture_sizes(8);
  c.set_model_preset("llama-3.2-1b");
  c.set_gpu_preset("h200-141gb");
  absl::StatusOr<MemoryPlan> listed = PlanMemory(c);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->config.graph().max_capture_size(), 8);

  // So do explicit prefill budgets under a long-context token budget above 65536.
  c = DefaultPlannerConfig();
  c.set_max_num_batched_tokens(131072);
  c.mutable_graph()->add_prefill_sizes(16);
  c.mutable_graph()->add_prefill_sizes(64);
  absl::StatusOr<MemoryPlan> long_context = PlanMemory(c);
  ASSERT_TRUE(long_context.ok()) << long_context.status();
  EXPECT_THAT(long_context->config.graph().prefill_sizes(), ElementsAre(16, 64));

  // The attention kernels take at most 64 query heads per KV head in a prefill tile.
  c = DefaultPlannerConfig();
  c.mutable_model()->set_num_heads(256);
  c.mutable_model()->set_num_kv_heads(2);
  c.mutable_model()->set_head_dim(16);
  EXPECT_EQ(PlanStatus(c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(PlanStatus(c).message()),
              HasSubstr("kiln's attention cannot plan step key prefill/16 of this model: "
                        "Planner prefill.tile_rows 64 is below the 128 query heads per KV head"));
}

TEST(MemoryPlannerTest, NoKvBlockIsResourceExhaustedWithTheFix) {
  config::PlannerConfig c = DefaultPlannerConfig();
  c.set_model_preset("llama-3.1-70b");
  absl::Status status = PlanStatus(c);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()), HasSubstr("The budget leaves no room for a KV block"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("largest term: weights 131.42 GiB"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("raise tensor_parallel_size"));

  // Exactly one block fits when the budget is the reserved bytes plus one block.
  MemoryPlan base = PlanOrDie(DefaultPlannerConfig());
  c = DefaultPlannerConfig();
  c.clear_gpu_preset();
  c.mutable_gpu()->set_total_bytes(base.reserved_bytes + base.kv_block_bytes);
  c.mutable_gpu()->set_sm_count(132);
  c.set_gpu_memory_utilization(1.0);
  auto one = PlanMemory(c);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->num_kv_blocks, 1);
  c.mutable_gpu()->set_total_bytes(base.reserved_bytes + base.kv_block_bytes - 1);
  EXPECT_EQ(PlanStatus(c).code(), absl::StatusCode::kResourceExhausted);
}

TEST(MemoryPlannerTest, LargestAcceptedInputsDoNotOverflow) {
  config::PlannerConfig c;
  config::ModelShape* m = c.mutable_model();
  m->set_hidden_size(1 << 20);
  m->set_intermediate_size(1 << 20);
  m->set_num_layers(1 << 12);
  m->set_num_heads(1 << 12);
  m->set_num_kv_heads(1 << 12);
  m->set_head_dim(1 << 12);
  m->set_vocab_size(1 << 24);
  m->set_dtype(config::DTYPE_FP32);
  m->set_attention_bias(true);
  c.mutable_gpu()->set_total_bytes(uint64_t{1} << 50);
  c.mutable_gpu()->set_sm_count(1 << 16);
  c.set_gpu_memory_utilization(1.0);
  c.set_max_num_seqs(1 << 20);
  c.set_max_num_batched_tokens(1 << 24);
  c.set_block_size(1 << 16);
  c.mutable_graph()->set_mode(config::GRAPH_MODE_PREFILL_ONLY);
  c.mutable_calibration()->set_activation_bytes_per_token(uint64_t{1} << 30);
  c.mutable_calibration()->set_graph_bytes_per_node(uint64_t{1} << 20);
  c.mutable_calibration()->set_nccl_bytes(uint64_t{1} << 40);
  c.mutable_calibration()->set_margin_bytes(uint64_t{1} << 40);
  absl::Status status = PlanStatus(c);
  // Weights alone are ~2^60 bytes: no block fits, and the shortfall is reported, not wrapped.
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()), HasSubstr("largest term: weights"));
  EXPECT_THAT(std::string(status.message()), HasSubstr(" reserved = -"));
}

TEST(MemoryPlannerTest, ChangedPresetsSaySo) {
  config::PlannerConfig c = DefaultPlannerConfig();
  c.mutable_model()->set_rope_theta(10000.0);  // does not change memory: still the preset
  auto same = ResolvePlannerConfig(c);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->model().name(), "Llama-3.1-8B");
  c.mutable_model()->mutable_rope_scaling()->set_factor(16.0);  // nor does the RoPE scaling
  auto rescaled = ResolvePlannerConfig(c);
  ASSERT_TRUE(rescaled.ok()) << rescaled.status();
  EXPECT_EQ(rescaled->model().name(), "Llama-3.1-8B");
  EXPECT_EQ(rescaled->model().rope_scaling().factor(), 16.0);
  EXPECT_EQ(rescaled->model().rope_scaling().original_max_position_embeddings(), 8192);
  c.mutable_model()->set_num_layers(16);
  c.mutable_gpu()->set_sm_count(114);
  auto changed = ResolvePlannerConfig(c);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(changed->model().name(), "Llama-3.1-8B (modified)");
  EXPECT_EQ(changed->model().num_layers(), 16);
  EXPECT_EQ(changed->model().hidden_size(), 4096);
  EXPECT_EQ(changed->gpu().name(), "NVIDIA H100 80GB HBM3 (modified)");
  EXPECT_EQ(ResolvePlannerConfig(*changed)->model().name(), "Llama-3.1-8B (modified)");
}

TEST(MemoryPlannerTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(128 * 1024), "128.0 KiB");
  EXPECT_EQ(FormatBytes(32 * kMiB), "32.0 MiB");
  EXPECT_EQ(FormatBytes(16060522496), "14.96 GiB");
  EXPECT_EQ(FormatBytes(-2 * kMiB), "-2.0 MiB");
}

}  // namespace
}  // namespace kiln
