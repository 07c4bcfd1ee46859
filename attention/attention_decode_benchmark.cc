// Decode attention throughput: KV bytes read per second for the batch × context shapes that
// matter (GQA 32/8, head_dim 128, bf16, blocks of 16 and 64 tokens scattered randomly over the
// pool), the 1B model's decode shapes (head_dim 64, blocks of 64, context 1024, batch 1 to 128),
// plus the planner's host time for 256 sequences.
//
//   bazel build -c opt //attention:attention_decode_benchmark
//   bazel-bin/attention/attention_decode_benchmark
//
// Method: the planner's plan for the shape, decode kernel and merge captured 24 times
// back to back in one CUDA graph (as consecutive layers would run), timed with CUDA events after
// warm-up; the median over 7 replays, divided by 24, is the time per call. Each call reads the
// sequences' K and V once: batch × context × 8 KV heads × head_dim × 2 bytes × 2. Calls rotate over
// copies of the KV (separate blocks, separate block tables) so the working set is at least
// 512 MB and the 60 MB L2 cannot serve it. Exits non-zero if anything fails. --explore adds a
// breakdown of the small shapes (merge fused or separate, split widths).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "attention/attention_params.h"
#include "attention/decode_kernel.h"
#include "attention/internal/random_fill.h"
#include "attention/plan_buffers.h"
#include "attention/split_kv_planner.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/device_info.h"
#include "runtime/cuda/event.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

constexpr int kQHeads = 32;
constexpr int kKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kModelHeadDim = 64;  // the 1B model of runtime/runner
constexpr int kModelBlockSize = 64;
constexpr int kCallsPerGraph = 24;
constexpr int kReplays = 7;
constexpr size_t kMinWorkingSet = size_t{512} << 20;

struct Shape {
  int batch;
  int context;
};

enum class MergeMode { kFused, kSeparate, kNone };

// One way to run a shape; the default is what RunDecodeAttention does with PlanBuffers.
struct Variant {
  const char* name = "default";
  int ctas_per_sm = 2;
  int min_kv_chunk = 256;
  MergeMode merge = MergeMode::kFused;
};

struct Result {
  int head_dim;
  int block_size;
  Shape shape;
  int items;
  int merges;
  int chunk;
  double us;
  double tbps;
};

SplitKvPlannerOptions PlannerOptions(int sm_count, int max_seqs, int max_kv,
                                     const Variant& variant = Variant(),
                                     int head_dim = kHeadDim) {
  SplitKvPlannerOptions o;
  o.num_q_heads = kQHeads;
  o.num_kv_heads = kKvHeads;
  o.head_dim = head_dim;
  o.sm_count = sm_count;
  o.key = {max_seqs, max_seqs, max_kv};
  o.decode.tile_rows = kQHeads / kKvHeads;
  o.decode.ctas_per_sm = variant.ctas_per_sm;
  o.decode.min_kv_chunk = variant.min_kv_chunk;
  return o;
}

absl::Status RunVariant(const DecodeAttentionParams& p, const Variant& variant,
                        cudaStream_t stream) {
  DecodeAttentionParams q = p;
  if (variant.merge != MergeMode::kFused) q.plan.merge_counters = nullptr;
  if (variant.merge == MergeMode::kNone) return LaunchDecodeAttention(q, stream);
  return RunDecodeAttention(q, stream);
}

