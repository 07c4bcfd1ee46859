#include "runtime/memory/memory_planner.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

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
              HasSubstr("model.num_heads 256 and model.num_kv_heads 2 at tensor_parallel_size 1 "
                        "leave 128 query heads per KV head on a rank, above the 64 kiln's "
                        "attention takes"));
  // Over 4 ranks the query heads split (the 2 KV heads replicate): 64 per KV head on a rank.
  c.set_tensor_parallel_size(4);
  EXPECT_NE(PlanStatus(c).code(), absl::StatusCode::kInvalidArgument) << PlanStatus(c);
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

TEST(MemoryPlannerTest, Thousands) {
  EXPECT_EQ(Thousands(0), "0");
  EXPECT_EQ(Thousands(999), "999");
  EXPECT_EQ(Thousands(1000), "1,000");
  EXPECT_EQ(Thousands(128256), "128,256");
  EXPECT_EQ(Thousands(-1234567), "-1,234,567");
  EXPECT_EQ(Thousands(-100), "-100");
  EXPECT_EQ(Thousands(std::numeric_limits<int64_t>::max()), "9,223,372,036,854,775,807");
  EXPECT_EQ(Thousands(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");
}

// ---------------------------------------------------------------------------------------------
// Sweeps: random and adversarial configs, each result checked against the planner's documented
// invariants, computed here independently (in 128 bits where a product could be large).

using int128 = __int128;

constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr uint64_t kUint64Max = std::numeric_limits<uint64_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

// The terms of every plan, in order (memory_planner.h, MemoryPlan::terms).
const std::vector<std::string>& TermNames() {
  static const auto* names =
      new std::vector<std::string>{"weights",    "activation_arena",   "attention_workspace",
                                   "graph_pool", "graph_executables",  "custom_allreduce",
                                   "nccl",       "cublaslt_workspace", "logits",
                                   "margin",     "kv_cache",           "unused"};
  return *names;
}

// Checks an accepted plan against what the header promises, independently of how it was built.
void ExpectPlanInvariants(const config::PlannerConfig& input, const MemoryPlan& plan,
                          std::mt19937& rng) {
  const config::PlannerConfig& c = plan.config;
  const config::ModelShape& m = c.model();
  const int tp = c.tensor_parallel_size();
  SCOPED_TRACE(input.ShortDebugString());

  // The resolved config is in range, and resolving it again changes nothing.
  const double u = c.gpu_memory_utilization();
  ASSERT_TRUE(u > 0.0 && u <= 1.0) << u;
  for (int64_t v :
       {int64_t{m.hidden_size()}, int64_t{m.num_layers()}, int64_t{m.num_heads()},
        int64_t{m.num_kv_heads()}, int64_t{m.head_dim()}, int64_t{m.intermediate_size()},
        int64_t{m.vocab_size()}, int64_t{c.max_num_seqs()}, int64_t{c.max_num_batched_tokens()},
        int64_t{c.block_size()}, int64_t{c.max_model_len()}, int64_t{tp},
        int64_t{c.gpu().sm_count()}}) {
    ASSERT_GE(v, 1);
  }
  ASSERT_GE(c.max_num_batched_tokens(), c.max_num_seqs());
  ASSERT_EQ(m.num_heads() % tp, 0);
  ASSERT_EQ(m.num_heads() % m.num_kv_heads(), 0);
  ASSERT_GT(DTypeBytes(m.dtype()), 0);
  ASSERT_GT(DTypeBytes(c.kv_cache_dtype()), 0);
  absl::StatusOr<config::PlannerConfig> again = ResolvePlannerConfig(c);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->SerializeAsString(), c.SerializeAsString());
  const config::GraphConfig& g = c.graph();
  if (g.mode() == config::GRAPH_MODE_NONE) {
    ASSERT_EQ(g.capture_sizes_size(), 0);
  } else {
    ASSERT_GT(g.capture_sizes_size(), 0);
    const int limit =
        g.mode() == config::GRAPH_MODE_DECODE ? c.max_num_seqs() : c.max_num_batched_tokens();
    for (int i = 0; i < g.capture_sizes_size(); ++i) {
      ASSERT_GE(g.capture_sizes(i), 1);
      ASSERT_LE(g.capture_sizes(i), limit);
      if (i > 0) {
        ASSERT_LT(g.capture_sizes(i - 1), g.capture_sizes(i));
      }
    }
    ASSERT_EQ(g.max_capture_size(), g.capture_sizes(g.capture_sizes_size() - 1));
  }

  // The budget: floor(total × utilization), the terms in their order, each non-negative, summing
  // to the budget exactly.
  ASSERT_EQ(static_cast<uint64_t>(plan.total_bytes), c.gpu().total_bytes());
  ASSERT_EQ(plan.budget_bytes,
            static_cast<int64_t>(std::floor(static_cast<long double>(plan.total_bytes) * u)));
  ASSERT_EQ(plan.terms.size(), TermNames().size());
  int128 sum = 0, reserved = 0;
  for (size_t i = 0; i < plan.terms.size(); ++i) {
    const MemoryTerm& t = plan.terms[i];
    ASSERT_EQ(t.name, TermNames()[i]);
    ASSERT_GE(t.bytes, 0) << t.name;
    ASSERT_FALSE(t.explanation.empty()) << t.name;
    ASSERT_EQ(t.explanation.find('\n'), std::string::npos) << t.name;
    sum += t.bytes;
    if (i < plan.terms.size() - 2) reserved += t.bytes;
  }
  ASSERT_TRUE(sum == plan.budget_bytes);
  ASSERT_TRUE(reserved == plan.reserved_bytes);

  // The KV cache: the block size by hand, and the largest whole number of blocks that fits.
  const int128 kv_heads = m.num_kv_heads() >= tp ? m.num_kv_heads() / tp : 1;
  const int128 per_token =
      int128{2} * m.num_layers() * kv_heads * m.head_dim() * DTypeBytes(c.kv_cache_dtype());
  ASSERT_TRUE(per_token == plan.kv_bytes_per_token);
  ASSERT_TRUE(per_token * c.block_size() == plan.kv_block_bytes);
  ASSERT_EQ(plan.block_size, c.block_size());
  const int128 rest = int128{plan.budget_bytes} - plan.reserved_bytes;
  ASSERT_GE(plan.num_kv_blocks, 1);
  ASSERT_TRUE(int128{plan.num_kv_blocks} * plan.kv_block_bytes <= rest);
  ASSERT_TRUE((int128{plan.num_kv_blocks} + 1) * plan.kv_block_bytes > rest);  // the largest
  ASSERT_TRUE(plan.Find("kv_cache")->bytes == int128{plan.num_kv_blocks} * plan.kv_block_bytes);
  ASSERT_LT(plan.Find("unused")->bytes, plan.kv_block_bytes);
  ASSERT_TRUE(int128{plan.KvTokens()} == int128{plan.num_kv_blocks} * plan.block_size);

  // Step keys: decode sizes ascending, then prefill budgets ascending, then the eager key.
  ASSERT_FALSE(plan.step_keys.empty());
  const PlannedStepKey& eager = plan.step_keys.back();
  ASSERT_EQ(eager.key.mode, GraphMode::kMixed);
  ASSERT_EQ(eager.max_tokens, c.max_num_batched_tokens());
  ASSERT_EQ(eager.max_rows, c.max_num_seqs());
  ASSERT_FALSE(eager.captured);
  int64_t captured = 0;
  for (size_t i = 0; i < plan.step_keys.size(); ++i) {
    const PlannedStepKey& k = plan.step_keys[i];
    ASSERT_GE(k.max_tokens, 1);
    ASSERT_GE(k.max_rows, 1);
    ASSERT_LE(k.max_rows, k.max_tokens);
    ASSERT_LE(k.max_tokens, c.max_num_batched_tokens());
    ASSERT_LE(k.max_rows, c.max_num_seqs());
    for (int64_t v : {k.activation_bytes, k.metadata_bytes, k.decode_partial_bytes,
                      k.prefill_partial_bytes, int64_t{k.decode_slots}, int64_t{k.prefill_slots},
                      int64_t{k.attention_kernels_per_layer}}) {
      ASSERT_GE(v, 0) << KeyName(k.key);
    }
    ASSERT_GE(k.activation_bytes, 1);
    if (i > 0 && k.key.mode == plan.step_keys[i - 1].key.mode) {
      ASSERT_LT(plan.step_keys[i - 1].key.size, k.key.size);
    }
    captured += k.captured ? 1 : 0;
  }
  const bool piecewise = g.execution() == config::GRAPH_EXECUTION_PIECEWISE;
  ASSERT_EQ(plan.num_graphs, captured * (piecewise ? m.num_layers() + 1 : 1));
  ASSERT_GE(plan.num_graph_nodes, 0);
  if (captured == 0) {
    ASSERT_EQ(plan.Find("graph_executables")->bytes, 0);
  }
  ASSERT_EQ(plan.Find("activation_arena")->bytes, eager.activation_bytes);
  ASSERT_EQ(plan.Find("nccl")->bytes > 0, tp > 1 && plan.estimates.nccl_bytes > 0);

  // Concurrency at any context: floor(blocks / ceil(context / block_size)), 0 below 1 token.
  const int64_t contexts[] = {kInt64Min,
                              -1,
                              0,
                              1,
                              plan.block_size - 1,
                              plan.block_size,
                              plan.block_size + 1,
                              plan.KvTokens(),
                              plan.KvTokens() + 1,
                              kInt64Max,
                              std::uniform_int_distribution<int64_t>(1, 1 << 20)(rng)};
  for (int64_t context : contexts) {
    const int128 blocks =
        context < 1 ? 0 : (int128{context} + plan.block_size - 1) / plan.block_size;
    const int128 want = context < 1 ? 0 : plan.num_kv_blocks / blocks;
    ASSERT_TRUE(plan.MaxConcurrency(context) == want) << "context " << context;
  }
}

// Checks a refusal: the code the header gives, and a one-line message, capitalised or starting
// with the field's name, with no final period, that names one of `fields`.
void ExpectRefusal(const absl::Status& status, const std::set<std::string>& fields,
                   const config::PlannerConfig& input) {
  SCOPED_TRACE(input.ShortDebugString());
  const std::string message(status.message());
  ASSERT_FALSE(message.empty());
  ASSERT_EQ(message.find('\n'), std::string::npos) << message;
  ASSERT_NE(message.back(), '.') << message;
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    ASSERT_THAT(message, HasSubstr("The budget leaves no room for a KV block"));
    return;
  }
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  bool named = false;
  for (const std::string& f : fields) named = named || message.find(f) != std::string::npos;
  ASSERT_TRUE(named) << "\"" << message << "\" names none of: " << testing::PrintToString(fields);
}

