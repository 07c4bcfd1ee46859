// The runner on the tiny two-layer model:
//   - graph replay equals an eager run at the same padded size, bit for bit, for every captured
//     size and for 1000 random batch compositions (decode-only, prefill-only, mixed; lengths at
//     block boundaries);
//   - piecewise graphs and graph-free runs equal full graphs, bit for bit; a piecewise step whose
//     key some piece lacks (its capture stopped part-way, in the last piece or before it, when
//     later pieces have no graphs at all) runs eagerly, with the same bits;
//   - folding the add + RMSNorm into the QKV and gate-up GEMMs (steps of up to 8 tokens) gives
//     the norm kernels' bits, in full graphs, piecewise graphs and eager steps; so do the decode
//     layer kernel and RoPE + KV append in attention, over random traffic and, small enough for
//     compute-sanitizer, in decode steps of every row count from 1 to 8;
//   - steps on the eager key (above every captured size) and greedy generation match the CPU
//     float64 reference decoder (logits by relative error, tokens where the reference's top-2
//     margin is clear), with and without Llama 3's RoPE frequency scaling;
//   - weights read from a safetensors file, or a Hugging Face model directory (config.json and
//     its safetensors), give the bits of the same weights made from their seed; a missing,
//     truncated or misshapen file is refused by name;
//   - bad batches are refused and change nothing; so are out-of-range kernel-choice options.
#include "runtime/runner/runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attention/rope_frequency.h"
#include "graph/capture_context.h"
#include "gtest/gtest.h"
#include "runtime/config/hf_model.h"
#include "runtime/config/presets.h"
#include "runtime/cuda/compute_capability.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/model/decode_layer.h"
#include "runtime/model/internal/step_args_stand_ins.h"
#include "runtime/model/llama_checkpoint.h"
#include "runtime/model/llama_weights.h"
#include "runtime/model/reference_decoder.h"

namespace kiln {
namespace {

constexpr int kMaxSeqs = 32;
constexpr int kMaxTokens = 640;
constexpr int kBlockSize = 16;
constexpr int kMaxModelLen = 1024;
// Every projection on the prefetch GEMM up to its most rows: what the decode layer kernel and the
// folded norms need at every row count they take.
constexpr PrefetchGemmRows kPrefetchEverywhere = {kPrefetchGemmMaxRows, kPrefetchGemmMaxRows,
                                                  kPrefetchGemmMaxRows, kPrefetchGemmMaxRows,
                                                  kPrefetchGemmMaxRows};

config::ModelShape TinyModel() { return ModelShapeFromLlamaShape(LlamaShape::Tiny(), "tiny"); }

// The tiny model with Llama 3's RoPE frequency scaling, its bands set so that the tiny model's
// pairs fall in all three (theta 10000 at head_dim 64: wavelengths 6 to 4.6e4; L = 64 keeps
// those under 16, blends 16 to 64 and divides the rest by 8).
LlamaShape TinyScaledShape() {
  LlamaShape shape = LlamaShape::Tiny();
  shape.rope_scaling = RopeScaling::Llama3(8.0, 1.0, 4.0, 64);
  return shape;
}

config::ModelShape TinyScaledModel() {
  return ModelShapeFromLlamaShape(TinyScaledShape(), "tiny-scaled");
}

RunnerOptions TinyOptions(GraphExecution graphs, uint64_t seed) {
  RunnerOptions o;
  *o.config.mutable_model() = TinyModel();
  o.config.set_max_num_seqs(kMaxSeqs);
  o.config.set_max_num_batched_tokens(kMaxTokens);
  o.config.set_block_size(kBlockSize);
  o.graphs = graphs;
  o.max_model_len = kMaxModelLen;
  o.weight_seed = seed;
  o.max_kv_blocks = 4096;
  o.progress = CaptureProgress::kQuiet;
  return o;
}

std::unique_ptr<Runner> MakeRunner(const RunnerOptions& options) {
  auto runner = Runner::Create(options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return nullptr;
  auto captured = (*runner)->Capture();
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
Outcome RunStep(Runner& runner, const std::vector<SequenceTokens>& batch, StepOptions options) {
  Outcome out;
  EXPECT_TRUE(runner.PoisonOutputs().ok());
  auto tokens = runner.Step(batch, options);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  if (!tokens.ok()) return out;
  out.tokens = *tokens;
  out.info = runner.last_step();
  auto logits = runner.LastLogits(static_cast<int>(batch.size()));
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

std::string Describe(const std::vector<SequenceTokens>& batch) {
  return absl::StrJoin(batch, ",", [](std::string* s, const SequenceTokens& t) {
    absl::StrAppend(s, t.id, ":", t.tokens.size());
  });
}

// Random batch compositions over a set of live sequences.
class Traffic {
 public:
  explicit Traffic(uint64_t seed) : rng_(seed) {}

  enum Kind { kDecode, kPrefill, kMixed };

  std::vector<SequenceTokens> Next(Kind kind, const Runner& runner) {
    // Keep sequences short of max_model_len and the live set bounded.
    for (size_t i = 0; i < live_.size();) {
      if (runner.sequences().Length(live_[i]) > 880 || live_.size() > 40) {
        to_release_.push_back(live_[i]);
        live_.erase(live_.begin() + i);
      } else {
        ++i;
      }
    }
    if (live_.empty()) kind = kPrefill;
    std::vector<SequenceTokens> batch;
    int tokens = 0;
    std::vector<int64_t> order = live_;
    std::shuffle(order.begin(), order.end(), rng_);
    size_t taken = 0;
    if (kind == kDecode || kind == kMixed) {
      const int most = kind == kDecode ? kMaxSeqs : 8;
      const int n = 1 + Uniform(0, std::min<int>(most, static_cast<int>(order.size())) - 1);
      for (; static_cast<int>(taken) < n; ++taken) {
        batch.push_back({order[taken], {Token()}});
        ++tokens;
      }
    }
    if (kind == kPrefill || kind == kMixed) {
      const int chunks = 1 + Uniform(0, 3);
      for (int c = 0; c < chunks && static_cast<int>(batch.size()) < kMaxSeqs; ++c) {
        int64_t id;
        int room = kMaxModelLen - 100;
        if (taken < order.size() && Uniform(0, 2) == 0) {
          id = order[taken++];  // a later chunk of a sequence that has tokens already
          room -= runner.sequences().Length(id);
        } else {
          id = next_id_++;
        }
        int len = ChunkLength();
        len = std::min({len, room, 512 - tokens});
        if (len < 2) break;
        batch.push_back({id, Tokens(len)});
        tokens += len;
      }
      if (batch.empty()) batch.push_back({next_id_++, Tokens(2)});
    }
    return batch;
  }

  // Records the sequences of a committed step as live.
  void Committed(const std::vector<SequenceTokens>& batch) {
    for (const SequenceTokens& s : batch) {
      if (std::find(live_.begin(), live_.end(), s.id) == live_.end()) live_.push_back(s.id);
    }
  }

  std::vector<int64_t> TakeReleases() { return std::exchange(to_release_, {}); }
  std::mt19937_64& rng() { return rng_; }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  int32_t Token() { return Uniform(0, LlamaShape::Tiny().vocab - 1); }
  std::vector<int32_t> Tokens(int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = Token();
    return t;
  }
  // A third of the chunks end at, just before or just after a block boundary.
  int ChunkLength() {
    if (Uniform(0, 2) == 0) return std::max(2, kBlockSize * Uniform(1, 8) + Uniform(-1, 1));
    return Uniform(2, 120);
  }

  std::mt19937_64 rng_;
  std::vector<int64_t> live_;
  std::vector<int64_t> to_release_;
  int64_t next_id_ = 0;
};

uint64_t FreshSeed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

// Runs `batch` as a graph (not committed), then eagerly at the same key (committed), and
// expects identical bits. Returns whether a graph ran.
bool ExpectGraphEqualsEager(Runner& runner, const std::vector<SequenceTokens>& batch) {
  SCOPED_TRACE(absl::StrCat("batch ", Describe(batch)));
  StepOptions graph_options;
  graph_options.commit = false;
  const Outcome graph = RunStep(runner, batch, graph_options);
  StepOptions eager_options;
  eager_options.force_eager = true;
  const Outcome eager = RunStep(runner, batch, eager_options);
  EXPECT_EQ(graph.info.key, eager.info.key);
  EXPECT_FALSE(eager.info.replayed);
  EXPECT_EQ(graph.tokens, eager.tokens);
  EXPECT_EQ(graph.logits.size(), eager.logits.size());
  if (graph.logits.size() == eager.logits.size()) {
    EXPECT_EQ(std::memcmp(graph.logits.data(), eager.logits.data(),
                          graph.logits.size() * sizeof(float)),
              0)
        << "graph replay of " << KeyName(graph.info.key) << " differs from eager";
  }
  return graph.info.replayed;
}

class RunnerGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { KILN_REQUIRE_GPUS(1); }
};

TEST_F(RunnerGpuTest, EveryCapturedSizeReplaysLikeEager) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::unique_ptr<Runner> runner = MakeRunner(TinyOptions(GraphExecution::kFull, seed));
  ASSERT_NE(runner, nullptr);
  std::mt19937_64 rng(seed);
  auto token = [&] { return static_cast<int32_t>(rng() % LlamaShape::Tiny().vocab); };

  // Prefill sizes: one chunk of exactly N tokens, and N - 1 tokens over several sequences.
  int64_t id = 0;
  std::vector<int64_t> ids;
  for (int n : runner->prefill_sizes()->sizes()) {
    std::vector<SequenceTokens> one = {{id++, {}}};
    for (int i = 0; i < n; ++i) one[0].tokens.push_back(token());
    EXPECT_TRUE(ExpectGraphEqualsEager(*runner, one)) << "prefill/" << n << " did not replay";
    EXPECT_EQ(runner->last_step().padded_tokens, n);
    ids.push_back(one[0].id);
    std::vector<SequenceTokens> spread;
    int left = n - 1;
    while (left > 0) {
      const int len = std::min(left, 1 + static_cast<int>(rng() % 40));
      spread.push_back({id++, {}});
      for (int i = 0; i < len; ++i) spread.back().tokens.push_back(token());
      left -= len;
    }
    if (!spread.empty() && static_cast<int>(spread.size()) <= kMaxSeqs) {
      ExpectGraphEqualsEager(*runner, spread);
      for (const auto& s : spread) ids.push_back(s.id);
    }
    while (ids.size() > 48) {
      ASSERT_TRUE(runner->Release(ids.front()).ok());
      ids.erase(ids.begin());
    }
  }
  // Decode sizes: exactly B sequences of one token each.
  for (int b : runner->decode_sizes()->sizes()) {
    std::vector<SequenceTokens> batch;
    for (int i = 0; i < b; ++i) batch.push_back({ids[ids.size() - 1 - i], {token()}});
    EXPECT_TRUE(ExpectGraphEqualsEager(*runner, batch)) << "decode/" << b << " did not replay";
    EXPECT_EQ(runner->last_step().key, (CaptureKey{GraphMode::kDecode, b}));
  }
}

TEST_F(RunnerGpuTest, ThousandRandomCompositionsReplayLikeEager) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::unique_ptr<Runner> runner = MakeRunner(TinyOptions(GraphExecution::kFull, seed));
  ASSERT_NE(runner, nullptr);
  Traffic traffic(seed);
  std::map<GraphMode, int> replayed;
  for (int step = 0; step < 1000; ++step) {
    const auto kind = static_cast<Traffic::Kind>(traffic.rng()() % 3);
    const std::vector<SequenceTokens> batch = traffic.Next(kind, *runner);
    for (int64_t id : traffic.TakeReleases()) ASSERT_TRUE(runner->Release(id).ok());
    if (ExpectGraphEqualsEager(*runner, batch)) ++replayed[runner->last_step().key.mode];
    traffic.Committed(batch);
    if (HasFailure()) break;
  }
  // The compositions must have exercised both kinds of graphs, often.
  EXPECT_GT(replayed[GraphMode::kDecode], 200);
  EXPECT_GT(replayed[GraphMode::kPrefill], 400);
}

TEST_F(RunnerGpuTest, PiecewiseAndGraphFreeStepsEqualFullGraphs) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::unique_ptr<Runner> full = MakeRunner(TinyOptions(GraphExecution::kFull, seed));
  std::unique_ptr<Runner> piecewise = MakeRunner(TinyOptions(GraphExecution::kPiecewise, seed));
  std::unique_ptr<Runner> none = MakeRunner(TinyOptions(GraphExecution::kNone, seed));
  ASSERT_TRUE(full && piecewise && none);
  Traffic traffic(seed);
  int piecewise_replays = 0;
  for (int step = 0; step < 150; ++step) {
    const auto kind = static_cast<Traffic::Kind>(traffic.rng()() % 3);
    const std::vector<SequenceTokens> batch = traffic.Next(kind, *full);
    for (int64_t id : traffic.TakeReleases()) {
      ASSERT_TRUE(full->Release(id).ok());
      ASSERT_TRUE(piecewise->Release(id).ok());
      ASSERT_TRUE(none->Release(id).ok());
    }
    SCOPED_TRACE(absl::StrCat("step ", step, " batch ", Describe(batch)));
    const Outcome a = RunStep(*full, batch, {});
    const Outcome b = RunStep(*piecewise, batch, {});
    const Outcome c = RunStep(*none, batch, {});
    piecewise_replays += b.info.replayed;
    EXPECT_FALSE(c.info.replayed);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.tokens, c.tokens);
    ASSERT_EQ(a.logits.size(), b.logits.size());
    ASSERT_EQ(a.logits.size(), c.logits.size());
    EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4), 0)
        << "piecewise differs from full at " << KeyName(a.info.key);
    EXPECT_EQ(std::memcmp(a.logits.data(), c.logits.data(), a.logits.size() * 4), 0)
        << "graph-free differs from full at " << KeyName(a.info.key);
    traffic.Committed(batch);
    if (HasFailure()) break;
  }
  EXPECT_GT(piecewise_replays, 100);
}

