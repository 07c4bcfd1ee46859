// What Runner::Step costs on the CPU before its graph replay, per decode step, with no GPU: the
// host work of a step, in Runner::Step's order, for batches of decode sequences (one new token
// each) of --context tokens:
//   check_tokens  CheckStepTokens over the batch
//   reserve       the step's SequenceTable::Entry list, then SequenceTable::Reserve(entries,
//                 admit, &lens, &blocks), `admit` running StepKeys::Check and StepKeys::Route,
//                 which also hands back each sequence's block span
//   tokens        the token span of each sequence
//   fill          FillStepInputs(..., StepIds::kCheckedByCaller) into a host blob
//   plan          the split-kv planner of the routed key: Plan(lens, blob + layout.plan)
//   commit        SequenceTable::Commit
//
//   bazel run -c opt //runtime/runner:step_host_benchmark [-- --batches=1,8 --context=1024]
//
// The step keys, the attention planners and the metadata layouts are built by BuildStepSetup
// (runner.h), as Runner::Create builds them, from the memory plan of the --preset model (default
// llama-3.2-1b) with the Runner's default limits; the planners' SM count is the --gpu preset's
// where the Runner reads the device's. The blob is one page-aligned host buffer as large
// as the largest layout (the Runner's is pinned, allocated once). What the Runner's `admit` also
// decides, whether the key replays a graph, asks the captured graphs: there are none here, so it
// is left out (the output says so).
//
// Each sequence holds --context tokens on average: the batch's sequences start a window of
// --block_size steps at lengths spread evenly over the --block_size tokens up to --context, so
// about batch / block_size of them take a new block at each step, as in a server whose sequences
// started at different times. Between windows (untimed) they are released and prefilled again.
// Sequence ids and tokens are drawn from --seed.
//
// After --warmup untimed steps, --steps steps are timed whole (steady_clock around the step) and
// --steps stage by stage (steady_clock between stages), alternating, so both see the same
// machine. The table gives the whole step's median and p90, and each stage's median with its
// share of the staged steps' total time, then a digest of the first timed step: a 64-bit FNV-1a
// hash of its sequence ids, its tokens and the blob bytes it uploads (the token ids, positions,
// rows, plan and block-table rows FillStepInputs and Plan wrote), which is the same for the same
// flags and --seed and changes with the seed. A flag value it refuses exits with code 2 and a
// message (what absl's parser refuses, such as an unknown flag, with absl's 1), an error in a step
// with code 1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "attention/split_kv_planner.h"
#include "graph/capture_context.h"
#include "runtime/config/planner_config.pb.h"
#include "runtime/config/presets.h"
#include "runtime/cuda/status_macros.h"
#include "runtime/memory/memory_planner.h"
#include "runtime/model/internal/benchmark_util.h"
#include "runtime/model/llama_shape.h"
#include "runtime/runner/runner.h"
#include "runtime/runner/sequence_table.h"
#include "runtime/runner/step_plan.h"

ABSL_FLAG(std::string, batches, "1,8,32,128,256",
          "Decode batch sizes (sequences per step), comma-separated, each in [1, max_num_seqs]");
ABSL_FLAG(int, context, 1024, "Tokens each sequence holds, on average over the timed steps");
ABSL_FLAG(int, block_size, 64, "Tokens per KV block");
ABSL_FLAG(int, max_model_len, kiln::RunnerOptions{}.max_model_len,
          "Longest sequence (the Runner's max_model_len: block-table width, planners' KV bound)");
ABSL_FLAG(int, steps, 2000, "Steps timed whole per batch, and as many timed stage by stage");
ABSL_FLAG(int, warmup, 200, "Untimed steps per batch before the timed ones");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the sequence ids and tokens");
ABSL_FLAG(std::string, preset, "llama-3.2-1b", "Model preset whose step keys are measured");
ABSL_FLAG(std::string, gpu, kiln::kStandInGpuPreset,
          "GPU preset whose SM count sizes the attention planners (the Runner reads the device's)");

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kStages = 6;
constexpr const char* kStageNames[kStages] = {"check_tokens", "reserve", "tokens",
                                              "fill",         "plan",    "commit"};

constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

// Returns `hash` advanced over the `n` bytes at `data` by 64-bit FNV-1a.
uint64_t Fnv1a(uint64_t hash, const void* data, size_t n) {
  const unsigned char* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    hash = (hash ^ bytes[i]) * kFnvPrime;
  }
  return hash;
}

// The flags, checked.
struct BenchOptions {
  std::vector<int> batches;
  int context = 0;
  int steps = 0;
  int warmup = 0;
  uint64_t seed = 0;
};

// What the benchmark measures with: the Runner's steps (PlanHostSteps, as Runner::Create builds
// them) and what they were built from.
struct BenchSetup {
  RunnerOptions options;
  HostStepPlan plan;
  size_t blob_bytes = 0;  // the largest layout's
};

// Builds them for `options`, whose config names a GPU preset (the Runner would plan for the
// device otherwise).
absl::StatusOr<BenchSetup> BuildBenchSetup(const RunnerOptions& options) {
  BenchSetup s;
  s.options = options;
  ASSIGN_OR_RETURN(s.plan, PlanHostSteps(options));
  for (const MetadataLayout& layout : s.plan.steps.layouts) {
    s.blob_bytes = std::max(s.blob_bytes, layout.bytes);
  }
  return s;
}

// A page of the host blob: the blob is page-aligned, as the Runner's pinned one is.
struct alignas(4096) Page {
  char bytes[4096];
};

// One batch's state between steps.
struct BatchState {
  const BenchSetup* setup = nullptr;
  SequenceTable table{0, 1, 0};
  std::vector<SequenceTokens> batch;
  std::vector<int> window_start;  // each sequence's length when a window starts
  char* host = nullptr;
  int key_index = -1;  // the last step's route
  // HostStep's lists, kept for their capacity as the Runner keeps its own.
  std::vector<SequenceTable::Entry> entries;
  std::vector<SeqLens> lens;
  std::vector<absl::Span<const int32_t>> tokens, blocks;
};

// Runs Runner::Step's host work on `s.batch`, in its order, up to the replay and from the commit
// (runner.cc). With kStaged, writes each stage's microseconds into `stage_us`.
template <bool kStaged>
absl::Status HostStep(BatchState& s, double* stage_us) {
  Clock::time_point marks[kStages + 1];
  if constexpr (kStaged) marks[0] = Clock::now();
  const BenchSetup& setup = *s.setup;
  const StepKeys& keys = setup.plan.steps.keys;
  const absl::Span<const SequenceTokens> batch = s.batch;

  RETURN_IF_ERROR(CheckStepTokens(batch, setup.plan.shape.vocab, keys.limits().max_num_batched_tokens));
  if constexpr (kStaged) marks[1] = Clock::now();

  std::vector<SequenceTable::Entry>& entries = s.entries;
  entries.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    entries[i] = {batch[i].id, static_cast<int>(batch[i].tokens.size())};
  }
  StepRoute route;
  auto admit = [&](absl::Span<const SeqLens> lens) -> absl::Status {
    RETURN_IF_ERROR(keys.Check(lens));
    route = keys.Route(lens);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(s.table.Reserve(entries, admit, &s.lens, &s.blocks));
  const std::vector<SeqLens>& lens = s.lens;
  const MetadataLayout& layout = setup.plan.steps.layouts[route.key_index];
  if constexpr (kStaged) marks[2] = Clock::now();

  s.tokens.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) s.tokens[i] = batch[i].tokens;
  if constexpr (kStaged) marks[3] = Clock::now();

  RETURN_IF_ERROR(FillStepInputs(layout, route, lens, s.tokens, s.blocks, s.table.block_size(),
                                 s.host, StepIds::kCheckedByCaller));
  if constexpr (kStaged) marks[4] = Clock::now();

  RETURN_IF_ERROR(setup.plan.steps.planners[route.key_index].Plan(lens, s.host + layout.plan).status());
  if constexpr (kStaged) marks[5] = Clock::now();

  RETURN_IF_ERROR(s.table.Commit(entries));
  if constexpr (kStaged) {
    marks[6] = Clock::now();
    for (int i = 0; i < kStages; ++i) {
      stage_us[i] = std::chrono::duration<double, std::micro>(marks[i + 1] - marks[i]).count();
    }
  }
  s.key_index = route.key_index;
  return absl::OkStatus();
}