// A value source for one field: adversarial values at the edges, and plausible ones.
class Values {
 public:
  explicit Values(std::mt19937& rng) : rng_(rng) {}
  int Pick(int hi) { return std::uniform_int_distribution<int>(0, hi)(rng_); }
  bool Coin() { return Pick(1) == 0; }

  // An int32 field bounded by `limit`: mostly plausible, often at an edge.
  int32_t Int(int32_t plausible_max, int64_t limit) {
    const int64_t edges[] = {kInt32Min, kInt32Min + 1, -1,       0, 1, 2, 3, limit - 1, limit,
                             limit + 1, kInt32Max - 1, kInt32Max};
    if (Pick(2) == 0) {
      const int64_t v = edges[Pick(static_cast<int>(std::size(edges)) - 1)];
      return static_cast<int32_t>(std::clamp<int64_t>(v, kInt32Min, kInt32Max));
    }
    return std::uniform_int_distribution<int32_t>(1, plausible_max)(rng_);
  }
  // A power of two up to `max`, or a small multiple of 8: the dimensions real models have.
  int32_t Dim(int log2_max) { return Coin() ? int32_t{1} << Pick(log2_max) : 8 * (1 + Pick(64)); }
  uint64_t Bytes(uint64_t plausible_max, uint64_t limit) {
    const uint64_t edges[] = {0,
                              1,
                              4096,
                              limit - 1,
                              limit,
                              limit + 1,
                              static_cast<uint64_t>(kInt64Max),
                              uint64_t{1} << 63,
                              kUint64Max};
    if (Pick(2) == 0) return edges[Pick(static_cast<int>(std::size(edges)) - 1)];
    return std::uniform_int_distribution<uint64_t>(0, plausible_max)(rng_);
  }
  double Fraction() {
    const double edges[] = {0.0,
                            -0.0,
                            -1.0,
                            1e-300,
                            std::numeric_limits<double>::denorm_min(),
                            1e-3,
                            1.0,
                            std::nextafter(1.0, 2.0),
                            1.5,
                            1e300,
                            std::numeric_limits<double>::quiet_NaN(),
                            -std::numeric_limits<double>::quiet_NaN(),
                            std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity()};
    if (Pick(2) == 0) return edges[Pick(static_cast<int>(std::size(edges)) - 1)];
    return std::uniform_real_distribution<double>(0.3, 1.0)(rng_);
  }
  // A size list: empty, unsorted, with duplicates, zero, negative, above `limit` and 65536.
  std::vector<int> Sizes(int limit) {
    std::vector<int> out;
    const int n = Pick(3) == 0 ? Pick(2) : 1 + Pick(Coin() ? 6 : 60);
    for (int i = 0; i < n; ++i) {
      switch (Pick(12)) {
        case 0:
          out.push_back(Int(8, 65536));
          break;
        case 1:
          if (!out.empty()) out.push_back(out[Pick(static_cast<int>(out.size()) - 1)]);
          break;
        case 2:
          out.push_back(limit == kInt32Max ? limit : limit + 1);
          break;
        default:
          out.push_back(1 + Pick(std::max(1, std::min(limit, 65536)) - 1));
      }
    }
    if (Coin()) {  // often valid: unique
      std::vector<int> unique;
      std::set<int> seen;
      for (int s : out)
        if (seen.insert(s).second) unique.push_back(s);
      out = unique;
    }
    return out;
  }

