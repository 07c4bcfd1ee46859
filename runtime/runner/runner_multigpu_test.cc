// The tensor-parallel Runner, one process per GPU (world size = visible GPUs, or
// $KILN_TEST_WORLD_SIZE), on the tiny two-layer model with 16 query and 8 KV heads (so heads
// split over 2, 4 and 8 ranks; 12 and 6 on a world of 6):
//   - generation at TP=2 and TP=world equals TP=1 of the same seeded model (logits by relative
//     error, tokens where TP=1's top-2 margin is clear) and is bitwise identical on every rank,
//     with the custom all-reduce (auto) and with NCCL only, each path checked by its call counts;
//   - on every rank, a graph equals an eager run of the same key bit for bit, for every captured
//     size, with one-shot all-reduces reading registered graph inputs, and with the fused
//     all-reduce + add + RMSNorm;
//   - the fused all-reduce + add + RMSNorm gives the unfused step's bits (full and piecewise
//     graphs);
//   - a step that would replay graphs before RegisterGraphBuffers() is FailedPrecondition;
//   - a capture that fails on one rank fails Capture() on every rank with the same Status, and
//     every rank drops that key (after registration it runs eagerly everywhere);
//   - ranks that capture in different graph modes fail at their first capture call, at once;
//     so do ranks of which one fails a capture before a captured all-reduce with registered
//     inputs (the others wait in its agreement);
//   - a killed rank ends the others' next step in DeadlineExceeded within a bounded time, with
//     the custom all-reduce and with NCCL alone;
//   - the weights and KV cache each rank allocates are what the memory planner planned per rank;
//   - weights read from a safetensors file give, sharded, the seeded model's bits on every rank;
//   - sharded, the model takes RunnerOptions::sharded_prefetch_gemm_rows, on one GPU
//     prefetch_gemm_rows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/allreduce_config.pb.h"
#include "collectives/testing/multiprocess_test_util.h"
#include "collectives/testing/rank_rig.h"
#include "graph/capture_context.h"
#include "gtest/gtest.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/model/llama_checkpoint.h"
#include "runtime/model/llama_weights.h"
#include "runtime/runner/runner.h"