// Captures a piecewise runner over decode sizes 2, 4 and 8 (largest first, each piece every key
// before the next piece) whose capture fails at piece `failing_piece`'s capture of decode/
// `failing_size`, then runs a prefill and decode steps of 8 down to 1 rows on it and on a
// graph-free runner. Every step has the graph-free runner's tokens and logits; a decode step
// replays exactly when its padded size is in `replayed_sizes` (a key every piece holds).
void ExpectFailedPiecewiseCaptureRunsEagerly(int failing_piece, int failing_size,
                                             const std::vector<int>& replayed_sizes) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", capture failing at piece ", failing_piece,
                            "'s decode/", failing_size));
  RunnerOptions options = TinyOptions(GraphExecution::kPiecewise, seed);
  options.capture_prefill = false;
  options.config.mutable_graph()->clear_capture_sizes();
  for (int size : {2, 4, 8}) options.config.mutable_graph()->add_capture_sizes(size);
  RunnerOptions reference_options = options;
  reference_options.graphs = GraphExecution::kNone;
  // Piece p captures a key as the key's (p + 1)-th capture (warm-ups aside).
  std::map<int, int> captures;
  options.capture_step_hook_for_testing = [&captures, failing_piece, failing_size](CaptureKey key) {
    if (CaptureContext::Phase() != CapturePhase::kCapture) return absl::OkStatus();
    if (++captures[key.size] == failing_piece + 1 && key.size == failing_size) {
      return absl::InternalError("Stopped at the injected capture");
    }
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<Runner>> created = Runner::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  Runner& runner = **created;
  ASSERT_GT(runner.model().num_pieces(), failing_piece);
  const absl::StatusOr<RunnerCaptureSummary> captured = runner.Capture();
  ASSERT_FALSE(captured.ok());
  EXPECT_NE(captured.status().message().find(absl::StrCat(
                "Capture of decode/", failing_size, " failed: Stopped at the injected capture")),
            std::string::npos)
      << captured.status();
  EXPECT_EQ(captures[failing_size], failing_piece + 1) << "the capture went on after the failure";
  std::unique_ptr<Runner> reference = MakeRunner(reference_options);
  ASSERT_NE(reference, nullptr);

  std::mt19937_64 rng(seed);
  auto token = [&] { return static_cast<int32_t>(rng() % LlamaShape::Tiny().vocab); };
  std::vector<SequenceTokens> prompts;
  for (int i = 0; i < 8; ++i) {
    SequenceTokens s{i, {}};
    for (int t = 0; t < 17 + 5 * i; ++t) s.tokens.push_back(token());
    prompts.push_back(std::move(s));
  }
  ASSERT_EQ(RunStep(runner, prompts, {}).tokens, RunStep(*reference, prompts, {}).tokens);
  for (int rows : {8, 5, 4, 3, 2, 1}) {
    std::vector<SequenceTokens> batch;
    for (int i = 0; i < rows; ++i) batch.push_back({i, {token()}});
    SCOPED_TRACE(absl::StrCat(rows, " decode rows"));
    const Outcome got = RunStep(runner, batch, {});
    const Outcome want = RunStep(*reference, batch, {});
    const int padded = rows > 4 ? 8 : rows > 2 ? 4 : 2;
    EXPECT_EQ(got.info.key, (CaptureKey{GraphMode::kDecode, padded}));
    EXPECT_EQ(got.info.replayed,
              std::count(replayed_sizes.begin(), replayed_sizes.end(), padded) == 1);
    EXPECT_FALSE(want.info.replayed);
    EXPECT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(got.logits.size(), want.logits.size());
    EXPECT_EQ(std::memcmp(got.logits.data(), want.logits.data(), want.logits.size() * 4), 0);
  }
}

