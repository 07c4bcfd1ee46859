// Decode-step latency of the 1B-class Llama (hidden 2048, 16 layers, 32/8 heads of 64, ffn 8192,
// vocab 128256, random bf16 weights; --preset names another model preset, e.g. llama-3.1-8b) with
// tensor parallelism, as CUDA graphs: TP=1, and
// TP=world with the custom all-reduce (AutoCommunicator's choice per call, fused with the
// residual add + RMSNorm after it where it takes the step's size), the same without that fusion
// (all-reduce, then a separate norm kernel), with NCCL only, with the unfused custom one-shot
// reading registered graph inputs, and with no all-reduce at all (the floor the collectives add
// to), at batch 1, 8 and 32 with 1024 tokens of context. It starts one process per visible GPU
// itself (RunBenchmarkOnEveryGpu, collectives/testing/multiprocess_benchmark_util.h); rank 0
// prints the table.
//
//   bazel run -c opt //runtime/runner:tp_benchmark [-- --world_size=4 --batches=1,8,32]
//       [--columns=auto,unfused]
//   .gpu_tp/bin/runtime_runner_tp_benchmark
//
// A step is timed on rank 0's device with CUDA events from the metadata upload to the copy of the
// sampled tokens (RunnerOptions::time_steps), after warm-up; the table shows medians. The ranks'
// sampled tokens must agree at every step (they compute the same logits bit for bit); the program
// exits non-zero if they do not, if a step did not replay its graph, or if a rank fails. (The
// fused and unfused steps compute the same bits: runtime/runner/runner_multigpu_test.cc.)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collectives/allreduce_config.pb.h"
#include "collectives/testing/multiprocess_benchmark_util.h"
#include "collectives/testing/process_group.h"
#include "runtime/config/presets.h"
#include "runtime/cuda/device_info.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"
#include "runtime/model/internal/benchmark_util.h"
#include "runtime/runner/runner.h"

ABSL_FLAG(int, world_size, 0, "Ranks (one process per GPU); 0 = every visible GPU");
ABSL_FLAG(std::string, preset, "llama-3.2-1b",
          "Model preset whose shape is measured (random weights): llama-3.2-1b, llama-3.1-8b, ...");
ABSL_FLAG(std::string, batches, "1,8,32", "Decode batch sizes");
ABSL_FLAG(int, context, 1024, "Tokens of context per sequence");
ABSL_FLAG(int, steps, 30, "Timed steps per measurement");
ABSL_FLAG(int, timeout_s, 540, "Kill the ranks after this many seconds");
ABSL_FLAG(std::string, columns, "tp1,auto,unfused,nccl,registered,none",
          "Columns to time, comma-separated, of tp1 (one GPU), auto (custom, fused with the "
          "norms), unfused, nccl, registered and none (no all-reduce); ratios need auto");
ABSL_FLAG(bool, prefetch_gemm, true,
          "Use the prefetch GEMM for small batches (false: the skinny, decode and cuBLASLt GEMMs)");
ABSL_FLAG(int, prefetch_layer_rows, kiln::RunnerOptions{}.sharded_prefetch_gemm_rows.qkv,
          "With --prefetch_gemm: the most rows the four layer projections take the prefetch GEMM "
          "on each rank (the TMA GEMM above)");
ABSL_FLAG(bool, prefetch_row_halves, kiln::RunnerOptions{}.prefetch_row_halves,
          "Prefetch GEMM CTAs of at most 8 rows fill each stage with their rows' two k halves");
ABSL_FLAG(bool, prefetch_gate_up_silu, kiln::RunnerOptions{}.prefetch_gate_up_silu,
          "SiLU·mul in the gate-up projection's prefetch GEMM (false: the SiLU·mul kernel after "
          "it)");
ABSL_FLAG(bool, tma_gate_up_silu, kiln::RunnerOptions{}.tma_gate_up_silu,
          "SiLU·mul in the gate-up projection's TMA GEMM (false: the SiLU·mul kernel after it)");