namespace kiln {
namespace {

using testing::RankContext;
using testing::RunOnEveryGpu;
using testing::SharedSeed;

constexpr int kMaxSeqs = 8;
constexpr int kMaxTokens = 128;
constexpr int kBlockSize = 16;
constexpr int kMaxModelLen = 256;
// Each run is within 1e-2 of the exact model (bf16 activations, runner_gpu_test's tolerance); two
// runs that round differently (TP=world rounds each rank's partial sums) are within twice that.
// Measured on 2 x H200: at most 7.9e-3.
constexpr double kTolerance = 1e-2;
constexpr double kTpTolerance = 2 * kTolerance;

// Tiny, with heads that split over 1, 2, 4 and 8 ranks (group size 2 everywhere). On a world whose
// size is a multiple of 3 (6 GPUs): 12 query heads, 6 KV heads and 768 MLP columns, which split
// over 1, 2 and 6 ranks.
LlamaShape TpTinyShape() {
  LlamaShape s = LlamaShape::Tiny();
  const bool thirds = testing::TestWorldSize() % 3 == 0;
  s.heads = thirds ? 12 : 16;
  s.kv_heads = thirds ? 6 : 8;
  if (thirds) s.ffn = 768;
  return s;
}

config::ModelShape ModelConfig(const LlamaShape& t) {
  return ModelShapeFromLlamaShape(t, "tiny-tp");
}

// `ctx` null: one GPU (device 0). `qwen`: the shape with Qwen2's QKV biases and Qwen3's QK norms.
RunnerOptions TpOptions(uint64_t seed, const AllReduceConfig& allreduce, RankContext* ctx,
                        bool qwen = false) {
  RunnerOptions o;
  LlamaShape shape = TpTinyShape();
  shape.qkv_bias = qwen;  // Qwen2's QKV bias and Qwen3's QK norm together
  shape.qk_norm = qwen;
  *o.config.mutable_model() = ModelConfig(shape);
  o.config.set_max_num_seqs(kMaxSeqs);
  o.config.set_max_num_batched_tokens(kMaxTokens);
  o.config.set_block_size(kBlockSize);
  for (int s : {1, 2, 4, 8}) o.config.mutable_graph()->add_capture_sizes(s);
  o.prefill_sizes = {16, 32, 64};
  o.graphs = GraphExecution::kFull;
  o.max_model_len = kMaxModelLen;
  o.weight_seed = seed;
  o.max_kv_blocks = 256;
  o.progress = CaptureProgress::kQuiet;
  o.allreduce = allreduce;
  if (ctx != nullptr) {
    o.bootstrap = &ctx->bootstrap;
    o.device = ctx->device();
  }
  return o;
}

AllReduceConfig AutoConfig() { return AllReduceConfig(); }

AllReduceConfig NcclOnlyConfig() {
  AllReduceConfig c;
  c.set_enable_custom(false);
  return c;
}

// Graphs' one-shot all-reduces read their peers' registered inputs (no staging copy).
AllReduceConfig RegisteredConfig() {
  AllReduceConfig c;
  c.set_graph_one_shot_registered(true);
  return c;
}

testing::MultiProcessTestOptions Options(int world_size = 0) {
  testing::MultiProcessTestOptions options;
  options.world_size = world_size;
  options.timeout = absl::Seconds(120);
  return options;
}

std::unique_ptr<Runner> MakeRunner(const RunnerOptions& options) {
  absl::StatusOr<std::unique_ptr<Runner>> runner = Runner::Create(options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return nullptr;
  absl::StatusOr<RunnerCaptureSummary> captured = (*runner)->Capture();
  EXPECT_TRUE(captured.ok()) << captured.status();
  return captured.ok() ? *std::move(runner) : nullptr;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  StepInfo info;
};

// Poisons the outputs, runs the step and reads back tokens and logits; every logit must have
// been written (finite).
Outcome RunStep(Runner& runner, const std::vector<SequenceTokens>& batch,
                const StepOptions& options = {}) {
  Outcome out;
  EXPECT_TRUE(runner.PoisonOutputs().ok());
  absl::StatusOr<std::vector<int32_t>> tokens = runner.Step(batch, options);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  if (!tokens.ok()) return out;
  out.tokens = *tokens;
  out.info = runner.last_step();
  absl::StatusOr<std::vector<float>> logits = runner.LastLogits(static_cast<int>(batch.size()));
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (logits.ok()) out.logits = *std::move(logits);
  for (float v : out.logits) {
    if (!std::isfinite(v)) {
      ADD_FAILURE() << "a logit was not written (or is not finite)";
      break;
    }
  }
  return out;
}

std::string Bytes(const std::vector<Outcome>& outcomes) {
  std::string out;
  for (const Outcome& o : outcomes) {
    out.append(reinterpret_cast<const char*>(o.tokens.data()), o.tokens.size() * 4);
    out.append(reinterpret_cast<const char*>(o.logits.data()), o.logits.size() * 4);
  }
  return out;
}

// Expects every rank's `bytes` to be rank 0's. `what` names them in failures and in the
// bootstrap's key, so each call of a test needs its own.
void ExpectSameOnEveryRank(RankContext& ctx, const std::string& bytes, const std::string& what) {
  absl::StatusOr<std::vector<std::string>> all = ctx.bootstrap.AllGather(
      bytes, absl::StrCat("runner_multigpu_test.same_on_every_rank.", what));
  ASSERT_TRUE(all.ok()) << all.status();
  for (int r = 1; r < ctx.world_size; ++r) {
    EXPECT_TRUE((*all)[r] == (*all)[0]) << what << ": rank " << r << " differs from rank 0";
  }
}

// Expects every rank's `outcomes` to be rank 0's, bit for bit.
void ExpectSameOnEveryRank(RankContext& ctx, const std::vector<Outcome>& outcomes,
                           const std::string& what) {
  ExpectSameOnEveryRank(ctx, Bytes(outcomes), what);
}

// One step of the generation script: sequences with a prompt (or chunk), or -1 for "the next
// token of this sequence" (its last sampled token).
struct ScriptStep {
  std::vector<std::pair<int64_t, int>> seqs;  // (id, prompt length or -1 for one decode token)
};

std::vector<ScriptStep> GenerationScript() {
  std::vector<ScriptStep> script;
  // 84 prompt tokens: above every prefill size (the eager key).
  script.push_back({{{0, 5}, {1, 16}, {2, 23}, {3, 40}}});
  for (int t = 0; t < 10; ++t) script.push_back({{{0, -1}, {1, -1}, {2, -1}, {3, -1}}});  // d/4
  for (int t = 0; t < 3; ++t) script.push_back({{{0, -1}, {2, -1}}});                     // d/2
  script.push_back({{{4, 30}}});                                                           // p/32
  for (int t = 0; t < 3; ++t) {
    script.push_back({{{0, -1}, {1, -1}, {2, -1}, {3, -1}, {4, -1}}});  // decode/8
  }
  return script;
}

// Runs the script. Decode inputs are `forced`'s tokens when given (teacher forcing: the same
// inputs as the run that produced them), else the runner's own.
std::vector<Outcome> RunScript(Runner& runner, uint64_t seed,
                               const std::vector<Outcome>* forced) {
  std::mt19937_64 rng(seed ^ 0x5eed);
  std::map<int64_t, int32_t> next;
  std::vector<Outcome> outcomes;
  const std::vector<ScriptStep> script = GenerationScript();
  for (size_t s = 0; s < script.size(); ++s) {
    std::vector<SequenceTokens> batch;
    for (const auto& [id, len] : script[s].seqs) {
      SequenceTokens seq{id, {}};
      if (len < 0) {
        seq.tokens.push_back(next[id]);
      } else {
        for (int i = 0; i < len; ++i) {
          seq.tokens.push_back(static_cast<int32_t>(rng() % TpTinyShape().vocab));
        }
      }
      batch.push_back(seq);
    }
    Outcome got = RunStep(runner, batch);
    if (got.tokens.size() != batch.size()) {
      ADD_FAILURE() << "step " << s << " failed";
      return outcomes;
    }
    const std::vector<int32_t>& feed = forced != nullptr ? (*forced)[s].tokens : got.tokens;
    for (size_t i = 0; i < batch.size(); ++i) next[batch[i].id] = std::max(feed[i], 0);
    outcomes.push_back(std::move(got));
  }
  return outcomes;
}

std::string EncodeTokens(const std::vector<Outcome>& outcomes) {
  std::string out;
  for (const Outcome& o : outcomes) {
    out.append(reinterpret_cast<const char*>(o.tokens.data()), o.tokens.size() * 4);
  }
  return out;
}

// Fills `outcomes`' tokens (shaped by the script) from EncodeTokens' bytes.
std::vector<Outcome> DecodeTokens(const std::string& bytes) {
  std::vector<Outcome> outcomes;
  size_t at = 0;
  for (const ScriptStep& step : GenerationScript()) {
    Outcome o;
    o.tokens.resize(step.seqs.size());
    if (at + o.tokens.size() * 4 <= bytes.size()) {
      std::memcpy(o.tokens.data(), bytes.data() + at, o.tokens.size() * 4);
    }
    at += o.tokens.size() * 4;
    outcomes.push_back(std::move(o));
  }
  EXPECT_EQ(at, bytes.size()) << "token record of the wrong length";
  return outcomes;
}

// Compares TP=world's outcomes with TP=1's: logits by relative error, tokens where TP=1's
// top-2 margin is clear. Returns the number of clear-margin tokens.
int CompareWithOneGpu(const std::vector<Outcome>& tp, const std::vector<Outcome>& one) {
  const int vocab = TpTinyShape().vocab;
  int clear_checks = 0;
  double max_rel = 0;
  EXPECT_EQ(tp.size(), one.size());
  for (size_t s = 0; s < std::min(tp.size(), one.size()); ++s) {
    EXPECT_EQ(tp[s].info.replayed, one[s].info.replayed) << "step " << s;
    EXPECT_EQ(tp[s].info.key, one[s].info.key) << "step " << s;
    const size_t rows = one[s].tokens.size();
    if (tp[s].logits.size() != rows * vocab || one[s].logits.size() != rows * vocab) {
      ADD_FAILURE() << "step " << s << " has no logits";
      continue;
    }
    for (size_t i = 0; i < rows; ++i) {
      const float* a = tp[s].logits.data() + i * vocab;
      const float* b = one[s].logits.data() + i * vocab;
      double diff = 0, norm = 0, best = -1e300, second = -1e300;
      int best_index = -1;
      for (int v = 0; v < vocab; ++v) {
        diff += (double{a[v]} - b[v]) * (double{a[v]} - b[v]);
        norm += double{b[v]} * b[v];
        if (b[v] > best) {
          second = best;
          best = b[v];
          best_index = v;
        } else if (b[v] > second) {
          second = b[v];
        }
      }
      const double rel = std::sqrt(diff / norm);
      max_rel = std::max(max_rel, rel);
      EXPECT_LT(rel, kTpTolerance) << "step " << s << " row " << i;
      EXPECT_EQ(best_index, one[s].tokens[i]) << "TP=1's sampler disagrees with its logits";
      // A clear margin: far above what either run's error moves a logit.
      const double clear = 8 * kTolerance * std::sqrt(norm / vocab);
      if (best - second > clear) {
        ++clear_checks;
        EXPECT_EQ(tp[s].tokens[i], best_index)
            << "step " << s << " row " << i << " margin " << best - second;
      }
    }
  }
  std::printf("TP vs TP=1: %d clear-margin tokens, max logits relative error %.2e\n",
              clear_checks, max_rel);
  return clear_checks;
}

// The whole generation at TP = ctx.world_size against TP=1 on rank 0's GPU.
void GenerationMatchesOneGpu(RankContext& ctx, const AllReduceConfig& allreduce,
                             bool expect_custom, bool qwen = false) {
  ASSERT_EQ(cudaSetDevice(ctx.device()), cudaSuccess);
  const uint64_t seed = SharedSeed(ctx);
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", rank ", ctx.rank, " of ", ctx.world_size));