// The last piece's capture fails at decode/4, after its decode/8: decode/4 and decode/2 lack the
// last piece and run eagerly; decode/8, which every piece holds, still replays.
TEST_F(RunnerGpuTest, PiecewiseStepWhoseKeyAPieceLacksRunsEagerly) {
  ExpectFailedPiecewiseCaptureRunsEagerly(/*failing_piece=*/LlamaShape::Tiny().layers,
                                          /*failing_size=*/4, /*replayed_sizes=*/{8});
}

// Piece 1's first capture (decode/8) fails: piece 0 holds every key, piece 1 none, and the later
// pieces have no graph set at all (fewer sets than pieces): every step runs eagerly.
TEST_F(RunnerGpuTest, PiecewiseStepsRunEagerlyWhenACaptureStopsBeforeTheLastPiece) {
  ExpectFailedPiecewiseCaptureRunsEagerly(/*failing_piece=*/1, /*failing_size=*/8,
                                          /*replayed_sizes=*/{});
}

// A change to the runner's options that must not change a bit: `edit` applied to `base`;
// `applies(model, info)` says whether it changes how the step `info` describes runs.
struct Variant {
  RunnerOptions base;
  std::function<void(RunnerOptions&)> edit;
  std::function<bool(const LlamaModel&, const StepInfo&)> applies;
  const char* what;

  RunnerOptions Changed() const {
    RunnerOptions o = base;
    edit(o);
    return o;
  }
};

// A runner with the variant and no graphs, to ask its model what runs on this GPU.
std::unique_ptr<Runner> MakeProbe(const Variant& v) {
  RunnerOptions o = v.Changed();
  o.graphs = GraphExecution::kNone;
  return MakeRunner(o);
}

// Runs 160 steps of random traffic (three in four of at most 8 tokens: decodes of 1 to 8
// sequences and short prefills; every second step eager) through runners with the variant (full
// graphs, and piecewise graphs) and one without, and expects the same tokens and logits bit for
// bit; at least 30 steps the variant applies to must run each way.
void ExpectVariantGivesBaseBits(const Variant& v, uint64_t seed) {
  RunnerOptions options = v.Changed();
  std::unique_ptr<Runner> changed = MakeRunner(options);
  options.graphs = GraphExecution::kPiecewise;
  std::unique_ptr<Runner> piecewise = MakeRunner(options);
  std::unique_ptr<Runner> reference = MakeRunner(v.base);
  ASSERT_TRUE(changed && piecewise && reference);
  Traffic traffic(seed);
  int changed_graphs = 0, changed_eager = 0, changed_pieces = 0;
  for (int step = 0; step < 160; ++step) {
    std::vector<SequenceTokens> batch;
    for (int attempt = 0; attempt < 50; ++attempt) {
      batch = traffic.Next(static_cast<Traffic::Kind>(traffic.rng()() % 3), *changed);
      int tokens = 0;
      for (const SequenceTokens& s : batch) tokens += static_cast<int>(s.tokens.size());
      if (step % 4 == 0 || tokens <= 8) break;
    }
    for (int64_t id : traffic.TakeReleases()) {
      ASSERT_TRUE(changed->Release(id).ok());
      ASSERT_TRUE(piecewise->Release(id).ok());
      ASSERT_TRUE(reference->Release(id).ok());
    }
    SCOPED_TRACE(absl::StrCat("step ", step, " batch ", Describe(batch)));
    StepOptions step_options;
    step_options.force_eager = step % 2 == 1;
    const Outcome a = RunStep(*changed, batch, step_options);
    const Outcome b = RunStep(*reference, batch, step_options);
    const Outcome c = RunStep(*piecewise, batch, step_options);
    if (v.applies(changed->model(), a.info)) {
      ++(a.info.replayed ? changed_graphs : changed_eager);
      changed_pieces += c.info.replayed;
    }
    EXPECT_EQ(a.info.key, b.info.key);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(c.tokens, b.tokens);
    ASSERT_EQ(a.logits.size(), b.logits.size());
    ASSERT_EQ(c.logits.size(), b.logits.size());
    EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4), 0)
        << v.what << " differs from the reference at " << KeyName(a.info.key)
        << (a.info.replayed ? " (graph)" : " (eager)");
    EXPECT_EQ(std::memcmp(c.logits.data(), b.logits.data(), c.logits.size() * 4), 0)
        << v.what << " in piecewise graphs differs from the reference at " << KeyName(c.info.key);
    traffic.Committed(batch);
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(changed_graphs, 30);
  EXPECT_GT(changed_eager, 30);
  EXPECT_GT(changed_pieces, 30);
}

// The variant against its base in decode steps of every row count from 1 to 8, each as a graph of
// its own size and eagerly at it, after one prefill of 8 prompts whose lengths sit at block
// boundaries; it must apply to every decode step. Eight decode graphs and no prefill
// graphs: small enough to run under compute-sanitizer, where the random traffic above is not.
void ExpectDecodeStepsOfEveryRowCountGiveBaseBits(Variant v, uint64_t seed) {
  v.base.capture_prefill = false;
  v.base.config.mutable_graph()->clear_capture_sizes();
  for (int s = 1; s <= 8; ++s) v.base.config.mutable_graph()->add_capture_sizes(s);
  std::unique_ptr<Runner> changed = MakeRunner(v.Changed());
  std::unique_ptr<Runner> reference = MakeRunner(v.base);
  ASSERT_TRUE(changed && reference);
  std::mt19937_64 rng(seed);
  auto token = [&] { return static_cast<int32_t>(rng() % LlamaShape::Tiny().vocab); };
  std::vector<SequenceTokens> prompts;
  for (int len : {15, 16, 17, 31, 32, 33, 63, 65}) {
    SequenceTokens s{static_cast<int64_t>(prompts.size()), {}};
    for (int i = 0; i < len; ++i) s.tokens.push_back(token());
    prompts.push_back(std::move(s));
  }
  ASSERT_EQ(RunStep(*changed, prompts, {}).tokens, RunStep(*reference, prompts, {}).tokens);
  for (int rows = 1; rows <= 8; ++rows) {
    std::vector<SequenceTokens> batch;
    for (int i = 0; i < rows; ++i) batch.push_back({i, {token()}});
    SCOPED_TRACE(absl::StrCat(rows, " decode rows"));
    StepOptions graph_options;
    graph_options.commit = false;
    StepOptions eager_options;
    eager_options.force_eager = true;
    const Outcome graph = RunStep(*changed, batch, graph_options);
    const Outcome eager = RunStep(*changed, batch, eager_options);
    const Outcome want = RunStep(*reference, batch, eager_options);
    EXPECT_TRUE(graph.info.replayed);
    EXPECT_FALSE(eager.info.replayed);
    EXPECT_EQ(graph.info.padded_tokens, rows);
    EXPECT_TRUE(v.applies(changed->model(), graph.info)) << v.what << " did not run";
    EXPECT_TRUE(v.applies(changed->model(), eager.info)) << v.what << " did not run";
    for (const Outcome* got : {&graph, &eager}) {
      EXPECT_EQ(got->tokens, want.tokens);
      ASSERT_EQ(got->logits.size(), want.logits.size());
      EXPECT_EQ(std::memcmp(got->logits.data(), want.logits.data(), want.logits.size() * 4), 0)
          << v.what << (got == &graph ? " (graph)" : " (eager)") << " differs from the reference";
    }
    if (::testing::Test::HasFailure()) break;
  }
}