 private:
  std::mt19937& rng_;
};

// Applies one random mutation to `c`, adding to `fields` the names an error about it may give.
void Mutate(config::PlannerConfig& c, Values& v, std::set<std::string>& fields) {
  config::ModelShape* m = c.mutable_model();
  config::Calibration* cal = c.mutable_calibration();
  config::GraphConfig* g = c.mutable_graph();
  const std::vector<std::string> models = ModelPresetNames();
  const std::vector<std::string> gpus = GpuPresetNames();
  switch (v.Pick(33)) {
    case 0:
      c.set_gpu_memory_utilization(v.Fraction());
      fields.insert("gpu_memory_utilization");
      break;
    case 1:
      m->set_hidden_size(v.Coin() ? v.Dim(13) : v.Int(16384, 1 << 20));
      fields.insert("model.hidden_size");
      break;
    case 2:
      m->set_num_layers(v.Int(128, 1 << 12));
      fields.insert("model.num_layers");
      break;
    case 3:
      m->set_num_heads(v.Coin() ? v.Dim(7) : v.Int(128, 1 << 12));
      fields.insert({"model.num_heads", "query heads"});
      break;
    case 4:
      m->set_num_kv_heads(v.Coin() ? v.Dim(4) : v.Int(64, 1 << 12));
      fields.insert({"model.num_kv_heads", "model.num_heads", "query heads"});
      break;
    case 5:
      m->set_head_dim(v.Coin() ? v.Dim(8) : v.Int(512, 1 << 12));
      fields.insert("model.head_dim");
      break;
    case 6:
      m->set_intermediate_size(v.Coin() ? v.Dim(15) : v.Int(65536, 1 << 20));
      fields.insert("model.intermediate_size");
      break;
    case 7:
      m->set_vocab_size(v.Int(300000, 1 << 24));
      fields.insert("model.vocab_size");
      break;
    case 8:
      m->set_dtype(static_cast<config::DType>(v.Pick(7) - 1));
      fields.insert("model.dtype");
      break;
    case 9:
      m->set_tie_embeddings(v.Coin());
      m->set_attention_bias(v.Coin());
      m->set_qk_norm(v.Coin());
      break;
    case 10:
      c.set_kv_cache_dtype(static_cast<config::DType>(v.Pick(7) - 1));
      fields.insert("kv_cache_dtype");
      break;
    case 11:
      c.mutable_gpu()->set_total_bytes(v.Bytes(uint64_t{200} << 30, uint64_t{1} << 50));
      fields.insert("gpu.total_bytes");
      break;
    case 12:
      c.mutable_gpu()->set_sm_count(v.Int(200, 1 << 16));
      fields.insert("gpu.sm_count");
      break;
    case 13:
      c.set_max_num_seqs(v.Int(1024, 1 << 20));
      fields.insert({"max_num_seqs", "max_num_batched_tokens"});
      break;
    case 14:
      c.set_max_num_batched_tokens(v.Int(32768, 1 << 24));
      fields.insert({"max_num_batched_tokens", "max_num_seqs"});
      break;
    case 15:
      c.set_block_size(v.Coin() ? v.Dim(10) : v.Int(256, 1 << 16));
      fields.insert("block_size");
      break;
    case 16:
      c.set_max_model_len(v.Int(131072, 1 << 24));
      fields.insert("max_model_len");
      break;
    case 17:
      c.set_tensor_parallel_size(v.Coin() ? 1 << v.Pick(6) : v.Int(16, 1 << 12));
      fields.insert({"tensor_parallel_size", "query heads"});
      break;
    case 18:
      g->set_mode(static_cast<config::GraphMode>(v.Pick(6) - 1));
      fields.insert({"graph.mode", "max_num_seqs", "max_num_batched_tokens", "apture size",
                     "graph.prefill_sizes"});
      break;
    case 19:
      g->set_execution(static_cast<config::GraphExecution>(v.Pick(5) - 1));
      fields.insert("graph.execution");
      break;
    case 20: {
      g->clear_capture_sizes();
      for (int s : v.Sizes(c.has_max_num_seqs() ? c.max_num_seqs() : 256)) g->add_capture_sizes(s);
      fields.insert({"apture size", "max_capture_size"});
      break;
    }
    case 21:
      g->set_max_capture_size(v.Int(512, 65536));
      fields.insert({"max_capture_size", "apture size"});
      break;
    case 22:
      g->set_capture_prefill(v.Coin());
      break;
    case 23: {
      g->clear_prefill_sizes();
      for (int s : v.Sizes(512)) g->add_prefill_sizes(s);
      fields.insert({"apture size", "graph.prefill_sizes"});
      break;
    }
    case 24:
      cal->set_activation_bytes_per_token(v.Bytes(1 << 20, uint64_t{1} << 30));
      fields.insert("calibration.activation_bytes_per_token");
      break;
    case 25:
      cal->set_graph_bytes_per_graph(v.Bytes(1 << 20, uint64_t{1} << 30));
      fields.insert("calibration.graph_bytes_per_graph");
      break;
    case 26:
      cal->set_graph_bytes_per_node(v.Bytes(8192, uint64_t{1} << 20));
      fields.insert("calibration.graph_bytes_per_node");
      break;
    case 27:
      cal->set_cublaslt_workspace_bytes(v.Bytes(uint64_t{1} << 26, uint64_t{1} << 40));
      fields.insert("calibration.cublaslt_workspace_bytes");
      break;
    case 28:
      cal->set_custom_allreduce_buffer_bytes(v.Bytes(uint64_t{1} << 24, uint64_t{1} << 40));
      fields.insert("calibration.custom_allreduce_buffer_bytes");
      break;
    case 29:
      cal->set_nccl_bytes(v.Bytes(uint64_t{1} << 30, uint64_t{1} << 40));
      fields.insert("calibration.nccl_bytes");
      break;
    case 30:
      cal->set_margin_bytes(v.Bytes(uint64_t{1} << 31, uint64_t{1} << 40));
      fields.insert("calibration.margin_bytes");
      break;
    case 31: {
      const char* odd[] = {"llama-9", "", " llama-3.1-8b", "LLAMA-3.2-1B", "llama-3.2-1b\n"};
      c.set_model_preset(v.Coin() ? models[v.Pick(static_cast<int>(models.size()) - 1)]
                                  : odd[v.Pick(4)]);
      fields.insert("model preset");
      break;
    }
    case 32: {
      const char* odd[] = {"auto", "AUTO", "v100", "", "h100 "};
      c.set_gpu_preset(v.Coin() ? gpus[v.Pick(static_cast<int>(gpus.size()) - 1)] : odd[v.Pick(4)]);
      fields.insert({"GPU preset", "gpu_preset"});
      break;
    }
    default: {  // a field cleared: a preset fills it, a custom shape or GPU then lacks it
      m->clear_hidden_size();
      c.mutable_gpu()->clear_sm_count();
      fields.insert({"model.hidden_size", "gpu.sm_count"});
    }
  }
}