  // TP=1 first, on rank 0 alone; its tokens drive every rank's inputs.
  std::vector<Outcome> one;
  if (ctx.rank == 0) {
    std::unique_ptr<Runner> single = MakeRunner(TpOptions(seed, allreduce, nullptr, qwen));
    ASSERT_NE(single, nullptr);
    // On one GPU the TMA GEMM takes O, gate-up and down from 3 rows; QKV stays on the prefetch
    // GEMM up to 8 rows.
    const PrefetchGemmRows& one_gpu = single->model().options().prefetch_gemm_rows;
    EXPECT_EQ(std::vector<int>({one_gpu.qkv, one_gpu.o, one_gpu.gate_up, one_gpu.down}),
              std::vector<int>({8, 2, 2, 2}));
    one = RunScript(*single, seed, nullptr);
  }
  absl::StatusOr<std::string> tokens =
      ctx.bootstrap.Broadcast(EncodeTokens(one), "runner_multigpu_test.tp1_tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  const std::vector<Outcome> forced = DecodeTokens(*tokens);

  std::unique_ptr<Runner> runner = MakeRunner(TpOptions(seed, allreduce, &ctx, qwen));
  ASSERT_NE(runner, nullptr);
  EXPECT_EQ(runner->tensor_parallel_size(), ctx.world_size);
  EXPECT_EQ(runner->shape().heads, TpTinyShape().heads / ctx.world_size);
  // Sharded, every projection stays on the prefetch GEMM up to 8 rows
  // (RunnerOptions::sharded_prefetch_gemm_rows).
  const PrefetchGemmRows& rows = runner->model().options().prefetch_gemm_rows;
  EXPECT_EQ(std::vector<int>({rows.qkv, rows.o, rows.gate_up, rows.down, rows.lm_head}),
            std::vector<int>({8, 8, 8, 8, 8}));
  const std::vector<Outcome> tp = RunScript(*runner, seed, &forced);
  ExpectSameOnEveryRank(ctx, tp, "TP generation");
  if (ctx.rank == 0) {
    EXPECT_GE(CompareWithOneGpu(tp, one), 20);
  }

  // The path the all-reduces took.
  const AutoCommunicator* comm = runner->communicator();
  ASSERT_NE(comm, nullptr);
  const AllReduceStats& stats = comm->stats();
  const int64_t custom = stats.one_shot_staged + stats.one_shot_registered +
                         stats.two_shot_staged + stats.two_shot_registered;
  std::printf("rank %d all-reduce calls: %lld custom, %lld NCCL (%s)\n", ctx.rank,
              static_cast<long long>(custom), static_cast<long long>(stats.nccl),
              comm->custom_available() ? "custom available"
                                       : comm->custom_unavailable_reason().c_str());
  if (expect_custom) {
    EXPECT_TRUE(comm->custom_available()) << comm->custom_unavailable_reason();
    EXPECT_GT(custom, 0);
    // Every step's size takes the fused all-reduce + add + RMSNorm (tiny rows, one-shot).
    EXPECT_GT(stats.fused_add_rms_norm, 0);
  } else {
    EXPECT_EQ(custom, 0);
    EXPECT_EQ(stats.fused_add_rms_norm, 0);
    EXPECT_GT(stats.nccl, 0);
  }

  // What this rank allocated is what the planner planned per rank.
  const MemoryPlan& plan = runner->memory_plan();
  EXPECT_EQ(plan.config.tensor_parallel_size(), ctx.world_size);
  const RunnerMemoryItem* weights = runner->memory().Find("weights");
  ASSERT_NE(weights, nullptr);
  const int64_t tensors = static_cast<int64_t>(runner->model().weights().layout().tensors().size());
  EXPECT_LE(std::abs(weights->requested_bytes - plan.Find("weights")->bytes),
            tensors * static_cast<int64_t>(LlamaWeightLayout::kAlignment))
      << "weights " << weights->requested_bytes << " planned " << plan.Find("weights")->bytes;
  const RunnerMemoryItem* kv = runner->memory().Find("kv_cache");
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(kv->requested_bytes, int64_t{runner->num_kv_blocks()} * plan.kv_block_bytes);
  const RunnerMemoryItem* collectives = runner->memory().Find("collectives");
  ASSERT_NE(collectives, nullptr);
  std::printf("rank %d collectives: planned %.1f MiB (custom_allreduce + nccl), measured %.1f MiB "
              "at creation\n",
              ctx.rank, collectives->requested_bytes / 1048576.0,
              collectives->measured_bytes / 1048576.0);
}

std::vector<int> TpSizes() {
  std::vector<int> sizes = {2};
  if (testing::TestWorldSize() > 2) sizes.push_back(testing::TestWorldSize());
  return sizes;
}

TEST(RunnerMultiGpuTest, GenerationWithCustomAllReduceMatchesOneGpu) {
  KILN_REQUIRE_GPUS(2);
  for (int tp : TpSizes()) {
    SCOPED_TRACE(absl::StrCat("TP ", tp));
    RunOnEveryGpu([](RankContext& ctx) { GenerationMatchesOneGpu(ctx, AutoConfig(), true); },
                  Options(tp));
  }
}

// Qwen2's QKV biases split with their heads (each rank adds its own part after its QKV GEMM), and
// Qwen3's QK norms, whose weights every rank holds whole.
TEST(RunnerMultiGpuTest, GenerationWithQkvBiasAndQkNormMatchesOneGpu) {
  KILN_REQUIRE_GPUS(2);
  for (int tp : TpSizes()) {
    SCOPED_TRACE(absl::StrCat("TP ", tp));
    RunOnEveryGpu(
        [](RankContext& ctx) { GenerationMatchesOneGpu(ctx, AutoConfig(), true, true); },
        Options(tp));
  }
}

TEST(RunnerMultiGpuTest, GenerationWithNcclOnlyMatchesOneGpu) {
  KILN_REQUIRE_GPUS(2);
  for (int tp : TpSizes()) {
    SCOPED_TRACE(absl::StrCat("TP ", tp));
    RunOnEveryGpu([](RankContext& ctx) { GenerationMatchesOneGpu(ctx, NcclOnlyConfig(), false); },
                  Options(tp));
  }
}

// The fused all-reduce + add + RMSNorm gives the bits of the all-reduce followed by
// runtime/model's own add + RMSNorm kernels: the whole generation script with the fusion, as full
// graphs and as piecewise graphs (pieces end after the fused call that replaces the next
// layer's input norm), against the unfused step, logits and tokens bit for bit, on every rank.
TEST(RunnerMultiGpuTest, FusedAllReduceNormEqualsUnfusedBitForBit) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    ASSERT_EQ(cudaSetDevice(ctx.device()), cudaSuccess);
    const uint64_t seed = SharedSeed(ctx);
    SCOPED_TRACE(absl::StrCat("seed ", seed, ", rank ", ctx.rank));
    std::vector<Outcome> unfused;
    {
      RunnerOptions options = TpOptions(seed, AutoConfig(), &ctx);
      options.fuse_allreduce_norm = false;
      std::unique_ptr<Runner> runner = MakeRunner(options);
      ASSERT_NE(runner, nullptr);
      unfused = RunScript(*runner, seed, nullptr);
      EXPECT_EQ(runner->communicator()->stats().fused_add_rms_norm, 0);
    }
    ASSERT_EQ(unfused.size(), GenerationScript().size());
    for (GraphExecution graphs : {GraphExecution::kFull, GraphExecution::kPiecewise}) {
      const char* name = graphs == GraphExecution::kFull ? "full graphs" : "piecewise graphs";
      RunnerOptions options = TpOptions(seed, AutoConfig(), &ctx);
      options.graphs = graphs;
      std::unique_ptr<Runner> runner = MakeRunner(options);
      ASSERT_NE(runner, nullptr);
      const std::vector<Outcome> fused = RunScript(*runner, seed, &unfused);
      const AllReduceStats& stats = runner->communicator()->stats();
      EXPECT_GT(stats.fused_add_rms_norm, 0) << name;
      EXPECT_EQ(stats.nccl, 0) << name << ": every all-reduce of the tiny model is custom";
      ASSERT_EQ(fused.size(), unfused.size()) << name;
      int replayed = 0;
      for (size_t step = 0; step < fused.size(); ++step) {
        replayed += fused[step].info.replayed;
        EXPECT_EQ(fused[step].tokens, unfused[step].tokens) << name << ", step " << step;
        EXPECT_TRUE(fused[step].logits.size() == unfused[step].logits.size() &&
                    std::memcmp(fused[step].logits.data(), unfused[step].logits.data(),
                                fused[step].logits.size() * sizeof(float)) == 0)
            << name << ", step " << step << ": fused logits differ from unfused";
      }
      EXPECT_GT(replayed, 10) << name;
      ExpectSameOnEveryRank(ctx, fused, name);
    }
  }, Options());
}