TEST_F(RunnerGpuTest, FoldedNormsGiveTheNormKernelsBits) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  Variant v{TinyOptions(GraphExecution::kFull, seed),
            [](RunnerOptions& o) { o.fold_norm_into_gemm = true; },
            [](const LlamaModel& m, const StepInfo& info) {
              return m.FoldsNorms(info.padded_tokens);
            },
            "the folded norm"};
  v.base.fold_norm_into_gemm = false;
  v.base.layer_kernel_rows = 0;  // it would take the steps the fold applies to
  v.base.prefetch_gemm_rows = kPrefetchEverywhere;  // the fold needs the prefetch GEMM
  // Skip on what the GPU is, never on what the model chose: otherwise a model that stopped
  // folding on a GPU of compute capability 9.0 would pass by skipping.
  if (!CurrentDeviceIsSm90OrLater()) {
    GTEST_SKIP() << "The fold runs in the prefetch GEMM, which needs compute capability 9.0";
  }
  std::unique_ptr<Runner> probe = MakeProbe(v);
  ASSERT_NE(probe, nullptr);
  ASSERT_TRUE(probe->model().FoldsNorms(1)) << "the fold does not run on this GPU";
  EXPECT_TRUE(probe->model().FoldsNorms(8));
  EXPECT_FALSE(probe->model().FoldsNorms(16));  // past the prefetch GEMM's rows
  probe.reset();
  ExpectVariantGivesBaseBits(v, seed);
}

// The decode layer kernel up to its most rows against the kernel-per-operation step, over
// `model`.
Variant LayerKernelVariant(const config::ModelShape& model, uint64_t seed) {
  Variant v{TinyOptions(GraphExecution::kFull, seed),
            [](RunnerOptions& o) { o.layer_kernel_rows = kDecodeLayerMaxRows; },
            [](const LlamaModel& m, const StepInfo& info) {
              return m.UsesLayerKernel(info.padded_tokens);
            },
            "the decode layer kernel"};
  *v.base.config.mutable_model() = model;
  v.base.layer_kernel_rows = 0;
  v.base.prefetch_gemm_rows = kPrefetchEverywhere;  // the layer kernel needs the prefetch GEMM
  // Its ring stages hold 16 rows of one k range, as the prefetch GEMM's do without row halves.
  v.base.prefetch_row_halves = false;
  return v;
}

// Returns whether the decode layer kernel runs on this GPU; where it does, expects it at every
// row count up to kDecodeLayerMaxRows and at none above. Callers skip on a GPU without compute
// capability 9.0 only (CurrentDeviceIsSm90OrLater) and assert this on one that has it, so a
// model that stopped choosing the kernel fails there instead of skipping.
bool LayerKernelRunsAtItsRows(const Variant& v) {
  std::unique_ptr<Runner> probe = MakeProbe(v);
  EXPECT_NE(probe, nullptr);
  if (probe == nullptr || !probe->model().UsesLayerKernel(1)) return false;
  for (int m = 1; m <= kDecodeLayerMaxRows; ++m) EXPECT_TRUE(probe->model().UsesLayerKernel(m));
  EXPECT_FALSE(probe->model().UsesLayerKernel(kDecodeLayerMaxRows + 1));
  return true;
}

constexpr char kNoLayerKernel[] = "The decode layer kernel needs compute capability 9.0";

// Over random traffic.
void ExpectLayerKernelGivesKernelPerOperationBits(const config::ModelShape& model, uint64_t seed) {
  const Variant v = LayerKernelVariant(model, seed);
  if (!CurrentDeviceIsSm90OrLater()) GTEST_SKIP() << kNoLayerKernel;
  ASSERT_TRUE(LayerKernelRunsAtItsRows(v)) << "the decode layer kernel does not run on this GPU";
  ExpectVariantGivesBaseBits(v, seed);
}

TEST_F(RunnerGpuTest, LayerKernelGivesTheKernelPerOperationBits) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectLayerKernelGivesKernelPerOperationBits(TinyModel(), seed);
}

// The decode layer kernel's own RoPE phase with Llama 3 scaling.
TEST_F(RunnerGpuTest, LayerKernelGivesTheKernelPerOperationBitsWithRopeScaling) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectLayerKernelGivesKernelPerOperationBits(TinyScaledModel(), seed);
}

TEST_F(RunnerGpuTest, LayerKernelGivesTheChainBitsAtEveryRowCount) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  const Variant v = LayerKernelVariant(TinyModel(), seed);
  if (!CurrentDeviceIsSm90OrLater()) GTEST_SKIP() << kNoLayerKernel;
  ASSERT_TRUE(LayerKernelRunsAtItsRows(v)) << "the decode layer kernel does not run on this GPU";
  ExpectDecodeStepsOfEveryRowCountGiveBaseBits(v, seed);
}

// The tiny model at hidden 2048, ffn 8192 and head_dim 128 (16 / 4 heads).
config::ModelShape WideModel() {
  LlamaShape wide = LlamaShape::Tiny();
  wide.hidden = 2048;
  wide.heads = 16;
  wide.kv_heads = 4;
  wide.head_dim = 128;
  wide.ffn = 8192;
  return ModelShapeFromLlamaShape(wide, "wide");
}

// Rows of k = 2048 and 8192 (several ring stages per row group; the down projection's x at the
// kernel's widest) and head_dim 128.
TEST_F(RunnerGpuTest, LayerKernelGivesTheKernelPerOperationBitsAtWideShapes) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectLayerKernelGivesKernelPerOperationBits(WideModel(), seed);
}

// RoPE + KV append in decode attention against the RoPE + KV append kernel, over `model`: every
// decode step (without the decode layer kernel, which keeps its own RoPE phase).
Variant RopeInAttentionVariant(const config::ModelShape& model, uint64_t seed) {
  Variant v{TinyOptions(GraphExecution::kFull, seed),
            [](RunnerOptions& o) {
              o.rope_in_attention_rows = kMaxTokens;
              o.rope_in_attention_min_rows = 1;
            },
            // Decode keys plan a decode part only: their steps rotate in attention.
            [](const LlamaModel&, const StepInfo& info) {
              return info.key.mode == GraphMode::kDecode && !info.eager_key;
            },
            "RoPE + KV append in attention"};
  *v.base.config.mutable_model() = model;
  v.base.layer_kernel_rows = 0;
  v.base.rope_in_attention_rows = 0;
  return v;
}

TEST_F(RunnerGpuTest, RopeInAttentionGivesTheRopeKernelBits) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectVariantGivesBaseBits(RopeInAttentionVariant(TinyModel(), seed), seed);
}

TEST_F(RunnerGpuTest, RopeInAttentionGivesTheRopeKernelBitsAtEveryRowCount) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectDecodeStepsOfEveryRowCountGiveBaseBits(RopeInAttentionVariant(TinyModel(), seed), seed);
}

// head_dim 128 (each lane rotates two pairs of loads) at the wide shape.
TEST_F(RunnerGpuTest, RopeInAttentionGivesTheRopeKernelBitsAtHeadDim128) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectVariantGivesBaseBits(RopeInAttentionVariant(WideModel(), seed), seed);
}

// Qwen3's QK norm: where attention rotates, it norms q and the new k itself
// (attention/qk_norm_math.cuh), the bits of the QK norm kernel before the RoPE kernel; at
// head_dim 64 at every row count, and at 128.
config::ModelShape WithQkNorm(config::ModelShape model) {
  model.set_qk_norm(true);
  return model;
}

TEST_F(RunnerGpuTest, RopeInAttentionGivesTheQkNormAndRopeKernelBitsAtEveryRowCount) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectDecodeStepsOfEveryRowCountGiveBaseBits(
      RopeInAttentionVariant(WithQkNorm(TinyModel()), seed), seed);
}