// Returns the digest of the step `s` last ran: each sequence's id and tokens, then the blob bytes
// the step uploads for its key (MetadataLayout::UploadBytes of the batch).
uint64_t StepDigest(const BatchState& s) {
  uint64_t hash = kFnvOffset;
  for (const SequenceTokens& seq : s.batch) {
    hash = Fnv1a(hash, &seq.id, sizeof(seq.id));
    hash = Fnv1a(hash, seq.tokens.data(), seq.tokens.size() * sizeof(int32_t));
  }
  const MetadataLayout& layout = s.setup->plan.steps.layouts[s.key_index];
  return Fnv1a(hash, s.host, layout.UploadBytes(static_cast<int>(s.batch.size())));
}

// Returns the value at fraction `q` of `v` (nearest rank), sorting `v`.
double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size(), std::max<size_t>(rank, 1)) - 1];
}

// Returns the median microseconds between two consecutive Clock::now() calls: what each staged
// stage carries on top of its work.
double ClockOverheadUs() {
  std::vector<double> v(10000);
  for (double& us : v) {
    const Clock::time_point a = Clock::now();
    const Clock::time_point b = Clock::now();
    us = std::chrono::duration<double, std::micro>(b - a).count();
  }
  return Percentile(v, 0.5);
}

struct BatchResult {
  std::string key;
  double median_us = 0, p90_us = 0;
  double stage_median_us[kStages] = {};
  double stage_share[kStages] = {};
  uint64_t digest = 0;  // StepDigest of the first timed step
};

// Releases the batch's sequences (where the table holds them) and prefills each to its window
// start, outside the timed steps.
absl::Status StartWindow(BatchState& s) {
  std::vector<SequenceTable::Entry> prefill;
  prefill.reserve(s.batch.size());
  for (size_t i = 0; i < s.batch.size(); ++i) {
    const int64_t id = s.batch[i].id;
    if (s.table.Contains(id)) RETURN_IF_ERROR(s.table.Release(id));
    prefill.push_back({id, s.window_start[i]});
  }
  RETURN_IF_ERROR(s.table.Reserve(prefill).status());
  return s.table.Commit(prefill);
}