// Without the fused all-reduce + norm (the one-shot all-reduces of the graphs read registered
// inputs) and with it (the fused push kernel reads none).
void EveryCapturedSizeReplaysLikeEager(RankContext& ctx, bool fuse) {
  ASSERT_EQ(cudaSetDevice(ctx.device()), cudaSuccess);
  const uint64_t seed = SharedSeed(ctx);
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", rank ", ctx.rank, fuse ? ", fused" : ""));
  RunnerOptions options = TpOptions(seed, RegisteredConfig(), &ctx);
  options.fuse_allreduce_norm = fuse;
  std::unique_ptr<Runner> runner = MakeRunner(options);
  ASSERT_NE(runner, nullptr);
  std::mt19937_64 rng(seed);
  auto token = [&] { return static_cast<int32_t>(rng() % TpTinyShape().vocab); };
  // Eight live sequences for the decode sizes.
  std::vector<SequenceTokens> prompts;
  for (int64_t id = 0; id < kMaxSeqs; ++id) {
    prompts.push_back({id, {token(), token(), token()}});
  }
  StepOptions eager;
  eager.force_eager = true;
  ASSERT_EQ(RunStep(*runner, prompts, eager).tokens.size(), prompts.size());

  std::vector<Outcome> graphs;
  auto expect_graph_equals_eager = [&](const std::vector<SequenceTokens>& batch) {
    StepOptions graph_options;
    graph_options.commit = false;
    const Outcome graph = RunStep(*runner, batch, graph_options);
    const Outcome eager_run = RunStep(*runner, batch, eager);
    EXPECT_TRUE(graph.info.replayed) << KeyName(graph.info.key) << " did not replay";
    EXPECT_FALSE(eager_run.info.replayed);
    EXPECT_EQ(graph.info.key, eager_run.info.key);
    EXPECT_EQ(graph.tokens, eager_run.tokens) << KeyName(graph.info.key);
    EXPECT_TRUE(graph.logits.size() == eager_run.logits.size() &&
                std::memcmp(graph.logits.data(), eager_run.logits.data(),
                            graph.logits.size() * sizeof(float)) == 0)
        << "graph replay of " << KeyName(graph.info.key) << " differs from eager";
    graphs.push_back(graph);
  };
  int64_t id = 100;
  for (int n : runner->prefill_sizes()->sizes()) {
    SequenceTokens one{id++, {}};
    for (int i = 0; i < n; ++i) one.tokens.push_back(token());
    expect_graph_equals_eager({one});
    EXPECT_EQ(runner->last_step().padded_tokens, n);
  }
  for (int b : runner->decode_sizes()->sizes()) {
    std::vector<SequenceTokens> batch;
    for (int i = 0; i < b; ++i) batch.push_back({i, {token()}});
    expect_graph_equals_eager(batch);
    EXPECT_EQ(runner->last_step().key, (CaptureKey{GraphMode::kDecode, b}));
  }
  ExpectSameOnEveryRank(ctx, graphs, "graph replays");
  const AutoCommunicator* comm = runner->communicator();
  ASSERT_NE(comm, nullptr);
  ASSERT_NE(comm->custom(), nullptr) << comm->custom_unavailable_reason();
  if (fuse) {
    // Every all-reduce of the tiny model is fused, and pushed: nothing to register.
    EXPECT_GT(comm->stats().fused_add_rms_norm, 0);
    EXPECT_EQ(comm->stats().one_shot_registered + comm->stats().two_shot_registered, 0);
  } else {
    // The graphs' one-shot all-reduces read registered inputs.
    EXPECT_EQ(comm->stats().fused_add_rms_norm, 0);
    EXPECT_GT(comm->stats().one_shot_registered + comm->stats().two_shot_registered, 0);
    EXPECT_GT(comm->custom()->registered_graph_inputs(), 0);
  }
  EXPECT_EQ(comm->custom()->pending_graph_inputs(), 0);
}