ABSL_FLAG(int, rope_in_attention_min_rows, kiln::RunnerOptions{}.rope_in_attention_min_rows,
          "Decode attention does the RoPE + KV append from this many rows (fewer: the RoPE + KV "
          "append kernel)");

namespace kiln {
namespace {

constexpr int kWarmup = 5;
constexpr int kBlockSize = 64;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

absl::StatusOr<std::vector<int>> Batches() {
  std::vector<int> batches;
  if (!benchmark_internal::ParseIntList("batches", absl::GetFlag(FLAGS_batches), 1, 256,
                                        &batches) ||
      batches.empty()) {
    return absl::InvalidArgumentError(
        "--batches: want a comma-separated list of sizes in [1, 256]");
  }
  return batches;
}

constexpr const char* kColumnKeys[] = {"tp1", "auto", "unfused", "nccl", "registered", "none"};

// --columns as one flag per column of kColumnKeys.
absl::StatusOr<std::vector<bool>> Columns() {
  std::vector<bool> on(std::size(kColumnKeys), false);
  for (absl::string_view key :
       absl::StrSplit(absl::GetFlag(FLAGS_columns), ',', absl::SkipEmpty())) {
    const auto* it = std::find(std::begin(kColumnKeys), std::end(kColumnKeys), key);
    if (it == std::end(kColumnKeys)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--columns: unknown column '", key, "'; want some of ",
          absl::StrJoin(std::begin(kColumnKeys), std::end(kColumnKeys), ",")));
    }
    on[it - std::begin(kColumnKeys)] = true;
  }
  if (std::find(on.begin(), on.end(), true) == on.end()) {
    return absl::InvalidArgumentError("--columns: name at least one column");
  }
  return on;
}

RunnerOptions BenchmarkOptions(const std::vector<int>& batches, int context) {
  RunnerOptions o;
  o.config.set_model_preset(absl::GetFlag(FLAGS_preset));
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  o.config.set_max_num_seqs(max_batch);
  o.config.set_max_num_batched_tokens(std::max(512, max_batch));
  o.config.set_block_size(kBlockSize);
  for (int b : batches) o.config.mutable_graph()->add_capture_sizes(b);
  o.capture_prefill = false;
  o.max_model_len = context + 64;
  o.max_kv_blocks = int64_t{max_batch} * ((context + kBlockSize) / kBlockSize + 1);
  o.time_steps = true;
  o.progress = CaptureProgress::kNone;
  PrefetchGemmRows& sharded = o.sharded_prefetch_gemm_rows;
  sharded.qkv = sharded.o = sharded.gate_up = sharded.down =
      absl::GetFlag(FLAGS_prefetch_layer_rows);
  o.prefetch_gate_up_silu = absl::GetFlag(FLAGS_prefetch_gate_up_silu);
  o.prefetch_row_halves = absl::GetFlag(FLAGS_prefetch_row_halves);
  o.tma_gate_up_silu = absl::GetFlag(FLAGS_tma_gate_up_silu);
  o.rope_in_attention_min_rows = absl::GetFlag(FLAGS_rope_in_attention_min_rows);
  if (!absl::GetFlag(FLAGS_prefetch_gemm)) {
    o.prefetch_gemm_rows = o.sharded_prefetch_gemm_rows = PrefetchGemmRows{0, 0, 0, 0, 0};
  }
  return o;
}