TEST_F(RunnerGpuTest, RopeInAttentionGivesTheQkNormAndRopeKernelBitsAtHeadDim128) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectVariantGivesBaseBits(RopeInAttentionVariant(WithQkNorm(WideModel()), seed), seed);
}

TEST_F(RunnerGpuTest, RopeInAttentionGivesTheRopeKernelBitsWithRopeScaling) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectVariantGivesBaseBits(RopeInAttentionVariant(TinyScaledModel(), seed), seed);
}

// Compares each sequence's logits row with the reference's, and the sampled token with the
// reference's argmax where its margin over the runner-up is clear.
class ReferenceCheck {
 public:
  static constexpr double kTolerance = 1e-2;  // bf16 activations: 1e-3 .. 1e-2

  // bf16_activations: the reference rounds where kiln stores bf16 (ReferenceDecoderOptions).
  ReferenceCheck(const LlamaShape& shape, uint64_t seed, bool bf16_activations = true)
      : vocab_(shape.vocab) {
    auto weights = RandomLlamaHostWeights(shape, seed);
    EXPECT_TRUE(weights.ok());
    ReferenceDecoderOptions options;
    options.bf16_activations = bf16_activations;
    auto ref = ReferenceDecoder::Create(*std::move(weights), options);
    EXPECT_TRUE(ref.ok());
    ref_ = std::make_unique<ReferenceDecoder>(*std::move(ref));
  }

  // Feeds the batch to the reference and checks `got` (the runner's outcome of the same batch).
  void Check(const std::vector<SequenceTokens>& batch, const Outcome& got) {
    const int vocab = vocab_;
    ASSERT_EQ(got.logits.size(), batch.size() * vocab);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (seq_.count(batch[i].id) == 0) seq_[batch[i].id] = ref_->AddSequence();
      auto logits = ref_->Forward(seq_[batch[i].id], batch[i].tokens);
      ASSERT_TRUE(logits.ok()) << logits.status();
      const double* ref = logits->data() + (batch[i].tokens.size() - 1) * vocab;
      const float* mine = got.logits.data() + i * vocab;
      double diff = 0, norm = 0, best = -1e300, second = -1e300;
      int32_t best_index = -1;
      for (int v = 0; v < vocab; ++v) {
        diff += (mine[v] - ref[v]) * (mine[v] - ref[v]);
        norm += ref[v] * ref[v];
        if (ref[v] > best) {
          second = best;
          best = ref[v];
          best_index = v;
        } else if (ref[v] > second) {
          second = ref[v];
        }
      }
      const double rel = std::sqrt(diff / norm);
      max_rel_ = std::max(max_rel_, rel);
      EXPECT_LT(rel, kTolerance) << "sequence " << batch[i].id;
      // The sampler's token is the argmax of the runner's own logits (lowest index on ties).
      ASSERT_GE(got.tokens[i], 0);
      ASSERT_LT(got.tokens[i], vocab);
      const int32_t own = static_cast<int32_t>(
          std::max_element(mine, mine + vocab) - mine);
      EXPECT_EQ(got.tokens[i], own);
      // A clear margin: far above what an error of the tolerance can move a logit.
      const double rms = std::sqrt(norm / vocab);
      const double clear = 8 * kTolerance * rms;
      if (best - second > clear) {
        ++clear_checks_;
        EXPECT_EQ(got.tokens[i], best_index) << "sequence " << batch[i].id << " margin "
                                             << best - second;
      } else {
        ++near_ties_;
        EXPECT_GE(ref[got.tokens[i]], best - clear) << "token far from the reference's best";
      }
    }
  }

  int clear_checks() const { return clear_checks_; }
  int near_ties() const { return near_ties_; }
  double max_rel() const { return max_rel_; }

 private:
  int vocab_;
  std::unique_ptr<ReferenceDecoder> ref_;
  std::map<int64_t, int> seq_;
  int clear_checks_ = 0;
  int near_ties_ = 0;
  double max_rel_ = 0;
};

// SiLU·mul in the gate-up projection's GEMM (prefetch or TMA) against the SiLU·mul kernel, over
// `model`.
Variant GateUpSiluVariant(const config::ModelShape& model, uint64_t seed) {
  Variant v{TinyOptions(GraphExecution::kFull, seed),
            [](RunnerOptions& o) { o.prefetch_gate_up_silu = o.tma_gate_up_silu = true; },
            [](const LlamaModel& m, const StepInfo& info) {
              return m.GateUpWritesSiluMul(info.padded_tokens);
            },
            "SiLU·mul in the gate-up GEMM"};
  *v.base.config.mutable_model() = model;
  v.base.prefetch_gate_up_silu = v.base.tma_gate_up_silu = false;
  return v;
}

constexpr char kNoBulkCopy[] = "The prefetch and TMA GEMMs need compute capability 9.0";

// Returns whether the epilogue runs on this GPU; where it does, expects it at 1 to `last` rows
// (where the prefetch and TMA GEMMs take the gate-up projection) and not above. Callers skip on a
// GPU without compute capability 9.0 only and assert this on one that has it.
bool GateUpSiluRunsAtItsRows(const Variant& v, int last) {
  std::unique_ptr<Runner> probe = MakeProbe(v);
  EXPECT_NE(probe, nullptr);
  if (probe == nullptr || !probe->model().GateUpWritesSiluMul(1)) return false;
  for (int m = 1; m <= last + 1; ++m) {
    EXPECT_EQ(probe->model().GateUpWritesSiluMul(m), m <= last) << m << " rows";
  }
  return true;
}

// Over random traffic: the prefetch GEMM at 1–2 rows, the TMA GEMM above.
void ExpectGateUpSiluGivesSiluMulKernelBits(const config::ModelShape& model, uint64_t seed) {
  const Variant v = GateUpSiluVariant(model, seed);
  if (!CurrentDeviceIsSm90OrLater()) GTEST_SKIP() << kNoBulkCopy;
  ASSERT_TRUE(GateUpSiluRunsAtItsRows(v, v.base.tma_gemm_rows.gate_up))
      << "the SiLU·mul epilogue does not run on this GPU";
  ExpectVariantGivesBaseBits(v, seed);
}

TEST_F(RunnerGpuTest, GateUpSiluEpilogueGivesTheSiluMulKernelBits) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectGateUpSiluGivesSiluMulKernelBits(TinyModel(), seed);
}

TEST_F(RunnerGpuTest, GateUpSiluEpilogueGivesTheSiluMulKernelBitsAtEveryRowCount) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  Variant v = GateUpSiluVariant(TinyModel(), seed);
  // The TMA GEMM at every row count: no decode layer kernel (as by default), no prefetch GEMM
  // for gate-up.
  v.base.layer_kernel_rows = 0;
  v.base.prefetch_gemm_rows.gate_up = 0;
  if (!CurrentDeviceIsSm90OrLater()) GTEST_SKIP() << kNoBulkCopy;
  ASSERT_TRUE(GateUpSiluRunsAtItsRows(v, v.base.tma_gemm_rows.gate_up))
      << "the SiLU·mul epilogue does not run on this GPU";
  ExpectDecodeStepsOfEveryRowCountGiveBaseBits(v, seed);
}

TEST_F(RunnerGpuTest, PrefetchGateUpSiluGivesTheSiluMulKernelBitsAtEveryRowCount) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  Variant v = GateUpSiluVariant(TinyModel(), seed);
  // The prefetch GEMM at every row count it takes.
  v.base.layer_kernel_rows = 0;
  v.base.prefetch_gemm_rows.gate_up = kPrefetchGemmMaxRows;
  v.base.tma_gemm_rows.gate_up = 0;
  if (!CurrentDeviceIsSm90OrLater()) GTEST_SKIP() << kNoBulkCopy;
  ASSERT_TRUE(GateUpSiluRunsAtItsRows(v, kPrefetchGemmMaxRows))
      << "the SiLU·mul epilogue does not run on this GPU";
  ExpectDecodeStepsOfEveryRowCountGiveBaseBits(v, seed);
}

// ffn 8192: 256 tiles of one k slice each (the tiny model's take several).
TEST_F(RunnerGpuTest, GateUpSiluEpilogueGivesTheSiluMulKernelBitsAtWideShapes) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectGateUpSiluGivesSiluMulKernelBits(WideModel(), seed);
}