TEST(RunnerMultiGpuTest, EveryCapturedSizeReplaysLikeEagerOnEveryRank) {
  KILN_REQUIRE_GPUS(2);
  for (bool fuse : {false, true}) {
    RunOnEveryGpu([fuse](RankContext& ctx) { EveryCapturedSizeReplaysLikeEager(ctx, fuse); },
                  Options());
  }
}

TEST(RunnerMultiGpuTest, SafetensorsWeightsGiveTheSeededShardsBits) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    ASSERT_EQ(cudaSetDevice(ctx.device()), cudaSuccess);
    const uint64_t seed = SharedSeed(ctx);
    SCOPED_TRACE(absl::StrCat("seed ", seed, ", rank ", ctx.rank));
    // Each rank writes the whole model to a file of its own and reads back its shard.
    absl::StatusOr<LlamaHostWeights> host = RandomLlamaHostWeights(TpTinyShape(), seed);
    ASSERT_TRUE(host.ok()) << host.status();
    const std::string path =
        TestTempPath(absl::StrCat("tp_weights_rank", ctx.rank, ".safetensors"));
    ASSERT_TRUE(WriteLlamaSafetensors(path, *host).ok());
    std::vector<Outcome> seeded;
    {
      std::unique_ptr<Runner> runner = MakeRunner(TpOptions(seed, AutoConfig(), &ctx));
      ASSERT_NE(runner, nullptr);
      seeded = RunScript(*runner, seed, nullptr);
    }
    RunnerOptions options = TpOptions(seed + 1, AutoConfig(), &ctx);  // the seed is not used
    options.weight_files = {path};
    std::unique_ptr<Runner> runner = MakeRunner(options);
    ASSERT_NE(runner, nullptr);
    const std::vector<Outcome> from_file = RunScript(*runner, seed, &seeded);
    ASSERT_EQ(from_file.size(), seeded.size());
    for (size_t step = 0; step < seeded.size(); ++step) {
      EXPECT_EQ(from_file[step].tokens, seeded[step].tokens) << "step " << step;
      EXPECT_TRUE(from_file[step].logits.size() == seeded[step].logits.size() &&
                  std::memcmp(from_file[step].logits.data(), seeded[step].logits.data(),
                              seeded[step].logits.size() * sizeof(float)) == 0)
          << "step " << step << ": the file's logits differ from the seeded model's";
    }
    ExpectSameOnEveryRank(ctx, from_file, "safetensors weights");
  }, Options());
}

