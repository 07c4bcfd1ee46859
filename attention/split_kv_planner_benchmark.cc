// Host time of SplitKvPlanner::Plan for 256 sequences (target: at most 10 us per step).
//
//   bazel run -c opt //attention:split_kv_planner_benchmark
#include <vector>

#include "attention/split_kv_planner.h"
#include "benchmark/benchmark.h"

namespace kiln {
namespace {

SplitKvPlannerOptions Options(int max_tokens, int prefill_rows) {
  SplitKvPlannerOptions o;
  o.num_q_heads = 32;
  o.num_kv_heads = 8;
  o.head_dim = 128;
  o.sm_count = 132;
  o.key = {256, max_tokens, 32768};
  o.decode.tile_rows = 4;
  o.prefill.tile_rows = prefill_rows;
  o.prefill.kv_granularity = 128;
  o.prefill.ctas_per_sm = 1;
  return o;
}

struct alignas(16) Chunk {
  char b[16];
};

void Run(benchmark::State& state, const SplitKvPlannerOptions& options,
         const std::vector<SeqLens>& seqs) {
  auto planner = SplitKvPlanner::Create(options);
  if (!planner.ok()) {
    state.SkipWithError(std::string(planner.status().message()).c_str());
    return;
  }
  std::vector<Chunk> blob(planner->layout().plan_bytes / 16 + 1);
  for (auto _ : state) {
    auto summary = planner->Plan(seqs, blob.data());
    benchmark::DoNotOptimize(summary);
    benchmark::ClobberMemory();
  }
}

// 256 decode sequences of mixed lengths (the binary search over chunk sizes runs).
void BM_Plan256DecodeSkewed(benchmark::State& state) {
  std::vector<SeqLens> seqs(256);
  for (int i = 0; i < 256; ++i) seqs[i] = {1, i == 7 ? 32768 : 100 + (i * 977) % 3000};
  Run(state, Options(256, 0), seqs);
}
BENCHMARK(BM_Plan256DecodeSkewed);

// 256 decode sequences of 1024 (no split).
void BM_Plan256DecodeUniform(benchmark::State& state) {
  Run(state, Options(256, 0), std::vector<SeqLens>(256, SeqLens{1, 1024}));
}
BENCHMARK(BM_Plan256DecodeUniform);

// 256 sequences, 224 decoding and 32 prefilling 100 tokens each, into both parts.
void BM_Plan256Mixed(benchmark::State& state) {
  std::vector<SeqLens> seqs(256);
  for (int i = 0; i < 256; ++i) seqs[i] = i % 8 == 0 ? SeqLens{100, 2100} : SeqLens{1, 900 + i};
  Run(state, Options(4096, 128), seqs);
}
BENCHMARK(BM_Plan256Mixed);

}  // namespace
}  // namespace kiln