// Decodes `batch` sequences of `context` tokens as graphs: warm-up, then timed steps. Returns
// the median device time; *tokens gets every step's sampled tokens (for the ranks to compare).
absl::StatusOr<double> TimeDecode(Runner& runner, int batch, int context, int steps,
                                  std::vector<int32_t>* tokens) {
  std::vector<SequenceTokens> seqs;
  const int64_t base = int64_t{batch} * 100000;
  for (int i = 0; i < batch; ++i) {
    RETURN_IF_ERROR(runner.SetContextForBenchmark(base + i, context - 1));
    seqs.push_back({base + i, {static_cast<int32_t>((i * 7919 + 13) % runner.shape().vocab)}});
  }
  std::vector<double> ms;
  for (int i = 0; i < kWarmup + steps; ++i) {
    ASSIGN_OR_RETURN(std::vector<int32_t> next, runner.Step(seqs));
    if (!runner.last_step().replayed) {
      return absl::InternalError(absl::StrCat("Batch ", batch, " did not replay a graph"));
    }
    for (int s = 0; s < batch; ++s) seqs[s].tokens[0] = std::max(next[s], 0);
    tokens->insert(tokens->end(), next.begin(), next.end());
    if (i >= kWarmup) ms.push_back(runner.last_step().device_ms);
  }
  for (int i = 0; i < batch; ++i) RETURN_IF_ERROR(runner.Release(base + i));
  return Median(ms);
}

struct Column {
  std::string name;
  std::map<int, double> ms;  // batch -> median step ms
  std::string paths;         // all-reduce calls by path
};