TEST(RunnerMultiGpuTest, ReplayBeforeRegistrationIsRefused) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    ASSERT_EQ(cudaSetDevice(ctx.device()), cudaSuccess);
    const uint64_t seed = SharedSeed(ctx);
    // A tensor-parallel size that is not the group's is refused on every rank alike.
    RunnerOptions wrong = TpOptions(seed, RegisteredConfig(), &ctx);
    wrong.config.set_tensor_parallel_size(ctx.world_size + 1);
    absl::StatusOr<std::unique_ptr<Runner>> refused = Runner::Create(wrong);
    EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();

    RunnerOptions options = TpOptions(seed, RegisteredConfig(), &ctx);
    options.register_graph_buffers = false;
    // Registered graph inputs come from the unfused all-reduces (the fused push kernel has none).
    options.fuse_allreduce_norm = false;
    absl::StatusOr<std::unique_ptr<Runner>> created = Runner::Create(options);
    ASSERT_TRUE(created.ok()) << created.status();
    Runner& runner = **created;
    ASSERT_TRUE(runner.Capture().ok());
    EXPECT_FALSE(runner.graphs_registered());
    EXPECT_TRUE(absl::IsFailedPrecondition(runner.communicator()->CheckReplayable()));

    StepOptions eager;
    eager.force_eager = true;
    ASSERT_TRUE(runner.Step({{1, {3, 4, 5}}, {2, {6, 7}}}, eager).ok());  // eager steps run
    absl::StatusOr<std::vector<int32_t>> step = runner.Step({{1, {8}}, {2, {9}}});
    EXPECT_TRUE(absl::IsFailedPrecondition(step.status())) << step.status();
    EXPECT_NE(step.status().message().find("RegisterGraphBuffers"), std::string::npos)
        << step.status();
    // The refusal comes before any sequence takes blocks: a new sequence is not left behind.
    const int free_blocks = runner.sequences().free_blocks();
    EXPECT_TRUE(absl::IsFailedPrecondition(runner.Step({{1, {8}}, {2, {9}}, {3, {10}}}).status()));
    EXPECT_FALSE(runner.sequences().Contains(3));
    EXPECT_EQ(runner.sequences().free_blocks(), free_blocks);

    ASSERT_TRUE(runner.RegisterGraphBuffers().ok());
    EXPECT_TRUE(runner.communicator()->CheckReplayable().ok());
    step = runner.Step({{1, {8}}, {2, {9}}});
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_TRUE(runner.last_step().replayed);
  }, Options());
}

