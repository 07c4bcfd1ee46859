// Decode-step latency of the 1B-class Llama (hidden 2048, 16 layers, 32/8 heads of 64, ffn 8192,
// vocab 128256, random bf16 weights; --preset names another model preset, e.g. llama-3.1-8b)
// through the Runner, as CUDA graphs and eagerly at the same
// padded sizes, at batch 1, 8, 32 and 128 with 1024 tokens of context; the capture time of every
// default decode size up to 256 and prefill budget up to 512 tokens; the step without attention
// (with --where, also without RoPE + KV append, the norm kernels or SiLU·mul); with
// --trace_batches, each kernel's share of a graph step's critical path (CUPTI kernel trace) and
// one layer's kernels in order; the step by GEMM path for small batches (as configured, without
// the prefetch GEMM, the skinny kernel with cuBLASLt, cuBLASLt alone); and with --ablate, the
// step with one fusion or choice changed at a time. The --prefetch_*, --fold_norm, --decode_*,
// --skinny_rows flags set the model's GEMM paths and the attention split for every table
// (defaults: RunnerOptions'). --capture_sizes, --capture_prefill, --max_model_len,
// --max_kv_blocks and --max_num_batched_tokens size the main runner as a server would; its KV
// cache is filled with seeded values of unit scale first (--kv_fill), so attention reads numbers
// like a real cache's. Batches run in the order given (runtime/runner/NOTES.md, "Batch 32 in
// two modes", shows how the sizes before a step and the captured set could matter).
//
//   bazel run -c opt //runtime/runner:runner_benchmark [-- --batches=1,8 --context=1024]
//
// A step is timed on the device with CUDA events around its kernels, from the metadata fetch to
// the sampled tokens in pinned memory (RunnerOptions::time_steps), after warm-up; the table shows
// medians. "step" is the host's wall time of Runner::Step (planning, replay, synchronisation).
// The floor is the weight bytes a step reads (every tensor once; an embedding table the LM head
// does not share, only in the rows it gathers) plus the KV cache, read once at the
// device-to-device copy bandwidth measured here. Exits non-zero on any error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "runtime/config/presets.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/device_info.h"
#include "runtime/cuda/event.h"
#include "runtime/cuda/kernel_trace.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/stream.h"
#include "runtime/model/internal/benchmark_util.h"
#include "runtime/model/llama_weights.h"
#include "runtime/runner/runner.h"

ABSL_FLAG(std::string, preset, "llama-3.2-1b",
          "Model preset whose shape is measured (random weights): llama-3.2-1b, llama-3.1-8b, ...");
ABSL_FLAG(std::string, batches, "1,8,32,128", "Decode batch sizes");
ABSL_FLAG(int, context, 1024, "Tokens of context per sequence");
ABSL_FLAG(int, steps, 30, "Timed steps per measurement");
ABSL_FLAG(int, max_model_len, 2048,
          "Longest sequence the runner is sized for (decode attention's graph-safe split plan "
          "depends on it); at least --context + 2 x --steps + 7, the tokens a measurement adds");
ABSL_FLAG(int, max_kv_blocks, 4096, "KV blocks of 64 tokens the main runner allocates");
ABSL_FLAG(int, max_num_batched_tokens, 8192, "Token rows the main runner's steps may carry");
ABSL_FLAG(std::string, kv_fill, "random",
          "What the main runner's KV cache holds before timing, where the steps read tokens they "
          "did not write: random (seeded bf16 of unit scale, like real keys and values), zero, or "
          "stale (whatever the allocation held)");
ABSL_FLAG(std::string, capture_sizes, "",
          "Decode sizes the main runner captures, comma-separated (empty: the runner's defaults, "
          "up to 256); every --batches size must be among them");
ABSL_FLAG(bool, capture_prefill, true, "Whether the main runner captures prefill graphs too");
ABSL_FLAG(bool, compare_cublas, true,
          "Also time batches 1..32 with other GEMM paths (no prefetch GEMM, skinny + cuBLASLt, "
          "cuBLASLt)");
ABSL_FLAG(bool, ablate, false,
          "Also time --ablate_batches with each fusion turned off and other GEMM paths");
ABSL_FLAG(std::string, ablate_batches, "1,2,4,8,16,32", "With --ablate, the batch sizes");
ABSL_FLAG(std::string, ablate_only, "",
          "With --ablate, only the variants whose name contains this (and the configured one)");
// The model's GEMM paths for every table (RunnerOptions; defaults: the runner's).
ABSL_FLAG(int, prefetch_qkv_rows, kiln::PrefetchGemmRows{}.qkv,
          "Prefetch GEMM rows: QKV projection");
ABSL_FLAG(int, prefetch_o_rows, kiln::PrefetchGemmRows{}.o, "Prefetch GEMM rows: O projection");
ABSL_FLAG(int, prefetch_gate_up_rows, kiln::PrefetchGemmRows{}.gate_up,
          "Prefetch GEMM rows: gate-up projection");
ABSL_FLAG(int, prefetch_down_rows, kiln::PrefetchGemmRows{}.down,
          "Prefetch GEMM rows: down projection");
ABSL_FLAG(int, prefetch_lm_head_rows, kiln::PrefetchGemmRows{}.lm_head,
          "Prefetch GEMM rows: LM head");
ABSL_FLAG(int, prefetch_ctas_per_sm, kiln::RunnerOptions{}.prefetch_gemm_ctas_per_sm,
          "Prefetch GEMM CTAs per SM (1 or 2)");