absl::StatusOr<BatchResult> RunBatch(const BenchSetup& setup, const BenchOptions& o, int batch,
                                     std::mt19937_64& rng, char* host) {
  const int block_size = setup.plan.resolved.block_size();
  // The longest a sequence gets: its window start (at most --context) plus a window of steps.
  const int64_t longest = int64_t{o.context} + block_size;
  const int64_t blocks_per_seq = (longest + block_size - 1) / block_size;
  BatchState s;
  s.setup = &setup;
  s.host = host;
  s.table = SequenceTable(static_cast<int>(batch * blocks_per_seq), block_size,
                          setup.options.max_model_len);
  std::uniform_int_distribution<int32_t> token(0, setup.plan.shape.vocab - 1);
  std::unordered_set<int64_t> ids;
  const int spread = std::min(block_size, o.context);
  for (int i = 0; i < batch; ++i) {
    int64_t id = 0;
    do {
      id = static_cast<int64_t>(rng() >> 1);
    } while (!ids.insert(id).second);
    s.batch.push_back({id, {token(rng)}});
    s.window_start.push_back(o.context -
                             static_cast<int>(int64_t{i} * spread / batch));
  }

  std::vector<double> whole, stages[kStages];
  whole.reserve(o.steps);
  for (std::vector<double>& v : stages) v.reserve(o.steps);
  double stage_us[kStages];
  uint64_t digest = 0;
  int in_window = block_size;  // starts a window at the first step
  for (int step = 0; step < o.warmup + 2 * o.steps; ++step) {
    if (in_window == block_size) {
      RETURN_IF_ERROR(StartWindow(s));
      in_window = 0;
    }
    ++in_window;
    for (SequenceTokens& seq : s.batch) seq.tokens[0] = token(rng);  // the sampled tokens
    const bool staged = step >= o.warmup && (step - o.warmup) % 2 == 1;
    if (staged) {
      RETURN_IF_ERROR(HostStep<true>(s, stage_us));
      for (int i = 0; i < kStages; ++i) stages[i].push_back(stage_us[i]);
    } else {
      const Clock::time_point start = Clock::now();
      RETURN_IF_ERROR(HostStep<false>(s, nullptr));
      const Clock::time_point stop = Clock::now();
      if (step >= o.warmup) {
        whole.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
      }
      if (step == o.warmup) digest = StepDigest(s);
    }
  }

  BatchResult r;
  r.key = KeyName(setup.plan.steps.keys.key(s.key_index).key);
  r.median_us = Percentile(whole, 0.5);
  r.p90_us = Percentile(whole, 0.9);
  r.digest = digest;
  double total = 0, sums[kStages] = {};
  for (int i = 0; i < kStages; ++i) {
    for (double t : stages[i]) sums[i] += t;
    total += sums[i];
  }
  for (int i = 0; i < kStages; ++i) {
    r.stage_median_us[i] = Percentile(stages[i], 0.5);
    r.stage_share[i] = total > 0 ? sums[i] / total : 0.0;
  }
  return r;
}

// Returns the CPU's model name from /proc/cpuinfo, or "unknown CPU".
std::string CpuName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "model name")) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(std::min(line.size(), colon + 2));
  }
  return "unknown CPU";
}

// Checks the flags that need no setup; InvalidArgument names the flag and the fix.
absl::Status CheckFlagValues(const std::vector<char*>& positional) {
  if (positional.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Unexpected argument \"", positional[1], "\"; step_host_benchmark takes only flags"));
  }
  const int block_size = absl::GetFlag(FLAGS_block_size);
  const int max_model_len = absl::GetFlag(FLAGS_max_model_len);
  const int context = absl::GetFlag(FLAGS_context);
  if (block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block_size=", block_size, " must be positive (default 64)"));
  }
  if (max_model_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_model_len=", max_model_len, " must be positive"));
  }
  if (context < 1 || int64_t{context} + block_size > max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--context=", context, " must lie in [1, --max_model_len - --block_size = ",
        int64_t{max_model_len} - block_size, "]: a sequence grows by a window of --block_size=",
        block_size, " steps; lower --context or raise --max_model_len"));
  }
  if (absl::GetFlag(FLAGS_steps) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps), " must be at least 1"));
  }
  if (absl::GetFlag(FLAGS_warmup) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--warmup=", absl::GetFlag(FLAGS_warmup), " must be at least 0"));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (absl::Status flags = CheckFlagValues(positional); !flags.ok()) {
    std::fprintf(stderr, "step_host_benchmark: %s\n", std::string(flags.message()).c_str());
    return 2;
  }
  RunnerOptions options;
  options.config.set_model_preset(absl::GetFlag(FLAGS_preset));
  options.config.set_block_size(absl::GetFlag(FLAGS_block_size));
  const std::string gpu = absl::GetFlag(FLAGS_gpu);
  options.config.set_gpu_preset(gpu);
  options.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  absl::StatusOr<BenchSetup> setup = BuildBenchSetup(options);
  if (!setup.ok()) {
    std::fprintf(stderr, "step_host_benchmark: --preset=%s, --gpu=%s: %s\n",
                 absl::GetFlag(FLAGS_preset).c_str(), gpu.c_str(),
                 std::string(setup.status().message()).c_str());
    return 2;
  }
  const int max_num_seqs = setup->plan.steps.keys.limits().max_num_seqs;
  BenchOptions o;
  if (!benchmark_internal::ParseIntList("batches", absl::GetFlag(FLAGS_batches), 1, max_num_seqs,
                                        &o.batches)) {
    return 2;
  }
  if (o.batches.empty()) {
    std::fprintf(stderr,
                 "step_host_benchmark: --batches is empty; give decode batch sizes, e.g. "
                 "--batches=1,8,32\n");
    return 2;
  }
  o.context = absl::GetFlag(FLAGS_context);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.seed = absl::GetFlag(FLAGS_seed);