// Runs every batch on a runner made from `options`; with a bootstrap, checks that every rank
// sampled the same tokens.
absl::Status RunColumn(const RunnerOptions& options, const std::vector<int>& batches,
                       HostBootstrap* check_with, Column* column) {
  ASSIGN_OR_RETURN(std::unique_ptr<Runner> runner, Runner::Create(options));
  RETURN_IF_ERROR(runner->Capture().status());
  std::vector<int32_t> tokens;
  for (int b : batches) {
    ASSIGN_OR_RETURN(column->ms[b], TimeDecode(*runner, b, absl::GetFlag(FLAGS_context),
                                               absl::GetFlag(FLAGS_steps), &tokens));
  }
  if (const AutoCommunicator* comm = runner->communicator()) {
    const AllReduceStats& s = comm->stats();
    column->paths = absl::StrCat(column->name, ": ", s.one_shot_staged, " one-shot staged, ",
                                 s.one_shot_registered, " one-shot registered (",
                                 s.fused_add_rms_norm, " of them fused with the norm), ",
                                 s.two_shot_staged + s.two_shot_registered, " two-shot, ", s.nccl,
                                 " NCCL calls enqueued (captures count once)",
                                 comm->custom_available()
                                     ? ""
                                     : absl::StrCat("; custom unavailable: ",
                                                    comm->custom_unavailable_reason()));
  }
  if (check_with != nullptr) {
    const std::string mine(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
    ASSIGN_OR_RETURN(
        std::vector<std::string> all,
        check_with->AllGather(mine, absl::StrCat("tp_benchmark.tokens.", column->name)));
    for (size_t r = 1; r < all.size(); ++r) {
      if (all[r] != all[0]) {
        return absl::InternalError(
            absl::StrCat(column->name, ": rank ", r, " sampled other tokens than rank 0"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RunRank(testing::ProcessGroupMember& member) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(member.rank));
  ASSIGN_OR_RETURN(std::vector<int> batches, Batches());
  ASSIGN_OR_RETURN(std::vector<bool> wanted, Columns());
  const int context = absl::GetFlag(FLAGS_context);
  const int world = member.world_size;
  HostBootstrap& bootstrap = *member.bootstrap;
  // Indexed like kColumnKeys; columns not wanted stay empty.
  std::vector<Column> columns(std::size(kColumnKeys));

  // TP=1 on rank 0's GPU; the other ranks wait.
  // The columns, in kColumnKeys' order.
  enum Variant { kTp1, kAuto, kUnfused, kNccl, kRegistered, kNone };
  if (wanted[kTp1]) {
    columns[kTp1].name = "TP=1";
    if (member.rank == 0) {
      RETURN_IF_ERROR(
          RunColumn(BenchmarkOptions(batches, context), batches, nullptr, &columns[kTp1]));
    }
    RETURN_IF_ERROR(bootstrap.Barrier("tp_benchmark.tp1_column"));
  }

  // TP=world: custom (auto, fused with the norms), custom without the fusion, NCCL only, custom
  // one-shot reading registered graph inputs, and no all-reduce at all (what the collectives
  // cost; tokens not the model's, so not compared).
  for (Variant v : {kAuto, kUnfused, kNccl, kRegistered, kNone}) {
    if (!wanted[v]) continue;
    RunnerOptions options = BenchmarkOptions(batches, context);
    options.bootstrap = &bootstrap;
    options.device = member.rank;
    options.allreduce.set_enable_custom(v != kNccl);
    options.allreduce.set_graph_one_shot_registered(v == kRegistered);
    // The fused kernel pushes decode-sized rows (no registered inputs): the registered column
    // measures the unfused one-shot reading registered inputs.
    options.fuse_allreduce_norm = v != kUnfused && v != kRegistered;
    options.skip_allreduce = v == kNone;
    const char* names[] = {"", " custom (auto)", " custom, unfused", " NCCL",
                           " custom registered, unfused", " no all-reduce"};
    Column& column = columns[v];
    column.name = absl::StrCat("TP=", world, names[v]);
    RETURN_IF_ERROR(RunColumn(options, batches, v == kNone ? nullptr : &bootstrap, &column));
  }

  if (member.rank == 0) {
    ASSIGN_OR_RETURN(DeviceInfo info, DeviceInfo::Query(0));
    std::printf("device: %s x %d\n", info.ToString().c_str(), world);
    std::printf("model: %s shape, random bf16 weights, context %d, CUDA graphs, step ms on rank 0 "
                "(median of %d)\n",
                absl::GetFlag(FLAGS_preset).c_str(), context, absl::GetFlag(FLAGS_steps));
    // Ratios against the custom column, of the columns timed.
    const std::pair<Variant, const char*> ratios[] = {
        {kNccl, "NCCL"}, {kUnfused, "unfused"}, {kTp1, "TP=1"}};
    std::printf("| batch |");
    int shown = 0;
    for (const Column& c : columns) {
      if (c.name.empty()) continue;
      std::printf(" %s |", c.name.c_str());
      ++shown;
    }
    for (const auto& [v, name] : ratios) {
      if (!wanted[kAuto] || !wanted[v]) continue;
      std::printf(" %s / custom |", name);
      ++shown;
    }
    std::printf("\n|------:|");
    for (int c = 0; c < shown; ++c) std::printf("------:|");
    std::printf("\n");
    for (int b : batches) {
      std::printf("| %d |", b);
      for (Column& c : columns) {
        if (!c.name.empty()) std::printf(" %.3f |", c.ms[b]);
      }
      for (const auto& [v, name] : ratios) {
        if (!wanted[kAuto] || !wanted[v]) continue;
        std::printf(" %.2fx |", columns[v].ms[b] / columns[kAuto].ms[b]);
      }
      std::printf("\n");
    }
    for (const Column& c : columns) {
      if (!c.paths.empty()) std::printf("%s\n", c.paths.c_str());
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Bad flags fail here, once, before any rank starts.
  for (const absl::Status& flags :
       {kiln::Batches().status(), kiln::Columns().status(),
        kiln::ModelPreset(absl::GetFlag(FLAGS_preset)).status()}) {
    if (!flags.ok()) {
      std::fprintf(stderr, "tp_benchmark: %s\n", std::string(flags.message()).c_str());
      return 2;
    }
  }
  kiln::testing::BenchmarkGroupOptions options;
  options.name = "tp_benchmark";
  options.world_size = absl::GetFlag(FLAGS_world_size);
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  options.bootstrap_timeout = absl::Seconds(300);
  return kiln::testing::RunBenchmarkOnEveryGpu(
      argc, argv, options, [](kiln::testing::ProcessGroupMember& member) -> absl::StatusOr<int> {
        RETURN_IF_ERROR(kiln::RunRank(member));
        return 0;
      });
}