// Greedy generation of `shape` (the tiny model's sizes) over graph keys and the eager key against
// the CPU float64 reference.
void ExpectGreedyGenerationMatchesReference(const LlamaShape& shape, uint64_t seed) {
  RunnerOptions options = TinyOptions(GraphExecution::kFull, seed);
  *options.config.mutable_model() = ModelShapeFromLlamaShape(shape, "tiny");
  for (int s : {1, 2, 4}) options.config.mutable_graph()->add_capture_sizes(s);
  options.prefill_sizes = {16, 32};
  std::unique_ptr<Runner> runner = MakeRunner(options);
  ASSERT_NE(runner, nullptr);
  ReferenceCheck check(shape, seed);
  std::mt19937_64 rng(seed);
  std::map<int64_t, int32_t> next;  // each sequence's next input token

  auto step = [&](std::vector<SequenceTokens> batch, bool expect_replay) {
    SCOPED_TRACE(absl::StrCat("batch ", Describe(batch)));
    const Outcome got = RunStep(*runner, batch, {});
    EXPECT_EQ(got.info.replayed, expect_replay) << KeyName(got.info.key);
    check.Check(batch, got);
    for (size_t i = 0; i < batch.size(); ++i) next[batch[i].id] = got.tokens[i];
  };
  auto prompt = [&](int64_t id, int len) {
    SequenceTokens s{id, {}};
    for (int i = 0; i < len; ++i) s.tokens.push_back(static_cast<int32_t>(rng() % 1024));
    return s;
  };
  auto decodes = [&](std::vector<int64_t> ids) {
    std::vector<SequenceTokens> batch;
    for (int64_t id : ids) batch.push_back({id, {next[id]}});
    return batch;
  };

  // 6 prompts at and around block boundaries, 87 tokens: above every prefill size (eager key).
  std::vector<SequenceTokens> prompts;
  const int lens[] = {1, 15, 16, 17, 33, 5};
  for (int i = 0; i < 6; ++i) prompts.push_back(prompt(i, lens[i]));
  step(prompts, false);
  EXPECT_TRUE(runner->last_step().eager_key);
  for (int t = 0; t < 4; ++t) step(decodes({0, 1, 2, 3, 4, 5}), false);  // 6 > 4: eager key
  ASSERT_TRUE(runner->Release(4).ok());
  ASSERT_TRUE(runner->Release(5).ok());
  for (int t = 0; t < 4; ++t) step(decodes({0, 1, 2, 3}), true);  // decode/4 graph
  std::vector<SequenceTokens> mixed = decodes({0, 1, 2, 3});
  mixed.push_back(prompt(6, 12));
  step(mixed, true);  // 16 tokens: prefill/16 graph with decodes in it
  for (int t = 0; t < 4; ++t) step(decodes({0, 1, 2, 3, 6}), false);  // 5 > 4: eager key
  for (int t = 0; t < 3; ++t) step(decodes({2, 6}), true);            // decode/2 graph
  std::vector<SequenceTokens> chunk = {prompt(1, 40)};                // a later chunk, 40 tokens
  step(chunk, false);                                                 // above 32: eager key
  step({prompt(1, 20)}, true);                                        // prefill/32 graph
  for (int t = 0; t < 3; ++t) step(decodes({1}), true);              // decode/1 graph

  std::printf("reference check (RoPE scaling %s): %d clear-margin tokens, %d near ties, max "
              "logits rel err %.2e\n",
              shape.rope_scaling.ToString().c_str(), check.clear_checks(), check.near_ties(),
              check.max_rel());
  EXPECT_GE(check.clear_checks(), 40);
}

// Three query heads per KV head (Llama 3.2 3B's grouping: 24 over 8), at the tiny model's size.
TEST_F(RunnerGpuTest, GreedyGenerationWithGroupsOfThreeMatchesReference) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  LlamaShape shape = LlamaShape::Tiny();
  shape.heads = 6;
  shape.kv_heads = 2;
  shape.hidden = 384;
  ExpectGreedyGenerationMatchesReference(shape, seed);
}

// Qwen2's QKV bias (the bias kernel after every QKV GEMM path), at the tiny model's size.
TEST_F(RunnerGpuTest, GreedyGenerationWithQkvBiasMatchesReference) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  LlamaShape shape = LlamaShape::Tiny();
  shape.qkv_bias = true;
  ExpectGreedyGenerationMatchesReference(shape, seed);
}

// Qwen2.5 0.5B's heads (14 over 2: seven per KV head) and width, with its QKV bias.
TEST_F(RunnerGpuTest, GreedyGenerationWithGroupsOfSevenAndQkvBiasMatchesReference) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  LlamaShape shape = LlamaShape::Tiny();
  shape.heads = 14;
  shape.kv_heads = 2;
  shape.hidden = 896;
  shape.qkv_bias = true;
  ExpectGreedyGenerationMatchesReference(shape, seed);
}

// Qwen3's QK norm (the norm kernel after every QKV GEMM path, before every RoPE path), at the
// tiny model's size.
TEST_F(RunnerGpuTest, GreedyGenerationWithQkNormMatchesReference) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  LlamaShape shape = LlamaShape::Tiny();
  shape.qk_norm = true;
  ExpectGreedyGenerationMatchesReference(shape, seed);
}

// Qwen3-4B's proportions: query heads of 128 wider together (8 x 128 = 1024) than the model
// (hidden 512), two query heads per KV head, with the QK norm and a QKV bias on top.
TEST_F(RunnerGpuTest, GreedyGenerationWithWideHeadsAndQkNormMatchesReference) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  LlamaShape shape = LlamaShape::Tiny();
  shape.hidden = 512;
  shape.heads = 8;
  shape.kv_heads = 4;
  shape.head_dim = 128;
  shape.qk_norm = true;
  shape.qkv_bias = true;
  ExpectGreedyGenerationMatchesReference(shape, seed);
}

TEST_F(RunnerGpuTest, GreedyGenerationAndEagerFallbackMatchReference) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectGreedyGenerationMatchesReference(LlamaShape::Tiny(), seed);
}

// Llama 3's scaling, in every RoPE path the steps take (the RoPE kernel in prefill, RoPE + KV
// append or attention's rotation in decode), against the reference's. The scaling changes the
// logits far beyond the tolerance, so a path that left it out would fail.
TEST_F(RunnerGpuTest, GreedyGenerationWithRopeScalingMatchesReference) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  ExpectGreedyGenerationMatchesReference(TinyScaledShape(), seed);

  RunnerOptions plain = TinyOptions(GraphExecution::kNone, seed);
  plain.capture_prefill = false;
  RunnerOptions scaled = plain;
  *scaled.config.mutable_model() = TinyScaledModel();
  std::unique_ptr<Runner> a = MakeRunner(plain);
  std::unique_ptr<Runner> b = MakeRunner(scaled);
  ASSERT_TRUE(a && b);
  const std::vector<SequenceTokens> prompt = {{1, {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9}}};
  const Outcome x = RunStep(*a, prompt, {});
  const Outcome y = RunStep(*b, prompt, {});
  ASSERT_EQ(x.logits.size(), y.logits.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.logits.size(); ++i) {
    diff += (x.logits[i] - y.logits[i]) * (x.logits[i] - y.logits[i]);
    norm += double{x.logits[i]} * x.logits[i];
  }
  EXPECT_GT(std::sqrt(diff / norm), 5 * ReferenceCheck::kTolerance)
      << "the scaling hardly changes the logits: the check above could not catch its absence";
}

// A prompt each (eager), then decode steps (the decode/2 graph): `a` and `b` give the same tokens
// and logits, bit for bit.
void ExpectSameTokensAndLogits(Runner& a, Runner& b) {
  std::vector<SequenceTokens> batch = {{1, {3, 1, 4, 1, 5}}, {2, {9, 2, 6}}};
  for (int t = 0; t < 4; ++t) {
    SCOPED_TRACE(absl::StrCat("step ", t));
    const Outcome x = RunStep(a, batch, {});
    const Outcome y = RunStep(b, batch, {});
    ASSERT_EQ(x.tokens.size(), 2u);
    ASSERT_EQ(x.tokens, y.tokens);
    ASSERT_EQ(x.logits.size(), y.logits.size());
    EXPECT_EQ(std::memcmp(x.logits.data(), y.logits.data(), x.logits.size() * sizeof(float)), 0);
    batch = {{1, {x.tokens[0]}}, {2, {x.tokens[1]}}};
  }
}