ABSL_FLAG(bool, prefetch_silu, kiln::RunnerOptions{}.prefetch_gemm_silu,
          "The prefetch GEMM reads SiLU(gate)·up itself for the down projection");
ABSL_FLAG(bool, prefetch_gate_up_silu, kiln::RunnerOptions{}.prefetch_gate_up_silu,
          "The gate-up projection's prefetch GEMM writes SiLU(gate)·up itself");
ABSL_FLAG(bool, prefetch_row_halves, kiln::RunnerOptions{}.prefetch_row_halves,
          "Prefetch GEMM CTAs of at most 8 rows fill each stage with their rows' two k halves");
ABSL_FLAG(bool, fold_norm, kiln::RunnerOptions{}.fold_norm_into_gemm,
          "The QKV and gate-up prefetch GEMMs do the add + RMSNorm before them");
ABSL_FLAG(int, tma_qkv_rows, kiln::TmaGemmRows{}.qkv, "TMA GEMM rows: QKV projection");
ABSL_FLAG(int, tma_o_rows, kiln::TmaGemmRows{}.o, "TMA GEMM rows: O projection");
ABSL_FLAG(int, tma_gate_up_rows, kiln::TmaGemmRows{}.gate_up,
          "TMA GEMM rows: gate-up projection");
ABSL_FLAG(int, tma_down_rows, kiln::TmaGemmRows{}.down, "TMA GEMM rows: down projection");
ABSL_FLAG(int, tma_qkv_splits, kiln::TmaGemmSplits{}.qkv, "TMA GEMM k slices: QKV projection");
ABSL_FLAG(int, tma_qkv_32_splits, kiln::TmaGemmSplits{}.qkv_at_32_rows,
          "TMA GEMM k slices: QKV projection at 17-32 rows");
ABSL_FLAG(int, tma_o_splits, kiln::TmaGemmSplits{}.o, "TMA GEMM k slices: O projection");
ABSL_FLAG(int, tma_gate_up_splits, kiln::TmaGemmSplits{}.gate_up,
          "TMA GEMM k slices: gate-up projection");
ABSL_FLAG(int, tma_down_splits, kiln::TmaGemmSplits{}.down, "TMA GEMM k slices: down projection");
ABSL_FLAG(int, tma_ctas_per_sm, kiln::RunnerOptions{}.tma_gemm_ctas_per_sm,
          "TMA GEMM CTAs per SM (1 or 2)");
ABSL_FLAG(int, layer_kernel_rows, kiln::RunnerOptions{}.layer_kernel_rows,
          "Steps of at most this many rows run each piece as one decode layer kernel (0: none)");
ABSL_FLAG(int, rope_in_attention_rows, kiln::RunnerOptions{}.rope_in_attention_rows,
          "Decode-only steps of at most this many rows do RoPE + KV append in attention");
ABSL_FLAG(int, rope_in_attention_min_rows, kiln::RunnerOptions{}.rope_in_attention_min_rows,
          "... and of at least this many rows");
ABSL_FLAG(int, decode_qkv_rows, kiln::DecodeGemmRows{}.qkv, "Decode GEMM rows: QKV projection");
ABSL_FLAG(int, decode_o_rows, kiln::DecodeGemmRows{}.o, "Decode GEMM rows: O projection");
ABSL_FLAG(int, decode_gate_up_rows, kiln::DecodeGemmRows{}.gate_up,
          "Decode GEMM rows: gate-up projection");
ABSL_FLAG(int, decode_down_rows, kiln::DecodeGemmRows{}.down, "Decode GEMM rows: down projection");
ABSL_FLAG(int, decode_lm_head_rows, kiln::DecodeGemmRows{}.lm_head, "Decode GEMM rows: LM head");
ABSL_FLAG(int, skinny_rows, kiln::RunnerOptions{}.skinny_gemm_max_rows, "Skinny GEMM rows");
ABSL_FLAG(int, decode_min_kv_chunk, kiln::RunnerOptions{}.decode_min_kv_chunk,
          "Shortest KV chunk of a split decode attention tile");
ABSL_FLAG(int, warm_runners, 0,
          "Runners like the main one built, captured and freed before it (0-16): a process's first "
          "runners run 16 and 32 rows slower than later ones (runtime/runner/NOTES.md)");
ABSL_FLAG(bool, where, false,
          "Also time the step without RoPE + KV append, without the norm kernels and without "
          "SiLU·mul (each from layer_kernel_rows + 1 rows), not only without attention");
ABSL_FLAG(std::string, trace_batches, "",
          "Decode batch sizes whose graph step is also traced (CUPTI): each kernel's share of "
          "the step's critical path, from the median of the traced replays (warm-ups and up to "
          "8 steps)");
ABSL_FLAG(std::string, decode_split_by_rows, "",
          "Decode attention split rules, max_rows:ctas_per_sm pairs (e.g. 2:2,8:4), for any "
          "head_dim; empty: RunnerOptions' defaults (decode_split_by_rows, and "
          "decode_split_by_rows_head_dim_128 for head_dim 128); none: no rules");
ABSL_FLAG(int, decode_ctas_per_sm, kiln::RunnerOptions{}.decode_ctas_per_sm,
          "Decode attention CTAs per SM the KV split aims to fill (keys past "
          "decode_split_by_rows)");