// A small custom model on a small custom GPU, so that many mutations still leave a KV block.
config::PlannerConfig TinyCustomConfig() {
  config::PlannerConfig c;
  config::ModelShape* m = c.mutable_model();
  m->set_hidden_size(256);
  m->set_num_layers(2);
  m->set_num_heads(4);
  m->set_num_kv_heads(2);
  m->set_head_dim(64);
  m->set_intermediate_size(512);
  m->set_vocab_size(1000);
  m->set_dtype(config::DTYPE_FP16);
  c.mutable_gpu()->set_total_bytes(uint64_t{4} << 30);
  c.mutable_gpu()->set_sm_count(8);
  c.set_max_num_seqs(16);
  c.set_max_num_batched_tokens(256);
  c.mutable_calibration()->set_margin_bytes(64 << 20);
  return c;
}

// Random configs (presets, custom shapes, up to four fields changed at random, with values at
// every edge: 0, negative, 1, the bounds and one past them, INT32_MAX, NaN and infinities, huge
// uint64s, bad enums and lists): every accepted plan keeps the invariants, every refusal names a
// changed field, and nothing overflows (run under UBSan).
TEST(MemoryPlannerSweepTest, RandomConfigsKeepTheInvariantsOrNameTheField) {
  std::mt19937 rng(20261127);
  Values v(rng);
  const std::vector<std::string> models = ModelPresetNames();
  const std::vector<std::string> gpus = GpuPresetNames();
  int planned = 0, refused = 0, exhausted = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    config::PlannerConfig c;
    switch (v.Pick(2)) {
      case 0:
        c = DefaultPlannerConfig();
        break;
      case 1:
        c = DefaultPlannerConfig();
        c.set_model_preset(models[v.Pick(static_cast<int>(models.size()) - 1)]);
        c.set_gpu_preset(gpus[v.Pick(static_cast<int>(gpus.size()) - 1)]);
        break;
      default:
        c = TinyCustomConfig();
    }
    std::set<std::string> fields;
    const int mutations = v.Pick(4);
    for (int i = 0; i < mutations; ++i) Mutate(c, v, fields);
    absl::StatusOr<MemoryPlan> plan = PlanMemory(c);
    if (plan.ok()) {
      ++planned;
      ExpectPlanInvariants(c, *plan, rng);
      if (HasFatalFailure()) return;
      // Same input, same plan; and the step keys are what PlanStepKeys gives for it.
      absl::StatusOr<std::vector<PlannedStepKey>> keys = PlanStepKeys(c);
      ASSERT_TRUE(keys.ok()) << keys.status();
      ASSERT_EQ(keys->size(), plan->step_keys.size());
      continue;
    }
    (plan.status().code() == absl::StatusCode::kResourceExhausted ? exhausted : refused) += 1;
    ExpectRefusal(plan.status(), fields, c);
    if (HasFatalFailure()) return;
    // Resolving alone refuses the same input the same way, unless only the budget failed.
    absl::StatusOr<config::PlannerConfig> resolved = ResolvePlannerConfig(c);
    if (plan.status().code() == absl::StatusCode::kResourceExhausted) {
      ASSERT_TRUE(resolved.ok()) << resolved.status();
    } else if (!resolved.ok()) {
      ASSERT_EQ(resolved.status(), plan.status());
      ASSERT_EQ(PlanStepKeys(c).status(), plan.status());
    }
  }
  // Each outcome in earnest (2147, 1685 and 168 at this seed).
  EXPECT_GT(planned, 1000);
  EXPECT_GT(refused, 1000);
  EXPECT_GT(exhausted, 80);
}