// A prompt of nearly kMaxModelLen tokens in two chunks, then decode steps, against the reference:
// the attention paths over long contexts (prefill chunks over a cached one, decode over ~1000
// tokens) keep the short prompts' accuracy.
TEST_F(RunnerGpuTest, LongPromptMatchesReference) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  for (const LlamaShape& shape : {LlamaShape::Tiny(), TinyScaledShape()}) {
    SCOPED_TRACE(shape.rope_scaling.ToString());
    RunnerOptions options = TinyOptions(GraphExecution::kFull, seed);
    *options.config.mutable_model() = ModelShapeFromLlamaShape(shape, "tiny");
    for (int s : {1, 2}) options.config.mutable_graph()->add_capture_sizes(s);
    options.capture_prefill = false;
    std::unique_ptr<Runner> runner = MakeRunner(options);
    ASSERT_NE(runner, nullptr);
    ReferenceCheck check(shape, seed);
    ReferenceCheck exact(shape, seed, /*bf16_activations=*/false);
    std::mt19937_64 rng(seed);
    std::vector<int32_t> prompt(kMaxModelLen - 24);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % shape.vocab);
    int32_t next = -1;
    for (size_t at = 0; at < prompt.size(); at += kMaxTokens) {
      const size_t end = std::min(prompt.size(), at + kMaxTokens);
      std::vector<SequenceTokens> chunk = {
          {1, std::vector<int32_t>(prompt.begin() + at, prompt.begin() + end)}};
      const Outcome got = RunStep(*runner, chunk, {});
      check.Check(chunk, got);
      exact.Check(chunk, got);
      next = got.tokens[0];
    }
    for (int t = 0; t < 8; ++t) {
      std::vector<SequenceTokens> step = {{1, {next}}};
      const Outcome got = RunStep(*runner, step, {});
      EXPECT_TRUE(got.info.replayed);
      check.Check(step, got);
      exact.Check(step, got);
      next = got.tokens[0];
    }
    std::printf("long prompt (%zu tokens, RoPE scaling %s): max logits rel err %.2e against the "
                "bf16-rounding reference, %.2e against float64\n",
                prompt.size(), shape.rope_scaling.ToString().c_str(), check.max_rel(),
                exact.max_rel());
  }
}

TEST_F(RunnerGpuTest, SafetensorsWeightsGiveTheSeededWeightsBits) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  absl::StatusOr<LlamaHostWeights> host = RandomLlamaHostWeights(LlamaShape::Tiny(), seed);
  ASSERT_TRUE(host.ok()) << host.status();
  const std::string path = TestTempPath("runner_tiny.safetensors");
  ASSERT_TRUE(WriteLlamaSafetensors(path, *host).ok());

  RunnerOptions seeded = TinyOptions(GraphExecution::kFull, seed);
  for (int s : {1, 2}) seeded.config.mutable_graph()->add_capture_sizes(s);
  seeded.capture_prefill = false;
  RunnerOptions from_file = seeded;
  from_file.weight_seed = seed + 1;  // not used: the file's weights are the seed's
  from_file.weight_files = {path};
  std::ostringstream log;
  from_file.progress = CaptureProgress::kLines;
  from_file.progress_stream = &log;
  std::unique_ptr<Runner> a = MakeRunner(seeded);
  std::unique_ptr<Runner> b = MakeRunner(from_file);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (const char* line : {"weights: 25% of", "weights: 75% of", "weights: 1 file(s), "}) {
    EXPECT_NE(log.str().find(line), std::string::npos) << line << " not in:\n" << log.str();
  }
  ASSERT_NE(b->memory().Find("weights"), nullptr);
  EXPECT_EQ(b->memory().Find("weights")->requested_bytes,
            a->memory().Find("weights")->requested_bytes);
  ExpectSameTokensAndLogits(*a, *b);

  // Wrong files, each refused by Create before any step, naming what is wrong.
  const std::string cut = TestTempPath("runner_cut.safetensors");
  {
    std::ifstream in(path, std::ios::binary);
    const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(cut, std::ios::binary | std::ios::trunc);
    out << raw.substr(0, raw.size() - 1000);
  }
  LlamaShape wider = LlamaShape::Tiny();
  wider.ffn *= 2;
  absl::StatusOr<LlamaHostWeights> other = RandomLlamaHostWeights(wider, seed);
  ASSERT_TRUE(other.ok()) << other.status();
  const std::string misshapen = TestTempPath("runner_wider.safetensors");
  ASSERT_TRUE(WriteLlamaSafetensors(misshapen, *other).ok());
  const struct {
    std::string file;
    absl::StatusCode code;
    std::string says;
  } bad[] = {
      {TestTempPath("runner_missing.safetensors"), absl::StatusCode::kNotFound, "runner_missing"},
      {cut, absl::StatusCode::kDataLoss, "truncated"},
      {misshapen, absl::StatusCode::kInvalidArgument, "mlp.gate_proj.weight"},
  };
  for (const auto& [file, code, says] : bad) {
    RunnerOptions options = seeded;
    options.weight_files = {file};
    auto runner = Runner::Create(options);
    ASSERT_FALSE(runner.ok()) << file;
    EXPECT_EQ(runner.status().code(), code) << runner.status();
    EXPECT_NE(runner.status().message().find("weight_files"), std::string::npos)
        << runner.status();
    EXPECT_NE(runner.status().message().find(says), std::string::npos) << runner.status();
  }
  RunnerOptions no_threads = seeded;
  no_threads.weight_files = {path};
  no_threads.weight_load_threads = 0;
  auto refused = Runner::Create(no_threads);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("weight_load_threads is 0"), std::string::npos)
      << refused.status();
}

// A Hugging Face model directory (config.json with Llama 3's rope_scaling, and the weights):
// LoadHfModelDir's shape and files give the bits of the same shape and weights made from a seed.
TEST_F(RunnerGpuTest, HfModelDirGivesTheSeededModelsBits) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  const std::string dir = TestTempPath("runner_hf_tiny");
  std::filesystem::create_directories(dir);
  absl::StatusOr<LlamaHostWeights> host = RandomLlamaHostWeights(TinyScaledShape(), seed);
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_TRUE(WriteLlamaSafetensors(dir + "/model.safetensors", *host).ok());
  {
    std::ofstream config(dir + "/config.json", std::ios::trunc);
    config << R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "vocab_size": 1024,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "max_position_embeddings": 2048, "eos_token_id": 2,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
})";
  }
  absl::StatusOr<HfModel> hf = LoadHfModelDir(dir);
  ASSERT_TRUE(hf.ok()) << hf.status();
  ASSERT_EQ(hf->weight_files.size(), 1u);

  RunnerOptions seeded = TinyOptions(GraphExecution::kFull, seed);
  *seeded.config.mutable_model() = TinyScaledModel();
  for (int s : {1, 2}) seeded.config.mutable_graph()->add_capture_sizes(s);
  seeded.capture_prefill = false;
  RunnerOptions from_dir = seeded;
  *from_dir.config.mutable_model() = hf->model;
  from_dir.weight_seed = seed + 1;  // not used: the files' weights are the seed's
  from_dir.weight_files = hf->weight_files;
  std::unique_ptr<Runner> a = MakeRunner(seeded);
  std::unique_ptr<Runner> b = MakeRunner(from_dir);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->shape().rope_scaling, TinyScaledShape().rope_scaling);
  ExpectSameTokensAndLogits(*a, *b);
}