// A capture hook that fails the capture (not the warm-ups) of decode/2 on rank `failing` with
// "Injected capture failure", as seen from rank `rank`.
std::function<absl::Status(CaptureKey)> FailCaptureOfDecode2On(int failing, int rank) {
  return [failing, rank](CaptureKey key) -> absl::Status {
    if (rank == failing && CaptureContext::Phase() == CapturePhase::kCapture &&
        key == CaptureKey{GraphMode::kDecode, 2}) {
      return absl::InternalError("Injected capture failure");
    }
    return absl::OkStatus();
  };
}

TEST(RunnerMultiGpuTest, CaptureFailingOnOneRankFailsEveryRankAlike) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    ASSERT_EQ(cudaSetDevice(ctx.device()), cudaSuccess);
    const uint64_t seed = SharedSeed(ctx);
    RunnerOptions options = TpOptions(seed, AutoConfig(), &ctx);
    const int failing = ctx.world_size - 1;
    options.capture_step_hook_for_testing = FailCaptureOfDecode2On(failing, ctx.rank);
    absl::StatusOr<std::unique_ptr<Runner>> created = Runner::Create(options);
    ASSERT_TRUE(created.ok()) << created.status();
    const absl::Time start = absl::Now();
    const absl::Status captured = (*created)->Capture().status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "a failed capture must not hang";
    EXPECT_TRUE(absl::IsInternal(captured)) << captured;
    EXPECT_NE(captured.message().find(
                  absl::StrCat("Capture of decode/2 failed on rank ", failing, " of ",
                               ctx.world_size)),
              std::string::npos)
        << captured;
    EXPECT_NE(captured.message().find("Injected capture failure"), std::string::npos)
        << captured;
    ExpectSameOnEveryRank(ctx, captured.ToString(), "capture_status");
    // Nothing replays after a failed capture (decode/4 was captured before decode/2 failed).
    EXPECT_FALSE((*created)->graphs_registered());
    StepOptions eager;
    eager.force_eager = true;
    ASSERT_TRUE((*created)->Step({{1, {3, 4, 5}}, {2, {6}}, {3, {7, 8}}}, eager).ok());
    EXPECT_TRUE(
        absl::IsFailedPrecondition((*created)->Step({{1, {9}}, {2, {10}}, {3, {11}}}).status()));
    // Every rank dropped decode/2, the ranks whose own capture of it succeeded too: once the
    // graphs are registered, two decode rows run eagerly on every rank and three (decode/4)
    // replay on every rank, with the same tokens everywhere.
    ASSERT_TRUE((*created)->RegisterGraphBuffers().ok());
    std::string outcomes;
    for (const std::vector<SequenceTokens>& batch :
         std::vector<std::vector<SequenceTokens>>{{{1, {12}}, {2, {13}}},
                                                  {{1, {14}}, {2, {15}}, {3, {16}}}}) {
      absl::StatusOr<std::vector<int32_t>> tokens = (*created)->Step(batch);
      ASSERT_TRUE(tokens.ok()) << tokens.status();
      const StepInfo& info = (*created)->last_step();
      const bool want_replay = batch.size() == 3;
      EXPECT_EQ(info.key, (CaptureKey{GraphMode::kDecode, want_replay ? 4 : 2}));
      EXPECT_EQ(info.replayed, want_replay) << KeyName(info.key);
      absl::StrAppend(&outcomes, KeyName(info.key), info.replayed ? " replayed:" : " eager:",
                      absl::StrJoin(*tokens, ","), ";");
    }
    ExpectSameOnEveryRank(ctx, outcomes, "step_outcomes");
  }, Options());
}

// Creates a runner with `options` on this rank and captures: Capture() must fail within 30 s,
// on rank 0 with Internal naming both `call` and `other_call` (the calls at which the ranks
// parted), elsewhere with Internal, or Unavailable for a rank whose connection rank 0 shut before
// its report arrived (or Aborted, where `may_be_aborted`: the custom all-reduce's sticky error).
void ExpectCaptureFailsEveryRankAtOnce(RankContext& ctx, const RunnerOptions& options,
                                       bool may_be_aborted, absl::string_view call,
                                       absl::string_view other_call) {
  absl::StatusOr<std::unique_ptr<Runner>> created = Runner::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  const absl::Time start = absl::Now();
  const absl::Status captured = (*created)->Capture().status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "a failed capture must not hang";
  EXPECT_TRUE(absl::IsInternal(captured) || absl::IsUnavailable(captured) ||
              (may_be_aborted && absl::IsAborted(captured)))
      << captured;
  if (ctx.rank == 0) {
    EXPECT_TRUE(absl::IsInternal(captured)) << captured;
    EXPECT_NE(captured.message().find(call), std::string::npos) << captured;
    EXPECT_NE(captured.message().find(other_call), std::string::npos) << captured;
  }
}