// Every field alone at each edge value, the rest the default: a refusal names that very field.
TEST(MemoryPlannerSweepTest, EachFieldAtEachEdgeNamesItself) {
  struct Field {
    const char* name;  // as the message gives it
    std::function<void(config::PlannerConfig&, int64_t)> set;
    int64_t limit;
  };
  const std::vector<Field> fields = {
      {"model.hidden_size", [](auto& c, int64_t x) { c.mutable_model()->set_hidden_size(x); },
       1 << 20},
      {"model.num_layers", [](auto& c, int64_t x) { c.mutable_model()->set_num_layers(x); },
       1 << 12},
      {"model.num_heads", [](auto& c, int64_t x) { c.mutable_model()->set_num_heads(x); }, 1 << 12},
      {"model.num_kv_heads", [](auto& c, int64_t x) { c.mutable_model()->set_num_kv_heads(x); },
       1 << 12},
      {"model.head_dim", [](auto& c, int64_t x) { c.mutable_model()->set_head_dim(x); }, 1 << 12},
      {"model.intermediate_size",
       [](auto& c, int64_t x) { c.mutable_model()->set_intermediate_size(x); }, 1 << 20},
      {"model.vocab_size", [](auto& c, int64_t x) { c.mutable_model()->set_vocab_size(x); },
       1 << 24},
      {"gpu.sm_count", [](auto& c, int64_t x) { c.mutable_gpu()->set_sm_count(x); }, 1 << 16},
      {"max_num_seqs", [](auto& c, int64_t x) { c.set_max_num_seqs(x); }, 1 << 20},
      {"max_num_batched_tokens", [](auto& c, int64_t x) { c.set_max_num_batched_tokens(x); },
       1 << 24},
      {"block_size", [](auto& c, int64_t x) { c.set_block_size(x); }, 1 << 16},
      {"max_model_len", [](auto& c, int64_t x) { c.set_max_model_len(x); }, 1 << 24},
      {"tensor_parallel_size", [](auto& c, int64_t x) { c.set_tensor_parallel_size(x); }, 1 << 12},
      {"graph.max_capture_size",
       [](auto& c, int64_t x) { c.mutable_graph()->set_max_capture_size(x); }, 256},
  };
  int refused = 0;
  for (const Field& f : fields) {
    for (int64_t x :
         {int64_t{kInt32Min}, int64_t{-1}, int64_t{0}, f.limit + 1, int64_t{kInt32Max}}) {
      config::PlannerConfig c = DefaultPlannerConfig();
      f.set(c, x);
      absl::Status status = PlanMemory(c).status();
      ASSERT_FALSE(status.ok()) << f.name << " " << x;
      ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << f.name << " " << x;
      const std::string message(status.message());
      // The field and its value, except where it breaks a relation with another (named too).
      ASSERT_THAT(message, HasSubstr(f.name)) << x;
      ++refused;
    }
  }
  for (uint64_t x : {uint64_t{0}, (uint64_t{1} << 50) + 1, kUint64Max}) {
    config::PlannerConfig c = DefaultPlannerConfig();
    c.mutable_gpu()->set_total_bytes(x);
    ASSERT_THAT(std::string(PlanMemory(c).status().message()), HasSubstr("gpu.total_bytes"));
  }
  for (double u :
       {0.0, -0.0, -1.0, std::nextafter(1.0, 2.0), std::numeric_limits<double>::quiet_NaN(),
        std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
    config::PlannerConfig c = DefaultPlannerConfig();
    c.set_gpu_memory_utilization(u);
    const absl::Status status = PlanMemory(c).status();
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << u;
    ASSERT_THAT(std::string(status.message()), HasSubstr("gpu_memory_utilization"));
    ASSERT_THAT(std::string(status.message()), HasSubstr("is outside (0, 1]"));
  }
  for (int d : {-1, 5, 99}) {
    config::PlannerConfig c = DefaultPlannerConfig();
    c.mutable_model()->set_dtype(static_cast<config::DType>(d));
    ASSERT_THAT(std::string(PlanMemory(c).status().message()),
                HasSubstr("model.dtype is " + std::to_string(d) + ";"));
    c = DefaultPlannerConfig();
    c.set_kv_cache_dtype(static_cast<config::DType>(d));
    ASSERT_THAT(std::string(PlanMemory(c).status().message()),
                HasSubstr("kv_cache_dtype " + std::to_string(d) + " is not a known type"));
  }
  EXPECT_EQ(refused, static_cast<int>(fields.size()) * 5);
}

// Tiny and huge GPUs, with max_model_len against the block size both ways (a block longer than
// any sequence, a sequence of one block, of many): the block count is the largest that fits, or
// the budget is refused with the shortfall.
TEST(MemoryPlannerSweepTest, GpuSizesAndBlockShapes) {
  std::mt19937 rng(5);
  const MemoryPlan base = PlanOrDie(TinyCustomConfig());
  const int64_t floor = base.reserved_bytes;
  int planned = 0, exhausted = 0;
  for (int64_t total :
       {int64_t{1}, int64_t{4096}, floor - 1, floor, floor + 1, floor + (1 << 20), int64_t{1} << 33,
        int64_t{1} << 40, (int64_t{1} << 50) - 1, int64_t{1} << 50}) {
    for (int block_size : {1, 2, 3, 16, 64, 1000, 4096, 65535, 65536}) {
      for (int max_model_len : {1, 2, 63, 64, 65, 4096, 1 << 20, 1 << 24}) {
        config::PlannerConfig c = TinyCustomConfig();
        c.mutable_gpu()->set_total_bytes(static_cast<uint64_t>(std::max<int64_t>(total, 1)));
        c.set_gpu_memory_utilization(1.0);
        c.set_block_size(block_size);
        c.set_max_model_len(max_model_len);
        absl::StatusOr<MemoryPlan> plan = PlanMemory(c);
        if (plan.ok()) {
          ++planned;
          ExpectPlanInvariants(c, *plan, rng);
          if (HasFatalFailure()) return;
        } else {
          ++exhausted;
          ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
        }
      }
    }
  }
  EXPECT_GT(planned, 300);  // 399 and 321 of 720
  EXPECT_GT(exhausted, 200);
}

// Every model preset on every GPU preset at every tensor-parallel size up to 64, in each graph
// mode and execution: a plan that keeps the invariants, no room for a KV block, or a refusal that
// names tensor_parallel_size.
TEST(MemoryPlannerSweepTest, EveryPresetGpuAndParallelism) {
  std::mt19937 rng(9);
  int planned = 0;
  for (const std::string& model : ModelPresetNames()) {
    for (const std::string& gpu : GpuPresetNames()) {
      for (int tp : {1, 2, 3, 4, 8, 16, 64}) {
        for (int mode = 1; mode <= 3; ++mode) {
          config::PlannerConfig c = DefaultPlannerConfig();
          c.set_model_preset(model);
          c.set_gpu_preset(gpu);
          c.set_tensor_parallel_size(tp);
          c.mutable_graph()->set_mode(static_cast<config::GraphMode>(mode));
          c.mutable_graph()->set_execution(mode == 2 ? config::GRAPH_EXECUTION_PIECEWISE
                                                     : config::GRAPH_EXECUTION_FULL);
          c.set_kv_cache_dtype(tp == 8 ? config::DTYPE_FP8_E4M3 : config::DTYPE_UNSPECIFIED);
          absl::StatusOr<MemoryPlan> plan = PlanMemory(c);
          if (plan.ok()) {
            ++planned;
            ExpectPlanInvariants(c, *plan, rng);
            if (HasFatalFailure()) return;
          } else {
            ExpectRefusal(plan.status(), {"tensor_parallel_size"}, c);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
  EXPECT_GT(planned, 300);  // 441 of 672
}

// The public formulas over their whole domain (random shapes inside ResolvePlannerConfig's
// bounds, the bounds themselves included) equal the same formulas in 128 bits, so none of their
// products overflowed; outside the domain they return -1, never undefined behaviour.
TEST(MemoryPlannerSweepTest, FormulasNeverOverflow) {
  std::mt19937 rng(13);
  Values v(rng);
  auto dim = [&](int64_t limit) -> int {
    switch (v.Pick(3)) {
      case 0:
        return 1;
      case 1:
        return static_cast<int>(limit);
      default:
        return std::uniform_int_distribution<int>(1, static_cast<int>(limit))(rng);
    }
  };
  for (int trial = 0; trial < 20000; ++trial) {
    config::ModelShape m;
    m.set_hidden_size(dim(1 << 20));
    m.set_intermediate_size(dim(1 << 20));
    m.set_num_layers(dim(1 << 12));
    m.set_num_heads(dim(1 << 12));
    m.set_num_kv_heads(dim(1 << 12));
    m.set_head_dim(dim(1 << 12));
    m.set_vocab_size(dim(1 << 24));
    m.set_dtype(static_cast<config::DType>(1 + v.Pick(3)));
    m.set_tie_embeddings(v.Coin());
    m.set_attention_bias(v.Coin());
    m.set_qk_norm(v.Coin());
    const int tp = dim(1 << 12);
    const int64_t tokens = v.Coin() ? int64_t{1} << 24 : v.Pick(1 << 24);
    const int64_t rows = v.Coin() ? int64_t{1} << 20 : v.Pick(1 << 20);

    const int128 h = m.hidden_size(), d = m.head_dim(), heads = m.num_heads() / tp;
    const int128 kv = m.num_kv_heads() >= tp ? m.num_kv_heads() / tp : 1;
    const int128 ffn = m.intermediate_size() / tp, vocab = m.vocab_size();
    const int128 qkv = (heads + 2 * kv) * d;
    const int128 layer = h * qkv + (m.attention_bias() ? qkv : 0) + (m.qk_norm() ? 2 * d : 0) +
                         heads * d * h + h * 2 * ffn + ffn * h + 2 * h;
    const int128 params =
        vocab * h + m.num_layers() * layer + h + (m.tie_embeddings() ? 0 : vocab * h);
    ASSERT_TRUE(WeightParamsPerRank(m, tp) == params) << m.ShortDebugString() << " tp " << tp;
    ASSERT_TRUE(params * 4 < kInt64Max);  // the weights term, in the widest dtype
    ASSERT_EQ(KvHeadsPerRank(m, tp), static_cast<int>(kv));
    ASSERT_TRUE(KvBytesPerToken(m, config::DTYPE_FP32, tp) == 2 * m.num_layers() * kv * d * 4);
    const int128 e = m.dtype() == config::DTYPE_FP8_E4M3 ? 2 : DTypeBytes(m.dtype());
    ASSERT_TRUE(ActivationBytesPerToken(m, tp) == (3 * h + qkv + heads * d + 2 * ffn + ffn) * e);
    auto aligned = [](int128 b) { return (b + 255) / 256 * 256; };
    const int128 arena = 3 * aligned(tokens * h * e) + aligned(tokens * qkv * e) +
                         aligned(tokens * heads * d * e) + aligned(tokens * 2 * ffn * e) +
                         aligned(tokens * ffn * e) + aligned(rows * h * e) +
                         aligned(std::min<int64_t>(tokens, 8) * h * e);
    ASSERT_TRUE(ActivationArenaBytes(m, tp, tokens, rows) == arena);
    ASSERT_EQ(GraphNodesOutsideAttention(m, tp), m.num_layers() * (tp > 1 ? 11 : 9) + 6);

    // One field pushed out of the domain: -1.
    config::ModelShape out = m;
    int bad_tp = tp;
    const int32_t wild[] = {kInt32Min, -1, 0, kInt32Max};
    const int32_t x = wild[v.Pick(3)];
    switch (v.Pick(7)) {
      case 0:
        out.set_hidden_size(x);
        break;
      case 1:
        out.set_intermediate_size(x);
        break;
      case 2:
        out.set_num_layers(x);
        break;
      case 3:
        out.set_num_heads(x);
        break;
      case 4:
        out.set_num_kv_heads(x);
        break;
      case 5:
        out.set_head_dim(x);
        break;
      case 6:
        out.set_vocab_size(x);
        break;
      default:
        bad_tp = x;
    }
    ASSERT_EQ(WeightParamsPerRank(out, bad_tp), -1);
    ASSERT_EQ(KvBytesPerToken(out, config::DTYPE_FP32, bad_tp), -1);
    ASSERT_EQ(ActivationBytesPerToken(out, bad_tp), -1);
    ASSERT_EQ(ActivationArenaBytes(out, bad_tp, tokens, rows), -1);
    ASSERT_EQ(GraphNodesOutsideAttention(out, bad_tp), -1);
    ASSERT_EQ(KvHeadsPerRank(out, bad_tp), -1);
    for (int64_t n : {kInt64Min, int64_t{-1}, (int64_t{1} << 24) + 1, kInt64Max}) {
      ASSERT_EQ(ActivationArenaBytes(m, tp, n, 1), -1);
      ASSERT_EQ(ActivationArenaBytes(m, tp, 1, n), -1);
    }
  }
}

// Values a caller may pass anywhere: FormatBytes and DTypeName of anything, EstimatesFor and
// PlanStepKeys of configs that were never resolved.
TEST(MemoryPlannerSweepTest, UnresolvedInputsToEveryFunction) {
  for (int64_t b : {kInt64Min, kInt64Min + 1, int64_t{-1025}, int64_t{0}, int64_t{1023},
                    int64_t{1024}, kInt64Max}) {
    const std::string text = FormatBytes(b);
    EXPECT_FALSE(text.empty()) << b;
    EXPECT_EQ(text[0] == '-', b < 0) << text;
  }
  EXPECT_EQ(FormatBytes(kInt64Min), "-8589934592.00 GiB");
  for (int d = -3; d < 300; ++d) {
    const auto dtype = static_cast<config::DType>(d);
    EXPECT_EQ(DTypeName(dtype) == "unspecified", DTypeBytes(dtype) == 0) << d;
  }

  std::mt19937 rng(17);
  Values v(rng);
  for (int trial = 0; trial < 2000; ++trial) {
    config::PlannerConfig c = v.Coin() ? DefaultPlannerConfig() : TinyCustomConfig();
    std::set<std::string> fields;
    for (int i = v.Pick(4); i >= 0; --i) Mutate(c, v, fields);
    const PlannerEstimates e = EstimatesFor(c);
    for (int64_t x : {e.activation_bytes_per_token, e.graph_bytes_per_graph, e.graph_bytes_per_node,
                      e.cublaslt_workspace_bytes, e.custom_allreduce_buffer_bytes, e.nccl_bytes,
                      e.margin_bytes}) {
      ASSERT_GE(x, 0) << c.calibration().ShortDebugString();
    }
    absl::StatusOr<config::PlannerConfig> resolved = ResolvePlannerConfig(c);
    absl::StatusOr<std::vector<PlannedStepKey>> keys = PlanStepKeys(c);
    if (!resolved.ok()) {
      ASSERT_EQ(keys.status(), resolved.status());
      continue;
    }
    absl::StatusOr<std::vector<PlannedStepKey>> from_resolved = PlanStepKeys(*resolved);
    ASSERT_EQ(keys.ok(), from_resolved.ok());
    if (!keys.ok()) {
      ExpectRefusal(keys.status(), fields, c);
      if (HasFatalFailure()) return;
      continue;
    }
    ASSERT_EQ(keys->size(), from_resolved->size());
    for (size_t i = 0; i < keys->size(); ++i) {
      ASSERT_EQ((*keys)[i].key, (*from_resolved)[i].key);
      ASSERT_EQ((*keys)[i].activation_bytes, (*from_resolved)[i].activation_bytes);
      ASSERT_EQ((*keys)[i].metadata_bytes, (*from_resolved)[i].metadata_bytes);
    }
  }
}

// The largest lists a config can hold: 65536 decode sizes and 65536 prefill budgets, in piecewise
// graphs of the deepest model (2^17 keys, 2^29 graphs): planned or refused, without overflow.
TEST(MemoryPlannerSweepTest, LongestCaptureLists) {
  config::PlannerConfig c = DefaultPlannerConfig();
  c.set_model_preset("llama-3.2-1b");
  c.set_gpu_preset("h200");
  c.set_max_num_seqs(65536);
  c.set_max_num_batched_tokens(65536);
  c.mutable_model()->set_num_layers(1 << 12);
  c.mutable_graph()->set_execution(config::GRAPH_EXECUTION_PIECEWISE);
  c.mutable_calibration()->set_graph_bytes_per_graph(uint64_t{1} << 30);
  c.mutable_calibration()->set_graph_bytes_per_node(uint64_t{1} << 20);
  for (int s = 65536; s >= 1; --s) {
    c.mutable_graph()->add_capture_sizes(s);
    c.mutable_graph()->add_prefill_sizes(s);
  }
  absl::StatusOr<MemoryPlan> plan = PlanMemory(c);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("largest term: graph_executables"));
  // With the graphs and the model at a sane size the same lists plan.
  c.mutable_model()->set_num_layers(2);
  c.clear_calibration();
  c.mutable_graph()->set_execution(config::GRAPH_EXECUTION_FULL);
  c.set_gpu_preset("h200");
  c.clear_gpu();
  c.mutable_gpu()->set_total_bytes(uint64_t{1} << 50);
  std::mt19937 rng(1);
  plan = PlanMemory(c);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_graphs, 2 * 65536);
  ExpectPlanInvariants(c, *plan, rng);
}

}  // namespace
}  // namespace kiln