namespace kiln {
namespace {

// Parses --decode_split_by_rows into `rules` (left as they are when the flag is empty); false,
// after printing the bad entry, for one that is not two integers max_rows:ctas_per_sm, or for
// rules CheckSplitAims refuses (the runner would refuse them too).
bool ParseSplitRules(const std::string& text, std::vector<SplitAim>* rules) {
  if (text.empty()) return true;
  rules->clear();
  if (text == "none") return true;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(piece, ':');
    SplitAim rule;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &rule.max_seqs) ||
        !absl::SimpleAtoi(parts[1], &rule.ctas_per_sm)) {
      std::fprintf(stderr,
                   "--decode_split_by_rows: bad entry \"%s\" (want max_rows:ctas_per_sm)\n",
                   std::string(piece).c_str());
      return false;
    }
    rules->push_back(rule);
  }
  const absl::Status checked = CheckSplitAims(*rules, "--decode_split_by_rows");
  if (!checked.ok()) std::fprintf(stderr, "%s\n", std::string(checked.message()).c_str());
  return checked.ok();
}

// One decode-attention split aim for every capture key.
void UniformSplit(RunnerOptions& o, int ctas_per_sm) {
  o.decode_ctas_per_sm = ctas_per_sm;
  o.decode_split_by_rows.clear();
  o.decode_split_by_rows_head_dim_128.clear();
}

using benchmark_internal::ValueOrDie;

constexpr int kWarmup = 5;

// The peer PyTorch CUDA-graph figures on H200 (README, "Peer figures"); batches 8 and 16 from
// torch_reference.py's compiled variant (torch.compile between attentions, one H200,
// 2026-11-21), which gives 1.60 ms at batch 32 where the peer figure is 1.59. Shown only on an
// H200: on another GPU they would compare two GPUs (run tools/bench/torch_reference.py there).
const std::map<int, double> kTorchGraphMs = {
    {1, 1.27}, {8, 1.40}, {16, 1.44}, {32, 1.59}, {128, 2.53}};