#ifndef NDEBUG
  std::printf("built without -c opt: these times are not those of an optimised server build\n");
#endif
  const config::PlannerConfig& r = setup->plan.resolved;
  const int block_size = r.block_size();
  std::printf("Runner::Step's host work per decode step (no GPU); host: %s, %u hardware threads\n",
              CpuName().c_str(), std::thread::hardware_concurrency());
  std::printf(
      "keys, planners and metadata layouts built by BuildStepSetup, as Runner::Create builds "
      "them: %s (vocab %d), max_num_seqs %d, max_num_batched_tokens %d, max_model_len %d, "
      "block_size %d (%d blocks per table row), %zu keys, blob %zu bytes; planners for %d SMs "
      "(gpu preset %s, %s; the Runner reads the device's)\n",
      r.model().name().c_str(), setup->plan.shape.vocab, r.max_num_seqs(), r.max_num_batched_tokens(),
      setup->options.max_model_len, block_size, setup->plan.max_blocks_per_seq,
      setup->plan.steps.keys.keys().size(), setup->blob_bytes, setup->plan.sm_count, gpu.c_str(),
      r.gpu().name().c_str());
  std::printf(
      "admit runs StepKeys::Check and Route; the Runner's replay decision (whether the key has "
      "a captured graph) is left out: no graphs exist here\n");
  std::printf(
      "context %d tokens on average: windows of %d steps start at lengths spread over (%d, %d], "
      "then release and prefill again (untimed); ids and tokens from seed %llu\n",
      o.context, block_size, o.context - std::min(block_size, o.context), o.context,
      static_cast<unsigned long long>(o.seed));
  std::printf(
      "%d steps timed whole and %d stage by stage (alternating) per batch after %d warm-up; "
      "stages: median us and share of the staged total, each with about one clock read of %.3f "
      "us on top\n\n",
      o.steps, o.steps, o.warmup, ClockOverheadUs());

  std::printf("%5s  %-10s %9s %9s %7s |", "batch", "key", "median_us", "p90_us", "us/seq");
  for (const char* name : kStageNames) std::printf(" %15s", name);
  std::printf(" | %16s\n", "digest");

  std::vector<Page> blob((setup->blob_bytes + sizeof(Page) - 1) / sizeof(Page));
  std::mt19937_64 rng(o.seed);
  for (int batch : o.batches) {
    absl::StatusOr<BatchResult> result =
        RunBatch(*setup, o, batch, rng, blob.empty() ? nullptr : blob.front().bytes);
    if (!result.ok()) {
      std::fprintf(stderr, "step_host_benchmark: batch %d: %s\n", batch,
                   result.status().ToString().c_str());
      return 1;
    }
    std::printf("%5d  %-10s %9.2f %9.2f %7.3f |", batch, result->key.c_str(), result->median_us,
                result->p90_us, result->median_us / batch);
    for (int i = 0; i < kStages; ++i) {
      std::printf(" %9.2f %4.0f%%", result->stage_median_us[i], 100.0 * result->stage_share[i]);
    }
    std::printf(" | %016llx\n", static_cast<unsigned long long>(result->digest));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