TEST_F(RunnerGpuTest, BadKernelChoiceOptionsAreRefused) {
  const std::vector<std::pair<std::function<void(RunnerOptions&)>, std::string>> bad = {
      {[](RunnerOptions& o) { o.tma_gemm_rows.down = kTmaGemmMaxRows + 1; }, "tma_gemm_rows"},
      {[](RunnerOptions& o) { o.tma_gemm_rows.qkv = -1; }, "tma_gemm_rows"},
      {[](RunnerOptions& o) { o.tma_gemm_ctas_per_sm = 3; }, "tma_gemm_ctas_per_sm 3"},
      {[](RunnerOptions& o) { o.tma_gemm_max_splits.qkv = 0; }, "tma_gemm_max_splits {0,"},
      {[](RunnerOptions& o) { o.tma_gemm_max_splits.qkv_at_32_rows = 0; },
       "tma_gemm_max_splits {4, 0,"},
      {[](RunnerOptions& o) { o.tma_gemm_max_splits.down = kTmaGemmMaxSplits + 1; },
       "tma_gemm_max_splits"},
      {[](RunnerOptions& o) { o.prefetch_gemm_rows.o = kPrefetchGemmMaxRows + 1; },
       "prefetch_gemm_rows"},
      {[](RunnerOptions& o) { o.rope_in_attention_rows = -1; }, "rope_in_attention_rows -1"},
      {[](RunnerOptions& o) { o.rope_in_attention_min_rows = 0; },
       "rope_in_attention_min_rows 0"},
      {[](RunnerOptions& o) { o.decode_split_by_rows = {{8, 4}, {2, 2}}; },
       "RunnerOptions::decode_split_by_rows[1] (max_seqs 2"},
      {[](RunnerOptions& o) { o.decode_split_by_rows_head_dim_128 = {{8, 0}}; },
       "RunnerOptions::decode_split_by_rows_head_dim_128[0]"},
  };
  for (const auto& [edit, name] : bad) {
    RunnerOptions options = TinyOptions(GraphExecution::kFull, 5);
    edit(options);
    auto runner = Runner::Create(options);
    ASSERT_FALSE(runner.ok()) << name;
    EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument) << runner.status();
    EXPECT_NE(runner.status().message().find(name), std::string::npos) << runner.status();
  }
}

// gpu_preset "auto", in any case, and no GPU at all both plan for the device the runner runs
// on; a named preset plans for that GPU.
TEST_F(RunnerGpuTest, AutoGpuPresetInAnyCasePlansForThisDevice) {
  const absl::StatusOr<DeviceInfo> device = DeviceInfo::Query(0);
  ASSERT_TRUE(device.ok()) << device.status();
  for (const char* preset : {"auto", "AUTO", "Auto", ""}) {
    RunnerOptions options = TinyOptions(GraphExecution::kNone, 7);
    if (*preset != '\0') options.config.set_gpu_preset(preset);
    auto runner = Runner::Create(options);
    ASSERT_TRUE(runner.ok()) << "gpu_preset \"" << preset << "\": " << runner.status();
    EXPECT_EQ((*runner)->memory_plan().total_bytes,
              static_cast<int64_t>(device->total_memory_bytes))
        << preset;
    EXPECT_EQ((*runner)->memory_plan().config.gpu().name(), device->name) << preset;
  }
  // A named preset (here a GPU with less memory than any this test runs on) plans for that GPU.
  RunnerOptions named = TinyOptions(GraphExecution::kNone, 7);
  named.config.set_gpu_preset("l40s-48gb");
  auto runner = Runner::Create(named);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const absl::StatusOr<config::GpuSpec> l40s = GpuPreset("l40s-48gb");
  ASSERT_TRUE(l40s.ok()) << l40s.status();
  EXPECT_EQ((*runner)->memory_plan().total_bytes, static_cast<int64_t>(l40s->total_bytes()));
}

TEST_F(RunnerGpuTest, BadBatchesAreRefusedAndChangeNothing) {
  std::unique_ptr<Runner> runner = MakeRunner(TinyOptions(GraphExecution::kFull, 3));
  ASSERT_NE(runner, nullptr);
  ASSERT_TRUE(runner->Step({{1, {5, 6, 7}}}).ok());
  const int free_blocks = runner->sequences().free_blocks();
  const std::vector<std::vector<SequenceTokens>> bad = {
      {},
      {{1, {}}},
      {{1, {2000}}},
      {{1, {4}}, {1, {5}}},
      {{2, std::vector<int32_t>(kMaxTokens + 1, 1)}},
      {{1, std::vector<int32_t>(kMaxTokens, 1)}, {2, {3}}},  // 3 + 640 fits, but 641 tokens
  };
  for (const auto& batch : bad) {
    auto result = runner->Step(batch);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << Describe(batch);
  }
  EXPECT_EQ(runner->sequences().Length(1), 3);
  EXPECT_EQ(runner->sequences().free_blocks(), free_blocks);
  EXPECT_FALSE(runner->sequences().Contains(2));
  // Past max_model_len: 3 + 600 + 500 > 1024.
  ASSERT_TRUE(runner->Step({{1, std::vector<int32_t>(600, 9)}}).ok());
  const int free_after = runner->sequences().free_blocks();
  EXPECT_EQ(runner->Step({{1, std::vector<int32_t>(500, 9)}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner->sequences().Length(1), 603);
  EXPECT_EQ(runner->sequences().free_blocks(), free_after);
  EXPECT_EQ(runner->Release(99).code(), absl::StatusCode::kNotFound);
}

// A max_model_len that is not a multiple of the block size: a block-table row holds 1008 tokens
// but attention plans 1000, so a sequence past 1000 is refused before it takes a block (the
// attention planner used to refuse it after the step's blocks were reserved), and so is a
// benchmark context past it.
TEST_F(RunnerGpuTest, PastMaxModelLenWithinTheLastBlockIsRefusedBeforeBlocksAreTaken) {
  RunnerOptions options = TinyOptions(GraphExecution::kFull, 4);
  options.max_model_len = 1000;
  std::unique_ptr<Runner> runner = MakeRunner(options);
  ASSERT_NE(runner, nullptr);
  ASSERT_TRUE(runner->Step({{1, std::vector<int32_t>(600, 9)}}).ok());
  const int free_blocks = runner->sequences().free_blocks();
  const absl::StatusOr<std::vector<int32_t>> past =
      runner->Step({{1, std::vector<int32_t>(401, 9)}});  // 1001 tokens
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument) << past.status();
  EXPECT_NE(past.status().message().find("max_model_len 1000"), std::string::npos) << past.status();
  EXPECT_EQ(runner->sequences().Length(1), 600);
  EXPECT_EQ(runner->sequences().free_blocks(), free_blocks);
  EXPECT_EQ(runner->SetContextForBenchmark(2, 1001).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(runner->sequences().Contains(2));
  EXPECT_EQ(runner->sequences().free_blocks(), free_blocks);
  // Exactly max_model_len is fine.
  ASSERT_TRUE(runner->Step({{1, std::vector<int32_t>(400, 9)}}).ok());
  EXPECT_EQ(runner->sequences().Length(1), 1000);
}

// LlamaModel's step methods refuse, before anything is enqueued, a layer outside the model
// (whose KV pools would lie past the cache) and step views a kernel would read through null.
TEST_F(RunnerGpuTest, ModelRefusesLayersOutsideTheModelAndMissingStepViews) {
  std::unique_ptr<Runner> runner = MakeRunner(TinyOptions(GraphExecution::kNone, 6));
  ASSERT_NE(runner, nullptr);
  LlamaModel& model = runner->model();
  // Host stand-ins, never read: every call below is refused first.
  testing_internal::StepArgsStandIns stand_ins;
  LlamaStepArgs args = stand_ins.Args(/*num_tokens=*/1, /*num_rows=*/1);
  const int layers = model.shape().layers;
  for (int layer : {-1, layers}) {
    const absl::Status s = model.RunAttention(layer, args, runner->stream());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(absl::StrCat("Layer ", layer, " is outside")), std::string::npos)
        << s;
  }
  std::vector<LlamaStepArgs> bad(6, args);
  bad[0].activations = nullptr;
  bad[1].activations = stand_ins.region + 16;
  bad[2].token_ids = nullptr;
  bad[3].max_blocks_per_seq = 0;
  bad[4].decode.work_capacity = 0;  // no plan part
  bad[5].num_rows = 2;              // more rows than tokens
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(model.RunPiece(0, bad[i], runner->stream()).code(),
              absl::StatusCode::kInvalidArgument)
        << i;
    EXPECT_EQ(model.RunAttention(0, bad[i], runner->stream()).code(),
              absl::StatusCode::kInvalidArgument)
        << i;
  }
  EXPECT_EQ(cudaStreamSynchronize(runner->stream()), cudaSuccess);
}

}  // namespace
}  // namespace kiln