// Returns whether `info` is the GPU that kTorchGraphMs was measured on.
bool IsH200(const DeviceInfo& info) { return info.name.find("H200") != std::string::npos; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Returns the device-to-device copy bandwidth in bytes per second (read plus write).
double CopyBandwidth() {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer a = ValueOrDie(DeviceBuffer::Allocate(bytes, "copy a"));
  DeviceBuffer b = ValueOrDie(DeviceBuffer::Allocate(bytes, "copy b"));
  Stream stream = ValueOrDie(Stream::Create());
  CHECK_OK(ToStatus(cudaMemsetAsync(a.data(), 0x3c, bytes, stream.get()), "memset"));
  Event start = ValueOrDie(Event::Create(Event::kTiming));
  Event stop = ValueOrDie(Event::Create(Event::kTiming));
  std::vector<double> ms;
  for (int i = 0; i < 8; ++i) {
    CHECK_OK(start.Record(stream.get()));
    CHECK_OK(CopyDeviceToDevice(b.data(), a.data(), bytes, stream.get()));
    CHECK_OK(stop.Record(stream.get()));
    ms.push_back(ValueOrDie(Event::ElapsedMs(start, stop)));
  }
  return 2.0 * bytes / (Median(ms) * 1e-3);
}

struct Timing {
  double graph_ms = 0, eager_ms = 0, step_ms = 0;
  bool replayed = false;
  int64_t no_token = 0;  // sampled rows with no token (every logit NaN): broken arithmetic
};

// Fills the runner's KV cache as --kv_fill says (checked in Main). A 16 MiB seeded pattern of
// bf16 values in [-2, 2) is copied over the cache, so that attention reads numbers of a real
// cache's scale rather than leftovers of earlier allocations.
void FillKv(Runner& runner, const std::string& how) {
  void* kv = runner.model().kv_cache_data();
  const size_t bytes = runner.model().kv_cache_bytes();
  if (how == "stale" || bytes == 0) return;
  if (how == "zero") {
    CHECK_CUDA(cudaMemset(kv, 0, bytes));
    CHECK_CUDA(cudaDeviceSynchronize());
    return;
  }
  std::vector<uint16_t> pattern(std::min<size_t>(bytes, size_t{16} << 20) / 2);
  uint32_t state = 12345;
  for (uint16_t& v : pattern) {
    state = state * 1664525u + 1013904223u;
    // bf16 of a float in (-2, 2): a random sign, an exponent from 2^-7 to 2^0 and random
    // mantissa bits.
    const uint32_t sign = (state >> 31) << 15;
    const uint32_t exponent = 120 + ((state >> 27) & 7);
    const uint32_t mantissa = (state >> 20) & 0x7f;
    v = static_cast<uint16_t>(sign | (exponent << 7) | mantissa);
  }
  const size_t chunk = pattern.size() * 2;
  char* dst = static_cast<char*>(kv);
  CHECK_CUDA(cudaMemcpy(dst, pattern.data(), chunk, cudaMemcpyHostToDevice));
  for (size_t done = chunk; done < bytes; done += chunk) {
    CHECK_CUDA(cudaMemcpy(dst + done, dst, std::min(chunk, bytes - done),
                          cudaMemcpyDeviceToDevice));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
}

// Decodes `batch` sequences of `context` tokens: warm-up, then timed graph steps, then timed
// eager steps at the same key.
Timing TimeDecode(Runner& runner, int batch, int context, int steps, bool eager_too) {
  std::vector<SequenceTokens> seqs;
  const int64_t base = int64_t{batch} * 100000;
  for (int i = 0; i < batch; ++i) {
    CHECK_OK(runner.SetContextForBenchmark(base + i, context - 1));
    seqs.push_back({base + i, {static_cast<int32_t>((i * 7919 + 13) % runner.shape().vocab)}});
  }
  int64_t no_token = 0;
  auto step = [&](bool eager, std::vector<double>* device_ms, std::vector<double>* wall_ms,
                  bool* replayed) {
    StepOptions options;
    options.force_eager = eager;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> next = ValueOrDie(runner.Step(seqs, options));
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i) {
      if (next[i] < 0) ++no_token;
      seqs[i].tokens[0] = std::max(next[i], 0);
    }
    if (device_ms) device_ms->push_back(runner.last_step().device_ms);
    if (wall_ms) wall_ms->push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (replayed) *replayed = runner.last_step().replayed;
  };
  Timing t;
  std::vector<double> graph, wall, eager;
  for (int i = 0; i < kWarmup; ++i) step(false, nullptr, nullptr, nullptr);
  for (int i = 0; i < steps; ++i) step(false, &graph, &wall, &t.replayed);
  if (eager_too) {
    for (int i = 0; i < 2; ++i) step(true, nullptr, nullptr, nullptr);
    for (int i = 0; i < steps; ++i) step(true, &eager, nullptr, nullptr);
  }
  for (int i = 0; i < batch; ++i) CHECK_OK(runner.Release(base + i));
  t.graph_ms = Median(graph);
  t.step_ms = Median(wall);
  t.eager_ms = Median(eager);
  t.no_token = no_token;
  return t;
}

// Traces the graph step of `batch` rows (warm-ups and `steps` steps) and prints each kernel's
// share of the median replay's critical path (kernel_trace.h).
void PrintTrace(Runner& runner, int batch, int context, int steps) {
  std::unique_ptr<KernelTrace> trace = ValueOrDie(KernelTrace::Start());
  TimeDecode(runner, batch, context, steps, /*eager_too=*/false);
  const ReplayProfile profile = ValueOrDie(ProfileReplays(ValueOrDie(trace->Finish())));
  std::printf("\nGraph step of batch %d, kernel by kernel (CUPTI trace, median of %d replays of %d "
              "kernels; each kernel's increment of the critical path): span %.1f us\n",
              batch, profile.replays, profile.kernels, profile.span_us);
  std::printf("%10s %7s %8s  %s\n", "us", "share", "kernels", "kernel");
  for (const KernelShare& s : profile.shares) {
    std::printf("%10.1f %6.1f%% %8d  %s\n", s.us, 100 * s.us / profile.span_us, s.launches,
                s.kernel.c_str());
  }
  // One layer, in order: the projections that share a kernel apart.
  const std::optional<RepeatedBlock> layer = FindRepeatedBlock(profile.nodes);
  if (!layer.has_value()) return;
  double sum = 0;
  for (const NodeShare& n : layer->nodes) sum += n.us;
  std::printf("One layer, in order (the block of %zu kernels that repeats %d times from kernel %d; "
              "median increment over the repeats): %.1f us\n",
              layer->nodes.size(), layer->repeats, layer->first, sum);
  for (const NodeShare& n : layer->nodes) std::printf("%10.1f  %s\n", n.us, n.kernel.c_str());
}

// Makes `o` capture exactly `sizes` (each once, whatever --capture_sizes gave the main runner).
void CaptureOnly(const std::vector<int>& sizes, RunnerOptions& o) {
  o.config.mutable_graph()->clear_capture_sizes();
  for (int b : std::set<int>(sizes.begin(), sizes.end())) {
    o.config.mutable_graph()->add_capture_sizes(b);
  }
}

// The runner options the flags give; `capture_sizes` and `split_rules` are the list flags Main
// parsed (split_rules: --decode_split_by_rows for every head_dim; unused where it is empty).
RunnerOptions BenchmarkOptions(const std::vector<int>& capture_sizes,
                               const std::vector<SplitAim>& split_rules) {
  RunnerOptions o;
  o.prefetch_gemm_rows.qkv = absl::GetFlag(FLAGS_prefetch_qkv_rows);
  o.prefetch_gemm_rows.o = absl::GetFlag(FLAGS_prefetch_o_rows);
  o.prefetch_gemm_rows.gate_up = absl::GetFlag(FLAGS_prefetch_gate_up_rows);
  o.prefetch_gemm_rows.down = absl::GetFlag(FLAGS_prefetch_down_rows);
  o.prefetch_gemm_rows.lm_head = absl::GetFlag(FLAGS_prefetch_lm_head_rows);
  o.prefetch_gemm_ctas_per_sm = absl::GetFlag(FLAGS_prefetch_ctas_per_sm);
  o.prefetch_gemm_silu = absl::GetFlag(FLAGS_prefetch_silu);
  o.prefetch_gate_up_silu = absl::GetFlag(FLAGS_prefetch_gate_up_silu);
  o.prefetch_row_halves = absl::GetFlag(FLAGS_prefetch_row_halves);
  o.fold_norm_into_gemm = absl::GetFlag(FLAGS_fold_norm);
  o.tma_gemm_rows.qkv = absl::GetFlag(FLAGS_tma_qkv_rows);
  o.tma_gemm_rows.o = absl::GetFlag(FLAGS_tma_o_rows);
  o.tma_gemm_rows.gate_up = absl::GetFlag(FLAGS_tma_gate_up_rows);
  o.tma_gemm_rows.down = absl::GetFlag(FLAGS_tma_down_rows);
  o.tma_gemm_ctas_per_sm = absl::GetFlag(FLAGS_tma_ctas_per_sm);
  o.tma_gemm_max_splits.qkv = absl::GetFlag(FLAGS_tma_qkv_splits);
  o.tma_gemm_max_splits.qkv_at_32_rows = absl::GetFlag(FLAGS_tma_qkv_32_splits);
  o.tma_gemm_max_splits.o = absl::GetFlag(FLAGS_tma_o_splits);
  o.tma_gemm_max_splits.gate_up = absl::GetFlag(FLAGS_tma_gate_up_splits);
  o.tma_gemm_max_splits.down = absl::GetFlag(FLAGS_tma_down_splits);
  o.layer_kernel_rows = absl::GetFlag(FLAGS_layer_kernel_rows);
  o.rope_in_attention_rows = absl::GetFlag(FLAGS_rope_in_attention_rows);
  o.rope_in_attention_min_rows = absl::GetFlag(FLAGS_rope_in_attention_min_rows);
  o.decode_gemm_rows.qkv = absl::GetFlag(FLAGS_decode_qkv_rows);
  o.decode_gemm_rows.o = absl::GetFlag(FLAGS_decode_o_rows);
  o.decode_gemm_rows.gate_up = absl::GetFlag(FLAGS_decode_gate_up_rows);
  o.decode_gemm_rows.down = absl::GetFlag(FLAGS_decode_down_rows);
  o.decode_gemm_rows.lm_head = absl::GetFlag(FLAGS_decode_lm_head_rows);
  o.skinny_gemm_max_rows = absl::GetFlag(FLAGS_skinny_rows);
  o.decode_min_kv_chunk = absl::GetFlag(FLAGS_decode_min_kv_chunk);
  o.decode_ctas_per_sm = absl::GetFlag(FLAGS_decode_ctas_per_sm);
  if (!absl::GetFlag(FLAGS_decode_split_by_rows).empty()) {
    o.decode_split_by_rows = split_rules;
    o.decode_split_by_rows_head_dim_128 = split_rules;
  }
  o.config.set_model_preset(absl::GetFlag(FLAGS_preset));
  o.config.set_max_num_seqs(256);
  o.config.set_max_num_batched_tokens(absl::GetFlag(FLAGS_max_num_batched_tokens));
  o.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  o.max_kv_blocks = absl::GetFlag(FLAGS_max_kv_blocks);
  o.capture_prefill = absl::GetFlag(FLAGS_capture_prefill);
  for (int b : capture_sizes) o.config.mutable_graph()->add_capture_sizes(b);
  o.time_steps = true;
  o.progress = CaptureProgress::kNone;
  return o;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int> batches, ablate_batches, capture_sizes, trace_batches;
  if (!benchmark_internal::ParseIntList("batches", absl::GetFlag(FLAGS_batches), 1, 256,
                                        &batches) ||
      !benchmark_internal::ParseIntList("trace_batches", absl::GetFlag(FLAGS_trace_batches), 1,
                                        256, &trace_batches) ||
      !benchmark_internal::ParseIntList("ablate_batches", absl::GetFlag(FLAGS_ablate_batches), 1,
                                        256, &ablate_batches) ||
      !benchmark_internal::ParseIntList("capture_sizes", absl::GetFlag(FLAGS_capture_sizes), 1,
                                        256, &capture_sizes)) {
    return 2;
  }
  std::vector<SplitAim> split_rules;  // used only where --decode_split_by_rows is given
  if (!ParseSplitRules(absl::GetFlag(FLAGS_decode_split_by_rows), &split_rules)) return 2;
  const int context = absl::GetFlag(FLAGS_context);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int max_model_len = absl::GetFlag(FLAGS_max_model_len);
  const std::string kv_fill = absl::GetFlag(FLAGS_kv_fill);
  if (kv_fill != "random" && kv_fill != "zero" && kv_fill != "stale") {
    std::fprintf(stderr, "--kv_fill %s: want random, zero or stale\n", kv_fill.c_str());
    return 2;
  }
  // A measurement starts at `context` tokens and adds warm-ups, graph and eager steps.
  const int64_t longest = int64_t{context} + kWarmup + 2 + 2 * int64_t{steps};
  if (context < 1 || steps < 1 || max_model_len < longest) {
    std::fprintf(stderr,
                 "--context %d, --steps %d, --max_model_len %d: want context and steps >= 1 and "
                 "max_model_len >= %lld (context + 2 x steps + 7)\n",
                 context, steps, max_model_len, static_cast<long long>(longest));
    return 2;
  }
  const std::string preset = absl::GetFlag(FLAGS_preset);
  if (absl::Status known = ModelPreset(preset).status(); !known.ok()) {
    std::fprintf(stderr, "--preset: %s\n", std::string(known.message()).c_str());
    return 2;
  }
  const int warm_runners = absl::GetFlag(FLAGS_warm_runners);
  if (warm_runners < 0 || warm_runners > 16) {
    std::fprintf(stderr, "--warm_runners %d: want 0 to 16\n", warm_runners);
    return 2;
  }
  const RunnerOptions base = BenchmarkOptions(capture_sizes, split_rules);
  const DeviceInfo info = ValueOrDie(DeviceInfo::Query(0));
  std::printf("device: %s\n", info.ToString().c_str());
  const double bandwidth = CopyBandwidth();
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", bandwidth / 1e9);

  for (int i = 0; i < warm_runners; ++i) {
    std::unique_ptr<Runner> runner = ValueOrDie(Runner::Create(base));
    CHECK_OK(runner->Capture().status());
  }
  if (warm_runners > 0) std::printf("built, captured and freed %d runners first\n", warm_runners);

  {
    std::unique_ptr<Runner> runner = ValueOrDie(Runner::Create(base));
    const LlamaShape& s = runner->shape();
    const LlamaWeightLayout& layout = runner->model().weights().layout();
    const double kv_bytes_per_token = 2.0 * s.layers * s.kv_heads * s.head_dim * 2;
    std::printf("model: %s, %.2f GiB of weights\n", s.ToString().c_str(),
                static_cast<double>(runner->model().weights().bytes()) / (1 << 30));
    const RunnerCaptureSummary captured = ValueOrDie(runner->Capture());
    // The largest captured size of a list (0: none captured).
    const auto largest = [](int captured_count, const std::optional<CaptureSizes>& sizes) {
      return captured_count > 0 && sizes.has_value() ? sizes->max_size() : 0;
    };
    std::printf("capture: %d graphs (%d decode sizes up to %d, %d prefill budgets up to %d "
                "tokens) in %.3f s, %.1f ms per graph, pool %.1f MiB, %zu nodes, %.1f MiB for the "
                "executables\n",
                captured.num_graphs, captured.num_decode_sizes,
                largest(captured.num_decode_sizes, runner->decode_sizes()),
                captured.num_prefill_sizes,
                largest(captured.num_prefill_sizes, runner->prefill_sizes()), captured.seconds,
                1e3 * captured.seconds / captured.num_graphs, captured.pool_bytes / 1048576.0,
                captured.num_nodes,
                captured.device_bytes / 1048576.0);
    FillKv(*runner, absl::GetFlag(FLAGS_kv_fill));

    std::printf("\nDecode step, context %d, ms (median of %d)\n", context, steps);
    // The peer figures are the 1B shape's.
    const bool peer = IsH200(info) && absl::AsciiStrToLower(preset) == "llama-3.2-1b";
    if (!peer) {
      std::printf("(torch graph: the peer figures are an H200's with the 1B shape, not shown "
                  "for %s on %s; tools/bench/torch_reference.py measures PyTorch here)\n",
                  preset.c_str(), info.name.c_str());
    }
    std::printf("%6s %10s %10s %10s %10s %12s %10s\n", "batch", "graph", "eager", "step(host)",
                "floor", "torch graph", "speedup");
    for (int b : batches) {
      const Timing t = TimeDecode(*runner, b, context, steps, /*eager_too=*/true);
      if (!t.replayed) {
        std::fprintf(stderr, "batch %d did not replay a graph\n", b);
        return 1;
      }
      if (t.no_token > 0) {
        std::printf("batch %d: %lld sampled rows had no token (every logit NaN)\n", b,
                    static_cast<long long>(t.no_token));
      }
      const double floor_ms =
          (static_cast<double>(layout.StepReadBytes(b)) + kv_bytes_per_token * context * b) /
          bandwidth * 1e3;
      auto torch = kTorchGraphMs.find(b);
      if (peer && torch != kTorchGraphMs.end()) {
        std::printf("%6d %10.3f %10.3f %10.3f %10.3f %12.2f %9.2fx\n", b, t.graph_ms, t.eager_ms,
                    t.step_ms, floor_ms, torch->second, torch->second / t.graph_ms);
      } else {
        std::printf("%6d %10.3f %10.3f %10.3f %10.3f %12s %10s\n", b, t.graph_ms, t.eager_ms,
                    t.step_ms, floor_ms, "-", "-");
      }
    }
    for (int b : trace_batches) PrintTrace(*runner, b, context, std::min(steps, 8));
  }

  // Where the time goes: the same step without attention, then without each kind of small kernel
  // (from layer_kernel_rows + 1 rows: the layer kernel does its own). These runners are smaller
  // than the main one (fewer KV blocks and token rows, only the benchmark's sizes captured), which
  // alone moves the step (12–17 µs at batch 1 on an H100, runtime/runner/NOTES.md), so the first of
  // them runs the step as configured: the costs are differences from it.
  struct Without {
    const char* what;
    std::function<void(RunnerOptions&)> edit;
  };
  const Without withouts[] = {
      {nullptr, [](RunnerOptions&) {}},
      {"attention (and the RoPE + KV append it does up to rope_in_attention_rows)",
       [](RunnerOptions& o) { o.skip_attention = true; }},
      {"RoPE + KV append", [](RunnerOptions& o) { o.skip_rope_append = true; }},
      {"norm kernels", [](RunnerOptions& o) { o.skip_norms = true; }},
      {"SiLU·mul kernel (where it runs)", [](RunnerOptions& o) { o.skip_silu_mul = true; }},
  };
  const int where_count = absl::GetFlag(FLAGS_where) ? 5 : 2;
  std::vector<double> as_configured;
  for (int i = 0; i < where_count; ++i) {
    RunnerOptions o = base;
    withouts[i].edit(o);
    o.config.set_max_num_batched_tokens(512);
    o.max_kv_blocks = 2600;
    o.capture_prefill = false;
    CaptureOnly(batches, o);
    std::unique_ptr<Runner> runner = ValueOrDie(Runner::Create(o));
    CHECK_OK(runner->Capture().status());
    if (i == 0) {
      std::printf("\nThe same step on a smaller runner (%d KV blocks, 512 token rows, only these "
                  "sizes captured), as configured (graph ms)\n",
                  static_cast<int>(o.max_kv_blocks));
    } else {
      std::printf("\nThe same smaller runner without %s (graph ms, and the difference: what it "
                  "costs)\n",
                  withouts[i].what);
    }
    for (size_t j = 0; j < batches.size(); ++j) {
      const Timing t = TimeDecode(*runner, batches[j], context, steps, /*eager_too=*/false);
      if (i == 0) {
        as_configured.push_back(t.graph_ms);
        std::printf("%6d %10.3f\n", batches[j], t.graph_ms);
      } else {
        std::printf("%6d %10.3f %+10.3f\n", batches[j], t.graph_ms,
                    as_configured[j] - t.graph_ms);
      }
    }
  }

  // A small runner that captures only `sizes`, for the comparisons below.
  auto small_runner = [&](const std::vector<int>& sizes,
                          const std::function<void(RunnerOptions&)>& edit) {
    RunnerOptions o = base;
    o.config.set_max_num_batched_tokens(512);
    o.max_kv_blocks = 2600;
    o.capture_prefill = false;
    CaptureOnly(sizes, o);
    edit(o);
    std::unique_ptr<Runner> runner = ValueOrDie(Runner::Create(o));
    CHECK_OK(runner->Capture().status());
    return runner;
  };

  if (absl::GetFlag(FLAGS_compare_cublas)) {
    // The GEMM paths for small batches, whole steps as graphs: the options above; without the
    // prefetch GEMM (the earlier defaults); the skinny kernel up to 2 rows with cuBLASLt above (no
    // prefetch, TMA or decode GEMM); cuBLASLt for every GEMM.
    const std::vector<int> small = {1, 2, 4, 8, 16, 32};
    const char* names[] = {"as configured", "no prefetch", "skinny+cuBLASLt", "cuBLASLt"};
    constexpr int kPaths = 4;
    std::map<int, std::map<int, double>> ms;  // path -> batch -> ms
    for (int i = 0; i < kPaths; ++i) {
      std::unique_ptr<Runner> runner = small_runner(small, [&](RunnerOptions& o) {
        if (i >= 1) o.prefetch_gemm_rows = PrefetchGemmRows{0, 0, 0, 0, 0};
        if (i >= 2) {
          o.decode_gemm_rows = DecodeGemmRows{0, 0, 0, 0, 0};
          o.tma_gemm_rows = TmaGemmRows{0, 0, 0, 0};
        }
        if (i == 3) o.skinny_gemm_max_rows = 0;
      });
      for (int b : small) ms[i][b] = TimeDecode(*runner, b, context, steps, false).graph_ms;
    }
    std::printf("\nDecode step (graph ms) by GEMM path for small batches\n%6s", "batch");
    for (const char* name : names) std::printf(" %16s", name);
    std::printf("\n");
    for (int b : small) {
      std::printf("%6d", b);
      for (int i = 0; i < kPaths; ++i) std::printf(" %16.3f", ms[i][b]);
      std::printf("\n");
    }
    std::fflush(stdout);
  }

  if (absl::GetFlag(FLAGS_ablate)) {
    // One change at a time from the options above (graph ms).
    const std::vector<int>& sizes = ablate_batches;
    struct Variant {
      const char* name;
      std::function<void(RunnerOptions&)> edit;
    };
    const Variant variants[] = {
        {"as configured", [](RunnerOptions&) {}},
        {"no RoPE scaling",
         [](RunnerOptions& o) {
           o.config.mutable_model()->mutable_rope_scaling()->set_rope_type("default");
         }},
        {"SiLU kernel", [](RunnerOptions& o) { o.silu_in_down = false; }},
        {"norm fold flipped",
         [](RunnerOptions& o) { o.fold_norm_into_gemm = !o.fold_norm_into_gemm; }},
        {"layer kernel<=1", [](RunnerOptions& o) { o.layer_kernel_rows = 1; }},
        {"layer kernel<=2", [](RunnerOptions& o) { o.layer_kernel_rows = 2; }},
        {"layer kernel<=4", [](RunnerOptions& o) { o.layer_kernel_rows = 4; }},
        {"layer kernel<=8", [](RunnerOptions& o) { o.layer_kernel_rows = 8; }},
        {"RoPE+append apart", [](RunnerOptions& o) { o.fuse_rope_append = false; }},
        {"no RoPE+append in attention", [](RunnerOptions& o) { o.rope_in_attention_rows = 0; }},
        {"RoPE+append kernel at 1 row",
         [](RunnerOptions& o) { o.rope_in_attention_min_rows = 2; }},
        {"merge kernel", [](RunnerOptions& o) { o.fused_attention_merge = false; }},
        {"KV chunk >= 128", [](RunnerOptions& o) { o.decode_min_kv_chunk = 128; }},
        {"KV chunk >= 256", [](RunnerOptions& o) { o.decode_min_kv_chunk = 256; }},
        {"attn split 2 CTA/SM", [](RunnerOptions& o) { UniformSplit(o, 2); }},
        {"attn split 2 CTA/SM for 9-24 rows",
         [](RunnerOptions& o) { o.decode_split_by_rows = {{7, 2}, {8, 4}}; }},
        {"attn split by key only",
         [](RunnerOptions& o) { o.decode_split_by_rows = {{2, 2}, {8, 4}}; }},
        {"attn split 1 CTA/SM", [](RunnerOptions& o) { UniformSplit(o, 1); }},
        {"attn split 4 CTA/SM", [](RunnerOptions& o) { UniformSplit(o, 4); }},
        {"attn split 6 CTA/SM", [](RunnerOptions& o) { UniformSplit(o, 6); }},
        {"no prefetch",
         [](RunnerOptions& o) { o.prefetch_gemm_rows = PrefetchGemmRows{0, 0, 0, 0, 0}; }},
        {"prefetch 1 CTA/SM", [](RunnerOptions& o) { o.prefetch_gemm_ctas_per_sm = 1; }},
        {"prefetch down with fused SiLU", [](RunnerOptions& o) { o.prefetch_gemm_silu = true; }},
        {"prefetch to 8 rows (no TMA to 8)",
         [](RunnerOptions& o) { o.prefetch_gemm_rows = PrefetchGemmRows{8, 8, 8, 8, 8}; }},
        {"prefetch to 8 rows, former split rules",
         [](RunnerOptions& o) {
           o.prefetch_gemm_rows = PrefetchGemmRows{8, 8, 8, 8, 8};
           o.decode_split_by_rows = {{2, 2}, {3, 2}, {5, 4}, {7, 2}, {8, 4}};
         }},
        {"decode GEMM down<=4", [](RunnerOptions& o) { o.decode_gemm_rows.down = 4; }},
        {"no prefetch qkv", [](RunnerOptions& o) { o.prefetch_gemm_rows.qkv = 0; }},
        {"prefetch qkv <=2 (TMA from 3)", [](RunnerOptions& o) { o.prefetch_gemm_rows.qkv = 2; }},
        {"no prefetch o", [](RunnerOptions& o) { o.prefetch_gemm_rows.o = 0; }},
        {"no prefetch gate_up", [](RunnerOptions& o) { o.prefetch_gemm_rows.gate_up = 0; }},
        {"no prefetch down", [](RunnerOptions& o) { o.prefetch_gemm_rows.down = 0; }},
        {"no prefetch lm_head", [](RunnerOptions& o) { o.prefetch_gemm_rows.lm_head = 0; }},
        {"no tma", [](RunnerOptions& o) { o.tma_gemm_rows = TmaGemmRows{0, 0, 0, 0}; }},
        {"tma 1 CTA/SM", [](RunnerOptions& o) { o.tma_gemm_ctas_per_sm = 1; }},
        {"tma o <=16", [](RunnerOptions& o) { o.tma_gemm_rows.o = 16; }},
        {"tma qkv <=16", [](RunnerOptions& o) { o.tma_gemm_rows.qkv = 16; }},
        {"tma qkv 8 slices",
         [](RunnerOptions& o) {
           o.tma_gemm_max_splits.qkv = 8;
           o.tma_gemm_max_splits.qkv_at_32_rows = 8;
         }},
        {"tma qkv 3 slices at 32 rows",
         [](RunnerOptions& o) { o.tma_gemm_max_splits.qkv_at_32_rows = 3; }},
        {"tma qkv 3 slices",
         [](RunnerOptions& o) {
           o.tma_gemm_max_splits.qkv = 3;
           o.tma_gemm_max_splits.qkv_at_32_rows = 3;
         }},
        {"tma qkv next at start", [](RunnerOptions& o) { o.tma_qkv_next_after_wait = false; }},
        {"tma gate_up then SiLU·mul kernel",
         [](RunnerOptions& o) { o.tma_gate_up_silu = false; }},
        {"prefetch without row halves",
         [](RunnerOptions& o) { o.prefetch_row_halves = false; }},
        {"prefetch gate_up then SiLU·mul kernel",
         [](RunnerOptions& o) { o.prefetch_gate_up_silu = false; }},
        {"tma gate_up,down <=32",
         [](RunnerOptions& o) { o.tma_gemm_rows.gate_up = o.tma_gemm_rows.down = 32; }},
        {"tma qkv,o only",
         [](RunnerOptions& o) { o.tma_gemm_rows.gate_up = o.tma_gemm_rows.down = 0; }},
        {"tma gate_up,down only",
         [](RunnerOptions& o) { o.tma_gemm_rows.qkv = o.tma_gemm_rows.o = 0; }},
        {"tma all <=64",
         [](RunnerOptions& o) { o.tma_gemm_rows = TmaGemmRows{64, 64, 64, 64}; }},
        {"decode qkv,o,down<=8",
         [](RunnerOptions& o) {
           o.prefetch_gemm_rows = PrefetchGemmRows{0, 0, 0, 0, 0};
           o.decode_gemm_rows = DecodeGemmRows{8, 8, 0, 8, 0};
         }},
        {"decode all <=32",
         [](RunnerOptions& o) {
           o.prefetch_gemm_rows = PrefetchGemmRows{0, 0, 0, 0, 0};
           o.decode_gemm_rows = DecodeGemmRows{32, 32, 32, 32, 32};
         }},
    };
    std::printf("\nDecode step (graph ms), one change at a time\n%-34s", "variant");
    for (int b : sizes) std::printf(" %5s%-3d", "b", b);
    std::printf("\n");
    const std::string only = absl::GetFlag(FLAGS_ablate_only);
    for (const Variant& v : variants) {
      if (&v != &variants[0] && std::string(v.name).find(only) == std::string::npos) continue;
      std::unique_ptr<Runner> runner = small_runner(sizes, v.edit);
      std::printf("%-34s", v.name);
      for (int b : sizes) {
        std::printf(" %8.3f", TimeDecode(*runner, b, context, steps, false).graph_ms);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