absl::StatusOr<Result> Measure(const DeviceInfo& info, int block_size, Shape shape,
                               const Variant& variant, Stream& stream,
                               int head_dim = kHeadDim) {
  const size_t kv_bytes =
      size_t{2} * shape.batch * shape.context * kKvHeads * head_dim * 2;  // K and V, bf16
  const int copies =
      static_cast<int>(std::min<size_t>(8, (kMinWorkingSet + kv_bytes - 1) / kv_bytes));
  const int blocks_per_seq = shape.context / block_size;
  const int num_blocks = copies * shape.batch * blocks_per_seq;
  const size_t pool_elems = static_cast<size_t>(num_blocks) * kKvHeads * block_size * head_dim;
  ASSIGN_OR_RETURN(DeviceBuffer k, DeviceBuffer::Allocate(pool_elems * 2, "bench K"));
  ASSIGN_OR_RETURN(DeviceBuffer v, DeviceBuffer::Allocate(pool_elems * 2, "bench V"));
  RETURN_IF_ERROR(ToStatus(attention_internal::FillRandom16(k.data(), pool_elems, 1, true,
                                                            stream.get()),
                           "fill K"));
  RETURN_IF_ERROR(ToStatus(attention_internal::FillRandom16(v.data(), pool_elems, 2, true,
                                                            stream.get()),
                           "fill V"));
  // Every block of the pool once, in random order, dealt to copies × sequences.
  std::vector<int32_t> order(num_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 gen(block_size * 7 + shape.batch);
  std::shuffle(order.begin(), order.end(), gen);
  std::vector<DeviceBuffer> tables(copies);
  for (int c = 0; c < copies; ++c) {
    const int32_t* first = order.data() + static_cast<size_t>(c) * shape.batch * blocks_per_seq;
    ASSIGN_OR_RETURN(tables[c], DeviceBuffer::Allocate(
                                    size_t{4} * shape.batch * blocks_per_seq, "bench table"));
    RETURN_IF_ERROR(ToStatus(cudaMemcpy(tables[c].data(), first, tables[c].size(),
                                        cudaMemcpyHostToDevice),
                             "upload table"));
  }
  const size_t q_elems = static_cast<size_t>(shape.batch) * kQHeads * head_dim;
  ASSIGN_OR_RETURN(DeviceBuffer q, DeviceBuffer::Allocate(q_elems * 2, "bench q"));
  ASSIGN_OR_RETURN(DeviceBuffer o, DeviceBuffer::Allocate(q_elems * 2, "bench o"));
  RETURN_IF_ERROR(ToStatus(attention_internal::FillRandom16(q.data(), q_elems, 3, true,
                                                            stream.get()),
                           "fill q"));

  ASSIGN_OR_RETURN(SplitKvPlanner planner,
                   SplitKvPlanner::Create(PlannerOptions(info.sm_count, shape.batch,
                                                         shape.context, variant, head_dim)));
  ASSIGN_OR_RETURN(PlanBuffers buffers, PlanBuffers::Create(planner.layout()));
  const std::vector<SeqLens> seqs(shape.batch, SeqLens{1, shape.context});
  ASSIGN_OR_RETURN(PlanSummary summary, planner.Plan(seqs, buffers.host_plan()));
  RETURN_IF_ERROR(buffers.Upload(stream.get()));

  DecodeAttentionParams p;
  p.dtype = AttentionDtype::kBf16;
  p.num_q_heads = kQHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = head_dim;
  p.q = q.data();
  p.o = o.data();
  p.kv.k_cache = k.data();
  p.kv.v_cache = v.data();
  p.kv.max_blocks_per_seq = blocks_per_seq;
  p.kv.block_size = block_size;
  p.plan = buffers.decode();
  // Warm-up, eagerly, through every copy.
  for (int c = 0; c < copies; ++c) {
    p.kv.block_table = tables[c].as<int32_t>();
    RETURN_IF_ERROR(RunVariant(p, variant, stream.get()));
  }
  RETURN_IF_ERROR(stream.Synchronize());

  cudaGraph_t graph = nullptr;
  RETURN_IF_ERROR(ToStatus(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal),
                           "begin capture"));
  absl::Status captured = absl::OkStatus();
  for (int i = 0; i < kCallsPerGraph && captured.ok(); ++i) {
    p.kv.block_table = tables[i % copies].as<int32_t>();
    captured = RunVariant(p, variant, stream.get());
  }
  RETURN_IF_ERROR(ToStatus(cudaStreamEndCapture(stream.get(), &graph), "end capture"));
  RETURN_IF_ERROR(captured);
  cudaGraphExec_t exec = nullptr;
  RETURN_IF_ERROR(ToStatus(cudaGraphInstantiate(&exec, graph, 0), "instantiate"));
  ASSIGN_OR_RETURN(Event start, Event::Create(Event::kTiming));
  ASSIGN_OR_RETURN(Event stop, Event::Create(Event::kTiming));
  RETURN_IF_ERROR(ToStatus(cudaGraphLaunch(exec, stream.get()), "warm-up replay"));
  std::vector<double> per_call_us;
  for (int r = 0; r < kReplays; ++r) {
    RETURN_IF_ERROR(start.Record(stream.get()));
    RETURN_IF_ERROR(ToStatus(cudaGraphLaunch(exec, stream.get()), "replay"));
    RETURN_IF_ERROR(stop.Record(stream.get()));
    ASSIGN_OR_RETURN(float ms, Event::ElapsedMs(start, stop));
    per_call_us.push_back(1000.0 * ms / kCallsPerGraph);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  RETURN_IF_ERROR(ToStatus(cudaGetLastError(), "benchmark"));
  std::sort(per_call_us.begin(), per_call_us.end());
  const double us = per_call_us[per_call_us.size() / 2];
  const double read = static_cast<double>(kv_bytes);
  return Result{head_dim,
                block_size,
                shape,
                summary.decode.num_work_items,
                summary.decode.num_merge_items,
                summary.decode.kv_chunk_size,
                us,
                read / (us * 1e-6) / 1e12};
}

// Median host time of Plan() for 256 decode sequences of mixed lengths (some split).
absl::StatusOr<double> PlannerMicros(int sm_count) {
  ASSIGN_OR_RETURN(SplitKvPlanner planner,
                   SplitKvPlanner::Create(PlannerOptions(sm_count, 256, 32768)));
  std::vector<SeqLens> seqs(256);
  for (int i = 0; i < 256; ++i) seqs[i] = {1, i == 7 ? 32768 : 100 + (i * 977) % 3000};
  struct alignas(16) Chunk {
    char b[16];
  };
  std::vector<Chunk> blob(planner.layout().plan_bytes / 16 + 1);
  std::vector<double> times;
  for (int i = 0; i < 2000; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto summary = planner.Plan(seqs, blob.data());
    const auto t1 = std::chrono::steady_clock::now();
    if (!summary.ok()) return summary.status();
    times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Breaks the time of the small shapes down: kernel alone, merge fused or separate, wider or
// narrower splits, and a context of one block (fixed cost per call).
int Explore(const DeviceInfo& info, Stream& stream) {
  struct Row {
    Shape shape;
    Variant variant;
  };
  const Row rows[] = {
      {{1, 16}, {"fixed cost (ctx 16)", 2, 256, MergeMode::kFused}},
      {{1, 8192}, {"default (fused merge)", 2, 256, MergeMode::kFused}},
      {{1, 8192}, {"separate merge kernel", 2, 256, MergeMode::kSeparate}},
      {{1, 8192}, {"kernel only, no merge", 2, 256, MergeMode::kNone}},
      {{1, 8192}, {"ctas/sm 1", 1, 256, MergeMode::kFused}},
      {{1, 8192}, {"ctas/sm 4, chunk >= 128", 4, 128, MergeMode::kFused}},
      {{16, 4096}, {"default (fused merge)", 2, 256, MergeMode::kFused}},
      {{16, 4096}, {"ctas/sm 1", 1, 256, MergeMode::kFused}},
  };
  std::printf("\n| explore (block 16) | batch × context | items | chunk | us/call | KV TB/s |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Row& row : rows) {
    auto r = Measure(info, 16, row.shape, row.variant, stream);
    if (!r.ok()) {
      std::fprintf(stderr, "%s: %s\n", row.variant.name,
                   std::string(r.status().message()).c_str());
      return 1;
    }
    std::printf("| %s | %d × %d | %d | %d | %.2f | %.2f |\n", row.variant.name, row.shape.batch,
                row.shape.context, r->items, r->chunk, r->us, r->tbps);
    std::fflush(stdout);
  }
  return 0;
}

int Main(bool explore) {
  auto info = DeviceInfo::Query(0);
  if (!info.ok()) {
    std::fprintf(stderr, "%s\n", std::string(info.status().message()).c_str());
    return 1;
  }
  auto stream = Stream::Create();
  if (!stream.ok()) return 1;
  std::printf("device: %s\n", info->ToString().c_str());
  const Shape shapes[] = {{1, 8192}, {16, 4096}, {64, 4096}, {128, 2048}, {256, 1024}};
  std::vector<Result> results;
  for (int block_size : {16, 64}) {
    for (const Shape& shape : shapes) {
      auto r = Measure(*info, block_size, shape, Variant(), *stream);
      if (!r.ok()) {
        std::fprintf(stderr, "block %d batch %d ctx %d: %s\n", block_size, shape.batch,
                     shape.context, std::string(r.status().message()).c_str());
        return 1;
      }
      results.push_back(*r);
      std::printf("block %2d  batch %3d  ctx %5d: %8.2f us  %5.2f TB/s\n", block_size,
                  shape.batch, shape.context, r->us, r->tbps);
      std::fflush(stdout);
    }
  }
  for (int batch : {1, 8, 32, 128}) {
    const Shape shape = {batch, 1024};
    auto r = Measure(*info, kModelBlockSize, shape, Variant(), *stream, kModelHeadDim);
    if (!r.ok()) {
      std::fprintf(stderr, "head_dim %d batch %d ctx %d: %s\n", kModelHeadDim, shape.batch,
                   shape.context, std::string(r.status().message()).c_str());
      return 1;
    }
    results.push_back(*r);
    std::printf("head_dim %d block %2d  batch %3d  ctx %5d: %8.2f us  %5.2f TB/s\n",
                kModelHeadDim, kModelBlockSize, shape.batch, shape.context, r->us, r->tbps);
    std::fflush(stdout);
  }
  auto planner_us = PlannerMicros(info->sm_count);
  if (!planner_us.ok()) return 1;
  std::printf(
      "\n| head_dim | block | batch × context | work items | merges | chunk | us/call | KV TB/s "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Result& r : results) {
    std::printf("| %d | %d | %d × %d | %d | %d | %d | %.2f | %.2f |\n", r.head_dim,
                r.block_size, r.shape.batch, r.shape.context, r.items, r.merges, r.chunk, r.us,
                r.tbps);
  }
  std::printf("\nplanner, 256 sequences: %.2f us (median of 2000)\n", *planner_us);
  return explore ? Explore(*info, *stream) : 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  const bool explore = argc > 1 && std::string(argv[1]) == "--explore";
  return kiln::Main(explore);
}