// With registered graph inputs every captured one-shot all-reduce makes an agreement among the
// ranks; a rank whose capture fails before it reports its failure while the others wait in that
// agreement. Every rank fails at once with Internal naming both calls, never a hang.
TEST(RunnerMultiGpuTest, CaptureFailingBeforeARegisteredAllReduceFailsEveryRankAtOnce) {
  KILN_REQUIRE_GPUS(2);
  testing::MultiProcessTestOptions options = Options();
  options.final_barrier = false;  // the failed exchange leaves the bootstrap unusable
  RunOnEveryGpu([](RankContext& ctx) {
    ASSERT_EQ(cudaSetDevice(ctx.device()), cudaSuccess);
    const uint64_t seed = SharedSeed(ctx);
    RunnerOptions runner_options = TpOptions(seed, RegisteredConfig(), &ctx);
    // Unfused, every all-reduce of a captured step is one-shot reading a registered input (the
    // fused all-reduce + norm reads none and makes no agreement).
    runner_options.fuse_allreduce_norm = false;
    runner_options.capture_step_hook_for_testing =
        FailCaptureOfDecode2On(ctx.world_size - 1, ctx.rank);
    ExpectCaptureFailsEveryRankAtOnce(ctx, runner_options, /*may_be_aborted=*/true,
                                      "custom_allreduce.capture_agreement",
                                      "runner.capture_agreement.full.decode/2");
  }, options);
}

// Ranks that capture in different graph modes (one full graphs, the others piecewise) part at
// their first capture call: its name carries the scope ("full" against "piece/0"), so every rank
// fails at once with Internal naming both calls, never pairing one piece's capture with another's.
TEST(RunnerMultiGpuTest, CaptureInAnotherGraphModeFailsEveryRankAtOnce) {
  KILN_REQUIRE_GPUS(2);
  testing::MultiProcessTestOptions options = Options();
  options.final_barrier = false;  // the failed exchange leaves the bootstrap unusable
  RunOnEveryGpu([](RankContext& ctx) {
    ASSERT_EQ(cudaSetDevice(ctx.device()), cudaSuccess);
    const uint64_t seed = SharedSeed(ctx);
    RunnerOptions runner_options = TpOptions(seed, AutoConfig(), &ctx);
    runner_options.graphs = ctx.rank == 0 ? GraphExecution::kFull : GraphExecution::kPiecewise;
    ExpectCaptureFailsEveryRankAtOnce(ctx, runner_options, /*may_be_aborted=*/false,
                                      "runner.capture_size.full.decode/8",
                                      "runner.capture_size.piece/0.decode/8");
  }, options);
}

// One rank exits between steps; the others' next step must end in DeadlineExceeded, bounded by
// the all-reduce timeout: through the custom all-reduce's barriers, or, NCCL only, by aborting
// NCCL when the step's stream has not finished in time.
void KilledRankEndsTheOthersWithDeadlineExceeded(bool custom) {
  testing::MultiProcessTestOptions options = Options();
  options.final_barrier = false;  // one rank exits on purpose
  RunOnEveryGpu([custom](RankContext& ctx) {
    ASSERT_EQ(cudaSetDevice(ctx.device()), cudaSuccess);
    const uint64_t seed = SharedSeed(ctx);
    AllReduceConfig config;
    config.set_barrier_timeout_ms(2000);
    config.set_enable_custom(custom);
    std::unique_ptr<Runner> runner = MakeRunner(TpOptions(seed, config, &ctx));
    ASSERT_NE(runner, nullptr);
    ASSERT_EQ(runner->communicator()->custom_available(), custom)
        << runner->communicator()->custom_unavailable_reason();
    ASSERT_TRUE(runner->Step({{1, {3, 4, 5}}, {2, {6, 7}}}).ok());
    ASSERT_TRUE(runner->Step({{1, {8}}, {2, {9}}}).ok());
    ASSERT_TRUE(ctx.bootstrap.Barrier("runner_multigpu_test.before_exit").ok());
    if (ctx.rank == ctx.world_size - 1) ctx.ExitProcessNow();  // dies between steps

    absl::SleepFor(absl::Milliseconds(300));
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<int32_t>> step = runner->Step({{1, {10}}, {2, {11}}});
    const absl::Duration waited = absl::Now() - start;
    EXPECT_EQ(step.status().code(), absl::StatusCode::kDeadlineExceeded) << step.status();
    EXPECT_LT(waited, absl::Seconds(10)) << "bounded by the barrier timeout";
    // Sticky: the next step fails at once.
    const absl::Time again = absl::Now();
    EXPECT_EQ(runner->Step({{1, {12}}, {2, {13}}}).status().code(),
              absl::StatusCode::kDeadlineExceeded);
    EXPECT_LT(absl::Now() - again, absl::Seconds(1));
    // A communicator with a dead peer cannot be torn down collectively (NCCL's finalize would
    // wait for it); the process is about to exit, so leave the runner to the driver.
    runner.release();
  }, options);
}

TEST(RunnerMultiGpuTest, KilledRankEndsTheOthersWithDeadlineExceeded) {
  KILN_REQUIRE_GPUS(2);
  KilledRankEndsTheOthersWithDeadlineExceeded(/*custom=*/true);
}

TEST(RunnerMultiGpuTest, KilledRankEndsTheOthersWithDeadlineExceededWithNcclOnly) {
  KILN_REQUIRE_GPUS(2);
  KilledRankEndsTheOthersWithDeadlineExceeded(/*custom=*/false);
}

}  // namespace
}  // namespace kiln
